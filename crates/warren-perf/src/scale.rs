//! Workloads at scale, on the raw client ([`crate::rawclient`]):
//!
//! * [`churn`] — (i) connection churn: N clients each looping connect, open a
//!   channel, confirm.select, declare a server-named exclusive queue, publish
//!   one message and wait for its confirm, close the connection.
//! * [`many_queues`] — (j) declare N durable queues (P connections in
//!   parallel), each bound to a durable topic exchange, then measure the
//!   broker at rest; [`delete_queues`] removes them again.
//! * [`many_connections`] — (k) N connections, each consuming from its own
//!   exclusive queue and publishing to it at a fixed rate; end-to-end latency.
//! * [`restart_check`] — after a broker restart: time until it accepts a
//!   connection, until the first basic.get succeeds, until every queue reports
//!   its full depth (passive queue.declare message_count). Used by (j) and (l).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use warren_amqp::frame::Frame;
use warren_amqp::{
    BasicAck, BasicConsume, BasicGet, BasicProperties, BasicQos, BasicReject, ConfirmSelect,
    ExchangeDeclare, ExchangeDelete, Method, QueueBind, QueueDeclare, QueueDelete,
};

use crate::cpu::{round2, round3, us_per, CpuMeter};
use crate::rawclient::RawConn;
use crate::uri::AmqpUri;
use crate::{log_error, median, new_hist, steady, Args, ErrorLog};

/// Percentiles of a latency histogram in µs, as JSON.
pub fn hist_json(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return json!({"count": 0});
    }
    json!({
        "count": h.len(),
        "p50_us": h.value_at_quantile(0.50),
        "p99_us": h.value_at_quantile(0.99),
        "p999_us": h.value_at_quantile(0.999),
        "max_us": h.max(),
    })
}

/// Name of queue `i` from a pattern (`%d` replaced by `i`).
pub fn queue_name(pattern: &str, i: usize) -> String {
    pattern.replace("%d", &i.to_string())
}

/// Samples `counter` once a second while `running` holds; returns the
/// per-second rates.
fn rate_sampler(
    counter: Arc<AtomicU64>,
    running: Arc<AtomicBool>,
    label: &'static str,
    quiet: bool,
) -> tokio::task::JoinHandle<Vec<f64>> {
    tokio::spawn(async move {
        let mut out = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let mut last = counter.load(Ordering::Relaxed);
        let mut t = Instant::now();
        let mut second = 0;
        while running.load(Ordering::Relaxed) {
            tick.tick().await;
            let now = counter.load(Ordering::Relaxed);
            let r = (now - last) as f64 / t.elapsed().as_secs_f64();
            t = Instant::now();
            last = now;
            second += 1;
            if !quiet {
                println!("time {second:>3}s {label} {r:>9.0}/s");
            }
            out.push(r);
        }
        out
    })
}

// ---------------------------------------------------------------- (i) churn

async fn churn_cycle(uri: &AmqpUri, body: &[u8], props: &BasicProperties) -> Result<(), String> {
    let mut c = RawConn::connect(uri, "warren-perf-churn").await?;
    c.open_channel(1).await?;
    match c.call(1, ConfirmSelect { nowait: false }.into()).await? {
        Method::ConfirmSelectOk(_) => {}
        m => return Err(format!("expected confirm.select-ok, got {}", m.name())),
    }
    let q = match c
        .call(
            1,
            QueueDeclare {
                exclusive: true,
                ..Default::default()
            }
            .into(),
        )
        .await?
    {
        Method::QueueDeclareOk(ok) => ok.queue,
        m => return Err(format!("expected queue.declare-ok, got {}", m.name())),
    };
    c.push_publish(1, "", &q, props, body);
    c.flush().await?;
    match c.recv_method().await? {
        (1, Method::BasicAck(a)) if a.delivery_tag == 1 => {}
        (_, m) => return Err(format!("expected basic.ack for tag 1, got {}", m.name())),
    }
    c.close().await;
    Ok(())
}

