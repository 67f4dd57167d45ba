//! The quorum queue as the broker sees it: [`QuorumQueue`] implements `QueueBackend` on top
//! of its Raft group.
//!
//! Every change goes through the log: a publish, an ack, a return, a delivery. The queue's
//! proposer task takes what the connections submitted meanwhile (publishes with their
//! publisher-confirm waiters, settlements, checkouts) and proposes it as one entry, so one
//! commit (one fsync of the shared log on each member) covers many operations; a waiter is
//! completed once its entry is committed and applied. Applying an entry changes the
//! replicated [`QueueState`] on every member; the leader then delivers to its consumers what
//! became ready and publishes what died to the dead-letter exchange (at most once).
//!
//! Leader-only state (not replicated): the consumers, which messages this leader handed out
//! and has not seen settled yet (`out`), and its epoch. A member that becomes leader draws an
//! epoch at random and proposes it ([`Command::Lead`]); it delivers only once that entry is
//! applied (everything committed before it is then applied too) and while it still leads.

use crate::command::{Batch, Command, SettleReason};
use crate::kind::DEFAULT_DELIVERY_LIMIT;
use crate::machine::{decode_snapshot, StateMachine};
use crate::network::GroupNetwork;
use crate::node::QuorumNode;
use crate::state::{Effects, QMsg, QueueState};
use crate::storage::LogStore;
use crate::transport::{Request, Response};
use crate::TypeConfig;
use bytes::Bytes;
use openraft::{BasicNode, Entry, EntryPayload, LogId, Raft, StoredMembership};
use parking_lot::{Mutex, RwLock};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use warren_amqp::table::{FieldTable, FieldValue};
use warren_broker::args::{Overflow, QueueArgs};
use warren_broker::clock::Clock;
use warren_broker::dead_letter::{DeadLetter, DeadLetterSink, DeathReason};
use warren_broker::policy::Applied;
use warren_broker::queue::{
    PagedSettlement, Positions, QueueBackend, QueueCounts, QueueSpec, Settlement,
};
use warren_broker::registry::QueueStats;
use warren_broker::{BrokerError, Consumer, Message, Queue, QueuedMessage, Result};
use warren_store::raftlog::GroupLog;
use warren_store::spill::SpillEntry;
use warren_store::{Completion, Location, Store};

mod backend;
mod dispatch;
pub(crate) mod members;
mod remote;

type NodeId = u64;
type Waiter = (Arc<dyn Completion>, u64);

/// How far ahead of the first undelivered message the leader moves the horizon.
const HORIZON_STEP: u64 = 4096;
/// Largest entry the proposer builds, bytes of message bodies.
const MAX_ENTRY_BYTES: usize = 4 * 1024 * 1024;
/// Body bytes applied since the last snapshot beyond which a snapshot is taken early, when
/// the queue holds less than a quarter of them (its log, held in memory until a snapshot
/// lets it be purged, is then mostly messages already gone).
const SNAPSHOT_LOG_BYTES: u64 = 32 * 1024 * 1024;
/// Entries a queue has proposed and not yet seen committed.
const MAX_IN_FLIGHT: usize = 8;
/// How long a member waits for the leader's node to apply a proposal it forwarded.
const FORWARD_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// How long a new group's first member waits for the first leader before it proposes, and
/// how long proposals wait for the outcome of an election.
const LEADER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What connections hand the proposer.
enum Submit {
    Publish(Arc<Message>, u64, Option<Waiter>),
    Cmd(Command),
}

/// A consumer and the deliveries it has not settled.
struct QConsumer {
    c: Consumer,
    priority: i64,
    in_flight: u32,
    /// A consumer of this node's clients: its id (unique in the queue, from 1), which the
    /// leader's node knows it by when another node leads. 0 for a remote consumer.
    id: u64,
    /// A consumer of another node's client (node, its id there), kept while this node leads.
    remote: Option<(NodeId, u64)>,
}

impl QConsumer {
    fn has_credit(&self) -> bool {
        self.c.no_ack || self.c.prefetch == 0 || self.in_flight < u32::from(self.c.prefetch)
    }
}

/// Who a message handed out by this leader went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Out {
    /// Delivered to a consumer of this node (or taken by basic.get here).
    Delivered,
    /// Delivered to consumer `consumer` of node `node` (0: taken by basic.get there).
    Remote { node: NodeId, consumer: u64 },
    /// Proposed to be returned, its remote holder gone.
    Returning,
    /// Proposed to be dropped (expired, over the length limit, purged).
    Dropping,
}

