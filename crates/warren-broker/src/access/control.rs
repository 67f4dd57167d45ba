//! The access-control database and the one function that answers "may this user do that?".
//!
//! [`AccessControl`] holds users, vhost records, permissions and topic permissions, and checks
//! an [`Operation`] against them with RabbitMQ's reply codes and texts. It is plain data without
//! locks or I/O: the broker keeps it behind whatever lock or snapshot scheme it chooses, and
//! every check takes `&self` and allocates only to build a refusal.
//!
//! Refusals (texts of RabbitMQ 4.x; `rabbit_access_control.erl`, `rabbit_reader.erl`,
//! `rabbit_channel.erl`):
//! - resource: 403 ACCESS_REFUSED `<perm> access to <kind> '<name>' in vhost '<v>' refused for
//!   user '<u>'` (RabbitMQ before 3.13 wrote no `<perm>` in front);
//! - topic: 403 ACCESS_REFUSED `<perm> access to topic '<key>' in exchange '<x>' in vhost '<v>'
//!   refused for user '<u>'`;
//! - vhost at connection.open: 530 NOT_ALLOWED `access to vhost '<v>' refused for user '<u>'`,
//!   or `vhost <v> not found`;
//! - `user_id` mismatch: 406 PRECONDITION_FAILED `user_id property set to '<claimed>' but
//!   authenticated user was '<u>'`;
//! - management: 403 ACCESS_REFUSED with the reason texts of RabbitMQ's management API
//!   (`Not management user`, `Not administrator user`, ...), which that API sends as
//!   HTTP 401 `{"error":"not_authorised","reason":...}`.

use std::collections::HashMap;

use crate::error::{BrokerError, Result};

use super::limits::{UserLimits, VhostLimits};
use super::operation::{
    required_access, ManagementAccess, Need, Operation, Requirement, ResourceCheck, TopicCheck,
};
use super::password::{verify_password, HashingAlgorithm, SALT_LEN_BYTES};
use super::pattern::PatternError;
use super::permissions::{Permission, Permissions, TopicPermissions};
use super::user::{LoginError, UserRecord, UserTag};
use super::vhost::VhostRecord;

/// Why a change to the access-control database was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// The user does not exist.
    #[error("no such user '{0}'")]
    NoSuchUser(String),
    /// The vhost does not exist.
    #[error("no such vhost '{0}'")]
    NoSuchVhost(String),
    /// A permission pattern is unusable.
    #[error(transparent)]
    Pattern(#[from] PatternError),
}

/// The counts of open connections that connection.open's limit checks need, each *before* the
/// connection being opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpenConnections {
    /// Client connections open to the vhost.
    pub in_vhost: u64,
    /// Connections the user has open, over all vhosts.
    pub by_user: u64,
}

type ByVhost<T> = HashMap<String, T>;

/// Users, vhost records, permissions and topic permissions.
#[derive(Debug, Clone, Default)]
pub struct AccessControl {
    users: HashMap<String, UserRecord>,
    vhosts: HashMap<String, VhostRecord>,
    /// user -> vhost -> permissions.
    permissions: HashMap<String, ByVhost<Permissions>>,
    /// user -> vhost -> exchange -> topic permissions.
    topic_permissions: HashMap<String, ByVhost<HashMap<String, TopicPermissions>>>,
    /// RabbitMQ's global runtime parameters (`cluster_name`, ...): any JSON by name.
    global_parameters: std::collections::BTreeMap<String, serde_json::Value>,
}

impl AccessControl {
    /// An empty database: no users, no vhosts.
    pub fn new() -> Self {
        Self::default()
    }

    /// RabbitMQ's first-boot state: vhost `/`, user `guest` (password `guest`, tag
    /// `administrator`) with `.*` permissions on it (rabbitmq.com/docs/access-control, "Default
    /// Virtual Host and User"). Restricting `guest` to loopback connections is the listener's job.
    pub fn with_default_guest() -> Self {
        let mut ac = AccessControl::new();
        ac.put_vhost(VhostRecord::default_vhost());
        ac.put_user(UserRecord::with_password(
            "guest",
            "guest",
            vec![UserTag::Administrator],
        ));
        ac.set_permissions("guest", "/", Permissions::full())
            .expect("guest and / were just created");
        ac
    }

