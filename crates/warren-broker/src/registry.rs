//! The read model for operators: which connections and channels are open, who opened them,
//! and how many messages went through them, through each queue and through each vhost.
//!
//! The management API (`GET /api/connections`, `/api/channels`, `/api/consumers`, the
//! `message_stats` of queues, vhosts and `/api/overview`) and `/metrics` read it; front ends
//! (the AMQP server) write into it.
//!
//! What it costs on the hot path: nothing is locked to count. Each channel owns its
//! [`MessageCounters`] (atomics only its connection task and the queues delivering to it
//! touch, so the cache line is rarely shared); a queue counts in [`QueueStats`] under the
//! lock it holds anyway; a channel counts what it publishes to each exchange in a map only
//! its own task writes (an uncontended lock per publish; RabbitMQ's per channel-exchange
//! stats). Totals per vhost and for the node are added up when someone reads
//! them: the live channels' counters plus what closed channels left behind (folded into
//! per-vhost totals when a channel closes). The registry's own locks are taken when a
//! connection or channel opens or closes, and when an operator reads.
//!
//! What RabbitMQ calls things: a connection is named `"<peer ip>:<port> -> <local ip>:<port>"`
//! and a channel `"<connection name> (<number>)"` (rabbit_reader / rabbit_channel); the
//! counters are the `message_stats` fields of its management API (`publish`, `confirm`,
//! `deliver`, `deliver_no_ack`, `get`, `get_no_ack`, `ack`, `redeliver`,
//! `return_unroutable`, `drop_unroutable`, `get_empty`).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::{Mutex, RwLock};
use rustc_hash::FxHashMap;
use warren_amqp::table::FieldTable;

/// Message counts of a channel, as atomics its owner bumps (Relaxed: they are statistics).
/// Aligned to 128 bytes (two cache lines, what x86's adjacent-line prefetch pairs) so that
/// two channels' counters, allocated side by side and bumped from different threads, never
/// share a line.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct MessageCounters {
    /// basic.publish received (whole messages).
    pub publish: AtomicU64,
    /// Publisher confirms sent (basic.ack to the publisher, per message).
    pub confirm: AtomicU64,
    /// Deliveries to consumers that acknowledge.
    pub deliver: AtomicU64,
    /// Deliveries to no-ack consumers.
    pub deliver_no_ack: AtomicU64,
    /// basic.get answered with a message, to be acknowledged.
    pub get: AtomicU64,
    /// basic.get answered with a message, no-ack.
    pub get_no_ack: AtomicU64,
    /// Deliveries acknowledged by the client (basic.ack, per message).
    pub ack: AtomicU64,
    /// Deliveries (and gets) of messages delivered before.
    pub redeliver: AtomicU64,
    /// Mandatory publishes returned unroutable (basic.return 312).
    pub return_unroutable: AtomicU64,
    /// Publishes that routed nowhere and were dropped (not mandatory).
    pub drop_unroutable: AtomicU64,
    /// basic.get answered with basic.get-empty.
    pub get_empty: AtomicU64,
}

/// Adds one to a counter.
#[inline]
pub fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Adds `n` to a counter.
#[inline]
pub fn bump_by(c: &AtomicU64, n: u64) {
    if n != 0 {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

impl MessageCounters {
    /// The counts now.
    pub fn snapshot(&self) -> MessageStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        MessageStats {
            publish: l(&self.publish),
            confirm: l(&self.confirm),
            deliver: l(&self.deliver),
            deliver_no_ack: l(&self.deliver_no_ack),
            get: l(&self.get),
            get_no_ack: l(&self.get_no_ack),
            ack: l(&self.ack),
            redeliver: l(&self.redeliver),
            return_unroutable: l(&self.return_unroutable),
            drop_unroutable: l(&self.drop_unroutable),
            get_empty: l(&self.get_empty),
        }
    }
}

/// Message counts at one moment (see [`MessageCounters`] for what each counts). RabbitMQ's
/// `deliver_get` is [`MessageStats::deliver_get`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MessageStats {
    /// basic.publish received.
    pub publish: u64,
    /// Publisher confirms sent.
    pub confirm: u64,
    /// Deliveries to acknowledging consumers.
    pub deliver: u64,
    /// Deliveries to no-ack consumers.
    pub deliver_no_ack: u64,
    /// basic.get with acknowledgement.
    pub get: u64,
    /// basic.get without acknowledgement.
    pub get_no_ack: u64,
    /// Acknowledgements.
    pub ack: u64,
    /// Redeliveries.
    pub redeliver: u64,
    /// Unroutable mandatory publishes returned.
    pub return_unroutable: u64,
    /// Unroutable publishes dropped (not mandatory).
    pub drop_unroutable: u64,
    /// basic.get answered empty.
    pub get_empty: u64,
}

impl MessageStats {
    /// Every delivery and get: RabbitMQ's `deliver_get`.
    pub fn deliver_get(&self) -> u64 {
        self.deliver + self.deliver_no_ack + self.get + self.get_no_ack
    }

    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &MessageStats) {
        self.publish += o.publish;
        self.confirm += o.confirm;
        self.deliver += o.deliver;
        self.deliver_no_ack += o.deliver_no_ack;
        self.get += o.get;
        self.get_no_ack += o.get_no_ack;
        self.ack += o.ack;
        self.redeliver += o.redeliver;
        self.return_unroutable += o.return_unroutable;
        self.drop_unroutable += o.drop_unroutable;
        self.get_empty += o.get_empty;
    }
}

