//! Store behaviour across reopenings: recovery order, acks, redelivered flags, group-commit
//! completions, segment reclaim and damaged files.

use parking_lot::Mutex;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use warren_amqp::properties::BasicProperties;
use warren_store::{Completion, Location, Store, StoreConfig};

struct Done(Mutex<Vec<(u64, bool)>>);
impl Completion for Done {
    fn complete(&self, tokens: &[u64], ok: bool) {
        self.0.lock().extend(tokens.iter().map(|t| (*t, ok)));
    }
}

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-store-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn cfg(dir: &Path) -> StoreConfig {
    StoreConfig {
        segment_size: 4096,
        ..StoreConfig::new(dir)
    }
}

fn persistent() -> BasicProperties {
    BasicProperties {
        delivery_mode: Some(2),
        ..Default::default()
    }
}

fn publish(store: &Store, body: &str, queues: &[&str]) -> (u64, Location) {
    publish_with(store, &persistent(), body, queues)
}

fn publish_with(
    store: &Store,
    props: &BasicProperties,
    body: &str,
    queues: &[&str],
) -> (u64, Location) {
    let id = store.next_id();
    let loc = store
        .append_publish(id, "", "k", props, body.as_bytes(), 1, queues, None)
        .unwrap();
    (id, loc)
}

fn ids(rec: &warren_store::Recovered, q: &str) -> Vec<u64> {
    rec.queues
        .get(q)
        .map(|v| v.iter().map(|e| e.id).collect())
        .unwrap_or_default()
}

