//! The health checks under `/api/health/checks/` (rabbit_mgmt_wm_health_check_* in
//! rabbitmq-server): 200 `{"status":"ok",...}` when the check passes, 503
//! `{"status":"failed","reason":...}` with what failed otherwise; any management user may
//! ask. Every vhost runs in the node's process. `node-is-quorum-critical` fails when a
//! quorum queue with a member here would lose its majority if this node stopped (members
//! online elsewhere fewer than a majority; a node alone answers "single node cluster", as
//! RabbitMQ), and `quorum-queues-without-elected-leaders` when a quorum queue's member here
//! knows no leader.

use super::{authorize, ok_json, App, Need, Peer, Reply, S};
use crate::backend::ListenerCertificates;
use crate::error::ApiError;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::Arc;

/// The routes, to merge into the API's router.
pub(super) fn routes() -> Router<Arc<App>> {
    let mut r = Router::new()
        .route("/api/health/checks/alarms", get(alarms))
        .route("/api/health/checks/local-alarms", get(local_alarms))
        .route(
            "/api/health/checks/metadata-store/initialized",
            get(always_ok),
        )
        .route(
            "/api/health/checks/metadata-store/initialized/with-data",
            get(initialized_with_data),
        )
        .route(
            "/api/health/checks/certificate-expiration/{within}/{unit}",
            get(certificate_expiration),
        )
        .route(
            "/api/health/checks/port-listener/{port}",
            get(port_listener),
        )
        .route(
            "/api/health/checks/protocol-listener/{protocol}",
            get(protocol_listener),
        )
        .route("/api/health/checks/virtual-hosts", get(always_ok))
        .route(
            "/api/health/checks/node-is-quorum-critical",
            get(quorum_critical),
        )
        // Gone from RabbitMQ 4 with classic mirrored queues; kept for older scripts.
        .route(
            "/api/health/checks/node-is-mirror-sync-critical",
            get(always_ok),
        )
        .route("/api/health/checks/is-in-service", get(always_ok))
        .route(
            "/api/health/checks/below-node-connection-limit",
            get(below_connection_limit),
        )
        .route(
            "/api/health/checks/ready-to-serve-clients",
            get(ready_to_serve_clients),
        )
        .route(
            "/api/health/checks/reached-target-cluster-size",
            get(always_ok),
        );
    // RabbitMQ declares these with a trailing slash; both forms are served.
    let all = "/api/health/checks/quorum-queues-without-elected-leaders/all-vhosts";
    r = r
        .route(all, get(without_leaders_anywhere))
        .route(&format!("{all}/"), get(without_leaders_anywhere));
    for path in [
        "/api/health/checks/quorum-queues-without-elected-leaders/all-vhosts/pattern/{pattern}",
        "/api/health/checks/quorum-queues-without-elected-leaders/vhost/{v}",
        "/api/health/checks/quorum-queues-without-elected-leaders/vhost/{v}/pattern/{pattern}",
    ] {
        r = r
            .route(path, get(without_leaders))
            .route(&format!("{path}/"), get(without_leaders));
    }
    r
}

fn ok(extra: Value) -> Reply {
    let mut v = json!({"status": "ok"});
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    ok_json(v)
}

fn failed(reason: &str, extra: Value) -> Reply {
    let mut v = json!({"status": "failed", "reason": reason});
    if let (Some(o), Value::Object(e)) = (v.as_object_mut(), extra) {
        o.extend(e);
    }
    Ok((StatusCode::SERVICE_UNAVAILABLE, Json(v)).into_response())
}

/// Checks that hold on every Warren node: `metadata-store/initialized` (the definitions
/// are loaded before the listeners open), `virtual-hosts` (every vhost runs in this
/// process), `is-in-service`, `reached-target-cluster-size` (a cluster of one),
/// `node-is-mirror-sync-critical` (no mirrored queues).
async fn always_ok(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    ok(json!({}))
}

/// A quorum queue as these checks list it (rabbit_upgrade_preparation's fields).
fn listed_queue(q: &crate::backend::QueueInfo) -> Value {
    json!({
        "readable_name": format!("queue '{}' in vhost '{}'", q.name, q.vhost),
        "name": q.name,
        "virtual_host": q.vhost,
        "type": "quorum",
    })
}