/// A member's consumers as told to the leader's node (see [`crate::remote`]).
#[derive(Debug, Default)]
struct Subscription {
    /// The leader, its term, the connection generation and the list version the leader's
    /// node last accepted.
    sent: Option<(NodeId, u64, u64, u64)>,
    /// The leader and term deliveries are taken from (set when a list is sent).
    target: Option<(NodeId, u64)>,
    /// A list is on its way.
    pending: bool,
    /// Grows with each change of this node's consumers.
    version: u64,
}

struct Inner {
    qs: QueueState,
    last_applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    consumers: Vec<QConsumer>,
    next_consumer: usize,
    out: HashMap<u64, Out>,
    /// The term this member leads in, per its Raft metrics.
    leader_term: Option<u64>,
    /// The epoch this member proposed when it became leader.
    my_epoch: Option<u64>,
    horizon_asked: u64,
    deleted: bool,
    /// Body bytes of the messages applied since a snapshot was last asked for.
    log_bytes: u64,
    /// The id the next consumer of this node's clients gets.
    next_consumer_id: u64,
    /// Deliveries from the leader's node that a consumer's channel could not take yet
    /// (consumer id, message), in order; offered again when its channel settles something.
    parked: Vec<(u64, QueuedMessage)>,
    subscription: Subscription,
}

impl Inner {
    fn leading(&self) -> bool {
        self.my_epoch.is_some_and(|e| e == self.qs.epoch())
    }

    /// Ready messages not handed out, counted.
    fn ready_count(&self) -> usize {
        let taken = self
            .out
            .keys()
            .filter(|k| self.qs.ready().contains(k))
            .count();
        self.qs.ready().len() - taken
    }
}

/// Commands to propose, gathered under the lock and sent after.
#[derive(Default)]
struct Proposals {
    /// Delivered messages: key and delivery count.
    checkout: Vec<(u64, u32)>,
    acked: Vec<u64>,
    rejected: Vec<u64>,
    returned: Vec<u64>,
    expired: Vec<u64>,
    maxlen: Vec<u64>,
    purged: Vec<u64>,
    horizon: Option<u64>,
}

/// A quorum queue (`x-queue-type: quorum`).
pub struct QuorumQueue {
    name: Arc<str>,
    vhost: Arc<str>,
    key: String,
    arguments: FieldTable,
    declared: QueueArgs,
    overflow_declared: bool,
    args: RwLock<Arc<QueueArgs>>,
    applied: RwLock<Arc<Applied>>,
    stats: QueueStats,
    order: Mutex<()>,
    clock: Arc<dyn Clock>,
    dead_letters: Weak<dyn DeadLetterSink>,
    node: Arc<QuorumNode>,
    inner: Mutex<Inner>,
    submit: mpsc::UnboundedSender<Submit>,
    raft: OnceLock<Raft<TypeConfig>>,
    last_used: AtomicU64,
    deliveries: AtomicU64,
    deleted: AtomicBool,
    /// Set while the queue is in its vhost's sweep set (a quorum queue stays in it: its
    /// sweep is what expires messages and the queue).
    sweep_mark: AtomicBool,
    /// The queue itself, for the tasks its `&self` methods start.
    myself: Weak<QuorumQueue>,
    /// Signalled when the queue is deleted: its proposer stops (and with it the last
    /// reference its tasks hold, so that the queue, its Raft instance and log are freed).
    stop: tokio::sync::Notify,
    /// The group's Raft instance from the moment it exists (`raft` is set only once the
    /// group is initialized): a deletion shuts down whatever was started.
    started: Mutex<Option<Raft<TypeConfig>>>,
    /// Becomes true once the group's task has returned: a deletion forgets the group's log
    /// only after that, so that no record of the deleted group follows its `DROP` record.
    ended: tokio::sync::watch::Sender<bool>,
    /// The drop of a deleted queue of the same name that was under way at this queue's
    /// declare: the group waits for it before it writes to the log, and so does this
    /// queue's own drop (so that drops of one name reach the log in order).
    previous_drop: Mutex<Option<tokio::sync::watch::Receiver<bool>>>,
}

impl std::fmt::Debug for QuorumQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuorumQueue")
            .field("name", &self.name)
            .field("vhost", &self.vhost)
            .finish()
    }
}

