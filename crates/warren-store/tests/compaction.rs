//! Compaction: a long-unacknowledged message does not pin the log behind it, moved messages
//! stay readable and settleable through the locations their queues know, and a crash at any
//! step of a compaction loses nothing live and brings back nothing settled.

use parking_lot::Mutex;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use warren_amqp::properties::BasicProperties;
use warren_store::{
    CompactionHook, CompactionStep, Completion, Location, Recovered, Store, StoreConfig,
};

const WAIT: Duration = Duration::from_secs(30);

fn tempdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("warren-compact-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Small segments, and compaction as soon as a segment is less than half live.
fn cfg(dir: &Path, segment_size: u64) -> StoreConfig {
    StoreConfig {
        segment_size,
        compact_quiet: Duration::ZERO,
        ..StoreConfig::new(dir)
    }
}

fn persistent() -> BasicProperties {
    BasicProperties {
        delivery_mode: Some(2),
        ..Default::default()
    }
}

fn publish(store: &Store, body: &[u8], queues: &[&str]) -> (u64, Location) {
    let id = store.next_id();
    let loc = store
        .append_publish(id, "", "k", &persistent(), body, 1000 + id, queues, None)
        .unwrap();
    (id, loc)
}

struct Done(Mutex<Option<bool>>);
impl Completion for Done {
    fn complete(&self, _: &[u64], ok: bool) {
        *self.0.lock() = Some(ok);
    }
}

/// Waits until everything appended so far is fsynced.
fn sync(store: &Store) {
    let d = Arc::new(Done(Mutex::new(None)));
    store.sync((d.clone(), 0));
    let deadline = Instant::now() + WAIT;
    while d.0.lock().is_none() {
        assert!(Instant::now() < deadline, "sync timed out");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    v.sort();
    v
}

fn disk_bytes(dir: &Path) -> u64 {
    segment_files(dir)
        .iter()
        .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()))
        .sum()
}

/// Waits (bounded) until `cond` holds, nudging the writer meanwhile.
fn wait_for(store: &Store, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        sync(store);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A body as failure messages show it: its start and its length.
fn digest(body: &[u8]) -> String {
    format!(
        "{}…({} bytes, crc {:08x})",
        String::from_utf8_lossy(&body[..body.len().min(10)]),
        body.len(),
        crc32(body)
    )
}

fn crc32(b: &[u8]) -> u32 {
    b.iter().fold(0u32, |h, &x| h.rotate_left(5) ^ u32::from(x))
}

type Contents = BTreeMap<(String, u64), (String, bool)>;

/// (queue, id) → (body digest, redelivered) as recovered.
fn contents(store: &Store, rec: &Recovered) -> Contents {
    let mut out = BTreeMap::new();
    for (q, entries) in &rec.queues {
        let ids: Vec<u64> = entries.iter().map(|e| e.id).collect();
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "{q}: {ids:?}");
        for e in entries {
            let m = store.read(e.location).unwrap();
            assert_eq!(m.id, e.id);
            let dup = out.insert((q.clone(), e.id), (digest(&m.body), e.redelivered));
            assert!(dup.is_none(), "{q}/{} recovered twice", e.id);
        }
    }
    out
}

