//! Positions of the httpmq API: the put and get counters of a queue (1, 2, 3, ...) that
//! `Pos:` headers and `opt=status` show, kept across restarts by the httpmq front.

use super::*;

impl ClassicQueue {
    /// The queue's put position and ready count, read together (see [`Positions`]).
    pub fn positions(&self) -> Positions {
        let st = self.state.lock();
        Positions {
            put: st.put_pos,
            ready: st.ready_count() as u64,
        }
    }

    /// Sets the put position (a checkpoint restored at start, or 0 by a reset) unless the
    /// queue is deleted.
    pub fn set_put_position(&self, put: u64) {
        let mut st = self.state.lock();
        if !st.deleted {
            st.put_pos = put;
        }
    }

    /// Drops every ready message and sets the put position back to 0, under one lock, so
    /// that no publish falls between the two (the HTTP queue API's `opt=reset`). Returns the
    /// number of messages dropped.
    pub fn reset_positions(&self) -> u32 {
        let mut st = self.state.lock();
        let n = self.drop_ready(&mut st);
        st.put_pos = 0;
        n
    }

    /// basic.get (not `no_ack`) that also gives the message's position: the head of the queue
    /// is at position `put - ready + 1` ([`Positions`]), read under the same lock that takes
    /// it. Settle the message with [`Queue::settle`].
    pub fn get_positioned(&self) -> Option<(QueuedMessage, u64)> {
        self.touch();
        let mut st = self.state.lock();
        self.refill(&mut st);
        self.expire_head(&mut st, None);
        let dead = self.flush_dead(&mut st);
        let pos = st.put_pos.saturating_sub(st.ready_count() as u64) + 1;
        let Some(msg) = st.pop_front() else {
            drop(st);
            self.publish_dead(dead);
            return None;
        };
        st.unacked += 1;
        if let (Some(store), false, true) = (self.store(), msg.redelivered, msg.stored.is_some()) {
            store.delivered(&self.store_key, st.mark_priority(&msg.message), msg.seq);
        }
        drop(st);
        self.publish_dead(dead);
        Some((msg, pos))
    }
}

/// A queue's positions, as the HTTP queue API (httpsqs's `Pos`, `putpos`, `getpos`) shows
/// them.
///
/// Every message enqueued on the queue, by any front end, takes the next position: `put` is
/// the number of messages enqueued since the queue was created (or its positions were reset),
/// counted under the queue's lock in [`Queue::publish`] — one addition on a lock the publish
/// holds anyway, so AMQP publishing pays nothing measurable — and handed to the publisher in
/// [`Message::position`]. Positions are not stored per message: the ready messages are the
/// positions `put - ready + 1 ..= put` in queue order (`getpos = put - ready`), which is exact
/// for a queue consumed from its head (HTTP gets, AMQP consumers acking in order). Requeued
/// messages and out-of-order acks make it an approximation: a requeued message returns to its
/// place in the queue and the positions of the queue's head shift back with it.
///
/// Durability: the store recovers the messages; the put position is checkpointed by the front
/// end that shows it (the HTTP queue API writes its state file at every reset and maxqueue
/// change, periodically, and at shutdown) and restored at start as
/// `max(put, getpos + ready)` of the checkpoint, which is exact unless both puts and gets
/// happened after the last checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Positions {
    /// Messages enqueued (the last position taken).
    pub put: u64,
    /// Messages ready in the queue.
    pub ready: u64,
}

impl Positions {
    /// Messages taken from the head so far: `put - ready` (0 if requeues made the queue
    /// longer than its put position).
    pub fn get(&self) -> u64 {
        self.put.saturating_sub(self.ready)
    }
}

/// The queues of a vhost that may hold messages or have counted any (see
/// [`crate::VHost::used_queues`]): what the management rate sampler and the HTTP queue API's
/// checkpoints visit, instead of every queue of the vhost. 100,000 queues that never held a
/// message cost them nothing.
///
/// A classic queue joins when its put position goes from 0 to 1 (its first enqueue), when
/// one is restored and when it recovers messages at start; queues of other kinds and queues
/// held by other nodes join when they are made ([`UsedSet::add`]). A queue leaves once
/// deleted. Held by weak reference, keyed by the address of its `Arc` (which a weak
/// reference keeps from being reused).
#[derive(Default)]
pub struct UsedSet {
    inner: Mutex<UsedInner>,
}

#[derive(Default)]
struct UsedInner {
    queues: std::collections::HashMap<usize, Weak<Queue>>,
    /// The set's size after the last pruning of queues gone.
    pruned_at: usize,
}

impl UsedSet {
    /// Adds `q` (nothing when it is in already). Once the set has doubled since it was last
    /// pruned, the queues dropped meanwhile leave it, so that it stays within twice the
    /// number of live queues in it even when nothing calls [`UsedSet::snapshot`] (short-lived
    /// reply queues that each take a message and go).
    pub fn add(&self, q: &Arc<Queue>) {
        let key = Arc::as_ptr(q) as *const () as usize;
        let mut inner = self.inner.lock();
        inner.queues.entry(key).or_insert_with(|| Arc::downgrade(q));
        if inner.queues.len() > 2 * inner.pruned_at + 64 {
            inner.queues.retain(|_, w| w.strong_count() > 0);
            inner.pruned_at = inner.queues.len();
        }
    }

    /// Entries held (live or not yet pruned).
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.inner.lock().queues.len()
    }

    /// The queues in the set now; drops those deleted meanwhile. (A queue's own lock is never
    /// taken under the set's: a queue joins while holding its own.)
    pub fn snapshot(&self) -> Vec<Arc<Queue>> {
        let live: Vec<(usize, Arc<Queue>)> = {
            let mut inner = self.inner.lock();
            inner.queues.retain(|_, w| w.strong_count() > 0);
            inner.pruned_at = inner.queues.len();
            inner
                .queues
                .iter()
                .filter_map(|(k, w)| Some((*k, w.upgrade()?)))
                .collect()
        };
        let (deleted, out): (Vec<_>, Vec<_>) = live.into_iter().partition(|(_, q)| q.is_deleted());
        if !deleted.is_empty() {
            // Each deleted queue is still held here, so its address names it alone.
            let mut inner = self.inner.lock();
            for (k, q) in &deleted {
                if inner
                    .queues
                    .get(k)
                    .is_some_and(|w| std::ptr::addr_eq(w.as_ptr(), Arc::as_ptr(q)))
                {
                    inner.queues.remove(k);
                }
            }
        }
        out.into_iter().map(|(_, q)| q).collect()
    }
}
