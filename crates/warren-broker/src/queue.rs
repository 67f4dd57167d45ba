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

use crate::args::{Overflow, QueueArgs};
use crate::blocks::Blocks;
use crate::clock::{Clock, SystemClock};
use crate::dead_letter::{DeadLetter, DeadLetterSink, DeadLetterSource, DeathReason};
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
    /// Most ready messages held in memory.
    pub window: usize,
    /// Most bytes of ready message bodies held in memory.
    pub window_bytes: usize,
    /// Path of this queue's spill file (created on first use); a priority queue's files add
    /// the priority to it.
    pub spill_path: PathBuf,
    /// Unacknowledged deliveries a channel keeps in memory, beyond which it keeps them as
    /// store locations.
    pub unacked_window: usize,
    /// The same bound in bytes of message bodies.
    pub unacked_window_bytes: usize,
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
pub struct Queue {
    /// Queue name.
    pub name: String,
    /// Name of the vhost the queue lives in (for reply texts).
    pub vhost: String,
    /// Survives a broker restart.
    pub durable: bool,
    /// The connection that owns an exclusive queue.
    pub exclusive_owner: Option<u64>,
    /// Deleted when its last consumer is cancelled.
    pub auto_delete: bool,
    /// Declared arguments (`x-…`).
    pub arguments: FieldTable,
    /// The arguments parsed from `arguments`.
    declared: QueueArgs,
    /// `arguments` has `x-overflow` (which then wins over a policy's `overflow`).
    overflow_declared: bool,
    /// The settings the queue acts on: `declared` merged with the policies that apply
    /// (see [`crate::policy::effective_queue_args`]).
    effective: parking_lot::RwLock<Arc<QueueArgs>>,
    /// The policy and operator policy that apply, and their merged definition.
    applied: parking_lot::RwLock<Arc<crate::policy::Applied>>,
    clock: Arc<dyn Clock>,
    dead_letters: Option<Weak<dyn DeadLetterSink>>,
    /// When the queue was last used (consumer, basic.get, declare), for `x-expires`.
    last_used: AtomicU64,
    /// The queue's name in store records: vhost and name joined by U+001F.
    store_key: String,
    backing: Option<Backing>,
    deliveries: std::sync::atomic::AtomicU64,
    stalled_at: std::sync::atomic::AtomicU64,
    /// Message counts for operators (see [`crate::registry`]); deliveries to consumers are
    /// [`Queue::deliveries`].
    pub stats: crate::registry::QueueStats,
    /// Held by a publisher from taking a message id to enqueueing the message (see
    /// [`Queue::enqueue_order`]), so that this queue enqueues its messages in id order.
    enqueue_order: Mutex<()>,
    state: Mutex<State>,
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
}

/// One priority's messages beyond the in-memory window, in queue order: the spill file's
/// entries first, then the messages that could not be paged out (the store refused the
/// write: disk full or failing), held whole in memory until they can be.
struct Spilled {
    file: SpillFile,
    held: VecDeque<QueuedMessage>,
}

impl Spilled {
    fn len(&self) -> usize {
        self.file.len() as usize + self.held.len()
    }
}

/// Warnings of the paging paths, one line per interval each (a full disk fails them all).
static PAGE_OUT_FAILED: LogLimit = LogLimit::new();
static SPILL_WRITE_FAILED: LogLimit = LogLimit::new();
static SPILL_READ_FAILED: LogLimit = LogLimit::new();

impl State {
    fn spilled(&self) -> usize {
        self.spills.iter().flatten().map(Spilled::len).sum()
    }
    fn spilled_at(&self, level: usize) -> usize {
        self.spills
            .get(level)
            .and_then(Option::as_ref)
            .map_or(0, Spilled::len)
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

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("name", &self.name).finish()
    }
}

impl Queue {
    /// A new, empty queue.
    pub fn new(
        name: impl Into<String>,
        vhost: impl Into<String>,
        durable: bool,
        exclusive_owner: Option<u64>,
        auto_delete: bool,
        arguments: FieldTable,
    ) -> Self {
        let (name, vhost) = (name.into(), vhost.into());
        // Declared arguments were validated by queue.declare; recovered definitions are
        // taken as they are.
        let args =
            QueueArgs::parse(&resource("queue", &name, &vhost), &arguments).unwrap_or_default();
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        Queue {
            store_key: store_key(&vhost, &name),
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
            enqueue_order: Mutex::new(()),
            stats: crate::registry::QueueStats::default(),
            state: Mutex::new(State {
                priority: args.max_priority,
                ..State::default()
            }),
            overflow_declared: arguments.contains_key("x-overflow"),
            effective: parking_lot::RwLock::new(Arc::new(args.clone())),
            applied: parking_lot::RwLock::new(Arc::default()),
            declared: args,
            arguments,
        }
    }

