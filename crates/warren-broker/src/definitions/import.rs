//! Importing a definitions file as a list of plain changes.
//!
//! [`plan_import`] validates a parsed file and turns it into [`Change`]s: put a user, put a
//! vhost, set limits, set permissions, declare an exchange or a queue, bind, set a policy or a
//! parameter. It touches nothing; the broker applies the changes (the access-control ones with
//! [`Change::apply_to_access`]). Validation happens here, up front, so a bad file is refused
//! whole instead of half-applied.
//!
//! Importing is idempotent, as RabbitMQ's is (`apply_defs/3` in `rabbit_definitions.erl`): every
//! change is an upsert or an "ensure", so applying a plan twice, or importing a file into a
//! broker that already holds its contents, leaves the same state. In detail:
//! - users, vhosts, permissions, topic permissions, limits, policies and parameters are put:
//!   created or replaced;
//! - an exchange or a queue is declared only if no exchange or queue of that name exists in the
//!   vhost; an existing one is left as it is, with no equivalence check (RabbitMQ's import does
//!   the same);
//! - a binding is added unless the same binding exists.
//!
//! The plan keeps RabbitMQ's order: users, vhosts, permissions, exchanges, topic permissions,
//! global parameters, policies, parameters, queues, bindings. As RabbitMQ does, it skips the
//! default exchange, exchanges and queues whose names begin with `amq.` (reported in
//! [`ImportPlan::skipped`]), and refuses a whole-broker file with a queue, exchange or binding
//! that names no vhost (such files come from a vhost export: use [`plan_vhost_import`]).
//!
//! A user's cleartext `password`, accepted by RabbitMQ's import, is hashed here with a fresh salt
//! (SHA-256), so no cleartext travels further; that is the one non-deterministic step.

use std::collections::HashSet;

use rand::RngCore;
use serde_json::Value;
use warren_amqp::table::FieldTable;

use super::arguments::{json_to_table, ArgumentError};
use super::format::{
    BindingDefinition, Definitions, DestinationType, ExchangeDefinition, LimitsDefinition, Object,
    ParameterDefinition, PolicyDefinition, QueueDefinition, UserDefinition, VhostDefinition,
};
use crate::access::limits::limit_from_i64;
use crate::access::password::{hash_password_with_salt, SALT_LEN_BYTES};
use crate::access::user::{parse_tags, TooManyTags};
use crate::access::{
    AccessControl, AccessError, HashingAlgorithm, PasswordHash, Pattern, PatternError, Permissions,
    UserLimits, UserTag, VhostLimits, VhostRecord,
};

/// The runtime-parameter component that holds vhost limits.
pub const VHOST_LIMITS_COMPONENT: &str = "vhost-limits";

/// A user to create or replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserChange {
    /// Login name.
    pub name: String,
    /// Credential ([`PasswordHash::none`] for a passwordless user).
    pub password: PasswordHash,
    /// Tags.
    pub tags: Vec<UserTag>,
    /// New limits, or `None` to keep an existing user's limits (none for a new user).
    pub limits: Option<UserLimits>,
}

/// A vhost to create, or whose metadata to replace (its limits are left alone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VhostChange {
    /// Name.
    pub name: String,
    /// Description.
    pub description: String,
    /// Tags.
    pub tags: Vec<String>,
    /// Default queue type.
    pub default_queue_type: Option<String>,
}

/// An exchange to declare unless one of that name exists.
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeChange {
    /// Vhost.
    pub vhost: String,
    /// Name.
    pub name: String,
    /// Type name as given (`direct`, `topic`, …); the broker refuses types it lacks.
    pub kind: String,
    /// Survives restarts.
    pub durable: bool,
    /// Deleted with its last binding.
    pub auto_delete: bool,
    /// Not publishable by clients.
    pub internal: bool,
    /// Arguments.
    pub arguments: FieldTable,
}