#[test]
fn one_unacked_message_does_not_pin_the_log() {
    let dir = tempdir("pinned");
    let segment = 64 * 1024;
    let (store, _) = Store::open(cfg(&dir, segment)).unwrap();
    let (pinned, pinned_loc) = publish(&store, b"pinned", &["q"]);
    store.delivered("q", None, pinned);
    // 32 MB through the queue, each message acked soon after; the first one never is.
    let body = vec![7u8; 1024];
    let mut window = std::collections::VecDeque::new();
    let mut peak = 0;
    for i in 0..32 * 1024 {
        window.push_back(publish(&store, &body, &["q"]));
        if window.len() > 64 {
            let (id, loc) = window.pop_front().unwrap();
            store.ack("q", id, loc);
        }
        if i % 1024 == 0 {
            peak = peak.max(disk_bytes(&dir));
        }
    }
    for (id, loc) in window.drain(..) {
        store.ack("q", id, loc);
    }
    // Disk use comes down to a few segments: the pinned message's copy and the head. (Without
    // compaction all 32 MB would stay: each segment's ACK records settle messages in the one
    // before, back to the pinned message's. How high it peaks meanwhile depends on how fast
    // the writer's fsyncs go, which a loaded test machine does not promise.)
    wait_for(&store, "compaction", || disk_bytes(&dir) <= 4 * segment);
    eprintln!(
        "peak {peak} bytes on disk during 32 MB of traffic; {} after",
        disk_bytes(&dir)
    );
    // The pinned message is still readable through the location its queue knows.
    assert_eq!(&store.read(pinned_loc).unwrap().body[..], b"pinned");
    store.close();
    let (store, rec) = Store::open(cfg(&dir, segment)).unwrap();
    let got = contents(&store, &rec);
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        vec![(("q".into(), pinned), (digest(b"pinned"), true))]
    );
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// Builds a log where compaction has work of every kind: live records routed to two queues
/// and half settled, settled segments whose ACK records point into an older surviving
/// segment, a DELIVERED mark, and a transient page. Returns the expected contents.
fn messy_log(store: &Store) -> Contents {
    let mut want = BTreeMap::new();
    // A dense old segment: mostly long-lived messages of "keep", and "gone" ones acked later.
    let mut gone = Vec::new();
    for i in 0..12u32 {
        let body = format!("keep-{i}-{}", "k".repeat(300)).into_bytes();
        let (id, _) = publish(store, &body, &["keep"]);
        want.insert(("keep".to_string(), id), (digest(&body), false));
        if i % 4 == 0 {
            gone.push(publish(store, b"gone", &["gone"]));
        }
    }
    // Records routed to two queues; "a" acks them all, "b" keeps every third.
    let mut both = Vec::new();
    for i in 0..60u32 {
        let body = format!("ab-{i}-{}", "x".repeat(200)).into_bytes();
        let (id, loc) = publish(store, &body, &["a", "b"]);
        both.push((id, loc, body));
    }
    for (i, (id, loc, body)) in both.iter().enumerate() {
        store.ack("a", *id, *loc);
        if i % 3 == 0 {
            want.insert(("b".to_string(), *id), (digest(body), i < 30));
        } else {
            store.ack("b", *id, *loc);
        }
    }
    store.delivered("b", None, both[29].0);
    // A transient page, released, and one kept (neither is recovered).
    let t1 = store
        .append_transient(9_000_000, "", "k", &BasicProperties::default(), b"t1", 5)
        .unwrap();
    let t2 = store
        .append_transient(9_000_001, "", "k", &BasicProperties::default(), b"t2", 5)
        .unwrap();
    store.release(t1);
    // Traffic, all settled.
    for _ in 0..40 {
        let (id, loc) = publish(store, &[1u8; 400], &["c"]);
        store.ack("c", id, loc);
    }
    // The "gone" messages are acked now: their ACK records land far from their records.
    for (id, loc) in gone {
        store.ack("gone", id, loc);
    }
    for _ in 0..20 {
        let (id, loc) = publish(store, &[2u8; 400], &["c"]);
        store.ack("c", id, loc);
    }
    assert_eq!(&store.read(t2).unwrap().body[..], b"t2");
    want
}

#[test]
fn moved_messages_recover_exactly_once() {
    let dir = tempdir("messy");
    let (store, _) = Store::open(cfg(&dir, 4096)).unwrap();
    let want = messy_log(&store);
    sync(&store);
    // 30 KB went into 4 KB segments; what stays live fits in a few.
    wait_for(&store, "settled segments to go", || {
        segment_files(&dir).len() <= 5
    });
    store.close();
    let (store, rec) = Store::open(cfg(&dir, 4096)).unwrap();
    assert_eq!(contents(&store, &rec), want);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let p = e.unwrap().path();
        // A file deleted while we copy is a crash after its deletion.
        let _ = std::fs::copy(&p, to.join(p.file_name().unwrap()));
    }
}

/// A crash at every step of every compaction: each snapshot of the directory recovers to
/// exactly what was live.
#[test]
fn a_crash_at_any_compaction_step_loses_and_duplicates_nothing() {
    let dir = tempdir("crash");
    let snaps = tempdir("crash-snaps");
    let taken: Arc<Mutex<Vec<(CompactionStep, PathBuf)>>> = Arc::default();
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook = {
        let (dir, snaps, taken, armed) = (dir.clone(), snaps.clone(), taken.clone(), armed.clone());
        CompactionHook(Arc::new(move |step| {
            // The first compaction waits until the log is built and durable.
            while !armed.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let mut t = taken.lock();
            let to = snaps.join(format!("{}", t.len()));
            copy_dir(&dir, &to);
            t.push((step, to));
        }))
    };
    let config = StoreConfig {
        compaction_hook: Some(hook),
        ..cfg(&dir, 4096)
    };
    let (store, _) = Store::open(config).unwrap();
    let want = messy_log(&store);
    sync(&store);
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    wait_for(&store, "compactions", || segment_files(&dir).len() <= 5);
    store.close();
    let taken = taken.lock().clone();
    let steps: BTreeSet<String> = taken
        .iter()
        .map(|(s, _)| format!("{s:?}").split('(').next().unwrap().to_string())
        .collect();
    assert_eq!(
        steps,
        ["Copied", "Deleted", "Scanned", "Synced"]
            .map(String::from)
            .into()
    );
    for (step, snap) in &taken {
        recovers_after_a_crash(snap, &want, &format!("{step:?}"));
    }
    let (store, rec) = Store::open(cfg(&dir, 4096)).unwrap();
    assert_eq!(contents(&store, &rec), want);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
    std::fs::remove_dir_all(snaps).unwrap();
}

