//! A quorum queue's replicated state: what every member holds after applying the same log.
//!
//! Messages are keyed by the order the log enqueued them in. A message is *ready* or
//! *checked out* (delivered, not yet settled). Applying is deterministic and does no I/O: it
//! returns [`Effects`] (dead letters, messages that left or came back) that only the leader
//! acts on.
//!
//! Deliveries: the leader hands a message to a consumer as soon as it is committed and then
//! proposes a [`Command::Checkout`] for it, so that a publish costs one commit before it can be
//! consumed. If the leader dies in between, the new leader must still not deliver that message
//! again as if it were new: a message may be delivered for the first time only while its key is
//! below the committed [`QueueState::horizon`], which the leader moves ahead in steps of
//! thousands of messages. When a leadership begins (its [`Command::Lead`] is applied; a member
//! restarted as leader in the same Raft term proposes one too), everything checked out is
//! returned (delivery count + 1, redelivered) and every ready message below the horizon is
//! marked redelivered: a duplicate is always flagged, at the cost of flagging up to one step of
//! messages that were never delivered.

use crate::command::{put_message, read_message, Command, DecodeError, SettleReason};
use bytes::{BufMut, Bytes, BytesMut};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use warren_amqp::table::Decoder;
use warren_broker::dead_letter::DeathReason;
use warren_broker::Message;

/// A message in a quorum queue.
#[derive(Debug, Clone)]
pub struct QMsg {
    /// The message as published.
    pub message: Arc<Message>,
    /// When it was enqueued (ms since the epoch): its TTL counts from then.
    pub enqueued_ms: u64,
    /// How often it was returned to the queue (RabbitMQ's `x-delivery-count`).
    pub delivery_count: u32,
    /// It may have been delivered before.
    pub redelivered: bool,
    /// Delivered and not yet settled.
    pub checked_out: bool,
}

/// What applying commands did, for the leader to act on.
#[derive(Debug, Default)]
pub struct Effects {
    /// Messages that died, with why (published to the dead-letter exchange by the leader).
    pub dead: Vec<(Arc<Message>, DeathReason)>,
    /// Keys that left the queue.
    pub settled: Vec<u64>,
    /// Keys that became ready again.
    pub returned: Vec<u64>,
    /// Messages were enqueued.
    pub enqueued: bool,
    /// A new leadership began.
    pub new_term: bool,
}

/// The replicated state of one quorum queue.
#[derive(Debug, Default, Clone)]
pub struct QueueState {
    msgs: BTreeMap<u64, QMsg>,
    ready: BTreeSet<u64>,
    ready_bytes: u64,
    next_key: u64,
    epoch: u64,
    horizon: u64,
    /// `x-delivery-limit`: a message returned more often than this dies; `None`: no limit.
    delivery_limit: Option<u32>,
}

impl QueueState {
    /// An empty queue with delivery limit `delivery_limit`.
    pub fn new(delivery_limit: Option<u32>) -> Self {
        QueueState {
            next_key: 1,
            delivery_limit,
            ..Default::default()
        }
    }

    /// The epoch of the leadership whose [`Command::Lead`] was applied last.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Messages with keys up to here may be delivered for the first time.
    pub fn horizon(&self) -> u64 {
        self.horizon
    }

    /// The key the next enqueued message gets.
    pub fn next_key(&self) -> u64 {
        self.next_key
    }

    /// Ready messages, in order.
    pub fn ready(&self) -> &BTreeSet<u64> {
        &self.ready
    }

    /// Ready and checked-out messages.
    pub fn len(&self) -> usize {
        self.msgs.len()
    }

    /// True when the queue holds no message.
    pub fn is_empty(&self) -> bool {
        self.msgs.is_empty()
    }

    /// Body bytes of the ready messages.
    pub fn ready_bytes(&self) -> u64 {
        self.ready_bytes
    }

    /// A message by key.
    pub fn get(&self, key: u64) -> Option<&QMsg> {
        self.msgs.get(&key)
    }

    /// The delivery limit in force.
    pub fn delivery_limit(&self) -> Option<u32> {
        self.delivery_limit
    }

    /// Sets the delivery limit (a policy changed it).
    pub fn set_delivery_limit(&mut self, limit: Option<u32>) {
        self.delivery_limit = limit;
    }

    fn make_ready(&mut self, key: u64) {
        if let Some(m) = self.msgs.get_mut(&key) {
            if m.checked_out {
                m.checked_out = false;
            }
            if self.ready.insert(key) {
                self.ready_bytes += m.message.body.len() as u64;
            }
        }
    }

    fn remove(&mut self, key: u64) -> Option<QMsg> {
        let m = self.msgs.remove(&key)?;
        if self.ready.remove(&key) {
            self.ready_bytes -= m.message.body.len() as u64;
        }
        Some(m)
    }

