//! Queue arguments (`x-…` of queue.declare): validation with RabbitMQ's error texts, and the
//! parsed settings a queue works with.
//!
//! RabbitMQ checks each known argument in `rabbit_amqqueue:check_arguments` and fails
//! queue.declare with `406 PRECONDITION_FAILED - invalid arg '<key>' for queue '<q>' in vhost
//! '<v>': <reason>`, the reason printed as an Erlang term (`{value_negative,-1}`,
//! `"expected integer, got longstr"`, …). Unknown arguments are ignored.

use crate::error::{BrokerError, Result};
use warren_amqp::table::{FieldTable, FieldValue};

/// Largest expiry RabbitMQ accepts for `x-message-ttl` and `x-expires` (its
/// `?MAX_EXPIRY_TIMER`, the largest Erlang timer).
pub const MAX_EXPIRY: i64 = 4_294_967_295;

/// Highest priority a queue supports (RabbitMQ's `?MAX_SUPPORTED_PRIORITY`).
pub const MAX_PRIORITY: i64 = 255;

/// What a queue does when a publish would take it past its length limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overflow {
    /// Drop (or dead-letter) the oldest messages.
    #[default]
    DropHead,
    /// Refuse the new message (nacked under publisher confirms).
    RejectPublish,
    /// Refuse the new message and dead-letter it.
    RejectPublishDlx,
}

/// A queue's parsed arguments.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueArgs {
    /// `x-message-ttl`, in ms.
    pub message_ttl: Option<u64>,
    /// `x-expires`, in ms.
    pub expires: Option<u64>,
    /// `x-max-length`.
    pub max_length: Option<u64>,
    /// `x-max-length-bytes`.
    pub max_length_bytes: Option<u64>,
    /// `x-overflow`.
    pub overflow: Overflow,
    /// `x-dead-letter-exchange`.
    pub dead_letter_exchange: Option<String>,
    /// `x-dead-letter-routing-key`.
    pub dead_letter_routing_key: Option<String>,
    /// `x-max-priority`.
    pub max_priority: Option<u8>,
    /// `x-single-active-consumer`.
    pub single_active_consumer: bool,
    /// `x-consumer-timeout`, in ms (merged with the `consumer-timeout` policy key in the
    /// queue's effective settings): how long a delivery of this queue may stay
    /// unacknowledged before its channel is closed. `None`: the broker's
    /// `amqp.consumer_timeout` applies.
    pub consumer_timeout: Option<u64>,
}

/// RabbitMQ's name for a field value's type, as in its error texts.
pub fn type_name(v: &FieldValue) -> &'static str {
    match v {
        FieldValue::Bool(_) => "bool",
        FieldValue::I8(_) => "byte",
        FieldValue::U8(_) => "unsignedbyte",
        FieldValue::I16(_) => "short",
        FieldValue::U16(_) => "unsignedshort",
        FieldValue::I32(_) => "signedint",
        FieldValue::U32(_) => "unsignedint",
        FieldValue::I64(_) => "long",
        FieldValue::F32(_) => "float",
        FieldValue::F64(_) => "double",
        FieldValue::Decimal { .. } => "decimal",
        FieldValue::LongString(_) => "longstr",
        FieldValue::ByteArray(_) => "binary",
        FieldValue::Array(_) => "array",
        FieldValue::Timestamp(_) => "timestamp",
        FieldValue::Table(_) => "table",
        FieldValue::Void => "void",
    }
}

/// An integer of one of the types RabbitMQ accepts for integer arguments (byte, short,
/// signedint, long); unsigned AMQP types are refused, as by RabbitMQ. The error is the
/// reason part of RabbitMQ's `invalid arg` text (`"expected integer, got ..."`); every
/// queue kind validates its integer arguments with it.
pub fn int(v: &FieldValue) -> std::result::Result<i64, String> {
    match v {
        FieldValue::I8(i) => Ok(i64::from(*i)),
        FieldValue::I16(i) => Ok(i64::from(*i)),
        FieldValue::I32(i) => Ok(i64::from(*i)),
        FieldValue::I64(i) => Ok(*i),
        other => Err(format!("\"expected integer, got {}\"", type_name(other))),
    }
}

