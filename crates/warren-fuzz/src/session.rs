//! Target `connection`: the server's connection state machine, driven end to end.
//!
//! A fuzz input is decoded into a [`Session`]: how the client connects (a [`Handshake`]
//! variant, one or two connections) and a sequence of [`Op`]s, each one or a few frames that a
//! client sends (methods with names and arguments drawn from small pools, so that declares,
//! binds, publishes and consumes meet each other; content split at any point, or sent in
//! pieces and out of order; raw frames and bytes), or an action of the harness (let virtual
//! time pass, run the broker's TTL sweep, drop a connection). The decoding is total: every
//! byte string is a session, and [`Session::encode`] gives the bytes of a session back, which
//! is how the seed corpus is written ([`crate::seeds`]).
//!
//! [`run`] serves each connection with `warren_server::connection::serve`, the code the TCP
//! listener runs, over an in-memory duplex stream, against a fresh in-memory broker, on a
//! single-threaded tokio runtime whose clock is paused (timeouts elapse as soon as nothing else
//! can run, so heartbeat, handshake and close timeouts cost no real time). A reader task parses
//! everything the server sends. The run panics when:
//!
//! * the server sends bytes that do not parse as frames, a frame above the negotiated
//!   `frame_max`, content that does not follow its method (header, then body frames adding up
//!   to the announced size), or delivery tags on a channel that do not count up from 1;
//! * a connection does not end within a minute of virtual time after its client went away, or
//!   the server stops reading from a client for that long;
//! * once every connection has ended, a queue still has consumers or unacknowledged messages,
//!   or an exclusive queue survived its connection.

use bytes::{Bytes, BytesMut};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::watch;
use warren_amqp::frame::{
    encode_body_frames, encode_header_frame, encode_heartbeat, encode_method_frame, parse_frame,
    Frame, Limits, FRAME_BODY, FRAME_HEADER, FRAME_METHOD, PROTOCOL_HEADER,
};
use warren_amqp::generated::*;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_amqp::{BasicProperties, Method};
use warren_server::{Config, ServerState};

/// Most operations decoded from one input; the rest of a longer input is ignored.
pub const MAX_OPS: usize = 256;
/// Largest message body an operation sends, bytes.
pub const MAX_BODY: usize = 16 * 1024;
/// Virtual time after which a stalled connection counts as hung.
const HANG: Duration = Duration::from_secs(60);
/// `frame_max` the harness's broker offers (the default, 128 KiB).
const FRAME_MAX: u32 = 131_072;

/// Reads the fields of a session from fuzz input: past the end every read gives zeros.
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }
    /// True when every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn bytes(&mut self, n: usize) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        let end = (self.pos + n).min(self.data.len());
        self.pos += n;
        &self.data[start..end]
    }
}

/// One field of an operation: how it is read from fuzz input and written back.
trait Field: Sized {
    fn read(r: &mut Reader) -> Self;
    fn write(&self, out: &mut Vec<u8>);
}

impl Field for u8 {
    fn read(r: &mut Reader) -> Self {
        r.u8()
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.push(*self);
    }
}

impl Field for bool {
    fn read(r: &mut Reader) -> Self {
        r.u8() & 1 == 1
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.push(u8::from(*self));
    }
}

impl Field for u16 {
    fn read(r: &mut Reader) -> Self {
        u16::from_be_bytes([r.u8(), r.u8()])
    }
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_be_bytes());
    }
}

/// Up to 255 raw bytes: a length octet, then the bytes.
impl Field for Vec<u8> {
    fn read(r: &mut Reader) -> Self {
        let n = r.u8();
        r.bytes(usize::from(n)).to_vec()
    }
    fn write(&self, out: &mut Vec<u8>) {
        let n = self.len().min(255);
        out.push(n as u8);
        out.extend_from_slice(&self[..n]);
    }
}

