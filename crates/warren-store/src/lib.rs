//! Warren's durable message store.
//!
//! One append-only log for all queues, cut into numbered segment files
//! (`<data>/messages/00000001.seg`, …). Callers append records under a short mutex, which
//! assigns each record its final [`Location`] at once; a dedicated writer thread takes
//! everything appended since its last round, writes it with one `write` per segment, covers it
//! with one `fdatasync` and only then runs the completions (publisher confirms, tx.commit-ok).
//! Whatever arrives while an fsync runs is covered by the next one: the batch grows with load
//! (group commit).
//!
//! The segment being written is kept ahead of its records with zeros, [`PREALLOCATE`] bytes at
//! a time: a record written over zeros leaves the file's length as it was, so its `fdatasync`
//! flushes the data alone instead of the data and then the inode (about half the latency and
//! the kernel CPU of an `fdatasync` that extends the file). The zeros stop at the segment
//! size, so a full segment has none left; the segment being written is cut back to its
//! records at shutdown, and recovery cuts away the zeros a crash left (a zero length field is
//! never a record's).
//!
//! A message routed to several durable queues is written once, with the list of queues. Each
//! queue's settlement of it (ack, reject, purge, delete) is an `ACK` record naming where the
//! settled record is; a paged-out transient message's release is one too. Per segment the
//! store counts (message, queue) pairs still live and the oldest segment its `ACK` records
//! settle something in. A segment whose pairs are all settled is deleted once no older segment
//! its `ACK` records point into survives; a segment that is mostly settled is compacted: its
//! live records (and the `ACK` records still needed) are copied to the head of the log, and it
//! is deleted once the copies are fsynced (see the `compact` module). One message left
//! unacknowledged therefore pins a copy of itself, not the log behind it. A segment whose
//! records have been taken over by records further on (compaction's copies, a queue's newer
//! `DELIVERED` record) counts as settled at once, but is never deleted before the log is
//! durable up to the end of what took over: a compaction cut short by a failed write or a
//! shutdown leaves its segment in place, and the copies or the segment survive a crash.
//!
//! Recovery ([`Store::open`]) scans every segment in order, checks each record's CRC, truncates
//! a torn tail, skips corrupt records and reports what it dropped.
//!
//! I/O errors (e.g. ENOSPC) put the store into a failed state: appends are refused with
//! [`StoreError::Unavailable`] so publishers can be told (settlements excepted: their `ACK`
//! records wait in memory, so that the log never says a settled message is live), the
//! unwritten batch is kept and retried every second, and once a retry succeeds the store
//! serves again. Compaction pauses meanwhile; deleting settled segments does not (except those
//! taken over by records still unwritten). Nothing already confirmed is touched by a failed
//! write: the file is cut back to its last good length first.
//!
//! The waiters of the batch that failed are completed with `ok = false` at once (publishers
//! get basic.nack without waiting for the disk to come back), but the batch itself is not
//! dropped: its records already have their locations, later records and the queues' indexes
//! refer to them, and it may hold `ACK` records of other messages. So a message whose publish
//! was nacked stays in its queues and is written when a retry succeeds: it may still be
//! delivered, and may survive a restart, as a nacked message may in RabbitMQ (a nack means
//! "not taken responsibility for"; a publisher that sends it again may cause a duplicate,
//! which at-least-once delivery allows). If the broker stops before a retry succeeds, the
//! batch is lost, which the nack already told. Barriers ([`Store::sync`], tx.commit) are not
//! failed: they complete once everything before them is written, after the retry.

mod compact;
mod deleted;
pub mod raftlog;
pub mod record;
mod recovery;
pub mod spill;
mod stats;

use bytes::{Bytes, BytesMut};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, error, info, warn};
use warren_amqp::properties::BasicProperties;

pub use compact::CompactionStep;
pub use record::StoredMessage;
pub use recovery::{RecoveredEntry, RecoveryReport};
pub use stats::{HistogramSnapshot, StoreStats, BATCH_BUCKETS_RECORDS, FSYNC_BUCKETS_NS};

/// Where a record lives: segment number, byte offset of its header, and total length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Location {
    /// Segment file number.
    pub segment: u32,
    /// Offset of the record's header in the segment, bytes.
    pub offset: u64,
    /// Length of the whole record including its 8-byte header, bytes.
    pub len: u32,
}

/// Store settings.
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// Directory for segment files (created if missing).
    pub dir: PathBuf,
    /// A segment is closed and a new one started once it reaches this size, bytes.
    pub segment_size: u64,
    /// Largest batch, bytes, written under one fsync; appenders wait when this much is pending.
    pub max_batch_bytes: usize,
    /// How long the writer waits for more appends before writing a batch that is still small
    /// (under half of `max_batch_bytes`; 0 = write as soon as anything is pending; the batch
    /// still grows during each fsync).
    pub fsync_delay: Duration,
    /// A segment is compacted once its live records take less than this fraction of it
    /// (0.0 never copies a live message; a settled segment whose `ACK` records or `DELIVERED`
    /// mark are still needed has those copied forward and goes, whatever the ratio).
    pub compact_ratio: f64,
    /// ... and none of its messages has been settled for this long: a segment whose messages
    /// are still being consumed is left to drain by itself.
    pub compact_quiet: Duration,
    /// Called at each step of a compaction (crash tests copy the directory there).
    pub compaction_hook: Option<CompactionHook>,
    /// Makes the spill files of [`Store::spill_file`] fail their writes as on a full disk
    /// while set (a test hook; `None` in service).
    pub spill_write_fault: Option<spill::SpillFault>,
}

/// A callback run at each [`CompactionStep`], on the compactor thread.
#[derive(Clone)]
pub struct CompactionHook(pub Arc<dyn Fn(CompactionStep) + Send + Sync>);

