//! The cluster's metadata group: one Raft group with a member on every node of the cluster,
//! whose log orders the metadata changes every node applies (as RabbitMQ 4 keeps its
//! metadata in Khepri, a Raft-replicated store).
//!
//! What it carries (see [`warren_broker::replica`]): the durable topology changes of every
//! vhost (exchanges, bindings, policies; [`TopologyCommand`]s, already decided on the node
//! that made them) and, after each change of users, vhosts, permissions or limits, the whole
//! access-control database. A change is made on the node a client asked, proposed here, and
//! answered once committed (on disk on a majority of the nodes); every other node applies it
//! in log order when it learns the commit. The node that made the change skips its own entry
//! (it applied it already) unless it restarted since: after a restart, entries past the last
//! applied one are applied again, which changes nothing that is already so.
//!
//! Storage: the group's log is its own `warren_store::raftlog` in `<quorum dir>/metadata/`
//! (not the queues' shared log, whose segments a group that never purges would hold), kept
//! whole: metadata changes are small (a few hundred bytes each) and few. The last applied
//! entry and the membership are written to `<quorum dir>/metadata/applied.json` after each
//! applied batch.
//!
//! Entry payload: [`Command::Meta`] holding an AMQP field table: `origin` (node id),
//! `nonce` (per-process proposal number), `kind` (`topology`: `vhost` and `commands`, each the
//! table of [`TopologyCommand::to_table`]; `access`: `delta`, the change of the
//! access-control database, see [`warren_broker::replica::access_delta`]).
//!
//! The group's members are the cluster's nodes. At the first start the seed node with the
//! lowest id, its log empty, initializes the group with every seed node (once: a restart
//! finds its log); the others wait to hear from it. Nodes are added to a running cluster and
//! removed with [`MetadataGroup::change_node`] (the new node catches up as a learner, then
//! votes), and every node's transport follows the group's membership: the nodes it lists are
//! dialed and accepted, the others refused.

use crate::command::{Batch, Command};
use crate::network::GroupNetwork;
use crate::node::QuorumNode;
use crate::storage::LogStore;
use crate::transport::{Request, Response};
use crate::TypeConfig;
use bytes::{Bytes, BytesMut};
use openraft::storage::RaftStateMachine;
use openraft::ChangeMembers;
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, Raft, RaftSnapshotBuilder, Snapshot, SnapshotMeta,
    StorageError, StorageIOError, StoredMembership,
};
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Cursor;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tracing::{debug, info, warn};
use warren_amqp::table::{decode_table, encode_table, Decoder, FieldTable, FieldValue};
use warren_broker::replica::{Done, MetadataReplicator};
use warren_broker::vhost::log::TopologyCommand;
use warren_broker::Broker;

type NodeId = u64;

/// The metadata group's key in the transport (no queue's key: those hold U+001F).
pub const GROUP: &str = "\u{1e}metadata";

/// How long a change waits for a leader of the metadata group before it is refused.
const LEADER_WAIT: Duration = Duration::from_secs(10);

/// At most this many changes go in one entry.
const MAX_BATCH: usize = 256;

fn io_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write(&std::io::Error::other(e.to_string())).into()
}

/// One metadata change, as replicated.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// A durable topology change of `vhost`.
    Topology {
        /// The vhost.
        vhost: String,
        /// Its primitive changes, in order.
        commands: Vec<TopologyCommand>,
    },
    /// A change of the access-control database.
    Access {
        /// What changed (see [`warren_broker::replica::access_delta`]).
        delta: String,
    },
}

fn text(t: &FieldTable, k: &str) -> Result<String, String> {
    t.get(k)
        .and_then(|v| v.as_str())
        .map(str::to_string)
        .ok_or_else(|| format!("metadata entry without '{k}'"))
}

fn long(s: &str) -> FieldValue {
    FieldValue::LongString(Bytes::copy_from_slice(s.as_bytes()))
}

