//! `/api/definitions` and `/api/definitions/{vhost}` (RabbitMQ's `rabbit_mgmt_wm_definitions`):
//! export (`GET`) and import (`POST`) of definitions files, administrator only.
//!
//! An import takes the file as the body (`application/json`, as `rabbitmqadmin import` and
//! curl send it); a `multipart/form-data` upload is refused with 415 (not supported yet).
//! The file is parsed and checked whole before anything is applied (400 with the reason
//! otherwise), then applied through the broker's operations layer; success is 204 No Content,
//! as in RabbitMQ. Importing the same file twice changes nothing.

use super::{authorize, ok_json, Need, Peer, Reply, Q, RABBITMQ_VERSION, S};
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::collections::HashMap;
use std::sync::Arc;

/// The routes, to merge into the API's router.
pub(super) fn routes() -> Router<Arc<super::App>> {
    Router::new()
        .route("/api/definitions", get(export_all).post(import_all))
        .route("/api/definitions/{v}", get(export_vhost).post(import_vhost))
}

/// The export as the reply, with `Content-Disposition: attachment; filename=<download>`
/// when the query has `download` (RabbitMQ's way to save it as a file).
fn export_reply(defs: serde_json::Value, q: &HashMap<String, String>) -> Reply {
    let mut r = ok_json(defs)?;
    if let Some(name) = q.get("download").filter(|n| !n.is_empty()) {
        if let Ok(v) = HeaderValue::from_str(&format!("attachment; filename={name}")) {
            r.headers_mut().insert(header::CONTENT_DISPOSITION, v);
        }
    }
    Ok(r)
}

async fn export_all(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap, q: Q) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    let cluster = super::cluster_name(&app);
    export_reply(app.backend.definitions(RABBITMQ_VERSION, &cluster), &q)
}

/// `GET /api/definitions/{vhost}`: 400 `vhost_not_found` for a vhost that does not exist,
/// as RabbitMQ answers.
async fn export_vhost(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    q: Q,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    match app.backend.vhost_definitions(&v, RABBITMQ_VERSION) {
        Some(defs) => export_reply(defs, &q),
        None => Err(ApiError::bad_request("vhost_not_found")),
    }
}

async fn import_all(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    let file = definitions_file(&headers, body)?;
    let backend = app.backend.clone();
    blocking(move || backend.import_definitions(&user, &file, None)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn import_vhost(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
    body: Bytes,
) -> Reply {
    let user = authorize(&app, &headers, peer, Need::Admin, None)?;
    if !app.backend.vhost_exists(&v) {
        // RabbitMQ's `not_found(vhost_not_found)`.
        return Err(ApiError {
            error: "not_found",
            reason: "vhost_not_found".into(),
            ..ApiError::not_found()
        });
    }
    let file = definitions_file(&headers, body)?;
    let backend = app.backend.clone();
    blocking(move || backend.import_definitions(&user, &file, Some(&v))).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Runs a blocking import (it stores the access-control database and waits for the
/// definitions writer) off the async runtime's threads.
async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> Result<R, ApiError> + Send + 'static,
) -> Result<R, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?
}

/// The definitions file of an import request: the body itself.
///
/// Errors: 415 for a `multipart/form-data` upload (not supported), 400 for an empty body.
fn definitions_file(headers: &HeaderMap, body: Bytes) -> Result<Bytes, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        return Err(ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            error: "unsupported_media_type",
            reason: "send the definitions file as the request body (application/json)".into(),
            challenge: false,
        });
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("no definitions in the request body"));
    }
    Ok(body)
}
