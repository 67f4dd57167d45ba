//! One AMQP 0-9-1 client connection: the handshake (protocol header, connection.start / start-ok
//! with SASL, tune / tune-ok, open), the frame loop that routes frames to channels, heartbeat
//! checking, and the close handshakes in both directions.
//!
//! Everything a connection does to the broker model runs on its own task, synchronously; only
//! socket writes are left to the writer task that drains the [`Outbox`].

use crate::channel::{Channel, ChannelLimits, Context, DurableReplies, Outcome, BASIC_CLASS};
use crate::outbox::Outbox;
use crate::sasl::{self, TransportSecurity};
use crate::state::ServerState;
use bytes::{Bytes, BytesMut};
use std::cell::Cell;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tracing::{debug, info, warn};
use warren_amqp::frame::{
    encode_heartbeat, encode_method_frame, parse_frame, Frame, Limits, FRAME_MIN_SIZE,
    PROTOCOL_HEADER,
};
use warren_amqp::generated::*;
use warren_amqp::table::{FieldTable, FieldValue};
use warren_amqp::{constants, DecodeError, Method};
use warren_broker::login::ConnectionSlot;
use warren_broker::registry::{ConnectionDetails, ConnectionHandle};
use warren_broker::vhost::log::DurableSink;
use warren_broker::{Actor, BrokerError, Credentials, LoginSource, VHost};

/// How long the server waits for connection.close-ok after sending connection.close.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection-level error: sent as connection.close, then the socket is closed.
#[derive(Debug)]
struct ConnError {
    code: u16,
    text: String,
    class_id: u16,
    method_id: u16,
    /// A refused login: `Some(true)` when the client declared the
    /// `authentication_failure_close` capability (it gets this close), `Some(false)` when it
    /// did not (the socket is closed without a word). Either happens after the configured
    /// delay.
    login_refused: Option<bool>,
}

impl ConnError {
    fn new(code: u16, text: impl Into<String>) -> Self {
        ConnError {
            code,
            text: format!("{} - {}", constants::reply_code_name(code), text.into()),
            class_id: 0,
            method_id: 0,
            login_refused: None,
        }
    }
    /// A frame that could not be decoded: 501 FRAME_ERROR (503 for an unknown method), naming
    /// the method whose arguments were malformed, as RabbitMQ does.
    fn decode(e: &DecodeError) -> Self {
        let (class_id, method_id) = e.method_ids();
        let text = match e {
            // RabbitMQ's text for a name that is not UTF-8.
            DecodeError::MethodArguments { reason, .. } if **reason == DecodeError::InvalidUtf8 => {
                reason.to_string()
            }
            _ => e.to_string(),
        };
        ConnError {
            class_id,
            method_id,
            ..ConnError::new(e.reply_code(), text)
        }
    }
    fn from_broker(e: BrokerError, class_id: u16, method_id: u16) -> Self {
        ConnError {
            code: e.code,
            text: e.reply_text(),
            class_id,
            method_id,
            login_refused: None,
        }
    }
}

/// Why the frame loop ended.
enum End {
    /// The peer went away or the socket failed.
    Eof,
    /// The client sent connection.close (close-ok already queued).
    ClientClosed,
    /// The server must close the connection with this error.
    Error(ConnError),
}

/// Serves one accepted plain-TCP socket (from `peer`, accepted on local address `local`) until
/// it closes.
pub async fn serve<S>(
    state: Arc<ServerState>,
    stream: S,
    peer: SocketAddr,
    local: SocketAddr,
    shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    serve_with(
        state,
        stream,
        peer,
        local,
        TransportSecurity::plain(),
        shutdown,
    )
    .await
}

/// [`serve`] for a stream whose transport established `security` (a TLS session, whose
/// verified client certificate SASL EXTERNAL logs in with).
pub async fn serve_with<S>(
    state: Arc<ServerState>,
    stream: S,
    peer: SocketAddr,
    local: SocketAddr,
    security: TransportSecurity,
    shutdown: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let id = state.next_connection_id();
    let span = tracing::info_span!("conn", id, %peer);
    let (rd, wr) = tokio::io::split(stream);
    let fut = async move {
        match run(state.clone(), id, rd, wr, peer, local, security, shutdown).await {
            Ok(()) => debug!("connection closed"),
            Err(e) => debug!(error = %e, "connection ended"),
        }
    };
    tracing::Instrument::instrument(fut, span).await;
}

async fn read_more<R: AsyncRead + Unpin>(rd: &mut R, buf: &mut BytesMut) -> std::io::Result<()> {
    read_more_sized(rd, buf, &mut 4096).await
}

/// Largest read buffer a connection grows to, bytes.
const MAX_READ: usize = 64 * 1024;

/// Reads more bytes into `buf`, with room for at least half of `size` bytes. A read that fills
/// all the room doubles `size` (up to [`MAX_READ`]): busy connections get large reads that
/// batch many frames, idle ones keep a small buffer.
async fn read_more_sized<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    size: &mut usize,
) -> std::io::Result<()> {
    if buf.capacity() - buf.len() < *size / 2 {
        buf.reserve(*size);
    }
    let room = buf.capacity() - buf.len();
    match rd.read_buf(buf).await? {
        0 => Err(std::io::ErrorKind::UnexpectedEof.into()),
        n => {
            if n >= room && *size < MAX_READ {
                *size = (*size * 2).min(MAX_READ);
            }
            Ok(())
        }
    }
}

