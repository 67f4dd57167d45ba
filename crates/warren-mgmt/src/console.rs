//! The web management console: one HTML page at `/` and its static assets (ES modules,
//! CSS, the vendored uPlot chart library) under `/console/...`, all compiled into the
//! binary so that the console works without any network beyond the broker.
//!
//! As with RabbitMQ's management plugin, the page and its assets are public; every piece of
//! data the page shows comes from the `/api` endpoints, which the page calls with HTTP basic
//! auth (the credentials typed into its login form, kept in the tab's `sessionStorage`).
//! No route here reads broker state.
//!
//! Every response carries `X-Content-Type-Options: nosniff`, a `Content-Security-Policy`
//! that allows scripts, styles and connections to this origin only (no inline script, no
//! `eval`, no framing: [`CONTENT_SECURITY_POLICY`]), `X-Frame-Options: DENY` and
//! `Referrer-Policy: same-origin`. Caching: `Cache-Control: no-cache` with a strong `ETag`
//! per asset, so a browser revalidates (answered `304 Not Modified` while the binary is the
//! same) and never runs a stale module after an upgrade.

use crate::error::ApiError;
use axum::extract::Path;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use std::sync::{Arc, OnceLock};

/// The `Content-Security-Policy` of the console's responses: same-origin scripts (module
/// files only, nothing inline), styles and `fetch` targets; `data:` images (none are used
/// today); no plugins, frames, form posts or base-URL changes.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
     form-action 'none'; frame-ancestors 'none'; base-uri 'none'";

/// One file of the console, served at `/console/<path>` (`index.html` also at `/`).
pub struct Asset {
    /// Path under `/console/`, e.g. `js/main.js`.
    pub path: &'static str,
    /// Its `Content-Type`.
    pub content_type: &'static str,
    /// Its bytes, from `crates/warren-mgmt/assets/console/<path>`.
    pub body: &'static [u8],
}

macro_rules! asset {
    ($path:literal, $ty:expr) => {
        Asset {
            path: $path,
            content_type: $ty,
            body: include_bytes!(concat!("../assets/console/", $path)),
        }
    };
}

const HTML: &str = "text/html; charset=utf-8";
const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// Every file the console serves.
pub const ASSETS: &[Asset] = &[
    asset!("index.html", HTML),
    asset!("console.css", CSS),
    asset!("js/main.js", JS),
    asset!("js/api.js", JS),
    asset!("js/dom.js", JS),
    asset!("js/rates.js", JS),
    asset!("js/pages/overview.js", JS),
    asset!("js/pages/queues.js", JS),
    asset!("js/pages/exchanges.js", JS),
    asset!("js/pages/connections.js", JS),
    asset!("js/pages/admin.js", JS),
    asset!("js/pages/definitions.js", JS),
    asset!("vendor/uPlot.iife.min.js", JS),
    asset!("vendor/uPlot.min.css", CSS),
    asset!("vendor/uPlot.LICENSE", TEXT),
];

/// The strong ETag of each asset (a hash of its bytes, computed once).
fn etags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        ASSETS
            .iter()
            .map(|a| {
                use std::hash::{Hash, Hasher};
                // DefaultHasher::new() has fixed keys: the same bytes give the same tag.
                let mut h = std::collections::hash_map::DefaultHasher::new();
                a.body.hash(&mut h);
                format!("\"{:016x}\"", h.finish())
            })
            .collect()
    })
}

/// The console's routes: `GET /` (the page) and `GET /console/{*path}` (its assets).
pub(crate) fn routes() -> Router<Arc<crate::api::App>> {
    Router::new()
        .route(
            "/",
            get(|h: HeaderMap| async move { serve("index.html", &h) }),
        )
        .route(
            "/console/{*path}",
            get(|Path(p): Path<String>, h: HeaderMap| async move { serve(&p, &h) }),
        )
}

/// The asset at `path` with the console's headers; `304` when `If-None-Match` names its
/// ETag; RabbitMQ's 404 body when there is no such asset.
fn serve(path: &str, headers: &HeaderMap) -> Response {
    let Some(i) = ASSETS.iter().position(|a| a.path == path) else {
        return ApiError::not_found().into_response();
    };
    let asset = &ASSETS[i];
    let etag = &etags()[i];
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag || t.trim() == "*"));
    let mut r = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = asset.body.into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(asset.content_type),
        );
        r
    };
    let h = r.headers_mut();
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every page file in the assets directory is served (a module left out of [`ASSETS`]
    /// would fail to load in the browser), and every asset is there.
    #[test]
    fn assets_table_matches_the_directory() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("assets/console");
        let mut found = Vec::new();
        let mut dirs = vec![root.clone()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if matches!(
                    p.extension().and_then(|x| x.to_str()),
                    Some("js" | "css" | "html")
                ) {
                    found.push(p.strip_prefix(&root).unwrap().to_str().unwrap().to_string());
                }
            }
        }
        for f in &found {
            assert!(ASSETS.iter().any(|a| a.path == f), "{f} is not in ASSETS");
        }
        for a in ASSETS {
            assert!(!a.body.is_empty(), "{} is empty", a.path);
        }
    }

    #[test]
    fn etag_revalidates() {
        let tag = etags()[0].clone();
        let mut h = HeaderMap::new();
        h.insert(header::IF_NONE_MATCH, HeaderValue::from_str(&tag).unwrap());
        assert_eq!(serve("index.html", &h).status(), StatusCode::NOT_MODIFIED);
        let r = serve("index.html", &HeaderMap::new());
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()[header::ETAG], tag.as_str());
        assert_eq!(
            serve("nope.js", &HeaderMap::new()).status(),
            StatusCode::NOT_FOUND
        );
    }
}
