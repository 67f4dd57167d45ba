//! Ceiling runs with pre-encoded frames, so that the broker and not the
//! client library is measured:
//!
//! * [`raw`] — one publisher and one consumer connection. The publisher
//!   writes a batch of about 64 KB of basic.publish + header + body frames,
//!   encoded once with `warren-amqp`, over and over (with confirms: at most
//!   `--confirm` unconfirmed messages). The consumer reads 256 KB at a time,
//!   counts basic.deliver frames by scanning frame headers, and acknowledges
//!   with multiple=true every `--multi-ack` deliveries.
//! * [`relay`] — a copy-only TCP relay (64 KB reads and writes between two
//!   sockets) standing in for the broker: [`raw`] with `--relay` drives it, and
//!   its rate is the physical ceiling of the machine measured the same way.
//! * [`recovery_fill`] — (l) fills durable queues with persistent messages
//!   through the same publisher, then leaves them for a kill -9 and a restart.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use warren_amqp::{
    encode_method_frame, BasicAck, BasicConsume, BasicProperties, BasicQos, ConfirmSelect,
    ExchangeDeclare, ExchangeDelete, Method, QueueBind, QueueDeclare, QueueDelete,
};

use crate::cpu::{round2, us_per, CpuMeter};
use crate::rawclient::{push_publish, FrameScanner, RawConn, CLIENT_FRAME_MAX};
use crate::scale::queue_name;
use crate::uri::AmqpUri;
use crate::{log_error, median, steady, Args, ErrorLog, ExchangeKind};

/// Bytes per pre-encoded publish batch (rounded to whole messages).
const BATCH_BYTES: usize = 64 * 1024;
/// Consumer read buffer.
const READ_BYTES: usize = 256 * 1024;

/// Which delivery tags have been confirmed: everything up to `base`, plus a
/// ring of flags for single acks above it.
struct Settled {
    base: u64,
    ring: Vec<bool>,
    mask: u64,
    nacked: u64,
}

impl Settled {
    fn new(window: usize) -> Settled {
        let cap = (window * 2 + 1024).next_power_of_two();
        Settled {
            base: 0,
            ring: vec![false; cap],
            mask: cap as u64 - 1,
            nacked: 0,
        }
    }

    fn settle(&mut self, tag: u64, multiple: bool) {
        if tag <= self.base {
            return;
        }
        if multiple {
            while self.base < tag {
                self.base += 1;
                self.ring[(self.base & self.mask) as usize] = false;
            }
        } else {
            self.ring[(tag & self.mask) as usize] = true;
        }
        while self.ring[((self.base + 1) & self.mask) as usize] {
            self.base += 1;
            self.ring[(self.base & self.mask) as usize] = false;
        }
    }
}

/// The publishing side: a batch of frames encoded once, written until told
/// to stop or until `total` messages are out.
pub struct PublishPlan {
    /// (exchange, routing key) per message, used round robin in the batch.
    pub targets: Vec<(String, String)>,
    /// Body size in bytes.
    pub size: usize,
    /// delivery_mode 2 when true.
    pub persistent: bool,
    /// Confirm window (0 = no confirms).
    pub confirm: usize,
    /// Stop after this many messages (None = until `stop`).
    pub total: Option<u64>,
}

/// Counters shared between the publisher, its confirm reader and the caller.
#[derive(Default)]
pub struct PubCounters {
    /// Messages written to the socket.
    pub published: AtomicU64,
    /// Confirmed (basic.ack) messages, contiguous from the first.
    pub confirmed: AtomicU64,
    /// basic.nack count.
    pub nacked: AtomicU64,
}

fn encode_batch(plan: &PublishPlan, frame_max: u32) -> (Vec<u8>, Vec<usize>) {
    let props = BasicProperties {
        delivery_mode: Some(if plan.persistent { 2 } else { 1 }),
        ..Default::default()
    };
    let body = vec![b'x'; plan.size];
    let t = plan.targets.len().max(1);
    let mut buf = BytesMut::new();
    let mut ends = Vec::new();
    while buf.len() < BATCH_BYTES || ends.len() % t != 0 {
        let (ex, key) = &plan.targets[ends.len() % t];
        push_publish(&mut buf, 1, ex, key, &props, &body, frame_max);
        ends.push(buf.len());
    }
    (buf.to_vec(), ends)
}

