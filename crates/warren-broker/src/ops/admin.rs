//! Operations on the broker as a whole: vhosts, users, permissions, topic permissions and
//! client connections, for operators (the management API; a CLI later).
//!
//! Each call is authorized like every other operation, by [`required_access`] over an
//! [`Operation`] (administrator for users, vhosts and permissions; the owner, a monitoring
//! user or an administrator for a connection), then applied to the access-control database
//! and, for a durable broker, stored at once: the whole database is written to
//! `<data_dir>/access.json` in RabbitMQ's definitions format, which the next start loads
//! before the configuration's `[[users]]` (see docs/security.md, "Users changed at run
//! time"). A change is answered only once it is on disk.
//!
//! Deleting a vhost closes its connections with 320 CONNECTION_FORCED `vhost '<v>' is
//! deleted` and removes its queues, exchanges, bindings and stored messages; deleting a user
//! closes that user's connections with `user '<u>' is deleted`.
//!
//! These calls write files and wait for the definitions writer: call them off the async
//! runtime's threads (`spawn_blocking`).

use crate::access::operation::required_access;
use std::collections::HashSet;

use crate::access::{Operation, Permissions, UserRecord, VhostRecord};
use crate::broker::Broker;
use crate::definitions::format::DestinationType;
use crate::definitions::{AppliedImport, Change, ImportPlan};
use crate::error::{BrokerError, Result};
use crate::exchange::ExchangeKind;
use crate::ops::Actor;

/// The reason given to the connections of a deleted vhost (RabbitMQ's `rabbit_vhost`).
pub fn vhost_deleted_reason(vhost: &str) -> String {
    format!("vhost '{vhost}' is deleted")
}

/// The reason given to the connections of a deleted user.
pub fn user_deleted_reason(user: &str) -> String {
    format!("user '{user}' is deleted")
}

/// `actor`'s operations on the broker as a whole.
#[derive(Clone, Copy)]
pub struct Admin<'a> {
    broker: &'a Broker,
    actor: &'a Actor,
}

impl<'a> Admin<'a> {
    /// `actor`'s broker-wide operations on `broker`.
    pub fn new(broker: &'a Broker, actor: &'a Actor) -> Self {
        Admin { broker, actor }
    }

    /// Decides whether the actor may perform `op`.
    ///
    /// Errors: 403 ACCESS_REFUSED with the management refusal's reason ("Not administrator
    /// user", "User not authorised to access object", ...).
    pub fn authorize(&self, op: &Operation<'_>) -> Result<()> {
        if required_access(op).is_none() {
            return Ok(());
        }
        self.broker
            .access()
            .check(&self.actor.user, &self.actor.vhost, op)
    }

    /// Writes the access-control database to the data directory (durable brokers) and, in a
    /// cluster, replicates it to the other nodes and waits until that is committed (see
    /// [`crate::replica`]).
    ///
    /// Errors: 541 INTERNAL_ERROR when it could not be stored or replicated.
    fn store(&self) -> Result<()> {
        let json = crate::definitions::export::export_access(&self.broker.access()).to_json();
        self.broker.store_access(&json).map_err(|e| {
            BrokerError::internal(format!(
                "the access-control database could not be stored: {e}"
            ))
        })?;
        let Some(r) = self.broker.replicator() else {
            return Ok(());
        };
        let Some(delta) = self.broker.access_change(&json) else {
            return Ok(());
        };
        let (tx, rx) = std::sync::mpsc::channel();
        r.access(
            delta,
            Box::new(move |outcome| {
                let _ = tx.send(outcome);
            }),
        );
        rx.recv()
            .unwrap_or_else(|_| Err("the cluster is stopping".into()))
            .map_err(|e| {
                BrokerError::internal(format!(
                    "the access-control database could not be replicated: {e}"
                ))
            })
    }

    // --- Connections ---

    /// May the actor see a connection of `owner`? (monitoring, administrator, or its owner)
    pub fn may_view_connection(&self, owner: &str) -> Result<()> {
        self.authorize(&Operation::ConnectionView { owner })
    }

