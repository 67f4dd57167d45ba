//! The on-disk record format.
//!
//! Every record is framed as
//!
//! ```text
//! u32 length (of type + payload) | u32 crc32c (of type + payload) | u8 type | payload
//! ```
//!
//! all big-endian. The CRC covers the type byte and the payload, so a torn write or a flipped
//! bit anywhere in a record is detected on recovery. Payloads:
//!
//! - `PUBLISH_AT` / `TRANSIENT_AT`: `u64 id, u64 enqueued (ms since the epoch), u16 n,
//!   n × (u16 + UTF-8 queue), shortstr exchange, shortstr routing key, u32 + properties (AMQP
//!   content-header property encoding), u32 + body`. `TRANSIENT_AT` records hold paged-out
//!   transient messages and are ignored by recovery. The enqueue time keeps a message's TTL
//!   counting from when it was first enqueued, however often it is paged or recovered.
//! - `ACK_AT`: `u64 id, u32 segment, u64 offset, u32 origin, u16 + UTF-8 queue` — the
//!   message left that queue (acked, dropped, purged). Segment and offset are where the record
//!   it settles is; origin is the segment of the oldest copy of it compaction may have left
//!   (the same segment unless the message was moved). The record is needed while a segment
//!   from origin on survives. An empty queue name releases a `TRANSIENT_AT` page.
//! - `DELIVERED`: `u64 id, u16 + UTF-8 queue` — every message of the queue with an id up to
//!   this one was delivered at least once, so they are recovered with `redelivered = true`.
//!
//! The first format's `PUBLISH` / `TRANSIENT` (as above without the enqueue time) and `ACK`
//! (`u64 id, u16 + UTF-8 queue`) are still read; they are no longer written. The second
//! format's kinds are the first's with bit 0x10 set.

use crate::Location;
use bytes::{BufMut, Bytes, BytesMut};
use warren_amqp::properties::BasicProperties;
use warren_amqp::table::{put_shortstr, Decoder};

/// The deepest field-table nesting a stored record may hold (message headers): the broker
/// accepts no deeper from any front end (`amqp.max_table_depth` is capped at this), so that
/// whatever was accepted is read back after a restart.
pub const MAX_TABLE_DEPTH: usize = 128;

/// Queue names in records are qualified by their vhost and may exceed a short string, so they
/// are written with a 16-bit length.
fn put_name(buf: &mut BytesMut, name: &str) {
    let bytes = &name.as_bytes()[..name.len().min(usize::from(u16::MAX))];
    buf.put_u16(bytes.len() as u16);
    buf.put_slice(bytes);
}

fn read_name(d: &mut Decoder) -> Result<String, RecordError> {
    read_name_ref(d).map(str::to_string)
}

/// [`read_name`], borrowed from the record.
fn read_name_ref<'a>(d: &mut Decoder<'a>) -> Result<&'a str, RecordError> {
    let len = d.read_u16().map_err(bad)?;
    let raw = d.take(usize::from(len)).map_err(bad)?;
    std::str::from_utf8(raw).map_err(|_| RecordError::Malformed("queue name is not UTF-8".into()))
}

/// Bytes of framing before the type byte.
pub const HEADER_LEN: usize = 8;

/// The length (bytes after the header) and the CRC-32C of a record, from its header.
pub(crate) fn header_fields(header: &[u8; HEADER_LEN]) -> (u32, u32) {
    let [l0, l1, l2, l3, c0, c1, c2, c3] = *header;
    (
        u32::from_be_bytes([l0, l1, l2, l3]),
        u32::from_be_bytes([c0, c1, c2, c3]),
    )
}

/// Record types.
pub mod kind {
    /// A persistent message and the durable queues it was routed to.
    pub const PUBLISH: u8 = 1;
    /// A message left a queue.
    pub const ACK: u8 = 2;
    /// A message was delivered from a queue.
    pub const DELIVERED: u8 = 3;
    /// A paged-out transient message (not recovered).
    pub const TRANSIENT: u8 = 4;
    /// `PUBLISH` with the message's enqueue time.
    pub const PUBLISH_AT: u8 = 0x10 | PUBLISH;
    /// `ACK` with the location of the record it settles.
    pub const ACK_AT: u8 = 0x10 | ACK;
    /// `TRANSIENT` with the message's enqueue time.
    pub const TRANSIENT_AT: u8 = 0x10 | TRANSIENT;
}