/// (i) Connection churn. JSON: cycles, cycles_per_s (completed cycles over the
/// measured window), median per-second rate, cycle time percentiles, client
/// and broker CPU, broker CPU per cycle in µs.
pub async fn churn(args: &Args, uri: AmqpUri, errors: ErrorLog) -> Result<Value, String> {
    let clients = args.clients.max(1);
    let cycles = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(AtomicU64::new(0));
    let running = Arc::new(AtomicBool::new(true));
    let hist = Arc::new(Mutex::new(new_hist()));
    let body = vec![0u8; args.size];
    let props = BasicProperties {
        delivery_mode: Some(1),
        ..Default::default()
    };
    let sampler = rate_sampler(cycles.clone(), running.clone(), "cycles", args.json);
    let meter = CpuMeter::start(&args.broker_pid);
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (uri, body, props) = (uri.clone(), body.clone(), props.clone());
        let (cycles, failures, running, hist, errors) = (
            cycles.clone(),
            failures.clone(),
            running.clone(),
            hist.clone(),
            errors.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut local = new_hist();
            while running.load(Ordering::Relaxed) {
                let t = Instant::now();
                match tokio::time::timeout(
                    Duration::from_secs(30),
                    churn_cycle(&uri, &body, &props),
                )
                .await
                {
                    Ok(Ok(())) => {
                        if running.load(Ordering::Relaxed) {
                            cycles.fetch_add(1, Ordering::Relaxed);
                            local.saturating_record(t.elapsed().as_micros() as u64);
                        }
                    }
                    Ok(Err(e)) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                        log_error(&errors, format!("churn cycle: {e}"));
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Err(_) => {
                        failures.fetch_add(1, Ordering::Relaxed);
                        log_error(&errors, "churn cycle: no progress in 30 s".into());
                    }
                }
            }
            hist.lock().unwrap().add(&local).ok();
        }));
    }
    tokio::time::sleep(Duration::from_secs(args.duration)).await;
    running.store(false, Ordering::Relaxed);
    let done = cycles.load(Ordering::Relaxed);
    let cpu = meter.finish();
    for t in tasks {
        let _ = t.await;
    }
    let rates = sampler.await.unwrap_or_default();
    let h = hist.lock().unwrap();
    Ok(json!({
        "mode": "churn",
        "clients": clients,
        "cycles": done,
        "failures": failures.load(Ordering::Relaxed),
        "cycles_per_s": round2(done as f64 / cpu.window_s),
        "cycles_per_s_median": median(steady(&rates)).round(),
        "cycle_time": hist_json(&h),
        "cpu": cpu,
        "broker_cpu_us_per_cycle": cpu.broker_cpu_s.map(|b| us_per(b, done)),
        "client_cpu_us_per_cycle": us_per(cpu.client_cpu_s, done),
    }))
}

// ---------------------------------------------------------- (j) many queues

