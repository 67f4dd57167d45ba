//! The seed corpus: valid sessions (handshake, declare, publish with content, consume, ack,
//! close, and the other paths a client takes) and the frames, method payloads and tables they
//! are made of. `cargo run -p warren-fuzz --example seed_corpus` writes them to
//! `fuzz/corpus/<target>/seed-*`; the fuzzer grows the corpus from there.

use crate::session::{self, args_table, handshake_bytes, op_bytes, props, Handshake, Op, Session};
use bytes::{Bytes, BytesMut};
use warren_amqp::frame::{encode_method_frame, parse_frame, Frame, Limits};
use warren_amqp::generated::*;
use warren_amqp::table::{encode_table, FieldTable, FieldValue};
use warren_amqp::Method;

// Pool indexes used below (see session::QUEUES, EXCHANGES, KINDS, KEYS, TAGS).
const Q0: u8 = 0;
const Q1: u8 = 1;
const Q2: u8 = 2;
const DLQ: u8 = 4;
const REPLY_TO: u8 = 6;
const DEFAULT_X: u8 = 0;
const FANOUT_X: u8 = 2;
const E0: u8 = 5;
const DLX: u8 = 7;
const TOPIC: u8 = 2;
const KEY_Q0: u8 = 0;
const KEY_Q1: u8 = 1;
const KEY_DLQ: u8 = 3;
const KEY_ABC: u8 = 4;
const KEY_A_STAR: u8 = 5;
const TAG_C0: u8 = 1;
const TAG_C1: u8 = 2;
const CH1: u8 = 1;
const CH2: u8 = 2;

fn open(ch: u8) -> Op {
    Op::ChannelOpen { conn: 0, ch }
}
fn declare(queue: u8, flags: u8, args: u8) -> Op {
    Op::QueueDeclare {
        conn: 0,
        ch: CH1,
        queue,
        flags,
        args,
    }
}
fn publish(exchange: u8, key: u8, props: u8, size: u16) -> Op {
    Op::Publish {
        conn: 0,
        ch: CH1,
        exchange,
        key,
        flags: 0,
        props,
        size,
        split: 0,
    }
}
fn consume(queue: u8, tag: u8, flags: u8) -> Op {
    Op::Consume {
        conn: 0,
        ch: CH1,
        queue,
        tag,
        flags,
        args: 0,
    }
}
fn ack(tag: u8, multiple: bool) -> Op {
    Op::Ack {
        conn: 0,
        ch: CH1,
        tag,
        multiple,
    }
}
fn close_channel() -> Op {
    Op::ChannelClose { conn: 0, ch: CH1 }
}
fn close() -> Op {
    Op::Connection { conn: 0, which: 0 }
}
fn on(conn: u8, mut op: Op) -> Op {
    use Op::*;
    match &mut op {
        ChannelOpen { conn: c, .. }
        | QueueDeclare { conn: c, .. }
        | Publish { conn: c, .. }
        | Consume { conn: c, .. }
        | Ack { conn: c, .. }
        | Disconnect { conn: c }
        | Connection { conn: c, .. } => *c = conn,
        _ => {}
    }
    op
}

fn session(handshake: Handshake, ops: Vec<Op>) -> Session {
    Session {
        handshake,
        two_connections: false,
        ops,
    }
}

