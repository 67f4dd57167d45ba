//! Proptest strategies for the hand-written types, shared by the generated
//! per-method strategies.

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::generated::Method;
use crate::properties::BasicProperties;
use crate::table::{FieldTable, FieldValue};

/// Short strings of at most 40 characters (at most 160 UTF-8 bytes).
pub fn shortstr() -> impl Strategy<Value = String> {
    "\\PC{0,40}"
}

/// Arbitrary long strings (raw bytes).
pub fn longstr() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..64).prop_map(Bytes::from)
}

fn leaf_value() -> impl Strategy<Value = FieldValue> {
    prop_oneof![
        any::<bool>().prop_map(FieldValue::Bool),
        any::<i8>().prop_map(FieldValue::I8),
        any::<u8>().prop_map(FieldValue::U8),
        any::<i16>().prop_map(FieldValue::I16),
        any::<u16>().prop_map(FieldValue::U16),
        any::<i32>().prop_map(FieldValue::I32),
        any::<u32>().prop_map(FieldValue::U32),
        any::<i64>().prop_map(FieldValue::I64),
        any::<f32>()
            .prop_filter("NaN never compares equal", |f| !f.is_nan())
            .prop_map(FieldValue::F32),
        any::<f64>()
            .prop_filter("NaN never compares equal", |f| !f.is_nan())
            .prop_map(FieldValue::F64),
        (any::<u8>(), any::<u32>()).prop_map(|(scale, value)| FieldValue::Decimal { scale, value }),
        longstr().prop_map(FieldValue::LongString),
        longstr().prop_map(FieldValue::ByteArray),
        any::<u64>().prop_map(FieldValue::Timestamp),
        Just(FieldValue::Void),
    ]
}

/// Any field value, nested tables and arrays included (depth at most 4).
pub fn field_value() -> impl Strategy<Value = FieldValue> {
    leaf_value().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(FieldValue::Array),
            vec((shortstr(), inner), 0..6).prop_map(|e| FieldValue::Table(FieldTable(e))),
        ]
    })
}

/// Any field table. Keys may repeat: the wire format allows it and the
/// codec preserves entries verbatim.
pub fn field_table() -> impl Strategy<Value = FieldTable> {
    vec((shortstr(), field_value()), 0..6).prop_map(FieldTable)
}

/// Any set of `basic` properties; short-string values are arbitrary bytes, as
/// clients may send (a binary `correlation-id`).
pub fn basic_properties() -> impl Strategy<Value = BasicProperties> {
    let s = || {
        proptest::option::of(vec(any::<u8>(), 0..=255).prop_map(crate::shortstr::ShortStr::from))
    };
    (
        (s(), s(), proptest::option::of(field_table())),
        (
            proptest::option::of(any::<u8>()),
            proptest::option::of(any::<u8>()),
        ),
        (s(), s(), s(), s()),
        proptest::option::of(any::<u64>()),
        (s(), s(), s(), s()),
    )
        .prop_map(
            |(
                (content_type, content_encoding, headers),
                (delivery_mode, priority),
                (correlation_id, reply_to, expiration, message_id),
                timestamp,
                (kind, user_id, app_id, cluster_id),
            )| BasicProperties {
                content_type,
                content_encoding,
                headers,
                delivery_mode,
                priority,
                correlation_id,
                reply_to,
                expiration,
                message_id,
                timestamp,
                kind,
                user_id,
                app_id,
                cluster_id,
            },
        )
}

/// Encodes `m`, decodes it back both as a bare payload and as a frame, and
/// checks that the values are equal.
pub fn check_method_roundtrip(m: Method) -> Result<(), TestCaseError> {
    let mut buf = BytesMut::new();
    m.encode(&mut buf);
    prop_assert_eq!(&Method::decode(&buf), &Ok(m.clone()));

    let mut frame_buf = BytesMut::new();
    crate::frame::encode_method_frame(7, &m, &mut frame_buf);
    let limits = crate::frame::Limits::new(0);
    let parsed = crate::frame::parse_frame(&mut frame_buf, &limits);
    prop_assert_eq!(
        parsed,
        Ok(Some(crate::frame::Frame::Method {
            channel: 7,
            method: m
        }))
    );
    prop_assert!(frame_buf.is_empty());
    Ok(())
}
