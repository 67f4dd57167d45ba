//! Crash recovery: scan every segment in order, validate each record, rebuild which messages
//! are still live in which queue.
//!
//! - A record cut short at the end of a segment (a torn write) is truncated away, with a
//!   warning.
//! - A record whose CRC does not match is skipped and counted; scanning continues after it.
//! - A length field that cannot be right (past the end of the file is a torn tail; larger than
//!   any record could be) ends the scan of the last segment: the rest is cut off and reported.
//!   In an older segment, written no more, such bytes are damage: the scan steps to the next
//!   record that reads back whole (its length fits, its kind is known, its id is plausible,
//!   its checksum matches and it decodes) and reports the bytes skipped; so it does after a record that does not
//!   decode and is not followed by a whole record where its length says it ends (its length
//!   was damaged). Only when no whole record follows is the rest cut off.
//! - Zeros from a record boundary to the end of the last segment, when its length is a
//!   multiple of `PREALLOCATE` (or the segment size), are what the writer writes ahead of its
//!   records, left by a crash: they are cut off quietly, and not counted as truncated. (Records
//!   that a failing disk turned into zeros there cannot be told from them.) A record that
//!   does not decode with only such zeros after it was torn by the crash: it is cut off with
//!   them, as a torn tail. Anything else after a zero header is a torn tail too.
//! - A gap in segment numbers (a missing file) is reported, unless the store recorded deleting
//!   that segment itself (see the `deleted` module); everything else is served.
//!
//! Compaction copies live messages forward: a `PUBLISH` record with an id seen before is a
//! newer copy and replaces the older one, with the queues it lists (the ones that had not
//! settled the message when the copy was written; later `ACK` records settle the copy). An
//! older copy left behind by a crash is reported as superseded, and the message is handed out
//! by the location of its oldest copy (resolved to the newest), so that the `ACK` records
//! settling it stay needed as long as any copy survives.
//!
//! Work and memory grow linearly with what is on disk: one pass, one map entry per live
//! message (24 bytes each, see `Live`). Segments are read and checked on several threads (at
//! most [`SCAN_THREADS`]), which hand their records on in chunks, at most a few chunks ahead;
//! the calling thread applies them in segment order, so the outcome is the one a single pass
//! in order gives.

use crate::record::{self, Record, Scanned, HEADER_LEN};
use crate::{segment_path, Location, Moved, Seg};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Largest record recovery accepts as plausible (bigger lengths are corruption).
const MAX_RECORD: u32 = 1 << 30;

/// Most threads that scan segments at once (at most the machine's cores).
const SCAN_THREADS: usize = 4;

/// One recovered message of a queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveredEntry {
    /// Message id (queue order).
    pub id: u64,
    /// Where its `PUBLISH` record is: the oldest copy still on disk, which the store
    /// resolves to the newest.
    pub location: Location,
    /// It had been delivered from this queue before the restart.
    pub redelivered: bool,
    /// Its `priority` property (0 when absent), for priority queues to page it by level.
    pub priority: u8,
}

impl From<RecoveredEntry> for crate::spill::SpillEntry {
    /// The queue entry of a recovered message: at its id's place in the queue, persistent.
    fn from(e: RecoveredEntry) -> Self {
        crate::spill::SpillEntry {
            seq: e.id,
            id: e.id,
            location: e.location,
            redelivered: e.redelivered,
            transient: false,
            priority: e.priority,
        }
    }
}

/// What recovery did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Segment files scanned.
    pub segments: usize,
    /// Records read successfully.
    pub records: u64,
    /// Live (message, queue) pairs recovered.
    pub messages: u64,
    /// Bytes cut off torn or unreadable segment tails.
    pub truncated_bytes: u64,
    /// Records skipped for a bad checksum or malformed payload.
    pub corrupt_records: u64,
    /// Segment numbers missing between the first and the last segment.
    pub missing_segments: Vec<u32>,
    /// Time the scan took.
    pub duration: Duration,
}

pub(crate) struct RecoveryResult {
    pub queues: HashMap<String, Vec<RecoveredEntry>>,
    pub report: RecoveryReport,
    pub segs: BTreeMap<u32, Seg>,
    pub next_id: u64,
    pub last_segment: u32,
    /// Per queue: the highest `DELIVERED` id and the segment of the record that says so.
    pub marks: HashMap<String, (u64, u32)>,
    /// Records replaced by a newer copy (segment, offset).
    pub superseded: HashSet<(u32, u64)>,
    /// Messages with older copies still on disk: oldest copy → newest.
    pub moved: HashMap<(u32, u64), Moved>,
}