/// The delivery limit of declared arguments: `x-delivery-limit`, RabbitMQ 4.x's 20 when
/// absent, none when negative.
fn delivery_limit(args: &FieldTable) -> Option<u32> {
    match args.get("x-delivery-limit").and_then(|v| v.as_i64()) {
        None => Some(DEFAULT_DELIVERY_LIMIT),
        Some(n) if n < 0 => None,
        Some(n) => Some(n.min(i64::from(u32::MAX - 1)) as u32),
    }
}

/// The settings of a quorum queue from its declared arguments (validated at declare).
fn parse_args(arguments: &FieldTable) -> QueueArgs {
    let int = |k: &str| arguments.get(k).and_then(|v| v.as_i64()).map(|n| n as u64);
    let overflow = match arguments.get("x-overflow").and_then(|v| v.as_str()) {
        Some("reject-publish") => Overflow::RejectPublish,
        // RabbitMQ's quorum queues take reject-publish-dlx for drop-head.
        _ => Overflow::DropHead,
    };
    QueueArgs {
        message_ttl: int("x-message-ttl"),
        expires: int("x-expires"),
        max_length: int("x-max-length"),
        max_length_bytes: int("x-max-length-bytes"),
        overflow,
        dead_letter_exchange: arguments
            .get("x-dead-letter-exchange")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        dead_letter_routing_key: arguments
            .get("x-dead-letter-routing-key")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        max_priority: None,
        single_active_consumer: arguments
            .get("x-single-active-consumer")
            .and_then(|v| v.as_bool())
            .unwrap_or(false),
        consumer_timeout: int("x-consumer-timeout"),
    }
}

/// The message with RabbitMQ's `x-delivery-count` header when it was returned before.
fn with_delivery_count(m: &QMsg) -> Arc<Message> {
    if m.delivery_count == 0 {
        return m.message.clone();
    }
    let src = &m.message;
    let mut props = src.properties.clone();
    let mut headers = props.headers.take().unwrap_or_default();
    headers.insert(
        "x-delivery-count",
        FieldValue::I64(i64::from(m.delivery_count)),
    );
    props.headers = Some(headers);
    let mut copy = Message::new(
        src.exchange.clone(),
        src.routing_key.clone(),
        props,
        src.body.clone(),
    );
    copy.sender_keys = src.sender_keys.clone();
    Arc::new(copy)
}

impl QuorumQueue {
    /// Builds the queue and starts its Raft group on the node's runtime: a new group
    /// (declare) is initialized with the node's members, a recovered one replays its
    /// snapshot and log.
    pub(crate) fn start(node: Arc<QuorumNode>, spec: QueueSpec) -> Arc<Queue> {
        let key = crate::node::group_key(&spec.vhost, &spec.name);
        // Started at another node's request: that node initializes the group.
        let joining = node.cluster().is_some_and(|c| c.take_joining(&key));
        let (tx, rx) = mpsc::unbounded_channel();
        let declared = parse_args(&spec.arguments);
        let limit = delivery_limit(&spec.arguments);
        let now = spec.clock.now_ms();
        let q = Arc::new_cyclic(|myself| QuorumQueue {
            myself: myself.clone(),
            stop: tokio::sync::Notify::new(),
            started: Mutex::new(None),
            ended: tokio::sync::watch::Sender::new(false),
            previous_drop: Mutex::new(None),
            name: spec.name,
            vhost: spec.vhost,
            key,
            overflow_declared: spec.arguments.contains_key("x-overflow"),
            arguments: spec.arguments,
            args: RwLock::new(Arc::new(declared.clone())),
            declared,
            applied: RwLock::new(Arc::default()),
            stats: QueueStats::default(),
            order: Mutex::new(()),
            clock: spec.clock,
            dead_letters: spec.dead_letters,
            node: node.clone(),
            inner: Mutex::new(Inner {
                qs: QueueState::new(limit),
                last_applied: None,
                membership: StoredMembership::default(),
                consumers: Vec::new(),
                next_consumer: 0,
                out: HashMap::new(),
                leader_term: None,
                my_epoch: None,
                horizon_asked: 0,
                deleted: false,
                log_bytes: 0,
                next_consumer_id: 1,
                parked: Vec::new(),
                subscription: Subscription::default(),
            }),
            submit: tx,
            raft: OnceLock::new(),
            last_used: AtomicU64::new(now),
            deliveries: AtomicU64::new(0),
            deleted: AtomicBool::new(false),
            sweep_mark: AtomicBool::new(false),
        });
        node.register_queue(&q.key, &q);
        // Claimed now, so that the node's end of recovery does not take it for an orphan.
        let recovered = node.take_recovered(&q.key);
        // A queue of this name deleted just before: its group must be gone from the log
        // before this one writes there (taken now, so that this queue's own deletion is
        // never waited for here).
        let previous = node.drop_in_progress(&q.key);
        q.previous_drop.lock().clone_from(&previous);
        let runner = q.clone();
        node.runtime.spawn(async move {
            let mut rx = rx;
            match runner.clone().run(&mut rx, recovered, joining, previous).await {
                // (A queue deleted while its group started may see its Raft instance shut
                // down under it.)
                Err(e) if !runner.is_deleted() => {
                    warn!(queue = %runner.name, vhost = %runner.vhost, error = %e, "quorum queue stopped");
                }
                _ => {}
            }
            // However the group stopped (deleted, or its start failed), what is still
            // submitted is refused rather than dropped unanswered.
            refuse_waiting(&mut rx, None);
            runner.ended.send_replace(true);
        });
        q
    }

