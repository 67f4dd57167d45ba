//! The commands of a quorum queue's Raft log and their binary encoding.
//!
//! A log entry's payload is a [`Batch`]: everything the queue's leader was asked to do while
//! the previous entry was being proposed (publishes, acks, returns, deliveries), so that one
//! entry, and one fsync, carries many operations. Applying a batch is deterministic: every
//! member that applies the same entries holds the same queue (see [`crate::state`]).
//!
//! Encoding (big-endian): `u32 n`, then n commands, each a `u8` tag and its fields; a message
//! is `u64 enqueued_ms, shortstr exchange, shortstr routing key, u32 + properties (content
//! header encoding), u32 + body`. Bodies decode as slices of the entry's buffer (no copy).

use bytes::{BufMut, Bytes, BytesMut};
use std::sync::Arc;
use warren_amqp::properties::BasicProperties;
use warren_amqp::table::{put_shortstr, Decoder};
use warren_broker::Message;

/// The deepest field-table nesting accepted in a replicated message's headers (as the
/// message store's records).
const MAX_TABLE_DEPTH: usize = warren_store::record::MAX_TABLE_DEPTH;

/// Why messages leave a queue (the reason decides whether and how they are dead-lettered).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleReason {
    /// Acknowledged by a consumer (or delivered with no ack).
    Ack,
    /// basic.reject / basic.nack without requeue: dead-lettered with reason `rejected`.
    Rejected,
    /// Its TTL ran out: dead-lettered with reason `expired`.
    Expired,
    /// Dropped from the head over the length limit: dead-lettered with reason `maxlen`.
    Maxlen,
    /// queue.purge: dropped.
    Purged,
}

impl SettleReason {
    fn tag(self) -> u8 {
        match self {
            SettleReason::Ack => 0,
            SettleReason::Rejected => 1,
            SettleReason::Expired => 2,
            SettleReason::Maxlen => 3,
            SettleReason::Purged => 4,
        }
    }

    fn from_tag(t: u8) -> Option<Self> {
        Some(match t {
            0 => SettleReason::Ack,
            1 => SettleReason::Rejected,
            2 => SettleReason::Expired,
            3 => SettleReason::Maxlen,
            4 => SettleReason::Purged,
            _ => return None,
        })
    }
}

/// One operation on a quorum queue.
#[derive(Debug, Clone)]
pub enum Command {
    /// Published messages, with their enqueue times (ms since the epoch), in order.
    Enqueue(Vec<(Arc<Message>, u64)>),
    /// The leader that began with `epoch` delivered these messages; ignored when another
    /// leadership began since (its [`Command::Lead`] returned everything checked out).
    Checkout {
        /// The delivering leader's epoch.
        epoch: u64,
        /// The messages' keys.
        keys: Vec<u64>,
        /// Each message's delivery count when it was delivered (same length as `keys`), so
        /// that a checkout applied after the delivery's own return (a settlement forwarded
        /// by another node can overtake the leader's checkout) is ignored. Empty in entries
        /// written before counts were recorded: then every key is checked out.
        counts: Vec<u32>,
    },
    /// Messages left the queue.
    Settle {
        /// Why.
        reason: SettleReason,
        /// The messages' keys.
        keys: Vec<u64>,
    },
    /// Messages went back to the queue (nack or reject with requeue, a consumer's channel
    /// closed): their delivery count goes up by one.
    Return {
        /// The messages' keys.
        keys: Vec<u64>,
    },
    /// The leader may deliver messages up to this key for the first time (see
    /// [`crate::state::QueueState::horizon`]).
    Horizon(u64),
    /// A member took over as leader (it drew `epoch` at random): everything checked out is
    /// returned, as its consumers' channels belonged to the previous leader or to a process
    /// that is gone. Every leadership proposes one before delivering, so that a leader
    /// restarted in the same Raft term starts afresh too.
    Lead(u64),
    /// A change of the cluster's metadata (an entry of the metadata group, see
    /// [`crate::metadata`]; queues ignore it), encoded by that module.
    Meta(Bytes),
}

/// The payload of one log entry.
#[derive(Debug, Clone, Default)]
pub struct Batch(pub Vec<Command>);

mod tag {
    pub const ENQUEUE: u8 = 1;
    pub const CHECKOUT: u8 = 2;
    pub const SETTLE: u8 = 3;
    pub const RETURN: u8 = 4;
    pub const HORIZON: u8 = 5;
    pub const LEAD: u8 = 6;
    pub const CHECKOUT_COUNTED: u8 = 7;
    pub const META: u8 = 8;
}

