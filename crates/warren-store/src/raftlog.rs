//! The shared log of a node's Raft groups (quorum queues): one append-only log for every
//! group, as RabbitMQ's Ra keeps one write-ahead log per node, so that the appends of many
//! queues share each fsync.
//!
//! It is built like the message store: numbered segment files (`<dir>/00000001.rlog`, …),
//! records framed as `u32 length | u32 crc32c | u8 type | payload` (big-endian, the CRC over
//! type and payload), appends taken under a short mutex and a writer thread that writes
//! everything appended since its last round, covers it with one `fdatasync` and only then
//! runs the callbacks (group commit: what arrives during an fsync goes in the next one).
//!
//! Records (payloads, after the type byte; `group` is `u16` length + UTF-8):
//!
//! - `ENTRY` (1): `group, u64 index, payload` — a log entry. Raft appends at `index` only
//!   after every entry from `index` on was removed, so recovery reads an entry as "the
//!   group's log ends here": it drops the group's entries from `index` on before keeping it.
//! - `TRUNCATE` (2): `group, u64 since` — entries from `since` on are gone (a follower's
//!   conflicting suffix).
//! - `PURGE` (3): `group, u64 upto, meta` — entries up to `upto` are gone (a snapshot covers
//!   them); `meta` is the caller's encoding of the last purged log id.
//! - `META` (4): `group, u8 which, value` — the group's vote (1) or committed log id (2), the
//!   latest record winning.
//! - `DROP` (5): `group` — the group was deleted: everything it wrote before is gone.
//!
//! The payloads are opaque here; the caller (warren-quorum) encodes its entries.
//!
//! Reclaim: every entry is counted live in its segment until it is purged, truncated,
//! replaced or its group dropped. Segments are deleted oldest first, only once the oldest one
//! holds no live entry: a record that a later one overrides always goes before the later
//! one, so no stale entry can come back, and a `TRUNCATE`, `PURGE` or `DROP` record outlives
//! everything it overrides.
//! The latest `META` and `PURGE` records of each group that live in a segment about to go are
//! appended again at the head first, and the segment is deleted once those copies are
//! durable. A group that never purges keeps the segments from its oldest live entry on; the
//! quorum queues snapshot and purge every few thousand entries.
//!
//! Recovery ([`RaftLog::open`]) scans every segment in order; the first record that does not
//! check out (a torn write at a crash) ends the log there: its file is cut at that offset and
//! later segments are deleted. Nothing after it had been reported durable.
//!
//! A write error (a full disk) does not fail the log: the batch is kept, with its callbacks,
//! and written again every second until a retry succeeds; what is appended meanwhile goes
//! after it. Nothing is reported durable before it is, so the groups simply wait: their Raft
//! state stays as it was (openraft treats a failed log write as fatal for the group, which
//! would stop the node's quorum queues until a restart). [`RaftLog::is_failed`] tells the
//! queues to refuse new publishes meanwhile, so that only the groups' own small records pile
//! up. A torn write of the failed batch is overwritten by the retry, or cut off by recovery
//! if the broker stops first.

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// Runs once the records appended before it are durable (`true`), or could not be written.
pub type Flushed = Box<dyn FnOnce(bool) + Send>;

/// Settings of the shared log.
#[derive(Debug, Clone)]
pub struct RaftLogConfig {
    /// Directory of the segment files (created if missing).
    pub dir: PathBuf,
    /// A new segment is started once one reaches this size, bytes.
    pub segment_size: u64,
    /// Appenders wait while this many bytes are pending.
    pub max_batch_bytes: usize,
}

impl RaftLogConfig {
    /// Defaults for `dir`: 64 MiB segments, 16 MiB batches.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        RaftLogConfig {
            dir: dir.into(),
            segment_size: 64 * 1024 * 1024,
            max_batch_bytes: 16 * 1024 * 1024,
        }
    }
}

/// Which value a `META` record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetaKind {
    /// The group's vote (term, candidate, committed flag).
    Vote = 1,
    /// The group's last committed log id.
    Committed = 2,
}

/// What recovery found of one group.
#[derive(Debug, Default, Clone)]
pub struct GroupLog {
    /// The live entries by index.
    pub entries: BTreeMap<u64, Bytes>,
    /// The latest vote.
    pub vote: Option<Bytes>,
    /// The latest committed log id.
    pub committed: Option<Bytes>,
    /// Up to which index entries were purged, and the caller's record of that.
    pub purged: Option<(u64, Bytes)>,
}

