//! Raw-socket protocol tests: frames built and parsed with the `warren-amqp` codec, for the
//! behaviour client libraries never let a test provoke (bad headers, malformed frames, protocol
//! violations). RabbitMQ's replies — codes, texts, class and method ids — are the reference.

use bytes::{BufMut, BytesMut};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;
use warren_amqp::frame::{
    encode_body_frames, encode_header_frame, encode_heartbeat, encode_method_frame, parse_frame,
    Frame, Limits, FRAME_BODY, FRAME_END, FRAME_METHOD, PROTOCOL_HEADER,
};
use warren_amqp::generated::*;
use warren_amqp::table::{encode_table, FieldTable, FieldValue};
use warren_amqp::{BasicProperties, Bytes, Method};
use warren_server::{Broker, Config, RunningBroker};

/// Upper bound for any single wait on the broker.
const WAIT: Duration = Duration::from_secs(5);

async fn broker() -> RunningBroker {
    broker_with(Config::default()).await
}

async fn broker_with(cfg: Config) -> RunningBroker {
    timeout(
        WAIT,
        Broker::builder().config(cfg).bind("127.0.0.1:0").start(),
    )
    .await
    .expect("broker start timed out")
    .expect("broker start")
}

async fn stop(b: RunningBroker) {
    timeout(Duration::from_secs(20), b.shutdown())
        .await
        .expect("broker shutdown timed out");
}

