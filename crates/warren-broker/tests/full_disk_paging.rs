//! Paging when the disk refuses writes: at recovery (the spill file cannot be written) and at
//! run time (the store cannot take a transient message's page). Nothing may leave a queue's
//! view or change place: the depth stays right, every message is delivered in order, and what
//! was kept in memory is paged out once the disk takes writes again.

use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use warren_amqp::properties::BasicProperties;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_broker::clock::{Clock, ManualClock};
use warren_broker::queue::{Backing, ClassicQueue, Paging};
use warren_broker::{Message, Queue};
use warren_store::spill::{SpillEntry, SpillFault};
use warren_store::{Store, StoreConfig};

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-fullpage-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cfg(dir: &Path) -> StoreConfig {
    StoreConfig {
        segment_size: 4096,
        ..StoreConfig::new(dir.join("messages"))
    }
}

/// The number of a spill file named `<n>.spill` (see `Backing::spill_path`).
fn spill_number(spill: &Path) -> u64 {
    let stem = spill.file_stem().and_then(|s| s.to_str()).unwrap();
    stem.parse().expect("a spill file is named <n>.spill")
}

/// A durable queue paging to `store` beyond 8 messages, its spill file at `spill`
/// (`<dir>/<n>.spill`).
fn queue(store: &Store, spill: &Path, clock: &Arc<ManualClock>, args: FieldTable) -> Arc<Queue> {
    Arc::new(
        ClassicQueue::new("q", "/", true, None, false, args)
            .with_clock(clock.clone())
            .with_backing(Backing {
                store: store.clone(),
                paging: Arc::new(Paging {
                    window: 8,
                    window_bytes: 1 << 20,
                    unacked_window: 4,
                    unacked_window_bytes: 1 << 20,
                    spill_dir: spill.parent().unwrap().to_path_buf(),
                }),
                spill: spill_number(spill),
            }),
    )
}

fn prio_args() -> FieldTable {
    let mut t = FieldTable::new();
    t.insert("x-max-priority", FieldValue::I32(5));
    t
}

/// Publishes like the vhost does: a persistent message is written to the store first.
fn publish(q: &Arc<Queue>, store: &Store, clock: &ManualClock, body: &str, persistent: bool) {
    let prio = body.len() as u8 % 3;
    let props = BasicProperties {
        delivery_mode: Some(if persistent { 2 } else { 1 }),
        priority: Some(prio),
        ..Default::default()
    };
    let id = store.next_id();
    let stored = persistent.then(|| {
        store
            .append_publish(
                id,
                "",
                "q",
                &props,
                body.as_bytes(),
                clock.now_ms(),
                &[q.store_key()],
                None,
            )
            .unwrap()
    });
    let msg = Arc::new(Message::new(
        String::new(),
        "q".into(),
        props,
        Bytes::copy_from_slice(body.as_bytes()),
    ));
    q.publish(msg, id, stored);
}

fn drain(q: &Arc<Queue>) -> Vec<String> {
    std::iter::from_fn(|| q.get(true))
        .map(|(m, _)| String::from_utf8(m.message.body.to_vec()).unwrap())
        .collect()
}

/// Restarts: reopens the store and recovers the queue's messages into a fresh queue, as the
/// vhost does.
fn recover(
    dir: &Path,
    config: StoreConfig,
    spill: &Path,
    clock: &Arc<ManualClock>,
) -> (Store, Arc<Queue>) {
    let _ = dir;
    let (store, rec) = Store::open(config).unwrap();
    let q = queue(&store, spill, clock, FieldTable::new());
    let entries = rec.queues.get(q.store_key()).cloned().unwrap_or_default();
    q.recover(&mut entries.into_iter().map(SpillEntry::from));
    (store, q)
}

fn bodies(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("m{i}")).collect()
}

/// Publishes `n` persistent messages and stops the broker.
fn fill(dir: &Path, clock: &Arc<ManualClock>, n: usize) {
    let (store, _) = Store::open(cfg(dir)).unwrap();
    let q = queue(&store, &dir.join("1.spill"), clock, FieldTable::new());
    for b in bodies(0..n) {
        publish(&q, &store, clock, &b, true);
    }
    assert_eq!(q.counts().ready as usize, n);
    store.close();
}

/// A restart whose spill file is on a disk that refuses every write (`/dev/full`, which
/// answers ENOSPC): every recovered message stays in the queue, counted and in order.
#[test]
fn recovery_onto_a_full_disk_keeps_every_message_in_order() {
    if !Path::new("/dev/full").exists() {
        eprintln!("skipping: no /dev/full here");
        return;
    }
    let dir = tempdir("recover-devfull");
    let clock = Arc::new(ManualClock::new(1_000));
    fill(&dir, &clock, 3000);
    let spill = dir.join("2.spill");
    std::os::unix::fs::symlink("/dev/full", &spill).unwrap();
    let (store, q) = recover(&dir, cfg(&dir), &spill, &clock);
    assert_eq!(
        q.counts().ready,
        3000,
        "recovered messages missing from the queue"
    );
    assert_eq!(drain(&q), bodies(0..3000));
    assert_eq!(q.counts().ready, 0);
    store.close();
    drop(q);
    // The restart after that has nothing left: every message was delivered (and acked).
    let (store, q) = recover(&dir, cfg(&dir), &dir.join("3.spill"), &clock);
    assert_eq!(q.counts().ready, 0);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// The same with an injected failure that ends: once the disk takes writes again, the
/// entries kept in memory go to the spill file (at the next sweep), and nothing moves.
#[test]
fn entries_kept_in_memory_at_recovery_are_paged_out_once_space_returns() {
    let dir = tempdir("recover-hook");
    let clock = Arc::new(ManualClock::new(1_000));
    fill(&dir, &clock, 3000);
    let fault = SpillFault::default();
    fault.set(true);
    let config = StoreConfig {
        spill_write_fault: Some(fault.clone()),
        ..cfg(&dir)
    };
    let spill = dir.join("spill").join("4.spill");
    let (store, q) = recover(&dir, config, &spill, &clock);
    assert_eq!(q.counts().ready, 3000);
    assert_eq!(q.ready_in_memory_and_paged_out(), (8, 2992));
    assert!(!spill.exists(), "the spill file was written on a full disk");
    q.sweep();
    assert!(!spill.exists());
    fault.set(false);
    q.sweep();
    let written = std::fs::metadata(&spill).map(|m| m.len()).unwrap_or(0);
    assert_eq!(
        written,
        2992 * 32,
        "kept entries not written once space returned"
    );
    assert_eq!(drain(&q), bodies(0..3000));
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

struct Synced(parking_lot::Mutex<bool>);

impl warren_store::Completion for Synced {
    fn complete(&self, _tokens: &[u64], _ok: bool) {
        *self.0.lock() = true;
    }
}

fn wait(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn segment_numbers(dir: &Path) -> Vec<u32> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".seg")?.parse().ok()
        })
        .collect()
}

