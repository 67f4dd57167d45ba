//! An ordered double-ended queue kept in fixed-size blocks.
//!
//! The per-message indexes that grow with a backlog (a queue's requeued messages paged out, a
//! channel's unacknowledged deliveries held by store location) can reach millions of entries.
//! A `VecDeque` grows by doubling, and an allocator may keep the old buffer of every
//! doubling: as much memory again as the index itself. [`Blocks`] grows and shrinks one block
//! of [`BLOCK`] entries at a time instead, so its memory follows its length.

use std::collections::VecDeque;

/// Entries per block.
pub const BLOCK: usize = 512;

/// A deque of `T` in blocks of [`BLOCK`]. Callers that keep it sorted use
/// [`Blocks::insert_sorted`] and [`Blocks::find_mut`].
///
/// An empty deque is 16 bytes and allocates nothing: every queue keeps one (its requeued
/// paged-out messages), nearly always empty.
#[derive(Debug)]
pub struct Blocks<T> {
    /// The blocks, in order; `None` while there are none.
    #[allow(clippy::box_collection)]
    blocks: Option<Box<VecDeque<VecDeque<T>>>>,
    len: usize,
}

impl<T> Default for Blocks<T> {
    fn default() -> Self {
        Blocks {
            blocks: None,
            len: 0,
        }
    }
}

impl<T> Blocks<T> {
    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The blocks, in order (none when empty).
    fn list(&self) -> impl DoubleEndedIterator<Item = &VecDeque<T>> {
        self.blocks.iter().flat_map(|l| l.iter())
    }

    /// The first entry.
    pub fn front(&self) -> Option<&T> {
        self.list().next().and_then(VecDeque::front)
    }

    /// The last entry.
    pub fn back(&self) -> Option<&T> {
        self.list().next_back().and_then(VecDeque::back)
    }

    /// Appends at the back.
    pub fn push_back(&mut self, v: T) {
        let list = self.blocks.get_or_insert_with(Default::default);
        if list.back().is_none_or(|b| b.len() >= BLOCK) {
            list.push_back(VecDeque::with_capacity(BLOCK));
        }
        list.back_mut().expect("pushed above").push_back(v);
        self.len += 1;
    }

    /// Takes the first entry.
    pub fn pop_front(&mut self) -> Option<T> {
        let list = self.blocks.as_mut()?;
        let first = list.front_mut()?;
        let v = first.pop_front();
        if first.is_empty() {
            list.pop_front();
            if list.is_empty() {
                self.blocks = None;
            }
        }
        if v.is_some() {
            self.len -= 1;
        }
        v
    }

    /// Inserts `v` after every entry whose key is not greater, in a deque sorted by `key`.
    /// Appending (the usual case) costs no search.
    pub fn insert_sorted<K: Ord>(&mut self, v: T, key: impl Fn(&T) -> K) {
        let k = key(&v);
        if self.back().is_none_or(|b| key(b) <= k) {
            return self.push_back(v);
        }
        // The last block whose first entry is not after `v` (or the first block).
        let list = self.blocks.as_mut().expect("not empty: it has a back");
        let b = list
            .partition_point(|blk| blk.front().is_some_and(|f| key(f) <= k))
            .saturating_sub(1);
        let block = &mut list[b];
        let at = block.partition_point(|x| key(x) <= k);
        block.insert(at, v);
        if block.len() > BLOCK {
            let tail = block.split_off(BLOCK / 2);
            list.insert(b + 1, tail);
        }
        self.len += 1;
    }

    /// The entry whose key is `k`, in a deque sorted by `key` with distinct keys.
    pub fn find<K: Ord>(&self, k: &K, key: impl Fn(&T) -> K) -> Option<&T> {
        let list = self.blocks.as_ref()?;
        let b = list
            .partition_point(|blk| blk.front().is_some_and(|f| key(f) <= *k))
            .checked_sub(1)?;
        let block = &list[b];
        let at = block.partition_point(|x| key(x) < *k);
        block.get(at).filter(|x| key(x) == *k)
    }

    /// [`Blocks::find`], mutably.
    pub fn find_mut<K: Ord>(&mut self, k: &K, key: impl Fn(&T) -> K) -> Option<&mut T> {
        let list = self.blocks.as_mut()?;
        let b = list
            .partition_point(|blk| blk.front().is_some_and(|f| key(f) <= *k))
            .checked_sub(1)?;
        let block = &mut list[b];
        let at = block.partition_point(|x| key(x) < *k);
        block.get_mut(at).filter(|x| key(x) == *k)
    }

