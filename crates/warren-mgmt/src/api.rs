//! The HTTP handlers: RabbitMQ management API paths, JSON shapes and status codes
//! (rabbitmq.com/docs/management, deps/rabbitmq_management in rabbitmq-server).

use crate::admin;
use crate::backend::{
    AckMode, Backend, BindingInfo, ExchangeInfo, LoginError, QueueInfo, UserInfo,
};
use crate::conns::{self, stats_with_rates};
use crate::error::ApiError;
use crate::list;
use crate::rates::{Key, Ranges};
use crate::resources::NodeResources;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use base64::Engine;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use warren_broker::policy::definition_json;

mod definitions;
mod health;
mod limits;
mod parameters;
mod policies;

/// The RabbitMQ version whose management API Warren answers as (`rabbitmq_version`,
/// `management_version`); `product_name` / `product_version` say what it really is.
pub const RABBITMQ_VERSION: &str = "4.0.0";

/// State shared by the handlers.
pub struct App {
    pub(crate) backend: Backend,
    pub(crate) node: String,
    pub(crate) started: Instant,
    pub(crate) rates: crate::rates::Rates,
}

pub(crate) type S = State<Arc<App>>;
pub(crate) type Peer = ConnectInfo<SocketAddr>;
pub(crate) type Q = Query<HashMap<String, String>>;
pub(crate) type Reply = Result<Response, ApiError>;

/// What a path needs of the caller's tags (rabbit_mgmt_util's `is_authorized_*`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// Any management user (management, policymaker, monitoring, administrator).
    Management,
    /// monitoring or administrator.
    Monitor,
    /// administrator.
    Admin,
}

pub(crate) fn has(tags: &[String], any: &[&str]) -> bool {
    tags.iter().any(|t| any.contains(&t.as_str()))
}

/// Authenticates the request's basic credentials and checks its tags, and, with `vhost`,
/// that the vhost is one the user may use (administrators may use all).
///
/// A request with `X-Requested-With: XMLHttpRequest` (the web console's calls) gets its 401
/// without `WWW-Authenticate`, so that a browser shows the console's own login form rather
/// than its built-in credentials dialog; every other client gets RabbitMQ's challenge.
pub(crate) fn authorize(
    app: &App,
    headers: &HeaderMap,
    peer: SocketAddr,
    need: Need,
    vhost: Option<&str>,
) -> Result<UserInfo, ApiError> {
    let scripted = headers
        .get("x-requested-with")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"XMLHttpRequest"));
    authorize_basic(app, headers, peer, need, vhost).map_err(|mut e| {
        if scripted {
            e.challenge = false;
        }
        e
    })
}

fn authorize_basic(
    app: &App,
    headers: &HeaderMap,
    peer: SocketAddr,
    need: Need,
    vhost: Option<&str>,
) -> Result<UserInfo, ApiError> {
    let Some(auth) = headers.get(header::AUTHORIZATION) else {
        return Err(ApiError::credentials_required());
    };
    let creds = Some(auth)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| {
            h.strip_prefix("Basic ")
                .or_else(|| h.strip_prefix("basic "))
        })
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(ApiError::not_authenticated)?;
    let (name, password) = creds
        .split_once(':')
        .ok_or_else(ApiError::not_authenticated)?;
    let user = match app.backend.login(name, password, peer) {
        Ok(u) => u,
        Err(LoginError::BadCredentials) => {
            tracing::warn!(user = name, %peer, "HTTP access denied: invalid credentials");
            return Err(ApiError::not_authenticated());
        }
        Err(LoginError::NotLoopback) => {
            return Err(ApiError::not_authorised(
                "User can only log in via localhost",
            ))
        }
    };
    if !has(
        &user.tags,
        &["administrator", "monitoring", "policymaker", "management"],
    ) {
        return Err(ApiError::not_authorised("Not management user"));
    }
    match need {
        Need::Admin if !has(&user.tags, &["administrator"]) => {
            return Err(ApiError::not_authorised("Not administrator user"))
        }
        Need::Monitor if !has(&user.tags, &["administrator", "monitoring"]) => {
            return Err(ApiError::not_authorised("Not monitor user"))
        }
        _ => {}
    }
    if let Some(v) = vhost {
        if !has(&user.tags, &["administrator"])
            && app.backend.vhost_exists(v)
            && !app.backend.user_vhosts(&user.name).iter().any(|x| x == v)
        {
            return Err(ApiError::not_authorised(
                "User not authorised to access virtual host",
            ));
        }
    }
    Ok(user)
}

/// The vhosts a user learns of (rabbit_mgmt_util's `list_visible_vhosts`): all for monitors
/// and administrators, else those the user may log in to. `/api/vhosts` and the overview
/// show these.
pub(crate) fn visible_vhosts(app: &App, user: &UserInfo) -> Vec<String> {
    if has(&user.tags, &["administrator", "monitoring"]) {
        app.backend.vhosts()
    } else {
        app.backend.user_vhosts(&user.name)
    }
}

/// The vhosts whose objects a user sees in the lists of queues, exchanges, bindings,
/// policies and parameters (rabbit_mgmt_util's `filter_vhost`): all for administrators,
/// else those the user may log in to; a `monitoring` user learns that other vhosts exist
/// ([`visible_vhosts`]) but not what is in them.
pub(crate) fn member_vhosts(app: &App, user: &UserInfo) -> Vec<String> {
    if has(&user.tags, &["administrator"]) {
        app.backend.vhosts()
    } else {
        app.backend.user_vhosts(&user.name)
    }
}

