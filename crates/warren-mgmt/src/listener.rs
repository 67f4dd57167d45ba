//! The management listener's bounds: how many HTTP connections it holds at once, how long
//! one may sit idle, and how long a client has to send a request's line and headers.
//!
//! An HTTP listener without them is a file-descriptor leak waiting for a client: 20,000 idle
//! sockets (or one slow client per socket sending a header byte now and then) exhaust the
//! broker's descriptors, and the AMQP listener with them. RabbitMQ bounds its management
//! listener through cowboy and ranch (`management.tcp.max_connections`,
//! `management.tcp.idle_timeout`, `management.tcp.request_timeout`); Warren does the same
//! below axum:
//!
//! - [`Bounded`] accepts while fewer than `max_connections` connections are open; one more is
//!   closed at once (its descriptor is freed immediately, as the AMQP listener does beyond
//!   `amqp.max_connections`).
//! - [`TimedIo`] ends a new connection that sends nothing for [`FIRST_REQUEST_TIMEOUT`]
//!   (10 s), one that sends nothing for `idle_timeout` between requests,
//!   or that takes longer than `request_timeout` from the first byte of a request to the end
//!   of its headers (a slow client sending a byte now and then is not idle, but is cut off
//!   here).

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

/// Bounds of the management listener (`[management]` `max_connections`, `idle_timeout`,
/// `request_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListenerLimits {
    /// Most HTTP connections open at once; more are closed as they are accepted.
    pub max_connections: usize,
    /// A connection with no request in progress is closed after this long.
    pub idle_timeout: Duration,
    /// A request's line and headers must arrive within this long of its first byte.
    pub request_timeout: Duration,
}

impl Default for ListenerLimits {
    /// 1,024 connections, 120 s idle (RabbitMQ's `management.tcp.idle_timeout`), 30 s for a
    /// request's headers.
    fn default() -> Self {
        ListenerLimits {
            max_connections: 1024,
            idle_timeout: Duration::from_secs(120),
            request_timeout: Duration::from_secs(30),
        }
    }
}

/// A TCP listener that holds at most `limits.max_connections` connections and wraps each
/// in [`TimedIo`].
pub struct Bounded {
    inner: TcpListener,
    limits: ListenerLimits,
    open: Arc<AtomicUsize>,
    /// Refusals since the last warning, so that a flood is logged once a second.
    refused: u64,
    warned_at: Option<std::time::Instant>,
}

impl Bounded {
    /// Bounds `inner` by `limits`.
    pub fn new(inner: TcpListener, limits: ListenerLimits) -> Self {
        Bounded {
            inner,
            limits,
            open: Arc::new(AtomicUsize::new(0)),
            refused: 0,
            warned_at: None,
        }
    }
}

impl axum::serve::Listener for Bounded {
    type Io = TimedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, peer) = axum::serve::Listener::accept(&mut self.inner).await;
            if self.open.load(Ordering::Acquire) >= self.limits.max_connections {
                drop(stream);
                self.refused += 1;
                let now = std::time::Instant::now();
                if self
                    .warned_at
                    .is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1))
                {
                    tracing::warn!(
                        %peer,
                        refused = self.refused,
                        max_connections = self.limits.max_connections,
                        "management connection refused: max_connections reached"
                    );
                    self.refused = 0;
                    self.warned_at = Some(now);
                }
                continue;
            }
            self.open.fetch_add(1, Ordering::AcqRel);
            let io = TimedIo::new(stream, self.limits, self.open.clone());
            return (io, peer);
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

/// How long a new connection may wait before the first byte of its first request (at most
/// `request_timeout`), as the AMQP listener's handshake timeout bounds a silent socket.
pub const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a connection is in its request cycle, for its deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No request in progress: `idle_timeout` after the last activity.
    Idle,
    /// Receiving a request's line and headers: `request_timeout` after its first byte.
    Headers,
    /// Headers received (body, handler, response): `idle_timeout` after the last read.
    Request,
}

