//! Queues: the ready list, consumers with prefetch accounting, and settlement.
//!
//! A queue keeps its ready messages ordered by [`QueuedMessage::seq`]. Delivery is round-robin
//! over consumers that have credit: a consumer's own prefetch (basic.qos with global=false, as
//! RabbitMQ's `per_consumer_qos`) is counted here; the channel-wide prefetch (global=true) is
//! counted by the channel, which can refuse a delivery through [`DeliveryTarget::deliver`].
//!
//! Messages handed to a consumer that acks leave the queue's custody; the queue only counts
//! them (`unacked`) until they are settled. A requeued message goes back to its original
//! position, flagged redelivered.
//!
//! Routing and the front ends see a queue as [`Queue`], the trait object of [`QueueBackend`]
//! (`queue/backend.rs`, which says why), so that other kinds of queue can sit beside the
//! classic one; `queue/classic.rs` implements the trait for [`ClassicQueue`].
//!
//! This file holds the [`ClassicQueue`], its state and publishing into it; each concern has a
//! file below `queue/`: `dispatch.rs` (consumers, delivery, get, settlement, purge), `paging.rs`
//! (the spill file beyond the in-memory window, read-back, recovery), `expiry.rs` (message
//! TTL and `x-expires`), `limits.rs` (length limits and publisher flow control),
//! `dead_letters.rs`, `positions.rs` and `view.rs` (the httpmq API's positions and views).

use crate::args::{Overflow, QueueArgs};
use crate::blocks::Blocks;
use crate::clock::{Clock, SystemClock};
use crate::dead_letter::{DeadLetter, DeadLetterSink, DeathReason};
use crate::error::{resource, BrokerError, Result};
use crate::log_limit::LogLimit;
use crate::message::{Message, QueuedMessage};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Weak};
use tracing::warn;
use warren_amqp::table::FieldTable;
use warren_store::spill::{SpillEntry, SpillFile};
use warren_store::{Location, Store, StoreError};

mod backend;
mod classic;
mod dead_letters;
mod dispatch;
mod expiry;
mod limits;
mod paging;
mod positions;
mod sweeps;
mod view;

pub use backend::{
    lock_enqueue_order, queue_type, EnqueueOrder, Queue, QueueBackend, QueueKind, QueueSpec,
    ENQUEUE_ORDER_INLINE,
};
use paging::{entry_key, Spilled};
pub use positions::{Positions, UsedSet};
pub use sweeps::SweepSet;

/// The side of a channel that receives deliveries from queues.
///
/// Implemented by the server's channel. Both methods are called with the queue's lock held and
/// must not call back into any queue.
pub trait DeliveryTarget: Send + Sync {
    /// A process-unique id of the channel; consumers are identified by (channel key, tag).
    fn channel_key(&self) -> u64;

    /// Offers `msg` to consumer `consumer_tag` of this channel. Returns the message back when the
    /// channel cannot take it now (channel-wide prefetch reached, flow stopped, channel closing).
    fn deliver(
        &self,
        queue: &Arc<Queue>,
        consumer_tag: &Arc<str>,
        no_ack: bool,
        msg: QueuedMessage,
    ) -> std::result::Result<(), QueuedMessage>;

    /// The broker cancelled consumer `consumer_tag` (its queue was deleted): forget it and, if the
    /// client declared the `consumer_cancel_notify` capability, send it basic.cancel.
    fn cancelled_by_broker(&self, consumer_tag: &Arc<str>);
}

/// A consumer registered on a queue by basic.consume.
pub struct Consumer {
    /// Consumer tag, unique within its channel.
    pub tag: Arc<str>,
    /// The channel that receives its deliveries.
    pub target: Arc<dyn DeliveryTarget>,
    /// Deliveries need no acknowledgement (and take no prefetch credit).
    pub no_ack: bool,
    /// Exclusive consumer: no other consumer may use the queue while it exists.
    pub exclusive: bool,
    /// Per-consumer prefetch count, 0 = unlimited.
    pub prefetch: u16,
    /// basic.consume arguments.
    pub arguments: FieldTable,
    in_flight: u32,
    /// Consumer priority (`x-priority` argument, RabbitMQ's consumer priorities): a queue
    /// delivers to its highest-priority consumers while they have credit.
    priority: i64,
}

