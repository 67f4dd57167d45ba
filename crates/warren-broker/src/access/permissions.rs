//! A user's permissions in one vhost, and topic permissions on one exchange.
//!
//! Permissions are three patterns per (user, vhost): `configure` (create, delete or alter a
//! resource), `write` (inject messages into it) and `read` (take messages from it)
//! (rabbitmq.com/docs/access-control, "How Permissions Work"). A user with no permissions entry
//! for a vhost may not even connect to it.
//!
//! Topic permissions are two more patterns per (user, vhost, topic exchange), matched against
//! routing keys: `write` on publish, `read` on queue.bind and exchange.bind. Where none are set,
//! everything is allowed ("Topic Authorisation"). Their patterns may use `{username}` and
//! `{vhost}`, which are expanded here, once, when they are set (both are fixed for the entry);
//! `{client_id}` exists only for MQTT and stays literal, as RabbitMQ leaves it on AMQP 0-9-1
//! connections.

use std::fmt;

use regex::Regex;

use super::pattern::{self, Pattern, PatternError};

/// One of the three permission kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Permission {
    /// Create, delete or alter the behaviour of a resource.
    Configure,
    /// Inject messages into a resource.
    Write,
    /// Retrieve messages from a resource.
    Read,
}

impl Permission {
    /// `configure`, `write` or `read`, as in RabbitMQ's refusal texts.
    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Configure => "configure",
            Permission::Write => "write",
            Permission::Read => "read",
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A user's `configure`, `write` and `read` patterns in one vhost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Names the user may declare, delete or alter.
    pub configure: Pattern,
    /// Names the user may publish to or bind to (as destination).
    pub write: Pattern,
    /// Names the user may consume from, get from, purge, or bind from (as source).
    pub read: Pattern,
}

impl Permissions {
    /// Compiles the three patterns (`rabbitmqctl set_permissions <user> <conf> <write> <read>`).
    pub fn new(configure: &str, write: &str, read: &str) -> Result<Self, PatternError> {
        Ok(Permissions {
            configure: Pattern::new(configure)?,
            write: Pattern::new(write)?,
            read: Pattern::new(read)?,
        })
    }

    /// `.*` for all three, what the default user gets on `/`.
    pub fn full() -> Self {
        Permissions {
            configure: Pattern::everything(),
            write: Pattern::everything(),
            read: Pattern::everything(),
        }
    }

    /// The pattern for `permission`.
    pub fn pattern(&self, permission: Permission) -> &Pattern {
        match permission {
            Permission::Configure => &self.configure,
            Permission::Write => &self.write,
            Permission::Read => &self.read,
        }
    }

    /// True when `permission` is granted on the resource called `name`.
    pub fn allows(&self, permission: Permission, name: &str) -> bool {
        self.pattern(permission).is_match(name)
    }
}

/// A user's topic permissions on one topic exchange in one vhost.
#[derive(Clone)]
pub struct TopicPermissions {
    exchange: String,
    write_source: String,
    read_source: String,
    write: Regex,
    read: Regex,
}

impl TopicPermissions {
    /// Compiles `write` and `read` for `user` in `vhost` on `exchange`, with `{username}` and
    /// `{vhost}` expanded (`rabbitmqctl set_topic_permissions -p <vhost> <user> <exchange> <write>
    /// <read>`). The limits and rules of [`Pattern`] apply to the patterns as given.
    pub fn new(
        user: &str,
        vhost: &str,
        exchange: &str,
        write: &str,
        read: &str,
    ) -> Result<Self, PatternError> {
        let vars = [("username", user), ("vhost", vhost)];
        let build = |source: &str| -> Result<Regex, PatternError> {
            pattern::compile(source)?;
            pattern::compile_expanded(source, &pattern::expand_variables(source, &vars))
        };
        Ok(TopicPermissions {
            exchange: exchange.to_string(),
            write: build(write)?,
            read: build(read)?,
            write_source: write.to_string(),
            read_source: read.to_string(),
        })
    }