/// Encodes `change` made by node `origin` as its `nonce`th proposal.
pub fn encode_change(origin: NodeId, nonce: u64, change: &Change) -> Bytes {
    let mut t = FieldTable::new();
    t.insert("origin", FieldValue::I64(origin as i64));
    t.insert("nonce", FieldValue::I64(nonce as i64));
    match change {
        Change::Topology { vhost, commands } => {
            t.insert("kind", long("topology"));
            t.insert("vhost", long(vhost));
            TopologyCommand::put_list(&mut t, commands);
        }
        Change::Access { delta } => {
            t.insert("kind", long("access"));
            t.insert("delta", long(delta));
        }
    }
    let mut b = BytesMut::new();
    encode_table(&t, &mut b);
    b.freeze()
}

/// Decodes what [`encode_change`] wrote: origin, nonce and the change.
pub fn decode_change(b: &[u8]) -> Result<(NodeId, u64, Change), String> {
    let t = decode_table(&mut Decoder::new(b), 64).map_err(|e| e.to_string())?;
    let num = |k: &str| {
        t.get(k)
            .and_then(|v| v.as_i64())
            .map(|n| n as u64)
            .ok_or_else(|| format!("metadata entry without '{k}'"))
    };
    let (origin, nonce) = (num("origin")?, num("nonce")?);
    let change = match text(&t, "kind")?.as_str() {
        "topology" => Change::Topology {
            vhost: text(&t, "vhost")?,
            commands: TopologyCommand::list_from(&t)?,
        },
        "access" => Change::Access {
            delta: text(&t, "delta")?,
        },
        other => return Err(format!("unknown metadata change '{other}'")),
    };
    Ok((origin, nonce, change))
}

/// A change waiting to be proposed, and who waits for it.
type Pending = (Bytes, Done);

/// This node's member of the metadata group, and the broker's [`MetadataReplicator`].
pub struct MetadataGroup {
    node: Arc<QuorumNode>,
    broker: Weak<Broker>,
    raft: OnceLock<Raft<TypeConfig>>,
    /// This process's proposals not applied yet by this node's state machine (already
    /// applied here when they were made): nonce -> [`Self::foreign`] when it was made.
    mine: Mutex<HashMap<u64, u64>>,
    /// How many other nodes' changes this node has applied: when one was applied between
    /// this node's own change and that change's commit, the own change is applied again at
    /// its place in the log, so that every node ends with the log order's outcome.
    foreign: AtomicU64,
    next_nonce: AtomicU64,
    submit: mpsc::UnboundedSender<Pending>,
}

impl std::fmt::Debug for MetadataGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetadataGroup")
            .field("node_id", &self.node.cfg.node_id)
            .finish()
    }
}

impl MetadataGroup {
    /// Starts this node's member of the metadata group on the node's runtime, applying the
    /// other nodes' changes to `broker`. Changes handed to it before the group is up wait.
    /// `None` on a node that is not in a cluster.
    pub fn start(node: &Arc<QuorumNode>, broker: Weak<Broker>) -> Option<Arc<MetadataGroup>> {
        node.cluster()?;
        let (tx, rx) = mpsc::unbounded_channel();
        let g = Arc::new(MetadataGroup {
            node: node.clone(),
            broker,
            raft: OnceLock::new(),
            mine: Mutex::new(HashMap::new()),
            foreign: AtomicU64::new(0),
            next_nonce: AtomicU64::new(1),
            submit: tx,
        });
        let runner = g.clone();
        node.runtime.spawn(async move {
            match runner.clone().open().await {
                Ok(raft) => runner.propose_loop(raft, rx).await,
                Err(e) => warn!(error = %e, "the cluster's metadata group did not start"),
            }
        });
        Some(g)
    }

    fn dir(&self) -> PathBuf {
        self.node.cfg.dir.join("metadata")
    }

