//! Queues across the nodes of a cluster: a classic queue lives on the node that declared it
//! (its owner) and is reached from every other node, as in RabbitMQ; a quorum queue is
//! reached the same way from the nodes that hold no member of its group (added to the
//! cluster later, or left out by `x-quorum-initial-group-size`), through one of its members.
//!
//! The cluster's metadata group carries a durable classic queue's declare and delete (see
//! [`crate::metadata`]); every other node puts a [`ClassicProxy`] under its name, so that
//! declares (with RabbitMQ's equivalence checks), bindings and routing work there as for a
//! local queue. What the proxy is asked goes to the owner's node:
//! - a publish routed to it is sent in order over the inter-node connection
//!   ([`Request::ClassicPublish`]) and enqueued by the owner, which writes a persistent message
//!   to its store; the publisher's confirm waits for the owner's answer (after the fsync);
//! - its consumers are registered with the owner's node, as a quorum queue's follower does with
//!   the leader ([`Request::Subscribe`]); the owner's queue treats them as its own consumers
//!   (ordering, prefetch, priorities, exclusive use) and sends each delivery over the
//!   connection ([`Cast::Deliver`]); the client's ack, nack or reject goes back
//!   ([`Cast::Settle`]);
//! - basic.get, queue.purge and the message counts are asked of the owner's node.
//!
//! A quorum queue's proxy asks a member's node (the declaring node first, then the others by
//! id, skipping nodes that turn out to hold no member, moving on when a node is not
//! connected); that member serves the proxy with its local queue as it serves its own
//! clients (forwarding to the group's leader when it does not lead). Its requests name the
//! queue with [`via_key`], so that they reach that node's [`ClassicServer`] and not the
//! group's own member-to-leader protocol, which uses the plain key.
//!
//! On the owner, a [`ClassicServer`] per queue serves those requests. When the connection
//! between the two nodes drops, the owner returns what it had handed to that node (redelivered)
//! and forgets its consumers; the proxy registers them again when the connection is back.
//! While the owner's node is down, publishes to its queues are refused (basic.nack) and gets
//! find nothing, as RabbitMQ's classic queues are unavailable while their node is down.

use crate::remote::{Cast, GroupServer, MemberChange, RemoteConsumer, RemoteMessage, WireMessage};
use crate::transport::{Cluster, Request, Response};
use bytes::Bytes;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};
use tracing::debug;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_broker::args::QueueArgs;
use warren_broker::dead_letter::DeadLetter;
use warren_broker::policy::Applied;
use warren_broker::queue::{
    DeliveryTarget, PagedSettlement, Positions, QueueBackend, QueueCounts, Settlement,
};
use warren_broker::registry::QueueStats;
use warren_broker::{BrokerError, Consumer, Message, Queue, QueuedMessage, Result};
use warren_store::spill::SpillEntry;
use warren_store::{Completion, Location, Store};

type NodeId = u64;

/// Channel keys of the owner's stand-ins for other nodes' channels: far above the broker's.
static NEXT_CHANNEL_KEY: AtomicU64 = AtomicU64::new(1 << 62);

/// How long a request to the owner's node may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a publish waits for the owner's node to hold it: a node that stops answering
/// is noticed sooner (its connection is closed after 10 s of silence), and the publish is
/// nacked then.
const PUBLISH_WAIT: Duration = Duration::from_secs(60);

/// How long the message counts asked of the owner's node are reused.
const COUNTS_FRESH: Duration = Duration::from_millis(500);

/// The answer when a consumer would break an exclusive use (as the quorum queues').
const EXCLUSIVE_USE: &str = "in exclusive use";

/// The first character of the keys with which a quorum queue's proxy names the queue (see
/// [`via_key`]).
const VIA: char = '\u{1d}';

/// The key with which a quorum queue's proxy names the queue of group key `key` to a
/// member's node.
pub(crate) fn via_key(key: &str) -> String {
    format!("{VIA}{key}")
}

/// Whether `key` is one a quorum queue's proxy uses (see [`via_key`]).
pub(crate) fn is_via(key: &str) -> bool {
    key.starts_with(VIA)
}

/// The answer of a node asked about a queue it does not hold (a proxy then asks another).
pub(crate) const NOT_HERE: &str = "no such queue on this node";

/// Splits a group key (or a [`via_key`]) into vhost and queue name.
pub(crate) fn split_key(key: &str) -> Option<(&str, &str)> {
    key.strip_prefix(VIA).unwrap_or(key).split_once('\u{1f}')
}

// ---- on the owner's node ----------------------------------------------------------------

/// A delivered message not yet settled by the other node.
struct Outstanding {
    message: QueuedMessage,
    tag: Option<Arc<str>>,
}

/// The owner's stand-in for one consumer (or the basic.gets) of another node: the queue
/// delivers to it as to a channel.
struct RemoteChannel {
    cluster: Weak<Cluster>,
    peer: NodeId,
    group: String,
    /// The consumer's id on the other node (0: basic.get).
    consumer: u64,
    key: u64,
    out: Mutex<HashMap<u64, Outstanding>>,
}