/// A client speaking raw frames.
struct Raw {
    sock: TcpStream,
    buf: BytesMut,
    frame_max: u32,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Raw {
        let sock = timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("connect timed out")
            .expect("connect");
        Raw {
            sock,
            buf: BytesMut::new(),
            frame_max: 131_072,
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        timeout(WAIT, self.sock.write_all(bytes))
            .await
            .expect("write timed out")
            .expect("write");
    }

    async fn send(&mut self, channel: u16, m: impl Into<Method>) {
        let mut b = BytesMut::new();
        encode_method_frame(channel, &m.into(), &mut b);
        self.write(&b).await;
    }

    /// basic.publish with its content header and body frames, in one write.
    async fn publish(&mut self, channel: u16, exchange: &str, routing_key: &str, body: &[u8]) {
        let mut b = BytesMut::new();
        encode_method_frame(
            channel,
            &Method::BasicPublish(BasicPublish {
                exchange: exchange.into(),
                routing_key: routing_key.into(),
                ..Default::default()
            }),
            &mut b,
        );
        encode_header_frame(
            channel,
            60,
            body.len() as u64,
            &BasicProperties::default(),
            &mut b,
        );
        encode_body_frames(channel, body, self.frame_max, &mut b);
        self.write(&b).await;
    }

    /// The next frame, heartbeats included; `None` once the broker closed the socket.
    async fn next_frame_within(&mut self, limit: Duration) -> Option<Frame> {
        timeout(limit, async {
            loop {
                if let Some(f) = parse_frame(&mut self.buf, &Limits::new(0))
                    .expect("the broker sent a malformed frame")
                {
                    return Some(f);
                }
                match self.sock.read_buf(&mut self.buf).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("timed out waiting for the broker")
    }

    async fn next_frame(&mut self) -> Option<Frame> {
        self.next_frame_within(WAIT).await
    }

    /// The next frame that is not a heartbeat.
    async fn recv(&mut self) -> Frame {
        loop {
            match self.next_frame().await {
                Some(Frame::Heartbeat { .. }) => continue,
                Some(f) => return f,
                None => panic!("the broker closed the connection"),
            }
        }
    }

    async fn recv_method(&mut self, channel: u16) -> Method {
        match self.recv().await {
            Frame::Method { channel: c, method } if c == channel => method,
            other => panic!("expected a method on channel {channel}, got {other:?}"),
        }
    }

    /// Waits for the broker to close the socket, ignoring heartbeats.
    async fn expect_eof(&mut self) {
        loop {
            match self.next_frame().await {
                None => return,
                Some(Frame::Heartbeat { .. }) => {}
                Some(f) => panic!("expected the socket to close, got {f:?}"),
            }
        }
    }

    /// True when nothing but heartbeats arrives for `d` and the socket stays open.
    async fn quiet_for(&mut self, d: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + d;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return true;
            }
            let read = async {
                loop {
                    if let Some(f) = parse_frame(&mut self.buf, &Limits::new(0))
                        .expect("the broker sent a malformed frame")
                    {
                        return Some(f);
                    }
                    match self.sock.read_buf(&mut self.buf).await {
                        Ok(0) | Err(_) => return None,
                        Ok(_) => {}
                    }
                }
            };
            match timeout(left, read).await {
                Err(_) => return true,
                Ok(Some(Frame::Heartbeat { .. })) => {}
                Ok(_) => return false,
            }
        }
    }

    async fn open_channel(&mut self, channel: u16) {
        self.send(channel, ChannelOpen::default()).await;
        match self.recv_method(channel).await {
            Method::ChannelOpenOk(_) => {}
            m => panic!("expected channel.open-ok, got {m:?}"),
        }
    }

    async fn declare_queue(&mut self, channel: u16, name: &str) {
        self.send(
            channel,
            QueueDeclare {
                queue: name.into(),
                ..Default::default()
            },
        )
        .await;
        match self.recv_method(channel).await {
            Method::QueueDeclareOk(ok) => assert_eq!(ok.queue, name),
            m => panic!("expected queue.declare-ok, got {m:?}"),
        }
    }

    /// Expects connection.close with this code, class and method; returns its reply text.
    async fn expect_connection_close(
        &mut self,
        code: u16,
        class_id: u16,
        method_id: u16,
    ) -> String {
        match self.recv_method(0).await {
            Method::ConnectionClose(c) => {
                assert_eq!(
                    (c.reply_code, c.class_id, c.method_id),
                    (code, class_id, method_id),
                    "connection.close was {c:?}"
                );
                c.reply_text
            }
            m => panic!("expected connection.close, got {m:?}"),
        }
    }

    /// After a server connection.close: the broker keeps the socket open until close-ok, then
    /// closes it.
    async fn finish_server_close(&mut self) {
        assert!(
            self.quiet_for(Duration::from_millis(300)).await,
            "the broker must wait for connection.close-ok"
        );
        self.send(0, ConnectionCloseOk {}).await;
        self.expect_eof().await;
    }
}

fn client_properties() -> FieldTable {
    let mut caps = FieldTable::new();
    caps.insert("authentication_failure_close", FieldValue::Bool(true));
    caps.insert("consumer_cancel_notify", FieldValue::Bool(true));
    caps.insert("connection.blocked", FieldValue::Bool(true));
    let mut t = FieldTable::new();
    t.insert("capabilities", FieldValue::Table(caps));
    t.insert(
        "product",
        FieldValue::LongString(Bytes::from_static(b"raw")),
    );
    t
}

fn plain(user: &str, pass: &str) -> Bytes {
    Bytes::from(format!("\0{user}\0{pass}").into_bytes())
}

/// AMQPLAIN: a field table without its 4-byte length prefix.
fn amqplain(user: &str, pass: &str) -> Bytes {
    let mut t = FieldTable::new();
    t.insert(
        "LOGIN",
        FieldValue::LongString(Bytes::copy_from_slice(user.as_bytes())),
    );
    t.insert(
        "PASSWORD",
        FieldValue::LongString(Bytes::copy_from_slice(pass.as_bytes())),
    );
    let mut b = BytesMut::new();
    encode_table(&t, &mut b);
    Bytes::copy_from_slice(&b[4..])
}

/// Sends the protocol header and returns connection.start.
async fn start(addr: SocketAddr) -> (Raw, ConnectionStart) {
    let mut raw = Raw::connect(addr).await;
    raw.write(PROTOCOL_HEADER).await;
    match raw.recv_method(0).await {
        Method::ConnectionStart(s) => (raw, s),
        m => panic!("expected connection.start, got {m:?}"),
    }
}

async fn start_ok(raw: &mut Raw, mechanism: &str, response: Bytes) {
    raw.send(
        0,
        ConnectionStartOk {
            client_properties: client_properties(),
            mechanism: mechanism.into(),
            response,
            locale: "en_US".into(),
        },
    )
    .await;
}

async fn expect_tune(raw: &mut Raw) -> ConnectionTune {
    match raw.recv_method(0).await {
        Method::ConnectionTune(t) => t,
        m => panic!("expected connection.tune, got {m:?}"),
    }
}

/// tune-ok with these values, then connection.open of `vhost`; returns the broker's answer.
async fn tune_and_open(raw: &mut Raw, tune_ok: ConnectionTuneOk, vhost: &str) -> Method {
    raw.frame_max = tune_ok.frame_max;
    raw.send(0, tune_ok).await;
    raw.send(
        0,
        ConnectionOpen {
            virtual_host: vhost.into(),
            ..Default::default()
        },
    )
    .await;
    raw.recv_method(0).await
}

/// A fully opened connection (guest/guest, PLAIN, vhost "/") with the given tune-ok values.
async fn open_with(addr: SocketAddr, channel_max: u16, frame_max: u32, heartbeat: u16) -> Raw {
    let (mut raw, _) = start(addr).await;
    start_ok(&mut raw, "PLAIN", plain("guest", "guest")).await;
    expect_tune(&mut raw).await;
    let tune_ok = ConnectionTuneOk {
        channel_max,
        frame_max,
        heartbeat,
    };
    match tune_and_open(&mut raw, tune_ok, "/").await {
        Method::ConnectionOpenOk(_) => raw,
        m => panic!("expected connection.open-ok, got {m:?}"),
    }
}

/// An opened connection without heartbeats and with channel 1 open.
async fn open(addr: SocketAddr) -> Raw {
    let mut raw = open_with(addr, 2047, 131_072, 0).await;
    raw.open_channel(1).await;
    raw
}

fn raw_frame(kind: u8, channel: u16, payload: &[u8], end: u8) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_u8(kind);
    b.put_u16(channel);
    b.put_u32(payload.len() as u32);
    b.put_slice(payload);
    b.put_u8(end);
    b.to_vec()
}

// ---------------------------------------------------------------------------------------------
// Protocol header and connection.start

#[tokio::test]
async fn wrong_protocol_header_gets_ours_back_and_close() {
    let b = broker().await;
    for header in [
        &b"AMQP\x00\x00\x08\x00"[..],
        b"AMQP\x01\x01\x00\x0a",
        b"GET / HTTP/1.1\r\n",
    ] {
        let mut raw = Raw::connect(b.amqp_addr()).await;
        raw.write(header).await;
        let mut got = Vec::new();
        timeout(WAIT, raw.sock.read_to_end(&mut got))
            .await
            .expect("the broker must close the socket")
            .expect("read");
        assert_eq!(got, PROTOCOL_HEADER, "for header {header:?}");
    }
    stop(b).await;
}

#[tokio::test]
async fn connection_start_advertises_version_capabilities_and_mechanisms() {
    let b = broker().await;
    let (_raw, s) = start(b.amqp_addr()).await;
    assert_eq!((s.version_major, s.version_minor), (0, 9));
    let caps = s
        .server_properties
        .get("capabilities")
        .and_then(|c| c.as_table())
        .expect("capabilities table");
    for cap in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "authentication_failure_close",
        "per_consumer_qos",
    ] {
        assert_eq!(
            caps.get(cap).and_then(|v| v.as_bool()),
            Some(true),
            "capability {cap}"
        );
    }
    for key in ["product", "version", "platform"] {
        assert!(
            s.server_properties
                .get(key)
                .and_then(|v| v.as_str())
                .is_some_and(|v| !v.is_empty()),
            "server property {key}"
        );
    }
    let mechanisms = std::str::from_utf8(&s.mechanisms).unwrap();
    let mechanisms: Vec<&str> = mechanisms.split(' ').collect();
    assert!(mechanisms.contains(&"PLAIN"), "{mechanisms:?}");
    assert!(mechanisms.contains(&"AMQPLAIN"), "{mechanisms:?}");
    assert!(std::str::from_utf8(&s.locales).unwrap().contains("en_US"));
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Login, tuning, vhost

#[tokio::test]
async fn plain_login_default_tune_and_client_close_handshake() {
    let b = broker().await;
    let (mut raw, _) = start(b.amqp_addr()).await;
    start_ok(&mut raw, "PLAIN", plain("guest", "guest")).await;
    let t = expect_tune(&mut raw).await;
    assert_eq!(
        (t.channel_max, t.frame_max, t.heartbeat),
        (2047, 131_072, 60)
    );
    let tune_ok = ConnectionTuneOk {
        channel_max: t.channel_max,
        frame_max: t.frame_max,
        heartbeat: 0,
    };
    match tune_and_open(&mut raw, tune_ok, "/").await {
        Method::ConnectionOpenOk(_) => {}
        m => panic!("expected open-ok, got {m:?}"),
    }
    raw.open_channel(1).await;
    raw.send(
        0,
        ConnectionClose {
            reply_code: 200,
            reply_text: "bye".into(),
            ..Default::default()
        },
    )
    .await;
    match raw.recv_method(0).await {
        Method::ConnectionCloseOk(_) => {}
        m => panic!("expected connection.close-ok, got {m:?}"),
    }
    raw.expect_eof().await;
    stop(b).await;
}

#[tokio::test]
async fn amqplain_login() {
    let b = broker().await;
    let (mut raw, _) = start(b.amqp_addr()).await;
    start_ok(&mut raw, "AMQPLAIN", amqplain("guest", "guest")).await;
    let t = expect_tune(&mut raw).await;
    let tune_ok = ConnectionTuneOk {
        channel_max: t.channel_max,
        frame_max: t.frame_max,
        heartbeat: 0,
    };
    match tune_and_open(&mut raw, tune_ok, "/").await {
        Method::ConnectionOpenOk(_) => {}
        m => panic!("expected open-ok, got {m:?}"),
    }
    raw.open_channel(1).await;
    stop(b).await;
}

#[tokio::test]
async fn bad_password_is_refused_with_403() {
    let b = broker().await;
    for (mechanism, response) in [
        ("PLAIN", plain("guest", "wrong")),
        ("AMQPLAIN", amqplain("guest", "wrong")),
        ("PLAIN", plain("nobody", "guest")),
    ] {
        let (mut raw, _) = start(b.amqp_addr()).await;
        start_ok(&mut raw, mechanism, response).await;
        let text = raw.expect_connection_close(403, 0, 0).await;
        assert_eq!(
            text,
            format!(
                "ACCESS_REFUSED - Login was refused using authentication mechanism {mechanism}. \
                 For details see the broker logfile."
            )
        );
        raw.send(0, ConnectionCloseOk {}).await;
        raw.expect_eof().await;
    }
    stop(b).await;
}

#[tokio::test]
async fn unknown_vhost_is_not_allowed() {
    let b = broker().await;
    let (mut raw, _) = start(b.amqp_addr()).await;
    start_ok(&mut raw, "PLAIN", plain("guest", "guest")).await;
    expect_tune(&mut raw).await;
    let tune_ok = ConnectionTuneOk {
        channel_max: 2047,
        frame_max: 131_072,
        heartbeat: 0,
    };
    match tune_and_open(&mut raw, tune_ok, "nope").await {
        Method::ConnectionClose(c) => {
            assert_eq!(
                (c.reply_code, c.class_id, c.method_id),
                (530, 10, 40),
                "{c:?}"
            );
            assert_eq!(c.reply_text, "NOT_ALLOWED - vhost nope not found");
        }
        m => panic!("expected connection.close, got {m:?}"),
    }
    raw.send(0, ConnectionCloseOk {}).await;
    raw.expect_eof().await;
    stop(b).await;
}

/// tune-ok values RabbitMQ refuses (rabbit_reader's validate_negotiated_integer_value): 0
/// ("no limit") and values above the server's for frame_max and channel_max, frame_max
/// below 4096; each is 530 NOT_ALLOWED naming connection.tune (10, 30).
#[tokio::test]
async fn tune_ok_outside_the_servers_limits_is_not_allowed() {
    let b = broker().await;
    let cases: [(u16, u32, &str); 6] = [
        (
            2047,
            0,
            "negotiated frame_max = 0 is higher than the maximum allowed value (131072)",
        ),
        (
            0,
            131_072,
            "negotiated channel_max = 0 (no limit) is higher than the maximum allowed value \
             (2047)",
        ),
        (
            2047,
            131_073,
            "negotiated frame_max = 131073 is higher than the maximum allowed value (131072)",
        ),
        (
            2048,
            131_072,
            "negotiated channel_max = 2048 is higher than the maximum allowed value (2047)",
        ),
        (
            2047,
            4095,
            "negotiated frame_max = 4095 is lower than the minimum allowed value (4096)",
        ),
        (
            2047,
            1,
            "negotiated frame_max = 1 is lower than the minimum allowed value (4096)",
        ),
    ];
    for (channel_max, frame_max, text) in cases {
        let (mut raw, _) = start(b.amqp_addr()).await;
        start_ok(&mut raw, "PLAIN", plain("guest", "guest")).await;
        expect_tune(&mut raw).await;
        let tune_ok = ConnectionTuneOk {
            channel_max,
            frame_max: frame_max.max(4096),
            heartbeat: 0,
        };
        raw.frame_max = tune_ok.frame_max;
        raw.send(
            0,
            ConnectionTuneOk {
                frame_max,
                ..tune_ok
            },
        )
        .await;
        match raw.recv_method(0).await {
            Method::ConnectionClose(c) => {
                assert_eq!(
                    (c.reply_code, c.class_id, c.method_id),
                    (530, 10, 30),
                    "{c:?}"
                );
                assert_eq!(c.reply_text, format!("NOT_ALLOWED - {text}"));
            }
            m => panic!("expected connection.close for {channel_max}/{frame_max}, got {m:?}"),
        }
        raw.expect_eof().await;
    }
    // The limits themselves, and values between, are accepted.
    for (channel_max, frame_max) in [(2047, 131_072), (1, 4096), (100, 65_536)] {
        let raw = open_with(b.amqp_addr(), channel_max, frame_max, 0).await;
        drop(raw);
    }
    stop(b).await;
}

#[tokio::test]
async fn client_lower_frame_max_wins() {
    let b = broker().await;
    let mut raw = open_with(b.amqp_addr(), 10, 4096, 0).await;
    raw.open_channel(1).await;
    raw.declare_queue(1, "big").await;
    let body: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    raw.publish(1, "", "big", &body).await;
    raw.send(
        1,
        BasicGet {
            queue: "big".into(),
            no_ack: true,
            ..Default::default()
        },
    )
    .await;
    match raw.recv_method(1).await {
        Method::BasicGetOk(_) => {}
        m => panic!("expected basic.get-ok, got {m:?}"),
    }
    match raw.recv().await {
        Frame::Header { body_size, .. } => assert_eq!(body_size, 10_000),
        f => panic!("expected a content header, got {f:?}"),
    }
    let mut got = Vec::new();
    let mut frames = 0;
    while got.len() < body.len() {
        match raw.recv().await {
            Frame::Body {
                channel: 1,
                payload,
            } => {
                assert!(payload.len() + 8 <= 4096, "body frame of {}", payload.len());
                got.extend_from_slice(&payload);
                frames += 1;
            }
            f => panic!("expected a body frame, got {f:?}"),
        }
    }
    assert_eq!(got, body);
    assert_eq!(frames, 3);
    stop(b).await;
}

#[tokio::test]
async fn frame_larger_than_negotiated_frame_max_is_frame_error() {
    let b = broker().await;
    let mut raw = open_with(b.amqp_addr(), 2047, 4096, 0).await;
    raw.open_channel(1).await;
    let mut b2 = BytesMut::new();
    encode_method_frame(
        1,
        &Method::BasicPublish(BasicPublish {
            routing_key: "q".into(),
            ..Default::default()
        }),
        &mut b2,
    );
    encode_header_frame(1, 60, 5000, &BasicProperties::default(), &mut b2);
    raw.write(&b2).await;
    // One 5008-byte body frame where 4096 was negotiated.
    raw.write(&raw_frame(FRAME_BODY, 1, &[7u8; 5000], FRAME_END))
        .await;
    let text = raw.expect_connection_close(501, 0, 0).await;
    assert!(text.starts_with("FRAME_ERROR - "), "{text}");
    raw.finish_server_close().await;
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Hard errors: connection.close with RabbitMQ's code, text, class and method

#[tokio::test]
async fn method_frame_where_content_header_expected_is_unexpected_frame() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.send(
        1,
        BasicPublish {
            routing_key: "q".into(),
            ..Default::default()
        },
    )
    .await;
    raw.send(
        1,
        QueueDeclare {
            queue: "q".into(),
            ..Default::default()
        },
    )
    .await;
    // RabbitMQ names the method whose content was expected: basic.publish.
    let text = raw.expect_connection_close(505, 60, 40).await;
    assert_eq!(
        text,
        "UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead"
    );
    raw.finish_server_close().await;
    stop(b).await;
}

#[tokio::test]
async fn body_frame_without_publish_is_unexpected_frame() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.write(&raw_frame(FRAME_BODY, 1, b"stray", FRAME_END))
        .await;
    let text = raw.expect_connection_close(505, 0, 0).await;
    assert_eq!(
        text,
        "UNEXPECTED_FRAME - expected method frame, got non method frame instead"
    );
    raw.finish_server_close().await;
    stop(b).await;
}

