//! Queues: the ready list, consumers with prefetch accounting, and settlement.
//!
//! A queue keeps its ready messages ordered by [`QueuedMessage::seq`]. Delivery is round-robin
//! over consumers that have credit: a consumer's own prefetch (basic.qos with global=false, as
//! RabbitMQ's `per_consumer_qos`) is counted here; the channel-wide prefetch (global=true) is
//! counted by the channel, which can refuse a delivery through [`DeliveryTarget::deliver`].
//!
//! Messages handed to a consumer that acks leave the queue's custody; the queue only counts
//! them (`unacked`) until they are settled. A requeued message goes back to its original
//! position, flagged redelivered.

use crate::error::{resource, BrokerError, Result};
use crate::message::{Message, QueuedMessage};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use warren_amqp::table::FieldTable;

/// The side of a channel that receives deliveries from queues.
///
/// Implemented by the server's channel. Both methods are called with the queue's lock held and
/// must not call back into any queue.
pub trait DeliveryTarget: Send + Sync {
    /// A process-unique id of the channel; consumers are identified by (channel key, tag).
    fn channel_key(&self) -> u64;

    /// Offers `msg` to consumer `consumer_tag` of this channel. Returns the message back when the
    /// channel cannot take it now (channel-wide prefetch reached, flow stopped, channel closing).
    fn deliver(
        &self,
        queue: &Arc<Queue>,
        consumer_tag: &Arc<str>,
        no_ack: bool,
        msg: QueuedMessage,
    ) -> std::result::Result<(), QueuedMessage>;

    /// The broker cancelled consumer `consumer_tag` (its queue was deleted): forget it and, if the
    /// client declared the `consumer_cancel_notify` capability, send it basic.cancel.
    fn cancelled_by_broker(&self, consumer_tag: &Arc<str>);
}

/// A consumer registered on a queue by basic.consume.
pub struct Consumer {
    /// Consumer tag, unique within its channel.
    pub tag: Arc<str>,
    /// The channel that receives its deliveries.
    pub target: Arc<dyn DeliveryTarget>,
    /// Deliveries need no acknowledgement (and take no prefetch credit).
    pub no_ack: bool,
    /// Exclusive consumer: no other consumer may use the queue while it exists.
    pub exclusive: bool,
    /// Per-consumer prefetch count, 0 = unlimited.
    pub prefetch: u16,
    /// basic.consume arguments.
    pub arguments: FieldTable,
    in_flight: u32,
}

impl Consumer {
    /// A consumer with nothing in flight.
    pub fn new(
        tag: Arc<str>,
        target: Arc<dyn DeliveryTarget>,
        no_ack: bool,
        exclusive: bool,
        prefetch: u16,
        arguments: FieldTable,
    ) -> Self {
        Consumer {
            tag,
            target,
            no_ack,
            exclusive,
            prefetch,
            arguments,
            in_flight: 0,
        }
    }

    fn has_credit(&self) -> bool {
        self.no_ack || self.prefetch == 0 || self.in_flight < u32::from(self.prefetch)
    }
}

/// How a delivered message is settled by its channel.
#[derive(Debug)]
pub struct Settlement {
    /// Consumer the message was delivered to (`None` for basic.get).
    pub consumer_tag: Option<Arc<str>>,
    /// `Some` to put the message back in the queue (nack/reject with requeue, channel close,
    /// basic.recover); `None` when it was acknowledged or dropped.
    pub requeue: Option<QueuedMessage>,
}

/// A queue's declared properties and live state.
pub struct Queue {
    /// Queue name.
    pub name: String,
    /// Name of the vhost the queue lives in (for reply texts).
    pub vhost: String,
    /// Survives a broker restart.
    pub durable: bool,
    /// The connection that owns an exclusive queue.
    pub exclusive_owner: Option<u64>,
    /// Deleted when its last consumer is cancelled.
    pub auto_delete: bool,
    /// Declared arguments (`x-…`).
    pub arguments: FieldTable,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    ready: VecDeque<QueuedMessage>,
    next_seq: u64,
    consumers: Vec<Consumer>,
    round_robin: usize,
    unacked: u32,
    deleted: bool,
}

/// Counts reported by queue.declare-ok and the management API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueCounts {
    /// Messages ready for delivery.
    pub ready: u32,
    /// Messages delivered and not yet acknowledged.
    pub unacked: u32,
    /// Consumers.
    pub consumers: u32,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").field("name", &self.name).finish()
    }
}

impl Queue {
    /// A new, empty queue.
    pub fn new(
        name: impl Into<String>,
        vhost: impl Into<String>,
        durable: bool,
        exclusive_owner: Option<u64>,
        auto_delete: bool,
        arguments: FieldTable,
    ) -> Self {
        Queue {
            name: name.into(),
            vhost: vhost.into(),
            durable,
            exclusive_owner,
            auto_delete,
            arguments,
            state: Mutex::new(State::default()),
        }
    }

    /// `queue 'name' in vhost 'v'`, as RabbitMQ names a queue in reply texts.
    pub fn resource_name(&self) -> String {
        resource("queue", &self.name, &self.vhost)
    }