    // --- Authentication ---

    /// Checks a username and cleartext password (SASL PLAIN, AMQPLAIN). A blank password is
    /// refused outright; an unknown user costs the same hashing work as a known one, so timing
    /// does not reveal which names exist (`user_login_authentication/2` and
    /// `internal_check_user_login/2` in `rabbit_auth_backend_internal.erl`).
    pub fn authenticate(
        &self,
        name: &str,
        password: &str,
    ) -> std::result::Result<&UserRecord, LoginError> {
        if password.is_empty() {
            return Err(LoginError::BlankPassword(name.to_string()));
        }
        match self.users.get(name) {
            Some(user) if user.password.verify(password) => Ok(user),
            Some(_) => Err(LoginError::InvalidCredentials(name.to_string())),
            None => {
                let dummy = [0u8; SALT_LEN_BYTES + 32];
                let _ = verify_password(&dummy, HashingAlgorithm::default(), password);
                Err(LoginError::InvalidCredentials(name.to_string()))
            }
        }
    }

    // --- Checks ---

    /// Checks everything `op` needs that RabbitMQ checks before looking the resource up: vhost
    /// access, resource permissions (in RabbitMQ's order, the first refusal wins) and management
    /// tags. `vhost` is the vhost of the connection (AMQP) or of the request; management
    /// operations that name a vhost carry it themselves.
    ///
    /// For basic.publish, queue.bind, queue.unbind, exchange.bind and exchange.unbind, call
    /// [`AccessControl::check_after_lookup`] too, once the exchange is found.
    pub fn check(&self, user: &str, vhost: &str, op: &Operation<'_>) -> Result<()> {
        let req = required_access(op);
        if let Some(access) = req.management {
            self.check_management(user, access)?;
        }
        if req.vhost_access {
            self.check_vhost_access(user, vhost)?;
        }
        for check in req.resources() {
            self.check_resource(user, vhost, check)?;
        }
        Ok(())
    }

    /// The part of `op`'s checks that RabbitMQ makes after finding the exchange: topic
    /// permissions when that exchange is a topic exchange (`exchange_is_topic`: for publish the
    /// target exchange, for the binds the source), then a publish's `user_id`. A no-op for
    /// operations without such checks.
    pub fn check_after_lookup(
        &self,
        user: &str,
        vhost: &str,
        op: &Operation<'_>,
        exchange_is_topic: bool,
    ) -> Result<()> {
        let req: Requirement<'_> = required_access(op);
        if exchange_is_topic {
            if let Some(topic) = req.topic {
                self.check_topic(user, vhost, &topic)?;
            }
        }
        if let Some(claimed) = req.user_id {
            self.check_user_id(user, claimed)?;
        }
        Ok(())
    }

    /// connection.open in RabbitMQ's order (`handle_method0/2` in `rabbit_reader.erl`): the vhost
    /// must exist, then its connection limit, the user's connection limit, and the user's
    /// permissions in it. All refusals are 530 NOT_ALLOWED.
    pub fn check_connection_open(
        &self,
        user: &str,
        vhost: &str,
        open: OpenConnections,
    ) -> Result<()> {
        let record = self.vhost_or_not_found(vhost)?;
        record.limits.check_connection(vhost, user, open.in_vhost)?;
        if let Some(u) = self.users.get(user) {
            u.limits.check_connection(user, open.by_user)?;
        }
        self.check(user, vhost, &Operation::ConnectionOpen)
    }

    /// channel.open: the user's `max-channels` against `open_by_user`, the channels the user has
    /// open now on all connections (530 NOT_ALLOWED, closing the connection).
    pub fn check_channel_open(&self, user: &str, open_by_user: u64) -> Result<()> {
        match self.users.get(user) {
            Some(u) => u.limits.check_channel(user, open_by_user),
            None => Ok(()),
        }
    }

