//! A quorum queue's Raft state machine: applies committed entries to the queue (see
//! [`crate::queue::QuorumQueue::apply`]) and keeps its snapshots.
//!
//! A snapshot is the whole queue state (messages included, see
//! [`crate::state::QueueState::encode`]) with openraft's metadata, written to
//! `<quorum dir>/snapshots/<group hex>.snap` through a temporary file, fsync and rename. At
//! start the queue loads it before its Raft instance replays the log entries after it.
//!
//! File format: `WQSNAP1\n`, `u32` length + JSON metadata, then the state.
//!
//! A snapshot file that cannot be written (a full disk) is written again every second until
//! it is: openraft stops a group for good on a state machine error, which would leave the
//! queue refusing every publish until the broker restarts. A snapshot this member builds is
//! written in the background and the group carries on meanwhile (its log is purged only
//! once the snapshot is durable); one received from the leader holds up the member's state
//! machine until it is written.

use crate::queue::QuorumQueue;
use crate::TypeConfig;
use bytes::{BufMut, Bytes, BytesMut};
use openraft::storage::RaftStateMachine;
use openraft::{
    BasicNode, Entry, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError,
    StorageIOError, StoredMembership,
};
use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::time::Duration;
use tracing::{info, warn};
use warren_broker::queue::QueueBackend;

type NodeId = u64;
type Meta = SnapshotMeta<NodeId, BasicNode>;

const MAGIC: &[u8] = b"WQSNAP1\n";

/// How long a snapshot whose file could not be written waits before it is written again.
const SNAPSHOT_RETRY: Duration = Duration::from_secs(1);

fn io_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write(&std::io::Error::other(e.to_string())).into()
}

/// Encodes a snapshot file's contents.
pub fn encode_snapshot(meta: &Meta, state: &[u8]) -> Bytes {
    let json = serde_json::to_vec(meta).unwrap_or_default();
    let mut b = BytesMut::with_capacity(MAGIC.len() + 4 + json.len() + state.len());
    b.put_slice(MAGIC);
    b.put_u32(json.len() as u32);
    b.put_slice(&json);
    b.put_slice(state);
    b.freeze()
}

/// Splits a snapshot file's contents into its metadata and state.
pub fn decode_snapshot(b: &Bytes) -> Result<(Meta, Bytes), String> {
    if b.len() < MAGIC.len() + 4 || &b[..MAGIC.len()] != MAGIC {
        return Err("not a quorum queue snapshot".into());
    }
    let at = MAGIC.len();
    let n = u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes")) as usize;
    let start = at + 4;
    if b.len() < start + n {
        return Err("snapshot metadata cut short".into());
    }
    let meta: Meta =
        serde_json::from_slice(&b[start..start + n]).map_err(|e| format!("snapshot meta: {e}"))?;
    Ok((meta, b.slice(start + n..)))
}

/// Writes `data` to `path` durably (temporary file, fsync, rename, directory fsync). On a
/// failure the temporary file is removed, so that a partial copy does not hold the space.
pub fn write_file(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    let written = std::fs::File::create(&tmp).and_then(|mut f| {
        f.write_all(data)?;
        f.sync_all()
    });
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Writes the snapshot file of `queue`, again every [`SNAPSHOT_RETRY`] until it succeeds;
/// gives up (with the error) only once the queue is gone or deleted.
async fn write_snapshot(
    queue: &Weak<QuorumQueue>,
    path: &Path,
    data: Bytes,
) -> Result<(), StorageError<NodeId>> {
    let mut failing = false;
    loop {
        let (p, d) = (path.to_path_buf(), data.clone());
        let res = tokio::task::spawn_blocking(move || write_file(&p, &d))
            .await
            .map_err(io_err)?;
        match res {
            Ok(()) => {
                if failing {
                    info!(path = %path.display(), "quorum queue snapshot written");
                }
                return Ok(());
            }
            Err(e) => {
                if queue.upgrade().is_none_or(|q| q.is_deleted()) {
                    return Err(io_err(e));
                }
                if !failing {
                    warn!(path = %path.display(), error = %e, "cannot write quorum queue snapshot; writing it again every second");
                    failing = true;
                }
                tokio::time::sleep(SNAPSHOT_RETRY).await;
            }
        }
    }
}

/// The state machine openraft drives: the queue itself.
pub struct StateMachine {
    pub(crate) queue: Weak<QuorumQueue>,
    pub(crate) path: PathBuf,
}

fn gone() -> StorageError<NodeId> {
    io_err("the queue is gone")
}

/// Builds a snapshot from the queue's state at the moment of the call.
pub struct Builder {
    queue: Weak<QuorumQueue>,
    path: PathBuf,
}

impl RaftSnapshotBuilder<TypeConfig> for Builder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<NodeId>> {
        let q = self
            .queue
            .upgrade()
            .ok_or_else(|| io_err("the queue is gone"))?;
        let (state, last_applied, membership) = q.snapshot_state();
        let id = format!(
            "{}-{}",
            last_applied.map_or(0, |l| l.leader_id.term),
            last_applied.map_or(0, |l| l.index)
        );
        let meta = Meta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id: id,
        };
        drop(q);
        let data = encode_snapshot(&meta, &state);
        write_snapshot(&self.queue, &self.path, data).await?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(state.to_vec())),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Builder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<NodeId>>, StoredMembership<NodeId, BasicNode>), StorageError<NodeId>>
    {
        Ok(self.queue.upgrade().ok_or_else(gone)?.applied_state())
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<()>, StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let n = entries.len();
        self.queue.upgrade().ok_or_else(gone)?.apply(entries);
        Ok(vec![(); n])
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        Builder {
            queue: self.queue.clone(),
            path: self.path.clone(),
        }
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<Cursor<Vec<u8>>>, StorageError<NodeId>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<NodeId>> {
        let bytes = Bytes::from(snapshot.into_inner());
        let state = crate::state::QueueState::decode(&bytes).map_err(io_err)?;
        let data = encode_snapshot(meta, &bytes);
        write_snapshot(&self.queue, &self.path, data).await?;
        self.queue.upgrade().ok_or_else(gone)?.install_state(
            state,
            meta.last_log_id,
            meta.last_membership.clone(),
        );
        Ok(())
    }

    async fn get_current_snapshot(
        &mut self,
    ) -> Result<Option<Snapshot<TypeConfig>>, StorageError<NodeId>> {
        let path = self.path.clone();
        let raw = tokio::task::spawn_blocking(move || std::fs::read(&path))
            .await
            .map_err(io_err)?;
        let raw = match raw {
            Ok(r) => Bytes::from(r),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(e)),
        };
        let (meta, state) = decode_snapshot(&raw).map_err(io_err)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(state.to_vec())),
        }))
    }
}
