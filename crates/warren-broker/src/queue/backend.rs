//! The queue backend trait: what routing, the operations layer and the front ends need from
//! a queue, whatever kind of queue it is.
//!
//! Warren's vhosts route messages to queues, the AMQP channel delivers from them and settles
//! with them, the management API reads their counts and the httpmq API their positions. None
//! of them should care how a queue keeps its messages: the classic queue
//! ([`super::ClassicQueue`]) keeps them in memory with a spill file and the message store
//! behind; a replicated queue (RabbitMQ's quorum queues) keeps them in a Raft log. So every
//! user holds a queue as [`Queue`], the trait object `dyn QueueBackend`, and a second kind of
//! queue only needs an implementation of this trait and a line in the function that builds
//! queues by `x-queue-type` (`VHost::new_queue`, see [`QueueKind`]).
//!
//! The trait is object-safe. A queue hands itself to the channels it delivers to
//! ([`super::DeliveryTarget::deliver`] takes the `Arc<Queue>` a channel later settles with),
//! so the operations that may deliver take that handle as `this` (it must be the `Arc` the
//! method is called through); callers use the wrappers of `impl dyn QueueBackend`
//! ([`Queue::publish`], [`Queue::dispatch`], [`Queue::settle`], ...), which pass it. That costs
//! one virtual call per operation and nothing per message: no allocation, no reference count.
//!
//! Locks: an implementation follows the crate's lock order (see the crate docs): it may be
//! called under a vhost's topology lock, it may call into a [`super::DeliveryTarget`] under its
//! own lock, and it never calls back into routing (dead letters included) while holding it.

use super::{Consumer, PagedSettlement, Positions, QueueCounts, Settlement};
use crate::args::QueueArgs;
use crate::dead_letter::{DeadLetter, DeadLetterSink, DeadLetterSource};
use crate::error::{resource, BrokerError, Result};
use crate::message::{Message, QueuedMessage};
use crate::policy::Applied;
use crate::registry::QueueStats;
use bytes::Bytes;
use smallvec::SmallVec;
use std::sync::{Arc, Weak};
use warren_amqp::table::FieldTable;
use warren_store::spill::SpillEntry;
use warren_store::{Completion, Location, Store};

/// A queue as routing, the operations layer and the front ends see it: `dyn QueueBackend`,
/// held as `Arc<Queue>`.
pub type Queue = dyn QueueBackend;

/// One kind of queue (classic, or later quorum): the operations every user of a queue needs.
///
/// Errors are [`BrokerError`]s carrying RabbitMQ's AMQP reply codes and texts. Methods that
/// take `this` may deliver to consumers: `this` is the `Arc` the method is called through
/// (use the wrappers on [`Queue`]).
pub trait QueueBackend: Send + Sync + std::fmt::Debug {
    // ---- identity and flags ------------------------------------------------------------

    /// The queue's name (queue.declare's `queue`).
    fn name(&self) -> &str;

    /// The queue's name as one shared allocation: the vhost keys the queue by it and its
    /// bindings name the queue with it, so that 100,000 queues keep their names once. The
    /// default makes a copy; a queue that keeps its name in an `Arc<str>` returns that.
    fn shared_name(&self) -> Arc<str> {
        Arc::from(self.name())
    }

    /// Name of the vhost the queue lives in.
    fn vhost(&self) -> &str;

    /// The queue type, as `x-queue-type` and the management API's `type` name it:
    /// `"classic"` for [`super::ClassicQueue`].
    fn kind(&self) -> &'static str;

    /// True when the queue survives a broker restart (queue.declare's `durable`).
    fn durable(&self) -> bool;

    /// The connection id that owns an exclusive queue (queue.declare's `exclusive`); `None`
    /// for a shared queue.
    fn exclusive_owner(&self) -> Option<u64>;

    /// True when the queue is deleted once its last consumer is cancelled (queue.declare's
    /// `auto_delete`).
    fn auto_delete(&self) -> bool;

    /// The declared arguments (`x-…`), as queue.declare gave them (the equivalence check of
    /// a redeclare compares them).
    fn arguments(&self) -> &FieldTable;

    /// The queue's name in message store records (`vhost` U+001F `name`, see
    /// [`super::store_key`]).
    fn store_key(&self) -> &str;

    /// The store this queue records persistent messages in; `None` for a queue that keeps
    /// nothing on disk (in-memory broker, transient queue). Routing writes a persistent
    /// message to it once for every queue that has one, before [`QueueBackend::enqueue`].
    fn store(&self) -> Option<&Store>;

