//! The HTTP floor for bench/httpmq.sh: the same HTTP stack as Warren's httpmq listener (axum
//! over hyper's HTTP/1.1 server on tokio's multi-threaded runtime, TCP_NODELAY, keep-alive),
//! with a handler that reads the request body and answers `HTTPMQ_PUT_OK` without doing any
//! queue work. Its request rate under a load tool is the most the httpmq API could reach on
//! the same machine with this stack, whatever the broker does.
//!
//! Usage: `cargo run --release -p warren-httpmq --example http_floor -- 127.0.0.1:11299`

use axum::body::{to_bytes, Body};
use axum::http::{header, Response};
use axum::serve::ListenerExt;
use axum::Router;

async fn put(body: Body) -> Response<Body> {
    let data = to_bytes(body, 16 << 20).await.unwrap_or_default();
    Response::builder()
        .header(header::CONTENT_TYPE, "text/plain")
        .header("Pos", data.len())
        .body(Body::from("HTTPMQ_PUT_OK"))
        .expect("a valid response")
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:11299".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    let app = Router::new().fallback(put);
    axum::serve(listener, app).await
}