mod kind {
    pub const ENTRY: u8 = 1;
    pub const TRUNCATE: u8 = 2;
    pub const PURGE: u8 = 3;
    pub const META: u8 = 4;
    pub const DROP: u8 = 5;
}

/// A mark kind as the log tracks it: the two `META` kinds and `PURGE`.
const MARK_PURGE: u8 = 3;

/// Position in the log: (segment, offset).
type LogPos = (u32, u64);

/// Bytes to write at a position: (segment, offset, framed records).
type Chunk = (u32, u64, BytesMut);

#[derive(Default)]
struct Seg {
    /// Entries in this segment not yet purged, truncated, replaced or dropped.
    live: i64,
    /// (group, mark kind) whose latest record is in this segment.
    marks: Vec<(String, u8)>,
    /// Copies of its marks were appended up to here: the file goes once that is durable.
    carried_until: Option<LogPos>,
}

#[derive(Default)]
struct Group {
    /// Segment of each live entry.
    entries: BTreeMap<u64, u32>,
    /// Latest mark records: kind -> (segment, encoded record payload after the type byte).
    marks: HashMap<u8, (u32, Bytes)>,
}

struct State {
    segment: u32,
    position: u64,
    pending: Vec<(u32, u64, BytesMut)>,
    pending_bytes: usize,
    waiters: Vec<Flushed>,
    segs: BTreeMap<u32, Seg>,
    groups: HashMap<String, Group>,
    failed: Option<String>,
    shutdown: bool,
    durable: LogPos,
}

struct Inner {
    cfg: RaftLogConfig,
    state: Mutex<State>,
    /// A write failed and no retry has succeeded yet (read without the lock, per publish).
    failing: AtomicBool,
    wake_writer: Condvar,
    wake_appenders: Condvar,
}

/// The shared Raft log of a node. Cheap to clone; the writer thread runs until
/// [`RaftLog::close`].
#[derive(Clone)]
pub struct RaftLog {
    inner: Arc<Inner>,
    writer: Arc<Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl std::fmt::Debug for RaftLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftLog")
            .field("dir", &self.inner.cfg.dir)
            .finish()
    }
}

fn segment_path(dir: &Path, n: u32) -> PathBuf {
    dir.join(format!("{n:08}.rlog"))
}

fn put_group(buf: &mut BytesMut, group: &str) {
    let g = &group.as_bytes()[..group.len().min(usize::from(u16::MAX))];
    buf.put_u16(g.len() as u16);
    buf.put_slice(g);
}

/// Frames one record (type byte + payload) into `buf`; returns its length.
fn frame(buf: &mut BytesMut, kind: u8, payload: &[u8]) -> usize {
    let mut crc = crc32c::crc32c(&[kind]);
    crc = crc32c::crc32c_append(crc, payload);
    buf.put_u32(payload.len() as u32 + 1);
    buf.put_u32(crc);
    buf.put_u8(kind);
    buf.put_slice(payload);
    9 + payload.len()
}

impl State {
    /// Appends one framed record at the head; returns where it starts.
    fn append(&mut self, segment_size: u64, kind: u8, payload: &[u8]) -> LogPos {
        if self.position >= segment_size {
            self.segment += 1;
            self.position = 0;
            self.segs.entry(self.segment).or_default();
        }
        let seg = self.segment;
        if self.pending.last().map(|(s, _, _)| *s) != Some(seg) {
            self.pending
                .push((seg, self.position, BytesMut::with_capacity(64 * 1024)));
        }
        let buf = &mut self.pending.last_mut().expect("pushed above").2;
        let at = (seg, self.position);
        let len = frame(buf, kind, payload);
        self.position += len as u64;
        self.pending_bytes += len;
        at
    }

    fn kill_entry(&mut self, seg: u32) {
        if let Some(s) = self.segs.get_mut(&seg) {
            s.live -= 1;
            debug_assert!(s.live >= 0, "raft log segment {seg} over-released");
        }
    }

    /// Entries of `group` from `since` on are gone.
    fn cut_from(&mut self, group: &str, since: u64) {
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        let gone = g.entries.split_off(&since);
        for seg in gone.into_values() {
            self.kill_entry(seg);
        }
    }