/// Declares [`Op`] with its wire layout: one octet (the variant's index, plus 128 for the
/// second connection), then the fields in order.
macro_rules! define_ops {
    ($( $(#[doc = $doc:literal])* $name:ident { $($field:ident : $ty:ty),* $(,)? } ),* $(,)?) => {
        /// One step of a session. `conn` is 0 or 1 (the second connection, when there is one);
        /// `ch` is a channel selector ([`channel`]); name fields index the pools
        /// ([`QUEUES`], [`EXCHANGES`], [`KINDS`], [`KEYS`], [`TAGS`]), `args` a field table
        /// ([`args_table`]) and `props` content properties ([`props`]).
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Op {
            $( $(#[doc = $doc])* $name { conn: u8, $($field: $ty),* }, )*
        }

        const OP_COUNT: usize = [$(stringify!($name)),*].len();

        impl Op {
            /// Reads one operation (every input decodes to some operation).
            pub fn read(r: &mut Reader) -> Op {
                let b = r.u8();
                let conn = b >> 7;
                let mut index = usize::from(b & 0x7f) % OP_COUNT;
                $(
                    if index == 0 {
                        return Op::$name { conn, $($field: Field::read(r)),* };
                    }
                    index -= 1;
                )*
                unreachable!("index < OP_COUNT")
            }

            /// Appends this operation's bytes ([`Op::read`] reads it back unchanged).
            pub fn write(&self, out: &mut Vec<u8>) {
                let mut code = 0u8;
                $(
                    #[allow(unused_variables)]
                    if let Op::$name { conn, $($field),* } = self {
                        out.push(code | ((conn & 1) << 7));
                        $( Field::write($field, out); )*
                        return;
                    }
                    code += 1;
                )*
                let _ = code;
            }

            /// The connection this operation acts on.
            pub fn conn(&self) -> usize {
                match self {
                    $( Op::$name { conn, .. } => usize::from(*conn & 1), )*
                }
            }
        }
    };
}

define_ops! {
    /// channel.open.
    ChannelOpen { ch: u8 },
    /// channel.close (reply code 200).
    ChannelClose { ch: u8 },
    /// channel.close-ok.
    ChannelCloseOk { ch: u8 },
    /// channel.flow.
    ChannelFlow { ch: u8, active: bool },
    /// exchange.declare; `flags` bits: passive, durable, auto-delete, internal, nowait.
    ExchangeDeclare { ch: u8, exchange: u8, kind: u8, flags: u8, args: u8 },
    /// exchange.delete; `flags` bits: if-unused, nowait.
    ExchangeDelete { ch: u8, exchange: u8, flags: u8 },
    /// exchange.bind, or exchange.unbind when `unbind`.
    ExchangeBind { ch: u8, destination: u8, source: u8, key: u8, unbind: bool, args: u8 },
    /// queue.declare; `flags` bits: passive, durable, exclusive, auto-delete, nowait.
    QueueDeclare { ch: u8, queue: u8, flags: u8, args: u8 },
    /// queue.bind, or queue.unbind when `unbind`.
    QueueBind { ch: u8, queue: u8, exchange: u8, key: u8, unbind: bool, args: u8 },
    /// queue.purge.
    QueuePurge { ch: u8, queue: u8, nowait: bool },
    /// queue.delete; `flags` bits: if-unused, if-empty, nowait.
    QueueDelete { ch: u8, queue: u8, flags: u8 },
    /// basic.qos (prefetch count, global).
    Qos { ch: u8, prefetch: u8, global: bool },
    /// basic.consume; `flags` bits: no-local, no-ack, exclusive, nowait.
    Consume { ch: u8, queue: u8, tag: u8, flags: u8, args: u8 },
    /// basic.cancel.
    Cancel { ch: u8, tag: u8, nowait: bool },
    /// basic.publish with its content: header, then the body of `size` bytes in body frames
    /// of `split` bytes each (0: as large as `frame_max` allows). `flags` bits: mandatory,
    /// immediate, announce one byte more than is sent, announce one byte less.
    Publish { ch: u8, exchange: u8, key: u8, flags: u8, props: u8, size: u16, split: u16 },
    /// basic.publish without its content.
    PublishMethod { ch: u8, exchange: u8, key: u8 },
    /// A content header frame alone; `class` 0 is basic (60), anything else that class id.
    Header { ch: u8, class: u8, size: u16, props: u8 },
    /// A content body frame alone.
    Body { ch: u8, size: u16 },
    /// basic.get.
    Get { ch: u8, queue: u8, no_ack: bool },
    /// basic.ack.
    Ack { ch: u8, tag: u8, multiple: bool },
    /// basic.nack; `flags` bits: multiple, requeue.
    Nack { ch: u8, tag: u8, flags: u8 },
    /// basic.reject.
    Reject { ch: u8, tag: u8, requeue: bool },
    /// basic.recover, or basic.recover-async when `async_`.
    Recover { ch: u8, requeue: bool, async_: bool },
    /// confirm.select.
    ConfirmSelect { ch: u8, nowait: bool },
    /// tx.select, tx.commit or tx.rollback (`which` mod 3).
    Tx { ch: u8, which: u8 },
    /// A heartbeat frame on channel 0 (or on `ch`, which is an error, when `on_channel`).
    Heartbeat { ch: u8, on_channel: bool },
    /// A connection-class method on channel 0: close, close-ok, update-secret, a second
    /// start-ok / tune-ok / open, or blocked (`which` mod 7).
    Connection { which: u8 },
    /// A method frame with the given class and method ids and raw argument bytes.
    RawMethod { ch: u8, class: u8, method: u8, payload: Vec<u8> },
    /// A frame of any type octet with a raw payload.
    RawFrame { ch: u8, kind: u8, payload: Vec<u8> },
    /// Raw bytes on the socket.
    RawBytes { bytes: Vec<u8> },
    /// Lets `ms` milliseconds of virtual time pass.
    Wait { ms: u8 },
    /// Runs the broker's TTL and queue-expiry sweep.
    Sweep {},
    /// The client closes its side of the connection without a word.
    Disconnect {},
}

/// How the client connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Handshake {
    /// PLAIN guest/guest, tune-ok accepting the server's proposal, open "/".
    Plain,
    /// AMQPLAIN guest/guest, otherwise as [`Handshake::Plain`].
    Amqplain,
    /// PLAIN with this tune-ok (`frame_max` in units of 256 bytes).
    Tune {
        /// tune-ok channel_max.
        channel_max: u16,
        /// tune-ok frame_max / 256.
        frame_max_256: u16,
        /// tune-ok heartbeat, seconds.
        heartbeat: u8,
    },
    /// A protocol header other than AMQP 0-9-1's.
    BadHeader,
    /// A wrong password.
    BadLogin,
    /// An unknown SASL mechanism.
    UnknownMechanism,
    /// connection.open for a vhost that does not exist.
    UnknownVhost,
    /// The protocol header, then these raw bytes.
    Raw(Vec<u8>),
}

impl Handshake {
    const COUNT: u8 = 8;

    fn index(&self) -> u8 {
        match self {
            Handshake::Plain => 0,
            Handshake::Amqplain => 1,
            Handshake::Tune { .. } => 2,
            Handshake::BadHeader => 3,
            Handshake::BadLogin => 4,
            Handshake::UnknownMechanism => 5,
            Handshake::UnknownVhost => 6,
            Handshake::Raw(_) => 7,
        }
    }
}

/// A decoded fuzz input: how the first connection connects, whether a second one (with a
/// [`Handshake::Plain`] handshake) takes part, and what the clients do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// The first connection's handshake.
    pub handshake: Handshake,
    /// A second connection takes part (operations with `conn: 1` go to it).
    pub two_connections: bool,
    /// What happens after the handshakes, in order.
    pub ops: Vec<Op>,
}

impl Session {
    /// Decodes any byte string into a session: one octet for the handshake (the variant,
    /// plus 128 for a second connection) and its fields, then operations until the input
    /// ends or [`MAX_OPS`] are read.
    pub fn decode(data: &[u8]) -> Session {
        let mut r = Reader::new(data);
        let b = r.u8();
        let handshake = match (b & 0x7f) % Handshake::COUNT {
            0 => Handshake::Plain,
            1 => Handshake::Amqplain,
            2 => Handshake::Tune {
                channel_max: Field::read(&mut r),
                frame_max_256: Field::read(&mut r),
                heartbeat: Field::read(&mut r),
            },
            3 => Handshake::BadHeader,
            4 => Handshake::BadLogin,
            5 => Handshake::UnknownMechanism,
            6 => Handshake::UnknownVhost,
            _ => Handshake::Raw(Field::read(&mut r)),
        };
        let mut ops = Vec::new();
        while !r.is_empty() && ops.len() < MAX_OPS {
            ops.push(Op::read(&mut r));
        }
        Session {
            handshake,
            two_connections: b & 0x80 != 0,
            ops,
        }
    }

    /// The bytes that [`Session::decode`] reads back as this session.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![self.handshake.index() | if self.two_connections { 0x80 } else { 0 }];
        match &self.handshake {
            Handshake::Tune {
                channel_max,
                frame_max_256,
                heartbeat,
            } => {
                channel_max.write(&mut out);
                frame_max_256.write(&mut out);
                heartbeat.write(&mut out);
            }
            Handshake::Raw(bytes) => bytes.write(&mut out),
            _ => {}
        }
        for op in &self.ops {
            op.write(&mut out);
        }
        out
    }
}

/// Queue names operations pick from ("" is a server-named queue on declare, the channel's
/// last declared queue elsewhere).
pub const QUEUES: &[&str] = &[
    "q0",
    "q1",
    "q2",
    "",
    "dlq",
    "amq.gen-x",
    "amq.rabbitmq.reply-to",
];
/// Exchange names operations pick from.
pub const EXCHANGES: &[&str] = &[
    "",
    "amq.direct",
    "amq.fanout",
    "amq.topic",
    "amq.headers",
    "e0",
    "e1",
    "dlx",
    "amq.nope",
];
/// Exchange types for exchange.declare.
pub const KINDS: &[&str] = &["direct", "fanout", "topic", "headers", "x-nope"];
/// Routing and binding keys.
pub const KEYS: &[&str] = &["q0", "q1", "q2", "dlq", "a.b.c", "a.*", "#", ""];
/// Consumer tags ("" lets the server pick one).
pub const TAGS: &[&str] = &["", "c0", "c1", "c2"];

fn pick<'a>(pool: &[&'a str], i: u8) -> &'a str {
    pool[usize::from(i) % pool.len()]
}

