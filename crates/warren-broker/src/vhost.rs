//! Virtual hosts: the exchanges, queues and bindings of one namespace, and the [`Broker`] that
//! holds every vhost and the access-control database.
//!
//! All topology changes (declare, delete, bind) take the vhost's write lock; routing a publish
//! takes the read lock only, so publishers on different connections route in parallel.

use crate::args::QueueArgs;
use crate::clock::{Clock, SystemClock};
use crate::dead_letter::{
    dead_lettered, DeadLetter, DeadLetterSink, DeadLetterSource, DeathReason,
};
use crate::delayed::{self, Body, Held};
use crate::error::{resource, BrokerError, Result};
mod delaying;
mod durable;
pub mod log;
mod policies;
mod routing;

use crate::equivalence::{arg_type_and_value, check_args, check_field, EQUIVALENT_QUEUE_ARGS};
use crate::exchange::{Binding, Destination, Exchange, ExchangeKind};
use crate::limits::{self, Limits};
use crate::log_limit::LogLimit;
use crate::message::{ConfirmTicket, Message, QueuedMessage};
use crate::names;
use crate::persist::{get_bool, get_str, get_table, s, Persistence, StorageOptions};
use crate::queue::{Backing, Consumer, DeliveryTarget, Queue, QueueCounts};
use crate::sender_selected::{self, SenderKeys};
use log::TopologyCommand;
use parking_lot::RwLock;
use routing::Routed;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use warren_amqp::table::{FieldTable, FieldValue};
use warren_store::spill::SpillEntry;
use warren_store::{Completion, RecoveryReport, Store};

/// The broker: vhosts and the access-control database.
pub struct Broker {
    vhosts: RwLock<HashMap<String, Arc<VHost>>>,
    access: parking_lot::RwLock<crate::access::AccessControl>,
    /// Bumped each time the access-control database may have changed (see
    /// [`Broker::access_generation`]).
    access_generation: AtomicU64,
    persist: Option<Arc<Persistence>>,
    ids: Arc<AtomicU64>,
    clock: Arc<dyn Clock>,
    limits: Arc<RwLock<Limits>>,
    registry: Arc<crate::registry::Registry>,
    /// The access-control database was loaded from the data directory (changed at run time
    /// before), not built from scratch.
    access_restored: bool,
}

impl Default for Broker {
    fn default() -> Self {
        Self::new()
    }
}