    /// `queue 'name' in vhost 'v'`, as RabbitMQ names a queue in reply texts.
    fn resource_name(&self) -> String {
        resource("queue", self.name(), self.vhost())
    }

    /// Fails with 405 RESOURCE_LOCKED (RabbitMQ's text) when the queue is exclusive to a
    /// connection other than `connection_id`.
    fn check_exclusive(&self, connection_id: u64) -> Result<()> {
        match self.exclusive_owner() {
            Some(owner) if owner != connection_id => Err(BrokerError::resource_locked(format!(
                "cannot obtain exclusive access to locked {}. It could be originally declared on \
                 another connection or the exclusive property value does not match that of the \
                 original declaration.",
                self.resource_name()
            ))),
            _ => Ok(()),
        }
    }

    // ---- policies and limits -----------------------------------------------------------

    /// The settings the queue acts on now: its arguments merged with the policies that apply
    /// (see [`crate::policy::effective_queue_args`]).
    fn args(&self) -> Arc<QueueArgs>;

    /// The policy and operator policy applied to the queue, and their merged definition.
    fn applied_policy(&self) -> Arc<Applied>;

    /// Applies `applied` (the policies matching the queue now). Returns true when the
    /// queue's settings changed; the caller then calls [`QueueBackend::enforce_limits`]
    /// outside the topology lock.
    fn apply_policy(&self, applied: Applied) -> bool;

    /// Applies the length limits (`x-max-length`, `x-max-length-bytes` with `drop-head`) to
    /// what the queue holds now: after recovery or a policy change.
    fn enforce_limits(&self);

    // ---- publishing (basic.publish, after routing) -------------------------------------

    /// The lock a publisher holds from taking a message id until this queue has enqueued the
    /// message, so that each queue enqueues in id order (see [`lock_enqueue_order`]).
    fn enqueue_order(&self) -> parking_lot::MutexGuard<'_, ()>;

    /// True when the queue refuses `msg` because it is full and its overflow is
    /// `reject-publish` or `reject-publish-dlx` (the publisher gets basic.nack).
    fn rejects_publish(&self, msg: &Message) -> bool;

    /// Enqueues message `seq` (ids increase across the broker; the caller holds
    /// [`QueueBackend::enqueue_order`]) and delivers what consumers can take. `stored` is
    /// where [`QueueBackend::store`] holds the message when it is persistent. A deleted queue
    /// drops it. Returns (publishers should pause, see [`QueueBackend::is_pressured`]; the dead
    /// letters it produced, for [`QueueBackend::dead_letter`] once the order locks are
    /// released).
    fn enqueue(
        &self,
        this: &Arc<Queue>,
        message: Arc<Message>,
        seq: u64,
        stored: Option<Location>,
    ) -> (bool, Vec<DeadLetter>);

    /// True for a queue that confirms publishes itself (a replicated queue confirms once a
    /// majority of its members has the message on disk): routing gives it the publisher's
    /// waiter through [`QueueBackend::enqueue_confirmed`] and does not write the message to
    /// the message store for it.
    fn confirms_publishes(&self) -> bool {
        false
    }

    /// [`QueueBackend::enqueue`] for a queue that [`confirms_publishes`]: `waiter` is
    /// completed once the queue has taken responsibility for the message (or with `false`
    /// when it cannot).
    ///
    /// [`confirms_publishes`]: QueueBackend::confirms_publishes
    fn enqueue_confirmed(
        &self,
        this: &Arc<Queue>,
        message: Arc<Message>,
        seq: u64,
        waiter: Option<(Arc<dyn Completion>, u64)>,
    ) -> (bool, Vec<DeadLetter>) {
        let r = self.enqueue(this, message, seq, None);
        if let Some((sink, token)) = waiter {
            sink.complete(&[token], true);
        }
        r
    }

    /// Re-publishes dead letters to the queue's dead-letter exchange (never with the queue's
    /// or an enqueue-order lock held: the exchange may route back to this queue).
    fn dead_letter(&self, dead: Vec<DeadLetter>);

    /// Where this queue's dead letters go under `args` (its [`QueueBackend::args`]): `None`
    /// without a dead-letter exchange.
    fn dead_letter_source<'a>(&'a self, args: &'a QueueArgs) -> Option<DeadLetterSource<'a>> {
        Some(DeadLetterSource {
            queue: self.name(),
            exchange: args.dead_letter_exchange.as_deref()?,
            routing_key: args.dead_letter_routing_key.as_deref(),
        })
    }

    /// Publisher flow control: true while the queue's consumers fall behind its publishers.
    fn is_pressured(&self) -> bool;