/// Messages through one exchange (RabbitMQ's exchange `message_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ExchangeCounts {
    /// Messages published to the exchange.
    pub publish_in: u64,
    /// Queue deliveries out of it: a message routed to three queues counts three.
    pub publish_out: u64,
}

impl ExchangeCounts {
    fn add(&mut self, o: &ExchangeCounts) {
        self.publish_in += o.publish_in;
        self.publish_out += o.publish_out;
    }
}

/// A queue's message counts since it was created (or recovered), counted under the queue's
/// own lock.
#[derive(Debug, Default)]
pub struct QueueStats {
    /// Messages enqueued (published or dead-lettered into the queue).
    pub publish: AtomicU64,
    /// Messages taken by basic.get.
    pub get: AtomicU64,
    /// Deliveries acknowledged by consumers.
    pub ack: AtomicU64,
    /// Deliveries and gets of messages delivered before.
    pub redeliver: AtomicU64,
}

/// One direction of a connection's socket traffic: bytes and the read or write calls that
/// moved them, bumped once per call by the one task doing that direction's I/O (Relaxed:
/// statistics). Not padded to a cache line of its own, unlike [`MessageCounters`]: every
/// connection, idle ones included, has its [`ConnectionIo`] (padding both directions took
/// 250 bytes more per connection), and the reader and the writer bump theirs once per
/// system call, not per message.
#[derive(Debug, Default)]
pub struct Traffic {
    /// Bytes moved (RabbitMQ's `recv_oct` / `send_oct`).
    pub octets: AtomicU64,
    /// Read or write calls that moved bytes (RabbitMQ's `recv_cnt` / `send_cnt`, which count
    /// the socket's packets; a call is Warren's nearest unit).
    pub calls: AtomicU64,
}

impl Traffic {
    /// Counts one call that moved `n` bytes.
    #[inline]
    pub fn count(&self, n: usize) {
        self.octets.fetch_add(n as u64, Ordering::Relaxed);
        self.calls.fetch_add(1, Ordering::Relaxed);
    }
}

/// What a connection's tasks tell operators while it runs: its socket traffic, and whether
/// it is held by a resource alarm or by flow control (RabbitMQ's connection `state`).
/// Made before the handshake, so that the handshake's bytes count too.
#[derive(Debug, Default)]
pub struct ConnectionIo {
    /// Bytes read from the client.
    pub recv: Traffic,
    /// Bytes written to the client.
    pub send: Traffic,
    /// Not read from because it published while a memory or disk alarm is on.
    alarm_held: AtomicBool,
    /// Not read from because a queue it publishes to is over its window (flow control).
    flow_held: AtomicBool,
    /// When flow control last let it go, ms since the Unix epoch (0: never held).
    flow_released_ms: AtomicU64,
}

/// How long a connection flow control held shows `flow` afterwards, ms (RabbitMQ's 5 s).
pub const FLOW_STATE_MS: u64 = 5000;

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl ConnectionIo {
    /// The connection stops (`true`) or resumes (`false`) reading because of a resource
    /// alarm.
    pub fn set_alarm_held(&self, held: bool) {
        self.alarm_held.store(held, Ordering::Relaxed);
    }

    /// The connection stops (`true`) or resumes (`false`) reading because of flow control.
    pub fn set_flow_held(&self, held: bool) {
        self.flow_held.store(held, Ordering::Relaxed);
        if !held {
            self.flow_released_ms.store(now_ms(), Ordering::Relaxed);
        }
    }

    /// The counts and holds now.
    pub fn snapshot(&self) -> IoSnapshot {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let released = l(&self.flow_released_ms);
        IoSnapshot {
            recv_oct: l(&self.recv.octets),
            recv_cnt: l(&self.recv.calls),
            send_oct: l(&self.send.octets),
            send_cnt: l(&self.send.calls),
            alarm_held: self.alarm_held.load(Ordering::Relaxed),
            flow: self.flow_held.load(Ordering::Relaxed)
                || (released != 0 && now_ms().saturating_sub(released) < FLOW_STATE_MS),
        }
    }
}

/// A connection's [`ConnectionIo`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoSnapshot {
    /// Bytes read from the socket.
    pub recv_oct: u64,
    /// Reads that returned bytes.
    pub recv_cnt: u64,
    /// Bytes written to the socket.
    pub send_oct: u64,
    /// Writes that took bytes.
    pub send_cnt: u64,
    /// Held by a resource alarm now (it published while the alarm was on).
    pub alarm_held: bool,
    /// Held by flow control now or within the last [`FLOW_STATE_MS`].
    pub flow: bool,
}