impl RemoteChannel {
    fn new(cluster: Weak<Cluster>, peer: NodeId, group: &str, consumer: u64) -> Arc<Self> {
        Arc::new(RemoteChannel {
            cluster,
            peer,
            group: group.to_string(),
            consumer,
            key: NEXT_CHANNEL_KEY.fetch_add(1, Ordering::Relaxed),
            out: Mutex::new(HashMap::new()),
        })
    }

    /// Everything outstanding, to be requeued.
    fn take_all(&self) -> Vec<Settlement> {
        self.out
            .lock()
            .drain()
            .map(|(_, o)| Settlement {
                consumer_tag: o.tag,
                message: o.message,
                requeue: true,
                rejected: false,
            })
            .collect()
    }
}

impl DeliveryTarget for RemoteChannel {
    fn channel_key(&self) -> u64 {
        self.key
    }

    fn deliver(
        &self,
        _queue: &Arc<Queue>,
        consumer_tag: &Arc<str>,
        no_ack: bool,
        msg: QueuedMessage,
    ) -> std::result::Result<(), QueuedMessage> {
        let Some(cluster) = self.cluster.upgrade() else {
            return Err(msg);
        };
        let delivery = RemoteMessage {
            key: msg.seq,
            redelivered: msg.redelivered,
            message: WireMessage(msg.message.clone()),
        };
        let seq = msg.seq;
        if !no_ack {
            self.out.lock().insert(
                seq,
                Outstanding {
                    message: msg.clone(),
                    tag: Some(consumer_tag.clone()),
                },
            );
        }
        let cast = Cast::Deliver {
            group: self.group.clone(),
            term: 0,
            consumer: self.consumer,
            delivery,
        };
        if cluster.cast(self.peer, cast) {
            Ok(())
        } else {
            self.out.lock().remove(&seq);
            Err(msg)
        }
    }

    fn cancelled_by_broker(&self, _consumer_tag: &Arc<str>) {
        // The queue was deleted: its delete reaches the other nodes through the metadata.
    }
}

/// What the owner keeps for one other node.
struct PeerState {
    /// Its consumers: id -> (stand-in, tag).
    consumers: HashMap<u64, (Arc<RemoteChannel>, Arc<str>)>,
    /// Stand-ins of cancelled consumers whose deliveries are not all settled yet.
    retired: Vec<Arc<RemoteChannel>>,
    /// Its basic.gets.
    gets: Arc<RemoteChannel>,
}

/// Serves a queue held on this node (a classic queue, or this node's member of a quorum
/// queue) to the other nodes' proxies of it.
pub struct ClassicServer {
    cluster: Weak<Cluster>,
    group: String,
    queue: Arc<Queue>,
    broker: Weak<warren_broker::Broker>,
    peers: Mutex<HashMap<NodeId, PeerState>>,
}

impl ClassicServer {
    /// The server of `queue` (held here, in `broker`) under group key `group`.
    pub(crate) fn new(
        cluster: Weak<Cluster>,
        group: &str,
        queue: Arc<Queue>,
        broker: &Arc<warren_broker::Broker>,
    ) -> Arc<Self> {
        Arc::new(ClassicServer {
            cluster,
            group: group.to_string(),
            queue,
            broker: Arc::downgrade(broker),
            peers: Mutex::new(HashMap::new()),
        })
    }

    /// Deletes the queue after its last consumer went, when it is auto-delete.
    fn auto_delete(&self) {
        if let Some(v) = self
            .broker
            .upgrade()
            .and_then(|b| b.vhost(self.queue.vhost()))
        {
            v.remove_queue(&self.queue);
        }
    }

    /// The queue it serves.
    pub(crate) fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }

    fn peer<'a>(
        &self,
        peers: &'a mut HashMap<NodeId, PeerState>,
        peer: NodeId,
    ) -> &'a mut PeerState {
        peers.entry(peer).or_insert_with(|| PeerState {
            consumers: HashMap::new(),
            retired: Vec::new(),
            gets: RemoteChannel::new(self.cluster.clone(), peer, &self.group, 0),
        })
    }

    /// Settlements from node `peer` for its consumer `consumer` (0: its basic.gets): `(key,
    /// requeue, rejected)` each; keys it does not hold are ignored.
    pub(crate) fn settle(&self, peer: NodeId, consumer: u64, items: Vec<(u64, bool, bool)>) {
        let channel = {
            let mut peers = self.peers.lock();
            let Some(p) = peers.get_mut(&peer) else {
                return;
            };
            let ch = if consumer == 0 {
                Some(p.gets.clone())
            } else {
                p.consumers
                    .get(&consumer)
                    .map(|(c, _)| c.clone())
                    .or_else(|| p.retired.iter().find(|c| c.consumer == consumer).cloned())
            };
            p.retired.retain(|c| !c.out.lock().is_empty());
            ch
        };
        let Some(ch) = channel else { return };
        let settlements: Vec<Settlement> = {
            let mut out = ch.out.lock();
            items
                .into_iter()
                .filter_map(|(key, requeue, rejected)| {
                    out.remove(&key).map(|o| Settlement {
                        consumer_tag: o.tag,
                        message: o.message,
                        requeue,
                        rejected,
                    })
                })
                .collect()
        };
        if !settlements.is_empty() {
            self.queue.settle_with(&self.queue, ch.key, settlements);
        }
    }

    /// The queue's counts: ready, unacknowledged, consumers.
    pub(crate) fn counts(&self) -> (u32, u32, u32) {
        let c = self.queue.counts();
        (c.ready, c.unacked, c.consumers)
    }

    /// Enqueues `msg`, published on another node, through `host`'s vhost: `done` learns
    /// whether it is held (on disk when persistent).
    pub(crate) fn publish(
        &self,
        broker: &warren_broker::Broker,
        msg: Arc<Message>,
        done: Arc<dyn Completion>,
    ) {
        let Some(vhost) = broker.vhost(self.queue.vhost()) else {
            done.complete(&[0], false);
            return;
        };
        match vhost.enqueue_forwarded(self.queue.name(), msg, Some((done.clone(), 0))) {
            Ok(p) if p.rejected => {}
            Ok(p) if !p.stored => done.complete(&[0], true),
            Ok(_) => {}
            Err(e) => {
                debug!(queue = %self.queue.name(), error = %e, "forwarded publish refused");
                done.complete(&[0], false);
            }
        }
    }
}

