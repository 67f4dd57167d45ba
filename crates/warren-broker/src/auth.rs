//! Users and authentication.
//!
//! Mirrors RabbitMQ's defaults: a `guest` user with password `guest` that may only log in from
//! a loopback address (`loopback_users = guest`, rabbitmq.com/docs/access-control).

use std::collections::HashMap;

/// A user of the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Login name.
    pub name: String,
    /// Password, compared byte for byte.
    pub password: String,
    /// Management tags (`administrator`, …).
    pub tags: Vec<String>,
    /// May only log in over a loopback address.
    pub loopback_only: bool,
}

/// Why a login was refused. Clients all see the same 403 ACCESS_REFUSED; the reason goes to the
/// broker's log, as in RabbitMQ.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No such user.
    #[error("user '{0}' - invalid credentials")]
    UnknownUser(String),
    /// Wrong password.
    #[error("user '{0}' - invalid credentials")]
    BadPassword(String),
    /// A loopback-only user connected from elsewhere.
    #[error("user '{0}' can only connect via localhost")]
    NotLoopback(String),
}

/// The user table.
#[derive(Debug, Clone, Default)]
pub struct Users {
    users: HashMap<String, User>,
}

impl Users {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The default table: `guest`/`guest`, administrator, loopback only.
    pub fn with_default_guest() -> Self {
        let mut u = Users::new();
        u.add(User {
            name: "guest".into(),
            password: "guest".into(),
            tags: vec!["administrator".into()],
            loopback_only: true,
        });
        u
    }

    /// Adds or replaces a user.
    pub fn add(&mut self, user: User) {
        self.users.insert(user.name.clone(), user);
    }

    /// Every user's name, in no particular order.
    pub fn names(&self) -> Vec<String> {
        self.users.keys().cloned().collect()
    }

    /// Looks a user up.
    pub fn get(&self, name: &str) -> Option<&User> {
        self.users.get(name)
    }

    /// Checks a username/password pair for a client connecting from a loopback address or not.
    pub fn authenticate(
        &self,
        name: &str,
        password: &str,
        from_loopback: bool,
    ) -> Result<&User, AuthError> {
        let user = self
            .users
            .get(name)
            .ok_or_else(|| AuthError::UnknownUser(name.into()))?;
        if user.password != password {
            return Err(AuthError::BadPassword(name.into()));
        }
        if user.loopback_only && !from_loopback {
            return Err(AuthError::NotLoopback(name.into()));
        }
        Ok(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_only_from_loopback() {
        let u = Users::with_default_guest();
        assert!(u.authenticate("guest", "guest", true).is_ok());
        assert_eq!(
            u.authenticate("guest", "guest", false),
            Err(AuthError::NotLoopback("guest".into()))
        );
        assert!(u.authenticate("guest", "nope", true).is_err());
        assert!(u.authenticate("nobody", "guest", true).is_err());
    }
}