/// [`int`], refusing a negative value with RabbitMQ's `{value_negative,N}`.
pub fn non_neg(v: &FieldValue) -> std::result::Result<i64, String> {
    let n = int(v)?;
    if n < 0 {
        return Err(format!("{{value_negative,{n}}}"));
    }
    Ok(n)
}

/// A TTL or expiry in ms: `{value_negative,N}` below 0, `{value_too_large,N,MAX}` above
/// [`MAX_EXPIRY`].
pub fn expiry(n: i64) -> std::result::Result<i64, String> {
    if n < 0 {
        Err(format!("{{value_negative,{n}}}"))
    } else if n > MAX_EXPIRY {
        Err(format!("{{value_too_large,{n},{MAX_EXPIRY}}}"))
    } else {
        Ok(n)
    }
}

fn string(v: &FieldValue) -> std::result::Result<String, String> {
    match v {
        FieldValue::LongString(b) => Ok(String::from_utf8_lossy(b).into_owned()),
        other => Err(format!("{{unacceptable_type,{}}}", type_name(other))),
    }
}

/// Parses a message's `expiration` property (a TTL in ms, as a decimal string) as RabbitMQ's
/// `rabbit_basic:parse_expiration` does; the error is the reason RabbitMQ gives in
/// `invalid expiration '<value>': <reason>`.
pub fn parse_expiration(e: &str) -> std::result::Result<u64, String> {
    let b = e.as_bytes();
    let sign = usize::from(matches!(b.first(), Some(b'+' | b'-')));
    let digits = b[sign..].iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 {
        return Err("no_integer".into());
    }
    let (num, rest) = e.split_at(sign + digits);
    if !rest.is_empty() {
        return Err(format!("{{leftover_string,\"{rest}\"}}"));
    }
    match num.parse::<i64>() {
        Ok(n) => expiry(n).map(|n| n as u64),
        Err(_) if sign == 1 && b[0] == b'-' => Err(format!("{{value_negative,{num}}}")),
        Err(_) => Err(format!("{{value_too_large,{num},{MAX_EXPIRY}}}")),
    }
}

