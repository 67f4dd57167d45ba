//! One AMQP 0-9-1 client connection: the handshake (protocol header, connection.start / start-ok
//! with SASL, tune / tune-ok, open), the frame loop that routes frames to channels, heartbeat
//! checking, and the close handshakes in both directions.
//!
//! Everything a connection does to the broker model runs on its own task, synchronously; only
//! socket writes are left to the writer task that drains the [`Outbox`].
//!
//! This file holds the connection's task ([`serve`] and its read loop); the rest has a file
//! below `connection/`: `handshake.rs` (start, SASL login, tune, open), `frames.rs` (the frame
//! loop's state and the connection class's methods), `flow.rs` (a paused connection) and
//! `close.rs` (forced closes and the close handshakes).

use crate::channel::{Channel, ChannelLimits, Context, DurableReplies, Outcome, BASIC_CLASS};
use crate::outbox::Outbox;
use crate::sasl::{self, TransportSecurity};
use crate::state::ServerState;
use bytes::{Bytes, BytesMut};
use std::cell::Cell;
use std::future::Future;
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
use warren_broker::registry::{ConnectionDetails, ConnectionHandle, ConnectionIo};
use warren_broker::vhost::log::DurableSink;
use warren_broker::{Actor, BrokerError, Credentials, LoginSource, VHost};

mod close;
mod counted;
mod flow;
mod frames;
mod handshake;

use close::{
    close_linger, drain_until_eof, wait_close_ok, ForcedClose, CLOSE_DRAIN, SHUTDOWN_CLOSE_TIMEOUT,
};
use flow::{paused, wait_for_drain, Wake};
use frames::Conn;
use handshake::handshake_steps;

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
///
/// The connection's future is the frame loop's own (no async wrapper around it): every
/// wrapper level would keep another copy of the arguments in each connection's task.
pub fn serve<S>(
    state: Arc<ServerState>,
    stream: S,
    peer: SocketAddr,
    local: SocketAddr,
    shutdown: watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send
where
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
}

/// [`serve`] for a stream whose transport established `security` (a TLS session, whose
/// verified client certificate SASL EXTERNAL logs in with).
pub fn serve_with<S>(
    state: Arc<ServerState>,
    stream: S,
    peer: SocketAddr,
    local: SocketAddr,
    security: TransportSecurity,
    shutdown: watch::Receiver<bool>,
) -> impl Future<Output = ()> + Send
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let id = state.next_connection_id();
    // A debug span: at the default level it is disabled, so polling the connection's task
    // does not enter and exit it (with the layered subscriber that is two lock reads and a
    // span-slab lookup per poll, about 4% of the broker's instructions per fanout
    // delivery). Log lines at info and above name the connection themselves.
    let span = tracing::debug_span!("conn", id, %peer);
    let (rd, wr) = tokio::io::split(stream);
    // Counted from the first byte, the handshake's included (as RabbitMQ's socket stats).
    let io = Arc::new(ConnectionIo::default());
    let rd = counted::CountedRead::new(rd, io.clone());
    let wr = counted::CountedWrite::new(wr, io.clone());
    tracing::Instrument::instrument(
        run(state, id, rd, wr, peer, local, security, io, shutdown),
        span,
    )
}

/// The timer of a connection's acknowledgement-timeout checks: made at the first check
/// (boxed, so that a connection that never needs one keeps a pointer's worth of state) and
/// moved rather than made again for each later one.
type AckTimer = Option<std::pin::Pin<Box<tokio::time::Sleep>>>;

/// Sets `timer` to fire at `due`.
fn arm(timer: &mut AckTimer, due: std::time::Instant) {
    let at = tokio::time::Instant::from_std(due);
    match timer {
        Some(t) if t.deadline() == at => {}
        Some(t) => t.as_mut().reset(at),
        None => *timer = Some(Box::pin(tokio::time::sleep_until(at))),
    }
}