/// Makes the store's writes fail (directories where its next segments go, which refuses them
/// for root too) until the returned blockers are removed.
fn fail_store(store: &Store, dir: &Path) -> Vec<PathBuf> {
    let synced = Arc::new(Synced(parking_lot::Mutex::new(false)));
    store.sync((synced.clone(), 0));
    wait("sync", || *synced.0.lock());
    let seg_dir = dir.join("messages");
    let last = segment_numbers(&seg_dir).into_iter().max().unwrap_or(0);
    let blockers: Vec<PathBuf> = (last + 1..last + 64)
        .map(|n| seg_dir.join(format!("{n:08}.seg")))
        .collect();
    for b in &blockers {
        std::fs::create_dir(b).unwrap();
    }
    let junk = BasicProperties::default();
    wait("store failed", || {
        if let Ok(loc) = store.append_transient(store.next_id(), "", "", &junk, &[0; 1024], 0) {
            store.release(loc);
        }
        store.is_failed()
    });
    blockers
}

/// Transient messages published while the store refuses writes cannot be paged out: they
/// stay in memory behind the messages already paged out (not ahead of them), the depth
/// counts them, and once the store writes again they are paged out and delivered in order.
fn run_time_page_out_failure(name: &str, args: FieldTable) {
    let dir = tempdir(name);
    let clock = Arc::new(ManualClock::new(1_000));
    let (store, _) = Store::open(cfg(&dir)).unwrap();
    let q = queue(&store, &dir.join("5.spill"), &clock, args.clone());
    for b in bodies(0..30) {
        publish(&q, &store, &clock, &b, false);
    }
    let blockers = fail_store(&store, &dir);
    for b in bodies(30..60) {
        publish(&q, &store, &clock, &b, false);
    }
    assert_eq!(q.counts().ready, 60);
    // Persistent publishes are refused by the store itself (the vhost nacks them).
    for b in &blockers {
        std::fs::remove_dir(b).unwrap();
    }
    wait("store writes again", || !store.is_failed());
    q.sweep();
    let (in_memory, paged_out) = q.ready_in_memory_and_paged_out();
    assert_eq!(
        (in_memory, paged_out),
        (8, 52),
        "held messages not paged out"
    );
    let mut want: Vec<usize> = (0..60).collect();
    if args.get("x-max-priority").is_some() {
        want.sort_by_key(|&i| (2 - format!("m{i}").len() % 3, i));
    }
    let want: Vec<String> = want.iter().map(|i| format!("m{i}")).collect();
    assert_eq!(drain(&q), want);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn publishes_the_store_cannot_page_out_keep_their_place() {
    run_time_page_out_failure("runtime", FieldTable::new());
}

#[test]
fn priority_publishes_the_store_cannot_page_out_keep_their_place() {
    run_time_page_out_failure("runtime-prio", prio_args());
}

/// A stored message that cannot be read back for now (an I/O error: here its segment is
/// replaced by a directory, which fails reads for root too) stays queued and counted: the
/// queue delivers up to it, waits, and goes on in order once the segment reads again. It is
/// neither skipped nor deleted from the store.
#[test]
fn a_message_that_cannot_be_read_now_stays_queued_in_order() {
    let dir = tempdir("unreadable");
    let clock = Arc::new(ManualClock::new(1_000));
    fill(&dir, &clock, 3000);
    let segs = dir.join("messages");
    let mut numbers = segment_numbers(&segs);
    numbers.sort_unstable();
    assert!(numbers.len() >= 10, "{numbers:?}");
    let broken = segs.join(format!("{:08}.seg", numbers[numbers.len() / 2]));
    let aside = dir.join("aside.seg");
    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    std::fs::rename(&broken, &aside).unwrap();
    std::fs::create_dir(&broken).unwrap();
    let q = queue(&store, &dir.join("5.spill"), &clock, FieldTable::new());
    let entries = rec.queues.get(q.store_key()).cloned().unwrap_or_default();
    q.recover(&mut entries.into_iter().map(SpillEntry::from));
    assert_eq!(q.counts().ready, 3000);
    let before = drain(&q);
    assert!(before.len() < 3000, "read through a broken segment");
    assert_eq!(before, bodies(0..before.len()));
    assert_eq!(q.counts().ready as usize, 3000 - before.len());
    // The segment reads again: the rest follows, in order, the stuck one first.
    std::fs::remove_dir(&broken).unwrap();
    std::fs::rename(&aside, &broken).unwrap();
    let after = drain(&q);
    assert_eq!(after, bodies(before.len()..3000));
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}
