//! The memory alarm cannot lock the broker for good: a client that starts large messages on
//! many channels and then disconnects while paused is noticed, its partial bodies are freed,
//! the alarm clears and paused publishers resume. Alone in its test binary, because it
//! watches the process's resident memory.

use bytes::{BufMut, BytesMut};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;
use warren_amqp::frame::{
    encode_header_frame, encode_method_frame, parse_frame, Frame, Limits, FRAME_BODY, FRAME_END,
    PROTOCOL_HEADER,
};
use warren_amqp::generated::*;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_amqp::{BasicProperties, Bytes, Method};
use warren_server::{Broker, Config};

const WAIT: Duration = Duration::from_secs(10);

/// This process's resident memory in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

struct Raw {
    sock: TcpStream,
    buf: BytesMut,
}

impl Raw {
    /// Logged in, vhost "/" open, heartbeats off, with the connection.blocked capability.
    async fn open(addr: SocketAddr) -> Raw {
        let sock = TcpStream::connect(addr).await.unwrap();
        let mut raw = Raw {
            sock,
            buf: BytesMut::new(),
        };
        raw.sock.write_all(PROTOCOL_HEADER).await.unwrap();
        assert!(matches!(raw.method().await, Method::ConnectionStart(_)));
        let mut caps = FieldTable::new();
        caps.insert("connection.blocked", FieldValue::Bool(true));
        let mut props = FieldTable::new();
        props.insert("capabilities", FieldValue::Table(caps));
        raw.send(
            0,
            ConnectionStartOk {
                client_properties: props,
                mechanism: "PLAIN".into(),
                response: Bytes::from_static(b"\0guest\0guest"),
                locale: "en_US".into(),
            },
        )
        .await;
        assert!(matches!(raw.method().await, Method::ConnectionTune(_)));
        raw.send(
            0,
            ConnectionTuneOk {
                channel_max: 2047,
                frame_max: 131_072,
                heartbeat: 0,
            },
        )
        .await;
        raw.send(
            0,
            ConnectionOpen {
                virtual_host: "/".into(),
                ..Default::default()
            },
        )
        .await;
        assert!(matches!(raw.method().await, Method::ConnectionOpenOk(_)));
        raw
    }

    async fn send(&mut self, channel: u16, m: impl Into<Method>) {
        let mut b = BytesMut::new();
        encode_method_frame(channel, &m.into(), &mut b);
        timeout(WAIT, self.sock.write_all(&b))
            .await
            .expect("write timed out")
            .unwrap();
    }

    /// The next method (any channel), skipping heartbeats; `None` if nothing came in `limit`.
    async fn method_within(&mut self, limit: Duration) -> Option<Method> {
        timeout(limit, async {
            loop {
                match parse_frame(&mut self.buf, &Limits::new(0)).unwrap() {
                    Some(Frame::Method { method, .. }) => return method,
                    Some(_) => continue,
                    None => {}
                }
                let n = self.sock.read_buf(&mut self.buf).await.unwrap();
                assert!(n > 0, "the broker closed the connection");
            }
        })
        .await
        .ok()
    }

    async fn method(&mut self) -> Method {
        self.method_within(WAIT)
            .await
            .expect("timed out waiting for the broker")
    }

    async fn open_channel(&mut self, channel: u16) {
        self.send(channel, ChannelOpen::default()).await;
        assert!(matches!(self.method().await, Method::ChannelOpenOk(_)));
    }
}