/// A live message as the segments merged so far leave it: 24 bytes, so that the map of
/// millions of them stays small.
struct Live {
    /// The newest copy (the oldest, when older copies survive, is in [`Merge::first`]).
    location: Location,
    /// The queues still holding it: one queue index, or with [`MANY`] set the index of their
    /// list in [`Merge::lists`].
    queues: u32,
    priority: u8,
}

/// Marks [`Live::queues`] as the index of a list of queues.
const MANY: u32 = 1 << 31;

/// True when a record that reads back whole starts at `at` of `rest` (a segment's bytes from
/// some offset on): its length fits, its kind is known, its id is one the store could have
/// given (below 2^48: ids count from 1), its checksum matches and it decodes. The cheap tests
/// come first, so that a search through damaged bytes seldom computes a checksum.
fn reads_whole(rest: &[u8], at: usize) -> bool {
    let Some(start) = rest.get(at..at + HEADER_LEN + 9) else {
        return false;
    };
    let (header, kind_and_id) = start.split_at(HEADER_LEN);
    let (len, crc) = record::header_fields(header.try_into().unwrap_or(&[0; HEADER_LEN]));
    let id = u64::from_be_bytes(kind_and_id[1..].try_into().unwrap_or([0xff; 8]));
    let body = at + HEADER_LEN;
    len > 8
        && len <= MAX_RECORD
        && body + len as usize <= rest.len()
        && record::is_kind(kind_and_id[0])
        && id < 1 << 48
        && record::scan(&rest[body..body + len as usize], crc).is_ok()
}

/// Whether a record that reads back whole starts at `at` of `file` (`file_len` bytes long).
fn whole_record_at(file: &File, at: u64, file_len: u64) -> std::io::Result<bool> {
    let mut header = [0u8; HEADER_LEN];
    if at + HEADER_LEN as u64 > file_len {
        return Ok(false);
    }
    file.read_exact_at(&mut header, at)?;
    // What the header says, as far as the file and `MAX_RECORD` go: `reads_whole` judges it.
    let len = u64::from(record::header_fields(&header).0)
        .min(u64::from(MAX_RECORD))
        .min(file_len - at - HEADER_LEN as u64);
    let mut bytes = vec![0u8; HEADER_LEN + len as usize];
    file.read_exact_at(&mut bytes, at)?;
    Ok(reads_whole(&bytes, 0))
}

/// Where the first record that reads back whole starts in `file` (`file_len` bytes long) at
/// or after `from`, if one does: how recovery steps over damaged bytes in a segment written
/// no more. Reads the rest of the segment into memory (at most a segment's size), only when
/// a segment is damaged.
fn next_whole_record(file: &File, from: u64, file_len: u64) -> std::io::Result<Option<u64>> {
    if from >= file_len {
        return Ok(None);
    }
    let mut rest = vec![0u8; (file_len - from) as usize];
    file.read_exact_at(&mut rest, from)?;
    Ok((0..rest.len())
        .find(|&at| reads_whole(&rest, at))
        .map(|at| from + at as u64))
}

/// Reads the next `n` bytes of `rd`: true when all are zero.
fn rest_is_zero(rd: &mut impl Read, n: u64) -> std::io::Result<bool> {
    let mut buf = [0u8; 64 * 1024];
    let mut left = n;
    while left > 0 {
        let chunk = left.min(buf.len() as u64) as usize;
        rd.read_exact(&mut buf[..chunk])?;
        if buf[..chunk].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        left -= chunk as u64;
    }
    Ok(true)
}

/// Events in a [`Chunk`]: what a scanning thread hands the merge at a time.
const CHUNK_EVENTS: usize = 16 * 1024;

/// Chunks a scanning thread may have waiting for the merge (with the one it is filling, this
/// bounds what recovery holds beyond its map: about 4 MiB a thread).
const CHUNKS_AHEAD: usize = 4;

/// One record's effect as scanning its segment finds it, queue names given as indexes into
/// that segment's table of names (see [`Chunk::names`]).
enum Event {
    /// A persistent copy of message `id` held by the queues `queues` (a range of its chunk's
    /// [`Chunk::queue_lists`]).
    Publish {
        id: u64,
        location: Location,
        queues: std::ops::Range<u32>,
        priority: u8,
    },
    /// Message `id` settled by `queue`; `origin` is the segment of its oldest copy that may
    /// still exist (`None` for the first format's `ACK`).
    Ack {
        id: u64,
        queue: u32,
        origin: Option<u32>,
    },
    /// Everything of `queue` (a queue or a priority mark) up to `id` was delivered.
    Delivered { id: u64, queue: u32 },
}