/// The channel number a selector names: 1 to 3 mostly; every fourth value names one of 0,
/// 2047 (the highest allowed by default), 2048 and 65535.
pub fn channel(sel: u8) -> u16 {
    match sel % 4 {
        0 => [0, 2047, 2048, 65535][usize::from(sel / 4) % 4],
        n => u16::from(n),
    }
}

fn long(s: &str) -> FieldValue {
    FieldValue::LongString(Bytes::copy_from_slice(s.as_bytes()))
}

/// Number of argument tables [`args_table`] knows by index.
pub const ARGS_COUNT: u8 = 24;

/// The arguments table an `args` selector names: one of [`ARGS_COUNT`] tables of queue,
/// consumer, binding and exchange arguments (valid ones and ones RabbitMQ refuses); any
/// selector at or above [`ARGS_COUNT`] is empty.
pub fn args_table(sel: u8) -> FieldTable {
    let mut t = FieldTable::new();
    let mut put = |k: &str, v: FieldValue| t.insert(k, v);
    match sel {
        0 => {}
        1 => put("x-message-ttl", FieldValue::I32(0)),
        2 => put("x-message-ttl", FieldValue::I64(20)),
        3 => put("x-max-length", FieldValue::I32(1)),
        4 => {
            put("x-max-length", FieldValue::I32(2));
            put("x-overflow", long("reject-publish"));
        }
        5 => {
            put("x-max-length", FieldValue::I16(1));
            put("x-overflow", long("reject-publish-dlx"));
            put("x-dead-letter-exchange", long("dlx"));
        }
        6 => {
            put("x-dead-letter-exchange", long(""));
            put("x-dead-letter-routing-key", long("dlq"));
        }
        7 => {
            put("x-dead-letter-exchange", long("dlx"));
            put("x-message-ttl", FieldValue::I32(0));
        }
        8 => put("x-expires", FieldValue::I32(30)),
        9 => put("x-max-priority", FieldValue::U8(5)),
        10 => put("x-single-active-consumer", FieldValue::Bool(true)),
        11 => put("x-queue-type", long("quorum")),
        12 => put("x-max-length-bytes", FieldValue::I64(10)),
        13 => put("x-max-length", long("ten")),
        14 => put("x-message-ttl", FieldValue::I32(-1)),
        15 => put("x-priority", FieldValue::I32(5)),
        16 => put("x-priority", long("high")),
        17 => {
            put("x-match", long("all"));
            put("k", long("v"));
        }
        18 => {
            put("x-match", long("any-with-x"));
            put("x-k", FieldValue::I32(1));
        }
        19 => put("alternate-exchange", long("e1")),
        20 => put("x-overflow", long("nope")),
        21 => put("x-dead-letter-routing-key", long("q1")),
        22 => {
            put("x-max-length", FieldValue::I32(0));
            put("x-dead-letter-exchange", long("amq.fanout"));
        }
        23 => put("x-max-priority", FieldValue::I32(300)),
        _ => {}
    }
    t
}