impl GroupServer for ClassicServer {
    fn subscribe(
        &self,
        peer: NodeId,
        _term: u64,
        consumers: Vec<RemoteConsumer>,
    ) -> std::result::Result<(), String> {
        if self.queue.is_deleted() {
            return Err("the queue is deleted".into());
        }
        let mut refused = None;
        let mut unused = false;
        {
            let mut peers = self.peers.lock();
            let p = self.peer(&mut peers, peer);
            let wanted: HashMap<u64, &RemoteConsumer> =
                consumers.iter().map(|c| (c.id, c)).collect();
            let gone: Vec<u64> = p
                .consumers
                .keys()
                .filter(|id| !wanted.contains_key(id))
                .copied()
                .collect();
            for id in gone {
                if let Some((ch, tag)) = p.consumers.remove(&id) {
                    unused |= self.queue.remove_consumer(ch.key, &tag);
                    // Its deliveries stay the other node's until settled (or the link drops).
                    p.retired.push(ch);
                }
            }
            for rc in consumers {
                if p.consumers.contains_key(&rc.id) {
                    continue;
                }
                let ch = RemoteChannel::new(self.cluster.clone(), peer, &self.group, rc.id);
                let mut args = FieldTable::new();
                if rc.priority != 0 {
                    args.insert("x-priority", FieldValue::I64(rc.priority));
                }
                let tag: Arc<str> = rc.tag.as_str().into();
                let c = Consumer::new(
                    tag.clone(),
                    ch.clone(),
                    rc.no_ack,
                    rc.exclusive,
                    rc.prefetch,
                    args,
                );
                match self.queue.add_consumer(c) {
                    Ok(()) => {
                        p.consumers.insert(rc.id, (ch, tag));
                    }
                    Err(e) => refused = Some(e.text),
                }
            }
        }
        if unused && self.queue.counts().consumers == 0 {
            self.auto_delete();
        } else {
            self.queue.dispatch();
        }
        match refused {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn deliver(&self, _peer: NodeId, _term: u64, _consumer: u64, _delivery: RemoteMessage) {}

    fn get(
        &self,
        peer: NodeId,
        no_ack: bool,
    ) -> std::result::Result<Option<(RemoteMessage, u32)>, String> {
        let Some((qm, left)) = self.queue.get(no_ack) else {
            return Ok(None);
        };
        let delivery = RemoteMessage {
            key: qm.seq,
            redelivered: qm.redelivered,
            message: WireMessage(qm.message.clone()),
        };
        if !no_ack {
            let mut peers = self.peers.lock();
            let p = self.peer(&mut peers, peer);
            p.gets.out.lock().insert(
                qm.seq,
                Outstanding {
                    message: qm,
                    tag: None,
                },
            );
        }
        Ok(Some((delivery, left)))
    }

    fn purge(&self) -> std::result::Result<u32, String> {
        Ok(self.queue.purge())
    }

    fn check_consume(&self, exclusive: bool) -> std::result::Result<(), String> {
        if self.queue.has_exclusive_consumer() || (exclusive && self.queue.counts().consumers > 0) {
            return Err(EXCLUSIVE_USE.into());
        }
        Ok(())
    }

    fn peer_lost(&self, peer: NodeId) {
        let Some(p) = self.peers.lock().remove(&peer) else {
            return;
        };
        let mut channels: Vec<Arc<RemoteChannel>> = p.retired;
        let mut unused = false;
        for (_, (ch, tag)) in p.consumers {
            unused |= self.queue.remove_consumer(ch.key, &tag);
            channels.push(ch);
        }
        channels.push(p.gets);
        for ch in channels {
            let settlements = ch.take_all();
            if !settlements.is_empty() {
                self.queue.settle_with(&self.queue, ch.key, settlements);
            }
        }
        if unused && self.queue.counts().consumers == 0 {
            self.auto_delete();
        }
    }

    fn change_member(&self, _node: NodeId, _add: bool) -> MemberChange {
        Box::pin(async { Err("a classic queue has no members".to_string()) })
    }
}

// ---- on the other nodes -----------------------------------------------------------------

struct ProxyConsumer {
    c: Consumer,
    id: u64,
}

#[derive(Default)]
struct ProxyState {
    consumers: Vec<ProxyConsumer>,
    next_id: u64,
    /// Bumped whenever the consumers change.
    version: u64,
    /// (node, connection generation, version) the queue's node took last.
    sent: Option<(NodeId, u64, u64)>,
    pending: bool,
    /// Which consumer each unsettled delivery went to: (channel key, key) -> consumer id.
    delivered: HashMap<(u64, u64), u64>,
    /// A task watches the connection while there are consumers.
    watching: bool,
    /// Deliveries a channel could not take yet (its channel-wide prefetch), in order, with
    /// their consumer's id: offered again when the channel settles something.
    parked: Vec<(u64, QueuedMessage)>,
}

/// A queue held by other nodes, as this node's vhosts see it: a classic queue of another
/// node, or a quorum queue with no member here.
pub struct ClassicProxy {
    myself: Weak<ClassicProxy>,
    cluster: Arc<Cluster>,
    runtime: tokio::runtime::Handle,
    /// `classic` or `quorum`.
    kind: &'static str,
    /// The node asked now: a classic queue's owner, or a quorum queue's member node.
    owner: AtomicU64,
    /// The nodes that may be asked, in order of preference (a classic queue's owner alone).
    candidates: Vec<NodeId>,
    /// Candidates that answered that they hold no member.
    not_here: Mutex<Vec<NodeId>>,
    name: String,
    vhost: String,
    /// The key its requests name the queue with (see [`via_key`]).
    key: String,
    auto_delete: bool,
    arguments: FieldTable,
    args: parking_lot::RwLock<Arc<QueueArgs>>,
    applied: parking_lot::RwLock<Arc<Applied>>,
    inner: Mutex<ProxyState>,
    order: Mutex<()>,
    stats: QueueStats,
    deleted: AtomicBool,
    sweep_mark: AtomicBool,
    deliveries: AtomicU64,
    counts: Mutex<(QueueCounts, Option<Instant>, bool)>,
}

impl std::fmt::Debug for ClassicProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassicProxy")
            .field("vhost", &self.vhost)
            .field("name", &self.name)
            .field("owner", &self.owner())
            .finish()
    }
}

