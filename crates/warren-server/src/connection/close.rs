//! Closing: a close forced from outside the connection (an operator, a deleted vhost or
//! user), and the close handshakes in both directions with their time limits.

use super::*;

/// A request to close the connection from outside its task: an operator's
/// `DELETE /api/connections/{name}`, its vhost or user deleted. The connection's frame loop
/// picks it up and closes with 320 CONNECTION_FORCED.
#[derive(Default)]
pub(super) struct ForcedClose {
    pub(super) requested: std::sync::atomic::AtomicBool,
    pub(super) reason: parking_lot::Mutex<Option<String>>,
    pub(super) notify: tokio::sync::Notify,
}

impl ForcedClose {
    /// Waits for a close request; returns its error. The frame loop keeps one such future
    /// pinned across its iterations, so waiting costs nothing per read.
    pub(super) async fn requested(&self) -> ConnError {
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

/// How long the broker waits for the client's side of a close handshake: connection.close-ok
/// after a server-initiated close, the socket's close after a client-initiated one. As in
/// RabbitMQ, the negotiated heartbeat interval when it is set and shorter than
/// [`CLOSE_TIMEOUT`], else [`CLOSE_TIMEOUT`].
pub(super) fn close_linger(heartbeat_s: u16) -> Duration {
    match Duration::from_secs(u64::from(heartbeat_s)) {
        h if !h.is_zero() && h < CLOSE_TIMEOUT => h,
        _ => CLOSE_TIMEOUT,
    }
}

/// How long a connection.close sent because the broker shuts down waits for close-ok.
pub(super) const SHUTDOWN_CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// After the server received connection.close-ok, how long it keeps reading frames the client
/// sent before it (and discarding them) while waiting for the client to close its socket.
pub(super) const CLOSE_DRAIN: Duration = Duration::from_secs(2);

/// Reads and discards whatever the client sends until it closes its side of the socket (or
/// the socket fails), for at most `limit`. Closing a socket with unread input resets the
/// connection, which a client still writing sees as EPIPE / ECONNRESET instead of a clean close.
pub(super) async fn drain_until_eof<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    limit: Duration,
) {
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
pub(super) async fn wait_close_ok<R: AsyncRead + Unpin>(
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
pub(super) fn skip_frame(buf: &mut BytesMut) -> bool {
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
