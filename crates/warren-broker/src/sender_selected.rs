//! Sender-selected distribution: the `CC` and `BCC` message headers (rabbitmq.com/docs/
//! sender-selected).
//!
//! A publisher lists extra routing keys in the `CC` and `BCC` headers, each an array of long
//! strings (elements of other types are skipped); the message is routed with its routing key
//! and all of them. Direct and topic exchanges (and the default exchange) match every key;
//! fanout and headers exchanges ignore keys anyway. `BCC` is removed from the message before
//! it is delivered or stored, but its keys stay with the message: dead-lettering without an
//! `x-dead-letter-routing-key` routes with all of them again, while the `routing-keys` of an
//! `x-death` entry list the routing key and the `CC` keys only (RabbitMQ 4.x `mc`;
//! 3.10 shows the same keys).
//!
//! A `CC` or `BCC` header that is not an array fails the publish with 406 PRECONDITION_FAILED
//! `invalid message: {unacceptable_type_in_header,"CC",longstr}` (RabbitMQ's
//! `rabbit_basic:header_routes`).

use crate::args::type_name;
use crate::message::Message;
use std::sync::Arc;
use warren_amqp::table::{FieldTable, FieldValue};

/// A message's extra routing keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SenderKeys {
    /// Keys of the `CC` header, in order.
    pub cc: Vec<String>,
    /// Keys of the `BCC` header, in order (the header itself is removed before delivery).
    pub bcc: Vec<String>,
}

impl SenderKeys {
    /// Reads the `CC` and `BCC` headers. The error is RabbitMQ's reason for the
    /// `invalid message: <reason>` reply text.
    pub fn from_headers(headers: Option<&FieldTable>) -> Result<SenderKeys, String> {
        let Some(h) = headers else {
            return Ok(SenderKeys::default());
        };
        Ok(SenderKeys {
            cc: keys_of(h, "CC")?,
            bcc: keys_of(h, "BCC")?,
        })
    }

    /// True when there are no extra keys.
    pub fn is_empty(&self) -> bool {
        self.cc.is_empty() && self.bcc.is_empty()
    }

    /// Every key a message is routed with: `routing_key`, then `CC`, then `BCC`.
    pub fn all<'a>(&'a self, routing_key: &'a str) -> Vec<&'a str> {
        let mut keys = Vec::with_capacity(1 + self.cc.len() + self.bcc.len());
        keys.push(routing_key);
        keys.extend(self.cc.iter().map(String::as_str));
        keys.extend(self.bcc.iter().map(String::as_str));
        keys
    }

    /// The keys an `x-death` entry records: every routing key with the `BCC` keys taken
    /// out (Erlang's `--`: the first occurrence of each), i.e. the routing key and `CC`.
    pub fn death_keys(&self, routing_key: &str) -> Vec<String> {
        let mut keys: Vec<String> = self
            .all(routing_key)
            .into_iter()
            .map(str::to_string)
            .collect();
        for b in &self.bcc {
            if let Some(i) = keys.iter().position(|k| k == b) {
                keys.remove(i);
            }
        }
        keys
    }
}

fn keys_of(h: &FieldTable, header: &str) -> Result<Vec<String>, String> {
    match h.get(header) {
        None => Ok(Vec::new()),
        Some(FieldValue::Array(items)) => Ok(items
            .iter()
            .filter_map(|v| match v {
                FieldValue::LongString(b) => Some(String::from_utf8_lossy(b).into_owned()),
                _ => None,
            })
            .collect()),
        Some(other) => Err(format!(
            "{{unacceptable_type_in_header,\"{header}\",{}}}",
            type_name(other)
        )),
    }
}

/// The message as routed and delivered: its extra keys attached and its `BCC` header
/// removed. Returns `msg` itself when it has neither header.
pub fn prepare(msg: Arc<Message>, keys: SenderKeys) -> Arc<Message> {
    let has_bcc = msg
        .properties
        .headers
        .as_ref()
        .is_some_and(|h| h.contains_key("BCC"));
    if keys.is_empty() && !has_bcc {
        return msg;
    }
    let mut properties = msg.properties.clone();
    if let Some(h) = properties.headers.as_mut() {
        h.0.retain(|(k, _)| k != "BCC");
    }
    let mut m = Message::new(
        msg.exchange.clone(),
        msg.routing_key.clone(),
        properties,
        msg.body.clone(),
    );
    m.sender_keys = Some(Arc::new(keys));
    Arc::new(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn s(v: &str) -> FieldValue {
        FieldValue::LongString(Bytes::copy_from_slice(v.as_bytes()))
    }

    #[test]
    fn reads_arrays_of_long_strings() {
        let mut h = FieldTable::new();
        h.insert(
            "CC",
            FieldValue::Array(vec![s("k1"), FieldValue::I32(5), s("k2")]),
        );
        h.insert("BCC", FieldValue::Array(vec![s("k3")]));
        let k = SenderKeys::from_headers(Some(&h)).unwrap();
        assert_eq!(k.cc, vec!["k1", "k2"]);
        assert_eq!(k.bcc, vec!["k3"]);
        assert_eq!(k.all("rk"), vec!["rk", "k1", "k2", "k3"]);
        assert_eq!(k.death_keys("rk"), vec!["rk", "k1", "k2"]);
    }

    #[test]
    fn other_types_are_refused_with_rabbitmq_reason() {
        for (v, ty) in [
            (s("k"), "longstr"),
            (FieldValue::I32(1), "signedint"),
            (FieldValue::Table(FieldTable::new()), "table"),
        ] {
            let mut h = FieldTable::new();
            h.insert("CC", v.clone());
            assert_eq!(
                SenderKeys::from_headers(Some(&h)).unwrap_err(),
                format!("{{unacceptable_type_in_header,\"CC\",{ty}}}")
            );
            let mut h = FieldTable::new();
            h.insert("BCC", v);
            assert_eq!(
                SenderKeys::from_headers(Some(&h)).unwrap_err(),
                format!("{{unacceptable_type_in_header,\"BCC\",{ty}}}")
            );
        }
    }

    #[test]
    fn prepare_removes_bcc_only() {
        let mut h = FieldTable::new();
        h.insert("CC", FieldValue::Array(vec![s("k2")]));
        h.insert("BCC", FieldValue::Array(vec![s("k3")]));
        h.insert("other", s("x"));
        let msg = Arc::new(Message::new(
            "x".into(),
            "k1".into(),
            warren_amqp::properties::BasicProperties {
                headers: Some(h.clone()),
                ..Default::default()
            },
            Bytes::from_static(b"body"),
        ));
        let keys = SenderKeys::from_headers(Some(&h)).unwrap();
        let out = prepare(msg.clone(), keys.clone());
        let oh = out.properties.headers.as_ref().unwrap();
        assert!(oh.get("BCC").is_none());
        assert!(oh.get("CC").is_some() && oh.get("other").is_some());
        assert_eq!(out.sender_keys.as_deref(), Some(&keys));
        // Without CC or BCC the message is passed through untouched.
        let plain = Arc::new(Message::new(
            "x".into(),
            "k".into(),
            Default::default(),
            Bytes::new(),
        ));
        assert!(Arc::ptr_eq(
            &prepare(plain.clone(), SenderKeys::default()),
            &plain
        ));
    }
}