#[tokio::test]
async fn method_on_unopened_channel_is_channel_error() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.send(
        7,
        QueueDeclare {
            queue: "q".into(),
            ..Default::default()
        },
    )
    .await;
    let text = raw.expect_connection_close(504, 50, 10).await;
    assert_eq!(text, "CHANNEL_ERROR - expected 'channel.open'");
    raw.finish_server_close().await;
    stop(b).await;
}

#[tokio::test]
async fn second_channel_open_is_channel_error() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.send(1, ChannelOpen::default()).await;
    let text = raw.expect_connection_close(504, 20, 10).await;
    assert_eq!(text, "CHANNEL_ERROR - second 'channel.open' seen");
    raw.finish_server_close().await;
    stop(b).await;
}

#[tokio::test]
async fn channel_method_on_channel_zero_is_channel_error() {
    // RabbitMQ (rabbit_reader:handle_method0): CHANNEL_ERROR, naming the offending method.
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.send(0, ChannelOpen::default()).await;
    let text = raw.expect_connection_close(504, 20, 10).await;
    assert_eq!(
        text,
        "CHANNEL_ERROR - unexpected method in connection state running"
    );
    raw.finish_server_close().await;
    stop(b).await;
}

#[tokio::test]
async fn bad_frame_end_is_frame_error() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    let mut payload = BytesMut::new();
    Method::ChannelFlow(ChannelFlow { active: true }).encode(&mut payload);
    raw.write(&raw_frame(FRAME_METHOD, 1, &payload, 0x00)).await;
    let text = raw.expect_connection_close(501, 0, 0).await;
    assert!(text.starts_with("FRAME_ERROR - "), "{text}");
    raw.finish_server_close().await;
    stop(b).await;
}