    /// Closes the connection named `name` with 320 CONNECTION_FORCED and `reason`.
    ///
    /// Errors: 404 when there is no such connection; the refusal of
    /// [`Operation::ConnectionForceClose`] (administrator or its owner).
    pub fn close_connection(&self, name: &str, reason: &str) -> Result<()> {
        let registry = self.broker.registry();
        let owner = registry
            .connection(name)
            .map(|c| c.details.user.clone())
            .ok_or_else(|| BrokerError::not_found(format!("no connection '{name}'")))?;
        self.authorize(&Operation::ConnectionForceClose { owner: &owner })?;
        tracing::info!(connection = name, by = %self.actor.user, "closing connection: {reason}");
        if registry.close_connection(name, reason) {
            Ok(())
        } else {
            Err(BrokerError::not_found(format!("no connection '{name}'")))
        }
    }

    // --- Vhosts ---

    /// Creates vhost `record.name` (or updates its description, tags and default queue
    /// type, keeping its limits). Returns true when it was created.
    ///
    /// Errors: not an administrator; the database could not be stored.
    pub fn put_vhost(&self, record: VhostRecord) -> Result<bool> {
        self.authorize(&Operation::VhostPut {
            vhost: &record.name,
        })?;
        let name = record.name.clone();
        let created = {
            let mut access = self.broker.access_mut();
            let old = access.vhost(&name).cloned();
            let limits = old.as_ref().map(|o| o.limits).unwrap_or(record.limits);
            access.put_vhost(VhostRecord { limits, ..record });
            old.is_none()
        };
        self.broker.add_vhost(&name);
        self.store()?;
        if created {
            tracing::info!(vhost = %name, by = %self.actor.user, "vhost created");
        }
        Ok(created)
    }

    /// Deletes vhost `name`: its permissions, its connections (closed with 320), its queues,
    /// exchanges, bindings and stored messages.
    ///
    /// Errors: 404 when it does not exist; not an administrator; the change could not be
    /// stored.
    pub fn delete_vhost(&self, name: &str) -> Result<()> {
        self.authorize(&Operation::VhostDelete { vhost: name })?;
        let had_record = self.broker.access_mut().delete_vhost(name);
        // No new connection gets in from here on (connection.open needs the record);
        // those open now are closed.
        let reason = vhost_deleted_reason(name);
        self.broker
            .registry()
            .close_where(|c| c.vhost == name, &reason);
        let had_topology = self.broker.remove_vhost(name).map_err(|e| {
            BrokerError::internal(format!(
                "vhost '{name}' deleted, but its definitions could not be removed: {e}"
            ))
        })?;
        if !had_record && !had_topology {
            return Err(BrokerError::not_found(format!("no vhost '{name}'")));
        }
        self.store()?;
        tracing::info!(vhost = %name, by = %self.actor.user, "vhost deleted");
        Ok(())
    }

    // --- Users ---

    /// Creates or replaces user `record.name` (keeping an existing user's limits). Returns
    /// true when it was created.
    ///
    /// Errors: not an administrator; the database could not be stored.
    pub fn put_user(&self, record: UserRecord) -> Result<bool> {
        self.authorize(&Operation::UserPut { user: &record.name })?;
        let name = record.name.clone();
        let created = {
            let mut access = self.broker.access_mut();
            let old = access.user(&name).map(|u| u.limits);
            access.put_user(UserRecord {
                limits: old.unwrap_or(record.limits),
                ..record
            });
            old.is_none()
        };
        self.store()?;
        tracing::info!(user = %name, by = %self.actor.user, created, "user stored");
        Ok(created)
    }

    /// Deletes user `name` with its permissions, and closes its connections.
    ///
    /// Errors: 404 when there is no such user; not an administrator; the change could not
    /// be stored.
    pub fn delete_user(&self, name: &str) -> Result<()> {
        self.authorize(&Operation::UserDelete { user: name })?;
        if !self.broker.access_mut().delete_user(name) {
            return Err(BrokerError::not_found(format!("no user '{name}'")));
        }
        let reason = user_deleted_reason(name);
        self.broker
            .registry()
            .close_where(|c| c.user == name, &reason);
        self.store()?;
        tracing::info!(user = %name, by = %self.actor.user, "user deleted");
        Ok(())
    }

    // --- Permissions ---