/// Number of property sets [`props`] knows by index.
pub const PROPS_COUNT: u8 = 14;

/// The content properties a `props` selector names (persistent, expirations, priorities,
/// headers for the headers exchange, `CC` / `BCC`, direct reply-to, `user-id`).
pub fn props(sel: u8) -> BasicProperties {
    let mut p = BasicProperties::default();
    let headers = |entries: &[(&str, FieldValue)]| {
        let mut t = FieldTable::new();
        for (k, v) in entries {
            t.insert(*k, v.clone());
        }
        Some(t)
    };
    match sel % PROPS_COUNT {
        0 => {}
        1 => p.delivery_mode = Some(2),
        2 => p.expiration = Some("0".into()),
        3 => p.expiration = Some("20".into()),
        4 => p.expiration = Some("soon".into()),
        5 => p.priority = Some(9),
        6 => p.headers = headers(&[("k", long("v"))]),
        7 => {
            p.headers = headers(&[
                ("CC", FieldValue::Array(vec![long("q1")])),
                (
                    "BCC",
                    FieldValue::Array(vec![long("q2"), FieldValue::I32(3)]),
                ),
            ])
        }
        8 => p.reply_to = Some("amq.rabbitmq.reply-to".into()),
        9 => p.user_id = Some("guest".into()),
        10 => p.user_id = Some("mallory".into()),
        11 => p.headers = headers(&[("x-death", FieldValue::Array(vec![FieldValue::Void]))]),
        12 => p.expiration = Some("-5".into()),
        _ => {
            p = BasicProperties {
                content_type: Some("text/plain".into()),
                content_encoding: Some("utf-8".into()),
                headers: headers(&[("x-k", FieldValue::I32(1))]),
                delivery_mode: Some(1),
                priority: Some(0),
                correlation_id: Some("c".into()),
                reply_to: Some("q1".into()),
                expiration: Some("100000".into()),
                message_id: Some("m".into()),
                timestamp: Some(1),
                kind: Some("t".into()),
                user_id: None,
                app_id: Some("fuzz".into()),
                cluster_id: Some(Default::default()),
            }
        }
    }
    p
}

fn bit(flags: u8, n: u8) -> bool {
    flags & (1 << n) != 0
}

fn body(size: u16) -> Vec<u8> {
    (0..usize::from(size) % (MAX_BODY + 1))
        .map(|i| (i % 251) as u8)
        .collect()
}

