//! Virtual hosts: the exchanges, queues and bindings of one namespace, and the [`Broker`] that
//! holds every vhost and the user table.
//!
//! All topology changes (declare, delete, bind) take the vhost's write lock; routing a publish
//! takes the read lock only, so publishers on different connections route in parallel.

use crate::args::QueueArgs;
use crate::auth::Users;
use crate::clock::{Clock, SystemClock};
use crate::delayed::{self, Body, Held};
use crate::error::{resource, BrokerError, Result};
use crate::exchange::{Binding, Destination, Exchange, ExchangeKind};
use crate::limits::{self, Limits};
use crate::message::{ConfirmTicket, Message, QueuedMessage};
use crate::names;
use crate::persist::{get_bool, get_str, get_table, s, Persistence, StorageOptions};
use crate::queue::{
    Backing, Consumer, DeadLetter, DeathReason, DeliveryTarget, Queue, QueueCounts,
};
use crate::sender_selected::{self, SenderKeys};
use parking_lot::RwLock;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use warren_amqp::table::{FieldTable, FieldValue};
use warren_store::spill::SpillEntry;
use warren_store::{Completion, RecoveryReport, Store};

/// Queue arguments whose values must match when a queue is redeclared (RabbitMQ compares these
/// and ignores any other argument).
const EQUIVALENT_QUEUE_ARGS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-queue-version",
    "x-single-active-consumer",
    "x-delivery-limit",
];

/// The broker: vhosts and users.
pub struct Broker {
    vhosts: RwLock<HashMap<String, Arc<VHost>>>,
    /// The user table.
    pub users: RwLock<Users>,
    persist: Option<Arc<Persistence>>,
    ids: Arc<AtomicU64>,
    clock: Arc<dyn Clock>,
    limits: Arc<RwLock<Limits>>,
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
    /// An in-memory broker with the default vhost `/` and the given users: nothing survives a
    /// restart and queues are bounded by memory only.
    pub fn new(users: Users) -> Self {
        Self::with_clock(users, Arc::new(SystemClock))
    }