fn put_keys(buf: &mut BytesMut, keys: &[u64]) {
    buf.put_u32(keys.len() as u32);
    for k in keys {
        buf.put_u64(*k);
    }
}

/// Why a payload does not decode.
#[derive(Debug, thiserror::Error)]
#[error("quorum queue log entry does not decode: {0}")]
pub struct DecodeError(pub String);

impl From<warren_amqp::error::DecodeError> for DecodeError {
    fn from(e: warren_amqp::error::DecodeError) -> Self {
        DecodeError(e.to_string())
    }
}

impl Batch {
    /// Appends the encoding to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) {
        buf.put_u32(self.0.len() as u32);
        for c in &self.0 {
            match c {
                Command::Enqueue(msgs) => {
                    buf.put_u8(tag::ENQUEUE);
                    buf.put_u32(msgs.len() as u32);
                    for (m, at) in msgs {
                        buf.put_u64(*at);
                        put_message(buf, m);
                    }
                }
                Command::Checkout {
                    epoch,
                    keys,
                    counts,
                } if counts.len() == keys.len() && !keys.is_empty() => {
                    buf.put_u8(tag::CHECKOUT_COUNTED);
                    buf.put_u64(*epoch);
                    put_keys(buf, keys);
                    for c in counts {
                        buf.put_u32(*c);
                    }
                }
                Command::Checkout { epoch, keys, .. } => {
                    buf.put_u8(tag::CHECKOUT);
                    buf.put_u64(*epoch);
                    put_keys(buf, keys);
                }
                Command::Settle { reason, keys } => {
                    buf.put_u8(tag::SETTLE);
                    buf.put_u8(reason.tag());
                    put_keys(buf, keys);
                }
                Command::Return { keys } => {
                    buf.put_u8(tag::RETURN);
                    put_keys(buf, keys);
                }
                Command::Horizon(k) => {
                    buf.put_u8(tag::HORIZON);
                    buf.put_u64(*k);
                }
                Command::Lead(e) => {
                    buf.put_u8(tag::LEAD);
                    buf.put_u64(*e);
                }
                Command::Meta(b) => {
                    buf.put_u8(tag::META);
                    buf.put_u32(b.len() as u32);
                    buf.put_slice(b);
                }
            }
        }
    }

    /// The encoding as bytes.
    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::new();
        self.encode(&mut b);
        b.freeze()
    }

    /// Decodes a batch; message bodies are slices of `payload`.
    pub fn decode(payload: &Bytes) -> Result<Batch, DecodeError> {
        let mut d = Decoder::new(payload);
        let n = d.read_u32()?;
        let mut out = Vec::with_capacity((n as usize).min(1024));
        for _ in 0..n {
            let c = match d.read_u8()? {
                tag::ENQUEUE => {
                    let count = d.read_u32()?;
                    let mut msgs = Vec::with_capacity((count as usize).min(4096));
                    for _ in 0..count {
                        let at = d.read_u64()?;
                        msgs.push((read_message(&mut d, payload)?, at));
                    }
                    Command::Enqueue(msgs)
                }
                tag::CHECKOUT => {
                    let epoch = d.read_u64()?;
                    Command::Checkout {
                        epoch,
                        keys: read_keys(&mut d)?,
                        counts: Vec::new(),
                    }
                }
                tag::CHECKOUT_COUNTED => {
                    let epoch = d.read_u64()?;
                    let keys = read_keys(&mut d)?;
                    if keys.len() > d.remaining() / 4 {
                        return Err(DecodeError("count beyond the payload".into()));
                    }
                    let counts = (0..keys.len())
                        .map(|_| Ok(d.read_u32()?))
                        .collect::<Result<Vec<u32>, DecodeError>>()?;
                    Command::Checkout {
                        epoch,
                        keys,
                        counts,
                    }
                }
                tag::SETTLE => {
                    let t = d.read_u8()?;
                    let reason = SettleReason::from_tag(t)
                        .ok_or_else(|| DecodeError(format!("unknown settle reason {t}")))?;
                    Command::Settle {
                        reason,
                        keys: read_keys(&mut d)?,
                    }
                }
                tag::RETURN => Command::Return {
                    keys: read_keys(&mut d)?,
                },
                tag::HORIZON => Command::Horizon(d.read_u64()?),
                tag::LEAD => Command::Lead(d.read_u64()?),
                tag::META => {
                    let n = d.read_u32()? as usize;
                    let start = payload.len() - d.remaining();
                    d.take(n)?;
                    Command::Meta(payload.slice(start..start + n))
                }
                other => return Err(DecodeError(format!("unknown command tag {other}"))),
            };
            out.push(c);
        }
        Ok(Batch(out))
    }
}

