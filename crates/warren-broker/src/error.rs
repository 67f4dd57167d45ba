//! Errors of the broker model, each carrying the AMQP reply code RabbitMQ uses for it.
//!
//! Soft errors (4xx) close the channel; hard errors (5xx) close the connection
//! (AMQP 0-9-1 section 1.2 "constants", RabbitMQ's "spec differences").

use warren_amqp::constants;

/// An error to be reported to a client as a `channel.close` or `connection.close`.
///
/// `text` is the reply text *without* the reply code name prefix; [`BrokerError::reply_text`]
/// gives the full `NOT_FOUND - no queue 'q' in vhost '/'` form RabbitMQ sends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} - {text}", constants::reply_code_name(*.code))]
pub struct BrokerError {
    /// AMQP reply code (e.g. 404 NOT_FOUND).
    pub code: u16,
    /// Human-readable explanation.
    pub text: String,
}

/// Result alias for broker operations.
pub type Result<T> = std::result::Result<T, BrokerError>;

impl BrokerError {
    /// Builds an error from a reply code and text.
    pub fn new(code: u16, text: impl Into<String>) -> Self {
        BrokerError {
            code,
            text: text.into(),
        }
    }
    /// 404 NOT_FOUND (soft).
    pub fn not_found(text: impl Into<String>) -> Self {
        Self::new(constants::NOT_FOUND, text)
    }
    /// 403 ACCESS_REFUSED (soft).
    pub fn access_refused(text: impl Into<String>) -> Self {
        Self::new(constants::ACCESS_REFUSED, text)
    }
    /// 405 RESOURCE_LOCKED (soft).
    pub fn resource_locked(text: impl Into<String>) -> Self {
        Self::new(constants::RESOURCE_LOCKED, text)
    }
    /// 406 PRECONDITION_FAILED (soft).
    pub fn precondition_failed(text: impl Into<String>) -> Self {
        Self::new(constants::PRECONDITION_FAILED, text)
    }
    /// 503 COMMAND_INVALID (hard).
    pub fn command_invalid(text: impl Into<String>) -> Self {
        Self::new(constants::COMMAND_INVALID, text)
    }
    /// 530 NOT_ALLOWED (hard).
    pub fn not_allowed(text: impl Into<String>) -> Self {
        Self::new(constants::NOT_ALLOWED, text)
    }
    /// 540 NOT_IMPLEMENTED (hard).
    pub fn not_implemented(text: impl Into<String>) -> Self {
        Self::new(constants::NOT_IMPLEMENTED, text)
    }
    /// 541 INTERNAL_ERROR (hard).
    pub fn internal(text: impl Into<String>) -> Self {
        Self::new(constants::INTERNAL_ERROR, text)
    }

    /// True for connection-level (hard) errors, which close the whole connection.
    pub fn is_hard(&self) -> bool {
        self.code >= 500 || self.code == constants::CONNECTION_FORCED || self.code == 402
    }

    /// The reply text as RabbitMQ formats it: `"<CODE_NAME> - <text>"`.
    pub fn reply_text(&self) -> String {
        format!("{} - {}", constants::reply_code_name(self.code), self.text)
    }
}

/// Formats a resource name the way RabbitMQ does in reply texts: `queue 'q' in vhost '/'`.
pub fn resource(kind: &str, name: &str, vhost: &str) -> String {
    format!("{kind} '{name}' in vhost '{vhost}'")
}
