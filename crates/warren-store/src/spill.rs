//! A queue's overflow on disk: a FIFO file of fixed-size entries pointing at messages in the
//! store, so a queue deeper than its in-memory window costs no memory per message.
//!
//! Each entry is 32 bytes: `u64 seq, u64 message id, u32 segment, u64 offset, u32 len`, with a
//! flag in the top bit of `len` for a redelivered message and one in the top bit of `segment`
//! for a transient (paged) one. The file is scratch space: it is recreated on first write
//! (recovery rebuilds queues from the segments) and truncated whenever it has been read to the
//! end. A priority queue keeps one file per priority, so the priority is not written.
//!
//! An entry pushed is never lost: entries wait in memory until a batch is written, and when
//! the file cannot be created or written (a full or failing disk) they stay in memory, behind
//! what the file holds, until a later write succeeds ([`SpillFile::retry`], or the next push
//! once another batch has gathered). The queue's order and depth are therefore the same
//! whether the disk took the entries or not; only their memory (32 bytes of location each,
//! the body staying in the message store) is not released.

use crate::Location;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const ENTRY: usize = 32;
const REDELIVERED: u32 = 1 << 31;
const TRANSIENT: u32 = 1 << 31;

/// One spilled queue entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillEntry {
    /// Position in the queue.
    pub seq: u64,
    /// Store message id.
    pub id: u64,
    /// Where the message is stored.
    pub location: Location,
    /// Delivered before.
    pub redelivered: bool,
    /// A paged transient message (not recovered after restart).
    pub transient: bool,
    /// The message's priority (0 when it has none), which orders it in a priority queue.
    /// Not stored in the file: the caller sets it when taking entries from a priority's file.
    pub priority: u8,
}

/// Makes spill-file writes fail as on a full disk while it is set: a test hook for the
/// paths that must keep every entry when the disk refuses them (see
/// `StoreConfig::spill_write_fault`).
#[derive(Clone, Default)]
pub struct SpillFault(pub Arc<AtomicBool>);

impl SpillFault {
    /// Starts (`true`) or stops failing writes.
    pub fn set(&self, failing: bool) {
        self.0.store(failing, Ordering::Relaxed);
    }

    fn check(&self) -> std::io::Result<()> {
        if self.0.load(Ordering::Relaxed) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "no space left on device (injected)",
            ));
        }
        Ok(())
    }
}

impl std::fmt::Debug for SpillFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SpillFault")
            .field(&self.0.load(Ordering::Relaxed))
            .finish()
    }
}

/// A FIFO of [`SpillEntry`] in one file.
pub struct SpillFile {
    path: PathBuf,
    /// Opened (truncated) on the first write.
    file: Option<File>,
    read_pos: u64,
    write_pos: u64,
    /// Entries given back by [`SpillFile::unpop`], before those in the file.
    head: Vec<SpillEntry>,
    /// Entries pushed but not yet written, after those in the file: spilling one message
    /// costs no syscall, and entries the disk refused wait here.
    tail: Vec<SpillEntry>,
    /// Length of `tail` at which the next write is tried: [`TAIL_MAX`], or another
    /// [`TAIL_MAX`] beyond a write that failed (so a full disk is not retried on every push).
    flush_at: usize,
    /// The last write failed.
    stalled: bool,
    fault: Option<SpillFault>,
}

/// Entries buffered in memory before they are written to the file.
const TAIL_MAX: usize = 1024;

impl SpillFile {
    /// A spill file at `path`, created (truncating what a previous run left) when the first
    /// batch of entries is written.
    pub fn new(path: PathBuf) -> Self {
        SpillFile {
            path,
            file: None,
            read_pos: 0,
            write_pos: 0,
            head: Vec::new(),
            tail: Vec::new(),
            flush_at: TAIL_MAX,
            stalled: false,
            fault: None,
        }
    }

    /// The same, with writes failing while `fault` is set (a test hook).
    pub fn with_fault(mut self, fault: Option<SpillFault>) -> Self {
        self.fault = fault;
        self
    }

    /// Entries waiting.
    pub fn len(&self) -> u64 {
        (self.write_pos - self.read_pos) / ENTRY as u64
            + self.head.len() as u64
            + self.tail.len() as u64
    }

    /// True when nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True while entries the disk refused wait in memory.
    pub fn is_stalled(&self) -> bool {
        self.stalled
    }

    /// Appends entries at the back. They are kept whatever happens: the error returned is a
    /// write that failed (the entries wait in memory, to be written by a later push or
    /// [`SpillFile::retry`]), for the caller to report.
    pub fn push(&mut self, entries: &[SpillEntry]) -> std::io::Result<()> {
        self.tail.extend_from_slice(entries);
        if self.tail.len() >= self.flush_at {
            return self.flush();
        }
        Ok(())
    }

