//! Crash recovery: scan every segment in order, validate each record, rebuild which messages
//! are still live in which queue.
//!
//! - A record cut short at the end of a segment (a torn write) is truncated away, with a
//!   warning.
//! - A record whose CRC does not match is skipped and counted; scanning continues after it.
//! - A length field that cannot be right (past the end of the file is a torn tail; larger than
//!   any record could be) ends the scan of that segment: the rest is cut off and reported.
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
//! message.

use crate::record::{self, Record, Scanned, HEADER_LEN};
use crate::{segment_path, Location, Moved, Seg};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::OpenOptions;
use std::hash::{BuildHasherDefault, Hasher};
use std::io::{BufReader, Read};
use std::path::Path;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Largest record recovery accepts as plausible (bigger lengths are corruption).
const MAX_RECORD: u32 = 1 << 30;

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

struct Live {
    /// The newest copy.
    location: Location,
    /// The oldest copy.
    first: Location,
    /// Queue indexes still holding the message.
    queues: Vec<u32>,
    priority: u8,
}

fn report_corrupt(report: &mut RecoveryReport, seg: u32, offset: u64, error: &str) {
    report.corrupt_records += 1;
    warn!(segment = seg, offset, error, "skipping corrupt record");
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

pub(crate) fn recover(dir: &Path, segment_size: u64) -> std::io::Result<RecoveryResult> {
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

    let mut names: Vec<String> = Vec::new();
    let mut index: HashMap<String, u32> = HashMap::new();
    let mut msgs: HashMap<u64, Live, BuildHasherDefault<IdHasher>> = HashMap::default();
    let mut max_id = 0u64;
    let mut delivered_upto: HashMap<u32, u64, BuildHasherDefault<IdHasher>> = HashMap::default();
    // A priority queue's watermarks, by (queue, priority) (see `Store::delivered`).
    let mut priority_upto: HashMap<(u32, u8), u64> = HashMap::new();
    let mut segs: BTreeMap<u32, Seg> = BTreeMap::new();
    let mut marks: HashMap<String, (u64, u32)> = HashMap::new();
    let mut superseded: HashSet<(u32, u64)> = HashSet::new();

    let last = segments.last().copied().unwrap_or(0);
    for &seg in &segments {
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
        while offset < file_len {
            if file_len - offset < HEADER_LEN as u64 {
                cut_at = Some(offset);
                zeros = rest_is_zero(&mut rd, file_len - offset)?;
                break;
            }
            rd.read_exact(&mut header)?;
            let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
            let crc = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
            let end = offset + HEADER_LEN as u64 + u64::from(len);
            if len == 0 || len > MAX_RECORD || end > file_len {
                cut_at = Some(offset);
                zeros = header == [0; HEADER_LEN]
                    && rest_is_zero(&mut rd, file_len - offset - HEADER_LEN as u64)?;
                break;
            }
            if let Some((at, e)) = corrupt.take() {
                report_corrupt(&mut report, seg, at, &e);
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
                    // Reported once the next record is read: one that only zeros follow is
                    // a record torn by a crash over the zeros ahead of it.
                    corrupt = Some((location.offset, e.to_string()));
                    continue;
                }
            };
            report.records += 1;
            let rec = match rec {
                Scanned::Publish {
                    id,
                    queues,
                    transient,
                    priority,
                } => {
                    max_id = max_id.max(id);
                    if transient || queues.is_empty() {
                        continue;
                    }
                    let queues = queues
                        .into_iter()
                        .map(|q| intern(&mut index, &mut names, q))
                        .collect();
                    let old = msgs.insert(
                        id,
                        Live {
                            location,
                            first: location,
                            queues,
                            priority,
                        },
                    );
                    if let Some(old) = old {
                        superseded.insert((old.location.segment, old.location.offset));
                        if let Some(m) = msgs.get_mut(&id) {
                            m.first = old.first;
                        }
                    }
                    continue;
                }
                Scanned::Other(rec) => *rec,
            };
            match rec {
                Record::Publish { .. } => {
                    unreachable!("scan returns publish records as Scanned::Publish")
                }
                Record::Ack { id, queue, target } => {
                    max_id = max_id.max(id);
                    let Some(&q) = index.get(&queue) else {
                        continue;
                    };
                    let Some(m) = msgs.get_mut(&id) else {
                        continue;
                    };
                    let before = m.queues.len();
                    m.queues.retain(|i| *i != q);
                    if m.queues.len() == before {
                        continue;
                    }
                    // This ACK settles a message whose oldest copy is in segment `settles`:
                    // deleting it while a copy survives would bring the message back.
                    let settles = m.first.segment.min(target.map_or(u32::MAX, |t| t.origin));
                    if m.queues.is_empty() {
                        msgs.remove(&id);
                    }
                    let s = segs.entry(seg).or_insert_with(|| Seg::new(0));
                    s.ack_floor = s.ack_floor.min(settles);
                    s.legacy |= target.is_none() && settles < seg;
                }
                Record::Delivered { id, queue } => {
                    // Everything of this queue (of this priority) up to `id` has been
                    // delivered.
                    let w = match crate::parse_priority_mark(&queue) {
                        Some((p, base)) => {
                            let q = intern(&mut index, &mut names, base);
                            priority_upto.entry((q, p)).or_insert(0)
                        }
                        None => {
                            let q = intern(&mut index, &mut names, &queue);
                            delivered_upto.entry(q).or_insert(0)
                        }
                    };
                    *w = (*w).max(id);
                    let mark = marks.entry(queue).or_insert((id, seg));
                    if id >= mark.0 {
                        *mark = (id, seg);
                    }
                }
            }
        }
        // The writer's zeros (see `PREALLOCATE`) are only in the last segment (a full one has
        // none left, one written no more is cut back), which they leave at a multiple of
        // `PREALLOCATE` or at the segment size.
        zeros &= seg == last && (file_len % crate::PREALLOCATE == 0 || file_len == segment_size);
        match corrupt.take() {
            // Only zeros after a record that does not decode: a torn write, cut with the zeros.
            Some((at, _)) if zeros => {
                cut_at = Some(at);
                zeros = false;
            }
            Some((at, e)) => report_corrupt(&mut report, seg, at, &e),
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
                report.truncated_bytes += dropped;
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
        segs.entry(seg).or_insert_with(|| Seg::new(0)).bytes = cut_at.unwrap_or(file_len);
    }

    // By queue index (see `intern`), named at the end.
    let mut per_queue: Vec<Vec<RecoveredEntry>> = names.iter().map(|_| Vec::new()).collect();
    let mut moved = HashMap::new();
    for (id, m) in &msgs {
        if m.first != m.location {
            moved.insert(
                (m.first.segment, m.first.offset),
                Moved {
                    to: m.location,
                    pairs: m.queues.len() as u32,
                },
            );
        }
        if let Some(s) = segs.get_mut(&m.location.segment) {
            let n = m.queues.len() as i64;
            s.pairs += n;
            s.live_bytes += n * i64::from(m.location.len);
        }
        for q in &m.queues {
            let delivered = delivered_upto.get(q).is_some_and(|w| *id <= *w)
                || (!priority_upto.is_empty()
                    && priority_upto
                        .get(&(*q, m.priority))
                        .is_some_and(|w| *id <= *w));
            report.messages += 1;
            per_queue[*q as usize].push(RecoveredEntry {
                id: *id,
                location: m.first,
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
