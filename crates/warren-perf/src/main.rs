//! `warren-perf`: a load generator for AMQP 0-9-1 brokers in the spirit of
//! RabbitMQ PerfTest. It measures throughput, end-to-end and confirm latency,
//! and checks that every confirmed message is consumed exactly once.
//!
//! `--mode` selects the workload: `classic` (the default: producers and
//! consumers on `amqprs`), or one of the scale and ceiling workloads on a raw
//! client built on `warren-amqp` ([`scale`], [`ceiling`]). Every mode reports
//! its own CPU (getrusage) and, with `--broker-pid`, the broker's.

mod ceiling;
mod cpu;
mod rawclient;
mod scale;
mod uri;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use amqprs::callbacks::{ChannelCallback, ConnectionCallback};
use amqprs::channel::{
    BasicAckArguments, BasicCancelArguments, BasicConsumeArguments, BasicPublishArguments,
    BasicQosArguments, Channel, ConfirmSelectArguments, ExchangeDeclareArguments,
    ExchangeDeleteArguments, QueueBindArguments, QueueDeclareArguments, QueueDeleteArguments,
};
use amqprs::connection::{Connection, OpenConnectionArguments};
use amqprs::{
    Ack, BasicProperties, Cancel, Close, CloseChannel, FieldTable, FieldValue, Nack, Return,
};
use async_trait::async_trait;
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::sync::{watch, Semaphore};

/// Size of the header every message body starts with:
/// run tag (u32 LE), producer id (u32 LE), sequence (u64 LE), send time in
/// microseconds since the start of this process (u64 LE).
const HEADER_LEN: usize = 24;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum ExchangeKind {
    Default,
    Direct,
    Fanout,
    Topic,
}

/// The type of the queues the classic mode declares (`x-queue-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
enum QueueType {
    /// Classic queues: no `x-queue-type` argument, durable with `--persistent`.
    Classic,
    /// Quorum queues: `x-queue-type = quorum`, always durable (brokers refuse
    /// transient quorum queues).
    Quorum,
}

/// The workload to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Mode {
    /// Producers and consumers on amqprs (workloads a-h, m).
    Classic,
    /// (i) Connection churn: connect, channel, confirm.select, exclusive
    /// queue, one confirmed publish, close; `--clients` in parallel.
    Churn,
    /// (j) Declare `--queues` durable queues bound to a topic exchange over
    /// `--parallel` connections, then measure the broker at rest for `--rest` s.
    ManyQueues,
    /// Delete the queues of many-queues.
    DeleteQueues,
    /// (k) `--connections` connections, each consuming from its own queue and
    /// publishing `--conn-rate` msg/s to it.
    ManyConnections,
    /// After a broker restart: time to connect, to the first basic.get
    /// (`--get`), and until every queue reports its depth (`--messages`).
    RestartCheck,
    /// (l) Fill `--queues` durable queues with `--messages` persistent messages.
    RecoveryFill,
    /// Raw-frame ceiling run: pre-encoded frames, 1 publisher and 1 consumer
    /// connection (`--relay`: against a copy-only relay).
    Raw,
    /// Copy-only TCP relay listening on `--listen` (the physical ceiling).
    Relay,
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "warren-perf",
    version,
    about = "AMQP 0-9-1 load generator: throughput, latency and exactly-once checks"
)]
struct Args {
    /// Broker URI (amqp://user:pass@host:port/vhost).
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    uri: String,
    /// Number of producers (one connection each).
    #[arg(long, default_value_t = 1)]
    producers: usize,
    /// Number of consumers (one connection each).
    #[arg(long, default_value_t = 1)]
    consumers: usize,
    /// Number of queues; producer i and consumer i use queue i mod N.
    #[arg(long, default_value_t = 1)]
    queues: usize,
    /// Queue name pattern; `%d` is replaced by the queue index.
    /// Default: perf-<run id>-%d.
    #[arg(long)]
    queue_pattern: Option<String>,
    /// Message body size in bytes (at least 24).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// How long producers publish, in seconds.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Publish rate cap per producer in msg/s (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Persistent messages (delivery_mode 2) and durable queues.
    #[arg(long)]
    persistent: bool,
    /// Publisher confirms with at most N unconfirmed messages per producer (0 = off).
    #[arg(long, default_value_t = 0)]
    confirm: usize,
    /// Consumer prefetch (basic.qos prefetch_count; 0 = unlimited).
    #[arg(long, default_value_t = 0)]
    prefetch: u16,
    /// Acknowledge every N messages with multiple=true (1 = ack each message).
    #[arg(long, default_value_t = 1)]
    multi_ack: u64,
    /// Consume with no_ack=true.
    #[arg(long)]
    auto_ack: bool,
    /// Exchange type used for publishing.
    #[arg(long, value_enum, default_value_t = ExchangeKind::Default)]
    exchange_type: ExchangeKind,
    /// Type of the queues declared by the classic mode: `quorum` declares them
    /// with `x-queue-type = quorum` (and durable, even without --persistent).
    #[arg(long, value_enum, default_value_t = QueueType::Classic)]
    queue_type: QueueType,
    /// Print only the final JSON line.
    #[arg(long)]
    json: bool,
    /// Only open N idle connections (one channel each) and hold them for --duration.
    #[arg(long, default_value_t = 0)]
    idle_connections: usize,
    /// After producers stop, consumers drain until everything published has
    /// arrived; they give up after this many seconds without any delivery.
    #[arg(long, default_value_t = 5)]
    drain: u64,
    /// Upper bound on the whole drain phase, in seconds.
    #[arg(long, default_value_t = 120)]
    drain_max: u64,
    /// Keep the queues (and exchange) at the end instead of deleting them.
    #[arg(long)]
    keep_queues: bool,
    /// Workload to run (see the list of modes in docs/benchmarks.md).
    #[arg(long, value_enum, default_value_t = Mode::Classic)]
    mode: Mode,
    /// Broker process id(s), comma separated, for broker CPU and RSS from
    /// /proc (RabbitMQ: beam.smp and erl_child_setup).
    #[arg(long, value_delimiter = ',')]
    broker_pid: Vec<u32>,
    /// churn: parallel clients.
    #[arg(long, default_value_t = 8)]
    clients: usize,
    /// many-queues, delete-queues: connections used in parallel.
    #[arg(long, default_value_t = 16)]
    parallel: usize,
    /// many-queues: seconds of rest over which the broker's idle CPU is measured.
    #[arg(long, default_value_t = 10)]
    rest: u64,
    /// many-connections: number of connections.
    #[arg(long, default_value_t = 10_000)]
    connections: usize,
    /// many-connections: messages per second each connection publishes.
    #[arg(long, default_value_t = 1.0)]
    conn_rate: f64,
    /// many-connections: seconds between the start of publishing and the
    /// measured window.
    #[arg(long, default_value_t = 3)]
    warmup: u64,
    /// recovery-fill: messages to publish; restart-check: messages expected
    /// over all queues.
    #[arg(long, default_value_t = 0)]
    messages: u64,
    /// restart-check: give up after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// restart-check: wait for a basic.get on the first queue to succeed.
    #[arg(long)]
    get: bool,
    /// restart-check: check only the last queue of the pattern.
    #[arg(long)]
    only_last: bool,
    /// raw: drive a copy-only relay (`--mode relay`) instead of a broker.
    #[arg(long)]
    relay: bool,
    /// relay: address to listen on.
    #[arg(long, default_value = "127.0.0.1:5690")]
    listen: String,
}

fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

fn now_us() -> u64 {
    base().elapsed().as_micros() as u64
}

/// A tag for this run, from the clock and the process id.
fn run_tag() -> u32 {
    static TAG: OnceLock<u32> = OnceLock::new();
    *TAG.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        (nanos ^ (nanos >> 32) ^ ((std::process::id() as u64) << 16)) as u32
    })
}

fn new_hist() -> Histogram<u64> {
    // 1 µs .. 1 hour, 3 significant digits.
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds")
}

#[derive(Default)]
struct Counters {
    published: AtomicU64,
    confirmed: AtomicU64,
    nacked: AtomicU64,
    consumed: AtomicU64,
    returned: AtomicU64,
}

type ErrorLog = Arc<Mutex<Vec<String>>>;

fn log_error(errors: &ErrorLog, msg: String) {
    let mut e = errors.lock().unwrap();
    if e.len() < 50 {
        e.push(msg);
    }
}

struct ConnCb {
    name: String,
    errors: ErrorLog,
}

#[async_trait]
impl ConnectionCallback for ConnCb {
    async fn close(&mut self, _c: &Connection, close: Close) -> Result<(), amqprs::error::Error> {
        log_error(
            &self.errors,
            format!("{}: connection closed by broker: {close}", self.name),
        );
        Ok(())
    }
    async fn blocked(&mut self, _c: &Connection, reason: String) {
        log_error(
            &self.errors,
            format!("{}: connection blocked: {reason}", self.name),
        );
    }
    async fn unblocked(&mut self, _c: &Connection) {}
    async fn secret_updated(&mut self, _c: &Connection) {}
}

/// Outstanding publisher confirms of one producer.
struct ConfirmState {
    /// delivery tag -> send time
    outstanding: BTreeMap<u64, Instant>,
    /// confirmed[seq] (delivery tag = seq + 1)
    confirmed: Vec<bool>,
    hist: Histogram<u64>,
}

impl ConfirmState {
    fn settle(&mut self, tag: u64, multiple: bool, ack: bool) -> u64 {
        let done: Vec<(u64, Instant)> = if multiple {
            let rest = self.outstanding.split_off(&(tag + 1));
            std::mem::replace(&mut self.outstanding, rest)
                .into_iter()
                .collect()
        } else {
            self.outstanding
                .remove(&tag)
                .map(|t| vec![(tag, t)])
                .unwrap_or_default()
        };
        let now = Instant::now();
        for (t, sent) in &done {
            if ack {
                let seq = (*t - 1) as usize;
                if self.confirmed.len() <= seq {
                    self.confirmed.resize(seq + 1, false);
                }
                self.confirmed[seq] = true;
                let us = now.duration_since(*sent).as_micros() as u64;
                self.hist.saturating_record(us.max(1));
            }
        }
        done.len() as u64
    }
}

struct ChanCb {
    name: String,
    errors: ErrorLog,
    counters: Arc<Counters>,
    confirms: Option<(Arc<Mutex<ConfirmState>>, Arc<Semaphore>)>,
}