/// Named seed sessions for the `connection` target.
pub fn sessions() -> Vec<(&'static str, Session)> {
    use Handshake::*;
    let basic = |ops: Vec<Op>| {
        let mut all = vec![open(CH1)];
        all.extend(ops);
        all.push(close_channel());
        all.push(close());
        session(Plain, all)
    };
    let mut two = session(
        Plain,
        vec![
            open(CH1),
            on(1, open(CH1)),
            // Connection 0 owns an exclusive queue; connection 1 may not use it.
            declare(Q0, 0b100, 0),
            on(1, consume(Q0, TAG_C0, 0)),
            consume(Q0, TAG_C0, 0),
            on(1, publish(DEFAULT_X, KEY_Q0, 0, 10)),
            on(1, publish(DEFAULT_X, KEY_Q0, 1, 10)),
            // Dropped with two unacked deliveries: they go back, then the queue goes.
            Op::Disconnect { conn: 0 },
            Op::ChannelCloseOk { conn: 1, ch: CH1 },
            on(1, open(CH1)),
            on(1, declare(Q1, 0, 0)),
            on(1, close()),
        ],
    );
    two.two_connections = true;
    vec![
        ("handshake-close", session(Plain, vec![close()])),
        (
            "handshake-amqplain",
            session(Amqplain, vec![open(CH1), close()]),
        ),
        (
            "declare-publish-get-ack",
            basic(vec![
                declare(Q0, 0, 0),
                publish(DEFAULT_X, KEY_Q0, 0, 100),
                Op::Get {
                    conn: 0,
                    ch: CH1,
                    queue: Q0,
                    no_ack: false,
                },
                ack(1, false),
            ]),
        ),
        (
            "consume-ack",
            basic(vec![
                declare(Q0, 0, 0),
                Op::Qos {
                    conn: 0,
                    ch: CH1,
                    prefetch: 10,
                    global: false,
                },
                consume(Q0, TAG_C0, 0),
                publish(DEFAULT_X, KEY_Q0, 0, 1),
                publish(DEFAULT_X, KEY_Q0, 13, 200),
                publish(DEFAULT_X, KEY_Q0, 0, 0),
                ack(1, false),
                ack(3, true),
                Op::Cancel {
                    conn: 0,
                    ch: CH1,
                    tag: TAG_C0,
                    nowait: false,
                },
            ]),
        ),
        (
            "confirms-mandatory-return",
            basic(vec![
                Op::ConfirmSelect {
                    conn: 0,
                    ch: CH1,
                    nowait: false,
                },
                declare(Q1, 0b10, 0),
                publish(DEFAULT_X, KEY_Q1, 1, 50),
                Op::Publish {
                    conn: 0,
                    ch: CH1,
                    exchange: DEFAULT_X,
                    key: KEY_ABC,
                    flags: 1,
                    props: 0,
                    size: 5,
                    split: 0,
                },
            ]),
        ),
        (
            "nack-reject-recover",
            basic(vec![
                declare(Q0, 0, 0),
                consume(Q0, TAG_C0, 0),
                publish(DEFAULT_X, KEY_Q0, 0, 10),
                publish(DEFAULT_X, KEY_Q0, 0, 10),
                publish(DEFAULT_X, KEY_Q0, 0, 10),
                Op::Nack {
                    conn: 0,
                    ch: CH1,
                    tag: 1,
                    flags: 0b10,
                },
                Op::Reject {
                    conn: 0,
                    ch: CH1,
                    tag: 2,
                    requeue: false,
                },
                Op::Recover {
                    conn: 0,
                    ch: CH1,
                    requeue: true,
                    async_: false,
                },
            ]),
        ),
        (
            "tx-commit-rollback",
            basic(vec![
                declare(Q0, 0, 0),
                Op::Tx {
                    conn: 0,
                    ch: CH1,
                    which: 0,
                },
                publish(DEFAULT_X, KEY_Q0, 0, 10),
                Op::Tx {
                    conn: 0,
                    ch: CH1,
                    which: 1,
                },
                publish(DEFAULT_X, KEY_Q0, 0, 10),
                Op::Tx {
                    conn: 0,
                    ch: CH1,
                    which: 2,
                },
                Op::Get {
                    conn: 0,
                    ch: CH1,
                    queue: Q0,
                    no_ack: true,
                },
            ]),
        ),
        (
            "ttl-dead-letter",
            basic(vec![
                declare(DLQ, 0, 0),
                Op::ExchangeDeclare {
                    conn: 0,
                    ch: CH1,
                    exchange: DLX,
                    kind: 1,
                    flags: 0,
                    args: 0,
                },
                Op::QueueBind {
                    conn: 0,
                    ch: CH1,
                    queue: DLQ,
                    exchange: DLX,
                    key: KEY_DLQ,
                    unbind: false,
                    args: 0,
                },
                declare(Q0, 0, 7),
                publish(DEFAULT_X, KEY_Q0, 0, 10),
                publish(DEFAULT_X, KEY_Q0, 3, 10),
                Op::Wait { conn: 0, ms: 30 },
                Op::Sweep { conn: 0 },
                Op::Get {
                    conn: 0,
                    ch: CH1,
                    queue: DLQ,
                    no_ack: true,
                },
            ]),
        ),
        (
            "max-length-reject-publish",
            basic(vec![
                Op::ConfirmSelect {
                    conn: 0,
                    ch: CH1,
                    nowait: false,
                },
                declare(Q1, 0, 4),
                publish(DEFAULT_X, KEY_Q1, 0, 1),
                publish(DEFAULT_X, KEY_Q1, 0, 1),
                publish(DEFAULT_X, KEY_Q1, 0, 1),
                Op::QueuePurge {
                    conn: 0,
                    ch: CH1,
                    queue: Q1,
                    nowait: false,
                },
                Op::QueueDelete {
                    conn: 0,
                    ch: CH1,
                    queue: Q1,
                    flags: 0,
                },
            ]),
        ),
        (
            "topic-fanout-bindings",
            basic(vec![
                Op::ExchangeDeclare {
                    conn: 0,
                    ch: CH1,
                    exchange: E0,
                    kind: TOPIC,
                    flags: 0,
                    args: 19,
                },
                declare(Q0, 0, 0),
                declare(Q2, 0, 0),
                Op::QueueBind {
                    conn: 0,
                    ch: CH1,
                    queue: Q0,
                    exchange: E0,
                    key: KEY_A_STAR,
                    unbind: false,
                    args: 0,
                },
                Op::ExchangeBind {
                    conn: 0,
                    ch: CH1,
                    destination: FANOUT_X,
                    source: E0,
                    key: 6,
                    unbind: false,
                    args: 0,
                },
                Op::QueueBind {
                    conn: 0,
                    ch: CH1,
                    queue: Q2,
                    exchange: FANOUT_X,
                    key: KEY_Q0,
                    unbind: false,
                    args: 0,
                },
                publish(E0, KEY_ABC, 7, 20),
                publish(E0, KEY_A_STAR, 6, 20),
                Op::QueueBind {
                    conn: 0,
                    ch: CH1,
                    queue: Q0,
                    exchange: E0,
                    key: KEY_A_STAR,
                    unbind: true,
                    args: 0,
                },
                Op::ExchangeDelete {
                    conn: 0,
                    ch: CH1,
                    exchange: E0,
                    flags: 0,
                },
            ]),
        ),
        (
            "content-split-small-frames",
            session(
                Tune {
                    channel_max: 16,
                    frame_max_256: 16,
                    heartbeat: 0,
                },
                vec![
                    open(CH1),
                    declare(Q0, 0, 0),
                    consume(Q0, TAG_C0, 0b10),
                    Op::Publish {
                        conn: 0,
                        ch: CH1,
                        exchange: DEFAULT_X,
                        key: KEY_Q0,
                        flags: 0,
                        props: 13,
                        size: 10_000,
                        split: 100,
                    },
                    publish(DEFAULT_X, KEY_Q0, 0, 9000),
                    close(),
                ],
            ),
        ),
        (
            "content-out-of-order",
            basic(vec![
                Op::PublishMethod {
                    conn: 0,
                    ch: CH1,
                    exchange: DEFAULT_X,
                    key: KEY_Q0,
                },
                Op::Body {
                    conn: 0,
                    ch: CH1,
                    size: 10,
                },
                open(CH2),
                Op::Header {
                    conn: 0,
                    ch: CH2,
                    class: 0,
                    size: 3,
                    props: 0,
                },
                Op::Publish {
                    conn: 0,
                    ch: CH1,
                    exchange: DEFAULT_X,
                    key: KEY_Q0,
                    flags: 0b100,
                    props: 0,
                    size: 10,
                    split: 0,
                },
            ]),
        ),
        (
            "channel-error-reopen",
            basic(vec![
                consume(Q2, TAG_C1, 0),
                Op::ChannelCloseOk { conn: 0, ch: CH1 },
                open(CH1),
                declare(Q2, 0, 0),
                Op::ChannelFlow {
                    conn: 0,
                    ch: CH1,
                    active: false,
                },
                Op::Heartbeat {
                    conn: 0,
                    ch: 0,
                    on_channel: false,
                },
            ]),
        ),
        (
            "reply-to-priority",
            basic(vec![
                consume(REPLY_TO, TAG_C0, 0b10),
                declare(Q0, 0, 9),
                publish(DEFAULT_X, KEY_Q0, 8, 10),
                publish(DEFAULT_X, KEY_Q0, 5, 10),
                Op::Get {
                    conn: 0,
                    ch: CH1,
                    queue: Q0,
                    no_ack: true,
                },
            ]),
        ),
        (
            "disconnect-with-unacked",
            session(
                Plain,
                vec![
                    open(CH1),
                    declare(Q0, 0, 0),
                    consume(Q0, TAG_C0, 0),
                    publish(DEFAULT_X, KEY_Q0, 0, 10),
                    publish(DEFAULT_X, KEY_Q0, 0, 10),
                    Op::Disconnect { conn: 0 },
                ],
            ),
        ),
        ("two-connections-exclusive", two),
        (
            "heartbeat-timeout",
            session(
                Tune {
                    channel_max: 2047,
                    frame_max_256: 512,
                    heartbeat: 1,
                },
                [open(CH1)]
                    .into_iter()
                    .chain((0..10).map(|_| Op::Wait { conn: 0, ms: 255 }))
                    .collect(),
            ),
        ),
        ("bad-login", session(BadLogin, vec![])),
        ("unknown-mechanism", session(UnknownMechanism, vec![])),
        ("unknown-vhost", session(UnknownVhost, vec![])),
        ("bad-header", session(BadHeader, vec![])),
    ]
}