/// What a connection is, fixed when it opens (RabbitMQ's connection details).
#[derive(Debug, Clone)]
pub struct ConnectionDetails {
    /// Process-unique id (the owner id of its exclusive queues).
    pub id: u64,
    /// RabbitMQ's name: `"<peer> -> <local>"`, e.g. `"127.0.0.1:54022 -> 127.0.0.1:5672"`.
    pub name: String,
    /// The client's address.
    pub peer: SocketAddr,
    /// The broker's address the client connected to.
    pub local: SocketAddr,
    /// The authenticated user.
    pub user: String,
    /// The vhost.
    pub vhost: String,
    /// `"AMQP 0-9-1"`.
    pub protocol: &'static str,
    /// Over TLS.
    pub tls: bool,
    /// The SASL mechanism the client logged in with (`PLAIN`, `AMQPLAIN`, ...).
    pub auth_mechanism: String,
    /// The client's connection.start-ok properties.
    pub client_properties: FieldTable,
    /// Milliseconds since the Unix epoch when the connection opened.
    pub connected_at_ms: u64,
    /// Negotiated frame_max, bytes.
    pub frame_max: u32,
    /// Negotiated channel_max.
    pub channel_max: u16,
    /// Negotiated heartbeat interval, seconds (0: none).
    pub heartbeat: u16,
}

/// Closes a connection from outside its task (an operator's `DELETE /api/connections/x`, a
/// vhost or user deleted). Implemented by the front end that owns the connection.
pub trait ConnectionControl: Send + Sync {
    /// Closes the connection with 320 CONNECTION_FORCED and `reason` (sent as
    /// `"CONNECTION_FORCED - <reason>"`). Returns at once; the close happens on the
    /// connection's task.
    fn force_close(&self, reason: &str);
}

/// A consumer as a channel reports it.
#[derive(Debug, Clone)]
pub struct ConsumerDetails {
    /// The consumer tag.
    pub tag: String,
    /// The queue it consumes from.
    pub queue: String,
    /// The client acknowledges deliveries (not no-ack).
    pub ack_required: bool,
    /// basic.consume's exclusive flag.
    pub exclusive: bool,
    /// The consumer's prefetch (basic.qos global=false in force at basic.consume; 0: none).
    pub prefetch_count: u16,
    /// basic.consume's arguments.
    pub arguments: FieldTable,
    /// The delivery acknowledgement timeout in ms that applies to the consumer's queue (its
    /// `x-consumer-timeout` and `consumer-timeout` policy, else the broker's
    /// `amqp.consumer_timeout`), as RabbitMQ's management API reports it; `None` when no
    /// timeout applies. Filled in when an operator reads the channel.
    pub consumer_timeout: Option<u64>,
}

/// What a channel took from one queue (RabbitMQ's per channel and queue stats, the
/// `deliveries` of `/api/channels/{name}`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueDeliveries {
    /// The queue's name (in the channel's vhost).
    pub queue: String,
    /// Deliveries to consumers that acknowledge.
    pub deliver: u64,
    /// Deliveries to no-ack consumers.
    pub deliver_no_ack: u64,
    /// basic.get answered with a message, to be acknowledged.
    pub get: u64,
    /// basic.get answered with a message, no-ack.
    pub get_no_ack: u64,
    /// Deliveries and gets of messages delivered before.
    pub redeliver: u64,
    /// Deliveries and gets acknowledged.
    pub ack: u64,
}

impl QueueDeliveries {
    /// Every delivery and get: RabbitMQ's `deliver_get`.
    pub fn deliver_get(&self) -> u64 {
        self.deliver + self.deliver_no_ack + self.get + self.get_no_ack
    }
}

/// What only the channel itself knows, read when an operator asks (it may lock the channel
/// briefly; never called on a hot path).
pub trait ChannelProbe: Send + Sync {
    /// Deliveries not yet acknowledged.
    fn unacked(&self) -> u64;
    /// The channel's consumers.
    fn consumers(&self) -> Vec<ConsumerDetails>;
    /// What the channel took from each queue that still exists, by queue name.
    fn deliveries(&self) -> Vec<QueueDeliveries> {
        Vec::new()
    }
}

/// One open channel: its counters and modes.
pub struct ChannelEntry {
    /// Process-unique id (never reused, unlike the number): what rate samples are kept by.
    pub id: u64,
    /// The channel number.
    pub number: u16,
    /// Its message counts.
    pub counters: MessageCounters,
    prefetch: AtomicU32,
    global_prefetch: AtomicU32,
    confirm: AtomicBool,
    tx: AtomicBool,
    /// Publishes in confirm mode not yet confirmed (RabbitMQ's `messages_unconfirmed`):
    /// raised when a publish takes its sequence number, lowered when its basic.ack or
    /// basic.nack is sent.
    pub unconfirmed: AtomicU64,
    probe: Mutex<Option<Weak<dyn ChannelProbe>>>,
    /// Per exchange published to: locked by the channel's own task per publish (so never
    /// contended but by a reader) and by readers.
    /// FxHash: bumped on every publish, and the names are the channel's own (only its own
    /// lookups would slow down).
    exchanges: Mutex<ExchangeTally>,
}

/// A channel's [`ExchangeCounts`] by exchange name. The default exchange (`""`), the target
/// of most publishes, has a slot of its own: looking it up in the map would compare two
/// empty names, and glibc's AVX-512 `memcmp` reads an empty `&str`'s dangling address with
/// a masked load even for 0 bytes, which takes a microcode assist on some CPUs (about 3% of
/// the broker's CPU per publish in a raw-frame 1p/1c run on AMD EPYC; see [`crate::names::same`]).
#[derive(Default)]
struct ExchangeTally {
    default: Option<ExchangeCounts>,
    named: FxHashMap<String, ExchangeCounts>,
}

