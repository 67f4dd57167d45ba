//! Writes to vhosts, users, permissions and topic permissions (administrator only, as in
//! RabbitMQ): `PUT`/`DELETE /api/vhosts/{v}`, `/api/users/{u}`, `/api/permissions/{v}/{u}`,
//! `/api/topic-permissions/{v}/{u}`, with RabbitMQ's bodies and status codes (201 created,
//! 204 updated or deleted, 404 unknown, 400 bad body).
//!
//! They go through the broker's operations layer (`warren_broker::ops::Admin`), which
//! authorizes, applies and stores each change before it is answered; storing is an fsync,
//! so the calls run on a blocking thread.

use crate::api::{authorize, body_json, ok_json, App, Need, Peer, Reply, S};
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use warren_broker::access::user::{parse_tag_list, parse_tags};
use warren_broker::access::{HashingAlgorithm, PasswordHash};

/// Runs a blocking backend write off the async runtime's threads.
pub(crate) async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> Result<R, ApiError> + Send + 'static,
) -> Result<R, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
}

fn created_or_updated(created: bool) -> Response {
    if created {
        StatusCode::CREATED.into_response()
    } else {
        StatusCode::NO_CONTENT.into_response()
    }
}

fn text_field(m: &Map<String, Value>, key: &str) -> Result<Option<String>, ApiError> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ApiError::bad_request(format!(
            "{key} must be a string, not {other}"
        ))),
    }
}

/// Tags as RabbitMQ's API takes them: a comma-separated string or a list of strings.
fn tags_field(m: &Map<String, Value>) -> Result<Option<Vec<String>>, ApiError> {
    match m.get("tags") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(
            s.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(str::to_string)
                .collect(),
        )),
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::bad_request("tags must be strings"))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(_) => Err(ApiError::bad_request("tags must be a string or a list")),
    }
}

pub(crate) async fn vhost_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let m = body_json(&body)?;
    let description = text_field(&m, "description")?;
    let tags = tags_field(&m)?;
    let queue_type = text_field(&m, "default_queue_type")?;
    let backend = app.backend.clone();
    let created =
        blocking(move || backend.put_vhost(&user, &v, description, tags, queue_type)).await?;
    Ok(created_or_updated(created))
}

pub(crate) async fn vhost_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let backend = app.backend.clone();
    blocking(move || backend.delete_vhost(&user, &v)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// The credential of a user PUT: `password` (hashed here with `hashing_algorithm`, default
/// SHA-256) or `password_hash` (base64, as exported), not both; neither leaves the user
/// without a password (it cannot log in with one), as RabbitMQ allows.
fn credential(m: &Map<String, Value>) -> Result<PasswordHash, ApiError> {
    let algorithm = match text_field(m, "hashing_algorithm")? {
        None => HashingAlgorithm::default(),
        Some(name) => HashingAlgorithm::from_module_name(&name)
            .ok_or_else(|| ApiError::bad_request(format!("unknown hashing_algorithm '{name}'")))?,
    };
    match (text_field(m, "password")?, text_field(m, "password_hash")?) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "set password or password_hash, not both",
        )),
        (Some(p), None) => Ok(PasswordHash::from_password(algorithm, &p)),
        (None, Some(h)) if h.is_empty() => Ok(PasswordHash::none()),
        (None, Some(h)) => PasswordHash::from_base64(algorithm, &h)
            .map_err(|e| ApiError::bad_request(format!("password_hash is not base64: {e}"))),
        (None, None) => Ok(PasswordHash::none()),
    }
}

pub(crate) async fn user_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let m = body_json(&body)?;
    let password = credential(&m)?;
    let tags = match tags_field(&m)? {
        Some(t) => parse_tags(t.iter().map(String::as_str)),
        None => parse_tag_list(""),
    }
    .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let backend = app.backend.clone();
    let created = blocking(move || backend.put_user(&user, &name, password, tags)).await?;
    Ok(created_or_updated(created))
}

pub(crate) async fn user_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let backend = app.backend.clone();
    blocking(move || backend.delete_user(&user, &name)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

pub(crate) async fn permission_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, u)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let m = body_json(&body)?;
    let field = |k: &str| -> Result<String, ApiError> {
        text_field(&m, k)?.ok_or_else(|| ApiError::bad_request(format!("{k} is missing")))
    };
    let (configure, write, read) = (field("configure")?, field("write")?, field("read")?);
    let backend = app.backend.clone();
    let created =
        blocking(move || backend.set_permissions(&user, &v, &u, &configure, &write, &read)).await?;
    Ok(created_or_updated(created))
}

pub(crate) async fn permission_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, u)): Path<(String, String)>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let backend = app.backend.clone();
    blocking(move || backend.clear_permissions(&user, &v, &u)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn topic_items(app: &App) -> Vec<Value> {
    app.backend
        .topic_permissions()
        .into_iter()
        .map(|(user, vhost, exchange, write, read)| {
            json!({"user": user, "vhost": vhost, "exchange": exchange, "write": write, "read": read})
        })
        .collect()
}

pub(crate) async fn topic_permissions(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    ok_json(Value::Array(topic_items(&app)))
}

pub(crate) async fn topic_permission_get(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, u)): Path<(String, String)>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    let items: Vec<Value> = topic_items(&app)
        .into_iter()
        .filter(|p| p["vhost"] == v.as_str() && p["user"] == u.as_str())
        .collect();
    if items.is_empty() {
        return Err(ApiError::not_found());
    }
    ok_json(Value::Array(items))
}

pub(crate) async fn topic_permission_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, u)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let m = body_json(&body)?;
    let field = |k: &str| -> Result<String, ApiError> {
        text_field(&m, k)?.ok_or_else(|| ApiError::bad_request(format!("{k} is missing")))
    };
    let (exchange, write, read) = (field("exchange")?, field("write")?, field("read")?);
    let backend = app.backend.clone();
    blocking(move || backend.set_topic_permissions(&user, &v, &u, &exchange, &write, &read))
        .await?;
    Ok(StatusCode::CREATED.into_response())
}

pub(crate) async fn topic_permission_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, u)): Path<(String, String)>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let backend = app.backend.clone();
    blocking(move || backend.clear_topic_permissions(&user, &v, &u, None)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