/// A queue to declare unless one of that name exists.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueChange {
    /// Vhost.
    pub vhost: String,
    /// Name.
    pub name: String,
    /// The file's `type` (`classic`, `quorum`, `stream`), if it has one; the broker refuses
    /// types it lacks.
    pub queue_type: Option<String>,
    /// Survives restarts.
    pub durable: bool,
    /// Deleted with its last consumer.
    pub auto_delete: bool,
    /// Arguments.
    pub arguments: FieldTable,
}

/// A binding to add unless it exists.
#[derive(Debug, Clone, PartialEq)]
pub struct BindingChange {
    /// Vhost.
    pub vhost: String,
    /// Source exchange.
    pub source: String,
    /// Destination queue or exchange.
    pub destination: String,
    /// Queue or exchange.
    pub destination_type: DestinationType,
    /// Binding key.
    pub routing_key: String,
    /// Arguments.
    pub arguments: FieldTable,
}

/// A policy to create or replace.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyChange {
    /// Vhost.
    pub vhost: String,
    /// Name.
    pub name: String,
    /// Regular expression on names.
    pub pattern: String,
    /// What it applies to (`all` when the file says nothing).
    pub apply_to: String,
    /// Priority (0 when the file says nothing).
    pub priority: i64,
    /// The policy's keys.
    pub definition: Object,
    /// An operator policy (RabbitMQ exports those as `operator_policy` parameters).
    pub operator: bool,
}

/// One change of an import plan. Each is idempotent (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Create or replace a user.
    PutUser(UserChange),
    /// Create a vhost or replace its metadata.
    PutVhost(VhostChange),
    /// Replace a vhost's limits.
    SetVhostLimits {
        /// Vhost.
        vhost: String,
        /// Limits.
        limits: VhostLimits,
    },
    /// Set a user's permissions in a vhost (patterns already checked to compile).
    SetPermissions {
        /// User.
        user: String,
        /// Vhost.
        vhost: String,
        /// Configure pattern.
        configure: String,
        /// Write pattern.
        write: String,
        /// Read pattern.
        read: String,
    },
    /// Set a user's topic permissions on an exchange (patterns already checked to compile).
    SetTopicPermissions {
        /// User.
        user: String,
        /// Vhost.
        vhost: String,
        /// Topic exchange.
        exchange: String,
        /// Write pattern.
        write: String,
        /// Read pattern.
        read: String,
    },
    /// Declare an exchange unless it exists.
    DeclareExchange(ExchangeChange),
    /// Set a global runtime parameter.
    SetGlobalParameter {
        /// Name.
        name: String,
        /// Value.
        value: Value,
    },
    /// Create or replace a policy.
    SetPolicy(PolicyChange),
    /// Set a vhost-scoped runtime parameter (other than vhost limits, which become
    /// [`Change::SetVhostLimits`]).
    SetParameter {
        /// Vhost.
        vhost: String,
        /// Component.
        component: String,
        /// Name.
        name: String,
        /// Value.
        value: Value,
    },
    /// Declare a queue unless it exists.
    DeclareQueue(QueueChange),
    /// Add a binding unless it exists.
    Bind(BindingChange),
}

/// Something in the file that the import leaves out on purpose, as RabbitMQ does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    /// `exchange` or `queue`.
    pub kind: &'static str,
    /// Its vhost.
    pub vhost: String,
    /// Its name.
    pub name: String,
    /// Why, in RabbitMQ's words.
    pub reason: &'static str,
}

/// The changes an import makes, in order, and what it skips.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImportPlan {
    /// Changes to apply in order.
    pub changes: Vec<Change>,
    /// Entries left out.
    pub skipped: Vec<Skipped>,
}