impl Consumer {
    /// A consumer with nothing in flight.
    pub fn new(
        tag: Arc<str>,
        target: Arc<dyn DeliveryTarget>,
        no_ack: bool,
        exclusive: bool,
        prefetch: u16,
        arguments: FieldTable,
    ) -> Self {
        Consumer {
            tag,
            target,
            no_ack,
            exclusive,
            prefetch,
            priority: arguments
                .get("x-priority")
                .and_then(|v| v.as_i64())
                .unwrap_or(0),
            arguments,
            in_flight: 0,
        }
    }

    fn has_credit(&self) -> bool {
        self.no_ack || self.prefetch == 0 || self.in_flight < u32::from(self.prefetch)
    }
}

/// How a delivered message is settled by its channel.
#[derive(Debug)]
pub struct Settlement {
    /// Consumer the message was delivered to (`None` for basic.get).
    pub consumer_tag: Option<Arc<str>>,
    /// The message.
    pub message: QueuedMessage,
    /// Put the message back in the queue (nack/reject with requeue, channel close,
    /// basic.recover) rather than dropping it (ack, reject without requeue).
    pub requeue: bool,
    /// The client rejected the message (basic.reject / basic.nack): without `requeue` it is
    /// dead-lettered with reason `rejected` when the queue has a dead-letter exchange.
    pub rejected: bool,
}

/// Where a queue keeps what does not fit in memory.
///
/// A queue holds at most `window` ready messages in memory. Beyond that, new messages go to a
/// spill file of 32-byte entries pointing into the message store (persistent messages are
/// there already; transient ones are paged there), and come back into memory in chunks as
/// consumers drain the window. Memory per queue is therefore bounded however deep it grows.
/// When the disk refuses the spill (full or failing), nothing leaves the queue and nothing
/// changes place: the spill file keeps its entries in memory until it can write them, and a
/// transient message the store cannot take is held whole in memory behind the spilled ones
/// until it can be paged out (see [`Queue::sweep`]).
/// A priority queue has a spill file per priority, so that a message of a higher priority
/// than the window holds comes back first. A message keeps its enqueue time in the store, so
/// its TTL counts from then however often it is paged or recovered.
///
/// Delivered, unacknowledged messages beyond `unacked_window` per channel are kept by their
/// channel as store locations too ([`Queue::page_out`]); requeued, they go back to the queue
/// without their body, which is read when they reach its head again.
pub struct Backing {
    /// The message store.
    pub store: Store,
    /// The bounds and the spill directory, shared by the queues of a broker.
    pub paging: Arc<Paging>,
    /// This queue's spill file number (see [`Backing::spill_path`]).
    pub spill: u64,
}

/// The paging bounds of [`Backing`], the same for every queue of a broker (one copy, so that
/// an idle queue does not carry them).
#[derive(Debug, Clone)]
pub struct Paging {
    /// Most ready messages held in memory.
    pub window: usize,
    /// Most bytes of ready message bodies held in memory.
    pub window_bytes: usize,
    /// Unacknowledged deliveries a channel keeps in memory, beyond which it keeps them as
    /// store locations.
    pub unacked_window: usize,
    /// The same bound in bytes of message bodies.
    pub unacked_window_bytes: usize,
    /// The directory of the spill files.
    pub spill_dir: PathBuf,
}

impl Backing {
    /// The queue's spill file (created on first use): `<spill_dir>/<spill>.spill`, or
    /// `<spill_dir>/<spill>.<level>.spill` for priority level `level` of a priority queue.
    pub fn spill_path(&self, level: Option<usize>) -> PathBuf {
        let name = match level {
            Some(l) => format!("{}.{l}.spill", self.spill),
            None => format!("{}.spill", self.spill),
        };
        self.paging.spill_dir.join(name)
    }
}

/// A delivery settled by a channel that held it paged out (see [`Queue::page_out`]).
#[derive(Debug)]
pub struct PagedSettlement {
    /// Consumer the message was delivered to (`None` for basic.get).
    pub consumer_tag: Option<Arc<str>>,
    /// Where the message is stored.
    pub entry: SpillEntry,
    /// Put it back in the queue (as [`Settlement::requeue`]).
    pub requeue: bool,
    /// The client rejected it (as [`Settlement::rejected`]).
    pub rejected: bool,
}