    /// Sets `user`'s permissions in `vhost`. Returns true when the user had none there.
    ///
    /// Errors: not an administrator; 404 for an unknown user or vhost; the database could
    /// not be stored.
    pub fn set_permissions(&self, user: &str, vhost: &str, perms: Permissions) -> Result<bool> {
        self.authorize(&Operation::PermissionsSet { user, vhost })?;
        let created = {
            let mut access = self.broker.access_mut();
            let created = access.permissions(user, vhost).is_none();
            access
                .set_permissions(user, vhost, perms)
                .map_err(|e| BrokerError::not_found(e.to_string()))?;
            created
        };
        self.store()?;
        Ok(created)
    }

    /// Clears `user`'s permissions in `vhost`.
    ///
    /// Errors: not an administrator; 404 when there were none; the change could not be
    /// stored.
    pub fn clear_permissions(&self, user: &str, vhost: &str) -> Result<()> {
        self.authorize(&Operation::PermissionsClear { user, vhost })?;
        if !self.broker.access_mut().clear_permissions(user, vhost) {
            return Err(BrokerError::not_found(format!(
                "no permissions for user '{user}' in vhost '{vhost}'"
            )));
        }
        self.store()
    }

    /// Sets `user`'s topic permissions on `exchange` in `vhost` (write and read patterns on
    /// routing keys).
    ///
    /// Errors: not an administrator; 404 for an unknown user or vhost, 400 for a bad
    /// pattern; the database could not be stored.
    pub fn set_topic_permissions(
        &self,
        user: &str,
        vhost: &str,
        exchange: &str,
        write: &str,
        read: &str,
    ) -> Result<()> {
        self.authorize(&Operation::TopicPermissionsSet {
            user,
            vhost,
            exchange,
        })?;
        {
            let mut access = self.broker.access_mut();
            if access.user(user).is_none() || access.vhost(vhost).is_none() {
                return Err(BrokerError::not_found(format!(
                    "no user '{user}' or no vhost '{vhost}'"
                )));
            }
            access
                .set_topic_permissions(user, vhost, exchange, write, read)
                .map_err(|e| BrokerError::precondition_failed(e.to_string()))?;
        }
        self.store()
    }

    /// Clears `user`'s topic permissions in `vhost` on `exchange` (all exchanges: `None`).
    ///
    /// Errors: not an administrator; 404 when there were none; the change could not be
    /// stored.
    pub fn clear_topic_permissions(
        &self,
        user: &str,
        vhost: &str,
        exchange: Option<&str>,
    ) -> Result<()> {
        self.authorize(&Operation::TopicPermissionsClear {
            user,
            vhost,
            exchange,
        })?;
        if !self
            .broker
            .access_mut()
            .clear_topic_permissions(user, vhost, exchange)
        {
            return Err(BrokerError::not_found(format!(
                "no topic permissions for user '{user}' in vhost '{vhost}'"
            )));
        }
        self.store()
    }

    // --- Runtime parameters ---

    /// Sets vhost `vhost`'s limits, RabbitMQ's `vhost-limits` runtime parameter `limits`
    /// (`PUT /api/parameters/vhost-limits/<vhost>/limits`). Returns true when the vhost had
    /// no limits before.
    ///
    /// Errors: 403 unless the actor is an administrator, or a policymaker with access to
    /// the vhost (rabbit_mgmt_wm_parameter); 404 no vhost; the database could not be stored.
    pub fn set_vhost_limits(
        &self,
        vhost: &str,
        limits: crate::access::VhostLimits,
    ) -> Result<bool> {
        self.authorize(&Operation::ParameterPut {
            vhost,
            component: crate::definitions::VHOST_LIMITS_COMPONENT,
            name: "limits",
        })?;
        let was_unset = {
            let mut access = self.broker.access_mut();
            let old = access
                .vhost(vhost)
                .map(|v| v.limits)
                .ok_or_else(|| BrokerError::not_found(format!("no vhost '{vhost}'")))?;
            access
                .set_vhost_limits(vhost, limits)
                .map_err(|e| BrokerError::not_found(e.to_string()))?;
            old == crate::access::VhostLimits::default()
        };
        self.store()?;
        Ok(was_unset)
    }

    /// Clears vhost `vhost`'s limits (`DELETE /api/parameters/vhost-limits/<vhost>/limits`).
    ///
    /// Errors: as [`Admin::set_vhost_limits`]; 404 when it has none.
    pub fn clear_vhost_limits(&self, vhost: &str) -> Result<()> {
        self.authorize(&Operation::ParameterDelete {
            vhost,
            component: crate::definitions::VHOST_LIMITS_COMPONENT,
            name: "limits",
        })?;
        {
            let mut access = self.broker.access_mut();
            let unset = access
                .vhost(vhost)
                .is_none_or(|v| v.limits == crate::access::VhostLimits::default());
            if unset {
                return Err(BrokerError::not_found("Parameter does not exist"));
            }
            access
                .set_vhost_limits(vhost, crate::access::VhostLimits::default())
                .map_err(|e| BrokerError::not_found(e.to_string()))?;
        }
        self.store()
    }