/// 404 Not Found (RabbitMQ's `resource_exists` false) when vhost `v` does not exist.
pub(crate) fn require_vhost(app: &App, v: &str) -> Result<(), ApiError> {
    if app.backend.vhost_exists(v) {
        Ok(())
    } else {
        Err(ApiError::not_found())
    }
}

/// A vhost named in a path that `user` must be able to see (rabbit_mgmt_util's
/// `is_authorized_vhost_visible`): 404 when it does not exist ([`require_vhost`]), then 401
/// `User not authorised to access virtual host` when it is not one of the user's
/// [`visible_vhosts`] (any vhost for administrators and monitors, else those the user may
/// use).
pub(crate) fn require_visible_vhost(app: &App, user: &UserInfo, v: &str) -> Result<(), ApiError> {
    require_vhost(app, v)?;
    if visible_vhosts(app, user).iter().any(|x| x == v) {
        Ok(())
    } else {
        Err(ApiError::not_authorised(
            "User not authorised to access virtual host",
        ))
    }
}

pub(crate) fn ok_json(v: Value) -> Reply {
    Ok(Json(v).into_response())
}

pub(crate) fn listed(items: Vec<Value>, q: &HashMap<String, String>) -> Reply {
    ok_json(list::apply(items, q)?)
}

/// `amq.default` in a path names the default exchange, as in RabbitMQ.
fn exchange_name(name: &str) -> &str {
    if name == "amq.default" {
        ""
    } else {
        name
    }
}

pub(crate) fn body_json(body: &Bytes) -> Result<Map<String, Value>, ApiError> {
    if body.is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::bad_request("not_json")),
        Err(_) => Err(ApiError::bad_request("not_json")),
    }
}

/// rabbit_mgmt_util's `with_decode` check: 400 `[{key_missing,a},{key_missing,b}]` naming
/// every one of `keys` the body lacks.
pub(crate) fn require_keys(m: &Map<String, Value>, keys: &[&str]) -> Result<(), ApiError> {
    let missing: Vec<String> = keys
        .iter()
        .filter(|k| !m.contains_key(**k))
        .map(|k| format!("{{key_missing,{k}}}"))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!("[{}]", missing.join(","))))
    }
}

fn get_bool(m: &Map<String, Value>, key: &str, default: bool) -> Result<bool, ApiError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(Value::String(s)) if s == "true" => Ok(true),
        Some(Value::String(s)) if s == "false" => Ok(false),
        Some(_) => Err(ApiError::bad_request(format!("{key} must be a boolean"))),
    }
}

fn get_args(m: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    match m.get("arguments") {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(a)) => Ok(a.clone()),
        // rabbitmqadmin sends "" for no arguments.
        Some(Value::String(s)) if s.is_empty() => Ok(Map::new()),
        Some(_) => Err(ApiError::bad_request("arguments must be an object")),
    }
}

fn query_flag(q: &HashMap<String, String>, key: &str) -> bool {
    q.get(key).is_some_and(|v| v == "true")
}

// ---- JSON shapes ---------------------------------------------------------------------

fn queue_json(app: &App, q: &QueueInfo, ranges: &Ranges) -> Value {
    let key = [Key::Queue(q.ident)];
    let mut v = json!({
        "name": q.name,
        "vhost": q.vhost,
        "durable": q.durable,
        "auto_delete": q.auto_delete,
        "exclusive": q.exclusive,
        "arguments": q.arguments,
        "node": app.node,
        "type": q.kind,
        "state": "running",
        "messages": q.ready + q.unacked,
        "messages_ready": q.ready,
        "messages_unacknowledged": q.unacked,
        "consumers": q.consumers,
        "message_bytes_ready": q.ready_bytes,
        "memory": q.memory,
        "message_stats": stats_with_rates(app, &q.stats, &key, ranges),
        "policy": q.policy.policy,
        "operator_policy": q.policy.operator_policy,
        "effective_policy_definition": definition_json(&q.policy.definition),
        "exclusive_consumer_tag": null,
    });
    if let Some(r) = &q.replicas {
        crate::cluster::replicas_json(app, r, &mut v);
    }
    if let Some(owner) = q.owner_node {
        v["node"] = Value::from(crate::cluster::node_name(app, owner));
    }
    app.rates.lengths(&mut v, &key, ranges);
    v
}

fn exchange_json(app: &App, x: &ExchangeInfo, ranges: &Ranges) -> Value {
    let mut v = json!({
        "name": x.name,
        "vhost": x.vhost,
        "type": x.kind,
        "durable": x.durable,
        "auto_delete": x.auto_delete,
        "internal": x.internal,
        "arguments": x.arguments,
        "user_who_performed_action": "rmq-internal",
    });
    // RabbitMQ shows an exchange's `policy` only when one applies.
    if let (Some(p), Value::Object(m)) = (&x.policy.policy, &mut v) {
        m.insert("policy".into(), Value::from(p.as_str()));
    }
    // And its `message_stats` once messages went through it.
    if let Some(c) = &x.stats {
        let mut stats = json!({"publish_in": c.publish_in, "publish_out": c.publish_out});
        let key = [Key::Exchange(x.vhost.clone(), x.name.clone())];
        app.rates.message_stats(&mut stats, &key, ranges);
        v["message_stats"] = stats;
    }
    v
}

/// RabbitMQ's `properties_key`: the binding's id in paths (`~` for an empty key without
/// arguments; the key then `~` and a hash of the arguments otherwise).
fn properties_key(b: &BindingInfo) -> String {
    if b.arguments.is_empty() {
        if b.routing_key.is_empty() {
            "~".into()
        } else {
            b.routing_key.clone()
        }
    } else {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        Value::Object(b.arguments.clone()).to_string().hash(&mut h);
        let hash = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(((h.finish() & 0xffff_ffff) as u32).to_be_bytes());
        format!("{}~{hash}", b.routing_key)
    }
}