    /// A queue.declare that creates `queue`: the vhost's `max-queues` against `existing`, the
    /// queues it has now (406 PRECONDITION_FAILED). Not for a declare of an existing queue.
    pub fn check_new_queue(&self, vhost: &str, queue: &str, existing: u64) -> Result<()> {
        match self.vhosts.get(vhost) {
            Some(v) => v.limits.check_new_queue(queue, vhost, existing),
            None => Ok(()),
        }
    }

    /// True when `user` has a permissions entry in `vhost` (and both exist).
    pub fn has_vhost_access(&self, user: &str, vhost: &str) -> bool {
        self.vhosts.contains_key(vhost) && self.permissions(user, vhost).is_some()
    }

    fn vhost_or_not_found(&self, vhost: &str) -> Result<&VhostRecord> {
        self.vhosts
            .get(vhost)
            .ok_or_else(|| BrokerError::not_allowed(format!("vhost {vhost} not found")))
    }

    fn check_vhost_access(&self, user: &str, vhost: &str) -> Result<()> {
        self.vhost_or_not_found(vhost)?;
        if self.permissions(user, vhost).is_some() {
            Ok(())
        } else {
            Err(BrokerError::not_allowed(format!(
                "access to vhost '{vhost}' refused for user '{user}'"
            )))
        }
    }

    fn check_resource(&self, user: &str, vhost: &str, check: &ResourceCheck<'_>) -> Result<()> {
        let perms = self.permissions(user, vhost);
        let allowed = |p: Permission| perms.is_some_and(|perms| perms.allows(p, check.name));
        let (ok, reported) = match check.need {
            Need::Permission(p) => (allowed(p), p),
            Need::AnyPermission => (
                [Permission::Read, Permission::Write, Permission::Configure]
                    .into_iter()
                    .any(allowed),
                Permission::Configure,
            ),
        };
        if ok {
            Ok(())
        } else {
            Err(BrokerError::access_refused(format!(
                "{reported} access to {} '{}' in vhost '{vhost}' refused for user '{user}'",
                check.kind, check.name
            )))
        }
    }

    fn check_topic(&self, user: &str, vhost: &str, check: &TopicCheck<'_>) -> Result<()> {
        let Some(perms) = self.topic_permissions_on(user, vhost, check.exchange) else {
            return Ok(());
        };
        if perms.allows(check.permission, check.routing_key) {
            Ok(())
        } else {
            Err(BrokerError::access_refused(format!(
                "{} access to topic '{}' in exchange '{}' in vhost '{vhost}' refused for user '{user}'",
                check.permission, check.routing_key, check.exchange
            )))
        }
    }

    /// `check_user_id/2` in `rabbit_access_control.erl`.
    fn check_user_id(&self, user: &str, claimed: &str) -> Result<()> {
        let impersonator = self
            .users
            .get(user)
            .is_some_and(|u| u.has_tag(&UserTag::Impersonator));
        if claimed == user || impersonator {
            Ok(())
        } else {
            Err(BrokerError::precondition_failed(format!(
                "user_id property set to '{claimed}' but authenticated user was '{user}'"
            )))
        }
    }