impl std::fmt::Debug for CompactionHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompactionHook")
    }
}

impl StoreConfig {
    /// Defaults for `dir`: 64 MiB segments, 16 MiB batches, no delay, compaction of segments
    /// less than half live and quiet for 2 s.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StoreConfig {
            dir: dir.into(),
            segment_size: 64 * 1024 * 1024,
            max_batch_bytes: 16 * 1024 * 1024,
            fsync_delay: Duration::ZERO,
            compact_ratio: 0.5,
            compact_quiet: Duration::from_secs(2),
            compaction_hook: None,
            spill_write_fault: None,
        }
    }
}

/// Store errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O error.
    #[error("message store I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A write failed and the store is refusing appends until a retry succeeds.
    #[error("message store unavailable: {0}")]
    Unavailable(String),
    /// A record read back does not decode.
    #[error("message store record at segment {segment} offset {offset} is unreadable: {reason}")]
    Corrupt {
        /// Segment number.
        segment: u32,
        /// Offset.
        offset: u64,
        /// Why.
        reason: String,
    },
}

/// Receives completions from the writer thread: `tokens` were covered by an fsync (`ok`), or
/// could not be written (`!ok`). Called on the writer thread, once per sink per batch.
pub trait Completion: Send + Sync {
    /// Tokens are the values given to [`Store::append_publish`] / [`Store::sync`], in append
    /// order.
    fn complete(&self, tokens: &[u64], ok: bool);
}

/// A [`Completion`] for one waiter: `f(ok)` runs once, on the first completion it receives
/// (later ones are ignored). Front ends that answer a request after its fsync use it with a
/// oneshot channel: `once(move |ok| { let _ = tx.send(ok); })`.
pub fn once(f: impl FnOnce(bool) + Send + 'static) -> Arc<dyn Completion> {
    type Callback = Box<dyn FnOnce(bool) + Send>;
    struct Once(std::sync::Mutex<Option<Callback>>);
    impl Completion for Once {
        fn complete(&self, _tokens: &[u64], ok: bool) {
            let f = self.0.lock().ok().and_then(|mut g| g.take());
            if let Some(f) = f {
                f(ok);
            }
        }
    }
    Arc::new(Once(std::sync::Mutex::new(Some(Box::new(f)))))
}

type Waiter = (Arc<dyn Completion>, u64);

/// Chunks taken by the writer: (segment, start offset, bytes).
type Batch = VecDeque<(u32, u64, Bytes)>;

/// What the store keeps in memory about one segment file.
#[derive(Debug, Clone)]
struct Seg {
    /// Live (message, queue) pairs whose record is in this segment.
    pairs: i64,
    /// Bytes of those records, counted once per live pair.
    live_bytes: i64,
    /// Bytes in the file.
    bytes: u64,
    /// Oldest segment an `ACK` record of this one settles something in (`u32::MAX`: none).
    ack_floor: u32,
    /// Holds first-format `ACK` records (no target) that settle something in an older
    /// segment: they cannot be told apart, so the segment waits until those are gone.
    legacy: bool,
    /// `pairs` when the compactor last looked, and since when it has been so.
    seen_pairs: i64,
    quiet_since: Instant,
    /// `pairs` when a compaction scan found too much still live to be worth copying.
    checked_pairs: Option<i64>,
    /// End of the records that took over from this segment (compaction's copies of its
    /// records, its `ACK` records and `DELIVERED` marks appended again, a newer `DELIVERED`
    /// mark): until the log is durable up to there ([`State::durable`]), this file is the only
    /// durable copy of what they hold, so it stays, whatever its live count says.
    replaced_until: Option<LogPos>,
}

impl Seg {
    fn new(bytes: u64) -> Self {
        Seg {
            pairs: 0,
            live_bytes: 0,
            bytes,
            ack_floor: u32::MAX,
            legacy: false,
            seen_pairs: 0,
            quiet_since: Instant::now(),
            checked_pairs: None,
            replaced_until: None,
        }
    }
}

/// A position in the log: (segment, byte offset). Positions order as the log does.
type LogPos = (u32, u64);

/// A record compaction moved: where it is now and how many of its pairs are still live.
#[derive(Debug, Clone, Copy)]
struct Moved {
    to: Location,
    pairs: u32,
}

/// The segment being compacted and the pairs settled in it since its scan began, by offset.
struct Watch {
    segment: u32,
    settled: HashMap<u64, Vec<String>>,
}

struct State {
    segment: u32,
    position: u64,
    /// Appended, not yet taken by the writer: (segment, start offset, bytes).
    pending: Vec<(u32, u64, BytesMut)>,
    pending_bytes: usize,
    /// Records in `pending`.
    pending_records: u64,
    /// Taken by the writer and not yet known to be written.
    writing: Vec<(u32, u64, Bytes)>,
    /// Completed after the fsync that covers their record, or failed with it.
    waiters: Vec<Waiter>,
    /// Completed once everything appended before them is written (kept across retries).
    barriers: Vec<Waiter>,
    /// Every segment file, with its live pairs and what its `ACK` records settle.
    live: BTreeMap<u32, Seg>,
    failed: Option<String>,
    shutdown: bool,
    /// Highest delivered id per queue since the writer's last batch.
    delivered: HashMap<String, u64>,
    /// Per queue: the highest id a `DELIVERED` record holds, and that record's segment (which
    /// is copied forward before the segment is deleted).
    marks: HashMap<String, (u64, u32)>,
    /// Records moved by compaction, by the location queues know them by (their oldest copy).
    moved: HashMap<(u32, u64), Moved>,
    /// Records replaced by a newer copy (segment, offset) whose segment still exists.
    superseded: HashSet<(u32, u64)>,
    /// The compaction in progress.
    watch: Option<Watch>,
    /// First segment written by this process: `TRANSIENT` records before it are dead.
    first_segment: u32,
    /// A segment may become deletable once the writer's current batch is written.
    reclaim_after_write: bool,
    /// Everything appended before this position is written and fsynced.
    durable: LogPos,
}