/// Methods the server sends (the client side of the corpus comes from the sessions).
fn server_methods() -> Vec<Method> {
    let mut caps = FieldTable::new();
    caps.insert("publisher_confirms", FieldValue::Bool(true));
    let mut server_properties = FieldTable::new();
    server_properties.insert("capabilities", FieldValue::Table(caps));
    server_properties.insert(
        "product",
        FieldValue::LongString(Bytes::from_static(b"Warren")),
    );
    vec![
        ConnectionStart {
            version_major: 0,
            version_minor: 9,
            server_properties,
            mechanisms: Bytes::from_static(b"PLAIN AMQPLAIN"),
            locales: Bytes::from_static(b"en_US"),
        }
        .into(),
        ConnectionTune {
            channel_max: 2047,
            frame_max: 131_072,
            heartbeat: 60,
        }
        .into(),
        ConnectionOpenOk::default().into(),
        ChannelOpenOk::default().into(),
        QueueDeclareOk {
            queue: "amq.gen-abc".into(),
            message_count: 3,
            consumer_count: 1,
        }
        .into(),
        BasicConsumeOk {
            consumer_tag: "amq.ctag-x".into(),
        }
        .into(),
        BasicDeliver {
            consumer_tag: "c0".into(),
            delivery_tag: 7,
            redelivered: true,
            exchange: "amq.direct".into(),
            routing_key: "q0".into(),
        }
        .into(),
        BasicGetOk {
            delivery_tag: 1,
            redelivered: false,
            exchange: String::new(),
            routing_key: "q0".into(),
            message_count: 2,
        }
        .into(),
        BasicGetEmpty::default().into(),
        BasicReturn {
            reply_code: 312,
            reply_text: "NO_ROUTE".into(),
            exchange: String::new(),
            routing_key: "nowhere".into(),
        }
        .into(),
        BasicNack {
            delivery_tag: 4,
            multiple: true,
            requeue: false,
        }
        .into(),
        ChannelClose {
            reply_code: 404,
            reply_text: "NOT_FOUND - no queue 'q2' in vhost '/'".into(),
            class_id: 60,
            method_id: 20,
        }
        .into(),
        ConnectionBlocked {
            reason: "low on disk".into(),
        }
        .into(),
    ]
}