/// A queue's declared properties and live state.
pub struct ClassicQueue {
    /// Queue name (the vhost's key for the queue and its bindings' name for it share it).
    name: Arc<str>,
    /// Name of the vhost the queue lives in (for reply texts), shared with the vhost.
    vhost: Arc<str>,
    /// Survives a broker restart.
    durable: bool,
    /// The connection that owns an exclusive queue.
    exclusive_owner: Option<u64>,
    /// Deleted when its last consumer is cancelled.
    auto_delete: bool,
    /// Declared arguments (`x-…`); `None` when there are none (most queues: 8 bytes, no
    /// allocation).
    arguments: Option<Box<FieldTable>>,
    /// The arguments parsed from `arguments`; shared with `effective` while no policy
    /// changes them (most queues), so that a queue keeps them once.
    declared: Arc<QueueArgs>,
    /// `arguments` has `x-overflow` (which then wins over a policy's `overflow`).
    overflow_declared: bool,
    /// The settings the queue acts on: `declared` merged with the policies that apply
    /// (see [`crate::policy::effective_queue_args`]).
    effective: parking_lot::RwLock<Arc<QueueArgs>>,
    /// `effective` has a length limit (`x-max-length` or `x-max-length-bytes`): read on every
    /// publish without taking the lock.
    limited: std::sync::atomic::AtomicBool,
    /// The policy and operator policy that apply, and their merged definition.
    applied: parking_lot::RwLock<Arc<crate::policy::Applied>>,
    clock: Arc<dyn Clock>,
    dead_letters: Option<Weak<dyn DeadLetterSink>>,
    /// When the queue was last used (consumer, basic.get, declare), for `x-expires`.
    last_used: AtomicU64,
    /// The queue's name in store records: vhost and name joined by U+001F.
    store_key: Box<str>,
    backing: Option<Backing>,
    deliveries: std::sync::atomic::AtomicU64,
    stalled_at: std::sync::atomic::AtomicU64,
    /// Publishers wait for the queue to drain ([`ClassicQueue::wake_when_drained`]).
    drain_waiting: std::sync::atomic::AtomicBool,
    /// Message counts for operators (see [`crate::registry`]); deliveries to consumers are
    /// [`Queue::deliveries`].
    stats: crate::registry::QueueStats,
    /// Held by a publisher from taking a message id to enqueueing the message (see
    /// [`Queue::enqueue_order`]), so that this queue enqueues its messages in id order.
    enqueue_order: Mutex<()>,
    state: Mutex<State>,
    /// The vhost's sweep set, joined when the queue gets something to sweep.
    sweeps: Weak<SweepSet>,
    /// Set while the queue is in its vhost's sweep set.
    sweep_mark: std::sync::atomic::AtomicBool,
    /// The vhost's set of queues that may hold messages (see `VHost::used_queues`), joined
    /// at the first enqueue and when messages are recovered.
    used: Weak<UsedSet>,
}

#[derive(Default)]
struct State {
    ready: VecDeque<QueuedMessage>,
    /// Body bytes of `ready`.
    ready_bytes: usize,
    /// Body bytes of the spilled messages (as far as known: recovered ones count 0).
    spilled_bytes: usize,
    /// What is beyond the window, by priority (one, at index 0, for a queue without
    /// priorities).
    spills: Vec<Option<Spilled>>,
    /// Requeued messages whose bodies are in the store, in queue order: each is read back
    /// when it reaches the head of the queue.
    paged: Blocks<SpillEntry>,
    /// Messages ordered by priority first (`x-max-priority`, capped at this).
    priority: Option<u8>,
    /// Dead letters collected under the lock, published after it is released.
    dead: Vec<DeadLetter>,
    consumers: Vec<Consumer>,
    round_robin: usize,
    unacked: u32,
    deleted: bool,
    /// Messages enqueued since the queue was created or its positions reset (see
    /// [`Positions`]).
    put_pos: u64,
    /// A message with a deadline (TTL) was enqueued, or messages were recovered: the sweep
    /// must look at the head while the queue holds messages.
    has_deadlines: bool,
}

impl Spilled {
    fn len(&self) -> usize {
        self.file.len() as usize + self.held.len()
    }
}

