//! Logging in and counting sessions: who may open a connection, and the counts that RabbitMQ's
//! per-vhost and per-user limits (`max-connections`, `max-channels`) are checked against.
//!
//! A front end (the AMQP handshake, later the HTTP APIs) turns what the client sent into
//! [`Credentials`] and calls [`Broker::login`]; every refusal is a [`LoginRefused`] whose text
//! is for the broker's log only: clients see one generic refusal whatever the reason, so that
//! an unknown user and a wrong password look the same (rabbit_reader.erl `auth_fail/5`).
//!
//! Then, at connection.open, [`Sessions::open_connection`] checks the vhost and the user's
//! limits and permissions in RabbitMQ's order and returns a [`ConnectionSlot`] that counts the
//! connection (and its channels) until it is dropped. Checking and counting happen under one
//! lock, so concurrent connections cannot both slip under a limit.
//!
//! Lock order: the access-control lock ([`Broker::access`]) may be held while taking the
//! sessions lock or the broker's vhost map (start-up provisioning creates vhosts under it),
//! never the reverse, and neither is taken under a vhost's topology or a queue lock.

use std::collections::HashMap;
use std::sync::Arc;

use crate::access::{AccessControl, LoginError, OpenConnections, UserTag};
use crate::broker::Broker;
use crate::error::Result;

/// What a client presented to log in.
#[derive(Debug, Clone, Copy)]
pub enum Credentials<'a> {
    /// A user name and cleartext password (SASL PLAIN, AMQPLAIN).
    Password {
        /// User name.
        user: &'a str,
        /// Cleartext password; never logged.
        password: &'a str,
    },
    /// A user name established outside the mechanism: from a client certificate verified
    /// during the TLS handshake (SASL EXTERNAL). Only the user's existence is checked, as
    /// RabbitMQ's internal backend does for `check_user_login(Name, [])`.
    Verified {
        /// User name (derived from the certificate).
        user: &'a str,
    },
    /// SASL ANONYMOUS, logging in as the configured anonymous user (which must exist).
    Anonymous {
        /// The configured anonymous user.
        user: &'a str,
    },
}

/// Where a client logs in from, for the loopback-only rule.
#[derive(Debug, Clone, Copy)]
pub struct LoginSource<'a> {
    /// The client connected from a loopback address.
    pub from_loopback: bool,
    /// Users that may only log in from loopback addresses (RabbitMQ's `loopback_users`,
    /// default `["guest"]`).
    pub loopback_users: &'a [String],
}

/// A successful login.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Authenticated {
    /// User name.
    pub user: String,
    /// The user's tags at login.
    pub tags: Vec<UserTag>,
}

/// Why a login was refused, worded as RabbitMQ logs it (`rabbit_auth_backend_internal.erl`,
/// `rabbit_reader.erl`). For the log only: the client gets the generic refusal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoginRefused {
    /// Unknown user, wrong or blank password.
    #[error(transparent)]
    Credentials(#[from] LoginError),
    /// A loopback-only user connected from another address.
    #[error("user '{0}' can only connect via localhost")]
    NotLoopback(String),
}

impl Broker {
    /// Checks `credentials` against the access-control database and the loopback rule.
    ///
    /// Errors: [`LoginRefused`] (for the log; tell the client only that login was refused).
    pub fn login(
        &self,
        credentials: Credentials<'_>,
        source: LoginSource<'_>,
    ) -> std::result::Result<Authenticated, LoginRefused> {
        let access = self.access();
        let user =
            match credentials {
                Credentials::Password { user, password } => access.authenticate(user, password)?,
                Credentials::Verified { user } | Credentials::Anonymous { user } => access
                    .user(user)
                    .ok_or_else(|| LoginError::InvalidCredentials(user.to_string()))?,
            };
        if !source.from_loopback && source.loopback_users.contains(&user.name) {
            return Err(LoginRefused::NotLoopback(user.name.clone()));
        }
        Ok(Authenticated {
            user: user.name.clone(),
            tags: user.tags.clone(),
        })
    }
}

#[derive(Debug, Default)]
struct Counts {
    connections_by_vhost: HashMap<String, u64>,
    connections_by_user: HashMap<String, u64>,
    channels_by_user: HashMap<String, u64>,
}