impl ExchangeTally {
    fn count(&mut self, exchange: &str, queues: u32) {
        let c = if exchange.is_empty() {
            self.default.get_or_insert_with(ExchangeCounts::default)
        } else {
            match self.named.get_mut(exchange) {
                Some(c) => c,
                None => self.named.entry(exchange.to_string()).or_default(),
            }
        };
        c.publish_in += 1;
        c.publish_out += u64::from(queues);
    }

    /// Every exchange counted, by name.
    fn iter(&self) -> impl Iterator<Item = (&str, &ExchangeCounts)> {
        let default = self.default.as_ref().map(|c| ("", c));
        default
            .into_iter()
            .chain(self.named.iter().map(|(k, c)| (k.as_str(), c)))
    }
}

impl ChannelEntry {
    fn new(id: u64, number: u16) -> Self {
        ChannelEntry {
            id,
            number,
            counters: MessageCounters::default(),
            prefetch: AtomicU32::new(0),
            global_prefetch: AtomicU32::new(0),
            confirm: AtomicBool::new(false),
            tx: AtomicBool::new(false),
            unconfirmed: AtomicU64::new(0),
            probe: Mutex::new(None),
            exchanges: Mutex::new(ExchangeTally::default()),
        }
    }

    /// Counts a publish to `exchange` that `queues` queues enqueued.
    pub fn count_exchange(&self, exchange: &str, queues: u32) {
        self.exchanges.lock().count(exchange, queues);
    }

    /// Sets what answers for the channel's unacked deliveries and consumers.
    pub fn set_probe(&self, probe: Weak<dyn ChannelProbe>) {
        *self.probe.lock() = Some(probe);
    }

    /// basic.qos: `global` false sets the per-consumer prefetch, true the channel's.
    pub fn set_prefetch(&self, count: u16, global: bool) {
        let slot = if global {
            &self.global_prefetch
        } else {
            &self.prefetch
        };
        slot.store(u32::from(count), Ordering::Relaxed);
    }

    /// confirm.select was accepted.
    pub fn set_confirm(&self) {
        self.confirm.store(true, Ordering::Relaxed);
    }

    /// tx.select was accepted.
    pub fn set_transactional(&self) {
        self.tx.store(true, Ordering::Relaxed);
    }

    fn probe(&self) -> Option<Arc<dyn ChannelProbe>> {
        self.probe.lock().as_ref().and_then(Weak::upgrade)
    }
}

/// A connection's open channels, by number: a sorted `Vec` (most connections have one
/// channel; a `BTreeMap` node takes 128 bytes for it).
#[derive(Default)]
struct ChannelSet(Vec<Arc<ChannelEntry>>);

impl ChannelSet {
    fn position(&self, number: u16) -> Result<usize, usize> {
        self.0.binary_search_by_key(&number, |c| c.number)
    }

    fn insert(&mut self, number: u16, ch: Arc<ChannelEntry>) {
        match self.position(number) {
            Ok(i) => self.0[i] = ch,
            Err(i) => self.0.insert(i, ch),
        }
    }

    fn get(&self, number: u16) -> Option<&Arc<ChannelEntry>> {
        self.position(number).ok().map(|i| &self.0[i])
    }

    fn remove(&mut self, number: u16) {
        if let Ok(i) = self.position(number) {
            self.0.remove(i);
        }
    }

