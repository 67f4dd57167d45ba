//! The HTTP queue API's `opt=view`: the ready message at a position, wherever the queue keeps
//! it (in memory, requeued and paged out, or spilled beyond the in-memory window), read
//! without taking it and without changing anything in the queue.

use super::{entry_key, order_key, ClassicQueue, State};
use crate::log_limit::LogLimit;
use crate::message::QueuedMessage;
use bytes::Bytes;
use tracing::warn;
use warren_store::{Location, StoreError};

/// Where the message at a place of the queue is.
enum Held {
    /// In memory: its body.
    Body(Bytes),
    /// In the message store only.
    Stored(Location),
}

static VIEW_READ_FAILED: LogLimit = LogLimit::new();

impl ClassicQueue {
    /// The body of the ready message at position `pos` (see [`super::Positions`]: the ready
    /// messages are the positions `put - ready + 1 ..= put`, in queue order), without taking
    /// it: nothing is requeued, reordered, flagged redelivered or kept in memory.
    ///
    /// `None` for a position outside that range: not yet used, or already taken by a get or
    /// delivered to a consumer (acknowledged or not: such a message counts as read, as in
    /// httpsqs's `getpos`, until it is requeued); `None` too when the message cannot be read
    /// back from the store (an I/O error, logged) or has been consumed meanwhile.
    ///
    /// Cost, bounded whatever the depth: a message in memory is found by binary search over
    /// the in-memory window (requeued messages paged out are counted through their block
    /// index, O(their number / 512) per step); one spilled beyond the window is one 32-byte
    /// read of the spill file at a computed offset. A message not in memory is then one read
    /// of its record from the message store, done after the queue's lock is released.
    pub fn peek_position(&self, pos: u64) -> Option<Bytes> {
        let held = {
            let st = self.state.lock();
            let ready = st.ready_count() as u64;
            let first = st.put_pos.checked_sub(ready)? + 1;
            if pos < first || pos > st.put_pos {
                return None;
            }
            self.held_at(&st, pos - first)?
        };
        match held {
            Held::Body(body) => Some(body),
            Held::Stored(location) => match self.backing.as_ref()?.store.read(location) {
                Ok(m) => Some(m.body),
                // Acknowledged and its segment reclaimed since it was looked up.
                Err(StoreError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => {
                    if let Some(suppressed) = VIEW_READ_FAILED.admit() {
                        warn!(queue = %self.name, error = %e, suppressed, "view: cannot read stored message");
                    }
                    None
                }
            },
        }
    }

    /// The ready message `index` places from the head of the queue (0: the next one a
    /// consumer gets). The queue order is, by priority from the highest (a queue without
    /// priorities has one): the in-memory messages and the requeued ones paged out merged by
    /// their order, then that priority's spill file, then the messages it holds in memory
    /// because the store refused them.
    fn held_at(&self, st: &State, mut index: u64) -> Option<Held> {
        let max = st.priority;
        for level in (0..=max.unwrap_or(0)).rev() {
            // The first part of [`order_key`] of this priority.
            let rank = max.map_or(0, |m| m - level);
            let r0 = st.ready.partition_point(|m| order_key(m, max).0 < rank);
            let r1 = st.ready.partition_point(|m| order_key(m, max).0 <= rank);
            let p0 = st.paged.partition_point(|e| entry_key(e, max).0 < rank);
            let p1 = st.paged.partition_point(|e| entry_key(e, max).0 <= rank);
            let (nr, np) = (r1 - r0, p1 - p0);
            if index < (nr + np) as u64 {
                let i = index as usize;
                if np == 0 {
                    return Some(Held::Body(st.ready[r0 + i].message.body.clone()));
                }
                // In the merge of the two sorted runs, in-memory message j is at
                // j + (paged entries before it), which increases with j.
                let merged = |j: usize| {
                    let m: &QueuedMessage = &st.ready[r0 + j];
                    let k = order_key(m, max);
                    j + st.paged.partition_point(|e| entry_key(e, max) < k) - p0
                };
                let (mut lo, mut hi) = (0, nr);
                while lo < hi {
                    let mid = lo + (hi - lo) / 2;
                    if merged(mid) < i {
                        lo = mid + 1;
                    } else {
                        hi = mid;
                    }
                }
                // `lo` in-memory messages come before place i.
                if lo < nr && merged(lo) == i {
                    return Some(Held::Body(st.ready[r0 + lo].message.body.clone()));
                }
                return st.paged.get(p0 + i - lo).map(|e| Held::Stored(e.location));
            }
            index -= (nr + np) as u64;
            let Some(Some(spilled)) = st.spills.get(usize::from(level)) else {
                continue;
            };
            let in_file = spilled.file.len();
            if index < in_file {
                return match spilled.file.peek(index) {
                    Ok(e) => e.map(|e| Held::Stored(e.location)),
                    Err(e) => {
                        if let Some(suppressed) = VIEW_READ_FAILED.admit() {
                            warn!(queue = %self.name, error = %e, suppressed, "view: cannot read spill file");
                        }
                        None
                    }
                };
            }
            index -= in_file;
            if let Some(qm) = usize::try_from(index)
                .ok()
                .and_then(|i| spilled.held.get(i))
            {
                return Some(Held::Body(qm.message.body.clone()));
            }
            index -= spilled.held.len() as u64;
        }
        None
    }
}