    /// Fails with 405 RESOURCE_LOCKED when the queue is exclusive to another connection.
    pub fn check_exclusive(&self, connection_id: u64) -> Result<()> {
        match self.exclusive_owner {
            Some(owner) if owner != connection_id => Err(BrokerError::resource_locked(format!(
                "cannot obtain exclusive access to locked {}. It could be originally declared on \
                 another connection or the exclusive property value does not match that of the \
                 original declaration.",
                self.resource_name()
            ))),
            _ => Ok(()),
        }
    }

    /// Current counts.
    pub fn counts(&self) -> QueueCounts {
        let st = self.state.lock();
        QueueCounts {
            ready: st.ready.len() as u32,
            unacked: st.unacked,
            consumers: st.consumers.len() as u32,
        }
    }

    /// True once the queue has been deleted.
    pub fn is_deleted(&self) -> bool {
        self.state.lock().deleted
    }

    /// Appends a message and delivers what consumers can take. A deleted queue drops it.
    pub fn publish(self: &Arc<Self>, message: Arc<Message>) {
        let mut st = self.state.lock();
        if st.deleted {
            return;
        }
        let seq = st.next_seq;
        st.next_seq += 1;
        st.ready.push_back(QueuedMessage {
            seq,
            message,
            redelivered: false,
        });
        self.dispatch_locked(&mut st);
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
        st.consumers.push(consumer);
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
        removed && self.auto_delete && st.consumers.is_empty() && !st.deleted
    }

    /// Delivers ready messages to consumers with credit, round-robin.
    pub fn dispatch(self: &Arc<Self>) {
        let mut st = self.state.lock();
        self.dispatch_locked(&mut st);
    }

    fn dispatch_locked(self: &Arc<Self>, st: &mut State) {
        while !st.ready.is_empty() && !st.consumers.is_empty() {
            let n = st.consumers.len();
            let mut delivered = false;
            for i in 0..n {
                let idx = (st.round_robin + i) % n;
                if !st.consumers[idx].has_credit() {
                    continue;
                }
                let Some(msg) = st.ready.pop_front() else {
                    return;
                };
                let c = &mut st.consumers[idx];
                match c.target.deliver(self, &c.tag, c.no_ack, msg) {
                    Ok(()) => {
                        if !c.no_ack {
                            c.in_flight += 1;
                            st.unacked += 1;
                        }
                        st.round_robin = (idx + 1) % n;
                        delivered = true;
                        break;
                    }
                    Err(msg) => st.ready.push_front(msg),
                }
            }
            if !delivered {
                break;
            }
        }
    }

    /// basic.get: takes the next ready message. With `no_ack` false the message is counted as
    /// unacknowledged until settled. Returns the message and the number of messages still ready.
    pub fn get(&self, no_ack: bool) -> Option<(QueuedMessage, u32)> {
        let mut st = self.state.lock();
        let msg = st.ready.pop_front()?;
        if !no_ack {
            st.unacked += 1;
        }
        Some((msg, st.ready.len() as u32))
    }

    /// Settles delivered messages (ack, reject, requeue), then delivers what the freed credit
    /// allows. Settling on a deleted queue is a no-op.
    pub fn settle(self: &Arc<Self>, channel_key: u64, settlements: Vec<Settlement>) {
        let mut st = self.state.lock();
        if st.deleted {
            return;
        }
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
            if let Some(mut m) = s.requeue {
                m.redelivered = true;
                insert_ordered(&mut st.ready, m);
            }
        }
        self.dispatch_locked(&mut st);
    }

    /// queue.purge: drops every ready message (unacknowledged ones stay); returns how many.
    pub fn purge(&self) -> u32 {
        let mut st = self.state.lock();
        let n = st.ready.len() as u32;
        st.ready.clear();
        n
    }

    /// Marks the queue deleted and drops its messages. Returns the ready-message count it had
    /// and its consumers, whom the caller notifies (outside any lock).
    pub fn mark_deleted(&self) -> (u32, Vec<Consumer>) {
        let mut st = self.state.lock();
        st.deleted = true;
        let n = st.ready.len() as u32;
        st.ready.clear();
        (n, std::mem::take(&mut st.consumers))
    }
}