    /// Opens the group's storage, starts Raft, then proposes what connections submit. A new
    /// group is initialized here unless this member was started at another node's request
    /// (`joining`); in a cluster its members are placed first (see
    /// [`QuorumNode::place_members`]). Waits first for `previous`, the drop of a deleted
    /// group of the same name; returns at once if this queue is deleted before its group
    /// starts, and once its proposer stops after a deletion.
    async fn run(
        self: Arc<Self>,
        rx: &mut mpsc::UnboundedReceiver<Submit>,
        recovered: GroupLog,
        joining: bool,
        previous: Option<tokio::sync::watch::Receiver<bool>>,
    ) -> std::result::Result<(), String> {
        let node = self.node.clone();
        if let Some(mut done) = previous {
            tokio::select! {
                _ = done.wait_for(|d| *d) => {}
                // Deleted meanwhile: what was submitted is refused at once (its own drop
                // waits for the previous one).
                _ = self.stop.notified() => return Ok(()),
            }
        }
        if self.is_deleted() {
            return Ok(());
        }
        let log = node.log()?;
        let fresh = recovered.entries.is_empty() && recovered.vote.is_none();
        let store = LogStore::new(&self.key, log, recovered)?;
        let path = node.snapshot_path(&self.key);
        if fresh {
            // A queue of this name deleted before may have left a snapshot.
            let _ = std::fs::remove_file(&path);
        } else if let Ok(raw) = std::fs::read(&path) {
            let raw = Bytes::from(raw);
            let (meta, state) = decode_snapshot(&raw)?;
            let state = QueueState::decode(&state).map_err(|e| e.to_string())?;
            self.install_state(state, meta.last_log_id, meta.last_membership);
        }
        let sm = StateMachine {
            queue: Arc::downgrade(&self),
            path,
        };
        let network = GroupNetwork {
            group: self.key.as_str().into(),
            network: node.network.clone(),
        };
        let raft = Raft::new(
            node.cfg.node_id,
            node.raft_config(),
            network,
            store.clone(),
            sm,
        )
        .await
        .map_err(|e| e.to_string())?;
        *self.started.lock() = Some(raft.clone());
        if let Some(c) = node.cluster() {
            c.register_group(&self.key, raft.clone());
            let server: Arc<dyn crate::remote::GroupServer> = self.clone();
            c.register_server(&self.key, Arc::downgrade(&server));
        }
        if fresh && !joining && !raft.is_initialized().await.map_err(|e| e.to_string())? {
            let size = self.initial_group_size();
            let placed = node
                .place_members(&self.vhost, &self.name, &self.arguments, size)
                .await;
            if let Some(members) = &placed {
                // The member that initializes the group wins its first election.
                let leader = self.first_leader(members);
                let elsewhere = leader != node.cfg.node_id
                    && node.initialize_on(leader, &self.key, members).await;
                if !elsewhere {
                    if let Err(e) = raft.initialize(members.clone()).await {
                        debug!(queue = %self.name, error = %e, "quorum queue group already initialized");
                    }
                }
            }
            if placed.is_some() && node.cluster().is_some() {
                // Proposals before the first election is won would be refused (no leader).
                let _ = raft
                    .wait(Some(LEADER_WAIT))
                    .metrics(|m| m.current_leader.is_some(), "a leader")
                    .await;
            }
        }
        // A group of this node alone need not wait an election timeout after a restart.
        let alone = {
            let m = raft.metrics().borrow().membership_config.clone();
            let voters: Vec<NodeId> = m.membership().voter_ids().collect();
            voters == [node.cfg.node_id]
        };
        if !fresh && alone {
            let _ = raft.trigger().elect().await;
        }
        let _ = self.raft.set(raft.clone());
        let watcher = self.clone();
        let metrics_raft = raft.clone();
        tokio::spawn(async move { watcher.watch_leadership(metrics_raft).await });
        self.propose_loop(raft, rx).await;
        Ok(())
    }

