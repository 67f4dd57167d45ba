//! Error replies in RabbitMQ's shape: a status code and `{"error": ..., "reason": ...}`
//! (rabbit_mgmt_util's `halt_response`).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

/// The realm RabbitMQ's management plugin names in `WWW-Authenticate`.
pub const REALM: &str = "Basic realm=\"RabbitMQ Management\"";

/// An error reply of the management API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// RabbitMQ's error type (`not_found`, `bad_request`, `not_authorised`, ...).
    pub error: &'static str,
    /// Human-readable reason.
    pub reason: String,
    /// Ask for credentials (`WWW-Authenticate`): only a failed login does.
    pub challenge: bool,
}

impl ApiError {
    /// 404 `{"error":"Object Not Found","reason":"Not Found"}`, RabbitMQ's body for a
    /// missing vhost, queue, exchange, user or path.
    pub fn not_found() -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            error: "Object Not Found",
            reason: "Not Found".into(),
            challenge: false,
        }
    }

    /// 404 with `reason` saying what is missing.
    pub fn not_found_because(reason: impl Into<String>) -> Self {
        ApiError {
            reason: reason.into(),
            ..Self::not_found()
        }
    }

    /// 400 `{"error":"bad_request","reason":reason}`.
    pub fn bad_request(reason: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            error: "bad_request",
            reason: reason.into(),
            challenge: false,
        }
    }

    /// 401 for a request without credentials: `WWW-Authenticate` and no body, as RabbitMQ.
    pub fn credentials_required() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            error: "",
            reason: String::new(),
            challenge: true,
        }
    }

    /// 401 for wrong credentials: `{"error":"not_authorized",
    /// "reason":"Not_Authorized"}` with `WWW-Authenticate`.
    pub fn not_authenticated() -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            error: "not_authorized",
            reason: "Not_Authorized".into(),
            challenge: true,
        }
    }

    /// 500 `{"error":"internal_server_error","reason":reason}`: the broker could not do what
    /// was asked (e.g. the message store failed to write a published message).
    pub fn internal(reason: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            error: "internal_server_error",
            reason: reason.into(),
            challenge: false,
        }
    }

    /// 401 for an operation the broker refused with 403 ACCESS_REFUSED (deleting a standard
    /// exchange, ...): RabbitMQ answers `{"error":"not_authorised","reason":"Access refused."}`.
    pub fn access_refused() -> Self {
        Self::not_authorised("Access refused.")
    }

    /// 401 for a known user who may not do this (RabbitMQ answers 401, not 403, with
    /// `{"error":"not_authorised","reason":reason}`, e.g. "Not administrator user").
    pub fn not_authorised(reason: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::UNAUTHORIZED,
            error: "not_authorised",
            reason: reason.into(),
            challenge: false,
        }
    }

    /// 405 for a method the path does not take.
    pub fn method_not_allowed() -> Self {
        ApiError {
            status: StatusCode::METHOD_NOT_ALLOWED,
            error: "method_not_allowed",
            reason: "Method Not Allowed".into(),
            challenge: false,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = if self.error.is_empty() {
            self.status.into_response()
        } else {
            let body = serde_json::json!({"error": self.error, "reason": self.reason});
            (self.status, axum::Json(body)).into_response()
        };
        if self.challenge {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static(REALM));
        }
        r
    }
}