#[async_trait]
impl ChannelCallback for ChanCb {
    async fn close(
        &mut self,
        _c: &Channel,
        close: CloseChannel,
    ) -> Result<(), amqprs::error::Error> {
        log_error(
            &self.errors,
            format!("{}: channel closed by broker: {close}", self.name),
        );
        Ok(())
    }
    async fn cancel(&mut self, _c: &Channel, cancel: Cancel) -> Result<(), amqprs::error::Error> {
        log_error(
            &self.errors,
            format!(
                "{}: consumer {} cancelled by broker",
                self.name,
                cancel.consumer_tag()
            ),
        );
        Ok(())
    }
    async fn flow(&mut self, _c: &Channel, active: bool) -> Result<bool, amqprs::error::Error> {
        Ok(active)
    }
    async fn publish_ack(&mut self, _c: &Channel, ack: Ack) {
        if let Some((state, sem)) = &self.confirms {
            let n = state
                .lock()
                .unwrap()
                .settle(ack.delivery_tag(), ack.mutiple(), true);
            self.counters.confirmed.fetch_add(n, Ordering::Relaxed);
            sem.add_permits(n as usize);
        }
    }
    async fn publish_nack(&mut self, _c: &Channel, nack: Nack) {
        if let Some((state, sem)) = &self.confirms {
            let n = state
                .lock()
                .unwrap()
                .settle(nack.delivery_tag(), nack.multiple(), false);
            self.counters.nacked.fetch_add(n, Ordering::Relaxed);
            sem.add_permits(n as usize);
        }
    }
    async fn publish_return(
        &mut self,
        _c: &Channel,
        _ret: Return,
        _p: BasicProperties,
        _content: Vec<u8>,
    ) {
        self.counters.returned.fetch_add(1, Ordering::Relaxed);
    }
}

#[derive(Clone)]
struct Ctx {
    args: Arc<Args>,
    conn_args: OpenConnectionArguments,
    run_tag: u32,
    counters: Arc<Counters>,
    errors: ErrorLog,
}

async fn open(ctx: &Ctx, name: &str) -> Result<(Connection, Channel), String> {
    let mut ca = ctx.conn_args.clone();
    ca.connection_name(name);
    let conn = Connection::open(&ca)
        .await
        .map_err(|e| format!("{name}: connect: {e}"))?;
    conn.register_callback(ConnCb {
        name: name.to_string(),
        errors: ctx.errors.clone(),
    })
    .await
    .map_err(|e| format!("{name}: {e}"))?;
    let ch = conn
        .open_channel(None)
        .await
        .map_err(|e| format!("{name}: channel.open: {e}"))?;
    Ok((conn, ch))
}

/// Where messages go: queue names, exchange and routing keys.
struct Topology {
    queues: Vec<String>,
    exchange: String,
    /// routing key used by producers targeting queue i
    keys: Vec<String>,
}

impl Topology {
    fn new(args: &Args, run_id: &str) -> Topology {
        let nq = match args.exchange_type {
            ExchangeKind::Fanout => args.queues.max(args.consumers).max(1),
            _ => args.queues.max(1),
        };
        let pattern = args
            .queue_pattern
            .clone()
            .unwrap_or_else(|| format!("perf-{run_id}-%d"));
        let queues: Vec<String> = (0..nq)
            .map(|i| {
                if pattern.contains("%d") {
                    pattern.replace("%d", &i.to_string())
                } else if nq == 1 {
                    pattern.clone()
                } else {
                    format!("{pattern}-{i}")
                }
            })
            .collect();
        let exchange = match args.exchange_type {
            ExchangeKind::Default => String::new(),
            k => format!("perf-{run_id}-{}", format!("{k:?}").to_lowercase()),
        };
        let keys = (0..nq)
            .map(|i| match args.exchange_type {
                ExchangeKind::Default | ExchangeKind::Direct => queues[i].clone(),
                ExchangeKind::Fanout => String::new(),
                ExchangeKind::Topic => format!("perf.{i}.msg"),
            })
            .collect();
        Topology {
            queues,
            exchange,
            keys,
        }
    }

    /// Queues a message from producer `p` ends up in.
    fn targets(&self, p: usize) -> Vec<usize> {
        if self.exchange.ends_with("-fanout") {
            (0..self.queues.len()).collect()
        } else {
            vec![p % self.queues.len()]
        }
    }

    async fn declare(&self, args: &Args, ch: &Channel) -> Result<(), String> {
        if !self.exchange.is_empty() {
            let kind = format!("{:?}", args.exchange_type).to_lowercase();
            let mut ed = ExchangeDeclareArguments::new(&self.exchange, &kind);
            ed.durable = args.persistent;
            ch.exchange_declare(ed)
                .await
                .map_err(|e| format!("exchange.declare {}: {e}", self.exchange))?;
        }
        for (i, q) in self.queues.iter().enumerate() {
            let mut qd = QueueDeclareArguments::new(q);
            match args.queue_type {
                QueueType::Classic => qd.durable(args.persistent),
                QueueType::Quorum => {
                    let mut t = FieldTable::new();
                    t.insert(
                        "x-queue-type".try_into().expect("short field name"),
                        FieldValue::from("quorum"),
                    );
                    qd.durable(true).arguments(t)
                }
            };
            let qd = qd.finish();
            ch.queue_declare(qd)
                .await
                .map_err(|e| format!("queue.declare {q}: {e}"))?;
            if !self.exchange.is_empty() {
                let key = match args.exchange_type {
                    ExchangeKind::Topic => format!("perf.{i}.#"),
                    _ => self.keys[i].clone(),
                };
                ch.queue_bind(QueueBindArguments::new(q, &self.exchange, &key))
                    .await
                    .map_err(|e| format!("queue.bind {q}: {e}"))?;
            }
        }
        Ok(())
    }

    async fn delete(&self, ch: &Channel) -> Result<(), String> {
        for q in &self.queues {
            ch.queue_delete(QueueDeleteArguments::new(q))
                .await
                .map_err(|e| format!("queue.delete {q}: {e}"))?;
        }
        if !self.exchange.is_empty() {
            ch.exchange_delete(ExchangeDeleteArguments::new(&self.exchange))
                .await
                .map_err(|e| format!("exchange.delete {}: {e}", self.exchange))?;
        }
        Ok(())
    }
}