impl ClassicProxy {
    /// The proxy of queue `name` of `vhost`, and registered to receive deliveries: a classic
    /// queue (`quorum` false) held by node `owner`, or a quorum queue declared on node
    /// `owner` (asked first; the cluster's other nodes after it).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cluster: Arc<Cluster>,
        runtime: tokio::runtime::Handle,
        owner: NodeId,
        quorum: bool,
        vhost: &str,
        name: &str,
        auto_delete: bool,
        arguments: FieldTable,
    ) -> Arc<ClassicProxy> {
        let group = crate::node::group_key(vhost, name);
        let (kind, key, candidates) = if quorum {
            let me = cluster.node_id();
            let mut c = vec![owner];
            c.extend(
                cluster
                    .nodes()
                    .into_keys()
                    .filter(|n| *n != owner && *n != me),
            );
            ("quorum", via_key(&group), c)
        } else {
            ("classic", group, vec![owner])
        };
        let resource = format!("queue '{name}' in vhost '{vhost}'");
        let args = QueueArgs::parse(&resource, &arguments).unwrap_or_default();
        let p = Arc::new_cyclic(|me| ClassicProxy {
            myself: me.clone(),
            cluster: cluster.clone(),
            runtime,
            kind,
            owner: AtomicU64::new(owner),
            candidates,
            not_here: Mutex::new(Vec::new()),
            name: name.to_string(),
            vhost: vhost.to_string(),
            key: key.clone(),
            auto_delete,
            arguments,
            args: parking_lot::RwLock::new(Arc::new(args)),
            applied: parking_lot::RwLock::new(Arc::default()),
            inner: Mutex::new(ProxyState {
                next_id: 1,
                ..ProxyState::default()
            }),
            order: Mutex::new(()),
            stats: QueueStats::default(),
            deleted: AtomicBool::new(false),
            sweep_mark: AtomicBool::new(false),
            deliveries: AtomicU64::new(0),
            counts: Mutex::new((QueueCounts::default(), None, false)),
        });
        let server: Arc<dyn GroupServer> = p.clone();
        cluster.register_proxy(&key, Arc::downgrade(&server));
        p
    }

    /// The node asked now.
    fn owner(&self) -> NodeId {
        self.owner.load(Ordering::Acquire)
    }

    /// The node to ask: the one asked until now while it is connected, else the first
    /// connected candidate that did not answer [`NOT_HERE`] (a quorum queue's proxy).
    fn pick(&self) -> NodeId {
        let now = self.owner();
        if self.candidates.len() < 2 {
            return now;
        }
        let mut not_here = self.not_here.lock();
        if self.cluster.generation(now).is_some() && !not_here.contains(&now) {
            return now;
        }
        let usable = |n: &&NodeId| self.cluster.generation(**n).is_some();
        let next = match self
            .candidates
            .iter()
            .filter(usable)
            .find(|n| !not_here.contains(n))
        {
            Some(n) => *n,
            None => {
                // Every connected node said no: members may have been added since.
                not_here.clear();
                self.candidates.iter().find(usable).copied().unwrap_or(now)
            }
        };
        if next != now {
            debug!(queue = %self.name, from = now, to = next, "quorum queue reached through another node");
            self.owner.store(next, Ordering::Release);
        }
        next
    }

    /// Notes that `node` holds no member of the queue, when `answer` says so (a quorum
    /// queue's proxy then asks another node); returns whether it did.
    fn noted_not_here(&self, node: NodeId, answer: &str) -> bool {
        if answer != NOT_HERE || self.candidates.len() < 2 {
            return false;
        }
        let mut not_here = self.not_here.lock();
        if !not_here.contains(&node) {
            not_here.push(node);
        }
        true
    }

    /// A request to the queue's node, waited for on this (worker) thread; `None` when the
    /// node cannot be asked. A node that holds no member of a quorum queue passes the
    /// request on to the next candidate.
    fn call_owner(&self, make: impl Fn() -> Request) -> Option<Response> {
        for _ in 0..self.candidates.len() {
            let node = self.pick();
            let r = match self.cluster.call_blocking(node, make(), CALL_TIMEOUT)? {
                Ok(r) => r,
                Err(e) => {
                    debug!(queue = %self.name, owner = node, error = %e, "the queue's node did not answer");
                    return None;
                }
            };
            let refused = match &r {
                Response::Done(Err(e))
                | Response::Got(Err(e))
                | Response::Purged(Err(e))
                | Response::Counts(Err(e)) => e.as_str(),
                Response::Deleted(Err((_, e))) => e.as_str(),
                _ => "",
            };
            if !self.noted_not_here(node, refused) {
                return Some(r);
            }
        }
        None
    }

    /// Sends settlements of consumer `consumer` (0: basic.get) to the owner's node.
    fn send_settle(&self, consumer: u64, items: Vec<(u64, bool, bool)>) {
        if items.is_empty() {
            return;
        }
        let cast = Cast::Settle {
            group: self.key.clone(),
            consumer,
            settlements: items,
        };
        if !self.cluster.cast(self.owner(), cast) {
            debug!(queue = %self.name, owner = self.owner(), "settlements not sent: the queue's node is not connected (it returns the messages)");
        }
    }

    /// Tells the owner's node this node's consumers when they changed since it last took
    /// them, or the connection to it is new.
    fn sync_subscription(&self) {
        let node = self.pick();
        let Some(generation) = self.cluster.generation(node) else {
            return;
        };
        let (consumers, want) = {
            let mut st = self.inner.lock();
            if self.deleted.load(Ordering::Acquire) || st.pending {
                return;
            }
            let want = (node, generation, st.version);
            if st.sent == Some(want) {
                return;
            }
            let consumers: Vec<RemoteConsumer> = st
                .consumers
                .iter()
                .map(|c| RemoteConsumer {
                    id: c.id,
                    tag: c.c.tag.to_string(),
                    no_ack: c.c.no_ack,
                    prefetch: c.c.prefetch,
                    priority: c
                        .c
                        .arguments
                        .get("x-priority")
                        .and_then(|v| v.as_i64())
                        .unwrap_or(0),
                    exclusive: c.c.exclusive,
                })
                .collect();
            if consumers.is_empty() && st.sent.is_none_or(|s| (s.0, s.1) != (node, generation)) {
                st.sent = Some(want);
                return;
            }
            st.pending = true;
            (consumers, want)
        };
        let Some(me) = self.myself.upgrade() else {
            return;
        };
        self.runtime.spawn(async move {
            let req = Request::Subscribe {
                group: me.key.clone(),
                term: 0,
                consumers,
            };
            let r = me.cluster.call(node, req, Duration::ZERO, CALL_TIMEOUT).await;
            let ok = matches!(r, Ok(Response::Subscribed(Ok(()))));
            let elsewhere =
                matches!(&r, Ok(Response::Subscribed(Err(e))) if me.noted_not_here(node, e));
            {
                let mut st = me.inner.lock();
                st.pending = false;
                if ok {
                    st.sent = Some(want);
                } else {
                    debug!(queue = %me.name, answer = ?r, "consumers not registered at the queue's node");
                }
            }
            if ok || elsewhere {
                me.sync_subscription();
                me.offer_parked();
            }
        });
    }

    /// While there are consumers, registers them again whenever the connection to the owner's
    /// node is new (checked twice a second).
    fn watch(&self) {
        {
            let mut st = self.inner.lock();
            if st.watching {
                return;
            }
            st.watching = true;
        }
        let Some(me) = self.myself.upgrade() else {
            return;
        };
        self.runtime.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                {
                    let mut st = me.inner.lock();
                    if me.deleted.load(Ordering::Acquire) || st.consumers.is_empty() {
                        st.watching = false;
                        break;
                    }
                }
                me.sync_subscription();
            }
        });
    }

    fn refresh_counts(&self) {
        {
            let mut c = self.counts.lock();
            if c.2 {
                return;
            }
            c.2 = true;
        }
        let Some(me) = self.myself.upgrade() else {
            return;
        };
        self.runtime.spawn(async move {
            let req = Request::ClassicCounts {
                group: me.key.clone(),
            };
            let node = me.pick();
            let r = me
                .cluster
                .call(node, req, Duration::ZERO, CALL_TIMEOUT)
                .await;
            if let Ok(Response::Counts(Err(e))) = &r {
                me.noted_not_here(node, e);
            }
            let mut c = me.counts.lock();
            c.2 = false;
            if let Ok(Response::Counts(Ok((ready, unacked, consumers)))) = r {
                c.0 = QueueCounts {
                    ready,
                    unacked,
                    consumers,
                };
                c.1 = Some(Instant::now());
            }
        });
    }
}

