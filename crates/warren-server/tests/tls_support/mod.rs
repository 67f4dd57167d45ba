//! Helpers for the TLS integration tests: a TLS echo server on a local port that reports each
//! handshake's outcome, clients that connect to it, and bounded waits.

#![allow(dead_code)]

pub mod certs;

use certs::{localhost, Identity, TempDir};
use rustls::pki_types::{CertificateDer, ServerName};
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use warren_server::tls::{TlsAcceptorHandle, TlsConfig, TlsSessionInfo};

/// Upper bound for any single wait.
pub const WAIT: Duration = Duration::from_secs(10);

/// Awaits `fut`, failing the test if it takes longer than [`WAIT`].
pub async fn within<F: Future>(what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(WAIT, fut).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

/// Server certificate files in a temporary directory, and `[tls]` settings naming them.
pub struct ServerFiles {
    pub dir: TempDir,
    pub settings: TlsConfig,
}

impl ServerFiles {
    /// Writes `server`'s certificate and key, and `ca_pem` as the client CA file when given.
    pub fn new(server: &Identity, ca_pem: Option<&str>) -> ServerFiles {
        let dir = TempDir::new("warren-tls-test");
        let cert_file = dir.write("server.pem", &server.cert_pem);
        let key_file = dir.write("server.key", &server.key_pem);
        let ca_file = ca_pem.map(|pem| dir.write("ca.pem", pem));
        ServerFiles {
            settings: TlsConfig {
                cert_file: Some(cert_file),
                key_file: Some(key_file),
                ca_file,
                ..TlsConfig::default()
            },
            dir,
        }
    }

    /// Replaces the server certificate and key files (for reloads).
    pub fn replace_server(&self, server: &Identity) {
        self.dir.write("server.pem", &server.cert_pem);
        self.dir.write("server.key", &server.key_pem);
    }
}

/// A TLS echo server: every accepted connection is handshaken with the handle's current config
/// and its outcome sent to [`EchoServer::next_outcome`]; established connections echo what they
/// read until the client closes.
pub struct EchoServer {
    pub addr: SocketAddr,
    outcomes: mpsc::UnboundedReceiver<io::Result<TlsSessionInfo>>,
    task: tokio::task::JoinHandle<()>,
}

impl EchoServer {
    /// Listens on `127.0.0.1` (or `bind`) with `handle`.
    pub async fn start(handle: TlsAcceptorHandle) -> EchoServer {
        Self::start_on("127.0.0.1:0", handle)
            .await
            .expect("bind 127.0.0.1")
    }

    /// Listens on `bind` with `handle`.
    pub async fn start_on(bind: &str, handle: TlsAcceptorHandle) -> io::Result<EchoServer> {
        let listener = TcpListener::bind(bind).await?;
        let addr = listener.local_addr()?;
        let (tx, outcomes) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (handle, tx) = (handle.clone(), tx.clone());
                tokio::spawn(async move {
                    match handle.accept_timeout(tcp, WAIT).await {
                        Ok(mut tls) => {
                            let _ = tx.send(Ok(TlsSessionInfo::of(&tls)));
                            let mut buf = [0u8; 1024];
                            while let Ok(n) = tls.read(&mut buf).await {
                                if n == 0 || tls.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                });
            }
        });
        Ok(EchoServer {
            addr,
            outcomes,
            task,
        })
    }

    /// The server-side outcome of the next handshake.
    pub async fn next_outcome(&mut self) -> io::Result<TlsSessionInfo> {
        within("the server's handshake outcome", self.outcomes.recv())
            .await
            .expect("server task running")
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A client TLS connection to `addr` for `name` (default `localhost`).
pub async fn connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
    name: Option<ServerName<'static>>,
) -> io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let connector = tokio_rustls::TlsConnector::from(config);
    within(
        "the client handshake",
        connector.connect(name.unwrap_or_else(localhost), tcp),
    )
    .await
}

/// Sends `ping` and reads the echo back.
pub async fn ping<S>(stream: &mut S) -> io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    stream.write_all(b"ping").await?;
    stream.flush().await?;
    let mut buf = [0u8; 4];
    within("the echo", stream.read_exact(&mut buf)).await?;
    assert_eq!(&buf, b"ping");
    Ok(())
}

/// Connects, handshakes and exchanges one echo: the client's view of whether the server took
/// it (with TLS 1.3 a refused client certificate shows only at the first read).
pub async fn client_outcome(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let mut s = connect(addr, config, None)
        .await
        .map_err(|e| e.to_string())?;
    ping(&mut s).await.map_err(|e| e.to_string())?;
    Ok(s)
}

/// The DER of `identity`'s certificate.
pub fn der(identity: &Identity) -> CertificateDer<'static> {
    identity.cert_der.clone()
}
