//! Dead-lettering: why a message died, the `x-death` history of the copy that goes to the
//! dead-letter exchange, and the sink a queue hands its dead letters to.
//!
//! A queue does not know the vhost it lives in: it holds a [`DeadLetterSink`] (the vhost
//! implements it) and calls it, outside its own lock, with what died and where from. This keeps
//! the dependency one way: vhost -> queue -> dead_letter.

use std::sync::Arc;

use warren_amqp::table::{FieldTable, FieldValue};

use crate::message::Message;
use crate::persist::s;
use crate::sender_selected::SenderKeys;

/// Why a message was dead-lettered (the `reason` of its `x-death` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeathReason {
    /// basic.reject / basic.nack with requeue=false.
    Rejected,
    /// Its TTL ran out.
    Expired,
    /// Dropped from the head of a queue over its length limit, or refused by a
    /// `reject-publish-dlx` queue.
    Maxlen,
    /// Returned to a quorum queue more often than its `x-delivery-limit` allows.
    DeliveryLimit,
}

impl DeathReason {
    /// The reason as RabbitMQ writes it in `x-death`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeathReason::Rejected => "rejected",
            DeathReason::Expired => "expired",
            DeathReason::Maxlen => "maxlen",
            DeathReason::DeliveryLimit => "delivery_limit",
        }
    }
}

/// A message that left a queue with a dead-letter exchange, to be re-published there once
/// the queue's lock is released.
#[derive(Debug)]
pub struct DeadLetter {
    /// The message as it was in the queue.
    pub message: Arc<Message>,
    /// Why it died.
    pub reason: DeathReason,
}

/// The queue dead letters come from, as the `x-death` history and the re-publish need it.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetterSource<'a> {
    /// The queue's name.
    pub queue: &'a str,
    /// Its `x-dead-letter-exchange`.
    pub exchange: &'a str,
    /// Its `x-dead-letter-routing-key`, if set.
    pub routing_key: Option<&'a str>,
}

/// Where a queue's dead letters go: re-published to the dead-letter exchange of their queue.
/// Called without any queue lock held (the dead-letter exchange may route back to the queue).
pub trait DeadLetterSink: Send + Sync {
    /// Re-publishes `letters`, which died in `from`.
    fn dead_letter(&self, from: &DeadLetterSource<'_>, letters: Vec<DeadLetter>);
}

/// The copy of a dead letter that goes to the dead-letter exchange: routed with the
/// queue's `x-dead-letter-routing-key` or its original routing key, its `x-death` history
/// updated (entries per queue and reason, most recent first), its `expiration` moved to the
/// entry's `original-expiration`.
///
/// Without `x-dead-letter-routing-key` the copy is routed with all the keys the message had
/// (its routing key, `CC` and `BCC` keys); with one, with that key alone. The entry's
/// `routing-keys` are the routing key and `CC` keys (RabbitMQ 4.x `mc:record_death`).
pub(crate) fn dead_lettered(
    from: &DeadLetterSource<'_>,
    l: &DeadLetter,
    now_s: u64,
) -> Arc<Message> {
    let dlx = from.exchange;
    let m = &l.message;
    let reason = l.reason.as_str();
    let sender_keys = m.sender_keys();
    let routing_key = from
        .routing_key
        .map_or_else(|| m.routing_key.clone(), str::to_string);
    let copy_keys = match from.routing_key {
        Some(_) => SenderKeys::default(),
        None => sender_keys.clone(),
    };
    let mut props = m.properties.clone();
    let mut headers = props.headers.take().unwrap_or_default();
    let mut deaths: Vec<FieldValue> = headers
        .get("x-death")
        .and_then(|v| v.as_array())
        .map(<[FieldValue]>::to_vec)
        .unwrap_or_default();
    let same = |d: &FieldValue| {
        d.as_table().is_some_and(|t| {
            t.get("queue").and_then(|v| v.as_str()) == Some(from.queue)
                && t.get("reason").and_then(|v| v.as_str()) == Some(reason)
        })
    };
    let entry = match deaths.iter().position(same) {
        Some(i) => {
            let mut t = deaths.remove(i).as_table().cloned().unwrap_or_default();
            let count = t.get("count").and_then(|v| v.as_i64()).unwrap_or(0);
            // `time` stays the time of the first death (RabbitMQ 4.x); the entry is written
            // in RabbitMQ's field order.
            t.insert("count", FieldValue::I64(count + 1));
            let mut ordered = FieldTable::new();
            for key in [
                "original-expiration",
                "count",
                "reason",
                "queue",
                "time",
                "exchange",
                "routing-keys",
            ] {
                if let Some(v) = t.remove(key) {
                    ordered.insert(key, v);
                }
            }
            ordered.0.append(&mut t.0);
            ordered
        }
        None => {
            let mut t = FieldTable::new();
            if let Some(e) = &props.expiration {
                t.insert(
                    "original-expiration",
                    FieldValue::LongString(bytes::Bytes::copy_from_slice(e)),
                );
            }
            t.insert("count", FieldValue::I64(1));
            t.insert("reason", s(reason));
            t.insert("queue", s(from.queue));
            t.insert("time", FieldValue::Timestamp(now_s));
            t.insert("exchange", s(&m.exchange));
            let keys = sender_keys.death_keys(&m.routing_key);
            t.insert(
                "routing-keys",
                FieldValue::Array(keys.iter().map(|k| s(k)).collect()),
            );
            t
        }
    };
    props.expiration = None;
    deaths.insert(0, FieldValue::Table(entry));
    headers.insert("x-death", FieldValue::Array(deaths));
    if headers.get("x-first-death-reason").is_none() {
        headers.insert("x-first-death-reason", s(reason));
        headers.insert("x-first-death-queue", s(from.queue));
        headers.insert("x-first-death-exchange", s(&m.exchange));
    }
    headers.insert("x-last-death-reason", s(reason));
    headers.insert("x-last-death-queue", s(from.queue));
    headers.insert("x-last-death-exchange", s(&m.exchange));
    // RabbitMQ 4.x hands out a dead-lettered message's headers sorted by name.
    headers.0.sort_by(|a, b| a.0.cmp(&b.0));
    props.headers = Some(headers);
    let mut copy = Message::new(dlx.to_string(), routing_key, props, m.body.clone());
    copy.sender_keys = Some(Arc::new(copy_keys));
    Arc::new(copy)
}