    /// The settings the queue acts on now: its arguments merged with the policies that apply.
    pub fn args(&self) -> Arc<QueueArgs> {
        self.effective.read().clone()
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
        *self.effective.write() = Arc::new(args);
        *self.applied.write() = Arc::new(applied);
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

    /// Records a use of the queue (basic.get, declare, consumers coming and going), which
    /// restarts its `x-expires` timer.
    pub fn touch(&self) {
        self.last_used
            .store(self.clock.now_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    /// When a message enqueued now expires: the smaller of the queue's `x-message-ttl` and
    /// the message's `expiration`.
    fn deadline(&self, m: &Message) -> Option<u64> {
        self.deadline_from(m, self.clock.now_ms())
    }

    /// When a message enqueued at `enqueued_ms` expires.
    fn deadline_from(&self, m: &Message, enqueued_ms: u64) -> Option<u64> {
        Some(enqueued_ms.saturating_add(self.ttl(m)?))
    }

    /// A message's TTL in this queue, ms: the smaller of `x-message-ttl` and `expiration`.
    fn ttl(&self, m: &Message) -> Option<u64> {
        let own = m
            .properties
            .expiration
            .as_ref()
            .and_then(|e| crate::args::parse_expiration(e.as_str()?).ok());
        match (self.args().message_ttl, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When `qm` was enqueued, ms since the epoch, as far as its deadline tells (now when it
    /// has none: then the time does not matter).
    fn enqueued_at(&self, qm: &QueuedMessage) -> u64 {
        match (qm.expires_at, self.ttl(&qm.message)) {
            (Some(at), Some(ttl)) => at.saturating_sub(ttl),
            _ => self.clock.now_ms(),
        }
    }

    /// A message leaves the queue without being delivered (expired, over the length limit,
    /// rejected): it is settled, and dead-lettered if the queue has a dead-letter exchange.
    fn discard(&self, st: &mut State, qm: QueuedMessage, reason: DeathReason) {
        self.settled(&qm);
        if self.args().dead_letter_exchange.is_some() {
            st.dead.push(DeadLetter {
                message: qm.message,
                reason,
            });
        }
    }

    /// Takes the dead letters collected under the lock, for [`Queue::publish_dead`] once the
    /// lock is released.
    fn flush_dead(&self, st: &mut State) -> Vec<DeadLetter> {
        std::mem::take(&mut st.dead)
    }

    /// Re-publishes dead letters to the queue's dead-letter exchange (never call with the
    /// queue's lock held: the dead-letter exchange may route back to this queue).
    fn publish_dead(&self, dead: Vec<DeadLetter>) {
        if dead.is_empty() {
            return;
        }
        let args = self.args();
        if let Some(source) = self.dead_letter_source(&args) {
            if let Some(sink) = self.dead_letters.as_ref().and_then(Weak::upgrade) {
                sink.dead_letter(&source, dead);
            }
        }
    }

    /// Where this queue's dead letters go under `args` (its [`Queue::args`]), if it has a
    /// dead-letter exchange.
    pub fn dead_letter_source<'a>(&'a self, args: &'a QueueArgs) -> Option<DeadLetterSource<'a>> {
        Some(DeadLetterSource {
            queue: &self.name,
            exchange: args.dead_letter_exchange.as_deref()?,
            routing_key: args.dead_letter_routing_key.as_deref(),
        })
    }

    /// Drops (or dead-letters) the expired messages at the head of the queue. `spare` is a
    /// message being published now, which a TTL of 0 lets through to a consumer that can take
    /// it at once.
    fn expire_head(&self, st: &mut State, spare: Option<u64>) {
        let mut now = None;
        loop {
            self.refill(st);
            let Some(deadline) = st
                .ready
                .front()
                .and_then(|f| (Some(f.seq) != spare).then_some(f.expires_at).flatten())
            else {
                return;
            };
            let now = *now.get_or_insert_with(|| self.clock.now_ms());
            if deadline > now {
                return;
            }
            if let Some(qm) = st.pop_front() {
                self.discard(st, qm, DeathReason::Expired);
            }
        }
    }

    /// Ready messages and their body bytes, in memory and spilled.
    fn depth(st: &State) -> (u64, u64) {
        (
            st.ready_count() as u64,
            (st.ready_bytes + st.spilled_bytes) as u64,
        )
    }

    /// Drops (or dead-letters) messages from the head while the queue is over its
    /// `x-max-length` / `x-max-length-bytes` (overflow `drop-head`).
    fn enforce_max_length(&self, st: &mut State) {
        let (max_len, max_bytes) = (self.args().max_length, self.args().max_length_bytes);
        if self.args().overflow != Overflow::DropHead || (max_len.is_none() && max_bytes.is_none())
        {
            return;
        }
        loop {
            let (n, bytes) = Self::depth(st);
            if !(max_len.is_some_and(|m| n > m) || max_bytes.is_some_and(|m| bytes > m)) {
                return;
            }
            self.refill(st);
            let Some(qm) = st.pop_front() else {
                return;
            };
            self.discard(st, qm, DeathReason::Maxlen);
        }
    }

    /// True when the queue refuses `msg` because it is full and its overflow is
    /// `reject-publish` or `reject-publish-dlx`.
    pub fn rejects_publish(&self, msg: &Message) -> bool {
        let (max_len, max_bytes) = (self.args().max_length, self.args().max_length_bytes);
        if self.args().overflow == Overflow::DropHead || (max_len.is_none() && max_bytes.is_none())
        {
            return false;
        }
        let st = self.state.lock();
        let (n, bytes) = Self::depth(&st);
        max_len.is_some_and(|m| n >= m)
            || max_bytes.is_some_and(|m| bytes + msg.body.len() as u64 > m)
    }

    /// Periodic housekeeping: pages out what a full disk kept in memory once it takes writes
    /// again, and expires messages at the head. Returns true when the queue has
    /// been unused for its `x-expires` and should be deleted.
    pub fn sweep(self: &Arc<Self>) -> bool {
        let mut st = self.state.lock();
        if st.deleted {
            return false;
        }
        self.retry_paging(&mut st);
        self.expire_head(&mut st, None);
        let unused = st.consumers.is_empty();
        let dead = self.flush_dead(&mut st);
        drop(st);
        self.publish_dead(dead);
        let last = self.last_used.load(std::sync::atomic::Ordering::Relaxed);
        unused
            && self
                .args()
                .expires
                .is_some_and(|e| self.clock.now_ms() >= last.saturating_add(e))
    }

    /// Gives the queue a store to page to beyond `backing.window` ready messages, and (for a
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

    /// `queue 'name' in vhost 'v'`, as RabbitMQ names a queue in reply texts.
    pub fn resource_name(&self) -> String {
        resource("queue", &self.name, &self.vhost)
    }

    /// Fails with 405 RESOURCE_LOCKED when the queue is exclusive to another connection.
    pub fn check_exclusive(&self, connection_id: u64) -> Result<()> {
        match self.exclusive_owner {
            Some(owner) if owner != connection_id => Err(BrokerError::resource_locked(format!(
                "cannot obtain exclusive access to locked {}. It could be originally declared on \
                 another connection or the exclusive property value does not match that of the \
                 original declaration.",
                self.resource_name()
            ))),
            _ => Ok(()),
        }
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
        let mut bytes = size_of::<Queue>()
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
    /// messages in id order, see [`Queue::enqueue_order`]) and delivers what consumers can
    /// take. `stored` is where the store holds the message when it is persistent and this
    /// queue durable. A deleted queue drops it.
    ///
    /// Returns true when publishers should pause (see [`Queue::is_pressured`]).
    pub fn publish(
        self: &Arc<Self>,
        message: Arc<Message>,
        seq: u64,
        stored: Option<Location>,
    ) -> bool {
        let (pressured, dead) = self.publish_held(message, seq, stored);
        self.publish_dead(dead);
        pressured
    }

    /// [`Queue::publish`] that returns the dead letters (messages dropped by `x-overflow`
    /// `drop-head` or a TTL of 0) instead of publishing them, for a caller that holds
    /// [`Queue::enqueue_order`] locks: dead-lettering publishes again, maybe to this queue.
    /// Publish them with [`Queue::dead_letter`] once the locks are released.
    pub fn publish_held(
        self: &Arc<Self>,
        message: Arc<Message>,
        seq: u64,
        stored: Option<Location>,
    ) -> (bool, Vec<DeadLetter>) {
        let expires_at = self.deadline(&message);
        let mut st = self.state.lock();
        if !st.deleted {
            st.put_pos += 1;
            let _ = message.position.set(st.put_pos);
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
        self.dispatch_from(&mut st, Some(seq));
        if expires_at.is_some() {
            // A message whose TTL ran out before a consumer could take it (TTL 0) goes now.
            self.expire_head(&mut st, None);
        }
        self.enforce_max_length(&mut st);
        let pressured = !st.consumers.is_empty()
            && (st.spilled() > 0 || st.ready.len() >= self.pressure_limit());
        let dead = self.flush_dead(&mut st);
        drop(st);
        (pressured, dead)
    }

    /// Publishes the dead letters [`Queue::publish_held`] returned (never with an
    /// [`Queue::enqueue_order`] lock held).
    pub fn dead_letter(&self, dead: Vec<DeadLetter>) {
        self.publish_dead(dead);
    }

    /// Ready messages beyond which a queue with consumers asks publishers to pause: its
    /// in-memory window, or 4096 without a store.
    fn pressure_limit(&self) -> usize {
        self.backing.as_ref().map_or(4096, |b| b.window)
    }

    /// Publisher flow control. A queue whose consumers fall behind its publishers would
    /// otherwise build a backlog that only adds latency (and, beyond the window, disk
    /// traffic); publishers of a pressured queue pause until it drains below half its window,
    /// so the broker's CPU goes to delivering instead. A queue without consumers is never
    /// pressured: it simply grows on disk.
    pub fn is_pressured(&self) -> bool {
        let st = self.state.lock();
        !st.consumers.is_empty()
            && (st.spilled() > 0 || st.ready.len() >= self.pressure_limit() / 2)
    }

    /// Messages delivered to consumers so far (to tell a stalled consumer from a slow one).
    pub fn deliveries(&self) -> u64 {
        self.deliveries.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The delivery count at which publishers found this queue's consumers stalled, if they
    /// have not delivered anything since.
    pub fn stalled_at(&self) -> Option<u64> {
        let v = self.stalled_at.load(std::sync::atomic::Ordering::Relaxed);
        (v != u64::MAX).then_some(v)
    }

    /// Records that consumers made no progress since delivery count `at`.
    pub fn mark_stalled(&self, at: u64) {
        self.stalled_at
            .store(at, std::sync::atomic::Ordering::Relaxed);
    }

    /// Adds messages recovered from the store, in id order, as ready: the first window's worth
    /// is read into memory, the rest goes to the spill file (of its priority) unread. Every
    /// entry stays in the queue, in order: when the spill file cannot be written (a full
    /// disk), its entries wait in memory until it can.
    pub fn recover(self: &Arc<Self>, entries: impl IntoIterator<Item = SpillEntry>) {
        let Some(b) = &self.backing else {
            return;
        };
        let mut st = self.state.lock();
        for e in entries {
            let level = st.level(e.priority);
            let e = if !Self::window_full(&st, b) && st.spilled_at(level) == 0 {
                // Unreadable now: it goes first in the spill, where what follows queues
                // behind it.
                match self.load_spilled(&mut st, b, e, true) {
                    Ok(()) => continue,
                    Err(e) => e,
                }
            } else {
                e
            };
            let result = self.spilled(&mut st, b, level).file.push(&[e]);
            self.spill_written(result);
        }
    }

    /// Reports a spill-file write that failed (its entries are kept in memory).
    fn spill_written(&self, result: std::io::Result<()>) {
        if let Err(err) = result {
            if let Some(suppressed) = SPILL_WRITE_FAILED.admit() {
                warn!(queue = %self.name, error = %err, suppressed, "cannot write spill file; keeping its entries in memory until it can be written");
            }
        }
    }

    fn window_full(st: &State, b: &Backing) -> bool {
        st.ready.len() >= b.window || st.ready_bytes >= b.window_bytes
    }

    /// What priority `level` holds beyond the window, created on first use (its spill file
    /// is written once it has a batch of entries).
    fn spilled<'a>(&self, st: &'a mut State, b: &Backing, level: usize) -> &'a mut Spilled {
        if st.spills.len() <= level {
            st.spills.resize_with(level + 1, || None);
        }
        let path = match st.priority {
            Some(_) => b.spill_path.with_extension(format!("{level}.spill")),
            None => b.spill_path.clone(),
        };
        st.spills[level].get_or_insert_with(|| Spilled {
            file: b.store.spill_file(path),
            held: VecDeque::new(),
        })
    }

    /// Where `qm` is in the store, writing it there (as a transient page, released when it
    /// leaves the queue) unless it is a persistent message of this durable queue. `None`
    /// without a store or when the write fails.
    fn page(&self, b: &Backing, qm: &QueuedMessage) -> Option<SpillEntry> {
        let (location, transient) = match qm.stored {
            Some(loc) => (loc, false),
            None => {
                let m = &qm.message;
                match b.store.append_transient(
                    qm.seq,
                    &m.exchange,
                    &m.routing_key,
                    &m.properties,
                    &m.body,
                    self.enqueued_at(qm),
                ) {
                    Ok(loc) => (loc, true),
                    Err(e) => {
                        if let Some(suppressed) = PAGE_OUT_FAILED.admit() {
                            warn!(queue = %self.name, error = %e, suppressed, "cannot page message out; keeping it in memory");
                        }
                        return None;
                    }
                }
            }
        };
        Some(SpillEntry {
            seq: qm.seq,
            id: qm.seq,
            location,
            redelivered: qm.redelivered,
            transient,
            priority: qm.message.properties.priority.unwrap_or(0),
        })
    }

    /// When the in-memory window is full (or messages of its priority are already beyond it,
    /// to keep order), puts `qm` behind them: in the spill file, or held in memory when the
    /// store cannot take it. Returns `qm` when it belongs in the window instead.
    fn spill_if_full(&self, st: &mut State, qm: QueuedMessage) -> Option<QueuedMessage> {
        let Some(b) = &self.backing else {
            return Some(qm);
        };
        let level = st.level(qm.message.properties.priority.unwrap_or(0));
        if !Self::window_full(st, b) && st.spilled_at(level) == 0 {
            return Some(qm);
        }
        // Messages held before this one go to the spill first, if the store takes them now.
        self.page_held(st, b, level);
        st.spilled_bytes += qm.message.body.len();
        let entry = match self.spilled(st, b, level).held.is_empty() {
            true => self.page(b, &qm),
            false => None,
        };
        let spilled = self.spilled(st, b, level);
        match entry {
            Some(entry) => {
                let result = spilled.file.push(&[entry]);
                self.spill_written(result);
            }
            None => spilled.held.push_back(qm),
        }
        None
    }

    /// Pages out the messages priority `level` holds in memory behind its spill, from the
    /// front, for as long as the store takes them.
    fn page_held(&self, st: &mut State, b: &Backing, level: usize) {
        let Some(Some(spilled)) = st.spills.get_mut(level) else {
            return;
        };
        while let Some(qm) = spilled.held.front() {
            let Some(entry) = self.page(b, qm) else {
                return;
            };
            spilled.held.pop_front();
            let result = spilled.file.push(&[entry]);
            self.spill_written(result);
        }
    }

    /// Once the disk takes writes again, writes out what the spill files and the held
    /// messages keep in memory because it did not.
    fn retry_paging(&self, st: &mut State) {
        let Some(b) = &self.backing else {
            return;
        };
        for level in 0..st.spills.len() {
            if let Some(Some(spilled)) = st.spills.get_mut(level) {
                let result = spilled.file.retry();
                self.spill_written(result);
            }
            self.page_held(st, b, level);
        }
    }

    /// Brings back what is paged out as it is needed: requeued messages that sort before
    /// the head, the spill of a priority above the head's, and spilled messages once the
    /// in-memory window is half empty.
    fn refill(&self, st: &mut State) {
        let Some(b) = &self.backing else {
            return;
        };
        let max = st.priority;
        loop {
            // Requeued messages paged out, ahead of the head of the queue.
            if !st.paged.is_empty() {
                let head = st.ready.front().map(|f| order_key(f, max));
                let mut loaded = 0;
                while let Some(e) = st.paged.front() {
                    if loaded == 64 || head.is_some_and(|h| entry_key(e, max) > h) {
                        break;
                    }
                    let e = st.paged.pop_front().expect("front checked");
                    if let Err(e) = self.load_spilled(st, b, e, false) {
                        st.paged.insert_sorted(e, |x| entry_key(x, max));
                        return;
                    }
                    loaded += 1;
                }
            }
            if max.is_none() {
                break;
            }
            // A priority spilled above the priority of the head is delivered first.
            let head_level = st
                .ready
                .front()
                .map(|f| st.level(f.message.properties.priority.unwrap_or(0)));
            let top = (0..st.spills.len()).rev().find(|&l| st.spilled_at(l) > 0);
            match (top, head_level) {
                (Some(t), h) if h.is_none_or(|h| t > h) => {
                    if !self.refill_from(st, b, t, 64) {
                        return;
                    }
                }
                _ => break,
            }
        }
        if st.ready.len() > b.window / 2 || st.ready_bytes > b.window_bytes / 2 || st.spilled() == 0
        {
            return;
        }
        while !Self::window_full(st, b) && st.spilled() > 0 {
            let want = (b.window - st.ready.len()).clamp(1, 64);
            let top = (0..st.spills.len())
                .rev()
                .find(|&l| st.spilled_at(l) > 0)
                .unwrap_or(0);
            if !self.refill_from(st, b, top, want) {
                return;
            }
        }
    }

    /// Reads up to `want` entries of priority `level`'s spill back into memory, or once the
    /// spill file is empty takes its held messages; false when the spill file cannot be read
    /// (its entries stay).
    fn refill_from(&self, st: &mut State, b: &Backing, level: usize, want: usize) -> bool {
        let Some(Some(spilled)) = st.spills.get_mut(level) else {
            return false;
        };
        if spilled.file.is_empty() {
            let n = want.min(spilled.held.len());
            let held: Vec<QueuedMessage> = spilled.held.drain(..n).collect();
            for qm in held {
                st.spilled_bytes = st.spilled_bytes.saturating_sub(qm.message.body.len());
                st.insert_ordered(qm);
            }
            return n > 0;
        }
        let entries = match spilled.file.pop(want) {
            Ok(e) => e,
            Err(e) => {
                if let Some(suppressed) = SPILL_READ_FAILED.admit() {
                    warn!(queue = %self.name, error = %e, suppressed, "cannot read spill file");
                }
                return false;
            }
        };
        let mut entries = entries.into_iter();
        while let Some(mut e) = entries.next() {
            e.priority = level as u8;
            if let Err(e) = self.load_spilled(st, b, e, true) {
                // Back to the front of the spill, in order, to be read again later.
                let back: Vec<SpillEntry> = std::iter::once(e).chain(entries).collect();
                if let Some(Some(spilled)) = st.spills.get_mut(level) {
                    spilled.file.unpop(back);
                }
                return false;
            }
        }
        true
    }

    /// Reads a paged-out message back; its TTL counts from its enqueue time. A transient
    /// page is released. `Err(Some(e))`: an I/O error that may pass (the caller keeps the
    /// entry queued, to be read again); `Err(None)`: the record is corrupt or its segment is
    /// gone, and the message has left the queue.
    fn read_back(
        &self,
        b: &Backing,
        e: SpillEntry,
    ) -> std::result::Result<QueuedMessage, Option<SpillEntry>> {
        match b.store.read(e.location) {
            Ok(m) => {
                if e.transient {
                    b.store.release(e.location);
                }
                let now = self.clock.now_ms();
                let enqueued = m.enqueued_ms.unwrap_or(now);
                let message = Arc::new(Message::new(
                    m.exchange,
                    m.routing_key,
                    m.properties,
                    m.body,
                ));
                let expires_at = self.deadline_from(&message, enqueued);
                Ok(QueuedMessage {
                    seq: e.seq,
                    message,
                    redelivered: e.redelivered,
                    stored: (!e.transient).then_some(e.location),
                    expires_at,
                })
            }
            Err(StoreError::Io(err)) if err.kind() != std::io::ErrorKind::NotFound => {
                static READ_FAILED: LogLimit = LogLimit::new();
                if let Some(suppressed) = READ_FAILED.admit() {
                    warn!(queue = %self.name, error = %err, suppressed, "cannot read stored message; it stays queued and is read again later");
                }
                Err(Some(e))
            }
            Err(err) => {
                static UNREADABLE: LogLimit = LogLimit::new();
                if let Some(suppressed) = UNREADABLE.admit() {
                    warn!(queue = %self.name, error = %err, suppressed, "dropping unreadable stored message");
                }
                self.forget_entry(b, &e);
                Err(None)
            }
        }
    }

    /// Reads `e` back into the ready list; `spilled` when it came from a spill file (whose
    /// byte count it leaves). Gives `e` back when it cannot be read now (see
    /// [`Queue::read_back`]): the caller puts it back where it was.
    fn load_spilled(
        &self,
        st: &mut State,
        b: &Backing,
        e: SpillEntry,
        spilled: bool,
    ) -> std::result::Result<(), SpillEntry> {
        match self.read_back(b, e) {
            Ok(qm) => {
                if spilled {
                    st.spilled_bytes = st.spilled_bytes.saturating_sub(qm.message.body.len());
                }
                st.insert_ordered(qm);
                Ok(())
            }
            Err(Some(e)) => Err(e),
            Err(None) => Ok(()),
        }
    }

    /// A paged-out message leaves this queue for good.
    fn forget_entry(&self, b: &Backing, e: &SpillEntry) {
        if e.transient {
            b.store.release(e.location);
        } else {
            self.forget(e.seq, Some(e.location));
        }
    }

    /// The bound on unacknowledged deliveries a channel keeps in memory from this queue
    /// (messages, body bytes): beyond it the channel holds them by [`Queue::page_out`].
    /// `None` without a store.
    pub fn unacked_window(&self) -> Option<(usize, usize)> {
        self.backing
            .as_ref()
            .map(|b| (b.unacked_window, b.unacked_window_bytes))
    }

    /// Where the store keeps `qm`, delivered from this queue and not yet acknowledged, so
    /// that its channel can drop the body: a persistent message of a durable queue is there
    /// already, another one is written as a transient page. `None` without a store or when
    /// the write fails (the channel keeps the message then). Settle it with
    /// [`Queue::settle_paged`].
    pub fn page_out(&self, qm: &QueuedMessage) -> Option<SpillEntry> {
        self.page(self.backing.as_ref()?, qm)
    }

    /// Settles deliveries their channel held paged out, as [`Queue::settle`] does: acked ones
    /// leave the store, rejected ones are read back to be dead-lettered, and requeued ones go
    /// back to their place without their body, which is read when they reach the head.
    pub fn settle_paged(self: &Arc<Self>, channel_key: u64, settlements: Vec<PagedSettlement>) {
        let Some(b) = &self.backing else {
            return;
        };
        let mut st = self.state.lock();
        if st.deleted {
            drop(st);
            for s in settlements {
                self.forget_entry(b, &s.entry);
            }
            return;
        }
        let max = st.priority;
        for s in settlements {
            st.unacked = st.unacked.saturating_sub(1);
            if let Some(tag) = &s.consumer_tag {
                if let Some(c) = st
                    .consumers
                    .iter_mut()
                    .find(|c| c.target.channel_key() == channel_key && &c.tag == tag)
                {
                    c.in_flight = c.in_flight.saturating_sub(1);
                }
            }
            let mut e = s.entry;
            if s.requeue {
                e.redelivered = true;
                st.paged.insert_sorted(e, |x| entry_key(x, max));
            } else if s.rejected && self.args().dead_letter_exchange.is_some() {
                match self.read_back(b, e) {
                    Ok(qm) => self.discard(&mut st, qm, DeathReason::Rejected),
                    // Rejected: it leaves the queue whether or not it can be dead-lettered.
                    Err(Some(e)) => self.forget_entry(b, &e),
                    Err(None) => {}
                }
            } else {
                if !s.rejected {
                    crate::registry::bump(&self.stats.ack);
                }
                self.forget_entry(b, &e);
            }
        }
        self.dispatch_from(&mut st, None);
        let dead = self.flush_dead(&mut st);
        drop(st);
        self.publish_dead(dead);
    }

    /// A stored message leaves this queue for good: record it in the store.
    fn forget(&self, seq: u64, stored: Option<Location>) {
        if let (Some(store), Some(loc)) = (self.store(), stored) {
            store.ack(&self.store_key, seq, loc);
        }
    }

    /// A message leaves this queue for good: record it in the store, and count this queue
    /// towards an early publisher confirm.
    fn settled(&self, qm: &QueuedMessage) {
        if let (Some(store), Some(loc)) = (self.store(), qm.stored) {
            store.ack(&self.store_key, qm.seq, loc);
            if let Some(t) = qm.message.confirm.get() {
                t.settle_one();
            }
        }
    }

    /// Drops every ready message, in memory, requeued paged out and spilled; returns how many.
    fn drop_ready(&self, st: &mut State) -> u32 {
        let mut n = 0u32;
        for qm in st.take_ready() {
            self.settled(&qm);
            n += 1;
        }
        let Some(b) = &self.backing else {
            return n;
        };
        let mut entries: Vec<SpillEntry> = st.paged.drain().collect();
        let mut held = Vec::new();
        for spilled in st.spills.iter_mut().flatten() {
            match spilled.file.clear() {
                Ok(e) => entries.extend(e),
                // What could not be read stays queued (and counted) rather than vanish.
                Err(e) => warn!(queue = %self.name, error = %e, "cannot read spill file"),
            }
            held.extend(spilled.held.drain(..));
        }
        for e in entries {
            n += 1;
            self.forget_entry(b, &e);
        }
        for qm in held {
            n += 1;
            self.settled(&qm);
        }
        n
    }

    /// Registers a consumer without delivering yet (so that basic.consume-ok can be sent first);
    /// call [`Queue::dispatch`] afterwards.
    ///
    /// Errors: 403 ACCESS_REFUSED when the queue has an exclusive consumer, or when `consumer` is
    /// exclusive and the queue already has consumers (RabbitMQ's "in exclusive use").
    pub fn add_consumer(&self, consumer: Consumer) -> Result<()> {
        let mut st = self.state.lock();
        if st.deleted {
            return Err(BrokerError::not_found(format!(
                "no {}",
                self.resource_name()
            )));
        }
        if st.consumers.iter().any(|c| c.exclusive)
            || (consumer.exclusive && !st.consumers.is_empty())
        {
            return Err(BrokerError::access_refused(format!(
                "{} in exclusive use",
                self.resource_name()
            )));
        }
        // Highest priority first; among equals, in registration order.
        let at = st
            .consumers
            .iter()
            .position(|c| c.priority < consumer.priority)
            .unwrap_or(st.consumers.len());
        st.consumers.insert(at, consumer);
        drop(st);
        self.touch();
        Ok(())
    }

    /// Removes consumer (channel, tag). Returns true when the queue is auto-delete and has just
    /// lost its last consumer: the caller then deletes it from its vhost.
    pub fn remove_consumer(&self, channel_key: u64, tag: &str) -> bool {
        let mut st = self.state.lock();
        let before = st.consumers.len();
        st.consumers
            .retain(|c| !(c.target.channel_key() == channel_key && &*c.tag == tag));
        let removed = st.consumers.len() != before;
        if st.round_robin >= st.consumers.len() {
            st.round_robin = 0;
        }
        if removed && st.consumers.is_empty() {
            self.touch();
        }
        removed && self.auto_delete && st.consumers.is_empty() && !st.deleted
    }

    /// Delivers ready messages to consumers with credit, round-robin.
    pub fn dispatch(self: &Arc<Self>) {
        let mut st = self.state.lock();
        self.dispatch_from(&mut st, None);
        let dead = self.flush_dead(&mut st);
        drop(st);
        self.publish_dead(dead);
    }

    /// Delivers what consumers can take; `spare` as in [`Queue::expire_head`]. With
    /// `x-single-active-consumer`, only the first registered consumer receives messages.
    fn dispatch_from(self: &Arc<Self>, st: &mut State, spare: Option<u64>) {
        while !st.consumers.is_empty() {
            self.refill(st);
            self.expire_head(st, spare);
            if st.ready.is_empty() {
                break;
            }
            let single = self.args().single_active_consumer;
            let n = if single { 1 } else { st.consumers.len() };
            let mut delivered = false;
            // Consumers are sorted by priority: try each priority group in turn, round-robin
            // within the group, and go to a lower group only when no consumer above has credit.
            let mut group = 0;
            while group < n && !delivered {
                let priority = st.consumers[group].priority;
                let end = (group..n)
                    .find(|&i| st.consumers[i].priority != priority)
                    .unwrap_or(n);
                let len = end - group;
                let start = st.round_robin % len;
                for i in 0..len {
                    let idx = group + (start + i) % len;
                    if !st.consumers[idx].has_credit() {
                        continue;
                    }
                    let Some(msg) = st.pop_front() else {
                        return;
                    };
                    let (seq, stored, first) = (msg.seq, msg.stored, !msg.redelivered);
                    let ticket = msg.message.confirm.get().cloned();
                    let c = &mut st.consumers[idx];
                    match c.target.deliver(self, &c.tag, c.no_ack, msg) {
                        Ok(()) => {
                            self.deliveries
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if !first {
                                crate::registry::bump(&self.stats.redeliver);
                            }
                            if c.no_ack {
                                self.forget(seq, stored);
                                if let (Some(t), true) = (ticket, stored.is_some()) {
                                    t.settle_one();
                                }
                            } else {
                                c.in_flight += 1;
                                st.unacked += 1;
                                if let (Some(store), true, true) =
                                    (self.store(), first, stored.is_some())
                                {
                                    store.delivered(&self.store_key, seq);
                                }
                            }
                            st.round_robin = (idx - group + 1) % len;
                            delivered = true;
                            break;
                        }
                        Err(msg) => st.push_front(msg),
                    }
                }
                group = end;
            }
            if !delivered {
                break;
            }
        }
    }

    /// basic.get: takes the next ready message. With `no_ack` false the message is counted as
    /// unacknowledged until settled. Returns the message and the number of messages still ready.
    pub fn get(&self, no_ack: bool) -> Option<(QueuedMessage, u32)> {
        self.touch();
        let mut st = self.state.lock();
        self.refill(&mut st);
        self.expire_head(&mut st, None);
        let dead = self.flush_dead(&mut st);
        let Some(msg) = st.pop_front() else {
            drop(st);
            self.publish_dead(dead);
            return None;
        };
        crate::registry::bump(&self.stats.get);
        if msg.redelivered {
            crate::registry::bump(&self.stats.redeliver);
        }
        if no_ack {
            self.settled(&msg);
        } else {
            st.unacked += 1;
            if let (Some(store), false, true) =
                (self.store(), msg.redelivered, msg.stored.is_some())
            {
                store.delivered(&self.store_key, msg.seq);
            }
        }
        let remaining = st.ready_count() as u32;
        drop(st);
        self.publish_dead(dead);
        Some((msg, remaining))
    }

    /// Settles delivered messages (ack, reject, requeue), then delivers what the freed credit
    /// allows. On a deleted queue, settling only releases the messages' storage.
    ///
    /// Requeued messages count against the queue's length limits like published ones: with
    /// overflow `drop-head`, a queue pushed over `x-max-length` / `x-max-length-bytes` by a
    /// requeue drops (or dead-letters, reason `maxlen`) from its head, which is where requeued
    /// messages return to; `reject-publish` queues keep them, over their limit, as RabbitMQ's
    /// `requeue_and_run` does (its `maybe_drop_head` only drops for `drop-head`).
    pub fn settle(self: &Arc<Self>, channel_key: u64, settlements: Vec<Settlement>) {
        let mut st = self.state.lock();
        if st.deleted {
            drop(st);
            for s in settlements {
                self.settled(&s.message);
            }
            return;
        }
        let mut requeued = false;
        for s in settlements {
            st.unacked = st.unacked.saturating_sub(1);
            if let Some(tag) = &s.consumer_tag {
                if let Some(c) = st
                    .consumers
                    .iter_mut()
                    .find(|c| c.target.channel_key() == channel_key && &c.tag == tag)
                {
                    c.in_flight = c.in_flight.saturating_sub(1);
                }
            }
            if s.requeue {
                let mut m = s.message;
                m.redelivered = true;
                st.insert_ordered(m);
                requeued = true;
            } else if s.rejected {
                self.discard(&mut st, s.message, DeathReason::Rejected);
            } else {
                crate::registry::bump(&self.stats.ack);
                self.settled(&s.message);
            }
        }
        if requeued {
            self.enforce_max_length(&mut st);
        }
        self.dispatch_from(&mut st, None);
        let dead = self.flush_dead(&mut st);
        drop(st);
        self.publish_dead(dead);
    }

    /// Applies the queue's length limits to what it holds now (after recovery, where messages
    /// that were unacknowledged come back as ready), as RabbitMQ does when a queue process
    /// starts: a `drop-head` queue over its limit drops or dead-letters from its head.
    pub fn enforce_limits(&self) {
        let mut st = self.state.lock();
        if st.deleted {
            return;
        }
        self.enforce_max_length(&mut st);
        let dead = self.flush_dead(&mut st);
        drop(st);
        self.publish_dead(dead);
    }

    /// queue.purge: drops every ready message (unacknowledged ones stay); returns how many.
    pub fn purge(&self) -> u32 {
        let mut st = self.state.lock();
        self.drop_ready(&mut st)
    }

    /// Marks the queue deleted and drops its messages. Returns the ready-message count it had
    /// and its consumers, whom the caller notifies (outside any lock).
    pub fn mark_deleted(&self) -> (u32, Vec<Consumer>) {
        let mut st = self.state.lock();
        st.deleted = true;
        let n = self.drop_ready(&mut st);
        st.spills.clear();
        if let Some(store) = self.store() {
            store.forget_queue(&self.store_key);
        }
        (n, std::mem::take(&mut st.consumers))
    }

    // ---- positions (the HTTP queue API's `Pos`) --------------------------------------

    /// The queue's put position and ready count, read together (see [`Positions`]).
    pub fn positions(&self) -> Positions {
        let st = self.state.lock();
        Positions {
            put: st.put_pos,
            ready: st.ready_count() as u64,
        }
    }

    /// Sets the put position (a checkpoint restored at start, or 0 by a reset) unless the
    /// queue is deleted.
    pub fn set_put_position(&self, put: u64) {
        let mut st = self.state.lock();
        if !st.deleted {
            st.put_pos = put;
        }
    }

    /// Drops every ready message and sets the put position back to 0, under one lock, so
    /// that no publish falls between the two (the HTTP queue API's `opt=reset`). Returns the
    /// number of messages dropped.
    pub fn reset_positions(&self) -> u32 {
        let mut st = self.state.lock();
        let n = self.drop_ready(&mut st);
        st.put_pos = 0;
        n
    }

    /// basic.get (not `no_ack`) that also gives the message's position: the head of the queue
    /// is at position `put - ready + 1` ([`Positions`]), read under the same lock that takes
    /// it. Settle the message with [`Queue::settle`].
    pub fn get_positioned(&self) -> Option<(QueuedMessage, u64)> {
        self.touch();
        let mut st = self.state.lock();
        self.refill(&mut st);
        self.expire_head(&mut st, None);
        let dead = self.flush_dead(&mut st);
        let pos = st.put_pos.saturating_sub(st.ready_count() as u64) + 1;
        let Some(msg) = st.pop_front() else {
            drop(st);
            self.publish_dead(dead);
            return None;
        };
        st.unacked += 1;
        if let (Some(store), false, true) = (self.store(), msg.redelivered, msg.stored.is_some()) {
            store.delivered(&self.store_key, msg.seq);
        }
        drop(st);
        self.publish_dead(dead);
        Some((msg, pos))
    }

    /// The body of the ready message at position `pos` without taking it, when it is among
    /// the ready messages held in memory (the first `storage.queue_window` of the queue);
    /// `None` for a position already consumed, not yet used, or paged out to disk.
    pub fn peek_position(&self, pos: u64) -> Option<bytes::Bytes> {
        let st = self.state.lock();
        let ready = st.ready_count() as u64;
        let first = st.put_pos.checked_sub(ready)? + 1;
        if pos < first || pos > st.put_pos || !st.paged.is_empty() {
            return None;
        }
        let index = usize::try_from(pos - first).ok()?;
        st.ready.get(index).map(|qm| qm.message.body.clone())
    }
}

/// A queue's positions, as the HTTP queue API (httpsqs's `Pos`, `putpos`, `getpos`) shows
/// them.
///
/// Every message enqueued on the queue, by any front end, takes the next position: `put` is
/// the number of messages enqueued since the queue was created (or its positions were reset),
/// counted under the queue's lock in [`Queue::publish`] — one addition on a lock the publish
/// holds anyway, so AMQP publishing pays nothing measurable — and handed to the publisher in
/// [`Message::position`]. Positions are not stored per message: the ready messages are the
/// positions `put - ready + 1 ..= put` in queue order (`getpos = put - ready`), which is exact
/// for a queue consumed from its head (HTTP gets, AMQP consumers acking in order). Requeued
/// messages and out-of-order acks make it an approximation: a requeued message returns to its
/// place in the queue and the positions of the queue's head shift back with it.
///
/// Durability: the store recovers the messages; the put position is checkpointed by the front
/// end that shows it (the HTTP queue API writes its state file at every reset and maxqueue
/// change, periodically, and at shutdown) and restored at start as
/// `max(put, getpos + ready)` of the checkpoint, which is exact unless both puts and gets
/// happened after the last checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Positions {
    /// Messages enqueued (the last position taken).
    pub put: u64,
    /// Messages ready in the queue.
    pub ready: u64,
}

impl Positions {
    /// Messages taken from the head so far: `put - ready` (0 if requeues made the queue
    /// longer than its put position).
    pub fn get(&self) -> u64 {
        self.put.saturating_sub(self.ready)
    }
}

/// Takes the [`Queue::enqueue_order`] locks of `queues` in address order (the same order for
/// every publisher, so that publishers routing to overlapping sets of queues cannot deadlock);
/// a queue listed twice is locked once.
pub fn lock_enqueue_order(queues: &[Arc<Queue>]) -> Vec<parking_lot::MutexGuard<'_, ()>> {
    let mut sorted: Vec<&Arc<Queue>> = queues.iter().collect();
    sorted.sort_by_key(|q| Arc::as_ptr(q) as usize);
    sorted.dedup_by_key(|q| Arc::as_ptr(q) as usize);
    sorted.into_iter().map(|q| q.enqueue_order()).collect()
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

/// [`order_key`] of a paged-out entry.
fn entry_key(e: &SpillEntry, max: Option<u8>) -> (u8, u64) {
    match max {
        Some(max) => (max - e.priority.min(max), e.seq),
        None => (0, e.seq),
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
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Sink {
        key: u64,
        got: Mutex<Vec<(String, u64, bool)>>,
        limit: usize,
        cancelled: Mutex<Vec<String>>,
    }

    impl DeliveryTarget for Sink {
        fn channel_key(&self) -> u64 {
            self.key
        }
        fn deliver(
            &self,
            _q: &Arc<Queue>,
            tag: &Arc<str>,
            _no_ack: bool,
            msg: QueuedMessage,
        ) -> std::result::Result<(), QueuedMessage> {
            let mut got = self.got.lock();
            if got.len() >= self.limit {
                return Err(msg);
            }
            got.push((tag.to_string(), msg.seq, msg.redelivered));
            Ok(())
        }
        fn cancelled_by_broker(&self, tag: &Arc<str>) {
            self.cancelled.lock().push(tag.to_string());
        }
    }

    static KEYS: AtomicU64 = AtomicU64::new(1);

    fn sink(limit: usize) -> Arc<Sink> {
        Arc::new(Sink {
            key: KEYS.fetch_add(1, Ordering::Relaxed),
            got: Mutex::new(Vec::new()),
            limit,
            cancelled: Mutex::new(Vec::new()),
        })
    }

    fn msg(body: &str) -> Arc<Message> {
        Arc::new(Message::new(
            String::new(),
            "q".into(),
            Default::default(),
            Bytes::copy_from_slice(body.as_bytes()),
        ))
    }

    fn queue() -> Arc<Queue> {
        Arc::new(Queue::new("q", "/", false, None, false, FieldTable::new()))
    }

    #[test]
    fn round_robin_and_prefetch() {
        let q = queue();
        let a = sink(usize::MAX);
        let b = sink(usize::MAX);
        q.add_consumer(Consumer::new(
            "a".into(),
            a.clone(),
            false,
            false,
            2,
            FieldTable::new(),
        ))
        .unwrap();
        q.add_consumer(Consumer::new(
            "b".into(),
            b.clone(),
            false,
            false,
            1,
            FieldTable::new(),
        ))
        .unwrap();
        for i in 0..5 {
            q.publish(msg(&i.to_string()), i, None);
        }
        // a gets 0 and 2 (prefetch 2), b gets 1 (prefetch 1); 3 and 4 wait.
        let seqs = |s: &Sink| s.got.lock().iter().map(|g| g.1).collect::<Vec<_>>();
        assert_eq!(seqs(&a), vec![0, 2]);
        assert_eq!(seqs(&b), vec![1]);
        assert_eq!(
            q.counts(),
            QueueCounts {
                ready: 2,
                unacked: 3,
                consumers: 2
            }
        );
        q.settle(
            b.key,
            vec![Settlement {
                consumer_tag: Some("b".into()),
                message: QueuedMessage {
                    seq: 1,
                    message: msg("1"),
                    redelivered: false,
                    stored: None,
                    expires_at: None,
                },
                requeue: false,
                rejected: false,
            }],
        );
        assert_eq!(seqs(&b), vec![1, 3]);
    }

    #[test]
    fn higher_priority_consumers_first_while_they_have_credit() {
        let q = queue();
        let lo = sink(usize::MAX);
        let hi = sink(usize::MAX);
        let prio = |p: i32| {
            let mut t = FieldTable::new();
            t.insert("x-priority", warren_amqp::table::FieldValue::I32(p));
            t
        };
        q.add_consumer(Consumer::new(
            "lo".into(),
            lo.clone(),
            false,
            false,
            0,
            prio(1),
        ))
        .unwrap();
        q.add_consumer(Consumer::new(
            "hi".into(),
            hi.clone(),
            false,
            false,
            2,
            prio(10),
        ))
        .unwrap();
        for i in 0..5 {
            q.publish(msg(&i.to_string()), i, None);
        }
        let seqs = |s: &Sink| s.got.lock().iter().map(|g| g.1).collect::<Vec<_>>();
        // hi takes what its prefetch of 2 allows, lo gets the rest.
        assert_eq!(seqs(&hi), vec![0, 1]);
        assert_eq!(seqs(&lo), vec![2, 3, 4]);
        q.settle(
            hi.key,
            vec![Settlement {
                consumer_tag: Some("hi".into()),
                message: QueuedMessage {
                    seq: 0,
                    message: msg("0"),
                    redelivered: false,
                    stored: None,
                    expires_at: None,
                },
                requeue: false,
                rejected: false,
            }],
        );
        q.publish(msg("5"), 5, None);
        assert_eq!(seqs(&hi), vec![0, 1, 5]);
    }

    #[test]
    fn requeue_returns_to_original_position() {
        let q = queue();
        for i in 0..3 {
            q.publish(msg(&i.to_string()), i, None);
        }
        let (m0, left) = q.get(false).unwrap();
        assert_eq!(left, 2);
        let (m1, _) = q.get(false).unwrap();
        q.settle(
            0,
            vec![Settlement {
                consumer_tag: None,
                message: m1,
                requeue: true,
                rejected: false,
            }],
        );
        q.settle(
            0,
            vec![Settlement {
                consumer_tag: None,
                message: m0,
                requeue: true,
                rejected: false,
            }],
        );
        let order: Vec<(u64, bool)> = std::iter::from_fn(|| q.get(true))
            .map(|(m, _)| (m.seq, m.redelivered))
            .collect();
        assert_eq!(order, vec![(0, true), (1, true), (2, false)]);
    }

    #[test]
    fn channel_refusal_keeps_message() {
        let q = queue();
        let a = sink(1);
        q.add_consumer(Consumer::new(
            "a".into(),
            a.clone(),
            false,
            false,
            0,
            FieldTable::new(),
        ))
        .unwrap();
        q.publish(msg("x"), 0, None);
        q.publish(msg("y"), 1, None);
        assert_eq!(q.counts().ready, 1);
        assert_eq!(a.got.lock().len(), 1);
    }

    #[test]
    fn exclusive_consumers() {
        let q = queue();
        let a = sink(9);
        q.add_consumer(Consumer::new(
            "a".into(),
            a.clone(),
            false,
            false,
            0,
            FieldTable::new(),
        ))
        .unwrap();
        let err = q
            .add_consumer(Consumer::new(
                "b".into(),
                a.clone(),
                false,
                true,
                0,
                FieldTable::new(),
            ))
            .unwrap_err();
        assert_eq!(err.code, 403);
        assert_eq!(err.text, "queue 'q' in vhost '/' in exclusive use");
    }

    #[test]
    fn auto_delete_on_last_consumer() {
        let q = Arc::new(Queue::new("q", "/", false, None, true, FieldTable::new()));
        let a = sink(9);
        q.add_consumer(Consumer::new(
            "a".into(),
            a.clone(),
            false,
            false,
            0,
            FieldTable::new(),
        ))
        .unwrap();
        q.add_consumer(Consumer::new(
            "b".into(),
            a.clone(),
            false,
            false,
            0,
            FieldTable::new(),
        ))
        .unwrap();
        assert!(!q.remove_consumer(a.key, "a"));
        assert!(!q.remove_consumer(a.key, "zzz"));
        assert!(q.remove_consumer(a.key, "b"));
    }
}