    /// The channels, by number.
    fn values(&self) -> std::slice::Iter<'_, Arc<ChannelEntry>> {
        self.0.iter()
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

/// A registered connection.
pub struct ConnectionEntry {
    /// What it is.
    pub details: Arc<ConnectionDetails>,
    /// Its socket traffic and holds.
    pub io: Arc<ConnectionIo>,
    channels: Mutex<ChannelSet>,
    control: Arc<dyn ConnectionControl>,
}

/// A connection as read by an operator.
#[derive(Debug, Clone)]
pub struct ConnectionSnapshot {
    /// What it is.
    pub details: Arc<ConnectionDetails>,
    /// Channels open now.
    pub channels: usize,
    /// Message counts of its open channels.
    pub stats: MessageStats,
    /// Its socket traffic and holds.
    pub io: IoSnapshot,
}

/// A channel as read by an operator.
#[derive(Debug, Clone)]
pub struct ChannelSnapshot {
    /// The channel's process-unique id ([`ChannelEntry::id`]).
    pub id: u64,
    /// Its connection.
    pub connection: Arc<ConnectionDetails>,
    /// The channel number.
    pub number: u16,
    /// Per-consumer prefetch (basic.qos global=false).
    pub prefetch_count: u16,
    /// Channel-wide prefetch (basic.qos global=true).
    pub global_prefetch_count: u16,
    /// Deliveries not yet acknowledged.
    pub unacked: u64,
    /// Publishes not yet confirmed (confirm mode).
    pub unconfirmed: u64,
    /// Consumers on the channel.
    pub consumers: Vec<ConsumerDetails>,
    /// In confirm mode.
    pub confirm: bool,
    /// In transactional mode.
    pub transactional: bool,
    /// Message counts.
    pub stats: MessageStats,
    /// Messages published to each exchange, by exchange name (sorted).
    pub exchanges: Vec<(String, ExchangeCounts)>,
    /// What it took from each queue, by queue name (sorted).
    pub deliveries: Vec<QueueDeliveries>,
}

impl ChannelSnapshot {
    /// RabbitMQ's channel name: `"<connection name> (<number>)"`.
    pub fn name(&self) -> String {
        format!("{} ({})", self.connection.name, self.number)
    }
}

/// Churn since the broker started: connections and channels opened and closed, queues
/// declared, created and deleted (RabbitMQ's `churn_rates` in `/api/overview`). The
/// registry counts connections and channels; vhosts count their queues (every deletion:
/// by a client, by `x-expires`, auto-delete, exclusive owner gone, vhost deleted), the
/// operations layer counts declares.
#[derive(Debug, Default)]
pub struct ChurnCounters {
    /// Connections registered (handshake completed).
    pub connection_created: AtomicU64,
    /// Connections unregistered.
    pub connection_closed: AtomicU64,
    /// Channels opened.
    pub channel_created: AtomicU64,
    /// Channels closed (with their connection or alone).
    pub channel_closed: AtomicU64,
    /// Non-passive queue.declare calls that passed the permission check, as RabbitMQ
    /// counts `queue_declared`.
    pub queue_declared: AtomicU64,
    /// Queues created by a declare.
    pub queue_created: AtomicU64,
    /// Queues deleted, for whatever reason.
    pub queue_deleted: AtomicU64,
}

impl ChurnCounters {
    /// The counts now.
    pub fn snapshot(&self) -> Churn {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Churn {
            connection_created: l(&self.connection_created),
            connection_closed: l(&self.connection_closed),
            channel_created: l(&self.channel_created),
            channel_closed: l(&self.channel_closed),
            queue_declared: l(&self.queue_declared),
            queue_created: l(&self.queue_created),
            queue_deleted: l(&self.queue_deleted),
        }
    }
}

/// A snapshot of [`ChurnCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Churn {
    /// See [`ChurnCounters::connection_created`].
    pub connection_created: u64,
    /// See [`ChurnCounters::connection_closed`].
    pub connection_closed: u64,
    /// See [`ChurnCounters::channel_created`].
    pub channel_created: u64,
    /// See [`ChurnCounters::channel_closed`].
    pub channel_closed: u64,
    /// See [`ChurnCounters::queue_declared`].
    pub queue_declared: u64,
    /// See [`ChurnCounters::queue_created`].
    pub queue_created: u64,
    /// See [`ChurnCounters::queue_deleted`].
    pub queue_deleted: u64,
}

/// The registry of live connections and channels, with the counts closed channels left.
#[derive(Default)]
pub struct Registry {
    connections: RwLock<BTreeMap<u64, Arc<ConnectionEntry>>>,
    /// Counts of closed channels, per vhost.
    retired: Mutex<HashMap<String, MessageStats>>,
    /// Counts of closed channels of vhosts since deleted.
    retired_gone: Mutex<MessageStats>,
    /// The next channel's id.
    next_channel: AtomicU64,
    /// Exchange counts of closed channels, per (vhost, exchange).
    retired_exchanges: Mutex<HashMap<(String, String), ExchangeCounts>>,
    /// Connections, channels and queues created and closed (shared with the vhosts).
    churn: Arc<ChurnCounters>,
}

/// A connection's place in the [`Registry`]: dropping it unregisters the connection (and
/// retires its channels' counts).
pub struct ConnectionHandle {
    registry: Arc<Registry>,
    entry: Arc<ConnectionEntry>,
}

impl ConnectionHandle {
    /// Registers channel `number` (opened). The channel bumps the counters of the returned
    /// handle's [`ChannelEntry`]; dropping the handle unregisters it, keeping its counts in
    /// the vhost's totals.
    pub fn open_channel(&self, number: u16) -> ChannelHandle {
        let id = self.registry.next_channel.fetch_add(1, Ordering::Relaxed);
        bump(&self.registry.churn.channel_created);
        let ch = Arc::new(ChannelEntry::new(id, number));
        self.entry.channels.lock().insert(number, ch.clone());
        ChannelHandle {
            registry: self.registry.clone(),
            connection: self.entry.clone(),
            entry: ch,
        }
    }

    /// The connection's details.
    pub fn details(&self) -> &Arc<ConnectionDetails> {
        &self.entry.details
    }

    /// The connection's traffic counters and holds.
    pub fn io(&self) -> &Arc<ConnectionIo> {
        &self.entry.io
    }
}

/// A channel's place in the [`Registry`] (see [`ConnectionHandle::open_channel`]).
pub struct ChannelHandle {
    registry: Arc<Registry>,
    connection: Arc<ConnectionEntry>,
    entry: Arc<ChannelEntry>,
}

impl ChannelHandle {
    /// The channel's entry: its counters and modes.
    pub fn entry(&self) -> &Arc<ChannelEntry> {
        &self.entry
    }
}

impl Drop for ChannelHandle {
    fn drop(&mut self) {
        let mut channels = self.connection.channels.lock();
        // The connection may be gone already (its handle retired every channel), or the
        // number reused by a newer channel: only this entry is removed.
        if channels
            .get(self.entry.number)
            .is_some_and(|c| Arc::ptr_eq(c, &self.entry))
        {
            channels.remove(self.entry.number);
            drop(channels);
            bump(&self.registry.churn.channel_closed);
            self.registry.retire(
                &self.connection.details.vhost,
                &self.entry.counters.snapshot(),
            );
            self.registry
                .retire_exchanges(&self.connection.details.vhost, &self.entry);
        }
    }
}