/// Why a definitions file cannot be imported. Nothing of it should be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImportError {
    /// A whole-broker import met an object without a vhost.
    #[error("{kind} '{name}' names no vhost; a file exported from one vhost must be imported into a vhost")]
    MissingVhost {
        /// `queue`, `exchange`, `binding`, `policy` or `parameter`.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// A user has both `password` and `password_hash`.
    #[error("user '{0}': both password and password_hash are provided")]
    BothPasswordAndHash(String),
    /// A `password_hash` is not base64.
    #[error("user '{user}': password_hash is not valid base64: {reason}")]
    BadPasswordHash {
        /// User.
        user: String,
        /// Decoder's explanation.
        reason: String,
    },
    /// A `hashing_algorithm` Warren does not implement.
    #[error("user '{user}': unsupported hashing_algorithm '{algorithm}'")]
    UnknownHashingAlgorithm {
        /// User.
        user: String,
        /// The module named.
        algorithm: String,
    },
    /// A user with neither `tags` nor the old `administrator` flag.
    #[error("user '{0}': tags are missing")]
    TagsMissing(String),
    /// Too many tags.
    #[error("user '{user}': {error}")]
    TooManyTags {
        /// User.
        user: String,
        /// Details.
        error: TooManyTags,
    },
    /// A limit that is not an integer, or a key that is not a limit.
    #[error("limits of {owner}: {reason}")]
    BadLimit {
        /// `user 'u'` or `vhost 'v'`.
        owner: String,
        /// What is wrong.
        reason: String,
    },
    /// A vhost with an empty `default_queue_type`.
    #[error("vhost '{0}': default_queue_type must not be an empty string")]
    EmptyDefaultQueueType(String),
    /// A permission or topic permission pattern that does not compile.
    #[error("permissions of user '{user}' in vhost '{vhost}': {error}")]
    Pattern {
        /// User.
        user: String,
        /// Vhost.
        vhost: String,
        /// Details.
        error: PatternError,
    },
    /// Arguments with no AMQP counterpart.
    #[error("{kind} '{name}' in vhost '{vhost}': {error}")]
    Argument {
        /// `queue`, `exchange` or `binding`.
        kind: &'static str,
        /// Its name.
        name: String,
        /// Its vhost.
        vhost: String,
        /// Details.
        error: ArgumentError,
    },
}

type Result<T> = std::result::Result<T, ImportError>;

/// Plans the import of a whole-broker definitions file (see the module docs). Cleartext
/// passwords get salts from the operating system's generator.
pub fn plan_import(defs: &Definitions) -> Result<ImportPlan> {
    plan_import_with_rng(defs, &mut rand::rngs::OsRng)
}

/// [`plan_import`] with the generator for cleartext passwords' salts given (deterministic plans
/// in tests).
pub fn plan_import_with_rng(defs: &Definitions, rng: &mut dyn RngCore) -> Result<ImportPlan> {
    let mut plan = Planner::default();
    for user in defs.users() {
        plan.push(Change::PutUser(user_change(user, defs.version(), rng)?));
    }
    let limit_params: HashSet<&str> = defs
        .parameters()
        .iter()
        .filter(|p| p.component == VHOST_LIMITS_COMPONENT)
        .filter_map(|p| p.vhost.as_deref())
        .collect();
    for vhost in defs.vhosts() {
        plan.push(Change::PutVhost(vhost_change(vhost)?));
        // 3.x exports limits both here and as a parameter; a hand-written file may have them
        // only here.
        if let Some(limits) = vhost.limits.as_ref().filter(|l| !l.is_empty()) {
            if !limit_params.contains(vhost.name.as_str()) {
                plan.push(Change::SetVhostLimits {
                    vhost: vhost.name.clone(),
                    limits: vhost_limits(&vhost.name, limits.iter())?,
                });
            }
        }
    }
    for p in defs.permissions() {
        let checked = Permissions::new(&p.configure, &p.write, &p.read);
        checked.map_err(|error| pattern_error(&p.user, &p.vhost, error))?;
        plan.push(Change::SetPermissions {
            user: p.user.clone(),
            vhost: p.vhost.clone(),
            configure: p.configure.clone(),
            write: p.write.clone(),
            read: p.read.clone(),
        });
    }
    for x in defs.exchanges() {
        let vhost = require_vhost("exchange", &x.name, x.vhost.as_deref())?;
        plan.exchange(x, vhost)?;
    }
    for t in defs.topic_permissions() {
        for pattern in [&t.write, &t.read] {
            Pattern::new(pattern).map_err(|error| pattern_error(&t.user, &t.vhost, error))?;
        }
        plan.push(Change::SetTopicPermissions {
            user: t.user.clone(),
            vhost: t.vhost.clone(),
            exchange: t.exchange.clone(),
            write: t.write.clone(),
            read: t.read.clone(),
        });
    }
    for g in defs.global_parameters() {
        plan.push(Change::SetGlobalParameter {
            name: g.name.clone(),
            value: g.value.clone(),
        });
    }
    for p in defs.policies() {
        let vhost = require_vhost("policy", &p.name, p.vhost.as_deref())?;
        plan.push(Change::SetPolicy(policy_change(p, vhost)));
    }
    for p in defs.parameters() {
        let vhost = require_vhost("parameter", &p.name, p.vhost.as_deref())?;
        plan.push(parameter_change(p, vhost)?);
    }
    for q in defs.queues() {
        let vhost = require_vhost("queue", &q.name, q.vhost.as_deref())?;
        plan.queue(q, vhost)?;
    }
    for b in defs.bindings() {
        let vhost = require_vhost("binding", &b.source, b.vhost.as_deref())?;
        plan.binding(b, vhost)?;
    }
    Ok(plan.done())
}