/// Reads the next frame during the handshake (before the writer task exists).
async fn handshake_frame<R: AsyncRead + Unpin>(
    rd: &mut R,
    buf: &mut BytesMut,
    limits: &Limits,
) -> Result<Frame, ConnError> {
    loop {
        match parse_frame(buf, limits) {
            Ok(Some(Frame::Heartbeat { .. })) => continue,
            Ok(Some(f)) => return Ok(f),
            Ok(None) => read_more(rd, buf)
                .await
                .map_err(|e| ConnError::new(constants::CONNECTION_FORCED, e.to_string()))?,
            Err(e) => return Err(ConnError::decode(&e)),
        }
    }
}

fn expect_method<T>(
    frame: Frame,
    pick: impl FnOnce(Method) -> Option<T>,
    what: &str,
) -> Result<T, ConnError> {
    match frame {
        Frame::Method { channel: 0, method } => {
            let name = method.name();
            pick(method).ok_or_else(|| {
                ConnError::new(
                    constants::COMMAND_INVALID,
                    format!("expected '{what}', got '{name}'"),
                )
            })
        }
        _ => Err(ConnError::new(
            constants::UNEXPECTED_FRAME,
            format!("expected '{what}' on channel 0"),
        )),
    }
}

fn server_properties() -> FieldTable {
    let s = |v: &str| FieldValue::LongString(Bytes::copy_from_slice(v.as_bytes()));
    let mut caps = FieldTable::new();
    for c in [
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "consumer_priorities",
        "authentication_failure_close",
        "per_consumer_qos",
        "direct_reply_to",
    ] {
        caps.insert(c, FieldValue::Bool(true));
    }
    let mut t = FieldTable::new();
    t.insert("capabilities", FieldValue::Table(caps));
    t.insert("cluster_name", s("warren"));
    t.insert("copyright", s("Copyright (c) the Warren developers"));
    t.insert("information", s("Licensed under the MPL 2.0"));
    t.insert("platform", s("Rust"));
    t.insert("product", s("Warren"));
    t.insert("version", s(env!("CARGO_PKG_VERSION")));
    t
}

/// connection.start-ok: the mechanism must be one offered, then the response must name a user
/// the broker lets in. Returns the user's name.
///
/// A refused login is 403 ACCESS_REFUSED with RabbitMQ's generic text whatever the reason
/// (unknown user, wrong password, loopback-only user, unusable certificate), so that the
/// refusal says nothing about which names exist; the reason goes to the log.
fn login(
    state: &ServerState,
    start_ok: &ConnectionStartOk,
    offered: &[&str],
    peer: SocketAddr,
    security: &TransportSecurity,
    cap: impl Fn(&str) -> bool,
) -> Result<String, ConnError> {
    let mechanism = start_ok.mechanism.as_str();
    if !offered.contains(&mechanism) {
        let why = if crate::config::KNOWN_MECHANISMS.contains(&mechanism) {
            "invalid"
        } else {
            "unknown"
        };
        return Err(ConnError::new(
            constants::COMMAND_INVALID,
            format!("{why} authentication mechanism '{mechanism}'"),
        ));
    }
    let refused = |reason: &dyn std::fmt::Display| {
        warn!(%peer, mechanism, "{mechanism} login refused: {reason}");
        ConnError {
            login_refused: Some(cap("authentication_failure_close")),
            ..ConnError::new(
                constants::ACCESS_REFUSED,
                format!(
                    "Login was refused using authentication mechanism {mechanism}. For details see the broker logfile."
                ),
            )
        }
    };
    let auth = &state.config.auth;
    let response =
        sasl::decode(mechanism, &start_ok.response, auth, security).map_err(|e| refused(&e))?;
    let credentials = match &response {
        sasl::Response::Password { user, password } => Credentials::Password { user, password },
        sasl::Response::Certificate { user } => Credentials::Verified { user },
        sasl::Response::Anonymous { user } => Credentials::Anonymous { user },
    };
    let source = LoginSource {
        from_loopback: peer.ip().to_canonical().is_loopback(),
        loopback_users: &state.loopback_users,
    };
    let who = state
        .broker
        .login(credentials, source)
        .map_err(|e| refused(&e))?;
    Ok(who.user)
}

/// What the handshake learned about the client.
struct Session {
    /// The authenticated user.
    user: String,
    /// Counts this connection (and its channels) against the vhost's and the user's limits.
    slot: ConnectionSlot,
    /// The client wants basic.cancel when its queue is deleted.
    cancel_notify: bool,
    /// The client understands connection.blocked / unblocked.
    blocked_notify: bool,
    /// The client's connection.start-ok properties.
    client_properties: FieldTable,
    /// The SASL mechanism it logged in with.
    mechanism: String,
}

/// A request to close the connection from outside its task: an operator's
/// `DELETE /api/connections/{name}`, its vhost or user deleted. The connection's frame loop
/// picks it up and closes with 320 CONNECTION_FORCED.
#[derive(Default)]
struct ForcedClose {
    requested: std::sync::atomic::AtomicBool,
    reason: parking_lot::Mutex<Option<String>>,
    notify: tokio::sync::Notify,
}

impl ForcedClose {
    /// Waits for a close request; returns its error. The frame loop keeps one such future
    /// pinned across its iterations, so waiting costs nothing per read.
    async fn requested(&self) -> ConnError {
        loop {
            let notified = self.notify.notified();
            if self.requested.load(std::sync::atomic::Ordering::Acquire) {
                let reason = self.reason.lock().clone().unwrap_or_default();
                return ConnError::new(constants::CONNECTION_FORCED, reason);
            }
            notified.await;
        }
    }
}