/// Part of one segment's records, in order, from the thread scanning it.
#[derive(Default)]
struct Chunk {
    /// Names (queues and priority marks) that no earlier chunk of the segment gave: they
    /// continue the segment's table of names, which events index.
    names: Vec<String>,
    /// The queue lists of its publish events, as indexes into that table, back to back.
    queue_lists: Vec<u32>,
    events: Vec<Event>,
    /// With the segment's last chunk: what scanning the segment found.
    end: Option<SegmentEnd>,
}

/// What scanning a segment found besides its records.
#[derive(Default)]
struct SegmentEnd {
    /// Records read successfully.
    records: u64,
    /// The highest id of its publish and ack records.
    max_id: u64,
    /// Records skipped as corrupt.
    corrupt_records: u64,
    /// Bytes cut off its end as a torn or unreadable tail.
    truncated_bytes: u64,
    /// Its length after any cut, bytes.
    bytes: u64,
}

/// Fills a segment's chunks and hands each to `emit` when it is full.
struct Chunker<'a> {
    /// Every name of the segment so far, with its index.
    local: HashMap<String, u32>,
    chunk: Chunk,
    /// Takes a full chunk; false when the merge is gone.
    emit: &'a mut dyn FnMut(Chunk) -> bool,
}

impl Chunker<'_> {
    /// The index of `name` in the segment's table, added if new.
    fn name(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.local.get(name) {
            return i;
        }
        let i = self.local.len() as u32;
        self.chunk.names.push(name.to_string());
        self.local.insert(name.to_string(), i);
        i
    }

    /// Adds `event`, handing the chunk on once full. Errors: the merge is gone.
    fn push(&mut self, event: Event) -> std::io::Result<()> {
        self.chunk.events.push(event);
        if self.chunk.events.len() >= CHUNK_EVENTS && !(self.emit)(std::mem::take(&mut self.chunk))
        {
            return Err(merge_gone());
        }
        Ok(())
    }
}

fn merge_gone() -> std::io::Error {
    std::io::Error::other("recovery stopped merging")
}