    /// Records that the latest mark `mark` of `group` is now the record at `seg`.
    fn set_mark(&mut self, group: &str, mark: u8, seg: u32, payload: Bytes) {
        let g = self.groups.entry(group.to_string()).or_default();
        let old = g.marks.insert(mark, (seg, payload));
        if let Some((old_seg, _)) = old {
            if let Some(s) = self.segs.get_mut(&old_seg) {
                s.marks.retain(|(n, m)| !(n == group && *m == mark));
            }
        }
        self.segs
            .entry(seg)
            .or_default()
            .marks
            .push((group.to_string(), mark));
    }
}

impl RaftLog {
    /// Opens (creating if needed) the log in `cfg.dir`, recovers every group's entries and
    /// marks, and starts the writer thread. New records go to a fresh segment.
    pub fn open(cfg: RaftLogConfig) -> std::io::Result<(RaftLog, HashMap<String, GroupLog>)> {
        std::fs::create_dir_all(&cfg.dir)?;
        let (groups, state) = recover(&cfg.dir)?;
        let inner = Arc::new(Inner {
            cfg,
            state: Mutex::new(state),
            failing: AtomicBool::new(false),
            wake_writer: Condvar::new(),
            wake_appenders: Condvar::new(),
        });
        let w = inner.clone();
        let handle = std::thread::Builder::new()
            .name("warren-raft-log".into())
            .spawn(move || writer_loop(w))?;
        let log = RaftLog {
            inner,
            writer: Arc::new(Mutex::new(Some(handle))),
        };
        Ok((log, groups))
    }

    fn with_state<R>(&self, flushed: Option<Flushed>, f: impl FnOnce(&mut State, u64) -> R) -> R {
        let inner = &self.inner;
        let mut st = inner.state.lock();
        while st.pending_bytes >= inner.cfg.max_batch_bytes && st.failed.is_none() && !st.shutdown {
            inner.wake_appenders.wait(&mut st);
        }
        let r = f(&mut st, inner.cfg.segment_size);
        if let Some(cb) = flushed {
            if st.shutdown {
                drop(st);
                cb(false);
                return r;
            }
            st.waiters.push(cb);
        }
        drop(st);
        inner.wake_writer.notify_one();
        r
    }

    /// Appends entries (index, payload) of `group`, in index order, after removing the
    /// group's entries from the first index on. `flushed` runs once they are durable.
    pub fn append(&self, group: &str, entries: &[(u64, Bytes)], flushed: Option<Flushed>) {
        self.with_state(flushed, |st, size| {
            if let Some((first, _)) = entries.first() {
                st.cut_from(group, *first);
            }
            let mut p = BytesMut::new();
            for (index, payload) in entries {
                p.clear();
                put_group(&mut p, group);
                p.put_u64(*index);
                p.put_slice(payload);
                let (seg, _) = st.append(size, kind::ENTRY, &p);
                st.segs.entry(seg).or_default().live += 1;
                st.groups
                    .entry(group.to_string())
                    .or_default()
                    .entries
                    .insert(*index, seg);
            }
        })
    }

    /// Removes the entries of `group` from `since` on.
    pub fn truncate(&self, group: &str, since: u64) {
        self.with_state(None, |st, size| {
            st.cut_from(group, since);
            let mut p = BytesMut::new();
            put_group(&mut p, group);
            p.put_u64(since);
            st.append(size, kind::TRUNCATE, &p);
        })
    }

    /// Removes the entries of `group` up to `upto`; `meta` (the last purged log id, in the
    /// caller's encoding) is returned by recovery.
    pub fn purge(&self, group: &str, upto: u64, meta: &[u8]) {
        self.with_state(None, |st, size| {
            if let Some(g) = st.groups.get_mut(group) {
                let keep = g.entries.split_off(&(upto + 1));
                let gone = std::mem::replace(&mut g.entries, keep);
                for seg in gone.into_values() {
                    st.kill_entry(seg);
                }
            }
            let mut p = BytesMut::new();
            put_group(&mut p, group);
            p.put_u64(upto);
            p.put_slice(meta);
            let p = p.freeze();
            let (seg, _) = st.append(size, kind::PURGE, &p);
            st.set_mark(group, MARK_PURGE, seg, p);
        })
    }