/// Runs `work(conn, i)` for every i in 0..n over `parallel` connections
/// (connection k takes i = k, k + parallel, ...). Returns how many succeeded.
async fn over_connections<F, Fut>(
    uri: &AmqpUri,
    n: usize,
    parallel: usize,
    done: Arc<AtomicU64>,
    errors: ErrorLog,
    work: F,
) -> u64
where
    F: Fn(RawConn, usize) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = (RawConn, Result<(), String>)> + Send,
{
    let mut tasks = Vec::new();
    for k in 0..parallel.max(1) {
        let (uri, work, done, errors) = (uri.clone(), work.clone(), done.clone(), errors.clone());
        let parallel = parallel.max(1);
        tasks.push(tokio::spawn(async move {
            let mut ok = 0u64;
            let mut conn = match RawConn::connect(&uri, "warren-perf-queues").await {
                Ok(c) => c,
                Err(e) => {
                    log_error(&errors, e);
                    return 0;
                }
            };
            if let Err(e) = conn.open_channel(1).await {
                log_error(&errors, e);
                return 0;
            }
            let mut i = k;
            while i < n {
                let (c, r) = work(conn, i).await;
                conn = c;
                match r {
                    Ok(()) => {
                        ok += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        log_error(&errors, e);
                        // The channel (or connection) is gone: start over.
                        let Ok(mut c) = RawConn::connect(&uri, "warren-perf-queues").await else {
                            return ok;
                        };
                        if c.open_channel(1).await.is_err() {
                            return ok;
                        }
                        conn = c;
                    }
                }
                i += parallel;
            }
            conn.close().await;
            ok
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap_or(0);
    }
    total
}

/// (j) Declares `--queues` durable queues named by `--queue-pattern` (default
/// `warren-perf-mq-%d`), each bound to the durable topic exchange
/// `warren-perf-mq-topic` with key `mq.<i>.#`, over `--parallel` connections;
/// then closes them and measures the broker at rest for `--rest` seconds.
/// JSON: declared, declares_per_s, RSS before/after and per queue (with
/// `--broker-pid`), broker CPU at rest.
pub async fn many_queues(args: &Args, uri: AmqpUri, errors: ErrorLog) -> Result<Value, String> {
    let n = args.queues;
    let pattern = args
        .queue_pattern
        .clone()
        .unwrap_or_else(|| "warren-perf-mq-%d".into());
    let exchange = "warren-perf-mq-topic".to_string();
    let rss_before = crate::cpu::pids_rss_kb(&args.broker_pid);
    {
        let mut c = RawConn::connect(&uri, "warren-perf-queues-control").await?;
        c.open_channel(1).await?;
        match c
            .call(
                1,
                ExchangeDeclare {
                    exchange: exchange.clone(),
                    kind: "topic".into(),
                    durable: true,
                    ..Default::default()
                }
                .into(),
            )
            .await?
        {
            Method::ExchangeDeclareOk(_) => {}
            m => return Err(format!("expected exchange.declare-ok, got {}", m.name())),
        }
        c.close().await;
    }
    let done = Arc::new(AtomicU64::new(0));
    let running = Arc::new(AtomicBool::new(true));
    let sampler = rate_sampler(done.clone(), running.clone(), "declared+bound", args.json);
    let meter = CpuMeter::start(&args.broker_pid);
    let work = {
        let (pattern, exchange) = (pattern.clone(), exchange.clone());
        move |mut c: RawConn, i: usize| {
            let (pattern, exchange) = (pattern.clone(), exchange.clone());
            async move {
                let q = queue_name(&pattern, i);
                let r = async {
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
                        Method::QueueDeclareOk(_) => {}
                        m => return Err(format!("expected queue.declare-ok, got {}", m.name())),
                    }
                    match c
                        .call(
                            1,
                            QueueBind {
                                queue: q.clone(),
                                exchange,
                                routing_key: format!("mq.{i}.#"),
                                ..Default::default()
                            }
                            .into(),
                        )
                        .await?
                    {
                        Method::QueueBindOk(_) => Ok(()),
                        m => Err(format!("expected queue.bind-ok, got {}", m.name())),
                    }
                }
                .await;
                (c, r.map_err(|e| format!("{q}: {e}")))
            }
        }
    };
    let declared = over_connections(&uri, n, args.parallel, done, errors.clone(), work).await;
    let declare = meter.finish();
    running.store(false, Ordering::Relaxed);
    let rates = sampler.await.unwrap_or_default();
    if !args.json {
        println!(
            "declared and bound {declared}/{n} queues in {:.1} s; resting {} s",
            declare.window_s, args.rest
        );
    }
    // Let the broker settle (and its allocator/GC catch up) before the rest window.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rest_meter = CpuMeter::start(&args.broker_pid);
    tokio::time::sleep(Duration::from_secs(args.rest)).await;
    let rest = rest_meter.finish();
    let rss_after = rest.broker_rss_kb;
    let per_queue = match (rss_before, rss_after) {
        (Some(b), Some(a)) if declared > 0 => {
            Some(round2((a as f64 - b as f64) * 1024.0 / declared as f64))
        }
        _ => None,
    };
    Ok(json!({
        "mode": "many-queues",
        "queues": n,
        "declared": declared,
        "parallel": args.parallel,
        "declares_per_s": round2(declared as f64 / declare.window_s),
        "declares_per_s_median": median(steady(&rates)).round(),
        "declare_cpu": declare,
        "broker_cpu_us_per_declare": declare.broker_cpu_s.map(|b| us_per(b, declared)),
        "rss_before_kb": rss_before,
        "rss_after_kb": rss_after,
        "rss_bytes_per_queue": per_queue,
        "rest_s": args.rest,
        "rest_cpu": rest,
        "broker_cpu_ms_at_rest_per_s": rest.broker_cpu_s.map(|b| round3(b * 1000.0 / rest.window_s)),
    }))
}

/// Deletes the queues of [`many_queues`] (or any `--queue-pattern` x
/// `--queues`) and the exchange `warren-perf-mq-topic`.
pub async fn delete_queues(args: &Args, uri: AmqpUri, errors: ErrorLog) -> Result<Value, String> {
    let n = args.queues;
    let pattern = args
        .queue_pattern
        .clone()
        .unwrap_or_else(|| "warren-perf-mq-%d".into());
    let done = Arc::new(AtomicU64::new(0));
    let t = Instant::now();
    let work = move |mut c: RawConn, i: usize| {
        let pattern = pattern.clone();
        async move {
            let q = queue_name(&pattern, i);
            let r = match c
                .call(
                    1,
                    QueueDelete {
                        queue: q.clone(),
                        ..Default::default()
                    }
                    .into(),
                )
                .await
            {
                Ok(Method::QueueDeleteOk(_)) => Ok(()),
                Ok(m) => Err(format!("{q}: expected queue.delete-ok, got {}", m.name())),
                Err(e) => Err(format!("{q}: {e}")),
            };
            (c, r)
        }
    };
    let deleted = over_connections(&uri, n, args.parallel, done, errors, work).await;
    let mut c = RawConn::connect(&uri, "warren-perf-queues-control").await?;
    c.open_channel(1).await?;
    let _ = c
        .call(
            1,
            ExchangeDelete {
                exchange: "warren-perf-mq-topic".into(),
                ..Default::default()
            }
            .into(),
        )
        .await;
    c.close().await;
    Ok(json!({
        "mode": "delete-queues",
        "queues": n,
        "deleted": deleted,
        "seconds": round3(t.elapsed().as_secs_f64()),
    }))
}

// -------------------------------------------------- (k) many connections

/// Body layout for (k): send time in µs since the process start (u64 LE),
/// then padding.
async fn conn_task(
    uri: AmqpUri,
    id: usize,
    size: usize,
    period: Duration,
    setup: Arc<Semaphore>,
    start: Arc<tokio::sync::watch::Receiver<Option<Instant>>>,
    state: Arc<ManyConnState>,
) -> Result<(), String> {
    let permit = setup.acquire().await.map_err(|e| e.to_string())?;
    let mut c = RawConn::connect(&uri, &format!("warren-perf-conn-{id}")).await?;
    c.open_channel(1).await?;
    match c
        .call(
            1,
            BasicQos {
                prefetch_count: 10,
                ..Default::default()
            }
            .into(),
        )
        .await?
    {
        Method::BasicQosOk(_) => {}
        m => return Err(format!("expected basic.qos-ok, got {}", m.name())),
    }
    let q = match c
        .call(
            1,
            QueueDeclare {
                exclusive: true,
                ..Default::default()
            }
            .into(),
        )
        .await?
    {
        Method::QueueDeclareOk(ok) => ok.queue,
        m => return Err(format!("expected queue.declare-ok, got {}", m.name())),
    };
    match c
        .call(
            1,
            BasicConsume {
                queue: q.clone(),
                consumer_tag: "c".into(),
                ..Default::default()
            }
            .into(),
        )
        .await?
    {
        Method::BasicConsumeOk(_) => {}
        m => return Err(format!("expected basic.consume-ok, got {}", m.name())),
    }
    drop(permit);
    state.opened.fetch_add(1, Ordering::Relaxed);
    let mut rx = (*start).clone();
    let t0 = loop {
        if let Some(t) = *rx.borrow() {
            break t;
        }
        if rx.changed().await.is_err() {
            return Ok(());
        }
    };
    // Spread the publishers evenly over one period.
    let offset = period.mul_f64((id as f64 * 0.618_033_988_75).fract());
    let mut next = tokio::time::Instant::from_std(t0 + offset);
    let props = BasicProperties {
        delivery_mode: Some(1),
        ..Default::default()
    };
    let mut body = vec![0u8; size.max(8)];
    let mut pending_ts: VecDeque<u64> = VecDeque::new();
    let mut expect_body = false;
    loop {
        if state.stop.load(Ordering::Relaxed) {
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {
                body[..8].copy_from_slice(&crate::now_us().to_le_bytes());
                c.push_publish(1, "", &q, &props, &body);
                c.flush().await?;
                state.published.fetch_add(1, Ordering::Relaxed);
                next += period;
            }
            f = c.recv_frame() => {
                match f? {
                    Frame::Method { method: Method::BasicDeliver(d), .. } => {
                        pending_ts.push_back(d.delivery_tag);
                        expect_body = true;
                    }
                    Frame::Body { payload, .. } if expect_body => {
                        expect_body = false;
                        let tag = pending_ts.pop_front().unwrap_or(0);
                        if payload.len() >= 8 {
                            let sent = u64::from_le_bytes(payload[..8].try_into().unwrap());
                            let lat = crate::now_us().saturating_sub(sent).max(1);
                            if state.recording.load(Ordering::Relaxed) {
                                state.hist.lock().unwrap().saturating_record(lat);
                            }
                        }
                        state.consumed.fetch_add(1, Ordering::Relaxed);
                        c.push(1, BasicAck { delivery_tag: tag, multiple: false }.into());
                        c.flush().await?;
                    }
                    Frame::Method { method, .. } => {
                        if let Some(e) = crate::rawclient::close_error(&method) {
                            return Err(e);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    c.close().await;
    Ok(())
}

struct ManyConnState {
    opened: AtomicU64,
    published: AtomicU64,
    consumed: AtomicU64,
    stop: AtomicBool,
    recording: AtomicBool,
    hist: Mutex<Histogram<u64>>,
}

/// (k) `--connections` connections, each with one channel consuming (manual
/// ack, prefetch 10) from its own server-named exclusive queue and publishing
/// `--conn-rate` messages per second to it (default exchange). After all
/// are open and `--warmup` seconds, measures for `--duration` seconds:
/// end-to-end latency, broker CPU and RSS, client CPU.
pub async fn many_connections(
    args: &Args,
    uri: AmqpUri,
    errors: ErrorLog,
) -> Result<Value, String> {
    let n = args.connections;
    let nofile = crate::cpu::raise_nofile(n as u64 + 1024);
    if nofile < n as u64 + 64 {
        return Err(format!(
            "open-file limit {nofile} is too low for {n} connections (raise ulimit -n)"
        ));
    }
    let state = Arc::new(ManyConnState {
        opened: AtomicU64::new(0),
        published: AtomicU64::new(0),
        consumed: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        recording: AtomicBool::new(false),
        hist: Mutex::new(new_hist()),
    });
    let rss_before = crate::cpu::pids_rss_kb(&args.broker_pid);
    let (start_tx, start_rx) = tokio::sync::watch::channel(None);
    let start_rx = Arc::new(start_rx);
    let setup = Arc::new(Semaphore::new(64));
    let period = Duration::from_secs_f64(1.0 / args.conn_rate.max(0.001));
    let t_open = Instant::now();
    let mut tasks = Vec::with_capacity(n);
    for id in 0..n {
        let (uri, setup, start_rx, state, errors) = (
            uri.clone(),
            setup.clone(),
            start_rx.clone(),
            state.clone(),
            errors.clone(),
        );
        let size = args.size;
        tasks.push(tokio::spawn(async move {
            if let Err(e) = conn_task(uri, id, size, period, setup, start_rx, state.clone()).await {
                if !state.stop.load(Ordering::Relaxed) {
                    log_error(&errors, format!("connection {id}: {e}"));
                }
                return false;
            }
            true
        }));
    }
    // Wait until every connection is set up (or failed).
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let opened = state.opened.load(Ordering::Relaxed) as usize;
        let finished = tasks.iter().filter(|t| t.is_finished()).count();
        if opened + finished >= n || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let opened = state.opened.load(Ordering::Relaxed);
    let open_s = t_open.elapsed().as_secs_f64();
    let rss_open = crate::cpu::pids_rss_kb(&args.broker_pid);
    if !args.json {
        println!("opened {opened}/{n} connections in {open_s:.1} s");
    }
    let _ = start_tx.send(Some(Instant::now()));
    tokio::time::sleep(Duration::from_secs(args.warmup)).await;
    state.recording.store(true, Ordering::Relaxed);
    let (p0, c0) = (
        state.published.load(Ordering::Relaxed),
        state.consumed.load(Ordering::Relaxed),
    );
    let meter = CpuMeter::start(&args.broker_pid);
    let mut rss_peak = 0;
    let window_end = Instant::now() + Duration::from_secs(args.duration);
    while Instant::now() < window_end {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if let Some(r) = crate::cpu::pids_rss_kb(&args.broker_pid) {
            rss_peak = rss_peak.max(r);
        }
    }
    let cpu = meter.finish();
    state.recording.store(false, Ordering::Relaxed);
    let (p1, c1) = (
        state.published.load(Ordering::Relaxed),
        state.consumed.load(Ordering::Relaxed),
    );
    state.stop.store(true, Ordering::Relaxed);
    let mut still_open = 0;
    for t in tasks {
        if let Ok(Ok(true)) = tokio::time::timeout(Duration::from_secs(30), t).await {
            still_open += 1;
        }
    }
    let h = state.hist.lock().unwrap();
    Ok(json!({
        "mode": "many-connections",
        "connections": n,
        "opened": opened,
        "survived": still_open,
        "open_s": round3(open_s),
        "conn_rate": args.conn_rate,
        "published_in_window": p1 - p0,
        "consumed_in_window": c1 - c0,
        "consume_rate": round2((c1 - c0) as f64 / cpu.window_s),
        "latency": hist_json(&h),
        "cpu": cpu,
        "rss_before_kb": rss_before,
        "rss_open_kb": rss_open,
        "rss_peak_kb": (rss_peak > 0).then_some(rss_peak),
        "rss_bytes_per_conn": match (rss_before, rss_open) {
            (Some(b), Some(a)) if opened > 0 => Some(round2((a as f64 - b as f64) * 1024.0 / opened as f64)),
            _ => None,
        },
    }))
}

// ------------------------------------------------------ restart / recovery

async fn passive_depth(c: &mut RawConn, q: &str) -> Result<u32, String> {
    match c
        .call(
            1,
            QueueDeclare {
                queue: q.into(),
                passive: true,
                ..Default::default()
            }
            .into(),
        )
        .await?
    {
        Method::QueueDeclareOk(ok) => Ok(ok.message_count),
        m => Err(format!("expected queue.declare-ok, got {}", m.name())),
    }
}

async fn connect_with_channel(uri: &AmqpUri) -> Result<RawConn, String> {
    let mut c = RawConn::connect(uri, "warren-perf-restart-check").await?;
    c.open_channel(1).await?;
    Ok(c)
}

/// After a broker (re)start: polls every 10 ms until a connection succeeds,
/// then (with `--get`) until basic.get on the first queue returns a message
/// (which is rejected with requeue), then until every queue of
/// `--queue-pattern` x `--queues` (only the last one with `--only-last`)
/// answers a passive queue.declare with at least `--messages / --queues`
/// messages. Times are in ms from this process's start (start it together
/// with the broker). Gives up after `--timeout` seconds.
pub async fn restart_check(args: &Args, uri: AmqpUri) -> Result<Value, String> {
    let t0 = crate::base();
    let ms = || round3(t0.elapsed().as_secs_f64() * 1000.0);
    let deadline = Instant::now() + Duration::from_secs(args.timeout);
    let pattern = args
        .queue_pattern
        .clone()
        .ok_or("restart-check needs --queue-pattern")?;
    let nq = args.queues.max(1);
    let per_queue = (args.messages / nq as u64) as u32;
    let mut last_err = String::new();
    let mut c = loop {
        match connect_with_channel(&uri).await {
            Ok(c) => break c,
            Err(e) => last_err = e,
        }
        if Instant::now() > deadline {
            return Err(format!("no connection within the timeout: {last_err}"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let connect_ms = ms();
    let mut first_get_ms = None;
    if args.get {
        let q = queue_name(&pattern, 0);
        loop {
            c.push(
                1,
                BasicGet {
                    queue: q.clone(),
                    no_ack: false,
                    ..Default::default()
                }
                .into(),
            );
            let r = async {
                c.flush().await?;
                match c.recv_method().await? {
                    (_, Method::BasicGetOk(ok)) => {
                        // header and body frames follow
                        let mut got = 0u64;
                        let mut size = u64::MAX;
                        while got < size {
                            match c.recv_frame().await? {
                                Frame::Header { body_size, .. } => size = body_size,
                                Frame::Body { payload, .. } => got += payload.len() as u64,
                                _ => return Err("unexpected frame after basic.get-ok".to_string()),
                            }
                            if size == 0 {
                                break;
                            }
                        }
                        c.push(
                            1,
                            BasicReject {
                                delivery_tag: ok.delivery_tag,
                                requeue: true,
                            }
                            .into(),
                        );
                        c.flush().await?;
                        Ok(true)
                    }
                    (_, Method::BasicGetEmpty(_)) => Ok(false),
                    (_, m) => Err(format!("expected basic.get-ok, got {}", m.name())),
                }
            }
            .await;
            match r {
                Ok(true) => break,
                Ok(false) => {}
                Err(e) => {
                    last_err = e;
                    if let Ok(nc) = connect_with_channel(&uri).await {
                        c = nc;
                    }
                }
            }
            if Instant::now() > deadline {
                return Err(format!("basic.get never succeeded: {last_err}"));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        first_get_ms = Some(ms());
    }
    let first = if args.only_last { nq - 1 } else { 0 };
    let mut depths = vec![None::<u32>; nq];
    let mut polls = 0u64;
    loop {
        polls += 1;
        let mut all = true;
        for (i, d) in depths.iter_mut().enumerate().skip(first) {
            if d.is_some_and(|d| d >= per_queue) {
                continue;
            }
            match passive_depth(&mut c, &queue_name(&pattern, i)).await {
                Ok(n) => {
                    *d = Some(n);
                    if n < per_queue {
                        all = false;
                    }
                }
                Err(e) => {
                    last_err = e;
                    all = false;
                    c = match connect_with_channel(&uri).await {
                        Ok(c) => c,
                        Err(e) => {
                            last_err = e;
                            break;
                        }
                    };
                }
            }
        }
        if all {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "queues never reached their depth (seen {:?}): {last_err}",
                depths
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let full_ms = ms();
    c.close().await;
    Ok(json!({
        "mode": "restart-check",
        "queues_checked": nq - first,
        "expected_per_queue": per_queue,
        "depths": depths.iter().skip(first).take(20).collect::<Vec<_>>(),
        "connect_ms": connect_ms,
        "first_get_ms": first_get_ms,
        "full_depth_ms": full_ms,
        "polls": polls,
    }))
}