    /// Members of the group at declare: `x-quorum-initial-group-size`, by default (and at
    /// most) the number of nodes.
    fn initial_group_size(&self) -> usize {
        let nodes = self.node.members.lock().len();
        match self
            .arguments
            .get("x-quorum-initial-group-size")
            .and_then(|v| v.as_i64())
        {
            Some(n) if n >= 1 => (n as usize).min(nodes),
            _ => nodes,
        }
    }

    /// Where the new group's first leader goes, by `x-queue-leader-locator` (else the
    /// `queue-leader-locator` policy key): `client-local` (the default, as RabbitMQ 4) this
    /// node, `balanced` (and `least-leaders`, `random`) the member whose node leads the fewest
    /// quorum queues this node knows of (this node on a tie).
    fn first_leader(&self, members: &BTreeMap<NodeId, BasicNode>) -> NodeId {
        let me = self.node.cfg.node_id;
        let declared = self
            .arguments
            .get("x-queue-leader-locator")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        let locator =
            declared.or_else(
                || match self.applied.read().definition.get("queue-leader-locator") {
                    Some(warren_broker::policy::PolicyValue::Text(t)) => Some(t.clone()),
                    _ => None,
                },
            );
        if locator.is_none_or(|l| l == "client-local") {
            return me;
        }
        let counts = self.node.leader_counts();
        members
            .keys()
            .copied()
            .min_by_key(|id| (counts.get(id).copied().unwrap_or(0), *id != me, *id))
            .unwrap_or(me)
    }

    /// Follows the group's Raft metrics: this member leads in a term, or not.
    async fn watch_leadership(self: Arc<Self>, raft: Raft<TypeConfig>) {
        let me = self.node.cfg.node_id;
        let mut metrics = raft.metrics();
        loop {
            let term = {
                let m = metrics.borrow();
                (m.current_leader == Some(me) && m.state.is_leader()).then_some(m.current_term)
            };
            self.set_leadership(term);
            self.sync_subscription();
            if metrics.changed().await.is_err() || self.deleted.load(Ordering::Acquire) {
                return;
            }
        }
    }

    fn set_leadership(self: &Arc<Self>, term: Option<u64>) {
        let mut st = self.inner.lock();
        if st.leader_term == term {
            return;
        }
        if self.node.cluster().is_some() && st.leader_term.is_some() != term.is_some() {
            let node = self.node.cfg.node_id;
            match term {
                Some(term) => {
                    info!(queue = %self.name, vhost = %self.vhost, node, term, "this node leads the quorum queue")
                }
                None => {
                    info!(queue = %self.name, vhost = %self.vhost, node, "this node no longer leads the quorum queue")
                }
            }
        }
        {
            st.leader_term = term;
            st.horizon_asked = st.qs.horizon();
            st.out.clear();
            // Other nodes' consumers subscribe again with the new term; deliveries parked
            // from the previous leader are returned by the new leadership's Lead.
            st.consumers.retain(|c| c.remote.is_none());
            st.parked.clear();
            st.subscription.target = None;
            for c in &mut st.consumers {
                c.in_flight = 0;
            }
            st.my_epoch = term.map(|_| random_epoch());
            if let Some(epoch) = st.my_epoch {
                self.send(Command::Lead(epoch));
            }
        }
    }

