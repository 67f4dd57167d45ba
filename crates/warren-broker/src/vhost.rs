//! Virtual hosts: the exchanges, queues and bindings of one namespace, and the [`Broker`] that
//! holds every vhost and the user table.
//!
//! All topology changes (declare, delete, bind) take the vhost's write lock; routing a publish
//! takes the read lock only, so publishers on different connections route in parallel.

use crate::args::QueueArgs;
use crate::auth::Users;
use crate::clock::{Clock, SystemClock};
use crate::error::{resource, BrokerError, Result};
use crate::exchange::{Binding, Destination, Exchange, ExchangeKind};
use crate::message::{ConfirmTicket, Message, QueuedMessage};
use crate::names;
use crate::persist::{get_bool, get_str, get_table, s, Persistence, StorageOptions};
use crate::queue::{
    Backing, Consumer, DeadLetter, DeathReason, DeliveryTarget, Queue, QueueCounts,
};
use parking_lot::RwLock;
use std::collections::HashMap;
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
}

/// Why a durable broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The message store failed to open or recover.
    #[error(transparent)]
    Store(#[from] warren_store::StoreError),
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
        };
        b.add_vhost("/");
        b
    }

    /// A durable broker on `options.data_dir`: recovers durable definitions and the messages
    /// of durable queues, and pages every queue beyond its in-memory window to disk.
    pub fn open(
        users: Users,
        options: StorageOptions,
    ) -> std::result::Result<(Broker, RecoveryReport), OpenError> {
        let (store, recovered) = Store::open(options.store_config())?;
        let _ = std::fs::remove_dir_all(options.data_dir.join("spill"));
        let persist = Arc::new(Persistence::new(store.clone(), options));
        let b = Broker {
            vhosts: RwLock::new(HashMap::new()),
            users: RwLock::new(users),
            persist: Some(persist.clone()),
            ids: Arc::new(AtomicU64::new(0)),
            clock: Arc::new(SystemClock),
        };
        for defs in persist.load_definitions() {
            let vh = b.add_vhost(get_str(&defs, "name"));
            vh.load_definitions(&defs);
        }
        b.add_vhost("/");
        for (key, entries) in recovered.queues {
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
        Ok((b, recovered.report))
    }

    /// The message store, for a durable broker.
    pub fn store(&self) -> Option<&Store> {
        self.persist.as_ref().map(|p| &p.store)
    }

    /// Stops the message store's writer after a final fsync.
    pub fn close(&self) {
        if let Some(p) = &self.persist {
            p.store.close();
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
        for (n, k) in [
            ("", ExchangeKind::Direct),
            ("amq.direct", ExchangeKind::Direct),
            ("amq.fanout", ExchangeKind::Fanout),
            ("amq.topic", ExchangeKind::Topic),
            ("amq.headers", ExchangeKind::Headers),
            ("amq.match", ExchangeKind::Headers),
        ] {
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

    /// Periodic housekeeping: expires messages at the head of each queue and deletes the
    /// queues unused for longer than their `x-expires`.
    pub fn sweep(&self) {
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
            let mut queues = Vec::new();
            if self
                .route_inner(dlx, &msg.routing_key, headers, &mut queues, false)
                .is_err()
            {
                continue;
            }
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
            if let Err(e) = self.enqueue(msg, queues, None, false) {
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
        let mut queues = Vec::new();
        self.route(
            &msg.exchange,
            &msg.routing_key,
            msg.properties.headers.as_ref(),
            &mut queues,
        )?;
        if queues.is_empty() {
            return Ok(Published {
                routed: false,
                stored: false,
                pressured: None,
                rejected: false,
            });
        }
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
        self.enqueue(msg, queues, waiter, !rejected.is_empty())
    }

    /// Enqueues a routed message on `queues`, writing it to the store first when it is
    /// persistent and some of them are durable.
    fn enqueue(
        &self,
        msg: Arc<Message>,
        queues: Vec<Arc<Queue>>,
        waiter: Option<(Arc<dyn Completion>, u64)>,
        rejected: bool,
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
                if let Some((sink, token)) = &waiter {
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

    /// Saves this vhost's durable definitions (called with the topology lock held, so saves
    /// happen in the order of the changes).
    fn save(&self, topo: &Topology) {
        let Some(p) = &self.persist else {
            return;
        };
        if let Err(e) = p.save_definitions(&self.name, &topo.snapshot(&self.name)) {
            tracing::error!(vhost = %self.name, error = %e, "cannot save durable definitions");
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
                x.bind(Binding {
                    destination,
                    routing_key: get_str(&b, "routing_key").to_string(),
                    arguments: get_table(&b, "arguments"),
                });
            }
        }
    }

    fn exchange_resource(&self, name: &str) -> String {
        resource("exchange", name, &self.name)
    }

    fn queue_resource(&self, name: &str) -> String {
        resource("queue", name, &self.name)
    }

    fn no_exchange(&self, name: &str) -> BrokerError {
        BrokerError::not_found(format!("no {}", self.exchange_resource(name)))
    }

    fn no_queue(&self, name: &str) -> BrokerError {
        BrokerError::not_found(format!("no {}", self.queue_resource(name)))
    }

    /// exchange.declare. Errors: 404 (passive, missing), 406 (unknown type, as in RabbitMQ 4.x;
    /// 3.x closed the connection with 503), 403 (default exchange, or `amq.` prefix for an
    /// exchange that does not exist yet), 406 (inequivalent type, flags or
    /// `alternate-exchange`).
    pub fn declare_exchange(&self, d: &ExchangeDeclare) -> Result<()> {
        if d.passive {
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
            self.save(&topo);
        }
        Ok(())
    }

    /// exchange.delete. Deleting a missing exchange succeeds, as in RabbitMQ. Errors: 403 for the
    /// default exchange and `amq.` exchanges, 406 with `if_unused` when it is a binding source.
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
        let durable = x.durable;
        topo.remove_exchange(name);
        if durable {
            self.save(&topo);
        }
        Ok(())
    }

    /// True when the exchange exists.
    pub fn exchange_exists(&self, name: &str) -> bool {
        self.topology.read().exchanges.contains_key(name)
    }

    /// queue.declare, for connection `connection_id`. Returns the queue and its counts.
    ///
    /// Errors: 404 (passive, missing), 403 (`amq.` prefix), 405 (exclusive to another
    /// connection, or exclusivity differs), 406 (inequivalent durable/auto_delete/arguments).
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
            check_field(&what, "durable", q.durable, d.durable)?;
            check_field(&what, "auto_delete", q.auto_delete, d.auto_delete)?;
            check_args(&what, &q.arguments, &d.arguments, EQUIVALENT_QUEUE_ARGS)?;
            q.touch();
            let counts = q.counts();
            return Ok((q.clone(), counts));
        }
        QueueArgs::parse(&self.queue_resource(&name), &d.arguments)?;
        let q = Arc::new(self.new_queue(Queue::new(
            name.clone(),
            self.name.clone(),
            d.durable,
            d.exclusive.then_some(connection_id),
            d.auto_delete,
            d.arguments.clone(),
        )));
        topo.queues.insert(name.clone(), q.clone());
        if topo.queue_is_durable(&name) {
            self.save(&topo);
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
            let durable = topo.queue_is_durable(name);
            topo.remove_queue(name);
            if durable {
                self.save(&topo);
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
                    let durable = topo.queue_is_durable(&queue.name);
                    topo.remove_queue(&queue.name);
                    if durable {
                        self.save(&topo);
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
    /// must not be the default exchange (403). Headers bindings need a valid `x-match` (406).
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
            .get_mut(source)
            .ok_or_else(|| self.no_exchange(source))?;
        if x.kind == ExchangeKind::Headers
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
        let durable_source = x.durable;
        let added = x.bind(Binding {
            destination: destination.clone(),
            routing_key: routing_key.to_string(),
            arguments: arguments.clone(),
        });
        if added && durable_source && topo.destination_is_durable(&destination) {
            self.save(&topo);
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
        let durable = durable_source && topo.destination_is_durable(&destination);
        if removed && now_unused {
            topo.remove_exchange(source);
        }
        if removed && durable {
            self.save(&topo);
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
    /// Follows exchange-to-exchange bindings (each exchange visited once, so binding cycles
    /// terminate) and the `alternate-exchange` of an exchange that routes nowhere. Errors:
    /// 404 for a missing exchange, 403 for an internal one.
    pub fn route(
        &self,
        exchange: &str,
        routing_key: &str,
        headers: Option<&FieldTable>,
        out: &mut Vec<Arc<Queue>>,
    ) -> Result<()> {
        self.route_inner(exchange, routing_key, headers, out, true)
    }

    /// [`VHost::route`]; dead-lettering may go through an internal exchange.
    fn route_inner(
        &self,
        exchange: &str,
        routing_key: &str,
        headers: Option<&FieldTable>,
        out: &mut Vec<Arc<Queue>>,
        refuse_internal: bool,
    ) -> Result<()> {
        let topo = self.topology.read();
        if exchange.is_empty() {
            if let Some(q) = topo.queues.get(routing_key) {
                out.push(q.clone());
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
        let mut visited: Vec<&str> = Vec::new();
        topo.route_from(x, routing_key, headers, &mut visited, out);
        let mut current = x;
        while out.is_empty() {
            let Some(ae) = current.alternate_exchange() else {
                break;
            };
            let Some(next) = topo.exchanges.get(ae) else {
                break;
            };
            if visited.contains(&next.name.as_str()) {
                break;
            }
            topo.route_from(next, routing_key, headers, &mut visited, out);
            current = next;
        }
        Ok(())
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

    fn route_from<'a>(
        &'a self,
        x: &'a Exchange,
        routing_key: &str,
        headers: Option<&FieldTable>,
        visited: &mut Vec<&'a str>,
        out: &mut Vec<Arc<Queue>>,
    ) {
        visited.push(&x.name);
        let mut next: Vec<&'a Exchange> = Vec::new();
        x.route(routing_key, headers, &mut |d| match d {
            Destination::Queue(name) => {
                if let Some(q) = self.queues.get(name) {
                    if !out.iter().any(|o| Arc::ptr_eq(o, q)) {
                        out.push(q.clone());
                    }
                }
            }
            Destination::Exchange(name) => {
                if let Some(e) = self.exchanges.get(name) {
                    next.push(e);
                }
            }
        });
        for e in next {
            if !visited.contains(&e.name.as_str()) {
                self.route_from(e, routing_key, headers, visited, out);
            }
        }
    }

    /// Removes an exchange, its bindings as a source and as a destination, and then any
    /// auto-delete exchange left without bindings.
    fn remove_exchange(&mut self, name: &str) {
        self.exchanges.remove(name);
        self.unbind_everywhere(&Destination::Exchange(name.to_string()));
    }

    fn remove_queue(&mut self, name: &str) {
        self.queues.remove(name);
        self.unbind_everywhere(&Destination::Queue(name.to_string()));
    }

    fn unbind_everywhere(&mut self, dest: &Destination) {
        let mut emptied = Vec::new();
        for x in self.exchanges.values_mut() {
            if x.unbind_destination(dest) > 0 && x.auto_delete && x.bindings().is_empty() {
                emptied.push(x.name.clone());
            }
        }
        for name in emptied {
            self.remove_exchange(&name);
        }
    }
}

/// The copy of a dead letter that goes to the dead-letter exchange `dlx`: routed with the
/// queue's `x-dead-letter-routing-key` or its original routing key, its `x-death` history
/// updated (entries per queue and reason, most recent first), its `expiration` moved to the
/// entry's `original-expiration`.
fn dead_lettered(from: &Queue, dlx: &str, l: &DeadLetter, now_s: u64) -> Arc<Message> {
    let m = &l.message;
    let reason = l.reason.as_str();
    let routing_key = from
        .args
        .dead_letter_routing_key
        .clone()
        .unwrap_or_else(|| m.routing_key.clone());
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
                t.insert("original-expiration", s(e));
            }
            t.insert("count", FieldValue::I64(1));
            t.insert("reason", s(reason));
            t.insert("queue", s(&from.name));
            t.insert("time", FieldValue::Timestamp(now_s));
            t.insert("exchange", s(&m.exchange));
            t.insert("routing-keys", FieldValue::Array(vec![s(&m.routing_key)]));
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
    Arc::new(Message::new(
        dlx.to_string(),
        routing_key,
        props,
        m.body.clone(),
    ))
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
}