    /// The entry at `index` (0: the front). Walks the blocks: O(len / [`BLOCK`]).
    pub fn get(&self, mut index: usize) -> Option<&T> {
        for b in self.list() {
            if index < b.len() {
                return b.get(index);
            }
            index -= b.len();
        }
        None
    }

    /// The number of leading entries `pred` accepts, in a deque where it accepts a prefix
    /// (as `slice::partition_point`). O(len / [`BLOCK`] + log len).
    pub fn partition_point(&self, pred: impl Fn(&T) -> bool) -> usize {
        let Some(list) = &self.blocks else {
            return 0;
        };
        let whole = list.partition_point(|blk| blk.back().is_some_and(&pred));
        let before: usize = list.iter().take(whole).map(VecDeque::len).sum();
        before + list.get(whole).map_or(0, |blk| blk.partition_point(&pred))
    }

    /// Entries in order, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> {
        self.blocks
            .iter_mut()
            .flat_map(|l| l.iter_mut())
            .flat_map(|b| b.iter_mut())
    }

    /// Entries in order.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.list().flat_map(|b| b.iter())
    }

    /// Keeps the entries `f` accepts; blocks left small are merged with their neighbour.
    pub fn retain(&mut self, mut f: impl FnMut(&T) -> bool) {
        let mut out: VecDeque<VecDeque<T>> = VecDeque::new();
        for mut block in std::mem::take(&mut self.blocks)
            .into_iter()
            .flat_map(|l| *l)
        {
            block.retain(&mut f);
            match out.back_mut() {
                Some(last) if last.len() + block.len() <= BLOCK => last.extend(block),
                _ if block.is_empty() => {}
                _ => {
                    block.shrink_to(BLOCK);
                    out.push_back(block)
                }
            }
        }
        self.len = out.iter().map(VecDeque::len).sum();
        self.blocks = (!out.is_empty()).then(|| Box::new(out));
    }

    /// Takes every entry, in order.
    pub fn drain(&mut self) -> impl Iterator<Item = T> {
        self.len = 0;
        std::mem::take(&mut self.blocks)
            .into_iter()
            .flat_map(|l| *l)
            .flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_order_across_blocks() {
        let mut b = Blocks::default();
        for i in 0..3000u32 {
            b.push_back(i * 2);
        }
        // Odd keys go between the even ones, splitting full blocks.
        for i in (0..3000u32).rev().step_by(7) {
            b.insert_sorted(i * 2 + 1, |x| *x);
        }
        b.insert_sorted(0, |x| *x);
        let all: Vec<u32> = b.iter().copied().collect();
        assert!(all.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(all.len(), b.len());
        assert_eq!(*b.find_mut(&(3 * 2 + 1), |x| *x).unwrap(), 7);
        assert!(b.find(&15, |x| *x).is_none());
        assert!(b.find_mut(&3, |x| *x).is_none());
        assert!(b.find_mut(&100_000, |x| *x).is_none());
        for (i, v) in all.iter().enumerate().step_by(97) {
            assert_eq!(b.get(i), Some(v));
            assert_eq!(b.partition_point(|x| x < v), all.partition_point(|x| x < v));
        }
        assert_eq!(b.get(all.len()), None);
        assert_eq!(b.partition_point(|_| true), all.len());
        assert_eq!(b.partition_point(|_| false), 0);
        b.retain(|x| x % 3 == 0);
        let kept: Vec<u32> = b.iter().copied().collect();
        assert!(kept.iter().all(|x| x % 3 == 0) && kept.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(b.pop_front(), Some(0));
        assert_eq!(b.pop_front(), Some(0));
        let rest: Vec<u32> = b.drain().collect();
        assert_eq!(rest.len(), kept.len() - 2);
        assert!(b.is_empty() && b.front().is_none());
    }

    #[test]
    fn memory_follows_length() {
        let mut b = Blocks::default();
        for i in 0..100_000u64 {
            b.push_back(i);
        }
        assert_eq!(b.list().count(), 100_000usize.div_ceil(BLOCK));
        while b.len() > 10 {
            b.pop_front();
        }
        assert_eq!(b.list().count(), 1);
        while b.pop_front().is_some() {}
        assert!(b.blocks.is_none(), "an emptied deque keeps no allocation");
        b.push_back(1);
        b.retain(|_| false);
        assert!(b.blocks.is_none() && b.is_empty());
    }
}