impl ClassicProxy {
    /// Hands `qm` to consumer `consumer`'s channel; the message back when it cannot take it.
    fn offer(
        &self,
        st: &mut ProxyState,
        this: &Arc<Queue>,
        consumer: u64,
        qm: QueuedMessage,
    ) -> std::result::Result<(), QueuedMessage> {
        let Some(c) = st.consumers.iter().find(|c| c.id == consumer) else {
            return Err(qm);
        };
        let (channel, no_ack, key) = (c.c.target.channel_key(), c.c.no_ack, qm.seq);
        c.c.target.deliver(this, &c.c.tag, no_ack, qm)?;
        self.deliveries.fetch_add(1, Ordering::Relaxed);
        if !no_ack {
            st.delivered.insert((channel, key), consumer);
        }
        Ok(())
    }

    /// Offers the parked deliveries again, in order; those of a consumer that is gone go
    /// back to the owner's node.
    fn offer_parked(&self) {
        let Some(me) = self.myself.upgrade() else {
            return;
        };
        let this: Arc<Queue> = me;
        let mut back: Vec<(u64, u64)> = Vec::new();
        {
            let mut st = self.inner.lock();
            if st.parked.is_empty() {
                return;
            }
            let parked = std::mem::take(&mut st.parked);
            let mut full: Vec<u64> = Vec::new();
            for (id, qm) in parked {
                if full.contains(&id) {
                    st.parked.push((id, qm));
                    continue;
                }
                if !st.consumers.iter().any(|c| c.id == id) {
                    back.push((id, qm.seq));
                    continue;
                }
                if let Err(qm) = self.offer(&mut st, &this, id, qm) {
                    full.push(id);
                    st.parked.push((id, qm));
                }
            }
        }
        let mut by_consumer: HashMap<u64, Vec<(u64, bool, bool)>> = HashMap::new();
        for (id, key) in back {
            by_consumer.entry(id).or_default().push((key, true, false));
        }
        for (id, items) in by_consumer {
            self.send_settle(id, items);
        }
    }
}

