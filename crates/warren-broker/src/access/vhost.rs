//! What the access layer knows of a virtual host: its metadata and limits.
//!
//! The vhost's topology (exchanges, queues, bindings) lives in [`crate::VHost`]; this record holds
//! what `rabbitmqctl add_vhost --description --tags --default-queue-type` and
//! `set_vhost_limits` set (rabbitmq.com/docs/vhosts), which is what a definitions file carries.

use super::limits::VhostLimits;

/// The description RabbitMQ gives the default vhost `/` on first boot.
pub const DEFAULT_VHOST_DESCRIPTION: &str = "Default virtual host";

/// A virtual host's metadata and limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VhostRecord {
    /// Name, e.g. `/`.
    pub name: String,
    /// Free text.
    pub description: String,
    /// Free-form tags, in the order given.
    pub tags: Vec<String>,
    /// Queue type for declares that name none (`classic`, `quorum`, `stream`); `None` uses the
    /// broker's default.
    pub default_queue_type: Option<String>,
    /// `max-connections` and `max-queues`.
    pub limits: VhostLimits,
}

impl VhostRecord {
    /// A vhost with no metadata and no limits.
    pub fn new(name: impl Into<String>) -> Self {
        VhostRecord {
            name: name.into(),
            ..Default::default()
        }
    }

    /// The default vhost `/` as RabbitMQ creates it on first boot.
    pub fn default_vhost() -> Self {
        VhostRecord {
            name: "/".into(),
            description: DEFAULT_VHOST_DESCRIPTION.into(),
            ..Default::default()
        }
    }
}