fn binding_json(b: &BindingInfo) -> Value {
    json!({
        "source": b.source,
        "vhost": b.vhost,
        "destination": b.destination,
        "destination_type": b.destination_type,
        "routing_key": b.routing_key,
        "arguments": b.arguments,
        "properties_key": properties_key(b),
    })
}

/// A user as `/api/users` shows it (rabbit_mgmt_format's `internal_user`).
pub(crate) fn user_json(u: &UserInfo) -> Value {
    json!({
        "name": u.name,
        "tags": u.tags,
        "password_hash": u.password_hash,
        "hashing_algorithm": u.hashing_algorithm,
        "limits": u.limits,
    })
}

/// The cluster's name: the `cluster_name` global parameter when it is set, else `warren`.
pub(crate) fn cluster_name(app: &App) -> String {
    app.backend
        .global_parameter("cluster_name")
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "warren".to_string())
}

/// A node as `/api/nodes` shows it (rabbit_mgmt_wm_nodes): identity, the resource figures
/// of `r` (see [`crate::resources`] for each one's unit and source) with the
/// `<gauge>_details` rates RabbitMQ gives (`mem_used`, `fd_used`, `sockets_used`,
/// `disk_free`, `proc_used`), the alarms, and `uptime` in ms.
fn node_json(app: &App, r: &NodeResources) -> Value {
    let n = app.backend.node();
    let mut out = json!({
        "name": app.node,
        "type": "disc",
        "running": true,
        "being_drained": false,
        "mem_used": r.mem_used,
        "mem_limit": r.mem_limit,
        "mem_alarm": n.memory_alarm(),
        // How `mem_used` is measured (RabbitMQ's `vm_memory_calculation_strategy`).
        "mem_calculation_strategy": "rss",
        "disk_free": r.disk_free,
        "disk_free_limit": r.disk_free_limit,
        "disk_free_alarm": n.disk_alarm(),
        "fd_used": r.fd_used,
        "fd_total": r.fd_total,
        "sockets_used": r.sockets_used,
        "sockets_total": r.sockets_total,
        "proc_used": r.proc_used,
        "proc_total": r.proc_total,
        "run_queue": r.run_queue,
        "processors": r.processors,
        "uptime": app.started.elapsed().as_millis() as u64,
        "os_pid": std::process::id().to_string(),
        "partitions": [],
        "rates_mode": "basic",
        "product_name": "Warren",
        "product_version": env!("CARGO_PKG_VERSION"),
    });
    if let Value::Object(m) = &mut out {
        app.rates.resources(m);
    }
    out
}

/// The node's resource figures, read on a blocking thread (they are `/proc` reads, one per
/// open descriptor).
async fn node_resources(app: &Arc<App>) -> NodeResources {
    let app = app.clone();
    tokio::task::spawn_blocking(move || NodeResources::read(app.backend.node()))
        .await
        .unwrap_or_default()
}

// ---- handlers ------------------------------------------------------------------------

/// `GET /api/overview`, as rabbit_mgmt_wm_overview: monitors and administrators get the
/// node's figures with `node`, `listeners` and `contexts`; other users the figures of the
/// vhosts they may use, their own connections and channels, no consumer count and no
/// node details.
async fn overview(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let ranges = Ranges::from_query(&q)?;
    let monitor = has(&user.tags, &["administrator", "monitoring"]);
    let vhosts = visible_vhosts(&app, &user);
    let keys = overview_keys(&user, &vhosts);
    let mut queues = Vec::new();
    let mut exchanges = 0usize;
    for v in &vhosts {
        queues.extend(app.backend.queues(Some(v)));
        exchanges += app.backend.exchanges(Some(v)).len();
    }
    let ready: u64 = queues.iter().map(|q| q.ready).sum();
    let unacked: u64 = queues.iter().map(|q| q.unacked).sum();
    let consumers: u64 = queues.iter().map(|q| q.consumers).sum();
    let n = app.backend.node();
    let mut queue_totals = json!({
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
    });
    app.rates.lengths(&mut queue_totals, &keys, &ranges);
    let (connections, channels) = if monitor {
        (app.backend.connections().len(), app.backend.channel_count())
    } else {
        let own = app.backend.connections();
        let own: Vec<_> = own.iter().filter(|c| c.details.user == user.name).collect();
        (own.len(), own.iter().map(|c| c.channels).sum())
    };
    let mut object_totals = json!({
        "connections": connections,
        "channels": channels,
        "exchanges": exchanges,
        "queues": queues.len(),
    });
    if monitor {
        object_totals["consumers"] = Value::from(consumers);
    }
    let mut out = json!({
        "management_version": RABBITMQ_VERSION,
        "rabbitmq_version": RABBITMQ_VERSION,
        "product_name": "Warren",
        "product_version": env!("CARGO_PKG_VERSION"),
        "erlang_version": "none",
        "erlang_full_version": "none",
        "rates_mode": "basic",
        // What the rate samples keep (see `rates`): 605 s for the node and vhosts, 65 s
        // for queues, exchanges and channels, in RabbitMQ's rounded form.
        "sample_retention_policies": {
            "global": [600],
            "basic": [60],
            "detailed": [],
        },
        "disable_stats": false,
        "enable_queue_totals": true,
        "default_queue_type": "classic",
        "is_op_policy_updating_enabled": true,
        "cluster_name": cluster_name(&app),
        "cluster_tags": app.backend.global_parameter("cluster_tags")
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({})),
        "node_tags": {},
        "exchange_types": [
            {"name": "direct", "description": "AMQP direct exchange, as per the AMQP specification", "enabled": true},
            {"name": "fanout", "description": "AMQP fanout exchange, as per the AMQP specification", "enabled": true},
            {"name": "headers", "description": "AMQP headers exchange, as per the AMQP specification", "enabled": true},
            {"name": "topic", "description": "AMQP topic exchange, as per the AMQP specification", "enabled": true},
            {"name": "x-delayed-message", "description": "Delayed Message Exchange", "enabled": true},
        ],
        "message_stats": overview_stats(&app, &user, &vhosts, &keys, &ranges),
        "churn_rates": app.rates.churn_rates(&app.backend.churn(), &ranges),
        "queue_totals": queue_totals,
        "object_totals": object_totals,
        // RabbitMQ's backlog of stats events; Warren reads its counters directly.
        "statistics_db_event_queue": 0,
    });
    if monitor {
        let listeners: Vec<Value> = n
            .listeners()
            .into_iter()
            .map(|(protocol, a)| {
                json!({"node": app.node, "protocol": protocol, "ip_address": a.ip().to_string(),
                       "port": a.port()})
            })
            .collect();
        out["node"] = Value::from(app.node.as_str());
        out["listeners"] = Value::Array(listeners);
        out["contexts"] = json!([]);
    }
    ok_json(out)
}