impl GroupServer for ClassicProxy {
    fn subscribe(
        &self,
        _peer: NodeId,
        _term: u64,
        _consumers: Vec<RemoteConsumer>,
    ) -> std::result::Result<(), String> {
        Err("this node does not hold the queue".into())
    }

    fn deliver(&self, peer: NodeId, _term: u64, consumer: u64, delivery: RemoteMessage) {
        if peer != self.owner() {
            return;
        }
        let Some(me) = self.myself.upgrade() else {
            return;
        };
        let this: Arc<Queue> = me;
        let qm = delivery.into_queued();
        let key = qm.seq;
        let mut st = self.inner.lock();
        if !st.consumers.iter().any(|c| c.id == consumer) {
            drop(st);
            self.send_settle(consumer, vec![(key, true, false)]);
            return;
        }
        if st.parked.iter().any(|(id, _)| *id == consumer) {
            st.parked.push((consumer, qm));
            return;
        }
        if let Err(qm) = self.offer(&mut st, &this, consumer, qm) {
            // The channel cannot take it now (its channel-wide prefetch): it waits here.
            st.parked.push((consumer, qm));
        }
    }

    fn get(
        &self,
        _peer: NodeId,
        _no_ack: bool,
    ) -> std::result::Result<Option<(RemoteMessage, u32)>, String> {
        Err("this node does not hold the queue".into())
    }

    fn purge(&self) -> std::result::Result<u32, String> {
        Err("this node does not hold the queue".into())
    }

    fn check_consume(&self, _exclusive: bool) -> std::result::Result<(), String> {
        Err("this node does not hold the queue".into())
    }

    fn peer_lost(&self, peer: NodeId) {
        if peer == self.owner() {
            // The owner returns what it handed out; the consumers register again.
            let mut st = self.inner.lock();
            st.sent = None;
            st.delivered.clear();
            st.parked.clear();
        }
    }

    fn change_member(&self, _node: NodeId, _add: bool) -> MemberChange {
        Box::pin(async { Err("a classic queue has no members".to_string()) })
    }
}

