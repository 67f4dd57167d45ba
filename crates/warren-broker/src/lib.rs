//! The broker model of Warren, free of any transport.
//!
//! This crate holds what an AMQP 0-9-1 broker *is*, independent of sockets: virtual hosts
//! ([`VHost`]), exchanges and their routing tables ([`exchange`]), queues with their ready lists,
//! consumers and prefetch accounting ([`queue`]), and the user table ([`auth`]). The server crate
//! drives it from connection tasks; tests drive it directly.
//!
//! [`access`] (users with RabbitMQ's password hashes, vhost and user limits, permissions, and the
//! table of what each operation needs) and [`definitions`] (RabbitMQ's definitions files) are the
//! pieces of the coming operations layer; the server does not use them yet.
//!
//! Locking discipline: a vhost's topology lock may be held while taking a queue lock, and a queue
//! lock may be held while calling into a [`queue::DeliveryTarget`] (a channel), never the reverse.
//! Channels therefore never call back into a queue while holding their own lock. A vhost's
//! schedule of delayed messages is taken alone or under the topology lock, and never held
//! while routing.

pub mod access;
pub mod args;
pub mod auth;
pub mod blocks;
pub mod clock;
pub mod data_dir;
pub mod definitions;
pub mod delayed;
pub mod error;
pub mod exchange;
pub mod headers;
pub mod limits;
pub mod message;
pub mod names;
pub mod persist;
pub mod queue;
pub mod sender_selected;
pub mod topic;
pub mod vhost;

pub use auth::{User, Users};
pub use data_dir::{DataDir, DataDirError};
pub use error::{BrokerError, Result};
pub use exchange::{Destination, ExchangeKind};
pub use limits::Limits;
pub use message::{Message, QueuedMessage};
pub use persist::StorageOptions;
pub use queue::{Consumer, DeliveryTarget, Queue};
pub use vhost::{Broker, ExchangeSnapshot, PublishError, Published, VHost};
pub use warren_store::{Completion, RecoveryReport};