#[tokio::test]
async fn a_client_holding_partial_bodies_that_disconnects_while_paused_releases_the_alarm() {
    const CHANNELS: u16 = 10;
    const ANNOUNCED: u64 = 8 * 1024 * 1024;
    const SENT: usize = 7 * 1024 * 1024;
    let mut cfg = Config::default();
    // About half of what the hoarding client holds (70 MiB) above today's footprint.
    cfg.memory.high_watermark_bytes = rss() + 40 * 1024 * 1024;
    let b = timeout(
        WAIT,
        Broker::builder().config(cfg).bind("127.0.0.1:0").start(),
    )
    .await
    .unwrap()
    .unwrap();
    let addr = b.amqp_addr();

    let mut setup = Raw::open(addr).await;
    setup.open_channel(1).await;
    setup
        .send(
            1,
            QueueDeclare {
                queue: "after-alarm".into(),
                ..Default::default()
            },
        )
        .await;
    assert!(matches!(setup.method().await, Method::QueueDeclareOk(_)));

    // The hoarder starts an 8 MiB message on each channel and sends 7 MiB of each.
    let mut hoarder = Raw::open(addr).await;
    for ch in 1..=CHANNELS {
        hoarder.open_channel(ch).await;
    }
    let (_hoarder_rd, mut hoarder_wr) = hoarder.sock.into_split();
    let feeding = tokio::spawn(async move {
        let chunk = vec![7u8; 131_072 - 8];
        for ch in 1..=CHANNELS {
            let mut b = BytesMut::new();
            encode_method_frame(
                ch,
                &Method::BasicPublish(BasicPublish {
                    routing_key: "nowhere".into(),
                    ..Default::default()
                }),
                &mut b,
            );
            encode_header_frame(ch, 60, ANNOUNCED, &BasicProperties::default(), &mut b);
            hoarder_wr.write_all(&b).await?;
            let mut sent = 0;
            while sent < SENT {
                let mut f = BytesMut::with_capacity(chunk.len() + 8);
                f.put_u8(FRAME_BODY);
                f.put_u16(ch);
                f.put_u32(chunk.len() as u32);
                f.put_slice(&chunk);
                f.put_u8(FRAME_END);
                hoarder_wr.write_all(&f).await?;
                sent += chunk.len();
            }
        }
        Ok::<_, std::io::Error>(hoarder_wr)
    });

    // The alarm goes off.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !b.state().memory_alarm() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the memory alarm never went off (rss {} MiB)",
            rss() >> 20
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Another publisher is blocked once it publishes (RabbitMQ blocks connections that
    // publish during an alarm) and, having published, paused.
    let mut publisher = Raw::open(addr).await;
    publisher.open_channel(1).await;
    let mut b2 = BytesMut::new();
    encode_method_frame(
        1,
        &Method::BasicPublish(BasicPublish {
            routing_key: "after-alarm".into(),
            ..Default::default()
        }),
        &mut b2,
    );
    encode_header_frame(1, 60, 1, &BasicProperties::default(), &mut b2);
    b2.extend_from_slice(&[FRAME_BODY, 0, 1, 0, 0, 0, 1, b'x', FRAME_END]);
    publisher.sock.write_all(&b2).await.unwrap();
    match publisher.method().await {
        Method::ConnectionBlocked(m) => assert_eq!(m.reason, "low on memory"),
        m => panic!("expected connection.blocked, got {m:?}"),
    }
    publisher
        .send(
            1,
            QueueDeclare {
                queue: "after-alarm".into(),
                passive: true,
                ..Default::default()
            },
        )
        .await;
    assert!(
        publisher
            .method_within(Duration::from_millis(600))
            .await
            .is_none(),
        "a publisher was served during the memory alarm"
    );

    // The hoarder goes away mid-message (its heartbeats were never negotiated).
    feeding.abort();
    let _ = feeding.await;
    drop(_hoarder_rd);

    // The broker notices, frees the partial bodies, the alarm clears and the publisher
    // resumes: unblocked, then its declare answered with the message it published.
    let mut unblocked = false;
    let mut declared = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !(unblocked && declared.is_some()) {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match publisher.method_within(left).await {
            Some(Method::ConnectionUnblocked(_)) => unblocked = true,
            Some(Method::QueueDeclareOk(ok)) => declared = Some(ok),
            Some(m) => panic!("unexpected {m:?}"),
            None => panic!(
                "the alarm did not clear (rss {} MiB, alarm {})",
                rss() >> 20,
                b.state().memory_alarm()
            ),
        }
    }
    assert_eq!(declared.unwrap().message_count, 1);
    drop(setup);
    drop(publisher);
    timeout(Duration::from_secs(20), b.shutdown())
        .await
        .expect("broker shutdown timed out");
}
