//! Unit and property tests for framing, tables and properties.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;

use crate::arbitrary::{basic_properties, field_table, field_value};
use crate::constants::*;
use crate::error::DecodeError;
use crate::frame::*;
use crate::generated::*;
use crate::generated_tests::arbitrary_method;
use crate::properties::BasicProperties;
use crate::table::*;

fn limits() -> Limits {
    Limits::default()
}

#[test]
fn heartbeat_round_trip() {
    let mut buf = BytesMut::new();
    encode_heartbeat(&mut buf);
    assert_eq!(&buf[..], &[8, 0, 0, 0, 0, 0, 0, 0xCE]);
    let f = parse_frame(&mut buf, &limits()).unwrap().unwrap();
    assert_eq!(f, Frame::Heartbeat { channel: 0 });
    assert_eq!(f.channel(), 0);
    assert!(buf.is_empty());
}

#[test]
fn heartbeat_with_payload_is_rejected() {
    let mut buf = BytesMut::from(&[8, 0, 0, 0, 0, 0, 1, 0, 0xCE][..]);
    assert_eq!(
        parse_frame(&mut buf, &limits()),
        Err(DecodeError::BadHeartbeat(1))
    );
}

#[test]
fn method_frame_round_trip_and_wire_layout() {
    let m: Method = ConnectionTune {
        channel_max: 2047,
        frame_max: 131_072,
        heartbeat: 60,
    }
    .into();
    let mut buf = BytesMut::new();
    encode_method_frame(0, &m, &mut buf);
    let expected: &[u8] = &[
        1, 0, 0, 0, 0, 0, 12, // type, channel, size
        0, 10, 0, 30, // connection.tune
        0x07, 0xFF, 0, 2, 0, 0, 0, 60, 0xCE,
    ];
    assert_eq!(&buf[..], expected);
    assert_eq!(
        parse_frame(&mut buf, &limits()).unwrap(),
        Some(Frame::Method {
            channel: 0,
            method: m
        })
    );
    assert!(buf.is_empty());
}

#[test]
fn bits_are_packed_into_one_octet() {
    let m: Method = QueueDeclare {
        ticket: 0,
        queue: "q".into(),
        passive: false,
        durable: true,
        exclusive: false,
        auto_delete: true,
        nowait: true,
        arguments: FieldTable::new(),
    }
    .into();
    let mut buf = BytesMut::new();
    m.encode(&mut buf);
    assert_eq!(
        &buf[..],
        &[0, 50, 0, 10, 0, 0, 1, b'q', 0b11010, 0, 0, 0, 0]
    );
    assert_eq!(Method::decode(&buf), Ok(m));
}

#[test]
fn method_metadata() {
    let m: Method = BasicPublish::default().into();
    assert_eq!((m.class_id(), m.method_id()), (60, 40));
    assert_eq!(m.name(), "basic.publish");
    assert!(m.has_content());
    assert!(!m.is_synchronous());
    assert!(Method::from(BasicGetOk::default()).has_content());
    assert!(Method::from(BasicDeliver::default()).has_content());
    assert!(Method::from(BasicReturn::default()).has_content());
    assert!(!Method::from(BasicGetEmpty::default()).has_content());
    assert!(Method::from(QueueDeclare::default()).is_synchronous());
    assert_eq!(method_name(40, 51), Some("exchange.unbind-ok"));
    assert_eq!(method_name(85, 10), Some("confirm.select"));
    assert_eq!(method_name(10, 71), Some("connection.update-secret-ok"));
    assert_eq!(method_name(60, 100), Some("basic.recover-async"));
    assert_eq!(method_name(60, 99), None);
    assert_eq!(ConfirmSelect::CLASS_ID, 85);
    assert_eq!(class_name(CLASS_BASIC), Some("basic"));
}

#[test]
fn reply_codes() {
    assert_eq!(REPLY_SUCCESS, 200);
    assert_eq!(NOT_FOUND, 404);
    assert_eq!(INTERNAL_ERROR, 541);
    assert_eq!(reply_code_name(404), "NOT_FOUND");
    assert_eq!(reply_code_name(PRECONDITION_FAILED), "PRECONDITION_FAILED");
    assert_eq!(reply_code_name(1), "UNKNOWN");
    assert!(is_soft_error(NOT_FOUND) && !is_hard_error(NOT_FOUND));
    assert!(is_hard_error(FRAME_ERROR));
}