impl QueueArgs {
    /// Validates `args` as RabbitMQ does at queue.declare and parses them. `resource` names
    /// the queue (`queue 'q' in vhost '/'`) for the error text.
    pub fn parse(resource: &str, args: &FieldTable) -> Result<QueueArgs> {
        let mut out = QueueArgs::default();
        let fail = |key: &str, reason: String| {
            BrokerError::precondition_failed(format!(
                "invalid arg '{key}' for {resource}: {reason}"
            ))
        };
        // rabbit_channel checks the type of the dead-letter exchange name before the queue
        // type validates the other arguments, with its own wording.
        if let Some(v) = args.get("x-dead-letter-exchange") {
            if !matches!(v, FieldValue::LongString(_)) {
                return Err(BrokerError::precondition_failed(format!(
                    "invalid type '{}' for arg 'x-dead-letter-exchange' in {resource}",
                    type_name(v)
                )));
            }
        }
        // Checked in RabbitMQ's order (`rabbit_amqqueue:declare_args/0`).
        if let Some(v) = args.get("x-expires") {
            let n = int(v)
                .and_then(|n| {
                    if n == 0 {
                        Err("{value_zero,0}".to_string())
                    } else {
                        expiry(n)
                    }
                })
                .map_err(|r| fail("x-expires", r))?;
            out.expires = Some(n as u64);
        }
        if let Some(v) = args.get("x-message-ttl") {
            let n = int(v)
                .and_then(expiry)
                .map_err(|r| fail("x-message-ttl", r))?;
            out.message_ttl = Some(n as u64);
        }
        if let Some(v) = args.get("x-dead-letter-exchange") {
            out.dead_letter_exchange =
                Some(string(v).map_err(|r| fail("x-dead-letter-exchange", r))?);
        }
        if let Some(v) = args.get("x-dead-letter-routing-key") {
            let rk = string(v).map_err(|r| fail("x-dead-letter-routing-key", r))?;
            if out.dead_letter_exchange.is_none() {
                return Err(fail(
                    "x-dead-letter-routing-key",
                    "routing_key_but_no_dlx_defined".into(),
                ));
            }
            out.dead_letter_routing_key = Some(rk);
        }
        for key in [
            "x-max-length",
            "x-max-length-bytes",
            "x-max-in-memory-length",
            "x-max-in-memory-bytes",
        ] {
            if let Some(v) = args.get(key) {
                let n = non_neg(v).map_err(|r| fail(key, r))? as u64;
                match key {
                    "x-max-length" => out.max_length = Some(n),
                    "x-max-length-bytes" => out.max_length_bytes = Some(n),
                    _ => {}
                }
            }
        }
        if let Some(v) = args.get("x-max-priority") {
            let n = non_neg(v).map_err(|r| fail("x-max-priority", r))?;
            if n > MAX_PRIORITY {
                return Err(fail(
                    "x-max-priority",
                    format!("{{max_value_exceeded,{n}}}"),
                ));
            }
            out.max_priority = Some(n as u8);
        }
        if let Some(v) = args.get("x-overflow") {
            out.overflow = match v {
                FieldValue::LongString(b) => match &b[..] {
                    b"drop-head" => Overflow::DropHead,
                    b"reject-publish" => Overflow::RejectPublish,
                    b"reject-publish-dlx" => Overflow::RejectPublishDlx,
                    _ => return Err(fail("x-overflow", "invalid_overflow".into())),
                },
                other => {
                    return Err(fail(
                        "x-overflow",
                        format!("{{unacceptable_type,{}}}", type_name(other)),
                    ))
                }
            };
        }
        if let Some(v) = args.get("x-queue-mode") {
            let mode = string(v).map_err(|r| fail("x-queue-mode", r))?;
            if mode != "default" && mode != "lazy" {
                return Err(fail(
                    "x-queue-mode",
                    format!("\"unsupported queue mode '{mode}'\""),
                ));
            }
        }
        if let Some(v) = args.get("x-single-active-consumer") {
            match v {
                FieldValue::Bool(b) => out.single_active_consumer = *b,
                other => {
                    return Err(fail(
                        "x-single-active-consumer",
                        format!("{{unacceptable_type,{}}}", type_name(other)),
                    ))
                }
            }
        }
        // RabbitMQ 4.3.2 and later validate it as a non-negative integer (earlier versions
        // ignored a value of another type, and with it the timeout).
        if let Some(v) = args.get("x-consumer-timeout") {
            let n = non_neg(v).map_err(|r| fail("x-consumer-timeout", r))?;
            out.consumer_timeout = Some(n as u64);
        }
        if let Some(v) = args.get("x-queue-type") {
            let t = string(v).map_err(|r| fail("x-queue-type", r))?;
            // Warren only has classic queues. RabbitMQ would create a quorum queue or a
            // stream; silently creating a classic queue instead would change the
            // application's guarantees, so those are refused too.
            if t != "classic" {
                return Err(fail(
                    "x-queue-type",
                    format!("\"unsupported queue type '{t}'\""),
                ));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn s(v: &str) -> FieldValue {
        FieldValue::LongString(Bytes::copy_from_slice(v.as_bytes()))
    }

    fn parse(pairs: &[(&str, FieldValue)]) -> Result<QueueArgs> {
        let t: FieldTable = pairs.iter().cloned().collect();
        QueueArgs::parse("queue 'q' in vhost '/'", &t)
    }

    fn reason(pairs: &[(&str, FieldValue)]) -> String {
        let e = parse(pairs).unwrap_err();
        assert_eq!(e.code, 406);
        e.text
    }

    #[test]
    fn rabbitmq_error_texts() {
        assert_eq!(
            reason(&[("x-message-ttl", FieldValue::I32(-1))]),
            "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': {value_negative,-1}"
        );
        assert_eq!(
            reason(&[("x-message-ttl", s("1000"))]),
            "invalid arg 'x-message-ttl' for queue 'q' in vhost '/': \"expected integer, got longstr\""
        );
        assert_eq!(
            reason(&[("x-expires", FieldValue::I32(0))]),
            "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_zero,0}"
        );
        assert_eq!(
            reason(&[("x-expires", FieldValue::I64(MAX_EXPIRY + 1))]),
            "invalid arg 'x-expires' for queue 'q' in vhost '/': {value_too_large,4294967296,4294967295}"
        );
        assert_eq!(
            reason(&[("x-max-length", FieldValue::I16(-5))]),
            "invalid arg 'x-max-length' for queue 'q' in vhost '/': {value_negative,-5}"
        );
        assert_eq!(
            reason(&[("x-max-length-bytes", FieldValue::U32(5))]),
            "invalid arg 'x-max-length-bytes' for queue 'q' in vhost '/': \"expected integer, got unsignedint\""
        );
        assert_eq!(
            reason(&[("x-overflow", s("drop-tail"))]),
            "invalid arg 'x-overflow' for queue 'q' in vhost '/': invalid_overflow"
        );
        assert_eq!(
            reason(&[("x-dead-letter-exchange", FieldValue::I32(1))]),
            "invalid type 'signedint' for arg 'x-dead-letter-exchange' in queue 'q' in vhost '/'"
        );
        assert_eq!(
            reason(&[("x-dead-letter-routing-key", s("rk"))]),
            "invalid arg 'x-dead-letter-routing-key' for queue 'q' in vhost '/': routing_key_but_no_dlx_defined"
        );
        assert_eq!(
            reason(&[("x-max-priority", FieldValue::I32(256))]),
            "invalid arg 'x-max-priority' for queue 'q' in vhost '/': {max_value_exceeded,256}"
        );
        assert_eq!(
            reason(&[("x-single-active-consumer", s("true"))]),
            "invalid arg 'x-single-active-consumer' for queue 'q' in vhost '/': {unacceptable_type,longstr}"
        );
        assert_eq!(
            reason(&[("x-consumer-timeout", FieldValue::I32(-1))]),
            "invalid arg 'x-consumer-timeout' for queue 'q' in vhost '/': {value_negative,-1}"
        );
        assert_eq!(
            reason(&[("x-consumer-timeout", s("60000"))]),
            "invalid arg 'x-consumer-timeout' for queue 'q' in vhost '/': \"expected integer, got longstr\""
        );
        assert_eq!(
            reason(&[("x-queue-type", s("quorum"))]),
            "invalid arg 'x-queue-type' for queue 'q' in vhost '/': \"unsupported queue type 'quorum'\""
        );
    }

    #[test]
    fn expiration_property() {
        assert_eq!(parse_expiration("1500"), Ok(1500));
        assert_eq!(parse_expiration("0"), Ok(0));
        assert_eq!(parse_expiration("abc"), Err("no_integer".into()));
        assert_eq!(parse_expiration(""), Err("no_integer".into()));
        assert_eq!(parse_expiration("-5"), Err("{value_negative,-5}".into()));
        assert_eq!(
            parse_expiration("10s"),
            Err("{leftover_string,\"s\"}".into())
        );
    }

    #[test]
    fn parses_valid_arguments() {
        let a = parse(&[
            ("x-message-ttl", FieldValue::I32(0)),
            ("x-expires", FieldValue::I64(1000)),
            ("x-max-length", FieldValue::I8(3)),
            ("x-overflow", s("reject-publish")),
            ("x-dead-letter-exchange", s("")),
            ("x-dead-letter-routing-key", s("dead")),
            ("x-max-priority", FieldValue::I16(10)),
            ("x-single-active-consumer", FieldValue::Bool(true)),
            ("x-queue-type", s("classic")),
            ("x-consumer-timeout", FieldValue::I64(60_000)),
            ("x-unknown", s("ignored")),
        ])
        .unwrap();
        assert_eq!(a.message_ttl, Some(0));
        assert_eq!(a.expires, Some(1000));
        assert_eq!(a.max_length, Some(3));
        assert_eq!(a.overflow, Overflow::RejectPublish);
        assert_eq!(a.dead_letter_exchange.as_deref(), Some(""));
        assert_eq!(a.dead_letter_routing_key.as_deref(), Some("dead"));
        assert_eq!(a.max_priority, Some(10));
        assert!(a.single_active_consumer);
        assert_eq!(a.consumer_timeout, Some(60_000));
    }
}