/// A message as the store keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredMessage {
    /// Store-wide message id, increasing in publish order.
    pub id: u64,
    /// Exchange it was published to.
    pub exchange: String,
    /// Routing key it was published with.
    pub routing_key: String,
    /// Content properties.
    pub properties: BasicProperties,
    /// Body.
    pub body: Bytes,
    /// When the message was enqueued, ms since the Unix epoch (`None` for records of the
    /// first format, which did not keep it, and copies of them, which hold 0).
    pub enqueued_ms: Option<u64>,
}

/// A decoded record (decoded one at a time, so the size difference between variants is moot).
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// `PUBLISH` or `TRANSIENT` (see `transient`).
    Publish {
        /// The message.
        message: StoredMessage,
        /// Queues it went to.
        queues: Vec<String>,
        /// True for a `TRANSIENT` record.
        transient: bool,
    },
    /// `ACK` or `ACK_AT`.
    Ack {
        /// Message id.
        id: u64,
        /// Queue name (empty: a transient page released).
        queue: String,
        /// Where the record it settles is (`None` for the first format's `ACK`).
        target: Option<AckTarget>,
    },
    /// `DELIVERED`.
    Delivered {
        /// Message id.
        id: u64,
        /// Queue name.
        queue: String,
    },
}

/// Where the record an `ACK_AT` settles is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckTarget {
    /// Segment of the record.
    pub segment: u32,
    /// Its offset.
    pub offset: u64,
    /// Segment of the oldest copy of the message that may still exist.
    pub origin: u32,
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// The CRC does not match: the record is corrupt.
    #[error("record checksum mismatch")]
    BadChecksum,
    /// The payload is malformed or of an unknown type.
    #[error("malformed record: {0}")]
    Malformed(String),
}

fn frame(buf: &mut BytesMut, kind: u8, payload: impl FnOnce(&mut BytesMut)) {
    let start = buf.len();
    buf.put_u32(0);
    buf.put_u32(0);
    buf.put_u8(kind);
    payload(buf);
    let len = (buf.len() - start - HEADER_LEN) as u32;
    let crc = crc32c::crc32c(&buf[start + HEADER_LEN..]);
    buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
    buf[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
}

/// Appends a `PUBLISH_AT` (or `TRANSIENT_AT`) record to `buf`; `enqueued_ms` is the enqueue
/// time in ms since the Unix epoch.
#[allow(clippy::too_many_arguments)]
pub fn encode_publish(
    buf: &mut BytesMut,
    id: u64,
    exchange: &str,
    routing_key: &str,
    properties: &BasicProperties,
    body: &[u8],
    enqueued_ms: u64,
    queues: &[&str],
    transient: bool,
) {
    let k = if transient {
        kind::TRANSIENT_AT
    } else {
        kind::PUBLISH_AT
    };
    frame(buf, k, |b| {
        b.put_u64(id);
        b.put_u64(enqueued_ms);
        b.put_u16(queues.len() as u16);
        for q in queues {
            put_name(b, q);
        }
        put_shortstr(b, exchange);
        put_shortstr(b, routing_key);
        let at = b.len();
        b.put_u32(0);
        properties.encode(b);
        let plen = (b.len() - at - 4) as u32;
        b[at..at + 4].copy_from_slice(&plen.to_be_bytes());
        b.put_u32(body.len() as u32);
        b.put_slice(body);
    });
}

/// Appends a `DELIVERED` record (or, for tests of old data, a first-format `ACK`).
pub fn encode_queue_event(buf: &mut BytesMut, kind: u8, id: u64, queue: &str) {
    frame(buf, kind, |b| {
        b.put_u64(id);
        put_name(b, queue);
    });
}

/// Appends an `ACK_AT` record: message `id`, whose record is at `target` (and whose oldest
/// copy is in segment `origin`), left `queue`.
pub fn encode_ack(buf: &mut BytesMut, id: u64, target: Location, origin: u32, queue: &str) {
    frame(buf, kind::ACK_AT, |b| {
        b.put_u64(id);
        b.put_u32(target.segment);
        b.put_u64(target.offset);
        b.put_u32(origin);
        put_name(b, queue);
    });
}

/// Decodes the type byte and payload of one record (the bytes after the 8-byte header),
/// checking `crc` first.
pub fn decode(body: &[u8], crc: u32) -> Result<Record, RecordError> {
    if crc32c::crc32c(body) != crc {
        return Err(RecordError::BadChecksum);
    }
    decode_checked(body)
}

/// What recovery needs of a record: of a publish, only its id, queues (borrowed from `body`),
/// kind and priority; any other record whole.
#[derive(Debug, PartialEq)]
pub enum Scanned<'a> {
    /// A `PUBLISH` / `TRANSIENT` record of either format.
    Publish {
        /// Message id.
        id: u64,
        /// The queues it was routed to (store keys).
        queues: Vec<&'a str>,
        /// A paged-out transient message (ignored by recovery).
        transient: bool,
        /// Its `priority` property, 0 when it has none.
        priority: u8,
    },
    /// Any other record (an ack or a delivered mark).
    Other(Box<Record>),
}