    /// Counts a return of `key`: the message dies once returned more often than the limit.
    fn count_return(&mut self, key: u64, fx: &mut Effects) {
        let Some(m) = self.msgs.get_mut(&key) else {
            return;
        };
        m.delivery_count += 1;
        m.redelivered = true;
        if self
            .delivery_limit
            .is_some_and(|limit| m.delivery_count > limit)
        {
            if let Some(m) = self.remove(key) {
                fx.dead.push((m.message, DeathReason::DeliveryLimit));
                fx.settled.push(key);
            }
            return;
        }
        self.make_ready(key);
        fx.returned.push(key);
    }

    /// Applies one command.
    pub fn apply(&mut self, cmd: &Command, fx: &mut Effects) {
        match cmd {
            Command::Enqueue(msgs) => {
                for (m, at) in msgs {
                    let key = self.next_key;
                    self.next_key += 1;
                    self.msgs.insert(
                        key,
                        QMsg {
                            message: m.clone(),
                            enqueued_ms: *at,
                            delivery_count: 0,
                            redelivered: false,
                            checked_out: false,
                        },
                    );
                    self.ready.insert(key);
                    self.ready_bytes += m.body.len() as u64;
                }
                fx.enqueued |= !msgs.is_empty();
            }
            Command::Checkout {
                epoch,
                keys,
                counts,
            } => {
                if *epoch != self.epoch {
                    return;
                }
                for (i, k) in keys.iter().enumerate() {
                    if let Some(m) = self.msgs.get_mut(k) {
                        // Returned since this delivery (its return overtook it): stays ready.
                        if counts.get(i).is_some_and(|c| *c != m.delivery_count) {
                            continue;
                        }
                        m.checked_out = true;
                        if self.ready.remove(k) {
                            self.ready_bytes -= m.message.body.len() as u64;
                        }
                    }
                }
            }
            Command::Settle { reason, keys } => {
                for k in keys {
                    let Some(m) = self.remove(*k) else { continue };
                    fx.settled.push(*k);
                    let death = match reason {
                        SettleReason::Rejected => Some(DeathReason::Rejected),
                        SettleReason::Expired => Some(DeathReason::Expired),
                        SettleReason::Maxlen => Some(DeathReason::Maxlen),
                        SettleReason::Ack | SettleReason::Purged => None,
                    };
                    if let Some(d) = death {
                        fx.dead.push((m.message, d));
                    }
                }
            }
            Command::Return { keys } => {
                for k in keys {
                    self.count_return(*k, fx);
                }
            }
            Command::Horizon(k) => self.horizon = self.horizon.max(*k),
            Command::Lead(epoch) => self.begin_epoch(*epoch, fx),
            Command::Meta(_) => {}
        }
    }

    /// A leadership begins: what was checked out comes back, counted as returned, and ready
    /// messages that may have been delivered are marked redelivered.
    pub fn begin_epoch(&mut self, epoch: u64, fx: &mut Effects) {
        self.epoch = epoch;
        fx.new_term = true;
        let out: Vec<u64> = self
            .msgs
            .iter()
            .filter(|(_, m)| m.checked_out)
            .map(|(k, _)| *k)
            .collect();
        for k in out {
            self.count_return(k, fx);
        }
        let horizon = self.horizon;
        for (_, m) in self.msgs.range_mut(..=horizon) {
            m.redelivered = true;
        }
    }

