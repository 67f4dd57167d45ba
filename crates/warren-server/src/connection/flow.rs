//! A paused connection (memory or disk alarm, a queue over its window, a full outbox): it is
//! still watched, so that a client that goes away is noticed and what it held is freed.

use super::*;

/// How often a paused connection's client is probed with a heartbeat frame.
pub(super) const PAUSED_PROBE: Duration = Duration::from_secs(2);

/// Input a paused connection still reads (and holds unprocessed), bytes: enough to see the
/// client close its socket behind a few frames it sent meanwhile.
pub(super) const PAUSED_READ_MAX: usize = 256 * 1024;

/// Keeps a connection from processing its client's frames while `blocked()` holds, yet
/// watches it: the client closing its socket (up to [`PAUSED_READ_MAX`] bytes of input are
/// read meanwhile, unprocessed), the writer failing (a heartbeat to a client that vanished),
/// and broker shutdown each end the pause with the connection's end. `drain` wakes the check
/// whenever the writer drains the outbox (else it is polled every 100 ms). The delivery
/// acknowledgement timeouts of `conn`'s channels are checked meanwhile, at those wake-ups.
#[allow(clippy::too_many_arguments)]
pub(super) async fn paused<R: AsyncRead + Unpin>(
    rd: &mut R,
    rbuf: &mut BytesMut,
    outbox: &Outbox,
    shutdown: &mut watch::Receiver<bool>,
    forced: &ForcedClose,
    drain: bool,
    mut blocked: impl FnMut() -> bool,
    conn: &mut Conn,
) -> Option<End> {
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
/// and publishers do not wait for it again until its consumers make progress.
/// While it waits, the connection shows RabbitMQ's `flow` state (`io`), and for 5 s after.
pub(super) async fn wait_for_drain(q: &warren_broker::Queue, io: &ConnectionIo) {
    let mut last = q.deliveries();
    if q.stalled_at() == Some(last) || !q.is_pressured() {
        return;
    }
    io.set_flow_held(true);
    let _released = scopeguard(|| io.set_flow_held(false));
    let mut since = tokio::time::Instant::now();
    while q.is_pressured() {
        // Woken as soon as the queue drains below half its window; the 1 ms poll watches for
        // stalled consumers and the ways out that do not wake (purge, cancelled consumers).
        let drained = Drained { q, waker: None };
        tokio::select! {
            () = drained => {}
            () = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
        let now = q.deliveries();
        if now != last {
            last = now;
            since = tokio::time::Instant::now();
        } else if since.elapsed() >= Duration::from_millis(250) {
            debug!(queue = %q.name(), "consumers stalled; publisher resumes");
            q.mark_stalled(now);
            return;
        }
    }
}

/// Ready once `q` is no longer pressured ([`warren_broker::Queue::wake_when_drained`]); its
/// waker is unregistered when it is dropped.
struct Drained<'a> {
    q: &'a warren_broker::Queue,
    waker: Option<std::task::Waker>,
}

impl std::future::Future for Drained<'_> {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.q.wake_when_drained(cx.waker()) {
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
        if let Some(w) = &self.waker {
            self.q.forget_drain_waker(w);
        }
    }
}
