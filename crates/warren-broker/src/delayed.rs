//! The delayed-message exchange, built in: RabbitMQ's `rabbitmq_delayed_message_exchange`
//! plugin (github.com/rabbitmq/rabbitmq-delayed-message-exchange), with its semantics.
//!
//! An exchange of type `x-delayed-message` routes as the exchange type named by its
//! `x-delayed-type` argument, but a message whose `x-delay` header asks for a delay of 1 to
//! 4294967295 ms is held first and routed from this exchange when the delay is over. Any
//! other `x-delay` (absent, 0, negative, too large, or of a type the plugin ignores) routes
//! at once. When the message is finally routed its `x-delay` header becomes the negated
//! delay (type long, headers in name order, as RabbitMQ 4.x hands them out), so that a
//! delayed exchange further along exchange-to-exchange bindings does not hold it again and
//! consumers can tell it was delayed.
//!
//! What the plugin does, and Warren with it:
//! - `x-delayed-type` is checked when the exchange is created: missing or not a string,
//!   406 `Invalid argument, 'x-delayed-type' must be an existing exchange type`;
//!   `x-delayed-message` itself, 406 `Invalid argument, 'x-delayed-message' can't be used for
//!   'x-delayed-type'`; an unknown type, 406 `unknown exchange type 'x'`. A redeclare only
//!   compares the type, flags and `alternate-exchange`, as for any exchange.
//! - `x-delay` of type signed 16/32/64-bit or unsigned 8/16/32-bit integer is the delay; a
//!   long string (or byte array) is parsed as a decimal integer; a float or double is
//!   truncated. Other types (bool, timestamp, signed 8-bit, table, ...) mean no delay,
//!   as in the plugin for RabbitMQ 4.x.
//! - A message entering the exchange through an exchange-to-exchange binding is held too;
//!   when due it is routed from the delayed exchange, with the exchange and routing key it
//!   was published with.
//! - A mandatory publish that only reaches a delayed exchange gets basic.return 312
//!   NO_ROUTE at once (the plugin cannot know the future route; its README documents this),
//!   and the message is still delivered when due.
//! - The delayed copy is routed only once: if nothing matches when it is due, it is dropped,
//!   or goes to the exchange's `alternate-exchange`.
//! - Deleting the exchange drops what it holds (Warren lets go of the messages at once; the
//!   plugin keeps them until due and then finds no bindings).
//!
//! Where Warren differs on purpose (see the README): an `x-delay` string that is not an
//! integer (and a decimal, which RabbitMQ 4.x cannot convert) fails the publish with a
//! channel error 406 PRECONDITION_FAILED instead of an internal error; and a held message
//! does not also go to the exchange's alternate exchange at publish time (the plugin's open
//! issue #36: RabbitMQ sees "no queues" and uses the alternate exchange).
//!
//! Storage: a durable broker keeps held messages out of memory. A persistent message held by
//! a durable delayed exchange is written to the message store under a reserved key (see
//! [`store_key`]) that names the vhost, exchange and due time, so it survives restarts and
//! `kill -9`; the publisher's confirm goes out once it is fsynced. Other held messages are
//! paged to the store as transient records, dropped on restart. Memory holds an index entry
//! per message in one ordered map per vhost, released by the broker's periodic sweep: no
//! timer or task per message.

use crate::error::{BrokerError, Result};
use crate::exchange::ExchangeKind;
use crate::message::Message;
use std::collections::BTreeMap;
use std::sync::Arc;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_store::Location;

/// The exchange type name.
pub const TYPE: &str = "x-delayed-message";

/// The longest delay held, ms (the plugin's `?ERL_MAX_T`, the largest Erlang timer); a longer
/// one routes at once.
pub const MAX_DELAY_MS: u64 = 4_294_967_295;

/// Most held messages released per vhost per sweep; the rest follow on the next sweep.
pub const RELEASE_BATCH: usize = 4096;

/// Prefix of the message-store keys of held persistent messages. A queue's key starts with
/// its vhost's name, and no vhost name starts with NUL.
const STORE_PREFIX: &str = "\u{0}delayed\u{1f}";

