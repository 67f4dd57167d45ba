//! Unacknowledged deliveries a channel holds by their store location.
//!
//! A consumer that never acknowledges (prefetch 0) would otherwise keep every message it was
//! sent in memory until it disconnects. Beyond the channel's in-memory bound
//! (`unacked_window`, `unacked_window_bytes`), a delivery is kept as a 40-byte [`Entry`]:
//! delivery tag, queue position, store location, flags, and an index into a small table of
//! (queue, consumer tag) pairs. The body is in the store (a persistent message of a durable
//! queue is there already; another is written as a transient page) and is read back only if
//! the message is requeued or dead-lettered.
//!
//! Entries are kept in delivery-tag order (tags increase with each delivery), in fixed-size
//! blocks (so that memory follows the count, without a doubling buffer's leftovers). A
//! settled entry becomes a tombstone until the front is cleared or tombstones outnumber live
//! entries, so one long-unacknowledged delivery at the front costs no more than itself.

use std::sync::Arc;
use warren_broker::blocks::Blocks;
use warren_broker::queue::PagedSettlement;
use warren_broker::Queue;
use warren_store::spill::SpillEntry;
use warren_store::Location;

const LIVE: u8 = 1;
const REDELIVERED: u8 = 2;
const TRANSIENT: u8 = 4;

/// One delivery held by its store location.
#[derive(Debug, Clone, Copy)]
struct Entry {
    tag: u64,
    seq: u64,
    location: Location,
    route: u32,
    flags: u8,
    priority: u8,
}

/// The queue a delivery came from and the consumer it went to.
struct Route {
    queue: Arc<Queue>,
    consumer_tag: Option<Arc<str>>,
    /// Live entries using this route.
    refs: usize,
}

/// A delivery held, as the acknowledgement timeout looks at it: its tag, queue and consumer
/// tag (`None` for basic.get).
pub(crate) type HeldDelivery<'a> = (u64, &'a Arc<Queue>, Option<&'a Arc<str>>);

/// A delivery taken out to be settled.
pub(crate) struct Taken {
    pub queue: Arc<Queue>,
    pub settlement: PagedSettlement,
}

/// The deliveries of one channel held by store location, in delivery-tag order.
#[derive(Default)]
pub(crate) struct PagedUnacked {
    entries: Blocks<Entry>,
    live: usize,
    /// Routes by index; a slot is emptied when no entry uses it any more.
    routes: Vec<Option<Route>>,
}

impl PagedUnacked {
    /// Deliveries held.
    pub fn len(&self) -> usize {
        self.live
    }

    /// The oldest delivery held (the lowest tag): its tag, queue and consumer tag (`None`
    /// for basic.get). Settled entries are cleared from the front, so this looks at the
    /// first live entry only.
    pub fn oldest(&self) -> Option<HeldDelivery<'_>> {
        let e = self.entries.iter().find(|e| e.flags & LIVE != 0)?;
        let route = self.routes[e.route as usize]
            .as_ref()
            .expect("a live entry's route is set");
        Some((e.tag, &route.queue, route.consumer_tag.as_ref()))
    }

    /// True when delivery `tag` is held here.
    pub fn contains(&self, tag: u64) -> bool {
        self.entries
            .find(&tag, |e| e.tag)
            .is_some_and(|e| e.flags & LIVE != 0)
    }

    /// Holds delivery `tag` (greater than every tag held) of `queue` to `consumer_tag`.
    pub fn push(
        &mut self,
        tag: u64,
        queue: &Arc<Queue>,
        consumer_tag: Option<Arc<str>>,
        e: SpillEntry,
    ) {
        debug_assert!(self.entries.back().is_none_or(|b| b.tag < tag));
        let same = |r: &Option<Route>| {
            r.as_ref()
                .is_some_and(|r| Arc::ptr_eq(&r.queue, queue) && r.consumer_tag == consumer_tag)
        };
        let route = match self.routes.iter().rposition(same) {
            Some(i) => i,
            None => {
                let r = Some(Route {
                    queue: queue.clone(),
                    consumer_tag,
                    refs: 0,
                });
                match self.routes.iter().position(Option::is_none) {
                    Some(i) => {
                        self.routes[i] = r;
                        i
                    }
                    None => {
                        self.routes.push(r);
                        self.routes.len() - 1
                    }
                }
            }
        };
        if let Some(r) = self.routes[route].as_mut() {
            r.refs += 1;
        }
        let flags = LIVE
            | if e.redelivered { REDELIVERED } else { 0 }
            | if e.transient { TRANSIENT } else { 0 };
        self.entries.push_back(Entry {
            tag,
            seq: e.seq,
            location: e.location,
            route: route as u32,
            flags,
            priority: e.priority,
        });
        self.live += 1;
    }

    /// Settles entry `e` (already marked dead in `entries`).
    fn take(&mut self, e: Entry, requeue: bool, rejected: bool) -> Taken {
        self.live -= 1;
        let slot = &mut self.routes[e.route as usize];
        let route = slot.as_mut().expect("a live entry's route is set");
        route.refs -= 1;
        let taken = Taken {
            queue: route.queue.clone(),
            settlement: PagedSettlement {
                consumer_tag: route.consumer_tag.clone(),
                entry: SpillEntry {
                    seq: e.seq,
                    id: e.seq,
                    location: e.location,
                    redelivered: e.flags & REDELIVERED != 0,
                    transient: e.flags & TRANSIENT != 0,
                    priority: e.priority,
                },
                requeue,
                rejected,
            },
        };
        if route.refs == 0 {
            *slot = None;
        }
        taken
    }

    /// Drops tombstones at the front, and all of them once they outnumber live entries; gives
    /// memory back once most of it is unused.
    fn tidy(&mut self) {
        while self.entries.front().is_some_and(|e| e.flags & LIVE == 0) {
            self.entries.pop_front();
        }
        if self.entries.len() > 2 * self.live + 64 {
            self.entries.retain(|e| e.flags & LIVE != 0);
        }
    }

    /// Takes delivery `tag` out to be settled.
    pub fn remove(&mut self, tag: u64, requeue: bool, rejected: bool) -> Option<Taken> {
        let e = self
            .entries
            .find_mut(&tag, |e| e.tag)
            .filter(|e| e.flags & LIVE != 0)?;
        e.flags &= !LIVE;
        let e = *e;
        let t = self.take(e, requeue, rejected);
        self.tidy();
        Some(t)
    }

    /// Takes up to [`CHUNK`] deliveries with a tag up to `tag`, oldest first. Callers take
    /// and settle chunk after chunk (with no lock held while settling), so that settling a
    /// million of them never holds a million at once.
    pub fn take_upto(&mut self, tag: u64, requeue: bool, rejected: bool) -> Vec<Taken> {
        let mut chunk = Vec::new();
        for e in self.entries.iter_mut() {
            if e.tag > tag || chunk.len() == CHUNK {
                break;
            }
            if e.flags & LIVE != 0 {
                e.flags &= !LIVE;
                chunk.push(*e);
            }
        }
        let out = chunk
            .into_iter()
            .map(|e| self.take(e, requeue, rejected))
            .collect();
        self.tidy();
        out
    }
}