/// A management connection's socket with the idle and request-header deadlines; counts
/// itself out of [`Bounded`]'s open connections when dropped.
pub struct TimedIo {
    stream: TcpStream,
    limits: ListenerLimits,
    open: Arc<AtomicUsize>,
    phase: Phase,
    header_end: HeaderEnd,
    deadline: Instant,
    timer: Pin<Box<Sleep>>,
}

impl TimedIo {
    fn new(stream: TcpStream, limits: ListenerLimits, open: Arc<AtomicUsize>) -> Self {
        // A new connection owes its first request sooner than a kept-alive one its next:
        // silent sockets must not hold the listener's slots for the whole idle timeout.
        let deadline = Instant::now() + limits.request_timeout.min(FIRST_REQUEST_TIMEOUT);
        TimedIo {
            stream,
            limits,
            open,
            phase: Phase::Idle,
            header_end: HeaderEnd::default(),
            deadline,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
        }
    }

    /// Follows the request cycle through the bytes just read.
    fn saw(&mut self, bytes: &[u8]) {
        let now = Instant::now();
        if self.phase == Phase::Idle {
            self.phase = Phase::Headers;
            self.header_end = HeaderEnd::default();
            self.deadline = now + self.limits.request_timeout;
        }
        if self.phase == Phase::Headers && self.header_end.feed(bytes) {
            self.phase = Phase::Request;
        }
        if self.phase == Phase::Request {
            self.deadline = now + self.limits.idle_timeout;
        }
    }
}

/// Finds the blank line (`\r\n\r\n`) that ends a request's headers, across reads.
#[derive(Debug, Default, Clone, Copy)]
struct HeaderEnd {
    /// How many bytes of `\r\n\r\n` the input read so far ends with.
    matched: usize,
}

impl HeaderEnd {
    /// Feeds the next bytes read; true once the headers' end has been seen.
    fn feed(&mut self, bytes: &[u8]) -> bool {
        const END: &[u8; 4] = b"\r\n\r\n";
        for &b in bytes {
            self.matched = if b == END[self.matched] {
                self.matched + 1
            } else if b == b'\r' {
                1
            } else {
                0
            };
            if self.matched == END.len() {
                return true;
            }
        }
        false
    }
}

impl Drop for TimedIo {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AsyncRead for TimedIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len() - before;
                if n > 0 {
                    this.saw(&buf.filled()[before..]);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if this.timer.deadline() != this.deadline {
                    let d = this.deadline;
                    this.timer.as_mut().reset(d);
                }
                match this.timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        let what = match this.phase {
                            Phase::Headers => "request headers not received in time",
                            Phase::Idle | Phase::Request => "idle connection",
                        };
                        tracing::debug!("closing management connection: {what}");
                        Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl AsyncWrite for TimedIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.stream).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = &r {
            if *n > 0 {
                // A response is going out: the next request starts from idle.
                this.phase = Phase::Idle;
                this.deadline = Instant::now() + this.limits.idle_timeout;
            }
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let r = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(n)) = &r {
            if *n > 0 {
                this.phase = Phase::Idle;
                this.deadline = Instant::now() + this.limits.idle_timeout;
            }
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::HeaderEnd;

    #[test]
    fn header_end_is_found_across_reads() {
        let mut h = HeaderEnd::default();
        assert!(!h.feed(b"GET / HTTP/1.1\r\nHost: x\r"));
        assert!(!h.feed(b"\n\r"));
        assert!(h.feed(b"\n"));
        let mut h = HeaderEnd::default();
        assert!(!h.feed(b"a\r\n\rb\r\r\n"));
        assert!(h.feed(b"\r\n"));
        let mut h = HeaderEnd::default();
        assert!(
            !h.feed(b"\n\r\n"),
            "a bare LF does not start the blank line"
        );
    }
}
