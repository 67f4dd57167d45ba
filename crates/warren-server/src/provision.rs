//! Users, vhosts and permissions at start: first from the configuration (`[[users]]`,
//! `[[vhosts]]`, `[[permissions]]`, `[[topic_permissions]]`), then from the definitions file
//! (`[definitions] load_file`, `--load-definitions`), which may add to and replace what the
//! configuration set.
//!
//! The default user `guest` (password `guest`, `.*` on `/`) exists only when neither the
//! configuration lists users nor a definitions file is loaded, as RabbitMQ creates it only on
//! a first boot without definitions (rabbitmq.com/docs/access-control, "Default Virtual Host
//! and User"). Plain passwords of the configuration are hashed here and never logged.
//!
//! Users, vhosts and permissions changed at run time (the management API) are stored in the
//! data directory and loaded by the broker before this runs; the configuration and the
//! definitions file are then applied on top of them: what they name is set again at every
//! start, what they do not name stays as it was changed (docs/security.md, "Users changed at
//! run time"). `guest` is then removed only if it came from the first boot's default.

use std::path::{Path, PathBuf};

use tracing::{info, warn};
use warren_broker::access::limits::limit_from_i64;
use warren_broker::access::user::parse_tags;
use warren_broker::access::{Permissions, UserLimits, UserRecord, VhostLimits, VhostRecord};
use warren_broker::definitions::{plan_import, AppliedImport, Definitions};
use warren_broker::Broker;

use crate::config::Config;

/// Why users, vhosts or permissions could not be set up; the broker does not start.
#[derive(Debug, thiserror::Error)]
pub enum ProvisionError {
    /// A `[[users]]`, `[[vhosts]]` or `[[permissions]]` entry cannot be applied (e.g.
    /// permissions for a user or vhost that does not exist).
    #[error("configuration: {0}")]
    Config(String),
    /// The definitions file cannot be read, parsed or imported.
    #[error("definitions file {}: {message}", path.display())]
    Definitions {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// Applies the configuration's users, vhosts and permissions to `broker`, then imports the
/// definitions file if one is configured.
///
/// Errors: [`ProvisionError`] naming the entry or the file.
pub fn provision(broker: &Broker, config: &Config) -> Result<(), ProvisionError> {
    apply_config(broker, config)?;
    if let Some(path) = &config.definitions.load_file {
        let done = load_definitions(broker, path)?;
        info!(
            file = %path.display(),
            users = done.users,
            vhosts = done.vhosts,
            permissions = done.permissions,
            exchanges = done.exchanges,
            queues = done.queues,
            bindings = done.bindings,
            "definitions imported"
        );
        for s in &done.skipped {
            info!(file = %path.display(), "definitions: not imported: {s}");
        }
    }
    // Vhosts recovered from the data directory that nothing above named still need a record
    // to be reachable (with permissions granted by the configuration or a definitions file).
    let mut access = broker.access_mut();
    for name in broker.vhost_names() {
        if access.vhost(&name).is_none() {
            warn!(vhost = %name, "vhost recovered from the data directory has no permissions set");
            access.put_vhost(VhostRecord::new(name));
        }
    }
    // Vhosts created at run time hold no durable definitions until something durable is
    // declared in them: their record brings them back.
    let recorded: Vec<String> = access.vhosts().map(|v| v.name.clone()).collect();
    drop(access);
    for name in recorded {
        broker.add_vhost(&name);
    }
    Ok(())
}

fn apply_config(broker: &Broker, config: &Config) -> Result<(), ProvisionError> {
    let err = |m: String| ProvisionError::Config(m);
    let mut access = broker.access_mut();
    if (!config.users.is_empty() || config.definitions.load_file.is_some())
        && !broker.access_restored()
    {
        access.delete_user("guest");
    }
    for v in &config.vhosts {
        let mut record = access
            .vhost(&v.name)
            .cloned()
            .unwrap_or_else(|| VhostRecord::new(&v.name));
        if !v.description.is_empty() {
            record.description = v.description.clone();
        }
        record.limits = VhostLimits {
            max_connections: v.max_connections.and_then(limit_from_i64),
            ..record.limits
        };
        access.put_vhost(record);
        broker.add_vhost(&v.name);
    }
    for u in &config.users {
        let password = u
            .credential()
            .map_err(|m| err(format!("user '{}': {m}", u.name)))?;
        let tags = parse_tags(u.tags.iter().map(String::as_str))
            .map_err(|e| err(format!("user '{}': {e}", u.name)))?;
        access.put_user(UserRecord {
            name: u.name.clone(),
            password,
            tags,
            limits: UserLimits {
                max_connections: u.max_connections.and_then(limit_from_i64),
                max_channels: u.max_channels.and_then(limit_from_i64),
            },
        });
    }
    if config.permissions.is_empty() {
        for u in &config.users {
            access
                .set_permissions(&u.name, "/", Permissions::full())
                .map_err(|e| err(format!("permissions of '{}' in '/': {e}", u.name)))?;
        }
    }
    for p in &config.permissions {
        let perms = Permissions::new(&p.configure, &p.write, &p.read)
            .map_err(|e| err(format!("permissions of '{}' in '{}': {e}", p.user, p.vhost)))?;
        access
            .set_permissions(&p.user, &p.vhost, perms)
            .map_err(|e| err(format!("permissions of '{}' in '{}': {e}", p.user, p.vhost)))?;
    }
    for t in &config.topic_permissions {
        access
            .set_topic_permissions(&t.user, &t.vhost, &t.exchange, &t.write, &t.read)
            .map_err(|e| {
                err(format!(
                    "topic permissions of '{}' in '{}' on '{}': {e}",
                    t.user, t.vhost, t.exchange
                ))
            })?;
    }
    Ok(())
}

/// Imports the RabbitMQ definitions file at `path` into `broker` (idempotent: see
/// [`warren_broker::definitions::import`]).
///
/// Errors: [`ProvisionError::Definitions`]: the file cannot be read or parsed, fails
/// validation (nothing is applied then), or a change is refused (the ones before it stay).
pub fn load_definitions(broker: &Broker, path: &Path) -> Result<AppliedImport, ProvisionError> {
    let fail = |message: String| ProvisionError::Definitions {
        path: path.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(path).map_err(|e| fail(format!("cannot read: {e}")))?;
    let defs = Definitions::from_json(&text).map_err(|e| fail(e.to_string()))?;
    let plan = plan_import(&defs).map_err(|e| fail(e.to_string()))?;
    broker.apply_import(&plan).map_err(|e| fail(e.to_string()))
}