async fn whoami(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    // Every Warren user is in its own database (RabbitMQ's internal backend).
    ok_json(json!({"name": user.name, "tags": user.tags, "is_internal_user": true}))
}

/// Another node of the cluster, as RabbitMQ lists a node it cannot read the figures of:
/// name, type and whether it runs (its inter-node connection with this node is up).
fn other_node_json(n: &crate::ClusterNode) -> Value {
    json!({
        "name": n.name,
        "type": "disc",
        "running": n.running,
        "being_drained": false,
        "partitions": [],
    })
}

/// `GET /api/nodes`: this node with its figures, then (in a cluster) the other nodes.
async fn nodes(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    authorize(&app, &headers, peer, Need::Monitor, None)?;
    let r = node_resources(&app).await;
    let mut all = vec![node_json(&app, &r)];
    all.extend(
        app.backend
            .node()
            .cluster_nodes()
            .iter()
            .filter(|n| !n.this)
            .map(other_node_json),
    );
    listed(all, &q)
}

async fn node(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Monitor, None)?;
    if name != app.node {
        let others = app.backend.node().cluster_nodes();
        return match others.iter().find(|n| !n.this && n.name == name) {
            Some(n) => ok_json(other_node_json(n)),
            None => Err(ApiError::not_found()),
        };
    }
    let r = node_resources(&app).await;
    ok_json(node_json(&app, &r))
}

/// `GET /api/nodes/{node}/memory`: RabbitMQ breaks an Erlang node's memory down by
/// kind of process and table; a Warren node has none of those, so it answers as RabbitMQ
/// does when the breakdown cannot be had: `{"memory": "not_available"}`.
async fn node_memory(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Monitor, None)?;
    if name != app.node {
        return Err(ApiError::not_found());
    }
    ok_json(json!({"memory": "not_available"}))
}

/// `GET /api/feature-flags`, `/api/deprecated-features[/used]`: Warren has no feature flags
/// (what a RabbitMQ 4 cluster enables is simply there) and deprecates nothing, so the
/// lists are empty; any management user may ask.
async fn no_items(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    listed(Vec::new(), &q)
}

fn vhost_json(app: &App, v: &str, ranges: &Ranges) -> Value {
    let key = [Key::Vhost(v.to_string())];
    let queues = app.backend.queues(Some(v));
    let ready: u64 = queues.iter().map(|q| q.ready).sum();
    let unacked: u64 = queues.iter().map(|q| q.unacked).sum();
    let record = app.backend.vhost_record(v).unwrap_or_default();
    // As RabbitMQ 4 (`rabbit_queue_type:inject_dqt`): the default queue type always, at
    // the top and in the metadata, `classic` when none was set.
    let queue_type = record.default_queue_type.as_deref().unwrap_or("classic");
    let mut out = json!({
        "name": v,
        "description": record.description,
        "tags": record.tags,
        "default_queue_type": queue_type,
        "protected_from_deletion": false,
        "metadata": {
            "description": record.description,
            "tags": record.tags,
            "default_queue_type": queue_type,
        },
        "tracing": false,
        "cluster_state": {app.node.clone(): "running"},
        "messages": ready + unacked,
        "messages_ready": ready,
        "messages_unacknowledged": unacked,
        "message_stats": stats_with_rates(app, &app.backend.vhost_stats(v), &key, ranges),
    });
    app.rates.lengths(&mut out, &key, ranges);
    out
}

/// Whose samples the overview's rates come from: the node's for those who see every
/// vhost, else the vhosts the user sees (their rates summed).
fn overview_keys(user: &UserInfo, vhosts: &[String]) -> Vec<Key> {
    if has(&user.tags, &["administrator", "monitoring"]) {
        vec![Key::Node]
    } else {
        vhosts.iter().map(|v| Key::Vhost(v.clone())).collect()
    }
}

/// The overview's `message_stats`: the node's for those who see every vhost, else the sum
/// over the vhosts the user sees; with rates from `keys`.
fn overview_stats(
    app: &App,
    user: &UserInfo,
    vhosts: &[String],
    keys: &[Key],
    ranges: &Ranges,
) -> Value {
    if has(&user.tags, &["administrator", "monitoring"]) {
        return stats_with_rates(app, &app.backend.global_stats(), keys, ranges);
    }
    let mut total = crate::backend::MessageStats::default();
    for v in vhosts {
        total.add(&app.backend.vhost_stats(v));
    }
    stats_with_rates(app, &total, keys, ranges)
}