#[test]
fn recovers_unacked_messages_in_order_per_queue() {
    let dir = tempdir("order");
    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    assert!(rec.queues.is_empty());
    let mut sent = Vec::new();
    for i in 0..100 {
        sent.push(publish(&store, &format!("m{i}"), &["a", "b"]));
    }
    // a acks the even ones, b acks the first half.
    for (i, (id, loc)) in sent.iter().enumerate() {
        if i % 2 == 0 {
            store.ack("a", *id, *loc);
        }
        if i < 50 {
            store.ack("b", *id, *loc);
        }
    }
    store.delivered("a", None, sent[1].0);
    store.close();

    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    let want_a: Vec<u64> = sent.iter().skip(1).step_by(2).map(|s| s.0).collect();
    let want_b: Vec<u64> = sent.iter().skip(50).map(|s| s.0).collect();
    assert_eq!(ids(&rec, "a"), want_a);
    assert_eq!(ids(&rec, "b"), want_b);
    assert!(rec.queues["a"][0].redelivered);
    assert!(!rec.queues["a"][1].redelivered);
    let m = store.read(rec.queues["a"][0].location).unwrap();
    assert_eq!(&m.body[..], b"m1");
    assert_eq!(m.properties.delivery_mode, Some(2));
    // New ids continue after the recovered ones.
    assert!(store.next_id() > sent.last().unwrap().0);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_priority_queue_keeps_a_delivered_watermark_per_priority() {
    let dir = tempdir("prio");
    let (store, _) = Store::open(cfg(&dir)).unwrap();
    let with_priority = |body: &str, p: u8| {
        let props = BasicProperties {
            priority: Some(p),
            ..persistent()
        };
        publish_with(&store, &props, body, &["pq", "plain"]).0
    };
    // Ten of priority 0, then ten of priority 5; the queue delivers the priority-5 ones
    // first, and the first three of priority 0 after them.
    let low: Vec<u64> = (0..10)
        .map(|i| with_priority(&format!("l{i}"), 0))
        .collect();
    let high: Vec<u64> = (0..10)
        .map(|i| with_priority(&format!("h{i}"), 5))
        .collect();
    store.delivered("pq", Some(5), high[9]);
    store.delivered("pq", Some(0), low[2]);
    // The same deliveries from a queue without priorities: one watermark.
    store.delivered("plain", None, high[9]);
    store.close();

    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    let flagged = |q: &str| -> Vec<u64> {
        rec.queues[q]
            .iter()
            .filter(|e| e.redelivered)
            .map(|e| e.id)
            .collect()
    };
    let mut want: Vec<u64> = low[..3].to_vec();
    want.extend(&high);
    assert_eq!(
        flagged("pq"),
        want,
        "only what was delivered, at each priority"
    );
    assert_eq!(flagged("plain").len(), 20);
    store.close();
    // The names the per-priority watermarks are kept under, and what they are not.
    let name = warren_store::priority_mark("/\u{1f}pq", 7);
    assert_eq!(
        warren_store::parse_priority_mark(&name),
        Some((7, "/\u{1f}pq"))
    );
    assert_eq!(warren_store::parse_priority_mark("/\u{1f}pq"), None);
    assert_eq!(warren_store::parse_priority_mark("\u{1e}x\u{1e}q"), None);
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn completions_follow_the_fsync() {
    let dir = tempdir("confirm");
    let (store, _) = Store::open(cfg(&dir)).unwrap();
    let done = Arc::new(Done(Mutex::new(Vec::new())));
    for t in 1..=50u64 {
        let id = store.next_id();
        store
            .append_publish(
                id,
                "",
                "k",
                &persistent(),
                b"x",
                1,
                &["q"],
                Some((done.clone(), t)),
            )
            .unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while done.0.lock().len() < 50 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let got = done.0.lock().clone();
    assert_eq!(got, (1..=50).map(|t| (t, true)).collect::<Vec<_>>());
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn settled_segments_are_deleted_as_queues_drain() {
    let dir = tempdir("reclaim");
    let (store, _) = Store::open(cfg(&dir)).unwrap();
    // Enough messages that their ACK records alone fill several segments.
    let body = "y".repeat(100);
    let sent: Vec<_> = (0..1000).map(|_| publish(&store, &body, &["q"])).collect();
    store.close();
    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    assert_eq!(ids(&rec, "q").len(), 1000);
    let before = store.segment_count();
    assert!(before > 5, "{before} segments");
    for (id, loc) in &sent {
        store.ack("q", *id, *loc);
    }
    // Reclaim happens after the writer's next round.
    let sync = Arc::new(Done(Mutex::new(Vec::new())));
    store.sync((sync.clone(), 0));
    store.sync((sync.clone(), 1));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while store.segment_count() > 2 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        store.sync((sync.clone(), 2));
    }
    assert!(
        store.segment_count() <= 2,
        "{} segments left",
        store.segment_count()
    );
    store.close();
    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    assert!(ids(&rec, "q").is_empty());
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

fn fill(dir: &Path, n: usize) -> Vec<u64> {
    let (store, _) = Store::open(cfg(dir)).unwrap();
    let ids = (0..n)
        .map(|i| publish(&store, &format!("{i:0>300}"), &["q"]).0)
        .collect();
    store.close();
    ids
}

#[test]
fn torn_tail_is_truncated() {
    let dir = tempdir("torn");
    let sent = fill(&dir, 30);
    let last = segments(&dir).pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
    f.set_len(len - 10).unwrap();
    drop(f);
    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    assert_eq!(ids(&rec, "q"), sent[..29].to_vec());
    assert!(rec.report.truncated_bytes > 0);
    store.close();
    // The truncation is permanent and clean: a second recovery reports nothing.
    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    assert_eq!(rec.report.truncated_bytes, 0);
    assert_eq!(ids(&rec, "q").len(), 29);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// The store with 1 MiB segments: room for the zeros written ahead of the records.
fn big_segments(dir: &Path) -> StoreConfig {
    StoreConfig {
        segment_size: 1 << 20,
        ..StoreConfig::new(dir)
    }
}

/// Publishes `n` messages and waits for their fsync.
fn publish_synced(store: &Store, n: usize, size: usize) -> Vec<u64> {
    let ids = (0..n)
        .map(|i| publish(store, &format!("{i:0>size$}"), &["q"]).0)
        .collect();
    let done = Arc::new(Done(Mutex::new(Vec::new())));
    store.sync((done.clone(), 0));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while done.0.lock().is_empty() {
        assert!(std::time::Instant::now() < deadline, "sync never completed");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(*done.0.lock(), vec![(0, true)]);
    ids
}

#[test]
fn a_crash_leaves_zeros_ahead_of_the_records_that_recovery_cuts_quietly() {
    let dir = tempdir("zeros");
    let (store, _) = Store::open(big_segments(&dir)).unwrap();
    let mut sent = publish_synced(&store, 200, 300);
    store.crash();
    // The segment was written ahead of its records: zeros up to the segment size.
    let seg = segments(&dir).pop().unwrap();
    let data = std::fs::read(&seg).unwrap();
    assert_eq!(data.len() as u64, 1 << 20, "zeros written ahead");
    let end = records_end(&data);
    assert!(end > 200 * 300 && end < data.len());

    let (store, rec) = Store::open(big_segments(&dir)).unwrap();
    assert_eq!(ids(&rec, "q"), sent);
    assert_eq!(rec.report.truncated_bytes, 0, "zeros are not a torn tail");
    assert_eq!(rec.report.corrupt_records, 0);
    // Cut to the records: the zeros are gone from the disk.
    let cut = std::fs::metadata(&seg).unwrap().len() as usize;
    assert!(cut >= end && cut < end + 8, "cut at {cut}");
    for e in &rec.queues["q"] {
        store.read(e.location).unwrap();
    }
    // Written on after the restart (a new segment), crashed again, recovered again.
    sent.extend(publish_synced(&store, 50, 300));
    store.crash();
    let (store, rec) = Store::open(big_segments(&dir)).unwrap();
    assert_eq!(ids(&rec, "q"), sent);
    assert_eq!(rec.report.truncated_bytes, 0);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_segment_written_no_more_keeps_no_zeros() {
    let dir = tempdir("sealed");
    let (store, _) = Store::open(big_segments(&dir)).unwrap();
    // About 2.5 segments of records.
    let sent = publish_synced(&store, 2600, 1000);
    let segs = segments(&dir);
    assert!(segs.len() >= 3, "{} segments", segs.len());
    for seg in &segs[..segs.len() - 1] {
        let data = std::fs::read(seg).unwrap();
        assert_ne!(data.last(), Some(&0), "{} ends in zeros", seg.display());
        assert!(data.len() < (1 << 20) + 2000);
    }
    // The open segment is cut at shutdown too.
    store.close();
    let data = std::fs::read(segs.last().unwrap()).unwrap();
    assert_ne!(data.last(), Some(&0));
    let (store, rec) = Store::open(big_segments(&dir)).unwrap();
    assert_eq!(ids(&rec, "q"), sent);
    assert_eq!(rec.report.truncated_bytes, 0);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// A store of 100 synced messages crashed with zeros ahead of its records, then `damage`
/// done to the bytes of its last segment: the directory and the ids sent.
fn crashed_and_damaged(name: &str, damage: impl FnOnce(&mut Vec<u8>)) -> (PathBuf, Vec<u64>) {
    let dir = tempdir(name);
    let (store, _) = Store::open(big_segments(&dir)).unwrap();
    let sent = publish_synced(&store, 100, 300);
    store.crash();
    let seg = segments(&dir).pop().unwrap();
    let mut data = std::fs::read(&seg).unwrap();
    damage(&mut data);
    std::fs::write(&seg, &data).unwrap();
    (dir, sent)
}

/// Where the records of a crashed segment end: zeros follow.
fn records_end(data: &[u8]) -> usize {
    data.iter().rposition(|&b| b != 0).unwrap() + 1
}

#[test]
fn bytes_after_a_zero_header_are_a_torn_tail() {
    // A record written ahead of an earlier one that never reached the disk.
    let (dir, sent) = crashed_and_damaged("zeros-junk", |data| {
        let end = records_end(data);
        data[end + 5000] = 1;
    });
    let (store, rec) = Store::open(big_segments(&dir)).unwrap();
    assert_eq!(ids(&rec, "q"), sent, "every synced record is kept");
    assert!(rec.report.truncated_bytes > 0, "reported as a torn tail");
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_record_torn_over_the_zeros_is_cut_with_them() {
    // The last record's end never reached the disk: zeros where its body ends.
    let (dir, sent) = crashed_and_damaged("zeros-torn", |data| {
        let end = records_end(data);
        data[end - 100..end].fill(0);
    });
    let (store, rec) = Store::open(big_segments(&dir)).unwrap();
    assert_eq!(ids(&rec, "q"), sent[..99].to_vec());
    assert_eq!(
        rec.report.corrupt_records, 0,
        "a torn tail, not a corrupt record"
    );
    assert!(rec.report.truncated_bytes > 0);
    store.close();
    // Cut for good: the next recovery reports nothing.
    let (store, rec) = Store::open(big_segments(&dir)).unwrap();
    assert_eq!(ids(&rec, "q").len(), 99);
    assert_eq!(
        (rec.report.corrupt_records, rec.report.truncated_bytes),
        (0, 0)
    );
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn zeros_in_a_file_of_another_length_are_reported() {
    // Zeros the writer did not write: the file is not as long as it makes its files.
    let (dir, sent) = crashed_and_damaged("zeros-odd", |data| {
        data.pop();
    });
    let (store, rec) = Store::open(big_segments(&dir)).unwrap();
    assert_eq!(ids(&rec, "q"), sent);
    assert!(
        rec.report.truncated_bytes > 0,
        "zeros of unknown origin are reported"
    );
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn zeros_after_the_records_of_an_older_segment_are_reported() {
    let dir = tempdir("zeros-older");
    let (store, _) = Store::open(big_segments(&dir)).unwrap();
    let sent = publish_synced(&store, 2600, 1000);
    store.crash();
    // Only the segment being written has zeros ahead: these are not the writer's.
    let first = segments(&dir).remove(0);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&first)
        .unwrap();
    f.set_len(warren_store::PREALLOCATE).unwrap();
    drop(f);
    let (store, rec) = Store::open(big_segments(&dir)).unwrap();
    assert_eq!(ids(&rec, "q"), sent);
    assert!(
        rec.report.truncated_bytes > 0,
        "zeros in an older segment are reported"
    );
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn flipped_byte_loses_one_record() {
    let dir = tempdir("flip");
    let sent = fill(&dir, 30);
    let first = segments(&dir).remove(0);
    let mut data = std::fs::read(&first).unwrap();
    let mid = data.len() / 2;
    data[mid] ^= 0xff;
    std::fs::write(&first, &data).unwrap();
    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    let got = ids(&rec, "q");
    assert_eq!(
        rec.report.corrupt_records + u64::from(rec.report.truncated_bytes > 0),
        1
    );
    assert!(got.len() >= 20 && got.len() < 30, "{} recovered", got.len());
    assert!(got.iter().all(|id| sent.contains(id)));
    for e in &rec.queues["q"] {
        store.read(e.location).unwrap();
    }
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// A damaged length field in a segment written no more costs only its record: recovery
/// steps to the next record that reads back whole instead of cutting the rest of the segment.
#[test]
fn a_damaged_length_in_an_older_segment_loses_only_its_record() {
    // The high byte (a length past the end of the file) and the low byte (a length inside
    // it, the checksum failing and the next record elsewhere).
    for (byte, mask) in [(0usize, 0x01u8), (3, 0x10)] {
        let dir = tempdir(&format!("length-{byte}"));
        let sent = fill(&dir, 60);
        let files = segments(&dir);
        assert!(files.len() >= 4, "{} segments", files.len());
        let older = &files[1];
        let mut data = std::fs::read(older).unwrap();
        let len = |at: usize| u32::from_be_bytes(data[at..at + 4].try_into().unwrap()) as usize;
        let second = 8 + len(0);
        let third = second + 8 + len(second);
        assert!(third + 8 < data.len());
        let bytes = data.len() as u64;
        data[second + byte] ^= mask;
        std::fs::write(older, &data).unwrap();
        let (store, rec) = Store::open(cfg(&dir)).unwrap();
        assert_eq!(rec.report.corrupt_records, 1, "{:?}", rec.report);
        assert_eq!(rec.report.truncated_bytes, 0, "{:?}", rec.report);
        assert_eq!(
            std::fs::metadata(older).unwrap().len(),
            bytes,
            "the file was cut"
        );
        let got = ids(&rec, "q");
        assert_eq!(
            got.len(),
            sent.len() - 1,
            "byte {byte}: one record lost, no more"
        );
        assert!(got.iter().all(|id| sent.contains(id)));
        for e in &rec.queues["q"] {
            store.read(e.location).unwrap();
        }
        store.close();
        std::fs::remove_dir_all(dir).unwrap();
    }
}

#[test]
fn missing_segment_is_reported() {
    let dir = tempdir("missing");
    let sent = fill(&dir, 30);
    let segs = segments(&dir);
    assert!(segs.len() >= 3);
    std::fs::remove_file(&segs[1]).unwrap();
    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    assert_eq!(rec.report.missing_segments.len(), 1);
    let got = ids(&rec, "q");
    assert!(got.len() < 30 && !got.is_empty());
    assert!(got.contains(&sent[0]) && got.contains(sent.last().unwrap()));
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// A failed write completes its waiters with `ok = false` at once (not when the disk comes
/// back), refuses appends meanwhile, keeps barriers until the retry writes the batch, and the
/// retried batch is written exactly once.
#[test]
fn failed_write_fails_its_waiters_at_once_and_retries_the_batch() {
    let dir = tempdir("fail-fast");
    // The first segment the writer opens is 1; a directory in its place makes the open fail
    // (EISDIR), for root too.
    let (store, _) = Store::open(cfg(&dir)).unwrap();
    let blocker = dir.join("00000001.seg");
    std::fs::create_dir(&blocker).unwrap();
    let done = Arc::new(Done(Mutex::new(Vec::new())));
    let sink: Arc<dyn Completion> = done.clone();
    let id = store.next_id();
    store
        .append_publish(
            id,
            "",
            "k",
            &persistent(),
            b"caught",
            1,
            &["q"],
            Some((sink.clone(), 7)),
        )
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while done.0.lock().is_empty() {
        assert!(std::time::Instant::now() < deadline, "waiter not failed");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(*done.0.lock(), vec![(7, false)]);
    assert!(store.is_failed());
    // Appends are refused while the store is failed; a barrier waits for the retry.
    let id2 = store.next_id();
    assert!(store
        .append_publish(id2, "", "k", &persistent(), b"refused", 1, &["q"], None)
        .is_err());
    store.sync((sink.clone(), 8));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        done.0.lock().len(),
        1,
        "barrier completed while writes fail"
    );
    // The disk comes back: the retry writes the batch and completes the barrier.
    std::fs::remove_dir(&blocker).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while done.0.lock().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "barrier never completed"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(done.0.lock()[1], (8, true));
    assert!(!store.is_failed());
    store.close();
    let (store, rec) = Store::open(cfg(&dir)).unwrap();
    assert_eq!(ids(&rec, "q"), vec![id], "the retried batch is there, once");
    store.close();
    std::fs::remove_dir_all(&dir).unwrap();
}
