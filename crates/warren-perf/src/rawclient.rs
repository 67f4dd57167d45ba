//! A minimal AMQP 0-9-1 client on Warren's own codec (`warren-amqp`), for the
//! workloads where the client library would otherwise be the bottleneck or
//! too heavy to run by the thousand: connection churn, many queues, many
//! connections, recovery and the raw-frame ceiling runs.
//!
//! It speaks exactly what those workloads need: the connection handshake
//! (PLAIN login, heartbeats off, frame_max up to 128 KiB), synchronous
//! method calls, publishing, and frame-level access for the callers that scan
//! deliveries themselves. A `connection.close` or `channel.close` from the
//! broker turns into an error carrying its reply code and text.

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use warren_amqp::frame::{Frame, Limits, PROTOCOL_HEADER};
use warren_amqp::{
    encode_body_frames, encode_header_frame, encode_method_frame, parse_frame, BasicProperties,
    BasicPublish, ChannelOpen, ConnectionClose, ConnectionOpen, ConnectionStartOk,
    ConnectionTuneOk, FieldTable, FieldValue, Method,
};

use crate::uri::AmqpUri;

/// The largest frame this client asks for (bytes, overhead included).
pub const CLIENT_FRAME_MAX: u32 = 131_072;

/// One AMQP connection: the socket, a read buffer and a write buffer.
pub struct RawConn {
    /// The socket; callers that scan frames themselves take it over with
    /// [`RawConn::into_parts`].
    stream: TcpStream,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// Negotiated frame_max in bytes.
    pub frame_max: u32,
    limits: Limits,
}

fn io_err(what: &str, e: std::io::Error) -> String {
    format!("{what}: {e}")
}

/// The error text for a close method from the broker, if `m` is one.
pub fn close_error(m: &Method) -> Option<String> {
    match m {
        Method::ConnectionClose(c) => Some(format!(
            "connection.close {} {} (class {} method {})",
            c.reply_code, c.reply_text, c.class_id, c.method_id
        )),
        Method::ChannelClose(c) => Some(format!(
            "channel.close {} {} (class {} method {})",
            c.reply_code, c.reply_text, c.class_id, c.method_id
        )),
        _ => None,
    }
}

impl RawConn {
    /// Connects to `uri` and completes the handshake: protocol header,
    /// start-ok (PLAIN), tune-ok (channel_max as offered, frame_max at most
    /// [`CLIENT_FRAME_MAX`], heartbeat 0) and open. Errors name the step.
    pub async fn connect(uri: &AmqpUri, name: &str) -> Result<RawConn, String> {
        let stream = TcpStream::connect((uri.host.as_str(), uri.port))
            .await
            .map_err(|e| io_err("connect", e))?;
        stream.set_nodelay(true).map_err(|e| io_err("nodelay", e))?;
        let mut c = RawConn {
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
            wbuf: BytesMut::with_capacity(4 * 1024),
            frame_max: CLIENT_FRAME_MAX,
            limits: Limits::new(CLIENT_FRAME_MAX),
        };
        c.stream
            .write_all(PROTOCOL_HEADER)
            .await
            .map_err(|e| io_err("protocol header", e))?;
        match c.recv_method().await? {
            (0, Method::ConnectionStart(_)) => {}
            (_, m) => return Err(format!("expected connection.start, got {}", m.name())),
        }
        let mut response = Vec::with_capacity(2 + uri.user.len() + uri.password.len());
        response.push(0);
        response.extend_from_slice(uri.user.as_bytes());
        response.push(0);
        response.extend_from_slice(uri.password.as_bytes());
        let props = FieldTable(vec![
            (
                "product".to_string(),
                FieldValue::LongString("warren-perf".into()),
            ),
            (
                "connection_name".to_string(),
                FieldValue::LongString(name.as_bytes().to_vec().into()),
            ),
        ]);
        c.push(
            0,
            ConnectionStartOk {
                client_properties: props,
                mechanism: "PLAIN".into(),
                response: response.into(),
                locale: "en_US".into(),
            }
            .into(),
        );
        c.flush().await?;
        let tune = match c.recv_method().await? {
            (0, Method::ConnectionTune(t)) => t,
            (_, m) => return Err(format!("expected connection.tune, got {}", m.name())),
        };
        let frame_max = match tune.frame_max {
            0 => CLIENT_FRAME_MAX,
            f => f.min(CLIENT_FRAME_MAX),
        };
        c.frame_max = frame_max;
        c.limits = Limits::new(frame_max);
        c.push(
            0,
            ConnectionTuneOk {
                channel_max: tune.channel_max,
                frame_max,
                heartbeat: 0,
            }
            .into(),
        );
        c.push(
            0,
            ConnectionOpen {
                virtual_host: uri.vhost.clone(),
                ..Default::default()
            }
            .into(),
        );
        c.flush().await?;
        match c.recv_method().await? {
            (0, Method::ConnectionOpenOk(_)) => Ok(c),
            (_, m) => Err(format!("expected connection.open-ok, got {}", m.name())),
        }
    }

