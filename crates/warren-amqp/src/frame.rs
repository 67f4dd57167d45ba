//! AMQP 0-9-1 framing (spec section 2.3.5 and 4.2.3).
//!
//! Every frame is a 7-byte header — type octet, channel (`u16`), payload size
//! (`u32`) — followed by the payload and the frame-end octet `0xCE`, so a
//! frame occupies `payload + 8` bytes. The negotiated `frame-max` limits that
//! total size.
//!
//! Content (message bodies) travels as a method frame (`basic.publish`,
//! `basic.deliver`, ...), one header frame carrying [`BasicProperties`] and the
//! body size, then zero or more body frames.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::DecodeError;
use crate::generated::Method;
use crate::properties::BasicProperties;
use crate::table::{Decoder, DEFAULT_MAX_TABLE_DEPTH};

/// Frame type octet of a method frame.
pub const FRAME_METHOD: u8 = 1;
/// Frame type octet of a content header frame.
pub const FRAME_HEADER: u8 = 2;
/// Frame type octet of a content body frame.
pub const FRAME_BODY: u8 = 3;
/// Frame type octet of a heartbeat frame.
pub const FRAME_HEARTBEAT: u8 = 8;
/// Octet that terminates every frame.
pub const FRAME_END: u8 = 0xCE;
/// Smallest `frame-max` a peer may negotiate; frames up to this size must be
/// accepted before `connection.tune` completes.
pub const FRAME_MIN_SIZE: u32 = 4096;
/// Bytes a frame adds around its payload: 7-byte header plus frame end.
pub const FRAME_OVERHEAD: u32 = 8;
/// Size of the frame header (type, channel, payload size).
pub const FRAME_HEADER_SIZE: usize = 7;
/// Protocol header a client sends first to select AMQP 0-9-1.
pub const PROTOCOL_HEADER: &[u8; 8] = b"AMQP\x00\x00\x09\x01";
/// RabbitMQ's default negotiated `frame-max` (128 KiB).
pub const DEFAULT_FRAME_MAX: u32 = 131_072;

/// One decoded AMQP frame.
// A frame lives only from parsing to dispatch, one at a time: boxing the header's properties
// would cost an allocation per message for no memory saved.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// A method frame (type 1).
    Method {
        /// Channel number; 0 is the connection channel.
        channel: u16,
        /// The decoded method.
        method: Method,
    },
    /// A content header frame (type 2).
    Header {
        /// Channel number.
        channel: u16,
        /// Content class id (60 for `basic`, the only content class). A header
        /// for another class is returned too, for the receiver to refuse as an
        /// unexpected frame.
        class_id: u16,
        /// The weight field, which must be 0.
        weight: u16,
        /// Total size in bytes of the body that follows in body frames.
        body_size: u64,
        /// Content properties; decoded only for class 60 with weight 0, empty
        /// otherwise.
        properties: BasicProperties,
    },
    /// A content body frame (type 3).
    Body {
        /// Channel number.
        channel: u16,
        /// A slice of the message body.
        payload: Bytes,
    },
    /// A heartbeat frame (type 8); the channel should be 0.
    Heartbeat {
        /// Channel number as received.
        channel: u16,
    },
}

impl Frame {
    /// The channel this frame was sent on.
    pub fn channel(&self) -> u16 {
        match *self {
            Frame::Method { channel, .. }
            | Frame::Header { channel, .. }
            | Frame::Body { channel, .. }
            | Frame::Heartbeat { channel } => channel,
        }
    }
}

/// Limits applied by [`parse_frame`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The negotiated `frame-max` in bytes, framing overhead included; 0
    /// means no limit other than the `u32` size field. Like RabbitMQ,
    /// [`parse_frame`] tolerates 8 bytes more (a payload of `frame_max`), since
    /// many clients get the overhead wrong.
    pub frame_max: u32,
    /// Maximum nesting depth of field tables and arrays (default 16).
    pub max_table_depth: usize,
}

impl Limits {
    /// Limits with the given `frame_max` and the default table depth.
    pub const fn new(frame_max: u32) -> Self {
        Limits {
            frame_max,
            max_table_depth: DEFAULT_MAX_TABLE_DEPTH,
        }
    }
}