impl State {
    /// Where the record known as `loc` is now.
    fn resolve(&self, loc: Location) -> Location {
        self.moved
            .get(&(loc.segment, loc.offset))
            .map_or(loc, |m| m.to)
    }

    /// One pair of the record known as `loc` (now at `target`) is settled by `queue`; true when
    /// that left a segment other than the head with no live pair.
    fn settle_pair(&mut self, loc: Location, target: Location, queue: &str) -> bool {
        if let Some(m) = self.moved.get_mut(&(loc.segment, loc.offset)) {
            m.pairs = m.pairs.saturating_sub(1);
            if m.pairs == 0 {
                self.moved.remove(&(loc.segment, loc.offset));
            }
        }
        if let Some(w) = self.watch.as_mut().filter(|w| w.segment == target.segment) {
            w.settled
                .entry(target.offset)
                .or_default()
                .push(queue.to_string());
        }
        let head = self.segment;
        match self.live.get_mut(&target.segment) {
            Some(s) => {
                s.pairs -= 1;
                s.live_bytes -= i64::from(target.len);
                debug_assert!(s.pairs >= 0, "segment {} over-settled", target.segment);
                s.pairs == 0 && target.segment != head
            }
            None => false,
        }
    }

    /// True when an `ACK` record of segment `seg` settles something in an older segment that
    /// still exists, so that deleting `seg` would bring a message back.
    fn needs_acks(&self, seg: u32) -> bool {
        let floor = self.live.get(&seg).map_or(u32::MAX, |s| s.ack_floor);
        floor < seg && self.live.range(floor..seg).next().is_some()
    }

    /// Segment `seg` now has records elsewhere in the log that replace it, ending at the
    /// current end of the log: it may go only once they are durable.
    fn replaced_up_to_here(&mut self, seg: u32) {
        let end = (self.segment, self.position);
        if let Some(s) = self.live.get_mut(&seg) {
            s.replaced_until = Some(s.replaced_until.map_or(end, |e| e.max(end)));
        }
    }

    /// True when whatever replaced segment `seg`'s records is durable (or nothing did).
    fn replacement_durable(&self, seg: u32) -> bool {
        self.live
            .get(&seg)
            .and_then(|s| s.replaced_until)
            .is_none_or(|end| end <= self.durable)
    }

    /// Segments with records not yet known to be in their file.
    fn unwritten(&self) -> HashSet<u32> {
        self.pending
            .iter()
            .map(|(s, _, _)| *s)
            .chain(self.writing.iter().map(|(s, _, _)| *s))
            .collect()
    }
}

/// Appends one record to the pending batch (the caller holds the state lock) and returns its
/// location; `pairs` (message, queue) pairs become live in its segment.
fn append_locked(
    st: &mut State,
    segment_size: u64,
    pairs: i64,
    encode: impl FnOnce(&mut BytesMut),
) -> Location {
    if st.position >= segment_size {
        st.segment += 1;
        st.position = 0;
        // The old head may be deletable once written.
        st.reclaim_after_write = true;
    }
    let segment = st.segment;
    if st.pending.last().map(|(s, _, _)| *s) != Some(segment) {
        let start = st.position;
        st.pending
            .push((segment, start, BytesMut::with_capacity(64 * 1024)));
    }
    let buf = &mut st.pending.last_mut().expect("pushed above").2;
    let before = buf.len();
    encode(buf);
    let len = buf.len() - before;
    let loc = Location {
        segment,
        offset: st.position,
        len: len as u32,
    };
    st.position += len as u64;
    st.pending_bytes += len;
    st.pending_records += 1;
    // Every segment is tracked, including ones holding only ACK records, so that it can be
    // deleted once settled.
    let seg = st.live.entry(segment).or_insert_with(|| Seg::new(0));
    seg.pairs += pairs;
    seg.live_bytes += pairs * len as i64;
    seg.bytes += len as u64;
    loc
}

struct Inner {
    cfg: StoreConfig,
    state: Mutex<State>,
    wake_writer: Condvar,
    wake_appenders: Condvar,
    readers: Mutex<HashMap<u32, Arc<File>>>,
    next_id: AtomicU64,
    failed: AtomicBool,
    /// Set (and `wake_compactor` notified) when a segment may have become deletable.
    compactor_poked: Mutex<bool>,
    wake_compactor: Condvar,
    /// Set by [`Store::crash`]: the writer writes nothing more.
    crashed: AtomicBool,
    /// Where segment deletions are recorded before the files go.
    deletions: Mutex<deleted::DeletionLog>,
    /// What [`Store::stats`] reports.
    stats: stats::Counters,
}

/// The message store. Cheap to clone; the writer and compactor threads run until
/// [`Store::close`], which writes and syncs whatever is pending first.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
    writer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
    compactor: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

/// What recovery found: each durable queue's messages in publish order.
pub struct Recovered {
    /// Queue name → its live messages, ordered by id.
    pub queues: HashMap<String, Vec<RecoveredEntry>>,
    /// What was scanned, dropped and how long it took.
    pub report: RecoveryReport,
}

/// The name under which a priority queue's `DELIVERED` watermark for its messages of
/// priority `priority` is recorded (see [`Store::delivered`]): U+001E, the priority, U+001E,
/// then the queue's name in store records. Store keys begin with their vhost's name.
pub fn priority_mark(queue: &str, priority: u8) -> String {
    format!("\u{1e}{priority}\u{1e}{queue}")
}