    /// Appends a method frame to the write buffer (sent by [`RawConn::flush`]).
    pub fn push(&mut self, channel: u16, m: Method) {
        encode_method_frame(channel, &m, &mut self.wbuf);
    }

    /// Appends a basic.publish with its header and body frames.
    pub fn push_publish(
        &mut self,
        channel: u16,
        exchange: &str,
        routing_key: &str,
        props: &BasicProperties,
        body: &[u8],
    ) {
        push_publish(
            &mut self.wbuf,
            channel,
            exchange,
            routing_key,
            props,
            body,
            self.frame_max,
        );
    }

    /// Writes out everything pushed so far.
    pub async fn flush(&mut self) -> Result<(), String> {
        if !self.wbuf.is_empty() {
            self.stream
                .write_all(&self.wbuf)
                .await
                .map_err(|e| io_err("write", e))?;
            self.wbuf.clear();
        }
        Ok(())
    }

    /// The next frame from the broker (heartbeats included).
    pub async fn recv_frame(&mut self) -> Result<Frame, String> {
        loop {
            match parse_frame(&mut self.rbuf, &self.limits) {
                Ok(Some(f)) => return Ok(f),
                Ok(None) => {}
                Err(e) => return Err(format!("bad frame from broker: {e}")),
            }
            if self.rbuf.capacity() - self.rbuf.len() < 4096 {
                self.rbuf.reserve(16 * 1024);
            }
            let n = self
                .stream
                .read_buf(&mut self.rbuf)
                .await
                .map_err(|e| io_err("read", e))?;
            if n == 0 {
                return Err("connection closed by broker (EOF)".into());
            }
        }
    }

    /// The next method frame, skipping heartbeats; a close from the broker
    /// is an error (and is answered with its close-ok).
    pub async fn recv_method(&mut self) -> Result<(u16, Method), String> {
        loop {
            match self.recv_frame().await? {
                Frame::Method { channel, method } => {
                    if let Some(e) = close_error(&method) {
                        let ok: Method = match method {
                            Method::ConnectionClose(_) => warren_amqp::ConnectionCloseOk.into(),
                            _ => warren_amqp::ChannelCloseOk.into(),
                        };
                        self.push(channel, ok);
                        let _ = self.flush().await;
                        return Err(e);
                    }
                    return Ok((channel, method));
                }
                Frame::Heartbeat { .. } => continue,
                other => {
                    return Err(format!(
                        "unexpected content frame on channel {}",
                        other.channel()
                    ))
                }
            }
        }
    }

    /// Sends `m` on `channel` and returns the next method the broker sends.
    pub async fn call(&mut self, channel: u16, m: Method) -> Result<Method, String> {
        let name = m.name();
        self.push(channel, m);
        self.flush().await?;
        let (_, reply) = self
            .recv_method()
            .await
            .map_err(|e| format!("{name}: {e}"))?;
        Ok(reply)
    }

    /// Opens channel `channel`.
    pub async fn open_channel(&mut self, channel: u16) -> Result<(), String> {
        match self.call(channel, ChannelOpen::default().into()).await? {
            Method::ChannelOpenOk(_) => Ok(()),
            m => Err(format!("expected channel.open-ok, got {}", m.name())),
        }
    }

    /// Closes the connection politely (connection.close, then waits up to
    /// 5 s for close-ok); errors are ignored, the socket is dropped anyway.
    pub async fn close(mut self) {
        self.push(
            0,
            ConnectionClose {
                reply_code: 200,
                reply_text: "Goodbye".into(),
                class_id: 0,
                method_id: 0,
            }
            .into(),
        );
        if self.flush().await.is_err() {
            return;
        }
        let wait = async {
            loop {
                match self.recv_frame().await {
                    Ok(Frame::Method {
                        method: Method::ConnectionCloseOk(_),
                        ..
                    })
                    | Err(_) => break,
                    Ok(_) => {}
                }
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), wait).await;
    }

    /// The socket and whatever was read past the last parsed frame, for
    /// callers that scan frames themselves.
    pub fn into_parts(self) -> (TcpStream, BytesMut) {
        (self.stream, self.rbuf)
    }
}

/// Appends a basic.publish method frame, its content header and body
/// frames to `buf`.
pub fn push_publish(
    buf: &mut BytesMut,
    channel: u16,
    exchange: &str,
    routing_key: &str,
    props: &BasicProperties,
    body: &[u8],
    frame_max: u32,
) {
    let m: Method = BasicPublish {
        exchange: exchange.into(),
        routing_key: routing_key.into(),
        ..Default::default()
    }
    .into();
    encode_method_frame(channel, &m, buf);
    encode_header_frame(channel, 60, body.len() as u64, props, buf);
    encode_body_frames(channel, body, frame_max, buf);
}

/// A frame seen by [`FrameScanner`]: its type, channel and payload.
pub struct RawFrame<'a> {
    /// Frame type: 1 method, 2 header, 3 body, 8 heartbeat.
    pub kind: u8,
    /// The payload, without the 7-byte header and the frame-end octet.
    pub payload: &'a [u8],
}