/// What a client tells the server for `op`, as bytes (`frame_max` is the connection's
/// negotiated frame size, used to split content).
pub fn op_bytes(op: &Op, frame_max: u32) -> Vec<u8> {
    let mut b = BytesMut::new();
    let mut m = |ch: u8, method: Method| encode_method_frame(channel(ch), &method, &mut b);
    let q = |i: u8| pick(QUEUES, i).to_string();
    let x = |i: u8| pick(EXCHANGES, i).to_string();
    let k = |i: u8| pick(KEYS, i).to_string();
    match *op {
        Op::ChannelOpen { ch, .. } => m(ch, ChannelOpen::default().into()),
        Op::ChannelClose { ch, .. } => m(
            ch,
            ChannelClose {
                reply_code: 200,
                reply_text: "bye".into(),
                ..Default::default()
            }
            .into(),
        ),
        Op::ChannelCloseOk { ch, .. } => m(ch, ChannelCloseOk {}.into()),
        Op::ChannelFlow { ch, active, .. } => m(ch, ChannelFlow { active }.into()),
        Op::ExchangeDeclare {
            ch,
            exchange,
            kind,
            flags,
            args,
            ..
        } => m(
            ch,
            ExchangeDeclare {
                exchange: x(exchange),
                kind: pick(KINDS, kind).into(),
                passive: bit(flags, 0),
                durable: bit(flags, 1),
                auto_delete: bit(flags, 2),
                internal: bit(flags, 3),
                nowait: bit(flags, 4),
                arguments: args_table(args),
                ..Default::default()
            }
            .into(),
        ),
        Op::ExchangeDelete {
            ch,
            exchange,
            flags,
            ..
        } => m(
            ch,
            ExchangeDelete {
                exchange: x(exchange),
                if_unused: bit(flags, 0),
                nowait: bit(flags, 1),
                ..Default::default()
            }
            .into(),
        ),
        Op::ExchangeBind {
            ch,
            destination,
            source,
            key,
            unbind,
            args,
            ..
        } => {
            let (destination, source, routing_key) = (x(destination), x(source), k(key));
            let arguments = args_table(args);
            let method = if unbind {
                ExchangeUnbind {
                    destination,
                    source,
                    routing_key,
                    arguments,
                    ..Default::default()
                }
                .into()
            } else {
                ExchangeBind {
                    destination,
                    source,
                    routing_key,
                    arguments,
                    ..Default::default()
                }
                .into()
            };
            m(ch, method)
        }
        Op::QueueDeclare {
            ch,
            queue,
            flags,
            args,
            ..
        } => m(
            ch,
            QueueDeclare {
                queue: q(queue),
                passive: bit(flags, 0),
                durable: bit(flags, 1),
                exclusive: bit(flags, 2),
                auto_delete: bit(flags, 3),
                nowait: bit(flags, 4),
                arguments: args_table(args),
                ..Default::default()
            }
            .into(),
        ),
        Op::QueueBind {
            ch,
            queue,
            exchange,
            key,
            unbind,
            args,
            ..
        } => {
            let (queue, exchange, routing_key) = (q(queue), x(exchange), k(key));
            let arguments = args_table(args);
            let method = if unbind {
                QueueUnbind {
                    queue,
                    exchange,
                    routing_key,
                    arguments,
                    ..Default::default()
                }
                .into()
            } else {
                QueueBind {
                    queue,
                    exchange,
                    routing_key,
                    arguments,
                    ..Default::default()
                }
                .into()
            };
            m(ch, method)
        }
        Op::QueuePurge {
            ch, queue, nowait, ..
        } => m(
            ch,
            QueuePurge {
                queue: q(queue),
                nowait,
                ..Default::default()
            }
            .into(),
        ),
        Op::QueueDelete {
            ch, queue, flags, ..
        } => m(
            ch,
            QueueDelete {
                queue: q(queue),
                if_unused: bit(flags, 0),
                if_empty: bit(flags, 1),
                nowait: bit(flags, 2),
                ..Default::default()
            }
            .into(),
        ),
        Op::Qos {
            ch,
            prefetch,
            global,
            ..
        } => m(
            ch,
            BasicQos {
                prefetch_size: 0,
                prefetch_count: u16::from(prefetch),
                global,
            }
            .into(),
        ),
        Op::Consume {
            ch,
            queue,
            tag,
            flags,
            args,
            ..
        } => m(
            ch,
            BasicConsume {
                queue: q(queue),
                consumer_tag: pick(TAGS, tag).into(),
                no_local: bit(flags, 0),
                no_ack: bit(flags, 1),
                exclusive: bit(flags, 2),
                nowait: bit(flags, 3),
                arguments: args_table(args),
                ..Default::default()
            }
            .into(),
        ),
        Op::Cancel {
            ch, tag, nowait, ..
        } => m(
            ch,
            BasicCancel {
                consumer_tag: pick(TAGS, tag).into(),
                nowait,
            }
            .into(),
        ),
        Op::Publish {
            ch,
            exchange,
            key,
            flags,
            props: p,
            size,
            split,
            ..
        } => {
            m(
                ch,
                BasicPublish {
                    exchange: x(exchange),
                    routing_key: k(key),
                    mandatory: bit(flags, 0),
                    immediate: bit(flags, 1),
                    ..Default::default()
                }
                .into(),
            );
            let data = body(size);
            let announced = match (bit(flags, 2), bit(flags, 3)) {
                (true, _) => data.len() as u64 + 1,
                (false, true) => (data.len() as u64).saturating_sub(1),
                _ => data.len() as u64,
            };
            encode_header_frame(channel(ch), CLASS_BASIC, announced, &props(p), &mut b);
            let piece = match split {
                0 => frame_max,
                s => u32::from(s) + 8,
            };
            encode_body_frames(channel(ch), &data, piece, &mut b);
        }
        Op::PublishMethod {
            ch, exchange, key, ..
        } => m(
            ch,
            BasicPublish {
                exchange: x(exchange),
                routing_key: k(key),
                ..Default::default()
            }
            .into(),
        ),
        Op::Header {
            ch,
            class,
            size,
            props: p,
            ..
        } => {
            let class_id = if class == 0 {
                CLASS_BASIC
            } else {
                u16::from(class)
            };
            encode_header_frame(channel(ch), class_id, u64::from(size), &props(p), &mut b);
        }
        Op::Body { ch, size, .. } => {
            // A body frame even for size 0 (encode_body_frames writes none for an empty body).
            let data = body(size);
            raw_frame(&mut b, FRAME_BODY, channel(ch), &data);
        }
        Op::Get {
            ch, queue, no_ack, ..
        } => m(
            ch,
            BasicGet {
                queue: q(queue),
                no_ack,
                ..Default::default()
            }
            .into(),
        ),
        Op::Ack {
            ch, tag, multiple, ..
        } => m(
            ch,
            BasicAck {
                delivery_tag: u64::from(tag),
                multiple,
            }
            .into(),
        ),
        Op::Nack { ch, tag, flags, .. } => m(
            ch,
            BasicNack {
                delivery_tag: u64::from(tag),
                multiple: bit(flags, 0),
                requeue: bit(flags, 1),
            }
            .into(),
        ),
        Op::Reject {
            ch, tag, requeue, ..
        } => m(
            ch,
            BasicReject {
                delivery_tag: u64::from(tag),
                requeue,
            }
            .into(),
        ),
        Op::Recover {
            ch,
            requeue,
            async_,
            ..
        } => m(
            ch,
            if async_ {
                BasicRecoverAsync { requeue }.into()
            } else {
                BasicRecover { requeue }.into()
            },
        ),
        Op::ConfirmSelect { ch, nowait, .. } => m(ch, ConfirmSelect { nowait }.into()),
        Op::Tx { ch, which, .. } => m(
            ch,
            match which % 3 {
                0 => TxSelect {}.into(),
                1 => TxCommit {}.into(),
                _ => TxRollback {}.into(),
            },
        ),
        Op::Heartbeat { ch, on_channel, .. } => {
            if on_channel {
                raw_frame(&mut b, 8, channel(ch), &[]);
            } else {
                encode_heartbeat(&mut b);
            }
        }
        Op::Connection { which, .. } => {
            let method: Method = match which % 7 {
                0 => ConnectionClose {
                    reply_code: 200,
                    reply_text: "bye".into(),
                    ..Default::default()
                }
                .into(),
                1 => ConnectionCloseOk {}.into(),
                2 => ConnectionUpdateSecret {
                    new_secret: Bytes::from_static(b"s"),
                    reason: "r".into(),
                }
                .into(),
                3 => start_ok("PLAIN", Bytes::from_static(b"\0guest\0guest")).into(),
                4 => ConnectionTuneOk {
                    channel_max: 0,
                    frame_max: FRAME_MAX,
                    heartbeat: 0,
                }
                .into(),
                5 => open("/").into(),
                _ => ConnectionBlocked { reason: "r".into() }.into(),
            };
            encode_method_frame(0, &method, &mut b);
        }
        Op::RawMethod {
            ch,
            class,
            method,
            ref payload,
            ..
        } => {
            // Class ids are multiples of 10 (10..90) and method ids small: map the octets so
            // that most raw methods name a real method with fuzzed arguments.
            let class_id = u16::from(class % 10) * 10 + u16::from(class / 10 % 2) * 0x100;
            let mut p = Vec::with_capacity(4 + payload.len());
            p.extend_from_slice(&class_id.to_be_bytes());
            p.extend_from_slice(&u16::from(method).to_be_bytes());
            p.extend_from_slice(payload);
            raw_frame(&mut b, FRAME_METHOD, channel(ch), &p);
        }
        Op::RawFrame {
            ch,
            kind,
            ref payload,
            ..
        } => {
            let kind = match kind % 8 {
                0..=2 => FRAME_METHOD,
                3 | 4 => FRAME_HEADER,
                5 | 6 => FRAME_BODY,
                _ => kind,
            };
            raw_frame(&mut b, kind, channel(ch), payload);
        }
        Op::RawBytes { ref bytes, .. } => b.extend_from_slice(bytes),
        Op::Wait { .. } | Op::Sweep { .. } | Op::Disconnect { .. } => {}
    }
    b.to_vec()
}