/// Reads the publisher's socket: confirms, and a close from the broker.
async fn confirm_reader(
    mut rd: OwnedReadHalf,
    leftover: BytesMut,
    window: usize,
    counters: Arc<PubCounters>,
    notify: Arc<Notify>,
    failed: Arc<Mutex<Option<String>>>,
) {
    let mut sc = FrameScanner::new(64 * 1024, &leftover);
    let mut settled = Settled::new(window.max(1));
    loop {
        let mut err = None;
        let r = sc.scan(|f| match f.method_id() {
            Some((60, 80)) => {
                if let Some((tag, multiple)) = f.ack_fields() {
                    settled.settle(tag, multiple);
                }
            }
            Some((60, 120)) => {
                if let Some((tag, multiple)) = f.ack_fields() {
                    let before = settled.base;
                    settled.settle(tag, multiple);
                    settled.nacked += settled.base.saturating_sub(before).max(1);
                }
            }
            Some((10, 50)) | Some((20, 40)) => {
                err = Some(format!(
                    "publisher: closed by broker: {}",
                    String::from_utf8_lossy(f.payload.get(7..).unwrap_or(&[]))
                ));
            }
            _ => {}
        });
        if let Err(e) = r {
            err = Some(e);
        }
        counters.confirmed.store(settled.base, Ordering::Relaxed);
        counters.nacked.store(settled.nacked, Ordering::Relaxed);
        notify.notify_one();
        if let Some(e) = err {
            *failed.lock().unwrap() = Some(e);
            notify.notify_one();
            return;
        }
        match rd.read(sc.spare()).await {
            Ok(0) | Err(_) => {
                failed
                    .lock()
                    .unwrap()
                    .get_or_insert_with(|| "publisher: connection closed".into());
                notify.notify_one();
                return;
            }
            Ok(n) => sc.filled(n),
        }
    }
}

/// Writes batches until `stop` (or the plan's total); returns when done and,
/// with confirms, everything written has been confirmed (or `drain` passed).
#[allow(clippy::too_many_arguments)]
async fn publisher(
    mut wr: OwnedWriteHalf,
    rd: OwnedReadHalf,
    leftover: BytesMut,
    frame_max: u32,
    plan: PublishPlan,
    stop: Arc<AtomicBool>,
    counters: Arc<PubCounters>,
    drain: Duration,
) -> Result<(), String> {
    let (batch, ends) = encode_batch(&plan, frame_max);
    let per_batch = ends.len() as u64;
    let notify = Arc::new(Notify::new());
    let failed = Arc::new(Mutex::new(None));
    let reader = tokio::spawn(confirm_reader(
        rd,
        leftover,
        plan.confirm + ends.len(),
        counters.clone(),
        notify.clone(),
        failed.clone(),
    ));
    let mut published = 0u64;
    let result = loop {
        if stop.load(Ordering::Relaxed) {
            break Ok(());
        }
        if let Some(e) = failed.lock().unwrap().clone() {
            break Err(e);
        }
        let mut n = per_batch;
        if let Some(total) = plan.total {
            if published >= total {
                break Ok(());
            }
            n = n.min(total - published);
        }
        if plan.confirm > 0 {
            // Wait until the whole batch fits in the window.
            let window = plan.confirm as u64;
            let mut interrupted = false;
            while published + n - counters.confirmed.load(Ordering::Relaxed) > window.max(n) {
                if stop.load(Ordering::Relaxed) || failed.lock().unwrap().is_some() {
                    interrupted = true;
                    break;
                }
                let _ = tokio::time::timeout(Duration::from_millis(100), notify.notified()).await;
            }
            if interrupted {
                continue;
            }
        }
        let bytes = &batch[..ends[n as usize - 1]];
        if let Err(e) = wr.write_all(bytes).await {
            break Err(format!("publisher: write: {e}"));
        }
        published += n;
        counters.published.store(published, Ordering::Relaxed);
    };
    if result.is_ok() && plan.confirm > 0 {
        let deadline = Instant::now() + drain;
        while counters.confirmed.load(Ordering::Relaxed) < published && Instant::now() < deadline {
            if failed.lock().unwrap().is_some() {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(100), notify.notified()).await;
        }
    }
    // connection.close; the reader ends on close-ok or EOF.
    let mut close = BytesMut::new();
    encode_method_frame(
        0,
        &warren_amqp::ConnectionClose {
            reply_code: 200,
            reply_text: "Goodbye".into(),
            class_id: 0,
            method_id: 0,
        }
        .into(),
        &mut close,
    );
    let _ = wr.write_all(&close).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), reader).await;
    result
}