    /// Tries again to write the entries a failed write left in memory; `Ok` when there were
    /// none or they are now written.
    pub fn retry(&mut self) -> std::io::Result<()> {
        if !self.stalled {
            return Ok(());
        }
        self.flush()
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self.write_tail() {
            Ok(()) => {
                self.tail.clear();
                self.flush_at = TAIL_MAX;
                self.stalled = false;
                Ok(())
            }
            Err(e) => {
                self.flush_at = self.tail.len() + TAIL_MAX;
                self.stalled = true;
                Err(e)
            }
        }
    }

    /// Writes `tail` after the file's entries; on failure nothing counts as written (a
    /// partial write is overwritten by the next one, which starts at `write_pos` again).
    fn write_tail(&mut self) -> std::io::Result<()> {
        if let Some(f) = &self.fault {
            f.check()?;
        }
        if self.file.is_none() {
            if let Some(dir) = self.path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .read(true)
                .write(true)
                .open(&self.path)?;
            self.file = Some(file);
        }
        let file = self.file.as_mut().expect("opened above");
        let mut buf = Vec::with_capacity(self.tail.len() * ENTRY);
        for e in &self.tail {
            buf.extend_from_slice(&e.seq.to_be_bytes());
            buf.extend_from_slice(&e.id.to_be_bytes());
            let seg = e.location.segment | if e.transient { TRANSIENT } else { 0 };
            buf.extend_from_slice(&seg.to_be_bytes());
            buf.extend_from_slice(&e.location.offset.to_be_bytes());
            let len = e.location.len | if e.redelivered { REDELIVERED } else { 0 };
            buf.extend_from_slice(&len.to_be_bytes());
        }
        file.seek(SeekFrom::Start(self.write_pos))?;
        file.write_all(&buf)?;
        self.write_pos += buf.len() as u64;
        Ok(())
    }

    /// Puts entries taken by [`SpillFile::pop`] back at the front, in their order (their
    /// messages could not be read now).
    pub fn unpop(&mut self, mut entries: Vec<SpillEntry>) {
        entries.append(&mut self.head);
        self.head = entries;
    }

    /// The entry `index` places from the front (0: the one [`SpillFile::pop`] takes next),
    /// without taking it; `None` beyond the last. Costs at most one 32-byte read at a computed
    /// offset of the file, however long it is.
    ///
    /// Errors: the file cannot be read.
    pub fn peek(&self, index: u64) -> std::io::Result<Option<SpillEntry>> {
        let head = self.head.len() as u64;
        if index < head {
            return Ok(Some(self.head[index as usize]));
        }
        let index = index - head;
        let on_disk = (self.write_pos - self.read_pos) / ENTRY as u64;
        if index < on_disk {
            let Some(file) = &self.file else {
                return Ok(None);
            };
            let mut buf = [0u8; ENTRY];
            file.read_exact_at(&mut buf, self.read_pos + index * ENTRY as u64)?;
            return Ok(Some(decode(&buf)));
        }
        Ok(usize::try_from(index - on_disk)
            .ok()
            .and_then(|i| self.tail.get(i))
            .copied())
    }

    /// Takes up to `max` entries from the front. On a read error nothing is taken.
    pub fn pop(&mut self, max: usize) -> std::io::Result<Vec<SpillEntry>> {
        if !self.head.is_empty() {
            let n = self.head.len().min(max);
            return Ok(self.head.drain(..n).collect());
        }
        let on_disk = ((self.write_pos - self.read_pos) / ENTRY as u64) as usize;
        let file = match &mut self.file {
            Some(f) if on_disk > 0 => f,
            _ => {
                let n = self.tail.len().min(max);
                return Ok(self.tail.drain(..n).collect());
            }
        };
        let n = on_disk.min(max);
        let mut buf = vec![0u8; n * ENTRY];
        file.seek(SeekFrom::Start(self.read_pos))?;
        file.read_exact(&mut buf)?;
        self.read_pos += buf.len() as u64;
        if self.read_pos == self.write_pos {
            self.read_pos = 0;
            self.write_pos = 0;
            // Only gives the space back: the next write starts at 0 whatever the length.
            let _ = file.set_len(0);
        }
        Ok(buf.chunks_exact(ENTRY).map(decode).collect())
    }

    /// Empties the file. On a read error the entries stay.
    pub fn clear(&mut self) -> std::io::Result<Vec<SpillEntry>> {
        let mut all = Vec::new();
        while !self.is_empty() {
            all.extend(self.pop(usize::MAX)?);
        }
        Ok(all)
    }
}

