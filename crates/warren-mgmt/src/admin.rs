//! Writes to vhosts, users, permissions and topic permissions (administrator only, as in
//! RabbitMQ): `PUT`/`DELETE /api/vhosts/{v}`, `/api/users/{u}`, `/api/permissions/{v}/{u}`,
//! `/api/topic-permissions/{v}/{u}`, with RabbitMQ's bodies and status codes (201 created,
//! 204 updated or deleted, 404 unknown, 400 bad body).
//!
//! They go through the broker's operations layer (`warren_broker::ops::Admin`), which
//! authorizes, applies and stores each change before it is answered; storing is an fsync,
//! so the calls run on a blocking thread.

use crate::api::{
    authorize, body_json, listed, ok_json, require_keys, App, Need, Peer, Reply, Q, S,
};
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
    // `defaultqueuetype` is the name RabbitMQ 3.11 took at first, still read as a fallback.
    let queue_type = match text_field(&m, "default_queue_type")? {
        Some(t) => Some(t),
        None => text_field(&m, "defaultqueuetype")?,
    };
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

/// 400 `vhost_or_user_not_found` unless both exist: RabbitMQ's answer to a permission PUT
/// for a user or vhost that does not exist, given before the body is looked at.
fn user_and_vhost_exist(app: &App, vhost: &str, user: &str) -> Result<(), ApiError> {
    if app.backend.vhost_exists(vhost) && app.backend.users().iter().any(|u| u.name == user) {
        Ok(())
    } else {
        Err(ApiError::bad_request("vhost_or_user_not_found"))
    }
}

/// The string fields `keys` of a permission body: 400 `[{key_missing,...}]` for those
/// left out, 400 for one that is not a string.
fn string_fields<const N: usize>(
    m: &Map<String, Value>,
    keys: [&str; N],
) -> Result<[String; N], ApiError> {
    require_keys(m, &keys)?;
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for (slot, k) in out.iter_mut().zip(keys) {
        *slot = text_field(m, k)?.unwrap_or_default();
    }
    Ok(out)
}

pub(crate) async fn permission_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path((v, u)): Path<(String, String)>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    user_and_vhost_exist(&app, &v, &u)?;
    let m = body_json(&body)?;
    let [configure, write, read] = string_fields(&m, ["configure", "write", "read"])?;
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
    let mut items: Vec<Value> = app
        .backend
        .topic_permissions()
        .into_iter()
        .map(|(user, vhost, exchange, write, read)| {
            json!({"user": user, "vhost": vhost, "exchange": exchange, "write": write, "read": read})
        })
        .collect();
    // RabbitMQ's default order for permission lists: by vhost, then user.
    items.sort_by(|a, b| {
        (a["vhost"].as_str(), a["user"].as_str()).cmp(&(b["vhost"].as_str(), b["user"].as_str()))
    });
    items
}

pub(crate) async fn topic_permissions(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    listed(topic_items(&app), &q)
}

/// `GET /api/topic-permissions/{v}/{u}[/{exchange}]`: every topic permission of the user in
/// the vhost (the exchange in the path does not narrow it, as in RabbitMQ); 404 when there
/// are none.
pub(crate) async fn topic_permission_get(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(path): Path<Vec<String>>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    let (v, u) = (&path[0], &path[1]);
    let items: Vec<Value> = topic_items(&app)
        .into_iter()
        .filter(|p| p["vhost"] == v.as_str() && p["user"] == u.as_str())
        .collect();
    if items.is_empty() {
        return Err(ApiError::not_found());
    }
    ok_json(Value::Array(items))
}

/// `PUT /api/topic-permissions/{v}/{u}[/{exchange}]`: the body names the exchange.
pub(crate) async fn topic_permission_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(path): Path<Vec<String>>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let (v, u) = (path[0].clone(), path[1].clone());
    user_and_vhost_exist(&app, &v, &u)?;
    let m = body_json(&body)?;
    let [exchange, write, read] = string_fields(&m, ["exchange", "write", "read"])?;
    let backend = app.backend.clone();
    blocking(move || backend.set_topic_permissions(&user, &v, &u, &exchange, &write, &read))
        .await?;
    Ok(StatusCode::CREATED.into_response())
}

