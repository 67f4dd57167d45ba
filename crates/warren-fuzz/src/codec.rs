//! Targets for the wire codec (`warren-amqp`): the frame reader, the method decoder and the
//! field-table / content-property decoders.
//!
//! Besides "never panics", each target checks a property that a decoding bug would break:
//! the incremental frame reader gives the same frames whatever the chunking of its input, and
//! everything decoded re-encodes to bytes that decode to the same value (compared through
//! `Debug`, because NaN floats inside tables never compare equal to themselves).

use bytes::BytesMut;
use warren_amqp::frame::{
    encode_body_frames, encode_header_frame, encode_method_frame, parse_frame, Frame, Limits,
};
use warren_amqp::table::{
    decode_field_value, encode_field_value, encode_table, DEFAULT_MAX_TABLE_DEPTH,
};
use warren_amqp::{decode_table, BasicProperties, Decoder, Method};

/// Most bytes of one input a chunked read is split into (the chunk size is 1 to this).
const MAX_CHUNK: usize = 64;

/// What parsing a byte stream frame by frame produced: the frames (as `Debug` text), how it
/// stopped (an error, or `None` when the rest is an incomplete frame) and how many bytes were
/// left unconsumed.
#[derive(Debug, PartialEq)]
struct Parsed {
    frames: Vec<String>,
    error: Option<String>,
    left: usize,
}

/// Parses `data` as a stream of frames, delivered to the parser `chunk` bytes at a time
/// (`chunk == 0`: all at once). Re-encodes every frame and checks it parses back unchanged.
fn parse_stream(data: &[u8], limits: &Limits, chunk: usize) -> Parsed {
    let mut buf = BytesMut::new();
    let mut out = Parsed {
        frames: Vec::new(),
        error: None,
        left: 0,
    };
    let step = if chunk == 0 { data.len().max(1) } else { chunk };
    'feed: for piece in data.chunks(step) {
        buf.extend_from_slice(piece);
        loop {
            match parse_frame(&mut buf, limits) {
                Ok(Some(frame)) => {
                    check_reencode(&frame, limits);
                    out.frames.push(format!("{frame:?}"));
                }
                Ok(None) => break,
                Err(e) => {
                    out.error = Some(format!("{e:?}"));
                    break 'feed;
                }
            }
        }
    }
    out.left = if out.error.is_some() {
        // On an error nothing of the failing frame is consumed; what follows it in `data`
        // was never handed to the parser in the chunked case, so count from the stream.
        data.len() - consumed(&out, data, limits)
    } else {
        buf.len()
    };
    out
}

/// Bytes taken by the frames in `parsed` (re-parsed from `data` in one piece).
fn consumed(parsed: &Parsed, data: &[u8], limits: &Limits) -> usize {
    let mut buf = BytesMut::from(data);
    for _ in &parsed.frames {
        match parse_frame(&mut buf, limits) {
            Ok(Some(_)) => {}
            other => panic!("frame reader is not deterministic: {other:?}"),
        }
    }
    data.len() - buf.len()
}

/// Encodes `frame` again and checks that it parses back to the same frame.
fn check_reencode(frame: &Frame, limits: &Limits) {
    let mut buf = BytesMut::new();
    match frame {
        Frame::Method { channel, method } => encode_method_frame(*channel, method, &mut buf),
        // The encoder always writes weight 0; a header with another weight cannot re-encode
        // to itself (the server refuses it with 505).
        Frame::Header { weight, .. } if *weight != 0 => return,
        Frame::Header {
            channel,
            class_id,
            body_size,
            properties,
            ..
        } => encode_header_frame(*channel, *class_id, *body_size, properties, &mut buf),
        // An empty body is sent as no body frame at all.
        Frame::Body { payload, .. } if payload.is_empty() => return,
        Frame::Body { channel, payload } => encode_body_frames(*channel, payload, 0, &mut buf),
        Frame::Heartbeat { .. } => return,
    }
    // Encoding may cut nothing and add nothing: the limits that accepted the frame accept it
    // again (a header frame's property flags may shrink, never grow).
    let unlimited = Limits {
        frame_max: 0,
        ..*limits
    };
    let again = parse_frame(&mut buf, &unlimited);
    match again {
        Ok(Some(f)) => assert_eq!(
            format!("{f:?}"),
            format!("{frame:?}"),
            "frame changed through encode and parse"
        ),
        other => panic!("re-encoded {frame:?} does not parse: {other:?}"),
    }
    assert!(buf.is_empty(), "re-encoded frame left {} bytes", buf.len());
}