    /// Records the group's vote or committed log id; `flushed` runs once it is durable.
    pub fn save_meta(&self, group: &str, which: MetaKind, value: &[u8], flushed: Option<Flushed>) {
        self.with_state(flushed, |st, size| {
            let mut p = BytesMut::new();
            put_group(&mut p, group);
            p.put_u8(which as u8);
            p.put_slice(value);
            let p = p.freeze();
            let (seg, _) = st.append(size, kind::META, &p);
            st.set_mark(group, which as u8, seg, p);
        })
    }

    /// Forgets group `group` (its queue was deleted): recovery no longer returns anything it
    /// wrote before. `flushed` runs once that is durable.
    pub fn drop_group(&self, group: &str, flushed: Option<Flushed>) {
        self.with_state(flushed, |st, size| {
            if let Some(g) = st.groups.remove(group) {
                for seg in g.entries.into_values() {
                    st.kill_entry(seg);
                }
                for (mark, (seg, _)) in g.marks {
                    if let Some(s) = st.segs.get_mut(&seg) {
                        s.marks.retain(|(n, m)| !(n == group && *m == mark));
                    }
                }
            }
            let mut p = BytesMut::new();
            put_group(&mut p, group);
            st.append(size, kind::DROP, &p);
        })
    }

    /// Runs `flushed` once everything appended so far is durable.
    pub fn flush(&self, flushed: Flushed) {
        self.with_state(Some(flushed), |_, _| ())
    }

    /// True from a failed write until a retry succeeds: the log is not losing anything, but
    /// nothing appended meanwhile becomes durable either.
    pub fn is_failed(&self) -> bool {
        self.inner.failing.load(Ordering::Relaxed)
    }

    /// Number of segment files on disk.
    pub fn segment_count(&self) -> usize {
        segment_numbers(&self.inner.cfg.dir).len()
    }

    /// Writes and syncs what is pending, then stops the writer.
    pub fn close(&self) {
        self.inner.state.lock().shutdown = true;
        self.inner.wake_writer.notify_all();
        self.inner.wake_appenders.notify_all();
        if let Some(h) = self.writer.lock().take() {
            let _ = h.join();
        }
    }
}

fn segment_numbers(dir: &Path) -> Vec<u32> {
    let mut v: Vec<u32> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let name = e.file_name();
                    let name = name.to_str()?;
                    name.strip_suffix(".rlog")?.parse().ok()
                })
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

fn writer_loop(inner: Arc<Inner>) {
    let mut files: BTreeMap<u32, File> = BTreeMap::new();
    // A batch whose write failed, with its callbacks: written again, before anything newer.
    let mut retry: Option<(Vec<Chunk>, Vec<Flushed>)> = None;
    loop {
        let (batch, waiters) = {
            let mut st = inner.state.lock();
            match retry.take() {
                Some((mut batch, mut waiters)) => {
                    // Appends wake the writer; the retry still waits its second.
                    let deadline = Instant::now() + Duration::from_secs(1);
                    while !st.shutdown && Instant::now() < deadline {
                        let _ = inner.wake_writer.wait_until(&mut st, deadline);
                    }
                    batch.append(&mut st.pending);
                    waiters.append(&mut st.waiters);
                    st.pending_bytes = 0;
                    (batch, waiters)
                }
                None => {
                    while st.pending.is_empty() && st.waiters.is_empty() && !st.shutdown {
                        inner.wake_writer.wait(&mut st);
                    }
                    if st.pending.is_empty() && st.waiters.is_empty() && st.shutdown {
                        return;
                    }
                    st.pending_bytes = 0;
                    let batch = std::mem::take(&mut st.pending);
                    let waiters = std::mem::take(&mut st.waiters);
                    (batch, waiters)
                }
            }
        };
        inner.wake_appenders.notify_all();
        let end = batch.last().map(|(s, o, b)| (*s, *o + b.len() as u64));
        match write_batch(&inner.cfg.dir, &mut files, &batch) {
            Ok(()) => {
                {
                    let mut st = inner.state.lock();
                    if let Some(end) = end {
                        st.durable = end;
                    }
                    if st.failed.take().is_some() {
                        inner.failing.store(false, Ordering::Relaxed);
                        info!(dir = %inner.cfg.dir.display(), "raft log writes succeed again; the node's quorum queues resume");
                    }
                }
                for w in waiters {
                    w(true);
                }
                reclaim(&inner, &mut files);
            }
            Err(e) => {
                let shutdown = {
                    let mut st = inner.state.lock();
                    if st.failed.is_none() {
                        error!(error = %e, dir = %inner.cfg.dir.display(), "raft log write failed; the node's quorum queues refuse publishes and retry the write every second");
                    }
                    st.failed = Some(e.to_string());
                    inner.failing.store(true, Ordering::Relaxed);
                    st.shutdown
                };
                if shutdown {
                    // Stopping with the disk still failing: nothing more will be written.
                    for w in waiters {
                        w(false);
                    }
                    let mut st = inner.state.lock();
                    for w in std::mem::take(&mut st.waiters) {
                        w(false);
                    }
                    return;
                }
                retry = Some((batch, waiters));
            }
        }
    }
}

