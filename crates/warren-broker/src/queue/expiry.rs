//! Message TTL (`x-message-ttl`, per-message `expiration`) and queue expiry (`x-expires`):
//! when a message is due, expiring the head, and the periodic sweep.

use super::*;

impl ClassicQueue {
    /// Records a use of the queue (basic.get, declare, consumers coming and going), which
    /// restarts its `x-expires` timer.
    pub fn touch(&self) {
        self.last_used
            .store(self.clock.now_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    /// When a message enqueued now expires: the smaller of the queue's `x-message-ttl` and
    /// the message's `expiration`.
    pub(super) fn deadline(&self, m: &Message) -> Option<u64> {
        // The TTL first: most messages have none, and then the clock is not read.
        let ttl = self.ttl(m)?;
        Some(self.clock.now_ms().saturating_add(ttl))
    }

    /// When a message enqueued at `enqueued_ms` expires.
    pub(super) fn deadline_from(&self, m: &Message, enqueued_ms: u64) -> Option<u64> {
        Some(enqueued_ms.saturating_add(self.ttl(m)?))
    }

    /// A message's TTL in this queue, ms: the smaller of `x-message-ttl` and `expiration`.
    pub(super) fn ttl(&self, m: &Message) -> Option<u64> {
        let own = m
            .properties
            .expiration
            .as_ref()
            .and_then(|e| crate::args::parse_expiration(e.as_str()?).ok());
        match (self.settings().message_ttl, own) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// When `qm` was enqueued, ms since the epoch, as far as its deadline tells (now when it
    /// has none: then the time does not matter).
    pub(super) fn enqueued_at(&self, qm: &QueuedMessage) -> u64 {
        match (qm.expires_at, self.ttl(&qm.message)) {
            (Some(at), Some(ttl)) => at.saturating_sub(ttl),
            _ => self.clock.now_ms(),
        }
    }

    /// Drops (or dead-letters) the expired messages at the head of the queue. `spare` is a
    /// message being published now, which a TTL of 0 lets through to a consumer that can take
    /// it at once.
    pub(super) fn expire_head(&self, st: &mut State, spare: Option<u64>) {
        let mut now = None;
        loop {
            self.refill(st);
            let Some(deadline) = st
                .ready
                .front()
                .and_then(|f| (Some(f.seq) != spare).then_some(f.expires_at).flatten())
            else {
                return;
            };
            let now = *now.get_or_insert_with(|| self.clock.now_ms());
            if deadline > now {
                return;
            }
            if let Some(qm) = st.pop_front() {
                self.discard(st, qm, DeathReason::Expired);
            }
        }
    }

    /// Periodic housekeeping: pages out what a full disk kept in memory once it takes writes
    /// again, and expires messages at the head. Returns true when the queue has
    /// been unused for its `x-expires` and should be deleted.
    pub fn sweep(&self) -> bool {
        let mut st = self.state.lock();
        if st.deleted {
            return false;
        }
        self.retry_paging(&mut st);
        self.expire_head(&mut st, None);
        let unused = st.consumers.is_empty();
        let dead = self.flush_dead(&mut st);
        drop(st);
        self.publish_dead(dead);
        let last = self.last_used.load(std::sync::atomic::Ordering::Relaxed);
        unused
            && self
                .args()
                .expires
                .is_some_and(|e| self.clock.now_ms() >= last.saturating_add(e))
    }
}