impl warren_broker::registry::ConnectionControl for ForcedClose {
    fn force_close(&self, reason: &str) {
        self.reason.lock().get_or_insert_with(|| reason.to_string());
        self.requested
            .store(true, std::sync::atomic::Ordering::Release);
        self.notify.notify_one();
    }
}

struct Tuned {
    frame_max: u32,
    channel_max: u16,
    heartbeat: u16,
}

#[allow(clippy::too_many_arguments)]
async fn run<R, W>(
    state: Arc<ServerState>,
    id: u64,
    mut rd: R,
    mut wr: W,
    peer: SocketAddr,
    local: SocketAddr,
    security: TransportSecurity,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + Send + 'static,
{
    // How RabbitMQ names a connection in its log.
    let name = format!("{peer} -> {local}");
    let cfg = &state.config.amqp;
    // Small at first: an idle connection should cost little; busy ones grow it in read_more.
    let mut rbuf = BytesMut::with_capacity(4 * 1024);
    let handshake = Duration::from_secs(cfg.handshake_timeout.max(1));

    // Protocol header.
    let header_ok = tokio::time::timeout(handshake, async {
        while rbuf.len() < 8 {
            read_more(&mut rd, &mut rbuf).await?;
        }
        Ok::<_, std::io::Error>(&rbuf[..8] == PROTOCOL_HEADER)
    })
    .await
    .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    if !header_ok {
        wr.write_all(PROTOCOL_HEADER).await?;
        wr.shutdown().await?;
        debug!("bad protocol header; sent ours back");
        return Ok(());
    }
    let _ = rbuf.split_to(8);

    let negotiated = tokio::time::timeout(
        handshake,
        handshake_steps(&state, &mut rd, &mut wr, &mut rbuf, peer, &security),
    )
    .await
    .unwrap_or_else(|_| {
        Err(ConnError::new(
            constants::CONNECTION_FORCED,
            "handshake timed out",
        ))
    });
    let (tuned, vhost, session) = match negotiated {
        Ok(v) => v,
        Err(e) if e.login_refused.is_some() => {
            // As RabbitMQ (rabbit_reader.erl auth_fail/5, handle_exception/3): the close goes
            // out at once to clients that asked for it, the socket closes after a delay for all.
            if e.login_refused == Some(true) {
                let mut out = BytesMut::new();
                encode_method_frame(
                    0,
                    &Method::ConnectionClose(ConnectionClose {
                        reply_code: e.code,
                        reply_text: e.text,
                        class_id: e.class_id,
                        method_id: e.method_id,
                    }),
                    &mut out,
                );
                let _ = wr.write_all(&out).await;
            }
            let delay = Duration::from_millis(state.config.auth.login_failure_delay_ms);
            let until = tokio::time::Instant::now() + delay;
            drain_until_eof(&mut rd, &mut rbuf, delay).await;
            tokio::time::sleep_until(until).await;
            let _ = wr.shutdown().await;
            return Ok(());
        }
        Err(e) => {
            warn!(
                code = e.code,
                "closing AMQP connection ({name}): handshake failed: {}", e.text
            );
            let mut out = BytesMut::new();
            encode_method_frame(
                0,
                &Method::ConnectionClose(ConnectionClose {
                    reply_code: e.code,
                    reply_text: e.text,
                    class_id: e.class_id,
                    method_id: e.method_id,
                }),
                &mut out,
            );
            let _ = wr.write_all(&out).await;
            // Give the client a moment to read the close before the socket goes.
            let _ = tokio::time::timeout(Duration::from_secs(1), rd.read_buf(&mut rbuf)).await;
            let _ = wr.shutdown().await;
            return Ok(());
        }
    };

    let outbox = Arc::new(Outbox::with_high_water(cfg.outbox_high_water_bytes));
    let heartbeat = (tuned.heartbeat > 0).then(|| Duration::from_secs(u64::from(tuned.heartbeat)));
    let writer = {
        let outbox = outbox.clone();
        tokio::spawn(async move {
            if let Err(e) = outbox.run_writer(wr, heartbeat).await {
                debug!(error = %e, "socket write failed");
            }
            outbox.close_after_flush();
        })
    };

    // Who works on this connection, for every operation of its channels.
    let actor = Arc::new(Actor::new(
        session.user.as_str(),
        state
            .broker
            .access()
            .user(&session.user)
            .map(|u| u.tags.clone())
            .unwrap_or_default(),
        vhost.name.as_str(),
        id,
        Some(peer),
    ));
    let durable = Arc::new(DurableReplies::new(outbox.clone()));
    // Listed for operators (`/api/connections`) until the connection ends.
    let forced = Arc::new(ForcedClose::default());
    let registration = state.broker.registry().register(
        ConnectionDetails {
            id,
            name: name.clone(),
            peer,
            local,
            user: session.user.clone(),
            vhost: vhost.name.clone(),
            protocol: "AMQP 0-9-1",
            tls: security.tls.is_some(),
            auth_mechanism: session.mechanism.clone(),
            client_properties: session.client_properties.clone(),
            connected_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            frame_max: tuned.frame_max,
            channel_max: tuned.channel_max,
            heartbeat: tuned.heartbeat,
        },
        forced.clone(),
    );
    let mut conn = Conn {
        registration,
        id,
        state: state.clone(),
        actor,
        vhost,
        outbox: outbox.clone(),
        channels: HashMap::new(),
        frame_max: tuned.frame_max,
        channel_max: tuned.channel_max,
        cancel_notify: session.cancel_notify,
        limits: ChannelLimits {
            max_message_size: cfg.max_message_size,
            max_incomplete_content_bytes: cfg.max_incomplete_content_bytes,
            tx_max_bytes: cfg.tx_max_bytes,
            tx_max_operations: cfg.tx_max_operations,
        },
        incomplete_content: Cell::new(0),
        slot: Some(session.slot),
        durable: durable.clone(),
        published: false,
    };
    // connection.blocked goes to connections that publish, as in RabbitMQ (a client such as
    // lapin stops sending anything once blocked, acks included): registered at the first
    // publish.
    let mut blocked_listener = false;
    let limits = Limits {
        frame_max: tuned.frame_max,
        max_table_depth: cfg.max_table_depth,
    };
    let idle_limit = heartbeat.map(|h| h * 2);
    let mut read_size = 4096;
    let who = format!(
        "{name}, vhost: '{}', user: '{}'",
        conn.vhost.name, conn.actor.user
    );
    info!(
        "connection ({name}): user '{}' authenticated and granted access to vhost '{}'",
        conn.actor.user, conn.vhost.name
    );
    // Why the peer went away, when it did without connection.close.
    let mut eof_reason = "client unexpectedly closed TCP connection".to_string();
    let forced_close = forced.requested();
    tokio::pin!(forced_close);

    let end = 'outer: loop {
        // Frames are handled until the input runs out or the output backs up: a client that
        // does not read what it is sent (replies, returns, confirms, get-oks) is not read from
        // either, so neither buffer grows without bound.
        let mut backlogged = false;
        loop {
            if outbox.is_backlogged() {
                backlogged = true;
                break;
            }
            match parse_frame(&mut rbuf, &limits) {
                Ok(Some(frame)) => {
                    if let Some(end) = conn.handle_frame(frame) {
                        break 'outer end;
                    }
                }
                Ok(None) => break,
                Err(e) => break 'outer End::Error(ConnError::decode(&e)),
            }
        }
        if let Some(slot) = &mut conn.slot {
            slot.set_channels(conn.channels.len() as u64);
        }
        conn.flush_confirms();
        // Replies held behind durable topology changes go once those are on disk.
        if let Some(e) = durable.settle().await {
            break End::Error(ConnError::from_broker(e, 0, 0));
        }
        if conn.published && session.blocked_notify && !blocked_listener {
            state.listen_blocked(&outbox);
            blocked_listener = true;
        }
        if outbox.is_closing() {
            break End::Eof;
        }
        if backlogged || outbox.is_backlogged() {
            let t = std::time::Instant::now();
            if let Some(end) = paused(
                &mut rd,
                &mut rbuf,
                &outbox,
                &mut shutdown,
                &forced,
                true,
                || outbox.is_backlogged(),
            )
            .await
            {
                break end;
            }
            tracing::trace!(
                waited_us = t.elapsed().as_micros() as u64,
                "reading paused until the client read its backlog"
            );
            continue;
        }
        // Memory and disk alarms: as RabbitMQ, a connection that publishes while an alarm is on is no
        // longer read from until memory use falls back; connections that only consume (and
        // so acknowledge, freeing memory) keep going.
        if std::mem::take(&mut conn.published) && state.publishers_paused() {
            debug!("memory or disk alarm: publisher paused");
            if let Some(end) = paused(
                &mut rd,
                &mut rbuf,
                &outbox,
                &mut shutdown,
                &forced,
                false,
                || state.publishers_paused(),
            )
            .await
            {
                break end;
            }
            debug!("alarm cleared: publisher resumed");
            // Input read during the pause is waiting in the buffer.
            continue;
        }
        for q in conn.take_pressure() {
            let t = std::time::Instant::now();
            wait_for_drain(&q).await;
            tracing::trace!(queue = %q.name, waited_us = t.elapsed().as_micros() as u64, "publisher paused");
        }
        let read = async {
            match idle_limit {
                Some(limit) => {
                    tokio::time::timeout(limit, read_more_sized(&mut rd, &mut rbuf, &mut read_size))
                        .await
                        .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()))
                }
                None => read_more_sized(&mut rd, &mut rbuf, &mut read_size).await,
            }
        };
        tokio::select! {
            r = read => match r {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    eof_reason = format!("missed heartbeats from client, timeout: {}s", tuned.heartbeat);
                    break End::Eof;
                }
                Err(_) => break End::Eof,
            },
            _ = shutdown.changed() => {
                break End::Error(ConnError::new(
                    constants::CONNECTION_FORCED,
                    "broker forced connection closure with reason 'shutdown'",
                ));
            }
            e = &mut forced_close => break End::Error(e),
        }
    };

    conn.cleanup();
    // Nothing held behind a durable change leaves before that change is on disk (or is
    // dropped, with the change rolled back).
    let _ = durable.settle().await;
    let linger = close_linger(tuned.heartbeat);
    match end {
        End::Eof => {
            warn!("closing AMQP connection ({who}): {eof_reason}");
            outbox.close_after_flush();
            let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
        }
        End::ClientClosed => {
            info!("closing AMQP connection ({who})");
            // close-ok is queued. The client may still be writing frames it queued before its
            // connection.close (amqplib sends channel 0 ahead of its channels' buffers): keep
            // reading and discarding until it closes the socket, so that closing ours does not
            // reset the connection under a client that is still flushing.
            outbox.close_after_flush();
            let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
            drain_until_eof(&mut rd, &mut rbuf, linger).await;
        }
        End::Error(e) => {
            if e.code == constants::CONNECTION_FORCED {
                info!(code = e.code, "closing AMQP connection ({who}): {}", e.text);
            } else {
                warn!(code = e.code, "closing AMQP connection ({who}): {}", e.text);
            }
            outbox.send(
                0,
                &Method::ConnectionClose(ConnectionClose {
                    reply_code: e.code,
                    reply_text: e.text,
                    class_id: e.class_id,
                    method_id: e.method_id,
                }),
            );
            // Discard everything until connection.close-ok (or close), or time out. At broker
            // shutdown the wait is short: a connection its client does not read (an idle
            // publishing connection of a Celery worker, say) can never answer.
            let linger = if *shutdown.borrow() {
                info!(
                    user = %conn.actor.user,
                    timeout_ms = SHUTDOWN_CLOSE_TIMEOUT.as_millis() as u64,
                    "broker shutdown: waiting for connection.close-ok"
                );
                SHUTDOWN_CLOSE_TIMEOUT
            } else {
                linger
            };
            let since = std::time::Instant::now();
            let waited = tokio::time::timeout(linger, wait_close_ok(&mut rd, &mut rbuf, &limits));
            let answered = match waited.await {
                Ok(true) => {
                    debug!(
                        waited_ms = since.elapsed().as_millis() as u64,
                        "connection.close-ok received"
                    );
                    true
                }
                Ok(false) => {
                    debug!("client closed the socket instead of sending close-ok");
                    false
                }
                Err(_) => {
                    warn!(
                        user = %conn.actor.user,
                        timeout_ms = linger.as_millis() as u64,
                        "no connection.close-ok in time (the client is not reading this \
                         connection); closing the socket"
                    );
                    false
                }
            };
            outbox.close_after_flush();
            let _ = tokio::time::timeout(Duration::from_secs(5), writer).await;
            // The close-ok may have overtaken frames the client still writes: read them until
            // the client closes, briefly, before closing the socket.
            if answered {
                drain_until_eof(&mut rd, &mut rbuf, CLOSE_DRAIN).await;
            }
        }
    }
    Ok(())
}