/// Reads segment `seg` of `dir` record by record, checking each (see the module docs), hands
/// its records to `emit` in chunks (the last one with [`Chunk::end`]), and cuts off a torn or
/// unreadable tail (zeros the writer left ahead of its records, only in the `last` segment,
/// quietly). Errors: the file cannot be opened, read or cut; `emit` returned false.
fn scan_segment(
    dir: &Path,
    seg: u32,
    last: bool,
    segment_size: u64,
    emit: &mut dyn FnMut(Chunk) -> bool,
) -> std::io::Result<()> {
    let mut found = SegmentEnd::default();
    let mut out = Chunker {
        local: HashMap::new(),
        chunk: Chunk::default(),
        emit,
    };
    let path = segment_path(dir, seg);
    let file = OpenOptions::new().read(true).write(true).open(&path)?;
    let file_len = file.metadata()?.len();
    let mut rd = BufReader::with_capacity(1 << 20, &file);
    let mut offset = 0u64;
    let mut cut_at: Option<u64> = None;
    let mut header = [0u8; HEADER_LEN];
    let mut body = Vec::new();
    // True when everything from `cut_at` on is zeros: the writer's preallocation.
    let mut zeros = false;
    // The last record read, when it did not decode: (offset, why).
    let mut corrupt: Option<(u64, String)> = None;
    let report_corrupt = |found: &mut SegmentEnd, offset: u64, error: &str| {
        found.corrupt_records += 1;
        warn!(segment = seg, offset, error, "skipping corrupt record");
    };
    while offset < file_len {
        if file_len - offset < HEADER_LEN as u64 {
            cut_at = Some(offset);
            zeros = rest_is_zero(&mut rd, file_len - offset)?;
            break;
        }
        rd.read_exact(&mut header)?;
        let (len, crc) = record::header_fields(&header);
        let end = offset + HEADER_LEN as u64 + u64::from(len);
        if len == 0 || len > MAX_RECORD || end > file_len {
            // In a segment written no more, bytes that do not read as a record are damage,
            // not a torn write: the records after them are stepped to, not cut off.
            if !last {
                if let Some(next) = next_whole_record(&file, offset + 1, file_len)? {
                    if let Some((at, e)) = corrupt.take() {
                        report_corrupt(&mut found, at, &e);
                    }
                    let skipped = format!("unreadable header, {} bytes skipped", next - offset);
                    report_corrupt(&mut found, offset, &skipped);
                    rd.seek(SeekFrom::Start(next))?;
                    offset = next;
                    continue;
                }
            }
            cut_at = Some(offset);
            zeros = header == [0; HEADER_LEN]
                && rest_is_zero(&mut rd, file_len - offset - HEADER_LEN as u64)?;
            break;
        }
        if let Some((at, e)) = corrupt.take() {
            report_corrupt(&mut found, at, &e);
        }
        body.resize(len as usize, 0);
        rd.read_exact(&mut body)?;
        let location = Location {
            segment: seg,
            offset,
            len: len + HEADER_LEN as u32,
        };
        offset = end;
        let rec = match record::scan(&body, crc) {
            Ok(r) => r,
            Err(e) => {
                // A damaged length (in a segment written no more) leaves the next record
                // elsewhere than where this one says it ends: step to where one starts.
                if !last && end < file_len && !whole_record_at(&file, end, file_len)? {
                    if let Some(next) = next_whole_record(&file, location.offset + 1, file_len)? {
                        let skipped = format!("{e}, {} bytes skipped", next - location.offset);
                        report_corrupt(&mut found, location.offset, &skipped);
                        rd.seek(SeekFrom::Start(next))?;
                        offset = next;
                        continue;
                    }
                }
                // Reported once the next record is read: one that only zeros follow is a
                // record torn by a crash over the zeros ahead of it.
                corrupt = Some((location.offset, e.to_string()));
                continue;
            }
        };
        found.records += 1;
        let event = match rec {
            Scanned::Publish {
                id,
                queues,
                transient,
                priority,
            } => {
                found.max_id = found.max_id.max(id);
                if transient || queues.is_empty() {
                    continue;
                }
                let from = out.chunk.queue_lists.len() as u32;
                for q in queues {
                    let i = out.name(q);
                    out.chunk.queue_lists.push(i);
                }
                Event::Publish {
                    id,
                    location,
                    queues: from..out.chunk.queue_lists.len() as u32,
                    priority,
                }
            }
            Scanned::Other(rec) => match *rec {
                Record::Publish { .. } => {
                    unreachable!("scan returns publish records as Scanned::Publish")
                }
                Record::Ack { id, queue, target } => {
                    found.max_id = found.max_id.max(id);
                    Event::Ack {
                        id,
                        queue: out.name(&queue),
                        origin: target.map(|t| t.origin),
                    }
                }
                Record::Delivered { id, queue } => Event::Delivered {
                    id,
                    queue: out.name(&queue),
                },
            },
        };
        out.push(event)?;
    }
    // The writer's zeros (see `PREALLOCATE`) are only in the last segment (a full one has
    // none left, one written no more is cut back), which they leave at a multiple of
    // `PREALLOCATE` or at the segment size.
    zeros &= last && (file_len % crate::PREALLOCATE == 0 || file_len == segment_size);
    match corrupt.take() {
        // Only zeros after a record that does not decode: a torn write, cut with the zeros.
        Some((at, _)) if zeros => {
            cut_at = Some(at);
            zeros = false;
        }
        Some((at, e)) => report_corrupt(&mut found, at, &e),
        None => {}
    }
    if let Some(at) = cut_at {
        let dropped = file_len - at;
        if zeros {
            debug!(
                segment = seg,
                offset = at,
                bytes = dropped,
                "cutting the zeros written ahead of the segment's records"
            );
        } else {
            found.truncated_bytes += dropped;
            warn!(
                segment = seg,
                offset = at,
                bytes = dropped,
                "truncating torn or unreadable segment tail"
            );
        }
        file.set_len(at)?;
        file.sync_all()?;
    }
    found.bytes = cut_at.unwrap_or(file_len);
    out.chunk.end = Some(found);
    if !(out.emit)(out.chunk) {
        return Err(merge_gone());
    }
    Ok(())
}