/// The exchange type a delayed-message exchange routes as, from its declare arguments.
/// Errors: 406 PRECONDITION_FAILED with the plugin's texts.
pub fn routing_kind(args: &FieldTable) -> Result<ExchangeKind> {
    let name = match args.get("x-delayed-type") {
        Some(FieldValue::LongString(b)) | Some(FieldValue::ByteArray(b)) => {
            String::from_utf8_lossy(b).into_owned()
        }
        _ => {
            return Err(BrokerError::precondition_failed(
                "Invalid argument, 'x-delayed-type' must be an existing exchange type",
            ))
        }
    };
    if name == TYPE {
        return Err(BrokerError::precondition_failed(
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'",
        ));
    }
    ExchangeKind::parse(&name)
        .ok_or_else(|| BrokerError::precondition_failed(format!("unknown exchange type '{name}'")))
}

/// The delay a message's `x-delay` header asks for, ms: `Some` when a delayed exchange must
/// hold it, `None` when it routes at once. Errors: 406 for a string that is not an integer
/// and for a decimal.
pub fn delay_of(headers: Option<&FieldTable>) -> Result<Option<u64>> {
    let Some(v) = headers.and_then(|h| h.get("x-delay")) else {
        return Ok(None);
    };
    let ms: i128 = match v {
        FieldValue::U8(n) => (*n).into(),
        FieldValue::I16(n) => (*n).into(),
        FieldValue::U16(n) => (*n).into(),
        FieldValue::I32(n) => (*n).into(),
        FieldValue::U32(n) => (*n).into(),
        FieldValue::I64(n) => (*n).into(),
        FieldValue::F32(f) => truncated(f64::from(*f)),
        FieldValue::F64(f) => truncated(*f),
        FieldValue::LongString(b) | FieldValue::ByteArray(b) => {
            parse_integer(b).ok_or_else(|| {
                BrokerError::precondition_failed(format!(
                    "invalid 'x-delay' header '{}': not an integer",
                    String::from_utf8_lossy(b)
                ))
            })?
        }
        FieldValue::Decimal { .. } => {
            return Err(BrokerError::precondition_failed(
                "invalid 'x-delay' header: a decimal is not supported",
            ))
        }
        _ => return Ok(None),
    };
    Ok((ms > 0 && ms <= i128::from(MAX_DELAY_MS)).then_some(ms as u64))
}

/// A float truncated toward zero, as Erlang's `trunc`; NaN and infinities hold nothing.
fn truncated(f: f64) -> i128 {
    if f.is_finite() {
        f.trunc().clamp(-1e30, 1e30) as i128
    } else {
        0
    }
}

