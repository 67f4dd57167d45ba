//! Length limits (`x-max-length`, `x-max-length-bytes`, `x-overflow`) and publisher flow
//! control (a queue over its in-memory window with consumers asks publishers to pause).

use super::*;
use std::sync::atomic::Ordering;
use std::task::Waker;

/// Publishers paused by pressured queues (see [`ClassicQueue::wake_when_drained`]), each with
/// the address of the queue it waits for. Kept outside the queues, which carry only a flag:
/// few publishers wait at any time, while every idle queue's size counts.
static DRAIN_WAITERS: Mutex<Vec<(usize, Waker)>> = parking_lot::const_mutex(Vec::new());

impl ClassicQueue {
    /// Ready messages and their body bytes, in memory and spilled.
    pub(super) fn depth(st: &State) -> (u64, u64) {
        (
            st.ready_count() as u64,
            (st.ready_bytes + st.spilled_bytes) as u64,
        )
    }

    /// Drops (or dead-letters) messages from the head while the queue is over its
    /// `x-max-length` / `x-max-length-bytes` (overflow `drop-head`).
    pub(super) fn enforce_max_length(&self, st: &mut State) {
        if !self.limited.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let (max_len, max_bytes, overflow) = {
            let a = self.settings();
            (a.max_length, a.max_length_bytes, a.overflow)
        };
        if overflow != Overflow::DropHead || (max_len.is_none() && max_bytes.is_none()) {
            return;
        }
        loop {
            let (n, bytes) = Self::depth(st);
            if !(max_len.is_some_and(|m| n > m) || max_bytes.is_some_and(|m| bytes > m)) {
                return;
            }
            self.refill(st);
            let Some(qm) = st.pop_front() else {
                return;
            };
            self.discard(st, qm, DeathReason::Maxlen);
        }
    }

    /// True when the queue refuses `msg` because it is full and its overflow is
    /// `reject-publish` or `reject-publish-dlx`.
    pub fn rejects_publish(&self, msg: &Message) -> bool {
        if !self.limited.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        let (max_len, max_bytes, overflow) = {
            let a = self.settings();
            (a.max_length, a.max_length_bytes, a.overflow)
        };
        if overflow == Overflow::DropHead || (max_len.is_none() && max_bytes.is_none()) {
            return false;
        }
        let st = self.state.lock();
        let (n, bytes) = Self::depth(&st);
        max_len.is_some_and(|m| n >= m)
            || max_bytes.is_some_and(|m| bytes + msg.body.len() as u64 > m)
    }

    /// Ready messages beyond which a queue with consumers asks publishers to pause: its
    /// in-memory window, or 4096 without a store.
    pub(super) fn pressure_limit(&self) -> usize {
        self.backing.as_ref().map_or(4096, |b| b.paging.window)
    }

    /// Publisher flow control. A queue whose consumers fall behind its publishers would
    /// otherwise build a backlog that only adds latency (and, beyond the window, disk
    /// traffic); a publish that leaves three quarters of the window ready asks its
    /// publisher to pause ([`ClassicQueue::pause_publishers_at`]; so that what the publisher
    /// has already read still fits in memory), and publishers of a pressured queue pause
    /// until fewer than half a window are ready, so the broker's CPU goes to delivering
    /// instead. A queue without consumers is never pressured: it simply grows on disk. Nor is
    /// a queue with messages on disk (a backlog from before its consumers came, or from
    /// consumers that stalled): its publishers add to the backlog, as RabbitMQ's do, rather
    /// than wait until the whole backlog has been consumed.
    pub fn is_pressured(&self) -> bool {
        let st = self.state.lock();
        self.pressured(&st)
    }

    fn pressured(&self, st: &State) -> bool {
        Self::pressured_at(st, (self.pressure_limit() / 2).max(1))
    }

    /// A queue with consumers and nothing on disk holds `at` or more ready messages.
    pub(super) fn pressured_at(st: &State, at: usize) -> bool {
        !st.consumers.is_empty() && st.spilled() == 0 && st.ready.len() >= at
    }

    /// The ready messages at which a publish asks its publisher to pause: three quarters of
    /// the window (at least 1).
    pub(super) fn pause_publishers_at(&self) -> usize {
        (self.pressure_limit() / 4 * 3).max(1)
    }

    /// A paused publisher's wait: registers `waker` to be woken as soon as the queue is no
    /// longer pressured ([`ClassicQueue::is_pressured`]), so that the publisher resumes
    /// while the consumers still have half a window to take. Returns false, registering
    /// nothing, when the queue is not pressured now. A waker waits for one queue at a time:
    /// registering it again moves it. The waiter removes it with
    /// [`ClassicQueue::forget_drain_waker`] when it stops waiting.
    pub fn wake_when_drained(&self, waker: &Waker) -> bool {
        let st = self.state.lock();
        if !self.pressured(&st) {
            return false;
        }
        let key = self.drain_key();
        let mut waiters = DRAIN_WAITERS.lock();
        match waiters.iter_mut().find(|(_, w)| w.will_wake(waker)) {
            Some(entry) => entry.0 = key,
            None => waiters.push((key, waker.clone())),
        }
        self.drain_waiting.store(true, Ordering::Relaxed);
        true
    }

    /// Removes `waker` registered by [`ClassicQueue::wake_when_drained`], if it still is.
    pub fn forget_drain_waker(&self, waker: &Waker) {
        DRAIN_WAITERS.lock().retain(|(_, w)| !w.will_wake(waker));
    }

    fn drain_key(&self) -> usize {
        self as *const Self as usize
    }

    /// Wakes the publishers waiting in [`ClassicQueue::wake_when_drained`] once the queue is
    /// no longer pressured. Called with the state locked where deliveries take messages;
    /// the waiters also poll, which covers the rarer ways out (purge, a cancelled consumer).
    pub(super) fn wake_drained(&self, st: &State) {
        if self.drain_waiting.load(Ordering::Relaxed) && !self.pressured(st) {
            self.drain_waiting.store(false, Ordering::Relaxed);
            let key = self.drain_key();
            let mut woken = Vec::new();
            DRAIN_WAITERS.lock().retain(|(q, w)| {
                if *q == key {
                    woken.push(w.clone());
                }
                *q != key
            });
            for w in woken {
                w.wake();
            }
        }
    }

    /// The delivery count at which publishers found this queue's consumers stalled, if they
    /// have not delivered anything since.
    pub fn stalled_at(&self) -> Option<u64> {
        let v = self.stalled_at.load(std::sync::atomic::Ordering::Relaxed);
        (v != u64::MAX).then_some(v)
    }

    /// Records that consumers made no progress since delivery count `at`.
    pub fn mark_stalled(&self, at: u64) {
        self.stalled_at
            .store(at, std::sync::atomic::Ordering::Relaxed);
    }

    /// Applies the queue's length limits to what it holds now (after recovery, where messages
    /// that were unacknowledged come back as ready), as RabbitMQ does when a queue process
    /// starts: a `drop-head` queue over its limit drops or dead-letters from its head.
    pub fn enforce_limits(&self) {
        let mut st = self.state.lock();
        if st.deleted {
            return;
        }
        self.enforce_max_length(&mut st);
        let dead = self.flush_dead(&mut st);
        drop(st);
        self.publish_dead(dead);
    }
}