fn write_batch(
    dir: &Path,
    files: &mut BTreeMap<u32, File>,
    batch: &[(u32, u64, BytesMut)],
) -> std::io::Result<()> {
    let mut touched = Vec::new();
    for (seg, offset, bytes) in batch {
        if !files.contains_key(seg) {
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(segment_path(dir, *seg))?;
            // A new file's directory entry must survive a crash too.
            File::open(dir)?.sync_all()?;
            files.insert(*seg, f);
        }
        files[seg].write_all_at(bytes, *offset)?;
        if !touched.contains(seg) {
            touched.push(*seg);
        }
    }
    for seg in touched {
        files[&seg].sync_data()?;
    }
    Ok(())
}

/// Deletes the oldest segments that hold no live entry (after carrying their marks forward).
fn reclaim(inner: &Inner, files: &mut BTreeMap<u32, File>) {
    loop {
        let mut st = inner.state.lock();
        let head = st.segment;
        let Some((&oldest, seg)) = st.segs.iter().next() else {
            return;
        };
        if oldest == head || seg.live > 0 {
            return;
        }
        if let Some(until) = seg.carried_until {
            if until > st.durable {
                return;
            }
            if !seg.marks.is_empty() {
                // Marks set again meanwhile: carry those too.
                st.segs.get_mut(&oldest).expect("present").carried_until = None;
                continue;
            }
            st.segs.remove(&oldest);
            drop(st);
            files.remove(&oldest);
            if let Err(e) = std::fs::remove_file(segment_path(&inner.cfg.dir, oldest)) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn!(segment = oldest, error = %e, "cannot delete raft log segment");
                    return;
                }
            }
            continue;
        }
        let marks = std::mem::take(&mut st.segs.get_mut(&oldest).expect("present").marks);
        for (group, mark) in marks {
            let payload = st
                .groups
                .get(&group)
                .and_then(|g| g.marks.get(&mark))
                .map(|(_, p)| p.clone());
            if let Some(p) = payload {
                let kind = if mark == MARK_PURGE {
                    kind::PURGE
                } else {
                    kind::META
                };
                let size = inner.cfg.segment_size;
                let (at, _) = st.append(size, kind, &p);
                st.set_mark(&group, mark, at, p);
            }
        }
        let end = (st.segment, st.position);
        st.segs.get_mut(&oldest).expect("present").carried_until = Some(end);
        if end <= st.durable {
            continue;
        }
        drop(st);
        inner.wake_writer.notify_one();
        return;
    }
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn u64(&mut self) -> Option<u64> {
        let (h, t) = self.b.split_first_chunk::<8>()?;
        self.b = t;
        Some(u64::from_be_bytes(*h))
    }
    fn u8(&mut self) -> Option<u8> {
        let (h, t) = self.b.split_first()?;
        self.b = t;
        Some(*h)
    }
    fn group(&mut self) -> Option<String> {
        let (h, t) = self.b.split_first_chunk::<2>()?;
        let n = usize::from(u16::from_be_bytes(*h));
        if t.len() < n {
            return None;
        }
        let (g, rest) = t.split_at(n);
        self.b = rest;
        String::from_utf8(g.to_vec()).ok()
    }
}

