//! `warren-soak`: a long-running mixed workload against an AMQP 0-9-1 broker, with the
//! exactly-once check of [`ledger`]. bench/soak.sh starts the broker, runs this driver, samples
//! the broker's memory and file descriptors, and checks the end state.
//!
//! For `--duration` seconds, over connections that each live a random time and then close
//! cleanly or are cut at the TCP level ([`proxy`]):
//!
//! * publishers send with publisher confirms (window 100) to work queues (durable, persistent
//!   messages half the time), a TTL queue that dead-letters, a `reject-publish` length-limited
//!   queue and a `drop-head` length-limited queue that dead-letters;
//! * consumers (one per work queue, one on the drop-head queue, one on the dead-letter queue)
//!   ack, multiple-ack, nack with requeue, and reject without requeue (to the dead-letter
//!   queue) at random, with a random prefetch;
//! * getters drain the `reject-publish` queue with basic.get;
//! * churners declare, use and drop short-lived queues (exclusive, auto-delete, `x-expires`,
//!   deleted explicitly).
//!
//! Then publishing stops, disconnects stop, consumers drain every queue, and the ledger is
//! checked: every confirmed message consumed, none twice, `redelivered` set where it must be,
//! no refused message delivered, every churned queue gone. The driver prints a JSON summary
//! and exits 1 if a check failed.

mod ledger;
mod proxy;

use amqprs::callbacks::{ChannelCallback, ConnectionCallback};
use amqprs::channel::{
    BasicAckArguments, BasicConsumeArguments, BasicGetArguments, BasicNackArguments,
    BasicPublishArguments, BasicQosArguments, BasicRejectArguments, Channel,
    ConfirmSelectArguments, QueueDeclareArguments, QueueDeleteArguments,
};
use amqprs::connection::{Connection, OpenConnectionArguments};
use amqprs::{
    Ack, BasicProperties, Cancel, Close, CloseChannel, FieldTable, FieldValue, Nack, Return,
};
use async_trait::async_trait;
use clap::Parser;
use ledger::{DeliveryRef, Ledger, MsgId, Settle};
use proxy::Proxy;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "warren-soak",
    about = "Soak test: mixed publish/consume load with random disconnects and an exactly-once check"
)]
struct Args {
    /// Broker address (host:port).
    #[arg(long, default_value = "127.0.0.1:5672")]
    broker: SocketAddr,
    #[arg(long, default_value = "guest")]
    user: String,
    #[arg(long, default_value = "guest")]
    password: String,
    /// Seconds of load (then the drain).
    #[arg(long, default_value_t = 60)]
    duration: u64,
    /// Work queues (each with one consumer).
    #[arg(long, default_value_t = 4)]
    queues: usize,
    /// Publishers.
    #[arg(long, default_value_t = 4)]
    publishers: usize,
    /// Publish rate per publisher, msg/s.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// Getters (basic.get on the length-limited queue).
    #[arg(long, default_value_t = 1)]
    getters: usize,
    /// Queue churners.
    #[arg(long, default_value_t = 1)]
    churners: usize,
    /// Longest life of one client connection, ms (each lives a random time up to this).
    #[arg(long, default_value_t = 8000)]
    max_life_ms: u64,
    /// Percent of connection ends that are abrupt disconnects rather than connection.close.
    #[arg(long, default_value_t = 50)]
    drop_percent: u64,
    /// Largest message body, bytes (at least 24).
    #[arg(long, default_value_t = 2048)]
    max_size: usize,
    /// Most seconds the drain may take once publishing stopped.
    #[arg(long, default_value_t = 180)]
    drain: u64,
    /// Random seed (default: from the clock).
    #[arg(long)]
    seed: Option<u64>,
}

/// Body header: run tag (u32 LE), publisher connection id (u32 LE), sequence (u64 LE).
const HEADER_LEN: usize = 16;

/// A small xorshift64* generator: reproducible per seed, no dependency.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Uniform in lo..hi (hi > lo).
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
    fn percent(&mut self, p: u64) -> bool {
        self.next() % 100 < p
    }
}

/// The generator of task `id` of a kind (`salt`), derived from the run's seed.
fn task_rng(sh: &Shared, salt: u64, id: usize) -> Rng {
    Rng::new(sh.args.seed.unwrap_or(1) ^ ((id as u64 + 1) * salt))
}

#[derive(Default, serde::Serialize)]
struct Counters {
    connections: AtomicU64,
    clean_closes: AtomicU64,
    failed_closes: AtomicU64,
    disconnects: AtomicU64,
    connect_failures: AtomicU64,
    published: AtomicU64,
    gets: AtomicU64,
    get_empty: AtomicU64,
    churn_queues: AtomicU64,
    confirm_timeouts: AtomicU64,
    channel_errors: AtomicU64,
}