/// The live messages as the records merged so far leave them, and what else recovery
/// keeps; [`Merge::apply`] takes the segments' chunks in order.
#[derive(Default)]
struct Merge {
    /// Queue names by index (see `intern`), and the index of each.
    names: Vec<String>,
    index: HashMap<String, u32>,
    msgs: HashMap<u64, Live, BuildHasherDefault<IdHasher>>,
    /// The oldest copy of each live message that has more than one on disk.
    first: HashMap<u64, Location, BuildHasherDefault<IdHasher>>,
    /// The queues of live messages held by more than one (see [`Live::queues`]), and the
    /// indexes of lists no message uses, to reuse.
    lists: Vec<Vec<u32>>,
    free_lists: Vec<u32>,
    max_id: u64,
    delivered_upto: HashMap<u32, u64, BuildHasherDefault<IdHasher>>,
    /// A priority queue's watermarks, by (queue, priority) (see `Store::delivered`).
    priority_upto: HashMap<(u32, u8), u64>,
    segs: BTreeMap<u32, Seg>,
    marks: HashMap<String, (u64, u32)>,
    superseded: HashSet<(u32, u64)>,
}

impl Merge {
    /// Applies the next chunk of segment `seg` (after every record before it). `names` is
    /// the segment's table of names so far, `queue_of` their queue indexes once known (an
    /// ACK names a queue only if an earlier record did); both start empty for a segment.
    fn apply(
        &mut self,
        seg: u32,
        names: &mut Vec<String>,
        queue_of: &mut Vec<Option<u32>>,
        chunk: Chunk,
        report: &mut RecoveryReport,
    ) {
        names.extend(chunk.names);
        queue_of.resize(names.len(), None);
        for event in chunk.events {
            match event {
                Event::Publish {
                    id,
                    location,
                    queues,
                    priority,
                } => {
                    let mut queues = chunk.queue_lists[queues.start as usize..queues.end as usize]
                        .iter()
                        .map(|&l| {
                            *queue_of[l as usize].get_or_insert_with(|| {
                                intern(&mut self.index, &mut self.names, &names[l as usize])
                            })
                        });
                    let queues = match (queues.next(), queues.len()) {
                        (Some(q), 0) => q,
                        (first, _) => {
                            let list = first.into_iter().chain(queues).collect();
                            match self.free_lists.pop() {
                                Some(i) => {
                                    self.lists[i as usize] = list;
                                    i | MANY
                                }
                                None => {
                                    self.lists.push(list);
                                    (self.lists.len() - 1) as u32 | MANY
                                }
                            }
                        }
                    };
                    let old = self.msgs.insert(
                        id,
                        Live {
                            location,
                            queues,
                            priority,
                        },
                    );
                    if let Some(old) = old {
                        self.free_list(old.queues);
                        self.superseded
                            .insert((old.location.segment, old.location.offset));
                        // The oldest copy stays the first one found.
                        self.first.entry(id).or_insert(old.location);
                    }
                }
                Event::Ack { id, queue, origin } => {
                    let l = queue as usize;
                    let q = match queue_of[l] {
                        Some(q) => q,
                        None => match self.index.get(&names[l]) {
                            Some(&q) => *queue_of[l].insert(q),
                            None => continue,
                        },
                    };
                    let Some(m) = self.msgs.get_mut(&id) else {
                        continue;
                    };
                    let emptied = if m.queues & MANY == 0 {
                        if m.queues != q {
                            continue;
                        }
                        true
                    } else {
                        let list = &mut self.lists[(m.queues & !MANY) as usize];
                        let before = list.len();
                        list.retain(|i| *i != q);
                        if list.len() == before {
                            continue;
                        }
                        list.is_empty()
                    };
                    // This ACK settles a message whose oldest copy is in segment `settles`:
                    // deleting it while a copy survives would bring the message back.
                    let oldest = self.first.get(&id).unwrap_or(&m.location);
                    let settles = oldest.segment.min(origin.unwrap_or(u32::MAX));
                    if emptied {
                        if let Some(m) = self.msgs.remove(&id) {
                            self.free_list(m.queues);
                        }
                        self.first.remove(&id);
                    }
                    let s = self.segs.entry(seg).or_insert_with(|| Seg::new(0));
                    s.ack_floor = s.ack_floor.min(settles);
                    s.legacy |= origin.is_none() && settles < seg;
                }
                Event::Delivered { id, queue } => {
                    let name = &names[queue as usize];
                    // Everything of this queue (of this priority) up to `id` has been
                    // delivered.
                    let w = match crate::parse_priority_mark(name) {
                        Some((p, base)) => {
                            let q = intern(&mut self.index, &mut self.names, base);
                            self.priority_upto.entry((q, p)).or_insert(0)
                        }
                        None => {
                            let q = intern(&mut self.index, &mut self.names, name);
                            queue_of[queue as usize] = Some(q);
                            self.delivered_upto.entry(q).or_insert(0)
                        }
                    };
                    *w = (*w).max(id);
                    let mark = self.marks.entry(name.clone()).or_insert((id, seg));
                    if id >= mark.0 {
                        *mark = (id, seg);
                    }
                }
            }
        }
        if let Some(end) = chunk.end {
            report.records += end.records;
            report.corrupt_records += end.corrupt_records;
            report.truncated_bytes += end.truncated_bytes;
            self.max_id = self.max_id.max(end.max_id);
            self.segs.entry(seg).or_insert_with(|| Seg::new(0)).bytes = end.bytes;
        }
    }