/// `node-is-quorum-critical`: RabbitMQ's answer for a single-node cluster; in a cluster,
/// 503 with the quorum queues that would lose their majority without this node.
async fn quorum_critical(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    let nodes = app.backend.node().cluster_nodes();
    let Some(me) = nodes.iter().find(|n| n.this).map(|n| n.id) else {
        return ok(json!({"reason": "single node cluster"}));
    };
    let critical: Vec<Value> = app
        .backend
        .queues(None)
        .iter()
        .filter(|q| {
            q.replicas.as_ref().is_some_and(|r| {
                let elsewhere = r.online.iter().filter(|id| **id != me).count();
                r.members.contains(&me) && elsewhere < r.members.len() / 2 + 1
            })
        })
        .map(listed_queue)
        .collect();
    if critical.is_empty() {
        return ok(json!({}));
    }
    failed(
        "There are quorum queues that would lose their quorum if the target node is shut down",
        json!({"queues": critical}),
    )
}

/// `quorum-queues-without-elected-leaders/{all-vhosts|vhost/V}[/pattern/P]`: 503 with the
/// quorum queues (of vhost V, names matching the regular expression P) whose member on this
/// node knows no leader.
async fn without_leaders(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(params): Path<std::collections::HashMap<String, String>>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    leaderless(&app, &params)
}

/// [`without_leaders`] over every vhost, every queue name.
async fn without_leaders_anywhere(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    leaderless(&app, &Default::default())
}

/// The quorum queues without a leader, of vhost `v` and names matching `pattern` when
/// `params` give them.
fn leaderless(app: &App, params: &std::collections::HashMap<String, String>) -> Reply {
    let pattern = params.get("pattern").map(String::as_str).unwrap_or(".*");
    let re = regex::Regex::new(pattern)
        .map_err(|e| ApiError::bad_request(format!("invalid pattern {pattern}: {e}")))?;
    let vhost = params.get("v").map(String::as_str);
    if vhost.is_some_and(|v| !app.backend.vhosts().iter().any(|x| x == v)) {
        return Err(ApiError::not_found());
    }
    let leaderless: Vec<Value> = app
        .backend
        .queues(vhost)
        .iter()
        .filter(|q| q.replicas.as_ref().is_some_and(|r| r.leader.is_none()))
        .filter(|q| re.is_match(&q.name))
        .map(listed_queue)
        .collect();
    if leaderless.is_empty() {
        return ok(json!({}));
    }
    failed(
        "Detected quorum queues without an elected leader",
        json!({"queues": leaderless}),
    )
}

async fn initialized_with_data(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    if app.backend.vhosts().is_empty() {
        return failed(
            "Metadata store has not yet been initialized: it reports to have no virtual hosts",
            json!({}),
        );
    }
    ok(json!({}))
}

async fn alarms(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    alarms_reply(&app, "There are alarms in effect in the cluster")
}

async fn local_alarms(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    alarms_reply(&app, "There are alarms in effect on the node")
}

/// The alarm checks' reply: 200 without alarms, else 503 with `reason` and the alarms in
/// effect (this node is the whole cluster).
fn alarms_reply(app: &App, reason: &str) -> Reply {
    let n = app.backend.node();
    let mut alarms = Vec::new();
    if n.memory_alarm() {
        alarms.push(json!({"node": app.node, "resource": "memory"}));
    }
    if n.disk_alarm() {
        alarms.push(json!({"node": app.node, "resource": "disk"}));
    }
    if alarms.is_empty() {
        ok(json!({}))
    } else {
        failed(reason, json!({"alarms": alarms}))
    }
}

async fn port_listener(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(port): Path<String>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    let port: u16 = port
        .parse()
        .map_err(|_| ApiError::bad_request("Invalid port"))?;
    let ports: Vec<u16> = app
        .backend
        .node()
        .listeners()
        .iter()
        .map(|(_, a)| a.port())
        .collect();
    if ports.contains(&port) {
        ok(json!({"port": port}))
    } else {
        failed(
            "No active listener",
            json!({"missing": port, "ports": ports}),
        )
    }
}

/// RabbitMQ's other names of a protocol (rabbit_mgmt_wm_health_check_protocol_listener's
/// `normalize_protocol`), for those Warren has.
fn normalize_protocol(p: &str) -> String {
    let p = p.to_ascii_lowercase();
    match p.as_str() {
        "amqp091" | "amqp0.9.1" | "amqp0-9-1" | "amqp0_9_1" | "amqp10" | "amqp1.0" | "amqp1-0"
        | "amqp1_0" => "amqp".into(),
        "amqps" => "amqp/ssl".into(),
        "http1" | "http1.1" | "http_api" | "management" | "management_ui" | "ui" => "http".into(),
        _ => p,
    }
}

async fn protocol_listener(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(protocol): Path<String>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    let protocol = normalize_protocol(&protocol);
    let protocols: Vec<String> = app
        .backend
        .node()
        .listeners()
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    if protocols.contains(&protocol) {
        ok(json!({"protocol": protocol}))
    } else {
        failed(
            "No active listener",
            json!({"missing": protocol, "protocols": protocols}),
        )
    }
}