/// [`decode`] for recovery, which reads every record of the store at start: a publish record
/// is checked as `decode` checks it (checksum, every field's framing, the properties, no
/// trailing bytes) but its names, exchange, routing key and body are not copied. Errors: as
/// [`decode`].
pub fn scan(body: &[u8], crc: u32) -> Result<Scanned<'_>, RecordError> {
    if crc32c::crc32c(body) != crc {
        return Err(RecordError::BadChecksum);
    }
    let mut d = Decoder::new(body);
    let kind = d.read_u8().map_err(bad)?;
    if !is_publish(kind) {
        return decode_checked(body).map(|r| Scanned::Other(Box::new(r)));
    }
    let p = read_publish(kind, &mut d)?;
    if !d.is_empty() {
        return Err(RecordError::Malformed("trailing bytes".into()));
    }
    Ok(Scanned::Publish {
        id: p.id,
        queues: p.queues,
        transient: p.transient,
        priority: p.properties.priority.unwrap_or(0),
    })
}

fn bad(e: warren_amqp::error::DecodeError) -> RecordError {
    RecordError::Malformed(e.to_string())
}

/// True for the type byte of a record kind this store writes (see [`kind`]).
pub(crate) fn is_kind(b: u8) -> bool {
    matches!(
        b,
        kind::PUBLISH
            | kind::ACK
            | kind::DELIVERED
            | kind::TRANSIENT
            | kind::PUBLISH_AT
            | kind::ACK_AT
            | kind::TRANSIENT_AT
    )
}

fn is_publish(kind: u8) -> bool {
    matches!(
        kind,
        kind::PUBLISH | kind::TRANSIENT | kind::PUBLISH_AT | kind::TRANSIENT_AT
    )
}

/// A publish record's fields, borrowed from the record.
struct PublishFields<'a> {
    id: u64,
    enqueued_ms: Option<u64>,
    queues: Vec<&'a str>,
    exchange: &'a str,
    routing_key: &'a str,
    properties: BasicProperties,
    body: &'a [u8],
    transient: bool,
}

/// Reads the payload of a publish record of kind `kind` (after its type byte): every field
/// checked, nothing copied but the properties.
fn read_publish<'a>(kind: u8, d: &mut Decoder<'a>) -> Result<PublishFields<'a>, RecordError> {
    let id = d.read_u64().map_err(bad)?;
    // 0 is written for a copy of a first-format record, whose time is unknown.
    let enqueued_ms = if kind & 0x10 != 0 {
        Some(d.read_u64().map_err(bad)?).filter(|t| *t != 0)
    } else {
        None
    };
    let n = d.read_u16().map_err(bad)?;
    let mut queues = Vec::with_capacity(usize::from(n));
    for _ in 0..n {
        queues.push(read_name_ref(d)?);
    }
    let mut shortstr = || -> Result<&'a str, RecordError> {
        let s = d.read_shortstr_bytes().map_err(bad)?;
        std::str::from_utf8(s).map_err(|_| bad(warren_amqp::error::DecodeError::InvalidUtf8))
    };
    let exchange = shortstr()?;
    let routing_key = shortstr()?;
    let plen = d.read_u32().map_err(bad)? as usize;
    let praw = d.take(plen).map_err(bad)?;
    let properties = BasicProperties::decode(praw, MAX_TABLE_DEPTH).map_err(bad)?;
    let blen = d.read_u32().map_err(bad)? as usize;
    let body = d.take(blen).map_err(bad)?;
    Ok(PublishFields {
        id,
        enqueued_ms,
        queues,
        exchange,
        routing_key,
        properties,
        body,
        transient: kind & !0x10 == kind::TRANSIENT,
    })
}