#[tokio::test]
async fn unknown_method_id_is_command_invalid() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    // class basic (60), method 999: not in the protocol.
    raw.write(&raw_frame(FRAME_METHOD, 1, &[0, 60, 3, 231], FRAME_END))
        .await;
    let text = raw.expect_connection_close(503, 0, 0).await;
    assert!(text.starts_with("COMMAND_INVALID - "), "{text}");
    raw.finish_server_close().await;
    stop(b).await;
}

#[tokio::test]
async fn reused_consumer_tag_is_not_allowed() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.declare_queue(1, "q").await;
    let consume = BasicConsume {
        queue: "q".into(),
        consumer_tag: "tag-1".into(),
        ..Default::default()
    };
    raw.send(1, consume.clone()).await;
    match raw.recv_method(1).await {
        Method::BasicConsumeOk(ok) => assert_eq!(ok.consumer_tag, "tag-1"),
        m => panic!("expected consume-ok, got {m:?}"),
    }
    raw.send(1, consume).await;
    let text = raw.expect_connection_close(530, 60, 20).await;
    assert_eq!(text, "NOT_ALLOWED - attempt to reuse consumer tag 'tag-1'");
    raw.finish_server_close().await;
    stop(b).await;
}

#[tokio::test]
async fn publish_immediate_is_not_implemented() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.declare_queue(1, "q").await;
    let mut bytes = BytesMut::new();
    encode_method_frame(
        1,
        &Method::BasicPublish(BasicPublish {
            routing_key: "q".into(),
            immediate: true,
            ..Default::default()
        }),
        &mut bytes,
    );
    encode_header_frame(1, 60, 2, &BasicProperties::default(), &mut bytes);
    encode_body_frames(1, b"hi", 131_072, &mut bytes);
    raw.write(&bytes).await;
    let text = raw.expect_connection_close(540, 60, 40).await;
    assert_eq!(text, "NOT_IMPLEMENTED - immediate=true");
    raw.finish_server_close().await;
    stop(b).await;
}

#[tokio::test]
async fn qos_prefetch_size_is_not_implemented() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.send(
        1,
        BasicQos {
            prefetch_size: 10,
            prefetch_count: 1,
            global: false,
        },
    )
    .await;
    let text = raw.expect_connection_close(540, 60, 10).await;
    assert_eq!(text, "NOT_IMPLEMENTED - prefetch_size!=0 (10)");
    raw.finish_server_close().await;
    stop(b).await;
}