/// The node's client connections against its limit: `Err` with the count at or above it.
fn connection_room(app: &App) -> Result<(), usize> {
    let n = app.backend.node();
    let open = n.connection_count();
    match n.connection_limit() {
        Some(limit) if open >= limit => Err(open),
        _ => Ok(()),
    }
}

async fn below_connection_limit(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    match connection_room(&app) {
        Ok(()) => ok(json!({})),
        Err(_) => failed("node connection limit is reached", json!({})),
    }
}

async fn ready_to_serve_clients(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    let amqp = app
        .backend
        .node()
        .listeners()
        .iter()
        .any(|(p, _)| p == "amqp" || p == "amqp/ssl");
    if !amqp {
        return failed("no active listeners for AMQP/AMQPS", json!({}));
    }
    match connection_room(&app) {
        Ok(()) => ok(json!({})),
        Err(open) => failed(
            "node connection limit is reached",
            json!({"connections": open}),
        ),
    }
}

/// Seconds in one `unit` of `certificate-expiration/{within}/{unit}` (RabbitMQ's: a month
/// is a twelfth of 365 days).
fn unit_seconds(unit: &str) -> Option<f64> {
    const DAY: f64 = 86_400.0;
    Some(match unit.to_lowercase().as_str() {
        "days" => DAY,
        "weeks" => DAY * 7.0,
        "months" => DAY * 365.0 / 12.0,
        "years" => DAY * 365.0,
        _ => return None,
    })
}

/// `seconds` since the Unix epoch as RabbitMQ prints a date in this check:
/// `YYYY-MM-DD H:MM:SS`, UTC, the hour not padded.
fn format_utc(seconds: i64) -> String {
    let days = seconds.div_euclid(86_400);
    let secs = seconds.rem_euclid(86_400);
    // Howard Hinnant's days-to-civil.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y}-{m:02}-{d:02} {}:{:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}

/// The certificates of `file` that end before `deadline` as RabbitMQ lists them, or the
/// file's error.
fn expiring(file: &Result<Vec<i64>, String>, deadline: i64) -> Value {
    match file {
        Err(e) => json!({"error": e}),
        Ok(ends) => Value::Array(
            ends.iter()
                .filter(|end| **end < deadline)
                .map(|end| Value::from(format_utc(*end)))
                .collect(),
        ),
    }
}

fn listener_expiring(app: &App, l: &ListenerCertificates, deadline: i64) -> Option<Value> {
    let cert = expiring(&l.cert_expiries, deadline);
    let ca = expiring(&l.ca_expiries, deadline);
    let empty = |v: &Value| v.as_array().is_some_and(Vec::is_empty);
    if empty(&cert) && empty(&ca) {
        return None;
    }
    Some(json!({
        "node": app.node,
        "protocol": l.protocol,
        "interface": l.addr.ip().to_string(),
        "port": l.addr.port(),
        "certfile": l.cert_file,
        "cacertfile": l.ca_file,
        "certfile_expires_on": cert,
        "cacertfile_expires_on": ca,
    }))
}

/// `certificate-expiration/{within}/{unit}`: fails when a certificate of a TLS listener
/// (its chain or its CA bundle) ends within `within` `unit`s (days, weeks, months, years).
async fn certificate_expiration(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((within, unit)): Path<(String, String)>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    let within: i64 = within
        .parse()
        .map_err(|_| ApiError::bad_request("Invalid expiration value."))?;
    let unit = unit_seconds(&unit).ok_or_else(|| {
        ApiError::bad_request(
            "Time unit not recognised. Supported units: days, weeks, months, years.",
        )
    })?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let deadline = now.saturating_add((within as f64 * unit) as i64);
    let expiring: Vec<Value> = app
        .backend
        .node()
        .tls_certificates()
        .iter()
        .filter_map(|l| listener_expiring(&app, l, deadline))
        .collect();
    if expiring.is_empty() {
        ok(json!({}))
    } else {
        failed("Certificates expiring", json!({"expired": expiring}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_units_as_rabbitmq_prints_and_reads_them() {
        assert_eq!(format_utc(0), "1970-01-01 0:00:00");
        assert_eq!(format_utc(951_782_400 + 3_723), "2000-02-29 1:02:03");
        assert_eq!(format_utc(4_102_444_799), "2099-12-31 23:59:59");
        assert_eq!(unit_seconds("Weeks"), Some(604_800.0));
        assert_eq!(unit_seconds("months"), Some(2_628_000.0));
        assert_eq!(unit_seconds("fortnights"), None);
        assert_eq!(normalize_protocol("AMQP0-9-1"), "amqp");
        assert_eq!(normalize_protocol("amqps"), "amqp/ssl");
        assert_eq!(normalize_protocol("http"), "http");
    }
}