/// The priority and the queue of a [`priority_mark`] name; `None` for any other name.
pub fn parse_priority_mark(name: &str) -> Option<(u8, &str)> {
    let (p, queue) = name.strip_prefix('\u{1e}')?.split_once('\u{1e}')?;
    Some((p.parse().ok()?, queue))
}

fn segment_path(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("{n:08}.seg"))
}

impl Store {
    /// Opens (creating if needed) the store in `cfg.dir`, recovers its contents and starts the
    /// writer thread. New records go to a fresh segment after the last existing one.
    pub fn open(cfg: StoreConfig) -> Result<(Store, Recovered), StoreError> {
        std::fs::create_dir_all(&cfg.dir)?;
        let rec = recovery::recover(&cfg.dir, cfg.segment_size)?;
        let (segments, file_bytes) = segment_files(&cfg.dir);
        let cfg_dir = cfg.dir.clone();
        let segment = rec.last_segment + 1;
        let inner = Arc::new(Inner {
            state: Mutex::new(State {
                segment,
                position: 0,
                pending: Vec::new(),
                pending_bytes: 0,
                pending_records: 0,
                writing: Vec::new(),
                waiters: Vec::new(),
                barriers: Vec::new(),
                live: rec.segs,
                failed: None,
                shutdown: false,
                delivered: HashMap::new(),
                marks: rec.marks,
                moved: rec.moved,
                superseded: rec.superseded,
                watch: None,
                first_segment: segment,
                reclaim_after_write: false,
                durable: (segment, 0),
            }),
            cfg,
            wake_writer: Condvar::new(),
            wake_appenders: Condvar::new(),
            readers: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(rec.next_id),
            failed: AtomicBool::new(false),
            compactor_poked: Mutex::new(false),
            wake_compactor: Condvar::new(),
            crashed: AtomicBool::new(false),
            deletions: Mutex::new(deleted::DeletionLog::new(&cfg_dir)),
            stats: stats::Counters::new(segments, file_bytes),
        });
        let w = inner.clone();
        let handle = std::thread::Builder::new()
            .name("warren-store-writer".into())
            .spawn(move || writer_loop(w))?;
        let c = inner.clone();
        let compactor = std::thread::Builder::new()
            .name("warren-store-compactor".into())
            .spawn(move || compact::compactor_loop(c))?;
        let store = Store {
            inner,
            writer: Arc::new(Mutex::new(Some(handle))),
            compactor: Arc::new(Mutex::new(Some(compactor))),
        };
        // Segments that recovery found fully settled can go now.
        store.inner.reclaim();
        Ok((
            store,
            Recovered {
                queues: rec.queues,
                report: rec.report,
            },
        ))
    }

    /// A fresh message id (increasing; ids order messages within every queue).
    pub fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// True while writes are failing and appends are refused.
    pub fn is_failed(&self) -> bool {
        self.inner.failed.load(Ordering::Relaxed)
    }

    fn append(
        &self,
        pairs: i64,
        waiter: Option<Waiter>,
        encode: impl FnOnce(&mut BytesMut),
    ) -> Result<Location, StoreError> {
        let inner = &self.inner;
        let mut st = inner.state.lock();
        while st.pending_bytes >= inner.cfg.max_batch_bytes && st.failed.is_none() && !st.shutdown {
            inner.wake_appenders.wait(&mut st);
        }
        if let Some(reason) = &st.failed {
            return Err(StoreError::Unavailable(reason.clone()));
        }
        let loc = append_locked(&mut st, inner.cfg.segment_size, pairs, encode);
        if let Some(w) = waiter {
            st.waiters.push(w);
        }
        drop(st);
        inner.wake_writer.notify_one();
        Ok(loc)
    }

    /// Appends a persistent message routed to the durable `queues`, enqueued at
    /// `enqueued_ms` (ms since the Unix epoch; its TTL counts from then after a restart).
    /// `waiter` is completed after the fsync that covers the record. Errors:
    /// [`StoreError::Unavailable`] while writes fail.
    #[allow(clippy::too_many_arguments)]
    pub fn append_publish(
        &self,
        id: u64,
        exchange: &str,
        routing_key: &str,
        properties: &BasicProperties,
        body: &[u8],
        enqueued_ms: u64,
        queues: &[&str],
        waiter: Option<(Arc<dyn Completion>, u64)>,
    ) -> Result<Location, StoreError> {
        self.append(queues.len() as i64, waiter, |buf| {
            record::encode_publish(
                buf,
                id,
                exchange,
                routing_key,
                properties,
                body,
                enqueued_ms,
                queues,
                false,
            )
        })
    }

    /// Pages a transient message, enqueued at `enqueued_ms`, out to disk; it is never
    /// recovered. Release it with [`Store::release`] when it leaves its queue.
    pub fn append_transient(
        &self,
        id: u64,
        exchange: &str,
        routing_key: &str,
        properties: &BasicProperties,
        body: &[u8],
        enqueued_ms: u64,
    ) -> Result<Location, StoreError> {
        self.append(1, None, |buf| {
            record::encode_publish(
                buf,
                id,
                exchange,
                routing_key,
                properties,
                body,
                enqueued_ms,
                &[],
                true,
            )
        })
    }

    /// Records that message `id` (stored at `loc`) left durable queue `queue`.
    pub fn ack(&self, queue: &str, id: u64, loc: Location) {
        self.settle(queue, id, loc);
    }

