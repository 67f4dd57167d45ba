//! A quorum queue's Raft log storage: openraft's `RaftLogStorage` on the node's shared log
//! (warren-store's `raftlog`), so that every queue of the node shares its fsyncs.
//!
//! The entries of a group are also kept in memory (decoded) until purged: openraft reads them
//! back to apply and to replicate them, and a published message's body is the same buffer in
//! the entry and in the queue. An entry is reported flushed only from the shared log's writer,
//! after the fdatasync that covers it. A vote is saved the same way and waited for.
//!
//! Entry encoding: `u64 term, u64 leader node, u64 index, u8 kind` then the payload: nothing for a blank entry,
//! the [`Batch`] for a normal one, the membership as JSON.

use crate::command::Batch;
use crate::TypeConfig;
use bytes::{BufMut, Bytes, BytesMut};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{
    CommittedLeaderId, Entry, EntryPayload, LogId, LogState, RaftLogReader, StorageError,
    StorageIOError, Vote,
};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;
use warren_store::raftlog::{GroupLog, MetaKind, RaftLog};

type NodeId = u64;

/// Encodes a log entry for the shared log (and the inter-node transport).
pub fn encode_entry(e: &Entry<TypeConfig>) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u64(e.log_id.leader_id.term);
    b.put_u64(e.log_id.leader_id.node_id);
    b.put_u64(e.log_id.index);
    match &e.payload {
        EntryPayload::Blank => b.put_u8(0),
        EntryPayload::Normal(batch) => {
            b.put_u8(1);
            batch.encode(&mut b);
        }
        EntryPayload::Membership(m) => {
            b.put_u8(2);
            b.put_slice(&serde_json::to_vec(m).unwrap_or_default());
        }
    }
    b.freeze()
}

/// Decodes an entry written by [`encode_entry`].
pub fn decode_entry(b: &Bytes) -> Result<Entry<TypeConfig>, String> {
    if b.len() < 25 {
        return Err("entry too short".into());
    }
    let word = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
    let (term, node, index) = (word(0), word(8), word(16));
    let payload = match b[24] {
        0 => EntryPayload::Blank,
        1 => EntryPayload::Normal(Batch::decode(&b.slice(25..)).map_err(|e| e.to_string())?),
        2 => EntryPayload::Membership(
            serde_json::from_slice(&b[25..]).map_err(|e| format!("membership: {e}"))?,
        ),
        k => return Err(format!("unknown entry kind {k}")),
    };
    Ok(Entry {
        log_id: LogId::new(CommittedLeaderId::new(term, node), index),
        payload,
    })
}

fn io_err(e: impl std::fmt::Display) -> StorageError<NodeId> {
    StorageIOError::write(&std::io::Error::other(e.to_string())).into()
}

#[derive(Default)]
struct Held {
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    vote: Option<Vote<NodeId>>,
    committed: Option<LogId<NodeId>>,
    purged: Option<LogId<NodeId>>,
}

/// One group's log: its entries in memory, written through the shared log.
#[derive(Clone)]
pub struct LogStore {
    group: Arc<str>,
    log: RaftLog,
    held: Arc<Mutex<Held>>,
}

impl LogStore {
    /// The log of group `group`, with what recovery found of it.
    pub fn new(group: &str, log: RaftLog, recovered: GroupLog) -> Result<LogStore, String> {
        let mut held = Held::default();
        for (index, raw) in recovered.entries {
            let e = decode_entry(&raw).map_err(|e| format!("entry {index}: {e}"))?;
            held.entries.insert(index, e);
        }
        held.vote = recovered.vote.and_then(|v| serde_json::from_slice(&v).ok());
        held.committed = recovered
            .committed
            .and_then(|v| serde_json::from_slice(&v).ok());
        held.purged = recovered
            .purged
            .and_then(|(_, v)| serde_json::from_slice(&v).ok());
        Ok(LogStore {
            group: group.into(),
            log,
            held: Arc::new(Mutex::new(held)),
        })
    }

    /// The entries held, up to index `last` included, in order.
    pub fn entries_through(&self, last: u64) -> Vec<Entry<TypeConfig>> {
        self.held
            .lock()
            .entries
            .range(..=last)
            .map(|(_, e)| e.clone())
            .collect()
    }

    /// Forgets the group in the shared log (its queue was deleted).
    pub fn drop_group(&self) {
        self.log.drop_group(&self.group, None);
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let held = self.held.lock();
        Ok(held.entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let held = self.held.lock();
        let last = held
            .entries
            .last_key_value()
            .map(|(_, e)| e.log_id)
            .or(held.purged);
        Ok(LogState {
            last_purged_log_id: held.purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        let value = serde_json::to_vec(vote).map_err(io_err)?;
        self.held.lock().vote = Some(*vote);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.log.save_meta(
            &self.group,
            MetaKind::Vote,
            &value,
            Some(Box::new(move |ok| {
                let _ = tx.send(ok);
            })),
        );
        match rx.await {
            Ok(true) => Ok(()),
            _ => Err(io_err("the vote could not be written")),
        }
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.held.lock().vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        self.held.lock().committed = committed;
        let value = serde_json::to_vec(&committed).map_err(io_err)?;
        self.log
            .save_meta(&self.group, MetaKind::Committed, &value, None);
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.held.lock().committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut encoded = Vec::new();
        {
            let mut held = self.held.lock();
            for e in entries {
                encoded.push((e.log_id.index, encode_entry(&e)));
                if let Some((first, _)) = encoded.first() {
                    if encoded.len() == 1 {
                        held.entries.split_off(first);
                    }
                }
                held.entries.insert(e.log_id.index, e);
            }
        }
        self.log.append(
            &self.group,
            &encoded,
            Some(Box::new(move |ok| {
                callback.log_io_completed(if ok {
                    Ok(())
                } else {
                    Err(std::io::Error::other("raft log write failed"))
                })
            })),
        );
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        self.held.lock().entries.split_off(&log_id.index);
        self.log.truncate(&self.group, log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let meta = serde_json::to_vec(&log_id).map_err(io_err)?;
        {
            let mut held = self.held.lock();
            let keep = held.entries.split_off(&(log_id.index + 1));
            held.entries = keep;
            held.purged = Some(log_id);
        }
        self.log.purge(&self.group, log_id.index, &meta);
        Ok(())
    }
}