#[test]
fn body_is_split_by_frame_max() {
    let body: Vec<u8> = (0..=255u8).cycle().take(100).collect();
    let mut buf = BytesMut::new();
    encode_body_frames(3, &body, 40, &mut buf);
    // 32-byte payloads: 32 + 32 + 32 + 4.
    assert_eq!(buf.len(), 100 + 4 * 8);
    let lim = Limits::new(40);
    let mut got = Vec::new();
    let mut sizes = Vec::new();
    while let Some(f) = parse_frame(&mut buf, &lim).unwrap() {
        match f {
            Frame::Body { channel, payload } => {
                assert_eq!(channel, 3);
                sizes.push(payload.len());
                got.extend_from_slice(&payload);
            }
            other => panic!("unexpected frame {other:?}"),
        }
    }
    assert_eq!(sizes, [32, 32, 32, 4]);
    assert_eq!(got, body);

    let mut empty = BytesMut::new();
    encode_body_frames(3, &[], 40, &mut empty);
    assert!(empty.is_empty());
}

#[test]
fn body_payload_is_zero_copy() {
    let mut buf = BytesMut::new();
    encode_body_frames(1, b"hello", 4096, &mut buf);
    let base = buf.as_ptr() as usize;
    let Some(Frame::Body { payload, .. }) = parse_frame(&mut buf, &limits()).unwrap() else {
        panic!("expected a body frame");
    };
    assert_eq!(&payload[..], b"hello");
    assert_eq!(payload.as_ptr() as usize, base + 7);
}

#[test]
fn header_frame_round_trip() {
    let props = BasicProperties {
        content_type: Some("text/plain".into()),
        delivery_mode: Some(2),
        timestamp: Some(1_700_000_000),
        kind: Some("t".into()),
        cluster_id: Some("c".into()),
        headers: Some([("x-match", FieldValue::from("all"))].into_iter().collect()),
        ..Default::default()
    };
    let mut buf = BytesMut::new();
    encode_header_frame(5, 60, 12345, &props, &mut buf);
    assert_eq!(
        parse_frame(&mut buf, &limits()).unwrap(),
        Some(Frame::Header {
            channel: 5,
            class_id: 60,
            weight: 0,
            body_size: 12345,
            properties: props,
        })
    );
}

#[test]
fn property_flags_follow_spec_order() {
    let p = BasicProperties {
        content_type: Some(String::new().into()),
        cluster_id: Some(String::new().into()),
        ..Default::default()
    };
    assert_eq!(p.flags(), 0x8004);
    let mut buf = BytesMut::new();
    p.encode(&mut buf);
    assert_eq!(&buf[..], &[0x80, 0x04, 0, 0]);
    // Continuation words without property bits are accepted.
    assert_eq!(
        BasicProperties::decode(&[0x80, 0x01, 0x00, 0x00, 0], 16),
        Ok(BasicProperties {
            content_type: Some(String::new().into()),
            ..Default::default()
        })
    );
    // Bit 1 names no property: ignored, as RabbitMQ does.
    assert_eq!(
        BasicProperties::decode(&[0x00, 0x02], 16),
        Ok(BasicProperties::default())
    );
    // A continuation word may not set property bits.
    assert_eq!(
        BasicProperties::decode(&[0x00, 0x01, 0x80, 0x00], 16),
        Err(DecodeError::BadPropertyFlags(0x8000))
    );
    assert_eq!(
        BasicProperties::decode(&[0x00, 0x00, 1], 16),
        Err(DecodeError::TrailingBytes)
    );
}

#[test]
fn bad_frame_end() {
    let mut buf = BytesMut::new();
    encode_method_frame(1, &ChannelOpen::default().into(), &mut buf);
    let last = buf.len() - 1;
    buf[last] = 0;
    let before = buf.len();
    assert_eq!(
        parse_frame(&mut buf, &limits()),
        Err(DecodeError::BadFrameEnd(0))
    );
    assert_eq!(buf.len(), before);
}