/// Most deliveries taken out and settled at a time.
pub(crate) const CHUNK: usize = 256;

/// Settles taken deliveries with their queues (a rejected one is read back to be
/// dead-lettered).
pub(crate) fn settle(channel_key: u64, taken: Vec<Taken>) {
    let mut by_queue: Vec<(Arc<Queue>, Vec<PagedSettlement>)> = Vec::new();
    for t in taken {
        match by_queue.iter_mut().find(|(q, _)| Arc::ptr_eq(q, &t.queue)) {
            Some((_, v)) => v.push(t.settlement),
            None => by_queue.push((t.queue, vec![t.settlement])),
        }
    }
    for (q, s) in by_queue {
        q.settle_paged(channel_key, s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_amqp::table::FieldTable;

    fn entry(seq: u64) -> SpillEntry {
        SpillEntry {
            seq,
            id: seq,
            location: Location {
                segment: 1,
                offset: seq * 100,
                len: 100,
            },
            redelivered: seq.is_multiple_of(2),
            transient: seq.is_multiple_of(3),
            priority: (seq % 4) as u8,
        }
    }

    #[test]
    fn entries_are_small() {
        assert!(
            std::mem::size_of::<Entry>() <= 40,
            "{}",
            std::mem::size_of::<Entry>()
        );
    }

    #[test]
    fn settles_by_tag_and_keeps_memory_bounded_behind_a_stuck_front() {
        let q: Arc<Queue> = Arc::new(warren_broker::ClassicQueue::new(
            "q",
            "/",
            false,
            None,
            false,
            FieldTable::new(),
        ));
        let mut p = PagedUnacked::default();
        let tag: Arc<str> = "c".into();
        for t in 1..=10_000u64 {
            p.push(t, &q, Some(tag.clone()), entry(t + 100));
        }
        assert_eq!(p.len(), 10_000);
        // Tag 1 is never settled; everything after it is, one at a time.
        for t in 2..=10_000u64 {
            let taken = p.remove(t, false, false).unwrap();
            assert_eq!(taken.settlement.entry, entry(t + 100));
            assert_eq!(taken.settlement.consumer_tag.as_deref(), Some("c"));
        }
        assert!(p.remove(5, false, false).is_none());
        assert_eq!(p.len(), 1);
        assert!(
            p.entries.len() <= 64 + 2,
            "{} entries kept",
            p.entries.len()
        );
        assert!(p.contains(1));
        assert_eq!(
            p.oldest().map(|(t, _, c)| (t, c.cloned())),
            Some((1, Some(tag.clone())))
        );
        for t in 10_001..=10_010u64 {
            p.push(t, &q, None, entry(t));
        }
        let upto = p.take_upto(10_005, true, false);
        assert_eq!(
            upto.iter()
                .map(|t| t.settlement.entry.seq)
                .collect::<Vec<_>>(),
            [101, 10_001, 10_002, 10_003, 10_004, 10_005]
        );
        assert!(upto.iter().all(|t| t.settlement.requeue));
        assert_eq!(p.take_upto(u64::MAX, false, false).len(), 5);
        assert_eq!(p.len(), 0);
        assert!(p.routes.iter().all(Option::is_none));
        // Taken a chunk at a time; memory goes back once empty.
        for t in 20_000..21_000u64 {
            p.push(t, &q, None, entry(t));
        }
        let mut chunks = 0;
        while !p.take_upto(u64::MAX, true, false).is_empty() {
            chunks += 1;
        }
        assert_eq!(chunks, 1000usize.div_ceil(CHUNK));
        assert!(p.entries.is_empty());
    }
}