    /// Frees the list of queues `queues` names, if it names one (see [`Live::queues`]).
    fn free_list(&mut self, queues: u32) {
        if queues & MANY != 0 {
            self.lists[(queues & !MANY) as usize] = Vec::new();
            self.free_lists.push(queues & !MANY);
        }
    }
}

/// Scans `segments` on up to `threads` threads (segment `i` on thread `i % threads`, each
/// at most [`CHUNKS_AHEAD`] chunks ahead of the merge) and merges their records in segment
/// order on this thread. Errors: the first segment, in order, that cannot be read or cut
/// (segments after it may have been scanned, and their torn tails cut, already).
fn scan_and_merge(
    dir: &Path,
    segments: &[u32],
    segment_size: u64,
    threads: usize,
    merge: &mut Merge,
    report: &mut RecoveryReport,
) -> std::io::Result<()> {
    let last = segments.last().copied().unwrap_or(0);
    let threads = threads.clamp(1, segments.len().max(1));
    std::thread::scope(|s| {
        let mut chunks = Vec::with_capacity(threads);
        for t in 0..threads {
            let (tx, rx) = std::sync::mpsc::sync_channel::<std::io::Result<Chunk>>(CHUNKS_AHEAD);
            chunks.push(rx);
            s.spawn(move || {
                for &seg in segments.iter().skip(t).step_by(threads) {
                    let mut emit = |c: Chunk| tx.send(Ok(c)).is_ok();
                    // A panic becomes the segment's error: the merge waits for its chunks.
                    let scanned = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        scan_segment(dir, seg, seg == last, segment_size, &mut emit)
                    }))
                    .unwrap_or_else(|_| {
                        Err(std::io::Error::other(format!(
                            "scanning segment {seg} panicked"
                        )))
                    });
                    if let Err(e) = scanned {
                        // Nothing listens any more when the merge stopped first.
                        let _ = tx.send(Err(e));
                        return;
                    }
                }
            });
        }
        // Leaving early (an error, a panic) drops the receivers, which stops the threads.
        for (i, &seg) in segments.iter().enumerate() {
            let (mut names, mut queue_of) = (Vec::new(), Vec::new());
            loop {
                let chunk = chunks[i % threads].recv().map_err(|_| merge_gone())??;
                let end = chunk.end.is_some();
                merge.apply(seg, &mut names, &mut queue_of, chunk, report);
                if end {
                    break;
                }
            }
        }
        Ok(())
    })
}

/// Recovers the store in `dir` (segments of at most `segment_size` bytes), scanning on up to
/// [`SCAN_THREADS`] threads (at most the machine's cores). Errors: a segment cannot be read
/// or cut.
pub(crate) fn recover(dir: &Path, segment_size: u64) -> std::io::Result<RecoveryResult> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(SCAN_THREADS));
    recover_on(dir, segment_size, threads)
}