/// Plans the import of a file into one vhost, as `POST /api/definitions/<vhost>` does
/// (`apply_defs/4` in `rabbit_definitions.erl`): only exchanges, parameters, policies, queues and
/// bindings are taken, all placed in `vhost` whatever vhost they name; users, vhosts and
/// permissions are ignored.
pub fn plan_vhost_import(defs: &Definitions, vhost: &str) -> Result<ImportPlan> {
    let mut plan = Planner::default();
    for x in defs.exchanges() {
        plan.exchange(x, vhost)?;
    }
    for p in defs.parameters() {
        plan.push(parameter_change(p, vhost)?);
    }
    for p in defs.policies() {
        plan.push(Change::SetPolicy(policy_change(p, vhost)));
    }
    for q in defs.queues() {
        plan.queue(q, vhost)?;
    }
    for b in defs.bindings() {
        plan.binding(b, vhost)?;
    }
    Ok(plan.done())
}

impl Change {
    /// Applies an access-control change (user, vhost record, limits, permissions, topic
    /// permissions) to `access`; returns `Ok(false)` for the other changes, which are the
    /// broker's. Putting a vhost keeps its limits; putting a user with `limits: None` keeps the
    /// existing user's limits.
    pub fn apply_to_access(
        &self,
        access: &mut AccessControl,
    ) -> std::result::Result<bool, AccessError> {
        match self {
            Change::PutUser(u) => {
                let limits = u
                    .limits
                    .or_else(|| access.user(&u.name).map(|old| old.limits))
                    .unwrap_or_default();
                access.put_user(crate::access::UserRecord {
                    name: u.name.clone(),
                    password: u.password.clone(),
                    tags: u.tags.clone(),
                    limits,
                });
            }
            Change::PutVhost(v) => {
                let limits = access
                    .vhost(&v.name)
                    .map(|old| old.limits)
                    .unwrap_or_default();
                access.put_vhost(VhostRecord {
                    name: v.name.clone(),
                    description: v.description.clone(),
                    tags: v.tags.clone(),
                    default_queue_type: v.default_queue_type.clone(),
                    limits,
                });
            }
            Change::SetVhostLimits { vhost, limits } => access.set_vhost_limits(vhost, *limits)?,
            Change::SetPermissions {
                user,
                vhost,
                configure,
                write,
                read,
            } => access.set_permissions(user, vhost, Permissions::new(configure, write, read)?)?,
            Change::SetTopicPermissions {
                user,
                vhost,
                exchange,
                write,
                read,
            } => access.set_topic_permissions(user, vhost, exchange, write, read)?,
            Change::SetGlobalParameter { name, value } => {
                access.set_global_parameter(name, value.clone());
            }
            Change::DeclareExchange(_)
            | Change::SetPolicy(_)
            | Change::SetParameter { .. }
            | Change::DeclareQueue(_)
            | Change::Bind(_) => return Ok(false),
        }
        Ok(true)
    }
}