/// Target `frame_reader`: the frame parser on a byte stream. The first byte picks the limits
/// (no `frame_max` or 4096; table depth 16 or 2) and the second a chunk size; the stream is
/// parsed whole and in chunks, and both must give the same frames and the same end.
pub fn frame_reader(data: &[u8]) {
    let first = data.first().copied().unwrap_or(0);
    let limits = Limits {
        frame_max: if first & 1 == 0 { 0 } else { 4096 },
        max_table_depth: if first & 2 == 0 {
            DEFAULT_MAX_TABLE_DEPTH
        } else {
            2
        },
    };
    let chunk = 1 + usize::from(data.get(1).copied().unwrap_or(0)) % MAX_CHUNK;
    let whole = parse_stream(data, &limits, 0);
    let chunked = parse_stream(data, &limits, chunk);
    assert_eq!(whole, chunked, "chunked parse (chunk {chunk}) differs");
}

/// Target `method_decode`: a method frame's payload (class id, method id, arguments).
/// A decoded method names the class and method ids it was read from, re-encodes stably, and a
/// lower table-depth limit can only refuse more, never decode differently.
pub fn method_decode(data: &[u8]) {
    let Ok(method) = Method::decode(data) else {
        if let Ok(m) = Method::decode_with_depth(data, 2) {
            panic!("accepted with depth 2 but refused with the default depth: {m:?}");
        }
        return;
    };
    assert_eq!(
        (method.class_id(), method.method_id()),
        (
            u16::from_be_bytes([data[0], data[1]]),
            u16::from_be_bytes([data[2], data[3]])
        ),
        "decoded {} from other ids",
        method.name()
    );
    let mut first = BytesMut::new();
    method.encode(&mut first);
    let again = Method::decode(&first)
        .unwrap_or_else(|e| panic!("re-encoded {} does not decode: {e}", method.name()));
    assert_eq!(format!("{again:?}"), format!("{method:?}"));
    let mut second = BytesMut::new();
    again.encode(&mut second);
    assert_eq!(first, second, "{} encodes unstably", method.name());
    if let Ok(shallow) = Method::decode_with_depth(data, 2) {
        assert_eq!(format!("{shallow:?}"), format!("{method:?}"));
    }
}

/// Target `table_decode`: the same bytes as a field table, a single field value and a
/// `basic` property list, each at the default nesting limit and at depth 2.
pub fn table_decode(data: &[u8]) {
    for depth in [DEFAULT_MAX_TABLE_DEPTH, 2] {
        if let Ok(t) = decode_table(&mut Decoder::new(data), depth) {
            let mut first = BytesMut::new();
            encode_table(&t, &mut first);
            let again = decode_table(&mut Decoder::new(&first), depth)
                .unwrap_or_else(|e| panic!("re-encoded table does not decode: {e}"));
            assert_eq!(format!("{again:?}"), format!("{t:?}"));
            let mut second = BytesMut::new();
            encode_table(&again, &mut second);
            assert_eq!(first, second, "table encodes unstably");
        }
        if let Ok(v) = decode_field_value(&mut Decoder::new(data), depth) {
            let mut first = BytesMut::new();
            encode_field_value(&v, &mut first);
            let again = decode_field_value(&mut Decoder::new(&first), depth)
                .unwrap_or_else(|e| panic!("re-encoded field value does not decode: {e}"));
            assert_eq!(format!("{again:?}"), format!("{v:?}"));
        }
        if let Ok(p) = BasicProperties::decode(data, depth) {
            let mut first = BytesMut::new();
            p.encode(&mut first);
            let again = BasicProperties::decode(&first, depth)
                .unwrap_or_else(|e| panic!("re-encoded properties do not decode: {e}"));
            assert_eq!(format!("{again:?}"), format!("{p:?}"));
            let mut second = BytesMut::new();
            again.encode(&mut second);
            assert_eq!(first, second, "properties encode unstably");
        }
    }
    // A shallower limit refuses more, never decodes differently.
    if let Ok(shallow) = decode_table(&mut Decoder::new(data), 2) {
        let deep = decode_table(&mut Decoder::new(data), DEFAULT_MAX_TABLE_DEPTH)
            .expect("a table accepted at depth 2 is accepted at depth 16");
        assert_eq!(format!("{shallow:?}"), format!("{deep:?}"));
    }
}