fn add(map: &mut HashMap<String, u64>, key: &str, delta: i64) {
    if delta >= 0 {
        *map.entry(key.to_string()).or_default() += delta.unsigned_abs();
    } else if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(delta.unsigned_abs());
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// Open client connections per vhost and per user, and open channels per user: what the
/// `max-connections` and `max-channels` limits are checked against.
#[derive(Debug, Default)]
pub struct Sessions {
    counts: parking_lot::Mutex<Counts>,
}

impl Sessions {
    /// No sessions.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// connection.open of `user` to `vhost`: checks, in RabbitMQ's order, that the vhost
    /// exists, its `max-connections`, the user's `max-connections` and the user's permissions
    /// in it ([`AccessControl::check_connection_open`]), then counts the connection until the
    /// returned slot is dropped.
    ///
    /// Errors: 530 NOT_ALLOWED with RabbitMQ's text (`vhost v not found`, `access to vhost 'v'
    /// refused for user 'u'`, the limits' texts).
    pub fn open_connection(
        self: &Arc<Self>,
        access: &AccessControl,
        user: &str,
        vhost: &str,
    ) -> Result<ConnectionSlot> {
        let mut counts = self.counts.lock();
        let open = OpenConnections {
            in_vhost: counts.connections_by_vhost.get(vhost).copied().unwrap_or(0),
            by_user: counts.connections_by_user.get(user).copied().unwrap_or(0),
        };
        access.check_connection_open(user, vhost, open)?;
        add(&mut counts.connections_by_vhost, vhost, 1);
        add(&mut counts.connections_by_user, user, 1);
        Ok(ConnectionSlot {
            sessions: self.clone(),
            user: user.to_string(),
            vhost: vhost.to_string(),
            channels: 0,
        })
    }

    /// Client connections open to `vhost`.
    pub fn connections_in_vhost(&self, vhost: &str) -> u64 {
        let c = self.counts.lock();
        c.connections_by_vhost.get(vhost).copied().unwrap_or(0)
    }

    /// Connections `user` has open.
    pub fn connections_of_user(&self, user: &str) -> u64 {
        let c = self.counts.lock();
        c.connections_by_user.get(user).copied().unwrap_or(0)
    }

    /// Channels `user` has open over all connections (as last reported by them).
    pub fn channels_of_user(&self, user: &str) -> u64 {
        let c = self.counts.lock();
        c.channels_by_user.get(user).copied().unwrap_or(0)
    }
}

/// One counted connection. Dropping it uncounts the connection and its channels.
#[derive(Debug)]
pub struct ConnectionSlot {
    sessions: Arc<Sessions>,
    user: String,
    vhost: String,
    channels: u64,
}

impl ConnectionSlot {
    /// channel.open on this connection, which has `open` channels now: syncs the count, then
    /// checks the user's `max-channels` over all the user's connections and counts the new
    /// channel.
    ///
    /// Errors: 530 NOT_ALLOWED `number of channels opened for user 'u' has reached the maximum
    /// allowed user limit of n` ([`AccessControl::check_channel_open`]), which closes the
    /// connection.
    pub fn open_channel(&mut self, access: &AccessControl, open: u64) -> Result<()> {
        self.set_channels(open);
        let mut counts = self.sessions.counts.lock();
        let by_user = counts
            .channels_by_user
            .get(&self.user)
            .copied()
            .unwrap_or(0);
        access.check_channel_open(&self.user, by_user)?;
        add(&mut counts.channels_by_user, &self.user, 1);
        self.channels += 1;
        Ok(())
    }

    /// Reports that this connection has `open` channels (after channels closed). Cheap when
    /// nothing changed.
    pub fn set_channels(&mut self, open: u64) {
        if open == self.channels {
            return;
        }
        let delta = open as i64 - self.channels as i64;
        add(
            &mut self.sessions.counts.lock().channels_by_user,
            &self.user,
            delta,
        );
        self.channels = open;
    }

    /// The user.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The vhost.
    pub fn vhost(&self) -> &str {
        &self.vhost
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut counts = self.sessions.counts.lock();
        add(&mut counts.connections_by_vhost, &self.vhost, -1);
        add(&mut counts.connections_by_user, &self.user, -1);
        add(
            &mut counts.channels_by_user,
            &self.user,
            -(self.channels as i64),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{Permissions, UserLimits, UserRecord, VhostLimits, VhostRecord};
    use warren_amqp::constants;

    fn source(from_loopback: bool) -> LoginSource<'static> {
        static GUEST: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        LoginSource {
            from_loopback,
            loopback_users: GUEST.get_or_init(|| vec!["guest".to_string()]),
        }
    }

    #[test]
    fn unknown_user_and_wrong_password_read_alike() {
        let b = Broker::new();
        let pw = |user, password| b.login(Credentials::Password { user, password }, source(true));
        assert_eq!(pw("guest", "guest").unwrap().user, "guest");
        let wrong = pw("guest", "nope").unwrap_err().to_string();
        let unknown = pw("nobody", "nope").unwrap_err().to_string();
        assert_eq!(wrong, "user 'guest' - invalid credentials");
        assert_eq!(unknown, "user 'nobody' - invalid credentials");
        assert!(pw("guest", "").is_err());
    }

    #[test]
    fn loopback_users_only_from_loopback() {
        let b = Broker::new();
        let creds = Credentials::Password {
            user: "guest",
            password: "guest",
        };
        assert_eq!(
            b.login(creds, source(false)).unwrap_err().to_string(),
            "user 'guest' can only connect via localhost"
        );
        let anyone = LoginSource {
            from_loopback: false,
            loopback_users: &[],
        };
        assert!(b.login(creds, anyone).is_ok());
    }

    #[test]
    fn verified_and_anonymous_need_an_existing_user() {
        let b = Broker::new();
        assert!(b
            .login(Credentials::Verified { user: "guest" }, source(true))
            .is_ok());
        assert!(b
            .login(Credentials::Verified { user: "CN=x" }, source(true))
            .is_err());
        assert!(b
            .login(Credentials::Anonymous { user: "guest" }, source(false))
            .is_err());
    }

    #[test]
    fn connection_and_channel_limits_count_open_sessions() {
        let mut access = AccessControl::with_default_guest();
        let mut vh = VhostRecord::new("v");
        vh.limits = VhostLimits {
            max_connections: Some(1),
            ..Default::default()
        };
        access.put_vhost(vh);
        let mut u = UserRecord::with_password("u", "p", vec![]);
        u.limits = UserLimits {
            max_connections: Some(2),
            max_channels: Some(2),
        };
        access.put_user(u);
        access
            .set_permissions("u", "v", Permissions::full())
            .unwrap();
        access
            .set_permissions("u", "/", Permissions::full())
            .unwrap();
        let s = Sessions::new();
        let mut first = s.open_connection(&access, "u", "v").unwrap();
        let e = s.open_connection(&access, "u", "v").unwrap_err();
        assert_eq!(e.code, constants::NOT_ALLOWED);
        assert_eq!(
            e.reply_text(),
            "NOT_ALLOWED - access to vhost 'v' refused for user 'u': connection limit (1) is reached"
        );
        let mut second = s.open_connection(&access, "u", "/").unwrap();
        let e = s.open_connection(&access, "u", "/").unwrap_err();
        assert_eq!(
            e.reply_text(),
            "NOT_ALLOWED - connection refused for user 'u': user connection limit (2) is reached"
        );
        first.open_channel(&access, 0).unwrap();
        second.open_channel(&access, 0).unwrap();
        assert_eq!(s.channels_of_user("u"), 2);
        let e = second.open_channel(&access, 1).unwrap_err();
        assert!(e.is_hard());
        // A channel closed on the first connection frees a place for the second.
        first.set_channels(0);
        second.open_channel(&access, 1).unwrap();
        drop(first);
        assert_eq!(s.connections_in_vhost("v"), 0);
        assert_eq!(s.channels_of_user("u"), 2);
        drop(second);
        assert_eq!(s.connections_of_user("u"), 0);
        assert_eq!(s.channels_of_user("u"), 0);
        // No permissions in the vhost: RabbitMQ's 530 text.
        access.put_user(UserRecord::with_password("w", "p", vec![]));
        let e = s.open_connection(&access, "w", "v").unwrap_err();
        assert_eq!(
            e.reply_text(),
            "NOT_ALLOWED - access to vhost 'v' refused for user 'w'"
        );
        let e = s.open_connection(&access, "u", "nope").unwrap_err();
        assert_eq!(e.reply_text(), "NOT_ALLOWED - vhost nope not found");
    }
}