struct ProducerResult {
    id: u32,
    published: u64,
    /// None when confirms are off.
    confirmed: Option<Vec<bool>>,
    confirm_hist: Histogram<u64>,
}

async fn producer(
    ctx: Ctx,
    id: u32,
    exchange: String,
    key: String,
    stop: Arc<AtomicBool>,
) -> Result<ProducerResult, String> {
    let args = ctx.args.clone();
    let name = format!("warren-perf-producer-{id}");
    let (conn, ch) = open(&ctx, &name).await?;
    let state = Arc::new(Mutex::new(ConfirmState {
        outstanding: BTreeMap::new(),
        confirmed: Vec::new(),
        hist: new_hist(),
    }));
    let sem = Arc::new(Semaphore::new(args.confirm.max(1)));
    ch.register_callback(ChanCb {
        name: name.clone(),
        errors: ctx.errors.clone(),
        counters: ctx.counters.clone(),
        confirms: (args.confirm > 0).then(|| (state.clone(), sem.clone())),
    })
    .await
    .map_err(|e| format!("{name}: {e}"))?;
    if args.confirm > 0 {
        ch.confirm_select(ConfirmSelectArguments::default())
            .await
            .map_err(|e| format!("{name}: confirm.select: {e}"))?;
    }
    let props = BasicProperties::default()
        .with_delivery_mode(if args.persistent { 2 } else { 1 })
        .finish();
    let mut body = vec![0u8; args.size];
    body[0..4].copy_from_slice(&ctx.run_tag.to_le_bytes());
    body[4..8].copy_from_slice(&id.to_le_bytes());
    let start = Instant::now();
    let mut seq: u64 = 0;
    let mut failure = None;
    while !stop.load(Ordering::Relaxed) {
        if args.rate > 0 {
            let due = start + Duration::from_secs_f64(seq as f64 / args.rate as f64);
            if due > Instant::now() {
                tokio::time::sleep_until(due.into()).await;
                if stop.load(Ordering::Relaxed) {
                    break;
                }
            }
        }
        if args.confirm > 0 {
            match tokio::time::timeout(Duration::from_millis(100), sem.acquire()).await {
                Ok(Ok(permit)) => permit.forget(),
                _ => continue,
            }
            state
                .lock()
                .unwrap()
                .outstanding
                .insert(seq + 1, Instant::now());
        }
        body[8..16].copy_from_slice(&seq.to_le_bytes());
        body[16..24].copy_from_slice(&now_us().to_le_bytes());
        if let Err(e) = ch
            .basic_publish(
                props.clone(),
                body.clone(),
                BasicPublishArguments::new(&exchange, &key),
            )
            .await
        {
            failure = Some(format!("{name}: basic.publish: {e}"));
            break;
        }
        seq += 1;
        ctx.counters.published.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(f) = &failure {
        log_error(&ctx.errors, f.clone());
    }
    if args.confirm > 0 && failure.is_none() {
        let deadline = Instant::now() + Duration::from_secs(args.drain.max(1));
        while !state.lock().unwrap().outstanding.is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let left = state.lock().unwrap().outstanding.len();
        if left > 0 {
            log_error(
                &ctx.errors,
                format!("{name}: {left} publishes still unconfirmed after drain"),
            );
        }
    }
    let _ = ch.close().await;
    let _ = conn.close().await;
    let mut st = state.lock().unwrap();
    Ok(ProducerResult {
        id,
        published: seq,
        confirmed: (args.confirm > 0).then(|| std::mem::take(&mut st.confirmed)),
        confirm_hist: st.hist.clone(),
    })
}

struct ConsumerResult {
    queue: usize,
    /// producer id -> count per sequence number
    seen: HashMap<u32, Vec<u8>>,
    hist: Histogram<u64>,
    foreign: u64,
}

async fn consumer(
    ctx: Ctx,
    id: usize,
    queue_idx: usize,
    queue: String,
    ready: tokio::sync::mpsc::Sender<Result<(), String>>,
    mut stop: watch::Receiver<bool>,
) -> Result<ConsumerResult, String> {
    let args = ctx.args.clone();
    let name = format!("warren-perf-consumer-{id}");
    let setup = async {
        let (conn, ch) = open(&ctx, &name).await?;
        ch.register_callback(ChanCb {
            name: name.clone(),
            errors: ctx.errors.clone(),
            counters: ctx.counters.clone(),
            confirms: None,
        })
        .await
        .map_err(|e| format!("{name}: {e}"))?;
        if args.prefetch > 0 {
            ch.basic_qos(BasicQosArguments::new(0, args.prefetch, false))
                .await
                .map_err(|e| format!("{name}: basic.qos: {e}"))?;
        }
        let ctag = format!("warren-perf-c{id}");
        let (ctag, rx) = ch
            .basic_consume_rx(
                BasicConsumeArguments::new(&queue, &ctag)
                    .manual_ack(!args.auto_ack)
                    .finish(),
            )
            .await
            .map_err(|e| format!("{name}: basic.consume {queue}: {e}"))?;
        Ok::<_, String>((conn, ch, ctag, rx))
    };
    let (conn, ch, ctag, mut rx) = match setup.await {
        Ok(v) => {
            let _ = ready.send(Ok(())).await;
            v
        }
        Err(e) => {
            let _ = ready.send(Err(e.clone())).await;
            return Err(e);
        }
    };
    let mut res = ConsumerResult {
        queue: queue_idx,
        seen: HashMap::new(),
        hist: new_hist(),
        foreign: 0,
    };
    let mut unacked: u64 = 0;
    let mut last_tag: u64 = 0;
    let mut failure = None;
    loop {
        let msg = tokio::select! {
            m = rx.recv() => m,
            _ = stop.changed() => break,
        };
        let Some(msg) = msg else {
            failure = Some(format!("{name}: delivery stream ended early"));
            break;
        };
        let now = now_us();
        let tag = msg.deliver.as_ref().map(|d| d.delivery_tag()).unwrap_or(0);
        let body = msg.content.unwrap_or_default();
        ctx.counters.consumed.fetch_add(1, Ordering::Relaxed);
        if body.len() >= HEADER_LEN && body[0..4] == ctx.run_tag.to_le_bytes() {
            let pid = u32::from_le_bytes(body[4..8].try_into().unwrap());
            let seq = u64::from_le_bytes(body[8..16].try_into().unwrap()) as usize;
            let sent = u64::from_le_bytes(body[16..24].try_into().unwrap());
            res.hist.saturating_record(now.saturating_sub(sent).max(1));
            let v = res.seen.entry(pid).or_default();
            if v.len() <= seq {
                v.resize(seq + 1, 0);
            }
            v[seq] = v[seq].saturating_add(1);
        } else {
            res.foreign += 1;
        }
        if !args.auto_ack {
            last_tag = tag;
            unacked += 1;
            if unacked >= args.multi_ack.max(1) {
                let multiple = args.multi_ack > 1;
                if let Err(e) = ch.basic_ack(BasicAckArguments::new(tag, multiple)).await {
                    failure = Some(format!("{name}: basic.ack: {e}"));
                    break;
                }
                unacked = 0;
            }
        }
    }
    if let Some(f) = failure {
        log_error(&ctx.errors, f);
    } else if unacked > 0 {
        let _ = ch.basic_ack(BasicAckArguments::new(last_tag, true)).await;
    }
    let _ = ch.basic_cancel(BasicCancelArguments::new(&ctag)).await;
    let _ = ch.close().await;
    let _ = conn.close().await;
    Ok(res)
}

#[derive(Serialize, Default)]
struct Report {
    // publish_rate_avg: published / publishing time;
    // consume_rate_avg: consumed / (publishing + drain time).
    run_id: String,
    uri_host: String,
    exchange_type: Option<ExchangeKind>,
    queue_type: Option<QueueType>,
    producers: usize,
    consumers: usize,
    queues: usize,
    size: usize,
    duration_s: u64,
    rate_per_producer: u64,
    persistent: bool,
    confirm: usize,
    prefetch: u16,
    multi_ack: u64,
    auto_ack: bool,
    published: u64,
    confirmed: u64,
    nacked: u64,
    returned: u64,
    consumed: u64,
    publish_rate_median: f64,
    consume_rate_median: f64,
    publish_rate_avg: f64,
    consume_rate_avg: f64,
    latency_p50_us: u64,
    latency_p95_us: u64,
    latency_p99_us: u64,
    latency_p999_us: u64,
    latency_max_us: u64,
    confirm_latency_p50_us: u64,
    confirm_latency_p99_us: u64,
    missing: u64,
    duplicates: u64,
    unexpected: u64,
    drain_s: f64,
    drain_incomplete: bool,
    idle_connections_requested: usize,
    idle_connections_opened: usize,
    idle_connect_time_ms: u64,
    /// Client and broker CPU while the producers were publishing (or while
    /// the idle connections were held).
    cpu: cpu::CpuReport,
    errors: Vec<String>,
}

fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn steady(v: &[f64]) -> &[f64] {
    if v.len() > 2 {
        &v[1..v.len() - 1]
    } else {
        v
    }
}

async fn idle_connections(ctx: Ctx, report: &mut Report) {
    let args = ctx.args.clone();
    let n = args.idle_connections;
    report.idle_connections_requested = n;
    let started = Instant::now();
    let mut held = Vec::with_capacity(n);
    let sem = Arc::new(Semaphore::new(16));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let ctx = ctx.clone();
        let sem = sem.clone();
        tasks.push(tokio::spawn(async move {
            let _p = sem.acquire().await;
            open(&ctx, &format!("warren-perf-idle-{i}")).await
        }));
    }
    for t in tasks {
        match t.await {
            Ok(Ok(c)) => held.push(c),
            Ok(Err(e)) => log_error(&ctx.errors, e),
            Err(e) => log_error(&ctx.errors, format!("idle task: {e}")),
        }
    }
    report.idle_connections_opened = held.len();
    report.idle_connect_time_ms = started.elapsed().as_millis() as u64;
    if !args.json {
        println!(
            "opened {}/{} idle connections in {} ms; holding for {} s",
            held.len(),
            n,
            report.idle_connect_time_ms,
            args.duration
        );
    }
    tokio::time::sleep(Duration::from_secs(args.duration)).await;
    let still_open = held
        .iter()
        .filter(|(c, ch)| c.is_open() && ch.is_open())
        .count();
    if still_open != held.len() {
        log_error(
            &ctx.errors,
            format!(
                "{} of {} idle connections were closed during the hold",
                held.len() - still_open,
                held.len()
            ),
        );
    }
    for (conn, ch) in held {
        let _ = ch.close().await;
        let _ = conn.close().await;
    }
}