    /// An in-memory broker whose TTLs and expiries are measured with `clock`.
    pub fn with_clock(users: Users, clock: Arc<dyn Clock>) -> Self {
        let b = Broker {
            vhosts: RwLock::new(HashMap::new()),
            users: RwLock::new(users),
            persist: None,
            ids: Arc::new(AtomicU64::new(1)),
            clock,
            limits: Arc::default(),
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
        users: Users,
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
        let b = Broker {
            vhosts: RwLock::new(HashMap::new()),
            users: RwLock::new(users),
            persist: Some(persist.clone()),
            ids: Arc::new(AtomicU64::new(0)),
            clock: Arc::new(SystemClock),
            limits: Arc::default(),
        };
        for defs in definitions {
            let vh = b.add_vhost(get_str(&defs, "name"));
            vh.load_definitions(&defs);
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
    /// No retry of a failed save before this instant.
    defs_retry_at: parking_lot::Mutex<Option<std::time::Instant>>,
    /// Messages held by delayed-message exchanges, by due time.
    delayed: parking_lot::Mutex<delayed::Schedule>,
    /// Caps on queues, exchanges and bindings (shared with the broker).
    limits: Arc<RwLock<Limits>>,
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

/// Why a routing walk failed.
enum WalkError {
    /// A reply to the publisher (an unreadable `x-delay`).
    Broker(BrokerError),
    /// Topic matching in this exchange used up the message's budget.
    TooComplex(String),
}

impl From<BrokerError> for WalkError {
    fn from(e: BrokerError) -> Self {
        WalkError::Broker(e)
    }
}

/// What a routing walk reached.
#[derive(Default)]
struct Routed {
    /// Queues, each once.
    queues: Vec<Arc<Queue>>,
    /// The queues by address, once there are too many to look through.
    index: HashSet<usize>,
    /// Delayed-message exchanges that hold the message: (name, durable, delay in ms).
    delayed: Vec<(String, bool, u64)>,
}

impl Routed {
    fn add_queue(&mut self, q: &Arc<Queue>) {
        const LINEAR: usize = 16;
        let addr = Arc::as_ptr(q) as usize;
        if self.queues.len() < LINEAR {
            if self.queues.iter().any(|o| Arc::ptr_eq(o, q)) {
                return;
            }
        } else {
            if self.index.is_empty() {
                self.index
                    .extend(self.queues.iter().map(|o| Arc::as_ptr(o) as usize));
            }
            if !self.index.insert(addr) {
                return;
            }
        }
        self.queues.push(q.clone());
    }
}

/// The exchanges a routing walk has queued up, the first one apart (most walks visit one).
struct Seen<'a> {
    start: &'a str,
    few: Vec<&'a str>,
    many: HashSet<&'a str>,
}

impl<'a> Seen<'a> {
    fn new(start: &'a str) -> Self {
        Seen {
            start,
            few: Vec::new(),
            many: HashSet::new(),
        }
    }

    /// Records `name`; false when it was seen already.
    fn insert(&mut self, name: &'a str) -> bool {
        if name == self.start {
            return false;
        }
        if !self.many.is_empty() {
            return self.many.insert(name);
        }
        if self.few.contains(&name) {
            return false;
        }
        self.few.push(name);
        if self.few.len() > 16 {
            self.many.extend(self.few.drain(..));
        }
        true
    }
}

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
            defs_retry_at: parking_lot::Mutex::new(None),
            delayed: parking_lot::Mutex::new(delayed::Schedule::default()),
            limits: Arc::default(),
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
            .with_vhost(self.me.clone());
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

    /// Re-publishes messages that died in queue `from` to its dead-letter exchange, with
    /// RabbitMQ's `x-death` history and `x-first-death-*` / `x-last-death-*` headers. A
    /// missing dead-letter exchange drops them, as do automatic (not `rejected`) deaths that
    /// would route a message back to a queue it already died in.
    pub fn dead_letter(&self, from: &Queue, letters: Vec<DeadLetter>) {
        let Some(dlx) = from.args.dead_letter_exchange.as_deref() else {
            return;
        };
        let now_s = self.clock.now_ms() / 1000;
        for l in letters {
            let msg = dead_lettered(from, dlx, &l, now_s);
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
                    tracing::warn!(queue = %from.name, error = %e, "cannot hold dead letter in delayed exchange");
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
                tracing::warn!(queue = %from.name, error = %e, "cannot dead-letter message");
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
            return Ok(Published {
                routed: self.deliver_reply(msg),
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
                if q.args.overflow == crate::args::Overflow::RejectPublishDlx {
                    self.dead_letter(
                        q,
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

    /// Holds `msg` in delayed exchange `exchange` (durable or not) for `delay` ms. Returns
    /// true when it was written to the store as a persistent record, so that its publisher's
    /// confirm must wait for an fsync.
    fn hold(
        &self,
        exchange: &str,
        durable: bool,
        msg: &Arc<Message>,
        delay: u64,
    ) -> std::result::Result<bool, PublishError> {
        let due_ms = self.clock.now_ms().saturating_add(delay);
        let id = self.next_id();
        let (body, persisted) = match &self.persist {
            None => (Body::Memory(msg.clone()), false),
            Some(p) if durable && msg.is_persistent() => {
                let key = delayed::store_key(&self.name, exchange, due_ms);
                let loc = p
                    .store
                    .append_publish(
                        id,
                        &msg.exchange,
                        &msg.routing_key,
                        &msg.properties,
                        &msg.body,
                        self.clock.now_ms(),
                        &[&key],
                        None,
                    )
                    .map_err(|e| PublishError::StoreUnavailable(e.to_string()))?;
                (Body::Stored(loc), true)
            }
            Some(p) => match p.store.append_transient(
                id,
                &msg.exchange,
                &msg.routing_key,
                &msg.properties,
                &msg.body,
                self.clock.now_ms(),
            ) {
                Ok(loc) => (Body::Paged(loc), false),
                Err(e) => {
                    tracing::warn!(%exchange, error = %e, "cannot page delayed message out; keeping it in memory");
                    (Body::Memory(msg.clone()), false)
                }
            },
        };
        self.delayed.lock().insert(
            due_ms,
            id,
            Held {
                exchange: Arc::from(exchange),
                body,
            },
        );
        Ok(persisted)
    }

    /// Messages held by delayed-message exchanges of this vhost.
    pub fn delayed_count(&self) -> usize {
        self.delayed.lock().len()
    }

    /// Routes the held messages whose delay is over, a bounded batch per call.
    fn release_delayed(&self) {
        let now = self.clock.now_ms();
        let due = self.delayed.lock().take_due(now, delayed::RELEASE_BATCH);
        let mut due = due.into_iter();
        while let Some(((due_ms, id), held)) = due.next() {
            if let Err(held) = self.release(due_ms, id, held) {
                // The store refuses writes: put this one and the rest back for a later sweep.
                let mut schedule = self.delayed.lock();
                schedule.insert(due_ms, id, held);
                for ((due_ms, id), held) in due {
                    schedule.insert(due_ms, id, held);
                }
                return;
            }
        }
    }

    /// Routes one held message from its delayed exchange (once: if nothing matches, it is
    /// gone, as with the plugin), then lets go of the held copy. Gives it back when the store
    /// cannot take the routed copy now.
    fn release(&self, due_ms: u64, id: u64, held: Held) -> std::result::Result<(), Held> {
        let store = self.persist.as_ref().map(|p| &p.store);
        let msg = match &held.body {
            Body::Memory(m) => Some(m.clone()),
            Body::Paged(loc) | Body::Stored(loc) => match store.map(|s| s.read(*loc)) {
                Some(Ok(m)) => Some(Arc::new(Message::new(
                    m.exchange,
                    m.routing_key,
                    m.properties,
                    m.body,
                ))),
                Some(Err(e)) => {
                    tracing::warn!(exchange = %held.exchange, error = %e, "dropping unreadable delayed message");
                    None
                }
                None => None,
            },
        };
        if let Some(msg) = msg {
            let delay = delayed::delay_of(msg.properties.headers.as_ref())
                .ok()
                .flatten()
                .unwrap_or(0);
            let released = Arc::new(delayed::released(&msg, delay));
            match self.dispatch(&held.exchange, released, None, false) {
                Ok(_) => {}
                Err(PublishError::StoreUnavailable(_)) => return Err(held),
                Err(PublishError::Broker(e)) => {
                    tracing::debug!(exchange = %held.exchange, error = %e, "delayed message not routed");
                }
            }
        }
        if let Some(s) = store {
            match held.body {
                Body::Paged(loc) => s.release(loc),
                Body::Stored(loc) => {
                    s.ack(
                        &delayed::store_key(&self.name, &held.exchange, due_ms),
                        id,
                        loc,
                    );
                }
                Body::Memory(_) => {}
            }
        }
        Ok(())
    }

    /// True when `exchange` is a durable delayed-message exchange (whose persistent held
    /// messages are recovered).
    fn holds_durably(&self, exchange: &str) -> bool {
        self.topology
            .read()
            .exchanges
            .get(exchange)
            .is_some_and(|x| x.durable && x.kind == ExchangeKind::DelayedMessage)
    }

    /// Re-arms persistent messages that `exchange` held until `due_ms` before a restart
    /// (released on the first sweep when already due).
    fn recover_delayed(
        &self,
        exchange: &str,
        due_ms: u64,
        entries: &[warren_store::RecoveredEntry],
    ) {
        let exchange: Arc<str> = Arc::from(exchange);
        let mut schedule = self.delayed.lock();
        for e in entries {
            schedule.insert(
                due_ms,
                e.id,
                Held {
                    exchange: exchange.clone(),
                    body: Body::Stored(e.location),
                },
            );
        }
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
                stored: false,
                pressured: None,
                rejected,
            });
        }
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
        for q in queues {
            let stored = if q.store().is_some() { location } else { None };
            if q.publish(msg.clone(), id, stored) && pressured.is_none() {
                pressured = Some(q);
            }
        }
        Ok(Published {
            routed: true,
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

    /// Stores this vhost's durable definitions as they are in `topo` (called with the topology
    /// write lock held, so saves happen in the order of the changes).
    ///
    /// Errors: the I/O error. A change a client asked for is then rolled back and refused; one
    /// the broker made itself (auto-delete, expiry) stays, and the definitions are marked
    /// dirty so that [`VHost::sweep`] writes them again until a save succeeds. Either way the
    /// file may hold the old or the new version, so the next save rewrites it from memory.
    fn save(&self, topo: &Topology) -> std::io::Result<()> {
        let Some(p) = &self.persist else {
            return Ok(());
        };
        match p.save_definitions(&self.name, &topo.snapshot(&self.name)) {
            Ok(()) => {
                if self.defs_dirty.swap(false, Ordering::Relaxed) {
                    tracing::info!(vhost = %self.name, "durable definitions stored again");
                }
                Ok(())
            }
            Err(e) => {
                if !self.defs_dirty.swap(true, Ordering::Relaxed) {
                    tracing::error!(
                        vhost = %self.name,
                        error = %e,
                        "cannot store durable definitions; changes that need it are refused, \
                         and the save is retried every second"
                    );
                }
                Err(e)
            }
        }
    }

    /// Writes the definitions again after a failed save, at most once a second.
    fn retry_save(&self) {
        if !self.defs_dirty.load(Ordering::Relaxed) {
            return;
        }
        let now = std::time::Instant::now();
        {
            let mut at = self.defs_retry_at.lock();
            if at.is_some_and(|t| now < t) {
                return;
            }
            *at = Some(now + std::time::Duration::from_secs(1));
        }
        let topo = self.topology.write();
        if let Err(e) = self.save(&topo) {
            tracing::debug!(vhost = %self.name, error = %e, "durable definitions still not stored");
        }
    }

    fn load_definitions(&self, defs: &FieldTable) {
        let mut topo = self.topology.write();
        let list = |k: &str| -> Vec<FieldTable> {
            defs.get(k)
                .and_then(|v| v.as_array())
                .map(|a| a.iter().filter_map(|v| v.as_table().cloned()).collect())
                .unwrap_or_default()
        };
        for x in list("exchanges") {
            let name = get_str(&x, "name").to_string();
            let Some(kind) = ExchangeKind::parse(get_str(&x, "type")) else {
                continue;
            };
            topo.exchanges.entry(name.clone()).or_insert_with(|| {
                Exchange::new(
                    name,
                    kind,
                    true,
                    get_bool(&x, "auto_delete"),
                    get_bool(&x, "internal"),
                    get_table(&x, "arguments"),
                )
            });
        }
        for q in list("queues") {
            let name = get_str(&q, "name").to_string();
            let queue = self.new_queue(Queue::new(
                name.clone(),
                self.name.clone(),
                true,
                None,
                get_bool(&q, "auto_delete"),
                get_table(&q, "arguments"),
            ));
            topo.queues.insert(name, Arc::new(queue));
        }
        for b in list("bindings") {
            let dest_name = get_str(&b, "destination").to_string();
            let destination = if get_str(&b, "destination_type") == "exchange" {
                Destination::Exchange(dest_name)
            } else {
                Destination::Queue(dest_name)
            };
            if let Some(x) = topo.exchanges.get_mut(get_str(&b, "source")) {
                let added = x.bind(Binding {
                    destination,
                    routing_key: get_str(&b, "routing_key").to_string(),
                    arguments: get_table(&b, "arguments"),
                });
                topo.bindings += usize::from(added);
            }
        }
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
        if d.name.starts_with("amq.") && !self.exchange_exists(&d.name) {
            return Err(BrokerError::access_refused(format!(
                "exchange name '{}' contains reserved prefix 'amq.*'",
                d.name
            )));
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
        topo.exchanges.insert(
            d.name.clone(),
            Exchange::new(
                d.name.clone(),
                kind,
                d.durable,
                d.auto_delete,
                d.internal,
                d.arguments.clone(),
            ),
        );
        if d.durable {
            if let Err(e) = self.save(&topo) {
                topo.exchanges.remove(&d.name);
                return Err(not_stored(
                    format!("failed to declare {}", self.exchange_resource(&d.name)),
                    &e,
                ));
            }
        }
        Ok(())
    }

    /// exchange.delete. Deleting a missing exchange succeeds, as in RabbitMQ. Errors: 403 for the
    /// default exchange and `amq.` exchanges, 406 with `if_unused` when it is a binding source.
    /// A deleted delayed-message exchange drops the messages it holds.
    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> Result<()> {
        if name.is_empty() {
            return Err(default_exchange_refused());
        }
        if name.starts_with("amq.") {
            return Err(BrokerError::access_refused(format!(
                "deletion of system {} not allowed",
                self.exchange_resource(name)
            )));
        }
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
            if let Err(e) = self.save(&topo) {
                topo.rollback(undo);
                return Err(not_stored(
                    format!("failed to delete {}", self.exchange_resource(name)),
                    &e,
                ));
            }
        }
        if delayed {
            // Under the topology lock, so that a new exchange of the same name cannot have
            // held anything yet.
            self.drop_held(name);
        }
        Ok(())
    }

    /// Lets go of the messages a deleted delayed exchange held.
    fn drop_held(&self, exchange: &str) {
        let gone = self.delayed.lock().remove_exchange(exchange);
        let Some(p) = &self.persist else {
            return;
        };
        for ((due_ms, id), held) in gone {
            match held.body {
                Body::Paged(loc) => p.store.release(loc),
                Body::Stored(loc) => {
                    p.store
                        .ack(&delayed::store_key(&self.name, exchange, due_ms), id, loc)
                }
                Body::Memory(_) => {}
            }
        }
    }

    /// True when the exchange exists.
    pub fn exchange_exists(&self, name: &str) -> bool {
        self.topology.read().exchanges.contains_key(name)
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
        let name = if d.name.is_empty() {
            names::queue_name()
        } else {
            if d.name.starts_with("amq.") {
                return Err(BrokerError::access_refused(format!(
                    "queue name '{}' contains reserved prefix 'amq.*'",
                    d.name
                )));
            }
            d.name.clone()
        };
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
        topo.queues.insert(name.clone(), q.clone());
        if topo.queue_is_durable(&name) {
            if let Err(e) = self.save(&topo) {
                topo.queues.remove(&name);
                return Err(not_stored(
                    format!("failed to declare {}", self.queue_resource(&name)),
                    &e,
                ));
            }
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
                if let Err(e) = self.save(&topo) {
                    topo.rollback(undo);
                    return Err(not_stored(
                        format!("failed to delete {}", q.resource_name()),
                        &e,
                    ));
                }
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
                        let _ = self.save(&topo);
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
            if let Err(e) = self.save(&topo) {
                if let Some(x) = topo.exchanges.get_mut(source) {
                    x.unbind(&binding);
                    topo.bindings -= 1;
                }
                return Err(not_stored(
                    format!(
                        "could not create binding from {} to {}",
                        self.exchange_resource(source),
                        self.destination_resource(&destination)
                    ),
                    &e,
                ));
            }
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
            if let Err(e) = self.save(&topo) {
                topo.rollback(undo);
                return Err(not_stored(
                    format!(
                        "could not delete binding from {} to {}",
                        self.exchange_resource(source),
                        self.destination_resource(&destination)
                    ),
                    &e,
                ));
            }
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

    /// Routes a basic.publish: fills `out` with each queue the message goes to, once.
    ///
    /// The message is routed with `routing_key` and the keys of its `CC` and `BCC` headers
    /// (sender-selected distribution), through exchange-to-exchange bindings and alternate
    /// exchanges as [`Topology::walk`] describes; delayed-message exchanges that would hold it
    /// contribute nothing. Errors: 404 for a missing exchange, 403 for an internal one, 406
    /// for `CC` / `BCC` headers that are not arrays or an unreadable `x-delay`.
    pub fn route(
        &self,
        exchange: &str,
        routing_key: &str,
        headers: Option<&FieldTable>,
        out: &mut Vec<Arc<Queue>>,
    ) -> Result<()> {
        let sender_keys = SenderKeys::from_headers(headers).map_err(|reason| {
            BrokerError::precondition_failed(format!("invalid message: {reason}"))
        })?;
        let mut routed = Routed::default();
        self.route_inner(
            exchange,
            &sender_keys.all(routing_key),
            headers,
            true,
            &mut routed,
        )?;
        for q in routed.queues {
            if !out.iter().any(|o| Arc::ptr_eq(o, &q)) {
                out.push(q);
            }
        }
        Ok(())
    }

    /// [`VHost::route`] with the routing keys given; dead-lettering and releasing delayed
    /// messages may go through an internal exchange.
    fn route_inner(
        &self,
        exchange: &str,
        keys: &[&str],
        headers: Option<&FieldTable>,
        refuse_internal: bool,
        out: &mut Routed,
    ) -> Result<()> {
        let topo = self.topology.read();
        if exchange.is_empty() {
            // The default exchange: each key names a queue.
            for key in keys {
                if let Some(q) = topo.queues.get(*key) {
                    out.add_queue(q);
                }
            }
            return Ok(());
        }
        let x = topo
            .exchanges
            .get(exchange)
            .ok_or_else(|| self.no_exchange(exchange))?;
        if x.internal && refuse_internal {
            return Err(BrokerError::access_refused(format!(
                "cannot publish to internal {}",
                self.exchange_resource(exchange)
            )));
        }
        let budget = self.limits.read().topic_budget();
        topo.walk(x, keys, headers, budget, out)
            .map_err(|e| match e {
                WalkError::Broker(e) => e,
                WalkError::TooComplex(through) => BrokerError::precondition_failed(format!(
                "cannot route message through {}: topic matching needs more than {budget} steps",
                self.exchange_resource(&through)
            )),
            })
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

    /// The durable definitions of this vhost as a field table: `name`, `exchanges` (user
    /// exchanges only; the standard ones always exist), `queues` and `bindings`.
    fn snapshot(&self, vhost: &str) -> FieldTable {
        let mut exchanges = Vec::new();
        let mut bindings = Vec::new();
        let mut xs: Vec<&Exchange> = self.exchanges.values().filter(|x| x.durable).collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in xs {
            if !x.name.is_empty() && !x.name.starts_with("amq.") {
                let mut t = FieldTable::new();
                t.insert("name", s(&x.name));
                t.insert("type", s(x.kind.as_str()));
                t.insert("auto_delete", FieldValue::Bool(x.auto_delete));
                t.insert("internal", FieldValue::Bool(x.internal));
                t.insert("arguments", FieldValue::Table(x.arguments.clone()));
                exchanges.push(FieldValue::Table(t));
            }
            for b in x.bindings() {
                if !self.destination_is_durable(&b.destination) {
                    continue;
                }
                let mut t = FieldTable::new();
                t.insert("source", s(&x.name));
                t.insert("destination", s(b.destination.name()));
                let kind = match b.destination {
                    Destination::Queue(_) => "queue",
                    Destination::Exchange(_) => "exchange",
                };
                t.insert("destination_type", s(kind));
                t.insert("routing_key", s(&b.routing_key));
                t.insert("arguments", FieldValue::Table(b.arguments.clone()));
                bindings.push(FieldValue::Table(t));
            }
        }
        let mut qs: Vec<&Arc<Queue>> = self
            .queues
            .values()
            .filter(|q| q.durable && q.exclusive_owner.is_none())
            .collect();
        qs.sort_by(|a, b| a.name.cmp(&b.name));
        let queues = qs
            .into_iter()
            .map(|q| {
                let mut t = FieldTable::new();
                t.insert("name", s(&q.name));
                t.insert("auto_delete", FieldValue::Bool(q.auto_delete));
                t.insert("arguments", FieldValue::Table(q.arguments.clone()));
                FieldValue::Table(t)
            })
            .collect();
        let mut t = FieldTable::new();
        t.insert("name", s(vhost));
        t.insert("exchanges", FieldValue::Array(exchanges));
        t.insert("queues", FieldValue::Array(queues));
        t.insert("bindings", FieldValue::Array(bindings));
        t
    }

    /// RabbitMQ's routing walk (`rabbit_exchange:route`): starting at `start`, each exchange
    /// reached routes the message in turn, every exchange at most once (so binding cycles
    /// end). Alternate exchanges are decided per exchange visited: one whose own bindings give
    /// no destination at all (queue or exchange) passes the message to its
    /// `alternate-exchange`, wherever it sits in the walk. A delayed-message exchange that
    /// must hold the message routes it nowhere now and is recorded in `out.delayed` (without
    /// trying its alternate exchange; see [`crate::delayed`]).
    ///
    /// Errors: 406 for an `x-delay` header a delayed exchange cannot read; the name of the
    /// topic exchange where the walk used up its `budget` of trie nodes.
    fn walk<'a>(
        &'a self,
        start: &'a Exchange,
        keys: &[&str],
        headers: Option<&FieldTable>,
        mut budget: usize,
        out: &mut Routed,
    ) -> std::result::Result<(), WalkError> {
        let mut work: Vec<&'a Exchange> = vec![start];
        let mut seen = Seen::new(&start.name);
        while let Some(x) = work.pop() {
            if x.kind == ExchangeKind::DelayedMessage {
                if let Some(delay) = delayed::delay_of(headers)? {
                    if !out.delayed.iter().any(|(n, _, _)| *n == x.name) {
                        out.delayed.push((x.name.clone(), x.durable, delay));
                    }
                    continue;
                }
            }
            let mut any = false;
            let complete = x.route_keys(keys, headers, &mut budget, &mut |d| {
                any = true;
                match d {
                    Destination::Queue(name) => {
                        if let Some(q) = self.queues.get(name) {
                            out.add_queue(q);
                        }
                    }
                    Destination::Exchange(name) => {
                        if let Some(e) = self.exchanges.get(name) {
                            if seen.insert(&e.name) {
                                work.push(e);
                            }
                        }
                    }
                }
            });
            if !complete {
                return Err(WalkError::TooComplex(x.name.clone()));
            }
            if !any {
                if let Some(ae) = x.alternate_exchange().and_then(|n| self.exchanges.get(n)) {
                    if seen.insert(&ae.name) {
                        work.push(ae);
                    }
                }
            }
        }
        Ok(())
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
                Removed::Exchange(x) => {
                    self.bindings += x.bindings().len();
                    self.exchanges.insert(x.name.clone(), x);
                }
                Removed::Binding(source, b) => {
                    if let Some(x) = self.exchanges.get_mut(&source) {
                        self.bindings += usize::from(x.bind(b));
                    }
                }
                Removed::Queue(q) => {
                    self.queues.insert(q.name.clone(), q);
                }
            }
        }
    }
}

/// What a topology change removed, so that it can be put back when the change cannot be
/// stored.
#[derive(Default)]
struct Undo {
    steps: Vec<Removed>,
    /// Something durable was removed: the definitions must be saved.
    durable: bool,
}

enum Removed {
    Exchange(Exchange),
    /// A binding removed from the named source exchange.
    Binding(String, Binding),
    Queue(Arc<Queue>),
}

/// 541 INTERNAL_ERROR for a topology change refused because the definitions could not be
/// stored: RabbitMQ answers a metadata store failure (a Khepri timeout) with this code and a
/// text such as `failed to declare exchange 'x' in vhost '/' because the operation timed out`.
fn not_stored(what: String, e: &std::io::Error) -> BrokerError {
    BrokerError::internal(format!(
        "{what} because the definitions could not be stored: {e}"
    ))
}

/// The copy of a dead letter that goes to the dead-letter exchange `dlx`: routed with the
/// queue's `x-dead-letter-routing-key` or its original routing key, its `x-death` history
/// updated (entries per queue and reason, most recent first), its `expiration` moved to the
/// entry's `original-expiration`.
///
/// Without `x-dead-letter-routing-key` the copy is routed with all the keys the message had
/// (its routing key, `CC` and `BCC` keys); with one, with that key alone. The entry's
/// `routing-keys` are the routing key and `CC` keys (RabbitMQ 4.x `mc:record_death`).
fn dead_lettered(from: &Queue, dlx: &str, l: &DeadLetter, now_s: u64) -> Arc<Message> {
    let m = &l.message;
    let reason = l.reason.as_str();
    let sender_keys = m.sender_keys();
    let routing_key = from
        .args
        .dead_letter_routing_key
        .clone()
        .unwrap_or_else(|| m.routing_key.clone());
    let copy_keys = match from.args.dead_letter_routing_key {
        Some(_) => SenderKeys::default(),
        None => sender_keys.clone(),
    };
    let mut props = m.properties.clone();
    let mut headers = props.headers.take().unwrap_or_default();
    let mut deaths: Vec<FieldValue> = headers
        .get("x-death")
        .and_then(|v| v.as_array())
        .map(<[FieldValue]>::to_vec)
        .unwrap_or_default();
    let same = |d: &FieldValue| {
        d.as_table().is_some_and(|t| {
            t.get("queue").and_then(|v| v.as_str()) == Some(from.name.as_str())
                && t.get("reason").and_then(|v| v.as_str()) == Some(reason)
        })
    };
    let entry = match deaths.iter().position(same) {
        Some(i) => {
            let mut t = deaths.remove(i).as_table().cloned().unwrap_or_default();
            let count = t.get("count").and_then(|v| v.as_i64()).unwrap_or(0);
            // `time` stays the time of the first death (RabbitMQ 4.x); the entry is written
            // in RabbitMQ's field order.
            t.insert("count", FieldValue::I64(count + 1));
            let mut ordered = FieldTable::new();
            for key in [
                "original-expiration",
                "count",
                "reason",
                "queue",
                "time",
                "exchange",
                "routing-keys",
            ] {
                if let Some(v) = t.remove(key) {
                    ordered.insert(key, v);
                }
            }
            ordered.0.append(&mut t.0);
            ordered
        }
        None => {
            let mut t = FieldTable::new();
            if let Some(e) = &props.expiration {
                t.insert(
                    "original-expiration",
                    FieldValue::LongString(bytes::Bytes::copy_from_slice(e)),
                );
            }
            t.insert("count", FieldValue::I64(1));
            t.insert("reason", s(reason));
            t.insert("queue", s(&from.name));
            t.insert("time", FieldValue::Timestamp(now_s));
            t.insert("exchange", s(&m.exchange));
            let keys = sender_keys.death_keys(&m.routing_key);
            t.insert(
                "routing-keys",
                FieldValue::Array(keys.iter().map(|k| s(k)).collect()),
            );
            t
        }
    };
    props.expiration = None;
    deaths.insert(0, FieldValue::Table(entry));
    headers.insert("x-death", FieldValue::Array(deaths));
    if headers.get("x-first-death-reason").is_none() {
        headers.insert("x-first-death-reason", s(reason));
        headers.insert("x-first-death-queue", s(&from.name));
        headers.insert("x-first-death-exchange", s(&m.exchange));
    }
    headers.insert("x-last-death-reason", s(reason));
    headers.insert("x-last-death-queue", s(&from.name));
    headers.insert("x-last-death-exchange", s(&m.exchange));
    // RabbitMQ 4.x hands out a dead-lettered message's headers sorted by name.
    headers.0.sort_by(|a, b| a.0.cmp(&b.0));
    props.headers = Some(headers);
    let mut copy = Message::new(dlx.to_string(), routing_key, props, m.body.clone());
    copy.sender_keys = Some(Arc::new(copy_keys));
    Arc::new(copy)
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

fn default_exchange_refused() -> BrokerError {
    BrokerError::access_refused("operation not permitted on the default exchange")
}

fn check_field<T: PartialEq + std::fmt::Display>(
    what: &str,
    field: &str,
    current: T,
    received: T,
) -> Result<()> {
    if current == received {
        return Ok(());
    }
    Err(BrokerError::precondition_failed(format!(
        "inequivalent arg '{field}' for {what}: received '{received}' but current is '{current}'"
    )))
}

fn check_args(
    what: &str,
    current: &FieldTable,
    received: &FieldTable,
    keys: &[&str],
) -> Result<()> {
    for key in keys {
        let (c, r) = (current.get(key), received.get(key));
        let same = match (c, r) {
            (None, None) => true,
            (Some(a), Some(b)) => a == b || (a.as_i64().is_some() && a.as_i64() == b.as_i64()),
            // A classic queue may or may not carry `x-queue-type: classic`.
            (None, Some(v)) | (Some(v), None) => {
                *key == "x-queue-type" && v.as_str() == Some("classic")
            }
        };
        if !same {
            // RabbitMQ (rabbit_misc:assert_args_equivalence) shows plain values when both
            // sides have the argument, and the value with its type against `none` otherwise.
            let (shown_r, shown_c) = match (r, c) {
                (Some(r), Some(c)) => (
                    format!("'{}'", arg_type_and_value(r).1),
                    format!("'{}'", arg_type_and_value(c).1),
                ),
                _ => (describe_arg(r), describe_arg(c)),
            };
            return Err(BrokerError::precondition_failed(format!(
                "inequivalent arg '{key}' for {what}: received {shown_r} but current is {shown_c}"
            )));
        }
    }
    Ok(())
}

/// RabbitMQ's type name for a field value and the value as its error texts show it.
fn arg_type_and_value(v: &FieldValue) -> (&'static str, String) {
    match v {
        FieldValue::Bool(b) => ("bool", b.to_string()),
        FieldValue::I8(i) => ("byte", i.to_string()),
        FieldValue::U8(i) => ("unsignedbyte", i.to_string()),
        FieldValue::I16(i) => ("short", i.to_string()),
        FieldValue::U16(i) => ("unsignedshort", i.to_string()),
        FieldValue::I32(i) => ("signedint", i.to_string()),
        FieldValue::U32(i) => ("unsignedint", i.to_string()),
        FieldValue::I64(i) => ("long", i.to_string()),
        FieldValue::F32(f) => ("float", f.to_string()),
        FieldValue::F64(f) => ("double", f.to_string()),
        FieldValue::Decimal { scale, value } => ("decimal", format!("{value}e-{scale}")),
        FieldValue::LongString(b) => ("longstr", String::from_utf8_lossy(b).into_owned()),
        FieldValue::ByteArray(b) => ("binary", format!("{b:?}")),
        FieldValue::Array(a) => ("array", format!("{a:?}")),
        FieldValue::Timestamp(t) => ("timestamp", t.to_string()),
        FieldValue::Table(t) => ("table", format!("{t:?}")),
        FieldValue::Void => ("void", "void".into()),
    }
}

/// RabbitMQ's wording for an argument value in inequivalence errors when only one side has
/// it: `the value '2000' of type 'signedint'`, or `none`.
fn describe_arg(v: Option<&FieldValue>) -> String {
    let Some(v) = v else {
        return "none".into();
    };
    let (ty, shown) = arg_type_and_value(v);
    format!("the value '{shown}' of type '{ty}'")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qd(name: &str) -> QueueDeclare {
        QueueDeclare {
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn declare_equivalence() {
        let v = VHost::new("/");
        v.declare_queue(&qd("q"), 1).unwrap();
        let err = v
            .declare_queue(
                &QueueDeclare {
                    durable: true,
                    ..qd("q")
                },
                1,
            )
            .unwrap_err();
        assert_eq!(err.code, 406);
        assert_eq!(
            err.text,
            "inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'"
        );
        let mut args = FieldTable::new();
        args.insert("x-message-ttl", FieldValue::I32(2000));
        let err = v
            .declare_queue(
                &QueueDeclare {
                    arguments: args,
                    ..qd("q")
                },
                1,
            )
            .unwrap_err();
        assert_eq!(
            err.text,
            "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '2000' of type 'signedint' but current is none"
        );
        // Unknown arguments are not compared.
        let mut args = FieldTable::new();
        args.insert("x-custom", FieldValue::I32(1));
        assert!(v
            .declare_queue(
                &QueueDeclare {
                    arguments: args,
                    ..qd("q")
                },
                1
            )
            .is_ok());
    }

    fn clocked() -> (Arc<crate::clock::ManualClock>, Arc<VHost>) {
        let clock = Arc::new(crate::clock::ManualClock::new(1_000_000));
        let b = Broker::with_clock(Users::new(), clock.clone());
        let v = b.vhost("/").unwrap();
        (clock, v)
    }

    fn declare_with(v: &VHost, name: &str, pairs: &[(&str, FieldValue)]) -> Arc<Queue> {
        v.declare_queue(
            &QueueDeclare {
                arguments: pairs.iter().cloned().collect(),
                ..qd(name)
            },
            1,
        )
        .unwrap()
        .0
    }

    fn text(v: &str) -> FieldValue {
        FieldValue::LongString(bytes::Bytes::copy_from_slice(v.as_bytes()))
    }

    fn send(v: &VHost, key: &str, body: &'static [u8]) {
        let m = Message::new(
            String::new(),
            key.into(),
            Default::default(),
            bytes::Bytes::from_static(body),
        );
        v.publish(Arc::new(m), None).unwrap();
    }

    #[test]
    fn message_ttl_follows_the_clock() {
        let (clock, v) = clocked();
        let q = declare_with(&v, "t", &[("x-message-ttl", FieldValue::I32(1000))]);
        send(&v, "t", b"a");
        clock.advance(999);
        v.sweep();
        assert_eq!(q.counts().ready, 1);
        clock.advance(1);
        v.sweep();
        assert_eq!(q.counts().ready, 0);
    }

    #[test]
    fn queue_expires_when_unused() {
        let (clock, v) = clocked();
        declare_with(&v, "e", &[("x-expires", FieldValue::I32(100))]);
        clock.advance(60);
        // A redeclare restarts the timer.
        declare_with(&v, "e", &[("x-expires", FieldValue::I32(100))]);
        clock.advance(60);
        v.sweep();
        assert!(v.queue("e", 1).is_ok());
        clock.advance(40);
        v.sweep();
        assert_eq!(v.queue("e", 1).unwrap_err().code, 404);
    }

    #[test]
    fn expiry_cycles_are_dropped_but_rejections_cycle() {
        let (clock, v) = clocked();
        // "loop" dead-letters to itself through the default exchange.
        let q = declare_with(
            &v,
            "loop",
            &[
                ("x-message-ttl", FieldValue::I32(10)),
                ("x-dead-letter-exchange", text("")),
            ],
        );
        send(&v, "loop", b"x");
        clock.advance(10);
        v.sweep();
        assert_eq!(q.counts().ready, 0, "an expiry cycle drops the message");
        send(&v, "loop", b"y");
        let (m, _) = q.get(false).unwrap();
        q.settle(
            0,
            vec![crate::queue::Settlement {
                consumer_tag: None,
                message: m,
                requeue: false,
                rejected: true,
            }],
        );
        let (m, _) = q.get(true).expect("a rejected message comes back");
        let h = m.message.properties.headers.as_ref().unwrap();
        assert_eq!(
            h.get("x-first-death-reason").and_then(|v| v.as_str()),
            Some("rejected")
        );
        let deaths = h.get("x-death").and_then(|v| v.as_array()).unwrap();
        assert_eq!(deaths.len(), 1);
        // A second death for the same queue and reason counts up in the same entry.
        send(&v, "loop", b"z");
        for _ in 0..2 {
            let (m, _) = q.get(false).unwrap();
            q.settle(
                0,
                vec![crate::queue::Settlement {
                    consumer_tag: None,
                    message: m,
                    requeue: false,
                    rejected: true,
                }],
            );
        }
        let (twice, _) = q.get(true).unwrap();
        assert!(q.get(true).is_none());
        let count = |m: &crate::message::QueuedMessage| {
            let h = m.message.properties.headers.as_ref().unwrap();
            let d = h.get("x-death").and_then(|v| v.as_array()).unwrap();
            d[0].as_table()
                .unwrap()
                .get("count")
                .and_then(|v| v.as_i64())
        };
        assert_eq!(count(&twice), Some(2));
    }

    fn requeue(q: &Arc<Queue>, m: QueuedMessage) {
        q.settle(
            0,
            vec![crate::queue::Settlement {
                consumer_tag: None,
                message: m,
                requeue: true,
                rejected: false,
            }],
        );
    }

    fn bodies(q: &Queue) -> Vec<String> {
        std::iter::from_fn(|| q.get(true))
            .map(|(m, _)| String::from_utf8_lossy(&m.message.body).into_owned())
            .collect()
    }

    #[test]
    fn requeue_respects_length_limits() {
        // RabbitMQ 3.10.8: x-max-length 2, publish a b, get a, publish c, nack a with requeue:
        // drop-head keeps [b, c] and dead-letters a (maxlen); reject-publish keeps [a, b, c].
        for (overflow, kept, dead) in [
            ("drop-head", vec!["b", "c"], vec!["a"]),
            ("reject-publish", vec!["a", "b", "c"], vec![]),
            ("reject-publish-dlx", vec!["a", "b", "c"], vec![]),
        ] {
            let (_, v) = clocked();
            let dlq = declare_with(&v, "dlq", &[]);
            let q = declare_with(
                &v,
                "limited",
                &[
                    ("x-max-length", FieldValue::I32(2)),
                    ("x-overflow", text(overflow)),
                    ("x-dead-letter-exchange", text("")),
                    ("x-dead-letter-routing-key", text("dlq")),
                ],
            );
            send(&v, "limited", b"a");
            send(&v, "limited", b"b");
            let (a, _) = q.get(false).unwrap();
            send(&v, "limited", b"c");
            requeue(&q, a);
            assert_eq!(bodies(&q), kept, "{overflow}");
            let dl: Vec<(String, String)> = std::iter::from_fn(|| dlq.get(true))
                .map(|(m, _)| {
                    let h = m.message.properties.headers.clone().unwrap_or_default();
                    let reason = h
                        .get("x-first-death-reason")
                        .and_then(|v| v.as_str())
                        .unwrap_or_default()
                        .to_string();
                    (
                        String::from_utf8_lossy(&m.message.body).into_owned(),
                        reason,
                    )
                })
                .collect();
            let want: Vec<(String, String)> = dead
                .iter()
                .map(|b| (b.to_string(), "maxlen".to_string()))
                .collect();
            assert_eq!(dl, want, "{overflow}");
        }
    }

    #[test]
    fn requeue_respects_byte_limits() {
        let (_, v) = clocked();
        let q = declare_with(&v, "bytes", &[("x-max-length-bytes", FieldValue::I32(2))]);
        send(&v, "bytes", b"a");
        send(&v, "bytes", b"b");
        let (a, _) = q.get(false).unwrap();
        let (b, _) = q.get(false).unwrap();
        send(&v, "bytes", b"c");
        // Both come back (recover, channel close): the head goes until 2 bytes remain.
        q.settle(
            0,
            [a, b]
                .into_iter()
                .map(|m| crate::queue::Settlement {
                    consumer_tag: None,
                    message: m,
                    requeue: true,
                    rejected: false,
                })
                .collect(),
        );
        assert_eq!(bodies(&q), vec!["b", "c"]);
    }

    #[test]
    fn exclusive_queues_are_never_durable() {
        let v = VHost::new("/");
        let (q, _) = v
            .declare_queue(
                &QueueDeclare {
                    exclusive: true,
                    durable: true,
                    ..qd("ex")
                },
                1,
            )
            .unwrap();
        assert!(!q.durable);
        // Redeclaring with either durable flag is equivalent.
        for durable in [false, true] {
            v.declare_queue(
                &QueueDeclare {
                    exclusive: true,
                    durable,
                    ..qd("ex")
                },
                1,
            )
            .unwrap();
        }
        assert!(v
            .topology
            .read()
            .snapshot("/")
            .get("queues")
            .and_then(|q| q.as_array())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn default_exchange_cannot_be_declared_even_passively() {
        let v = VHost::new("/");
        for passive in [true, false] {
            let e = v
                .declare_exchange(&ExchangeDeclare {
                    name: String::new(),
                    kind: "direct".into(),
                    passive,
                    ..Default::default()
                })
                .unwrap_err();
            assert_eq!(e.code, 403);
            assert_eq!(e.text, "operation not permitted on the default exchange");
        }
    }

    #[test]
    fn exclusive_queues_are_locked() {
        let v = VHost::new("/");
        v.declare_queue(
            &QueueDeclare {
                exclusive: true,
                ..qd("ex")
            },
            1,
        )
        .unwrap();
        assert_eq!(v.queue("ex", 2).unwrap_err().code, 405);
        assert_eq!(v.declare_queue(&qd("ex"), 2).unwrap_err().code, 405);
        assert!(v.queue("ex", 1).is_ok());
        v.remove_exclusive_queues(1);
        assert_eq!(v.queue("ex", 1).unwrap_err().code, 404);
    }

    #[test]
    fn routing_through_exchanges_and_alternate() {
        let v = VHost::new("/");
        for q in ["a", "b", "alt"] {
            v.declare_queue(&qd(q), 1).unwrap();
        }
        let mut args = FieldTable::new();
        args.insert(
            "alternate-exchange",
            FieldValue::LongString(bytes::Bytes::from_static(b"ae")),
        );
        v.declare_exchange(&ExchangeDeclare {
            name: "x".into(),
            kind: "direct".into(),
            arguments: args,
            ..Default::default()
        })
        .unwrap();
        v.declare_exchange(&ExchangeDeclare {
            name: "ae".into(),
            kind: "fanout".into(),
            ..Default::default()
        })
        .unwrap();
        v.declare_exchange(&ExchangeDeclare {
            name: "t".into(),
            kind: "topic".into(),
            ..Default::default()
        })
        .unwrap();
        let none = FieldTable::new();
        v.bind("x", Destination::Queue("a".into()), "k", &none, 1)
            .unwrap();
        v.bind("x", Destination::Exchange("t".into()), "k", &none, 1)
            .unwrap();
        v.bind("t", Destination::Queue("b".into()), "#", &none, 1)
            .unwrap();
        v.bind("t", Destination::Exchange("x".into()), "#", &none, 1)
            .unwrap(); // cycle
        v.bind("ae", Destination::Queue("alt".into()), "", &none, 1)
            .unwrap();
        let names = |key: &str| {
            let mut out = Vec::new();
            v.route("x", key, None, &mut out).unwrap();
            out.iter().map(|q| q.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names("k"), vec!["a", "b"]);
        assert_eq!(names("other"), vec!["alt"]);
        let mut out = Vec::new();
        assert_eq!(v.route("nope", "k", None, &mut out).unwrap_err().code, 404);
    }

    #[test]
    fn auto_delete_exchange_goes_with_last_binding() {
        let v = VHost::new("/");
        v.declare_queue(&qd("q"), 1).unwrap();
        v.declare_exchange(&ExchangeDeclare {
            name: "ad".into(),
            kind: "fanout".into(),
            auto_delete: true,
            ..Default::default()
        })
        .unwrap();
        v.bind(
            "ad",
            Destination::Queue("q".into()),
            "",
            &FieldTable::new(),
            1,
        )
        .unwrap();
        v.delete_queue("q", false, false, 1).unwrap();
        assert!(!v.exchange_exists("ad"));
    }

    #[test]
    fn reserved_names_and_default_exchange() {
        let v = VHost::new("/");
        let e = v
            .declare_exchange(&ExchangeDeclare {
                name: "amq.foo".into(),
                kind: "direct".into(),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(v.declare_queue(&qd("amq.q"), 1).unwrap_err().code, 403);
        assert_eq!(v.delete_exchange("", false).unwrap_err().code, 403);
        let e = v
            .declare_exchange(&ExchangeDeclare {
                name: "x".into(),
                kind: "nope".into(),
                ..Default::default()
            })
            .unwrap_err();
        // RabbitMQ 4.x: a channel error (3.x closed the connection with 503).
        assert_eq!(e.code, 406);
        assert_eq!(e.text, "unknown exchange type 'nope'");
        // An existing amq.* exchange may be redeclared, but not deleted.
        v.declare_exchange(&ExchangeDeclare {
            name: "amq.direct".into(),
            kind: "direct".into(),
            durable: true,
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            v.delete_exchange("amq.direct", false).unwrap_err().text,
            "deletion of system exchange 'amq.direct' in vhost '/' not allowed"
        );
    }

    fn xd(name: &str, kind: &str, args: &[(&str, FieldValue)]) -> ExchangeDeclare {
        ExchangeDeclare {
            name: name.into(),
            kind: kind.into(),
            arguments: args.iter().cloned().collect(),
            ..Default::default()
        }
    }

    fn bind_q(v: &VHost, x: &str, q: &str, key: &str) {
        v.bind(x, Destination::Queue(q.into()), key, &FieldTable::new(), 1)
            .unwrap();
    }

    fn headers(pairs: &[(&str, FieldValue)]) -> FieldTable {
        pairs.iter().cloned().collect()
    }

    fn publish_with(
        v: &VHost,
        x: &str,
        key: &str,
        h: FieldTable,
        body: &'static [u8],
    ) -> Published {
        let m = Message::new(
            x.into(),
            key.into(),
            warren_amqp::properties::BasicProperties {
                headers: Some(h),
                ..Default::default()
            },
            bytes::Bytes::from_static(body),
        );
        v.publish(Arc::new(m), None).unwrap()
    }

    #[test]
    fn alternate_exchange_is_decided_per_exchange_visited() {
        // fanout E -> direct I (alternate-exchange A) ; A -> QA. A key I does not match
        // reaches QA and counts as routed (RabbitMQ 3.10.8: no basic.return).
        let v = VHost::new("/");
        v.declare_exchange(&xd("E", "fanout", &[])).unwrap();
        v.declare_exchange(&xd("A", "fanout", &[])).unwrap();
        v.declare_exchange(&xd("I", "direct", &[("alternate-exchange", text("A"))]))
            .unwrap();
        v.bind(
            "E",
            Destination::Exchange("I".into()),
            "",
            &FieldTable::new(),
            1,
        )
        .unwrap();
        let qa = v.declare_queue(&qd("QA"), 1).unwrap().0;
        let qi = v.declare_queue(&qd("QI"), 1).unwrap().0;
        bind_q(&v, "A", "QA", "");
        bind_q(&v, "I", "QI", "hit");
        let p = publish_with(&v, "E", "miss", FieldTable::new(), b"m");
        assert!(p.routed);
        assert_eq!((qa.counts().ready, qi.counts().ready), (1, 0));
        // E itself routed (to I), so E's own alternate exchange would not be used.
        let p = publish_with(&v, "E", "hit", FieldTable::new(), b"m");
        assert!(p.routed);
        assert_eq!((qa.counts().ready, qi.counts().ready), (1, 1));
    }

    #[test]
    fn cc_and_bcc_route_and_bcc_is_removed() {
        let v = VHost::new("/");
        for q in ["k1", "k2", "k3"] {
            v.declare_queue(&qd(q), 1).unwrap();
        }
        v.declare_exchange(&xd("d", "direct", &[])).unwrap();
        v.declare_exchange(&xd("t", "topic", &[])).unwrap();
        for q in ["k1", "k2", "k3"] {
            bind_q(&v, "d", q, q);
            bind_q(&v, "t", q, &format!("{q}.#"));
        }
        let arr = |k: &str| FieldValue::Array(vec![text(k)]);
        for (x, cc, bcc) in [("d", "k2", "k3"), ("t", "k2.x", "k3"), ("", "k2", "k3")] {
            let p = publish_with(
                &v,
                x,
                "k1",
                headers(&[("CC", arr(cc)), ("BCC", arr(bcc))]),
                b"m",
            );
            assert!(p.routed, "{x}");
            for q in ["k1", "k2", "k3"] {
                let (m, _) = v
                    .queue(q, 1)
                    .unwrap()
                    .get(true)
                    .unwrap_or_else(|| panic!("{x} {q}"));
                let h = m.message.properties.headers.as_ref().unwrap();
                assert!(h.get("BCC").is_none(), "{x}");
                assert_eq!(h.get("CC"), Some(&arr(cc)));
                assert_eq!(m.message.routing_key, "k1");
            }
        }
        // A CC that is not an array is refused as RabbitMQ does.
        let m = Message::new(
            "d".into(),
            "k1".into(),
            warren_amqp::properties::BasicProperties {
                headers: Some(headers(&[("CC", text("k2"))])),
                ..Default::default()
            },
            bytes::Bytes::new(),
        );
        match v.publish(Arc::new(m), None) {
            Err(PublishError::Broker(e)) => {
                assert_eq!(e.code, 406);
                assert_eq!(
                    e.text,
                    "invalid message: {unacceptable_type_in_header,\"CC\",longstr}"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn x_death_records_cc_keys_and_dead_letters_route_with_all_keys() {
        let (_, v) = clocked();
        v.declare_exchange(&xd("d", "direct", &[])).unwrap();
        for q in ["k2", "k3"] {
            v.declare_queue(&qd(q), 1).unwrap();
            bind_q(&v, "d", q, q);
        }
        let src = declare_with(&v, "src", &[("x-dead-letter-exchange", text("d"))]);
        let arr = |k: &str| FieldValue::Array(vec![text(k)]);
        publish_with(
            &v,
            "",
            "src",
            headers(&[("CC", arr("k2")), ("BCC", arr("k3"))]),
            b"m",
        );
        // CC k2 and BCC k3 reached their queues already; drain them.
        for q in ["k2", "k3"] {
            assert!(v.queue(q, 1).unwrap().get(true).is_some());
        }
        let (m, _) = src.get(false).unwrap();
        src.settle(
            0,
            vec![crate::queue::Settlement {
                consumer_tag: None,
                message: m,
                requeue: false,
                rejected: true,
            }],
        );
        // Dead-lettered with src, k2 and k3 (BCC keys included) ...
        for q in ["k2", "k3"] {
            let (m, _) = v.queue(q, 1).unwrap().get(true).expect(q);
            let h = m.message.properties.headers.as_ref().unwrap();
            let death = h.get("x-death").and_then(|d| d.as_array()).unwrap()[0]
                .as_table()
                .unwrap()
                .clone();
            // ... and x-death lists the routing key and CC, not BCC.
            assert_eq!(
                death.get("routing-keys"),
                Some(&FieldValue::Array(vec![text("src"), text("k2")]))
            );
        }
    }

    fn delayed_exchange(v: &VHost, name: &str, inner: &str) {
        v.declare_exchange(&xd(name, delayed::TYPE, &[("x-delayed-type", text(inner))]))
            .unwrap();
    }

    fn delay(ms: i32) -> FieldTable {
        headers(&[("x-delay", FieldValue::I32(ms))])
    }

    #[test]
    fn delayed_exchange_holds_until_due_in_due_order() {
        let (clock, v) = clocked();
        delayed_exchange(&v, "dx", "direct");
        let q = declare_with(&v, "q", &[]);
        bind_q(&v, "dx", "q", "k");
        let p = publish_with(&v, "dx", "k", delay(300), b"late");
        // Held: no queue yet, so a mandatory publish is returned (as with the plugin).
        assert!(!p.routed);
        publish_with(&v, "dx", "k", delay(100), b"early");
        publish_with(&v, "dx", "k", delay(0), b"now");
        publish_with(&v, "dx", "k", delay(-5), b"negative");
        assert_eq!(bodies(&q), vec!["now", "negative"]);
        assert_eq!(v.delayed_count(), 2);
        clock.advance(99);
        v.sweep();
        assert!(q.get(true).is_none());
        clock.advance(1);
        v.sweep();
        let (m, _) = q.get(true).unwrap();
        assert_eq!(&m.message.body[..], b"early");
        let h = m.message.properties.headers.as_ref().unwrap();
        assert_eq!(h.get("x-delay"), Some(&FieldValue::I64(-100)));
        clock.advance(200);
        v.sweep();
        assert_eq!(bodies(&q), vec!["late"]);
        assert_eq!(v.delayed_count(), 0);
    }

    #[test]
    fn delayed_exchange_behind_exchange_bindings() {
        // fanout f -> delayed dx (topic) -> q ; f -> now. The copy through dx is held, the
        // direct one is not; when due it is routed from dx, keeping exchange f and its key.
        let (clock, v) = clocked();
        v.declare_exchange(&xd("f", "fanout", &[])).unwrap();
        delayed_exchange(&v, "dx", "topic");
        v.bind(
            "f",
            Destination::Exchange("dx".into()),
            "",
            &FieldTable::new(),
            1,
        )
        .unwrap();
        let q = declare_with(&v, "q", &[]);
        let now = declare_with(&v, "now", &[]);
        bind_q(&v, "dx", "q", "a.*");
        bind_q(&v, "f", "now", "");
        // A second delayed exchange behind dx does not hold the message again.
        delayed_exchange(&v, "dx2", "fanout");
        v.bind(
            "dx",
            Destination::Exchange("dx2".into()),
            "#",
            &FieldTable::new(),
            1,
        )
        .unwrap();
        let q2 = declare_with(&v, "q2", &[]);
        bind_q(&v, "dx2", "q2", "");
        let p = publish_with(&v, "f", "a.b", delay(50), b"m");
        assert!(p.routed);
        assert_eq!((now.counts().ready, q.counts().ready), (1, 0));
        clock.advance(50);
        v.sweep();
        let (m, _) = q.get(true).unwrap();
        assert_eq!(
            (m.message.exchange.as_str(), m.message.routing_key.as_str()),
            ("f", "a.b")
        );
        assert_eq!(q2.counts().ready, 1);
        assert_eq!(v.delayed_count(), 0);
    }

    #[test]
    fn delayed_exchange_uses_its_alternate_exchange_only_when_due() {
        // The plugin's open issue #36: RabbitMQ sees "no queues" at publish time and copies a
        // held message to the alternate exchange at once. Warren only uses it when the held
        // message is due and routes nowhere.
        let (clock, v) = clocked();
        v.declare_exchange(&xd("ae", "fanout", &[])).unwrap();
        v.declare_exchange(&xd(
            "dx",
            delayed::TYPE,
            &[
                ("x-delayed-type", text("direct")),
                ("alternate-exchange", text("ae")),
            ],
        ))
        .unwrap();
        let aq = declare_with(&v, "aq", &[]);
        bind_q(&v, "ae", "aq", "");
        publish_with(&v, "dx", "unbound", delay(10), b"m");
        assert_eq!(aq.counts().ready, 0);
        clock.advance(10);
        v.sweep();
        assert_eq!(aq.counts().ready, 1);
    }

    #[test]
    fn deleting_a_delayed_exchange_drops_what_it_holds() {
        let (clock, v) = clocked();
        delayed_exchange(&v, "dx", "fanout");
        delayed_exchange(&v, "keep", "fanout");
        let q = declare_with(&v, "q", &[]);
        bind_q(&v, "dx", "q", "");
        bind_q(&v, "keep", "q", "");
        publish_with(&v, "dx", "", delay(10), b"gone");
        publish_with(&v, "keep", "", delay(10), b"kept");
        v.delete_exchange("dx", false).unwrap();
        assert_eq!(v.delayed_count(), 1);
        // Redeclared, it starts empty.
        delayed_exchange(&v, "dx", "fanout");
        bind_q(&v, "dx", "q", "");
        clock.advance(10);
        v.sweep();
        assert_eq!(bodies(&q), vec!["kept"]);
    }

    #[test]
    fn delayed_exchange_declare_validation() {
        let v = VHost::new("/");
        let e = v
            .declare_exchange(&xd("dx", delayed::TYPE, &[]))
            .unwrap_err();
        assert_eq!(
            (e.code, e.text.as_str()),
            (
                406,
                "Invalid argument, 'x-delayed-type' must be an existing exchange type"
            )
        );
        let e = v
            .declare_exchange(&xd(
                "dx",
                delayed::TYPE,
                &[("x-delayed-type", text(delayed::TYPE))],
            ))
            .unwrap_err();
        assert_eq!(
            e.text,
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"
        );
        delayed_exchange(&v, "dx", "headers");
        // Only the type, flags and alternate-exchange are compared on redeclare.
        v.declare_exchange(&xd(
            "dx",
            delayed::TYPE,
            &[("x-delayed-type", text("fanout"))],
        ))
        .unwrap();
        let e = v.declare_exchange(&xd("dx", "headers", &[])).unwrap_err();
        assert_eq!(
            e.text,
            "inequivalent arg 'type' for exchange 'dx' in vhost '/': received 'headers' but current is 'x-delayed-message'"
        );
        // A headers-typed delayed exchange checks x-match like a headers exchange.
        v.declare_queue(&qd("q"), 1).unwrap();
        let e = v
            .bind(
                "dx",
                Destination::Queue("q".into()),
                "",
                &headers(&[("x-match", text("nope"))]),
                1,
            )
            .unwrap_err();
        assert_eq!(e.code, 406);
        // An unreadable x-delay fails the publish.
        let m = Message::new(
            "dx".into(),
            "".into(),
            warren_amqp::properties::BasicProperties {
                headers: Some(headers(&[("x-delay", text("soon"))])),
                ..Default::default()
            },
            bytes::Bytes::new(),
        );
        assert!(matches!(
            v.publish(Arc::new(m), None),
            Err(PublishError::Broker(BrokerError { code: 406, .. }))
        ));
    }

    #[test]
    fn topic_match_budget_refuses_messages_that_need_more() {
        let b = Broker::new(Users::new());
        b.set_limits(Limits {
            topic_match_budget: 500,
            ..Limits::default()
        });
        let v = b.vhost("/").unwrap();
        let q = v.declare_queue(&qd("q"), 1).unwrap().0;
        bind_q(&v, "amq.topic", "q", "#.a.#.a.#.a.#.a.#.a.#.a.#.a.c");
        // 60 words need about 800 node visits: over this budget.
        let m = Message::new(
            "amq.topic".into(),
            format!("{}b", "a.".repeat(60)),
            Default::default(),
            bytes::Bytes::new(),
        );
        match v.publish(Arc::new(m), None) {
            Err(PublishError::Broker(e)) => {
                assert_eq!(e.code, 406);
                assert_eq!(
                    e.text,
                    "cannot route message through exchange 'amq.topic' in vhost '/': topic matching needs more than 500 steps"
                );
            }
            other => panic!("{other:?}"),
        }
        // Shorter keys fit.
        publish_with(&v, "amq.topic", "a.a.a.a.a.a.a.c", FieldTable::new(), b"m");
        assert_eq!(q.counts().ready, 1);
    }

    #[test]
    fn vhost_limits() {
        let b = Broker::new(Users::new());
        b.set_limits(Limits {
            max_queues: 2,
            max_exchanges: 1,
            max_bindings: 2,
            ..Limits::default()
        });
        let v = b.vhost("/").unwrap();
        v.declare_queue(&qd("q1"), 1).unwrap();
        v.declare_queue(&qd("q2"), 1).unwrap();
        let e = v.declare_queue(&qd("q3"), 1).unwrap_err();
        assert_eq!(
            (e.code, e.text.as_str()),
            (
                406,
                "cannot declare queue 'q3': queue limit in vhost '/' (2) is reached"
            )
        );
        // Redeclares and passive declares still work at the limit.
        v.declare_queue(&qd("q2"), 1).unwrap();
        v.declare_exchange(&xd("x1", "direct", &[])).unwrap();
        let e = v.declare_exchange(&xd("x2", "direct", &[])).unwrap_err();
        assert_eq!(
            e.text,
            "cannot declare exchange 'x2' in vhost '/': exchange limit of 1 is reached"
        );
        v.declare_exchange(&xd("x1", "direct", &[])).unwrap();
        bind_q(&v, "x1", "q1", "a");
        bind_q(&v, "amq.direct", "q1", "b");
        bind_q(&v, "x1", "q1", "a");
        let e = v
            .bind(
                "x1",
                Destination::Queue("q2".into()),
                "c",
                &FieldTable::new(),
                1,
            )
            .unwrap_err();
        assert_eq!(
            e.text,
            "cannot bind queue 'q2' in vhost '/' to exchange 'x1' in vhost '/': binding limit of 2 is reached"
        );
        // Deleting a queue frees its bindings and its place.
        v.delete_queue("q1", false, false, 1).unwrap();
        bind_q(&v, "x1", "q2", "c");
        v.declare_queue(&qd("q3"), 1).unwrap();
        v.delete_exchange("x1", false).unwrap();
        assert_eq!(v.topology.read().bindings, 0);
        v.declare_exchange(&xd("x2", "direct", &[])).unwrap();
    }
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
            })
            .collect()
    }
}