/// [`recover`] with segments scanned on up to `threads` threads.
fn recover_on(dir: &Path, segment_size: u64, threads: usize) -> std::io::Result<RecoveryResult> {
    let started = Instant::now();
    let mut segments: Vec<u32> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".seg")?.parse::<u32>().ok()
        })
        .collect();
    segments.sort_unstable();
    let mut report = RecoveryReport {
        segments: segments.len(),
        ..Default::default()
    };
    // Gaps the store made itself (reclaim and compaction record what they delete) are not
    // missing; the record keeps only what is still a gap.
    let deleted = crate::deleted::read(dir);
    let mut gaps_deleted = Vec::new();
    for w in segments.windows(2) {
        for n in w[0] + 1..w[1] {
            match deleted.contains(&n) {
                true => gaps_deleted.push(n),
                false => report.missing_segments.push(n),
            }
        }
    }
    if gaps_deleted.len() != deleted.len() {
        if let Err(e) = crate::deleted::rewrite(dir, &gaps_deleted) {
            warn!(error = %e, "cannot rewrite the record of deleted segments");
        }
    }
    if !report.missing_segments.is_empty() {
        warn!(missing = ?report.missing_segments, "message store segments are missing; their messages and acks are lost");
    }

    let mut merge = Merge::default();
    scan_and_merge(
        dir,
        &segments,
        segment_size,
        threads,
        &mut merge,
        &mut report,
    )?;
    let Merge {
        names,
        msgs,
        first,
        lists,
        max_id,
        delivered_upto,
        priority_upto,
        mut segs,
        marks,
        superseded,
        ..
    } = merge;

    // By queue index (see `intern`), named at the end.
    let mut per_queue: Vec<Vec<RecoveredEntry>> = names.iter().map(|_| Vec::new()).collect();
    let mut moved = HashMap::new();
    for (id, m) in &msgs {
        let queues = match m.queues & MANY {
            0 => std::slice::from_ref(&m.queues),
            _ => &lists[(m.queues & !MANY) as usize][..],
        };
        let oldest = first.get(id).copied().unwrap_or(m.location);
        if oldest != m.location {
            moved.insert(
                (oldest.segment, oldest.offset),
                Moved {
                    to: m.location,
                    pairs: queues.len() as u32,
                },
            );
        }
        if let Some(s) = segs.get_mut(&m.location.segment) {
            let n = queues.len() as i64;
            s.pairs += n;
            s.live_bytes += n * i64::from(m.location.len);
        }
        for q in queues {
            let delivered = delivered_upto.get(q).is_some_and(|w| *id <= *w)
                || (!priority_upto.is_empty()
                    && priority_upto
                        .get(&(*q, m.priority))
                        .is_some_and(|w| *id <= *w));
            report.messages += 1;
            per_queue[*q as usize].push(RecoveredEntry {
                id: *id,
                location: oldest,
                redelivered: delivered,
                priority: m.priority,
            });
        }
    }
    let mut queues: HashMap<String, Vec<RecoveredEntry>> = HashMap::new();
    for (name, mut list) in names.into_iter().zip(per_queue) {
        if !list.is_empty() {
            list.sort_unstable_by_key(|e| e.id);
            queues.insert(name, list);
        }
    }
    report.duration = started.elapsed();
    info!(
        segments = report.segments,
        records = report.records,
        messages = report.messages,
        truncated_bytes = report.truncated_bytes,
        corrupt_records = report.corrupt_records,
        ms = report.duration.as_millis() as u64,
        "message store recovered"
    );
    Ok(RecoveryResult {
        queues,
        report,
        segs,
        next_id: max_id + 1,
        last_segment: segments.last().copied().unwrap_or(0),
        marks,
        superseded,
        moved,
    })
}

fn intern(index: &mut HashMap<String, u32>, names: &mut Vec<String>, q: &str) -> u32 {
    if let Some(i) = index.get(q) {
        return *i;
    }
    let i = names.len() as u32;
    names.push(q.to_string());
    index.insert(q.to_string(), i);
    i
}