    /// Opens the log, starts Raft and, on a node whose log is empty, initializes the group
    /// with every seed node.
    async fn open(self: Arc<Self>) -> Result<Raft<TypeConfig>, String> {
        let dir = self.dir();
        let cfg = warren_store::raftlog::RaftLogConfig::new(dir.join("log"));
        let (log, mut groups) = tokio::task::spawn_blocking(move || {
            warren_store::raftlog::RaftLog::open(cfg).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())??;
        let recovered = groups.remove(GROUP).unwrap_or_default();
        let fresh = recovered.entries.is_empty() && recovered.vote.is_none();
        let store = LogStore::new(GROUP, log, recovered)?;
        let applied_path = dir.join("applied.json");
        let (applied, membership) = if fresh {
            let _ = std::fs::remove_file(&applied_path);
            (None, StoredMembership::default())
        } else {
            read_applied(&applied_path)
        };
        self.restore_proxies(&store, applied);
        if membership.membership().voter_ids().next().is_some() {
            // Nodes added or removed since the seed list was written, as of the last applied
            // entry (the log's later entries, below).
            self.node.set_cluster_nodes(nodes_of(&membership));
        }
        let sm = MetaMachine {
            group: Arc::downgrade(&self),
            applied,
            membership,
            path: applied_path,
        };
        let network = GroupNetwork {
            group: GROUP.into(),
            network: self.node.network.clone(),
        };
        let raft = Raft::new(
            self.node.cfg.node_id,
            self.raft_config(),
            network,
            store,
            sm,
        )
        .await
        .map_err(|e| e.to_string())?;
        let cluster = self.node.cluster().ok_or("not in a cluster")?.clone();
        cluster.register_group(GROUP, raft.clone());
        cluster.set_metadata(Arc::downgrade(&self));
        // The membership openraft found in the log (it reports it once it has read the log).
        let known = if fresh {
            raft.metrics().borrow().membership_config.clone()
        } else {
            raft.wait(Some(Duration::from_secs(3)))
                .metrics(
                    |m| {
                        m.membership_config
                            .membership()
                            .voter_ids()
                            .next()
                            .is_some()
                    },
                    "the metadata group's membership",
                )
                .await
                .map(|m| m.membership_config.clone())
                .unwrap_or_else(|_| raft.metrics().borrow().membership_config.clone())
        };
        if known.membership().voter_ids().next().is_some() {
            // Nodes added or removed since the seed list was written.
            self.node.set_cluster_nodes(nodes_of(&known));
        }
        let seeds = cluster.nodes();
        let first = seeds.keys().next() == Some(&self.node.cfg.node_id);
        if fresh && first && !raft.is_initialized().await.map_err(|e| e.to_string())? {
            let members: BTreeMap<NodeId, BasicNode> = seeds
                .iter()
                .map(|(id, addr)| (*id, BasicNode::new(addr)))
                .collect();
            if let Err(e) = raft.initialize(members).await {
                debug!(error = %e, "metadata group already initialized");
            }
        }
        let _ = self.raft.set(raft.clone());
        info!(
            node = self.node.cfg.node_id,
            "the cluster's metadata group started"
        );
        Ok(raft)
    }

    /// The queues' Raft settings, with no snapshots: the metadata log is kept whole.
    fn raft_config(&self) -> Arc<openraft::Config> {
        let base = self.node.raft_config();
        let cfg = openraft::Config {
            cluster_name: "warren-metadata".into(),
            snapshot_policy: openraft::SnapshotPolicy::Never,
            ..(*base).clone()
        };
        Arc::new(cfg.validate().expect("valid raft settings"))
    }

    /// Proposes what is submitted, in order, many changes per entry.
    async fn propose_loop(
        self: Arc<Self>,
        raft: Raft<TypeConfig>,
        mut rx: mpsc::UnboundedReceiver<Pending>,
    ) {
        while let Some(first) = rx.recv().await {
            let mut items = vec![first];
            while items.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(p) => items.push(p),
                    Err(_) => break,
                }
            }
            let batch = Batch(
                items
                    .iter()
                    .map(|(payload, _)| Command::Meta(payload.clone()))
                    .collect(),
            );
            let outcome = self.propose(&raft, batch).await;
            if let Err(e) = &outcome {
                warn!(error = %e, changes = items.len(), "metadata changes not committed");
            }
            for (_, done) in items {
                done(outcome.clone());
            }
        }
    }

    /// Proposes `batch` as one entry: at this node when it leads, else at the leader's node;
    /// waits up to [`LEADER_WAIT`] for a leader. Returns once the leader applied the entry.
    async fn propose(&self, raft: &Raft<TypeConfig>, batch: Batch) -> Result<(), String> {
        let deadline = Instant::now() + LEADER_WAIT;
        let me = self.node.cfg.node_id;
        let mut last = "no leader of the cluster's metadata group".to_string();
        loop {
            let leader = raft.metrics().borrow().current_leader;
            let left = deadline.saturating_duration_since(Instant::now());
            match leader {
                Some(l) if l == me => {
                    // A leader cut off from the majority would wait for ever: bounded.
                    match tokio::time::timeout(left, raft.client_write(batch.clone())).await {
                        Ok(Ok(_)) => return Ok(()),
                        Ok(Err(e)) => last = e.to_string(),
                        Err(_) => {
                            return Err("not committed in time: this node leads the cluster's \
                                 metadata group but cannot reach a majority of the nodes"
                                .into())
                        }
                    }
                }
                Some(l) => {
                    let cluster = self.node.cluster().ok_or("not in a cluster")?;
                    let req = Request::Propose {
                        group: GROUP.to_string(),
                        batch: batch.clone(),
                    };
                    match cluster.call(l, req, Duration::ZERO, left).await {
                        Ok(Response::Proposed(Ok(()))) => return Ok(()),
                        Ok(Response::Proposed(Err(e))) => last = e,
                        Ok(_) => last = format!("node {l} has no member of the metadata group"),
                        Err(e) => last = e.to_string(),
                    }
                }
                None => {}
            }
            if Instant::now() >= deadline {
                return Err(last);
            }
            let mut m = raft.metrics();
            let _ = tokio::time::timeout(Duration::from_millis(100), m.changed()).await;
        }
    }

    fn submit(&self, change: Change, done: Done) {
        let nonce = self.next_nonce.fetch_add(1, Ordering::Relaxed);
        let payload = encode_change(self.node.cfg.node_id, nonce, &change);
        let foreign = self.foreign.load(Ordering::Acquire);
        self.mine.lock().insert(nonce, foreign);
        if let Err(mpsc::error::SendError((_, done))) = self.submit.send((payload, done)) {
            self.mine.lock().remove(&nonce);
            done(Err("the cluster's metadata group is stopped".into()));
        }
    }

    /// Applies one committed change to this node's broker, unless this process made it (and
    /// applied it then) and applied no other node's change since: two conflicting changes
    /// made at the same moment on two nodes are each applied first on their own node, and
    /// then again in log order, so that every node keeps the later one.
    fn apply_change(&self, origin: NodeId, nonce: u64, change: Change) {
        let own = origin == self.node.cfg.node_id;
        let made_at = if own {
            self.mine.lock().remove(&nonce)
        } else {
            None
        };
        match made_at {
            Some(at) if at == self.foreign.load(Ordering::Acquire) => return,
            Some(_) => debug!(nonce, "own metadata change applied again in log order"),
            None => {}
        }
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        self.apply_committed(&broker, origin, change);
        if made_at.is_none() {
            self.foreign.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Applies one committed change (see [`Self::apply_change`]).
    fn apply_committed(&self, broker: &Broker, origin: NodeId, change: Change) {
        match change {
            Change::Topology { vhost, commands } => {
                let elsewhere = origin != self.node.cfg.node_id;
                let v = broker.vhost(&vhost);
                if let (true, Some(v)) = (elsewhere, &v) {
                    for c in &commands {
                        if let TopologyCommand::PutQueue {
                            name,
                            auto_delete,
                            arguments,
                        } = c
                        {
                            self.put_proxy(v, origin, name, *auto_delete, arguments.clone());
                        }
                    }
                }
                let n = broker.apply_replicated_topology(&vhost, &commands);
                debug!(%vhost, origin, applied = n, "replicated definitions change applied");
                if let (true, Some(v)) = (elsewhere, &v) {
                    for c in &commands {
                        if let TopologyCommand::RemoveQueue { name } = c {
                            remove_classic(v, name);
                        }
                    }
                }
            }
            Change::Access { delta } => {
                if let Err(e) = broker.apply_replicated_access_delta(&delta) {
                    warn!(origin, error = %e, "replicated access-control database not applied");
                }
            }
        }
    }

    /// Puts the proxy of queue `name` of `v`, unless a queue of that name is there (see
    /// [`crate::proxy`]): of a classic queue held by node `owner`, or of a quorum queue
    /// declared on node `owner` (this node has no member of it).
    pub(crate) fn put_proxy(
        &self,
        v: &warren_broker::VHost,
        owner: NodeId,
        name: &str,
        auto_delete: bool,
        arguments: FieldTable,
    ) -> bool {
        if v.queue(name, 0).is_ok() {
            return false;
        }
        self.place_proxy(&v.name, owner, name, auto_delete, arguments, |q| {
            v.put_remote_queue(q)
        })
    }

    /// Puts the proxy of quorum queue `name` of `v` in place of this node's member, whose
    /// removal from the group leaves the node without one, in one step (see
    /// [`warren_broker::VHost::hand_over_queue`]). False when no member is here.
    pub(crate) fn hand_over(
        &self,
        v: &warren_broker::VHost,
        name: &str,
        arguments: FieldTable,
    ) -> bool {
        let me = self.node.cfg.node_id;
        self.place_proxy(&v.name, me, name, false, arguments, |q| {
            v.hand_over_queue(q)
        })
    }

    /// Makes the proxy of queue `name` of vhost `vhost` (see [`Self::put_proxy`]) and has
    /// `place` put it in the vhost; the proxy is dropped when `place` returns false.
    fn place_proxy(
        &self,
        vhost: &str,
        owner: NodeId,
        name: &str,
        auto_delete: bool,
        arguments: FieldTable,
        place: impl FnOnce(Arc<warren_broker::Queue>) -> bool,
    ) -> bool {
        let Some(cluster) = self.node.cluster() else {
            return false;
        };
        let proxy = crate::proxy::ClassicProxy::new(
            cluster.clone(),
            self.node.runtime.clone(),
            owner,
            !is_classic(&arguments),
            vhost,
            name,
            auto_delete,
            arguments,
        );
        if !place(proxy.clone()) {
            use warren_broker::queue::QueueBackend;
            let _ = proxy.mark_deleted();
            return false;
        }
        true
    }

    /// Puts again, at start, the proxies of the queues other nodes hold (classic queues, and
    /// quorum queues with no member here), as the applied entries of the log (through
    /// `last`) leave them.
    fn restore_proxies(&self, store: &LogStore, last: Option<LogId<NodeId>>) {
        let Some(last) = last else { return };
        let Some(broker) = self.broker.upgrade() else {
            return;
        };
        let me = self.node.cfg.node_id;
        // (vhost, name) -> (owner, auto-delete, arguments) of a proxy, or none.
        let mut held: BTreeMap<(String, String), Option<ProxySpec>> = BTreeMap::new();
        for e in store.entries_through(last.index) {
            let EntryPayload::Normal(batch) = e.payload else {
                continue;
            };
            for c in batch.0 {
                let Command::Meta(b) = c else { continue };
                let Ok((origin, _, Change::Topology { vhost, commands })) = decode_change(&b)
                else {
                    continue;
                };
                for c in commands {
                    match c {
                        TopologyCommand::PutQueue {
                            name,
                            auto_delete,
                            arguments,
                        } => {
                            // A quorum queue declared here may have lost its member here since.
                            let proxy = (origin != me || !is_classic(&arguments)).then_some((
                                origin,
                                auto_delete,
                                arguments,
                            ));
                            held.insert((vhost.clone(), name), proxy);
                        }
                        TopologyCommand::RemoveQueue { name } => {
                            held.insert((vhost.clone(), name), None);
                        }
                        _ => {}
                    }
                }
            }
        }
        let mut restored = 0usize;
        for ((vhost, name), proxy) in held {
            let (Some((owner, auto_delete, arguments)), Some(v)) = (proxy, broker.vhost(&vhost))
            else {
                continue;
            };
            if self.put_proxy(&v, owner, &name, auto_delete, arguments) {
                restored += 1;
            }
        }
        if restored > 0 {
            info!(
                queues = restored,
                "queues of other nodes reachable from here"
            );
        }
    }

    /// The node that leads the metadata group, as this node knows it.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.get()?.metrics().borrow().current_leader
    }

    /// Adds node `id` at inter-node address `addr` to the cluster (`Some`: it must be running,
    /// with the cluster's secret; it catches up on the metadata as a learner, then votes), or
    /// removes it (`None`: it leaves the metadata group and every node's transport). Asked of
    /// any node: done by the node that leads the metadata group.
    ///
    /// Errors: no leader within [`LEADER_WAIT`]; the node is there already at another address;
    /// a node to remove is not in the cluster, or is the last one; the new node did not catch
    /// up within [`CATCH_UP_WAIT`]; openraft's refusal.
    pub async fn change_node(&self, id: NodeId, addr: Option<String>) -> Result<(), String> {
        let raft = self
            .raft
            .get()
            .cloned()
            .ok_or("the cluster's metadata group is starting")?;
        let deadline = Instant::now() + LEADER_WAIT;
        let me = self.node.cfg.node_id;
        loop {
            let leader = raft.metrics().borrow().current_leader;
            match leader {
                Some(l) if l == me => return self.change_node_here(&raft, id, addr).await,
                Some(l) => {
                    let cluster = self.node.cluster().ok_or("not in a cluster")?;
                    let req = Request::ChangeNode {
                        node: id,
                        address: addr,
                    };
                    return match cluster
                        .call(
                            l,
                            req,
                            Duration::ZERO,
                            CONNECT_WAIT + CATCH_UP_WAIT + LEADER_WAIT,
                        )
                        .await
                    {
                        Ok(Response::Done(r)) => r,
                        Ok(_) => Err(format!("node {l} cannot change the cluster's nodes")),
                        Err(e) => Err(e.to_string()),
                    };
                }
                None => {}
            }
            if Instant::now() >= deadline {
                return Err("no leader of the cluster's metadata group".into());
            }
            let mut m = raft.metrics();
            let _ = tokio::time::timeout(Duration::from_millis(100), m.changed()).await;
        }
    }

    async fn change_node_here(
        &self,
        raft: &Raft<TypeConfig>,
        id: NodeId,
        addr: Option<String>,
    ) -> Result<(), String> {
        let known = raft.metrics().borrow().membership_config.clone();
        let membership = known.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        match addr {
            Some(addr) => {
                if voters.contains(&id) {
                    return match membership.get_node(&id) {
                        Some(n) if n.addr == addr => Ok(()),
                        _ => Err(format!(
                            "node {id} is in the cluster already, at another address"
                        )),
                    };
                }
                let mut nodes = nodes_of(&known);
                nodes.insert(id, addr.clone());
                self.node.set_cluster_nodes(nodes);
                let cluster = self.node.cluster().ok_or("not in a cluster")?.clone();
                let joined = async {
                    // Running, and authenticated with the cluster's secret (and TLS).
                    let deadline = Instant::now() + CONNECT_WAIT;
                    while !cluster.connected().contains(&id) {
                        if Instant::now() >= deadline {
                            return Err(format!(
                                "node {id} at {addr} did not connect within {} s: is it \
                                 running, with this cluster's secret (and TLS settings), and \
                                 the running nodes in its seed list?",
                                CONNECT_WAIT.as_secs()
                            ));
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    raft.add_learner(id, BasicNode::new(&addr), false)
                        .await
                        .map_err(|e| e.to_string())?;
                    // Caught up: it holds the log up to this leader's last entry.
                    let last = raft.metrics().borrow().last_log_index;
                    raft.wait(Some(CATCH_UP_WAIT))
                        .metrics(
                            |m| {
                                m.replication.as_ref().is_some_and(|r| {
                                    r.get(&id)
                                        .copied()
                                        .flatten()
                                        .is_some_and(|l| Some(l.index) >= last)
                                })
                            },
                            "the new node caught up",
                        )
                        .await
                        .map_err(|_| {
                            format!(
                                "node {id} at {addr} did not catch up within {} s",
                                CATCH_UP_WAIT.as_secs()
                            )
                        })?;
                    raft.change_membership(ChangeMembers::AddVoterIds([id].into()), false)
                        .await
                        .map_err(|e| e.to_string())
                }
                .await;
                if let Err(e) = joined {
                    let learner = raft
                        .metrics()
                        .borrow()
                        .membership_config
                        .membership()
                        .learner_ids()
                        .any(|l| l == id);
                    if learner {
                        let _ = raft
                            .change_membership(ChangeMembers::RemoveNodes([id].into()), false)
                            .await;
                    }
                    let now = raft.metrics().borrow().membership_config.clone();
                    self.node.set_cluster_nodes(nodes_of(&now));
                    return Err(e);
                }
                info!(node = id, addr = %addr, "node added to the cluster");
                Ok(())
            }
            None => {
                let learner = membership.learner_ids().any(|l| l == id);
                if !voters.contains(&id) && !learner {
                    return Err(format!("node {id} is not a node of this cluster"));
                }
                // As RabbitMQ's forget_cluster_node: only a node that is stopped.
                let cluster = self.node.cluster().ok_or("not in a cluster")?;
                if id == self.node.cfg.node_id || cluster.connected().contains(&id) {
                    return Err(format!(
                        "node {id} is running: stop it first, then remove it (from another node)"
                    ));
                }
                if voters.len() == 1 && voters.contains(&id) {
                    return Err("the last node of the cluster cannot be removed".into());
                }
                let change = if learner {
                    ChangeMembers::RemoveNodes([id].into())
                } else {
                    ChangeMembers::RemoveVoters([id].into())
                };
                raft.change_membership(change, false)
                    .await
                    .map_err(|e| e.to_string())?;
                info!(node = id, "node removed from the cluster");
                Ok(())
            }
        }
    }
}

/// A proxy to put: owner node, auto-delete, arguments.
type ProxySpec = (NodeId, bool, FieldTable);

/// A classic queue's arguments (no `x-queue-type`, or `classic`).
fn is_classic(arguments: &FieldTable) -> bool {
    warren_broker::queue::queue_type(arguments).is_none_or(|t| t == "classic")
}

/// A queue deleted on another node: its proxy here goes. A queue held here is never deleted
/// this way (a classic queue's delete asked on another node is done here first, see
/// [`crate::proxy`]), nor are this node's members of quorum queues, which their own group
/// deletes.
fn remove_classic(v: &warren_broker::VHost, name: &str) {
    v.remove_remote_queue(name);
}

/// How long a node being added has to connect (and authenticate).
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// How long a node being added has to catch up on the metadata log.
const CATCH_UP_WAIT: Duration = Duration::from_secs(10);

/// The nodes (id -> inter-node address) of a membership: voters and learners.
fn nodes_of(m: &StoredMembership<NodeId, BasicNode>) -> BTreeMap<NodeId, String> {
    m.membership()
        .nodes()
        .map(|(id, n)| (*id, n.addr.clone()))
        .collect()
}

impl MetadataReplicator for MetadataGroup {
    fn topology(&self, vhost: &str, commands: Vec<TopologyCommand>, done: Done) {
        self.submit(
            Change::Topology {
                vhost: vhost.to_string(),
                commands,
            },
            done,
        );
    }

    fn access(&self, delta: String, done: Done) {
        self.submit(Change::Access { delta }, done);
    }
}

/// What `applied.json` holds.
#[derive(serde::Serialize, serde::Deserialize)]
struct Applied {
    last: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
}

fn read_applied(
    path: &std::path::Path,
) -> (Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>) {
    std::fs::read(path)
        .ok()
        .and_then(|raw| serde_json::from_slice::<Applied>(&raw).ok())
        .map(|a| (a.last, a.membership))
        .unwrap_or_default()
}

/// The metadata group's state machine: the broker's metadata itself.
struct MetaMachine {
    group: Weak<MetadataGroup>,
    applied: Option<LogId<NodeId>>,
    membership: StoredMembership<NodeId, BasicNode>,
    path: PathBuf,
}

/// The metadata group takes no snapshots (its log is kept whole).
struct NoSnapshots;

impl RaftSnapshotBuilder<TypeConfig> for NoSnapshots {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        Err(io_err("the metadata group takes no snapshots"))
    }
}

impl RaftStateMachine<TypeConfig> for MetaMachine {
    type SnapshotBuilder = NoSnapshots;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        Ok((self.applied, self.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let n = entries.len();
        let group = self.group.clone();
        let mut last = self.applied;
        let mut membership = self.membership.clone();
        let mut membership_changed = false;
        let mut changes = Vec::new();
        for e in entries {
            last = Some(e.log_id);
            match e.payload {
                EntryPayload::Blank => {}
                EntryPayload::Membership(m) => {
                    membership = StoredMembership::new(Some(e.log_id), m);
                    membership_changed = true;
                }
                EntryPayload::Normal(batch) => {
                    for c in batch.0 {
                        if let Command::Meta(b) = c {
                            match decode_change(&b) {
                                Ok(x) => changes.push(x),
                                Err(err) => warn!(error = %err, "metadata entry skipped"),
                            }
                        }
                    }
                }
            }
        }
        let record = Applied {
            last,
            membership: membership.clone(),
        };
        let path = self.path.clone();
        // Applying writes definitions files: off the runtime's threads, in order.
        tokio::task::spawn_blocking(move || {
            if let Some(g) = group.upgrade() {
                for (origin, nonce, change) in changes {
                    g.apply_change(origin, nonce, change);
                }
            }
            let json = serde_json::to_vec(&record).unwrap_or_default();
            let tmp = path.with_extension("tmp");
            if std::fs::write(&tmp, json).is_ok() {
                let _ = std::fs::rename(&tmp, &path);
            }
        })
        .await
        .map_err(io_err)?;
        if membership_changed {
            if let Some(g) = self.group.upgrade() {
                g.node.set_cluster_nodes(nodes_of(&membership));
            }
        }
        self.applied = last;
        self.membership = membership;
        Ok(vec![(); n])
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        NoSnapshots
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        _meta: &SnapshotMeta<NodeId, BasicNode>,
        _snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        Err(io_err("the metadata group takes no snapshots"))
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_broker::exchange::{Binding, Destination, ExchangeKind};

    #[test]
    fn changes_decode_as_encoded() {
        let topo = Change::Topology {
            vhost: "/".into(),
            commands: vec![
                TopologyCommand::PutExchange {
                    name: "orders".into(),
                    kind: ExchangeKind::Topic,
                    auto_delete: false,
                    internal: false,
                    arguments: FieldTable::new(),
                },
                TopologyCommand::AddBinding {
                    source: "orders".into(),
                    binding: Binding {
                        destination: Destination::Queue("q".into()),
                        routing_key: "a.*".into(),
                        arguments: FieldTable::new(),
                    },
                },
            ],
        };
        let access = Change::Access {
            delta: "{\"upsert\":{},\"remove\":{}}".into(),
        };
        for (i, c) in [topo, access].into_iter().enumerate() {
            let b = encode_change(3, i as u64 + 7, &c);
            assert_eq!(decode_change(&b), Ok((3, i as u64 + 7, c)));
            let batch = Batch(vec![Command::Meta(b.clone())]);
            let back = Batch::decode(&batch.to_bytes()).expect("decodes");
            assert!(matches!(&back.0[..], [Command::Meta(x)] if *x == b));
        }
        assert!(decode_change(b"\x00\x00\x00\x00").is_err());
    }
}