/// Appends a message: exchange, routing key, properties, body.
pub(crate) fn put_message(buf: &mut BytesMut, m: &Message) {
    put_shortstr(buf, &m.exchange);
    put_shortstr(buf, &m.routing_key);
    let props = m.encoded_properties();
    buf.put_u32(props.len() as u32);
    buf.put_slice(props);
    buf.put_u32(m.body.len() as u32);
    buf.put_slice(&m.body);
}

/// Reads a message written by [`put_message`]; `d` reads `payload`, whose slice the body is.
pub(crate) fn read_message(d: &mut Decoder, payload: &Bytes) -> Result<Arc<Message>, DecodeError> {
    let exchange = d.read_shortstr()?;
    let routing_key = d.read_shortstr()?;
    let plen = d.read_u32()? as usize;
    let props = BasicProperties::decode(d.take(plen)?, MAX_TABLE_DEPTH)?;
    let blen = d.read_u32()? as usize;
    let start = payload.len() - d.remaining();
    d.take(blen)?;
    let body = payload.slice(start..start + blen);
    Ok(Arc::new(Message::new(exchange, routing_key, props, body)))
}

fn read_keys(d: &mut Decoder) -> Result<Vec<u64>, DecodeError> {
    let n = d.read_u32()? as usize;
    if n > d.remaining() / 8 {
        return Err(DecodeError("key count beyond the payload".into()));
    }
    (0..n).map(|_| Ok(d.read_u64()?)).collect()
}

impl serde::Serialize for Batch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.to_bytes())
    }
}

impl<'de> serde::Deserialize<'de> for Batch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw: RawBytes = serde::Deserialize::deserialize(d)?;
        Batch::decode(&Bytes::from(raw.0)).map_err(serde::de::Error::custom)
    }
}

/// Bytes as serde gives them (a byte string, or a sequence of u8).
pub(crate) struct RawBytes(pub Vec<u8>);

impl<'de> serde::Deserialize<'de> for RawBytes {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = RawBytes;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<RawBytes, E> {
                Ok(RawBytes(v.to_vec()))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<RawBytes, E> {
                Ok(RawBytes(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut a: A,
            ) -> Result<RawBytes, A::Error> {
                let mut v = Vec::new();
                while let Some(b) = a.next_element::<u8>()? {
                    v.push(b);
                }
                Ok(RawBytes(v))
            }
        }
        d.deserialize_bytes(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_round_trip() {
        let props = BasicProperties {
            delivery_mode: Some(2),
            content_type: Some("text/plain".into()),
            ..Default::default()
        };
        let m = Arc::new(Message::new(
            "x".into(),
            "rk".into(),
            props.clone(),
            Bytes::from_static(b"hello"),
        ));
        let b = Batch(vec![
            Command::Enqueue(vec![(m, 42)]),
            Command::Checkout {
                epoch: 3,
                keys: vec![1, 2],
                counts: vec![0, 4],
            },
            Command::Settle {
                reason: SettleReason::Rejected,
                keys: vec![7],
            },
            Command::Return { keys: vec![9] },
            Command::Horizon(1000),
        ]);
        let bytes = b.to_bytes();
        let back = Batch::decode(&bytes).unwrap();
        assert_eq!(back.0.len(), 5);
        let Command::Enqueue(msgs) = &back.0[0] else {
            panic!("enqueue expected")
        };
        assert_eq!(msgs[0].1, 42);
        assert_eq!(&msgs[0].0.body[..], b"hello");
        assert_eq!(msgs[0].0.properties, props);
        assert_eq!(msgs[0].0.routing_key, "rk");
        assert!(matches!(back.0[4], Command::Horizon(1000)));
        let Command::Checkout { keys, counts, .. } = &back.0[1] else {
            panic!("checkout expected")
        };
        assert_eq!(
            (keys.as_slice(), counts.as_slice()),
            (&[1, 2][..], &[0, 4][..])
        );
        assert!(Batch::decode(&bytes.slice(..bytes.len() - 1)).is_err());
        // A checkout written without counts (older logs) still decodes.
        let old = Batch(vec![Command::Checkout {
            epoch: 3,
            keys: vec![5],
            counts: vec![],
        }]);
        let Command::Checkout { keys, counts, .. } = &Batch::decode(&old.to_bytes()).unwrap().0[0]
        else {
            panic!("checkout expected")
        };
        assert_eq!((keys.len(), counts.len()), (1, 0));
    }
}