impl Drop for ConnectionHandle {
    fn drop(&mut self) {
        self.registry
            .connections
            .write()
            .remove(&self.entry.details.id);
        let channels = std::mem::take(&mut *self.entry.channels.lock());
        bump(&self.registry.churn.connection_closed);
        bump_by(&self.registry.churn.channel_closed, channels.len() as u64);
        let mut total = MessageStats::default();
        for ch in channels.values() {
            total.add(&ch.counters.snapshot());
            self.registry
                .retire_exchanges(&self.entry.details.vhost, ch);
        }
        self.registry.retire(&self.entry.details.vhost, &total);
    }
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Registers a connection that completed its handshake; it stays listed until the handle
    /// is dropped.
    pub fn register(
        self: &Arc<Self>,
        details: ConnectionDetails,
        control: Arc<dyn ConnectionControl>,
    ) -> ConnectionHandle {
        self.register_with_io(details, control, Arc::default())
    }

    /// [`Registry::register`] with the connection's traffic counters, counting since before
    /// the handshake.
    pub fn register_with_io(
        self: &Arc<Self>,
        details: ConnectionDetails,
        control: Arc<dyn ConnectionControl>,
        io: Arc<ConnectionIo>,
    ) -> ConnectionHandle {
        let entry = Arc::new(ConnectionEntry {
            details: Arc::new(details),
            io,
            channels: Mutex::new(ChannelSet::default()),
            control,
        });
        self.connections
            .write()
            .insert(entry.details.id, entry.clone());
        bump(&self.churn.connection_created);
        ConnectionHandle {
            registry: self.clone(),
            entry,
        }
    }

    fn retire(&self, vhost: &str, stats: &MessageStats) {
        if *stats == MessageStats::default() {
            return;
        }
        self.retired
            .lock()
            .entry(vhost.to_string())
            .or_default()
            .add(stats);
    }

    fn retire_exchanges(&self, vhost: &str, ch: &ChannelEntry) {
        let counts = std::mem::take(&mut *ch.exchanges.lock());
        if counts.default.is_none() && counts.named.is_empty() {
            return;
        }
        let mut retired = self.retired_exchanges.lock();
        for (x, c) in counts.iter() {
            retired
                .entry((vhost.to_string(), x.to_string()))
                .or_default()
                .add(c);
        }
    }

    /// Messages through each exchange, per (vhost, exchange name), over open and closed
    /// channels. An exchange deleted and declared again keeps its counts.
    pub fn exchange_stats(&self) -> HashMap<(String, String), ExchangeCounts> {
        let mut out = self.retired_exchanges.lock().clone();
        for c in self.entries() {
            for ch in c.channels.lock().values() {
                for (x, n) in ch.exchanges.lock().iter() {
                    out.entry((c.details.vhost.clone(), x.to_string()))
                        .or_default()
                        .add(n);
                }
            }
        }
        out
    }

    fn entries(&self) -> Vec<Arc<ConnectionEntry>> {
        self.connections.read().values().cloned().collect()
    }

    /// The churn counters (shared with the vhosts, which count their queues).
    pub fn churn(&self) -> &Arc<ChurnCounters> {
        &self.churn
    }

    /// Connections open now (cheap: no snapshot).
    pub fn connection_count(&self) -> usize {
        self.connections.read().len()
    }

    /// Channels open now.
    pub fn channel_count(&self) -> usize {
        self.entries().iter().map(|c| c.channels.lock().len()).sum()
    }

    /// Every connection, oldest first.
    pub fn connections(&self) -> Vec<ConnectionSnapshot> {
        self.entries()
            .into_iter()
            .map(|c| {
                let channels = c.channels.lock();
                let mut stats = MessageStats::default();
                for ch in channels.values() {
                    stats.add(&ch.counters.snapshot());
                }
                ConnectionSnapshot {
                    details: c.details.clone(),
                    channels: channels.len(),
                    stats,
                    io: c.io.snapshot(),
                }
            })
            .collect()
    }

    /// The connection named `name` (RabbitMQ's name, see [`ConnectionDetails::name`]).
    pub fn connection(&self, name: &str) -> Option<ConnectionSnapshot> {
        self.connections()
            .into_iter()
            .find(|c| c.details.name == name)
    }

    /// Every channel of every connection (or of the connection named `connection`).
    pub fn channels(&self, connection: Option<&str>) -> Vec<ChannelSnapshot> {
        let mut out = Vec::new();
        for c in self.entries() {
            if connection.is_some_and(|n| n != c.details.name) {
                continue;
            }
            let channels: Vec<Arc<ChannelEntry>> = c.channels.lock().values().cloned().collect();
            for ch in channels {
                let probe = ch.probe();
                let l = |a: &AtomicU32| a.load(Ordering::Relaxed) as u16;
                out.push(ChannelSnapshot {
                    id: ch.id,
                    connection: c.details.clone(),
                    number: ch.number,
                    prefetch_count: l(&ch.prefetch),
                    global_prefetch_count: l(&ch.global_prefetch),
                    unacked: probe.as_ref().map_or(0, |p| p.unacked()),
                    unconfirmed: ch.unconfirmed.load(Ordering::Relaxed),
                    consumers: probe.as_ref().map_or_else(Vec::new, |p| p.consumers()),
                    confirm: ch.confirm.load(Ordering::Relaxed),
                    transactional: ch.tx.load(Ordering::Relaxed),
                    stats: ch.counters.snapshot(),
                    exchanges: {
                        let mut x: Vec<(String, ExchangeCounts)> = ch
                            .exchanges
                            .lock()
                            .iter()
                            .map(|(k, v)| (k.to_string(), *v))
                            .collect();
                        x.sort_by(|a, b| a.0.cmp(&b.0));
                        x
                    },
                    deliveries: probe.as_ref().map_or_else(Vec::new, |p| {
                        let mut d = p.deliveries();
                        d.sort_by(|a, b| a.queue.cmp(&b.queue));
                        d
                    }),
                });
            }
        }
        out
    }