/// Scans the segments; returns what each group holds and the writer's state.
fn recover(dir: &Path) -> std::io::Result<(HashMap<String, GroupLog>, State)> {
    let numbers = segment_numbers(dir);
    let mut groups: HashMap<String, GroupLog> = HashMap::new();
    let mut state = State {
        segment: numbers.last().map_or(1, |n| n + 1),
        position: 0,
        pending: Vec::new(),
        pending_bytes: 0,
        waiters: Vec::new(),
        segs: BTreeMap::new(),
        groups: HashMap::new(),
        failed: None,
        shutdown: false,
        durable: (0, 0),
    };
    let mut cut: Option<u32> = None;
    for &n in &numbers {
        let path = segment_path(dir, n);
        if cut.is_some() {
            warn!(segment = n, "raft log segment after a torn record removed");
            std::fs::remove_file(&path)?;
            continue;
        }
        let data = std::fs::read(&path)?;
        state.segs.entry(n).or_default();
        let mut off = 0usize;
        while off < data.len() {
            let Some(len) = read_record(&data[off..]) else {
                warn!(
                    segment = n,
                    offset = off,
                    "raft log ends in a torn record; cut there"
                );
                let f = OpenOptions::new().write(true).open(&path)?;
                f.set_len(off as u64)?;
                f.sync_all()?;
                cut = Some(n);
                break;
            };
            let kind = data[off + 8];
            let payload = &data[off + 9..off + 8 + len];
            apply_record(&mut groups, &mut state, n, kind, payload);
            off += 8 + len;
        }
    }
    // Everything recovered is durable; new records start a new segment.
    state.segs.entry(state.segment).or_default();
    state.durable = (state.segment, 0);
    Ok((groups, state))
}

/// Checks the record at the start of `b`; returns its length after the 8-byte header.
fn read_record(b: &[u8]) -> Option<usize> {
    let (h, rest) = b.split_first_chunk::<8>()?;
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let crc = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    if len == 0 || rest.len() < len || crc32c::crc32c(&rest[..len]) != crc {
        return None;
    }
    Some(len)
}

