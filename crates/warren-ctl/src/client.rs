//! The HTTP side: one blocking call per request to the management API, with basic auth,
//! a timeout, and RabbitMQ's error bodies turned into [`CtlError::Server`].
//!
//! reqwest is asynchronous; a command makes a handful of calls one after the other, so a
//! current-thread tokio runtime owned by the [`Client`] drives each call to completion.

use crate::CtlError;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use reqwest::Method;
use serde_json::Value;
use std::time::Duration;

/// Everything but RFC 3986's unreserved characters is percent-encoded in a path segment, so
/// that the vhost `/` becomes `%2F` as the management API expects.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One path segment, percent-encoded (`/` -> `%2F`).
pub fn seg(s: &str) -> String {
    utf8_percent_encode(s, SEGMENT).to_string()
}

/// An exchange name in a path: the default exchange (`""`) is `amq.default`, as RabbitMQ's
/// management API names it.
pub fn exchange_seg(name: &str) -> String {
    if name.is_empty() {
        "amq.default".to_string()
    } else {
        seg(name)
    }
}

/// A management API client: base URL (`http://host:port`, no trailing slash) and credentials.
pub struct Client {
    base: String,
    username: String,
    password: String,
    http: reqwest::Client,
    runtime: tokio::runtime::Runtime,
}

impl Client {
    /// A client of the API at `base` (e.g. `http://localhost:15672`; a path prefix such as
    /// `http://host/rabbitmq` is kept), each request bounded by `timeout`.
    pub fn new(
        base: &str,
        username: &str,
        password: &str,
        timeout: Duration,
    ) -> Result<Client, CtlError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CtlError::Local(format!("cannot start the HTTP runtime: {e}")))?;
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .build()
            .map_err(|e| CtlError::Local(format!("cannot set up the HTTP client: {e}")))?;
        Ok(Client {
            base: base.trim_end_matches('/').to_string(),
            username: username.to_string(),
            password: password.to_string(),
            http,
            runtime,
        })
    }

    /// GET `path` (starting with `/api/`), the reply's JSON.
    pub fn get(&self, path: &str) -> Result<Value, CtlError> {
        self.call(Method::GET, path, None, &[])
    }

    /// `method` on `path` with an optional JSON body and extra headers. A 2xx reply gives its
    /// JSON body (`Value::Null` when empty, a string when it is not JSON); any other status
    /// gives [`CtlError::Server`] with RabbitMQ's `error` and `reason` when the body has them.
    pub fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> Result<Value, CtlError> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .http
            .request(method.clone(), &url)
            .basic_auth(&self.username, Some(&self.password));
        if let Some(b) = body {
            req = req.json(b);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (status, text) = self
            .runtime
            .block_on(async {
                let resp = req.send().await?;
                let status = resp.status();
                let text = resp.text().await?;
                Ok::<_, reqwest::Error>((status, text))
            })
            .map_err(|e| CtlError::Http {
                what: format!("{method} {url}"),
                detail: error_chain(&e),
            })?;
        let json = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            return Ok(json);
        }
        let field = |k: &str| json.get(k).and_then(Value::as_str).map(str::to_string);
        Err(CtlError::Server {
            status: status.as_u16(),
            status_text: status.canonical_reason().unwrap_or("").to_string(),
            error: field("error").or_else(|| field("status")),
            reason: field("reason").or_else(|| json.as_str().map(str::to_string)),
        })
    }
}

/// An error and its sources on one line ("error sending request: connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_encode_slash_and_reserved_characters() {
        assert_eq!(seg("/"), "%2F");
        assert_eq!(seg("a b/c%d"), "a%20b%2Fc%25d");
        assert_eq!(seg("q.1-x_y~"), "q.1-x_y~");
        assert_eq!(seg("é"), "%C3%A9");
        assert_eq!(exchange_seg(""), "amq.default");
        assert_eq!(exchange_seg("amq.topic"), "amq.topic");
    }
}