impl State {
    fn spilled(&self) -> usize {
        // Read on every publish and delivery; a queue without priorities has one level.
        match self.spills.as_slice() {
            [] => 0,
            [one] => one.as_ref().map_or(0, Spilled::len),
            levels => levels.iter().flatten().map(Spilled::len).sum(),
        }
    }
    fn spilled_at(&self, level: usize) -> usize {
        self.spills
            .get(level)
            .and_then(Option::as_ref)
            .map_or(0, Spilled::len)
    }
    /// The priority a delivery of `m` is recorded under in the store (see
    /// `Store::delivered`): its `priority` property in a priority queue, which delivers in id
    /// order only within a priority; none in another queue.
    fn mark_priority(&self, m: &Message) -> Option<u8> {
        self.priority.map(|_| m.properties.priority.unwrap_or(0))
    }
    /// The priority whose spill file a message of priority `p` goes to.
    fn level(&self, p: u8) -> usize {
        usize::from(self.priority.map_or(0, |max| p.min(max)))
    }
    /// Ready messages, in memory or not.
    fn ready_count(&self) -> usize {
        self.ready.len() + self.spilled() + self.paged.len()
    }
    fn push_back(&mut self, qm: QueuedMessage) {
        if self.priority.is_some() {
            return self.insert_ordered(qm);
        }
        self.ready_bytes += qm.message.body.len();
        self.ready.push_back(qm);
    }
    fn push_front(&mut self, qm: QueuedMessage) {
        self.ready_bytes += qm.message.body.len();
        self.ready.push_front(qm);
    }
    fn pop_front(&mut self) -> Option<QueuedMessage> {
        let qm = self.ready.pop_front()?;
        self.ready_bytes -= qm.message.body.len();
        Some(qm)
    }
    fn insert_ordered(&mut self, qm: QueuedMessage) {
        self.ready_bytes += qm.message.body.len();
        insert_ordered(&mut self.ready, qm, self.priority);
    }
    fn take_ready(&mut self) -> VecDeque<QueuedMessage> {
        self.ready_bytes = 0;
        self.spilled_bytes = 0;
        std::mem::take(&mut self.ready)
    }
}

/// Counts reported by queue.declare-ok and the management API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueCounts {
    /// Messages ready for delivery.
    pub ready: u32,
    /// Messages delivered and not yet acknowledged.
    pub unacked: u32,
    /// Consumers.
    pub consumers: u32,
}

/// Where a replicated queue's replicas are (RabbitMQ's `leader`, `members` and `online`
/// of a quorum queue), by cluster node id (`[cluster] node_id`; 1 without a cluster).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Replicas {
    /// The node whose member leads, when one is known.
    pub leader: Option<u64>,
    /// The nodes that hold a member (voters of the queue's Raft group), in id order.
    pub members: Vec<u64>,
    /// The members whose node is reachable from this one (this node included).
    pub online: Vec<u64>,
}

impl std::fmt::Debug for ClassicQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClassicQueue")
            .field("name", &self.name)
            .finish()
    }
}

impl ClassicQueue {
    /// A new, empty queue.
    pub fn new(
        name: impl Into<Arc<str>>,
        vhost: impl Into<Arc<str>>,
        durable: bool,
        exclusive_owner: Option<u64>,
        auto_delete: bool,
        arguments: FieldTable,
    ) -> Self {
        let (name, vhost) = (name.into(), vhost.into());
        // Declared arguments were validated by queue.declare; recovered definitions are
        // taken as they are.
        let args = if arguments.is_empty() {
            no_arguments()
        } else {
            Arc::new(
                QueueArgs::parse(&resource("queue", &name, &vhost), &arguments).unwrap_or_default(),
            )
        };
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        ClassicQueue {
            store_key: store_key(&vhost, &name).into(),
            name,
            vhost,
            durable,
            exclusive_owner,
            auto_delete,
            last_used: AtomicU64::new(clock.now_ms()),
            clock,
            dead_letters: None,
            backing: None,
            deliveries: std::sync::atomic::AtomicU64::new(0),
            stalled_at: std::sync::atomic::AtomicU64::new(u64::MAX),
            drain_waiting: std::sync::atomic::AtomicBool::new(false),
            enqueue_order: Mutex::new(()),
            stats: crate::registry::QueueStats::default(),
            state: Mutex::new(State {
                priority: args.max_priority,
                ..State::default()
            }),
            sweeps: Weak::new(),
            sweep_mark: std::sync::atomic::AtomicBool::new(false),
            used: Weak::new(),
            overflow_declared: arguments.contains_key("x-overflow"),
            limited: std::sync::atomic::AtomicBool::new(has_length_limit(&args)),
            applied: parking_lot::RwLock::new(no_policy()),
            effective: parking_lot::RwLock::new(args.clone()),
            declared: args,
            arguments: (!arguments.is_empty()).then(|| Box::new(arguments)),
        }
    }