async fn vhosts(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let ranges = Ranges::from_query(&q)?;
    let items = visible_vhosts(&app, &user)
        .iter()
        .map(|v| vhost_json(&app, v, &ranges))
        .collect();
    listed(items, &q)
}

/// `GET /api/vhosts/{v}`: administrators only, as rabbit_mgmt_wm_vhost (other users find
/// their vhosts in `/api/vhosts`).
async fn vhost(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    require_vhost(&app, &v)?;
    ok_json(vhost_json(&app, &v, &Ranges::from_query(&q)?))
}

async fn users(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    listed(app.backend.users().iter().map(user_json).collect(), &q)
}

async fn user(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    let u = app
        .backend
        .users()
        .into_iter()
        .find(|u| u.name == name)
        .ok_or_else(ApiError::not_found)?;
    ok_json(user_json(&u))
}

/// Every permission, in RabbitMQ's default order for these lists: by vhost, then user.
pub(crate) fn permission_items(app: &App) -> Vec<Value> {
    let mut items = app.backend.permissions();
    items.sort_by(|a, b| (&a.1, &a.0).cmp(&(&b.1, &b.0)));
    items
        .into_iter()
        .map(|(user, vhost, configure, write, read)| {
            json!({"user": user, "vhost": vhost, "configure": configure, "write": write, "read": read})
        })
        .collect()
}

async fn permissions(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    listed(permission_items(&app), &q)
}

async fn permission(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, u)): Path<(String, String)>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    permission_items(&app)
        .into_iter()
        .find(|p| p["vhost"] == v.as_str() && p["user"] == u.as_str())
        .map_or_else(|| Err(ApiError::not_found()), ok_json)
}

fn sorted<T>(mut items: Vec<T>, key: impl Fn(&T) -> (String, String)) -> Vec<T> {
    items.sort_by_key(|i| key(i));
    items
}

async fn exchanges_all(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let mut items = Vec::new();
    for v in member_vhosts(&app, &user) {
        items.extend(app.backend.exchanges(Some(&v)));
    }
    let items = sorted(items, |x| (x.vhost.clone(), x.name.clone()));
    let ranges = Ranges::from_query(&q)?;
    listed(
        items
            .iter()
            .map(|x| exchange_json(&app, x, &ranges))
            .collect(),
        &q,
    )
}

async fn exchanges_vhost(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    require_vhost(&app, &v)?;
    let items = sorted(app.backend.exchanges(Some(&v)), |x| {
        (x.vhost.clone(), x.name.clone())
    });
    let ranges = Ranges::from_query(&q)?;
    listed(
        items
            .iter()
            .map(|x| exchange_json(&app, x, &ranges))
            .collect(),
        &q,
    )
}

fn find_exchange(app: &App, v: &str, name: &str) -> Result<ExchangeInfo, ApiError> {
    require_vhost(app, v)?;
    app.backend
        .exchanges(Some(v))
        .into_iter()
        .find(|x| x.name == name)
        .ok_or_else(ApiError::not_found)
}

async fn exchange_get(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    let ranges = Ranges::from_query(&q)?;
    let x = find_exchange(&app, &v, exchange_name(&name))?;
    ok_json(exchange_json(&app, &x, &ranges))
}

async fn exchange_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    require_vhost(&app, &v)?;
    let b = body_json(&body)?;
    // RabbitMQ's defaults for keys left out: a transient direct exchange.
    let kind = match b.get("type") {
        None | Some(Value::Null) => "direct",
        Some(Value::String(t)) => t.as_str(),
        Some(_) => return Err(ApiError::bad_request("type must be a string")),
    };
    let created = app.backend.declare_exchange(
        &user,
        &ExchangeInfo {
            name: exchange_name(&name).to_string(),
            vhost: v.clone(),
            kind: kind.to_string(),
            durable: get_bool(&b, "durable", false)?,
            auto_delete: get_bool(&b, "auto_delete", false)?,
            internal: get_bool(&b, "internal", false)?,
            arguments: get_args(&b)?,
            policy: Arc::default(),
            stats: None,
        },
    )?;
    Ok(created_or_not(created))
}

fn created_or_not(created: bool) -> Response {
    if created {
        StatusCode::CREATED.into_response()
    } else {
        StatusCode::NO_CONTENT.into_response()
    }
}

async fn exchange_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    require_vhost(&app, &v)?;
    app.backend
        .delete_exchange(&user, &v, exchange_name(&name), query_flag(&q, "if-unused"))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn exchange_publish(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    require_vhost(&app, &v)?;
    let b = body_json(&body)?;
    require_keys(
        &b,
        &["routing_key", "properties", "payload", "payload_encoding"],
    )?;
    let missing = |k: &str| ApiError::bad_request(format!("[{{key_missing,{k}}}]"));
    let routing_key = b
        .get("routing_key")
        .and_then(|r| r.as_str())
        .ok_or_else(|| missing("routing_key"))?;
    let payload = b
        .get("payload")
        .and_then(|p| p.as_str())
        .ok_or_else(|| missing("payload"))?;
    let encoding = b
        .get("payload_encoding")
        .and_then(|e| e.as_str())
        .ok_or_else(|| missing("payload_encoding"))?;
    let payload = match encoding {
        "string" => Bytes::from(payload.to_string()),
        "base64" => Bytes::from(
            base64::engine::general_purpose::STANDARD
                .decode(payload)
                .map_err(|_| ApiError::bad_request("payload is not valid base64"))?,
        ),
        _ => {
            return Err(ApiError::bad_request(format!(
                "Unsupported payload_encoding {encoding}"
            )))
        }
    };
    let props = match b.get("properties") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(p)) => p.clone(),
        Some(_) => return Err(ApiError::bad_request("properties must be an object")),
    };
    let routed = app
        .backend
        .publish(
            &user,
            &v,
            exchange_name(&name),
            routing_key,
            &props,
            payload,
        )
        .await?;
    ok_json(json!({"routed": routed}))
}