/// Queue roles, by ledger index: work queues 0..n, then these.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Work(usize),
    Ttl,
    Limited,
    DropHead,
    DeadLetter,
}

struct Shared {
    args: Args,
    tag: u32,
    prefix: String,
    ledger: Mutex<Ledger>,
    counters: Counters,
    /// Publishers, getters and churners stop.
    stop_load: AtomicBool,
    /// No more disconnects, consumers ack everything at once.
    calm: AtomicBool,
    /// Consumers stop.
    stop_all: AtomicBool,
    errors: Mutex<Vec<String>>,
    /// connection.close frames from the broker.
    server_closes: Arc<Mutex<Vec<String>>>,
    /// Churned queues that must disappear by themselves (exclusive, auto-delete, x-expires).
    churned: Mutex<Vec<String>>,
}

impl Shared {
    fn queue_name(&self, role: Role) -> String {
        match role {
            Role::Work(i) => format!("{}w{i}", self.prefix),
            Role::Ttl => format!("{}ttl", self.prefix),
            Role::Limited => format!("{}lim", self.prefix),
            Role::DropHead => format!("{}dh", self.prefix),
            Role::DeadLetter => format!("{}dlq", self.prefix),
        }
    }
    fn index(&self, role: Role) -> u8 {
        let n = self.args.queues;
        (match role {
            Role::Work(i) => i,
            Role::Ttl => n,
            Role::Limited => n + 1,
            Role::DropHead => n + 2,
            Role::DeadLetter => n + 3,
        }) as u8
    }
    fn roles(&self) -> Vec<Role> {
        let mut r: Vec<Role> = (0..self.args.queues).map(Role::Work).collect();
        r.extend([Role::Ttl, Role::Limited, Role::DropHead, Role::DeadLetter]);
        r
    }
    fn error(&self, e: String) {
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 30 {
            errors.push(e);
        }
    }
}

fn table(entries: &[(&str, FieldValue)]) -> FieldTable {
    let mut t = FieldTable::new();
    for (k, v) in entries {
        t.insert((*k).try_into().expect("short field name"), v.clone());
    }
    t
}

fn conn_args(sh: &Shared, port: u16, name: &str) -> OpenConnectionArguments {
    let mut a = OpenConnectionArguments::new("127.0.0.1", port, &sh.args.user, &sh.args.password);
    a.connection_name(name);
    a
}

