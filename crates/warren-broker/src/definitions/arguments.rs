//! Queue, exchange and binding arguments between JSON and AMQP field tables.
//!
//! Definitions files hold arguments as JSON objects; the broker holds them as AMQP field tables.
//! The mapping is RabbitMQ's (`to_amqp_table/1` and `amqp_table/1` in `rabbit_misc.erl`):
//!
//! | JSON | AMQP |
//! |---|---|
//! | string | long string (`S`) |
//! | integer | signed 64-bit (`l`) |
//! | other number | double (`d`) |
//! | true / false | boolean (`t`) |
//! | array | field array (`A`) |
//! | object | nested table (`F`) |
//! | null | refused |
//!
//! Back to JSON, every integer type becomes a number, a decimal its value as a float, a
//! timestamp its seconds, void `null`, and a byte string that is not UTF-8 the text
//! `Not UTF-8, base64 is: <base64>` as RabbitMQ writes it.

use base64::Engine as _;
use bytes::Bytes;
use serde_json::{Number, Value};
use warren_amqp::table::{FieldTable, FieldValue};

use super::format::Object;

/// An argument that has no AMQP counterpart.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArgumentError {
    /// `null` (RabbitMQ: `null_not_allowed`).
    #[error("argument '{0}' is null")]
    Null(String),
    /// An integer beyond the signed 64-bit range.
    #[error("argument '{0}' is an integer out of the signed 64-bit range")]
    OutOfRange(String),
}

/// Converts a JSON object of arguments to a field table, keys in the object's order.
pub fn json_to_table(object: &Object) -> Result<FieldTable, ArgumentError> {
    let mut table = FieldTable::new();
    for (key, value) in object {
        table.insert(key.clone(), json_to_value(key, value)?);
    }
    Ok(table)
}

fn json_to_value(key: &str, value: &Value) -> Result<FieldValue, ArgumentError> {
    Ok(match value {
        Value::Null => return Err(ArgumentError::Null(key.to_string())),
        Value::Bool(b) => FieldValue::Bool(*b),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                FieldValue::I64(i)
            } else if n.is_u64() {
                return Err(ArgumentError::OutOfRange(key.to_string()));
            } else {
                FieldValue::F64(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        Value::String(s) => FieldValue::LongString(Bytes::from(s.clone())),
        Value::Array(items) => FieldValue::Array(
            items
                .iter()
                .map(|v| json_to_value(key, v))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(o) => FieldValue::Table(json_to_table(o)?),
    })
}

/// Converts a field table to a JSON object.
pub fn table_to_json(table: &FieldTable) -> Object {
    table
        .iter()
        .map(|(k, v)| (k.clone(), value_to_json(v)))
        .collect()
}

fn float(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

fn value_to_json(value: &FieldValue) -> Value {
    match value {
        FieldValue::Bool(b) => Value::Bool(*b),
        FieldValue::I8(n) => Value::from(*n),
        FieldValue::U8(n) => Value::from(*n),
        FieldValue::I16(n) => Value::from(*n),
        FieldValue::U16(n) => Value::from(*n),
        FieldValue::I32(n) => Value::from(*n),
        FieldValue::U32(n) => Value::from(*n),
        FieldValue::I64(n) => Value::from(*n),
        FieldValue::F32(f) => float(f64::from(*f)),
        FieldValue::F64(f) => float(*f),
        FieldValue::Decimal { scale, value } => {
            float(f64::from(*value) / 10f64.powi(i32::from(*scale)))
        }
        FieldValue::LongString(b) | FieldValue::ByteArray(b) => match std::str::from_utf8(b) {
            Ok(s) => Value::String(s.to_string()),
            Err(_) => Value::String(format!(
                "Not UTF-8, base64 is: {}",
                base64::engine::general_purpose::STANDARD.encode(b)
            )),
        },
        FieldValue::Array(items) => Value::Array(items.iter().map(value_to_json).collect()),
        FieldValue::Timestamp(t) => Value::from(*t),
        FieldValue::Table(t) => Value::Object(table_to_json(t)),
        FieldValue::Void => Value::Null,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Object {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn json_types_map_as_in_rabbitmq() {
        let t = json_to_table(&obj(json!({
            "x-max-length": 1000,
            "x-dead-letter-exchange": "dlx",
            "x-single-active-consumer": true,
            "ratio": 0.5,
            "list": [1, "a"],
            "nested": {"k": -1}
        })))
        .unwrap();
        assert_eq!(t.get("x-max-length"), Some(&FieldValue::I64(1000)));
        assert_eq!(
            t.get("x-dead-letter-exchange").and_then(FieldValue::as_str),
            Some("dlx")
        );
        assert_eq!(
            t.get("x-single-active-consumer"),
            Some(&FieldValue::Bool(true))
        );
        assert_eq!(t.get("ratio"), Some(&FieldValue::F64(0.5)));
        assert_eq!(
            t.get("list"),
            Some(&FieldValue::Array(vec![
                FieldValue::I64(1),
                FieldValue::LongString(Bytes::from_static(b"a"))
            ]))
        );
        let mut inner = FieldTable::new();
        inner.insert("k", FieldValue::I64(-1));
        assert_eq!(t.get("nested"), Some(&FieldValue::Table(inner)));
    }

    #[test]
    fn round_trip_through_amqp() {
        let v = obj(json!({"a": 1, "b": "s", "c": [true, 2.5], "d": {"e": {}}}));
        assert_eq!(table_to_json(&json_to_table(&v).unwrap()), v);
    }

    #[test]
    fn unrepresentable_values_are_refused() {
        assert_eq!(
            json_to_table(&obj(json!({"x-expires": null}))),
            Err(ArgumentError::Null("x-expires".into()))
        );
        assert_eq!(
            json_to_table(&obj(json!({"big": u64::MAX}))),
            Err(ArgumentError::OutOfRange("big".into()))
        );
        assert!(json_to_table(&obj(json!({"deep": [{"k": null}]}))).is_err());
    }

    #[test]
    fn amqp_only_types_to_json() {
        let mut t = FieldTable::new();
        t.insert("i8", FieldValue::I8(-3));
        t.insert("u32", FieldValue::U32(7));
        t.insert(
            "dec",
            FieldValue::Decimal {
                scale: 2,
                value: 150,
            },
        );
        t.insert("ts", FieldValue::Timestamp(1_700_000_000));
        t.insert("void", FieldValue::Void);
        t.insert(
            "bytes",
            FieldValue::ByteArray(Bytes::from_static(&[0xff, 0x00])),
        );
        assert_eq!(
            Value::Object(table_to_json(&t)),
            json!({
                "i8": -3, "u32": 7, "dec": 1.5, "ts": 1_700_000_000u64, "void": null,
                "bytes": "Not UTF-8, base64 is: /wA="
            })
        );
    }
}
