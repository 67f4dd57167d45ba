//! Per-vhost and per-user limits, and the refusals RabbitMQ sends when one is reached.
//!
//! RabbitMQ's semantics (rabbitmq.com/docs/vhosts "Per-Virtual Host Limits",
//! rabbitmq.com/docs/user-limits; `rabbit_vhost_limit.erl`, `is_over_limit/3` in
//! `rabbit_auth_backend_internal.erl`):
//! - a limit is an integer; a negative one means "no limit", like an absent one;
//! - `0` refuses everything (no connections, no queues, no channels);
//! - `n > 0` allows `n`: the next one is refused once `n` are open.
//!
//! Counting what is open belongs to the broker (connections per vhost and per user, channels per
//! user across all of that user's connections, queues per vhost); these checks take the counts
//! as arguments, so they stay pure. Each count is what is open *before* the new one.

use crate::error::{BrokerError, Result};

/// Reads a limit as RabbitMQ stores it: a negative value means no limit.
pub fn limit_from_i64(value: i64) -> Option<u64> {
    u64::try_from(value).ok()
}

/// True when one more would exceed `limit`, given `open` already.
fn reached(limit: Option<u64>, open: u64) -> bool {
    matches!(limit, Some(max) if open >= max)
}

/// A vhost's limits (`rabbitmqctl set_vhost_limits`, the `vhost-limits` runtime parameter).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VhostLimits {
    /// `max-connections`: client connections open to the vhost at once; `None` for no limit.
    pub max_connections: Option<u64>,
    /// `max-queues`: queues in the vhost; `None` for no limit.
    pub max_queues: Option<u64>,
}