/// One entry as the file holds it (see the module docs); its priority is 0.
fn decode(c: &[u8]) -> SpillEntry {
    let u64_at = |i: usize| u64::from_be_bytes(c[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_be_bytes(c[i..i + 4].try_into().expect("4 bytes"));
    let seg = u32_at(16);
    let len = u32_at(28);
    SpillEntry {
        seq: u64_at(0),
        id: u64_at(8),
        location: Location {
            segment: seg & !TRANSIENT,
            offset: u64_at(20),
            len: len & !REDELIVERED,
        },
        redelivered: len & REDELIVERED != 0,
        transient: seg & TRANSIENT != 0,
        priority: 0,
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        if self.file.is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(i: u64) -> SpillEntry {
        SpillEntry {
            seq: i,
            id: i * 10,
            location: Location {
                segment: 3,
                offset: i * 100,
                len: 77,
            },
            redelivered: i.is_multiple_of(2),
            transient: i.is_multiple_of(3),
            priority: 0,
        }
    }

    fn dir(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("warren-spill-{name}-{}", std::process::id()))
    }

    #[test]
    fn fifo_round_trip() {
        let dir = dir("fifo");
        let mut s = SpillFile::new(dir.join("q.spill"));
        s.push(&(0..5).map(e).collect::<Vec<_>>()).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s.pop(2).unwrap(), vec![e(0), e(1)]);
        // Given back (unreadable for now): they come first again.
        s.unpop(vec![e(0), e(1)]);
        assert_eq!(s.len(), 5);
        assert_eq!(s.pop(2).unwrap(), vec![e(0), e(1)]);
        s.push(&[e(5)]).unwrap();
        assert_eq!(s.peek(0).unwrap(), Some(e(2)));
        assert_eq!(s.peek(3).unwrap(), Some(e(5)));
        assert_eq!(s.peek(4).unwrap(), None);
        assert_eq!(s.pop(10).unwrap(), vec![e(2), e(3), e(4), e(5)]);
        assert!(s.is_empty());
        // A batch big enough to be written goes through the file and back.
        let many: Vec<_> = (0..3000).map(e).collect();
        s.push(&many).unwrap();
        assert!(dir.join("q.spill").exists());
        // Peeked anywhere (in the file, behind it in memory, given back in front of it)
        // without taking anything.
        s.push(&[e(3000)]).unwrap();
        let first = s.pop(2).unwrap();
        s.unpop(first);
        for i in [0u64, 1, 2, 1500, 2999, 3000] {
            assert_eq!(s.peek(i).unwrap(), Some(e(i)), "{i}");
        }
        assert_eq!(s.peek(3001).unwrap(), None);
        let mut many = many;
        many.push(e(3000));
        assert_eq!(s.clear().unwrap(), many);
        drop(s);
        assert!(!dir.join("q.spill").exists());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A full disk refuses the writes: every entry stays, in order, and the file takes them
    /// once it can.
    #[test]
    fn entries_the_disk_refuses_are_kept_in_order_and_written_later() {
        let dir = dir("full");
        let fault = SpillFault::default();
        let mut s = SpillFile::new(dir.join("q.spill")).with_fault(Some(fault.clone()));
        // Some entries in the file before the disk fills.
        s.push(&(0..TAIL_MAX as u64).map(e).collect::<Vec<_>>())
            .unwrap();
        assert!(!s.is_stalled());
        fault.set(true);
        let mut failures = 0;
        for i in TAIL_MAX as u64..5000 {
            failures += usize::from(s.push(&[e(i)]).is_err());
        }
        assert!(failures > 0 && s.is_stalled());
        // Retried once per batch gathered, not on every push.
        assert!(failures <= 4, "{failures} write attempts");
        assert_eq!(s.len(), 5000);
        assert!(s.retry().is_err());
        // Half read back while the disk is still full.
        assert_eq!(
            s.pop(2500).unwrap(),
            (0..TAIL_MAX as u64).map(e).collect::<Vec<_>>()
        );
        let mid = s.pop(1476).unwrap();
        assert_eq!(mid, (TAIL_MAX as u64..2500).map(e).collect::<Vec<_>>());
        fault.set(false);
        s.retry().unwrap();
        assert!(!s.is_stalled());
        s.push(&[e(5000)]).unwrap();
        assert_eq!(s.len(), 2501);
        assert_eq!(s.clear().unwrap(), (2500..5001).map(e).collect::<Vec<_>>());
        drop(s);
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A spill file that cannot even be created keeps its entries too.
    #[test]
    fn an_uncreatable_file_keeps_its_entries() {
        let dir = dir("nodir");
        std::fs::create_dir_all(&dir).unwrap();
        // A regular file where the directory should be.
        std::fs::write(dir.join("blocker"), b"x").unwrap();
        let mut s = SpillFile::new(dir.join("blocker").join("q.spill"));
        let all: Vec<_> = (0..2500).map(e).collect();
        assert!(s.push(&all).is_err());
        assert_eq!(s.len(), 2500);
        assert_eq!(s.clear().unwrap(), all);
        let _ = std::fs::remove_dir_all(dir);
    }
}