/// Opens a connection through `proxy` (or straight to the broker) and one channel.
async fn connect(sh: &Shared, proxy: Option<&Proxy>, name: &str) -> Option<(Connection, Channel)> {
    let port = proxy.map_or(sh.args.broker.port(), |p| p.port);
    for _ in 0..50 {
        let attempt = async {
            let conn = Connection::open(&conn_args(sh, port, name)).await.ok()?;
            conn.register_callback(ConnErrors {
                name: name.to_string(),
                errors: sh.server_closes.clone(),
            })
            .await
            .ok()?;
            let ch = conn.open_channel(None).await.ok()?;
            Some((conn, ch))
        };
        if let Ok(Some(c)) = tokio::time::timeout(Duration::from_secs(10), attempt).await {
            sh.counters.connections.fetch_add(1, Ordering::Relaxed);
            return Some(c);
        }
        sh.counters.connect_failures.fetch_add(1, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sh.error(format!("{name}: could not connect 50 times in a row"));
    None
}

/// Ends a connection: cut at the TCP level (unless calm) with probability `drop_percent`,
/// otherwise connection.close. Returns true for a clean close.
async fn finish(sh: &Shared, conn: Connection, proxy: &Proxy, rng: &mut Rng) -> bool {
    let cut = !sh.calm.load(Ordering::Relaxed) && rng.percent(sh.args.drop_percent);
    end(sh, conn, proxy, cut).await
}

/// Ends a consumer's connection like [`finish`]. Unless it is cut, a basic.qos round trip on
/// `ch` first proves that the broker processed every ack sent before it (a channel's methods
/// are handled in order), so the acks count as settled even if connection.close then fails.
/// Returns true when the acks are known to have been processed.
async fn finish_settled(
    sh: &Shared,
    conn: Connection,
    ch: &Channel,
    proxy: &Proxy,
    rng: &mut Rng,
) -> bool {
    let cut = !sh.calm.load(Ordering::Relaxed) && rng.percent(sh.args.drop_percent);
    let synced = !cut
        && tokio::time::timeout(
            Duration::from_secs(10),
            ch.basic_qos(BasicQosArguments::new(0, 1, false)),
        )
        .await
        .is_ok_and(|r| r.is_ok());
    end(sh, conn, proxy, cut).await || synced
}

/// Ends a connection: cut at the TCP level, or connection.close. True for a clean close.
///
/// amqprs can report a close as failed ("internal communication error: channel closed") when
/// the broker's close-ok and the end of the socket arrive before it registered its wait for
/// the close-ok; such closes are counted in `failed_closes`.
async fn end(sh: &Shared, conn: Connection, proxy: &Proxy, cut: bool) -> bool {
    if cut {
        proxy.cut();
        drop(conn);
        sh.counters.disconnects.fetch_add(1, Ordering::Relaxed);
        return false;
    }
    let name = conn.connection_name().to_string();
    let clean = match tokio::time::timeout(Duration::from_secs(10), conn.close()).await {
        Ok(Ok(())) => true,
        Ok(Err(_)) => false,
        Err(_) => {
            sh.error(format!("{name}: connection.close timed out"));
            false
        }
    };
    if clean {
        sh.counters.clean_closes.fetch_add(1, Ordering::Relaxed);
    } else {
        sh.counters.failed_closes.fetch_add(1, Ordering::Relaxed);
    }
    clean
}

/// Records connection.close sent by the broker (the soak never provokes one).
struct ConnErrors {
    name: String,
    errors: Arc<Mutex<Vec<String>>>,
}

#[async_trait]
impl ConnectionCallback for ConnErrors {
    async fn close(&mut self, _c: &Connection, close: Close) -> Result<(), amqprs::error::Error> {
        let mut e = self.errors.lock().unwrap();
        if e.len() < 30 {
            e.push(format!(
                "{}: connection closed by the broker: {close}",
                self.name
            ));
        }
        Ok(())
    }
    async fn blocked(&mut self, _c: &Connection, _reason: String) {}
    async fn unblocked(&mut self, _c: &Connection) {}
    async fn secret_updated(&mut self, _c: &Connection) {}
}

struct ChanErrors {
    sh: Arc<Shared>,
    name: String,
    confirms: Option<PubConfirms>,
}

#[derive(Clone)]
struct PubConfirms {
    conn: u32,
    outstanding: Arc<Mutex<BTreeSet<u64>>>,
    window: Arc<Semaphore>,
}

impl PubConfirms {
    fn settle(&self, sh: &Shared, tag: u64, multiple: bool, ack: bool) {
        let done: Vec<u64> = {
            let mut o = self.outstanding.lock().unwrap();
            if multiple {
                let rest = o.split_off(&(tag + 1));
                std::mem::replace(&mut *o, rest).into_iter().collect()
            } else if o.remove(&tag) {
                vec![tag]
            } else {
                vec![]
            }
        };
        let mut l = sh.ledger.lock().unwrap();
        for t in &done {
            l.confirmed((self.conn, *t), ack);
        }
        drop(l);
        self.window.add_permits(done.len());
    }
}

#[async_trait]
impl ChannelCallback for ChanErrors {
    async fn close(
        &mut self,
        _c: &Channel,
        close: CloseChannel,
    ) -> Result<(), amqprs::error::Error> {
        self.sh
            .counters
            .channel_errors
            .fetch_add(1, Ordering::Relaxed);
        self.sh
            .error(format!("{}: channel closed by broker: {close}", self.name));
        Ok(())
    }
    async fn cancel(&mut self, _c: &Channel, cancel: Cancel) -> Result<(), amqprs::error::Error> {
        self.sh.error(format!(
            "{}: consumer {} cancelled by broker",
            self.name,
            cancel.consumer_tag()
        ));
        Ok(())
    }
    async fn flow(&mut self, _c: &Channel, active: bool) -> Result<bool, amqprs::error::Error> {
        Ok(active)
    }
    async fn publish_ack(&mut self, _c: &Channel, ack: Ack) {
        if let Some(p) = &self.confirms {
            p.settle(&self.sh, ack.delivery_tag(), ack.mutiple(), true);
        }
    }
    async fn publish_nack(&mut self, _c: &Channel, nack: Nack) {
        if let Some(p) = &self.confirms {
            p.settle(&self.sh, nack.delivery_tag(), nack.multiple(), false);
        }
    }
    async fn publish_return(&mut self, _c: &Channel, _r: Return, _p: BasicProperties, _b: Vec<u8>) {
    }
}

fn parse_id(sh: &Shared, body: &[u8]) -> Option<MsgId> {
    let h = body.get(..HEADER_LEN)?;
    let tag = u32::from_le_bytes(h[0..4].try_into().ok()?);
    (tag == sh.tag).then(|| {
        (
            u32::from_le_bytes(h[4..8].try_into().expect("4 bytes")),
            u64::from_le_bytes(h[8..16].try_into().expect("8 bytes")),
        )
    })
}

async fn publisher(sh: Arc<Shared>, id: usize) {
    let mut rng = task_rng(&sh, 7919, id);
    let Ok(proxy) = Proxy::start(sh.args.broker).await else {
        sh.error("proxy: cannot listen".into());
        return;
    };
    let roles = sh.roles();
    let per_msg = Duration::from_micros(1_000_000 / sh.args.rate.max(1));
    while !sh.stop_load.load(Ordering::Relaxed) {
        let name = format!("soak-publisher-{id}");
        let Some((conn, ch)) = connect(&sh, Some(&proxy), &name).await else {
            return;
        };
        let conn_id = sh.ledger.lock().unwrap().open_conn();
        let confirms = PubConfirms {
            conn: conn_id,
            outstanding: Arc::new(Mutex::new(BTreeSet::new())),
            window: Arc::new(Semaphore::new(100)),
        };
        let cb = ChanErrors {
            sh: sh.clone(),
            name: name.clone(),
            confirms: Some(confirms.clone()),
        };
        let ready = ch.register_callback(cb).await.is_ok()
            && ch
                .confirm_select(ConfirmSelectArguments::default())
                .await
                .is_ok();
        let deadline =
            Instant::now() + Duration::from_millis(rng.range(200, sh.args.max_life_ms.max(201)));
        let mut seq = 0u64;
        let mut next = tokio::time::Instant::now();
        while ready && Instant::now() < deadline && !sh.stop_load.load(Ordering::Relaxed) {
            tokio::time::sleep_until(next).await;
            next += per_msg;
            let Ok(Ok(permit)) =
                tokio::time::timeout(Duration::from_secs(30), confirms.window.acquire()).await
            else {
                break;
            };
            permit.forget();
            seq += 1;
            let role = match rng.next() % 10 {
                0 => Role::Ttl,
                1 => Role::Limited,
                2 => Role::DropHead,
                _ => roles[rng.next() as usize % sh.args.queues.max(1)],
            };
            let size = rng.range(
                HEADER_LEN as u64,
                sh.args.max_size.max(HEADER_LEN + 1) as u64,
            ) as usize;
            let mut body = Vec::with_capacity(size);
            body.extend_from_slice(&sh.tag.to_le_bytes());
            body.extend_from_slice(&conn_id.to_le_bytes());
            body.extend_from_slice(&seq.to_le_bytes());
            body.resize(size, (seq % 251) as u8);
            let mut props = BasicProperties::default();
            if matches!(role, Role::Work(_)) && rng.percent(50) {
                props.with_delivery_mode(2);
            }
            sh.ledger.lock().unwrap().published((conn_id, seq));
            confirms.outstanding.lock().unwrap().insert(seq);
            let args = BasicPublishArguments::new("", &sh.queue_name(role));
            if ch.basic_publish(props.finish(), body, args).await.is_err() {
                break;
            }
            sh.counters.published.fetch_add(1, Ordering::Relaxed);
        }
        let calm = sh.calm.load(Ordering::Relaxed) || sh.stop_load.load(Ordering::Relaxed);
        let dropping = !calm && rng.percent(sh.args.drop_percent);
        if !dropping {
            // A clean close waits for the broker's answer to every publish first.
            let t = Instant::now();
            while !confirms.outstanding.lock().unwrap().is_empty() && conn.is_open() {
                if t.elapsed() > Duration::from_secs(30) {
                    let n = confirms.outstanding.lock().unwrap().len() as u64;
                    sh.counters.confirm_timeouts.fetch_add(n, Ordering::Relaxed);
                    sh.error(format!("{name}: {n} publishes unconfirmed after 30 s"));
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let clean = end(&sh, conn, &proxy, dropping).await;
        sh.ledger.lock().unwrap().end_conn(conn_id, clean);
    }
}

async fn consumer(sh: Arc<Shared>, role: Role, id: usize) {
    let mut rng = task_rng(&sh, 104_729, id);
    let Ok(proxy) = Proxy::start(sh.args.broker).await else {
        sh.error("proxy: cannot listen".into());
        return;
    };
    let queue = sh.queue_name(role);
    let qi = sh.index(role);
    while !sh.stop_all.load(Ordering::Relaxed) {
        let name = format!("soak-consumer-{queue}");
        let Some((conn, ch)) = connect(&sh, Some(&proxy), &name).await else {
            return;
        };
        let conn_id = sh.ledger.lock().unwrap().open_conn();
        let _ = ch
            .register_callback(ChanErrors {
                sh: sh.clone(),
                name: name.clone(),
                confirms: None,
            })
            .await;
        let prefetch = rng.range(1, 101) as u16;
        let consume = async {
            ch.basic_qos(BasicQosArguments::new(0, prefetch, false))
                .await
                .ok()?;
            ch.basic_consume_rx(
                BasicConsumeArguments::new(&queue, "")
                    .manual_ack(true)
                    .finish(),
            )
            .await
            .ok()
        };
        let Some((_tag, mut rx)) = consume.await else {
            let clean = finish(&sh, conn, &proxy, &mut rng).await;
            sh.ledger.lock().unwrap().end_conn(conn_id, clean);
            continue;
        };
        let deadline =
            Instant::now() + Duration::from_millis(rng.range(200, sh.args.max_life_ms.max(201)));
        // Deliveries acked in the next multiple ack.
        let mut pending: BTreeMap<u64, Option<DeliveryRef>> = BTreeMap::new();
        let max_batch = u64::from(prefetch).clamp(1, 10);
        let mut batch = rng.range(1, max_batch + 1) as usize;
        loop {
            let calm = sh.calm.load(Ordering::Relaxed);
            if sh.stop_all.load(Ordering::Relaxed) || (!calm && Instant::now() >= deadline) {
                break;
            }
            let msg = match tokio::time::timeout(Duration::from_millis(200), rx.recv()).await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(_) => {
                    if !conn.is_open() {
                        break;
                    }
                    // Idle: ack what is held back, or a batch larger than what the broker
                    // may have in flight would never fill.
                    if let Some((&last, _)) = pending.last_key_value() {
                        if ch
                            .basic_ack(BasicAckArguments::new(last, true))
                            .await
                            .is_err()
                        {
                            break;
                        }
                        for (_, d) in std::mem::take(&mut pending) {
                            settle(&sh, d, Settle::Ack);
                        }
                    }
                    continue;
                }
            };
            let (Some(deliver), Some(body)) = (msg.deliver, msg.content) else {
                continue;
            };
            let tag = deliver.delivery_tag();
            let dref = match parse_id(&sh, &body) {
                Some(id) => {
                    sh.ledger
                        .lock()
                        .unwrap()
                        .delivered(id, qi, deliver.redelivered(), conn_id)
                }
                None => {
                    sh.ledger.lock().unwrap().unexpected += 1;
                    None
                }
            };
            if role == Role::DropHead && !calm {
                // A slow consumer, so that the queue overflows and drops its head.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let r = rng.next() % 100;
            if !calm && matches!(role, Role::Work(_)) && r < 3 {
                if ch
                    .basic_reject(BasicRejectArguments::new(tag, false))
                    .await
                    .is_err()
                {
                    break;
                }
                settle(&sh, dref, Settle::Reject);
            } else if !calm && r < 8 {
                if ch
                    .basic_nack(BasicNackArguments::new(tag, false, true))
                    .await
                    .is_err()
                {
                    break;
                }
                settle(&sh, dref, Settle::Requeue);
            } else {
                pending.insert(tag, dref);
                if calm || pending.len() >= batch {
                    if ch
                        .basic_ack(BasicAckArguments::new(tag, true))
                        .await
                        .is_err()
                    {
                        break;
                    }
                    for (_, d) in std::mem::take(&mut pending) {
                        settle(&sh, d, Settle::Ack);
                    }
                    batch = rng.range(1, max_batch + 1) as usize;
                }
            }
        }
        if let Some((&last, _)) = pending.last_key_value() {
            if ch
                .basic_ack(BasicAckArguments::new(last, true))
                .await
                .is_ok()
            {
                for (_, d) in std::mem::take(&mut pending) {
                    settle(&sh, d, Settle::Ack);
                }
            }
        }
        let clean = finish_settled(&sh, conn, &ch, &proxy, &mut rng).await;
        sh.ledger.lock().unwrap().end_conn(conn_id, clean);
    }
}

fn settle(sh: &Shared, d: Option<DeliveryRef>, how: Settle) {
    if let Some(d) = d {
        sh.ledger.lock().unwrap().settle(d, how);
    }
}

/// basic.get on the length-limited queue (and now and then a work queue), manual ack.
async fn getter(sh: Arc<Shared>, id: usize) {
    let mut rng = task_rng(&sh, 15_485_863, id);
    let Ok(proxy) = Proxy::start(sh.args.broker).await else {
        return;
    };
    while !sh.stop_all.load(Ordering::Relaxed) {
        let Some((conn, ch)) = connect(&sh, Some(&proxy), &format!("soak-getter-{id}")).await
        else {
            return;
        };
        let conn_id = sh.ledger.lock().unwrap().open_conn();
        let deadline =
            Instant::now() + Duration::from_millis(rng.range(200, sh.args.max_life_ms.max(201)));
        while Instant::now() < deadline && !sh.stop_all.load(Ordering::Relaxed) {
            let role = if rng.percent(80) {
                Role::Limited
            } else {
                Role::Work(rng.next() as usize % sh.args.queues.max(1))
            };
            let got = ch
                .basic_get(BasicGetArguments::new(&sh.queue_name(role)))
                .await;
            let Ok(got) = got else { break };
            let Some((ok, _props, body)) = got else {
                sh.counters.get_empty.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            sh.counters.gets.fetch_add(1, Ordering::Relaxed);
            let dref = parse_id(&sh, &body).and_then(|id| {
                sh.ledger
                    .lock()
                    .unwrap()
                    .delivered(id, sh.index(role), ok.redelivered(), conn_id)
            });
            let tag = ok.delivery_tag();
            if !sh.calm.load(Ordering::Relaxed) && rng.percent(5) {
                if ch
                    .basic_nack(BasicNackArguments::new(tag, false, true))
                    .await
                    .is_err()
                {
                    break;
                }
                settle(&sh, dref, Settle::Requeue);
            } else {
                if ch
                    .basic_ack(BasicAckArguments::new(tag, false))
                    .await
                    .is_err()
                {
                    break;
                }
                settle(&sh, dref, Settle::Ack);
            }
        }
        let clean = finish_settled(&sh, conn, &ch, &proxy, &mut rng).await;
        sh.ledger.lock().unwrap().end_conn(conn_id, clean);
    }
}

/// Declares, uses and drops short-lived queues until the load stops.
async fn churner(sh: Arc<Shared>, id: usize) {
    let mut rng = task_rng(&sh, 32_452_843, id);
    let Ok(proxy) = Proxy::start(sh.args.broker).await else {
        return;
    };
    let mut n = 0u64;
    while !sh.stop_load.load(Ordering::Relaxed) {
        let Some((conn, ch)) = connect(&sh, Some(&proxy), &format!("soak-churner-{id}")).await
        else {
            return;
        };
        let deadline =
            Instant::now() + Duration::from_millis(rng.range(200, sh.args.max_life_ms.max(201)));
        while Instant::now() < deadline && !sh.stop_load.load(Ordering::Relaxed) {
            n += 1;
            let name = format!("{}churn-{id}-{n}", sh.prefix);
            let mode = rng.next() % 4;
            let mut decl = QueueDeclareArguments::new(&name);
            match mode {
                0 => decl.exclusive(true),
                1 => decl.auto_delete(true),
                2 => decl.arguments(table(&[("x-expires", FieldValue::I(300))])),
                _ => decl.durable(true),
            };
            if ch.queue_declare(decl.finish()).await.is_err() {
                break;
            }
            sh.counters.churn_queues.fetch_add(1, Ordering::Relaxed);
            if mode < 3 {
                sh.churned.lock().unwrap().push(name.clone());
            }
            for i in 0..rng.range(1, 6) {
                let body = format!("churn {i}").into_bytes();
                let _ = ch
                    .basic_publish(
                        BasicProperties::default(),
                        body,
                        BasicPublishArguments::new("", &name),
                    )
                    .await;
            }
            match mode {
                1 => {
                    // Consume, then cancel: the auto-delete queue goes with its last consumer.
                    if let Ok((tag, mut rx)) = ch
                        .basic_consume_rx(BasicConsumeArguments::new(&name, "").finish())
                        .await
                    {
                        let _ = tokio::time::timeout(Duration::from_millis(50), rx.recv()).await;
                        let _ = ch
                            .basic_cancel(amqprs::channel::BasicCancelArguments::new(&tag))
                            .await;
                    }
                }
                3 => {
                    let _ = ch
                        .basic_get(BasicGetArguments::new(&name).no_ack(true).finish())
                        .await;
                    if ch
                        .queue_delete(QueueDeleteArguments::new(&name))
                        .await
                        .is_err()
                    {
                        break;
                    }
                }
                _ => {}
            }
            tokio::time::sleep(Duration::from_millis(rng.range(5, 50))).await;
        }
        let _ = finish(&sh, conn, &proxy, &mut rng).await;
    }
}

/// Ready messages in `queue`, by passive declare (None if it cannot be asked).
async fn depth(ch: &Channel, queue: &str) -> Option<u32> {
    let r = ch
        .queue_declare(QueueDeclareArguments::new(queue).passive(true).finish())
        .await;
    match r {
        Ok(Some((_, n, _))) => Some(n),
        _ => None,
    }
}

async fn declare_topology(sh: &Shared, ch: &Channel) -> Result<(), String> {
    let dlq = sh.queue_name(Role::DeadLetter);
    let to_dlq = || {
        vec![
            ("x-dead-letter-exchange", FieldValue::from("")),
            ("x-dead-letter-routing-key", FieldValue::from(dlq.as_str())),
        ]
    };
    for role in sh.roles() {
        let name = sh.queue_name(role);
        let mut decl = QueueDeclareArguments::new(&name);
        match role {
            Role::Work(_) => decl.durable(true).arguments(table(&to_dlq())),
            Role::Ttl => {
                let mut a = to_dlq();
                a.push(("x-message-ttl", FieldValue::I(200)));
                decl.durable(true).arguments(table(&a))
            }
            Role::Limited => decl.arguments(table(&[
                ("x-max-length", FieldValue::I(100)),
                ("x-overflow", FieldValue::from("reject-publish")),
            ])),
            Role::DropHead => {
                let mut a = to_dlq();
                a.push(("x-max-length", FieldValue::I(50)));
                decl.arguments(table(&a))
            }
            Role::DeadLetter => decl.durable(true),
        };
        ch.queue_declare(decl.finish())
            .await
            .map_err(|e| format!("queue.declare {name}: {e}"))?;
    }
    Ok(())
}

#[derive(serde::Serialize)]
struct Summary<'a> {
    ok: bool,
    seconds: f64,
    drain_seconds: f64,
    #[serde(flatten)]
    verdict: &'a ledger::Verdict,
    #[serde(flatten)]
    counters: &'a Counters,
    queues_left_nonempty: Vec<(String, u32)>,
    churned_queues_left: Vec<String>,
    closed_by_broker: Vec<String>,
    errors: Vec<String>,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let tag = (seed as u32) | 1;
    let sh = Arc::new(Shared {
        prefix: format!("soak-{tag:08x}-"),
        args: Args {
            seed: Some(seed),
            ..args
        },
        tag,
        ledger: Mutex::new(Ledger::default()),
        counters: Counters::default(),
        stop_load: AtomicBool::new(false),
        calm: AtomicBool::new(false),
        stop_all: AtomicBool::new(false),
        errors: Mutex::new(Vec::new()),
        server_closes: Arc::new(Mutex::new(Vec::new())),
        churned: Mutex::new(Vec::new()),
    });
    eprintln!(
        "[soak] seed {seed}, {} s, {} publishers x {} msg/s, {} work queues",
        sh.args.duration, sh.args.publishers, sh.args.rate, sh.args.queues
    );
    let Some((admin, admin_ch)) = connect(&sh, None, "soak-admin").await else {
        eprintln!("[soak] cannot connect to {}", sh.args.broker);
        std::process::exit(2);
    };
    if let Err(e) = declare_topology(&sh, &admin_ch).await {
        eprintln!("[soak] {e}");
        std::process::exit(2);
    }
    let start = Instant::now();
    let mut consumers = Vec::new();
    let mut load = Vec::new();
    let mut id = 0;
    let roles = sh.roles();
    for role in roles
        .iter()
        .filter(|r| !matches!(r, Role::Ttl | Role::Limited))
    {
        id += 1;
        consumers.push(tokio::spawn(consumer(sh.clone(), *role, id)));
    }
    for i in 0..sh.args.getters {
        consumers.push(tokio::spawn(getter(sh.clone(), i)));
    }
    for i in 0..sh.args.publishers {
        load.push(tokio::spawn(publisher(sh.clone(), i)));
    }
    for i in 0..sh.args.churners {
        load.push(tokio::spawn(churner(sh.clone(), i)));
    }
    let mut last_report = Instant::now();
    while start.elapsed() < Duration::from_secs(sh.args.duration) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        if last_report.elapsed() >= Duration::from_secs(30) {
            last_report = Instant::now();
            let c = &sh.counters;
            eprintln!(
                "[soak] {:>5} s: published {}, connections {}, disconnects {}, gets {}, churned queues {}",
                start.elapsed().as_secs(),
                c.published.load(Ordering::Relaxed),
                c.connections.load(Ordering::Relaxed),
                c.disconnects.load(Ordering::Relaxed),
                c.gets.load(Ordering::Relaxed),
                c.churn_queues.load(Ordering::Relaxed),
            );
        }
    }
    let load_secs = start.elapsed().as_secs_f64();
    eprintln!("[soak] load done; draining");
    sh.stop_load.store(true, Ordering::Relaxed);
    for t in load {
        let _ = t.await;
    }
    sh.calm.store(true, Ordering::Relaxed);
    let drain_start = Instant::now();
    let mut drain_report = Instant::now();
    // Drained: every queue empty twice in a row, a second apart (TTL'd messages move to the
    // dead-letter queue meanwhile).
    let mut empty_rounds = 0;
    while empty_rounds < 2 && drain_start.elapsed() < Duration::from_secs(sh.args.drain) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let mut total = 0u64;
        let mut nonempty = Vec::new();
        for role in &roles {
            let n = depth(&admin_ch, &sh.queue_name(*role))
                .await
                .unwrap_or(u32::MAX);
            total += u64::from(n);
            if n > 0 {
                nonempty.push(format!("{role:?} {n}"));
            }
        }
        if !nonempty.is_empty() && drain_report.elapsed() >= Duration::from_secs(10) {
            drain_report = Instant::now();
            eprintln!(
                "[soak] draining for {} s; ready: {}",
                drain_start.elapsed().as_secs(),
                nonempty.join(", ")
            );
        }
        empty_rounds = if total == 0 { empty_rounds + 1 } else { 0 };
    }
    sh.stop_all.store(true, Ordering::Relaxed);
    for t in consumers {
        let _ = t.await;
    }
    // Whatever consumers left behind (a delivery that raced their close) is taken with
    // basic.get on a clean connection, so it counts.
    let sweep_conn = sh.ledger.lock().unwrap().open_conn();
    for role in &roles {
        let q = sh.queue_name(*role);
        while let Ok(Some((ok, _, body))) = admin_ch.basic_get(BasicGetArguments::new(&q)).await {
            let d = parse_id(&sh, &body).and_then(|id| {
                sh.ledger.lock().unwrap().delivered(
                    id,
                    sh.index(*role),
                    ok.redelivered(),
                    sweep_conn,
                )
            });
            if admin_ch
                .basic_ack(BasicAckArguments::new(ok.delivery_tag(), false))
                .await
                .is_ok()
            {
                settle(&sh, d, Settle::Ack);
            }
        }
    }
    let mut left = Vec::new();
    for role in &roles {
        let q = sh.queue_name(*role);
        match depth(&admin_ch, &q).await {
            Some(0) => {}
            Some(n) => left.push((q, n)),
            None => left.push((q, u32::MAX)),
        }
    }
    let drain_secs = drain_start.elapsed().as_secs_f64();
    // Churned queues that should have gone by themselves (x-expires is 300 ms).
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut churned_left = Vec::new();
    let churned = sh.churned.lock().unwrap().clone();
    for name in churned.iter().rev().take(200) {
        let Ok(ch) = admin.open_channel(None).await else {
            break;
        };
        if depth(&ch, name).await.is_some() {
            churned_left.push(name.clone());
            let _ = ch.queue_delete(QueueDeleteArguments::new(name)).await;
        }
        let _ = ch.close().await;
    }
    for role in &roles {
        let _ = admin_ch
            .queue_delete(QueueDeleteArguments::new(&sh.queue_name(*role)))
            .await;
    }
    let clean = matches!(admin.close().await, Ok(()));
    {
        let mut l = sh.ledger.lock().unwrap();
        l.end_conn(sweep_conn, clean);
    }
    let verdict = sh.ledger.lock().unwrap().verdict();
    let closed_by_broker = sh.server_closes.lock().unwrap().clone();
    let ok = verdict.ok()
        && closed_by_broker.is_empty()
        && left.is_empty()
        && churned_left.is_empty()
        && sh.counters.confirm_timeouts.load(Ordering::Relaxed) == 0;
    let summary = Summary {
        ok,
        seconds: load_secs,
        drain_seconds: drain_secs,
        verdict: &verdict,
        counters: &sh.counters,
        queues_left_nonempty: left,
        churned_queues_left: churned_left,
        closed_by_broker,
        errors: sh.errors.lock().unwrap().clone(),
    };
    println!(
        "{}",
        serde_json::to_string(&summary).expect("summary serializes")
    );
    std::process::exit(if ok { 0 } else { 1 });
}
