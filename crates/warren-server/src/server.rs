//! The embeddable broker: start it on an address inside any Rust program, get the bound address
//! back, and shut it down gracefully.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let broker = warren_server::Broker::builder().bind("127.0.0.1:0").start().await?;
//! println!("AMQP on {}", broker.amqp_addr());
//! broker.shutdown().await;
//! # Ok(()) }
//! ```

use crate::config::Config;
use crate::listen::{ListenAddr, ListenError};
use crate::state::ServerState;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};

/// Entry point of the embedding API.
pub struct Broker;

impl Broker {
    /// A builder with the default configuration ([`Config::default`]).
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder {
            config: Config::default(),
            management: false,
            httpmq: false,
        }
    }
}

/// Configures and starts a broker.
pub struct BrokerBuilder {
    config: Config,
    management: bool,
    httpmq: bool,
}

impl BrokerBuilder {
    /// Replaces the whole configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Keeps durable state in `dir` (by default the broker runs in memory).
    pub fn data_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.config.storage.data_dir = Some(dir.into());
        self
    }

    /// Sets the AMQP listen address ([`ListenAddr`]: `"127.0.0.1:0"` picks a free port,
    /// `"5672"` listens on every interface, `"localhost:5672"` on the host's addresses).
    ///
    /// # Panics
    /// When `addr` is not a listen address.
    pub fn bind(mut self, addr: &str) -> Self {
        self.config.amqp.listen = addr
            .parse()
            .unwrap_or_else(|e: String| panic!("bind(): {e}"));
        self
    }

    /// Serves the management HTTP API on `config.management.listen` too (off by default for
    /// an embedded broker; the `warren` binary turns it on unless `[management] enabled` is
    /// false).
    pub fn management(mut self, on: bool) -> Self {
        self.management = on;
        self
    }

    /// Serves the httpmq/httpsqs HTTP queue API on `config.httpmq.listen` too (off by default
    /// for an embedded broker; the `warren` binary turns it on unless `[httpmq] enabled` is
    /// false).
    pub fn httpmq(mut self, on: bool) -> Self {
        self.httpmq = on;
        self
    }

    /// Recovers durable state, binds the listeners and starts accepting connections on the
    /// current tokio runtime.
    ///
    /// Errors: the data directory or the store could not be opened (message naming the
    /// directory), or a listener could not be bound ([`ListenError`] naming the address).
    pub async fn start(self) -> std::io::Result<RunningBroker> {
        // Recover first, listen after: clients never wait on a broker that is still recovering.
        let listen: ListenAddr = self.config.amqp.listen.clone();
        let config = self.config;
        let state = Arc::new(tokio::task::spawn_blocking(move || ServerState::new(config)).await??);
        let listeners = match listen.bind("amqp.listen").await {
            Ok(l) => l,
            Err(e) => {
                // Release the data directory for whoever starts next.
                state.close();
                return Err(std::io::Error::other(e));
            }
        };
        let tls = match bind_tls(&state.config.tls).await {
            Ok(t) => t,
            Err(e) => {
                state.close();
                return Err(e);
            }
        };
        let addrs: Vec<SocketAddr> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let (tx, rx) = watch::channel(false);
        let (management_addrs, management_tasks) = if self.management {
            let listen = state.config.management.listen.clone();
            let amqps = tls.as_ref().and_then(|(l, _)| l.local_addr().ok());
            match crate::management::start(&listen, state.clone(), &addrs, amqps, rx.clone()).await
            {
                Ok(m) => m,
                Err(e) => {
                    state.close();
                    return Err(e);
                }
            }
        } else {
            (Vec::new(), Vec::new())
        };
        let (httpmq_addrs, httpmq_tasks) = if self.httpmq {
            let listen = state.config.httpmq.listen.clone();
            let tls_handle = if state.config.httpmq.tls {
                tls.as_ref().map(|(_, h)| h.clone())
            } else {
                None
            };
            match crate::httpmq::start(&listen, state.clone(), tls_handle, rx.clone()).await {
                Ok(m) => m,
                Err(e) => {
                    let _ = tx.send(true);
                    state.close();
                    return Err(e);
                }
            }
        } else {
            (Vec::new(), Vec::new())
        };
        for a in &addrs {
            info!(addr = %a, "started TCP listener for AMQP 0-9-1");
        }
        let amqps_addr = match &tls {
            Some((listener, _)) => {
                let a = listener.local_addr()?;
                info!(addr = %a, "started TLS (AMQPS) listener for AMQP 0-9-1");
                Some(a)
            }
            None => None,
        };
        let tls_acceptor = tls.as_ref().map(|(_, h)| h.clone());
        let task = tokio::spawn(accept_loop(listeners, tls, state.clone(), rx));
        Ok(RunningBroker {
            amqp_addrs: addrs,
            amqps_addr,
            tls_acceptor,
            management_addrs,
            management_tasks,
            httpmq_addrs,
            httpmq_tasks,
            state,
            shutdown: tx,
            task,
        })
    }
}