/// What a crash at `step` left in `dir` (a `messy_log` store of 4 KB segments) recovers to
/// `want`, compacts on to `want`, and once everything is settled recovers to nothing.
fn recovers_after_a_crash(dir: &Path, want: &Contents, step: &str) {
    let (s, rec) = Store::open(cfg(dir, 4096)).unwrap();
    assert_eq!(&contents(&s, &rec), want, "after a crash at {step}");
    // Compaction goes on from there (records left behind by the crash are superseded)...
    wait_for(&s, "compaction after the crash", || {
        segment_files(dir).len() <= 5
    });
    s.close();
    let (s, rec) = Store::open(cfg(dir, 4096)).unwrap();
    assert_eq!(
        &contents(&s, &rec),
        want,
        "compacting after a crash at {step}"
    );
    // ... and once everything is settled, nothing comes back.
    for (q, entries) in &rec.queues {
        for e in entries {
            s.ack(q, e.id, e.location);
        }
    }
    sync(&s);
    s.close();
    let (s, rec) = Store::open(cfg(dir, 4096)).unwrap();
    assert_eq!(
        contents(&s, &rec),
        Contents::new(),
        "settled after a crash at {step}"
    );
    s.close();
}

/// Holds the writer thread: completed as a barrier, it returns only once the store crashes,
/// so that nothing appended after it is written before the crash.
struct HoldWriter {
    store: Arc<std::sync::OnceLock<Store>>,
    entered: std::sync::atomic::AtomicBool,
}