async fn exchange_bindings(
    app: &App,
    v: &str,
    name: &str,
    as_source: bool,
    q: &HashMap<String, String>,
) -> Reply {
    let x = find_exchange(app, v, exchange_name(name))?;
    let items: Vec<Value> = app
        .backend
        .bindings(Some(v))
        .iter()
        .filter(|b| {
            if as_source {
                b.source == x.name
            } else {
                b.destination_type == "exchange" && b.destination == x.name
            }
        })
        .map(binding_json)
        .collect();
    listed(items, q)
}

async fn exchange_bindings_source(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    exchange_bindings(&app, &v, &name, true, &q).await
}

async fn exchange_bindings_destination(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    exchange_bindings(&app, &v, &name, false, &q).await
}

async fn queues_all(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let mut items = Vec::new();
    for v in member_vhosts(&app, &user) {
        items.extend(app.backend.queues(Some(&v)));
    }
    let items = sorted(items, |x| (x.vhost.clone(), x.name.clone()));
    let ranges = Ranges::from_query(&q)?;
    listed(
        items.iter().map(|x| queue_json(&app, x, &ranges)).collect(),
        &q,
    )
}

async fn queues_vhost(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    require_vhost(&app, &v)?;
    let items = sorted(app.backend.queues(Some(&v)), |x| {
        (x.vhost.clone(), x.name.clone())
    });
    let ranges = Ranges::from_query(&q)?;
    listed(
        items.iter().map(|x| queue_json(&app, x, &ranges)).collect(),
        &q,
    )
}

fn find_queue(app: &App, v: &str, name: &str) -> Result<QueueInfo, ApiError> {
    require_vhost(app, v)?;
    app.backend.queue(v, name).ok_or_else(ApiError::not_found)
}

async fn queue_get(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    let ranges = Ranges::from_query(&q)?;
    ok_json(queue_json(&app, &find_queue(&app, &v, &name)?, &ranges))
}

/// The longest queue name, bytes: an AMQP 0-9-1 short string.
const MAX_QUEUE_NAME: usize = 255;

/// Refuses a queue name AMQP clients could not name (longer than a short string) as RabbitMQ
/// 4's `PUT /api/queues/{vhost}/{name}` does (rabbit_parameter_validation's
/// `amqp091_queue_name`): 400 `bad_request` with "queue should be less than 255 bytes,
/// actually was N" and a newline. (RabbitMQ checks exchange names nowhere in its HTTP API,
/// and neither does Warren.)
fn check_queue_name(name: &str) -> Result<(), ApiError> {
    if name.len() > MAX_QUEUE_NAME {
        return Err(ApiError::bad_request(format!(
            "queue should be less than 255 bytes, actually was {}\n",
            name.len()
        )));
    }
    Ok(())
}

async fn queue_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    require_vhost(&app, &v)?;
    check_queue_name(&name)?;
    let b = body_json(&body)?;
    // RabbitMQ's default for a left-out `durable`: a transient queue.
    let created = app.backend.declare_queue(
        &user,
        &v,
        &name,
        get_bool(&b, "durable", false)?,
        get_bool(&b, "auto_delete", false)?,
        &get_args(&b)?,
    )?;
    Ok(created_or_not(created))
}