    /// Writes the `ACK` record for one pair and releases it. The record is written even while
    /// the store is failing (the writer keeps it until a write succeeds): the log must never
    /// hold a pair as live that memory has settled, or compaction would copy it back.
    fn settle(&self, queue: &str, id: u64, loc: Location) {
        let inner = &self.inner;
        let mut st = inner.state.lock();
        while st.pending_bytes >= inner.cfg.max_batch_bytes && st.failed.is_none() && !st.shutdown {
            inner.wake_appenders.wait(&mut st);
        }
        // `loc` is the oldest copy of the record (queues know records by where they were
        // first written, or where recovery found their oldest copy); `target` the newest.
        let target = st.resolve(loc);
        let at = append_locked(&mut st, inner.cfg.segment_size, 0, |buf| {
            record::encode_ack(buf, id, target, loc.segment, queue)
        });
        if let Some(s) = st.live.get_mut(&at.segment) {
            s.ack_floor = s.ack_floor.min(loc.segment);
        }
        let emptied = st.settle_pair(loc, target, queue);
        // A transient page's release need not reach the disk soon (it matters to compaction
        // only, which waits for the writer anyway): it goes with the next batch.
        let wake = !queue.is_empty() || st.pending_bytes >= inner.cfg.max_batch_bytes / 2;
        drop(st);
        if wake {
            inner.wake_writer.notify_one();
        }
        if emptied {
            inner.reclaim();
        }
    }

    /// Records that message `id` was delivered from `queue` (recovered as redelivered).
    ///
    /// Queues deliver in id order (a requeued message was delivered before), so every message
    /// of `queue` with an id up to the highest delivered one has been delivered: the store
    /// keeps that watermark per queue and writes one `DELIVERED` record per queue per batch,
    /// not one per delivery. A priority queue delivers in id order only within each priority:
    /// it gives the message's `priority` property (0 when absent) as `priority`, and the
    /// watermark is kept per priority ([`priority_mark`]), so that a restart does not flag
    /// as redelivered the lower-priority messages that waited behind delivered ones.
    pub fn delivered(&self, queue: &str, priority: Option<u8>, id: u64) {
        let key = match priority {
            Some(p) => std::borrow::Cow::Owned(priority_mark(queue, p)),
            None => std::borrow::Cow::Borrowed(queue),
        };
        let mut st = self.inner.state.lock();
        let was_empty = st.delivered.is_empty();
        match st.delivered.get_mut(key.as_ref()) {
            Some(w) => *w = (*w).max(id),
            None => {
                st.delivered.insert(key.into_owned(), id);
            }
        }
        drop(st);
        if was_empty {
            self.inner.wake_writer.notify_one();
        }
    }

    /// Releases a transient page stored at `loc` (see [`Store::append_transient`]).
    pub fn release(&self, loc: Location) {
        self.settle("", 0, loc);
    }

    /// Durable queue `queue` was deleted: its `DELIVERED` watermark (a priority queue's, one
    /// per priority, with `priority_queue`) no longer needs keeping (its messages are settled
    /// as they leave, and recovery drops those of a queue that is gone). Without this, the
    /// record holding it would be copied forward forever.
    pub fn forget_queue(&self, queue: &str, priority_queue: bool) {
        // A priority queue's watermarks, one per priority it delivered (see
        // [`Store::delivered`]); their names are made before the lock is taken.
        let by_priority: Vec<String> = if priority_queue {
            (0..=u8::MAX).map(|p| priority_mark(queue, p)).collect()
        } else {
            Vec::new()
        };
        let mut st = self.inner.state.lock();
        for name in std::iter::once(queue).chain(by_priority.iter().map(String::as_str)) {
            st.marks.remove(name);
            st.delivered.remove(name);
        }
    }

    /// Completes `waiter` after everything appended so far is fsynced (a barrier, for
    /// tx.commit). While writes fail it waits for a retry to succeed; it is completed with
    /// `ok = false` only when the store closes first.
    pub fn sync(&self, waiter: (Arc<dyn Completion>, u64)) {
        let mut st = self.inner.state.lock();
        st.barriers.push(waiter);
        drop(st);
        self.inner.wake_writer.notify_one();
    }

    /// A queue's spill file at `path`, whose entries point into this store (see
    /// [`spill::SpillFile`]); it carries the configured [`StoreConfig::spill_write_fault`].
    pub fn spill_file(&self, path: PathBuf) -> spill::SpillFile {
        spill::SpillFile::new(path).with_fault(self.inner.cfg.spill_write_fault.clone())
    }