impl Completion for HoldWriter {
    fn complete(&self, _: &[u64], _: bool) {
        self.entered
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let deadline = Instant::now() + WAIT;
        while !self.store.get().is_some_and(Store::is_crashed) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// A crash at each step of a compaction while the compactor runs on after the writer has
/// stopped, as it does when writes fail and the process then dies: whatever the compactor
/// does after the last write (giving up, deleting settled segments) loses nothing live and
/// brings back nothing settled. At `Copied` the writer is held from the scan on, so the
/// crash always comes before the copies are written.
#[test]
fn a_crash_at_each_compaction_step_with_the_compactor_running_on() {
    use std::sync::atomic::{AtomicBool, Ordering};
    type Crasher = Option<std::thread::JoinHandle<()>>;
    for at in ["Scanned", "Copied", "Synced", "Deleted"] {
        let dir = tempdir(&format!("crash-{at}"));
        let slot: Arc<std::sync::OnceLock<Store>> = Arc::default();
        let armed = Arc::new(AtomicBool::new(false));
        // The segment whose compaction crashes, and whether it has.
        let target: Arc<Mutex<(Option<u32>, bool)>> = Arc::default();
        let crasher: Arc<Mutex<Crasher>> = Arc::default();
        let hook = {
            let (slot, armed, target, crasher) =
                (slot.clone(), armed.clone(), target.clone(), crasher.clone());
            CompactionHook(Arc::new(move |step| {
                // The first compaction waits until the log is built and durable.
                let deadline = Instant::now() + WAIT;
                while !armed.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let (name, seg) = match step {
                    CompactionStep::Scanned(s) => ("Scanned", s),
                    CompactionStep::Copied(s) => ("Copied", s),
                    CompactionStep::Synced(s) => ("Synced", s),
                    CompactionStep::Deleted(s) => ("Deleted", s),
                };
                let mut target = target.lock();
                // The first compaction that scans a segment is the one that crashes.
                if target.0.is_none() && name == "Scanned" {
                    target.0 = Some(seg);
                }
                if target.0 != Some(seg) || target.1 {
                    return;
                }
                let store = slot.get().expect("set after open").clone();
                if name == "Scanned" && at == "Copied" {
                    let hold = Arc::new(HoldWriter {
                        store: slot.clone(),
                        entered: AtomicBool::new(false),
                    });
                    store.sync((hold.clone(), 0));
                    let deadline = Instant::now() + WAIT;
                    while !hold.entered.load(Ordering::SeqCst) {
                        assert!(Instant::now() < deadline, "writer not held");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                if name == at {
                    target.1 = true;
                    // crash() joins the compactor: it runs on another thread, and this one
                    // carries on once the writer has stopped.
                    let s = store.clone();
                    *crasher.lock() = Some(std::thread::spawn(move || s.crash()));
                    let deadline = Instant::now() + WAIT;
                    while !store.is_crashed() {
                        assert!(Instant::now() < deadline, "crash did not start");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
            }))
        };
        let config = StoreConfig {
            compaction_hook: Some(hook),
            ..cfg(&dir, 4096)
        };
        let (store, _) = Store::open(config).unwrap();
        assert!(slot.set(store.clone()).is_ok());
        let want = messy_log(&store);
        sync(&store);
        armed.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + WAIT;
        let handle = loop {
            if let Some(h) = crasher.lock().take() {
                break h;
            }
            assert!(Instant::now() < deadline, "no compaction reached {at}");
            std::thread::sleep(Duration::from_millis(5));
        };
        handle.join().unwrap();
        recovers_after_a_crash(&dir, &want, at);
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// A compaction whose copies cannot be written (the disk is full, here: the segment file they
/// go to cannot be created) stops, and the segment it was compacting stays until copies of
/// its records are written: if the broker then dies, nothing live is lost; if the disk comes
/// back, the retry writes the copies and the segment goes.
#[test]
fn a_compaction_whose_copies_fail_to_write_keeps_its_segment() {
    use std::sync::atomic::{AtomicBool, Ordering};
    for disk_comes_back in [false, true] {
        let dir = tempdir(&format!("copies-fail-{disk_comes_back}"));
        let slot: Arc<std::sync::OnceLock<Store>> = Arc::default();
        let armed = Arc::new(AtomicBool::new(false));
        // The segment being compacted, and the directory standing where its copies go.
        let target: Arc<Mutex<Option<(u32, PathBuf)>>> = Arc::default();
        let hook = {
            let (slot, armed, target, dir) =
                (slot.clone(), armed.clone(), target.clone(), dir.clone());
            CompactionHook(Arc::new(move |step| {
                let deadline = Instant::now() + WAIT;
                while !armed.load(Ordering::SeqCst) && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let CompactionStep::Scanned(t) = step else {
                    return;
                };
                let mut target = target.lock();
                if target.is_some() {
                    return;
                }
                // A page as big as a segment fills the head: the copies start the next one,
                // whose file cannot be created.
                let store = slot.get().expect("set after open");
                let page = store
                    .append_transient(
                        store.next_id(),
                        "",
                        "k",
                        &BasicProperties::default(),
                        &[0u8; 4096],
                        0,
                    )
                    .unwrap();
                sync(store);
                let blocker = dir.join(format!("{:08}.seg", page.segment + 1));
                std::fs::create_dir(&blocker).unwrap();
                *target = Some((t, blocker));
            }))
        };
        let config = StoreConfig {
            compaction_hook: Some(hook),
            ..cfg(&dir, 4096)
        };
        let (store, _) = Store::open(config).unwrap();
        assert!(slot.set(store.clone()).is_ok());
        let want = messy_log(&store);
        sync(&store);
        armed.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + WAIT;
        while !store.is_failed() {
            assert!(Instant::now() < deadline, "the copies' write did not fail");
            std::thread::sleep(Duration::from_millis(5));
        }
        let (t, blocker) = target.lock().clone().unwrap();
        let t_file = dir.join(format!("{t:08}.seg"));
        if disk_comes_back {
            std::fs::remove_dir(&blocker).unwrap();
            wait_for(&store, "the compacted segment to go", || !t_file.exists());
            store.close();
        } else {
            // The broker dies while writes fail. (crash() stops the compactor after the
            // compaction it is in has ended and been followed by a deletion pass.)
            store.crash();
            std::fs::remove_dir(&blocker).unwrap();
        }
        recovers_after_a_crash(
            &dir,
            &want,
            if disk_comes_back {
                "a failed write of copies, retried"
            } else {
                "a failed write of copies"
            },
        );
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// Settlements that arrive while a segment is being compacted (after its scan) are not
/// copied: the acked queue does not get the message back, the other one keeps it.
#[test]
fn settlements_during_a_compaction_are_honoured() {
    let dir = tempdir("during");
    type Slot = Option<(Store, Vec<(u64, Location)>)>;
    let store_slot: Arc<Mutex<Slot>> = Arc::default();
    let hook = {
        let slot = store_slot.clone();
        CompactionHook(Arc::new(move |step| {
            if step == CompactionStep::Scanned(1) {
                if let Some((store, victims)) = slot.lock().as_mut() {
                    for (id, loc) in victims.drain(..) {
                        store.ack("a", id, loc);
                    }
                }
            }
        }))
    };
    let config = StoreConfig {
        compaction_hook: Some(hook),
        ..cfg(&dir, 4096)
    };
    let (store, _) = Store::open(config).unwrap();
    let mut victims = Vec::new();
    let mut want = BTreeMap::new();
    for i in 0..8u32 {
        let body = format!("v{i}").into_bytes();
        let (id, loc) = publish(&store, &body, &["a", "b"]);
        victims.push((id, loc));
        want.insert(("b".to_string(), id), (digest(&body), false));
    }
    *store_slot.lock() = Some((store.clone(), victims));
    for _ in 0..60 {
        let (id, loc) = publish(&store, &[3u8; 300], &["c"]);
        store.ack("c", id, loc);
    }
    wait_for(&store, "the first segment to be compacted", || {
        store_slot.lock().as_ref().is_some_and(|s| s.1.is_empty())
            && !segment_files(&dir)
                .iter()
                .any(|p| p.ends_with("00000001.seg"))
    });
    *store_slot.lock() = None;
    sync(&store);
    store.close();
    let (store, rec) = Store::open(cfg(&dir, 4096)).unwrap();
    assert_eq!(contents(&store, &rec), want);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// Transient pages are moved too, and stay readable and releasable by their old location.
#[test]
fn transient_pages_move_and_release() {
    let dir = tempdir("transient");
    let (store, _) = Store::open(cfg(&dir, 4096)).unwrap();
    let keep = store
        .append_transient(1, "x", "rk", &BasicProperties::default(), b"page", 42)
        .unwrap();
    for _ in 0..60 {
        let (id, loc) = publish(&store, &[4u8; 300], &["c"]);
        store.ack("c", id, loc);
    }
    wait_for(&store, "the page's segment to be compacted", || {
        !segment_files(&dir)
            .iter()
            .any(|p| p.ends_with("00000001.seg"))
    });
    let m = store.read(keep).unwrap();
    assert_eq!(
        (&m.body[..], m.enqueued_ms, m.routing_key.as_str()),
        (&b"page"[..], Some(42), "rk")
    );
    store.release(keep);
    for _ in 0..30 {
        let (id, loc) = publish(&store, &[5u8; 300], &["c"]);
        store.ack("c", id, loc);
    }
    wait_for(&store, "everything settled to go", || {
        segment_files(&dir).len() <= 2
    });
    store.close();
    let (store, rec) = Store::open(cfg(&dir, 4096)).unwrap();
    assert!(rec.queues.is_empty());
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    /// Publish to a subset of the queues (bit i = queue i).
    Publish {
        queues: u8,
        size: u16,
    },
    /// Settle the n-th live (message, queue) pair.
    Ack(usize),
    /// A transient page, or the release of the n-th one.
    Page,
    Release(usize),
    /// Mark the n-th live pair delivered.
    Deliver(usize),
    /// Close and reopen the store.
    Restart,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (1u8..8, 1u16..1200).prop_map(|(queues, size)| Op::Publish { queues, size }),
        5 => any::<usize>().prop_map(Op::Ack),
        1 => Just(Op::Page),
        1 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Deliver),
        1 => Just(Op::Restart),
    ]
}

const QUEUES: [&str; 3] = ["q0", "q1", "q2"];

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    /// Random publishes, settlements, pages and restarts with compaction running all along:
    /// every live pair reads back with its body, and recovery returns exactly the live pairs.
    #[test]
    fn compaction_keeps_the_model(ops in proptest::collection::vec(op(), 1..250)) {
        let dir = tempdir("model");
        let (mut store, _) = Store::open(cfg(&dir, 2048)).unwrap();
        // (queue, id) → (location, body, delivered)
        let mut live: BTreeMap<(String, u64), (Location, Vec<u8>, bool)> = BTreeMap::new();
        let mut pages: Vec<(Location, Vec<u8>)> = Vec::new();
        let mut n = 0u64;
        for op in ops {
            match op {
                Op::Publish { queues, size } => {
                    n += 1;
                    let body: Vec<u8> = format!("{n}-").bytes().chain(std::iter::repeat_n(b'.', size as usize)).collect();
                    let qs: Vec<&str> = (0..3).filter(|i| queues & (1 << i) != 0).map(|i| QUEUES[i]).collect();
                    let (id, loc) = publish(&store, &body, &qs);
                    for q in qs {
                        live.insert((q.to_string(), id), (loc, body.clone(), false));
                    }
                }
                Op::Ack(i) if !live.is_empty() => {
                    let key = live.keys().nth(i % live.len()).unwrap().clone();
                    let (loc, _, _) = live.remove(&key).unwrap();
                    store.ack(&key.0, key.1, loc);
                }
                Op::Page => {
                    n += 1;
                    let body = format!("page-{n}").into_bytes();
                    let loc = store.append_transient(store.next_id(), "", "k", &BasicProperties::default(), &body, 7).unwrap();
                    pages.push((loc, body));
                }
                Op::Release(i) if !pages.is_empty() => {
                    let (loc, _) = pages.swap_remove(i % pages.len());
                    store.release(loc);
                }
                Op::Deliver(i) if !live.is_empty() => {
                    // Queues deliver in id order: everything of the queue up to this id.
                    let key = live.keys().nth(i % live.len()).unwrap().clone();
                    store.delivered(&key.0, None, key.1);
                    for (k, v) in live.iter_mut() {
                        if k.0 == key.0 && k.1 <= key.1 {
                            v.2 = true;
                        }
                    }
                }
                Op::Restart => {
                    store.close();
                    let (s, rec) = Store::open(cfg(&dir, 2048)).unwrap();
                    store = s;
                    // Transient pages do not survive; live pairs come back where recovery
                    // found them.
                    pages.clear();
                    for (q, entries) in &rec.queues {
                        for e in entries {
                            if let Some(v) = live.get_mut(&(q.clone(), e.id)) {
                                v.0 = e.location;
                            }
                        }
                    }
                }
                _ => {}
            }
            // Compaction runs meanwhile: whatever it moved must still read back.
            for (loc, body, _) in live.values().take(8) {
                prop_assert_eq!(&store.read(*loc).unwrap().body[..], &body[..]);
            }
            for (loc, body) in pages.iter().take(4) {
                prop_assert_eq!(&store.read(*loc).unwrap().body[..], &body[..]);
            }
        }
        sync(&store);
        std::thread::sleep(Duration::from_millis(30));
        for (loc, body, _) in live.values() {
            prop_assert_eq!(&store.read(*loc).unwrap().body[..], &body[..]);
        }
        store.close();
        let (store, rec) = Store::open(cfg(&dir, 2048)).unwrap();
        let want: Contents = live
            .into_iter()
            .map(|(k, (_, body, delivered))| (k, (digest(&body), delivered)))
            .collect();
        prop_assert_eq!(contents(&store, &rec), want);
        store.close();
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// A log written by the first record format (no enqueue times, ACK records without targets):
/// recovered as before, compacted without bringing anything back, and reclaimed once settled.
#[test]
fn first_format_log_recovers_compacts_and_drains() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../warren-server/tests/fixtures/data-v1/messages");
    let dir = tempdir("v1");
    copy_dir(&fixture, &dir);
    let key = |q: &str| format!("/\u{1f}{q}");
    let (store, rec) = Store::open(cfg(&dir, 4096)).unwrap();
    let want = contents(&store, &rec);
    let names = |q: &str| -> Vec<String> {
        want.iter()
            .filter(|((k, _), _)| *k == key(q))
            .map(|(_, (d, r))| format!("{}{}", &d[..4], if *r { "*" } else { "" }))
            .collect()
    };
    let q: Vec<String> = (5..40)
        .map(|i| format!("q-{i:02}{}", if i < 10 { "*" } else { "" }))
        .collect();
    assert_eq!(names("legacy-q"), q);
    assert!(names("legacy-a").is_empty());
    assert_eq!(names("legacy-b").len(), 20);
    let prio: Vec<u8> = rec.queues[&key("legacy-prio")]
        .iter()
        .map(|e| e.priority)
        .collect();
    assert_eq!(prio, (0..30).map(|i| (i % 6) as u8).collect::<Vec<_>>());
    for e in &rec.queues[&key("legacy-q")] {
        assert_eq!(store.read(e.location).unwrap().enqueued_ms, None);
    }
    // Compaction runs over the old segments (quiet 0): nothing changes for the queues.
    sync(&store);
    std::thread::sleep(Duration::from_millis(300));
    store.close();
    let (store, rec) = Store::open(cfg(&dir, 4096)).unwrap();
    assert_eq!(contents(&store, &rec), want);
    // Settled, the old segments go, and nothing comes back.
    for (q, entries) in &rec.queues {
        for e in entries {
            store.ack(q, e.id, e.location);
        }
    }
    wait_for(&store, "the old segments to go", || {
        segment_files(&dir)
            .iter()
            .all(|p| p.file_name().unwrap() > "00000006.seg")
    });
    store.close();
    let (store, rec) = Store::open(cfg(&dir, 4096)).unwrap();
    assert!(rec.queues.is_empty(), "{:?}", rec.queues.keys());
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// Publishers, consumers and the compactor all busy, and a crash at a random moment: every
/// message published and not acknowledged comes back, none whose acknowledgement was synced
/// does, and nothing twice.
#[test]
fn a_crash_under_load_loses_no_unacked_message_and_revives_no_synced_ack() {
    use std::collections::HashSet;
    use std::sync::atomic::{AtomicBool, Ordering};
    for round in 0..6u64 {
        let dir = tempdir(&format!("load-{round}"));
        let (store, _) = Store::open(cfg(&dir, 16 * 1024)).unwrap();
        // Published and synced; acked (by the time of a completed sync); never acked.
        let published: Arc<Mutex<Vec<(u64, Location)>>> = Arc::default();
        let synced_acks: Arc<Mutex<HashSet<u64>>> = Arc::default();
        let all_acks: Arc<Mutex<HashSet<u64>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let producer = {
            let (store, published, stop) = (store.clone(), published.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let batch: Vec<(u64, Location)> = (0..20)
                        .map(|_| {
                            i += 1;
                            let body = format!("{i:08}{}", ".".repeat((i % 7 * 100) as usize));
                            publish(&store, body.as_bytes(), &["q"])
                        })
                        .collect();
                    let d = Arc::new(Done(Mutex::new(None)));
                    store.sync((d.clone(), 0));
                    while d.0.lock().is_none() && !stop.load(Ordering::SeqCst) {
                        std::thread::yield_now();
                    }
                    if *d.0.lock() == Some(true) {
                        published.lock().extend(batch);
                    }
                }
            })
        };
        let consumer = {
            let (store, published, synced_acks, all_acks, stop) = (
                store.clone(),
                published.clone(),
                synced_acks.clone(),
                all_acks.clone(),
                stop.clone(),
            );
            std::thread::spawn(move || {
                let mut next = 1; // published[0] is never acked
                while !stop.load(Ordering::SeqCst) {
                    let todo: Vec<(u64, Location)> = {
                        let p = published.lock();
                        // Leave the newest 30 unacked for a while.
                        p.iter()
                            .skip(next)
                            .take(p.len().saturating_sub(next + 30))
                            .copied()
                            .collect()
                    };
                    next += todo.len();
                    let mut batch = Vec::new();
                    for (id, loc) in todo {
                        // Every 11th is held unacked for good.
                        if id % 11 == 0 {
                            continue;
                        }
                        store.ack("q", id, loc);
                        all_acks.lock().insert(id);
                        batch.push(id);
                    }
                    let d = Arc::new(Done(Mutex::new(None)));
                    store.sync((d.clone(), 0));
                    while d.0.lock().is_none() && !stop.load(Ordering::SeqCst) {
                        std::thread::yield_now();
                    }
                    if *d.0.lock() == Some(true) {
                        synced_acks.lock().extend(batch);
                    }
                }
            })
        };
        std::thread::sleep(Duration::from_millis(300 + 150 * round));
        store.crash();
        stop.store(true, Ordering::SeqCst);
        producer.join().unwrap();
        consumer.join().unwrap();
        let (store, rec) = Store::open(cfg(&dir, 16 * 1024)).unwrap();
        let got: Vec<u64> = rec
            .queues
            .get("q")
            .map_or(Vec::new(), |v| v.iter().map(|e| e.id).collect());
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "duplicated or out of order"
        );
        let got: HashSet<u64> = got.into_iter().collect();
        let published = published.lock();
        let all_acks = all_acks.lock();
        let synced_acks = synced_acks.lock();
        for (id, _) in published.iter() {
            if !all_acks.contains(id) {
                assert!(got.contains(id), "round {round}: unacked {id} lost");
                let e = rec.queues["q"].iter().find(|e| e.id == *id).unwrap();
                assert_eq!(store.read(e.location).unwrap().id, *id);
            }
            if synced_acks.contains(id) {
                assert!(
                    !got.contains(id),
                    "round {round}: {id} came back after its ack was synced"
                );
            }
        }
        eprintln!(
            "round {round}: {} published, {} acked ({} synced), {} recovered, {} segment files",
            published.len(),
            all_acks.len(),
            synced_acks.len(),
            got.len(),
            segment_files(&dir).len()
        );
        store.close();
        std::fs::remove_dir_all(dir).unwrap();
    }
}

/// With compaction off, settled segments still go, however many `DELIVERED` marks they
/// hold (the marks are carried forward without reading the segment, and kept).
#[test]
fn settled_segments_go_with_compaction_off_and_marks_survive() {
    let dir = tempdir("marks");
    let config = || StoreConfig {
        compact_ratio: 0.0,
        ..cfg(&dir, 4096)
    };
    let (store, _) = Store::open(config()).unwrap();
    // "kept" has a message delivered and never acked; "gone" is deleted.
    let (kept, _) = publish(&store, b"kept", &["kept"]);
    store.delivered("kept", None, kept);
    let (g, gloc) = publish(&store, b"gone", &["gone"]);
    store.delivered("gone", None, g);
    store.ack("gone", g, gloc);
    store.forget_queue("gone", false);
    sync(&store);
    for _ in 0..100 {
        let (id, loc) = publish(&store, &[6u8; 300], &["c"]);
        store.ack("c", id, loc);
    }
    // Every settled segment goes; the one holding "kept" stays (it is live).
    wait_for(&store, "settled segments to go", || {
        segment_files(&dir).len() <= 3
    });
    store.close();
    let (store, rec) = Store::open(config()).unwrap();
    let want: Contents = [(("kept".to_string(), kept), (digest(b"kept"), true))].into();
    assert_eq!(contents(&store, &rec), want);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// With compaction off, acknowledgements that lag one message behind (each segment's last
/// message acked in the next segment) do not let one live message keep every later segment:
/// the settled segments' `ACK` records still needed are copied forward and the files go.
#[test]
fn lagging_acks_do_not_pin_the_log_with_compaction_off() {
    let dir = tempdir("lagging");
    let config = || StoreConfig {
        compact_ratio: 0.0,
        ..cfg(&dir, 4096)
    };
    let (store, _) = Store::open(config()).unwrap();
    let (kept, _) = publish(&store, b"kept", &["kept"]);
    let mut previous = publish(&store, &[6u8; 300], &["c"]);
    for _ in 0..200 {
        let next = publish(&store, &[6u8; 300], &["c"]);
        store.ack("c", previous.0, previous.1);
        previous = next;
    }
    store.ack("c", previous.0, previous.1);
    sync(&store);
    wait_for(&store, "settled segments to go", || {
        segment_files(&dir).len() <= 3
    });
    store.close();
    let (store, rec) = Store::open(config()).unwrap();
    let want: Contents = [(("kept".to_string(), kept), (digest(b"kept"), false))].into();
    assert_eq!(contents(&store, &rec), want);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

fn segment_numbers(dir: &Path) -> Vec<u32> {
    segment_files(dir)
        .iter()
        .filter_map(|p| p.file_stem()?.to_str()?.parse().ok())
        .collect()
}

/// Pins one message, then sends traffic that is all acked, with a message that stays after
/// each stretch, until the store has deleted segments in the middle of the log.
fn log_with_deleted_segments(dir: &Path, config: StoreConfig, segment: u64) {
    let (store, _) = Store::open(config).unwrap();
    let (pinned, _) = publish(&store, b"pinned", &["q"]);
    store.delivered("q", None, pinned);
    let body = vec![7u8; 512];
    for _ in 0..4 {
        let batch: Vec<_> = (0..200).map(|_| publish(&store, &body, &["q"])).collect();
        for (id, loc) in batch {
            store.ack("q", id, loc);
        }
        sync(&store);
        let _ = publish(&store, b"kept", &["k"]);
        sync(&store);
        wait_for(&store, "reclaim", || disk_bytes(dir) <= 8 * segment);
    }
    store.close();
}

/// Segments that compaction and reclaim deleted leave gaps in the numbering; recovery knows
/// it deleted them and reports nothing missing. A segment removed by hand is still reported,
/// and only it.
#[test]
fn segments_the_store_deleted_are_not_reported_missing() {
    let segment = 16 * 1024;
    // Compaction on: where its deletions leave gaps depends on timing.
    let dir = tempdir("deleted-compacted");
    log_with_deleted_segments(&dir, cfg(&dir, segment), segment);
    let segs = segment_numbers(&dir);
    let (store, rec) = Store::open(cfg(&dir, segment)).unwrap();
    assert_eq!(
        rec.report.missing_segments,
        Vec::<u32>::new(),
        "segments deleted on purpose reported missing (on disk: {segs:?})"
    );
    assert_eq!(rec.queues["q"].len(), 1);
    assert_eq!(rec.queues["k"].len(), 4);
    store.close();
    std::fs::remove_dir_all(dir).unwrap();

    // Compaction off: the pinned first segment stays, so reclaim's deletions after it are
    // always a gap.
    let dir = tempdir("deleted-reclaimed");
    let no_compaction = || StoreConfig {
        compact_ratio: 0.0,
        ..cfg(&dir, segment)
    };
    log_with_deleted_segments(&dir, no_compaction(), segment);
    let segs = segment_numbers(&dir);
    let gaps = segs.windows(2).filter(|w| w[1] > w[0] + 1).count();
    assert!(gaps > 0, "no gap to check: {segs:?}");
    let (store, rec) = Store::open(no_compaction()).unwrap();
    assert_eq!(
        rec.report.missing_segments,
        Vec::<u32>::new(),
        "segments deleted on purpose reported missing (on disk: {segs:?})"
    );
    assert_eq!(rec.queues["q"].len(), 1);
    assert_eq!(rec.queues["k"].len(), 4);
    // Messages that stay fill a few more segments.
    let body = vec![7u8; 512];
    for _ in 0..100 {
        publish(&store, &body, &["k2"]);
    }
    store.close();
    // Restarts again: the record is still right after recovery rewrote it.
    let (store, rec) = Store::open(no_compaction()).unwrap();
    assert!(rec.report.missing_segments.is_empty());
    store.close();

    // Now one is removed by hand: that one, and only it, is reported.
    let segs = segment_numbers(&dir);
    assert!(segs.len() >= 3, "{segs:?}");
    let gone = segs[segs.len() / 2];
    std::fs::remove_file(dir.join(format!("{gone:08}.seg"))).unwrap();
    let (store, rec) = Store::open(no_compaction()).unwrap();
    assert_eq!(rec.report.missing_segments, vec![gone], "on disk: {segs:?}");
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}

/// The store's counters follow the files: bytes and segment files as on disk once the writer
/// is idle, fsyncs counted in the latency histogram, every record in some group commit, and
/// compactions counted; after a reopening the gauges start from what is on disk.
#[test]
fn stats_follow_the_files_on_disk() {
    let dir = tempdir("stats");
    let segment = 16 * 1024;
    let (store, _) = Store::open(cfg(&dir, segment)).unwrap();
    let s0 = store.stats();
    assert_eq!((s0.bytes, s0.segments, s0.fsyncs), (0, 0, 0));
    let (pinned, pinned_loc) = publish(&store, b"pinned", &["q"]);
    store.delivered("q", None, pinned);
    let body = vec![3u8; 512];
    let mut sent = Vec::new();
    for _ in 0..400 {
        sent.push(publish(&store, &body, &["q"]));
    }
    sync(&store);
    let s1 = store.stats();
    assert!(s1.fsyncs >= 1, "{s1:?}");
    assert_eq!(s1.fsync_seconds.count, s1.fsyncs);
    assert!(s1.fsync_seconds.sum > 0.0);
    assert_eq!(s1.bytes, disk_bytes(&dir));
    // What is on disk is what was written, and the zeros ahead of the open segment's records.
    assert!(
        s1.written_bytes <= s1.bytes && s1.bytes - s1.written_bytes < segment,
        "{s1:?}"
    );
    assert_eq!(s1.segments, segment_files(&dir).len() as u64);
    assert!(
        s1.segments > 5,
        "400 × 512 bytes in 16 KiB segments: {s1:?}"
    );
    // 401 publishes and at least one DELIVERED mark.
    assert!(s1.records_written >= 402, "{s1:?}");
    assert!(s1.batch_records.count >= 1);
    assert_eq!(s1.batch_records.sum, s1.records_written as f64);
    for h in [&s1.fsync_seconds, &s1.batch_records] {
        assert!(h.buckets.windows(2).all(|w| w[0].1 <= w[1].1), "{h:?}");
        assert!(h.buckets.last().unwrap().1 <= h.count);
    }

    for (id, loc) in sent {
        store.ack("q", id, loc);
    }
    // The pinned message's segment is compacted away, the settled ones deleted.
    wait_for(&store, "compaction", || {
        let s = store.stats();
        s.compactions >= 1 && s.segments <= 3
    });
    // (The compactor may still be deleting a file: the counters catch up right after.)
    wait_for(&store, "counters to match the files", || {
        let s = store.stats();
        s.bytes == disk_bytes(&dir) && s.segments == segment_files(&dir).len() as u64
    });
    let s2 = store.stats();
    assert!(s2.fsyncs > s1.fsyncs);
    assert!(s2.written_bytes > s1.written_bytes);
    assert!(s2.bytes < s1.bytes);
    assert_eq!(&store.read(pinned_loc).unwrap().body[..], b"pinned");
    store.close();

    let (store, _) = Store::open(cfg(&dir, segment)).unwrap();
    let s3 = store.stats();
    assert_eq!(s3.bytes, disk_bytes(&dir));
    assert_eq!(s3.segments, segment_files(&dir).len() as u64);
    assert_eq!((s3.fsyncs, s3.written_bytes, s3.compactions), (0, 0, 0));
    store.close();
    std::fs::remove_dir_all(dir).unwrap();
}