    /// Message counts of `vhost`: its open channels' and those its closed channels left.
    pub fn vhost_stats(&self, vhost: &str) -> MessageStats {
        let mut total = self.retired.lock().get(vhost).copied().unwrap_or_default();
        for c in self.entries() {
            if c.details.vhost == vhost {
                for ch in c.channels.lock().values() {
                    total.add(&ch.counters.snapshot());
                }
            }
        }
        total
    }

    /// The counters of every open channel as (channel id, vhost, counts), without asking
    /// the channels anything (no probe, no channel lock): what a rate sampler reads.
    pub fn channel_counters(&self) -> Vec<(u64, Arc<ConnectionDetails>, MessageStats)> {
        let mut out = Vec::new();
        for c in self.entries() {
            for ch in c.channels.lock().values() {
                out.push((ch.id, c.details.clone(), ch.counters.snapshot()));
            }
        }
        out
    }

    /// Each open connection's traffic as (connection id, traffic), for a rate sampler.
    pub fn connection_io(&self) -> Vec<(u64, IoSnapshot)> {
        self.entries()
            .iter()
            .map(|c| (c.details.id, c.io.snapshot()))
            .collect()
    }

    /// Each open channel's counts per exchange published to, as (channel id, vhost,
    /// exchange, counts), for a rate sampler (each channel's map locked in turn, briefly).
    pub fn channel_exchange_counts(&self) -> Vec<(u64, String, String, ExchangeCounts)> {
        let mut out = Vec::new();
        for c in self.entries() {
            for ch in c.channels.lock().values() {
                for (x, n) in ch.exchanges.lock().iter() {
                    out.push((ch.id, c.details.vhost.clone(), x.to_string(), *n));
                }
            }
        }
        out
    }

    /// Each open channel's deliveries per queue as (channel id, vhost, deliveries), for a
    /// rate sampler (each channel is asked, as for [`Registry::channels`]).
    pub fn channel_deliveries(&self) -> Vec<(u64, String, QueueDeliveries)> {
        let mut out = Vec::new();
        for c in self.entries() {
            let channels: Vec<Arc<ChannelEntry>> = c.channels.lock().values().cloned().collect();
            for ch in channels {
                if let Some(p) = ch.probe() {
                    for d in p.deliveries() {
                        out.push((ch.id, c.details.vhost.clone(), d));
                    }
                }
            }
        }
        out
    }

    /// Message counts per vhost (open and closed channels), and of the whole node (which
    /// also holds what vhosts since deleted left), read in one pass.
    pub fn all_stats(&self) -> (HashMap<String, MessageStats>, MessageStats) {
        let mut per = self.retired.lock().clone();
        let mut node = *self.retired_gone.lock();
        for c in self.entries() {
            let v = per.entry(c.details.vhost.clone()).or_default();
            for ch in c.channels.lock().values() {
                v.add(&ch.counters.snapshot());
            }
        }
        for s in per.values() {
            node.add(s);
        }
        (per, node)
    }

    /// Message counts of the whole node since it started.
    pub fn global_stats(&self) -> MessageStats {
        let mut total = *self.retired_gone.lock();
        for s in self.retired.lock().values() {
            total.add(s);
        }
        for c in self.entries() {
            for ch in c.channels.lock().values() {
                total.add(&ch.counters.snapshot());
            }
        }
        total
    }

    /// Closes the connection named `name` with 320 CONNECTION_FORCED and `reason`; false
    /// when there is no such connection.
    pub fn close_connection(&self, name: &str, reason: &str) -> bool {
        let found = self.entries().into_iter().find(|c| c.details.name == name);
        match found {
            Some(c) => {
                c.control.force_close(reason);
                true
            }
            None => false,
        }
    }

    /// Closes every connection for which `select` holds; returns how many.
    pub fn close_where(&self, select: impl Fn(&ConnectionDetails) -> bool, reason: &str) -> usize {
        let mut n = 0;
        for c in self.entries() {
            if select(&c.details) {
                c.control.force_close(reason);
                n += 1;
            }
        }
        n
    }