async fn queue_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    require_vhost(&app, &v)?;
    app.backend.delete_queue(
        &user,
        &v,
        &name,
        query_flag(&q, "if-unused"),
        query_flag(&q, "if-empty"),
    )?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn queue_purge(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    find_queue(&app, &v, &name)?;
    app.backend.purge_queue(&user, &v, &name)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn queue_get_messages(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    find_queue(&app, &v, &name)?;
    let b = body_json(&body)?;
    require_keys(&b, &["ackmode", "count", "encoding"])?;
    let missing = |k: &str| ApiError::bad_request(format!("[{{key_missing,{k}}}]"));
    let count = b
        .get("count")
        .and_then(|c| {
            c.as_u64()
                .or_else(|| c.as_str().and_then(|s| s.parse().ok()))
        })
        .ok_or_else(|| missing("count"))?;
    let mode = match b.get("ackmode").and_then(|a| a.as_str()) {
        Some("ack_requeue_true") => AckMode::AckRequeue,
        Some("ack_requeue_false") => AckMode::Ack,
        Some("reject_requeue_true") => AckMode::RejectRequeue,
        Some("reject_requeue_false") => AckMode::Reject,
        Some(other) => {
            return Err(ApiError::bad_request(format!("Invalid ackmode: {other}")));
        }
        None => return Err(missing("ackmode")),
    };
    let encoding = b
        .get("encoding")
        .and_then(|e| e.as_str())
        .ok_or_else(|| missing("encoding"))?;
    if encoding != "auto" && encoding != "base64" {
        return Err(ApiError::bad_request(format!(
            "Unsupported encoding {encoding}"
        )));
    }
    let truncate = b.get("truncate").and_then(|t| {
        t.as_u64()
            .or_else(|| t.as_str().and_then(|s| s.parse().ok()))
    });
    let count = usize::try_from(count).unwrap_or(usize::MAX).min(100_000);
    let msgs = app.backend.get(&user, &v, &name, count, mode)?;
    let items: Vec<Value> = msgs
        .into_iter()
        .map(|m| {
            let bytes = m.payload.len();
            let body = match truncate {
                Some(t) if (t as usize) < bytes => m.payload.slice(..t as usize),
                _ => m.payload.clone(),
            };
            let (payload, payload_encoding) = match (encoding, std::str::from_utf8(&body)) {
                ("auto", Ok(s)) => (s.to_string(), "string"),
                _ => (
                    base64::engine::general_purpose::STANDARD.encode(&body),
                    "base64",
                ),
            };
            json!({
                "payload_bytes": bytes,
                "redelivered": m.redelivered,
                "exchange": m.exchange,
                "routing_key": m.routing_key,
                "message_count": m.message_count,
                "properties": m.properties,
                "payload": payload,
                "payload_encoding": payload_encoding,
            })
        })
        .collect();
    ok_json(Value::Array(items))
}

async fn queue_bindings(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    find_queue(&app, &v, &name)?;
    let items = app
        .backend
        .bindings(Some(&v))
        .iter()
        .filter(|b| b.destination_type == "queue" && b.destination == name)
        .map(binding_json)
        .collect();
    listed(items, &q)
}

async fn bindings_all(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let mut items = Vec::new();
    for v in member_vhosts(&app, &user) {
        items.extend(app.backend.bindings(Some(&v)).iter().map(binding_json));
    }
    listed(items, &q)
}

async fn bindings_vhost(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    require_vhost(&app, &v)?;
    let items = app
        .backend
        .bindings(Some(&v))
        .iter()
        .map(binding_json)
        .collect();
    listed(items, &q)
}

fn between(
    app: &App,
    v: &str,
    source: &str,
    dest: &str,
    to_queue: bool,
) -> Result<Vec<BindingInfo>, ApiError> {
    find_exchange(app, v, source)?;
    if to_queue {
        find_queue(app, v, dest)?;
    } else {
        find_exchange(app, v, dest)?;
    }
    let kind = if to_queue { "queue" } else { "exchange" };
    Ok(app
        .backend
        .bindings(Some(v))
        .into_iter()
        .filter(|b| b.source == source && b.destination == dest && b.destination_type == kind)
        .collect())
}

fn dest_kind(kind: &str) -> Result<bool, ApiError> {
    match kind {
        "q" => Ok(true),
        "e" => Ok(false),
        _ => Err(ApiError::not_found()),
    }
}

async fn bindings_between(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, source, kind, dest)): Path<(String, String, String, String)>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    let to_queue = dest_kind(&kind)?;
    let items = between(&app, &v, exchange_name(&source), &dest, to_queue)?
        .iter()
        .map(binding_json)
        .collect();
    listed(items, &q)
}

async fn bindings_create(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, source, kind, dest)): Path<(String, String, String, String)>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    let to_queue = dest_kind(&kind)?;
    let source = exchange_name(&source);
    between(&app, &v, source, &dest, to_queue)?;
    let b = body_json(&body)?;
    let routing_key = b.get("routing_key").and_then(|r| r.as_str()).unwrap_or("");
    let args = get_args(&b)?;
    app.backend
        .bind(&user, &v, source, &dest, to_queue, routing_key, &args)?;
    let info = BindingInfo {
        source: source.to_string(),
        vhost: v.clone(),
        destination: dest.clone(),
        destination_type: if to_queue { "queue" } else { "exchange" },
        routing_key: routing_key.to_string(),
        arguments: args,
    };
    // Relative to the request path, as RabbitMQ gives it: `<destination>/<props>`.
    let location = format!("{}/{}", urlencode(&dest), urlencode(&properties_key(&info)));
    let mut r = StatusCode::CREATED.into_response();
    if let Ok(h) = location.parse() {
        r.headers_mut().insert(header::LOCATION, h);
    }
    Ok(r)
}

fn urlencode(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

async fn binding_one(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, source, kind, dest, props)): Path<(String, String, String, String, String)>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    let to_queue = dest_kind(&kind)?;
    between(&app, &v, exchange_name(&source), &dest, to_queue)?
        .iter()
        .find(|b| properties_key(b) == props)
        .map_or_else(|| Err(ApiError::not_found()), |b| ok_json(binding_json(b)))
}

async fn binding_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, source, kind, dest, props)): Path<(String, String, String, String, String)>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    let to_queue = dest_kind(&kind)?;
    let source = exchange_name(&source);
    let b = between(&app, &v, source, &dest, to_queue)?
        .into_iter()
        .find(|b| properties_key(b) == props)
        .ok_or_else(ApiError::not_found)?;
    app.backend.unbind(
        &user,
        &v,
        source,
        &dest,
        to_queue,
        &b.routing_key,
        &b.arguments,
    )?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn aliveness(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, Some(&v))?;
    require_vhost(&app, &v)?;
    // As RabbitMQ: declare `aliveness-test`, publish to it and get the message back.
    let q = "aliveness-test";
    app.backend
        .declare_queue(&user, &v, q, false, false, &Map::new())?;
    app.backend
        .publish(
            &user,
            &v,
            "",
            q,
            &Map::new(),
            Bytes::from_static(b"test_message"),
        )
        .await?;
    let got = app.backend.get(&user, &v, q, 1, AckMode::Ack)?;
    if got.iter().any(|m| &m.payload[..] == b"test_message") {
        ok_json(json!({"status": "ok"}))
    } else {
        Ok((
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "failed", "reason": "aliveness test message not received"})),
        )
            .into_response())
    }
}

async fn metrics(State(app): S) -> Reply {
    text_metrics(crate::metrics::render(&app, false))
}

async fn metrics_per_object(State(app): S) -> Reply {
    text_metrics(crate::metrics::render(&app, true))
}