fn raw_frame(b: &mut BytesMut, kind: u8, ch: u16, payload: &[u8]) {
    b.extend_from_slice(&[kind]);
    b.extend_from_slice(&ch.to_be_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    b.extend_from_slice(payload);
    b.extend_from_slice(&[0xCE]);
}

fn start_ok(mechanism: &str, response: Bytes) -> ConnectionStartOk {
    let mut caps = FieldTable::new();
    caps.insert("consumer_cancel_notify", FieldValue::Bool(true));
    caps.insert("connection.blocked", FieldValue::Bool(true));
    caps.insert("publisher_confirms", FieldValue::Bool(true));
    // As pika, lapin and amqplib: a refused login is told with connection.close (without it,
    // the broker only closes the socket, as RabbitMQ does).
    caps.insert("authentication_failure_close", FieldValue::Bool(true));
    let mut props = FieldTable::new();
    props.insert("product", long("warren-fuzz"));
    props.insert("capabilities", FieldValue::Table(caps));
    ConnectionStartOk {
        client_properties: props,
        mechanism: mechanism.into(),
        response,
        locale: "en_US".into(),
    }
}

fn open(vhost: &str) -> ConnectionOpen {
    ConnectionOpen {
        virtual_host: vhost.into(),
        ..Default::default()
    }
}

/// The bytes a client sends to connect with `handshake`, and the `frame_max` it asks for.
pub fn handshake_bytes(handshake: &Handshake) -> (Vec<u8>, u32) {
    let mut b = BytesMut::new();
    if *handshake == Handshake::BadHeader {
        b.extend_from_slice(b"AMQP\x01\x01\x00\x09");
        return (b.to_vec(), FRAME_MAX);
    }
    b.extend_from_slice(PROTOCOL_HEADER);
    if let Handshake::Raw(bytes) = handshake {
        b.extend_from_slice(bytes);
        return (b.to_vec(), FRAME_MAX);
    }
    let plain = Bytes::from_static(b"\0guest\0guest");
    let start = match handshake {
        Handshake::Amqplain => {
            let mut t = FieldTable::new();
            t.insert("LOGIN", long("guest"));
            t.insert("PASSWORD", long("guest"));
            let mut enc = BytesMut::new();
            warren_amqp::encode_table(&t, &mut enc);
            // AMQPLAIN's response is the table without its length prefix.
            start_ok("AMQPLAIN", Bytes::copy_from_slice(&enc[4..]))
        }
        Handshake::BadLogin => start_ok("PLAIN", Bytes::from_static(b"\0guest\0wrong")),
        Handshake::UnknownMechanism => start_ok("EXTERNAL", plain),
        _ => start_ok("PLAIN", plain),
    };
    encode_method_frame(0, &start.into(), &mut b);
    let tune = match *handshake {
        Handshake::Tune {
            channel_max,
            frame_max_256,
            heartbeat,
        } => ConnectionTuneOk {
            channel_max,
            frame_max: u32::from(frame_max_256) * 256,
            heartbeat: u16::from(heartbeat),
        },
        // The server's own channel_max: 0 ("no limit") is refused, as by RabbitMQ.
        _ => ConnectionTuneOk {
            channel_max: 2047,
            frame_max: FRAME_MAX,
            heartbeat: 0,
        },
    };
    let frame_max = match tune.frame_max {
        0 => FRAME_MAX,
        f => f,
    };
    encode_method_frame(0, &tune.into(), &mut b);
    let vhost = if *handshake == Handshake::UnknownVhost {
        "nope"
    } else {
        "/"
    };
    encode_method_frame(0, &open(vhost).into(), &mut b);
    (b.to_vec(), frame_max)
}

/// What the server sent on one connection, as seen by the harness.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnReport {
    /// Frames received.
    pub frames: usize,
    /// connection.open-ok was received.
    pub opened: bool,
    /// Deliveries (basic.deliver and basic.get-ok) received.
    pub deliveries: usize,
    /// basic.ack and basic.nack (publisher confirms) received.
    pub confirms: usize,
    /// basic.return received.
    pub returns: usize,
    /// Reply codes of channel.close frames received.
    pub channel_closes: Vec<u16>,
    /// Reply code of the connection.close received, if any.
    pub connection_close: Option<u16>,
    /// The server answered with its protocol header (it refused ours).
    pub protocol_header: bool,
}