    /// Replaces user `user`'s limits (`max-connections`, `max-channels`; RabbitMQ's user
    /// limits, `PUT /api/user-limits/<user>/<name>`). Connections and channels already open
    /// stay open; the limits apply to those opened from then on.
    ///
    /// Errors: not an administrator; 404 for an unknown user; the database could not be
    /// stored.
    pub fn set_user_limits(&self, user: &str, limits: crate::access::UserLimits) -> Result<()> {
        self.authorize(&Operation::UserLimitsSet { user })?;
        self.broker
            .access_mut()
            .set_user_limits(user, limits)
            .map_err(|e| BrokerError::not_found(e.to_string()))?;
        self.store()?;
        tracing::info!(user, by = %self.actor.user, "user limits stored");
        Ok(())
    }

    /// Sets global runtime parameter `name` to `value` (any JSON), durably. Returns true
    /// when it was not set before.
    ///
    /// Errors: 403 unless the actor is a policymaker or administrator
    /// (rabbit_mgmt_wm_global_parameter); the database could not be stored.
    pub fn set_global_parameter(&self, name: &str, value: serde_json::Value) -> Result<bool> {
        self.authorize(&Operation::GlobalParameterPut { name })?;
        let created = self
            .broker
            .access_mut()
            .set_global_parameter(name, value)
            .is_none();
        self.store()?;
        Ok(created)
    }

    /// Clears global runtime parameter `name`.
    ///
    /// Errors: as [`Admin::set_global_parameter`]; 404 "Parameter does not exist".
    pub fn clear_global_parameter(&self, name: &str) -> Result<()> {
        self.authorize(&Operation::GlobalParameterDelete { name })?;
        if !self.broker.access_mut().clear_global_parameter(name) {
            return Err(BrokerError::not_found("Parameter does not exist"));
        }
        self.store()
    }

    // --- Definitions ---

    /// Imports a definitions plan (`POST /api/definitions`, `rabbitmqadmin import`): checks
    /// it whole against the broker as it is (see [`Admin::check_import`]), then applies it
    /// with [`Broker::apply_import`] (exchanges, queues, bindings and policies through the
    /// same calls a client's methods use, so durable ones are in the definitions log) and
    /// stores the access-control database. Idempotent: importing the same plan again
    /// changes nothing.
    ///
    /// Errors: not an administrator; 406 naming the first entry that cannot be applied
    /// (nothing is applied then, unless the broker refuses a declare the check cannot
    /// foresee, e.g. queue arguments: the changes before it stay, and importing the
    /// corrected file completes the import); the database could not be stored.
    pub fn import_definitions(&self, plan: &ImportPlan) -> Result<AppliedImport> {
        self.authorize(&Operation::DefinitionsImport)?;
        self.check_import(plan)?;
        let applied = self
            .broker
            .apply_import(plan)
            .map_err(|e| BrokerError::precondition_failed(e.to_string()));
        self.store()?;
        let applied = applied?;
        tracing::info!(
            by = %self.actor.user,
            users = applied.users,
            vhosts = applied.vhosts,
            permissions = applied.permissions,
            exchanges = applied.exchanges,
            queues = applied.queues,
            bindings = applied.bindings,
            policies = applied.policies,
            "definitions imported"
        );
        for s in &applied.skipped {
            tracing::info!("definitions: not imported: {s}");
        }
        Ok(applied)
    }

