//! A full disk: the real `warren` binary on a small tmpfs. Publishes that cannot be written are
//! nacked (never confirmed) at once, publishers get connection.blocked, nothing already
//! confirmed is damaged, and once space is back the broker confirms again by itself.
//!
//! Mounting a tmpfs needs root (as in CI); elsewhere the test says so and does nothing.

mod binary_support;

use binary_support::{declare_durable, persistent, tempdir, within, Server};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString};
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

struct Mount<'a>(&'a Path);

impl Drop for Mount<'_> {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0).status();
    }
}

/// Fills `path` with a file of at most `bytes` (less if the filesystem runs out).
fn filler(path: &Path, bytes: usize) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        if f.write_all(&chunk[..n]).is_err() {
            break;
        }
        left -= n;
    }
    let _ = f.sync_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_disk_nacks_blocks_and_recovers() {
    full_disk_case("full", false).await;
}

/// The same for a quorum queue: its log's failed write is retried until it succeeds (the
/// queue does not stop for good), publishes are nacked meanwhile, and they are confirmed
/// again once space is back, without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_resumes_after_a_full_disk() {
    full_disk_case("qfull", true).await;
}

async fn full_disk_case(queue: &str, quorum: bool) {
    let dir = tempdir(&format!("diskfull-{queue}"));
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48m", "tmpfs"])
        .arg(&dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here (needs root)");
        return;
    }
    let _mount = Mount(&dir);
    let data = dir.join("data");
    // No disk alarm (it would block the publisher before the disk fills): this is about
    // writes that fail.
    let env = [
        ("WARREN_STORAGE_SEGMENT_SIZE", "1048576"),
        ("WARREN_STORAGE_DISK_FREE_LIMIT", "0"),
    ];
    let log = std::env::temp_dir().join(format!(
        "warren-diskfull-{queue}-{}.log",
        std::process::id()
    ));
    let started = std::time::Instant::now();
    let server = Server::start_logging(&data, &env, &log);
    // Leave about 6 MB free; once the filler goes, there is room for all 24 MB published.
    filler(&dir.join("filler"), 42 << 20);

    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    if quorum {
        let mut args = FieldTable::default();
        args.insert(
            "x-queue-type".into(),
            AMQPValue::LongString(LongString::from("quorum")),
        );
        within(
            "queue.declare",
            ch.queue_declare(
                queue.into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            ),
        )
        .await
        .unwrap();
    } else {
        declare_durable(&ch, queue).await;
    }
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();

    // 24 MB of 64 KB messages into 6 MB of space, without waiting for each confirm. In a
    // task: once the broker sends connection.blocked, lapin holds further publishes until
    // connection.unblocked, which comes only after the space is freed below.
    let body = |i: u32| {
        let mut b = vec![b'.'; 64 * 1024];
        b[..4].copy_from_slice(&i.to_be_bytes());
        b
    };
    let publisher = {
        let ch = ch.clone();
        let queue = queue.to_string();
        tokio::spawn(async move {
            let mut pending = Vec::new();
            for i in 0..384u32 {
                let pc = ch
                    .basic_publish(
                        "".into(),
                        queue.as_str().into(),
                        BasicPublishOptions::default(),
                        &body(i),
                        persistent(),
                    )
                    .await
                    .unwrap();
                pending.push((i, pc));
            }
            let mut acked = Vec::new();
            let mut nacked = Vec::new();
            for (i, pc) in pending {
                match pc.await.unwrap() {
                    c if c.is_ack() => acked.push(i),
                    _ => nacked.push(i),
                }
            }
            (acked, nacked)
        })
    };
    // Free the space while publishes and confirms are outstanding; the store retries on its
    // own.
    tokio::time::sleep(Duration::from_secs(2)).await;
    std::fs::remove_file(dir.join("filler")).unwrap();
    let (mut acked, nacked) = within("publishes and confirms", publisher).await.unwrap();
    eprintln!(
        "{} confirmed, {} nacked while the disk was full",
        acked.len(),
        nacked.len()
    );
    // A quorum queue's log holds a failed batch and writes it again once there is room: what
    // was proposed before the failure may all be confirmed then, with nothing nacked.
    assert!(quorum || !nacked.is_empty(), "a full disk nacked nothing");
    assert!(!acked.is_empty(), "nothing was confirmed");
    // The refusals are logged once, then summarised at most every 10 s: not one line each.
    // (A quorum queue's refusals are the log writer's: one line when writes start failing.)
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    if quorum {
        assert!(
            text.contains("raft log write failed"),
            "the failing log went unreported:\n{text}"
        );
        assert!(text.contains("raft log writes succeed again"), "{text}");
    } else {
        check_refusal_lines(&text, started, nacked.len());
    }
    let _ = std::fs::remove_file(&log);

    // Space is back: new publishes are confirmed again.
    for i in 1000..1010u32 {
        let pc = within(
            "publish",
            ch.basic_publish(
                "".into(),
                queue.into(),
                BasicPublishOptions::default(),
                &body(i),
                persistent(),
            ),
        )
        .await
        .unwrap();
        assert!(
            within("confirm", pc).await.unwrap().is_ack(),
            "{i} nacked after recovery"
        );
        acked.push(i);
    }
    server.kill();
    drop(conn);

    // Everything confirmed survived, in order; nothing nacked was stored.
    let server = Server::start(&data, &env);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let mut got = Vec::new();
    while let Some(m) = within(
        "basic.get",
        ch.basic_get(queue.into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap()
    {
        let d = &m.delivery.data;
        assert_eq!(d.len(), 64 * 1024, "damaged body");
        assert!(d[4..].iter().all(|b| *b == b'.'), "damaged body");
        got.push(u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
    }
    // Every confirmed message, in order, once. A nacked message may be there too: the batch
    // whose write failed is nacked at once but still written when the disk comes back (a
    // nack means the broker did not take responsibility, not that the message is gone).
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "out of order or duplicated: {got:?}"
    );
    for i in &acked {
        assert!(got.contains(i), "confirmed {i} lost");
    }
    for i in &got {
        assert!(
            acked.contains(i) || nacked.contains(i),
            "{i} was never published"
        );
    }
    drop(conn);
    server.kill();
}

/// The classic store's refusals are logged once, then summarised at most every 10 s: not
/// one line each.
fn check_refusal_lines(text: &str, started: std::time::Instant, nacked: usize) {
    let lines = text.matches("publish refused").count() as u64;
    assert!(lines >= 1, "refused publishes went unreported:\n{text}");
    assert!(
        lines <= 1 + started.elapsed().as_secs() / 10,
        "{lines} lines for {nacked} refused publishes:\n{text}"
    );
}

/// Publishes 64 KB numbered `i` and waits for its confirm: true for basic.ack.
async fn publish_confirmed(ch: &lapin::Channel, i: u32) -> bool {
    let mut b = vec![b'.'; 64 * 1024];
    b[..4].copy_from_slice(&i.to_be_bytes());
    let pc = within(
        "publish",
        ch.basic_publish(
            "".into(),
            "prompt".into(),
            BasicPublishOptions::default(),
            &b,
            persistent(),
        ),
    )
    .await
    .unwrap();
    within("confirm", pc).await.unwrap().is_ack()
}

/// A publish caught by a failing write is nacked at once, while the disk is still full (not
/// when it comes back); everything confirmed before survives SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishes_that_cannot_be_stored_are_nacked_promptly() {
    let dir = tempdir("diskfull-prompt");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16m", "tmpfs"])
        .arg(&dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here (needs root)");
        return;
    }
    let _mount = Mount(&dir);
    let data = dir.join("data");
    // No disk alarm: this is about writes that fail.
    let env = [
        ("WARREN_STORAGE_SEGMENT_SIZE", "1048576"),
        ("WARREN_STORAGE_DISK_FREE_LIMIT", "0"),
    ];
    let server = Server::start(&data, &env);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    declare_durable(&ch, "prompt").await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();
    let mut confirmed = Vec::new();
    for i in 0..5u32 {
        assert!(publish_confirmed(&ch, i).await);
        confirmed.push(i);
    }
    // Fill the disk and keep it full.
    filler(&dir.join("filler"), 16 << 20);
    let start = std::time::Instant::now();
    // Publishes until the first write that fails catches one: the zeros the store wrote
    // ahead of its records (at most a segment) take records until they run out. (Publishing
    // on after the nack would race with connection.blocked, after which lapin holds further
    // publishes on its side.)
    let mut nacked = false;
    for i in 100..100 + 32u32 {
        if !publish_confirmed(&ch, i).await {
            nacked = true;
            break;
        }
        confirmed.push(i);
    }
    let waited = start.elapsed();
    eprintln!("nacked within {waited:?} on a full disk");
    assert!(nacked, "a publish was confirmed on a full disk");
    // The store retries once a second; a confirm held until the disk came back would never
    // have arrived here (the disk is still full).
    assert!(
        waited < Duration::from_secs(15),
        "confirms took {waited:?} on a full disk"
    );
    server.kill();
    drop(conn);
    std::fs::remove_file(dir.join("filler")).unwrap();
    let server = Server::start(&data, &env);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let mut got = Vec::new();
    while let Some(m) = within(
        "basic.get",
        ch.basic_get("prompt".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap()
    {
        let d = &m.delivery.data;
        got.push(u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
    }
    for i in &confirmed {
        assert!(got.contains(i), "confirmed {i} lost: {got:?}");
    }
    drop(conn);
    server.kill();
}

/// A restart onto a full disk: the queue's spill file cannot be written, yet every confirmed
/// message is in the queue (its depth counts them all) and is delivered, in order; once
/// space is back and the broker stops cleanly, nothing delivered comes back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_on_a_full_disk_shows_every_confirmed_message() {
    let dir = tempdir("diskfull-restart");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
        .arg(&dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here (needs root)");
        return;
    }
    let _mount = Mount(&dir);
    let data = dir.join("data");
    // Small segments: recovery cuts the zeros the store wrote ahead of its records (at most
    // a segment), which must not make room for the spill file.
    let env = [
        ("WARREN_STORAGE_SEGMENT_SIZE", "16384"),
        ("WARREN_STORAGE_DISK_FREE_LIMIT", "0"),
        ("WARREN_STORAGE_QUEUE_WINDOW", "16"),
    ];
    let n = 5000u32;
    let body = |i: u32| {
        let mut b = vec![b'.'; 1024];
        b[..4].copy_from_slice(&i.to_be_bytes());
        b
    };
    let server = Server::start(&data, &env);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    declare_durable(&ch, "deep").await;
    within(
        "confirm.select",
        ch.confirm_select(ConfirmSelectOptions::default()),
    )
    .await
    .unwrap();
    let mut pending = Vec::new();
    for i in 0..n {
        let pc = within(
            "publish",
            ch.basic_publish(
                "".into(),
                "deep".into(),
                BasicPublishOptions::default(),
                &body(i),
                persistent(),
            ),
        )
        .await
        .unwrap();
        pending.push(pc);
    }
    for pc in pending {
        assert!(within("confirm", pc).await.unwrap().is_ack());
    }
    server.kill();
    drop(conn);

    // The disk fills up while the broker is down.
    let _ = std::fs::remove_dir_all(data.join("spill"));
    filler(&dir.join("filler"), 64 << 20);
    let log = std::env::temp_dir().join(format!(
        "warren-diskfull-restart-{}.log",
        std::process::id()
    ));
    let server = Server::start_logging(&data, &env, &log);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let depth = within(
        "queue.declare passive",
        ch.queue_declare(
            "deep".into(),
            lapin::options::QueueDeclareOptions {
                passive: true,
                ..Default::default()
            },
            lapin::types::FieldTable::default(),
        ),
    )
    .await
    .unwrap()
    .message_count();
    assert_eq!(
        depth, n,
        "confirmed messages missing from the queue after the restart"
    );
    let mut got = Vec::new();
    while let Some(m) = within(
        "basic.get",
        ch.basic_get("deep".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap()
    {
        let d = &m.delivery.data;
        assert_eq!(d.len(), 1024, "damaged body");
        got.push(u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
    }
    assert_eq!(got, (0..n).collect::<Vec<_>>());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("cannot write spill file"),
        "the full disk went unreported:\n{text}"
    );
    assert!(
        text.matches("cannot write spill file").count() <= 2,
        "one warning per failed write:\n{text}"
    );
    // Space comes back; a clean stop writes the acks; nothing delivered returns.
    std::fs::remove_file(dir.join("filler")).unwrap();
    drop(conn);
    server.terminate();
    let server = Server::start(&data, &env);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let left = within(
        "basic.get",
        ch.basic_get("deep".into(), BasicGetOptions { no_ack: true }),
    )
    .await
    .unwrap();
    assert!(left.is_none(), "delivered messages came back");
    drop(conn);
    server.kill();
    let _ = std::fs::remove_file(log);
}

/// A quorum queue whose snapshot cannot be written (the disk fills up as its log reaches
/// 4096 entries and it snapshots) carries on: the snapshot is written again until there is
/// room, and once space is back publishes are confirmed without a restart (openraft stops a
/// group for good on a failed snapshot, which left the queue nacking every publish).
/// Everything confirmed is there after a restart, from the snapshot and the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_queue_whose_snapshot_cannot_be_written_resumes() {
    let dir = tempdir("diskfull-qsnap");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=24m", "tmpfs"])
        .arg(&dir)
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !mounted {
        eprintln!("skipping: cannot mount a tmpfs here (needs root)");
        return;
    }
    let _mount = Mount(&dir);
    let data = dir.join("data");
    // No disk alarm: this is about writes that fail.
    let env = [
        ("WARREN_STORAGE_SEGMENT_SIZE", "1048576"),
        ("WARREN_STORAGE_DISK_FREE_LIMIT", "0"),
    ];
    let log =
        std::env::temp_dir().join(format!("warren-diskfull-qsnap-{}.log", std::process::id()));
    let server = Server::start_logging(&data, &env, &log);
    // About 12 MB free: room for the log of 4400 messages of 2 KB (9 MB), not for the
    // snapshot of the first 4096 of them besides it.
    filler(&dir.join("filler"), 12 << 20);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(LongString::from("quorum")),
    );
    within(
        "queue.declare",
        ch.queue_declare(
            "qsnap".into(),
            QueueDeclareOptions {
                durable: true,
                ..Default::default()
            },
            args,
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
    let publish = |i: u32| {
        let ch = ch.clone();
        async move {
            let mut b = vec![b'.'; 2048];
            b[..4].copy_from_slice(&i.to_be_bytes());
            let pc = within(
                "publish",
                ch.basic_publish(
                    "".into(),
                    "qsnap".into(),
                    BasicPublishOptions::default(),
                    &b,
                    persistent(),
                ),
            )
            .await
            .unwrap();
            within("confirm", pc).await.unwrap().is_ack()
        }
    };
    // One at a time, so that each message is an entry of its own and the group snapshots
    // after about 4096 of them.
    let mut acked = Vec::new();
    let mut nacked = Vec::new();
    for i in 0..4400u32 {
        if publish(i).await {
            acked.push(i);
        } else {
            nacked.push(i);
        }
    }
    eprintln!(
        "{} confirmed, {} nacked on the filling disk",
        acked.len(),
        nacked.len()
    );
    // Let the snapshot fail (it is built in the background) before space comes back.
    let failed = "cannot write quorum queue snapshot";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains(failed)
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::remove_file(dir.join("filler")).unwrap();

    // Space is back: publishes are confirmed again, within a few seconds.
    let start = std::time::Instant::now();
    for i in 5000..5010u32 {
        assert!(
            publish(i).await,
            "{i} nacked after the space came back ({:?} after)",
            start.elapsed()
        );
        acked.push(i);
    }
    eprintln!("confirmed again within {:?}", start.elapsed());
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains(failed),
        "the snapshot did not fail: the test set-up missed its point\n{text}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("quorum queue snapshot written")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the snapshot was not written once space was back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.kill();
    drop(conn);
    let _ = std::fs::remove_file(&log);

    // Everything confirmed survived, in order, once.
    let server = Server::start(&data, &env);
    let conn = server.connect().await;
    let ch = within("channel", conn.create_channel()).await.unwrap();
    let get = || {
        within(
            "basic.get",
            ch.basic_get("qsnap".into(), BasicGetOptions { no_ack: true }),
        )
    };
    // After a restart the group elects itself and replays its log before it hands anything
    // out (basic.get finds the queue empty until then).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut first = get().await.unwrap();
    while first.is_none() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        first = get().await.unwrap();
    }
    let mut got = Vec::new();
    let mut next = first;
    while let Some(m) = next {
        let d = &m.delivery.data;
        assert_eq!(d.len(), 2048, "damaged body");
        got.push(u32::from_be_bytes([d[0], d[1], d[2], d[3]]));
        next = get().await.unwrap();
    }
    assert!(
        got.windows(2).all(|w| w[0] < w[1]),
        "out of order or duplicated"
    );
    for i in &acked {
        assert!(got.contains(i), "confirmed {i} lost ({} got)", got.len());
    }
    for i in &got {
        assert!(
            acked.contains(i) || nacked.contains(i),
            "{i} was never published"
        );
    }
    drop(conn);
    server.kill();
}