impl Default for Limits {
    /// `frame_max` = [`DEFAULT_FRAME_MAX`] (131072), `max_table_depth` = 16.
    fn default() -> Self {
        Limits::new(DEFAULT_FRAME_MAX)
    }
}

/// Parses one frame from the front of `buf`.
///
/// Returns `Ok(None)` when `buf` does not yet hold a whole frame; nothing is
/// consumed then. On success the frame's bytes are removed from `buf`; body
/// payloads are zero-copy slices of `buf`'s storage. The frame type and the
/// announced size are checked as soon as the 7-byte header is available, so
/// an oversized frame is rejected before its payload arrives.
///
/// Errors (the connection should then be closed with `FRAME_ERROR`, see
/// [`DecodeError::reply_code`]; `buf` is left unconsumed):
/// [`DecodeError::UnknownFrameType`], [`DecodeError::FrameTooLarge`],
/// [`DecodeError::BadFrameEnd`], [`DecodeError::BadHeartbeat`],
/// [`DecodeError::Truncated`] for a method or header payload too short for its
/// fixed fields, [`DecodeError::UnknownMethod`],
/// [`DecodeError::MethodArguments`] wrapping any error in a known method's
/// arguments ([`Method::decode_with_depth`]), and property decoding errors
/// ([`BasicProperties::decode`]). Frame order, a header's class and weight,
/// and channel numbers are the receiver's to check.
pub fn parse_frame(buf: &mut BytesMut, limits: &Limits) -> Result<Option<Frame>, DecodeError> {
    let Some(header) = buf.first_chunk::<FRAME_HEADER_SIZE>() else {
        return Ok(None);
    };
    let frame_type = header[0];
    let channel = u16::from_be_bytes([header[1], header[2]]);
    let size = u32::from_be_bytes([header[3], header[4], header[5], header[6]]);
    if !matches!(
        frame_type,
        FRAME_METHOD | FRAME_HEADER | FRAME_BODY | FRAME_HEARTBEAT
    ) {
        return Err(DecodeError::UnknownFrameType(frame_type));
    }
    let total = u64::from(size) + u64::from(FRAME_OVERHEAD);
    // As RabbitMQ, accept a payload of up to `frame_max` bytes: many clients count frame_max
    // as the payload size, so their largest frames are 8 bytes over.
    if limits.frame_max != 0 && u64::from(size) > u64::from(limits.frame_max) {
        return Err(DecodeError::FrameTooLarge {
            size: u32::try_from(total).unwrap_or(u32::MAX),
            max: limits.frame_max,
        });
    }
    // `total` fits in usize whenever the buffer could hold it.
    let Ok(total) = usize::try_from(total) else {
        return Ok(None);
    };
    if buf.len() < total {
        return Ok(None);
    }
    let payload_end = total - 1;
    let end = buf[payload_end];
    if end != FRAME_END {
        return Err(DecodeError::BadFrameEnd(end));
    }
    let payload = &buf[FRAME_HEADER_SIZE..payload_end];
    let frame = match frame_type {
        FRAME_METHOD => Frame::Method {
            channel,
            method: Method::decode_with_depth(payload, limits.max_table_depth)
                .map_err(|e| in_method(e, payload))?,
        },
        FRAME_HEADER => decode_header_payload(channel, payload, limits.max_table_depth)?,
        FRAME_HEARTBEAT => {
            if size != 0 {
                return Err(DecodeError::BadHeartbeat(size));
            }
            Frame::Heartbeat { channel }
        }
        _ => {
            let mut frame = buf.split_to(total);
            frame.advance(FRAME_HEADER_SIZE);
            frame.truncate(frame.len() - 1);
            return Ok(Some(Frame::Body {
                channel,
                payload: frame.freeze(),
            }));
        }
    };
    buf.advance(total);
    Ok(Some(frame))
}

/// Names the method whose arguments failed to decode (an error with the
/// class and method ids); an unknown method or a payload too short to hold
/// the ids is left as it is.
fn in_method(e: DecodeError, payload: &[u8]) -> DecodeError {
    match (&e, payload) {
        (DecodeError::UnknownMethod { .. }, _) => e,
        (_, [c0, c1, m0, m1, ..]) => DecodeError::MethodArguments {
            class_id: u16::from_be_bytes([*c0, *c1]),
            method_id: u16::from_be_bytes([*m0, *m1]),
            reason: Box::new(e),
        },
        _ => e,
    }
}