/// How long the broker waits for the client's side of a close handshake: connection.close-ok
/// after a server-initiated close, the socket's close after a client-initiated one. As in
/// RabbitMQ, the negotiated heartbeat interval when it is set and shorter than
/// [`CLOSE_TIMEOUT`], else [`CLOSE_TIMEOUT`].
fn close_linger(heartbeat_s: u16) -> Duration {
    match Duration::from_secs(u64::from(heartbeat_s)) {
        h if !h.is_zero() && h < CLOSE_TIMEOUT => h,
        _ => CLOSE_TIMEOUT,
    }
}

/// How long a connection.close sent because the broker shuts down waits for close-ok.
const SHUTDOWN_CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// After the server received connection.close-ok, how long it keeps reading frames the client
/// sent before it (and discarding them) while waiting for the client to close its socket.
const CLOSE_DRAIN: Duration = Duration::from_secs(2);

/// Reads and discards whatever the client sends until it closes its side of the socket (or
/// the socket fails), for at most `limit`. Closing a socket with unread input resets the
/// connection, which a client still writing sees as EPIPE / ECONNRESET instead of a clean close.
async fn drain_until_eof<R: AsyncRead + Unpin>(rd: &mut R, rbuf: &mut BytesMut, limit: Duration) {
    let drained = tokio::time::timeout(limit, async {
        loop {
            rbuf.clear();
            if rbuf.capacity() < 4096 {
                rbuf.reserve(4096);
            }
            match rd.read_buf(rbuf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    if drained.is_err() {
        debug!(
            timeout_ms = limit.as_millis() as u64,
            "client kept the socket open after the close handshake"
        );
    }
}

/// Reads frames after a server-initiated connection.close until connection.close-ok (or a
/// crossing connection.close) arrives, discarding all others. Returns false when the client
/// closed the socket first. Frames that cannot be parsed are skipped byte-wise: the broker has
/// already given up on this connection and only listens for the handshake's end.
async fn wait_close_ok<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    limits: &Limits,
) -> bool {
    // The negotiated frame_max still bounds what is buffered: an oversized frame is dropped
    // with the rest of the buffer below.
    loop {
        loop {
            match parse_frame(rbuf, limits) {
                Ok(Some(Frame::Method {
                    channel: 0,
                    method: Method::ConnectionCloseOk(_) | Method::ConnectionClose(_),
                })) => return true,
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => {
                    // Skip the undecodable frame by its announced size, or drop the buffer
                    // when even the header is unusable.
                    match skip_frame(rbuf) {
                        true => {}
                        false => {
                            debug!(error = %e, "unparseable input while closing; discarded");
                            rbuf.clear();
                            break;
                        }
                    }
                }
            }
        }
        if read_more(rd, rbuf).await.is_err() {
            return false;
        }
    }
}

/// Removes one frame from the front of `buf` by its header's size when the whole frame is
/// buffered; false when the frame is incomplete or its header is unusable.
fn skip_frame(buf: &mut BytesMut) -> bool {
    let Some(h) = buf.first_chunk::<7>() else {
        return false;
    };
    let size = u32::from_be_bytes([h[3], h[4], h[5], h[6]]) as usize;
    let total = size.saturating_add(8);
    if !(1..=3).contains(&h[0]) && h[0] != 8 || buf.len() < total {
        return false;
    }
    let _ = buf.split_to(total);
    true
}

/// connection.start → start-ok → tune → tune-ok → open → open-ok. Returns the negotiated
/// tuning, the vhost and whether the client wants basic.cancel notifications.
async fn handshake_steps<R, W>(
    state: &ServerState,
    rd: &mut R,
    wr: &mut W,
    rbuf: &mut BytesMut,
    peer: SocketAddr,
    security: &TransportSecurity,
) -> Result<(Tuned, Arc<VHost>, Session), ConnError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let cfg = &state.config.amqp;
    let io_err = |e: std::io::Error| ConnError::new(constants::CONNECTION_FORCED, e.to_string());
    let limits = Limits {
        frame_max: cfg.frame_max.max(FRAME_MIN_SIZE),
        max_table_depth: cfg.max_table_depth,
    };
    let offered = sasl::offered(&state.config.auth, security);
    let mut out = BytesMut::new();
    encode_method_frame(
        0,
        &Method::ConnectionStart(ConnectionStart {
            version_major: 0,
            version_minor: 9,
            server_properties: server_properties(),
            mechanisms: sasl::mechanisms_field(&offered),
            locales: Bytes::from_static(b"en_US"),
        }),
        &mut out,
    );
    wr.write_all(&out).await.map_err(io_err)?;

    let start_ok = expect_method(
        handshake_frame(rd, rbuf, &limits).await?,
        |m| match m {
            Method::ConnectionStartOk(s) => Some(s),
            _ => None,
        },
        "connection.start-ok",
    )?;
    let caps = start_ok
        .client_properties
        .get("capabilities")
        .and_then(|c| c.as_table());
    let cap = |name: &str| {
        caps.and_then(|c| c.get(name))
            .and_then(|v| v.as_bool())
            .unwrap_or(false)
    };
    let cancel_notify = cap("consumer_cancel_notify");
    let client_properties = start_ok.client_properties.clone();
    let mechanism = start_ok.mechanism.clone();
    let blocked_notify = cap("connection.blocked");
    let user = login(state, &start_ok, &offered, peer, security, cap)?;
    out.clear();
    encode_method_frame(
        0,
        &Method::ConnectionTune(ConnectionTune {
            channel_max: cfg.channel_max,
            frame_max: cfg.frame_max,
            heartbeat: cfg.heartbeat,
        }),
        &mut out,
    );
    wr.write_all(&out).await.map_err(io_err)?;
    let tune_ok = expect_method(
        handshake_frame(rd, rbuf, &limits).await?,
        |m| match m {
            Method::ConnectionTuneOk(t) => Some(t),
            _ => None,
        },
        "connection.tune-ok",
    )?;
    let frame_max = match tune_ok.frame_max {
        0 => cfg.frame_max,
        f if f > cfg.frame_max => {
            return Err(ConnError::new(
                constants::NOT_ALLOWED,
                format!("frame_max={f} > {} max size", cfg.frame_max),
            ))
        }
        f if f < FRAME_MIN_SIZE => {
            return Err(ConnError::new(
                constants::NOT_ALLOWED,
                format!("frame_max={f} < {FRAME_MIN_SIZE} min size"),
            ))
        }
        f => f,
    };
    let channel_max = match tune_ok.channel_max {
        0 => cfg.channel_max,
        c if c > cfg.channel_max => {
            return Err(ConnError::new(
                constants::NOT_ALLOWED,
                format!("channel_max={c} > {} max", cfg.channel_max),
            ))
        }
        c => c,
    };
    let tuned = Tuned {
        frame_max,
        channel_max,
        heartbeat: tune_ok.heartbeat,
    };

    let open = expect_method(
        handshake_frame(
            rd,
            rbuf,
            &Limits {
                frame_max,
                ..limits
            },
        )
        .await?,
        |m| match m {
            Method::ConnectionOpen(o) => Some(o),
            _ => None,
        },
        "connection.open",
    )?;
    // connection.open: the vhost, its limits, the user's limits and permissions, in one place
    // (RabbitMQ names connection.open, 10/40, in these closes).
    let open_error = |e: BrokerError| {
        ConnError::from_broker(e, ConnectionOpen::CLASS_ID, ConnectionOpen::METHOD_ID)
    };
    let slot = state
        .sessions
        .open_connection(&state.broker.access(), &user, &open.virtual_host)
        .map_err(open_error)?;
    let vhost = state.broker.vhost(&open.virtual_host).ok_or_else(|| {
        open_error(BrokerError::not_allowed(format!(
            "vhost {} not found",
            open.virtual_host
        )))
    })?;
    out.clear();
    encode_method_frame(
        0,
        &Method::ConnectionOpenOk(ConnectionOpenOk {
            known_hosts: String::new(),
        }),
        &mut out,
    );
    wr.write_all(&out).await.map_err(io_err)?;
    Ok((
        tuned,
        vhost,
        Session {
            user,
            slot,
            cancel_notify,
            blocked_notify,
            client_properties,
            mechanism,
        },
    ))
}

struct Conn {
    id: u64,
    /// This connection's entry in the operators' read model.
    registration: ConnectionHandle,
    vhost: Arc<VHost>,
    outbox: Arc<Outbox>,
    channels: HashMap<u16, Channel>,
    frame_max: u32,
    channel_max: u16,
    cancel_notify: bool,
    limits: ChannelLimits,
    /// Content announced and not yet received over all channels, bytes.
    incomplete_content: Cell<u64>,
    /// This connection's place in the vhost's and user's connection and channel counts;
    /// given up at cleanup, so that a closing connection no longer counts.
    slot: Option<ConnectionSlot>,
    state: Arc<ServerState>,
    actor: Arc<Actor>,
    durable: Arc<dyn DurableSink>,
    /// The client published since the last check (the memory alarm pauses publishers).
    published: bool,
}

impl Conn {
    fn handle_frame(&mut self, frame: Frame) -> Option<End> {
        let ctx = Context {
            broker: &self.state.broker,
            actor: &self.actor,
            vhost: &self.vhost,
            limits: self.limits,
            incomplete_content: &self.incomplete_content,
            durable: &self.durable,
        };
        match frame {
            Frame::Heartbeat { channel: 0 } => None,
            // RabbitMQ: a heartbeat belongs on channel 0.
            Frame::Heartbeat { channel } => Some(End::Error(ConnError::new(
                constants::UNEXPECTED_FRAME,
                format!("heartbeat frame on channel {channel}"),
            ))),
            Frame::Method { channel: 0, method } => self.connection_method(method),
            Frame::Method { channel, method } => {
                let (class_id, method_id) = (method.class_id(), method.method_id());
                if matches!(method, Method::BasicPublish(_)) {
                    self.published = true;
                }
                let Some(ch) = self.channels.get_mut(&channel) else {
                    return match method {
                        Method::ChannelOpen(_) => {
                            // channel_max bounds how many channels are open at once, not their
                            // numbers (RabbitMQ's rabbit_reader:create_channel).
                            let open = self.channels.len();
                            if self.channel_max != 0 && open >= usize::from(self.channel_max) {
                                return Some(End::Error(ConnError::new(
                                    constants::NOT_ALLOWED,
                                    format!(
                                        "number of channels opened ({open}) has reached the negotiated channel_max ({})",
                                        self.channel_max
                                    ),
                                )));
                            }
                            // The user's max-channels over all their connections (530).
                            let counted = self.slot.as_mut().map(|slot| {
                                slot.open_channel(&self.state.broker.access(), open as u64)
                            });
                            if let Some(Err(e)) = counted {
                                // RabbitMQ names no method in this close.
                                return Some(End::Error(ConnError::from_broker(e, 0, 0)));
                            }
                            let ch = Channel::new(
                                channel,
                                self.outbox.clone(),
                                self.frame_max,
                                self.cancel_notify,
                                self.registration.open_channel(channel),
                            );
                            self.outbox.send(
                                channel,
                                &Method::ChannelOpenOk(ChannelOpenOk {
                                    channel_id: Bytes::new(),
                                }),
                            );
                            self.channels.insert(channel, ch);
                            None
                        }
                        _ => Some(End::Error(ConnError {
                            class_id,
                            method_id,
                            ..ConnError::new(constants::CHANNEL_ERROR, "expected 'channel.open'")
                        })),
                    };
                };
                // A method where content was expected: RabbitMQ names the pending basic.publish.
                let (class_id, method_id) = if ch.expects_content() {
                    (BASIC_CLASS, BasicPublish::METHOD_ID)
                } else {
                    (class_id, method_id)
                };
                if ch.closing {
                    match method {
                        Method::ChannelCloseOk(_) => {
                            self.channels.remove(&channel);
                        }
                        Method::ChannelClose(_) => {
                            self.outbox
                                .send(channel, &Method::ChannelCloseOk(ChannelCloseOk {}));
                            self.channels.remove(&channel);
                        }
                        _ => {}
                    }
                    return None;
                }
                match ch.handle_method(&ctx, method) {
                    Ok(Outcome::Done) => None,
                    Ok(Outcome::Closed) => {
                        self.channels.remove(&channel);
                        None
                    }
                    Err(e) => self.channel_error(channel, e, class_id, method_id),
                }
            }
            Frame::Header {
                channel,
                class_id,
                weight,
                body_size,
                properties,
            } => {
                let ch = match content_channel(&mut self.channels, channel) {
                    Ok(Some(ch)) => ch,
                    Ok(None) => return None,
                    Err(e) => return Some(End::Error(e)),
                };
                let (c, m) = content_error_ids(ch);
                match ch.handle_header(&ctx, class_id, weight, body_size, properties) {
                    Ok(()) => None,
                    Err(e) => self.channel_error(channel, e, c, m),
                }
            }
            Frame::Body { channel, payload } => {
                let ch = match content_channel(&mut self.channels, channel) {
                    Ok(Some(ch)) => ch,
                    Ok(None) => return None,
                    Err(e) => return Some(End::Error(e)),
                };
                let (c, m) = content_error_ids(ch);
                match ch.handle_body(&ctx, payload) {
                    Ok(()) => None,
                    Err(e) => self.channel_error(channel, e, c, m),
                }
            }
        }
    }

    /// Soft errors close the channel; hard ones the connection.
    fn channel_error(
        &mut self,
        channel: u16,
        e: BrokerError,
        class_id: u16,
        method_id: u16,
    ) -> Option<End> {
        if e.is_hard() {
            return Some(End::Error(ConnError::from_broker(e, class_id, method_id)));
        }
        debug!(channel, code = e.code, text = %e.text, "closing channel");
        let ctx = Context {
            broker: &self.state.broker,
            actor: &self.actor,
            vhost: &self.vhost,
            limits: self.limits,
            incomplete_content: &self.incomplete_content,
            durable: &self.durable,
        };
        if let Some(ch) = self.channels.get_mut(&channel) {
            ch.close_with_error(&ctx, &e, class_id, method_id);
        }
        None
    }

    fn connection_method(&mut self, method: Method) -> Option<End> {
        match method {
            Method::ConnectionClose(_) => {
                self.cleanup();
                self.outbox
                    .send(0, &Method::ConnectionCloseOk(ConnectionCloseOk {}));
                Some(End::ClientClosed)
            }
            Method::ConnectionUpdateSecret(_) => {
                self.outbox.send(
                    0,
                    &Method::ConnectionUpdateSecretOk(ConnectionUpdateSecretOk {}),
                );
                None
            }
            // RabbitMQ (rabbit_reader:handle_method0) answers CHANNEL_ERROR here.
            other => Some(End::Error(ConnError {
                class_id: other.class_id(),
                method_id: other.method_id(),
                ..ConnError::new(
                    constants::CHANNEL_ERROR,
                    "unexpected method in connection state running",
                )
            })),
        }
    }

    fn take_pressure(&mut self) -> Vec<Arc<warren_broker::Queue>> {
        let mut out: Vec<Arc<warren_broker::Queue>> = Vec::new();
        for ch in self.channels.values_mut() {
            if let Some(q) = ch.take_pressure() {
                if !out.iter().any(|o| Arc::ptr_eq(o, &q)) {
                    out.push(q);
                }
            }
        }
        out
    }

    fn flush_confirms(&mut self) {
        for ch in self.channels.values_mut() {
            ch.flush_confirms();
        }
    }

    /// Releases every channel's consumers and unacked messages, and this connection's
    /// exclusive queues. Idempotent.
    fn cleanup(&mut self) {
        let ctx = Context {
            broker: &self.state.broker,
            actor: &self.actor,
            vhost: &self.vhost,
            limits: self.limits,
            incomplete_content: &self.incomplete_content,
            durable: &self.durable,
        };
        for (_, mut ch) in self.channels.drain() {
            ch.cleanup(&ctx);
        }
        self.vhost.remove_exclusive_queues(self.id);
        self.slot = None;
    }
}

/// Class and method ids for an error caused by a content frame: the pending basic.publish, or
/// none when no content was expected (as RabbitMQ reports them).
fn content_error_ids(ch: &Channel) -> (u16, u16) {
    if ch.expects_content() {
        (BASIC_CLASS, BasicPublish::METHOD_ID)
    } else {
        (0, 0)
    }
}

/// The open channel a content frame belongs to; `Ok(None)` when the channel is closing
/// (the frame is discarded). A content frame on channel 0 or on a channel that is not open is
/// 505 UNEXPECTED_FRAME, as in RabbitMQ (whose channel expects a method first).
fn content_channel(
    channels: &mut HashMap<u16, Channel>,
    channel: u16,
) -> Result<Option<&mut Channel>, ConnError> {
    if channel == 0 {
        return Err(ConnError::new(
            constants::UNEXPECTED_FRAME,
            "content frame on channel 0",
        ));
    }
    match channels.get_mut(&channel) {
        None => Err(ConnError::new(
            constants::UNEXPECTED_FRAME,
            "expected method frame, got non method frame instead",
        )),
        Some(ch) if ch.closing => Ok(None),
        Some(ch) => Ok(Some(ch)),
    }
}

/// How often a paused connection's client is probed with a heartbeat frame.
const PAUSED_PROBE: Duration = Duration::from_secs(2);

/// Input a paused connection still reads (and holds unprocessed), bytes: enough to see the
/// client close its socket behind a few frames it sent meanwhile.
const PAUSED_READ_MAX: usize = 256 * 1024;

/// Keeps a connection from processing its client's frames while `blocked()` holds, yet
/// watches it: the client closing its socket (up to [`PAUSED_READ_MAX`] bytes of input are
/// read meanwhile, unprocessed), the writer failing (a heartbeat to a client that vanished),
/// and broker shutdown each end the pause with the connection's end. `drain` wakes the check
/// whenever the writer drains the outbox (else it is polled every 100 ms).
async fn paused<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    outbox: &Outbox,
    shutdown: &mut watch::Receiver<bool>,
    forced: &ForcedClose,
    drain: bool,
    mut blocked: impl FnMut() -> bool,
) -> Option<End> {
    let mut probe = tokio::time::Instant::now() + PAUSED_PROBE;
    loop {
        if outbox.is_closing() {
            return Some(End::Eof);
        }
        if !blocked() {
            return None;
        }
        if tokio::time::Instant::now() >= probe {
            // A heartbeat frame (which clients accept at any time) to a client that has gone
            // away draws a reset, and the writer's failure ends the pause, heartbeats
            // negotiated or not.
            outbox.with(encode_heartbeat);
            probe = tokio::time::Instant::now() + PAUSED_PROBE;
        }
        let can_read = rbuf.len() < PAUSED_READ_MAX;
        tokio::select! {
            _ = outbox.drained(), if drain => {}
            _ = tokio::time::sleep(Duration::from_millis(100)), if !drain => {}
            _ = tokio::time::sleep_until(probe), if drain => {}
            _ = shutdown.changed() => {
                return Some(End::Error(ConnError::new(
                    constants::CONNECTION_FORCED,
                    "broker forced connection closure with reason 'shutdown'",
                )));
            }
            e = forced.requested() => return Some(End::Error(e)),
            r = read_more(rd, rbuf), if can_read => {
                if r.is_err() {
                    debug!("client closed the socket while its connection was paused");
                    return Some(End::Eof);
                }
            }
        }
    }
}

/// Publisher flow control: stops reading from a publisher while a queue it feeds is
/// pressured, until the queue drains or its consumers stall (no delivery for 250 ms, e.g. all
/// at their prefetch limit and not acking). A stalled queue takes the backlog on disk instead,
/// and publishers do not wait for it again until its consumers make progress.
async fn wait_for_drain(q: &warren_broker::Queue) {
    let mut last = q.deliveries();
    if q.stalled_at() == Some(last) {
        return;
    }
    let mut since = tokio::time::Instant::now();
    while q.is_pressured() {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let now = q.deliveries();
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= Duration::from_millis(250) {
            debug!(queue = %q.name, "consumers stalled; publisher resumes");
            q.mark_stalled(now);
            return;
        }
    }
}
