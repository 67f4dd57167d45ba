//! The HTTP floor for bench/httpmq.sh: the same HTTP stack as Warren's httpmq listener
//! (hyper's HTTP/1.1 server on tokio's multi-threaded runtime, a service function per
//! connection, title-case headers, TCP_NODELAY, keep-alive), with a handler that reads the
//! request body and answers `HTTPMQ_PUT_OK` without doing any queue work. Its request rate
//! under a load tool is the most the httpmq API could reach on the same machine with this
//! stack, whatever the broker does.
//!
//! Usage: `cargo run --release -p warren-httpmq --example http_floor -- 127.0.0.1:11299`

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::http::{header, HeaderValue};

type Response = hyper::Response<Full<Bytes>>;

async fn put(req: hyper::Request<hyper::body::Incoming>) -> Response {
    let data = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut r = Response::new(Full::new(Bytes::from_static(b"HTTPMQ_PUT_OK")));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r.headers_mut().insert("pos", HeaderValue::from(data.len()));
    r
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:11299".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    let mut http = hyper::server::conn::http1::Builder::new();
    http.title_case_headers(true);
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let service = hyper::service::service_fn(|req| async {
            Ok::<_, std::convert::Infallible>(put(req).await)
        });
        let connection = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), service);
        tokio::spawn(connection);
    }
}