/// Why a durable broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The data directory cannot be used (not a directory, locked by another broker, a
    /// format this build does not know).
    #[error(transparent)]
    DataDir(#[from] crate::data_dir::DataDirError),
    /// The message store failed to open or recover.
    #[error("message store {}: {source}", dir.display())]
    Store {
        /// The store's directory.
        dir: std::path::PathBuf,
        /// The cause.
        source: warren_store::StoreError,
    },
    /// A definitions file cannot be read.
    #[error(transparent)]
    Definitions(#[from] crate::persist::DefinitionsError),
}

impl Broker {
    /// An in-memory broker with the default vhost `/` and RabbitMQ's first-boot access
    /// control (user `guest` with full permissions on `/`, see
    /// [`AccessControl::with_default_guest`](crate::access::AccessControl::with_default_guest)):
    /// nothing survives a restart and queues are bounded by memory only.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An in-memory broker whose TTLs and expiries are measured with `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let b = Broker {
            vhosts: RwLock::new(HashMap::new()),
            access: parking_lot::RwLock::new(crate::access::AccessControl::with_default_guest()),
            access_generation: AtomicU64::new(0),
            persist: None,
            ids: Arc::new(AtomicU64::new(1)),
            clock,
            limits: Arc::default(),
            registry: crate::registry::Registry::new(),
            access_restored: false,
        };
        b.add_vhost("/");
        b
    }

    /// A durable broker on `options.data_dir`: locks the directory for as long as the broker
    /// lives (until [`Broker::close`]), checks its format version, recovers durable
    /// definitions and the messages of durable queues, and pages every queue beyond its
    /// in-memory window to disk.
    ///
    /// Errors: [`OpenError`]: the directory is unusable or in use by another broker, the
    /// store cannot be opened, or a definitions file cannot be read.
    pub fn open(
        options: StorageOptions,
    ) -> std::result::Result<(Broker, RecoveryReport), OpenError> {
        let dir = crate::data_dir::DataDir::open(&options.data_dir)?;
        let (store, recovered) =
            Store::open(options.store_config()).map_err(|source| OpenError::Store {
                dir: options.data_dir.join("messages"),
                source,
            })?;
        let _ = std::fs::remove_dir_all(options.data_dir.join("spill"));
        let persist = Arc::new(Persistence::new(store.clone(), options, dir));
        let definitions = match persist.load_definitions() {
            Ok(d) => d,
            Err(e) => {
                store.close();
                return Err(e.into());
            }
        };
        // Users, vhosts and permissions changed at run time before (see ops::admin).
        let stored_access = match persist.load_access() {
            Ok(None) => None,
            Ok(Some(text)) => match crate::ops::admin::parse_stored_access(&text) {
                Ok(a) => Some(a),
                Err(reason) => {
                    store.close();
                    return Err(crate::persist::DefinitionsError {
                        path: options_dir(&persist).join("access.json"),
                        reason,
                    }
                    .into());
                }
            },
            Err(e) => {
                store.close();
                return Err(e.into());
            }
        };
        let access_restored = stored_access.is_some();
        let b = Broker {
            vhosts: RwLock::new(HashMap::new()),
            access: parking_lot::RwLock::new(
                stored_access.unwrap_or_else(crate::access::AccessControl::with_default_guest),
            ),
            access_generation: AtomicU64::new(0),
            persist: Some(persist.clone()),
            ids: Arc::new(AtomicU64::new(0)),
            clock: Arc::new(SystemClock),
            limits: Arc::default(),
            registry: crate::registry::Registry::new(),
            access_restored,
        };
        for (defs, size) in definitions {
            let vh = b.add_vhost(get_str(&defs, "name"));
            vh.load_definitions(&defs);
            let generation = defs.get("log_generation").and_then(|v| v.as_i64());
            vh.set_log_start(generation.unwrap_or(0).max(0) as u64, size);
        }
        // The changes since each snapshot, from its generation on; older logs were compacted
        // into it (a crash came between the snapshot's rename and their removal).
        for (vhost, generation, path) in persist.log_files() {
            let vh = b.add_vhost(&vhost);
            if generation < vh.log_generation() {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let records = match crate::vhost::log::read_log(&path) {
                Ok(r) => r,
                Err(reason) => {
                    store.close();
                    return Err(crate::persist::DefinitionsError { path, reason }.into());
                }
            };
            let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
            vh.replay_log(generation, &records, bytes);
        }
        b.add_vhost("/");
        for (key, entries) in recovered.queues {
            if let Some((vhost, exchange, due_ms)) = delayed::parse_store_key(&key) {
                // Persistent messages held by a durable delayed exchange.
                match b.vhost(vhost).filter(|v| v.holds_durably(exchange)) {
                    Some(v) => v.recover_delayed(exchange, due_ms, &entries),
                    None => {
                        for e in entries {
                            store.ack(&key, e.id, e.location);
                        }
                    }
                }
                continue;
            }
            let queue = key
                .split_once('\u{1f}')
                .and_then(|(v, q)| b.vhost(v)?.topology.read().queues.get(q).cloned())
                .filter(|q| q.durable);
            match queue {
                Some(q) => q.recover(entries.into_iter().map(|e| SpillEntry {
                    seq: e.id,
                    id: e.id,
                    location: e.location,
                    redelivered: e.redelivered,
                    transient: false,
                    priority: e.priority,
                })),
                None => {
                    for e in entries {
                        store.ack(&key, e.id, e.location);
                    }
                }
            }
        }
        // Once every queue is back (a dead-letter target included), over-long queues shed
        // their heads as they would have had the messages come back while running.
        for v in b.vhosts.read().values() {
            for q in v.queues() {
                q.enforce_limits();
            }
        }
        Ok((b, recovered.report))
    }

    /// The access-control database (users, vhost records, permissions), for reading.
    pub fn access(&self) -> parking_lot::RwLockReadGuard<'_, crate::access::AccessControl> {
        self.access.read()
    }

    /// The access-control database, for changing. Every call counts as a change: decisions
    /// cached under an older [`Broker::access_generation`] are dropped.
    pub fn access_mut(&self) -> parking_lot::RwLockWriteGuard<'_, crate::access::AccessControl> {
        let guard = self.access.write();
        self.access_generation.fetch_add(1, Ordering::Release);
        guard
    }

    /// A number that changes whenever the access-control database may have changed, for
    /// caches of access decisions (a channel's publish permission, as RabbitMQ caches its
    /// permission checks per channel).
    pub fn access_generation(&self) -> u64 {
        self.access_generation.load(Ordering::Acquire)
    }

    /// True when the access-control database was loaded from the data directory, where
    /// [`crate::ops::admin::Admin`] stores it after a change at run time.
    pub fn access_restored(&self) -> bool {
        self.access_restored
    }

    /// Stores the access-control database `json` (a definitions document) in the data
    /// directory; nothing to do for an in-memory broker.
    ///
    /// Errors: the file could not be written and fsynced.
    pub(crate) fn store_access(&self, json: &str) -> std::io::Result<()> {
        match &self.persist {
            Some(p) => p.save_access(json),
            None => Ok(()),
        }
    }

    /// The read model: live connections and channels, message counts (see
    /// [`crate::registry`]).
    pub fn registry(&self) -> &Arc<crate::registry::Registry> {
        &self.registry
    }

    /// The message store, for a durable broker.
    pub fn store(&self) -> Option<&Store> {
        self.persist.as_ref().map(|p| &p.store)
    }

    /// Sets the per-vhost caps on queues, exchanges and bindings of every vhost (see
    /// [`Limits`]; [`Limits::default`] until set). Declares already made stay.
    pub fn set_limits(&self, limits: Limits) {
        *self.limits.write() = limits;
    }

    /// The per-vhost caps in force.
    pub fn limits(&self) -> Limits {
        *self.limits.read()
    }

    /// Stops the message store's writer after a final fsync and releases the data
    /// directory's lock (another broker may open it from then on).
    pub fn close(&self) {
        if let Some(p) = &self.persist {
            p.defs.close();
            p.store.close();
            p.release();
        }
    }

    /// Creates a vhost with the standard exchanges if it does not exist; returns it.
    pub fn add_vhost(&self, name: &str) -> Arc<VHost> {
        self.vhosts
            .write()
            .entry(name.to_string())
            .or_insert_with(|| {
                Arc::new_cyclic(|me| {
                    let mut v = VHost::new(name);
                    v.persist = self.persist.clone();
                    v.ids = self.ids.clone();
                    v.clock = self.clock.clone();
                    v.limits = self.limits.clone();
                    v.me = me.clone();
                    v
                })
            })
            .clone()
    }

    /// Deletes vhost `name` with everything in it (RabbitMQ's `rabbit_vhost:delete`): its
    /// queues are deleted (their consumers get basic.cancel, their stored messages are
    /// dropped), its exchanges and bindings go, and a durable broker removes the vhost's
    /// definitions from its data directory, so that it does not come back at the next start.
    /// The vhost's connections are not closed here (see
    /// [`crate::registry::Registry::close_where`]); whatever they still do touches nothing.
    ///
    /// Blocks until the definitions files are removed (the definitions writer first writes
    /// what was queued before): call it off the async runtime's threads. Returns false when
    /// there was no such vhost.
    ///
    /// Errors: the definitions files could not be removed (the vhost is gone from memory;
    /// the files are removed at the next start if it is not recreated).
    pub fn remove_vhost(&self, name: &str) -> std::io::Result<bool> {
        let Some(v) = self.vhosts.write().remove(name) else {
            return Ok(false);
        };
        let queues: Vec<Arc<Queue>> = {
            let mut topo = v.topology.write();
            v.removed.store(true, Ordering::Release);
            let queues = topo.queues.drain().map(|(_, q)| q).collect();
            topo.exchanges.clear();
            topo.bindings = 0;
            queues
        };
        // Persistent messages it held stay in the store until the next start, which drops
        // them with the vhost gone.
        *v.delayed.lock() = delayed::Schedule::default();
        for q in &queues {
            finish_queue_delete(q);
        }
        self.registry.forget_vhost(name);
        let Some(p) = &self.persist else {
            return Ok(true);
        };
        // Records queued for this vhost before the flag was set are written first; then its
        // snapshot and logs are removed.
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = p.definitions_dir();
        let stem = crate::persist::file_stem(name);
        p.defs.after_written(Box::new(move |_| {
            let _ = tx.send(remove_vhost_files(&dir, &stem));
        }));
        rx.recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the broker is closed")))?;
        Ok(true)
    }

    /// Periodic housekeeping of every vhost (see [`VHost::sweep`]).
    pub fn sweep(&self) {
        let vhosts: Vec<Arc<VHost>> = self.vhosts.read().values().cloned().collect();
        for v in vhosts {
            v.sweep();
        }
    }

    /// Looks up a vhost.
    pub fn vhost(&self, name: &str) -> Option<Arc<VHost>> {
        self.vhosts.read().get(name).cloned()
    }

    /// Names of all vhosts.
    pub fn vhost_names(&self) -> Vec<String> {
        self.vhosts.read().keys().cloned().collect()
    }
}

impl DeadLetterSink for VHost {
    /// Re-publishes messages that died in queue `from` to its dead-letter exchange, with
    /// RabbitMQ's `x-death` history and `x-first-death-*` / `x-last-death-*` headers. A
    /// missing dead-letter exchange drops them, as do automatic (not `rejected`) deaths that
    /// would route a message back to a queue it already died in.
    fn dead_letter(&self, from: &DeadLetterSource<'_>, letters: Vec<DeadLetter>) {
        let dlx = from.exchange;
        let now_s = self.clock.now_ms() / 1000;
        for l in letters {
            let msg = dead_lettered(from, &l, now_s);
            let headers = msg.properties.headers.as_ref();
            let mut routed = Routed::default();
            let sender_keys = msg.sender_keys();
            let keys = sender_keys.all(&msg.routing_key);
            if self
                .route_inner(dlx, &keys, headers, false, &mut routed)
                .is_err()
            {
                continue;
            }
            for (x, durable, delay) in &routed.delayed {
                if let Err(e) = self.hold(x, *durable, &msg, *delay) {
                    static HOLD_FAILED: LogLimit = LogLimit::new();
                    if let Some(suppressed) = HOLD_FAILED.admit() {
                        tracing::warn!(queue = %from.queue, error = %e, suppressed, "cannot hold dead letter in delayed exchange");
                    }
                }
            }
            let mut queues = routed.queues;
            let deaths = headers
                .and_then(|h| h.get("x-death"))
                .and_then(|v| v.as_array())
                .unwrap_or(&[]);
            let field = |d: &FieldValue, k: &str| -> Option<String> {
                d.as_table()
                    .and_then(|t| t.get(k))
                    .and_then(|v| v.as_str())
                    .map(str::to_string)
            };
            let any_rejected = deaths
                .iter()
                .any(|d| field(d, "reason").as_deref() == Some("rejected"));
            if !any_rejected {
                queues.retain(|q| {
                    !deaths
                        .iter()
                        .any(|d| field(d, "queue").as_deref() == Some(q.name.as_str()))
                });
            }
            if queues.is_empty() {
                continue;
            }
            if let Err(e) = self.enqueue(msg, queues, None, false, true) {
                static DEAD_LETTER_FAILED: LogLimit = LogLimit::new();
                if let Some(suppressed) = DEAD_LETTER_FAILED.admit() {
                    tracing::warn!(queue = %from.queue, error = %e, suppressed, "cannot dead-letter message");
                }
            }
        }
    }
}