    /// The queue's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Name of the vhost the queue lives in.
    pub fn vhost(&self) -> &str {
        &self.vhost
    }

    /// True when the queue survives a broker restart (queue.declare's `durable`).
    pub fn durable(&self) -> bool {
        self.durable
    }

    /// The connection that owns an exclusive queue (queue.declare's `exclusive`).
    pub fn exclusive_owner(&self) -> Option<u64> {
        self.exclusive_owner
    }

    /// True when the queue is deleted once its last consumer is cancelled.
    pub fn auto_delete(&self) -> bool {
        self.auto_delete
    }

    /// The declared arguments (`x-…`), as queue.declare gave them.
    pub fn arguments(&self) -> &FieldTable {
        static NONE: FieldTable = FieldTable(Vec::new());
        self.arguments.as_deref().unwrap_or(&NONE)
    }

    /// Message counts for operators (see [`crate::registry`]).
    pub fn stats(&self) -> &crate::registry::QueueStats {
        &self.stats
    }

    /// A new, empty queue with what its vhost gives it (see [`QueueSpec`]).
    pub fn from_spec(spec: QueueSpec) -> Self {
        let mut q = ClassicQueue::new(
            spec.name,
            spec.vhost,
            spec.durable,
            spec.exclusive_owner,
            spec.auto_delete,
            spec.arguments,
        )
        .with_clock(spec.clock)
        .with_dead_letter_sink(spec.dead_letters);
        q.sweeps = spec.sweeps;
        q.used = spec.used;
        if let Some(b) = spec.backing {
            q = q.with_backing(b);
        }
        q
    }

    /// The settings the queue acts on now: its arguments merged with the policies that apply.
    pub fn args(&self) -> Arc<QueueArgs> {
        self.effective.read().clone()
    }

