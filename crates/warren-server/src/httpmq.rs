//! The httpmq/httpsqs-compatible HTTP queue API ([`warren_httpmq`]) wired to a running
//! broker: its settings from `[httpmq]`, binding and serving its listener.

use crate::listen::ListenAddr;
use crate::state::ServerState;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::info;

/// The server as the HTTP queue API sees it.
struct Node {
    state: Arc<ServerState>,
}

impl warren_httpmq::Node for Node {
    fn broker(&self) -> &warren_broker::Broker {
        &self.state.broker
    }
    fn loopback_users(&self) -> Vec<String> {
        self.state.loopback_users.clone()
    }
    fn publishers_blocked(&self) -> bool {
        self.state.publishers_paused() || self.state.broker.store().is_some_and(|s| s.is_failed())
    }
}

/// The API's settings from the configuration.
fn settings(state: &ServerState) -> warren_httpmq::Settings {
    let c = &state.config.httpmq;
    warren_httpmq::Settings {
        vhost: c.vhost.clone(),
        auth: c.auth.clone(),
        user: c.user.clone(),
        default_maxqueue: c.default_maxqueue,
        max_body_bytes: usize::try_from(c.max_body_bytes).unwrap_or(usize::MAX),
        max_connections: c.max_connections,
        state_file: state
            .config
            .storage
            .data_dir
            .as_ref()
            .map(|d| d.join("httpmq").join("state.json")),
        checkpoint_ms: c.checkpoint_ms,
        login_failure_delay: Duration::from_millis(state.config.auth.login_failure_delay_ms),
    }
}

/// Restores the API's state (queue positions and maxima) and binds `listen` (setting
/// `httpmq.listen`); serves there until `shutdown` turns true, over TLS with `tls` (the
/// AMQPS acceptor, so that a SIGHUP reload applies to both) when given. Returns the bound
/// addresses and the serving tasks.
///
/// Errors: the state file cannot be read, or the address cannot be bound
/// ([`crate::listen::ListenError`]).
pub(crate) async fn start(
    listen: &ListenAddr,
    state: Arc<ServerState>,
    tls: Option<crate::tls::TlsAcceptorHandle>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<(Vec<SocketAddr>, Vec<tokio::task::JoinHandle<()>>)> {
    let settings = settings(&state);
    let handshake_timeout = Duration::from_secs(state.config.amqp.handshake_timeout.max(1));
    let tls = tls.map(|handle| warren_httpmq::Tls {
        config: Arc::new(move || handle.server_config()),
        handshake_timeout,
    });
    let node: Arc<dyn warren_httpmq::Node> = Arc::new(Node { state });
    let app = warren_httpmq::Httpmq::new(node, settings)?;
    let listeners = listen
        .bind("httpmq.listen")
        .await
        .map_err(std::io::Error::other)?;
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let mut tasks = Vec::new();
    for l in listeners {
        if let Ok(a) = l.local_addr() {
            let scheme = if tls.is_some() { "HTTPS" } else { "HTTP" };
            info!(addr = %a, "started {scheme} listener for the httpmq queue API");
        }
        let app = app.clone();
        let rx = shutdown.clone();
        let tls = tls.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = warren_httpmq::serve(l, app, tls, rx).await {
                tracing::error!(error = %e, "httpmq listener failed");
            }
        }));
    }
    Ok((addrs, tasks))
}