/// The AMQPS listener and its acceptor, when `[tls]` is on. The files are read here, so a
/// broker with unusable certificates does not start.
///
/// Errors: a TLS file cannot be used (the message names the setting and the file), or the
/// listen address cannot be bound.
async fn bind_tls(
    settings: &crate::tls::TlsConfig,
) -> std::io::Result<Option<(TcpListener, crate::tls::TlsAcceptorHandle)>> {
    if !settings.enabled() {
        return Ok(None);
    }
    let owned = settings.clone();
    let handle = tokio::task::spawn_blocking(move || crate::tls::TlsAcceptorHandle::new(&owned))
        .await?
        .map_err(std::io::Error::other)?;
    let listener = TcpListener::bind(settings.listen).await.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen on {} (tls.listen): {e}", settings.listen),
        )
    })?;
    Ok(Some((listener, handle)))
}

/// The error of a listener that could not be bound, as a [`ListenError`] inside the
/// `io::Error` that [`BrokerBuilder::start`] returns.
pub fn listen_error(e: &std::io::Error) -> Option<&ListenError> {
    e.get_ref()?.downcast_ref()
}

/// A running broker.
pub struct RunningBroker {
    amqp_addrs: Vec<SocketAddr>,
    amqps_addr: Option<SocketAddr>,
    tls_acceptor: Option<crate::tls::TlsAcceptorHandle>,
    management_addrs: Vec<SocketAddr>,
    management_tasks: Vec<tokio::task::JoinHandle<()>>,
    httpmq_addrs: Vec<SocketAddr>,
    httpmq_tasks: Vec<tokio::task::JoinHandle<()>>,
    state: Arc<ServerState>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningBroker {
    /// The address of the (first) AMQP listener: the IPv4 one when a bare port binds both
    /// families.
    pub fn amqp_addr(&self) -> SocketAddr {
        self.amqp_addrs[0]
    }

    /// The addresses of every AMQP listener.
    pub fn amqp_addrs(&self) -> &[SocketAddr] {
        &self.amqp_addrs
    }

    /// The address of the AMQPS (AMQP over TLS) listener, when `[tls]` is on.
    pub fn amqps_addr(&self) -> Option<SocketAddr> {
        self.amqps_addr
    }

    /// The TLS acceptor of the AMQPS listener, when `[tls]` is on: reload it (SIGHUP) to
    /// serve new certificates to new connections; clone it to serve other listeners (HTTPS)
    /// with the same settings.
    pub fn tls_acceptor(&self) -> Option<&crate::tls::TlsAcceptorHandle> {
        self.tls_acceptor.as_ref()
    }

    /// The addresses of the management HTTP API's listeners (none unless
    /// [`BrokerBuilder::management`] turned it on).
    pub fn management_addrs(&self) -> &[SocketAddr] {
        &self.management_addrs
    }

    /// The addresses of the httpmq HTTP queue API's listeners (none unless
    /// [`BrokerBuilder::httpmq`] turned it on).
    pub fn httpmq_addrs(&self) -> &[SocketAddr] {
        &self.httpmq_addrs
    }

    /// The shared state (broker model and configuration).
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Stops accepting, closes every connection with 320 CONNECTION_FORCED and waits (up to a
    /// few seconds) for them to finish.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        // The HTTP queue API's last requests and its final checkpoint, before the store
        // closes.
        for t in self.httpmq_tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(15), self.task).await;
        for t in self.management_tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

/// How often expired messages and unused queues are looked for, in ms: a message outlives its
/// TTL by at most this much when nothing else touches its queue.
const SWEEP_MS: u64 = 50;

/// A connection accepted on a listener: the stream, the peer and local addresses, and whether
/// it came in on the AMQPS listener (its TLS handshake is still to be done).
type Accepted = (tokio::net::TcpStream, SocketAddr, SocketAddr, bool);

/// Accepts on one listener and hands each connection to the accept loop.
async fn accept_from(
    listener: TcpListener,
    accepted: tokio::sync::mpsc::Sender<Accepted>,
    tls: bool,
) {
    let local = match listener.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if accepted.send((stream, peer, local, tls)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                warn!(%local, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Serves one accepted connection; on the AMQPS listener, after its TLS handshake, which must
/// finish within `amqp.handshake_timeout` (a client refused by peer verification fails here,
/// before any AMQP is read).
///
/// A plain function returning the boxed future (not an `async fn`): an async wrapper would
/// keep its own copy of the arguments in every connection's task.
fn serve_accepted(
    state: Arc<ServerState>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    tls: Option<crate::tls::TlsAcceptorHandle>,
    shutdown: watch::Receiver<bool>,
) -> Pin<Box<dyn Future<Output = ()> + Send>> {
    match tls {
        None => Box::pin(crate::connection::serve(
            state, stream, peer, local, shutdown,
        )),
        Some(acceptor) => Box::pin(serve_tls(state, stream, peer, local, acceptor, shutdown)),
    }
}

/// [`serve_accepted`] on the AMQPS listener: the TLS handshake, then the connection.
async fn serve_tls(
    state: Arc<ServerState>,
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    acceptor: crate::tls::TlsAcceptorHandle,
    shutdown: watch::Receiver<bool>,
) {
    let limit = Duration::from_secs(state.config.amqp.handshake_timeout.max(1));
    match acceptor.accept_timeout(stream, limit).await {
        Ok(tls) => {
            let session = crate::tls::TlsSessionInfo::of(&tls);
            tracing::debug!(
                %peer,
                protocol = session.protocol_name(),
                client_certificate = session.peer_certificate().is_some(),
                "TLS handshake done"
            );
            let security = crate::sasl::TransportSecurity { tls: Some(session) };
            crate::connection::serve_with(state, tls, peer, local, security, shutdown).await
        }
        Err(e) => warn!(%peer, error = %e, "TLS handshake failed; connection closed"),
    }
}

/// The broker's lifecycle: accepts on every listener, runs the periodic checks, and on
/// shutdown stops accepting on all listeners, closes every connection with 320
/// CONNECTION_FORCED and closes the store (final fsync).
async fn accept_loop(
    listeners: Vec<TcpListener>,
    tls: Option<(TcpListener, crate::tls::TlsAcceptorHandle)>,
    state: Arc<ServerState>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut acceptors = JoinSet::new();
    let (accepted_tx, mut accepted) = tokio::sync::mpsc::channel(64);
    for l in listeners {
        acceptors.spawn(accept_from(l, accepted_tx.clone(), false));
    }
    let tls_acceptor = match tls {
        Some((l, handle)) => {
            acceptors.spawn(accept_from(l, accepted_tx.clone(), true));
            Some(handle)
        }
        None => None,
    };
    drop(accepted_tx);
    let mut tasks = JoinSet::new();
    let mut health = tokio::time::interval(Duration::from_millis(250));
    // Message TTLs and queue expiry (x-message-ttl, expiration, x-expires).
    let mut sweep = tokio::time::interval(Duration::from_millis(SWEEP_MS));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = health.tick() => state.check_blocked(),
            _ = sweep.tick() => state.broker.sweep(),
            Some((stream, peer, local, is_tls)) = accepted.recv() => {
                if state.connection_count() >= state.config.amqp.max_connections {
                    warn!(%peer, "connection refused: max_connections reached");
                    drop(stream);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let st = state.clone();
                let rx = shutdown.clone();
                st.connection_opened();
                info!("accepting AMQP connection ({peer} -> {local})");
                let tls = if is_tls { tls_acceptor.clone() } else { None };
                let conn = serve_accepted(st.clone(), stream, peer, local, tls, rx);
                tasks.spawn(async move {
                    conn.await;
                    st.connection_closed();
                });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    // Stop accepting on every listener (dropping them closes the sockets).
    acceptors.shutdown().await;
    drop(accepted);
    if !tasks.is_empty() {
        info!(
            connections = tasks.len(),
            "closing client connections (each waits briefly for its connection.close-ok)"
        );
    }
    let _ = tokio::time::timeout(Duration::from_secs(12), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    state.close();
    info!("broker stopped");
}