/// Collects changes; drops exact duplicates of bindings.
#[derive(Default)]
struct Planner {
    plan: ImportPlan,
    bindings: HashSet<String>,
}

impl Planner {
    fn push(&mut self, change: Change) {
        self.plan.changes.push(change);
    }

    fn done(self) -> ImportPlan {
        self.plan
    }

    fn skip(&mut self, kind: &'static str, vhost: &str, name: &str, reason: &'static str) {
        self.plan.skipped.push(Skipped {
            kind,
            vhost: vhost.to_string(),
            name: name.to_string(),
            reason,
        });
    }

    fn exchange(&mut self, x: &ExchangeDefinition, vhost: &str) -> Result<()> {
        if x.name.is_empty() {
            self.skip(
                "exchange",
                vhost,
                &x.name,
                "the default exchange is not imported",
            );
            return Ok(());
        }
        if x.name.starts_with("amq.") {
            self.skip("exchange", vhost, &x.name, "its name begins with 'amq.'");
            return Ok(());
        }
        let arguments = arguments("exchange", &x.name, vhost, x.arguments())?;
        self.push(Change::DeclareExchange(ExchangeChange {
            vhost: vhost.to_string(),
            name: x.name.clone(),
            kind: x.kind.clone(),
            durable: x.durable(),
            auto_delete: x.auto_delete(),
            internal: x.internal(),
            arguments,
        }));
        Ok(())
    }

    fn queue(&mut self, q: &QueueDefinition, vhost: &str) -> Result<()> {
        if q.name.starts_with("amq.") {
            self.skip("queue", vhost, &q.name, "its name begins with 'amq.'");
            return Ok(());
        }
        let arguments = arguments("queue", &q.name, vhost, q.arguments())?;
        // The type is in `type` (exports since 3.8) or only in the `x-queue-type` argument.
        let queue_type = q.queue_type.clone().or_else(|| {
            arguments
                .get("x-queue-type")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        });
        self.push(Change::DeclareQueue(QueueChange {
            vhost: vhost.to_string(),
            name: q.name.clone(),
            queue_type,
            durable: q.durable(),
            auto_delete: q.auto_delete(),
            arguments,
        }));
        Ok(())
    }

    fn binding(&mut self, b: &BindingDefinition, vhost: &str) -> Result<()> {
        let key = serde_json::to_string(&(
            vhost,
            &b.source,
            &b.destination,
            b.destination_type,
            b.routing_key(),
            b.arguments(),
        ))
        .expect("binding key serializes");
        if !self.bindings.insert(key) {
            return Ok(());
        }
        let arguments = arguments("binding", &b.source, vhost, b.arguments())?;
        self.push(Change::Bind(BindingChange {
            vhost: vhost.to_string(),
            source: b.source.clone(),
            destination: b.destination.clone(),
            destination_type: b.destination_type,
            routing_key: b.routing_key().to_string(),
            arguments,
        }));
        Ok(())
    }
}

fn require_vhost<'a>(kind: &'static str, name: &str, vhost: Option<&'a str>) -> Result<&'a str> {
    vhost.ok_or_else(|| ImportError::MissingVhost {
        kind,
        name: name.to_string(),
    })
}

fn pattern_error(user: &str, vhost: &str, error: PatternError) -> ImportError {
    ImportError::Pattern {
        user: user.to_string(),
        vhost: vhost.to_string(),
        error,
    }
}

fn arguments(kind: &'static str, name: &str, vhost: &str, args: &Object) -> Result<FieldTable> {
    json_to_table(args).map_err(|error| ImportError::Argument {
        kind,
        name: name.to_string(),
        vhost: vhost.to_string(),
        error,
    })
}