#[test]
fn oversize_announced_frame_errors_before_payload_arrives() {
    // A 4097-byte payload: 4105 bytes in all, over the 8 bytes RabbitMQ tolerates.
    let mut buf = BytesMut::from(&[3, 0, 1, 0, 0, 0x10, 0x01][..]);
    assert_eq!(
        parse_frame(&mut buf, &Limits::new(4096)),
        Err(DecodeError::FrameTooLarge {
            size: 4097 + 8,
            max: 4096
        })
    );
    // Exactly frame_max is fine (and incomplete).
    let mut buf = BytesMut::from(&[3, 0, 1, 0, 0, 0x0F, 0xF8][..]);
    assert_eq!(parse_frame(&mut buf, &Limits::new(4096)), Ok(None));
    // A maximal size field does not overflow.
    let mut buf = BytesMut::from(&[3, 0, 1, 0xFF, 0xFF, 0xFF, 0xFF][..]);
    assert_eq!(
        parse_frame(&mut buf, &Limits::new(4096)),
        Err(DecodeError::FrameTooLarge {
            size: u32::MAX,
            max: 4096
        })
    );
    assert_eq!(parse_frame(&mut buf, &Limits::new(0)), Ok(None));
}

#[test]
fn truncated_frames_wait_for_more_bytes() {
    let mut full = BytesMut::new();
    encode_method_frame(2, &BasicAck::default().into(), &mut full);
    for cut in 0..full.len() {
        let mut part = BytesMut::from(&full[..cut]);
        assert_eq!(parse_frame(&mut part, &limits()), Ok(None), "cut at {cut}");
        assert_eq!(part.len(), cut);
    }
    // Two frames back to back parse one at a time.
    let mut two = full.clone();
    two.extend_from_slice(&full);
    assert!(parse_frame(&mut two, &limits()).unwrap().is_some());
    assert_eq!(two.len(), full.len());
}

#[test]
fn truncated_method_payload() {
    let mut buf = BytesMut::new();
    Method::from(BasicConsume {
        queue: "queue".into(),
        ..Default::default()
    })
    .encode(&mut buf);
    for cut in 0..buf.len() {
        assert_eq!(Method::decode(&buf[..cut]), Err(DecodeError::Truncated));
    }
    let mut long = buf.to_vec();
    long.push(0);
    assert_eq!(Method::decode(&long), Err(DecodeError::TrailingBytes));
}

#[test]
fn unknown_frame_type() {
    let mut buf = BytesMut::from(&[4, 0, 0, 0, 0, 0, 0, 0xCE][..]);
    assert_eq!(
        parse_frame(&mut buf, &limits()),
        Err(DecodeError::UnknownFrameType(4))
    );
}

#[test]
fn unknown_method() {
    assert_eq!(
        Method::decode(&[0, 60, 0, 41]),
        Err(DecodeError::UnknownMethod {
            class_id: 60,
            method_id: 41
        })
    );
    let mut buf = BytesMut::from(&[1, 0, 1, 0, 0, 0, 4, 0, 99, 0, 1, 0xCE][..]);
    assert_eq!(
        parse_frame(&mut buf, &limits()),
        Err(DecodeError::UnknownMethod {
            class_id: 99,
            method_id: 1
        })
    );
}

#[test]
fn invalid_utf8_shortstr() {
    // channel.open with out-of-band = [0xFF]
    assert_eq!(
        Method::decode(&[0, 20, 0, 10, 1, 0xFF]),
        Err(DecodeError::InvalidUtf8)
    );
}

#[test]
fn long_shortstr_is_cut_at_char_boundary() {
    let s = "é".repeat(200); // 400 bytes
    let mut buf = BytesMut::new();
    put_shortstr(&mut buf, &s);
    assert_eq!(buf[0], 254);
    let back = Decoder::new(&buf).read_shortstr().unwrap();
    assert_eq!(back, "é".repeat(127));
}

fn nested_table(levels: usize) -> FieldTable {
    let mut t = FieldTable::new();
    for _ in 1..levels {
        let mut outer = FieldTable::new();
        outer.insert("n", FieldValue::Table(t));
        t = outer;
    }
    t
}

