//! The management HTTP API ([`warren_mgmt`]) wired to a running broker: what the API reads
//! from the server besides the broker model (connections, alarms, listeners), and binding
//! and serving its listener.

use crate::listen::ListenAddr;
use crate::state::ServerState;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::info;

/// The server as the management API sees it.
struct Node {
    state: Arc<ServerState>,
    listeners: Vec<(String, SocketAddr)>,
}

impl warren_mgmt::Node for Node {
    fn broker(&self) -> &warren_broker::Broker {
        &self.state.broker
    }
    fn connection_count(&self) -> usize {
        self.state.connection_count()
    }
    fn memory_alarm(&self) -> bool {
        self.state.memory_alarm()
    }
    fn disk_alarm(&self) -> bool {
        self.state.disk_alarm()
    }
    fn listeners(&self) -> Vec<(String, SocketAddr)> {
        self.listeners.clone()
    }
    fn loopback_users(&self) -> Vec<String> {
        self.state.loopback_users.clone()
    }
    fn max_table_depth(&self) -> usize {
        self.state.config.amqp.max_table_depth
    }
}

/// Binds `listen` (setting `management.listen`) and serves the API there until `shutdown`
/// turns true. Returns the bound addresses and the serving tasks.
///
/// Errors: the address cannot be bound ([`crate::listen::ListenError`]).
pub(crate) async fn start(
    listen: &ListenAddr,
    state: Arc<ServerState>,
    amqp: &[SocketAddr],
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<(Vec<SocketAddr>, Vec<tokio::task::JoinHandle<()>>)> {
    let listeners = listen
        .bind("management.listen")
        .await
        .map_err(std::io::Error::other)?;
    let addrs: Vec<SocketAddr> = listeners
        .iter()
        .filter_map(|l| l.local_addr().ok())
        .collect();
    let mut known: Vec<(String, SocketAddr)> =
        amqp.iter().map(|a| ("amqp".to_string(), *a)).collect();
    known.extend(addrs.iter().map(|a| ("http".to_string(), *a)));
    let limits = state.config.management.limits();
    let interval =
        std::time::Duration::from_millis(state.config.management.collect_statistics_interval);
    let node: Arc<dyn warren_mgmt::Node> = Arc::new(Node {
        state,
        listeners: known,
    });
    // One sample store and one sampler for every listener.
    let mgmt = warren_mgmt::Management::new(node, interval);
    let mut tasks = vec![tokio::spawn(mgmt.clone().sample(shutdown.clone()))];
    for l in listeners {
        if let Ok(a) = l.local_addr() {
            info!(addr = %a, "started HTTP listener for the management API");
        }
        let mgmt = mgmt.clone();
        let rx = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            if let Err(e) = mgmt.serve(l, rx, limits).await {
                tracing::error!(error = %e, "management listener failed");
            }
        }));
    }
    Ok((addrs, tasks))
}