/// `put_user/3` in `rabbit_auth_backend_internal.erl`.
fn user_change(
    u: &UserDefinition,
    version: Option<&str>,
    rng: &mut dyn RngCore,
) -> Result<UserChange> {
    let algorithm = match &u.hashing_algorithm {
        Some(name) => HashingAlgorithm::from_module_name(name).ok_or_else(|| {
            ImportError::UnknownHashingAlgorithm {
                user: u.name.clone(),
                algorithm: name.clone(),
            }
        })?,
        None => HashingAlgorithm::default_for_version(version),
    };
    let password = match (&u.password, &u.password_hash) {
        (Some(_), Some(_)) => return Err(ImportError::BothPasswordAndHash(u.name.clone())),
        (Some(cleartext), None) => {
            let mut salt = [0u8; SALT_LEN_BYTES];
            rng.fill_bytes(&mut salt);
            let algorithm = HashingAlgorithm::default();
            PasswordHash {
                algorithm,
                bytes: hash_password_with_salt(algorithm, salt, cleartext.expose()),
            }
        }
        (None, Some(hash)) => PasswordHash::from_base64(algorithm, hash).map_err(|e| {
            ImportError::BadPasswordHash {
                user: u.name.clone(),
                reason: e.to_string(),
            }
        })?,
        (None, None) => PasswordHash {
            algorithm,
            bytes: Vec::new(),
        },
    };
    let tags = match (&u.tags, u.extra.get("administrator")) {
        (Some(tags), _) => parse_tags(tags.iter()),
        (None, Some(flag)) => Ok(if parses_true(flag) {
            vec![UserTag::Administrator]
        } else {
            vec![]
        }),
        (None, None) => return Err(ImportError::TagsMissing(u.name.clone())),
    }
    .map_err(|error| ImportError::TooManyTags {
        user: u.name.clone(),
        error,
    })?;
    let limits = match &u.limits {
        Some(object) => Some(user_limits(&u.name, object)?),
        None => None,
    };
    Ok(UserChange {
        name: u.name.clone(),
        password,
        tags,
        limits,
    })
}

/// `rabbit_misc:parse_bool/1`.
fn parses_true(v: &Value) -> bool {
    match v {
        Value::Bool(b) => *b,
        Value::String(s) => s == "true",
        _ => false,
    }
}

/// `add_vhost/2` in `rabbit_definitions.erl`: top-level fields first, then `metadata`.
fn vhost_change(v: &VhostDefinition) -> Result<VhostChange> {
    let meta = v.metadata.as_ref();
    let description = v
        .description
        .as_ref()
        .or_else(|| meta.and_then(|m| m.description.as_ref()))
        .cloned()
        .unwrap_or_default();
    let tags = v
        .tags
        .as_ref()
        .or_else(|| meta.and_then(|m| m.tags.as_ref()))
        .map(|t| t.iter().map(str::to_string).collect())
        .unwrap_or_default();
    let default_queue_type = meta
        .and_then(|m| m.default_queue_type.as_ref())
        .or(v.default_queue_type.as_ref())
        .cloned();
    if default_queue_type.as_deref() == Some("") {
        return Err(ImportError::EmptyDefaultQueueType(v.name.clone()));
    }
    Ok(VhostChange {
        name: v.name.clone(),
        description,
        tags,
        default_queue_type,
    })
}

fn policy_change(p: &PolicyDefinition, vhost: &str) -> PolicyChange {
    PolicyChange {
        vhost: vhost.to_string(),
        name: p.name.clone(),
        pattern: p.pattern.clone(),
        apply_to: p.apply_to.clone().unwrap_or_else(|| "all".to_string()),
        priority: p.priority.unwrap_or(0),
        definition: p.definition.clone(),
        operator: false,
    }
}

/// RabbitMQ's runtime-parameter component of operator policies.
pub const OPERATOR_POLICY_COMPONENT: &str = "operator_policy";