    /// Reads back the message stored at `loc` (wherever compaction has moved it since).
    pub fn read(&self, loc: Location) -> Result<StoredMessage, StoreError> {
        let mut tries = 0;
        loop {
            match self.read_once(loc) {
                // Compaction deleted the file between resolving and opening it: resolve again.
                Err(StoreError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound && tries < 3 => {
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    fn read_once(&self, loc: Location) -> Result<StoredMessage, StoreError> {
        // Not yet written to the file?
        let loc = {
            let st = self.inner.state.lock();
            let loc = st.resolve(loc);
            let hit = st
                .pending
                .iter()
                .map(|(seg, start, b)| (*seg, *start, &b[..]))
                .chain(
                    st.writing
                        .iter()
                        .map(|(seg, start, b)| (*seg, *start, &b[..])),
                )
                .find(|(seg, start, b)| {
                    *seg == loc.segment
                        && loc.offset >= *start
                        && loc.offset + u64::from(loc.len) <= start + b.len() as u64
                });
            if let Some((_, start, b)) = hit {
                let off = (loc.offset - start) as usize;
                return decode_at(&b[off..off + loc.len as usize], loc);
            }
            loc
        };
        let file = self.inner.reader(loc.segment)?;
        let mut raw = vec![0u8; loc.len as usize];
        if let Err(e) = file.read_exact_at(&mut raw, loc.offset) {
            // The next read opens the file again (it may have been replaced meanwhile).
            self.inner.readers.lock().remove(&loc.segment);
            return Err(e.into());
        }
        decode_at(&raw, loc)
    }

    /// Stops the compactor, then the writer after it has written and synced everything
    /// pending.
    pub fn close(&self) {
        self.inner.state.lock().shutdown = true;
        self.inner.wake_writer.notify_all();
        self.inner.reclaim();
        if let Some(h) = self.compactor.lock().take() {
            let _ = h.join();
        }
        if let Some(h) = self.writer.lock().take() {
            let _ = h.join();
        }
    }

    /// Stops the store as a crash would, for crash tests: the writer writes nothing more
    /// (what is pending is lost, waiters are completed as failed), then both threads stop.
    /// The files are left as they were at that moment.
    #[doc(hidden)]
    pub fn crash(&self) {
        {
            let mut st = self.inner.state.lock();
            self.inner.crashed.store(true, Ordering::SeqCst);
            st.shutdown = true;
        }
        self.inner.wake_writer.notify_all();
        if let Some(h) = self.writer.lock().take() {
            let _ = h.join();
        }
        let (waiters, barriers) = {
            let mut st = self.inner.state.lock();
            (
                std::mem::take(&mut st.waiters),
                std::mem::take(&mut st.barriers),
            )
        };
        complete(&waiters, false);
        complete(&barriers, false);
        self.inner.reclaim();
        if let Some(h) = self.compactor.lock().take() {
            let _ = h.join();
        }
    }

    /// True once [`Store::crash`] has begun: the writer writes nothing more.
    #[doc(hidden)]
    pub fn is_crashed(&self) -> bool {
        self.inner.crashed.load(Ordering::SeqCst)
    }

    /// The store's counters now: bytes and segment files held, bytes and records written,
    /// fsyncs and their latencies, group-commit batch sizes, compactions (see
    /// [`StoreStats`]). A handful of atomic loads; takes no lock.
    pub fn stats(&self) -> StoreStats {
        self.inner.stats.snapshot()
    }

    /// Number of segment files currently holding live data or pending deletion.
    pub fn segment_count(&self) -> usize {
        std::fs::read_dir(&self.inner.cfg.dir)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter(|e| e.path().extension().is_some_and(|x| x == "seg"))
                    .count()
            })
            .unwrap_or(0)
    }
}

/// Segment files in `dir` and their total size, bytes.
fn segment_files(dir: &Path) -> (u64, u64) {
    let mut n = 0;
    let mut bytes = 0;
    if let Ok(d) = std::fs::read_dir(dir) {
        for e in d.filter_map(|e| e.ok()) {
            if e.path().extension().is_some_and(|x| x == "seg") {
                n += 1;
                bytes += e.metadata().map_or(0, |m| m.len());
            }
        }
    }
    (n, bytes)
}

fn decode_at(raw: &[u8], loc: Location) -> Result<StoredMessage, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        segment: loc.segment,
        offset: loc.offset,
        reason,
    };
    if raw.len() < record::HEADER_LEN {
        return Err(corrupt("short record".into()));
    }
    let crc = u32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]);
    match record::decode(&raw[record::HEADER_LEN..], crc) {
        Ok(record::Record::Publish { message, .. }) => Ok(message),
        Ok(other) => Err(corrupt(format!("not a message record: {other:?}"))),
        Err(e) => Err(corrupt(e.to_string())),
    }
}

impl Inner {
    fn reader(&self, segment: u32) -> Result<Arc<File>, StoreError> {
        let mut r = self.readers.lock();
        if let Some(f) = r.get(&segment) {
            return Ok(f.clone());
        }
        let f = Arc::new(File::open(segment_path(&self.cfg.dir, segment))?);
        r.insert(segment, f.clone());
        Ok(f)
    }

    /// Asks the compactor to delete the segments that can go.
    fn reclaim(&self) {
        *self.compactor_poked.lock() = true;
        self.wake_compactor.notify_one();
    }

    /// Deletes every segment whose pairs are all settled and whose `ACK` records settle
    /// nothing that still exists (other than the head, one with unwritten records, one
    /// holding a queue's latest `DELIVERED` record, or one being compacted).
    fn delete_settled(&self) {
        let mut doomed = Vec::new();
        {
            let mut st = self.state.lock();
            let unwritten = st.unwritten();
            let marked: HashSet<u32> = st.marks.values().map(|m| m.1).collect();
            let busy = st.watch.as_ref().map(|w| w.segment);
            loop {
                let settled: Vec<u32> = st
                    .live
                    .iter()
                    .filter(|(&seg, s)| {
                        s.pairs == 0
                            && seg < st.segment
                            && !unwritten.contains(&seg)
                            && !marked.contains(&seg)
                            && busy != Some(seg)
                            && st.replacement_durable(seg)
                    })
                    .map(|(&seg, _)| seg)
                    .collect();
                let before = doomed.len();
                for seg in settled {
                    if !st.needs_acks(seg) {
                        st.live.remove(&seg);
                        doomed.push(seg);
                    }
                }
                // Settled but not all written yet, or replaced by records not yet written: look
                // again after the writer's batch.
                st.reclaim_after_write |= st.live.iter().any(|(&seg, s)| {
                    s.pairs == 0
                        && seg < st.segment
                        && (unwritten.contains(&seg) || !st.replacement_durable(seg))
                });
                // Deleting one may free another whose ACK records pointed into it.
                if doomed.len() == before {
                    break;
                }
            }
            if !doomed.is_empty() {
                let gone: HashSet<u32> = doomed.iter().copied().collect();
                st.superseded.retain(|(seg, _)| !gone.contains(seg));
            }
        }
        self.delete_files(&doomed);
    }