/// Waits for `timer` to fire (forever without one).
async fn fired(timer: &mut AckTimer) {
    match timer {
        Some(t) => t.as_mut().await,
        None => std::future::pending().await,
    }
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

#[allow(clippy::too_many_arguments)]
async fn run<R, W>(
    state: Arc<ServerState>,
    id: u64,
    mut rd: R,
    mut wr: W,
    peer: SocketAddr,
    local: SocketAddr,
    security: TransportSecurity,
    io: Arc<ConnectionIo>,
    mut shutdown: watch::Receiver<bool>,
) where
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
    let header = tokio::time::timeout(handshake, async {
        while rbuf.len() < 8 {
            read_more(&mut rd, &mut rbuf).await?;
        }
        Ok::<_, std::io::Error>(&rbuf[..8] == PROTOCOL_HEADER)
    })
    .await
    .unwrap_or_else(|_| Err(std::io::ErrorKind::TimedOut.into()));
    match header {
        Ok(true) => {}
        Ok(false) => {
            if wr.write_all(PROTOCOL_HEADER).await.is_ok() {
                let _ = wr.shutdown().await;
            }
            debug!("bad protocol header; sent ours back");
            return;
        }
        Err(e) => {
            debug!(error = %e, "connection ended before its protocol header");
            return;
        }
    }
    let _ = rbuf.split_to(8);

    let negotiated = tokio::time::timeout(
        handshake,
        // Boxed, as the close handshakes below: what an idle connection's task keeps is
        // only the frame loop's state, not the largest of the steps it went through.
        Box::pin(handshake_steps(
            &state, &mut rd, &mut wr, &mut rbuf, peer, &security,
        )),
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
            Box::pin(drain_until_eof(&mut rd, &mut rbuf, delay)).await;
            tokio::time::sleep_until(until).await;
            let _ = wr.shutdown().await;
            debug!("connection closed");
            return;
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
            debug!("connection closed");
            return;
        }
    };

    let handshake::Session {
        user,
        slot,
        cancel_notify,
        blocked_notify,
        client_properties,
        mechanism,
    } = *session;
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
        user.as_str(),
        state
            .broker
            .access()
            .user(&user)
            .map(|u| u.tags.clone())
            .unwrap_or_default(),
        vhost.name.clone(),
        id,
        Some(peer),
    ));
    let durable = Arc::new(DurableReplies::new(outbox.clone()));
    // Listed for operators (`/api/connections`) until the connection ends.
    let forced = Arc::new(ForcedClose::default());
    let registration = state.broker.registry().register_with_io(
        ConnectionDetails {
            id,
            name,
            peer,
            local,
            user,
            vhost: vhost.name.to_string(),
            protocol: "AMQP 0-9-1",
            tls: security.tls.is_some(),
            auth_mechanism: mechanism,
            client_properties,
            connected_at_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            frame_max: tuned.frame_max,
            channel_max: tuned.channel_max,
            heartbeat: tuned.heartbeat,
        },
        forced.clone(),
        io.clone(),
    );
    // A user or vhost deleted between connection.open-ok and the registration above closed
    // the connections it found, which did not include this one yet: closed here instead.
    {
        use warren_broker::ops::admin::{user_deleted_reason, vhost_deleted_reason};
        use warren_broker::registry::ConnectionControl;
        let details = registration.details();
        if state.broker.access().user(&details.user).is_none() {
            forced.force_close(&user_deleted_reason(&details.user));
        } else if state.broker.vhost(&details.vhost).is_none() {
            forced.force_close(&vhost_deleted_reason(&details.vhost));
        }
    }
    let mut conn = Conn {
        registration,
        id,
        state: state.clone(),
        actor,
        vhost,
        outbox: outbox.clone(),
        channels: Default::default(),
        frame_max: tuned.frame_max,
        channel_max: tuned.channel_max,
        cancel_notify,
        limits: ChannelLimits {
            max_message_size: cfg.max_message_size,
            max_incomplete_content_bytes: cfg.max_incomplete_content_bytes,
            tx_max_bytes: cfg.tx_max_bytes,
            tx_max_operations: cfg.tx_max_operations,
            consumer_timeout: cfg.consumer_timeout(),
        },
        incomplete_content: Cell::new(0),
        slot: Some(slot),
        durable: durable.clone(),
        published: false,
        ack_due: None,
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
    info!(
        "connection ({}): user '{}' authenticated and granted access to vhost '{}'",
        conn.registration.details().name,
        conn.actor.user,
        conn.vhost.name
    );
    // Why the peer went away, when it did without connection.close.
    let mut eof_reason = std::borrow::Cow::Borrowed("client unexpectedly closed TCP connection");
    let forced_close = forced.requested();
    let mut ack_timer: AckTimer = None;
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
        if conn.published && blocked_notify && !blocked_listener {
            state.listen_blocked(&outbox);
            blocked_listener = true;
        }
        if outbox.is_closing() {
            break End::Eof;
        }
        if backlogged || outbox.is_backlogged() {
            let t = std::time::Instant::now();
            // Boxed (as the other rare waits): inline, the largest future of the loop
            // would size every idle connection's task.
            if let Some(end) = Box::pin(paused(
                &mut rd,
                &mut rbuf,
                &outbox,
                &mut shutdown,
                &forced,
                Wake::OutboxDrained,
                || outbox.is_backlogged(),
                &mut conn,
            ))
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
            // RabbitMQ's `blocked` state, until the alarm clears or the connection ends.
            io.set_alarm_held(true);
            let held = Box::pin(paused(
                &mut rd,
                &mut rbuf,
                &outbox,
                &mut shutdown,
                &forced,
                Wake::Poll,
                || state.publishers_paused(),
                &mut conn,
            ))
            .await;
            io.set_alarm_held(false);
            if let Some(end) = held {
                break end;
            }
            debug!("alarm cleared: publisher resumed");
            // Input read during the pause is waiting in the buffer.
            continue;
        }
        let mut held_by_queue = false;
        for q in conn.take_pressure() {
            let t = std::time::Instant::now();
            let end = Box::pin(wait_for_drain(
                &*q,
                &io,
                &mut rd,
                &mut rbuf,
                &outbox,
                &mut shutdown,
                &forced,
                &mut conn,
            ))
            .await;
            if let Some(end) = end {
                break 'outer end;
            }
            held_by_queue = true;
            tracing::trace!(queue = %q.name(), waited_us = t.elapsed().as_micros() as u64, "publisher paused");
        }
        if held_by_queue {
            // Input read during the pause is waiting in the buffer.
            continue;
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
        if let Some(due) = conn.ack_due {
            arm(&mut ack_timer, due);
        }
        tokio::select! {
            () = fired(&mut ack_timer), if conn.ack_due.is_some() => conn.check_acks(),
            r = read => match r {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                    eof_reason = format!("missed heartbeats from client, timeout: {}s", tuned.heartbeat).into();
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
    // Built only now: every idle connection would otherwise hold it.
    let who = format!(
        "{}, vhost: '{}', user: '{}'",
        conn.registration.details().name,
        conn.vhost.name,
        conn.actor.user
    );
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
            Box::pin(drain_until_eof(&mut rd, &mut rbuf, linger)).await;
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
            let waited =
                tokio::time::timeout(linger, Box::pin(wait_close_ok(&mut rd, &mut rbuf, &limits)));
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
                Box::pin(drain_until_eof(&mut rd, &mut rbuf, CLOSE_DRAIN)).await;
            }
        }
    }
    debug!("connection closed");
}
