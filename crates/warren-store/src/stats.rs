//! The store's always-on counters: plain atomics the writer and compactor threads update (at
//! most a few per fsync or per segment; nothing per record beyond the count the writer
//! already keeps under its lock), read together as a [`StoreStats`] snapshot.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the fsync latency histogram's buckets, nanoseconds (50 µs .. 1 s; slower
/// fsyncs fall in the `+Inf` bucket).
pub const FSYNC_BUCKETS_NS: [u64; 15] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    750_000_000,
    1_000_000_000,
];

/// Upper bounds of the group-commit batch histogram's buckets, records per batch (larger
/// batches fall in the `+Inf` bucket).
pub const BATCH_BUCKETS_RECORDS: [u64; 15] = [
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384,
];

/// A histogram over fixed integer bucket bounds, updated with atomics only (no lock, no
/// allocation per observation).
#[derive(Debug)]
pub(crate) struct AtomicHistogram {
    bounds: &'static [u64],
    /// Observations per bucket, not cumulative; one more than `bounds` (the `+Inf` bucket).
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl AtomicHistogram {
    pub(crate) fn new(bounds: &'static [u64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bounds increase");
        AtomicHistogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    /// Counts `v` in the first bucket whose upper bound is at least `v` (Prometheus' `le`,
    /// inclusive).
    pub(crate) fn observe(&self, v: u64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(v, Ordering::Relaxed);
    }

    /// The buckets as Prometheus has them: cumulative counts per upper bound, the bounds and
    /// the sum divided by `unit` (e.g. 1e9 to turn nanoseconds into seconds). The count
    /// is the `+Inf` bucket's, so that the snapshot is consistent in itself even while
    /// observations go on.
    pub(crate) fn snapshot(&self, unit: f64) -> HistogramSnapshot {
        let mut total = 0;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (i, b) in self.bounds.iter().enumerate() {
            total += self.buckets[i].load(Ordering::Relaxed);
            buckets.push((*b as f64 / unit, total));
        }
        total += self.buckets[self.bounds.len()].load(Ordering::Relaxed);
        HistogramSnapshot {
            buckets,
            count: total,
            sum: self.sum.load(Ordering::Relaxed) as f64 / unit,
        }
    }
}

/// A histogram read at one moment, in Prometheus' shape.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// (upper bound, observations at most that bound), bounds increasing, counts
    /// cumulative (non-decreasing); the `+Inf` bucket is not listed: it is `count`.
    pub buckets: Vec<(f64, u64)>,
    /// Observations in all.
    pub count: u64,
    /// Sum of the observed values, in the histogram's unit.
    pub sum: f64,
}

/// The counters behind [`StoreStats`], shared by the writer and compactor threads.
#[derive(Debug)]
pub(crate) struct Counters {
    pub(crate) file_bytes: AtomicU64,
    pub(crate) segments: AtomicU64,
    pub(crate) written_bytes: AtomicU64,
    pub(crate) records: AtomicU64,
    pub(crate) fsyncs: AtomicU64,
    pub(crate) compactions: AtomicU64,
    pub(crate) fsync_ns: AtomicHistogram,
    pub(crate) batch_records: AtomicHistogram,
}

impl Counters {
    /// Counters for a store whose directory holds `segments` segment files of `file_bytes`
    /// bytes in all.
    pub(crate) fn new(segments: u64, file_bytes: u64) -> Self {
        Counters {
            file_bytes: AtomicU64::new(file_bytes),
            segments: AtomicU64::new(segments),
            written_bytes: AtomicU64::new(0),
            records: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            compactions: AtomicU64::new(0),
            fsync_ns: AtomicHistogram::new(&FSYNC_BUCKETS_NS),
            batch_records: AtomicHistogram::new(&BATCH_BUCKETS_RECORDS),
        }
    }

    /// One fsync took `took` and made `bytes` more of a segment file durable.
    pub(crate) fn synced(&self, bytes: u64, took: Duration) {
        self.fsyncs.fetch_add(1, Ordering::Relaxed);
        self.fsync_ns
            .observe(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
        self.written_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// The open segment's file went from `old` to `new` bytes (records written, zeros written
    /// ahead of them or cut).
    pub(crate) fn resized(&self, old: u64, new: u64) {
        if new >= old {
            self.file_bytes.fetch_add(new - old, Ordering::Relaxed);
        } else {
            self.shrink(old - new);
        }
    }

    /// The gauge never wraps below zero, whatever a failed cut left it believing.
    fn shrink(&self, by: u64) {
        let _ = self
            .file_bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                Some(b.saturating_sub(by))
            });
    }

    /// A group commit of `records` records is written and fsynced.
    pub(crate) fn committed(&self, records: u64) {
        self.records.fetch_add(records, Ordering::Relaxed);
        self.batch_records.observe(records);
    }

    /// A segment file of `bytes` bytes was deleted.
    pub(crate) fn segment_deleted(&self, bytes: u64) {
        self.segments.fetch_sub(1, Ordering::Relaxed);
        self.shrink(bytes);
    }

