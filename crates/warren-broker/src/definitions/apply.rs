//! Applying an import plan to a running [`Broker`]: access-control changes go to its
//! access-control database, vhosts are created in both, and exchanges, queues and bindings go
//! through the same declare and bind calls a client's methods use, so an imported queue is
//! exactly the queue a client would have declared (durable ones are stored as usual).
//!
//! Each change is idempotent (see [`super::import`]): importing the same file at every start
//! changes nothing the second time.

use tracing::warn;

use crate::access::AccessError;
use crate::broker::Broker;
use crate::error::BrokerError;
use crate::exchange::Destination;
use crate::vhost::{ExchangeDeclare, QueueDeclare};

use super::format::DestinationType;
use super::import::{Change, ImportPlan};

/// The connection id imports declare with: no client connection has it, so nothing imported is
/// exclusive to one.
const IMPORT_CONNECTION_ID: u64 = 0;

/// What an import did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppliedImport {
    /// Users created or replaced.
    pub users: usize,
    /// Vhosts created or updated.
    pub vhosts: usize,
    /// Permissions and topic permissions set.
    pub permissions: usize,
    /// Exchanges declared (existing ones are not counted).
    pub exchanges: usize,
    /// Queues declared (existing ones are not counted).
    pub queues: usize,
    /// Bindings added or already present.
    pub bindings: usize,
    /// Policies created or replaced.
    pub policies: usize,
    /// Entries left out, each with its reason (queue types Warren lacks, runtime parameters,
    /// which Warren keeps no use for yet, and what the plan skipped).
    pub skipped: Vec<String>,
}

/// Why a change of an import could not be applied. Changes before it stay applied; importing
/// the corrected file again completes the import.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// A user, vhost or permission change was refused.
    #[error("{what}: {source}")]
    Access {
        /// The change, e.g. `permissions of 'app' in 'staging'`.
        what: String,
        /// Why.
        source: AccessError,
    },
    /// A declare or bind was refused by the broker.
    #[error("{what}: {source}")]
    Broker {
        /// The change, e.g. `queue 'q' in vhost 'v'`.
        what: String,
        /// Why (the reply the broker would give a client).
        source: BrokerError,
    },
}

impl Broker {
    /// Applies `plan` in order. See the module docs.
    ///
    /// Errors: [`ApplyError`] naming the first change that failed (an unknown exchange type, a
    /// queue whose arguments the broker refuses, a binding to a missing queue).
    pub fn apply_import(&self, plan: &ImportPlan) -> Result<AppliedImport, ApplyError> {
        let mut done = AppliedImport {
            skipped: plan
                .skipped
                .iter()
                .map(|s| {
                    format!(
                        "{} '{}' in vhost '{}': {}",
                        s.kind, s.name, s.vhost, s.reason
                    )
                })
                .collect(),
            ..Default::default()
        };
        // Queues left out (a type this broker lacks): bindings to them are left out too.
        let mut left_out = std::collections::HashSet::new();
        for change in plan.changes.iter() {
            self.apply_change(change, &mut done, &mut left_out)?;
        }
        Ok(done)
    }

