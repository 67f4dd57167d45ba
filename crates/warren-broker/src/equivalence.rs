//! Equivalence of redeclares: a declare of an exchange or queue that exists must match it in
//! type, flags and the arguments RabbitMQ compares, or fail with RabbitMQ's 406
//! PRECONDITION_FAILED `inequivalent arg '<name>' for <resource>: received <value> but current
//! is <value>` texts.

use crate::error::{BrokerError, Result};
use warren_amqp::table::{FieldTable, FieldValue};

/// Queue arguments whose values must match when a queue is redeclared (RabbitMQ compares these
/// and ignores any other argument).
pub(crate) const EQUIVALENT_QUEUE_ARGS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-queue-version",
    "x-single-active-consumer",
    "x-delivery-limit",
];

pub(crate) fn check_field<T: PartialEq + std::fmt::Display>(
    what: &str,
    field: &str,
    current: T,
    received: T,
) -> Result<()> {
    if current == received {
        return Ok(());
    }
    Err(BrokerError::precondition_failed(format!(
        "inequivalent arg '{field}' for {what}: received '{received}' but current is '{current}'"
    )))
}

pub(crate) fn check_args(
    what: &str,
    current: &FieldTable,
    received: &FieldTable,
    keys: &[&str],
) -> Result<()> {
    for key in keys {
        let (c, r) = (current.get(key), received.get(key));
        let same = match (c, r) {
            (None, None) => true,
            (Some(a), Some(b)) => a == b || (a.as_i64().is_some() && a.as_i64() == b.as_i64()),
            // A classic queue may or may not carry `x-queue-type: classic`.
            (None, Some(v)) | (Some(v), None) => {
                *key == "x-queue-type" && v.as_str() == Some("classic")
            }
        };
        if !same {
            // RabbitMQ (rabbit_misc:assert_args_equivalence) shows plain values when both
            // sides have the argument, and the value with its type against `none` otherwise.
            let (shown_r, shown_c) = match (r, c) {
                (Some(r), Some(c)) => (
                    format!("'{}'", arg_type_and_value(r).1),
                    format!("'{}'", arg_type_and_value(c).1),
                ),
                _ => (describe_arg(r), describe_arg(c)),
            };
            return Err(BrokerError::precondition_failed(format!(
                "inequivalent arg '{key}' for {what}: received {shown_r} but current is {shown_c}"
            )));
        }
    }
    Ok(())
}

/// RabbitMQ's type name for a field value and the value as its error texts show it.
pub(crate) fn arg_type_and_value(v: &FieldValue) -> (&'static str, String) {
    match v {
        FieldValue::Bool(b) => ("bool", b.to_string()),
        FieldValue::I8(i) => ("byte", i.to_string()),
        FieldValue::U8(i) => ("unsignedbyte", i.to_string()),
        FieldValue::I16(i) => ("short", i.to_string()),
        FieldValue::U16(i) => ("unsignedshort", i.to_string()),
        FieldValue::I32(i) => ("signedint", i.to_string()),
        FieldValue::U32(i) => ("unsignedint", i.to_string()),
        FieldValue::I64(i) => ("long", i.to_string()),
        FieldValue::F32(f) => ("float", f.to_string()),
        FieldValue::F64(f) => ("double", f.to_string()),
        FieldValue::Decimal { scale, value } => ("decimal", format!("{value}e-{scale}")),
        FieldValue::LongString(b) => ("longstr", String::from_utf8_lossy(b).into_owned()),
        FieldValue::ByteArray(b) => ("binary", format!("{b:?}")),
        FieldValue::Array(a) => ("array", format!("{a:?}")),
        FieldValue::Timestamp(t) => ("timestamp", t.to_string()),
        FieldValue::Table(t) => ("table", format!("{t:?}")),
        FieldValue::Void => ("void", "void".into()),
    }
}

/// RabbitMQ's wording for an argument value in inequivalence errors when only one side has
/// it: `the value '2000' of type 'signedint'`, or `none`.
pub(crate) fn describe_arg(v: Option<&FieldValue>) -> String {
    let Some(v) = v else {
        return "none".into();
    };
    let (ty, shown) = arg_type_and_value(v);
    format!("the value '{shown}' of type '{ty}'")
}