    /// Deletes segment files, recording first that the store itself deleted them (so that
    /// recovery does not report them missing). A record that cannot be written does not
    /// keep the files: deleting them may be what frees the disk.
    fn delete_files(&self, segs: &[u32]) {
        if segs.is_empty() {
            return;
        }
        if let Err(e) = self.deletions.lock().record(segs) {
            warn!(segments = ?segs, error = %e, "cannot record segment deletions; the next recovery will report these segments missing");
        }
        for &seg in segs {
            self.readers.lock().remove(&seg);
            let path = segment_path(&self.cfg.dir, seg);
            let len = std::fs::metadata(&path).map_or(0, |m| m.len());
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    self.stats.segment_deleted(len);
                    debug!(segment = seg, "deleted settled segment")
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => warn!(segment = seg, error = %e, "cannot delete segment"),
            }
        }
    }
}

struct OpenSegment {
    number: u32,
    file: File,
    /// Length known to be written and synced.
    synced_len: u64,
    /// Chunks written after `synced_len` and not yet synced.
    unsynced: Vec<(u32, u64, Bytes)>,
    /// The file's length: records end at `synced_len` plus the unsynced chunks, zeros follow.
    allocated: u64,
    /// False once zeros could not be written ahead of this segment's records.
    preallocating: bool,
}

fn writer_loop(inner: Arc<Inner>) {
    let mut open: Option<OpenSegment> = None;
    // A batch whose write failed, with its barriers (its waiters were failed at once) and
    // its record count.
    let mut retry: Option<(Batch, Vec<Waiter>, u64)> = None;
    loop {
        let (mut batch, waiters, barriers, shutdown, records) = match retry.take() {
            Some((b, barriers, records)) => {
                std::thread::sleep(Duration::from_secs(1));
                // Settled segments can go even while writes fail: that may be what frees space.
                inner.reclaim();
                (
                    b,
                    Vec::new(),
                    barriers,
                    inner.state.lock().shutdown,
                    records,
                )
            }
            None => {
                let mut st = inner.state.lock();
                while st.pending.is_empty()
                    && st.waiters.is_empty()
                    && st.barriers.is_empty()
                    && st.delivered.is_empty()
                    && !st.shutdown
                {
                    inner.wake_writer.wait(&mut st);
                }
                if st.failed.is_none() {
                    let marks = std::mem::take(&mut st.delivered);
                    for (queue, id) in marks {
                        let at = append_locked(&mut st, inner.cfg.segment_size, 0, |buf| {
                            record::encode_queue_event(buf, record::kind::DELIVERED, id, &queue)
                        });
                        let mark = st.marks.entry(queue).or_insert((id, at.segment));
                        if id >= mark.0 {
                            let old = mark.1;
                            *mark = (id, at.segment);
                            if old != at.segment {
                                // The old mark's segment stays until the new mark is durable.
                                st.replaced_up_to_here(old);
                            }
                        }
                    }
                }
                if !inner.cfg.fsync_delay.is_zero()
                    && st.pending_bytes < inner.cfg.max_batch_bytes / 2
                    && !st.shutdown
                {
                    // Appends notify the writer: wait out the delay (or until the batch is
                    // half full), not just until the next append.
                    let deadline = Instant::now() + inner.cfg.fsync_delay;
                    while st.pending_bytes < inner.cfg.max_batch_bytes / 2
                        && !st.shutdown
                        && !inner.wake_writer.wait_until(&mut st, deadline).timed_out()
                    {
                    }
                }
                let batch: VecDeque<(u32, u64, Bytes)> = std::mem::take(&mut st.pending)
                    .into_iter()
                    .map(|(seg, start, b)| (seg, start, b.freeze()))
                    .collect();
                st.writing = batch.iter().cloned().collect();
                st.pending_bytes = 0;
                let records = std::mem::take(&mut st.pending_records);
                let waiters = std::mem::take(&mut st.waiters);
                let barriers = std::mem::take(&mut st.barriers);
                let shutdown = st.shutdown;
                drop(st);
                inner.wake_appenders.notify_all();
                (batch, waiters, barriers, shutdown, records)
            }
        };
        if inner.crashed.load(Ordering::SeqCst) {
            complete(&waiters, false);
            complete(&barriers, false);
            return;
        }
        if batch.is_empty() && waiters.is_empty() && barriers.is_empty() && shutdown {
            if let Some(o) = open.as_mut() {
                if let Err(e) = seal(&inner.stats, o) {
                    warn!(segment = o.number, error = %e, "cannot cut the segment's zeros at shutdown; recovery will");
                }
            }
            return;
        }
        let end = batch
            .back()
            .map(|(seg, start, b)| (*seg, start + b.len() as u64));
        match write_batch(
            &inner.cfg.dir,
            inner.cfg.segment_size,
            &inner.stats,
            &mut open,
            &mut batch,
        ) {
            Ok(()) => {
                if records > 0 {
                    inner.stats.committed(records);
                }
                let mut st = inner.state.lock();
                st.writing.clear();
                if let Some(end) = end {
                    st.durable = st.durable.max(end);
                }
                if inner.failed.swap(false, Ordering::Relaxed) {
                    info!("message store writes succeed again");
                    st.failed = None;
                }
                let reclaim = std::mem::take(&mut st.reclaim_after_write);
                drop(st);
                complete(&waiters, true);
                complete(&barriers, true);
                if reclaim {
                    inner.reclaim();
                }
            }
            Err(e) => {
                if !inner.failed.swap(true, Ordering::Relaxed) {
                    error!(error = %e, "message store write failed; refusing publishes until it succeeds");
                }
                inner.state.lock().failed = Some(e.to_string());
                inner.wake_appenders.notify_all();
                // Appends are refused from now on; whoever waits on this batch learns now,
                // not when the disk comes back.
                complete(&waiters, false);
                if shutdown {
                    complete(&barriers, false);
                    return;
                }
                retry = Some((batch, barriers, records));
            }
        }
    }
}