fn text_metrics(r: Result<String, String>) -> Reply {
    match r {
        Ok(text) => Ok((
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response()),
        Err(e) => Err(ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error: "internal_server_error",
            reason: e,
            challenge: false,
        }),
    }
}

async fn not_found() -> ApiError {
    ApiError::not_found()
}

/// Every route of the API.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/api/overview", get(overview))
        .route("/api/whoami", get(whoami))
        .route("/api/nodes", get(nodes))
        .route("/api/nodes/{node}", get(node))
        .route("/api/nodes/{node}/memory", get(node_memory))
        .route("/api/feature-flags", get(no_items))
        .route("/api/deprecated-features", get(no_items))
        .route("/api/deprecated-features/used", get(no_items))
        .route("/api/vhosts", get(vhosts))
        .route(
            "/api/vhosts/{v}",
            get(vhost).put(admin::vhost_put).delete(admin::vhost_delete),
        )
        .route(
            "/api/cluster-name",
            get(admin::cluster_name).put(admin::cluster_name_put),
        )
        .route("/api/vhosts/{v}/permissions", get(admin::vhost_permissions))
        .route(
            "/api/vhosts/{v}/topic-permissions",
            get(admin::vhost_topic_permissions),
        )
        .route("/api/users", get(users))
        .route(
            "/api/users/without-permissions",
            get(admin::users_without_permissions),
        )
        .route("/api/users/bulk-delete", post(admin::users_bulk_delete))
        .route(
            "/api/users/{u}",
            get(user).put(admin::user_put).delete(admin::user_delete),
        )
        .route("/api/users/{u}/permissions", get(admin::user_permissions))
        .route(
            "/api/users/{u}/topic-permissions",
            get(admin::user_topic_permissions),
        )
        .route("/api/permissions", get(permissions))
        .route(
            "/api/permissions/{v}/{u}",
            get(permission)
                .put(admin::permission_put)
                .delete(admin::permission_delete),
        )
        .route("/api/topic-permissions", get(admin::topic_permissions))
        .route(
            "/api/topic-permissions/{v}/{u}",
            get(admin::topic_permission_get)
                .put(admin::topic_permission_put)
                .delete(admin::topic_permission_delete),
        )
        .route(
            "/api/topic-permissions/{v}/{u}/{exchange}",
            get(admin::topic_permission_get)
                .put(admin::topic_permission_put)
                .delete(admin::topic_permission_delete),
        )
        .route("/api/exchanges", get(exchanges_all))
        .route("/api/exchanges/{v}", get(exchanges_vhost))
        .route(
            "/api/exchanges/{v}/{name}",
            get(exchange_get).put(exchange_put).delete(exchange_delete),
        )
        .route("/api/exchanges/{v}/{name}/publish", post(exchange_publish))
        .route(
            "/api/exchanges/{v}/{name}/bindings/source",
            get(exchange_bindings_source),
        )
        .route(
            "/api/exchanges/{v}/{name}/bindings/destination",
            get(exchange_bindings_destination),
        )
        .route("/api/queues", get(queues_all))
        .route("/api/queues/{v}", get(queues_vhost))
        .route(
            "/api/queues/{v}/{name}",
            get(queue_get).put(queue_put).delete(queue_delete),
        )
        .route(
            "/api/queues/{v}/{name}/contents",
            axum::routing::delete(queue_purge),
        )
        .route("/api/queues/{v}/{name}/get", post(queue_get_messages))
        .route(
            "/api/queues/quorum/{v}/{name}/replicas/add",
            post(crate::cluster::replica_add),
        )
        .route(
            "/api/queues/quorum/{v}/{name}/replicas/delete",
            delete(crate::cluster::replica_delete),
        )
        .route("/api/cluster/nodes", post(crate::cluster::node_add))
        .route(
            "/api/cluster/nodes/{node}",
            delete(crate::cluster::node_remove),
        )
        .route("/api/queues/{v}/{name}/bindings", get(queue_bindings))
        .route("/api/bindings", get(bindings_all))
        .route("/api/bindings/{v}", get(bindings_vhost))
        .route(
            "/api/bindings/{v}/e/{source}/{kind}/{dest}",
            get(bindings_between).post(bindings_create),
        )
        .route(
            "/api/bindings/{v}/e/{source}/{kind}/{dest}/{props}",
            get(binding_one).delete(binding_delete),
        )
        .route("/api/aliveness-test/{v}", get(aliveness))
        .route("/api/connections", get(conns::connections))
        .route(
            "/api/connections/{name}",
            get(conns::connection).delete(conns::connection_delete),
        )
        .route(
            "/api/connections/{name}/channels",
            get(conns::connection_channels),
        )
        .route(
            "/api/connections/username/{username}",
            get(conns::user_connections).delete(conns::user_connections_delete),
        )
        .route("/api/vhosts/{v}/connections", get(conns::vhost_connections))
        .route("/api/vhosts/{v}/channels", get(conns::vhost_channels))
        .route("/api/channels", get(conns::channels))
        .route("/api/channels/{name}", get(conns::channel))
        .route("/api/consumers", get(conns::consumers))
        .route("/api/consumers/{v}", get(conns::vhost_consumers))
        .merge(health::routes())
        .merge(limits::routes())
        .merge(policies::routes())
        .merge(parameters::routes())
        .merge(definitions::routes())
        .merge(crate::console::routes())
        .route("/metrics", get(metrics))
        .route("/metrics/per-object", get(metrics_per_object))
        .fallback(not_found)
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

/// Largest request body the API reads, bytes: RabbitMQ's `management.http.max_body_size`
/// default (20 MB), so that large definitions files import as they do there. A larger body
/// is refused with 413.
pub const MAX_BODY_BYTES: usize = 20_000_000;