    /// Takes what was submitted, a batch at a time, and proposes it.
    async fn propose_loop(&self, raft: Raft<TypeConfig>, rx: &mut mpsc::UnboundedReceiver<Submit>) {
        let slots = Arc::new(tokio::sync::Semaphore::new(MAX_IN_FLIGHT));
        loop {
            let first = tokio::select! {
                s = rx.recv() => match s {
                    Some(s) => s,
                    None => return,
                },
                // Deleted: the task's end refuses what is still submitted.
                _ = self.stop.notified() => return,
            };
            // (A group that cannot commit, without a quorum, holds every slot: a deletion
            // still ends this task.)
            let permit = tokio::select! {
                p = slots.clone().acquire_owned() => match p {
                    Ok(p) => p,
                    Err(_) => return,
                },
                _ = self.stop.notified() => {
                    refuse_waiting(rx, Some(first));
                    return;
                }
            };
            let mut cmds: Vec<Command> = Vec::new();
            let mut waiters: Vec<Waiter> = Vec::new();
            let mut bytes = 0usize;
            let mut add = |s: Submit, bytes: &mut usize| match s {
                Submit::Publish(m, at, w) => {
                    *bytes += m.body.len();
                    waiters.extend(w);
                    match cmds.last_mut() {
                        Some(Command::Enqueue(v)) => v.push((m, at)),
                        _ => cmds.push(Command::Enqueue(vec![(m, at)])),
                    }
                }
                Submit::Cmd(c) => cmds.push(c),
            };
            add(first, &mut bytes);
            while bytes < MAX_ENTRY_BYTES {
                match rx.try_recv() {
                    Ok(s) => add(s, &mut bytes),
                    Err(_) => break,
                }
            }
            if self.deleted.load(Ordering::Acquire) {
                complete(waiters, false);
                continue;
            }
            // A member that does not lead forwards to the leader's node what its clients
            // submitted (in order, over the one connection to that node).
            let cluster = self.node.cluster();
            let mut leader = raft.metrics().borrow().current_leader;
            if leader.is_none() {
                // An election is under way (on a single node too: the first one after the
                // group is initialized or recovered, whose vote is not yet on disk): its
                // outcome is waited for (publishers see their confirms delayed, as with
                // RabbitMQ's quorum queues, rather than nacks).
                leader = raft
                    .wait(Some(LEADER_WAIT))
                    .metrics(|m| m.current_leader.is_some(), "a leader")
                    .await
                    .ok()
                    .and_then(|m| m.current_leader);
            }
            if let (Some(_), Some(gone)) = (cluster, leader) {
                // (A member that has not learnt the membership yet knows no voters.)
                let voter = |m: &openraft::RaftMetrics<u64, openraft::BasicNode>, l: u64| {
                    let mut voters = m.membership_config.membership().voter_ids().peekable();
                    voters.peek().is_none() || voters.any(|v| v == l)
                };
                if !voter(&raft.metrics().borrow(), gone) {
                    // The leader's member was just removed from the group: it steps down,
                    // and the next leader is waited for.
                    leader = raft
                        .wait(Some(LEADER_WAIT))
                        .metrics(
                            move |m| m.current_leader.is_some_and(|l| l != gone && voter(m, l)),
                            "a leader among the members",
                        )
                        .await
                        .ok()
                        .and_then(|m| m.current_leader);
                }
            }
            if let (Some(cluster), Some(gone)) = (cluster, leader) {
                if gone != self.node.cfg.node_id && cluster.generation(gone).is_none() {
                    // The leader's node is not reachable (it died, most likely): the next
                    // leader is waited for, as for an election, rather than nacking.
                    leader = raft
                        .wait(Some(LEADER_WAIT))
                        .metrics(
                            move |m| m.current_leader.is_some_and(|l| l != gone),
                            "a new leader",
                        )
                        .await
                        .ok()
                        .and_then(|m| m.current_leader);
                }
            }
            if let (Some(cluster), Some(leader)) = (cluster, leader) {
                if leader != self.node.cfg.node_id {
                    let req = Request::Propose {
                        group: self.key.clone(),
                        batch: Batch(cmds),
                    };
                    match cluster.send_now(leader, req) {
                        Ok(call) => {
                            tokio::spawn(async move {
                                let r = call.wait(FORWARD_TIMEOUT).await;
                                let ok = matches!(r, Ok(Response::Proposed(Ok(()))));
                                if !ok {
                                    debug!(leader, answer = ?r, "forwarded quorum queue proposal failed");
                                }
                                complete(waiters, ok);
                                drop(permit);
                            });
                        }
                        Err(e) => {
                            debug!(error = %e, "quorum queue proposal not forwarded");
                            complete(waiters, false);
                        }
                    }
                    continue;
                }
            }
            match raft.client_write_ff(Batch(cmds)).await {
                Ok(done) => {
                    let queue = self.myself.clone();
                    tokio::spawn(async move {
                        let ok = matches!(done.await, Ok(Ok(_)));
                        if ok && !waiters.is_empty() {
                            until_ready_to_hand_out(|| {
                                queue.upgrade().is_none_or(|q| q.ready_to_hand_out())
                            })
                            .await;
                        }
                        complete(waiters, ok);
                        drop(permit);
                    });
                }
                Err(e) => {
                    debug!(error = %e, "quorum queue proposal refused");
                    complete(waiters, false);
                }
            }
        }
    }