/// A virtual host.
pub struct VHost {
    /// The vhost's name (`/` by default).
    pub name: String,
    topology: RwLock<Topology>,
    persist: Option<Arc<Persistence>>,
    ids: Arc<AtomicU64>,
    clock: Arc<dyn Clock>,
    /// This vhost, for its queues to re-publish dead letters through.
    me: Weak<VHost>,
    /// Direct reply-to consumers, by the name their requests carry in `reply_to`.
    reply_consumers: parking_lot::Mutex<HashMap<String, ReplyConsumer>>,
    /// Stands in for a queue in deliveries to direct reply-to consumers (never routed to).
    reply_queue: Arc<Queue>,
    /// The stored definitions may differ from the ones in memory (a save failed): the next
    /// sweep writes them again.
    defs_dirty: std::sync::atomic::AtomicBool,
    /// Where the durable definitions log stands (see [`log`]).
    defs_log: parking_lot::Mutex<log::LogState>,
    /// No retry of a failed save before this instant.
    defs_retry_at: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Messages held by delayed-message exchanges, by due time.
    delayed: parking_lot::Mutex<delayed::Schedule>,
    /// Caps on queues, exchanges and bindings (shared with the broker).
    limits: Arc<RwLock<Limits>>,
    /// The vhost was deleted: nothing of it is written to disk any more.
    removed: std::sync::atomic::AtomicBool,
}

/// The pseudo-queue of RabbitMQ's direct reply-to: a requester consumes from it in no-ack
/// mode and publishes with `reply_to` set to it; the broker rewrites `reply_to` to
/// `amq.rabbitmq.reply-to.<token>`, and a reply published to the default exchange with that
/// routing key goes straight to the requester's consumer, without a queue
/// (rabbitmq.com/docs/direct-reply-to).
pub const REPLY_TO: &str = "amq.rabbitmq.reply-to";

struct ReplyConsumer {
    target: Weak<dyn DeliveryTarget>,
    tag: Arc<str>,
}

/// What became of a publish.
#[derive(Debug, Clone)]
pub struct Published {
    /// At least one queue received the message.
    pub routed: bool,
    /// How many queues enqueued it (RabbitMQ's exchange `publish_out` counts each).
    pub queues: u32,
    /// The message was written to the store (with the caller's completion, if one was given,
    /// to run after the fsync that covers it); otherwise nothing is pending.
    pub stored: bool,
    /// A queue it went to asks publishers to pause ([`Queue::is_pressured`]).
    pub pressured: Option<Arc<Queue>>,
    /// A queue it was routed to refused it (full, with overflow `reject-publish` or
    /// `reject-publish-dlx`): the publisher confirm is a nack.
    pub rejected: bool,
}

/// Why a publish failed.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    /// Routing failed (404 no exchange, 403 internal exchange).
    #[error(transparent)]
    Broker(#[from] BrokerError),
    /// The message store refuses writes (disk full or failing); the message went nowhere.
    #[error("{0}")]
    StoreUnavailable(String),
}

#[derive(Default)]
struct Topology {
    exchanges: HashMap<String, Exchange>,
    queues: HashMap<String, Arc<Queue>>,
    /// Bindings of all exchanges, for the binding limit.
    bindings: usize,
    /// Policies and operator policies.
    policies: crate::policy::Policies,
}

/// The exchanges every vhost has from the start: they do not count against the exchange
/// limit and cannot be deleted.
const STANDARD_EXCHANGES: [(&str, ExchangeKind); 6] = [
    ("", ExchangeKind::Direct),
    ("amq.direct", ExchangeKind::Direct),
    ("amq.fanout", ExchangeKind::Fanout),
    ("amq.topic", ExchangeKind::Topic),
    ("amq.headers", ExchangeKind::Headers),
    ("amq.match", ExchangeKind::Headers),
];

/// The flags and arguments of exchange.declare.
#[derive(Debug, Clone, Default)]
pub struct ExchangeDeclare {
    /// Exchange name.
    pub name: String,
    /// Type name (`direct`, `fanout`, `topic`, `headers`).
    pub kind: String,
    /// Only check that the exchange exists.
    pub passive: bool,
    /// Survives restarts.
    pub durable: bool,
    /// Deleted with its last binding.
    pub auto_delete: bool,
    /// Not publishable by clients.
    pub internal: bool,
    /// Arguments.
    pub arguments: FieldTable,
}

/// The flags and arguments of queue.declare.
#[derive(Debug, Clone, Default)]
pub struct QueueDeclare {
    /// Queue name; empty asks the server for an `amq.gen-…` name.
    pub name: String,
    /// Only check that the queue exists.
    pub passive: bool,
    /// Survives restarts.
    pub durable: bool,
    /// Owned by the declaring connection and deleted with it.
    pub exclusive: bool,
    /// Deleted when its last consumer goes.
    pub auto_delete: bool,
    /// Arguments (`x-…`).
    pub arguments: FieldTable,
}

