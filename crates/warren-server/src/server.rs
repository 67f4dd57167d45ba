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
use std::net::SocketAddr;
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
        }
    }
}

/// Configures and starts a broker.
pub struct BrokerBuilder {
    config: Config,
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
                state.broker.close();
                return Err(std::io::Error::other(e));
            }
        };
        let addrs: Vec<SocketAddr> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let (tx, rx) = watch::channel(false);
        for a in &addrs {
            info!(addr = %a, "started TCP listener for AMQP 0-9-1");
        }
        let task = tokio::spawn(accept_loop(listeners, state.clone(), rx));
        Ok(RunningBroker {
            amqp_addrs: addrs,
            state,
            shutdown: tx,
            task,
        })
    }
}

/// The error of a listener that could not be bound, as a [`ListenError`] inside the
/// `io::Error` that [`BrokerBuilder::start`] returns.
pub fn listen_error(e: &std::io::Error) -> Option<&ListenError> {
    e.get_ref()?.downcast_ref()
}

/// A running broker.
pub struct RunningBroker {
    amqp_addrs: Vec<SocketAddr>,
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

    /// The shared state (broker model and configuration).
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Stops accepting, closes every connection with 320 CONNECTION_FORCED and waits (up to a
    /// few seconds) for them to finish.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(15), self.task).await;
    }
}

/// How often expired messages and unused queues are looked for, in ms: a message outlives its
/// TTL by at most this much when nothing else touches its queue.
const SWEEP_MS: u64 = 50;

/// Accepts on one listener and hands each connection to the accept loop.
async fn accept_from(
    listener: TcpListener,
    accepted: tokio::sync::mpsc::Sender<(tokio::net::TcpStream, SocketAddr, SocketAddr)>,
) {
    let local = match listener.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if accepted.send((stream, peer, local)).await.is_err() {
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

/// The broker's lifecycle: accepts on every listener, runs the periodic checks, and on
/// shutdown stops accepting on all listeners, closes every connection with 320
/// CONNECTION_FORCED and closes the store (final fsync).
async fn accept_loop(
    listeners: Vec<TcpListener>,
    state: Arc<ServerState>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut acceptors = JoinSet::new();
    let (accepted_tx, mut accepted) = tokio::sync::mpsc::channel(64);
    for l in listeners {
        acceptors.spawn(accept_from(l, accepted_tx.clone()));
    }
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
            Some((stream, peer, local)) = accepted.recv() => {
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
                tasks.spawn(async move {
                    crate::connection::serve(st.clone(), stream, peer, local, rx).await;
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
    state.broker.close();
    info!("broker stopped");
}