    fn apply_change(
        &self,
        change: &Change,
        done: &mut AppliedImport,
        left_out: &mut std::collections::HashSet<(String, String)>,
    ) -> Result<(), ApplyError> {
        let access_err = |what: String| move |source| ApplyError::Access { what, source };
        let vhost = |name: &str, what: &dyn Fn() -> String| {
            self.vhost(name).ok_or_else(|| ApplyError::Broker {
                what: what(),
                source: BrokerError::not_found(format!("no vhost '{name}'")),
            })
        };
        match change {
            Change::PutUser(_)
            | Change::PutVhost(_)
            | Change::SetVhostLimits { .. }
            | Change::SetGlobalParameter { .. }
            | Change::SetPermissions { .. }
            | Change::SetTopicPermissions { .. } => {
                let what = describe(change);
                change
                    .apply_to_access(&mut self.access_mut())
                    .map_err(access_err(what))?;
                match change {
                    Change::PutUser(_) => done.users += 1,
                    Change::PutVhost(v) => {
                        self.add_vhost(&v.name);
                        done.vhosts += 1;
                    }
                    Change::SetVhostLimits { .. } | Change::SetGlobalParameter { .. } => {}
                    _ => done.permissions += 1,
                }
            }
            Change::DeclareExchange(x) => {
                let what = || format!("exchange '{}' in vhost '{}'", x.name, x.vhost);
                let vh = vhost(&x.vhost, &what)?;
                if !vh.exchange_exists(&x.name) {
                    vh.declare_exchange(&ExchangeDeclare {
                        name: x.name.clone(),
                        kind: x.kind.clone(),
                        passive: false,
                        durable: x.durable,
                        auto_delete: x.auto_delete,
                        internal: x.internal,
                        arguments: x.arguments.clone(),
                    })
                    .map_err(|source| ApplyError::Broker {
                        what: what(),
                        source,
                    })?;
                    done.exchanges += 1;
                }
            }
            Change::DeclareQueue(q) => {
                let what = || format!("queue '{}' in vhost '{}'", q.name, q.vhost);
                let vh = vhost(&q.vhost, &what)?;
                let mut arguments = q.arguments.clone();
                if let Some(t) = q.queue_type.as_deref().filter(|t| *t != "classic") {
                    if !vh.has_queue_kind(t) {
                        warn!(
                            queue = %q.name,
                            vhost = %q.vhost,
                            "definitions: queue type '{t}' is not supported; queue not imported"
                        );
                        done.skipped
                            .push(format!("{}: unsupported queue type '{t}'", what()));
                        left_out.insert((q.vhost.clone(), q.name.clone()));
                        return Ok(());
                    }
                    if !arguments.contains_key("x-queue-type") {
                        arguments.insert(
                            "x-queue-type",
                            warren_amqp::table::FieldValue::LongString(
                                bytes::Bytes::copy_from_slice(t.as_bytes()),
                            ),
                        );
                    }
                }
                if vh.queue(&q.name, IMPORT_CONNECTION_ID).is_err() {
                    vh.declare_queue(
                        &QueueDeclare {
                            name: q.name.clone(),
                            passive: false,
                            durable: q.durable,
                            exclusive: false,
                            auto_delete: q.auto_delete,
                            arguments,
                        },
                        IMPORT_CONNECTION_ID,
                    )
                    .map_err(|source| ApplyError::Broker {
                        what: what(),
                        source,
                    })?;
                    done.queues += 1;
                }
            }
            Change::Bind(b) => {
                let what = || {
                    format!(
                        "binding of '{}' to '{}' with key '{}' in vhost '{}'",
                        b.source, b.destination, b.routing_key, b.vhost
                    )
                };
                let vh = vhost(&b.vhost, &what)?;
                if b.destination_type == DestinationType::Queue
                    && left_out.contains(&(b.vhost.clone(), b.destination.clone()))
                {
                    warn!(
                        vhost = %b.vhost,
                        queue = %b.destination,
                        "definitions: binding to a queue not imported; binding not imported"
                    );
                    done.skipped
                        .push(format!("{}: its queue was not imported", what()));
                    return Ok(());
                }
                let destination = match b.destination_type {
                    DestinationType::Queue => Destination::Queue(b.destination.as_str().into()),
                    DestinationType::Exchange => {
                        Destination::Exchange(b.destination.as_str().into())
                    }
                };
                vh.bind(
                    &b.source,
                    destination,
                    &b.routing_key,
                    &b.arguments,
                    IMPORT_CONNECTION_ID,
                )
                .map_err(|source| ApplyError::Broker {
                    what: what(),
                    source,
                })?;
                done.bindings += 1;
            }
            Change::SetPolicy(p) => {
                let what = || format!("policy '{}' in vhost '{}'", p.name, p.vhost);
                let body = serde_json::json!({
                    "pattern": p.pattern,
                    "apply-to": p.apply_to,
                    "priority": p.priority,
                    "definition": p.definition,
                });
                let policy = crate::policy::Policy::from_json(&p.name, &body, p.operator).map_err(
                    |reason| ApplyError::Broker {
                        what: what(),
                        source: BrokerError::precondition_failed(reason.trim_end().to_string()),
                    },
                )?;
                let vh = self.vhost(&p.vhost).ok_or_else(|| ApplyError::Broker {
                    what: what(),
                    source: BrokerError::not_found(format!("no vhost '{}'", p.vhost)),
                })?;
                vh.set_policy(p.operator, policy)
                    .map_err(|source| ApplyError::Broker {
                        what: what(),
                        source,
                    })?;
                done.policies += 1;
            }
            Change::SetParameter {
                vhost,
                component,
                name,
                ..
            } => done.skipped.push(format!(
                "parameter {component}/{name} in vhost '{vhost}': not applied yet"
            )),
        }
        Ok(())
    }
}

fn describe(change: &Change) -> String {
    match change {
        Change::PutUser(u) => format!("user '{}'", u.name),
        Change::PutVhost(v) => format!("vhost '{}'", v.name),
        Change::SetVhostLimits { vhost, .. } => format!("limits of vhost '{vhost}'"),
        Change::SetPermissions { user, vhost, .. } => {
            format!("permissions of '{user}' in vhost '{vhost}'")
        }
        Change::SetTopicPermissions {
            user,
            vhost,
            exchange,
            ..
        } => format!("topic permissions of '{user}' in vhost '{vhost}' on '{exchange}'"),
        other => format!("{other:?}"),
    }
}