/// The hasher of the map of live messages by id, which recovery fills with every message of
/// the store: ids are sequential numbers, so a multiply spreads them well enough, at a
/// fraction of the default hasher's cost.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_u64(&mut self, id: u64) {
        // Fibonacci hashing: the high bits, which the map's control bytes use, vary too.
        self.0 = id.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Store, StoreConfig};
    use warren_amqp::properties::BasicProperties;

    type Outcome = (
        BTreeMap<String, Vec<RecoveredEntry>>,
        RecoveryReport,
        Vec<(u32, i64, i64, u64, u32, bool)>,
        u64,
        u32,
        BTreeMap<String, (u64, u32)>,
        Vec<(u32, u64)>,
        Vec<((u32, u64), Location, u32)>,
    );

    /// Everything recovery hands the store, in a comparable form (the scan's duration left
    /// out).
    fn outcome(r: RecoveryResult) -> Outcome {
        let mut superseded: Vec<_> = r.superseded.into_iter().collect();
        superseded.sort_unstable();
        let mut moved: Vec<_> = r
            .moved
            .into_iter()
            .map(|(k, m)| (k, m.to, m.pairs))
            .collect();
        moved.sort_unstable_by_key(|m| m.0);
        (
            r.queues.into_iter().collect(),
            RecoveryReport {
                duration: Duration::ZERO,
                ..r.report
            },
            r.segs
                .iter()
                .map(|(n, s)| (*n, s.pairs, s.live_bytes, s.bytes, s.ack_floor, s.legacy))
                .collect(),
            r.next_id,
            r.last_segment,
            r.marks.into_iter().collect(),
            superseded,
            moved,
        )
    }

    /// Writes `n` messages to a store in `dir` with segments of `segment_size` bytes: to
    /// queues `a` and `b`, to the priority queue `p`, or to `b` alone; settlements and
    /// delivery marks land segments after the records they name. Returns the segment size.
    fn fill(dir: &Path, segment_size: u64, n: u64, body: usize) -> u64 {
        let _ = std::fs::remove_dir_all(dir);
        let cfg = StoreConfig {
            segment_size,
            ..StoreConfig::new(dir)
        };
        let (store, _) = Store::open(cfg).unwrap();
        let persistent = BasicProperties {
            delivery_mode: Some(2),
            ..Default::default()
        };
        let urgent = BasicProperties {
            priority: Some(5),
            ..persistent.clone()
        };
        let mut sent = Vec::new();
        for i in 0..n {
            let id = store.next_id();
            let (props, queues): (_, &[&str]) = match i % 3 {
                0 => (&persistent, &["a", "b"]),
                1 => (&urgent, &["p"]),
                _ => (&persistent, &["b"]),
            };
            let body = format!("message {i} {}", "x".repeat(body));
            let loc = store
                .append_publish(id, "", "k", props, body.as_bytes(), 1, queues, None)
                .unwrap();
            sent.push((i, id, loc));
            if i >= 40 && i % 4 == 0 {
                let (j, id, loc) = sent[(i - 40) as usize];
                match j % 3 {
                    0 => store.ack("a", id, loc),
                    1 => store.delivered("p", Some(5), id),
                    _ => store.ack("b", id, loc),
                }
            }
            if i % 50 == 0 {
                store.delivered("b", None, id);
            }
        }
        store.close();
        segment_size
    }

    /// The ids each queue holds after [`fill`] of `n` messages (ids count from 1).
    fn expected(n: u64) -> BTreeMap<String, Vec<u64>> {
        let mut queues: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for i in 0..n {
            let settled = i + 40 < n && (i + 40) % 4 == 0;
            let held: &[&str] = match (i % 3, settled) {
                (0, false) => &["a", "b"],
                (0, true) => &["b"],
                (1, _) => &["p"],
                (_, false) => &["b"],
                (_, true) => &[],
            };
            for q in held {
                queues.entry(q.to_string()).or_default().push(i + 1);
            }
        }
        queues
    }

    /// Recovery on 1, 2 and 4 threads agree, and find the ids [`fill`] of `n` messages left;
    /// returns the report of one.
    fn recover_on_threads_agree(dir: &Path, segment_size: u64, n: u64) -> RecoveryReport {
        let one = outcome(recover_on(dir, segment_size, 1).unwrap());
        let ids: BTreeMap<String, Vec<u64>> = one
            .0
            .iter()
            .map(|(q, entries)| (q.clone(), entries.iter().map(|e| e.id).collect()))
            .collect();
        assert!(
            ids == expected(n),
            "the recovered ids differ from those written"
        );
        for threads in [2, 4] {
            assert_eq!(
                outcome(recover_on(dir, segment_size, threads).unwrap()),
                one,
                "{threads} threads"
            );
        }
        one.1
    }

    #[test]
    fn scanning_on_several_threads_recovers_what_one_pass_in_order_does() {
        let dir =
            std::env::temp_dir().join(format!("warren-recovery-threads-{}", std::process::id()));
        // Small segments: the records spread over dozens of them, each scanned on its own.
        let report = recover_on_threads_agree(&dir, fill(&dir, 4096, 2000, 100), 2000);
        assert!(report.segments > 20, "{} segments", report.segments);
        // Segments of several chunks each.
        let report = recover_on_threads_agree(&dir, fill(&dir, 4 << 20, 120_000, 0), 120_000);
        assert!(
            report.segments >= 2 && report.records / report.segments as u64 > CHUNK_EVENTS as u64,
            "{report:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