/// Erlang's `binary_to_integer/1`: an optional sign and at least one decimal digit, nothing
/// else. Values beyond the longest delay saturate (they route at once anyway).
fn parse_integer(b: &[u8]) -> Option<i128> {
    let (negative, digits) = match b.first() {
        Some(b'-') => (true, &b[1..]),
        Some(b'+') => (false, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let mut n: i128 = 0;
    for d in digits {
        n = (n * 10 + i128::from(d - b'0')).min(i128::from(u64::MAX));
    }
    Some(if negative { -n } else { n })
}

/// The message as routed when its delay of `delay` ms is over: `x-delay` set to `-delay`
/// (long), headers in name order (RabbitMQ 4.x adds the header as an annotation and sorts).
/// Its `CC` / `BCC` keys, if already fixed, stay with it.
pub fn released(msg: &Message, delay: u64) -> Message {
    let mut properties = msg.properties.clone();
    let mut headers = properties.headers.take().unwrap_or_default();
    headers.insert("x-delay", FieldValue::I64(-(delay as i64)));
    headers.0.sort_by(|a, b| a.0.cmp(&b.0));
    headers.0.dedup_by(|a, b| a.0 == b.0);
    properties.headers = Some(headers);
    let mut m = Message::new(
        msg.exchange.clone(),
        msg.routing_key.clone(),
        properties,
        msg.body.clone(),
    );
    m.sender_keys = msg.sender_keys.clone();
    m
}

/// The message-store key of persistent messages held by exchange `exchange` of vhost `vhost`
/// until `due_ms` (ms since the epoch).
pub fn store_key(vhost: &str, exchange: &str, due_ms: u64) -> String {
    format!("{STORE_PREFIX}{due_ms}\u{1f}{vhost}\u{1f}{exchange}")
}

/// The (vhost, exchange, due time) of a [`store_key`]; `None` for a queue's key.
pub fn parse_store_key(key: &str) -> Option<(&str, &str, u64)> {
    let rest = key.strip_prefix(STORE_PREFIX)?;
    let (due, rest) = rest.split_once('\u{1f}')?;
    let (vhost, exchange) = rest.split_once('\u{1f}')?;
    Some((vhost, exchange, due.parse().ok()?))
}

/// Where a held message is kept.
#[derive(Debug)]
pub(crate) enum Body {
    /// In memory (a broker without a data directory).
    Memory(Arc<Message>),
    /// Paged to the store as a transient record.
    Paged(Location),
    /// In the store as a persistent record under its [`store_key`].
    Stored(Location),
}

/// A held message.
#[derive(Debug)]
pub(crate) struct Held {
    /// The delayed exchange it is routed from when due.
    pub exchange: Arc<str>,
    /// The message as it was published (its `x-delay` gives the delay again when it is
    /// released; its `BCC` header is still there, removed when it is routed).
    pub body: Body,
}

/// A vhost's held messages, ordered by due time, then by arrival.
#[derive(Debug, Default)]
pub(crate) struct Schedule {
    entries: BTreeMap<(u64, u64), Held>,
}

impl Schedule {
    /// Holds `held` until `due_ms`; `id` orders messages due at the same time.
    pub fn insert(&mut self, due_ms: u64, id: u64, held: Held) {
        self.entries.insert((due_ms, id), held);
    }

    /// Takes up to `max` messages due at `now_ms` or earlier, earliest first, with their
    /// (due time, id).
    pub fn take_due(&mut self, now_ms: u64, max: usize) -> Vec<((u64, u64), Held)> {
        let mut out = Vec::new();
        while out.len() < max {
            match self.entries.first_entry() {
                Some(e) if e.key().0 <= now_ms => out.push(e.remove_entry()),
                _ => break,
            }
        }
        out
    }

    /// Messages held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Takes every message held by `exchange` (deleted), with their (due time, id).
    pub fn remove_exchange(&mut self, exchange: &str) -> Vec<((u64, u64), Held)> {
        let keys: Vec<(u64, u64)> = self
            .entries
            .iter()
            .filter(|(_, h)| &*h.exchange == exchange)
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter()
            .filter_map(|k| self.entries.remove_entry(&k))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn s(v: &str) -> FieldValue {
        FieldValue::LongString(Bytes::copy_from_slice(v.as_bytes()))
    }

    fn delay(v: FieldValue) -> Result<Option<u64>> {
        let mut h = FieldTable::new();
        h.insert("x-delay", v);
        delay_of(Some(&h))
    }

    #[test]
    fn x_delayed_type_validation() {
        let args = |v: Option<FieldValue>| {
            let mut t = FieldTable::new();
            if let Some(v) = v {
                t.insert("x-delayed-type", v);
            }
            t
        };
        assert_eq!(
            routing_kind(&args(Some(s("topic")))).unwrap(),
            ExchangeKind::Topic
        );
        assert_eq!(
            routing_kind(&args(None)).unwrap_err().text,
            "Invalid argument, 'x-delayed-type' must be an existing exchange type"
        );
        assert_eq!(
            routing_kind(&args(Some(FieldValue::I32(1))))
                .unwrap_err()
                .text,
            "Invalid argument, 'x-delayed-type' must be an existing exchange type"
        );
        assert_eq!(
            routing_kind(&args(Some(s(TYPE)))).unwrap_err().text,
            "Invalid argument, 'x-delayed-message' can't be used for 'x-delayed-type'"
        );
        let e = routing_kind(&args(Some(s("nope")))).unwrap_err();
        assert_eq!(
            (e.code, e.text.as_str()),
            (406, "unknown exchange type 'nope'")
        );
    }

    #[test]
    fn x_delay_values() {
        assert_eq!(delay_of(None).unwrap(), None);
        assert_eq!(delay(FieldValue::I32(1500)).unwrap(), Some(1500));
        assert_eq!(delay(FieldValue::I64(1)).unwrap(), Some(1));
        assert_eq!(delay(FieldValue::U8(7)).unwrap(), Some(7));
        assert_eq!(delay(FieldValue::U32(9)).unwrap(), Some(9));
        assert_eq!(delay(FieldValue::I16(3)).unwrap(), Some(3));
        assert_eq!(delay(FieldValue::I32(0)).unwrap(), None);
        assert_eq!(delay(FieldValue::I32(-5)).unwrap(), None);
        assert_eq!(
            delay(FieldValue::I64(MAX_DELAY_MS as i64)).unwrap(),
            Some(MAX_DELAY_MS)
        );
        assert_eq!(
            delay(FieldValue::I64(MAX_DELAY_MS as i64 + 1)).unwrap(),
            None
        );
        // RabbitMQ 4.x's plugin does not count a signed byte as an integer.
        assert_eq!(delay(FieldValue::I8(5)).unwrap(), None);
        assert_eq!(delay(FieldValue::Bool(true)).unwrap(), None);
        assert_eq!(delay(FieldValue::Timestamp(5)).unwrap(), None);
        assert_eq!(delay(s("250")).unwrap(), Some(250));
        assert_eq!(delay(s("+250")).unwrap(), Some(250));
        assert_eq!(delay(s("-250")).unwrap(), None);
        assert_eq!(delay(s("99999999999999999999999999999")).unwrap(), None);
        assert_eq!(delay(FieldValue::F64(10.9)).unwrap(), Some(10));
        assert_eq!(delay(FieldValue::F32(-3.5)).unwrap(), None);
        assert_eq!(delay(FieldValue::F64(f64::NAN)).unwrap(), None);
        let e = delay(s("1.5")).unwrap_err();
        assert_eq!(
            (e.code, e.text.as_str()),
            (406, "invalid 'x-delay' header '1.5': not an integer")
        );
        assert!(delay(s("")).is_err());
        assert!(delay(s(" 5")).is_err());
        assert!(delay(FieldValue::Decimal { scale: 1, value: 5 }).is_err());
    }

    #[test]
    fn released_headers() {
        let mut h = FieldTable::new();
        h.insert("z", s("last"));
        h.insert("x-delay", FieldValue::I32(300));
        h.insert("a", s("first"));
        let m = Message::new(
            "x".into(),
            "k".into(),
            warren_amqp::properties::BasicProperties {
                headers: Some(h),
                ..Default::default()
            },
            Bytes::new(),
        );
        let r = released(&m, 300);
        let keys: Vec<&str> = r
            .properties
            .headers
            .as_ref()
            .unwrap()
            .iter()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(keys, vec!["a", "x-delay", "z"]);
        assert_eq!(
            r.properties.headers.as_ref().unwrap().get("x-delay"),
            Some(&FieldValue::I64(-300))
        );
        // Released, it routes at once.
        assert_eq!(delay_of(r.properties.headers.as_ref()).unwrap(), None);
    }

    #[test]
    fn store_keys_round_trip() {
        let k = store_key("/", "my.delayed", 1_700_000_000_123);
        assert_eq!(
            parse_store_key(&k),
            Some(("/", "my.delayed", 1_700_000_000_123))
        );
        assert_eq!(parse_store_key("/\u{1f}queue"), None);
    }

    #[test]
    fn schedule_orders_by_due_time_then_arrival() {
        let mut s = Schedule::default();
        let held = |n: &str| Held {
            exchange: Arc::from(n),
            body: Body::Memory(Arc::new(Message::new(
                String::new(),
                String::new(),
                Default::default(),
                Bytes::new(),
            ))),
        };
        s.insert(200, 1, held("late"));
        s.insert(100, 3, held("b"));
        s.insert(100, 2, held("a"));
        assert!(s.take_due(99, 10).is_empty());
        let due: Vec<String> = s
            .take_due(150, 10)
            .into_iter()
            .map(|(_, h)| h.exchange.to_string())
            .collect();
        assert_eq!(due, vec!["a", "b"]);
        assert_eq!(s.len(), 1);
        s.insert(300, 4, held("other"));
        assert_eq!(s.remove_exchange("late").len(), 1);
        assert_eq!(s.len(), 1);
        assert_eq!(s.take_due(1000, 0).len(), 0);
        assert_eq!(s.take_due(1000, 10).len(), 1);
    }
}