/// What a session did, for tests that check the harness reaches where it should.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// One entry per connection.
    pub connections: Vec<ConnReport>,
    /// Queues left in vhost "/" once every connection ended, with their ready counts.
    pub queues: Vec<(String, u32)>,
}

/// Target `connection`: decodes `data` into a [`Session`] and runs it.
pub fn connection(data: &[u8]) {
    run(&Session::decode(data));
}

/// Runs `session` against a fresh in-memory broker (see the module docs for what is checked).
///
/// # Panics
/// On any of the failures listed in the module documentation.
pub fn run(session: &Session) -> Report {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    rt.block_on(drive(session))
}

struct Client {
    writer: Option<WriteHalf<DuplexStream>>,
    frame_max: u32,
    server: tokio::task::JoinHandle<()>,
    reader: tokio::task::JoinHandle<ConnReport>,
}

fn config() -> Config {
    let mut c = Config::default();
    c.amqp.frame_max = FRAME_MAX;
    c.log.level = "off".into();
    c
}

async fn connect(
    state: &Arc<ServerState>,
    shutdown: &watch::Receiver<bool>,
    handshake: &Handshake,
) -> Client {
    let (client, server) = tokio::io::duplex(64 * 1024);
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("literal address");
    let local: SocketAddr = "127.0.0.1:5672".parse().expect("literal address");
    let server = tokio::spawn(warren_server::connection::serve(
        state.clone(),
        server,
        peer,
        local,
        shutdown.clone(),
    ));
    let (rd, mut wr) = tokio::io::split(client);
    let (bytes, frame_max) = handshake_bytes(handshake);
    let reader = tokio::spawn(read_server(rd, frame_max));
    let writer = match tokio::time::timeout(HANG, wr.write_all(&bytes)).await {
        Ok(Ok(())) => Some(wr),
        Ok(Err(_)) => None,
        Err(_) => panic!("server stopped reading during the handshake"),
    };
    Client {
        writer,
        frame_max,
        server,
        reader,
    }
}

async fn drive(session: &Session) -> Report {
    let state = Arc::new(ServerState::new(config()).expect("an in-memory broker starts"));
    let (_shutdown_tx, shutdown) = watch::channel(false);
    let mut clients = vec![connect(&state, &shutdown, &session.handshake).await];
    if session.two_connections {
        clients.push(connect(&state, &shutdown, &Handshake::Plain).await);
    }
    settle().await;
    for op in &session.ops {
        let Some(client) = clients.get_mut(op.conn()) else {
            continue;
        };
        match op {
            Op::Wait { ms, .. } => tokio::time::sleep(Duration::from_millis(u64::from(*ms))).await,
            Op::Sweep { .. } => state.broker.sweep(),
            Op::Disconnect { .. } => {
                if let Some(mut w) = client.writer.take() {
                    let _ = w.shutdown().await;
                }
            }
            _ => {
                if let Some(w) = client.writer.as_mut() {
                    let bytes = op_bytes(op, client.frame_max);
                    match tokio::time::timeout(HANG, w.write_all(&bytes)).await {
                        Ok(Ok(())) => {}
                        // The server closed the connection.
                        Ok(Err(_)) => client.writer = None,
                        Err(_) => panic!("server stopped reading for {HANG:?} (at {op:?})"),
                    }
                }
            }
        }
        settle().await;
    }
    let mut report = Report::default();
    for mut client in clients {
        if let Some(mut w) = client.writer.take() {
            let _ = w.shutdown().await;
        }
        if tokio::time::timeout(HANG, &mut client.server)
            .await
            .is_err()
        {
            panic!("connection did not end {HANG:?} after its client went away");
        }
        match tokio::time::timeout(HANG, client.reader).await {
            Ok(Ok(r)) => report.connections.push(r),
            Ok(Err(e)) => std::panic::resume_unwind(e.into_panic()),
            Err(_) => panic!("server kept its socket open after its connection ended"),
        }
    }
    let vhost = state.broker.vhost("/").expect("vhost / exists");
    for q in vhost.queues() {
        let c = q.counts();
        assert_eq!(
            c.consumers,
            0,
            "queue {} has consumers of closed connections",
            q.name()
        );
        assert_eq!(
            c.unacked,
            0,
            "queue {} has unacked messages of closed connections",
            q.name()
        );
        assert!(
            q.exclusive_owner().is_none(),
            "exclusive queue {} outlived its connection",
            q.name()
        );
        report.queues.push((q.name().to_string(), c.ready));
    }
    report.queues.sort();
    state.broker.close();
    report
}

/// Lets every task run until all wait (the server has processed what it was sent).
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

/// Content the reader expects next on a channel: a header, then this many body bytes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    Method,
    Header,
    Body(u64),
}

