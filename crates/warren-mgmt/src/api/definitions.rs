//! `/api/definitions` and `/api/definitions/{vhost}` (RabbitMQ's `rabbit_mgmt_wm_definitions`):
//! export (`GET`) and import (`POST`) of definitions files, administrator only.
//!
//! An import takes the file as the body (`application/json`, as `rabbitmqadmin import` and
//! curl send it) or as the `file` part of a `multipart/form-data` upload (a browser form).
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
    let upload = definitions_file(&headers, body).await?;
    let backend = app.backend.clone();
    let file = upload.file;
    blocking(move || backend.import_definitions(&user, &file, None)).await?;
    Ok(imported(upload.redirect))
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
    let upload = definitions_file(&headers, body).await?;
    let backend = app.backend.clone();
    let file = upload.file;
    blocking(move || backend.import_definitions(&user, &file, Some(&v))).await?;
    Ok(imported(upload.redirect))
}

/// The reply to an import: 204, or with a form's `redirect` field 303 See Other to it (as
/// RabbitMQ's cowboy_rest answers a POST that names where to go).
fn imported(redirect: Option<String>) -> axum::response::Response {
    match redirect.and_then(|r| HeaderValue::from_str(&r).ok()) {
        Some(location) => {
            let mut r = StatusCode::SEE_OTHER.into_response();
            r.headers_mut().insert(header::LOCATION, location);
            r
        }
        None => StatusCode::NO_CONTENT.into_response(),
    }
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

/// An import request's definitions file, and where a form upload asks to be sent after.
struct Upload {
    file: Bytes,
    redirect: Option<String>,
}

/// The definitions file of an import request: the body itself (`application/json`, as
/// `rabbitmqadmin import` and curl send it), or, in a `multipart/form-data` upload (a
/// browser form, `curl -F file=@defs.json`), the part named `file`, with the optional
/// `redirect` part, as rabbit_mgmt_wm_definitions' `accept_multipart`.
///
/// Errors: 400 for an empty file, a form without a `file` part, or a malformed form.
async fn definitions_file(headers: &HeaderMap, body: Bytes) -> Result<Upload, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut upload = Upload {
        file: body,
        redirect: None,
    };
    if content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        upload = form_upload(headers, upload.file).await?;
    }
    if upload.file.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("no definitions in the request body"));
    }
    Ok(upload)
}

async fn form_upload(headers: &HeaderMap, body: Bytes) -> Result<Upload, ApiError> {
    use axum::extract::{FromRequest, Multipart};
    let malformed = |e: &dyn std::fmt::Display| {
        ApiError::bad_request(format!("malformed multipart/form-data upload: {e}"))
    };
    let mut request = axum::http::Request::new(axum::body::Body::from(body));
    *request.headers_mut() = headers.clone();
    let mut form = Multipart::from_request(request, &())
        .await
        .map_err(|e| malformed(&e.body_text()))?;
    let (mut file, mut redirect) = (None, None);
    while let Some(field) = form.next_field().await.map_err(|e| malformed(&e))? {
        match field.name() {
            Some("file") => file = Some(field.bytes().await.map_err(|e| malformed(&e))?),
            Some("redirect") => redirect = Some(field.text().await.map_err(|e| malformed(&e))?),
            _ => {}
        }
    }
    let file = file.ok_or_else(|| {
        ApiError::bad_request("no part named file in the multipart/form-data upload")
    })?;
    Ok(Upload { file, redirect })
}
