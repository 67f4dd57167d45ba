//! Warren's management HTTP API: RabbitMQ's management plugin paths, JSON shapes, status
//! codes and basic authentication with its tag rules, so that `rabbitmqadmin`, scripts and
//! monitoring written for RabbitMQ work unchanged; and Prometheus metrics with
//! rabbitmq_prometheus's names on `/metrics`.
//!
//! - [`backend`]: the only module that calls into the broker model; the embedding server
//!   implements [`Node`] for what lies outside it (connections, alarms, listeners).
//! - `api`: the routes and JSON shapes; `conns`: connections, channels and consumers;
//!   `admin`: vhost, user and permission writes; `list`: `sort`, `columns`, `page`...;
//!   `metrics`: the Prometheus text; `error`: RabbitMQ's error bodies; [`console`]: the
//!   web console's page and assets at `/` and `/console/...`; [`rates`]: the rate sampler
//!   and the `*_details` objects; [`resources`]: the node's memory, descriptors, sockets,
//!   threads and disk as `/api/nodes` shows them; `cluster`: node names and quorum queue
//!   replicas.
//!
//! ```no_run
//! # async fn demo(node: std::sync::Arc<dyn warren_mgmt::Node>) -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:15672").await?;
//! let (_stop, stopped) = tokio::sync::watch::channel(false);
//! warren_mgmt::serve(listener, node, stopped).await?;
//! # Ok(()) }
//! ```
//!
//! Several listeners share one [`Management`] (one sample store, one sampler):
//!
//! ```no_run
//! # async fn demo(node: std::sync::Arc<dyn warren_mgmt::Node>) -> std::io::Result<()> {
//! let mgmt = warren_mgmt::Management::new(node, std::time::Duration::from_secs(5));
//! let (_stop, stopped) = tokio::sync::watch::channel(false);
//! tokio::spawn(mgmt.clone().sample(stopped.clone()));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:15672").await?;
//! mgmt.serve(listener, stopped, Default::default()).await?;
//! # Ok(()) }
//! ```

mod admin;
mod api;
pub mod backend;
mod cluster;
mod conns;
pub mod console;
mod error;
mod list;
pub mod listener;
mod metrics;
pub mod rates;
pub mod resources;

pub use api::RABBITMQ_VERSION;
pub use backend::{ClusterNode, Node};
pub use error::ApiError;
pub use listener::ListenerLimits;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

/// The node name shown in `node` fields of a node that runs alone: `warren@<host name>`
/// (in a cluster: [`ClusterNode::name`]).
pub fn node_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("warren@{host}")
}

/// The management API of one node: its handlers' state and its rate samples, shared by
/// every listener that serves it.
#[derive(Clone)]
pub struct Management {
    app: Arc<api::App>,
}

impl Management {
    /// The API of `node`, sampling message rates every `interval` (RabbitMQ's
    /// `collect_statistics_interval`, 5 s by default) once [`Management::sample`] runs.
    pub fn new(node: Arc<dyn Node>, interval: std::time::Duration) -> Self {
        // In a cluster each node is named after its id, so that nodes on one host differ.
        let name = node
            .cluster_nodes()
            .into_iter()
            .find(|n| n.this)
            .map_or_else(node_name, |n| n.name);
        Management {
            app: Arc::new(api::App {
                backend: backend::Backend::new(node),
                node: name,
                started: Instant::now(),
                rates: rates::Rates::new(interval),
            }),
        }
    }

    /// The router (for tests and for embedding under another server).
    pub fn router(&self) -> axum::Router {
        api::router(self.app.clone())
    }

    /// Samples the counters every interval until `shutdown` turns true (see [`rates`]).
    /// The sweep runs on a blocking thread, so that a node with many queues does not hold
    /// up the runtime's workers.
    pub async fn sample(self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.app.rates.interval());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return;
                    }
                    continue;
                }
            }
            if *shutdown.borrow() {
                return;
            }
            let app = self.app.clone();
            let _ = tokio::task::spawn_blocking(move || app.rates.sweep(&app.backend)).await;
        }
    }

    /// Serves the API on `listener` bounded by `limits` until `shutdown` turns true
    /// (requests in progress finish).
    ///
    /// Errors: the listener failed.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        mut shutdown: tokio::sync::watch::Receiver<bool>,
        limits: ListenerLimits,
    ) -> std::io::Result<()> {
        use axum::serve::ListenerExt;
        let app = self
            .router()
            .into_make_service_with_connect_info::<SocketAddr>();
        // tap_io gives the bounded listener axum's ConnectInfo<SocketAddr>.
        let listener = listener::Bounded::new(listener, limits).tap_io(|_| {});
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                while !*shutdown.borrow() {
                    if shutdown.changed().await.is_err() {
                        return;
                    }
                }
            })
            .await
    }
}

/// The API's router for `node` (for tests and for embedding under another server), with
/// the default sampling interval; nothing samples until [`Management::sample`] runs.
pub fn router(node: Arc<dyn Node>) -> axum::Router {
    Management::new(node, rates::DEFAULT_INTERVAL).router()
}

/// Serves the API on `listener` with the default [`ListenerLimits`] until `shutdown` turns
/// true (requests in progress finish), sampling rates every 5 s meanwhile.
///
/// Errors: the listener failed.
pub async fn serve(
    listener: tokio::net::TcpListener,
    node: Arc<dyn Node>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    serve_with(listener, node, shutdown, ListenerLimits::default()).await
}

/// [`serve`] with the listener bounded by `limits` (connections held at once, idle and
/// request-header timeouts; see [`listener`]).
///
/// Errors: the listener failed.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    node: Arc<dyn Node>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    limits: ListenerLimits,
) -> std::io::Result<()> {
    let mgmt = Management::new(node, rates::DEFAULT_INTERVAL);
    let sampler = tokio::spawn(mgmt.clone().sample(shutdown.clone()));
    let r = mgmt.serve(listener, shutdown, limits).await;
    sampler.abort();
    r
}