    /// Whether this member, leading in Raft, can hand out the queue's head now (its
    /// leadership's [`Command::Lead`] is applied, and the horizon is past the head), or this
    /// node does not lead (any more). A new leadership proposes both entries as it begins,
    /// often right behind the first publishes.
    pub(crate) fn ready_to_hand_out(&self) -> bool {
        let st = self.inner.lock();
        let head_out = || {
            Self::next_ready(&st, 0)
                .and_then(|k| st.qs.get(k).map(|m| m.redelivered || k <= st.qs.horizon()))
                .unwrap_or(true)
        };
        if st.deleted || (st.leading() && head_out()) {
            return true;
        }
        drop(st);
        let me = self.node.cfg.node_id;
        self.raft
            .get()
            .is_none_or(|r| r.metrics().borrow().current_leader != Some(me))
    }

    fn send(&self, cmd: Command) {
        let _ = self.submit.send(Submit::Cmd(cmd));
    }

    fn propose(&self, p: Proposals) {
        if let Some(h) = p.horizon {
            self.send(Command::Horizon(h));
        }
        if !p.checkout.is_empty() {
            let epoch = self.inner.lock().qs.epoch();
            let (keys, counts) = p.checkout.into_iter().unzip();
            self.send(Command::Checkout {
                epoch,
                keys,
                counts,
            });
        }
        for (reason, keys) in [
            (SettleReason::Ack, p.acked),
            (SettleReason::Rejected, p.rejected),
            (SettleReason::Expired, p.expired),
            (SettleReason::Maxlen, p.maxlen),
            (SettleReason::Purged, p.purged),
        ] {
            if !keys.is_empty() {
                self.send(Command::Settle { reason, keys });
            }
        }
        if !p.returned.is_empty() {
            self.send(Command::Return { keys: p.returned });
        }
    }

    /// openraft's state machine: what was applied last and the membership.
    pub(crate) fn applied_state(
        &self,
    ) -> (Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>) {
        let st = self.inner.lock();
        (st.last_applied, st.membership.clone())
    }

    /// The state to snapshot, read under one lock.
    pub(crate) fn snapshot_state(
        &self,
    ) -> (
        Bytes,
        Option<LogId<NodeId>>,
        StoredMembership<NodeId, BasicNode>,
    ) {
        let st = self.inner.lock();
        (st.qs.encode(), st.last_applied, st.membership.clone())
    }

    /// Replaces the state with a snapshot's.
    pub(crate) fn install_state(
        &self,
        state: QueueState,
        last: Option<LogId<NodeId>>,
        membership: StoredMembership<NodeId, BasicNode>,
    ) {
        let mut st = self.inner.lock();
        st.qs = state;
        st.last_applied = last;
        st.membership = membership;
        st.out.clear();
    }

    /// Applies committed entries; the leader then delivers and dead-letters.
    pub(crate) fn apply(self: &Arc<Self>, entries: Vec<Entry<TypeConfig>>) {
        let mut dead = Vec::new();
        let mut props = Proposals::default();
        {
            let mut st = self.inner.lock();
            let mut enqueued = false;
            for e in entries {
                st.last_applied = Some(e.log_id);
                let mut fx = Effects::default();
                match e.payload {
                    EntryPayload::Blank => {}
                    EntryPayload::Normal(batch) => {
                        for c in &batch.0 {
                            if let Command::Enqueue(msgs) = c {
                                st.log_bytes +=
                                    msgs.iter().map(|(m, _)| m.body.len() as u64).sum::<u64>();
                            }
                            st.qs.apply(c, &mut fx);
                        }
                    }
                    EntryPayload::Membership(m) => {
                        st.membership = StoredMembership::new(Some(e.log_id), m);
                    }
                }
                if fx.new_term {
                    st.horizon_asked = st.qs.horizon();
                    st.out.clear();
                    for c in &mut st.consumers {
                        c.in_flight = 0;
                    }
                }
                for k in fx.settled.iter().chain(&fx.returned) {
                    if let Some(Out::Remote { node, consumer }) = st.out.remove(k) {
                        let holder = Some((node, consumer));
                        if let Some(c) = st.consumers.iter_mut().find(|c| c.remote == holder) {
                            c.in_flight = c.in_flight.saturating_sub(1);
                        }
                    }
                }
                enqueued |= fx.enqueued;
                if st.leading() {
                    dead.extend(fx.dead);
                }
            }
            if st.deleted {
                return;
            }
            // The log holds every body since the last snapshot, in memory: once that is much
            // more than the queue holds, a snapshot (small, then) lets it be purged.
            if st.log_bytes > SNAPSHOT_LOG_BYTES && st.qs.ready_bytes() < st.log_bytes / 4 {
                st.log_bytes = 0;
                if let Some(raft) = self.raft.get().cloned() {
                    tokio::spawn(async move {
                        let _ = raft.trigger().snapshot().await;
                    });
                }
            }
            if st.leading() {
                if enqueued {
                    self.enforce_limits_locked(&mut st, &mut props);
                }
                let this: Arc<Queue> = self.clone();
                self.dispatch_locked(&mut st, &this, &mut props);
            }
        }
        self.propose(props);
        self.publish_dead(dead);
    }