/// Reads and checks everything the server sends until it closes the stream.
async fn read_server(mut rd: ReadHalf<DuplexStream>, frame_max: u32) -> ConnReport {
    let mut report = ConnReport::default();
    let mut buf = BytesMut::new();
    let mut expect: HashMap<u16, Expect> = HashMap::new();
    let mut tags: HashMap<u16, u64> = HashMap::new();
    let mut limit = FRAME_MAX;
    let mut started = false;
    loop {
        if !started && buf.len() >= 8 {
            started = true;
            if buf.starts_with(b"AMQP") {
                report.protocol_header = true;
                let _ = buf.split_to(8);
            }
        }
        if started {
            let limits = Limits {
                frame_max: 0,
                max_table_depth: 16,
            };
            loop {
                // The announced size is checked before the frame is whole: an oversized
                // frame must never be sent, even in part.
                if let Some(h) = buf.first_chunk::<7>() {
                    let size = u64::from(u32::from_be_bytes([h[3], h[4], h[5], h[6]])) + 8;
                    assert!(
                        size <= u64::from(limit),
                        "server sent a frame of {size} bytes above frame_max {limit}"
                    );
                }
                let frame = match parse_frame(&mut buf, &limits) {
                    Ok(Some(f)) => f,
                    Ok(None) => break,
                    Err(e) => panic!("server sent a malformed frame: {e}"),
                };
                report.frames += 1;
                check_frame(&frame, &mut report, &mut expect, &mut tags);
                if matches!(
                    frame,
                    Frame::Method {
                        method: Method::ConnectionOpenOk(_),
                        ..
                    }
                ) {
                    report.opened = true;
                    limit = frame_max;
                }
            }
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    report
}

fn check_frame(
    frame: &Frame,
    report: &mut ConnReport,
    expect: &mut HashMap<u16, Expect>,
    tags: &mut HashMap<u16, u64>,
) {
    let ch = frame.channel();
    let state = expect.get(&ch).copied().unwrap_or(Expect::Method);
    match frame {
        Frame::Method { method, .. } => {
            assert_eq!(
                state,
                Expect::Method,
                "server sent {} on channel {ch} inside content",
                method.name()
            );
            let carries_content = matches!(
                method,
                Method::BasicDeliver(_) | Method::BasicGetOk(_) | Method::BasicReturn(_)
            );
            if carries_content {
                expect.insert(ch, Expect::Header);
            }
            let tag = match method {
                Method::BasicDeliver(d) => Some(d.delivery_tag),
                Method::BasicGetOk(g) => Some(g.delivery_tag),
                _ => None,
            };
            if let Some(tag) = tag {
                report.deliveries += 1;
                let last = tags.entry(ch).or_insert(0);
                assert_eq!(
                    tag,
                    *last + 1,
                    "delivery tags on channel {ch} do not count up by one"
                );
                *last = tag;
            }
            match method {
                Method::BasicAck(_) | Method::BasicNack(_) => report.confirms += 1,
                Method::BasicReturn(_) => report.returns += 1,
                Method::ChannelOpenOk(_) => {
                    tags.remove(&ch);
                }
                Method::ChannelClose(c) => report.channel_closes.push(c.reply_code),
                Method::ConnectionClose(c) => report.connection_close = Some(c.reply_code),
                _ => {}
            }
        }
        Frame::Header { body_size, .. } => {
            assert_eq!(
                state,
                Expect::Header,
                "server sent a content header on channel {ch} without a content method"
            );
            if *body_size == 0 {
                expect.remove(&ch);
            } else {
                expect.insert(ch, Expect::Body(*body_size));
            }
        }
        Frame::Body { payload, .. } => {
            let Expect::Body(left) = state else {
                panic!("server sent a content body on channel {ch} without a header");
            };
            let n = payload.len() as u64;
            assert!(
                n <= left,
                "server sent {n} body bytes on channel {ch}, {left} announced"
            );
            if n == left {
                expect.remove(&ch);
            } else {
                expect.insert(ch, Expect::Body(left - n));
            }
        }
        Frame::Heartbeat { .. } => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deliver(tag: u64) -> Frame {
        Frame::Method {
            channel: 1,
            method: BasicDeliver {
                delivery_tag: tag,
                ..Default::default()
            }
            .into(),
        }
    }

    fn header(size: u64) -> Frame {
        Frame::Header {
            channel: 1,
            class_id: CLASS_BASIC,
            weight: 0,
            body_size: size,
            properties: BasicProperties::default(),
        }
    }

    fn body(n: usize) -> Frame {
        Frame::Body {
            channel: 1,
            payload: Bytes::from(vec![0; n]),
        }
    }

    /// Feeds frames to the reader's checks; true when they accept the sequence.
    fn accepts(frames: Vec<Frame>) -> bool {
        std::panic::catch_unwind(|| {
            let (mut report, mut expect, mut tags) = Default::default();
            for f in &frames {
                check_frame(f, &mut report, &mut expect, &mut tags);
            }
        })
        .is_ok()
    }

    #[test]
    fn server_output_checks() {
        assert!(accepts(vec![
            deliver(1),
            header(3),
            body(2),
            body(1),
            deliver(2),
            header(0)
        ]));
        // A method inside content.
        assert!(!accepts(vec![deliver(1), header(3), body(2), deliver(2)]));
        // More body than announced.
        assert!(!accepts(vec![deliver(1), header(3), body(4)]));
        // A body without a header, a header without a method.
        assert!(!accepts(vec![deliver(1), body(1)]));
        assert!(!accepts(vec![header(1)]));
        // Delivery tags must count up by one.
        assert!(!accepts(vec![deliver(1), header(0), deliver(3), header(0)]));
    }
}
