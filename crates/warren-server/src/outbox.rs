//! The outgoing side of a connection: one buffer that every producer of frames (the connection's
//! own task, and queues delivering from other connections' tasks) encodes into, and one writer
//! task that drains it to the socket.
//!
//! Encoding straight into a shared buffer batches writes for free: whatever accumulated while
//! the previous `write_all` ran goes out in the next single syscall. The writer also sends
//! heartbeats when the connection has been quiet for half the negotiated interval.

use bytes::BytesMut;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::Notify;
use warren_amqp::frame::{encode_heartbeat, encode_method_frame};
use warren_amqp::Method;
use warren_broker::Queue;

/// Default pending output above which queues stop delivering to a connection and the
/// connection's input is no longer read, bytes (`amqp.outbox_high_water_bytes`).
pub const HIGH_WATER: usize = 4 * 1024 * 1024;

/// A connection's pending output.
///
/// Bounded: above [`Outbox::high_water`] bytes queues park instead of delivering; above twice
/// that the connection stops reading (and so producing replies, returns, get-oks and confirms)
/// until the writer has drained it below half the mark. The margin between the two keeps a
/// consumer's acknowledgements flowing while deliveries fill its outbox. One frame's
/// consequences (a basic.get-ok, a basic.return) may go past a mark, never more.
#[derive(Default)]
pub struct Outbox {
    buf: Mutex<BytesMut>,
    notify: Notify,
    /// Woken when the writer has drained the buffer below half the high-water mark, or stopped.
    drained: Notify,
    high_water: usize,
    closing: AtomicBool,
    /// Queues that held back deliveries because the outbox was over its high-water mark; they
    /// are asked to dispatch again once the writer has drained it.
    parked: Mutex<Vec<Arc<Queue>>>,
    /// Nothing is written while set: replies wait behind a durable change not yet on disk.
    held: AtomicBool,
}

impl std::fmt::Debug for Outbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outbox")
            .field("pending", &self.pending())
            .finish()
    }
}

impl Outbox {
    /// An empty outbox with the default high-water mark ([`HIGH_WATER`]).
    pub fn new() -> Self {
        Self::with_high_water(HIGH_WATER)
    }

    /// An empty outbox that counts as backlogged above `high_water` bytes.
    pub fn with_high_water(high_water: usize) -> Self {
        Outbox {
            high_water: high_water.max(1),
            ..Self::default()
        }
    }

    /// The high-water mark in bytes.
    pub fn high_water(&self) -> usize {
        self.high_water
    }

    /// True while more than twice the high-water mark is waiting to be written: the
    /// connection must stop reading.
    pub fn is_backlogged(&self) -> bool {
        self.pending() >= self.high_water.saturating_mul(2)
    }

    /// Waits until the writer has drained the buffer below half the high-water mark, or has
    /// stopped (socket failed or closed).
    pub async fn drained(&self) {
        loop {
            let woken = self.drained.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            if self.pending() < self.high_water / 2 || self.is_closing() {
                return;
            }
            woken.await;
        }
    }

    /// Runs `f` on the pending-output buffer and wakes the writer.
    pub fn with<R>(&self, f: impl FnOnce(&mut BytesMut) -> R) -> R {
        let r = f(&mut self.buf.lock());
        self.notify.notify_one();
        r
    }

    /// Queues one method frame.
    pub fn send(&self, channel: u16, method: &Method) {
        self.with(|buf| encode_method_frame(channel, method, buf));
    }

    /// Asks the writer to flush what is queued, then shut the socket down.
    pub fn close_after_flush(&self) {
        self.closing.store(true, Ordering::Release);
        self.notify.notify_one();
        self.drained.notify_waiters();
    }

    /// Stops writing: what is queued from now on (and what was not written yet) stays until
    /// [`Outbox::release`].
    pub fn hold(&self) {
        self.held.store(true, Ordering::Release);
    }

    /// Writes again.
    pub fn release(&self) {
        self.held.store(false, Ordering::Release);
        self.notify.notify_one();
    }

    /// Drops what is queued and writes again (the connection is about to be closed with an
    /// error, and the replies held must never reach the client).
    pub fn discard(&self) {
        self.buf.lock().clear();
        self.release();
    }

    /// True while held.
    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// True once [`Outbox::close_after_flush`] was called.
    pub fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    /// Bytes waiting to be written.
    pub fn pending(&self) -> usize {
        self.buf.lock().len()
    }

    /// Remembers a queue that held back a delivery because the outbox was over its
    /// high-water mark: it is dispatched again once the backlog has been written.
    pub fn park(&self, queue: &Arc<Queue>) {
        let mut parked = self.parked.lock();
        if !parked.iter().any(|q| Arc::ptr_eq(q, queue)) {
            parked.push(queue.clone());
        }
        drop(parked);
        // The writer may have drained everything between the check and the park.
        self.notify.notify_one();
    }

    /// Drains the outbox into `sink` until closed or the socket fails. `heartbeat` is the
    /// negotiated interval (`None` when disabled); a heartbeat frame is sent whenever nothing
    /// else was written for half of it.
    pub async fn run_writer<W: AsyncWrite + Unpin>(
        &self,
        mut sink: W,
        heartbeat: Option<Duration>,
    ) -> std::io::Result<()> {
        let tick = heartbeat.map(|h| (h / 2).max(Duration::from_millis(500)));
        let mut wrote_since_tick = false;
        loop {
            let timed_out = match tick {
                Some(t) => tokio::time::timeout(t, self.notify.notified())
                    .await
                    .is_err(),
                None => {
                    self.notify.notified().await;
                    false
                }
            };
            if self.is_held() && !self.is_closing() {
                continue;
            }
            if timed_out {
                if !wrote_since_tick {
                    self.with(encode_heartbeat);
                }
                wrote_since_tick = false;
            }
            let data = self.buf.lock().split();
            if !data.is_empty() {
                sink.write_all(&data).await?;
                wrote_since_tick = true;
                drop(data);
                if self.pending() < self.high_water / 2 {
                    self.drained.notify_waiters();
                    let parked = std::mem::take(&mut *self.parked.lock());
                    for q in parked {
                        q.dispatch();
                    }
                }
            }
            if self.is_closing() && self.buf.lock().is_empty() {
                sink.flush().await?;
                let _ = sink.shutdown().await;
                return Ok(());
            }
        }
    }
}