/// Every frame a seed session's clients send, and the server methods, as frames.
fn seed_frames() -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let limits = Limits::new(0);
    for (_, s) in sessions() {
        let (hs, frame_max) = handshake_bytes(&s.handshake);
        let mut stream = BytesMut::from(hs.get(8..).unwrap_or(&[]));
        for op in &s.ops {
            stream.extend_from_slice(&op_bytes(op, frame_max));
        }
        loop {
            let before = stream.clone();
            match parse_frame(&mut stream, &limits) {
                Ok(Some(_)) => frames.push(before[..before.len() - stream.len()].to_vec()),
                _ => break,
            }
        }
    }
    for m in server_methods() {
        let mut b = BytesMut::new();
        encode_method_frame(1, &m, &mut b);
        frames.push(b.to_vec());
    }
    frames
}

/// The seed files of `target`, as (file name, contents).
pub fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let files: Vec<Vec<u8>> = match target {
        "connection" => {
            return sessions()
                .into_iter()
                .map(|(name, s)| (format!("seed-{name}"), s.encode()))
                .collect()
        }
        "frame_reader" => {
            // Whole client streams (all frames after the protocol header).
            let mut files: Vec<Vec<u8>> = sessions()
                .into_iter()
                .map(|(_, s)| {
                    let (hs, frame_max) = handshake_bytes(&s.handshake);
                    let mut b = hs.get(8..).unwrap_or(&[]).to_vec();
                    for op in &s.ops {
                        b.extend_from_slice(&op_bytes(op, frame_max));
                    }
                    b
                })
                .collect();
            // Server frames, which no client stream holds.
            for m in server_methods() {
                let mut b = BytesMut::new();
                encode_method_frame(1, &m, &mut b);
                files.push(b.to_vec());
            }
            files
        }
        "method_decode" => seed_frames()
            .into_iter()
            .filter(|f| f.first() == Some(&1))
            .map(|f| f[7..f.len() - 1].to_vec())
            .collect(),
        "table_decode" => {
            let mut files = Vec::new();
            for i in 0..session::ARGS_COUNT {
                let mut b = BytesMut::new();
                encode_table(&args_table(i), &mut b);
                files.push(b.to_vec());
            }
            for i in 0..session::PROPS_COUNT {
                let mut b = BytesMut::new();
                props(i).encode(&mut b);
                files.push(b.to_vec());
            }
            for f in seed_frames() {
                let mut buf = BytesMut::from(&f[..]);
                if let Ok(Some(Frame::Method {
                    method: Method::ConnectionStartOk(s),
                    ..
                })) = parse_frame(&mut buf, &Limits::new(0))
                {
                    let mut b = BytesMut::new();
                    encode_table(&s.client_properties, &mut b);
                    files.push(b.to_vec());
                }
            }
            files
        }
        _ => Vec::new(),
    };
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for f in files {
        let name = format!("seed-{:016x}", fnv1a(&f));
        if !out.iter().any(|(n, _)| *n == name) {
            out.push((name, f));
        }
    }
    out
}

/// FNV-1a, 64 bits: stable names for seed files.
fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