impl VHost {
    /// A vhost with the default exchange and `amq.direct`, `amq.fanout`, `amq.topic`,
    /// `amq.headers` and `amq.match`, all durable, as RabbitMQ pre-declares them.
    pub fn new(name: &str) -> Self {
        let mut topo = Topology::default();
        for (n, k) in STANDARD_EXCHANGES {
            topo.exchanges.insert(
                n.into(),
                Exchange::new(n, k, true, false, false, FieldTable::new()),
            );
        }
        VHost {
            name: name.to_string(),
            topology: RwLock::new(topo),
            persist: None,
            ids: Arc::new(AtomicU64::new(1)),
            clock: Arc::new(SystemClock),
            me: Weak::new(),
            reply_consumers: parking_lot::Mutex::new(HashMap::new()),
            reply_queue: Arc::new(Queue::new(
                REPLY_TO,
                name,
                false,
                None,
                false,
                FieldTable::new(),
            )),
            defs_dirty: std::sync::atomic::AtomicBool::new(false),
            defs_log: parking_lot::Mutex::new(log::LogState::default()),
            defs_retry_at: parking_lot::Mutex::new(None),
            delayed: parking_lot::Mutex::new(delayed::Schedule::default()),
            limits: Arc::default(),
            removed: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The stand-in queue of direct reply-to consumers.
    pub fn reply_queue(&self) -> &Arc<Queue> {
        &self.reply_queue
    }

    /// Registers a direct reply-to consumer; returns the `reply_to` value its requests carry.
    pub fn add_reply_consumer(&self, target: Weak<dyn DeliveryTarget>, tag: Arc<str>) -> String {
        let name = names::generate(&format!("{REPLY_TO}."));
        self.reply_consumers
            .lock()
            .insert(name.clone(), ReplyConsumer { target, tag });
        name
    }

    /// Forgets a direct reply-to consumer (cancelled, or its channel closed).
    pub fn remove_reply_consumer(&self, name: &str) {
        self.reply_consumers.lock().remove(name);
    }

    /// Delivers a reply to its direct reply-to consumer; false when there is none (any
    /// more), in which case the reply is dropped as in RabbitMQ.
    fn deliver_reply(&self, msg: Arc<Message>) -> bool {
        let consumer = self
            .reply_consumers
            .lock()
            .get(&msg.routing_key)
            .and_then(|c| Some((c.target.upgrade()?, c.tag.clone())));
        let Some((target, tag)) = consumer else {
            return false;
        };
        let id = self.next_id();
        let qm = QueuedMessage {
            seq: id,
            message: msg,
            redelivered: false,
            stored: None,
            expires_at: None,
        };
        target.deliver(&self.reply_queue, &tag, true, qm).is_ok()
    }

    /// A new queue of this vhost, with its clock, vhost handle and store.
    fn new_queue(&self, queue: Queue) -> Queue {
        let mut queue = queue
            .with_clock(self.clock.clone())
            .with_dead_letter_sink(self.me.clone());
        if let Some(b) = self.backing() {
            queue = queue.with_backing(b);
        }
        queue
    }

    /// Periodic housekeeping: retries a failed save of the durable definitions (at most once a
    /// second), routes the delayed messages whose delay is over, expires messages at the head
    /// of each queue and deletes the queues unused for longer than their `x-expires`.
    pub fn sweep(&self) {
        self.retry_save();
        self.release_delayed();
        for q in self.queues() {
            if q.sweep() {
                self.remove_queue(&q);
            }
        }
    }

    /// A fresh message id, increasing across the broker.
    fn next_id(&self) -> u64 {
        match &self.persist {
            Some(p) => p.store.next_id(),
            None => self.ids.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Routes and enqueues a published message. A persistent message routed to durable queues
    /// of a durable broker is written to the store once, with `waiter` to be completed after
    /// its fsync (publisher confirms, tx.commit).
    ///
    /// Errors: 404 / 403 (missing or internal exchange), 406 (a `CC` / `BCC` header that is
    /// not an array, an `x-delay` header a delayed exchange cannot read), or the
    /// store refusing writes.
    pub fn publish(
        &self,
        msg: Arc<Message>,
        waiter: Option<(Arc<dyn Completion>, u64)>,
    ) -> std::result::Result<Published, PublishError> {
        if msg.exchange.is_empty() && msg.routing_key.starts_with(REPLY_TO) {
            let routed = self.deliver_reply(msg);
            return Ok(Published {
                routed,
                queues: u32::from(routed),
                stored: false,
                pressured: None,
                rejected: false,
            });
        }
        let exchange = msg.exchange.clone();
        self.dispatch(&exchange, msg, waiter, true)
    }

    /// Routes `msg` from exchange `start` (its publish exchange, or the delayed exchange that
    /// held it) with its routing key and `CC` / `BCC` keys, holds it in the delayed exchanges
    /// that must delay it, and enqueues it on the queues it reached.
    fn dispatch(
        &self,
        start: &str,
        msg: Arc<Message>,
        waiter: Option<(Arc<dyn Completion>, u64)>,
        refuse_internal: bool,
    ) -> std::result::Result<Published, PublishError> {
        // As published (BCC included): what a delayed exchange holds.
        let original = msg.clone();
        let msg = match msg.sender_keys {
            Some(_) => msg,
            None => match SenderKeys::from_headers(msg.properties.headers.as_ref()) {
                Ok(keys) => sender_selected::prepare(msg, keys),
                Err(reason) => {
                    // RabbitMQ checks the exchange before it reads the message.
                    self.check_publishable(start, refuse_internal)?;
                    return Err(BrokerError::precondition_failed(format!(
                        "invalid message: {reason}"
                    ))
                    .into());
                }
            },
        };
        let mut routed = Routed::default();
        {
            let single = [msg.routing_key.as_str()];
            let all;
            let keys: &[&str] = match &msg.sender_keys {
                Some(k) if !k.is_empty() => {
                    all = k.all(&msg.routing_key);
                    &all
                }
                _ => &single,
            };
            self.route_inner(
                start,
                keys,
                msg.properties.headers.as_ref(),
                refuse_internal,
                &mut routed,
            )?;
        }
        // Held copies go to the store before the queues' copy, whose fsync then covers them.
        let mut held_durably = false;
        for (x, durable, delay) in &routed.delayed {
            held_durably |= self.hold(x, *durable, &original, *delay)?;
        }
        let sync_waiter = waiter.clone().filter(|_| held_durably);
        let mut queues = routed.queues;
        let mut published = if queues.is_empty() {
            Published {
                routed: false,
                queues: 0,
                stored: false,
                pressured: None,
                rejected: false,
            }
        } else {
            let mut rejected = Vec::new();
            queues.retain(|q| {
                let refuse = q.rejects_publish(&msg);
                if refuse {
                    rejected.push(q.clone());
                }
                !refuse
            });
            for q in &rejected {
                let args = q.args();
                if args.overflow != crate::args::Overflow::RejectPublishDlx {
                    continue;
                }
                if let Some(source) = q.dead_letter_source(&args) {
                    self.dead_letter(
                        &source,
                        vec![DeadLetter {
                            message: msg.clone(),
                            reason: DeathReason::Maxlen,
                        }],
                    );
                }
            }
            // An early confirm (all durable queues acked) must not overtake the fsync of a
            // held copy.
            self.enqueue(msg, queues, waiter, !rejected.is_empty(), !held_durably)?
        };
        if let Some(w) = sync_waiter {
            if !published.stored && !published.rejected {
                published.stored = self.sync(w);
            }
        }
        Ok(published)
    }

    /// Fails like routing would from exchange `name`: 404 when it is missing, 403 when it is
    /// internal and `refuse_internal`.
    fn check_publishable(&self, name: &str, refuse_internal: bool) -> Result<()> {
        if name.is_empty() {
            return Ok(());
        }
        let topo = self.topology.read();
        let x = topo
            .exchanges
            .get(name)
            .ok_or_else(|| self.no_exchange(name))?;
        if x.internal && refuse_internal {
            return Err(BrokerError::access_refused(format!(
                "cannot publish to internal {}",
                self.exchange_resource(name)
            )));
        }
        Ok(())
    }

    /// Enqueues a routed message on `queues`, writing it to the store first when it is
    /// persistent and some of them are durable.
    fn enqueue(
        &self,
        msg: Arc<Message>,
        queues: Vec<Arc<Queue>>,
        waiter: Option<(Arc<dyn Completion>, u64)>,
        rejected: bool,
        early_confirm: bool,
    ) -> std::result::Result<Published, PublishError> {
        if queues.is_empty() {
            return Ok(Published {
                routed: true,
                queues: 0,
                stored: false,
                pressured: None,
                rejected,
            });
        }
        // Each queue enqueues in id order (see `Queue::enqueue_order`): the id is taken and the
        // message enqueued under the queues' order locks. Dead letters wait until they are
        // released, as dead-lettering publishes again.
        let order = crate::queue::lock_enqueue_order(&queues);
        let id = self.next_id();
        let mut location = None;
        if let (Some(p), true) = (&self.persist, msg.is_persistent()) {
            let durable: Vec<&str> = queues
                .iter()
                .filter(|q| q.store().is_some())
                .map(|q| q.store_key())
                .collect();
            if !durable.is_empty() {
                if let (Some((sink, token)), true) = (&waiter, early_confirm) {
                    let ticket = ConfirmTicket::new(durable.len() as u32, sink.clone(), *token);
                    let _ = msg.confirm.set(Arc::new(ticket));
                }
                let loc = p
                    .store
                    .append_publish(
                        id,
                        &msg.exchange,
                        &msg.routing_key,
                        &msg.properties,
                        &msg.body,
                        self.clock.now_ms(),
                        &durable,
                        waiter,
                    )
                    .map_err(|e| PublishError::StoreUnavailable(e.to_string()))?;
                location = Some(loc);
            }
        }
        let mut pressured = None;
        let mut dead = Vec::new();
        for q in &queues {
            let stored = if q.store().is_some() { location } else { None };
            let (pressure, letters) = q.publish_held(msg.clone(), id, stored);
            if pressure && pressured.is_none() {
                pressured = Some(q.clone());
            }
            if !letters.is_empty() {
                dead.push((q.clone(), letters));
            }
        }
        drop(order);
        for (q, letters) in dead {
            q.dead_letter(letters);
        }
        Ok(Published {
            routed: true,
            queues: queues.len() as u32,
            stored: location.is_some(),
            pressured,
            rejected,
        })
    }

    /// Completes `waiter` once everything written to the store so far is fsynced; returns
    /// false (and drops the waiter) for an in-memory broker.
    pub fn sync(&self, waiter: (Arc<dyn Completion>, u64)) -> bool {
        match &self.persist {
            Some(p) => {
                p.store.sync(waiter);
                true
            }
            None => false,
        }
    }

    fn backing(&self) -> Option<Backing> {
        self.persist.as_ref().map(|p| Backing {
            store: p.store.clone(),
            window: p.options.queue_window,
            window_bytes: p.options.queue_window_bytes,
            spill_path: p.spill_path(),
            unacked_window: p.options.unacked_window,
            unacked_window_bytes: p.options.unacked_window_bytes,
        })
    }

    fn exchange_resource(&self, name: &str) -> String {
        resource("exchange", name, &self.name)
    }

    fn queue_resource(&self, name: &str) -> String {
        resource("queue", name, &self.name)
    }

    fn destination_resource(&self, d: &Destination) -> String {
        match d {
            Destination::Queue(q) => self.queue_resource(q),
            Destination::Exchange(x) => self.exchange_resource(x),
        }
    }

    fn no_exchange(&self, name: &str) -> BrokerError {
        BrokerError::not_found(format!("no {}", self.exchange_resource(name)))
    }

    fn no_queue(&self, name: &str) -> BrokerError {
        BrokerError::not_found(format!("no {}", self.queue_resource(name)))
    }

    /// exchange.declare. Errors: 404 (passive, missing), 406 (unknown type, as in RabbitMQ 4.x;
    /// 3.x closed the connection with 503), 403 (default exchange, passive or not, or `amq.`
    /// prefix for an exchange that does not exist yet), 406 (inequivalent type, flags or
    /// `alternate-exchange`; a new `x-delayed-message` exchange without a usable
    /// `x-delayed-type`; the vhost's exchange limit reached).
    pub fn declare_exchange(&self, d: &ExchangeDeclare) -> Result<()> {
        if d.passive {
            // RabbitMQ refuses the default exchange even to a passive declare.
            if d.name.is_empty() {
                return Err(default_exchange_refused());
            }
            let topo = self.topology.read();
            return match topo.exchanges.get(&d.name) {
                Some(_) => Ok(()),
                None => Err(self.no_exchange(&d.name)),
            };
        }
        let kind = ExchangeKind::parse(&d.kind).ok_or_else(|| {
            BrokerError::precondition_failed(format!("unknown exchange type '{}'", d.kind))
        })?;
        if d.name.is_empty() {
            return Err(default_exchange_refused());
        }
        // The reserved prefix only stops creating an exchange: redeclaring an existing
        // `amq.*` exchange equivalently succeeds, as in RabbitMQ.
        if !self.exchange_exists(&d.name) {
            check_new_exchange_name(&d.name)?;
        }
        let mut topo = self.topology.write();
        if let Some(x) = topo.exchanges.get(&d.name) {
            let what = self.exchange_resource(&d.name);
            check_field(&what, "type", x.kind.as_str(), kind.as_str())?;
            check_field(&what, "durable", x.durable, d.durable)?;
            check_field(&what, "auto_delete", x.auto_delete, d.auto_delete)?;
            check_field(&what, "internal", x.internal, d.internal)?;
            check_args(&what, &x.arguments, &d.arguments, &["alternate-exchange"])?;
            return Ok(());
        }
        // As RabbitMQ: the limit first, then the type's own validation.
        let user_exchanges = topo
            .exchanges
            .len()
            .saturating_sub(STANDARD_EXCHANGES.len());
        limits::check_exchange(&self.limits.read(), &self.name, &d.name, user_exchanges)?;
        if kind == ExchangeKind::DelayedMessage {
            delayed::routing_kind(&d.arguments)?;
        }
        let mut x = Exchange::new(
            d.name.clone(),
            kind,
            d.durable,
            d.auto_delete,
            d.internal,
            d.arguments.clone(),
        );
        x.apply_policy(topo.policies.applied(&d.name, false));
        topo.exchanges.insert(d.name.clone(), x);
        if d.durable {
            let put = TopologyCommand::PutExchange {
                name: d.name.clone(),
                kind,
                auto_delete: d.auto_delete,
                internal: d.internal,
                arguments: d.arguments.clone(),
            };
            let undo = Undo::added(Removed::AddedExchange(d.name.clone()));
            let what = format!("failed to declare {}", self.exchange_resource(&d.name));
            self.save(&mut topo, vec![put], undo, what)?;
        }
        Ok(())
    }

    /// exchange.delete. Deleting a missing exchange succeeds, as in RabbitMQ. Errors: 403 for the
    /// default exchange and `amq.` exchanges, 406 with `if_unused` when it is a binding source.
    /// A deleted delayed-message exchange drops the messages it holds.
    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> Result<()> {
        self.check_exchange_deletable(name)?;
        let mut topo = self.topology.write();
        let Some(x) = topo.exchanges.get(name) else {
            return Ok(());
        };
        if if_unused && !x.bindings().is_empty() {
            return Err(BrokerError::precondition_failed(format!(
                "{} in use",
                self.exchange_resource(name)
            )));
        }
        let delayed = x.kind == ExchangeKind::DelayedMessage;
        let mut undo = Undo::default();
        topo.remove_exchange(name, &mut undo);
        if undo.durable {
            let what = format!("failed to delete {}", self.exchange_resource(name));
            self.save(&mut topo, TopologyCommand::removals(&undo), undo, what)?;
        }
        if delayed {
            // Under the topology lock, so that a new exchange of the same name cannot have
            // held anything yet.
            self.drop_held(name);
        }
        Ok(())
    }

    /// What RabbitMQ refuses before any permission check on exchange.delete: the default
    /// exchange and the `amq.` system exchanges (403).
    pub(crate) fn check_exchange_deletable(&self, name: &str) -> Result<()> {
        if name.is_empty() {
            return Err(default_exchange_refused());
        }
        if name.starts_with("amq.") {
            return Err(BrokerError::access_refused(format!(
                "deletion of system {} not allowed",
                self.exchange_resource(name)
            )));
        }
        Ok(())
    }

    /// True when the exchange exists.
    pub fn exchange_exists(&self, name: &str) -> bool {
        self.topology.read().exchanges.contains_key(name)
    }

    /// The type of exchange `name` (`""`, the default exchange, is a direct exchange), or
    /// `None` when there is no such exchange.
    pub fn exchange_kind(&self, name: &str) -> Option<ExchangeKind> {
        if name.is_empty() {
            return Some(ExchangeKind::Direct);
        }
        self.topology.read().exchanges.get(name).map(|x| x.kind)
    }

    /// True when the queue exists.
    pub fn queue_exists(&self, name: &str) -> bool {
        self.topology.read().queues.contains_key(name)
    }

    /// How many queues the vhost has.
    pub fn queue_count(&self) -> usize {
        self.topology.read().queues.len()
    }

    /// queue.declare, for connection `connection_id`. Returns the queue and its counts.
    ///
    /// An exclusive queue is never durable: `durable` is ignored when `exclusive` is set (it
    /// is deleted with its connection anyway), in the declare and in the equivalence check of
    /// a redeclare, as RabbitMQ's `Durable = DurableDeclare andalso not ExclusiveDeclare`.
    ///
    /// Errors: 404 (passive, missing), 403 (`amq.` prefix), 405 (exclusive to another
    /// connection, or exclusivity differs), 406 (inequivalent durable/auto_delete/arguments,
    /// invalid arguments, the vhost's queue limit reached).
    pub fn declare_queue(
        &self,
        d: &QueueDeclare,
        connection_id: u64,
    ) -> Result<(Arc<Queue>, QueueCounts)> {
        if d.passive {
            let q = self.queue(&d.name, connection_id)?;
            q.touch();
            let counts = q.counts();
            return Ok((q, counts));
        }
        let name = decide_queue_name(&d.name)?;
        self.declare_queue_as(name, d, connection_id)
    }

    /// A non-passive queue.declare under `name`, already decided by [`decide_queue_name`]
    /// (the operations layer decides it before checking permissions on it).
    pub(crate) fn declare_queue_as(
        &self,
        name: String,
        d: &QueueDeclare,
        connection_id: u64,
    ) -> Result<(Arc<Queue>, QueueCounts)> {
        let mut topo = self.topology.write();
        // As in RabbitMQ, the arguments of an existing queue are only compared (an invalid
        // value is reported as inequivalent); they are validated when the queue is created.
        if let Some(q) = topo.queues.get(&name) {
            let owner = d.exclusive.then_some(connection_id);
            if q.exclusive_owner != owner {
                // Reuse the 405 text of check_exclusive.
                return Err(q
                    .check_exclusive(u64::MAX)
                    .err()
                    .unwrap_or_else(|| locked_queue(q)));
            }
            let what = self.queue_resource(&name);
            check_field(&what, "durable", q.durable, d.durable && !d.exclusive)?;
            check_field(&what, "auto_delete", q.auto_delete, d.auto_delete)?;
            check_args(&what, &q.arguments, &d.arguments, EQUIVALENT_QUEUE_ARGS)?;
            q.touch();
            let counts = q.counts();
            return Ok((q.clone(), counts));
        }
        QueueArgs::parse(&self.queue_resource(&name), &d.arguments)?;
        limits::check_queue(&self.limits.read(), &self.name, &name, topo.queues.len())?;
        let q = Arc::new(self.new_queue(Queue::new(
            name.clone(),
            self.name.clone(),
            d.durable && !d.exclusive,
            d.exclusive.then_some(connection_id),
            d.auto_delete,
            d.arguments.clone(),
        )));
        q.apply_policy(topo.policies.applied(&name, true));
        topo.queues.insert(name.clone(), q.clone());
        if topo.queue_is_durable(&name) {
            let put = TopologyCommand::PutQueue {
                name: name.clone(),
                auto_delete: d.auto_delete,
                arguments: d.arguments.clone(),
            };
            let undo = Undo::added(Removed::AddedQueue(q.clone()));
            let what = format!("failed to declare {}", self.queue_resource(&name));
            self.save(&mut topo, vec![put], undo, what)?;
        }
        Ok((q, QueueCounts::default()))
    }

    /// Looks a queue up for connection `connection_id`: 404 when missing, 405 when exclusive to
    /// another connection.
    pub fn queue(&self, name: &str, connection_id: u64) -> Result<Arc<Queue>> {
        let q = self
            .topology
            .read()
            .queues
            .get(name)
            .cloned()
            .ok_or_else(|| self.no_queue(name))?;
        q.check_exclusive(connection_id)?;
        Ok(q)
    }

    /// All queues, in no particular order.
    pub fn queues(&self) -> Vec<Arc<Queue>> {
        self.topology.read().queues.values().cloned().collect()
    }

    /// queue.delete; returns the number of ready messages deleted. A missing queue is deleted
    /// successfully with count 0, as in RabbitMQ. Errors: 405, 406 (`if_unused`, `if_empty`).
    pub fn delete_queue(
        &self,
        name: &str,
        if_unused: bool,
        if_empty: bool,
        connection_id: u64,
    ) -> Result<u32> {
        let q = {
            let mut topo = self.topology.write();
            let Some(q) = topo.queues.get(name).cloned() else {
                return Ok(0);
            };
            q.check_exclusive(connection_id)?;
            let counts = q.counts();
            if if_unused && counts.consumers > 0 {
                return Err(BrokerError::precondition_failed(format!(
                    "{} in use",
                    q.resource_name()
                )));
            }
            if if_empty && counts.ready > 0 {
                return Err(BrokerError::precondition_failed(format!(
                    "{} not empty",
                    q.resource_name()
                )));
            }
            let mut undo = Undo::default();
            topo.remove_queue(name, &mut undo);
            if undo.durable {
                let what = format!("failed to delete {}", q.resource_name());
                self.save(&mut topo, TopologyCommand::removals(&undo), undo, what)?;
            }
            q
        };
        Ok(finish_queue_delete(&q))
    }

    /// Deletes `queue` if it is still the one registered under its name (auto-delete after the
    /// last consumer, exclusive queues when their connection closes).
    pub fn remove_queue(&self, queue: &Arc<Queue>) {
        {
            let mut topo = self.topology.write();
            match topo.queues.get(&queue.name) {
                Some(q) if Arc::ptr_eq(q, queue) => {
                    let mut undo = Undo::default();
                    topo.remove_queue(&queue.name, &mut undo);
                    // No client waits on this: a failed save is retried by the sweep.
                    if undo.durable {
                        self.save_detached(&mut topo, TopologyCommand::removals(&undo));
                    }
                }
                _ => return,
            }
        }
        finish_queue_delete(queue);
    }

    /// Deletes every queue exclusive to `connection_id`.
    pub fn remove_exclusive_queues(&self, connection_id: u64) {
        let owned: Vec<Arc<Queue>> = self
            .topology
            .read()
            .queues
            .values()
            .filter(|q| q.exclusive_owner == Some(connection_id))
            .cloned()
            .collect();
        for q in owned {
            self.remove_queue(&q);
        }
    }

    /// queue.purge; returns the number of messages purged.
    pub fn purge_queue(&self, name: &str, connection_id: u64) -> Result<u32> {
        Ok(self.queue(name, connection_id)?.purge())
    }

    /// queue.bind / exchange.bind. `destination` must exist (404), `source` must exist (404) and
    /// must not be the default exchange (403). Headers bindings need a valid `x-match` (406);
    /// a new binding must fit under the vhost's binding limit (406).
    pub fn bind(
        &self,
        source: &str,
        destination: Destination,
        routing_key: &str,
        arguments: &FieldTable,
        connection_id: u64,
    ) -> Result<()> {
        if source.is_empty() || destination == Destination::Exchange(String::new()) {
            return Err(default_exchange_refused());
        }
        let mut topo = self.topology.write();
        self.check_destination(&topo, &destination, connection_id)?;
        let x = topo
            .exchanges
            .get(source)
            .ok_or_else(|| self.no_exchange(source))?;
        if x.routing_kind() == ExchangeKind::Headers
            && crate::headers::MatchMode::from_args(arguments).is_none()
        {
            return Err(BrokerError::precondition_failed(
                match arguments.get("x-match") {
                    Some(FieldValue::LongString(b)) => format!(
                    "Invalid x-match field value <<\"{}\">>; expected all, any, all-with-x, or \
                     any-with-x",
                    String::from_utf8_lossy(b)
                ),
                    other => {
                        let (ty, shown) = other.map(arg_type_and_value).unwrap_or_default();
                        format!("Invalid x-match field type {ty} (value {shown}); expected longstr")
                    }
                },
            ));
        }
        let binding = Binding {
            destination: destination.clone(),
            routing_key: routing_key.to_string(),
            arguments: arguments.clone(),
        };
        if !x.bindings().contains(&binding) {
            limits::check_binding(
                &self.limits.read(),
                &self.name,
                source,
                &destination,
                topo.bindings,
            )?;
        }
        let Some(x) = topo.exchanges.get_mut(source) else {
            return Err(self.no_exchange(source));
        };
        let durable_source = x.durable;
        let added = x.bind(binding.clone());
        topo.bindings += usize::from(added);
        if added && durable_source && topo.destination_is_durable(&destination) {
            let add = TopologyCommand::AddBinding {
                source: source.to_string(),
                binding: binding.clone(),
            };
            let undo = Undo::added(Removed::AddedBinding(source.to_string(), binding.clone()));
            let what = format!(
                "could not create binding from {} to {}",
                self.exchange_resource(source),
                self.destination_resource(&destination)
            );
            self.save(&mut topo, vec![add], undo, what)?;
        }
        Ok(())
    }

    /// queue.unbind / exchange.unbind. Removing a binding that does not exist succeeds, as in
    /// RabbitMQ; a missing source or destination is 404.
    pub fn unbind(
        &self,
        source: &str,
        destination: Destination,
        routing_key: &str,
        arguments: &FieldTable,
        connection_id: u64,
    ) -> Result<()> {
        if source.is_empty() || destination == Destination::Exchange(String::new()) {
            return Err(default_exchange_refused());
        }
        let mut topo = self.topology.write();
        let binding = Binding {
            destination: destination.clone(),
            routing_key: routing_key.to_string(),
            arguments: arguments.clone(),
        };
        // As in RabbitMQ, unbinding is idempotent: a missing source, destination or binding
        // is not an error, and exclusivity is only checked for a binding that exists.
        let dest_exists = match &destination {
            Destination::Queue(q) => topo.queues.contains_key(q),
            Destination::Exchange(x) => topo.exchanges.contains_key(x),
        };
        let exists = dest_exists
            && topo
                .exchanges
                .get(source)
                .is_some_and(|x| x.bindings().contains(&binding));
        if !exists {
            return Ok(());
        }
        self.check_destination(&topo, &destination, connection_id)?;
        let x = topo
            .exchanges
            .get_mut(source)
            .ok_or_else(|| self.no_exchange(source))?;
        let removed = x.unbind(&binding);
        let (durable_source, now_unused) = (x.durable, x.auto_delete && x.bindings().is_empty());
        topo.bindings -= usize::from(removed);
        let mut undo = Undo::default();
        if removed {
            undo.durable = durable_source && topo.destination_is_durable(&destination);
            undo.steps
                .push(Removed::Binding(source.to_string(), binding.clone()));
            if now_unused {
                topo.remove_exchange(source, &mut undo);
            }
        }
        if undo.durable {
            let what = format!(
                "could not delete binding from {} to {}",
                self.exchange_resource(source),
                self.destination_resource(&destination)
            );
            self.save(&mut topo, TopologyCommand::removals(&undo), undo, what)?;
        }
        Ok(())
    }

    fn check_destination(
        &self,
        topo: &Topology,
        destination: &Destination,
        connection_id: u64,
    ) -> Result<()> {
        match destination {
            Destination::Queue(q) => topo
                .queues
                .get(q)
                .ok_or_else(|| self.no_queue(q))?
                .check_exclusive(connection_id),
            Destination::Exchange(x) if topo.exchanges.contains_key(x) => Ok(()),
            Destination::Exchange(x) => Err(self.no_exchange(x)),
        }
    }

    /// Registers a consumer on queue `name` for connection `connection_id` (404, 405, 403).
    pub fn consume(
        &self,
        name: &str,
        consumer: Consumer,
        connection_id: u64,
    ) -> Result<Arc<Queue>> {
        let q = self.queue(name, connection_id)?;
        q.add_consumer(consumer)?;
        Ok(q)
    }
}

impl Topology {
    fn queue_is_durable(&self, name: &str) -> bool {
        self.queues
            .get(name)
            .is_some_and(|q| q.durable && q.exclusive_owner.is_none())
    }

    fn exchange_is_durable(&self, name: &str) -> bool {
        self.exchanges.get(name).is_some_and(|x| x.durable)
    }

    fn destination_is_durable(&self, d: &Destination) -> bool {
        match d {
            Destination::Queue(q) => self.queue_is_durable(q),
            Destination::Exchange(x) => self.exchange_is_durable(x),
        }
    }

    /// Removes an exchange, its bindings as a source and as a destination, and then any
    /// auto-delete exchange left without bindings; records each removal in `undo`.
    fn remove_exchange(&mut self, name: &str, undo: &mut Undo) {
        if let Some(x) = self.exchanges.remove(name) {
            self.bindings -= x.bindings().len();
            undo.durable |= x.durable;
            undo.steps.push(Removed::Exchange(x));
        }
        self.unbind_everywhere(&Destination::Exchange(name.to_string()), undo);
    }

    /// Removes a queue and its bindings, and then any auto-delete exchange left without
    /// bindings; records each removal in `undo`.
    fn remove_queue(&mut self, name: &str, undo: &mut Undo) {
        if let Some(q) = self.queues.remove(name) {
            undo.durable |= q.durable && q.exclusive_owner.is_none();
            undo.steps.push(Removed::Queue(q));
        }
        self.unbind_everywhere(&Destination::Queue(name.to_string()), undo);
    }

    /// Removes every binding to `dest` (removed destinations were recorded as durable when
    /// they were, which covers their bindings).
    fn unbind_everywhere(&mut self, dest: &Destination, undo: &mut Undo) {
        let mut emptied = Vec::new();
        for x in self.exchanges.values_mut() {
            let gone: Vec<Binding> = x
                .bindings()
                .iter()
                .filter(|b| &b.destination == dest)
                .cloned()
                .collect();
            if gone.is_empty() {
                continue;
            }
            self.bindings -= x.unbind_destination(dest);
            for b in gone {
                undo.steps.push(Removed::Binding(x.name.clone(), b));
            }
            if x.auto_delete && x.bindings().is_empty() {
                emptied.push(x.name.clone());
            }
        }
        for name in emptied {
            self.remove_exchange(&name, undo);
        }
    }

    /// Puts back what a change removed, newest first (the change could not be stored).
    fn rollback(&mut self, undo: Undo) {
        for step in undo.steps.into_iter().rev() {
            match step {
                Removed::AddedExchange(name) => {
                    if let Some(x) = self.exchanges.remove(&name) {
                        self.bindings -= x.bindings().len();
                    }
                }
                Removed::AddedQueue(q) => {
                    if self.queues.get(&q.name).is_some_and(|o| Arc::ptr_eq(o, &q)) {
                        self.queues.remove(&q.name);
                    }
                }
                Removed::AddedBinding(source, b) => {
                    if let Some(x) = self.exchanges.get_mut(&source) {
                        self.bindings -= usize::from(x.unbind(&b));
                    }
                }
                Removed::Exchange(mut x) => {
                    // Policies may have changed since it was removed.
                    x.apply_policy(self.policies.applied(&x.name, false));
                    self.bindings += x.bindings().len();
                    self.exchanges.insert(x.name.clone(), x);
                }
                Removed::Binding(source, b) => {
                    if let Some(x) = self.exchanges.get_mut(&source) {
                        self.bindings += usize::from(x.bind(b));
                    }
                }
                Removed::Queue(q) => {
                    q.apply_policy(self.policies.applied(&q.name, true));
                    self.queues.insert(q.name.clone(), q);
                }
                Removed::Policy {
                    operator,
                    name,
                    previous,
                } => {
                    let list = self.policies.of_mut(operator);
                    match previous {
                        Some(p) => list.insert(name, p),
                        None => list.remove(&name),
                    };
                    self.reapply_policies();
                }
            }
        }
    }
}

/// What a topology change removed, so that it can be put back when the change cannot be
/// stored.
#[derive(Default)]
pub(crate) struct Undo {
    steps: Vec<Removed>,
    /// Something durable was removed: the definitions must be saved.
    durable: bool,
}

impl Undo {
    /// Undoes one addition.
    fn added(step: Removed) -> Self {
        Undo {
            steps: vec![step],
            durable: true,
        }
    }
}

pub(crate) enum Removed {
    /// An exchange a declare added.
    AddedExchange(String),
    /// A queue a declare added.
    AddedQueue(Arc<Queue>),
    /// A binding a bind added to the named source exchange.
    AddedBinding(String, Binding),
    Exchange(Exchange),
    /// A binding removed from the named source exchange.
    Binding(String, Binding),
    Queue(Arc<Queue>),
    /// A policy a change replaced or removed (`None`: it added it).
    Policy {
        /// An operator policy.
        operator: bool,
        /// Its name.
        name: String,
        /// What was there before.
        previous: Option<crate::policy::Policy>,
    },
}

/// 541 INTERNAL_ERROR for a topology change refused because the definitions could not be
/// stored: RabbitMQ answers a metadata store failure (a Khepri timeout) with this code and a
/// text such as `failed to declare exchange 'x' in vhost '/' because the operation timed out`.
fn not_stored(what: &str, e: &dyn std::fmt::Display) -> BrokerError {
    BrokerError::internal(format!(
        "{what} because the definitions could not be stored: {e}"
    ))
}

fn options_dir(p: &Persistence) -> std::path::PathBuf {
    p.data_dir().to_path_buf()
}

/// Removes a vhost's definitions snapshot and log files (names starting `<stem>.`) from
/// `dir`, and makes the removal durable.
fn remove_vhost_files(dir: &std::path::Path, stem: &str) -> std::io::Result<()> {
    let prefix = format!("{stem}.");
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        if e.file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
        {
            std::fs::remove_file(e.path())?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}

/// Marks a queue deleted and cancels its consumers; returns its ready-message count.
fn finish_queue_delete(q: &Arc<Queue>) -> u32 {
    let (count, consumers) = q.mark_deleted();
    for c in consumers {
        c.target.cancelled_by_broker(&c.tag);
    }
    count
}

fn locked_queue(q: &Queue) -> BrokerError {
    BrokerError::resource_locked(format!(
        "cannot obtain exclusive access to locked {}. It could be originally declared on another \
         connection or the exclusive property value does not match that of the original \
         declaration.",
        q.resource_name()
    ))
}

/// The name a non-passive queue.declare creates or redeclares: a fresh `amq.gen-…` name for
/// an empty one; 403 for a client-chosen name with the reserved `amq.` prefix.
pub(crate) fn decide_queue_name(requested: &str) -> Result<String> {
    if requested.is_empty() {
        return Ok(names::queue_name());
    }
    if requested.starts_with("amq.") {
        return Err(BrokerError::access_refused(format!(
            "queue name '{requested}' contains reserved prefix 'amq.*'"
        )));
    }
    Ok(requested.to_string())
}

/// 403 for creating an exchange with the reserved `amq.` prefix.
pub(crate) fn check_new_exchange_name(name: &str) -> Result<()> {
    if name.starts_with("amq.") {
        return Err(BrokerError::access_refused(format!(
            "exchange name '{name}' contains reserved prefix 'amq.*'"
        )));
    }
    Ok(())
}

pub(crate) fn default_exchange_refused() -> BrokerError {
    BrokerError::access_refused("operation not permitted on the default exchange")
}

/// One exchange as read by the management API: its declared properties and its bindings as
/// a source, copied under the topology's read lock.
#[derive(Debug, Clone)]
pub struct ExchangeSnapshot {
    /// Name (`""` for the default exchange).
    pub name: String,
    /// Declared type.
    pub kind: ExchangeKind,
    /// Survives a restart.
    pub durable: bool,
    /// Deleted with its last binding.
    pub auto_delete: bool,
    /// Not publishable by clients.
    pub internal: bool,
    /// Declared arguments.
    pub arguments: FieldTable,
    /// Its bindings as a source, in binding order.
    pub bindings: Vec<Binding>,
    /// The policy and operator policy that apply to it.
    pub policy: Arc<crate::policy::Applied>,
}

impl VHost {
    /// Every exchange of the vhost with its bindings, in no particular order (the default
    /// exchange's implicit bindings to every queue are not listed).
    pub fn exchange_snapshots(&self) -> Vec<ExchangeSnapshot> {
        self.topology
            .read()
            .exchanges
            .values()
            .map(|x| ExchangeSnapshot {
                name: x.name.clone(),
                kind: x.kind,
                durable: x.durable,
                auto_delete: x.auto_delete,
                internal: x.internal,
                arguments: x.arguments.clone(),
                bindings: x.bindings().to_vec(),
                policy: x.applied_policy().clone(),
            })
            .collect()
    }
}

#[cfg(test)]
#[path = "vhost_tests.rs"]
mod tests;