#[test]
fn table_depth_limit() {
    let mut buf = BytesMut::new();
    encode_table(&nested_table(16), &mut buf);
    assert!(decode_table(&mut Decoder::new(&buf), 16).is_ok());
    assert_eq!(
        decode_table(&mut Decoder::new(&buf), 15),
        Err(DecodeError::TableTooDeep)
    );
    // Deep arrays count too.
    let mut v = FieldValue::Void;
    for _ in 0..100 {
        v = FieldValue::Array(vec![v]);
    }
    let mut t = FieldTable::new();
    t.insert("a", v);
    let mut buf = BytesMut::new();
    encode_table(&t, &mut buf);
    assert_eq!(
        decode_table(&mut Decoder::new(&buf), DEFAULT_MAX_TABLE_DEPTH),
        Err(DecodeError::TableTooDeep)
    );
    // Via a method: connection.start's server-properties.
    let m: Method = ConnectionStart {
        server_properties: nested_table(17),
        ..Default::default()
    }
    .into();
    let mut buf = BytesMut::new();
    m.encode(&mut buf);
    assert_eq!(Method::decode(&buf), Err(DecodeError::TableTooDeep));
    assert_eq!(Method::decode_with_depth(&buf, 17), Ok(m));
}

#[test]
fn table_errors() {
    // Length prefix larger than the input.
    assert_eq!(
        decode_table(&mut Decoder::new(&[0, 0, 0, 9, 0]), 16),
        Err(DecodeError::Truncated)
    );
    // Unknown type tag 'z'.
    assert_eq!(
        decode_table(&mut Decoder::new(&[0, 0, 0, 3, 1, b'k', b'z']), 16),
        Err(DecodeError::BadFieldType(b'z'))
    );
    // Non-UTF-8 key.
    assert_eq!(
        decode_table(&mut Decoder::new(&[0, 0, 0, 3, 1, 0xFF, b'V']), 16),
        Err(DecodeError::InvalidUtf8)
    );
}

#[test]
fn field_table_api() {
    let mut t = FieldTable::new();
    assert!(t.is_empty());
    t.insert("a", FieldValue::I16(-3));
    t.insert("b", FieldValue::from("x"));
    t.insert("a", FieldValue::Bool(true));
    assert_eq!(t.len(), 2);
    assert_eq!(t.iter().next().map(|e| e.0.as_str()), Some("a"));
    assert_eq!(t.get("a").and_then(FieldValue::as_bool), Some(true));
    assert_eq!(t.get("b").and_then(FieldValue::as_str), Some("x"));
    assert_eq!(FieldValue::U32(7).as_i64(), Some(7));
    assert_eq!(FieldValue::I8(-7).as_i64(), Some(-7));
    assert_eq!(FieldValue::F64(1.0).as_i64(), None);
    assert_eq!(FieldValue::ByteArray(Bytes::new()).type_char(), b'x');
    assert_eq!(t.remove("a"), Some(FieldValue::Bool(true)));
    assert_eq!(t.remove("a"), None);
    assert_eq!(t.len(), 1);
}

#[test]
fn rabbitmq_field_type_tags() {
    let mut t = FieldTable::new();
    t.insert("s", FieldValue::I16(-2));
    t.insert("u", FieldValue::U16(2));
    let mut buf = BytesMut::new();
    encode_table(&t, &mut buf);
    assert_eq!(
        &buf[..],
        &[0, 0, 0, 10, 1, b's', b's', 0xFF, 0xFE, 1, b'u', b'u', 0, 2]
    );
}

#[test]
fn error_messages_and_reply_codes() {
    assert_eq!(
        DecodeError::UnknownMethod {
            class_id: 1,
            method_id: 2
        }
        .to_string(),
        "unknown method: class id 1, method id 2"
    );
    assert_eq!(DecodeError::BadFrameEnd(0).reply_code(), FRAME_ERROR);
    assert_eq!(DecodeError::InvalidUtf8.reply_code(), FRAME_ERROR);
    assert_eq!(
        DecodeError::UnknownMethod {
            class_id: 1,
            method_id: 2
        }
        .reply_code(),
        COMMAND_INVALID
    );
}