fn parameter_change(p: &ParameterDefinition, vhost: &str) -> Result<Change> {
    if p.component == OPERATOR_POLICY_COMPONENT {
        // The value is the policy: pattern, definition, priority, apply-to.
        let v = &p.value;
        return Ok(Change::SetPolicy(PolicyChange {
            vhost: vhost.to_string(),
            name: p.name.clone(),
            pattern: v["pattern"].as_str().unwrap_or_default().to_string(),
            apply_to: v["apply-to"].as_str().unwrap_or("all").to_string(),
            priority: v["priority"].as_i64().unwrap_or(0),
            definition: v["definition"].as_object().cloned().unwrap_or_default(),
            operator: true,
        }));
    }
    if p.component == VHOST_LIMITS_COMPONENT {
        let object = p.value.as_object().ok_or_else(|| ImportError::BadLimit {
            owner: format!("vhost '{vhost}'"),
            reason: format!("expected an object, got {}", p.value),
        })?;
        return Ok(Change::SetVhostLimits {
            vhost: vhost.to_string(),
            limits: vhost_limits(vhost, object.iter().map(|(k, v)| (k.as_str(), v)))?,
        });
    }
    Ok(Change::SetParameter {
        vhost: vhost.to_string(),
        component: p.component.clone(),
        name: p.name.clone(),
        value: p.value.clone(),
    })
}

/// One limit: an integer, negative for none (`rabbit_parameter_validation:integer/2`).
fn limit(owner: impl Fn() -> String, key: &str, value: &Value) -> Result<Option<u64>> {
    match value.as_i64() {
        Some(n) => Ok(limit_from_i64(n)),
        None if value.is_u64() => Ok(value.as_u64()),
        None => Err(ImportError::BadLimit {
            owner: owner(),
            reason: format!("{key} should be an integer, actually was {value}"),
        }),
    }
}

fn unrecognised(owner: String, key: &str) -> ImportError {
    ImportError::BadLimit {
        owner,
        reason: format!("unrecognised limit '{key}'"),
    }
}

fn vhost_limits<'a>(
    vhost: &str,
    entries: impl Iterator<Item = (&'a str, &'a Value)>,
) -> Result<VhostLimits> {
    let owner = || format!("vhost '{vhost}'");
    let mut limits = VhostLimits::default();
    for (key, value) in entries {
        match key {
            "max-connections" => limits.max_connections = limit(owner, key, value)?,
            "max-queues" => limits.max_queues = limit(owner, key, value)?,
            _ => return Err(unrecognised(owner(), key)),
        }
    }
    Ok(limits)
}

fn user_limits(user: &str, object: &Object) -> Result<UserLimits> {
    let owner = || format!("user '{user}'");
    let mut limits = UserLimits::default();
    for (key, value) in object {
        match key.as_str() {
            "max-connections" => limits.max_connections = limit(owner, key, value)?,
            "max-channels" => limits.max_channels = limit(owner, key, value)?,
            _ => return Err(unrecognised(owner(), key)),
        }
    }
    Ok(limits)
}

/// The vhost limits a [`LimitsDefinition`] describes (for callers reading files themselves).
pub fn parse_vhost_limits(vhost: &str, limits: &LimitsDefinition) -> Result<VhostLimits> {
    vhost_limits(vhost, limits.iter())
}

/// Reads an access-control database stored by [`crate::ops::Admin`] (a definitions document with users,
/// vhosts, permissions, topic permissions and vhost limits).
///
/// Errors: the text is not such a document, or an entry cannot be applied.
pub fn parse_stored_access(text: &str) -> std::result::Result<AccessControl, String> {
    let defs = Definitions::from_json(text).map_err(|e| e.to_string())?;
    let plan = plan_import(&defs).map_err(|e| e.to_string())?;
    let mut access = AccessControl::new();
    for change in &plan.changes {
        change
            .apply_to_access(&mut access)
            .map_err(|e| e.to_string())?;
    }
    Ok(access)
}

#[cfg(test)]
#[path = "import_tests.rs"]
mod tests;