#[tokio::test]
async fn misbehaving_connection_does_not_affect_another() {
    let b = broker().await;
    let mut good = open(b.amqp_addr()).await;
    good.declare_queue(1, "shared").await;
    good.send(
        1,
        BasicConsume {
            queue: "shared".into(),
            consumer_tag: "c".into(),
            no_ack: true,
            ..Default::default()
        },
    )
    .await;
    assert!(matches!(
        good.recv_method(1).await,
        Method::BasicConsumeOk(_)
    ));

    let mut bad = open(b.amqp_addr()).await;
    bad.write(&raw_frame(FRAME_METHOD, 1, &[0, 60], 0xAB)).await;
    bad.expect_connection_close(501, 0, 0).await;

    // The good connection still publishes and receives while the bad one awaits close-ok.
    good.publish(1, "", "shared", b"still here").await;
    match good.recv_method(1).await {
        Method::BasicDeliver(d) => assert_eq!(d.consumer_tag, "c"),
        m => panic!("expected basic.deliver, got {m:?}"),
    }
    assert!(matches!(good.recv().await, Frame::Header { .. }));
    match good.recv().await {
        Frame::Body { payload, .. } => assert_eq!(&payload[..], b"still here"),
        f => panic!("expected body, got {f:?}"),
    }
    bad.finish_server_close().await;
    good.open_channel(2).await;
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Heartbeats

#[tokio::test]
async fn heartbeats_are_sent_and_a_silent_client_is_disconnected() {
    let b = broker().await;
    // The broker offers 60 s; the client's lower value wins.
    let mut raw = open_with(b.amqp_addr(), 2047, 131_072, 1).await;
    let since = Instant::now();
    let mut heartbeats = 0;
    loop {
        match raw.next_frame_within(Duration::from_secs(6)).await {
            Some(Frame::Heartbeat { channel: 0 }) => heartbeats += 1,
            Some(f) => panic!("unexpected frame {f:?}"),
            None => break,
        }
    }
    let silent = since.elapsed();
    assert!(heartbeats >= 1, "no heartbeat within {silent:?}");
    assert!(
        silent >= Duration::from_millis(1500),
        "disconnected after only {silent:?}"
    );
    assert!(silent <= Duration::from_secs(5), "took {silent:?}");
    stop(b).await;
}

#[tokio::test]
async fn client_heartbeats_keep_the_connection_alive() {
    let b = broker().await;
    let mut raw = open_with(b.amqp_addr(), 2047, 131_072, 1).await;
    let mut hb = BytesMut::new();
    encode_heartbeat(&mut hb);
    for _ in 0..8 {
        raw.write(&hb).await;
        assert!(raw.quiet_for(Duration::from_millis(450)).await);
    }
    // 3.6 s later, well past two missed intervals, the connection still works.
    raw.open_channel(1).await;
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Channel flow and channel close

#[tokio::test]
async fn channel_flow_pauses_and_resumes_deliveries() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.declare_queue(1, "flowq").await;
    raw.send(
        1,
        BasicConsume {
            queue: "flowq".into(),
            consumer_tag: "f".into(),
            no_ack: true,
            ..Default::default()
        },
    )
    .await;
    assert!(matches!(
        raw.recv_method(1).await,
        Method::BasicConsumeOk(_)
    ));
    raw.send(1, ChannelFlow { active: false }).await;
    match raw.recv_method(1).await {
        Method::ChannelFlowOk(ok) => assert!(!ok.active),
        m => panic!("expected channel.flow-ok, got {m:?}"),
    }
    raw.publish(1, "", "flowq", b"held").await;
    assert!(
        raw.quiet_for(Duration::from_millis(400)).await,
        "delivered while flow was off"
    );
    raw.send(1, ChannelFlow { active: true }).await;
    match raw.recv_method(1).await {
        Method::ChannelFlowOk(ok) => assert!(ok.active),
        m => panic!("expected channel.flow-ok, got {m:?}"),
    }
    assert!(matches!(raw.recv_method(1).await, Method::BasicDeliver(_)));
    assert!(matches!(raw.recv().await, Frame::Header { .. }));
    match raw.recv().await {
        Frame::Body { payload, .. } => assert_eq!(&payload[..], b"held"),
        f => panic!("expected body, got {f:?}"),
    }
    stop(b).await;
}

#[tokio::test]
async fn server_channel_close_then_close_ok_and_reopen() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.send(
        1,
        QueueDeclare {
            queue: "missing".into(),
            passive: true,
            ..Default::default()
        },
    )
    .await;
    match raw.recv_method(1).await {
        Method::ChannelClose(c) => {
            assert_eq!((c.reply_code, c.class_id, c.method_id), (404, 50, 10));
            assert_eq!(c.reply_text, "NOT_FOUND - no queue 'missing' in vhost '/'");
        }
        m => panic!("expected channel.close, got {m:?}"),
    }
    // Until close-ok, methods on the closing channel are discarded.
    raw.send(
        1,
        QueueDeclare {
            queue: "ignored".into(),
            ..Default::default()
        },
    )
    .await;
    raw.send(1, ChannelCloseOk {}).await;
    raw.open_channel(1).await;
    raw.declare_queue(1, "after").await;
    // "ignored" was never declared.
    raw.send(
        1,
        QueueDeclare {
            queue: "ignored".into(),
            passive: true,
            ..Default::default()
        },
    )
    .await;
    match raw.recv_method(1).await {
        Method::ChannelClose(c) => assert_eq!(c.reply_code, 404),
        m => panic!("expected channel.close, got {m:?}"),
    }
    raw.send(1, ChannelCloseOk {}).await;
    raw.open_channel(1).await;
    stop(b).await;
}

