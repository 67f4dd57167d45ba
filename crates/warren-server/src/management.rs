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
    fn memory_limit(&self) -> Option<u64> {
        Some(self.state.memory_limit())
    }
    fn disk_free(&self) -> Option<u64> {
        self.state.disk_free()
    }
    fn disk_free_limit(&self) -> Option<u64> {
        Some(self.state.disk_free_limit())
    }
    fn listeners(&self) -> Vec<(String, SocketAddr)> {
        self.listeners.clone()
    }
    fn cluster_nodes(&self) -> Vec<warren_mgmt::ClusterNode> {
        let Some(cluster) = self.state.quorum.cluster() else {
            return Vec::new();
        };
        let me = cluster.node_id();
        let up = cluster.connected();
        cluster
            .nodes()
            .iter()
            .map(|(&id, addr)| warren_mgmt::ClusterNode {
                id,
                name: warren_mgmt::ClusterNode::name_of(id, addr),
                this: id == me,
                running: id == me || up.contains(&id),
            })
            .collect()
    }
    fn change_quorum_member(
        &self,
        vhost: &str,
        name: &str,
        node: u64,
        add: bool,
    ) -> warren_mgmt::backend::MemberChange {
        let quorum = self.state.quorum.clone();
        let (vhost, name) = (vhost.to_string(), name.to_string());
        Box::pin(async move { quorum.change_member(&vhost, &name, node, add).await })
    }
    fn change_cluster_node(
        &self,
        id: u64,
        address: Option<String>,
    ) -> warren_mgmt::backend::MemberChange {
        let quorum = self.state.quorum.clone();
        Box::pin(async move { quorum.change_node(id, address).await })
    }
    fn loopback_users(&self) -> Vec<String> {
        self.state.loopback_users.clone()
    }
    fn max_table_depth(&self) -> usize {
        self.state.config.amqp.max_table_depth
    }
    fn connection_limit(&self) -> Option<usize> {
        Some(self.state.config.amqp.max_connections)
    }
    fn tls_certificates(&self) -> Vec<warren_mgmt::backend::ListenerCertificates> {
        let tls = &self.state.config.tls;
        let Some(cert) = &tls.cert_file else {
            return Vec::new();
        };
        self.listeners
            .iter()
            .filter(|(p, _)| p == "amqp/ssl")
            .map(
                |(protocol, addr)| warren_mgmt::backend::ListenerCertificates {
                    protocol: protocol.clone(),
                    addr: *addr,
                    cert_file: cert.display().to_string(),
                    ca_file: tls.ca_file.as_ref().map(|f| f.display().to_string()),
                    cert_expiries: certificate_ends(cert),
                    ca_expiries: tls
                        .ca_file
                        .as_deref()
                        .map_or(Ok(Vec::new()), certificate_ends),
                },
            )
            .collect()
    }
}

/// When each certificate of the PEM file `path` stops being valid (seconds since the Unix
/// epoch), read now (a certificate replaced since the start and reloaded by SIGHUP is
/// the one looked at).
///
/// Errors: the file cannot be read, holds no certificate, or a certificate in it cannot be
/// parsed.
fn certificate_ends(path: &std::path::Path) -> Result<Vec<i64>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut ends = Vec::new();
    for pem in x509_parser::pem::Pem::iter_from_buffer(&bytes) {
        let pem = pem.map_err(|e| format!("{}: {e}", path.display()))?;
        if pem.label != "CERTIFICATE" {
            continue;
        }
        let cert = pem
            .parse_x509()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        ends.push(cert.validity().not_after.timestamp());
    }
    if ends.is_empty() {
        return Err(format!(
            "{}: The certificate file provided does not contain any PEM entry.",
            path.display()
        ));
    }
    Ok(ends)
}

/// Binds `listen` (setting `management.listen`) and serves the API there until `shutdown`
/// turns true; `amqp` and `amqps` are the AMQP listeners the API lists. Returns the bound
/// addresses and the serving tasks.
///
/// Errors: the address cannot be bound ([`crate::listen::ListenError`]).
pub(crate) async fn start(
    listen: &ListenAddr,
    state: Arc<ServerState>,
    amqp: &[SocketAddr],
    amqps: Option<SocketAddr>,
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
    known.extend(amqps.map(|a| ("amqp/ssl".to_string(), a)));
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