impl QueueBackend for ClassicProxy {
    fn name(&self) -> &str {
        &self.name
    }
    fn vhost(&self) -> &str {
        &self.vhost
    }
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn durable(&self) -> bool {
        true
    }
    fn exclusive_owner(&self) -> Option<u64> {
        None
    }
    fn auto_delete(&self) -> bool {
        self.auto_delete
    }
    fn arguments(&self) -> &FieldTable {
        &self.arguments
    }
    fn store_key(&self) -> &str {
        &self.key
    }
    fn store(&self) -> Option<&Store> {
        None
    }
    fn args(&self) -> Arc<QueueArgs> {
        self.args.read().clone()
    }
    fn applied_policy(&self) -> Arc<Applied> {
        self.applied.read().clone()
    }
    fn apply_policy(&self, applied: Applied) -> bool {
        *self.applied.write() = Arc::new(applied);
        false
    }
    fn enforce_limits(&self) {}
    fn enqueue_order(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.order.lock()
    }
    fn rejects_publish(&self, _msg: &Message) -> bool {
        false
    }
    fn enqueue(
        &self,
        this: &Arc<Queue>,
        message: Arc<Message>,
        seq: u64,
        _stored: Option<Location>,
    ) -> (bool, Vec<DeadLetter>) {
        self.enqueue_confirmed(this, message, seq, None)
    }
    fn confirms_publishes(&self) -> bool {
        true
    }
    fn enqueue_confirmed(
        &self,
        _this: &Arc<Queue>,
        message: Arc<Message>,
        _seq: u64,
        waiter: Option<(Arc<dyn Completion>, u64)>,
    ) -> (bool, Vec<DeadLetter>) {
        let fail = |waiter: Option<(Arc<dyn Completion>, u64)>| {
            if let Some((sink, token)) = waiter {
                sink.complete(&[token], false);
            }
        };
        if self.deleted.load(Ordering::Acquire) {
            fail(waiter);
            return (false, Vec::new());
        }
        self.stats.publish.fetch_add(1, Ordering::Relaxed);
        // Sent now, in the order of the publishes; answered once the owner holds it.
        let req = Request::ClassicPublish {
            group: self.key.clone(),
            message: WireMessage(message.clone()),
        };
        let node = self.pick();
        match self.cluster.send_now(node, req) {
            Ok(pending) => {
                let me = self.myself.upgrade();
                self.runtime.spawn(async move {
                    let mut r = pending.wait(PUBLISH_WAIT).await;
                    // A node without a member of the quorum queue: the next one is asked.
                    let mut node = node;
                    let mut tries = 1;
                    while let (Ok(Response::Proposed(Err(e))), Some(me)) = (&r, &me) {
                        if !me.noted_not_here(node, e) || tries >= me.candidates.len() {
                            break;
                        }
                        tries += 1;
                        node = me.pick();
                        let again = Request::ClassicPublish {
                            group: me.key.clone(),
                            message: WireMessage(message.clone()),
                        };
                        r = match me.cluster.send_now(node, again) {
                            Ok(p) => p.wait(PUBLISH_WAIT).await,
                            Err(_) => break,
                        };
                    }
                    let ok = matches!(r, Ok(Response::Proposed(Ok(()))));
                    if let Some((sink, token)) = waiter {
                        sink.complete(&[token], ok);
                    }
                });
            }
            Err(e) => {
                debug!(queue = %self.name, owner = node, error = %e, "publish to a queue whose node is not reachable refused");
                fail(waiter);
            }
        }
        (false, Vec::new())
    }
    fn dead_letter(&self, _dead: Vec<DeadLetter>) {}
    fn is_pressured(&self) -> bool {
        false
    }
    fn stalled_at(&self) -> Option<u64> {
        None
    }
    fn mark_stalled(&self, _at: u64) {}

    fn add_consumer(&self, consumer: Consumer) -> Result<()> {
        if self.deleted.load(Ordering::Acquire) {
            return Err(BrokerError::not_found(format!(
                "no {}",
                self.resource_name()
            )));
        }
        let req = || Request::CheckConsume {
            group: self.key.clone(),
            exclusive: consumer.exclusive,
        };
        if let Some(Response::Done(Err(e))) = self.call_owner(req) {
            if e == EXCLUSIVE_USE {
                return Err(BrokerError::access_refused(format!(
                    "{} in exclusive use",
                    self.resource_name()
                )));
            }
        }
        {
            let mut st = self.inner.lock();
            if st.consumers.iter().any(|c| c.c.exclusive)
                || (consumer.exclusive && !st.consumers.is_empty())
            {
                return Err(BrokerError::access_refused(format!(
                    "{} in exclusive use",
                    self.resource_name()
                )));
            }
            let id = st.next_id;
            st.next_id += 1;
            st.consumers.push(ProxyConsumer { c: consumer, id });
            st.version += 1;
        }
        self.sync_subscription();
        self.watch();
        Ok(())
    }

    fn remove_consumer(&self, channel_key: u64, tag: &str) -> bool {
        {
            let mut st = self.inner.lock();
            st.consumers
                .retain(|c| !(c.c.target.channel_key() == channel_key && &*c.c.tag == tag));
            st.version += 1;
        }
        // Its parked deliveries go back to the owner's node.
        self.offer_parked();
        self.sync_subscription();
        false
    }

    fn dispatch_with(&self, _this: &Arc<Queue>) {
        // A channel that can take more (after consume-ok, after its writer drained): the
        // deliveries held here go first.
        self.offer_parked();
    }

    fn touch(&self) {}

    fn get(&self, no_ack: bool) -> Option<(QueuedMessage, u32)> {
        let req = || Request::Get {
            group: self.key.clone(),
            no_ack,
        };
        match self.call_owner(req)? {
            Response::Got(Ok(Some((m, left)))) => Some((m.into_queued(), left)),
            _ => None,
        }
    }