    /// The topic exchange these permissions are for.
    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// The `write` pattern as given (variables unexpanded).
    pub fn write_source(&self) -> &str {
        &self.write_source
    }

    /// The `read` pattern as given (variables unexpanded).
    pub fn read_source(&self) -> &str {
        &self.read_source
    }

    /// True when `routing_key` may be used for `permission`: `Write` on publish, `Read` on bind.
    /// Topic permissions have no `configure` pattern; `Configure` is never allowed.
    pub fn allows(&self, permission: Permission, routing_key: &str) -> bool {
        match permission {
            Permission::Write => self.write.is_match(routing_key),
            Permission::Read => self.read.is_match(routing_key),
            Permission::Configure => false,
        }
    }
}

impl PartialEq for TopicPermissions {
    fn eq(&self, other: &Self) -> bool {
        self.exchange == other.exchange
            && self.write_source == other.write_source
            && self.read_source == other.read_source
    }
}

impl Eq for TopicPermissions {}

impl fmt::Debug for TopicPermissions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopicPermissions")
            .field("exchange", &self.exchange)
            .field("write", &self.write_source)
            .field("read", &self.read_source)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_pick_the_right_pattern() {
        let p = Permissions::new("^app\\..*", "^(app\\..*|amq\\.default)$", "").unwrap();
        assert!(p.allows(Permission::Configure, "app.q"));
        assert!(!p.allows(Permission::Configure, "amq.default"));
        assert!(p.allows(Permission::Write, "amq.default"));
        assert!(!p.allows(Permission::Read, "app.q"));
        assert_eq!(p.pattern(Permission::Read).source(), "");
        let full = Permissions::full();
        for perm in [Permission::Configure, Permission::Write, Permission::Read] {
            assert!(full.allows(perm, ""));
            assert!(full.allows(perm, "x"));
        }
    }

    #[test]
    fn topic_variables_expand_per_user_and_vhost() {
        // As observed on RabbitMQ 3.10.8: write '^{username}\.x$', read '^r\.{vhost}$'.
        let t = TopicPermissions::new(
            "probe",
            "staging",
            "amq.topic",
            "^{username}\\.x$",
            "^r\\.{vhost}$",
        )
        .unwrap();
        assert!(t.allows(Permission::Write, "probe.x"));
        assert!(!t.allows(Permission::Write, "other.x"));
        assert!(t.allows(Permission::Read, "r.staging"));
        assert!(!t.allows(Permission::Read, "r.other"));
        assert!(!t.allows(Permission::Configure, "probe.x"));
        assert_eq!(t.write_source(), "^{username}\\.x$");
        assert_eq!(t.exchange(), "amq.topic");
    }

    #[test]
    fn topic_variable_values_are_literal() {
        let t = TopicPermissions::new("a.b", "/", "x", "^{username}$", "").unwrap();
        assert!(t.allows(Permission::Write, "a.b"));
        assert!(!t.allows(Permission::Write, "aXb"));
        assert!(
            !t.allows(Permission::Read, "anything"),
            "empty read pattern grants nothing"
        );
        assert!(t.allows(Permission::Read, ""));
    }

    #[test]
    fn client_id_stays_literal_on_amqp() {
        let t = TopicPermissions::new("u", "/", "x", "^{client_id}\\..*", ".*").unwrap();
        assert!(t.allows(Permission::Write, "{client_id}.a"));
        assert!(!t.allows(Permission::Write, "c1.a"));
    }

    #[test]
    fn invalid_topic_pattern_names_the_source() {
        match TopicPermissions::new("u", "/", "x", "({username}", ".*") {
            Err(PatternError::Invalid { pattern, .. }) => assert_eq!(pattern, "({username}"),
            other => panic!("{other:?}"),
        }
    }
}
