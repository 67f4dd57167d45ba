//! The HTTP queue API's own durable state: per queue, the put position checkpoint
//! ([`warren_broker::queue::Positions`]) and the `maxqueue` set by `opt=maxqueue`.
//!
//! Kept in one small JSON file (`<data_dir>/httpmq/state.json`), replaced atomically (written
//! to a temporary file, fsynced, renamed, directory fsynced), so that a crash leaves either
//! the old or the new file. The messages themselves are in the message store; this file only
//! holds what the store does not know.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One queue's entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QueueState {
    /// Put position at the checkpoint.
    pub putpos: u64,
    /// Get position at the checkpoint (`putpos - ready`).
    pub getpos: u64,
    /// The queue's maximum set by `opt=maxqueue` (`None`: the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maxqueue: Option<u64>,
}

/// The whole file: queues by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateFile {
    /// Queues of the API's vhost by name.
    pub queues: BTreeMap<String, QueueState>,
}

impl StateFile {
    /// Reads `path`; a missing file is an empty state.
    ///
    /// Errors: the file exists but cannot be read or is not this format.
    pub fn load(path: &Path) -> std::io::Result<StateFile> {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", path.display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(StateFile::default()),
            Err(e) => Err(e),
        }
    }

    /// Replaces `path` atomically with this state, durably (fsync of the file and of its
    /// directory).
    ///
    /// Errors: the directory cannot be created or written.
    pub fn store(&self, path: &Path) -> std::io::Result<()> {
        let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
        std::fs::create_dir_all(&dir)?;
        let tmp: PathBuf = path.with_extension("json.tmp");
        let text = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&text)?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_missing_file() {
        let dir = std::env::temp_dir().join(format!("warren-httpmq-state-{}", std::process::id()));
        let path = dir.join("state.json");
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(StateFile::load(&path).unwrap(), StateFile::default());
        let mut s = StateFile::default();
        s.queues.insert(
            "a".into(),
            QueueState {
                putpos: 7,
                getpos: 3,
                maxqueue: Some(10),
            },
        );
        s.store(&path).unwrap();
        assert_eq!(StateFile::load(&path).unwrap(), s);
        std::fs::write(&path, b"{not json").unwrap();
        assert!(StateFile::load(&path).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
