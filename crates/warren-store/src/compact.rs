//! Compaction: a segment whose records are mostly settled is rewritten as copies of its live
//! records at the head of the log, then deleted, so that disk use follows what is stored and
//! one long-unacknowledged message does not keep every segment after it.
//!
//! The compactor is a thread of its own; the writer's group commit goes on meanwhile. It
//! deletes fully settled segments as soon as they may go, and every `compact_quiet / 4`
//! (at most 1 s) it looks for segments whose live records take less than `compact_ratio` of
//! the file and whose live count has not changed for `compact_quiet`.
//!
//! Which records of a segment T are live comes from the log itself, as recovery would see it:
//! T's `PUBLISH` / `TRANSIENT` records, minus every `ACK` record that targets one of them (in T
//! or in a later segment whose `ACK` records reach back to T). Steps:
//!
//! 1. Under the state lock: note the log's end (the cut) and start a watch on T, which records
//!    every pair settled in T from now on. Wait until the writer has written up to the cut.
//! 2. Without the lock: scan T and the later segments up to the cut; what is left is live.
//!    If it is more than the ratio allows, stop here (nothing was written).
//! 3. In batches under the lock: minus what the watch caught, append each live record as a
//!    `PUBLISH_AT` copy listing the queues still holding it (a transient page as a
//!    `TRANSIENT_AT` copy), move its pairs to the head, and note where it went (the `moved`
//!    map resolves the location queues know it by, so ready lists, spill files and unacked
//!    entries need no update). `ACK` records of T that settle something in an older surviving
//!    segment are appended again as they are, and a queue's latest `DELIVERED` record too.
//! 4. Wait for the fsync covering the copies, then delete T.
//!
//! From step 3 on, the copied pairs count in the copies' segment, not in T, which may look
//! settled; what keeps it is that it is marked as taken over up to the log's end after the
//! copies (and after the `ACK` and `DELIVERED` records of step 3): no deletion pass removes
//! it before the writer has made the log durable up to there. So a compaction that stops before step 4's fsync
//! (a write fails, the store shuts down or crashes) leaves T on disk until the copies are.
//!
//! Crash safety: recovery lets a newer copy of a message replace an older one, with the
//! queues it lists. A crash before step 4's fsync leaves T as it was (a torn or partial copy
//! is truncated or replaced by nothing). After it, both may exist: the copy wins, and the
//! pairs settled before it are not in it because every `ACK` before the copy in the log was
//! either scanned (before the cut) or caught by the watch (after it); `ACK` records after the
//! copy settle the copy. After step 4 only the copy exists. Nothing acknowledged returns, and
//! nothing is duplicated, at any step (`tests/compaction.rs` crashes at each of them).

use crate::record::{self, AckTarget, Record, HEADER_LEN};
use crate::{append_locked, decode_at, segment_path, Completion, Inner, Moved, StoreError, Watch};
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// A step of compacting one segment, reported to [`crate::StoreConfig::compaction_hook`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionStep {
    /// The segment's live records are known; nothing has been written.
    Scanned(u32),
    /// Their copies are appended, not necessarily written yet.
    Copied(u32),
    /// The copies are fsynced; the segment file still exists.
    Synced(u32),
    /// The segment file is deleted.
    Deleted(u32),
}

/// Most bytes of copies appended under one hold of the state lock.
const BATCH_BYTES: usize = 1 << 20;

/// A record of the segment being compacted that may still be live.
struct Candidate {
    offset: u64,
    len: u32,
    /// Queues still holding it (`""` for a transient page).
    queues: Vec<String>,
    transient: bool,
}

/// Completes once the writer has covered everything appended before it.
struct Barrier {
    done: Mutex<Option<bool>>,
    cv: Condvar,
}

impl Completion for Barrier {
    fn complete(&self, _tokens: &[u64], ok: bool) {
        *self.done.lock() = Some(ok);
        self.cv.notify_all();
    }
}

impl Barrier {
    fn new() -> Arc<Barrier> {
        Arc::new(Barrier {
            done: Mutex::new(None),
            cv: Condvar::new(),
        })
    }