#[tokio::test]
async fn memory_alarm_blocks_and_pauses_publishers_only() {
    let mut cfg = Config::default();
    // A watermark of one byte: the alarm is on from the broker's first health check.
    cfg.memory.high_watermark_bytes = 1;
    let b = broker_with(cfg).await;
    tokio::time::sleep(Duration::from_millis(400)).await;

    let mut publisher = open_with(b.amqp_addr(), 2047, 131_072, 0).await;
    publisher.open_channel(1).await;
    publisher.declare_queue(1, "mem-alarm").await;
    publisher.publish(1, "", "mem-alarm", b"x").await;
    // As in RabbitMQ, connection.blocked comes when a connection publishes during an alarm.
    match publisher.recv_method(0).await {
        Method::ConnectionBlocked(m) => assert_eq!(m.reason, "low on memory"),
        m => panic!("expected connection.blocked, got {m:?}"),
    }
    // Having published, the connection is no longer read from: a declare gets no answer.
    publisher
        .send(
            1,
            QueueDeclare {
                queue: "mem-alarm".into(),
                passive: true,
                ..Default::default()
            },
        )
        .await;
    assert!(
        publisher.quiet_for(Duration::from_millis(800)).await,
        "a publisher was served during the memory alarm"
    );

    // A connection that consumes keeps being served, so its acks can free memory; it is not
    // told connection.blocked, having published nothing.
    let mut consumer = open_with(b.amqp_addr(), 2047, 131_072, 0).await;
    consumer.open_channel(1).await;
    consumer
        .send(
            1,
            BasicConsume {
                queue: "mem-alarm".into(),
                consumer_tag: "c".into(),
                ..Default::default()
            },
        )
        .await;
    match consumer.recv_method(1).await {
        Method::BasicConsumeOk(_) => {}
        m => panic!("expected basic.consume-ok, got {m:?}"),
    }
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Close handshakes: frames the client still sends around a close are read and discarded, so
// closing the socket never resets the connection under a client that is still writing.

/// `n` small basic.publish + header + body frame sets for `queue` on channel 1.
fn publishes(queue: &str, n: usize) -> BytesMut {
    let mut b = BytesMut::new();
    for i in 0..n {
        let body = format!("m{i}");
        encode_method_frame(
            1,
            &Method::BasicPublish(BasicPublish {
                routing_key: queue.into(),
                ..Default::default()
            }),
            &mut b,
        );
        encode_header_frame(
            1,
            60,
            body.len() as u64,
            &BasicProperties::default(),
            &mut b,
        );
        encode_body_frames(1, body.as_bytes(), 131_072, &mut b);
    }
    b
}

/// Writes `chunk` `times` times with a pause between writes; returns the first write error.
async fn keep_writing(raw: &mut Raw, chunk: &[u8], times: usize) -> Option<std::io::Error> {
    for _ in 0..times {
        match timeout(WAIT, raw.sock.write_all(chunk)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Some(e),
            Err(_) => panic!("write timed out"),
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

/// After the client's shutdown of its side, the broker's side ends with a clean EOF, not a
/// reset.
async fn expect_clean_eof(raw: &mut Raw) {
    raw.sock.shutdown().await.expect("shutdown");
    let mut scratch = [0u8; 4096];
    loop {
        match timeout(WAIT, raw.sock.read(&mut scratch)).await {
            Ok(Ok(0)) => return,
            Ok(Ok(_)) => {}
            Ok(Err(e)) => panic!("the broker reset the connection: {e}"),
            Err(_) => panic!("the broker did not close the socket"),
        }
    }
}

#[tokio::test]
async fn client_close_while_still_publishing_is_not_reset() {
    // amqplib writes connection.close ahead of publishes still queued in its channel buffers;
    // RabbitMQ answers close-ok and keeps discarding input until the client closes.
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.declare_queue(1, "burst").await;
    let mut close = BytesMut::new();
    encode_method_frame(
        0,
        &Method::ConnectionClose(ConnectionClose {
            reply_code: 200,
            reply_text: "bye".into(),
            ..Default::default()
        }),
        &mut close,
    );
    raw.write(&close).await;
    let burst = publishes("burst", 200);
    raw.write(&burst).await;
    match raw.recv_method(0).await {
        Method::ConnectionCloseOk(_) => {}
        m => panic!("expected connection.close-ok, got {m:?}"),
    }
    // The broker's side of the socket is done writing; the client's may still be busy.
    raw.expect_eof().await;
    if let Some(e) = keep_writing(&mut raw, &burst, 20).await {
        panic!("writing after close-ok failed: {e}");
    }
    expect_clean_eof(&mut raw).await;
    stop(b).await;
}

#[tokio::test]
async fn server_close_while_client_still_publishing_is_not_reset() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.declare_queue(1, "burst2").await;
    // A stray body frame: 505, connection.close from the broker.
    raw.write(&raw_frame(FRAME_BODY, 1, b"stray", FRAME_END))
        .await;
    raw.expect_connection_close(505, 0, 0).await;
    let burst = publishes("burst2", 50);
    // Frames sent before the client saw the close are discarded while the broker waits.
    if let Some(e) = keep_writing(&mut raw, &burst, 10).await {
        panic!("writing while the broker waits for close-ok failed: {e}");
    }
    let mut close_ok = BytesMut::new();
    encode_method_frame(
        0,
        &Method::ConnectionCloseOk(ConnectionCloseOk {}),
        &mut close_ok,
    );
    // close-ok overtaking frames still in the client's buffers.
    close_ok.extend_from_slice(&burst);
    raw.write(&close_ok).await;
    raw.expect_eof().await;
    if let Some(e) = keep_writing(&mut raw, &burst, 5).await {
        panic!("writing after close-ok failed: {e}");
    }
    expect_clean_eof(&mut raw).await;
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// channel_max: how many channels may be open at once, not which numbers (RabbitMQ's rule)

#[tokio::test]
async fn channel_max_bounds_open_channels_not_channel_numbers() {
    let b = broker().await;
    let mut raw = open_with(b.amqp_addr(), 2, 131_072, 0).await;
    // Numbers above channel_max are fine, as in RabbitMQ.
    raw.open_channel(3000).await;
    raw.open_channel(65535).await;
    // A channel closed by the client frees its slot.
    raw.send(
        3000,
        ChannelClose {
            reply_code: 200,
            reply_text: "bye".into(),
            ..Default::default()
        },
    )
    .await;
    assert!(matches!(
        raw.recv_method(3000).await,
        Method::ChannelCloseOk(_)
    ));
    raw.open_channel(7).await;
    // A channel the broker closed still counts until the client's close-ok.
    raw.send(
        7,
        QueueDeclare {
            queue: "missing".into(),
            passive: true,
            ..Default::default()
        },
    )
    .await;
    assert!(matches!(raw.recv_method(7).await, Method::ChannelClose(_)));
    raw.send(8, ChannelOpen::default()).await;
    let text = raw.expect_connection_close(530, 0, 0).await;
    assert_eq!(
        text,
        "NOT_ALLOWED - number of channels opened (2) has reached the negotiated channel_max (2)"
    );
    raw.finish_server_close().await;

    // The default channel_max (2047) with channel number 3000.
    let mut raw = open_with(b.amqp_addr(), 2047, 131_072, 0).await;
    raw.open_channel(3000).await;
    raw.declare_queue(3000, "on-3000").await;
    drop(raw);
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Ordering of replies and notifications (as RabbitMQ: a method's reply comes before the
// notifications it causes on the same channel)

async fn consume(raw: &mut Raw, channel: u16, queue: &str, tag: &str) {
    raw.send(
        channel,
        BasicConsume {
            queue: queue.into(),
            consumer_tag: tag.into(),
            ..Default::default()
        },
    )
    .await;
    match raw.recv_method(channel).await {
        Method::BasicConsumeOk(ok) => assert_eq!(ok.consumer_tag, tag),
        m => panic!("expected basic.consume-ok, got {m:?}"),
    }
}

/// The next `n` methods as (channel, name).
async fn next_methods(raw: &mut Raw, n: usize) -> Vec<(u16, &'static str)> {
    let mut out = Vec::new();
    while out.len() < n {
        match raw.recv().await {
            Frame::Method { channel, method } => out.push((channel, method.name())),
            f => panic!("expected a method, got {f:?}"),
        }
    }
    out
}

#[tokio::test]
async fn queue_delete_ok_comes_before_the_cancel_it_causes_on_the_same_channel() {
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.declare_queue(1, "deleted-under-consumers").await;
    consume(&mut raw, 1, "deleted-under-consumers", "c1").await;
    consume(&mut raw, 1, "deleted-under-consumers", "c2").await;
    raw.send(
        1,
        QueueDelete {
            queue: "deleted-under-consumers".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        next_methods(&mut raw, 3).await,
        vec![
            (1, "queue.delete-ok"),
            (1, "basic.cancel"),
            (1, "basic.cancel")
        ]
    );

    // A consumer on another channel is told as soon as the queue goes (RabbitMQ's order).
    raw.open_channel(2).await;
    raw.declare_queue(1, "deleted-from-elsewhere").await;
    consume(&mut raw, 2, "deleted-from-elsewhere", "c3").await;
    raw.send(
        1,
        QueueDelete {
            queue: "deleted-from-elsewhere".into(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        next_methods(&mut raw, 2).await,
        vec![(2, "basic.cancel"), (1, "queue.delete-ok")]
    );
    drop(raw);
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Malformed and out-of-order frames: each reply code, text and class/method ids as RabbitMQ
// (4.x; the values were checked against RabbitMQ 3.10.8 where it closes the connection cleanly)

fn publish_frame(channel: u16, routing_key: &str) -> Vec<u8> {
    let mut b = BytesMut::new();
    encode_method_frame(
        channel,
        &Method::BasicPublish(BasicPublish {
            routing_key: routing_key.into(),
            ..Default::default()
        }),
        &mut b,
    );
    b.to_vec()
}

/// A content header frame with any class and weight and no properties.
fn header_frame(channel: u16, class_id: u16, weight: u16, body_size: u64) -> Vec<u8> {
    let mut p = BytesMut::new();
    p.put_u16(class_id);
    p.put_u16(weight);
    p.put_u64(body_size);
    p.put_u16(0);
    raw_frame(warren_amqp::frame::FRAME_HEADER, channel, &p, FRAME_END)
}

/// A method frame for (class, method) with raw argument bytes.
fn method_frame(channel: u16, class_id: u16, method_id: u16, args: &[u8]) -> Vec<u8> {
    let mut p = BytesMut::new();
    p.put_u16(class_id);
    p.put_u16(method_id);
    p.put_slice(args);
    raw_frame(FRAME_METHOD, channel, &p, FRAME_END)
}

/// What is sent, the reply code, class and method ids, and the exact text when checked.
type BadFrameCase = (&'static str, Vec<u8>, u16, (u16, u16), Option<&'static str>);

#[tokio::test]
async fn malformed_and_unexpected_frames_get_rabbitmq_reply_codes() {
    let header_after_publish = |class_id, weight| {
        let mut v = publish_frame(1, "q");
        v.extend(header_frame(1, class_id, weight, 1));
        v
    };
    let mut body_too_long = publish_frame(1, "q");
    body_too_long.extend(header_frame(1, 60, 0, 2));
    body_too_long.extend(raw_frame(FRAME_BODY, 1, b"abcd", FRAME_END));
    let mut header_twice = publish_frame(1, "q");
    header_twice.extend(header_frame(1, 60, 0, 2));
    header_twice.extend(header_frame(1, 60, 0, 2));
    let mut method_instead_of_body = publish_frame(1, "q");
    method_instead_of_body.extend(header_frame(1, 60, 0, 2));
    method_instead_of_body.extend(method_frame(1, 85, 10, &[0]));
    // queue.declare whose name is not UTF-8: ticket, shortstr, bits, empty table.
    let bad_name = method_frame(1, 50, 10, &[0, 0, 3, b'q', 0xFF, 0xFE, 0, 0, 0, 0, 0]);
    let cases: Vec<BadFrameCase> = vec![
        (
            "content header for a class without content",
            header_frame(1, 10, 0, 1),
            505,
            (0, 0),
            Some("UNEXPECTED_FRAME - expected method frame, got non method frame instead"),
        ),
        (
            "content header for class 10 after basic.publish",
            header_after_publish(10, 0),
            505,
            (60, 40),
            Some("UNEXPECTED_FRAME - expected content header for class 60, got one for class 10 instead"),
        ),
        (
            "content header with a non-zero weight",
            header_after_publish(60, 1),
            505,
            (60, 40),
            Some("UNEXPECTED_FRAME - expected content header for class 60, got non content header frame instead"),
        ),
        (
            "a second content header",
            header_twice,
            505,
            (60, 40),
            Some("UNEXPECTED_FRAME - expected content body, got non content body frame instead"),
        ),
        (
            "a method where a body frame was expected",
            method_instead_of_body,
            505,
            (60, 40),
            Some("UNEXPECTED_FRAME - expected content body, got non content body frame instead"),
        ),
        (
            "more body than the header announced",
            body_too_long,
            501,
            (60, 40),
            Some("FRAME_ERROR - content body frame exceeds remaining content size"),
        ),
        (
            "basic.publish arguments running past the frame",
            method_frame(1, 60, 40, &[0, 0, 5, b'a', b'b']),
            501,
            (60, 40),
            None,
        ),
        (
            "queue.declare arguments running past the frame",
            method_frame(1, 50, 10, &[0, 0, 9, b'q']),
            501,
            (50, 10),
            None,
        ),
        (
            "bytes after the last argument",
            method_frame(1, 85, 10, &[0, 1]),
            501,
            (85, 10),
            None,
        ),
        (
            "a field table with an unknown value type",
            method_frame(1, 50, 10, &[0, 0, 1, b'q', 0, 0, 0, 0, 3, 1, b'k', b'Z']),
            501,
            (50, 10),
            None,
        ),
        (
            "a queue name that is not UTF-8",
            bad_name,
            501,
            (0, 0),
            Some("FRAME_ERROR - Malformed UTF-8 in shortstr"),
        ),
        (
            "a method frame too short for its ids",
            raw_frame(FRAME_METHOD, 1, &[0, 60, 0], FRAME_END),
            501,
            (0, 0),
            None,
        ),
        (
            "a heartbeat on channel 1",
            raw_frame(8, 1, &[], FRAME_END),
            505,
            (0, 0),
            None,
        ),
        (
            "a heartbeat with a payload",
            raw_frame(8, 0, b"ab", FRAME_END),
            501,
            (0, 0),
            None,
        ),
        (
            "an unknown frame type",
            raw_frame(5, 1, &[], FRAME_END),
            501,
            (0, 0),
            None,
        ),
        (
            "a body frame on channel 0",
            raw_frame(FRAME_BODY, 0, b"abc", FRAME_END),
            505,
            (0, 0),
            None,
        ),
        (
            "a content header on a channel that is not open",
            header_frame(5, 60, 0, 1),
            505,
            (0, 0),
            Some("UNEXPECTED_FRAME - expected method frame, got non method frame instead"),
        ),
        (
            "channel.close-ok without a channel.close",
            method_frame(1, 20, 41, &[]),
            503,
            (20, 41),
            Some("COMMAND_INVALID - unimplemented method"),
        ),
        (
            "connection.close-ok without a connection.close",
            method_frame(0, 10, 51, &[]),
            504,
            (10, 51),
            Some("CHANNEL_ERROR - unexpected method in connection state running"),
        ),
    ];
    let b = broker().await;
    for (what, bytes, code, (class_id, method_id), text) in cases {
        let mut raw = open(b.amqp_addr()).await;
        raw.write(&bytes).await;
        let got = match raw.recv_method(0).await {
            Method::ConnectionClose(c) => c,
            m => panic!("{what}: expected connection.close, got {m:?}"),
        };
        assert_eq!(
            (got.reply_code, got.class_id, got.method_id),
            (code, class_id, method_id),
            "{what}: {got:?}"
        );
        if let Some(text) = text {
            assert_eq!(got.reply_text, text, "{what}");
        }
        raw.finish_server_close().await;
    }
    stop(b).await;
}

#[tokio::test]
async fn a_frame_of_frame_max_payload_is_tolerated_as_rabbitmq() {
    let b = broker().await;
    let mut raw = open_with(b.amqp_addr(), 2047, 4096, 0).await;
    raw.open_channel(1).await;
    raw.declare_queue(1, "fudge").await;
    let mut bytes = BytesMut::from(&publish_frame(1, "fudge")[..]);
    encode_header_frame(1, 60, 4096, &BasicProperties::default(), &mut bytes);
    // One body frame of 4096 + 8 bytes where 4096 was negotiated.
    bytes.extend_from_slice(&raw_frame(FRAME_BODY, 1, &[7u8; 4096], FRAME_END));
    raw.write(&bytes).await;
    raw.declare_queue(1, "fudge").await;
    drop(raw);
    stop(b).await;
}

#[tokio::test]
async fn binary_property_values_are_stored_and_delivered_unchanged() {
    // A raw 16-byte UUID as correlation-id and message-id, as Go and .NET programs send.
    let uuid: &[u8] = &[
        0x00, 0xFF, 0x10, 0x80, 0xC3, 0x28, 0xA0, 0xA1, 0xE2, 0x28, 0xA1, 0xF0, 0x28, 0x8C, 0xBC,
        0x01,
    ];
    let b = broker().await;
    let mut raw = open(b.amqp_addr()).await;
    raw.declare_queue(1, "binary-props").await;
    let props = BasicProperties {
        correlation_id: Some(uuid.into()),
        message_id: Some(uuid.into()),
        reply_to: Some(b"\xFFreply"[..].into()),
        ..Default::default()
    };
    let mut bytes = BytesMut::from(&publish_frame(1, "binary-props")[..]);
    encode_header_frame(1, 60, 2, &props, &mut bytes);
    encode_body_frames(1, b"hi", 131_072, &mut bytes);
    raw.write(&bytes).await;
    raw.send(
        1,
        BasicGet {
            queue: "binary-props".into(),
            no_ack: true,
            ..Default::default()
        },
    )
    .await;
    match raw.recv_method(1).await {
        Method::BasicGetOk(_) => {}
        m => panic!("expected basic.get-ok, got {m:?}"),
    }
    match raw.recv().await {
        Frame::Header { properties, .. } => {
            assert_eq!(properties, props);
            assert_eq!(properties.correlation_id.unwrap().as_bytes(), uuid);
        }
        f => panic!("expected a content header, got {f:?}"),
    }
    drop(raw);
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Bounded output: a client that does not read what it is sent is not read from either

#[tokio::test]
async fn unread_returns_stop_the_broker_reading_instead_of_buffering_them() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    const N: usize = 1000;
    const SIZE: usize = 100 * 1024;
    let b = broker().await;
    let raw = open(b.amqp_addr()).await;
    let Raw { sock, mut buf, .. } = raw;
    let (mut rd, mut wr) = sock.into_split();
    // Mandatory publishes that route nowhere: each comes back as a 100 KB basic.return.
    let mut one = BytesMut::new();
    encode_method_frame(
        1,
        &Method::BasicPublish(BasicPublish {
            routing_key: "nowhere".into(),
            mandatory: true,
            ..Default::default()
        }),
        &mut one,
    );
    encode_header_frame(1, 60, SIZE as u64, &BasicProperties::default(), &mut one);
    encode_body_frames(1, &vec![1u8; SIZE], 131_072, &mut one);
    let written = std::sync::Arc::new(AtomicUsize::new(0));
    let progress = written.clone();
    let writer = tokio::spawn(async move {
        for _ in 0..N {
            wr.write_all(&one).await.expect("write");
            progress.fetch_add(one.len(), Ordering::Relaxed);
        }
        wr
    });
    // Without reading, the client's writes stall once the broker stops reading.
    let mut last = 0;
    let mut still = 0;
    while still < 10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = written.load(Ordering::Relaxed);
        assert!(
            !writer.is_finished(),
            "the broker read {N} publishes no one read the returns of"
        );
        if now == last {
            still += 1;
        } else {
            (last, still) = (now, 0);
        }
    }
    // Output bound (8 MiB) + one frame + socket buffers on both sides.
    assert!(
        last < 48 * 1024 * 1024,
        "the broker read {} MiB from a client that reads nothing",
        last >> 20
    );
    // Reading the returns lets everything through, in order, nothing lost.
    let mut returns = 0;
    while returns < N {
        let frame = timeout(WAIT, async {
            loop {
                if let Some(f) = parse_frame(&mut buf, &Limits::new(0)).unwrap() {
                    return f;
                }
                assert!(rd.read_buf(&mut buf).await.unwrap() > 0, "closed");
            }
        })
        .await
        .expect("returns stopped coming");
        if let Frame::Method {
            method: Method::BasicReturn(r),
            ..
        } = frame
        {
            assert_eq!(r.reply_code, 312);
            returns += 1;
        }
    }
    timeout(WAIT, writer).await.unwrap().unwrap();
    drop(rd);
    stop(b).await;
}

// ---------------------------------------------------------------------------------------------
// Limits on what one connection holds in memory

async fn expect_channel_close(raw: &mut Raw, channel: u16) -> ChannelClose {
    match raw.recv_method(channel).await {
        Method::ChannelClose(c) => c,
        m => panic!("expected channel.close, got {m:?}"),
    }
}

#[tokio::test]
async fn incomplete_content_per_connection_is_bounded() {
    let mut cfg = Config::default();
    cfg.amqp.max_message_size = 1536 * 1024;
    cfg.amqp.max_incomplete_content_bytes = 2 * 1024 * 1024;
    let b = broker_with(cfg).await;
    let mut raw = open(b.amqp_addr()).await;
    raw.open_channel(2).await;
    raw.open_channel(3).await;
    raw.declare_queue(1, "incomplete").await;
    let mut started = BytesMut::from(&publish_frame(1, "incomplete")[..]);
    encode_header_frame(
        1,
        60,
        1024 * 1024,
        &BasicProperties::default(),
        &mut started,
    );
    raw.write(&started).await;
    let mut second = BytesMut::from(&publish_frame(2, "incomplete")[..]);
    encode_header_frame(2, 60, 1536 * 1024, &BasicProperties::default(), &mut second);
    raw.write(&second).await;
    let c = expect_channel_close(&mut raw, 2).await;
    assert_eq!((c.reply_code, c.class_id, c.method_id), (406, 60, 40));
    assert_eq!(
        c.reply_text,
        "PRECONDITION_FAILED - message size 1572864 would take the content this connection has \
         started and not finished to 2621440 bytes, over the limit of 2097152 \
         (amqp.max_incomplete_content_bytes)"
    );
    // Finishing the first message releases its share.
    let mut rest = BytesMut::new();
    encode_body_frames(1, &vec![0u8; 1024 * 1024], 131_072, &mut rest);
    raw.write(&rest).await;
    let mut third = BytesMut::from(&publish_frame(3, "incomplete")[..]);
    encode_header_frame(3, 60, 4, &BasicProperties::default(), &mut third);
    encode_body_frames(3, b"done", 131_072, &mut third);
    raw.write(&third).await;
    raw.send(
        1,
        QueueDeclare {
            queue: "incomplete".into(),
            passive: true,
            ..Default::default()
        },
    )
    .await;
    match raw.recv_method(1).await {
        Method::QueueDeclareOk(ok) => assert_eq!(ok.message_count, 2),
        m => panic!("expected queue.declare-ok, got {m:?}"),
    }
    drop(raw);
    stop(b).await;
}

#[tokio::test]
async fn transactions_are_bounded() {
    let mut cfg = Config::default();
    cfg.amqp.tx_max_operations = 3;
    cfg.amqp.tx_max_bytes = 10;
    let b = broker_with(cfg).await;
    let mut raw = open(b.amqp_addr()).await;
    raw.declare_queue(1, "txq").await;
    raw.send(1, TxSelect {}).await;
    assert!(matches!(raw.recv_method(1).await, Method::TxSelectOk(_)));
    for _ in 0..3 {
        raw.publish(1, "", "txq", b"abc").await;
    }
    raw.publish(1, "", "txq", b"abc").await;
    let c = expect_channel_close(&mut raw, 1).await;
    assert_eq!((c.reply_code, c.class_id, c.method_id), (406, 60, 40));
    assert_eq!(
        c.reply_text,
        "PRECONDITION_FAILED - transaction holds the maximum of 3 publishes and acknowledgements \
         (amqp.tx_max_operations); commit or roll back"
    );
    raw.send(1, ChannelCloseOk {}).await;
    raw.open_channel(1).await;
    raw.send(1, TxSelect {}).await;
    assert!(matches!(raw.recv_method(1).await, Method::TxSelectOk(_)));
    raw.publish(1, "", "txq", b"123456").await;
    raw.publish(1, "", "txq", b"123456").await;
    let c = expect_channel_close(&mut raw, 1).await;
    assert_eq!(
        c.reply_text,
        "PRECONDITION_FAILED - transaction would hold 12 bytes of messages, over the limit of 10 \
         (amqp.tx_max_bytes); commit or roll back"
    );
    drop(raw);
    stop(b).await;
}