    /// `rabbit_web_dispatch_access_control.erl`: a management user first, then the operation's
    /// own rule.
    fn check_management(&self, user: &str, access: ManagementAccess<'_>) -> Result<()> {
        let refuse = |reason: &str| Err(BrokerError::access_refused(reason));
        let Some(u) = self.users.get(user).filter(|u| u.is_management_user()) else {
            return refuse("Not management user");
        };
        match access {
            ManagementAccess::AnyManagementUser => Ok(()),
            ManagementAccess::Administrator if u.is_administrator() => Ok(()),
            ManagementAccess::Administrator => refuse("Not administrator user"),
            ManagementAccess::Monitoring if u.is_monitor() => Ok(()),
            ManagementAccess::Monitoring => refuse("Not monitor user"),
            ManagementAccess::VhostVisible { vhost }
                if u.is_monitor() || self.has_vhost_access(user, vhost) =>
            {
                Ok(())
            }
            ManagementAccess::VhostVisible { .. } => {
                refuse("User not authorised to access virtual host")
            }
            ManagementAccess::Policymaker { vhost }
                if u.is_administrator()
                    || (u.is_policymaker() && self.has_vhost_access(user, vhost)) =>
            {
                Ok(())
            }
            ManagementAccess::GlobalPolicymaker if u.is_policymaker() => Ok(()),
            ManagementAccess::MonitorOrOwner { owner } if u.is_monitor() || owner == user => Ok(()),
            ManagementAccess::AdministratorOrOwner { owner }
                if u.is_administrator() || owner == user =>
            {
                Ok(())
            }
            ManagementAccess::Policymaker { .. }
            | ManagementAccess::GlobalPolicymaker
            | ManagementAccess::MonitorOrOwner { .. }
            | ManagementAccess::AdministratorOrOwner { .. } => {
                refuse("User not authorised to access object")
            }
        }
    }

    // --- Reads ---

    /// A user.
    pub fn user(&self, name: &str) -> Option<&UserRecord> {
        self.users.get(name)
    }

    /// All users, in no particular order.
    pub fn users(&self) -> impl Iterator<Item = &UserRecord> {
        self.users.values()
    }

    /// A vhost record.
    pub fn vhost(&self, name: &str) -> Option<&VhostRecord> {
        self.vhosts.get(name)
    }

    /// All vhost records, in no particular order.
    pub fn vhosts(&self) -> impl Iterator<Item = &VhostRecord> {
        self.vhosts.values()
    }

    /// `user`'s permissions in `vhost`.
    pub fn permissions(&self, user: &str, vhost: &str) -> Option<&Permissions> {
        self.permissions.get(user)?.get(vhost)
    }

    /// Every permissions entry as (user, vhost, permissions), in no particular order.
    pub fn all_permissions(&self) -> impl Iterator<Item = (&str, &str, &Permissions)> {
        self.permissions.iter().flat_map(|(user, by_vhost)| {
            by_vhost
                .iter()
                .map(move |(vhost, p)| (user.as_str(), vhost.as_str(), p))
        })
    }

    /// `user`'s topic permissions on `exchange` in `vhost`.
    pub fn topic_permissions_on(
        &self,
        user: &str,
        vhost: &str,
        exchange: &str,
    ) -> Option<&TopicPermissions> {
        self.topic_permissions.get(user)?.get(vhost)?.get(exchange)
    }

    /// Every topic permissions entry as (user, vhost, permissions), in no particular order.
    pub fn all_topic_permissions(&self) -> impl Iterator<Item = (&str, &str, &TopicPermissions)> {
        self.topic_permissions.iter().flat_map(|(user, by_vhost)| {
            by_vhost.iter().flat_map(move |(vhost, by_x)| {
                by_x.values()
                    .map(move |t| (user.as_str(), vhost.as_str(), t))
            })
        })
    }

    // --- Changes ---

    /// Adds or replaces a user (with its credential, tags and limits). Returns the previous one.
    pub fn put_user(&mut self, user: UserRecord) -> Option<UserRecord> {
        self.users.insert(user.name.clone(), user)
    }

    /// Deletes a user with its permissions and topic permissions. False if there was none.
    pub fn delete_user(&mut self, name: &str) -> bool {
        self.permissions.remove(name);
        self.topic_permissions.remove(name);
        self.users.remove(name).is_some()
    }

    /// Replaces a user's limits.
    pub fn set_user_limits(
        &mut self,
        user: &str,
        limits: UserLimits,
    ) -> std::result::Result<(), AccessError> {
        let u = self
            .users
            .get_mut(user)
            .ok_or_else(|| AccessError::NoSuchUser(user.to_string()))?;
        u.limits = limits;
        Ok(())
    }

    /// Adds or replaces a vhost record. Returns the previous one.
    pub fn put_vhost(&mut self, vhost: VhostRecord) -> Option<VhostRecord> {
        self.vhosts.insert(vhost.name.clone(), vhost)
    }