#[test]
fn malformed_method_arguments_name_their_method() {
    // basic.publish whose exchange name runs past the end of the frame.
    let mut buf = BytesMut::new();
    buf.put_slice(&[1, 0, 1, 0, 0, 0, 7, 0, 60, 0, 40, 0, 0, 5, 0xCE]);
    let e = parse_frame(&mut buf, &limits()).unwrap_err();
    assert_eq!(
        e,
        DecodeError::MethodArguments {
            class_id: 60,
            method_id: 40,
            reason: Box::new(DecodeError::Truncated)
        }
    );
    assert_eq!((e.reply_code(), e.method_ids()), (FRAME_ERROR, (60, 40)));
    assert_eq!(
        e.to_string(),
        "cannot decode the arguments of basic.publish: truncated input: a value or length prefix extends past the end of the data"
    );
    // A name that is not UTF-8 names no method, as in RabbitMQ.
    let mut buf = BytesMut::new();
    buf.put_slice(&[1, 0, 1, 0, 0, 0, 6, 0, 20, 0, 10, 1, 0xFF, 0xCE]);
    let e = parse_frame(&mut buf, &limits()).unwrap_err();
    assert_eq!(e.method_ids(), (0, 0));
}

#[test]
fn content_header_of_another_class_or_weight_is_left_to_the_receiver() {
    let mut buf = BytesMut::new();
    encode_header_frame(1, 10, 3, &BasicProperties::default(), &mut buf);
    match parse_frame(&mut buf, &limits()).unwrap() {
        Some(Frame::Header {
            class_id, weight, ..
        }) => assert_eq!((class_id, weight), (10, 0)),
        f => panic!("{f:?}"),
    }
    let mut buf = BytesMut::new();
    buf.put_slice(&[
        2, 0, 1, 0, 0, 0, 14, 0, 60, 0, 9, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0xCE,
    ]);
    match parse_frame(&mut buf, &limits()).unwrap() {
        Some(Frame::Header { weight, .. }) => assert_eq!(weight, 9),
        f => panic!("{f:?}"),
    }
}

#[test]
fn binary_property_values_round_trip() {
    let uuid: &[u8] = &[
        0x00, 0xFF, 0x10, 0x80, 0xC3, 0x28, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10,
    ];
    let p = BasicProperties {
        correlation_id: Some(uuid.into()),
        message_id: Some(vec![0xFE; 255].into()),
        ..Default::default()
    };
    let mut buf = BytesMut::new();
    p.encode(&mut buf);
    let back = BasicProperties::decode(&buf, 16).unwrap();
    assert_eq!(back, p);
    assert_eq!(back.correlation_id.as_ref().unwrap().as_bytes(), uuid);
    assert_eq!(back.correlation_id.as_ref().unwrap().as_str(), None);
}

#[test]
fn frame_max_tolerates_the_framing_overhead_as_rabbitmq() {
    // A payload of exactly frame_max (8 bytes over in total) is accepted; one more is not.
    let mut buf = BytesMut::new();
    encode_body_frames(1, &[7u8; 4096], 0, &mut buf);
    assert!(parse_frame(&mut buf, &Limits::new(4096)).unwrap().is_some());
    let mut buf = BytesMut::new();
    encode_body_frames(1, &[7u8; 4097], 0, &mut buf);
    assert!(matches!(
        parse_frame(&mut buf, &Limits::new(4096)),
        Err(DecodeError::FrameTooLarge { .. })
    ));
}

#[test]
fn protocol_header() {
    let mut buf = BytesMut::from(&b"AMQP\x00\x00\x09"[..]);
    assert_eq!(parse_protocol_header(&mut buf), None);
    buf.put_u8(1);
    assert_eq!(parse_protocol_header(&mut buf), Some(true));
    assert!(buf.is_empty());
    let mut buf = BytesMut::from(&b"AMQP\x01\x01\x00\x0a"[..]);
    assert_eq!(parse_protocol_header(&mut buf), Some(false));
    assert_eq!(buf.len(), 8);
}

