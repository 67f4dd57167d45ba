//! A queue's overflow on disk: a FIFO file of fixed-size entries pointing at messages in the
//! store, so a queue deeper than its in-memory window costs no memory per message.
//!
//! Each entry is 32 bytes: `u64 seq, u64 message id, u32 segment, u64 offset, u32 len`, with a
//! flag in the top bit of `len` for a redelivered message and one in the top bit of `segment`
//! for a transient (paged) one. The file is scratch space: it is recreated on start (recovery
//! rebuilds queues from the segments) and truncated whenever it has been read to the end.
//! A priority queue keeps one file per priority, so the priority is not written.

use crate::Location;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;

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

/// A FIFO of [`SpillEntry`] in one file.
pub struct SpillFile {
    path: PathBuf,
    file: File,
    read_pos: u64,
    write_pos: u64,
    /// Entries pushed but not yet written: spilling one message costs no syscall.
    tail: Vec<SpillEntry>,
}

/// Entries buffered in memory before they are written to the file.
const TAIL_MAX: usize = 1024;

impl SpillFile {
    /// Creates (truncating) the spill file at `path`.
    pub fn create(path: PathBuf) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        Ok(SpillFile {
            path,
            file,
            read_pos: 0,
            write_pos: 0,
            tail: Vec::new(),
        })
    }

    /// Entries waiting.
    pub fn len(&self) -> u64 {
        (self.write_pos - self.read_pos) / ENTRY as u64 + self.tail.len() as u64
    }

    /// True when nothing is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends entries at the back.
    pub fn push(&mut self, entries: &[SpillEntry]) -> std::io::Result<()> {
        self.tail.extend_from_slice(entries);
        if self.tail.len() >= TAIL_MAX {
            let tail = std::mem::take(&mut self.tail);
            self.write(&tail)?;
        }
        Ok(())
    }

    fn write(&mut self, entries: &[SpillEntry]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(entries.len() * ENTRY);
        for e in entries {
            buf.extend_from_slice(&e.seq.to_be_bytes());
            buf.extend_from_slice(&e.id.to_be_bytes());
            let seg = e.location.segment | if e.transient { TRANSIENT } else { 0 };
            buf.extend_from_slice(&seg.to_be_bytes());
            buf.extend_from_slice(&e.location.offset.to_be_bytes());
            let len = e.location.len | if e.redelivered { REDELIVERED } else { 0 };
            buf.extend_from_slice(&len.to_be_bytes());
        }
        self.file.seek(SeekFrom::Start(self.write_pos))?;
        self.file.write_all(&buf)?;
        self.write_pos += buf.len() as u64;
        Ok(())
    }

    /// Takes up to `max` entries from the front.
    pub fn pop(&mut self, max: usize) -> std::io::Result<Vec<SpillEntry>> {
        let on_disk = ((self.write_pos - self.read_pos) / ENTRY as u64) as usize;
        if on_disk == 0 {
            let n = self.tail.len().min(max);
            return Ok(self.tail.drain(..n).collect());
        }
        let n = on_disk.min(max);
        let mut buf = vec![0u8; n * ENTRY];
        self.file.seek(SeekFrom::Start(self.read_pos))?;
        self.file.read_exact(&mut buf)?;
        self.read_pos += buf.len() as u64;
        if self.read_pos == self.write_pos {
            self.read_pos = 0;
            self.write_pos = 0;
            self.file.set_len(0)?;
        }
        Ok(buf
            .chunks_exact(ENTRY)
            .map(|c| {
                let u64_at =
                    |i: usize| u64::from_be_bytes(c[i..i + 8].try_into().expect("8 bytes"));
                let u32_at =
                    |i: usize| u32::from_be_bytes(c[i..i + 4].try_into().expect("4 bytes"));
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
            })
            .collect())
    }

    /// Empties the file.
    pub fn clear(&mut self) -> std::io::Result<Vec<SpillEntry>> {
        self.pop(usize::MAX)
    }
}

impl Drop for SpillFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_round_trip() {
        let dir = std::env::temp_dir().join(format!("warren-spill-{}", std::process::id()));
        let mut s = SpillFile::create(dir.join("q.spill")).unwrap();
        let e = |i: u64| SpillEntry {
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
        };
        s.push(&(0..5).map(e).collect::<Vec<_>>()).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s.pop(2).unwrap(), vec![e(0), e(1)]);
        s.push(&[e(5)]).unwrap();
        assert_eq!(s.pop(10).unwrap(), vec![e(2), e(3), e(4), e(5)]);
        assert!(s.is_empty());
        drop(s);
        assert!(!dir.join("q.spill").exists());
        let _ = std::fs::remove_dir_all(dir);
    }
}
