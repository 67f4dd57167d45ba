//! The API's listener: at most a given number of connections open at once (a connection
//! holds a permit until it closes; accepting waits for a free permit, further clients wait in
//! the kernel's listen backlog), optionally over TLS. TLS handshakes run in their own tasks,
//! bounded by a timeout, so a client that never finishes one holds up no one else.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tracing::{debug, warn};

/// TLS for the listener: the server config in force (asked at each handshake, so that a
/// reload applies to new connections) and the longest a handshake may take.
#[derive(Clone)]
pub struct Tls {
    /// The rustls server config to handshake with.
    pub config: Arc<dyn Fn() -> Arc<ServerConfig> + Send + Sync>,
    /// Handshakes not finished within this are dropped.
    pub handshake_timeout: Duration,
}

/// A [`TcpListener`] bounded to `max` open connections, optionally over TLS.
pub struct BoundedListener {
    accepted: mpsc::Receiver<(Limited, SocketAddr)>,
    local: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for BoundedListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl BoundedListener {
    /// Bounds `inner` to `max` connections (at least 1), each handshaken with `tls` if given.
    ///
    /// Errors: the listener's address cannot be read.
    pub fn new(inner: TcpListener, max: usize, tls: Option<Tls>) -> io::Result<Self> {
        let local = inner.local_addr()?;
        let permits = Arc::new(Semaphore::new(max.max(1)));
        let (tx, accepted) = mpsc::channel(64);
        let task = tokio::spawn(accept_loop(inner, permits, tls, tx));
        Ok(BoundedListener {
            accepted,
            local,
            task,
        })
    }
}

async fn accept_loop(
    inner: TcpListener,
    permits: Arc<Semaphore>,
    tls: Option<Tls>,
    tx: mpsc::Sender<(Limited, SocketAddr)>,
) {
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let (stream, peer) = match inner.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                warn!(error = %e, "httpmq accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        match &tls {
            None => {
                let conn = Limited {
                    stream: Stream::Plain(stream),
                    _permit: permit,
                };
                if tx.send((conn, peer)).await.is_err() {
                    return;
                }
            }
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from((tls.config)());
                let limit = tls.handshake_timeout;
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(limit, acceptor.accept(stream)).await {
                        Ok(Ok(s)) => {
                            let conn = Limited {
                                stream: Stream::Tls(Box::new(s)),
                                _permit: permit,
                            };
                            let _ = tx.send((conn, peer)).await;
                        }
                        Ok(Err(e)) => debug!(%peer, error = %e, "httpmq TLS handshake failed"),
                        Err(_) => debug!(%peer, "httpmq TLS handshake timed out"),
                    }
                });
            }
        }
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// An accepted connection (plain or TLS) and its permit.
pub struct Limited {
    stream: Stream,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }
    fn is_write_vectored(&self) -> bool {
        match &self.stream {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }
}

impl axum::serve::Listener for BoundedListener {
    type Io = Limited;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(c) => c,
            // The accept loop only ends with the listener: never resolve.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