/// Writes `batch` and syncs it. On error, whatever was written but not synced is cut from the
/// file and put back at the front of `batch`, so a retry writes each record exactly once.
/// Each fsync that succeeds is counted in `stats` with its latency and the bytes it covered.
fn write_batch(
    dir: &Path,
    segment_size: u64,
    stats: &stats::Counters,
    open: &mut Option<OpenSegment>,
    batch: &mut VecDeque<(u32, u64, Bytes)>,
) -> std::io::Result<()> {
    let result = (|| {
        while let Some((seg, _, _)) = batch.front() {
            let seg = *seg;
            if open.as_ref().map(|o| o.number) != Some(seg) {
                if let Some(prev) = open.as_mut() {
                    sync(stats, prev)?;
                    if let Err(e) = seal(stats, prev) {
                        warn!(segment = prev.number, error = %e, "cannot cut the segment's zeros; recovery will");
                    }
                }
                let path = segment_path(dir, seg);
                let created = !path.exists();
                let file = OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(false)
                    .open(&path)?;
                if created {
                    stats.segments.fetch_add(1, Ordering::Relaxed);
                }
                let synced_len = file.metadata()?.len();
                if let Ok(d) = File::open(dir) {
                    let _ = d.sync_all();
                }
                *open = Some(OpenSegment {
                    number: seg,
                    file,
                    synced_len,
                    unsynced: Vec::new(),
                    allocated: synced_len,
                    preallocating: true,
                });
            }
            let o = open.as_mut().expect("opened above");
            let chunk = batch.pop_front().expect("front checked");
            let end = chunk.1 + chunk.2.len() as u64;
            preallocate(stats, o, chunk.1, end, segment_size);
            let r = o.file.write_all_at(&chunk.2, chunk.1);
            if end > o.allocated {
                stats.resized(o.allocated, end);
                o.allocated = end;
            }
            o.unsynced.push(chunk);
            r?;
        }
        if let Some(o) = open.as_mut() {
            sync(stats, o)?;
        }
        Ok(())
    })();
    if result.is_err() {
        if let Some(o) = open.as_mut() {
            let _ = set_file_len(stats, o, o.synced_len);
            for chunk in o.unsynced.drain(..).rev() {
                batch.push_front(chunk);
            }
        }
    }
    result
}

/// Zeros written ahead of the open segment's records, bytes (see the module docs): one
/// `fdatasync` in every 4 MiB of records writes the inode, for the file's new length.
pub const PREALLOCATE: u64 = 4 * 1024 * 1024;

/// Writes zeros ahead of the open segment's records before a chunk `[start, end)` is written
/// at its place: from the file's current length up to the next multiple of [`PREALLOCATE`],
/// but not past `segment_size` (a segment grows past it by one record at most). Not synced
/// here: the `fdatasync` after the chunk covers the zeros too.
///
/// Best effort: if the zeros cannot be written (a nearly full disk), the file is cut back to
/// `start` and this segment is written without them, so records that fit are still written.
fn preallocate(
    stats: &stats::Counters,
    o: &mut OpenSegment,
    start: u64,
    end: u64,
    segment_size: u64,
) {
    if end <= o.allocated || !o.preallocating {
        return;
    }
    static ZEROS: [u8; 64 * 1024] = [0; 64 * 1024];
    let target = (end.div_ceil(PREALLOCATE) * PREALLOCATE).min(segment_size.max(end));
    let mut at = o.allocated.max(start);
    let written = (|| {
        // The length first, in one step: a crash while the zeros are written leaves the file
        // at a length recovery knows as the writer's (the rest reads as zeros).
        o.file.set_len(target)?;
        while at < target {
            let n = (target - at).min(ZEROS.len() as u64) as usize;
            o.file.write_all_at(&ZEROS[..n], at)?;
            at += n as u64;
        }
        Ok::<(), std::io::Error>(())
    })();
    match written {
        Ok(()) => {
            stats.resized(o.allocated, target);
            o.allocated = target;
        }
        Err(e) => {
            debug!(segment = o.number, error = %e, "cannot write zeros ahead of the records");
            o.preallocating = false;
            let _ = set_file_len(stats, o, start);
        }
    }
}

/// Sets the open segment's file length; `allocated` and the bytes gauge follow the length the
/// file has afterwards, whether or not the change succeeded.
fn set_file_len(stats: &stats::Counters, o: &mut OpenSegment, len: u64) -> std::io::Result<()> {
    let r = o.file.set_len(len);
    let now = o.file.metadata().map_or(o.allocated, |m| m.len());
    stats.resized(o.allocated, now);
    o.allocated = now;
    r
}

/// Cuts the open segment back to its records' length (its zeros go), when it is written no
/// more. Not synced: a crash before the cut leaves zeros that recovery cuts.
fn seal(stats: &stats::Counters, o: &mut OpenSegment) -> std::io::Result<()> {
    if o.allocated > o.synced_len {
        set_file_len(stats, o, o.synced_len)?;
    }
    Ok(())
}

/// `fdatasync`s the open segment: what was written to it since the last one is durable.
fn sync(stats: &stats::Counters, o: &mut OpenSegment) -> std::io::Result<()> {
    let started = Instant::now();
    o.file.sync_data()?;
    let bytes = o.unsynced.iter().map(|c| c.2.len() as u64).sum::<u64>();
    stats.synced(bytes, started.elapsed());
    o.synced_len += bytes;
    o.unsynced.clear();
    Ok(())
}

fn complete(waiters: &[Waiter], ok: bool) {
    let mut i = 0;
    let mut tokens = Vec::new();
    while i < waiters.len() {
        let sink = &waiters[i].0;
        tokens.clear();
        let mut j = i;
        while j < waiters.len() && Arc::ptr_eq(&waiters[j].0, sink) {
            tokens.push(waiters[j].1);
            j += 1;
        }
        sink.complete(&tokens, ok);
        i = j;
    }
}