    /// Deletes a vhost record and every permission in it. False if there was none.
    pub fn delete_vhost(&mut self, name: &str) -> bool {
        for by_vhost in self.permissions.values_mut() {
            by_vhost.remove(name);
        }
        for by_vhost in self.topic_permissions.values_mut() {
            by_vhost.remove(name);
        }
        self.vhosts.remove(name).is_some()
    }

    /// The global runtime parameters, by name.
    pub fn global_parameters(&self) -> impl Iterator<Item = (&str, &serde_json::Value)> {
        self.global_parameters.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// Global runtime parameter `name`.
    pub fn global_parameter(&self, name: &str) -> Option<&serde_json::Value> {
        self.global_parameters.get(name)
    }

    /// Sets global runtime parameter `name`; returns the previous value.
    pub fn set_global_parameter(
        &mut self,
        name: &str,
        value: serde_json::Value,
    ) -> Option<serde_json::Value> {
        self.global_parameters.insert(name.to_string(), value)
    }

    /// Clears global runtime parameter `name`; false when it was not set.
    pub fn clear_global_parameter(&mut self, name: &str) -> bool {
        self.global_parameters.remove(name).is_some()
    }

    /// Replaces a vhost's limits.
    pub fn set_vhost_limits(
        &mut self,
        vhost: &str,
        limits: VhostLimits,
    ) -> std::result::Result<(), AccessError> {
        let v = self
            .vhosts
            .get_mut(vhost)
            .ok_or_else(|| AccessError::NoSuchVhost(vhost.to_string()))?;
        v.limits = limits;
        Ok(())
    }

    /// Sets `user`'s permissions in `vhost`; both must exist.
    pub fn set_permissions(
        &mut self,
        user: &str,
        vhost: &str,
        permissions: Permissions,
    ) -> std::result::Result<(), AccessError> {
        self.require(user, vhost)?;
        self.permissions
            .entry(user.to_string())
            .or_default()
            .insert(vhost.to_string(), permissions);
        Ok(())
    }

    /// Clears `user`'s permissions in `vhost`. False if there were none.
    pub fn clear_permissions(&mut self, user: &str, vhost: &str) -> bool {
        self.permissions
            .get_mut(user)
            .is_some_and(|by_vhost| by_vhost.remove(vhost).is_some())
    }

    /// Sets `user`'s topic permissions on `exchange` in `vhost`, compiling the patterns with
    /// `{username}` and `{vhost}` expanded; user and vhost must exist.
    pub fn set_topic_permissions(
        &mut self,
        user: &str,
        vhost: &str,
        exchange: &str,
        write: &str,
        read: &str,
    ) -> std::result::Result<(), AccessError> {
        self.require(user, vhost)?;
        let perms = TopicPermissions::new(user, vhost, exchange, write, read)?;
        self.topic_permissions
            .entry(user.to_string())
            .or_default()
            .entry(vhost.to_string())
            .or_default()
            .insert(exchange.to_string(), perms);
        Ok(())
    }

    /// Clears `user`'s topic permissions in `vhost` on `exchange`, or on every exchange (`None`).
    /// False if there were none.
    pub fn clear_topic_permissions(
        &mut self,
        user: &str,
        vhost: &str,
        exchange: Option<&str>,
    ) -> bool {
        let Some(by_vhost) = self.topic_permissions.get_mut(user) else {
            return false;
        };
        match exchange {
            None => by_vhost.remove(vhost).is_some_and(|by_x| !by_x.is_empty()),
            Some(x) => by_vhost
                .get_mut(vhost)
                .is_some_and(|by_x| by_x.remove(x).is_some()),
        }
    }

    fn require(&self, user: &str, vhost: &str) -> std::result::Result<(), AccessError> {
        if !self.users.contains_key(user) {
            return Err(AccessError::NoSuchUser(user.to_string()));
        }
        if !self.vhosts.contains_key(vhost) {
            return Err(AccessError::NoSuchVhost(vhost.to_string()));
        }
        Ok(())
    }
}
