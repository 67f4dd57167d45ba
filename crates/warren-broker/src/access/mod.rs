//! Users, vhosts, permissions and limits: who may do what, decided in one place.
//!
//! The model is RabbitMQ's internal database (rabbitmq.com/docs/access-control), so users,
//! hashes, patterns and refusals exported from RabbitMQ mean the same in Warren:
//!
//! - [`password`]: RabbitMQ's salted SHA-256 / SHA-512 / MD5 password hashes.
//! - [`user`]: a user's credential, tags and limits; login refusals.
//! - [`vhost`]: a vhost's metadata and limits.
//! - [`limits`]: per-vhost and per-user limits and their refusals.
//! - [`pattern`], [`permissions`]: configure / write / read patterns per user and vhost, topic
//!   permissions per user, vhost and exchange.
//! - [`operation`]: every operation as a value, and [`required_access`], the exhaustive table of
//!   what each one needs.
//! - [`control`]: [`AccessControl`], the database, which checks an operation for a user.
//!
//! A front end (an AMQP channel, the management API) describes what it is about to do as an
//! [`Operation`] and calls [`AccessControl::check`] (and [`AccessControl::check_after_lookup`] for
//! the topic and `user_id` checks RabbitMQ makes once the exchange is found):
//!
//! ```
//! use warren_broker::access::{AccessControl, Operation, Permissions, UserRecord};
//!
//! let mut access = AccessControl::with_default_guest();
//! access.put_user(UserRecord::with_password("app", "s3cret", vec![]));
//! access
//!     .set_permissions("app", "/", Permissions::new("^app\\.", "^app\\.", ".*").unwrap())
//!     .unwrap();
//!
//! assert!(access.authenticate("app", "s3cret").is_ok());
//! let declare = Operation::QueueDeclare { queue: "other", passive: false, dead_letter_exchange: None };
//! let refusal = access.check("app", "/", &declare).unwrap_err();
//! assert_eq!(
//!     refusal.reply_text(),
//!     "ACCESS_REFUSED - configure access to queue 'other' in vhost '/' refused for user 'app'"
//! );
//! ```

pub mod control;
pub mod limits;
pub mod operation;
pub mod password;
pub mod pattern;
pub mod permissions;
pub mod user;
pub mod vhost;

#[cfg(test)]
mod control_tests;

pub use control::{AccessControl, AccessError, OpenConnections};
pub use limits::{UserLimits, VhostLimits};
pub use operation::{required_access, ManagementAccess, Operation, Requirement};
pub use password::{hash_password, verify_password, Cleartext, HashingAlgorithm, PasswordHash};
pub use pattern::{Pattern, PatternError};
pub use permissions::{Permission, Permissions, TopicPermissions};
pub use user::{LoginError, UserRecord, UserTag};
pub use vhost::VhostRecord;