    /// A paused publisher's wait: registers `waker` to be woken once the queue is no longer
    /// pressured, and returns true; returns false, registering nothing, when it is not
    /// pressured now. The waiter removes the waker with
    /// [`QueueBackend::forget_drain_waker`] when it stops waiting. This default registers
    /// nothing and answers [`QueueBackend::is_pressured`]: its waiters poll.
    fn wake_when_drained(&self, waker: &std::task::Waker) -> bool {
        let _ = waker;
        self.is_pressured()
    }

    /// Removes a waker registered by [`QueueBackend::wake_when_drained`], if it still is.
    fn forget_drain_waker(&self, waker: &std::task::Waker) {
        let _ = waker;
    }

    /// The delivery count at which publishers found the consumers stalled, if nothing was
    /// delivered since.
    fn stalled_at(&self) -> Option<u64>;

    /// Records that consumers made no progress since delivery count `at`.
    fn mark_stalled(&self, at: u64);

    // ---- consumers (basic.consume, basic.cancel) ---------------------------------------

    /// Registers a consumer without delivering yet (basic.consume-ok goes first); call
    /// [`Queue::dispatch`] afterwards. Errors: 404 NOT_FOUND for a deleted queue, 403
    /// ACCESS_REFUSED "in exclusive use" when an exclusive consumer is involved.
    fn add_consumer(&self, consumer: Consumer) -> Result<()>;

    /// Removes consumer (`channel_key`, `tag`) (basic.cancel, channel close). Returns true
    /// when the queue is auto-delete and just lost its last consumer: the caller deletes it.
    fn remove_consumer(&self, channel_key: u64, tag: &str) -> bool;

    /// Delivers ready messages to consumers with credit.
    fn dispatch_with(&self, this: &Arc<Queue>);

    /// Records a use (basic.get, declare, consumers), which restarts the `x-expires` timer.
    fn touch(&self);

    // ---- basic.get and settlement -------------------------------------------------------

    /// basic.get: takes the next ready message; with `no_ack` false it counts as unacked
    /// until settled. Returns the message and how many messages are still ready.
    fn get(&self, no_ack: bool) -> Option<(QueuedMessage, u32)>;

    /// Settles delivered messages (basic.ack, basic.nack, basic.reject, basic.recover, channel
    /// close: requeue, drop or dead-letter with reason `rejected`) of channel `channel_key`,
    /// then delivers what the freed credit allows.
    fn settle_with(&self, this: &Arc<Queue>, channel_key: u64, settlements: Vec<Settlement>);

    /// The bound (messages, body bytes) on unacknowledged deliveries a channel keeps in
    /// memory from this queue; beyond it the channel holds them by
    /// [`QueueBackend::page_out`]. `None` when the queue cannot page.
    fn unacked_window(&self) -> Option<(usize, usize)>;

    /// Where the store keeps `qm` (delivered, unacked) so that its channel can drop the
    /// body; `None` when that is not possible (the channel keeps the message).
    fn page_out(&self, qm: &QueuedMessage) -> Option<SpillEntry>;

    /// [`QueueBackend::settle_with`] for deliveries their channel held paged out.
    fn settle_paged_with(
        &self,
        this: &Arc<Queue>,
        channel_key: u64,
        settlements: Vec<PagedSettlement>,
    );

    // ---- purge, delete, housekeeping ---------------------------------------------------

    /// queue.purge: drops every ready message (unacked ones stay); returns how many.
    fn purge(&self) -> u32;

    /// queue.delete: marks the queue deleted and drops its messages. Returns the ready count
    /// it had and its consumers, whom the caller notifies (basic.cancel) outside any lock.
    fn mark_deleted(&self) -> (u32, Vec<Consumer>);

    /// True once the queue has been deleted.
    fn is_deleted(&self) -> bool;

    /// Periodic housekeeping (message TTL at the head, retried paging). Returns true when the
    /// queue has been unused for its `x-expires` and should be deleted.
    fn sweep(&self) -> bool;

    /// Whether [`QueueBackend::sweep`] still has something to do: a TTL or `x-expires`
    /// applies, messages with a deadline wait, or paging waits for the disk. The vhost's
    /// sweep stops visiting a queue that answers false until it is added again (see
    /// [`super::SweepSet`]).
    fn needs_sweep(&self) -> bool;

    /// The queue's mark in its vhost's [`super::SweepSet`]: set while the sweep visits it.
    fn sweep_mark(&self) -> &std::sync::atomic::AtomicBool;

    /// Adds messages recovered from the store at start, in id order, as ready.
    fn recover(&self, entries: &mut dyn Iterator<Item = SpillEntry>);

    // ---- counts and the read model -----------------------------------------------------

