//! Consumers and delivery: basic.consume / cancel, round-robin dispatch to consumers with
//! credit, basic.get, settlement (ack, nack, reject with requeue), purge and deletion.

use super::*;

impl ClassicQueue {
    /// A stored message leaves this queue for good: record it in the store.
    pub(super) fn forget(&self, seq: u64, stored: Option<Location>) {
        if let (Some(store), Some(loc)) = (self.store(), stored) {
            store.ack(&self.store_key, seq, loc);
        }
    }

    /// A message leaves this queue for good: record it in the store, and count this queue
    /// towards an early publisher confirm.
    pub(super) fn settled(&self, qm: &QueuedMessage) {
        if let (Some(store), Some(loc)) = (self.store(), qm.stored) {
            store.ack(&self.store_key, qm.seq, loc);
            if let Some(t) = qm.message.confirm.get() {
                t.settle_one();
            }
        }
    }

    /// Drops every ready message, in memory, requeued paged out and spilled; returns how many.
    pub(super) fn drop_ready(&self, st: &mut State) -> u32 {
        let mut n = 0u32;
        for qm in st.take_ready() {
            self.settled(&qm);
            n += 1;
        }
        let Some(b) = &self.backing else {
            return n;
        };
        let mut entries: Vec<SpillEntry> = st.paged.drain().collect();
        let mut held = Vec::new();
        for spilled in st.spills.iter_mut().flatten() {
            match spilled.file.clear() {
                Ok(e) => entries.extend(e),
                // What could not be read stays queued (and counted) rather than vanish.
                Err(e) => warn!(queue = %self.name, error = %e, "cannot read spill file"),
            }
            held.extend(spilled.held.drain(..));
        }
        for e in entries {
            n += 1;
            self.forget_entry(b, &e);
        }
        for qm in held {
            n += 1;
            self.settled(&qm);
        }
        n
    }

    /// True while a consumer that asked for exclusive use is registered.
    pub fn has_exclusive_consumer(&self) -> bool {
        self.state.lock().consumers.iter().any(|c| c.exclusive)
    }

    /// Registers a consumer without delivering yet (so that basic.consume-ok can be sent first);
    /// call [`Queue::dispatch`] afterwards.
    ///
    /// Errors: 403 ACCESS_REFUSED when the queue has an exclusive consumer, or when `consumer` is
    /// exclusive and the queue already has consumers (RabbitMQ's "in exclusive use").
    pub fn add_consumer(&self, consumer: Consumer) -> Result<()> {
        let mut st = self.state.lock();
        if st.deleted {
            return Err(BrokerError::not_found(format!(
                "no {}",
                self.resource_name()
            )));
        }
        if st.consumers.iter().any(|c| c.exclusive)
            || (consumer.exclusive && !st.consumers.is_empty())
        {
            return Err(BrokerError::access_refused(format!(
                "{} in exclusive use",
                self.resource_name()
            )));
        }
        // Highest priority first; among equals, in registration order.
        let at = st
            .consumers
            .iter()
            .position(|c| c.priority < consumer.priority)
            .unwrap_or(st.consumers.len());
        st.consumers.insert(at, consumer);
        drop(st);
        self.touch();
        Ok(())
    }

    /// Removes consumer (channel, tag). Returns true when the queue is auto-delete and has just
    /// lost its last consumer: the caller then deletes it from its vhost.
    pub fn remove_consumer(&self, channel_key: u64, tag: &str) -> bool {
        let mut st = self.state.lock();
        let before = st.consumers.len();
        st.consumers
            .retain(|c| !(c.target.channel_key() == channel_key && &*c.tag == tag));
        let removed = st.consumers.len() != before;
        if st.round_robin >= st.consumers.len() {
            st.round_robin = 0;
        }
        if removed && st.consumers.is_empty() {
            self.touch();
        }
        removed && self.auto_delete && st.consumers.is_empty() && !st.deleted
    }

    /// Delivers ready messages to consumers with credit, round-robin.
    pub fn dispatch_with(&self, this: &Arc<Queue>) {
        let mut st = self.state.lock();
        self.dispatch_from(this, &mut st, None);
        let dead = self.flush_dead(&mut st);
        drop(st);
        self.publish_dead(dead);
    }

    /// Delivers what consumers can take; `spare` as in [`Queue::expire_head`]. With
    /// `x-single-active-consumer`, only the first registered consumer receives messages.
    pub(super) fn dispatch_from(&self, this: &Arc<Queue>, st: &mut State, spare: Option<u64>) {
        self.deliver_ready(this, st, spare);
        self.wake_drained(st);
    }

