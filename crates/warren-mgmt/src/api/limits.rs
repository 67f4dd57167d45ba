//! `/api/vhost-limits[/{vhost}[/{name}]]` and `/api/user-limits[/{user}[/{name}]]`
//! (rabbit_mgmt_wm_limit(s), rabbit_mgmt_wm_user_limit(s)): the limits of vhosts
//! (`max-connections`, `max-queues`) and of users (`max-connections`, `max-channels`), one
//! limit at a time. Lists are open to any management user (vhost limits of the vhosts the
//! user may see, user limits of every user, as RabbitMQ shows them); PUT `{"value": n}` and
//! DELETE of one limit need `administrator` and answer 204. A negative value is no limit,
//! as in RabbitMQ.
//!
//! The same vhost limits are the `vhost-limits` runtime parameter `limits`
//! ([`super::parameters`]).

use super::{
    authorize, body_json, listed, require_keys, visible_vhosts, App, Need, Peer, Reply, Q, S,
};
use crate::admin::blocking;
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, put};
use axum::Router;
use serde_json::{json, Map, Value};
use std::sync::Arc;
use warren_broker::access::{UserLimits, VhostLimits};

/// The routes, to merge into the API's router.
pub(super) fn routes() -> Router<Arc<App>> {
    Router::new()
        .route("/api/vhost-limits", get(vhost_limits_all))
        .route("/api/vhost-limits/{v}", get(vhost_limits_one))
        .route(
            "/api/vhost-limits/{v}/{name}",
            put(vhost_limit_put).delete(vhost_limit_delete),
        )
        .route("/api/user-limits", get(user_limits_all))
        .route("/api/user-limits/{u}", get(user_limits_one))
        .route(
            "/api/user-limits/{u}/{name}",
            put(user_limit_put).delete(user_limit_delete),
        )
}

fn vhost_limits_object(l: &VhostLimits) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(n) = l.max_connections {
        m.insert("max-connections".into(), Value::from(n));
    }
    if let Some(n) = l.max_queues {
        m.insert("max-queues".into(), Value::from(n));
    }
    m
}

fn user_limits_object(l: &UserLimits) -> Map<String, Value> {
    let mut m = Map::new();
    if let Some(n) = l.max_connections {
        m.insert("max-connections".into(), Value::from(n));
    }
    if let Some(n) = l.max_channels {
        m.insert("max-channels".into(), Value::from(n));
    }
    m
}

/// `{"vhost": v, "value": {...}}` for a vhost with limits.
fn vhost_entry(app: &App, v: &str) -> Option<Value> {
    let limits = app.backend.vhost_record(v)?.limits;
    let value = vhost_limits_object(&limits);
    (!value.is_empty()).then(|| json!({"vhost": v, "value": value}))
}

/// `{"user": u, "value": {...}}` for a user with limits.
fn user_entry(app: &App, u: &str) -> Option<Value> {
    let value = user_limits_object(&app.backend.user_limits(u)?);
    (!value.is_empty()).then(|| json!({"user": u, "value": value}))
}

async fn vhost_limits_all(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    let items = visible_vhosts(&app, &user)
        .iter()
        .filter_map(|v| vhost_entry(&app, v))
        .collect();
    listed(items, &q)
}

/// rabbit_mgmt_util's `is_authorized_vhost_visible`: administrators and monitors see any
/// vhost, others those they may use (401 otherwise).
async fn vhost_limits_one(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    q: Q,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Management, None)?;
    super::require_visible_vhost(&app, &user, &v)?;
    listed(vhost_entry(&app, &v).into_iter().collect(), &q)
}

/// RabbitMQ's 404 for a vhost or user named in a limit's path that does not exist.
fn missing(what: &str) -> ApiError {
    ApiError {
        error: "not_found",
        reason: what.into(),
        ..ApiError::not_found()
    }
}

/// The `value` of a limit PUT: `[{key_missing,value}]` without one.
fn limit_value(body: &Bytes) -> Result<Value, ApiError> {
    let m = body_json(body)?;
    require_keys(&m, &["value"])?;
    Ok(m["value"].clone())
}

async fn vhost_limit_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let record = app
        .backend
        .vhost_record(&v)
        .ok_or_else(|| missing("vhost_not_found"))?;
    let value = limit_value(&body)?;
    // The new limit merged into the others, validated as the `vhost-limits` parameter.
    let mut all = vhost_limits_object(&record.limits);
    all.insert(name, value);
    let limits = super::parameters::vhost_limits("limits", &Value::Object(all))?;
    blocking(move || app.backend.set_vhost_limits(&user, &v, limits).map(|_| ())).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn vhost_limit_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, name)): Path<(String, String)>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let record = app
        .backend
        .vhost_record(&v)
        .ok_or_else(|| missing("vhost_not_found"))?;
    let mut limits = record.limits;
    match name.as_str() {
        "max-connections" => limits.max_connections = None,
        "max-queues" => limits.max_queues = None,
        _ => {}
    }
    if limits != record.limits {
        blocking(move || {
            if limits == VhostLimits::default() {
                app.backend.clear_vhost_limits(&user, &v)
            } else {
                app.backend.set_vhost_limits(&user, &v, limits).map(|_| ())
            }
        })
        .await?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn user_limits_all(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    let items = app
        .backend
        .users()
        .iter()
        .filter_map(|u| user_entry(&app, &u.name))
        .collect();
    listed(items, &q)
}

async fn user_limits_one(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(u): Path<String>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    if app.backend.user_limits(&u).is_none() {
        return Err(ApiError::not_found());
    }
    listed(user_entry(&app, &u).into_iter().collect(), &q)
}

/// Validates one user limit as rabbit_auth_backend_internal (`max-connections` and
/// `max-channels`, integers; a negative one is no limit).
fn set_user_limit(limits: &mut UserLimits, name: &str, value: &Value) -> Result<(), ApiError> {
    let slot = match name {
        "max-connections" => &mut limits.max_connections,
        "max-channels" => &mut limits.max_channels,
        _ => {
            return Err(ApiError::bad_request(format!(
                "Unrecognised terms [{{<<\"{name}\">>,{value}}}] in user-limits"
            )))
        }
    };
    let n = value.as_i64().ok_or_else(|| {
        let shown = match value {
            Value::String(s) => format!("<<\"{s}\">>"),
            other => other.to_string(),
        };
        ApiError::bad_request(format!("{name} should be a number, actually was {shown}"))
    })?;
    *slot = u64::try_from(n).ok();
    Ok(())
}

async fn user_limit_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((u, name)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let mut limits = app
        .backend
        .user_limits(&u)
        .ok_or_else(|| missing("user_not_found"))?;
    let value = limit_value(&body)?;
    set_user_limit(&mut limits, &name, &value)?;
    blocking(move || app.backend.set_user_limits(&user, &u, limits)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn user_limit_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((u, name)): Path<(String, String)>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let mut limits = app
        .backend
        .user_limits(&u)
        .ok_or_else(|| missing("user_not_found"))?;
    match name.as_str() {
        "max-connections" => limits.max_connections = None,
        "max-channels" => limits.max_channels = None,
        _ => {}
    }
    blocking(move || app.backend.set_user_limits(&user, &u, limits)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