fn decode_header_payload(
    channel: u16,
    payload: &[u8],
    max_depth: usize,
) -> Result<Frame, DecodeError> {
    let mut d = Decoder::new(payload);
    let class_id = d.read_u16()?;
    let weight = d.read_u16()?;
    let body_size = d.read_u64()?;
    // Only a basic header has basic properties; anything else is an unexpected frame for the
    // receiver to report.
    let properties = if class_id == crate::generated::CLASS_BASIC && weight == 0 {
        BasicProperties::decode(d.rest(), max_depth)?
    } else {
        BasicProperties::default()
    };
    Ok(Frame::Header {
        channel,
        class_id,
        weight,
        body_size,
        properties,
    })
}

/// Writes a 7-byte frame header with a zero size placeholder and returns the
/// offset of the size field.
#[inline]
fn begin_frame(buf: &mut BytesMut, frame_type: u8, channel: u16) -> usize {
    buf.put_u8(frame_type);
    buf.put_u16(channel);
    let at = buf.len();
    buf.put_u32(0);
    at
}

/// Fills in the size placeholder at `at` and appends the frame end.
#[inline]
fn finish_frame(buf: &mut BytesMut, at: usize) {
    let size = (buf.len() - at - 4) as u32;
    buf[at..at + 4].copy_from_slice(&size.to_be_bytes());
    buf.put_u8(FRAME_END);
}

/// Appends a complete method frame for `method` on `channel`.
pub fn encode_method_frame(channel: u16, method: &Method, buf: &mut BytesMut) {
    let at = begin_frame(buf, FRAME_METHOD, channel);
    method.encode(buf);
    finish_frame(buf, at);
}

/// Appends a content header frame: class id, weight 0, body size in bytes,
/// then the property flags and values.
pub fn encode_header_frame(
    channel: u16,
    class_id: u16,
    body_size: u64,
    props: &BasicProperties,
    buf: &mut BytesMut,
) {
    let at = begin_frame(buf, FRAME_HEADER, channel);
    buf.put_u16(class_id);
    buf.put_u16(0);
    buf.put_u64(body_size);
    props.encode(buf);
    finish_frame(buf, at);
}

/// Appends `body` as body frames of at most `frame_max` bytes each
/// (payload at most `frame_max - 8`). An empty body produces no frames.
/// `frame_max == 0` means unlimited (one frame per `u32::MAX - 8` bytes);
/// a `frame_max` of 8 or less still makes progress with 1-byte payloads.
pub fn encode_body_frames(channel: u16, body: &[u8], frame_max: u32, buf: &mut BytesMut) {
    if body.is_empty() {
        return;
    }
    let max_payload = if frame_max == 0 {
        u32::MAX - FRAME_OVERHEAD
    } else {
        frame_max.saturating_sub(FRAME_OVERHEAD).max(1)
    } as usize;
    let frames = body.len().div_ceil(max_payload);
    buf.reserve(body.len() + frames * FRAME_OVERHEAD as usize);
    for chunk in body.chunks(max_payload) {
        buf.put_u8(FRAME_BODY);
        buf.put_u16(channel);
        buf.put_u32(chunk.len() as u32);
        buf.put_slice(chunk);
        buf.put_u8(FRAME_END);
    }
}

/// Appends a heartbeat frame (channel 0, empty payload).
pub fn encode_heartbeat(buf: &mut BytesMut) {
    buf.put_slice(&[FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END]);
}

/// Checks the 8-byte protocol header a client sends when it connects.
///
/// Returns `None` if fewer than 8 bytes are buffered, `Some(true)`
/// (and consumes the header) for AMQP 0-9-1, `Some(false)` (consuming
/// nothing) for anything else — the server should then reply with
/// [`PROTOCOL_HEADER`] and close the socket (spec section 4.2.2).
pub fn parse_protocol_header(buf: &mut BytesMut) -> Option<bool> {
    let header = buf.first_chunk::<8>()?;
    if header == PROTOCOL_HEADER {
        buf.advance(8);
        Some(true)
    } else {
        Some(false)
    }
}