    /// The state as bytes (a snapshot).
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(64 + self.msgs.len() * 64);
        b.put_u64(self.next_key);
        b.put_u64(self.epoch);
        b.put_u64(self.horizon);
        b.put_u32(self.delivery_limit.unwrap_or(u32::MAX));
        b.put_u64(self.msgs.len() as u64);
        for (k, m) in &self.msgs {
            b.put_u64(*k);
            b.put_u64(m.enqueued_ms);
            b.put_u32(m.delivery_count);
            b.put_u8(u8::from(m.redelivered) | (u8::from(m.checked_out) << 1));
            put_message(&mut b, &m.message);
        }
        b.freeze()
    }

    /// Reads a state written by [`QueueState::encode`].
    pub fn decode(payload: &Bytes) -> Result<QueueState, DecodeError> {
        let mut d = Decoder::new(payload);
        let next_key = d.read_u64()?;
        let epoch = d.read_u64()?;
        let horizon = d.read_u64()?;
        let limit = d.read_u32()?;
        let n = d.read_u64()?;
        let mut s = QueueState {
            next_key,
            epoch,
            horizon,
            delivery_limit: (limit != u32::MAX).then_some(limit),
            ..Default::default()
        };
        for _ in 0..n {
            let key = d.read_u64()?;
            let enqueued_ms = d.read_u64()?;
            let delivery_count = d.read_u32()?;
            let flags = d.read_u8()?;
            let message = read_message(&mut d, payload)?;
            let checked_out = flags & 2 != 0;
            if !checked_out {
                s.ready.insert(key);
                s.ready_bytes += message.body.len() as u64;
            }
            s.msgs.insert(
                key,
                QMsg {
                    message,
                    enqueued_ms,
                    delivery_count,
                    redelivered: flags & 1 != 0,
                    checked_out,
                },
            );
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(body: &'static str) -> Arc<Message> {
        Arc::new(Message::new(
            String::new(),
            "q".into(),
            Default::default(),
            Bytes::from_static(body.as_bytes()),
        ))
    }

    fn enqueue(s: &mut QueueState, n: usize) -> Effects {
        let mut fx = Effects::default();
        let msgs = (0..n).map(|_| (msg("abc"), 0)).collect();
        s.apply(&Command::Enqueue(msgs), &mut fx);
        fx
    }

    #[test]
    fn delivery_limit_kills_after_too_many_returns() {
        let mut s = QueueState::new(Some(2));
        let mut fx = Effects::default();
        s.begin_epoch(1, &mut fx);
        enqueue(&mut s, 1);
        for round in 1..=3 {
            let mut fx = Effects::default();
            s.apply(
                &Command::Checkout {
                    epoch: 1,
                    keys: vec![1],
                    counts: vec![round - 1],
                },
                &mut fx,
            );
            assert!(s.ready().is_empty());
            s.apply(&Command::Return { keys: vec![1] }, &mut fx);
            if round < 3 {
                assert_eq!(s.get(1).unwrap().delivery_count, round);
                assert_eq!(fx.returned, vec![1]);
            } else {
                assert!(s.is_empty());
                assert_eq!(fx.dead.len(), 1);
                assert_eq!(fx.dead[0].1, DeathReason::DeliveryLimit);
            }
        }
    }

    #[test]
    fn a_new_leadership_returns_checked_out_and_flags_possible_duplicates() {
        let mut s = QueueState::new(None);
        let mut fx = Effects::default();
        s.begin_epoch(1, &mut fx);
        enqueue(&mut s, 5);
        s.apply(&Command::Horizon(3), &mut fx);
        s.apply(
            &Command::Checkout {
                epoch: 1,
                keys: vec![1],
                counts: vec![],
            },
            &mut fx,
        );
        // A stale leader's checkout is ignored.
        s.apply(
            &Command::Checkout {
                epoch: 0,
                keys: vec![2],
                counts: vec![],
            },
            &mut fx,
        );
        assert_eq!(s.ready().len(), 4);
        let mut fx = Effects::default();
        s.begin_epoch(2, &mut fx);
        assert_eq!(fx.returned, vec![1]);
        assert_eq!(s.ready().len(), 5);
        let m1 = s.get(1).unwrap();
        assert_eq!((m1.delivery_count, m1.redelivered), (1, true));
        assert!(s.get(3).unwrap().redelivered, "below the horizon");
        assert!(!s.get(4).unwrap().redelivered, "beyond the horizon");
        // Snapshots keep everything.
        let back = QueueState::decode(&s.encode()).unwrap();
        assert_eq!(back.ready().len(), 5);
        assert_eq!(back.epoch(), 2);
        assert_eq!(back.get(1).unwrap().delivery_count, 1);
        assert_eq!(back.ready_bytes(), 15);
    }

    #[test]
    fn a_checkout_overtaken_by_its_return_is_ignored() {
        let mut s = QueueState::new(None);
        let mut fx = Effects::default();
        s.begin_epoch(1, &mut fx);
        enqueue(&mut s, 1);
        // Delivered with count 0; the return (forwarded by another node) applies first.
        s.apply(&Command::Return { keys: vec![1] }, &mut fx);
        s.apply(
            &Command::Checkout {
                epoch: 1,
                keys: vec![1],
                counts: vec![0],
            },
            &mut fx,
        );
        assert_eq!(s.ready().len(), 1, "the message stays ready");
        // The next delivery, with count 1, is checked out.
        s.apply(
            &Command::Checkout {
                epoch: 1,
                keys: vec![1],
                counts: vec![1],
            },
            &mut fx,
        );
        assert!(s.ready().is_empty());
    }

    #[test]
    fn settle_reasons_decide_dead_letters() {
        let mut s = QueueState::new(None);
        enqueue(&mut s, 3);
        let mut fx = Effects::default();
        s.apply(
            &Command::Settle {
                reason: SettleReason::Ack,
                keys: vec![1],
            },
            &mut fx,
        );
        s.apply(
            &Command::Settle {
                reason: SettleReason::Expired,
                keys: vec![2, 2, 99],
            },
            &mut fx,
        );
        assert_eq!(fx.settled, vec![1, 2]);
        assert_eq!(fx.dead.len(), 1);
        assert_eq!(fx.dead[0].1, DeathReason::Expired);
        assert_eq!(s.len(), 1);
        assert_eq!(s.ready_bytes(), 3);
    }
}