async fn run(args: Args) -> Result<Report, String> {
    let _ = base();
    let u = uri::parse(&args.uri)?;
    let mut conn_args = OpenConnectionArguments::new(&u.host, u.port, &u.user, &u.password);
    conn_args.virtual_host(&u.vhost);
    let run_tag = run_tag();
    let run_id = format!("{run_tag:08x}");
    let args = Arc::new(args);
    let ctx = Ctx {
        args: args.clone(),
        conn_args,
        run_tag,
        counters: Arc::new(Counters::default()),
        errors: Arc::new(Mutex::new(Vec::new())),
    };
    let mut report = Report {
        run_id: run_id.clone(),
        uri_host: format!("{}:{}", u.host, u.port),
        queue_type: Some(args.queue_type),
        producers: args.producers,
        consumers: args.consumers,
        size: args.size,
        duration_s: args.duration,
        rate_per_producer: args.rate,
        persistent: args.persistent,
        confirm: args.confirm,
        prefetch: args.prefetch,
        multi_ack: args.multi_ack,
        auto_ack: args.auto_ack,
        ..Default::default()
    };

    if args.idle_connections > 0 {
        let meter = cpu::CpuMeter::start(&args.broker_pid);
        idle_connections(ctx.clone(), &mut report).await;
        report.cpu = meter.finish();
        report.errors = ctx.errors.lock().unwrap().clone();
        return Ok(report);
    }

    let topo = Arc::new(Topology::new(&args, &run_id));
    report.queues = topo.queues.len();
    report.exchange_type = Some(args.exchange_type);
    let (ctl_conn, ctl) = open(&ctx, "warren-perf-control").await?;
    topo.declare(&args, &ctl).await?;

    // Consumers first, so no message is published before somebody listens.
    let (stop_tx, stop_rx) = watch::channel(false);
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(args.consumers.max(1));
    let mut consumers = Vec::new();
    for c in 0..args.consumers {
        let qi = c % topo.queues.len();
        consumers.push(tokio::spawn(consumer(
            ctx.clone(),
            c,
            qi,
            topo.queues[qi].clone(),
            ready_tx.clone(),
            stop_rx.clone(),
        )));
    }
    drop(ready_tx);
    for _ in 0..args.consumers {
        match ready_rx.recv().await {
            Some(Ok(())) => {}
            Some(Err(e)) => return Err(e),
            None => return Err("consumer setup failed".into()),
        }
    }

    // Per-second reporter.
    let producing = Arc::new(AtomicBool::new(true));
    let reporter_stop = Arc::new(AtomicBool::new(false));
    let reporter = {
        let c = ctx.counters.clone();
        let producing = producing.clone();
        let rstop = reporter_stop.clone();
        let quiet = args.json;
        tokio::spawn(async move {
            let mut samples: Vec<(f64, f64)> = Vec::new();
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            let (mut lp, mut lc, mut lr) = (0u64, 0u64, 0u64);
            let mut last = Instant::now();
            let mut second = 0u64;
            while !rstop.load(Ordering::Relaxed) {
                tick.tick().await;
                let was_producing = producing.load(Ordering::Relaxed);
                let (p, cf, r) = (
                    c.published.load(Ordering::Relaxed),
                    c.confirmed.load(Ordering::Relaxed),
                    c.consumed.load(Ordering::Relaxed),
                );
                let dt = last.elapsed().as_secs_f64();
                last = Instant::now();
                second += 1;
                let (pr, cr, rr) = (
                    (p - lp) as f64 / dt,
                    (cf - lc) as f64 / dt,
                    (r - lr) as f64 / dt,
                );
                (lp, lc, lr) = (p, cf, r);
                if was_producing {
                    samples.push((pr, rr));
                }
                if !quiet {
                    println!(
                        "time {second:>3}s{} published {pr:>9.0} msg/s  confirmed {cr:>9.0} msg/s  consumed {rr:>9.0} msg/s",
                        if was_producing { "" } else { " (drain)" }
                    );
                }
            }
            samples
        })
    };

    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let meter = cpu::CpuMeter::start(&args.broker_pid);
    let mut producers = Vec::new();
    for p in 0..args.producers {
        let qi = p % topo.queues.len();
        producers.push(tokio::spawn(producer(
            ctx.clone(),
            p as u32,
            topo.exchange.clone(),
            topo.keys[qi].clone(),
            stop.clone(),
        )));
    }
    tokio::time::sleep(Duration::from_secs(args.duration)).await;
    stop.store(true, Ordering::Relaxed);
    producing.store(false, Ordering::Relaxed);
    let produce_secs = t0.elapsed().as_secs_f64();
    report.cpu = meter.finish();

    let mut presults = Vec::new();
    for p in producers {
        match p.await {
            Ok(Ok(r)) => presults.push(r),
            Ok(Err(e)) => log_error(&ctx.errors, e),
            Err(e) => log_error(&ctx.errors, format!("producer task: {e}")),
        }
    }

    // Drain: wait until every published message arrived (or the deadline).
    let expected_all: u64 = presults
        .iter()
        .map(|r| r.published * topo.targets(r.id as usize).len() as u64)
        .sum();
    // Consumers keep going while they make progress (a transient workload
    // without confirms can leave a large backlog), up to --drain-max; they
    // stop after --drain seconds without a single delivery.
    let hard_deadline = Instant::now() + Duration::from_secs(args.drain_max.max(args.drain));
    let idle_limit = Duration::from_secs(args.drain);
    let mut last_count = ctx.counters.consumed.load(Ordering::Relaxed);
    let mut last_progress = Instant::now();
    loop {
        let n = ctx.counters.consumed.load(Ordering::Relaxed);
        if n >= expected_all {
            break;
        }
        if n != last_count {
            last_count = n;
            last_progress = Instant::now();
        }
        if last_progress.elapsed() >= idle_limit || Instant::now() >= hard_deadline {
            report.drain_incomplete = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    report.drain_s = (t0.elapsed().as_secs_f64() - produce_secs).max(0.0);
    let consume_secs = t0.elapsed().as_secs_f64();
    let _ = stop_tx.send(true);
    let mut cresults = Vec::new();
    for c in consumers {
        match c.await {
            Ok(Ok(r)) => cresults.push(r),
            Ok(Err(e)) => log_error(&ctx.errors, e),
            Err(e) => log_error(&ctx.errors, format!("consumer task: {e}")),
        }
    }
    reporter_stop.store(true, Ordering::Relaxed);
    let samples = reporter.await.unwrap_or_default();

    if !args.keep_queues {
        if let Err(e) = topo.delete(&ctl).await {
            log_error(&ctx.errors, format!("cleanup: {e}"));
        }
    }
    let _ = ctl.close().await;
    let _ = ctl_conn.close().await;

    // Exactly-once accounting, per queue and producer.
    let mut per_queue: Vec<HashMap<u32, Vec<u8>>> = vec![HashMap::new(); topo.queues.len()];
    let mut lat = new_hist();
    let mut foreign = 0;
    for c in &cresults {
        lat.add(&c.hist).ok();
        foreign += c.foreign;
        let q = &mut per_queue[c.queue];
        for (pid, counts) in &c.seen {
            let v = q.entry(*pid).or_default();
            if v.len() < counts.len() {
                v.resize(counts.len(), 0);
            }
            for (i, n) in counts.iter().enumerate() {
                v[i] = v[i].saturating_add(*n);
            }
        }
    }
    let (mut missing, mut duplicates, mut unexpected) = (0u64, 0u64, foreign);
    let mut confirm_hist = new_hist();
    for r in &presults {
        confirm_hist.add(&r.confirm_hist).ok();
    }
    let by_id: HashMap<u32, &ProducerResult> = presults.iter().map(|r| (r.id, r)).collect();
    for (qi, q) in per_queue.iter().enumerate() {
        for r in &presults {
            if !topo.targets(r.id as usize).contains(&qi) {
                continue;
            }
            let counts = q.get(&r.id).map(|v| v.as_slice()).unwrap_or(&[]);
            for seq in 0..r.published as usize {
                let expected = match &r.confirmed {
                    Some(c) => c.get(seq).copied().unwrap_or(false),
                    None => true,
                };
                if expected && counts.get(seq).copied().unwrap_or(0) == 0 {
                    missing += 1;
                }
            }
        }
        for (pid, counts) in q {
            let known = by_id
                .get(pid)
                .map(|r| topo.targets(r.id as usize).contains(&qi))
                .unwrap_or(false);
            for (seq, n) in counts.iter().enumerate() {
                if *n > 1 {
                    duplicates += (*n - 1) as u64;
                }
                if *n > 0 && (!known || seq as u64 >= by_id[pid].published) {
                    unexpected += *n as u64;
                }
            }
        }
    }

    let c = &ctx.counters;
    report.published = c.published.load(Ordering::Relaxed);
    report.confirmed = c.confirmed.load(Ordering::Relaxed);
    report.nacked = c.nacked.load(Ordering::Relaxed);
    report.returned = c.returned.load(Ordering::Relaxed);
    report.consumed = c.consumed.load(Ordering::Relaxed);
    let pubs: Vec<f64> = samples.iter().map(|s| s.0).collect();
    let cons: Vec<f64> = samples.iter().map(|s| s.1).collect();
    report.publish_rate_median = median(steady(&pubs)).round();
    report.consume_rate_median = median(steady(&cons)).round();
    report.publish_rate_avg = (report.published as f64 / produce_secs).round();
    report.consume_rate_avg = (report.consumed as f64 / consume_secs).round();
    if !lat.is_empty() {
        report.latency_p50_us = lat.value_at_quantile(0.50);
        report.latency_p95_us = lat.value_at_quantile(0.95);
        report.latency_p99_us = lat.value_at_quantile(0.99);
        report.latency_p999_us = lat.value_at_quantile(0.999);
        report.latency_max_us = lat.max();
    }
    if !confirm_hist.is_empty() {
        report.confirm_latency_p50_us = confirm_hist.value_at_quantile(0.50);
        report.confirm_latency_p99_us = confirm_hist.value_at_quantile(0.99);
    }
    report.missing = missing;
    report.duplicates = duplicates;
    report.unexpected = unexpected;
    report.errors = ctx.errors.lock().unwrap().clone();
    Ok(report)
}

fn print_summary(r: &Report) {
    if r.idle_connections_requested > 0 {
        println!(
            "idle connections: {}/{} opened in {} ms",
            r.idle_connections_opened, r.idle_connections_requested, r.idle_connect_time_ms
        );
    } else {
        println!("---- summary (run {}) ----", r.run_id);
        println!(
            "published {}  confirmed {}  nacked {}  returned {}  consumed {}",
            r.published, r.confirmed, r.nacked, r.returned, r.consumed
        );
        println!(
            "steady-state median: published {} msg/s, consumed {} msg/s (average consumed {} msg/s)",
            r.publish_rate_median, r.consume_rate_median, r.consume_rate_avg
        );
        println!(
            "end-to-end latency µs: p50 {}  p95 {}  p99 {}  p99.9 {}  max {}",
            r.latency_p50_us,
            r.latency_p95_us,
            r.latency_p99_us,
            r.latency_p999_us,
            r.latency_max_us
        );
        if r.confirm > 0 {
            println!(
                "confirm latency µs: p50 {}  p99 {}",
                r.confirm_latency_p50_us, r.confirm_latency_p99_us
            );
        }
        println!(
            "missing {}  duplicates {}  unexpected {}  (drained for {:.1} s{})",
            r.missing,
            r.duplicates,
            r.unexpected,
            r.drain_s,
            if r.drain_incomplete {
                ", gave up: no deliveries for --drain seconds or --drain-max reached"
            } else {
                ""
            }
        );
    }
    let c = &r.cpu;
    print!(
        "load generator CPU {:.2} s ({:.0}%)",
        c.client_cpu_s, c.client_cpu_pct
    );
    if let (Some(b), Some(p)) = (c.broker_cpu_s, c.broker_cpu_pct) {
        print!("; broker CPU {b:.2} s ({p:.0}%)");
    }
    println!(" over {:.1} s", c.window_s);
    for e in &r.errors {
        println!("error: {e}");
    }
}

/// Runs one of the non-classic modes; the JSON report gets the errors.
async fn run_mode(args: Args) -> Result<serde_json::Value, String> {
    let _ = base();
    let u = uri::parse(&args.uri)?;
    let errors: ErrorLog = Arc::new(Mutex::new(Vec::new()));
    let mut v = match args.mode {
        Mode::Churn => scale::churn(&args, u, errors.clone()).await?,
        Mode::ManyQueues => scale::many_queues(&args, u, errors.clone()).await?,
        Mode::DeleteQueues => scale::delete_queues(&args, u, errors.clone()).await?,
        Mode::ManyConnections => scale::many_connections(&args, u, errors.clone()).await?,
        Mode::RestartCheck => scale::restart_check(&args, u).await?,
        Mode::RecoveryFill => ceiling::recovery_fill(&args, u, errors.clone()).await?,
        Mode::Raw => ceiling::raw(&args, u, errors.clone()).await?,
        Mode::Classic | Mode::Relay => unreachable!("handled in main"),
    };
    v["errors"] = serde_json::json!(errors.lock().unwrap().clone());
    Ok(v)
}

fn main() {
    let args = Args::parse();
    if args.mode == Mode::Relay {
        if let Err(e) = ceiling::relay(&args.listen) {
            eprintln!("warren-perf: {e}");
            std::process::exit(1);
        }
        return;
    }
    if args.mode != Mode::Classic {
        let json = args.json;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let result = rt.block_on(run_mode(args));
        let (v, code) = match result {
            Ok(v) => {
                let failed = v["errors"].as_array().is_some_and(|e| !e.is_empty())
                    || v["missing"].as_u64().is_some_and(|m| m > 0);
                (v, i32::from(failed))
            }
            Err(e) => {
                eprintln!("warren-perf: {e}");
                (serde_json::json!({ "errors": [e] }), 1)
            }
        };
        if !json {
            println!("{}", serde_json::to_string_pretty(&v).expect("json"));
        }
        println!("{}", serde_json::to_string(&v).expect("json"));
        rt.shutdown_timeout(Duration::from_secs(1));
        std::process::exit(code);
    }
    if args.size < HEADER_LEN {
        eprintln!("--size must be at least {HEADER_LEN} bytes");
        std::process::exit(64);
    }
    if !args.auto_ack && args.prefetch > 0 && args.multi_ack > args.prefetch as u64 {
        eprintln!("--multi-ack must not exceed --prefetch (the consumer would stall)");
        std::process::exit(64);
    }
    if args.idle_connections == 0 && (args.producers == 0 && args.consumers == 0) {
        eprintln!("nothing to do: no producers and no consumers");
        std::process::exit(64);
    }
    let json = args.json;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = rt.block_on(run(args));
    match result {
        Ok(report) => {
            if !json {
                print_summary(&report);
            }
            println!("{}", serde_json::to_string(&report).expect("json"));
            let code = if !report.errors.is_empty() {
                1
            } else if report.missing > 0 || report.duplicates > 0 {
                2
            } else {
                0
            };
            rt.shutdown_timeout(Duration::from_secs(1));
            std::process::exit(code);
        }
        Err(e) => {
            eprintln!("warren-perf: {e}");
            if json {
                let r = Report {
                    errors: vec![e],
                    ..Default::default()
                };
                println!("{}", serde_json::to_string(&r).expect("json"));
            }
            std::process::exit(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> ConfirmState {
        ConfirmState {
            outstanding: BTreeMap::new(),
            confirmed: Vec::new(),
            hist: new_hist(),
        }
    }

    #[test]
    fn confirms_single_and_multiple() {
        let mut st = state();
        for tag in 1..=5 {
            st.outstanding.insert(tag, Instant::now());
        }
        assert_eq!(st.settle(2, false, true), 1);
        assert_eq!(st.settle(4, true, true), 3); // 1, 3 and 4 (2 already settled)
        assert_eq!(st.confirmed, vec![true, true, true, true]);
        assert_eq!(st.settle(5, false, false), 1); // nack
        assert_eq!(st.confirmed.len(), 4);
        assert!(st.outstanding.is_empty());
        assert_eq!(st.settle(9, true, true), 0);
    }

    #[test]
    fn steady_state_median_drops_edges() {
        assert_eq!(median(steady(&[1.0, 10.0, 12.0, 11.0, 100.0])), 11.0);
        assert_eq!(median(steady(&[5.0, 7.0])), 6.0);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn fanout_targets_every_queue() {
        let args = Args::parse_from([
            "warren-perf",
            "--exchange-type",
            "fanout",
            "--consumers",
            "4",
        ]);
        let t = Topology::new(&args, "x");
        assert_eq!(t.queues.len(), 4);
        assert_eq!(t.targets(0), vec![0, 1, 2, 3]);
        let args = Args::parse_from(["warren-perf", "--queues", "3", "--queue-pattern", "q-%d"]);
        let t = Topology::new(&args, "x");
        assert_eq!(t.queues, vec!["q-0", "q-1", "q-2"]);
        assert_eq!(t.targets(4), vec![1]);
        assert_eq!(t.keys[2], "q-2");
    }
}