/// [`decode`] after the checksum was checked.
fn decode_checked(body: &[u8]) -> Result<Record, RecordError> {
    let mut d = Decoder::new(body);
    let kind = d.read_u8().map_err(bad)?;
    let rec = match kind {
        k if is_publish(k) => {
            let p = read_publish(k, &mut d)?;
            Record::Publish {
                message: StoredMessage {
                    id: p.id,
                    exchange: p.exchange.to_string(),
                    routing_key: p.routing_key.to_string(),
                    properties: p.properties,
                    body: Bytes::copy_from_slice(p.body),
                    enqueued_ms: p.enqueued_ms,
                },
                queues: p.queues.into_iter().map(str::to_string).collect(),
                transient: p.transient,
            }
        }
        kind::ACK_AT => {
            let id = d.read_u64().map_err(bad)?;
            let segment = d.read_u32().map_err(bad)?;
            let offset = d.read_u64().map_err(bad)?;
            let origin = d.read_u32().map_err(bad)?;
            let queue = read_name(&mut d)?;
            Record::Ack {
                id,
                queue,
                target: Some(AckTarget {
                    segment,
                    offset,
                    origin,
                }),
            }
        }
        kind::ACK | kind::DELIVERED => {
            let id = d.read_u64().map_err(bad)?;
            let queue = read_name(&mut d)?;
            if kind == kind::ACK {
                Record::Ack {
                    id,
                    queue,
                    target: None,
                }
            } else {
                Record::Delivered { id, queue }
            }
        }
        other => {
            return Err(RecordError::Malformed(format!(
                "unknown record type {other}"
            )))
        }
    };
    if !d.is_empty() {
        return Err(RecordError::Malformed("trailing bytes".into()));
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(buf: &[u8]) -> (u32, u32, &[u8]) {
        let len = u32::from_be_bytes(buf[0..4].try_into().unwrap());
        let crc = u32::from_be_bytes(buf[4..8].try_into().unwrap());
        (len, crc, &buf[8..8 + len as usize])
    }

    #[test]
    fn publish_round_trip() {
        let mut buf = BytesMut::new();
        let props = BasicProperties {
            delivery_mode: Some(2),
            content_type: Some("text/plain".into()),
            ..Default::default()
        };
        encode_publish(
            &mut buf,
            7,
            "x",
            "k",
            &props,
            b"hello",
            1_700_000_000_123,
            &["a", "b"],
            false,
        );
        let (len, crc, body) = split(&buf);
        assert_eq!(len as usize + HEADER_LEN, buf.len());
        match decode(body, crc).unwrap() {
            Record::Publish {
                message,
                queues,
                transient,
            } => {
                assert_eq!(message.id, 7);
                assert_eq!(message.enqueued_ms, Some(1_700_000_000_123));
                assert_eq!(message.body, Bytes::from_static(b"hello"));
                assert_eq!(message.properties, props);
                assert_eq!(queues, vec!["a", "b"]);
                assert!(!transient);
            }
            r => panic!("{r:?}"),
        }
    }

    #[test]
    fn corruption_is_detected() {
        let mut buf = BytesMut::new();
        encode_queue_event(&mut buf, kind::ACK, 9, "q");
        let (_, crc, _) = split(&buf);
        let mut body = buf[8..].to_vec();
        assert_eq!(
            decode(&body, crc).unwrap(),
            Record::Ack {
                id: 9,
                queue: "q".into(),
                target: None,
            }
        );
        body[3] ^= 0x40;
        assert_eq!(decode(&body, crc), Err(RecordError::BadChecksum));
    }

    #[test]
    fn ack_names_its_target() {
        let mut buf = BytesMut::new();
        let target = Location {
            segment: 12,
            offset: 1 << 33,
            len: 99,
        };
        encode_ack(&mut buf, 5, target, 3, "v\u{1f}q");
        let (_, crc, body) = split(&buf);
        assert_eq!(
            decode(body, crc).unwrap(),
            Record::Ack {
                id: 5,
                queue: "v\u{1f}q".into(),
                target: Some(AckTarget {
                    segment: 12,
                    offset: 1 << 33,
                    origin: 3,
                }),
            }
        );
    }

    /// Records of the first format, byte for byte as commit fc8b53a wrote them, still decode.
    #[test]
    fn first_format_publish_decodes_without_enqueue_time() {
        let mut buf = BytesMut::new();
        frame(&mut buf, kind::PUBLISH, |b| {
            b.put_u64(3);
            b.put_u16(1);
            put_name(b, "q");
            put_shortstr(b, "ex");
            put_shortstr(b, "rk");
            let mut props = BytesMut::new();
            BasicProperties {
                delivery_mode: Some(2),
                priority: Some(4),
                ..Default::default()
            }
            .encode(&mut props);
            b.put_u32(props.len() as u32);
            b.put_slice(&props);
            b.put_u32(2);
            b.put_slice(b"hi");
        });
        let (_, crc, body) = split(&buf);
        match decode(body, crc).unwrap() {
            Record::Publish {
                message,
                queues,
                transient,
            } => {
                assert_eq!(message.id, 3);
                assert_eq!(message.enqueued_ms, None);
                assert_eq!(message.properties.priority, Some(4));
                assert_eq!(&message.body[..], b"hi");
                assert_eq!(
                    (message.exchange.as_str(), queues),
                    ("ex", vec!["q".into()])
                );
                assert!(!transient);
            }
            r => panic!("{r:?}"),
        }
    }

    /// Recovery's scan reads what decode reads of a publish record, of either format, and
    /// refuses what decode refuses.
    #[test]
    fn scan_agrees_with_decode() {
        let mut buf = BytesMut::new();
        let props = BasicProperties {
            priority: Some(7),
            headers: Some(warren_amqp::table::FieldTable(vec![(
                "h".to_string(),
                warren_amqp::table::FieldValue::I32(1),
            )])),
            ..Default::default()
        };
        encode_publish(
            &mut buf,
            11,
            "x",
            "k",
            &props,
            b"body",
            5,
            &["v\u{1f}a", "v\u{1f}b"],
            false,
        );
        encode_publish(
            &mut buf,
            12,
            "",
            "",
            &BasicProperties::default(),
            b"",
            5,
            &["q"],
            true,
        );
        frame(&mut buf, kind::PUBLISH, |b| {
            b.put_u64(13);
            b.put_u16(1);
            put_name(b, "old");
            put_shortstr(b, "ex");
            put_shortstr(b, "rk");
            b.put_u32(2);
            b.put_slice(&[0, 0]);
            b.put_u32(1);
            b.put_slice(b"z");
        });
        encode_queue_event(&mut buf, kind::DELIVERED, 11, "v\u{1f}a");
        let mut rest = &buf[..];
        let mut scanned = Vec::new();
        while !rest.is_empty() {
            let (len, crc, body) = split(rest);
            let s = scan(body, crc).unwrap();
            match (decode(body, crc).unwrap(), &s) {
                (
                    Record::Publish {
                        message,
                        queues,
                        transient,
                    },
                    Scanned::Publish {
                        id,
                        queues: q,
                        transient: t,
                        priority,
                    },
                ) => {
                    assert_eq!(
                        (message.id, &queues, transient),
                        (*id, &q.iter().map(|n| n.to_string()).collect(), *t)
                    );
                    assert_eq!(message.properties.priority.unwrap_or(0), *priority);
                }
                (r, Scanned::Other(o)) => assert_eq!(&r, o.as_ref()),
                (r, s) => panic!("{r:?} against {s:?}"),
            }
            scanned.push(format!("{s:?}"));
            rest = &rest[HEADER_LEN + len as usize..];
        }
        assert_eq!(scanned.len(), 4);
        // A publish with a checksum that holds but a field cut short, or bytes after the body.
        for bad in [
            |b: &mut BytesMut| {
                b.put_u64(1);
                b.put_u16(1);
                put_name(b, "q");
                put_shortstr(b, "ex");
            },
            |b: &mut BytesMut| {
                b.put_u64(1);
                b.put_u16(0);
                put_shortstr(b, "ex");
                put_shortstr(b, "rk");
                b.put_u32(2);
                b.put_slice(&[0, 0]);
                b.put_u32(0);
                b.put_u8(9);
            },
        ] {
            let mut buf = BytesMut::new();
            frame(&mut buf, kind::PUBLISH, bad);
            let (_, crc, body) = split(&buf);
            assert!(decode(body, crc).is_err());
            assert!(matches!(scan(body, crc), Err(RecordError::Malformed(_))));
        }
        let (_, crc, body) = split(&buf);
        assert_eq!(scan(body, crc ^ 1), Err(RecordError::BadChecksum));
    }
}