    /// [`ClassicQueue::args`] without taking a reference: for a few fields read on every
    /// publish and delivery. Hold the guard briefly and never while taking the queue's
    /// state lock (a policy change writes it).
    pub(super) fn settings(&self) -> parking_lot::RwLockReadGuard<'_, Arc<QueueArgs>> {
        self.effective.read()
    }

    /// The policy and operator policy applied to the queue, and their merged definition.
    pub fn applied_policy(&self) -> Arc<crate::policy::Applied> {
        self.applied.read().clone()
    }

    /// Applies `applied` (the policies matching the queue now): the queue acts on its
    /// arguments merged with it from now on. Returns true when its settings changed; the
    /// caller then calls [`Queue::enforce_limits`] (outside the topology lock), as RabbitMQ
    /// applies a new length limit at once. Messages already queued keep the expiry they got
    /// when they were enqueued, as in RabbitMQ.
    pub fn apply_policy(&self, applied: crate::policy::Applied) -> bool {
        let args =
            crate::policy::effective_queue_args(&self.declared, self.overflow_declared, &applied);
        let changed = *self.effective.read().as_ref() != args;
        self.limited.store(
            has_length_limit(&args),
            std::sync::atomic::Ordering::Relaxed,
        );
        *self.effective.write() = if args == *self.declared {
            self.declared.clone()
        } else {
            Arc::new(args)
        };
        *self.applied.write() = if applied == crate::policy::Applied::default() {
            no_policy()
        } else {
            Arc::new(applied)
        };
        changed
    }

    /// Gives the queue the clock its TTLs and expiry are measured with.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.last_used = AtomicU64::new(clock.now_ms());
        self.clock = clock;
        self
    }

    /// Gives the queue the vhost its dead letters are re-published in.
    pub fn with_dead_letter_sink(mut self, sink: Weak<dyn DeadLetterSink>) -> Self {
        self.dead_letters = Some(sink);
        self
    }

    /// Gives the queue a store to page to beyond `backing.paging.window` ready messages, and (for a
    /// durable queue) to record settlements of persistent messages in.
    pub fn with_backing(mut self, backing: Backing) -> Self {
        self.backing = Some(backing);
        self
    }

    /// The queue's name in the message store's records.
    pub fn store_key(&self) -> &str {
        &self.store_key
    }

    /// The store this queue records persistent messages in: durable queues with a backing.
    pub fn store(&self) -> Option<&Store> {
        self.backing
            .as_ref()
            .filter(|_| self.durable)
            .map(|b| &b.store)
    }

    /// Body bytes of the ready messages (those paged out after a restart count 0 until read
    /// back): RabbitMQ's `message_bytes_ready`.
    pub fn ready_bytes(&self) -> u64 {
        let st = self.state.lock();
        (st.ready_bytes + st.spilled_bytes) as u64
    }

    /// An estimate of the bytes this queue holds in memory (RabbitMQ's queue `memory`),
    /// from what it keeps: the queue itself, each ready message held whole (its entry, the
    /// message's header struct and its body bytes, whether or not other queues share the
    /// same message), each message held whole because the store refused to page it out,
    /// the index entries of requeued messages whose bodies are in the store, and
    /// its consumers. Paged-out messages cost nothing here (their index is on disk), nor do
    /// unacknowledged deliveries (the channels hold those). Taken under the queue's lock,
    /// in constant time but for the messages held for a refusing store (few by nature).
    pub fn memory(&self) -> u64 {
        use std::mem::size_of;
        let per_message = size_of::<QueuedMessage>() + size_of::<Message>();
        let st = self.state.lock();
        let mut bytes = size_of::<ClassicQueue>()
            + size_of::<State>()
            + st.ready.len() * per_message
            + st.ready_bytes
            + st.paged.len() * size_of::<SpillEntry>()
            + st.consumers.len() * size_of::<Consumer>();
        for held in st.spills.iter().flatten().map(|s| &s.held) {
            bytes += held.len() * per_message;
            bytes += held.iter().map(|m| m.message.body.len()).sum::<usize>();
        }
        bytes as u64
    }

    /// Current counts.
    pub fn counts(&self) -> QueueCounts {
        let st = self.state.lock();
        QueueCounts {
            ready: st.ready_count() as u32,
            unacked: st.unacked,
            consumers: st.consumers.len() as u32,
        }
    }

    /// Ready messages as (held in memory with their bodies, paged out to the store), as
    /// RabbitMQ's `messages_ram` and `messages_paged_out`: a message the store could not take
    /// when it had to page out (disk full) counts in memory until it is paged out later.
    pub fn ready_in_memory_and_paged_out(&self) -> (u32, u32) {
        let st = self.state.lock();
        let held: usize = st.spills.iter().flatten().map(|s| s.held.len()).sum();
        let in_memory = st.ready.len() + held;
        (in_memory as u32, (st.ready_count() - in_memory) as u32)
    }

    /// True once the queue has been deleted.
    pub fn is_deleted(&self) -> bool {
        self.state.lock().deleted
    }

    /// The lock a publisher holds from taking message id `seq` (see [`Queue::publish`]) until
    /// this queue has enqueued the message. Ids are the queue order: requeued messages go back
    /// to their place by id, and recovery after a restart restores a queue in id order, so a
    /// queue must enqueue its messages in id order even when publishers race (RabbitMQ's
    /// classic queues requeue to the original position and recover in queue order).
    /// Publishers routing to several queues take their locks in address order (see
    /// [`lock_enqueue_order`]).
    pub fn enqueue_order(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.enqueue_order.lock()
    }

    /// Appends message `seq` (ids increase across the broker, and each queue enqueues its
    /// messages in id order, see [`ClassicQueue::enqueue_order`]) and delivers what consumers
    /// can take; `this` is this queue's handle, handed to the channels it delivers to.
    /// `stored` is where the store holds the message when it is persistent and this queue
    /// durable. A deleted queue drops it.
    ///
    /// Returns (publishers should pause, see [`ClassicQueue::is_pressured`]; the dead letters:
    /// messages dropped by `x-overflow` `drop-head` or a TTL of 0, for a caller that holds
    /// [`ClassicQueue::enqueue_order`] locks: dead-lettering publishes again, maybe to this
    /// queue. Publish them with [`ClassicQueue::dead_letter`] once the locks are released).
    pub fn enqueue(
        &self,
        this: &Arc<Queue>,
        message: Arc<Message>,
        seq: u64,
        stored: Option<Location>,
    ) -> (bool, Vec<DeadLetter>) {
        let expires_at = self.deadline(&message);
        let mut st = self.state.lock();
        if !st.deleted {
            st.put_pos += 1;
            let _ = message.position.set(st.put_pos);
            if st.put_pos == 1 {
                if let Some(set) = self.used.upgrade() {
                    set.add(this);
                }
            }
        }
        let qm = QueuedMessage {
            seq,
            message,
            redelivered: false,
            stored,
            expires_at,
        };
        if st.deleted {
            drop(st);
            self.settled(&qm);
            return (false, Vec::new());
        }
        crate::registry::bump(&self.stats.publish);
        if let Some(qm) = self.spill_if_full(&mut st, qm) {
            st.push_back(qm);
        }
        self.dispatch_from(this, &mut st, Some(seq));
        if expires_at.is_some() {
            st.has_deadlines = true;
            // A message whose TTL ran out before a consumer could take it (TTL 0) goes now.
            self.expire_head(&mut st, None);
        }
        self.enforce_max_length(&mut st);
        let spilled = st.spilled() > 0;
        let pressured = Self::pressured_at(&st, self.pause_publishers_at());
        let sweep = expires_at.is_some() || (spilled && Self::paging_stalled(&st));
        let dead = self.flush_dead(&mut st);
        drop(st);
        if sweep {
            self.join_sweeps(this);
        }
        (pressured, dead)
    }

    /// Joins the vhost's sweep set (nothing when the queue is in it already).
    fn join_sweeps(&self, this: &Arc<Queue>) {
        if self.sweep_mark.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        if let Some(set) = self.sweeps.upgrade() {
            set.add(this);
        }
    }

    /// True while paging waits for the disk: spill writes it refused, or messages held in
    /// memory behind a spill.
    fn paging_stalled(st: &State) -> bool {
        st.spills
            .iter()
            .flatten()
            .any(|s| s.file.is_stalled() || !s.held.is_empty())
    }

    /// See [`QueueBackend::needs_sweep`]: a TTL or `x-expires` applies, messages that may
    /// have deadlines wait, dead letters or paging wait.
    pub fn needs_sweep(&self) -> bool {
        {
            let args = self.settings();
            if args.expires.is_some() || args.message_ttl.is_some() {
                return true;
            }
        }
        let st = self.state.lock();
        !st.deleted
            && ((st.has_deadlines && st.ready_count() > 0)
                || !st.dead.is_empty()
                || Self::paging_stalled(&st))
    }

    /// Messages delivered to consumers so far (to tell a stalled consumer from a slow one).
    pub fn deliveries(&self) -> u64 {
        self.deliveries.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// The parsed arguments of a queue declared without any: one copy that all such queues share
/// (most queues; 150 bytes each otherwise).
fn no_arguments() -> Arc<QueueArgs> {
    static NONE: std::sync::LazyLock<Arc<QueueArgs>> = std::sync::LazyLock::new(Arc::default);
    NONE.clone()
}

/// The [`crate::policy::Applied`] of a queue no policy applies to, shared by all of them.
fn no_policy() -> Arc<crate::policy::Applied> {
    static NONE: std::sync::LazyLock<Arc<crate::policy::Applied>> =
        std::sync::LazyLock::new(Arc::default);
    NONE.clone()
}

/// True when `args` limit the queue's length (`x-max-length` or `x-max-length-bytes`).
fn has_length_limit(args: &QueueArgs) -> bool {
    args.max_length.is_some() || args.max_length_bytes.is_some()
}

/// The key a queue's messages carry in the store: `vhost` U+001F `name`.
pub fn store_key(vhost: &str, name: &str) -> String {
    format!("{vhost}\u{1f}{name}")
}

/// A message's place in a queue: by priority first in a priority queue (`max` set), then by
/// sequence number.
fn order_key(m: &QueuedMessage, max: Option<u8>) -> (u8, u64) {
    match max {
        Some(max) => (
            max - m.message.properties.priority.unwrap_or(0).min(max),
            m.seq,
        ),
        None => (0, m.seq),
    }
}

/// Inserts a message at its position (original position by sequence number for a requeued
/// one). Requeued messages are usually older than everything ready, so the front is checked
/// first; new ones usually go last.
fn insert_ordered(ready: &mut VecDeque<QueuedMessage>, m: QueuedMessage, max: Option<u8>) {
    let key = order_key(&m, max);
    match (ready.front(), ready.back()) {
        (None, _) => ready.push_back(m),
        (Some(f), _) if key < order_key(f, max) => ready.push_front(m),
        (_, Some(b)) if key > order_key(b, max) => ready.push_back(m),
        _ => {
            let pos = ready.partition_point(|x| order_key(x, max) < key);
            ready.insert(pos, m);
        }
    }
}

#[cfg(test)]
mod tests;
