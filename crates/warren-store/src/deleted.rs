//! The record of segments the store deleted itself (`<dir>/deleted-segments`), so that
//! recovery reports a gap in segment numbers only when a segment is really missing, not
//! after compaction or reclaim removed it on purpose.
//!
//! Each deletion is 8 bytes: the segment number and its bitwise complement (big-endian
//! `u32`s), written and fsynced before the segment file is removed (a crash in between
//! leaves the file, which then simply exists). A record that does not check (a torn write)
//! is ignored. Recovery keeps only the numbers that still fall in a gap between the
//! segments on disk and rewrites the file with them, so it stays as small as the gaps.
//! Writes go at the known end of the valid records, so a failed write leaves nothing that
//! shifts later records.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const FILE: &str = "deleted-segments";
const RECORD: usize = 8;

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

fn encode(segs: impl IntoIterator<Item = u32>) -> Vec<u8> {
    let mut buf = Vec::new();
    for s in segs {
        buf.extend_from_slice(&s.to_be_bytes());
        buf.extend_from_slice(&(!s).to_be_bytes());
    }
    buf
}

/// The segments recorded as deleted in `dir` (empty when there is no record).
pub(crate) fn read(dir: &Path) -> HashSet<u32> {
    let Ok(bytes) = std::fs::read(path(dir)) else {
        return HashSet::new();
    };
    bytes
        .chunks_exact(RECORD)
        .filter_map(|c| {
            let n = u32::from_be_bytes(c[..4].try_into().expect("4 bytes"));
            let check = u32::from_be_bytes(c[4..].try_into().expect("4 bytes"));
            (check == !n).then_some(n)
        })
        .collect()
}

/// Rewrites the record with `keep` only (atomically: a new file renamed over the old one).
/// On failure (a full disk) the old record stays, which is still right, only longer.
pub(crate) fn rewrite(dir: &Path, keep: &[u32]) -> std::io::Result<()> {
    let target = path(dir);
    if keep.is_empty() {
        return match std::fs::remove_file(&target) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    let tmp = dir.join(format!("{FILE}.tmp"));
    let mut f = File::create(&tmp)?;
    f.write_all(&encode(keep.iter().copied()))?;
    f.sync_all()?;
    std::fs::rename(&tmp, &target)?;
    File::open(dir)?.sync_all()
}

/// Appends deletions to the record; opened on first use.
pub(crate) struct DeletionLog {
    dir: PathBuf,
    file: Option<File>,
    /// End of the valid records.
    len: u64,
}

impl DeletionLog {
    pub(crate) fn new(dir: &Path) -> Self {
        DeletionLog {
            dir: dir.to_path_buf(),
            file: None,
            len: 0,
        }
    }

    /// Records `segs` as deleted, durably (fsynced) before returning.
    pub(crate) fn record(&mut self, segs: &[u32]) -> std::io::Result<()> {
        if self.file.is_none() {
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .read(true)
                .write(true)
                .open(path(&self.dir))?;
            // Whole records only: a torn one at the end is written over.
            self.len = f.metadata()?.len() / RECORD as u64 * RECORD as u64;
            self.file = Some(f);
        }
        let f = self.file.as_ref().expect("opened above");
        let buf = encode(segs.iter().copied());
        f.write_all_at(&buf, self.len)?;
        f.sync_data()?;
        self.len += buf.len() as u64;
        Ok(())
    }
}