    /// Ready, unacked and consumer counts (queue.declare-ok, the management API).
    fn counts(&self) -> QueueCounts;

    /// [`QueueBackend::counts`] as of now: a queue held by another node asks it (and waits
    /// for the answer) rather than reporting what it last learnt. For queue.declare-ok, whose
    /// counts RabbitMQ reports exactly.
    fn fresh_counts(&self) -> QueueCounts {
        self.counts()
    }

    /// Body bytes of the ready messages: RabbitMQ's `message_bytes_ready`.
    fn ready_bytes(&self) -> u64;

    /// Ready messages as (in memory, paged out): RabbitMQ's `messages_ram` and
    /// `messages_paged_out`.
    fn ready_in_memory_and_paged_out(&self) -> (u32, u32);

    /// An estimate of the bytes the queue holds in memory: RabbitMQ's queue `memory`
    /// (see [`ClassicQueue::memory`](crate::queue::ClassicQueue::memory) for what it counts).
    fn memory(&self) -> u64;

    /// Messages delivered to consumers so far.
    fn deliveries(&self) -> u64;

    /// Message counters for operators (see [`crate::registry`]).
    fn stats(&self) -> &QueueStats;

    // ---- positions and views (the httpmq API) ------------------------------------------

    /// The put position and ready count, read together (see [`Positions`]).
    fn positions(&self) -> Positions;

    /// Sets the put position (a checkpoint restored at start) unless the queue is deleted.
    fn set_put_position(&self, put: u64);

    /// Drops every ready message and sets the put position to 0 under one lock (httpmq's
    /// `opt=reset`); returns how many messages were dropped.
    fn reset_positions(&self) -> u32;

    /// basic.get (not `no_ack`) with the message's position (httpmq's `opt=get`).
    fn get_positioned(&self) -> Option<(QueuedMessage, u64)>;

    /// The body of the ready message at position `pos`, without taking it (httpmq's
    /// `opt=view`); `None` outside the ready positions or when it cannot be read.
    fn peek_position(&self, pos: u64) -> Option<Bytes>;

    /// Where the queue's replicas are; `None` for a queue that is not replicated (classic).
    /// The cluster node that holds this queue, for a queue that lives on another node and is
    /// reached from here (a classic queue declared elsewhere); `None` for a queue held here.
    fn owner_node(&self) -> Option<u64> {
        None
    }

    /// Why the queue cannot be used now (the node that holds it is down or unreachable, as
    /// RabbitMQ's "home node ... is down or inaccessible"); `None` when it can.
    fn unavailable(&self) -> Option<String> {
        None
    }

    /// queue.delete of a queue held by another node, done by that node (with its
    /// `if_unused` / `if_empty` checks): the ready messages deleted, or its refusal. `None`
    /// for a queue held here.
    fn delete_at_owner(&self, if_unused: bool, if_empty: bool) -> Option<Result<u32>> {
        let _ = (if_unused, if_empty);
        None
    }

    /// True while a consumer that asked for exclusive use is registered.
    fn has_exclusive_consumer(&self) -> bool {
        false
    }

    fn replicas(&self) -> Option<super::Replicas> {
        None
    }
}

impl dyn QueueBackend {
    /// Enqueues message `seq` and publishes its dead letters (see [`QueueBackend::enqueue`]);
    /// for a caller that holds no enqueue-order lock. Returns true when publishers should
    /// pause.
    pub fn publish(
        self: &Arc<Self>,
        message: Arc<Message>,
        seq: u64,
        stored: Option<Location>,
    ) -> bool {
        let (pressured, dead) = self.enqueue(self, message, seq, stored);
        self.dead_letter(dead);
        pressured
    }

    /// [`QueueBackend::enqueue`] through this handle: returns the dead letters instead of
    /// publishing them.
    pub fn publish_held(
        self: &Arc<Self>,
        message: Arc<Message>,
        seq: u64,
        stored: Option<Location>,
    ) -> (bool, Vec<DeadLetter>) {
        self.enqueue(self, message, seq, stored)
    }

    /// Delivers ready messages to consumers with credit ([`QueueBackend::dispatch_with`]).
    pub fn dispatch(self: &Arc<Self>) {
        self.dispatch_with(self)
    }

    /// Settles delivered messages ([`QueueBackend::settle_with`]).
    pub fn settle(self: &Arc<Self>, channel_key: u64, settlements: Vec<Settlement>) {
        self.settle_with(self, channel_key, settlements)
    }

    /// Settles paged-out deliveries ([`QueueBackend::settle_paged_with`]).
    pub fn settle_paged(self: &Arc<Self>, channel_key: u64, settlements: Vec<PagedSettlement>) {
        self.settle_paged_with(self, channel_key, settlements)
    }
}

