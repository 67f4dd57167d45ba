//! The cluster as the management API shows it: node names by id, and a quorum queue's
//! replicas (`leader`, `members`, `online` in its JSON; adding and removing one with
//! RabbitMQ's `POST /api/queues/quorum/{vhost}/{name}/replicas/add` and
//! `DELETE /api/queues/quorum/{vhost}/{name}/replicas/delete`, body `{"node": NAME}`,
//! administrators, 204), and the cluster's nodes: `POST /api/cluster/nodes` with body
//! `{"node": "ID@HOST:PORT"}` adds a running node to the cluster, `DELETE
//! /api/cluster/nodes/{node}` (its name `warren-ID@HOST` or its id) removes one
//! (administrators, 204; Warren's own: RabbitMQ changes its cluster with `rabbitmqctl`).

use crate::api::{authorize, body_json, require_keys, App, Need, Peer, Reply, S};
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use serde_json::{json, Value};
use std::net::SocketAddr;
use warren_broker::Replicas;

/// The name of node `id` in `node` fields: the cluster's name for it, or this node's name
/// when it runs alone.
pub(crate) fn node_name(app: &App, id: u64) -> String {
    app.backend
        .node()
        .cluster_nodes()
        .into_iter()
        .find(|n| n.id == id)
        .map_or_else(|| app.node.clone(), |n| n.name)
}

/// `leader`, `members` and `online` of a replicated queue, as RabbitMQ's quorum queues show
/// them (node names).
pub(crate) fn replicas_json(app: &App, r: &Replicas, out: &mut Value) {
    let names = |ids: &[u64]| -> Vec<String> { ids.iter().map(|id| node_name(app, *id)).collect() };
    if let Some(leader) = r.leader {
        out["leader"] = Value::from(node_name(app, leader));
        out["node"] = Value::from(node_name(app, leader));
    }
    out["members"] = json!(names(&r.members));
    out["online"] = json!(names(&r.online));
}

/// Adds or removes the member on the node named in the body.
async fn change(
    app: &App,
    headers: &HeaderMap,
    peer: SocketAddr,
    v: &str,
    name: &str,
    body: &Bytes,
    add: bool,
) -> Reply {
    authorize(app, headers, peer, Need::Admin, None)?;
    let m = body_json(body)?;
    require_keys(&m, &["node"])?;
    let node = m
        .get("node")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("node must be a string"))?;
    let q = app.backend.queue(v, name).ok_or_else(ApiError::not_found)?;
    if q.kind != "quorum" {
        return Err(ApiError::bad_request(format!(
            "{name} is a {} queue, not a quorum queue",
            q.kind
        )));
    }
    let nodes = app.backend.node().cluster_nodes();
    let Some(target) = nodes.iter().find(|n| n.name == node) else {
        return Err(ApiError::bad_request(format!(
            "{node} is not a node of the cluster"
        )));
    };
    app.backend
        .node()
        .change_quorum_member(v, name, target.id, add)
        .await
        .map_err(ApiError::bad_request)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /api/queues/quorum/{vhost}/{name}/replicas/add`.
pub(crate) async fn replica_add(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    change(&app, &headers, peer, &v, &name, &body, true).await
}

/// `DELETE /api/queues/quorum/{vhost}/{name}/replicas/delete`.
pub(crate) async fn replica_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    change(&app, &headers, peer, &v, &name, &body, false).await
}

/// `POST /api/cluster/nodes`, body `{"node": "ID@HOST:PORT"}`: adds that node (running, with
/// the cluster's secret) to the cluster; 204. Errors: 400 with the reason.
pub(crate) async fn node_add(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    let m = body_json(&body)?;
    require_keys(&m, &["node"])?;
    let node = m
        .get("node")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("node must be a string"))?;
    let (id, addr) = node
        .split_once('@')
        .and_then(|(id, addr)| Some((id.trim().parse::<u64>().ok()?, addr.trim())))
        .filter(|(id, addr)| *id >= 1 && addr.contains(':'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "node must be ID@HOST:PORT (an id of at least 1 and the node's [cluster] listen address), not {node:?}"
            ))
        })?;
    app.backend
        .node()
        .change_cluster_node(id, Some(addr.to_string()))
        .await
        .map_err(ApiError::bad_request)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `DELETE /api/cluster/nodes/{node}` (`warren-ID@HOST` or `ID`): removes that node from the
/// cluster; 204. Errors: 404 for a node the cluster does not have, 400 with the reason.
pub(crate) async fn node_remove(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(node): Path<String>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    let nodes = app.backend.node().cluster_nodes();
    let Some(target) = nodes
        .iter()
        .find(|n| n.name == node || n.id.to_string() == node)
    else {
        return Err(ApiError::not_found_because(format!(
            "{node} is not a node of the cluster"
        )));
    };
    app.backend
        .node()
        .change_cluster_node(target.id, None)
        .await
        .map_err(ApiError::bad_request)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
