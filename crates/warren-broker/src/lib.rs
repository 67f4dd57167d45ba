//! The broker model of Warren, free of any transport.
//!
//! This crate holds what an AMQP 0-9-1 broker *is*, independent of sockets: virtual hosts
//! ([`VHost`]), exchanges and their routing tables ([`exchange`]), queues with their ready lists,
//! consumers and prefetch accounting ([`queue`]), and the access-control database ([`access`]:
//! users with RabbitMQ's password hashes, vhost and user limits, permissions, and the table of
//! what each operation needs). [`login`] checks credentials and counts sessions against the
//! limits; [`definitions`] reads and writes RabbitMQ's definitions files.
//!
//! Front ends (the server crate's AMQP channels) go through [`ops`], the operations layer: every
//! call carries an [`Actor`] and is authorized there. Tests also drive the vhosts directly.
//!
//! Routing, the operations layer and the front ends hold queues as [`Queue`], the trait object
//! of [`QueueBackend`] (`queue/backend.rs`): the classic queue ([`ClassicQueue`]) is one
//! implementation, and a vhost builds queues of other kinds, chosen by `x-queue-type`, through
//! the [`queue::QueueKind`]s registered with it.
//!
//! [`registry`] is the read model for operators: live connections and channels, and message
//! counts per channel, queue, vhost and node.
//!
//! Locking discipline: a vhost's topology lock may be held while taking a queue lock, and a queue
//! lock may be held while calling into a [`queue::DeliveryTarget`] (a channel), never the reverse.
//! Channels therefore never call back into a queue while holding their own lock. A vhost's
//! schedule of delayed messages is taken alone or under the topology lock, and never held
//! while routing; so is a vhost's table of queue kinds, which is never held while calling
//! into a queue. Every queue implementation follows the queue's part of this order. The
//! definitions writer thread takes no lock of the model (a caller may wait for it under a
//! topology lock); the rollbacks of durable changes it failed to write run on a
//! thread of their own and take the topology lock there.

pub mod access;
pub mod args;
pub mod blocks;
pub mod broker;
pub mod clock;
pub mod data_dir;
pub mod dead_letter;
pub mod definitions;
mod defs_writer;
pub mod delayed;
mod equivalence;
pub mod error;
pub mod exchange;
pub mod headers;
pub mod limits;
pub mod log_limit;
pub mod login;
pub mod message;
pub mod names;
pub mod ops;
pub mod persist;
pub mod policy;
pub mod queue;
pub mod registry;
pub mod replica;
pub mod sender_selected;
pub mod topic;
pub mod vhost;

pub use access::AccessControl;
pub use broker::{Broker, OpenError};
pub use data_dir::{DataDir, DataDirError};
pub use error::{BrokerError, Result};
pub use exchange::{Destination, ExchangeKind};
pub use limits::Limits;
pub use login::{Authenticated, Credentials, LoginRefused, LoginSource, Sessions};
pub use message::{Message, QueuedMessage};
pub use ops::{Actor, Ops};
pub use persist::StorageOptions;
pub use queue::{ClassicQueue, Consumer, DeliveryTarget, Queue, QueueBackend, Replicas};
pub use registry::Registry;
pub use vhost::{ExchangeSnapshot, PublishError, Published, VHost};
pub use warren_store::{once as completion_once, Completion, RecoveryReport};