    /// Checks that every change of `plan` can be applied, changing nothing: the
    /// access-control changes are tried on a copy of the database; exchanges must have a
    /// known type, everything must be in a vhost that exists or that the plan creates,
    /// bindings must join exchanges and queues that exist or that the plan declares, and
    /// policies must be valid.
    ///
    /// Errors: 406 naming the entry and the reason.
    pub fn check_import(&self, plan: &ImportPlan) -> Result<()> {
        let refuse = |text: String| Err(BrokerError::precondition_failed(text));
        let mut access = self.broker.access().clone();
        let mut vhosts: HashSet<String> = self.broker.vhost_names().into_iter().collect();
        vhosts.extend(access.vhosts().map(|v| v.name.clone()));
        let mut exchanges: HashSet<(String, String)> = HashSet::new();
        let mut queues: HashSet<(String, String)> = HashSet::new();
        let no_vhost = |kind: &str, name: &str, vhost: &str| {
            format!("{kind} '{name}' in vhost '{vhost}': no vhost '{vhost}'")
        };
        let exchange_exists = |exchanges: &HashSet<(String, String)>, vhost: &str, name: &str| {
            name.is_empty()
                || name.starts_with("amq.")
                || exchanges.contains(&(vhost.to_string(), name.to_string()))
                || self
                    .broker
                    .vhost(vhost)
                    .is_some_and(|vh| vh.exchange_exists(name))
        };
        for change in &plan.changes {
            match change {
                Change::PutUser(_)
                | Change::PutVhost(_)
                | Change::SetVhostLimits { .. }
                | Change::SetGlobalParameter { .. }
                | Change::SetPermissions { .. }
                | Change::SetTopicPermissions { .. } => {
                    if let Err(e) = change.apply_to_access(&mut access) {
                        return refuse(format!("{}: {e}", describe_access(change)));
                    }
                    if let Change::PutVhost(v) = change {
                        vhosts.insert(v.name.clone());
                    }
                }
                Change::DeclareExchange(x) => {
                    if !vhosts.contains(&x.vhost) {
                        return refuse(no_vhost("exchange", &x.name, &x.vhost));
                    }
                    if ExchangeKind::parse(&x.kind).is_none() {
                        return refuse(format!(
                            "exchange '{}' in vhost '{}': unknown exchange type '{}'",
                            x.name, x.vhost, x.kind
                        ));
                    }
                    exchanges.insert((x.vhost.clone(), x.name.clone()));
                }
                Change::DeclareQueue(q) => {
                    if !vhosts.contains(&q.vhost) {
                        return refuse(no_vhost("queue", &q.name, &q.vhost));
                    }
                    // Every type counts here: quorum queues are declared, and queues of types
                    // Warren lacks are skipped when applied, with the bindings to them.
                    queues.insert((q.vhost.clone(), q.name.clone()));
                }
                Change::Bind(b) => {
                    let what = format!(
                        "binding of '{}' to '{}' with key '{}' in vhost '{}'",
                        b.source, b.destination, b.routing_key, b.vhost
                    );
                    if !vhosts.contains(&b.vhost) {
                        return refuse(format!("{what}: no vhost '{}'", b.vhost));
                    }
                    if !exchange_exists(&exchanges, &b.vhost, &b.source) {
                        return refuse(format!("{what}: no exchange '{}'", b.source));
                    }
                    let found = match b.destination_type {
                        DestinationType::Exchange => {
                            exchange_exists(&exchanges, &b.vhost, &b.destination)
                        }
                        DestinationType::Queue => {
                            queues.contains(&(b.vhost.clone(), b.destination.clone()))
                                || self
                                    .broker
                                    .vhost(&b.vhost)
                                    .is_some_and(|vh| vh.queue_exists(&b.destination))
                        }
                    };
                    if !found {
                        let kind = match b.destination_type {
                            DestinationType::Exchange => "exchange",
                            DestinationType::Queue => "queue",
                        };
                        return refuse(format!("{what}: no {kind} '{}'", b.destination));
                    }
                }
                Change::SetPolicy(p) => {
                    if !vhosts.contains(&p.vhost) {
                        return refuse(no_vhost("policy", &p.name, &p.vhost));
                    }
                    let body = serde_json::json!({
                        "pattern": p.pattern,
                        "apply-to": p.apply_to,
                        "priority": p.priority,
                        "definition": p.definition,
                    });
                    if let Err(reason) =
                        crate::policy::Policy::from_json(&p.name, &body, p.operator)
                    {
                        return refuse(format!(
                            "policy '{}' in vhost '{}': {}",
                            p.name,
                            p.vhost,
                            reason.trim_end()
                        ));
                    }
                }
                Change::SetParameter { .. } => {}
            }
        }
        Ok(())
    }
}

fn describe_access(change: &Change) -> String {
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
        _ => String::from("change"),
    }
}