/// Inserts a message at its original position by sequence number. Requeued messages are
/// usually older than everything ready, so the front is checked first.
fn insert_ordered(ready: &mut VecDeque<QueuedMessage>, m: QueuedMessage) {
    match ready.front() {
        None => ready.push_back(m),
        Some(f) if m.seq < f.seq => ready.push_front(m),
        _ => {
            let pos = ready.partition_point(|x| x.seq < m.seq);
            ready.insert(pos, m);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use std::sync::atomic::{AtomicU64, Ordering};

    struct Sink {
        key: u64,
        got: Mutex<Vec<(String, u64, bool)>>,
        limit: usize,
        cancelled: Mutex<Vec<String>>,
    }

    impl DeliveryTarget for Sink {
        fn channel_key(&self) -> u64 {
            self.key
        }
        fn deliver(
            &self,
            _q: &Arc<Queue>,
            tag: &Arc<str>,
            _no_ack: bool,
            msg: QueuedMessage,
        ) -> std::result::Result<(), QueuedMessage> {
            let mut got = self.got.lock();
            if got.len() >= self.limit {
                return Err(msg);
            }
            got.push((tag.to_string(), msg.seq, msg.redelivered));
            Ok(())
        }
        fn cancelled_by_broker(&self, tag: &Arc<str>) {
            self.cancelled.lock().push(tag.to_string());
        }
    }

    static KEYS: AtomicU64 = AtomicU64::new(1);

    fn sink(limit: usize) -> Arc<Sink> {
        Arc::new(Sink {
            key: KEYS.fetch_add(1, Ordering::Relaxed),
            got: Mutex::new(Vec::new()),
            limit,
            cancelled: Mutex::new(Vec::new()),
        })
    }

    fn msg(body: &str) -> Arc<Message> {
        Arc::new(Message {
            exchange: String::new(),
            routing_key: "q".into(),
            properties: Default::default(),
            body: Bytes::copy_from_slice(body.as_bytes()),
        })
    }

    fn queue() -> Arc<Queue> {
        Arc::new(Queue::new("q", "/", false, None, false, FieldTable::new()))
    }

    #[test]
    fn round_robin_and_prefetch() {
        let q = queue();
        let a = sink(usize::MAX);
        let b = sink(usize::MAX);
        q.add_consumer(Consumer::new(
            "a".into(),
            a.clone(),
            false,
            false,
            2,
            FieldTable::new(),
        ))
        .unwrap();
        q.add_consumer(Consumer::new(
            "b".into(),
            b.clone(),
            false,
            false,
            1,
            FieldTable::new(),
        ))
        .unwrap();
        for i in 0..5 {
            q.publish(msg(&i.to_string()));
        }
        // a gets 0 and 2 (prefetch 2), b gets 1 (prefetch 1); 3 and 4 wait.
        let seqs = |s: &Sink| s.got.lock().iter().map(|g| g.1).collect::<Vec<_>>();
        assert_eq!(seqs(&a), vec![0, 2]);
        assert_eq!(seqs(&b), vec![1]);
        assert_eq!(
            q.counts(),
            QueueCounts {
                ready: 2,
                unacked: 3,
                consumers: 2
            }
        );
        q.settle(
            b.key,
            vec![Settlement {
                consumer_tag: Some("b".into()),
                requeue: None,
            }],
        );
        assert_eq!(seqs(&b), vec![1, 3]);
    }

    #[test]
    fn requeue_returns_to_original_position() {
        let q = queue();
        for i in 0..3 {
            q.publish(msg(&i.to_string()));
        }
        let (m0, left) = q.get(false).unwrap();
        assert_eq!(left, 2);
        let (m1, _) = q.get(false).unwrap();
        q.settle(
            0,
            vec![Settlement {
                consumer_tag: None,
                requeue: Some(m1),
            }],
        );
        q.settle(
            0,
            vec![Settlement {
                consumer_tag: None,
                requeue: Some(m0),
            }],
        );
        let order: Vec<(u64, bool)> = std::iter::from_fn(|| q.get(true))
            .map(|(m, _)| (m.seq, m.redelivered))
            .collect();
        assert_eq!(order, vec![(0, true), (1, true), (2, false)]);
    }

    #[test]
    fn channel_refusal_keeps_message() {
        let q = queue();
        let a = sink(1);
        q.add_consumer(Consumer::new(
            "a".into(),
            a.clone(),
            false,
            false,
            0,
            FieldTable::new(),
        ))
        .unwrap();
        q.publish(msg("x"));
        q.publish(msg("y"));
        assert_eq!(q.counts().ready, 1);
        assert_eq!(a.got.lock().len(), 1);
    }

    #[test]
    fn exclusive_consumers() {
        let q = queue();
        let a = sink(9);
        q.add_consumer(Consumer::new(
            "a".into(),
            a.clone(),
            false,
            false,
            0,
            FieldTable::new(),
        ))
        .unwrap();
        let err = q
            .add_consumer(Consumer::new(
                "b".into(),
                a.clone(),
                false,
                true,
                0,
                FieldTable::new(),
            ))
            .unwrap_err();
        assert_eq!(err.code, 403);
        assert_eq!(err.text, "queue 'q' in vhost '/' in exclusive use");
    }

    #[test]
    fn auto_delete_on_last_consumer() {
        let q = Arc::new(Queue::new("q", "/", false, None, true, FieldTable::new()));
        let a = sink(9);
        q.add_consumer(Consumer::new(
            "a".into(),
            a.clone(),
            false,
            false,
            0,
            FieldTable::new(),
        ))
        .unwrap();
        q.add_consumer(Consumer::new(
            "b".into(),
            a.clone(),
            false,
            false,
            0,
            FieldTable::new(),
        ))
        .unwrap();
        assert!(!q.remove_consumer(a.key, "a"));
        assert!(!q.remove_consumer(a.key, "zzz"));
        assert!(q.remove_consumer(a.key, "b"));
    }
}