    /// Publishes dead letters to the dead-letter exchange (outside every lock).
    fn publish_dead(&self, dead: Vec<(Arc<Message>, DeathReason)>) {
        if dead.is_empty() {
            return;
        }
        let letters = dead
            .into_iter()
            .map(|(message, reason)| DeadLetter { message, reason })
            .collect();
        QueueBackend::dead_letter(self, letters);
    }

    /// This member's Raft instance, once started.
    pub fn raft(&self) -> Option<&Raft<TypeConfig>> {
        self.raft.get()
    }
}

impl Drop for QuorumQueue {
    fn drop(&mut self) {
        debug!(queue = %self.name, vhost = %self.vhost, "quorum queue freed");
    }
}

/// What a stopped queue's proposer still holds (`first`, taken already) or finds submitted
/// is refused: its publishes are nacked, and later submissions fail (and are nacked by
/// their sender).
fn refuse_waiting(rx: &mut mpsc::UnboundedReceiver<Submit>, first: Option<Submit>) {
    rx.close();
    for s in first
        .into_iter()
        .chain(std::iter::from_fn(|| rx.try_recv().ok()))
    {
        if let Submit::Publish(_, _, Some(w)) = s {
            complete(vec![w], false);
        }
    }
}

/// Waits, up to [`LEADER_WAIT`], until `applied()` (polled every millisecond): the
/// confirms of messages committed by a member whose leadership has just begun are held
/// until it can hand out the head (see [`QuorumQueue::ready_to_hand_out`]), so that a
/// basic.get right after a confirm gets a message, as from RabbitMQ. On a leadership that
/// began before, `applied()` holds at once.
pub(crate) async fn until_ready_to_hand_out(applied: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + LEADER_WAIT;
    while !applied() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
}

/// Awaits `fut` (its output is dropped), the step `what` of queue `queue`'s drop, with a
/// warning when it has taken more than 10 s (the group's task or Raft instance does not
/// stop).
pub(crate) async fn drop_step<F: std::future::Future>(queue: &str, what: &str, fut: F) {
    tokio::pin!(fut);
    let done = tokio::time::timeout(std::time::Duration::from_secs(10), &mut fut)
        .await
        .is_ok();
    if !done {
        warn!(
            queue,
            "a deleted quorum queue's drop still waits after 10 s for {what}"
        );
        let _ = fut.await;
    }
}

/// A fresh leadership epoch: unique in practice (64 random bits).
fn random_epoch() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(N.fetch_add(1, Ordering::Relaxed));
    if let Ok(t) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
        h.write_u128(t.as_nanos());
    }
    h.finish() | 1
}

/// Completes publisher-confirm waiters, one call per sink for a run of the same sink.
fn complete(waiters: Vec<Waiter>, ok: bool) {
    let mut run: Vec<u64> = Vec::new();
    let mut sink: Option<Arc<dyn Completion>> = None;
    for (s, token) in waiters {
        match &sink {
            Some(cur) if Arc::ptr_eq(cur, &s) => run.push(token),
            _ => {
                if let Some(cur) = sink.take() {
                    cur.complete(&run, ok);
                }
                run.clear();
                run.push(token);
                sink = Some(s);
            }
        }
    }
    if let Some(cur) = sink {
        cur.complete(&run, ok);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delivery_limit_defaults_to_twenty() {
        let mut t = FieldTable::new();
        assert_eq!(delivery_limit(&t), Some(20));
        t.insert("x-delivery-limit", FieldValue::I32(-1));
        assert_eq!(delivery_limit(&t), None);
        t.insert("x-delivery-limit", FieldValue::I32(3));
        assert_eq!(delivery_limit(&t), Some(3));
    }
}
