//! Messages that die in a queue (expired, rejected, dropped by a length limit) and their
//! hand-over to the vhost's dead-letter sink.

use super::*;

impl ClassicQueue {
    /// A message leaves the queue without being delivered (expired, over the length limit,
    /// rejected): it is settled, and dead-lettered if the queue has a dead-letter exchange.
    pub(super) fn discard(&self, st: &mut State, qm: QueuedMessage, reason: DeathReason) {
        self.settled(&qm);
        if self.settings().dead_letter_exchange.is_some() {
            st.dead.push(DeadLetter {
                message: qm.message,
                reason,
            });
        }
    }

    /// Takes the dead letters collected under the lock, for [`Queue::publish_dead`] once the
    /// lock is released.
    pub(super) fn flush_dead(&self, st: &mut State) -> Vec<DeadLetter> {
        std::mem::take(&mut st.dead)
    }

    /// Re-publishes dead letters to the queue's dead-letter exchange (never call with the
    /// queue's lock held: the dead-letter exchange may route back to this queue).
    pub(super) fn publish_dead(&self, dead: Vec<DeadLetter>) {
        if dead.is_empty() {
            return;
        }
        let args = self.args();
        if let Some(source) = self.dead_letter_source(&args) {
            if let Some(sink) = self.dead_letters.as_ref().and_then(Weak::upgrade) {
                sink.dead_letter(&source, dead);
            }
        }
    }

    /// Publishes the dead letters [`Queue::publish_held`] returned (never with an
    /// [`Queue::enqueue_order`] lock held).
    pub fn dead_letter(&self, dead: Vec<DeadLetter>) {
        self.publish_dead(dead);
    }
}