/// Opens the publishing connection (or a bare socket with `relay`).
async fn open_publisher(
    uri: &AmqpUri,
    confirm: bool,
    relay: bool,
) -> Result<(OwnedReadHalf, OwnedWriteHalf, BytesMut, u32), String> {
    if relay {
        let s = TcpStream::connect((uri.host.as_str(), uri.port))
            .await
            .map_err(|e| format!("publisher: connect: {e}"))?;
        s.set_nodelay(true).ok();
        let (r, w) = s.into_split();
        return Ok((r, w, BytesMut::new(), CLIENT_FRAME_MAX));
    }
    let mut c = RawConn::connect(uri, "warren-perf-raw-publisher").await?;
    c.open_channel(1).await?;
    if confirm {
        match c.call(1, ConfirmSelect { nowait: false }.into()).await? {
            Method::ConfirmSelectOk(_) => {}
            m => return Err(format!("expected confirm.select-ok, got {}", m.name())),
        }
    }
    let fm = c.frame_max;
    let (s, left) = c.into_parts();
    let (r, w) = s.into_split();
    Ok((r, w, left, fm))
}

struct ConsumerCounters {
    consumed: AtomicU64,
}

/// The consuming side: counts deliveries (with `relay`: publish frames) and
/// acks every `multi_ack` with multiple=true.
#[allow(clippy::too_many_arguments)]
async fn consumer(
    mut s: TcpStream,
    leftover: BytesMut,
    relay: bool,
    multi_ack: u64,
    counters: Arc<ConsumerCounters>,
    expected: Arc<AtomicU64>,
    producing_done: Arc<AtomicBool>,
    drain: Duration,
) -> Result<(), String> {
    let mut sc = FrameScanner::new(READ_BYTES, &leftover);
    let want = if relay { (60, 40) } else { (60, 60) };
    let mut consumed = 0u64;
    let mut since_ack = 0u64;
    let mut last_tag = 0u64;
    let mut acks = BytesMut::new();
    let mut last_progress = Instant::now();
    loop {
        let mut err = None;
        sc.scan(|f| match f.method_id() {
            Some(id) if id == want => {
                consumed += 1;
                if !relay {
                    last_tag = f.deliver_tag().unwrap_or(last_tag);
                    since_ack += 1;
                    if since_ack >= multi_ack {
                        since_ack = 0;
                        encode_method_frame(
                            1,
                            &BasicAck {
                                delivery_tag: last_tag,
                                multiple: true,
                            }
                            .into(),
                            &mut acks,
                        );
                    }
                }
            }
            // Through the relay, the publisher's own connection.close arrives here.
            Some((10, 50)) | Some((20, 40)) if !relay => {
                err = Some(format!(
                    "consumer: closed by broker: {}",
                    String::from_utf8_lossy(f.payload.get(7..).unwrap_or(&[]))
                ))
            }
            _ => {}
        })?;
        if let Some(e) = err {
            return Err(e);
        }
        counters.consumed.store(consumed, Ordering::Relaxed);
        if !acks.is_empty() {
            s.write_all(&acks)
                .await
                .map_err(|e| format!("consumer: write: {e}"))?;
            acks.clear();
        }
        if producing_done.load(Ordering::Relaxed)
            && (consumed >= expected.load(Ordering::Relaxed) || last_progress.elapsed() > drain)
        {
            break;
        }
        match tokio::time::timeout(Duration::from_millis(200), s.read(sc.spare())).await {
            // The relay passes the publisher's end of stream on: all data is in.
            Ok(Ok(0)) if relay => break,
            Ok(Ok(0)) => return Err("consumer: connection closed".into()),
            Ok(Ok(n)) => {
                sc.filled(n);
                last_progress = Instant::now();
            }
            Ok(Err(e)) => return Err(format!("consumer: read: {e}")),
            Err(_) => {}
        }
    }
    if !relay && since_ack > 0 {
        encode_method_frame(
            1,
            &BasicAck {
                delivery_tag: last_tag,
                multiple: true,
            }
            .into(),
            &mut acks,
        );
    }
    let _ = s.write_all(&acks).await;
    Ok(())
}