impl RawFrame<'_> {
    /// (class id, method id) of a method frame.
    pub fn method_id(&self) -> Option<(u16, u16)> {
        if self.kind != 1 || self.payload.len() < 4 {
            return None;
        }
        let p = self.payload;
        Some((
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        ))
    }

    /// The delivery tag of a basic.deliver method frame (class 60 method
    /// 60: consumer-tag shortstr, then delivery-tag u64), read without
    /// decoding the rest.
    pub fn deliver_tag(&self) -> Option<u64> {
        let p = self.payload;
        let len = *p.get(4)? as usize;
        let at = 5 + len;
        Some(u64::from_be_bytes(p.get(at..at + 8)?.try_into().ok()?))
    }

    /// (delivery tag, multiple) of a basic.ack or basic.nack method frame.
    pub fn ack_fields(&self) -> Option<(u64, bool)> {
        let p = self.payload;
        let tag = u64::from_be_bytes(p.get(4..12)?.try_into().ok()?);
        Some((tag, p.get(12)? & 1 == 1))
    }
}

/// Walks complete frames in a byte buffer without decoding them: 7-byte
/// header, payload, frame-end; a partial frame at the end is left for the
/// next read.
pub struct FrameScanner {
    buf: Vec<u8>,
    len: usize,
}

impl FrameScanner {
    /// A scanner with a read buffer of `cap` bytes (at least 2 frames of
    /// [`CLIENT_FRAME_MAX`] are kept room for).
    pub fn new(cap: usize, initial: &[u8]) -> FrameScanner {
        let cap = cap
            .max(2 * CLIENT_FRAME_MAX as usize)
            .max(initial.len() * 2);
        let mut buf = vec![0u8; cap];
        buf[..initial.len()].copy_from_slice(initial);
        FrameScanner {
            buf,
            len: initial.len(),
        }
    }

    /// The free tail of the buffer to read into; call [`FrameScanner::filled`] after.
    pub fn spare(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..]
    }

    /// Records `n` bytes read into [`FrameScanner::spare`].
    pub fn filled(&mut self, n: usize) {
        self.len += n;
    }

    /// Calls `f` on every complete frame buffered, then keeps only the
    /// incomplete rest. Errors on a bad frame-end octet.
    pub fn scan(&mut self, mut f: impl FnMut(RawFrame<'_>)) -> Result<(), String> {
        let mut pos = 0;
        let b = &self.buf[..self.len];
        while b.len() - pos >= 8 {
            let size =
                u32::from_be_bytes([b[pos + 3], b[pos + 4], b[pos + 5], b[pos + 6]]) as usize;
            let end = pos + 7 + size;
            if end >= b.len() {
                if size + 8 > self.buf.len() {
                    return Err(format!("frame of {size} bytes exceeds the read buffer"));
                }
                break;
            }
            if b[end] != 0xCE {
                return Err("bad frame end octet".into());
            }
            f(RawFrame {
                kind: b[pos],
                payload: &b[pos + 7..end],
            });
            pos = end + 1;
        }
        if pos > 0 {
            self.buf.copy_within(pos..self.len, 0);
            self.len -= pos;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_amqp::{BasicAck, BasicDeliver};

    #[test]
    fn scanner_finds_deliveries_and_acks_across_reads() {
        let mut buf = BytesMut::new();
        for tag in 1..=3u64 {
            let d: Method = BasicDeliver {
                consumer_tag: "ctag-xyz".into(),
                delivery_tag: tag,
                redelivered: false,
                exchange: "".into(),
                routing_key: "q".into(),
            }
            .into();
            encode_method_frame(1, &d, &mut buf);
            encode_header_frame(1, 60, 5, &BasicProperties::default(), &mut buf);
            encode_body_frames(1, b"hello", 4096, &mut buf);
        }
        let a: Method = BasicAck {
            delivery_tag: 77,
            multiple: true,
        }
        .into();
        encode_method_frame(1, &a, &mut buf);
        let all = buf.to_vec();
        // Feed it in awkward pieces.
        let mut sc = FrameScanner::new(1024, &all[..10]);
        let (mut tags, mut acks, mut frames) = (Vec::new(), Vec::new(), 0);
        let mut fed = 10;
        loop {
            sc.scan(|f| {
                frames += 1;
                match f.method_id() {
                    Some((60, 60)) => tags.push(f.deliver_tag().unwrap()),
                    Some((60, 80)) => acks.push(f.ack_fields().unwrap()),
                    _ => {}
                }
            })
            .unwrap();
            if fed == all.len() {
                break;
            }
            let n = 7.min(all.len() - fed);
            sc.spare()[..n].copy_from_slice(&all[fed..fed + n]);
            sc.filled(n);
            fed += n;
        }
        assert_eq!(tags, vec![1, 2, 3]);
        assert_eq!(acks, vec![(77, true)]);
        assert_eq!(frames, 10);
    }

    #[test]
    fn scanner_rejects_bad_frame_end() {
        let mut sc = FrameScanner::new(0, &[1, 0, 1, 0, 0, 0, 1, 9, 0]);
        assert!(sc.scan(|_| {}).is_err());
    }
}