    fn settle_with(&self, _this: &Arc<Queue>, channel_key: u64, settlements: Vec<Settlement>) {
        let mut by_consumer: HashMap<u64, Vec<(u64, bool, bool)>> = HashMap::new();
        {
            let mut st = self.inner.lock();
            for s in settlements {
                let key = s.message.seq;
                let consumer = match &s.consumer_tag {
                    None => 0,
                    Some(_) => match st.delivered.remove(&(channel_key, key)) {
                        Some(id) => id,
                        // Delivered before the link to the owner was lost: returned there.
                        None => continue,
                    },
                };
                if s.consumer_tag.is_none() {
                    st.delivered.remove(&(channel_key, key));
                }
                by_consumer
                    .entry(consumer)
                    .or_default()
                    .push((key, s.requeue, s.rejected));
            }
        }
        for (consumer, items) in by_consumer {
            self.send_settle(consumer, items);
        }
        self.offer_parked();
    }

    fn unacked_window(&self) -> Option<(usize, usize)> {
        None
    }
    fn page_out(&self, _qm: &QueuedMessage) -> Option<SpillEntry> {
        None
    }
    fn settle_paged_with(
        &self,
        this: &Arc<Queue>,
        channel_key: u64,
        settlements: Vec<PagedSettlement>,
    ) {
        // Never paged out (unacked_window is None).
        let _ = (this, channel_key, settlements);
    }

    fn purge(&self) -> u32 {
        let req = || Request::Purge {
            group: self.key.clone(),
        };
        match self.call_owner(req) {
            Some(Response::Purged(Ok(n))) => n,
            _ => 0,
        }
    }

    fn unavailable(&self) -> Option<String> {
        let node = self.pick();
        if self.cluster.generation(node).is_some() {
            return None;
        }
        let host = self
            .cluster
            .nodes()
            .get(&node)
            .and_then(|a| a.rsplit_once(':').map(|(h, _)| h.to_string()))
            .unwrap_or_default();
        Some(if self.kind == "quorum" {
            format!(
                "no node holding a member of quorum queue '{}' in vhost '{}' is reachable",
                self.name, self.vhost
            )
        } else {
            format!(
                "home node 'warren-{node}@{host}' of durable queue '{}' in vhost '{}' is down \
                 or inaccessible",
                self.name, self.vhost
            )
        })
    }

    fn delete_at_owner(&self, if_unused: bool, if_empty: bool) -> Option<Result<u32>> {
        let req = || Request::ClassicDelete {
            group: self.key.clone(),
            if_unused,
            if_empty,
        };
        Some(match self.call_owner(req) {
            Some(Response::Deleted(Ok(n))) => Ok(n),
            Some(Response::Deleted(Err((code, text)))) => Err(BrokerError::new(code, text)),
            _ => Err(BrokerError::not_found(self.unavailable().unwrap_or_else(
                || format!("{} could not be deleted by its node", self.resource_name()),
            ))),
        })
    }

    fn mark_deleted(&self) -> (u32, Vec<Consumer>) {
        let ready = self.counts.lock().0.ready;
        self.deleted.store(true, Ordering::Release);
        self.cluster.unregister_proxy(&self.key, self);
        // What the queue's node handed to this node's consumers and gets goes back to the
        // queue.
        let leave = Cast::Leave {
            group: self.key.clone(),
        };
        self.cluster.cast(self.owner(), leave);
        let consumers = {
            let mut st = self.inner.lock();
            st.delivered.clear();
            st.parked.clear();
            st.consumers.drain(..).map(|c| c.c).collect()
        };
        (ready, consumers)
    }
    fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }
    fn sweep(&self) -> bool {
        self.sync_subscription();
        false
    }
    fn needs_sweep(&self) -> bool {
        false
    }
    fn sweep_mark(&self) -> &AtomicBool {
        &self.sweep_mark
    }
    fn recover(&self, _entries: &mut dyn Iterator<Item = SpillEntry>) {}

    fn counts(&self) -> QueueCounts {
        let (counts, at) = {
            let c = self.counts.lock();
            (c.0, c.1)
        };
        if at.is_none_or(|t| t.elapsed() > COUNTS_FRESH) {
            self.refresh_counts();
        }
        counts
    }
    fn fresh_counts(&self) -> QueueCounts {
        let req = || Request::ClassicCounts {
            group: self.key.clone(),
        };
        if let Some(Response::Counts(Ok((ready, unacked, consumers)))) = self.call_owner(req) {
            let fresh = QueueCounts {
                ready,
                unacked,
                consumers,
            };
            let mut c = self.counts.lock();
            c.0 = fresh;
            c.1 = Some(Instant::now());
            return fresh;
        }
        self.counts()
    }
    fn ready_bytes(&self) -> u64 {
        0
    }
    fn ready_in_memory_and_paged_out(&self) -> (u32, u32) {
        (0, 0)
    }
    fn memory(&self) -> u64 {
        0
    }
    fn deliveries(&self) -> u64 {
        self.deliveries.load(Ordering::Relaxed)
    }
    fn stats(&self) -> &QueueStats {
        &self.stats
    }
    fn positions(&self) -> Positions {
        Positions::default()
    }
    fn set_put_position(&self, _put: u64) {}
    fn reset_positions(&self) -> u32 {
        0
    }
    fn get_positioned(&self) -> Option<(QueuedMessage, u64)> {
        None
    }
    fn peek_position(&self, _pos: u64) -> Option<Bytes> {
        None
    }
    fn owner_node(&self) -> Option<u64> {
        Some(self.owner())
    }
}
