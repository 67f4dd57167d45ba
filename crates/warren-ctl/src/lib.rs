//! `warren ctl`: a command-line client of the management HTTP API that Warren serves on
//! `[management] listen` (RabbitMQ's `/api` paths and JSON, so it works against RabbitMQ's
//! management plugin too).
//!
//! The commands follow rabbitmqadmin: `list`, `declare`, `delete`, `purge`, `publish`, `get`,
//! `close`, `export`, `import`, `overview`, `health-check`. Output is a table by default and
//! the server's JSON with `--json`. A refused request exits with status 1 and prints the
//! server's `reason` (RabbitMQ's error body `{"error": ..., "reason": ...}`) on standard error;
//! a usage error exits with 2 (clap's convention).
//!
//! The `warren` binary parses [`CtlArgs`] for its `ctl` subcommand and calls [`run`].

mod client;
mod commands;
mod output;

pub use client::Client;
pub use commands::{run, CtlArgs};

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    /// The server answered with a status other than 2xx. `error` and `reason` come from
    /// RabbitMQ's JSON error body (`{"error":"not_authorized","reason":"Not_Authorized"}`),
    /// or a failed health check's `{"status":"failed","reason":...}`.
    #[error("{}", server_message(*.status, .status_text, .error.as_deref(), .reason.as_deref()))]
    Server {
        /// HTTP status code.
        status: u16,
        /// The status' canonical text ("Not Found").
        status_text: String,
        /// RabbitMQ's error type, or a health check's `status`.
        error: Option<String>,
        /// The server's reason.
        reason: Option<String>,
    },
    /// No HTTP reply: the connection was refused, timed out, or the URL is unusable.
    #[error("{what}: {detail}")]
    Http {
        /// The request (`GET http://localhost:15672/api/queues`).
        what: String,
        /// The transport error and its causes.
        detail: String,
    },
    /// A file or standard input/output could not be read or written.
    #[error("{0}")]
    Io(String),
    /// The command's own input is wrong (e.g. `--arguments` is not a JSON object).
    #[error("{0}")]
    Input(String),
    /// Something on this side failed before a request was sent.
    #[error("{0}")]
    Local(String),
}

fn server_message(status: u16, text: &str, error: Option<&str>, reason: Option<&str>) -> String {
    let mut out = match reason {
        Some(r) if !r.is_empty() => r.to_string(),
        _ => text.to_string(),
    };
    out.push_str(&format!(" (HTTP {status}"));
    if !text.is_empty() {
        out.push_str(&format!(" {text}"));
    }
    if let Some(e) = error.filter(|e| !e.is_empty()) {
        out.push_str(&format!(", {e}"));
    }
    out.push(')');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errors_lead_with_the_reason() {
        let e = CtlError::Server {
            status: 401,
            status_text: "Unauthorized".into(),
            error: Some("not_authorized".into()),
            reason: Some("Not_Authorized".into()),
        };
        assert_eq!(
            e.to_string(),
            "Not_Authorized (HTTP 401 Unauthorized, not_authorized)"
        );
        let e = CtlError::Server {
            status: 401,
            status_text: "Unauthorized".into(),
            error: None,
            reason: None,
        };
        assert_eq!(e.to_string(), "Unauthorized (HTTP 401 Unauthorized)");
    }
}