proptest! {
    #[test]
    fn field_value_round_trip(v in field_value()) {
        let mut t = FieldTable::new();
        t.0.push(("k".into(), v));
        let mut buf = BytesMut::new();
        encode_table(&t, &mut buf);
        let mut d = Decoder::new(&buf);
        prop_assert_eq!(decode_table(&mut d, DEFAULT_MAX_TABLE_DEPTH), Ok(t));
        prop_assert!(d.is_empty());
    }

    #[test]
    fn field_table_round_trip(t in field_table()) {
        let mut buf = BytesMut::new();
        encode_table(&t, &mut buf);
        let mut d = Decoder::new(&buf);
        prop_assert_eq!(decode_table(&mut d, DEFAULT_MAX_TABLE_DEPTH), Ok(t));
        prop_assert!(d.is_empty());
    }

    #[test]
    fn basic_properties_round_trip(p in basic_properties(), body_size in any::<u64>(), channel in any::<u16>()) {
        let mut buf = BytesMut::new();
        p.encode(&mut buf);
        prop_assert_eq!(BasicProperties::decode(&buf, DEFAULT_MAX_TABLE_DEPTH), Ok(p.clone()));
        let mut frame = BytesMut::new();
        encode_header_frame(channel, CLASS_BASIC, body_size, &p, &mut frame);
        prop_assert_eq!(
            parse_frame(&mut frame, &Limits::new(0)),
            Ok(Some(Frame::Header { channel, class_id: CLASS_BASIC, weight: 0, body_size, properties: p }))
        );
    }

    #[test]
    fn any_method_round_trip(m in arbitrary_method()) {
        crate::arbitrary::check_method_roundtrip(m)?;
    }

    #[test]
    fn body_frames_reassemble(body in proptest::collection::vec(any::<u8>(), 0..600), frame_max in 9u32..200) {
        let mut buf = BytesMut::new();
        encode_body_frames(1, &body, frame_max, &mut buf);
        let lim = Limits::new(frame_max);
        let mut got = Vec::new();
        while let Some(f) = parse_frame(&mut buf, &lim).unwrap() {
            let Frame::Body { payload, .. } = f else { panic!("not a body frame") };
            prop_assert!(!payload.is_empty() && payload.len() as u32 <= frame_max - 8);
            got.extend_from_slice(&payload);
        }
        prop_assert!(buf.is_empty());
        prop_assert_eq!(got, body);
    }

    #[test]
    fn method_decode_never_panics(data in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Method::decode(&data);
        let _ = Method::decode_with_depth(&data, 2);
        let _ = BasicProperties::decode(&data, 4);
        let _ = decode_table(&mut Decoder::new(&data), 4);
    }

    #[test]
    fn method_decode_never_panics_with_valid_ids(
        m in arbitrary_method(),
        tail in proptest::collection::vec(any::<u8>(), 0..128),
        cut in any::<prop::sample::Index>(),
    ) {
        // Real class/method ids followed by garbage, and truncations of
        // valid payloads, reach the argument decoders.
        let mut buf = BytesMut::new();
        buf.put_u16(m.class_id());
        buf.put_u16(m.method_id());
        buf.extend_from_slice(&tail);
        let _ = Method::decode(&buf);
        let mut valid = BytesMut::new();
        m.encode(&mut valid);
        let n = cut.index(valid.len() + 1);
        let r = Method::decode(&valid[..n]);
        prop_assert!(n == valid.len() || r.is_err());
    }

    #[test]
    fn parse_frame_never_panics(data in proptest::collection::vec(any::<u8>(), 0..512), frame_max in prop_oneof![Just(0u32), 0u32..1024]) {
        let mut buf = BytesMut::from(&data[..]);
        let lim = Limits { frame_max, max_table_depth: 4 };
        while let Ok(Some(_)) = parse_frame(&mut buf, &lim) {}
    }

    #[test]
    fn parse_frame_never_panics_on_framed_garbage(
        kind in prop_oneof![Just(FRAME_METHOD), Just(FRAME_HEADER), Just(FRAME_BODY), Just(FRAME_HEARTBEAT)],
        payload in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut buf = BytesMut::new();
        buf.put_u8(kind);
        buf.put_u16(1);
        buf.put_u32(payload.len() as u32);
        buf.extend_from_slice(&payload);
        buf.put_u8(FRAME_END);
        let _ = parse_frame(&mut buf, &Limits::new(0));
    }
}
