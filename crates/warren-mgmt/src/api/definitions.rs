//! `/api/definitions` and `/api/definitions/{vhost}` (RabbitMQ's `rabbit_mgmt_wm_definitions`):
//! export (`GET`) and import (`POST`) of definitions files, administrator only.
//!
//! An import takes the file as the body (`application/json`, as `rabbitmqadmin import` and
//! curl send it) or as the `file` field of a `multipart/form-data` form (the web UI's upload).
//! The file is parsed and checked whole before anything is applied (400 with the reason
//! otherwise), then applied through the broker's operations layer; success is 204 No Content,
//! as in RabbitMQ. Importing the same file twice changes nothing.

use super::{authorize, ok_json, Need, Peer, Reply, RABBITMQ_VERSION, S};
use crate::error::ApiError;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use std::sync::Arc;

/// The routes, to merge into the API's router.
pub(super) fn routes() -> Router<Arc<super::App>> {
    Router::new()
        .route("/api/definitions", get(export_all).post(import_all))
        .route("/api/definitions/{v}", get(export_vhost).post(import_vhost))
}

async fn export_all(State(app): S, ConnectInfo(peer): Peer, headers: HeaderMap) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    ok_json(app.backend.definitions(RABBITMQ_VERSION))
}

async fn export_vhost(
    State(app): S,
    ConnectInfo(peer): Peer,
    headers: HeaderMap,
    Path(v): Path<String>,
) -> Reply {
    authorize(&app, &headers, peer, Need::Admin, None)?;
    match app.backend.vhost_definitions(&v, RABBITMQ_VERSION) {
        Some(defs) => ok_json(defs),
        None => Err(ApiError::not_found()),
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
        return Err(ApiError::not_found());
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

/// The definitions file of an import request: the body itself, or the `file` field of a
/// `multipart/form-data` body.
///
/// Errors: 400 for a multipart body without a boundary or a `file` field, or an empty body.
fn definitions_file(headers: &HeaderMap, body: Bytes) -> Result<Bytes, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let file = if content_type
        .to_ascii_lowercase()
        .starts_with("multipart/form-data")
    {
        let boundary = boundary(content_type)
            .ok_or_else(|| ApiError::bad_request("multipart body without a boundary"))?;
        multipart_field(&body, boundary.as_bytes(), "file")
            .map(|f| body.slice_ref(f))
            .ok_or_else(|| ApiError::bad_request("multipart body without a 'file' field"))?
    } else {
        body
    };
    if file.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("no definitions in the request body"));
    }
    Ok(file)
}

/// The `boundary` parameter of a `multipart/form-data` content type (RFC 7578), unquoted.
fn boundary(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|param| {
        let (k, v) = param.split_once('=')?;
        if !k.trim().eq_ignore_ascii_case("boundary") {
            return None;
        }
        let v = v.trim().trim_matches('"');
        (!v.is_empty()).then(|| v.to_string())
    })
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|i| i + from)
}

/// The content of the part named `name` of a multipart body delimited by `boundary`
/// (RFC 2046 §5.1: parts start after `--boundary` CRLF, headers end at an empty line, and
/// the content ends at CRLF `--boundary`).
fn multipart_field<'a>(body: &'a [u8], boundary: &[u8], name: &str) -> Option<&'a [u8]> {
    let delimiter = [b"--", boundary].concat();
    let next_delimiter = [b"\r\n--", boundary].concat();
    let wanted = format!("name=\"{name}\"");
    let mut at = find(body, &delimiter, 0)? + delimiter.len();
    loop {
        // After a delimiter: "--" closes the body, else CRLF and the part's headers.
        if body.get(at..at + 2) == Some(b"--") {
            return None;
        }
        let headers_start = find(body, b"\r\n", at)? + 2;
        let headers_end = find(body, b"\r\n\r\n", headers_start - 2)?;
        let content_start = headers_end + 4;
        let content_end = find(body, &next_delimiter, content_start)?;
        let part_headers = String::from_utf8_lossy(&body[headers_start..headers_end]);
        let is_wanted = part_headers.lines().any(|line| {
            line.to_ascii_lowercase()
                .starts_with("content-disposition:")
                && line.split(';').any(|p| p.trim() == wanted)
        });
        if is_wanted {
            return Some(&body[content_start..content_end]);
        }
        at = content_end + next_delimiter.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipart_file_field() {
        let body = b"--XyZ\r\nContent-Disposition: form-data; name=\"redirect\"\r\n\r\n../\r\n\
            --XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"d.json\"\r\n\
            Content-Type: application/json\r\n\r\n{\"users\": []}\r\n--XyZ--\r\n";
        assert_eq!(
            multipart_field(body, b"XyZ", "file"),
            Some(&b"{\"users\": []}"[..])
        );
        assert_eq!(multipart_field(body, b"XyZ", "other"), None);
        assert_eq!(
            boundary("multipart/form-data; boundary=\"XyZ\"").as_deref(),
            Some("XyZ")
        );
        assert_eq!(boundary("multipart/form-data"), None);
    }
}
