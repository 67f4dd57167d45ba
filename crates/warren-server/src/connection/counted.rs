//! A connection's socket halves wrapped to count its traffic for operators (RabbitMQ's
//! `recv_oct`, `recv_cnt`, `send_oct`, `send_cnt`): one relaxed add of the bytes and one of
//! the calls per read or write call that moved bytes, never per frame, into counters only
//! the one task doing that direction's I/O writes (see
//! [`warren_broker::registry::Traffic`]). Over TLS they count the decrypted stream.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use warren_broker::registry::ConnectionIo;

/// The reading half, counting into [`ConnectionIo::recv`].
pub(crate) struct CountedRead<R> {
    inner: R,
    io: Arc<ConnectionIo>,
}

impl<R> CountedRead<R> {
    pub(crate) fn new(inner: R, io: Arc<ConnectionIo>) -> Self {
        CountedRead { inner, io }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for CountedRead<R> {
    #[inline]
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.io.recv.count(n);
        }
        r
    }
}

/// The writing half, counting into [`ConnectionIo::send`].
pub(crate) struct CountedWrite<W> {
    inner: W,
    io: Arc<ConnectionIo>,
}

impl<W> CountedWrite<W> {
    pub(crate) fn new(inner: W, io: Arc<ConnectionIo>) -> Self {
        CountedWrite { inner, io }
    }

    #[inline]
    fn counted(&self, r: Poll<std::io::Result<usize>>) -> Poll<std::io::Result<usize>> {
        if let Poll::Ready(Ok(n)) = r {
            if n > 0 {
                self.io.send.count(n);
            }
        }
        r
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for CountedWrite<W> {
    #[inline]
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.counted(r)
    }

    #[inline]
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.counted(r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn counts_bytes_and_calls_each_way() {
        let (a, mut b) = tokio::io::duplex(64);
        let io = Arc::new(ConnectionIo::default());
        let (rd, wr) = tokio::io::split(a);
        let mut rd = CountedRead::new(rd, io.clone());
        let mut wr = CountedWrite::new(wr, io.clone());
        wr.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        b.read_exact(&mut got).await.unwrap();
        b.write_all(b"abc").await.unwrap();
        let mut buf = [0u8; 16];
        let n = rd.read(&mut buf).await.unwrap();
        assert_eq!(n, 3);
        let s = io.snapshot();
        assert_eq!((s.send_oct, s.send_cnt), (5, 1));
        assert_eq!((s.recv_oct, s.recv_cnt), (3, 1));
    }
}