    /// Forgets the closed channels' counts of a deleted vhost (they stay in the node's
    /// totals).
    pub fn forget_vhost(&self, vhost: &str) {
        if let Some(s) = self.retired.lock().remove(vhost) {
            self.retired_gone.lock().add(&s);
        }
        self.retired_exchanges.lock().retain(|(v, _), _| v != vhost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Closer(Mutex<Vec<String>>);
    impl ConnectionControl for Closer {
        fn force_close(&self, reason: &str) {
            self.0.lock().push(reason.to_string());
        }
    }

    fn details(id: u64, vhost: &str) -> ConnectionDetails {
        ConnectionDetails {
            id,
            name: format!("127.0.0.1:{} -> 127.0.0.1:5672", 40000 + id),
            peer: format!("127.0.0.1:{}", 40000 + id).parse().unwrap(),
            local: "127.0.0.1:5672".parse().unwrap(),
            user: "guest".into(),
            vhost: vhost.into(),
            protocol: "AMQP 0-9-1",
            tls: false,
            auth_mechanism: "PLAIN".into(),
            client_properties: FieldTable::new(),
            connected_at_ms: 0,
            frame_max: 131072,
            channel_max: 2047,
            heartbeat: 60,
        }
    }

    #[test]
    fn counts_survive_closed_channels_and_connections() {
        let r = Registry::new();
        let closer = Arc::new(Closer(Mutex::new(Vec::new())));
        let a = r.register(details(1, "/"), closer.clone());
        let b = r.register(details(2, "other"), closer.clone());
        let ch = a.open_channel(1);
        bump_by(&ch.entry().counters.publish, 3);
        bump(&ch.entry().counters.ack);
        let ch2 = b.open_channel(7);
        bump(&ch2.entry().counters.publish);
        assert_eq!(r.connection_count(), 2);
        assert_eq!(r.channel_count(), 2);
        assert_eq!(r.vhost_stats("/").publish, 3);
        drop(ch);
        assert_eq!(r.channel_count(), 1);
        assert_eq!(
            r.vhost_stats("/").publish,
            3,
            "closed channel's counts kept"
        );
        drop(b);
        drop(ch2);
        assert_eq!(r.connection_count(), 1);
        assert_eq!(r.vhost_stats("other").publish, 1);
        assert_eq!(r.global_stats().publish, 4);
        r.forget_vhost("other");
        assert_eq!(r.vhost_stats("other").publish, 0);
        assert_eq!(r.global_stats().publish, 4);
        assert_eq!(r.global_stats().ack, 1);
    }

    /// The default exchange (counted apart from the named ones) is listed, and kept when its
    /// channel closes, as any exchange.
    #[test]
    fn exchange_counts_include_the_default_exchange() {
        let r = Registry::new();
        let closer = Arc::new(Closer(Mutex::new(Vec::new())));
        let a = r.register(details(1, "/"), closer);
        let ch = a.open_channel(1);
        ch.entry().count_exchange("", 1);
        ch.entry().count_exchange("", 0);
        ch.entry().count_exchange("x", 3);
        let key = |x: &str| ("/".to_string(), x.to_string());
        let counts = |publish_in, publish_out| ExchangeCounts {
            publish_in,
            publish_out,
        };
        let open = r.exchange_stats();
        assert_eq!(open.len(), 2);
        assert_eq!(open[&key("")], counts(2, 1));
        assert_eq!(open[&key("x")], counts(1, 3));
        let mut listed: Vec<(String, ExchangeCounts)> = r
            .channel_exchange_counts()
            .into_iter()
            .map(|(_, _, x, c)| (x, c))
            .collect();
        listed.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            listed,
            vec![
                ("".to_string(), counts(2, 1)),
                ("x".to_string(), counts(1, 3))
            ]
        );
        drop(ch);
        assert_eq!(r.exchange_stats(), open, "closed channel's counts kept");
    }

    #[test]
    fn churn_counts_each_open_and_close_once() {
        let r = Registry::new();
        let closer = Arc::new(Closer(Mutex::new(Vec::new())));
        let a = r.register(details(1, "/"), closer.clone());
        let b = r.register(details(2, "/"), closer);
        let ch1 = a.open_channel(1);
        let _ch2 = a.open_channel(2);
        let ch3 = b.open_channel(1);
        drop(ch1);
        // The connection goes first: its open channel is closed with it, and the handle
        // dropped afterwards counts nothing more.
        drop(b);
        drop(ch3);
        drop(a);
        let c = r.churn().snapshot();
        assert_eq!((c.connection_created, c.connection_closed), (2, 2));
        assert_eq!((c.channel_created, c.channel_closed), (3, 3));
    }

    #[test]
    fn close_by_name_and_by_selection() {
        let r = Registry::new();
        let closer = Arc::new(Closer(Mutex::new(Vec::new())));
        let a = r.register(details(1, "/"), closer.clone());
        let _b = r.register(details(2, "v"), closer.clone());
        assert!(r.close_connection(&a.details().name, "bye"));
        assert!(!r.close_connection("nope", "bye"));
        assert_eq!(r.close_where(|d| d.vhost == "v", "vhost 'v' is deleted"), 1);
        assert_eq!(*closer.0.lock(), vec!["bye", "vhost 'v' is deleted"]);
        let ch = a.open_channel(3);
        assert_eq!(
            r.channels(None)[0].name(),
            format!("{} (3)", a.details().name)
        );
        ch.entry().set_prefetch(10, false);
        ch.entry().set_confirm();
        let snap = &r.channels(Some(&a.details().name))[0];
        assert_eq!(snap.prefetch_count, 10);
        assert!(snap.confirm);
        assert!(r.channels(Some("nope")).is_empty());
    }
}