/// Raw-frame ceiling run: see the module docs. Flags: `--persistent` (durable
/// queues, delivery_mode 2), `--confirm N` (window), `--exchange-type fanout
/// --queues N` (one consumer connection, one consumer per queue on one
/// channel), `--prefetch` (per consumer), `--multi-ack`, `--relay` (drive a
/// [`relay`] instead of a broker: no handshake, publish frames counted).
/// JSON: median per-second delivery rate, averages, client and broker CPU per
/// delivery.
pub async fn raw(args: &Args, uri: AmqpUri, errors: ErrorLog) -> Result<Value, String> {
    let relay = args.relay;
    let fanout = args.exchange_type == ExchangeKind::Fanout;
    let run = format!("{:08x}", crate::run_tag());
    let nq = if fanout { args.queues.max(1) } else { 1 };
    let queues: Vec<String> = (0..nq).map(|i| format!("perf-raw-{run}-{i}")).collect();
    let exchange = if fanout {
        format!("perf-raw-{run}-fanout")
    } else {
        String::new()
    };
    let mut control = None;
    if !relay {
        let mut c = RawConn::connect(&uri, "warren-perf-raw-control").await?;
        c.open_channel(1).await?;
        if fanout {
            match c
                .call(
                    1,
                    ExchangeDeclare {
                        exchange: exchange.clone(),
                        kind: "fanout".into(),
                        durable: args.persistent,
                        ..Default::default()
                    }
                    .into(),
                )
                .await?
            {
                Method::ExchangeDeclareOk(_) => {}
                m => return Err(format!("expected exchange.declare-ok, got {}", m.name())),
            }
        }
        for q in &queues {
            match c
                .call(
                    1,
                    QueueDeclare {
                        queue: q.clone(),
                        durable: args.persistent,
                        ..Default::default()
                    }
                    .into(),
                )
                .await?
            {
                Method::QueueDeclareOk(_) => {}
                m => return Err(format!("expected queue.declare-ok, got {}", m.name())),
            }
            if fanout {
                match c
                    .call(
                        1,
                        QueueBind {
                            queue: q.clone(),
                            exchange: exchange.clone(),
                            ..Default::default()
                        }
                        .into(),
                    )
                    .await?
                {
                    Method::QueueBindOk(_) => {}
                    m => return Err(format!("expected queue.bind-ok, got {}", m.name())),
                }
            }
        }
        control = Some(c);
    }

    // Consumer first.
    let (cstream, cleft) = if relay {
        let s = TcpStream::connect((uri.host.as_str(), uri.port))
            .await
            .map_err(|e| format!("consumer: connect: {e}"))?;
        s.set_nodelay(true).ok();
        (s, BytesMut::new())
    } else {
        let mut c = RawConn::connect(&uri, "warren-perf-raw-consumer").await?;
        c.open_channel(1).await?;
        if args.prefetch > 0 {
            match c
                .call(
                    1,
                    BasicQos {
                        prefetch_count: args.prefetch,
                        ..Default::default()
                    }
                    .into(),
                )
                .await?
            {
                Method::BasicQosOk(_) => {}
                m => return Err(format!("expected basic.qos-ok, got {}", m.name())),
            }
        }
        for (i, q) in queues.iter().enumerate() {
            match c
                .call(
                    1,
                    BasicConsume {
                        queue: q.clone(),
                        consumer_tag: format!("c{i}"),
                        ..Default::default()
                    }
                    .into(),
                )
                .await?
            {
                Method::BasicConsumeOk(_) => {}
                m => return Err(format!("expected basic.consume-ok, got {}", m.name())),
            }
        }
        c.into_parts()
    };
    // The relay pairs connections in accept order: consumer, then publisher.
    if relay {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (rd, wr, pleft, fm) = open_publisher(&uri, args.confirm > 0, relay).await?;

    let ccount = Arc::new(ConsumerCounters {
        consumed: AtomicU64::new(0),
    });
    let expected = Arc::new(AtomicU64::new(u64::MAX));
    let producing_done = Arc::new(AtomicBool::new(false));
    let drain = Duration::from_secs(args.drain.max(1));
    let cons = tokio::spawn(consumer(
        cstream,
        cleft,
        relay,
        args.multi_ack.max(1),
        ccount.clone(),
        expected.clone(),
        producing_done.clone(),
        drain,
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let pcount = Arc::new(PubCounters::default());
    let targets = if fanout {
        vec![(exchange.clone(), String::new())]
    } else {
        vec![(String::new(), queues[0].clone())]
    };
    let plan = PublishPlan {
        targets,
        size: args.size,
        persistent: args.persistent,
        confirm: args.confirm,
        total: None,
    };
    let t0 = Instant::now();
    let meter = CpuMeter::start(&args.broker_pid);
    let publ = tokio::spawn(publisher(
        wr,
        rd,
        pleft,
        fm,
        plan,
        stop.clone(),
        pcount.clone(),
        drain,
    ));
    let mut samples = Vec::new();
    let mut last = 0u64;
    let mut last_t = Instant::now();
    for second in 1..=args.duration {
        tokio::time::sleep_until(tokio::time::Instant::from_std(
            t0 + Duration::from_secs(second),
        ))
        .await;
        let now = ccount.consumed.load(Ordering::Relaxed);
        let r = (now - last) as f64 / last_t.elapsed().as_secs_f64();
        last_t = Instant::now();
        last = now;
        samples.push(r);
        if !args.json {
            println!(
                "time {second:>3}s published {:>10} confirmed {:>10} delivered {r:>9.0}/s",
                pcount.published.load(Ordering::Relaxed),
                pcount.confirmed.load(Ordering::Relaxed)
            );
        }
    }
    stop.store(true, Ordering::Relaxed);
    let cpu = meter.finish();
    let in_window = ccount.consumed.load(Ordering::Relaxed);
    let published_in_window = pcount.published.load(Ordering::Relaxed);
    match publ.await {
        Ok(Err(e)) => log_error(&errors, e),
        Err(e) => log_error(&errors, format!("publisher task: {e}")),
        Ok(Ok(())) => {}
    }
    let published = pcount.published.load(Ordering::Relaxed);
    expected.store(published * nq as u64, Ordering::Relaxed);
    producing_done.store(true, Ordering::Relaxed);
    match cons.await {
        Ok(Err(e)) => log_error(&errors, e),
        Err(e) => log_error(&errors, format!("consumer task: {e}")),
        Ok(Ok(())) => {}
    }
    let consumed = ccount.consumed.load(Ordering::Relaxed);
    if let Some(mut c) = control {
        if !args.keep_queues {
            for q in &queues {
                let _ = c
                    .call(
                        1,
                        QueueDelete {
                            queue: q.clone(),
                            ..Default::default()
                        }
                        .into(),
                    )
                    .await;
            }
            if fanout {
                let _ = c
                    .call(
                        1,
                        ExchangeDelete {
                            exchange: exchange.clone(),
                            ..Default::default()
                        }
                        .into(),
                    )
                    .await;
            }
        }
        c.close().await;
    }
    let missing = (published * nq as u64).saturating_sub(consumed);
    Ok(json!({
        "mode": if relay { "relay" } else { "raw" },
        "size": args.size,
        "persistent": args.persistent,
        "confirm": args.confirm,
        "queues": nq,
        "fanout": fanout,
        "prefetch": args.prefetch,
        "multi_ack": args.multi_ack,
        "published": published,
        "confirmed": pcount.confirmed.load(Ordering::Relaxed),
        "nacked": pcount.nacked.load(Ordering::Relaxed),
        "delivered": consumed,
        "missing": missing,
        "delivery_rate_median": median(steady(&samples)).round(),
        "delivery_rate_avg": round2(in_window as f64 / cpu.window_s),
        "publish_rate_avg": round2(published_in_window as f64 / cpu.window_s),
        "mb_per_s": round2(in_window as f64 * args.size as f64 / cpu.window_s / 1e6),
        "cpu": cpu,
        "broker_cpu_us_per_delivery": cpu.broker_cpu_s.map(|b| us_per(b, in_window)),
        "client_cpu_us_per_delivery": us_per(cpu.client_cpu_s, in_window),
    }))
}

/// (l) Declares `--queues` durable queues (`--queue-pattern`, default
/// `warren-perf-rec-%d`) and publishes `--messages` persistent messages of
/// `--size` bytes round robin into them, with a confirm window of `--confirm`
/// (default 1000 when 0). JSON: published, confirmed, fill rate.
pub async fn recovery_fill(args: &Args, uri: AmqpUri, errors: ErrorLog) -> Result<Value, String> {
    let pattern = args
        .queue_pattern
        .clone()
        .unwrap_or_else(|| "warren-perf-rec-%d".into());
    let nq = args.queues.max(1);
    let mut c = RawConn::connect(&uri, "warren-perf-fill").await?;
    c.open_channel(1).await?;
    let mut targets = Vec::new();
    for i in 0..nq {
        let q = queue_name(&pattern, i);
        match c
            .call(
                1,
                QueueDeclare {
                    queue: q.clone(),
                    durable: true,
                    ..Default::default()
                }
                .into(),
            )
            .await?
        {
            Method::QueueDeclareOk(ok) if ok.message_count == 0 => {}
            Method::QueueDeclareOk(ok) => {
                return Err(format!(
                    "{q} already holds {} messages; delete it first",
                    ok.message_count
                ))
            }
            m => return Err(format!("expected queue.declare-ok, got {}", m.name())),
        }
        targets.push((String::new(), q));
    }
    c.close().await;
    let (rd, wr, left, fm) = open_publisher(&uri, true, false).await?;
    let counters = Arc::new(PubCounters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let plan = PublishPlan {
        targets,
        size: args.size,
        persistent: true,
        confirm: if args.confirm == 0 {
            1000
        } else {
            args.confirm
        },
        total: Some(args.messages),
    };
    let meter = CpuMeter::start(&args.broker_pid);
    let progress = {
        let counters = counters.clone();
        let quiet = args.json;
        let total = args.messages;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            tick.tick().await;
            loop {
                tick.tick().await;
                if !quiet {
                    println!(
                        "filled {} / {total} (confirmed {})",
                        counters.published.load(Ordering::Relaxed),
                        counters.confirmed.load(Ordering::Relaxed)
                    );
                }
            }
        })
    };
    let r = publisher(
        wr,
        rd,
        left,
        fm,
        plan,
        stop,
        counters.clone(),
        Duration::from_secs(args.drain_max.max(30)),
    )
    .await;
    progress.abort();
    let cpu = meter.finish();
    if let Err(e) = r {
        log_error(&errors, e);
    }
    let confirmed = counters.confirmed.load(Ordering::Relaxed);
    if confirmed < args.messages {
        log_error(
            &errors,
            format!("only {confirmed} of {} messages confirmed", args.messages),
        );
    }
    Ok(json!({
        "mode": "recovery-fill",
        "queues": nq,
        "messages": args.messages,
        "size": args.size,
        "published": counters.published.load(Ordering::Relaxed),
        "confirmed": confirmed,
        "nacked": counters.nacked.load(Ordering::Relaxed),
        "fill_rate": round2(confirmed as f64 / cpu.window_s),
        "cpu": cpu,
    }))
}

/// Copy-only TCP relay on `--listen`: accepts connections in pairs (first
/// the consumer side, then the publisher side) and copies bytes both ways,
/// 64 KB per read and write, one thread per direction. Runs until killed;
/// it stands in for the broker process, so a script measures its CPU the same way.
pub fn relay(listen: &str) -> Result<(), String> {
    let l = std::net::TcpListener::bind(listen).map_err(|e| format!("bind {listen}: {e}"))?;
    println!(
        "relay listening on {}",
        l.local_addr().map_err(|e| e.to_string())?
    );
    std::io::stdout().flush().ok();
    loop {
        let (a, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
        let (b, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
        a.set_nodelay(true).ok();
        b.set_nodelay(true).ok();
        for (mut from, mut to) in [
            (
                b.try_clone().map_err(|e| e.to_string())?,
                a.try_clone().map_err(|e| e.to_string())?,
            ),
            (a, b),
        ] {
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = to.shutdown(std::net::Shutdown::Write);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settled_tracks_single_and_multiple_acks() {
        let mut s = Settled::new(8);
        s.settle(2, false);
        assert_eq!(s.base, 0);
        s.settle(1, false);
        assert_eq!(s.base, 2);
        s.settle(5, false);
        s.settle(4, true);
        assert_eq!(s.base, 5);
        s.settle(3, false); // already covered
        assert_eq!(s.base, 5);
        s.settle(100, true);
        assert_eq!(s.base, 100);
        s.settle(101, false);
        assert_eq!(s.base, 101);
    }

    #[test]
    fn batch_is_whole_messages_over_targets() {
        let plan = PublishPlan {
            targets: (0..10).map(|i| (String::new(), format!("q{i}"))).collect(),
            size: 1024,
            persistent: true,
            confirm: 0,
            total: None,
        };
        let (buf, ends) = encode_batch(&plan, CLIENT_FRAME_MAX);
        assert_eq!(ends.len() % 10, 0);
        assert!(buf.len() >= BATCH_BYTES);
        assert_eq!(*ends.last().unwrap(), buf.len());
        let mut sc = FrameScanner::new(buf.len() + 16, &buf);
        let mut publishes = 0;
        sc.scan(|f| {
            if f.method_id() == Some((60, 40)) {
                publishes += 1
            }
        })
        .unwrap();
        assert_eq!(publishes, ends.len());
    }
}