impl VhostLimits {
    /// Checked at connection.open, before the vhost permission check. `open` is the number of
    /// connections the vhost has now. Refuses with 530 NOT_ALLOWED
    /// `access to vhost '<v>' refused for user '<u>': connection limit (<n>) is reached`
    /// (`is_over_vhost_connection_limit/2` in `rabbit_reader.erl`).
    pub fn check_connection(&self, vhost: &str, user: &str, open: u64) -> Result<()> {
        match self.max_connections {
            Some(limit) if reached(self.max_connections, open) => {
                Err(BrokerError::not_allowed(format!(
                    "access to vhost '{vhost}' refused for user '{user}': connection limit \
                     ({limit}) is reached"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Checked when queue.declare would create a new queue (not for one that exists). `existing`
    /// is the number of queues the vhost has now. Refuses with 406 PRECONDITION_FAILED
    /// `cannot declare queue '<q>': queue limit in vhost '<v>' (<n>) is reached`
    /// (`check_vhost_queue_limit/1` in `rabbit_queue_type.erl`).
    pub fn check_new_queue(&self, queue: &str, vhost: &str, existing: u64) -> Result<()> {
        match self.max_queues {
            Some(limit) if reached(self.max_queues, existing) => {
                Err(BrokerError::precondition_failed(format!(
                    "cannot declare queue '{queue}': queue limit in vhost '{vhost}' ({limit}) is \
                     reached"
                )))
            }
            _ => Ok(()),
        }
    }
}

/// A user's limits (`rabbitmqctl set_user_limits`, a definitions file's user `limits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserLimits {
    /// `max-connections`: connections the user has open at once, over all vhosts.
    pub max_connections: Option<u64>,
    /// `max-channels`: channels the user has open at once, over all of their connections.
    pub max_channels: Option<u64>,
}

impl UserLimits {
    /// Checked at connection.open, after the vhost's connection limit. `open` is the number of
    /// connections the user has now. Refuses with 530 NOT_ALLOWED
    /// `connection refused for user '<u>': user connection limit (<n>) is reached`
    /// (`is_over_user_connection_limit/1` in `rabbit_reader.erl`).
    pub fn check_connection(&self, user: &str, open: u64) -> Result<()> {
        match self.max_connections {
            Some(limit) if reached(self.max_connections, open) => {
                Err(BrokerError::not_allowed(format!(
                    "connection refused for user '{user}': user connection limit ({limit}) is \
                     reached"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Checked at channel.open. `open` is the number of channels the user has now on all their
    /// connections. Refuses with 530 NOT_ALLOWED (closing the connection)
    /// `number of channels opened for user '<u>' has reached the maximum allowed user limit of <n>`
    /// (`is_over_limits/1` in `rabbit_reader.erl`; RabbitMQ before 4.3 wrote the number in
    /// parentheses).
    pub fn check_channel(&self, user: &str, open: u64) -> Result<()> {
        match self.max_channels {
            Some(limit) if reached(self.max_channels, open) => {
                Err(BrokerError::not_allowed(format!(
                    "number of channels opened for user '{user}' has reached the maximum allowed \
                     user limit of {limit}"
                )))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_amqp::constants;

    #[test]
    fn negative_means_unlimited() {
        assert_eq!(limit_from_i64(-1), None);
        assert_eq!(limit_from_i64(i64::MIN), None);
        assert_eq!(limit_from_i64(0), Some(0));
        assert_eq!(limit_from_i64(7), Some(7));
    }

    #[test]
    fn vhost_connection_limit() {
        let none = VhostLimits::default();
        assert!(none.check_connection("/", "u", 1_000_000).is_ok());
        let zero = VhostLimits {
            max_connections: Some(0),
            ..Default::default()
        };
        let e = zero.check_connection("staging", "guest", 0).unwrap_err();
        assert_eq!(e.code, constants::NOT_ALLOWED);
        // Text observed from RabbitMQ 3.10.8 and unchanged in 4.x.
        assert_eq!(
            e.reply_text(),
            "NOT_ALLOWED - access to vhost 'staging' refused for user 'guest': connection limit (0) \
             is reached"
        );
        let two = VhostLimits {
            max_connections: Some(2),
            ..Default::default()
        };
        assert!(two.check_connection("v", "u", 0).is_ok());
        assert!(two.check_connection("v", "u", 1).is_ok());
        assert!(two.check_connection("v", "u", 2).is_err());
    }

    #[test]
    fn vhost_queue_limit() {
        let l = VhostLimits {
            max_queues: Some(1),
            ..Default::default()
        };
        assert!(l.check_new_queue("q", "v", 0).is_ok());
        let e = l.check_new_queue("newq", "staging", 1).unwrap_err();
        assert_eq!(e.code, constants::PRECONDITION_FAILED);
        assert_eq!(
            e.reply_text(),
            "PRECONDITION_FAILED - cannot declare queue 'newq': queue limit in vhost 'staging' (1) \
             is reached"
        );
        let zero = VhostLimits {
            max_queues: Some(0),
            ..Default::default()
        };
        assert!(zero.check_new_queue("q", "v", 0).is_err());
        // The connection limit is independent.
        assert!(zero.check_connection("v", "u", 100).is_ok());
    }

    #[test]
    fn user_connection_limit() {
        let l = UserLimits {
            max_connections: Some(0),
            max_channels: None,
        };
        let e = l.check_connection("probe", 0).unwrap_err();
        assert_eq!(e.code, constants::NOT_ALLOWED);
        assert_eq!(
            e.reply_text(),
            "NOT_ALLOWED - connection refused for user 'probe': user connection limit (0) is reached"
        );
        assert!(l.check_channel("probe", 1_000).is_ok());
    }

    #[test]
    fn user_channel_limit() {
        let l = UserLimits {
            max_connections: None,
            max_channels: Some(1),
        };
        assert!(l.check_channel("probe", 0).is_ok());
        let e = l.check_channel("probe", 1).unwrap_err();
        assert!(e.is_hard());
        assert_eq!(
            e.reply_text(),
            "NOT_ALLOWED - number of channels opened for user 'probe' has reached the maximum \
             allowed user limit of 1"
        );
    }
}
