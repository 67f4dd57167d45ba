//! `QueueBackend` for [`QuorumQueue`]: what routing, the channels, the management API and
//! the vhost's housekeeping call; every change becomes a proposal to the queue's log.

use super::*;

impl QueueBackend for QuorumQueue {
    fn name(&self) -> &str {
        &self.name
    }
    fn shared_name(&self) -> Arc<str> {
        self.name.clone()
    }
    fn vhost(&self) -> &str {
        &self.vhost
    }
    fn kind(&self) -> &'static str {
        "quorum"
    }
    fn durable(&self) -> bool {
        true
    }
    fn exclusive_owner(&self) -> Option<u64> {
        None
    }
    fn auto_delete(&self) -> bool {
        false
    }
    fn arguments(&self) -> &FieldTable {
        &self.arguments
    }
    fn store_key(&self) -> &str {
        &self.key
    }
    fn store(&self) -> Option<&Store> {
        None
    }

    fn args(&self) -> Arc<QueueArgs> {
        self.args.read().clone()
    }
    fn applied_policy(&self) -> Arc<Applied> {
        self.applied.read().clone()
    }
    fn apply_policy(&self, applied: Applied) -> bool {
        let args = warren_broker::policy::effective_queue_args(
            &self.declared,
            self.overflow_declared,
            &applied,
        );
        *self.applied.write() = Arc::new(applied);
        let mut args = args;
        if args.overflow == Overflow::RejectPublishDlx {
            args.overflow = Overflow::DropHead;
        }
        let changed = **self.args.read() != args;
        *self.args.write() = Arc::new(args);
        changed
    }
    fn enforce_limits(&self) {
        let mut props = Proposals::default();
        {
            let mut st = self.inner.lock();
            if st.leading() {
                self.enforce_limits_locked(&mut st, &mut props);
            }
        }
        self.propose(props);
    }

    fn enqueue_order(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.order.lock()
    }

    fn rejects_publish(&self, msg: &Message) -> bool {
        let args = self.args();
        if args.overflow != Overflow::RejectPublish {
            return false;
        }
        let st = self.inner.lock();
        let count = st.ready_count() as u64;
        let bytes = st.qs.ready_bytes();
        args.max_length.is_some_and(|m| count >= m)
            || args
                .max_length_bytes
                .is_some_and(|m| bytes + msg.body.len() as u64 > m)
    }

    fn enqueue(
        &self,
        _this: &Arc<Queue>,
        message: Arc<Message>,
        _seq: u64,
        _stored: Option<Location>,
    ) -> (bool, Vec<DeadLetter>) {
        self.enqueue_confirmed(_this, message, _seq, None)
    }

    fn confirms_publishes(&self) -> bool {
        true
    }

    fn enqueue_confirmed(
        &self,
        _this: &Arc<Queue>,
        message: Arc<Message>,
        _seq: u64,
        waiter: Option<Waiter>,
    ) -> (bool, Vec<DeadLetter>) {
        // Deleted, or this node's log cannot write (a full disk): refused at once, as the
        // message store refuses classic queues' publishes meanwhile.
        if self.deleted.load(Ordering::Acquire) || self.node.log_failed() {
            if let Some((sink, token)) = waiter {
                sink.complete(&[token], false);
            }
            return (false, Vec::new());
        }
        self.stats.publish.fetch_add(1, Ordering::Relaxed);
        let at = self.clock.now_ms();
        if let Err(mpsc::error::SendError(Submit::Publish(_, _, Some((sink, token))))) =
            self.submit.send(Submit::Publish(message, at, waiter))
        {
            sink.complete(&[token], false);
        }
        (false, Vec::new())
    }

    fn dead_letter(&self, dead: Vec<DeadLetter>) {
        if dead.is_empty() {
            return;
        }
        let args = self.args();
        let Some(source) = self.dead_letter_source(&args) else {
            return;
        };
        if let Some(sink) = self.dead_letters.upgrade() {
            sink.dead_letter(&source, dead);
        }
    }

    fn is_pressured(&self) -> bool {
        false
    }
    fn stalled_at(&self) -> Option<u64> {
        None
    }
    fn mark_stalled(&self, _at: u64) {}

    fn add_consumer(&self, consumer: Consumer) -> Result<()> {
        // Consumers on other nodes count too: the leader's node knows them all.
        if !self.check_consume_at_leader(consumer.exclusive) {
            return Err(BrokerError::access_refused(format!(
                "{} in exclusive use",
                self.resource_name()
            )));
        }
        let mut st = self.inner.lock();
        if st.deleted {
            return Err(BrokerError::not_found(format!(
                "no {}",
                self.resource_name()
            )));
        }
        if st.consumers.iter().any(|c| c.c.exclusive)
            || (consumer.exclusive && !st.consumers.is_empty())
        {
            return Err(BrokerError::access_refused(format!(
                "{} in exclusive use",
                self.resource_name()
            )));
        }
        let priority = consumer
            .arguments
            .get("x-priority")
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        let id = st.next_consumer_id;
        st.next_consumer_id += 1;
        st.consumers.push(QConsumer {
            c: consumer,
            priority,
            in_flight: 0,
            id,
            remote: None,
        });
        st.subscription.version += 1;
        drop(st);
        self.touch();
        self.sync_subscription();
        Ok(())
    }

    fn remove_consumer(&self, channel_key: u64, tag: &str) -> bool {
        let mut props = Proposals::default();
        {
            let mut st = self.inner.lock();
            let gone: Vec<u64> = st
                .consumers
                .iter()
                .filter(|c| c.c.target.channel_key() == channel_key && &*c.c.tag == tag)
                .map(|c| c.id)
                .collect();
            st.consumers
                .retain(|c| !(c.c.target.channel_key() == channel_key && &*c.c.tag == tag));
            // Deliveries from the leader's node its channel had not taken go back.
            st.parked.retain(|(id, qm)| {
                let keep = !gone.contains(id);
                if !keep {
                    props.returned.push(qm.seq);
                }
                keep
            });
            st.subscription.version += 1;
        }
        self.propose(props);
        self.touch();
        self.sync_subscription();
        false
    }

    fn dispatch_with(&self, this: &Arc<Queue>) {
        let mut props = Proposals::default();
        {
            let mut st = self.inner.lock();
            self.dispatch_locked(&mut st, this, &mut props);
        }
        self.propose(props);
    }

    fn touch(&self) {
        self.last_used.store(self.clock.now_ms(), Ordering::Relaxed);
    }

    fn get(&self, no_ack: bool) -> Option<(QueuedMessage, u32)> {
        self.touch();
        match self.take_one(no_ack, Out::Delivered) {
            Some(got) => got,
            // Another node leads: it hands out the message.
            None => self.get_from_leader(no_ack),
        }
    }

    fn settle_with(&self, this: &Arc<Queue>, channel_key: u64, settlements: Vec<Settlement>) {
        let mut props = Proposals::default();
        {
            let mut st = self.inner.lock();
            for s in settlements {
                if let Some(tag) = &s.consumer_tag {
                    if let Some(c) = st
                        .consumers
                        .iter_mut()
                        .find(|c| c.c.target.channel_key() == channel_key && c.c.tag == *tag)
                    {
                        c.in_flight = c.in_flight.saturating_sub(1);
                    }
                }
                let key = s.message.seq;
                if s.requeue {
                    props.returned.push(key);
                } else if s.rejected {
                    props.rejected.push(key);
                } else {
                    self.stats.ack.fetch_add(1, Ordering::Relaxed);
                    props.acked.push(key);
                }
            }
            self.dispatch_locked(&mut st, this, &mut props);
            self.offer_parked(&mut st, this, &mut props);
        }
        self.propose(props);
    }

    fn unacked_window(&self) -> Option<(usize, usize)> {
        None
    }
    fn page_out(&self, _qm: &QueuedMessage) -> Option<SpillEntry> {
        None
    }
    fn settle_paged_with(
        &self,
        this: &Arc<Queue>,
        channel_key: u64,
        settlements: Vec<PagedSettlement>,
    ) {
        // Never paged out (unacked_window is None); settle what arrives anyway.
        let _ = (this, channel_key);
        let mut props = Proposals::default();
        for s in settlements {
            if s.requeue {
                props.returned.push(s.entry.seq);
            } else {
                props.acked.push(s.entry.seq);
            }
        }
        self.propose(props);
    }

    fn purge(&self) -> u32 {
        match self.purge_here() {
            Some(n) => n,
            // Another node leads: it purges.
            None => self.purge_at_leader(),
        }
    }

    fn mark_deleted(&self) -> (u32, Vec<Consumer>) {
        self.deleted.store(true, Ordering::Release);
        self.stop.notify_one();
        let (count, consumers) = {
            let mut st = self.inner.lock();
            st.deleted = true;
            let count = st.qs.ready().len() as u32;
            let consumers = st.consumers.drain(..).map(|c| c.c).collect();
            (count, consumers)
        };
        // Stop the group, then forget its log and snapshot; a queue declared again under
        // this name waits for that.
        let node = self.node.clone();
        let key = self.key.clone();
        let raft = self.raft.get().cloned();
        node.unregister_queue(&key, self);
        if let Some(c) = node.cluster() {
            // What the leader handed to this node's consumers goes back to the queue (a
            // member removed from the group, or deleted before the leader).
            let leader = raft
                .as_ref()
                .and_then(|r| r.metrics().borrow().current_leader);
            if let Some(l) = leader.filter(|l| *l != node.cfg.node_id) {
                c.cast(l, crate::remote::Cast::Leave { group: key.clone() });
            }
            c.unregister_group(&key);
            // Deleted here by a client: the other members go too (a member deleted at another
            // node's request does not ask back).
            if !c.is_leaving(&key) {
                let me = node.cfg.node_id;
                let others: Vec<u64> = {
                    let st = self.inner.lock();
                    st.membership
                        .membership()
                        .voter_ids()
                        .filter(|id| *id != me)
                        .collect()
                };
                node.delete_members(&self.vhost, &self.name, others);
            }
        }
        let done = node.begin_drop(&key);
        let path = node.snapshot_path(&key);
        let mut ended = self.ended.subscribe();
        let previous = self.previous_drop.lock().take();
        let this = self.myself.upgrade();
        let name = self.name.clone();
        node.runtime.clone().spawn(async move {
            // The group's Raft instance is shut down (its proposals in flight fail), then its
            // task is waited for: it may still have been starting (a queue deleted right
            // after its declare), and what it started meanwhile is shut down too. Only then
            // (and after the drop of the queue of this name deleted before, which a group
            // deleted while it waited for it did not wait out) is the log dropped, so that
            // nothing the group writes can follow the drop and reach a queue declared again
            // under this name.
            let started = || this.as_ref().and_then(|q| q.started.lock().take());
            if let Some(r) = started() {
                drop_step(&name, "its Raft instance to stop", r.shutdown()).await;
            }
            if let Some(mut done) = previous {
                drop_step(&name, "the drop before it", done.wait_for(|d| *d)).await;
            }
            drop_step(&name, "its group's task to end", ended.wait_for(|e| *e)).await;
            if let Some(r) = started() {
                drop_step(&name, "its Raft instance to stop", r.shutdown()).await;
            }
            if let Ok(log) = node.log() {
                log.drop_group(&key, None);
            }
            let _ = std::fs::remove_file(path);
            node.end_drop(&key, done);
        });
        (count, consumers)
    }

    fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    fn sweep(&self) -> bool {
        let mut props = Proposals::default();
        let sync;
        let unused = {
            let mut st = self.inner.lock();
            if st.deleted {
                return false;
            }
            if st.leading() {
                // Expired messages at the head go (RabbitMQ's quorum queues expire at the
                // head too).
                let now = self.clock.now_ms();
                let mut from = 0;
                while let Some(key) = Self::next_ready(&st, from) {
                    from = key + 1;
                    let Some(m) = st.qs.get(key) else { break };
                    if self.deadline(m).is_none_or(|d| d > now) {
                        break;
                    }
                    st.out.insert(key, Out::Dropping);
                    props.expired.push(key);
                }
            }
            if !st.parked.is_empty() {
                if let Some(me) = self.myself() {
                    let this: Arc<Queue> = me;
                    self.offer_parked(&mut st, &this, &mut props);
                }
            }
            // Retried here until the leader's node takes the list (or the connection to it
            // is new): while there are consumers, or an empty list is still to be told.
            sync = !st.leading()
                && (st.consumers.iter().any(|c| c.remote.is_none())
                    || st
                        .subscription
                        .sent
                        .is_some_and(|s| s.3 != st.subscription.version));
            st.consumers.is_empty() && st.leading()
        };
        self.propose(props);
        if sync {
            self.sync_subscription();
        }
        let last = self.last_used.load(Ordering::Relaxed);
        unused
            && self
                .args()
                .expires
                .is_some_and(|e| self.clock.now_ms() >= last.saturating_add(e))
    }

    fn needs_sweep(&self) -> bool {
        !self.deleted.load(Ordering::Acquire)
    }
    fn sweep_mark(&self) -> &AtomicBool {
        &self.sweep_mark
    }
    fn recover(&self, _entries: &mut dyn Iterator<Item = SpillEntry>) {}

    fn counts(&self) -> QueueCounts {
        let st = self.inner.lock();
        let ready = st.qs.ready().len();
        QueueCounts {
            ready: ready as u32,
            unacked: (st.qs.len() - ready) as u32,
            consumers: st.consumers.len() as u32,
        }
    }
    fn ready_bytes(&self) -> u64 {
        self.inner.lock().qs.ready_bytes()
    }
    fn ready_in_memory_and_paged_out(&self) -> (u32, u32) {
        (self.inner.lock().qs.ready().len() as u32, 0)
    }
    fn memory(&self) -> u64 {
        let st = self.inner.lock();
        st.qs.ready_bytes() + (st.qs.len() * 96) as u64
    }
    fn deliveries(&self) -> u64 {
        self.deliveries.load(Ordering::Relaxed)
    }
    fn stats(&self) -> &QueueStats {
        &self.stats
    }

    fn positions(&self) -> Positions {
        Positions::default()
    }
    fn set_put_position(&self, _put: u64) {}
    fn reset_positions(&self) -> u32 {
        0
    }
    fn get_positioned(&self) -> Option<(QueuedMessage, u64)> {
        None
    }
    fn peek_position(&self, _pos: u64) -> Option<Bytes> {
        None
    }
    fn replicas(&self) -> Option<warren_broker::Replicas> {
        Some(self.replicas_now())
    }
}
