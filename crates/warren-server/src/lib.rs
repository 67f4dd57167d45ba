//! Warren's server: AMQP 0-9-1 over TCP on tokio, configuration, and the embeddable
//! [`Broker`].
//!
//! Layout: [`server`] starts and stops the listeners and background tasks; [`state`] is what
//! every connection shares; [`connection`] runs one
//! client connection (handshake, frame loop, heartbeats, close); [`channel`] implements the
//! channel-level methods on top of the `warren-broker` model; [`outbox`] batches outgoing
//! frames into few socket writes; [`config`] loads settings; [`listen`] binds listen
//! addresses; [`logging`] sets up the `warren` binary's log; `management` serves the management HTTP
//! API of `warren-mgmt`; [`tls`] accepts TLS connections
//! (AMQPS, HTTPS) and reloads certificates; `unacked` holds a channel's unacknowledged
//! deliveries beyond its in-memory bound by their store location.

pub mod channel;
pub mod config;
pub mod connection;
mod httpmq;
pub mod listen;
pub mod logging;
mod management;
pub mod outbox;
pub mod provision;
pub mod sasl;
pub mod server;
pub mod state;
pub mod tls;
mod unacked;

pub use config::Config;
pub use server::{Broker, BrokerBuilder, RunningBroker};
pub use state::ServerState;