    pub(crate) fn snapshot(&self) -> StoreStats {
        StoreStats {
            bytes: self.file_bytes.load(Ordering::Relaxed),
            segments: self.segments.load(Ordering::Relaxed),
            written_bytes: self.written_bytes.load(Ordering::Relaxed),
            records_written: self.records.load(Ordering::Relaxed),
            fsyncs: self.fsyncs.load(Ordering::Relaxed),
            compactions: self.compactions.load(Ordering::Relaxed),
            fsync_seconds: self.fsync_ns.snapshot(1e9),
            batch_records: self.batch_records.snapshot(1.0),
        }
    }
}

/// What the message store has done and holds, read at one moment (see [`crate::Store::stats`]).
/// Counters count since the store was opened; gauges are the state now.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreStats {
    /// Bytes in the store's segment files now, as on disk: the records written (records
    /// appended but not yet written are not counted; a segment's bytes go when its file is
    /// deleted) and the zeros written ahead of the open segment's records (at most
    /// [`crate::PREALLOCATE`]).
    pub bytes: u64,
    /// Segment files in the store's directory now.
    pub segments: u64,
    /// Bytes written to segment files and fsynced since the store was opened (compaction's
    /// copies included).
    pub written_bytes: u64,
    /// Records (messages, acknowledgements, delivery marks, compaction's copies) written and
    /// fsynced since the store was opened.
    pub records_written: u64,
    /// `fdatasync` calls on segment files that succeeded since the store was opened (a group
    /// commit spanning two segments takes two).
    pub fsyncs: u64,
    /// Segments compacted (their still needed records copied to the head of the log, then the
    /// file deleted) since the store was opened.
    pub compactions: u64,
    /// Latency of each successful fsync, seconds (buckets [`FSYNC_BUCKETS_NS`]; `count`
    /// equals `fsyncs` when read while the writer is idle).
    pub fsync_seconds: HistogramSnapshot,
    /// Records per group commit: one observation per batch the writer wrote and fsynced
    /// (buckets [`BATCH_BUCKETS_RECORDS`]; a round with no record, e.g. a barrier alone, is
    /// not observed).
    pub batch_records: HistogramSnapshot,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_fall_in_the_first_bucket_at_least_as_large() {
        static BOUNDS: [u64; 3] = [10, 20, 30];
        let h = AtomicHistogram::new(&BOUNDS);
        for v in [0, 10, 11, 20, 29, 30, 31, 1000] {
            h.observe(v);
        }
        let s = h.snapshot(1.0);
        // le=10: 0, 10; le=20: + 11, 20; le=30: + 29, 30; +Inf: + 31, 1000.
        assert_eq!(s.buckets, vec![(10.0, 2), (20.0, 4), (30.0, 6)]);
        assert_eq!(s.count, 8);
        assert_eq!(s.sum, (10 + 11 + 20 + 29 + 30 + 31 + 1000) as f64);
    }

    #[test]
    fn fsync_latencies_are_reported_in_seconds() {
        let c = Counters::new(1, 100);
        c.synced(10, Duration::from_micros(40));
        c.synced(20, Duration::from_micros(60));
        c.synced(30, Duration::from_millis(3));
        c.synced(40, Duration::from_secs(2));
        // The file grows as it is written (zeros ahead of the records count), not at fsync.
        c.resized(0, 4096);
        c.resized(4096, 1000);
        let s = c.snapshot();
        assert_eq!(s.fsyncs, 4);
        assert_eq!(s.written_bytes, 100);
        assert_eq!(s.bytes, 1100);
        let h = &s.fsync_seconds;
        assert_eq!(h.count, 4);
        assert_eq!(h.buckets.len(), FSYNC_BUCKETS_NS.len());
        let at = |le: f64| {
            h.buckets
                .iter()
                .find(|(b, _)| (b - le).abs() < 1e-12)
                .map(|(_, n)| *n)
                .unwrap()
        };
        assert_eq!(at(0.00005), 1);
        assert_eq!(at(0.0001), 2);
        assert_eq!(at(0.0025), 2);
        assert_eq!(at(0.005), 3);
        assert_eq!(at(1.0), 3, "the 2 s fsync is only in +Inf");
        assert!((h.sum - 2.00310).abs() < 1e-9, "{}", h.sum);
        assert!(h.buckets.windows(2).all(|w| w[0].1 <= w[1].1));
    }

    #[test]
    fn batch_sizes_and_deletions() {
        let c = Counters::new(3, 1000);
        c.committed(1);
        c.committed(3);
        c.committed(100_000);
        c.segment_deleted(400);
        let s = c.snapshot();
        assert_eq!(s.records_written, 100_004);
        assert_eq!(s.segments, 2);
        assert_eq!(s.bytes, 600);
        let h = &s.batch_records;
        assert_eq!(h.buckets[0], (1.0, 1));
        assert_eq!(h.buckets[1], (2.0, 1));
        assert_eq!(h.buckets[2], (4.0, 2));
        assert_eq!(h.buckets.last().unwrap().1, 2);
        assert_eq!(h.count, 3);
    }

    #[test]
    fn concurrent_observations_are_all_counted() {
        let h = std::sync::Arc::new(AtomicHistogram::new(&BATCH_BUCKETS_RECORDS));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let h = h.clone();
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        h.observe((i * (t + 1)) % 20_000);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = h.snapshot(1.0);
        assert_eq!(s.count, 40_000);
        assert!(s.buckets.windows(2).all(|w| w[0].1 <= w[1].1));
    }
}