fn apply_record(
    groups: &mut HashMap<String, GroupLog>,
    st: &mut State,
    seg: u32,
    kind: u8,
    payload: &[u8],
) {
    let mut r = Reader { b: payload };
    let Some(group) = r.group() else {
        warn!(segment = seg, "raft log record without a group skipped");
        return;
    };
    match kind {
        kind::ENTRY => {
            let Some(index) = r.u64() else { return };
            st.cut_from(&group, index);
            let g = groups.entry(group.clone()).or_default();
            g.entries.split_off(&index);
            g.entries.insert(index, Bytes::copy_from_slice(r.b));
            st.segs.entry(seg).or_default().live += 1;
            st.groups
                .entry(group)
                .or_default()
                .entries
                .insert(index, seg);
        }
        kind::TRUNCATE => {
            let Some(since) = r.u64() else { return };
            st.cut_from(&group, since);
            if let Some(g) = groups.get_mut(&group) {
                g.entries.split_off(&since);
            }
        }
        kind::PURGE => {
            let Some(upto) = r.u64() else { return };
            if let Some(g) = st.groups.get_mut(&group) {
                let keep = g.entries.split_off(&(upto + 1));
                let gone = std::mem::replace(&mut g.entries, keep);
                for s in gone.into_values() {
                    st.kill_entry(s);
                }
            }
            let g = groups.entry(group.clone()).or_default();
            g.entries = g.entries.split_off(&(upto + 1));
            g.purged = Some((upto, Bytes::copy_from_slice(r.b)));
            st.set_mark(&group, MARK_PURGE, seg, Bytes::copy_from_slice(payload));
        }
        kind::META => {
            let Some(which) = r.u8() else { return };
            let value = Bytes::copy_from_slice(r.b);
            let g = groups.entry(group.clone()).or_default();
            match which {
                1 => g.vote = Some(value),
                2 => g.committed = Some(value),
                _ => return,
            }
            st.set_mark(&group, which, seg, Bytes::copy_from_slice(payload));
        }
        kind::DROP => {
            groups.remove(&group);
            if let Some(g) = st.groups.remove(&group) {
                for s in g.entries.into_values() {
                    st.kill_entry(s);
                }
                for (mark, (s, _)) in g.marks {
                    if let Some(x) = st.segs.get_mut(&s) {
                        x.marks.retain(|(n, m)| !(n == &group && *m == mark));
                    }
                }
            }
        }
        other => warn!(
            segment = seg,
            kind = other,
            "unknown raft log record skipped"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path) -> RaftLogConfig {
        RaftLogConfig {
            dir: dir.to_path_buf(),
            segment_size: 4096,
            max_batch_bytes: 1 << 20,
        }
    }

    fn wait(log: &RaftLog) {
        let (tx, rx) = std::sync::mpsc::channel();
        log.flush(Box::new(move |ok| {
            let _ = tx.send(ok);
        }));
        assert!(rx.recv().unwrap());
    }

    fn entries(from: u64, to: u64, tag: &str) -> Vec<(u64, Bytes)> {
        (from..=to)
            .map(|i| (i, Bytes::from(format!("{tag}{i}"))))
            .collect()
    }

    #[test]
    fn entries_marks_truncation_and_purge_survive_a_restart() {
        let dir = tempdir();
        {
            let (log, groups) = RaftLog::open(cfg(&dir)).unwrap();
            assert!(groups.is_empty());
            log.append("a", &entries(1, 10, "x"), None);
            log.append("b", &entries(1, 3, "y"), None);
            log.save_meta("a", MetaKind::Vote, b"vote-a", None);
            // A conflicting suffix replaced from 8 on, then an explicit truncation.
            log.append("a", &entries(8, 9, "z"), None);
            log.truncate("b", 3);
            log.purge("a", 4, b"p4");
            wait(&log);
            log.close();
        }
        let (log, groups) = RaftLog::open(cfg(&dir)).unwrap();
        let a = &groups["a"];
        let idx: Vec<u64> = a.entries.keys().copied().collect();
        assert_eq!(idx, vec![5, 6, 7, 8, 9]);
        assert_eq!(&a.entries[&8][..], b"z8");
        assert_eq!(a.vote.as_deref(), Some(&b"vote-a"[..]));
        assert_eq!(
            a.purged.as_ref().map(|(u, m)| (*u, &m[..])),
            Some((4, &b"p4"[..]))
        );
        assert_eq!(groups["b"].entries.len(), 2);
        log.drop_group("b", None);
        wait(&log);
        log.close();
        let (_log, groups) = RaftLog::open(cfg(&dir)).unwrap();
        assert!(!groups.contains_key("b"));
        assert_eq!(groups["a"].entries.len(), 5);
    }

    #[test]
    fn a_torn_tail_is_cut_off() {
        let dir = tempdir();
        {
            let (log, _) = RaftLog::open(cfg(&dir)).unwrap();
            log.append("a", &entries(1, 5, "x"), None);
            wait(&log);
            log.close();
        }
        let seg = segment_numbers(&dir)[0];
        let path = segment_path(&dir, seg);
        let len = std::fs::metadata(&path).unwrap().len();
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 3).unwrap();
        let (_log, groups) = RaftLog::open(cfg(&dir)).unwrap();
        assert_eq!(groups["a"].entries.len(), 4, "the torn fifth entry is gone");
    }

    #[test]
    fn purged_segments_are_deleted_and_marks_carried_forward() {
        let dir = tempdir();
        let (log, _) = RaftLog::open(cfg(&dir)).unwrap();
        log.save_meta("a", MetaKind::Vote, b"v1", None);
        let big = Bytes::from(vec![7u8; 1000]);
        for i in 1..=40u64 {
            log.append("a", &[(i, big.clone())], None);
        }
        wait(&log);
        assert!(log.segment_count() >= 8);
        log.purge("a", 38, b"p");
        wait(&log);
        // The carried marks are written by the next round, then the files go.
        wait(&log);
        wait(&log);
        assert!(
            log.segment_count() <= 3,
            "{} segments left",
            log.segment_count()
        );
        log.close();
        let (_log, groups) = RaftLog::open(cfg(&dir)).unwrap();
        let a = &groups["a"];
        assert_eq!(a.vote.as_deref(), Some(&b"v1"[..]));
        assert_eq!(a.entries.keys().copied().collect::<Vec<_>>(), vec![39, 40]);
        assert_eq!(a.purged.as_ref().map(|(u, _)| *u), Some(38));
    }

    fn tempdir() -> PathBuf {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let d = std::env::temp_dir().join(format!(
            "warren-raftlog-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }
}
