//! A paused connection (memory or disk alarm, a queue over its window, a full outbox): it is
//! still watched, so that a client that goes away is noticed and what it held is freed.

use super::*;

/// How often a paused connection's client is probed with a heartbeat frame.
pub(super) const PAUSED_PROBE: Duration = Duration::from_secs(2);

/// Input a paused connection still reads (and holds unprocessed), bytes: enough to see the
/// client close its socket behind a few frames it sent meanwhile.
pub(super) const PAUSED_READ_MAX: usize = 256 * 1024;

/// What wakes a paused connection to check again whether it is still blocked.
pub(super) enum Wake<'a> {
    /// The writer draining the outbox (and the heartbeat probe's time).
    OutboxDrained,
    /// A poll every 100 ms.
    Poll,
    /// The queue draining below half its window
    /// ([`warren_broker::Queue::wake_when_drained`]), and a poll every millisecond.
    QueueDrained(&'a warren_broker::Queue),
}

/// Keeps a connection from processing its client's frames while `blocked()` holds, yet
/// watches it: the client closing its socket (up to [`PAUSED_READ_MAX`] bytes of input are
/// read meanwhile, unprocessed), the writer failing (a heartbeat to a client that vanished),
/// a close forced by an operator and broker shutdown each end the pause with the
/// connection's end. `wake` says when `blocked()` is asked again. The delivery
/// acknowledgement timeouts of `conn`'s channels are checked meanwhile, at those wake-ups.
#[allow(clippy::too_many_arguments)]
pub(super) async fn paused<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    outbox: &Outbox,
    shutdown: &mut watch::Receiver<bool>,
    forced: &ForcedClose,
    wake: Wake<'_>,
    mut blocked: impl FnMut() -> bool,
    conn: &mut Conn,
) -> Option<End> {
    let drain = matches!(wake, Wake::OutboxDrained);
    let (queue, tick) = match wake {
        Wake::OutboxDrained => (None, Duration::ZERO),
        Wake::Poll => (None, Duration::from_millis(100)),
        Wake::QueueDrained(q) => (Some(q), Duration::from_millis(1)),
    };
    let mut probe = tokio::time::Instant::now() + PAUSED_PROBE;
    loop {
        if outbox.is_closing() {
            return Some(End::Eof);
        }
        if conn.ack_due.is_some_and(|t| t <= std::time::Instant::now()) {
            conn.check_acks();
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
        let drained = Drained {
            q: queue,
            waker: None,
        };
        tokio::select! {
            _ = outbox.drained(), if drain => {}
            _ = tokio::time::sleep(tick), if !drain => {}
            _ = tokio::time::sleep_until(probe), if drain => {}
            () = drained, if queue.is_some() => {}
            _ = shutdown.changed() => {
                return Some(End::Error(ConnError::new(
                    constants::CONNECTION_FORCED,
                    "broker forced connection closure with reason 'shutdown'",
                )));
            }
            e = forced.requested() => return Some(End::Error(e)),
            r = read_more(rd, rbuf), if can_read => {
                if r.is_err() {
                    if queue.is_some() {
                        // A publisher that went away after its last frames: they are handled
                        // (as they would have been had it not been paused), then the
                        // connection ends at its next read.
                        return None;
                    }
                    debug!("client closed the socket while its connection was paused");
                    return Some(End::Eof);
                }
            }
        }
    }
}

/// Runs `f` when dropped (at the end of a wait, or when the wait's future is dropped).
fn scopeguard<F: FnMut()>(f: F) -> impl Drop {
    struct Guard<F: FnMut()>(F);
    impl<F: FnMut()> Drop for Guard<F> {
        fn drop(&mut self) {
            (self.0)();
        }
    }
    Guard(f)
}

/// Publisher flow control: stops reading from a publisher while a queue it feeds is
/// pressured, until the queue drains or its consumers stall (no delivery for 250 ms, e.g. all
/// at their prefetch limit and not acking). A stalled queue takes the backlog on disk instead,
/// and publishers do not wait for it again until its consumers make progress. The wait is a
/// [`paused`] one: a forced close, the client going away, shutdown and the channels'
/// acknowledgement timeouts are seen meanwhile. While it waits, the connection shows
/// RabbitMQ's `flow` state (`io`), and for 5 s after. Returns the connection's end if it
/// ended meanwhile.
#[allow(clippy::too_many_arguments)]
pub(super) async fn wait_for_drain<R: AsyncRead + Unpin>(
    q: &warren_broker::Queue,
    io: &ConnectionIo,
    rd: &mut R,
    rbuf: &mut BytesMut,
    outbox: &Outbox,
    shutdown: &mut watch::Receiver<bool>,
    forced: &ForcedClose,
    conn: &mut Conn,
) -> Option<End> {
    let mut last = q.deliveries();
    if q.stalled_at() == Some(last) || !q.is_pressured() {
        return None;
    }
    io.set_flow_held(true);
    let _released = scopeguard(|| io.set_flow_held(false));
    let mut since = tokio::time::Instant::now();
    let still_pressured = || {
        if !q.is_pressured() {
            return false;
        }
        let now = q.deliveries();
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= Duration::from_millis(250) {
            debug!(queue = %q.name(), "consumers stalled; publisher resumes");
            q.mark_stalled(now);
            return false;
        }
        true
    };
    // Most pauses end within a few milliseconds: those are waited out with the queue's wake
    // alone, the longer ones with everything else watched too.
    let first = Drained {
        q: Some(q),
        waker: None,
    };
    let _ = tokio::time::timeout(Duration::from_millis(5), first).await;
    paused(
        rd,
        rbuf,
        outbox,
        shutdown,
        forced,
        Wake::QueueDrained(q),
        still_pressured,
        conn,
    )
    .await
}

/// Ready once `q` is no longer pressured ([`warren_broker::Queue::wake_when_drained`]); its
/// waker is unregistered when it is dropped. Without a queue it never completes.
struct Drained<'a> {
    q: Option<&'a warren_broker::Queue>,
    waker: Option<std::task::Waker>,
}

impl std::future::Future for Drained<'_> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let Some(q) = self.q else {
            return std::task::Poll::Pending;
        };
        if q.wake_when_drained(cx.waker()) {
            if !self.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                self.waker = Some(cx.waker().clone());
            }
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    }
}

impl Drop for Drained<'_> {
    fn drop(&mut self) {
        if let (Some(q), Some(w)) = (self.q, &self.waker) {
            q.forget_drain_waker(w);
        }
    }
}
