//! Durability of the real `warren` binary: SIGKILL while publishing with confirms, restart on
//! the same data directory, and check that every confirmed message is there exactly once per
//! queue, in order; unacked deliveries come back redelivered; durable definitions survive; a
//! deep queue pages to disk and keeps its memory flat.

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicPublishOptions,
    ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, ExchangeKind};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod binary_support;

use binary_support::{
    declare_durable, persistent, publish_and_confirm, tempdir, within, Server, WAIT,
};

async fn topology(ch: &Channel) {
    within(
        "exchange.declare",
        ch.exchange_declare(
            "crash-fanout".into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .expect("exchange.declare");
    for q in ["crash-a", "crash-b", "crash-c"] {
        declare_durable(ch, q).await;
        within(
            "queue.bind",
            ch.queue_bind(
                q.into(),
                "crash-fanout".into(),
                "".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            ),
        )
        .await
        .expect("queue.bind");
    }
    declare_durable(ch, "crash-direct").await;
}

/// Drains `queue` with basic.get + ack and returns (body, redelivered) pairs in order.
async fn drain(ch: &Channel, queue: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    loop {
        let got = within(
            "basic.get",
            ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }),
        )
        .await
        .expect("basic.get");
        let Some(m) = got else {
            return out;
        };
        out.push((
            String::from_utf8(m.delivery.data.clone()).unwrap(),
            m.delivery.redelivered,
        ));
    }
}

