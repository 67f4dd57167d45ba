//! Definitions files: RabbitMQ's JSON description of a broker's users, vhosts, permissions,
//! policies, parameters, exchanges, queues and bindings (rabbitmq.com/docs/definitions).
//!
//! A file exported from RabbitMQ (`rabbitmqctl export_definitions`, `GET /api/definitions`)
//! imports into Warren with its users' password hashes intact, and a file Warren writes imports
//! into RabbitMQ.
//!
//! - [`format`](mod@format): serde types that read every RabbitMQ version's shape and write back what they
//!   read, unknown fields included.
//! - [`arguments`]: queue, exchange and binding arguments between JSON and AMQP field tables.
//! - [`import`]: [`plan_import`], a pure function from a file to an ordered list of idempotent
//!   [`Change`]s for the broker to apply.
//! - [`apply`](mod@apply): [`Broker::apply_import`](crate::Broker::apply_import), which applies
//!   a plan to a running broker.
//! - [`export`]: the access-control database as a definitions file.
//!
//! ```
//! use warren_broker::access::AccessControl;
//! use warren_broker::definitions::{plan_import, Definitions};
//!
//! let file = r#"{"rabbit_version": "3.10.8",
//!     "users": [{"name": "guest", "tags": ["administrator"],
//!                "hashing_algorithm": "rabbit_password_hashing_sha256",
//!                "password_hash": "kI3GCqW5JLMJa4iX1lo7X4D6XbYqlLgxIs30+P6tENUV2POR"}],
//!     "vhosts": [{"name": "/"}],
//!     "permissions": [{"user": "guest", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}]}"#;
//! let plan = plan_import(&Definitions::from_json(file).unwrap()).unwrap();
//! let mut access = AccessControl::new();
//! for change in &plan.changes {
//!     change.apply_to_access(&mut access).unwrap();
//! }
//! assert!(access.authenticate("guest", "test12").is_ok());
//! ```

pub mod apply;
pub mod arguments;
pub mod export;
pub mod format;
pub mod import;

pub use apply::{AppliedImport, ApplyError};
pub use arguments::{json_to_table, table_to_json, ArgumentError};
pub use export::export_access;
pub use format::Definitions;
pub use import::{
    parse_vhost_limits, plan_import, plan_vhost_import, Change, ImportError, ImportPlan,
    VHOST_LIMITS_COMPONENT,
};