/// What a vhost gives a queue it creates: its clock, its dead-letter sink and (with a data
/// directory) the store to page to.
pub struct QueueSpec {
    /// Queue name: the queue keeps this allocation (see [`QueueBackend::shared_name`]).
    pub name: Arc<str>,
    /// The vhost's name, shared by its queues.
    pub vhost: Arc<str>,
    /// queue.declare's `durable` (already false for an exclusive queue).
    pub durable: bool,
    /// The owning connection of an exclusive queue.
    pub exclusive_owner: Option<u64>,
    /// queue.declare's `auto_delete`.
    pub auto_delete: bool,
    /// queue.declare's arguments.
    pub arguments: FieldTable,
    /// The vhost's clock.
    pub clock: Arc<dyn crate::clock::Clock>,
    /// Where the queue hands its dead letters (the vhost).
    pub dead_letters: Weak<dyn DeadLetterSink>,
    /// The message store and paging bounds, when the broker has a data directory.
    pub backing: Option<super::Backing>,
    /// The vhost's sweep set, which the queue joins when it gets something to sweep.
    pub sweeps: Weak<super::SweepSet>,
    /// The vhost's set of queues that may hold messages (see `VHost::used_queues`), which a
    /// classic queue joins at its first enqueue.
    pub used: Weak<super::UsedSet>,
}

/// A kind of queue other than classic, chosen by `x-queue-type` (see
/// `VHost::set_queue_kind`): it validates declared arguments and builds its queues.
pub trait QueueKind: Send + Sync {
    /// Validates the arguments of a queue.declare that creates a queue of this kind. Errors:
    /// 406 PRECONDITION_FAILED with RabbitMQ's `invalid arg` texts.
    fn validate(&self, resource: &str, arguments: &FieldTable) -> Result<()>;

    /// Builds a new, empty queue (declare) or an empty one to recover into (restart).
    fn build(&self, spec: QueueSpec) -> Arc<Queue>;

    /// Fails when the kind cannot have a server-named queue (queue.declare with an empty
    /// name): 406 PRECONDITION_FAILED with RabbitMQ's text. Checked before the name is
    /// generated and before permissions, as RabbitMQ's channel does.
    fn check_server_named(&self) -> Result<()> {
        Ok(())
    }

    /// Checks the flags of a queue.declare that creates a queue of this kind, after
    /// [`QueueKind::validate`] (`durable` is false for an exclusive queue). Errors: 406
    /// PRECONDITION_FAILED with RabbitMQ's `invalid property` texts.
    fn check_flags(
        &self,
        _resource: &str,
        _durable: bool,
        _exclusive: bool,
        _auto_delete: bool,
    ) -> Result<()> {
        Ok(())
    }
}

/// The `x-queue-type` of declared arguments: `None` when absent or not a string (the
/// classic queue then applies its own validation).
pub fn queue_type(arguments: &FieldTable) -> Option<&str> {
    arguments.get("x-queue-type").and_then(|v| v.as_str())
}

/// Takes the [`QueueBackend::enqueue_order`] locks of `queues` in address order (the same
/// order for every publisher, so that publishers routing to overlapping sets of queues cannot
/// deadlock); a queue listed twice is locked once. Up to [`ENQUEUE_ORDER_INLINE`] queues
/// (every publish but wide fanouts) it allocates nothing.
pub fn lock_enqueue_order(queues: &[Arc<Queue>]) -> EnqueueOrder<'_> {
    // Most publishes route to one queue: nothing to sort.
    if let [q] = queues {
        let mut one = EnqueueOrder::new();
        one.push(q.enqueue_order());
        return one;
    }
    let addr = |q: &&Arc<Queue>| Arc::as_ptr(q) as *const () as usize;
    let mut sorted: SmallVec<[&Arc<Queue>; ENQUEUE_ORDER_INLINE]> = queues.iter().collect();
    if sorted.len() > 1 {
        sorted.sort_unstable_by_key(addr);
        sorted.dedup_by_key(|q| addr(q));
    }
    sorted.into_iter().map(|q| q.enqueue_order()).collect()
}

/// How many queues' enqueue-order locks [`lock_enqueue_order`] holds without allocating.
pub const ENQUEUE_ORDER_INLINE: usize = 8;

/// The enqueue-order locks a publisher holds (see [`lock_enqueue_order`]); released on drop.
pub type EnqueueOrder<'a> = SmallVec<[parking_lot::MutexGuard<'a, ()>; ENQUEUE_ORDER_INLINE]>;