/// Publishes persistent messages `prefix-N` with confirms, pipelined in windows of 64, until
/// the connection dies; records the numbers the broker confirmed.
async fn publish_until_killed(
    ch: Channel,
    prefix: String,
    confirmed: Arc<parking_lot::Mutex<Vec<u64>>>,
    sent: Arc<AtomicU64>,
) {
    let mut n = 0u64;
    loop {
        let mut pending = Vec::new();
        for _ in 0..64 {
            let (exchange, key) = if n.is_multiple_of(3) {
                ("", "crash-direct")
            } else {
                ("crash-fanout", "")
            };
            let body = format!("{prefix}-{n}");
            let Ok(pc) = ch
                .basic_publish(
                    exchange.into(),
                    key.into(),
                    BasicPublishOptions::default(),
                    body.as_bytes(),
                    persistent(),
                )
                .await
            else {
                return;
            };
            sent.store(n + 1, Ordering::SeqCst);
            pending.push((n, pc));
            n += 1;
        }
        for (i, pc) in pending {
            match pc.await {
                Ok(c) if c.is_ack() => confirmed.lock().push(i),
                _ => return,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_loses_no_confirmed_message() {
    let dir = tempdir("crash");
    let mut confirmed: HashMap<String, Vec<u64>> = HashMap::new();
    let mut sent_counts: HashMap<String, u64> = HashMap::new();
    for round in 0..4u64 {
        let server = Server::start(&dir, &[]);
        let conn = server.connect().await;
        let ch = within("channel", conn.create_channel()).await.unwrap();
        topology(&ch).await;
        within(
            "confirm.select",
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        .unwrap();
        let prefix = format!("r{round}");
        let got = Arc::new(parking_lot::Mutex::new(Vec::new()));
        let sent = Arc::new(AtomicU64::new(0));
        let task = tokio::spawn(publish_until_killed(
            ch,
            prefix.clone(),
            got.clone(),
            sent.clone(),
        ));
        // Let it run a varying while, then kill it mid-stream.
        let deadline = Instant::now() + Duration::from_millis(300 + 250 * round);
        while Instant::now() < deadline || got.lock().len() < 100 {
            tokio::time::sleep(Duration::from_millis(10)).await;
            assert!(Instant::now() < deadline + WAIT, "no confirms arrive");
        }
        server.kill();
        let _ = within("publisher stops", task).await;
        confirmed.insert(prefix.clone(), got.lock().clone());
        sent_counts.insert(prefix, sent.load(Ordering::SeqCst));
        drop(conn);
    }

    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    for queue in ["crash-a", "crash-b", "crash-c", "crash-direct"] {
        let got = drain(&ch, queue).await;
        let fanout = queue != "crash-direct";
        let routed_here = |n: u64| n.is_multiple_of(3) != fanout;
        let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
        for (body, _) in &got {
            let (prefix, n) = body.split_once('-').expect("prefix-n body");
            let n: u64 = n.parse().unwrap();
            // Nothing invented: only messages that were sent, to the queues they route to.
            assert!(n < sent_counts[prefix], "{queue}: {body} was never sent");
            assert!(routed_here(n), "{queue}: {body} does not route here");
            seen.entry(prefix.to_string()).or_default().push(n);
        }
        for (prefix, want) in &confirmed {
            let have = seen.remove(prefix).unwrap_or_default();
            // In publish order, each at most once.
            assert!(
                have.windows(2).all(|w| w[0] < w[1]),
                "{queue}/{prefix}: out of order or duplicated"
            );
            for n in want.iter().filter(|n| routed_here(**n)) {
                assert!(
                    have.binary_search(n).is_ok(),
                    "{queue}: confirmed {prefix}-{n} is missing"
                );
            }
        }
    }
    let total: usize = confirmed.values().map(|v| v.len()).sum();
    assert!(total > 400, "only {total} confirms across rounds");
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacked_deliveries_return_redelivered_after_sigkill() {
    let dir = tempdir("unacked");
    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();
    declare_durable(&ch, "inflight").await;
    declare_durable(&ch, "marker").await;
    for i in 0..10 {
        let pc = within(
            "publish",
            ch.basic_publish(
                "".into(),
                "inflight".into(),
                BasicPublishOptions::default(),
                format!("m{i}").as_bytes(),
                persistent(),
            ),
        )
        .await
        .unwrap();
        assert!(within("confirm", pc).await.unwrap().is_ack());
    }
    // Take seven with basic.get (acks required), acknowledge the first three; m7..m9 are never
    // delivered.
    let consumer_ch = within("channel", conn.create_channel()).await.unwrap();
    for i in 0..7 {
        let m = within(
            "basic.get",
            consumer_ch.basic_get("inflight".into(), BasicGetOptions { no_ack: false }),
        )
        .await
        .unwrap()
        .expect("a message");
        assert_eq!(m.delivery.data, format!("m{i}").into_bytes());
        if i < 3 {
            within("ack", m.delivery.ack(BasicAckOptions::default()))
                .await
                .unwrap();
        }
    }
    // A confirmed publish after the acks: its fsync covers the ack records written before it.
    publish_and_confirm(&ch, "marker", b"sync", persistent()).await;
    server.kill();
    drop(conn);

    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let got = drain(&ch, "inflight").await;
    let want: Vec<(String, bool)> = (3..10).map(|i| (format!("m{i}"), i < 7)).collect();
    assert_eq!(got, want);
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_definitions_survive_and_transient_ones_do_not() {
    let dir = tempdir("defs");
    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    topology(&ch).await;
    within(
        "transient queue",
        ch.queue_declare(
            "scratch".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    // A transient message in a durable queue does not survive; a persistent one does.
    for (body, props) in [("t", BasicProperties::default()), ("p", persistent())] {
        within(
            "publish",
            ch.basic_publish(
                "crash-fanout".into(),
                "".into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                props,
            ),
        )
        .await
        .unwrap();
    }
    // Make sure the broker processed everything before the kill.
    within(
        "queue.declare passive",
        ch.queue_declare(
            "crash-a".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.kill();
    drop(conn);

    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let scratch = ch
        .queue_declare("scratch".into(), passive, FieldTable::default())
        .await;
    assert!(scratch.is_err(), "a non-durable queue survived a restart");
    let ch = within("channel", conn.create_channel()).await.unwrap();
    // The binding survived too: publishing to the fanout reaches crash-b.
    within(
        "publish",
        ch.basic_publish(
            "crash-fanout".into(),
            "".into(),
            BasicPublishOptions::default(),
            b"after",
            BasicProperties::default(),
        ),
    )
    .await
    .unwrap();
    let got: Vec<String> = drain(&ch, "crash-b")
        .await
        .into_iter()
        .map(|g| g.0)
        .collect();
    assert_eq!(got, vec!["p", "after"]);
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_queue_pages_to_disk_with_flat_memory() {
    let dir = tempdir("deep");
    // A small in-memory window so the test needs little data to go far beyond it.
    let server = Server::start(
        &dir,
        &[
            ("WARREN_STORAGE_QUEUE_WINDOW", "256"),
            ("WARREN_STORAGE_QUEUE_WINDOW_BYTES", "1048576"),
            ("WARREN_STORAGE_SEGMENT_SIZE", "8388608"),
        ],
    );
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    declare_durable(&ch, "deep-durable").await;
    within(
        "queue.declare",
        ch.queue_declare(
            "deep-transient".into(),
            QueueDeclareOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();
    let baseline = server.rss_kib();
    let body = vec![b'x'; 16 * 1024];
    let per_queue = 4000; // 64 MB per queue: 250 windows' worth of bytes.
    let mut peak = 0;
    for i in 0..per_queue {
        let mut pending = Vec::new();
        for (queue, props) in [
            ("deep-durable", persistent()),
            ("deep-transient", BasicProperties::default()),
        ] {
            let mut b = body.clone();
            b[..8].copy_from_slice(&(i as u64).to_be_bytes());
            pending.push(
                ch.basic_publish(
                    "".into(),
                    queue.into(),
                    BasicPublishOptions::default(),
                    &b,
                    props,
                )
                .await
                .unwrap(),
            );
        }
        if i % 64 == 63 {
            for pc in pending.drain(..) {
                assert!(within("confirm", pc).await.unwrap().is_ack());
            }
            peak = peak.max(server.rss_kib());
        } else {
            for pc in pending {
                within("confirm", pc).await.unwrap();
            }
        }
    }
    let filled = server.rss_kib();
    // Drain both queues in order.
    for queue in ["deep-durable", "deep-transient"] {
        let mut consumer = within(
            "consume",
            ch.basic_consume(
                queue.into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            ),
        )
        .await
        .unwrap();
        for i in 0..per_queue {
            let d = within("delivery", consumer.next()).await.unwrap().unwrap();
            assert_eq!(
                &d.data[..8],
                &(i as u64).to_be_bytes(),
                "{queue} out of order"
            );
            if i % 500 == 0 {
                peak = peak.max(server.rss_kib());
            }
        }
    }
    let growth_mib = peak.saturating_sub(baseline) / 1024;
    eprintln!("RSS baseline {baseline} KiB, filled {filled} KiB, peak {peak} KiB");
    // 128 MB went through two queues; memory may grow by buffers, not by the backlog.
    assert!(
        growth_mib < 48,
        "RSS grew by {growth_mib} MiB for a 128 MB backlog"
    );
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(dir).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_segments_are_reported_and_the_rest_is_served() {
    let dir = tempdir("damaged");
    // Small segments, so that the messages span several files.
    let env = [("WARREN_STORAGE_SEGMENT_SIZE", "65536")];
    let server = Server::start(&dir, &env);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    declare_durable(&ch, "damaged").await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();
    let total = 300;
    for i in 0..total {
        let pc = within(
            "publish",
            ch.basic_publish(
                "".into(),
                "damaged".into(),
                BasicPublishOptions::default(),
                format!("{i:04}{}", ".".repeat(1000)).as_bytes(),
                persistent(),
            ),
        )
        .await
        .unwrap();
        assert!(within("confirm", pc).await.unwrap().is_ack());
    }
    server.kill();
    drop(conn);

    let mut segs: Vec<PathBuf> = std::fs::read_dir(dir.join("messages"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    segs.sort();
    assert!(segs.len() >= 4, "{} segments", segs.len());
    // A flipped byte in the middle of the first segment, a missing second segment, and a torn
    // last record.
    let mut first = std::fs::read(&segs[0]).unwrap();
    // The middle record's payload (records are `u32 length, u32 crc, payload`).
    let mut starts = Vec::new();
    let mut at = 0;
    while at + 8 <= first.len() {
        starts.push(at);
        at += 8 + u32::from_be_bytes(first[at..at + 4].try_into().unwrap()) as usize;
    }
    let record = starts[starts.len() / 2];
    let len = u32::from_be_bytes(first[record..record + 4].try_into().unwrap()) as usize;
    first[record + 8 + len / 2] ^= 0x5a;
    std::fs::write(&segs[0], first).unwrap();
    std::fs::remove_file(&segs[1]).unwrap();
    // The last record ends at the last byte that is not zero: the zeros after it are what the
    // store writes ahead of its records.
    let last = segs.last().unwrap();
    let data = std::fs::read(last).unwrap();
    let len = data.iter().rposition(|&b| b != 0).unwrap() as u64 + 1;
    std::fs::OpenOptions::new()
        .write(true)
        .open(last)
        .unwrap()
        .set_len(len - 7)
        .unwrap();

    let log = dir.join("warren.log");
    let server = Server::start_logging(&dir, &env, &log);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let got: Vec<u32> = drain(&ch, "damaged")
        .await
        .into_iter()
        .map(|(body, _)| body[..4].parse().unwrap())
        .collect();
    // Everything else is served, in order, and what was lost is reported.
    assert!(got.windows(2).all(|w| w[0] < w[1]));
    assert!(
        got.len() > total as usize / 2 && got.len() < total as usize,
        "{} of {total}",
        got.len()
    );
    assert_eq!(got[0], 0);
    let text = std::fs::read_to_string(&log).unwrap();
    for what in [
        "segments are missing",
        "skipping corrupt record",
        "truncating torn",
    ] {
        assert!(text.contains(what), "log does not report '{what}':\n{text}");
    }
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(dir).unwrap();
}

/// Messages that leave durable queues through their arguments (dropped over x-max-length,
/// rejected and dead-lettered) are gone after a SIGKILL; their dead-lettered copies are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_lettered_and_dropped_messages_stay_gone_after_sigkill() {
    use lapin::options::BasicRejectOptions;
    use lapin::types::{AMQPValue, LongString};
    let dir = tempdir("queue-args");
    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    within(
        "exchange.declare",
        ch.exchange_declare(
            "dlx".into(),
            ExchangeKind::Fanout,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    declare_durable(&ch, "dlq").await;
    within(
        "queue.bind",
        ch.queue_bind(
            "dlq".into(),
            "dlx".into(),
            "".into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    let mut args = FieldTable::default();
    args.insert(
        "x-dead-letter-exchange".into(),
        AMQPValue::LongString(LongString::from("dlx")),
    );
    args.insert("x-max-length".into(), AMQPValue::LongInt(1));
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    within(
        "queue.declare",
        ch.queue_declare("src".into(), durable, args),
    )
    .await
    .unwrap();
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();
    for body in ["1", "2", "3"] {
        let pc = within(
            "publish",
            ch.basic_publish(
                "".into(),
                "src".into(),
                BasicPublishOptions::default(),
                body.as_bytes(),
                persistent(),
            ),
        )
        .await
        .unwrap();
        within("confirm", pc).await.unwrap();
    }
    // "1" and "2" were dropped to the dead-letter queue; reject "3" too.
    let got = within(
        "basic.get",
        ch.basic_get("src".into(), BasicGetOptions { no_ack: false }),
    )
    .await
    .unwrap()
    .expect("a message");
    assert_eq!(got.delivery.data, b"3");
    within(
        "basic.reject",
        ch.basic_reject(
            got.delivery.delivery_tag,
            BasicRejectOptions { requeue: false },
        ),
    )
    .await
    .unwrap();
    within(
        "queue.declare passive",
        ch.queue_declare(
            "src".into(),
            QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            FieldTable::default(),
        ),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill();
    drop(conn);

    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    assert_eq!(drain(&ch, "src").await, vec![]);
    let dead: Vec<String> = drain(&ch, "dlq").await.into_iter().map(|g| g.0).collect();
    assert_eq!(dead, vec!["1", "2", "3"]);
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(dir).unwrap();
}

/// Consumes `n` messages from `queue` on a fresh channel without acknowledging them, then closes
/// the channel (which requeues them all); returns their bodies in delivery order.
async fn consume_unacked_and_close(conn: &lapin::Connection, queue: &str, n: usize) -> Vec<String> {
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let mut consumer = within(
        "basic.consume",
        ch.basic_consume(
            queue.into(),
            "order".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        ),
    )
    .await
    .expect("basic.consume");
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        let d = within("delivery", consumer.next())
            .await
            .expect("consumer ended")
            .expect("delivery");
        got.push(String::from_utf8(d.data).unwrap());
    }
    within("channel.close", ch.close(200, "bye".into()))
        .await
        .expect("channel.close");
    got
}

/// Positions at which `b` differs from `a`.
fn moved(a: &[String], b: &[String]) -> usize {
    a.iter().zip(b).filter(|(x, y)| x != y).count() + a.len().abs_diff(b.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_publishers_queue_order_survives_requeue_and_restart() {
    const PUBLISHERS: usize = 10;
    const EACH: usize = 100;
    const TOTAL: usize = PUBLISHERS * EACH;
    let dir = tempdir("order");
    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    declare_durable(&ch, "order").await;

    // Ten publishers on their own connections, with confirms, all at once.
    let mut conns = Vec::new();
    for _ in 0..PUBLISHERS {
        conns.push(server.connect().await);
    }
    let start = Arc::new(tokio::sync::Barrier::new(PUBLISHERS));
    let mut tasks = Vec::new();
    for (p, c) in conns.iter().enumerate() {
        let ch = within("channel", c.create_channel()).await.unwrap();
        within(
            "confirm.select",
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        .unwrap();
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let mut pending = Vec::new();
            for n in 0..EACH {
                let pc = ch
                    .basic_publish(
                        "".into(),
                        "order".into(),
                        BasicPublishOptions::default(),
                        format!("p{p}-{n}").as_bytes(),
                        persistent(),
                    )
                    .await
                    .expect("publish");
                pending.push(pc);
            }
            for pc in pending {
                assert!(within("confirm", pc).await.unwrap().is_ack());
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }

    let first = consume_unacked_and_close(&conn, "order", TOTAL).await;
    for p in 0..PUBLISHERS {
        let prefix = format!("p{p}-");
        let mine: Vec<usize> = first
            .iter()
            .filter_map(|b| b.strip_prefix(&prefix)?.parse().ok())
            .collect();
        assert_eq!(mine, (0..EACH).collect::<Vec<_>>(), "publisher {p}");
    }
    let again = consume_unacked_and_close(&conn, "order", TOTAL).await;
    assert_eq!(moved(&first, &again), 0, "order changed by requeue");
    drop(conns);
    drop(conn);

    // A clean restart, then a crash: the queue comes back in the same order.
    server.terminate();
    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let after_term = consume_unacked_and_close(&conn, "order", TOTAL).await;
    assert_eq!(moved(&first, &after_term), 0, "order changed by a restart");
    // The channel close's requeue needs no fsync: the deliveries were never acked.
    drop(conn);
    server.kill();
    let server = Server::start(&dir, &[]);
    let conn = server.connect().await;
    let after_kill = consume_unacked_and_close(&conn, "order", TOTAL).await;
    assert_eq!(
        moved(&first, &after_kill),
        0,
        "order changed by recovery after SIGKILL"
    );
    drop(conn);
    server.kill();
    std::fs::remove_dir_all(dir).unwrap();
}