    fn deliver_ready(&self, this: &Arc<Queue>, st: &mut State, spare: Option<u64>) {
        while !st.consumers.is_empty() {
            self.refill(st);
            self.expire_head(st, spare);
            if st.ready.is_empty() {
                break;
            }
            let single = self.settings().single_active_consumer;
            let n = if single { 1 } else { st.consumers.len() };
            let mut delivered = false;
            // Consumers are sorted by priority: try each priority group in turn, round-robin
            // within the group, and go to a lower group only when no consumer above has credit.
            let mut group = 0;
            while group < n && !delivered {
                let priority = st.consumers[group].priority;
                let end = (group..n)
                    .find(|&i| st.consumers[i].priority != priority)
                    .unwrap_or(n);
                let len = end - group;
                let start = st.round_robin % len;
                for i in 0..len {
                    let idx = group + (start + i) % len;
                    if !st.consumers[idx].has_credit() {
                        continue;
                    }
                    let Some(msg) = st.pop_front() else {
                        return;
                    };
                    let (seq, stored, first) = (msg.seq, msg.stored, !msg.redelivered);
                    let mark = st.mark_priority(&msg.message);
                    let ticket = msg.message.confirm.get().cloned();
                    let c = &mut st.consumers[idx];
                    match c.target.deliver(this, &c.tag, c.no_ack, msg) {
                        Ok(()) => {
                            self.deliveries
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            if !first {
                                crate::registry::bump(&self.stats.redeliver);
                            }
                            if c.no_ack {
                                self.forget(seq, stored);
                                if let (Some(t), true) = (ticket, stored.is_some()) {
                                    t.settle_one();
                                }
                            } else {
                                c.in_flight += 1;
                                st.unacked += 1;
                                if let (Some(store), true, true) =
                                    (self.store(), first, stored.is_some())
                                {
                                    store.delivered(&self.store_key, mark, seq);
                                }
                            }
                            st.round_robin = (idx - group + 1) % len;
                            delivered = true;
                            break;
                        }
                        Err(msg) => st.push_front(msg),
                    }
                }
                group = end;
            }
            if !delivered {
                break;
            }
        }
    }

    /// basic.get: takes the next ready message. With `no_ack` false the message is counted as
    /// unacknowledged until settled. Returns the message and the number of messages still ready.
    pub fn get(&self, no_ack: bool) -> Option<(QueuedMessage, u32)> {
        self.touch();
        let mut st = self.state.lock();
        self.refill(&mut st);
        self.expire_head(&mut st, None);
        let dead = self.flush_dead(&mut st);
        let Some(msg) = st.pop_front() else {
            drop(st);
            self.publish_dead(dead);
            return None;
        };
        crate::registry::bump(&self.stats.get);
        if msg.redelivered {
            crate::registry::bump(&self.stats.redeliver);
        }
        if no_ack {
            self.settled(&msg);
        } else {
            st.unacked += 1;
            if let (Some(store), false, true) =
                (self.store(), msg.redelivered, msg.stored.is_some())
            {
                store.delivered(&self.store_key, st.mark_priority(&msg.message), msg.seq);
            }
        }
        let remaining = st.ready_count() as u32;
        drop(st);
        self.publish_dead(dead);
        Some((msg, remaining))
    }

    /// Settles delivered messages (ack, reject, requeue), then delivers what the freed credit
    /// allows. On a deleted queue, settling only releases the messages' storage.
    ///
    /// Requeued messages count against the queue's length limits like published ones: with
    /// overflow `drop-head`, a queue pushed over `x-max-length` / `x-max-length-bytes` by a
    /// requeue drops (or dead-letters, reason `maxlen`) from its head, which is where requeued
    /// messages return to; `reject-publish` queues keep them, over their limit, as RabbitMQ's
    /// `requeue_and_run` does (its `maybe_drop_head` only drops for `drop-head`).
    pub fn settle_with(&self, this: &Arc<Queue>, channel_key: u64, settlements: Vec<Settlement>) {
        let mut st = self.state.lock();
        if st.deleted {
            drop(st);
            for s in settlements {
                self.settled(&s.message);
            }
            return;
        }
        let mut requeued = false;
        for s in settlements {
            st.unacked = st.unacked.saturating_sub(1);
            if let Some(tag) = &s.consumer_tag {
                if let Some(c) = st
                    .consumers
                    .iter_mut()
                    .find(|c| c.target.channel_key() == channel_key && &c.tag == tag)
                {
                    c.in_flight = c.in_flight.saturating_sub(1);
                }
            }
            if s.requeue {
                let mut m = s.message;
                m.redelivered = true;
                st.insert_ordered(m);
                requeued = true;
            } else if s.rejected {
                self.discard(&mut st, s.message, DeathReason::Rejected);
            } else {
                crate::registry::bump(&self.stats.ack);
                self.settled(&s.message);
            }
        }
        if requeued {
            self.enforce_max_length(&mut st);
        }
        self.dispatch_from(this, &mut st, None);
        // A requeued message with a deadline waits in the queue again: the sweep expires it.
        let sweep = requeued && st.has_deadlines && st.ready_count() > 0;
        let dead = self.flush_dead(&mut st);
        drop(st);
        if sweep {
            self.join_sweeps(this);
        }
        self.publish_dead(dead);
    }

    /// queue.purge: drops every ready message (unacknowledged ones stay); returns how many.
    pub fn purge(&self) -> u32 {
        let mut st = self.state.lock();
        self.drop_ready(&mut st)
    }

    /// Marks the queue deleted and drops its messages. Returns the ready-message count it had
    /// and its consumers, whom the caller notifies (outside any lock).
    pub fn mark_deleted(&self) -> (u32, Vec<Consumer>) {
        let mut st = self.state.lock();
        st.deleted = true;
        let n = self.drop_ready(&mut st);
        st.spills.clear();
        if let Some(store) = self.store() {
            store.forget_queue(&self.store_key, st.priority.is_some());
        }
        (n, std::mem::take(&mut st.consumers))
    }
}