    fn wait(&self) -> bool {
        let mut d = self.done.lock();
        while d.is_none() {
            self.cv.wait(&mut d);
        }
        d.unwrap_or(false)
    }
}

pub(crate) fn compactor_loop(inner: Arc<Inner>) {
    let quiet = inner.cfg.compact_quiet;
    let interval = (quiet / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut next_pass = Instant::now() + interval;
    loop {
        {
            let mut poked = inner.compactor_poked.lock();
            while !*poked && Instant::now() < next_pass {
                inner.wake_compactor.wait_until(&mut poked, next_pass);
            }
            *poked = false;
        }
        if inner.state.lock().shutdown {
            return;
        }
        inner.delete_settled();
        if Instant::now() >= next_pass {
            next_pass = Instant::now() + interval;
            for seg in candidates(&inner) {
                if inner.state.lock().shutdown {
                    return;
                }
                if let Err(e) = compact(&inner, seg) {
                    warn!(segment = seg, error = %e, "segment compaction failed");
                }
                inner.delete_settled();
            }
        }
        // Deletion passes cost a walk over the segments: at most a hundred a second.
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Segments worth compacting now, oldest first. A settled segment is one whenever it holds
/// `ACK` records or a `DELIVERED` mark still needed, even with compaction off (ratio 0):
/// otherwise each settled segment whose `ACK` records reach back into the one before it
/// would keep the next one too, and one live message would pin every segment after it.
/// Only the records still needed are copied; no live message is.
fn candidates(inner: &Inner) -> Vec<u32> {
    let cfg = &inner.cfg;
    let mut st = inner.state.lock();
    if st.failed.is_some() {
        return Vec::new();
    }
    let compacting = cfg.compact_ratio > 0.0;
    let now = Instant::now();
    for s in st.live.values_mut() {
        if s.pairs != s.seen_pairs {
            s.seen_pairs = s.pairs;
            s.quiet_since = now;
        }
    }
    let unwritten = st.unwritten();
    let marked: HashSet<u32> = st.marks.values().map(|m| m.1).collect();
    let mut out = Vec::new();
    for (&seg, s) in &st.live {
        if seg >= st.segment || unwritten.contains(&seg) {
            continue;
        }
        let needs_acks = st.needs_acks(seg);
        if s.legacy && needs_acks {
            // First-format ACK records cannot be told apart: wait for what they settle to go.
            continue;
        }
        if s.pairs == 0 {
            // Settled, but holds ACK records or a DELIVERED mark that must be copied first.
            if needs_acks || marked.contains(&seg) {
                out.push(seg);
            }
            continue;
        }
        if compacting
            && now.duration_since(s.quiet_since) >= cfg.compact_quiet
            && s.checked_pairs != Some(s.pairs)
            && (s.live_bytes as f64) < cfg.compact_ratio * s.bytes as f64
        {
            out.push(seg);
        }
    }
    out
}

/// Reads the records of segment `seg` in order, up to `upto` bytes (the whole file if
/// `None`), calling `f(offset, length, record)` for each one that decodes. A record that does
/// not decode is skipped; a torn tail ends the scan.
fn scan(
    inner: &Inner,
    seg: u32,
    upto: Option<u64>,
    mut f: impl FnMut(u64, u32, Record),
) -> Result<(), StoreError> {
    let file = File::open(segment_path(&inner.cfg.dir, seg))?;
    let end = upto.unwrap_or(file.metadata()?.len());
    let mut rd = BufReader::with_capacity(1 << 20, file);
    let mut offset = 0u64;
    let mut header = [0u8; HEADER_LEN];
    let mut body = Vec::new();
    while offset + HEADER_LEN as u64 <= end {
        rd.read_exact(&mut header)?;
        let (len, crc) = record::header_fields(&header);
        let next = offset + HEADER_LEN as u64 + u64::from(len);
        if len == 0 || next > end {
            break;
        }
        body.resize(len as usize, 0);
        rd.read_exact(&mut body)?;
        match record::decode(&body, crc) {
            Ok(r) => f(offset, len + HEADER_LEN as u32, r),
            Err(e) => debug!(segment = seg, offset, error = %e, "compaction skips a bad record"),
        }
        offset = next;
    }
    Ok(())
}

fn remove_one(queues: &mut Vec<String>, queue: &str) {
    if let Some(i) = queues.iter().position(|q| q == queue) {
        queues.swap_remove(i);
    }
}

fn hook(inner: &Inner, step: CompactionStep) {
    if let Some(h) = &inner.cfg.compaction_hook {
        (h.0)(step);
    }
}

/// Ends the watch on a segment however its compaction ends (drop it with no lock held).
struct WatchGuard<'a>(&'a Inner, u32);

impl Drop for WatchGuard<'_> {
    fn drop(&mut self) {
        let mut st = self.0.state.lock();
        if st.watch.as_ref().is_some_and(|w| w.segment == self.1) {
            st.watch = None;
        }
    }
}

/// Compacts segment `t` (see the module docs). Returns false when it stopped before deleting
/// it (not worth it, or the store is failing or shutting down).
fn compact(inner: &Arc<Inner>, t: u32) -> Result<bool, StoreError> {
    let _watch = WatchGuard(inner, t);
    // 1. Cut and watch.
    let barrier = Barrier::new();
    let (cut_seg, cut_pos, later, superseded, first_segment, older) = {
        let mut st = inner.state.lock();
        if st.failed.is_some() || st.shutdown || t >= st.segment {
            return Ok(false);
        }
        let Some(s) = st.live.get(&t) else {
            return Ok(false);
        };
        if s.pairs == 0 && !st.needs_acks(t) {
            // Nothing live and no ACK record needed: only DELIVERED marks to carry forward,
            // no need to read the segment.
            drop(st);
            return finish(inner, t, Vec::new(), 0, 0);
        }
        st.watch = Some(Watch {
            segment: t,
            settled: HashMap::new(),
        });
        st.waiters.push((barrier.clone(), 0));
        let later: Vec<u32> = st
            .live
            .range(t + 1..)
            .filter(|(_, s)| s.ack_floor <= t)
            .map(|(&seg, _)| seg)
            .collect();
        let superseded: HashSet<u64> = st
            .superseded
            .iter()
            .filter(|(seg, _)| *seg == t)
            .map(|(_, off)| *off)
            .collect();
        let older: BTreeSet<u32> = st.live.range(..t).map(|(&seg, _)| seg).collect();
        (
            st.segment,
            st.position,
            later,
            superseded,
            st.first_segment,
            older,
        )
    };
    inner.wake_writer.notify_one();
    if !barrier.wait() {
        return Ok(false);
    }

    // 2. What is live in t, as of the cut.
    let mut cands: Vec<Candidate> = Vec::new();
    let mut by_offset: HashMap<u64, usize> = HashMap::new();
    let mut by_id: HashMap<u64, usize> = HashMap::new();
    // ACK records of t that settle a message with a copy in an older segment that still
    // exists: (offset, len, segment of the oldest copy).
    let mut acks: Vec<(u64, u32, u32)> = Vec::new();
    let settle = |cands: &mut Vec<Candidate>,
                  by_offset: &HashMap<u64, usize>,
                  by_id: &HashMap<u64, usize>,
                  at: u64,
                  id: u64,
                  queue: &str,
                  target: Option<AckTarget>| {
        let i = match target {
            Some(a) if a.segment == t => by_offset.get(&a.offset),
            Some(_) => None,
            // A first-format ACK names only the message: it settles the record with that id
            // if the record came before it.
            None => by_id
                .get(&id)
                .filter(|&&i| cands[i].offset < at || at == u64::MAX),
        };
        if let Some(&i) = i {
            remove_one(&mut cands[i].queues, queue);
        }
    };
    let scanned = scan(inner, t, None, |offset, len, rec| match rec {
        Record::Publish {
            message,
            queues,
            transient,
        } => {
            if superseded.contains(&offset) || (transient && t < first_segment) {
                return;
            }
            let queues = if transient {
                vec![String::new()]
            } else {
                queues
            };
            if queues.is_empty() {
                return;
            }
            by_offset.insert(offset, cands.len());
            if !transient {
                by_id.insert(message.id, cands.len());
            }
            cands.push(Candidate {
                offset,
                len,
                queues,
                transient,
            });
        }
        Record::Ack { id, queue, target } => {
            if let Some(a) = target.filter(|a| older.range(a.origin..).next().is_some()) {
                acks.push((offset, len, a.origin));
            }
            settle(&mut cands, &by_offset, &by_id, offset, id, &queue, target);
        }
        Record::Delivered { .. } => {}
    });
    scanned?;
    for &seg in later.iter().filter(|&&s| s <= cut_seg) {
        let upto = (seg == cut_seg).then_some(cut_pos);
        let scanned = scan(inner, seg, upto, |_, _, rec| {
            if let Record::Ack { id, queue, target } = rec {
                settle(&mut cands, &by_offset, &by_id, u64::MAX, id, &queue, target);
            }
        });
        scanned?;
    }
    cands.retain(|c| !c.queues.is_empty());
    let live_bytes: u64 = cands.iter().map(|c| u64::from(c.len)).sum::<u64>()
        + acks.iter().map(|a| u64::from(a.1)).sum::<u64>();
    {
        let mut st = inner.state.lock();
        let Some(s) = st.live.get_mut(&t) else {
            return Ok(false);
        };
        if s.pairs > 0 && live_bytes as f64 >= inner.cfg.compact_ratio * s.bytes as f64 {
            // The estimate was off (messages routed to several queues count once per queue):
            // look again only once more of it is settled.
            s.checked_pairs = Some(s.pairs);
            return Ok(false);
        }
        if s.pairs == 0 && !cands.is_empty() {
            // Memory, which knows what queues hold, says nothing here is live.
            warn!(
                segment = t,
                records = cands.len(),
                "records without a settlement in the log; not copying them"
            );
            cands.clear();
        }
    }
    let file = File::open(segment_path(&inner.cfg.dir, t))?;
    let read_raw = |offset: u64, len: u32| -> Result<Vec<u8>, StoreError> {
        let mut raw = vec![0u8; len as usize];
        file.read_exact_at(&mut raw, offset)?;
        Ok(raw)
    };
    hook(inner, CompactionStep::Scanned(t));

    // 3. Copies, in batches under the lock.
    let forwarded: HashMap<u64, (u32, u64)> = {
        let st = inner.state.lock();
        st.moved
            .iter()
            .filter(|(_, m)| m.to.segment == t)
            .map(|(&key, m)| (m.to.offset, key))
            .collect()
    };
    let (mut moved_records, mut moved_bytes) = (0u64, 0u64);
    let mut i = 0;
    while i < cands.len() {
        // Read a batch without the lock.
        let mut batch = Vec::new();
        let mut size = 0usize;
        while i < cands.len() && (batch.is_empty() || size < BATCH_BYTES) {
            let c = &cands[i];
            let raw = read_raw(c.offset, c.len)?;
            let loc = crate::Location {
                segment: t,
                offset: c.offset,
                len: c.len,
            };
            match decode_at(&raw, loc) {
                Ok(m) => {
                    size += raw.len();
                    batch.push((i, m));
                }
                Err(e) => {
                    // Recovery would drop it too: nothing to copy.
                    warn!(segment = t, offset = c.offset, error = %e, "compaction drops an unreadable record");
                }
            }
            i += 1;
        }
        let mut st = inner.state.lock();
        while st.pending_bytes >= inner.cfg.max_batch_bytes && st.failed.is_none() && !st.shutdown {
            inner.wake_appenders.wait(&mut st);
        }
        if st.failed.is_some() || st.shutdown {
            // What was copied so far stays copied (and forwarded); t keeps the rest.
            return Ok(false);
        }
        for (ci, m) in batch {
            let c = &mut cands[ci];
            if let Some(gone) = st.watch.as_mut().and_then(|w| w.settled.remove(&c.offset)) {
                for q in gone {
                    remove_one(&mut c.queues, &q);
                }
            }
            if c.queues.is_empty() {
                continue;
            }
            let n = c.queues.len();
            let names: Vec<&str> = c.queues.iter().map(String::as_str).collect();
            let names: &[&str] = if c.transient { &[] } else { &names };
            let to = append_locked(&mut st, inner.cfg.segment_size, n as i64, |buf| {
                record::encode_publish(
                    buf,
                    m.id,
                    &m.exchange,
                    &m.routing_key,
                    &m.properties,
                    &m.body,
                    m.enqueued_ms.unwrap_or(0),
                    names,
                    c.transient,
                )
            });
            if let Some(s) = st.live.get_mut(&t) {
                s.pairs -= n as i64;
                s.live_bytes -= n as i64 * i64::from(c.len);
            }
            // Should this compaction stop before t is deleted, a later one must skip it.
            st.superseded.insert((t, c.offset));
            let key = forwarded.get(&c.offset).copied().unwrap_or((t, c.offset));
            st.moved.insert(
                key,
                Moved {
                    to,
                    pairs: n as u32,
                },
            );
            moved_records += 1;
            moved_bytes += u64::from(to.len);
        }
        // The copies took t's pairs: t must stay until they are durable, even if this
        // compaction stops before its fsync (the store fails, or is shut down).
        st.replaced_up_to_here(t);
        drop(st);
        inner.wake_writer.notify_one();
    }
    // ACK records still needed, DELIVERED marks, then the barrier for all of it.
    let mut raws = Vec::new();
    for &(offset, len, seg) in &acks {
        raws.push((seg, read_raw(offset, len)?));
    }
    finish(inner, t, raws, moved_records, moved_bytes)
}

/// The end of compacting `t`: appends the `ACK` records still needed (`raws`: segment of the
/// oldest copy of what each settles, and the record) and the `DELIVERED` marks held by `t`,
/// waits for their fsync and deletes `t`.
fn finish(
    inner: &Arc<Inner>,
    t: u32,
    raws: Vec<(u32, Vec<u8>)>,
    moved_records: u64,
    moved_bytes: u64,
) -> Result<bool, StoreError> {
    let synced = Barrier::new();
    {
        let mut st = inner.state.lock();
        if st.shutdown {
            return Ok(false);
        }
        for (origin, raw) in raws {
            if st.live.range(origin..t).next().is_none() {
                continue;
            }
            let at = append_locked(&mut st, inner.cfg.segment_size, 0, |buf| {
                buf.extend_from_slice(&raw)
            });
            if let Some(s) = st.live.get_mut(&at.segment) {
                s.ack_floor = s.ack_floor.min(origin);
            }
        }
        let marks: Vec<(String, u64)> = st
            .marks
            .iter()
            .filter(|(_, m)| m.1 == t)
            .map(|(q, m)| (q.clone(), m.0))
            .collect();
        for (queue, id) in marks {
            let at = append_locked(&mut st, inner.cfg.segment_size, 0, |buf| {
                record::encode_queue_event(buf, record::kind::DELIVERED, id, &queue)
            });
            st.marks.insert(queue, (id, at.segment));
        }
        // No longer marked, and perhaps nothing live left: t must stay until all of this
        // is durable, even if the fsync below never comes.
        st.replaced_up_to_here(t);
        st.watch = None;
        st.waiters.push((synced.clone(), 0));
    }
    inner.wake_writer.notify_one();
    hook(inner, CompactionStep::Copied(t));

    // 4. Once the copies are on disk, t goes.
    if !synced.wait() {
        return Ok(false);
    }
    hook(inner, CompactionStep::Synced(t));
    {
        let mut st = inner.state.lock();
        let pairs = st.live.get(&t).map_or(0, |s| s.pairs);
        debug_assert!(
            st.replacement_durable(t),
            "copies of {t} synced, not durable"
        );
        if pairs != 0 {
            warn!(
                segment = t,
                pairs, "compacted segment still counts live pairs; keeping it"
            );
            return Ok(true);
        }
        st.live.remove(&t);
        st.superseded.retain(|(seg, _)| *seg != t);
    }
    inner.delete_files(&[t]);
    inner
        .stats
        .compactions
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    hook(inner, CompactionStep::Deleted(t));
    if moved_records > 0 {
        info!(
            segment = t,
            records = moved_records,
            bytes = moved_bytes,
            "compacted segment"
        );
    } else {
        debug!(
            segment = t,
            "deleted segment after carrying its records forward"
        );
    }
    Ok(true)
}