/// `DELETE /api/topic-permissions/{v}/{u}` clears the user's topic permissions in the
/// vhost, `.../{exchange}` those on one exchange.
pub(crate) async fn topic_permission_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(path): Path<Vec<String>>,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let (v, u) = (path[0].clone(), path[1].clone());
    let exchange = path.get(2).cloned();
    let backend = app.backend.clone();
    blocking(move || backend.clear_topic_permissions(&user, &v, &u, exchange.as_deref())).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /api/vhosts/{v}/permissions` and `/api/vhosts/{v}/topic-permissions`, `GET
/// /api/users/{u}/permissions` and `/api/users/{u}/topic-permissions`: the permissions of
/// one vhost or one user (administrators; 404 for a vhost or user that does not exist).
pub(crate) async fn scoped_permissions(
    app: &App,
    headers: &HeaderMap,
    peer: std::net::SocketAddr,
    scope: Scope<'_>,
    topic: bool,
    q: &std::collections::HashMap<String, String>,
) -> Reply {
    authorize(app, headers, peer, Need::Admin, None)?;
    let (key, name, exists) = match scope {
        Scope::Vhost(v) => ("vhost", v, app.backend.vhost_exists(v)),
        Scope::User(u) => ("user", u, app.backend.users().iter().any(|x| x.name == u)),
    };
    if !exists {
        return Err(ApiError::not_found());
    }
    let items = if topic {
        topic_items(app)
    } else {
        crate::api::permission_items(app)
    };
    listed(items.into_iter().filter(|p| p[key] == name).collect(), q)
}

/// Whose permissions [`scoped_permissions`] lists.
#[derive(Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// One vhost's.
    Vhost(&'a str),
    /// One user's.
    User(&'a str),
}

macro_rules! scoped {
    ($name:ident, $scope:ident, $topic:expr) => {
        pub(crate) async fn $name(
            State(app): S,
            ConnectInfo(peer): Peer,
            headers: HeaderMap,
            Path(name): Path<String>,
            q: Q,
        ) -> Reply {
            scoped_permissions(&app, &headers, peer, Scope::$scope(&name), $topic, &q).await
        }
    };
}

scoped!(vhost_permissions, Vhost, false);
scoped!(vhost_topic_permissions, Vhost, true);
scoped!(user_permissions, User, false);
scoped!(user_topic_permissions, User, true);

/// `GET /api/users/without-permissions`: the users with no permissions in any vhost.
pub(crate) async fn users_without_permissions(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    let with: std::collections::HashSet<String> = app
        .backend
        .permissions()
        .into_iter()
        .map(|(user, ..)| user)
        .collect();
    let items = app
        .backend
        .users()
        .iter()
        .filter(|u| !with.contains(&u.name))
        .map(crate::api::user_json)
        .collect();
    listed(items, &q)
}

/// `POST /api/users/bulk-delete` with `{"users": [names]}`: deletes each (names that do not
/// exist are passed over, as RabbitMQ does); 204.
pub(crate) async fn users_bulk_delete(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let m = body_json(&body)?;
    require_keys(&m, &["users"])?;
    let names: Vec<String> = match &m["users"] {
        Value::Array(a) => a
            .iter()
            .map(|n| {
                n.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::bad_request("users must be a list of names"))
            })
            .collect::<Result<_, _>>()?,
        _ => return Err(ApiError::bad_request("users must be a list of names")),
    };
    let backend = app.backend.clone();
    blocking(move || {
        for name in names {
            match backend.delete_user(&user, &name) {
                Ok(()) => {}
                Err(e) if e.status == StatusCode::NOT_FOUND => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    })
    .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /api/cluster-name`: `{"name": ...}` (the `cluster_name` global parameter, else
/// `warren`); any management user.
pub(crate) async fn cluster_name(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
) -> Reply {
    authorize(&app, &headers, peer, Need::Management, None)?;
    ok_json(json!({"name": crate::api::cluster_name(&app)}))
}

/// `PUT /api/cluster-name` with `{"name": ...}`: sets the `cluster_name` global parameter
/// (administrators); 204.
pub(crate) async fn cluster_name_put(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let m = body_json(&body)?;
    require_keys(&m, &["name"])?;
    let name = text_field(&m, "name")?.unwrap_or_default();
    let backend = app.backend.clone();
    blocking(move || backend.set_global_parameter(&user, "cluster_name", Value::from(name)))
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
