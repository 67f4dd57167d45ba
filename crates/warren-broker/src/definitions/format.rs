//! The definitions file format: serde types for what `rabbitmqctl export_definitions` writes and
//! the management API's `GET /api/definitions` returns (rabbitmq.com/docs/definitions;
//! `rabbit_definitions.erl`).
//!
//! Round trips lose nothing and add nothing: every field the broker uses is typed, and every other
//! field, known to some RabbitMQ plugin or version or to none, is kept in the `extra` map of its
//! object and written back. Optional fields are `Option`s, so what a file leaves out stays out
//! (RabbitMQ's own export has no `internal` on exchanges, for one); accessors such as
//! [`QueueDefinition::durable`] give the default RabbitMQ's import assumes for a missing one.
//!
//! Shapes that differ between RabbitMQ versions are all accepted and written back as read:
//! - user and vhost `tags`: a list (`["a","b"]`, 3.7 and later) or one comma-separated string
//!   (`"a,b"`, older exports and the management API) — [`Tags`];
//! - vhost `limits`: a list of pairs (`[["max-queues",32]]`, 3.x) or an object
//!   (`{"max-queues":32}`, 4.x) — [`LimitsDefinition`].

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::access::Cleartext;

/// A JSON object.
pub type Object = Map<String, Value>;

fn empty_object() -> &'static Object {
    static EMPTY: std::sync::OnceLock<Object> = std::sync::OnceLock::new();
    EMPTY.get_or_init(Object::new)
}

/// A whole definitions file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Definitions {
    /// Version of the RabbitMQ that wrote the file (older name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rabbit_version: Option<String>,
    /// Version of the RabbitMQ that wrote the file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rabbitmq_version: Option<String>,
    /// Users of the internal database.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<Vec<UserDefinition>>,
    /// Virtual hosts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhosts: Option<Vec<VhostDefinition>>,
    /// Permissions per user and vhost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<Vec<PermissionDefinition>>,
    /// Topic permissions per user, vhost and exchange.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_permissions: Option<Vec<TopicPermissionDefinition>>,
    /// Vhost-scoped runtime parameters (vhost limits, federation upstreams, shovels, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Vec<ParameterDefinition>>,
    /// Global runtime parameters (`cluster_name`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_parameters: Option<Vec<GlobalParameterDefinition>>,
    /// Policies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policies: Option<Vec<PolicyDefinition>>,
    /// Queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<QueueDefinition>>,
    /// Exchanges (RabbitMQ leaves out the default exchange and the `amq.*` ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exchanges: Option<Vec<ExchangeDefinition>>,
    /// Bindings (RabbitMQ leaves out the default exchange's implicit ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bindings: Option<Vec<BindingDefinition>>,
    /// Any other top-level field (e.g. `operator_policies`, `product_name`), kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

fn listed<T>(v: &Option<Vec<T>>) -> &[T] {
    v.as_deref().unwrap_or_default()
}

impl Definitions {
    /// Parses a definitions file.
    pub fn from_json(text: &str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }

    /// Writes the file as compact JSON, as `rabbitmqctl export_definitions` does.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("definitions serialize to JSON")
    }

    /// The writer's version: `rabbitmq_version`, else `rabbit_version`.
    pub fn version(&self) -> Option<&str> {
        self.rabbitmq_version
            .as_deref()
            .or(self.rabbit_version.as_deref())
    }

    /// The users, or none.
    pub fn users(&self) -> &[UserDefinition] {
        listed(&self.users)
    }

    /// The vhosts, or none.
    pub fn vhosts(&self) -> &[VhostDefinition] {
        listed(&self.vhosts)
    }

    /// The permissions, or none.
    pub fn permissions(&self) -> &[PermissionDefinition] {
        listed(&self.permissions)
    }

    /// The topic permissions, or none.
    pub fn topic_permissions(&self) -> &[TopicPermissionDefinition] {
        listed(&self.topic_permissions)
    }

    /// The runtime parameters, or none.
    pub fn parameters(&self) -> &[ParameterDefinition] {
        listed(&self.parameters)
    }

    /// The global parameters, or none.
    pub fn global_parameters(&self) -> &[GlobalParameterDefinition] {
        listed(&self.global_parameters)
    }

    /// The policies, or none.
    pub fn policies(&self) -> &[PolicyDefinition] {
        listed(&self.policies)
    }

    /// The queues, or none.
    pub fn queues(&self) -> &[QueueDefinition] {
        listed(&self.queues)
    }

    /// The exchanges, or none.
    pub fn exchanges(&self) -> &[ExchangeDefinition] {
        listed(&self.exchanges)
    }

    /// The bindings, or none.
    pub fn bindings(&self) -> &[BindingDefinition] {
        listed(&self.bindings)
    }
}

/// Tags, as a list or as one comma-separated string.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Tags {
    /// `["administrator", "management"]`.
    List(Vec<String>),
    /// `"administrator,management"`.
    Csv(String),
}

impl Tags {
    /// The tags one by one, trimmed, empty ones dropped.
    pub fn iter(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        let items: Box<dyn Iterator<Item = &str>> = match self {
            Tags::List(list) => Box::new(list.iter().map(String::as_str)),
            Tags::Csv(csv) => Box::new(csv.split(',')),
        };
        Box::new(items.map(str::trim).filter(|t| !t.is_empty()))
    }
}

/// A user. `Debug` leaves out the password and its hash.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct UserDefinition {
    /// Login name.
    pub name: String,
    /// Base64 of salt and digest; `""` for a passwordless user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_hash: Option<String>,
    /// A cleartext password to hash on import (accepted by RabbitMQ's import, never exported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<Cleartext>,
    /// `rabbit_password_hashing_sha256`, `…_sha512` or `…_md5`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hashing_algorithm: Option<String>,
    /// Tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Tags>,
    /// `max-connections` and `max-channels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Object>,
    /// Other fields (e.g. the pre-3.0 `administrator` flag), kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

impl fmt::Debug for UserDefinition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserDefinition")
            .field("name", &self.name)
            .field("hashing_algorithm", &self.hashing_algorithm)
            .field("tags", &self.tags)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A virtual host. Description, tags and default queue type appear at the top level
/// (management API) or under `metadata` (RabbitMQ's export), or both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VhostDefinition {
    /// Name.
    pub name: String,
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Tags>,
    /// Default queue type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_queue_type: Option<String>,
    /// Metadata: description, tags, default queue type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<VhostMetadataDefinition>,
    /// `max-connections` and `max-queues` (RabbitMQ exports them here and as a `vhost-limits`
    /// parameter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsDefinition>,
    /// Other fields (e.g. `tracing`), kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

/// A vhost's `metadata` object.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct VhostMetadataDefinition {
    /// Description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<Tags>,
    /// Default queue type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_queue_type: Option<String>,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

/// Limits as an object (4.x) or as a list of `[name, value]` pairs (3.x).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LimitsDefinition {
    /// `{"max-queues": 32}`.
    Object(Object),
    /// `[["max-queues", 32]]`.
    Pairs(Vec<(String, Value)>),
}

impl LimitsDefinition {
    /// The limits one by one.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (&str, &Value)> + '_> {
        match self {
            LimitsDefinition::Object(o) => Box::new(o.iter().map(|(k, v)| (k.as_str(), v))),
            LimitsDefinition::Pairs(p) => Box::new(p.iter().map(|(k, v)| (k.as_str(), v))),
        }
    }

    /// True when no limit is set.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }
}

/// A user's permissions in a vhost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PermissionDefinition {
    /// User name.
    pub user: String,
    /// Vhost name.
    pub vhost: String,
    /// Configure pattern.
    pub configure: String,
    /// Write pattern.
    pub write: String,
    /// Read pattern.
    pub read: String,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

/// A user's topic permissions on an exchange.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicPermissionDefinition {
    /// User name.
    pub user: String,
    /// Vhost name.
    pub vhost: String,
    /// Topic exchange.
    pub exchange: String,
    /// Write pattern (publish routing keys).
    pub write: String,
    /// Read pattern (binding keys).
    pub read: String,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

/// A vhost-scoped runtime parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ParameterDefinition {
    /// Vhost name (absent in vhost-scoped files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<String>,
    /// Component, e.g. `vhost-limits`, `federation-upstream`, `shovel`.
    pub component: String,
    /// Name within the component (`limits` for `vhost-limits`).
    pub name: String,
    /// Value, any JSON.
    pub value: Value,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

/// A global runtime parameter.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GlobalParameterDefinition {
    /// Name, e.g. `cluster_name`.
    pub name: String,
    /// Value, any JSON.
    pub value: Value,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

/// A policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyDefinition {
    /// Vhost name (absent in vhost-scoped files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<String>,
    /// Policy name.
    pub name: String,
    /// Regular expression on queue or exchange names.
    pub pattern: String,
    /// `queues`, `exchanges`, `all`, `classic_queues`, `quorum_queues`, `streams`; RabbitMQ's
    /// default is `all`.
    #[serde(rename = "apply-to", default, skip_serializing_if = "Option::is_none")]
    pub apply_to: Option<String>,
    /// Higher wins; RabbitMQ's default is 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// The policy's keys (`message-ttl`, `max-length`, …).
    pub definition: Object,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

/// A queue.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueueDefinition {
    /// Vhost name (absent in vhost-scoped files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<String>,
    /// Queue name.
    pub name: String,
    /// `classic`, `quorum`, `stream` (exported since 3.8; also in `arguments` as
    /// `x-queue-type`).
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub queue_type: Option<String>,
    /// Survives restarts (see [`QueueDefinition::durable`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable: Option<bool>,
    /// Deleted with its last consumer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_delete: Option<bool>,
    /// Queue arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Object>,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

impl QueueDefinition {
    /// `durable`, true when absent (`add_queue_int/3` in `rabbit_definitions.erl`).
    pub fn durable(&self) -> bool {
        self.durable.unwrap_or(true)
    }

    /// `auto_delete`, false when absent.
    pub fn auto_delete(&self) -> bool {
        self.auto_delete.unwrap_or(false)
    }

    /// `arguments`, empty when absent.
    pub fn arguments(&self) -> &Object {
        self.arguments.as_ref().unwrap_or_else(|| empty_object())
    }
}

/// An exchange.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExchangeDefinition {
    /// Vhost name (absent in vhost-scoped files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<String>,
    /// Exchange name.
    pub name: String,
    /// `direct`, `fanout`, `topic`, `headers`, or a plugin's type.
    #[serde(rename = "type")]
    pub kind: String,
    /// Survives restarts (see [`ExchangeDefinition::durable`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable: Option<bool>,
    /// Deleted with its last binding.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_delete: Option<bool>,
    /// Not publishable by clients (RabbitMQ exports no internal exchanges, and no such field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal: Option<bool>,
    /// Exchange arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Object>,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

impl ExchangeDefinition {
    /// `durable`, true when absent (`add_exchange_int/3` in `rabbit_definitions.erl`).
    pub fn durable(&self) -> bool {
        self.durable.unwrap_or(true)
    }

    /// `auto_delete`, false when absent.
    pub fn auto_delete(&self) -> bool {
        self.auto_delete.unwrap_or(false)
    }

    /// `internal`, false when absent.
    pub fn internal(&self) -> bool {
        self.internal.unwrap_or(false)
    }

    /// `arguments`, empty when absent.
    pub fn arguments(&self) -> &Object {
        self.arguments.as_ref().unwrap_or_else(|| empty_object())
    }
}

/// What a binding routes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DestinationType {
    /// A queue.
    Queue,
    /// An exchange (exchange-to-exchange binding).
    Exchange,
}

/// A binding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BindingDefinition {
    /// Vhost name (absent in vhost-scoped files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vhost: Option<String>,
    /// Source exchange.
    pub source: String,
    /// Destination queue or exchange.
    pub destination: String,
    /// Whether the destination is a queue or an exchange.
    pub destination_type: DestinationType,
    /// Binding key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_key: Option<String>,
    /// Binding arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments: Option<Object>,
    /// Other fields, kept as read.
    #[serde(flatten)]
    pub extra: Object,
}

impl BindingDefinition {
    /// `routing_key`, empty when absent.
    pub fn routing_key(&self) -> &str {
        self.routing_key.as_deref().unwrap_or("")
    }

    /// `arguments`, empty when absent.
    pub fn arguments(&self) -> &Object {
        self.arguments.as_ref().unwrap_or_else(|| empty_object())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn round_trip(v: Value) {
        let defs: Definitions = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(serde_json::to_value(&defs).unwrap(), v);
    }

    #[test]
    fn empty_and_partial_files() {
        round_trip(json!({}));
        round_trip(json!({"users": [], "rabbitmq_version": "4.1.0"}));
        let defs = Definitions::from_json("{}").unwrap();
        assert!(defs.users().is_empty() && defs.bindings().is_empty());
        assert_eq!(defs.version(), None);
    }

    #[test]
    fn unknown_fields_survive_everywhere() {
        round_trip(json!({
            "product_name": "RabbitMQ",
            "operator_policies": [{"vhost": "/", "name": "op"}],
            "users": [{"name": "u", "password_hash": "", "tags": [], "future": {"a": 1}}],
            "vhosts": [{"name": "/", "tracing": false, "metadata": {"description": "d", "x": 1}}],
            "permissions": [{"user": "u", "vhost": "/", "configure": "", "write": "", "read": "", "x": 1}],
            "topic_permissions": [{"user": "u", "vhost": "/", "exchange": "t", "write": "", "read": "", "x": 2}],
            "parameters": [{"vhost": "/", "component": "c", "name": "n", "value": [1, "two"], "x": 3}],
            "global_parameters": [{"name": "n", "value": {"k": null}, "x": 4}],
            "policies": [{"vhost": "/", "name": "p", "pattern": ".*", "apply-to": "all", "priority": 0, "definition": {}, "x": 5}],
            "queues": [{"vhost": "/", "name": "q", "durable": true, "auto_delete": false, "arguments": {}, "exclusive": false}],
            "exchanges": [{"vhost": "/", "name": "x", "type": "direct", "durable": true, "auto_delete": false, "internal": false, "arguments": {}, "x": 6}],
            "bindings": [{"vhost": "/", "source": "x", "destination": "q", "destination_type": "queue", "routing_key": "", "arguments": {}, "x": 7}]
        }));
    }

    #[test]
    fn both_shapes_of_tags_and_limits() {
        round_trip(json!({"users": [{"name": "a", "tags": "administrator, management"}]}));
        round_trip(json!({"users": [{"name": "a", "tags": ["administrator"]}]}));
        round_trip(json!({"vhosts": [{"name": "v", "limits": [["max-queues", 3]]}]}));
        round_trip(json!({"vhosts": [{"name": "v", "limits": {"max-queues": 3}}]}));
        round_trip(json!({"vhosts": [{"name": "v", "limits": []}]}));
        let csv = Tags::Csv(" a,,b ,".into());
        assert_eq!(csv.iter().collect::<Vec<_>>(), vec!["a", "b"]);
        let pairs: LimitsDefinition = serde_json::from_value(json!([["max-queues", 3]])).unwrap();
        assert_eq!(
            pairs.iter().collect::<Vec<_>>(),
            vec![("max-queues", &json!(3))]
        );
        assert!(LimitsDefinition::Pairs(vec![]).is_empty());
    }

    #[test]
    fn defaults_of_absent_flags_are_rabbitmqs() {
        let defs = Definitions::from_json(
            r#"{"queues":[{"vhost":"/","name":"q"}],
                "exchanges":[{"vhost":"/","name":"x","type":"fanout"}],
                "bindings":[{"vhost":"/","source":"x","destination":"q","destination_type":"queue"}]}"#,
        )
        .unwrap();
        let q = &defs.queues()[0];
        assert!(q.durable() && !q.auto_delete() && q.arguments().is_empty());
        let x = &defs.exchanges()[0];
        assert!(x.durable() && !x.auto_delete() && !x.internal() && x.arguments().is_empty());
        let b = &defs.bindings()[0];
        assert!(b.routing_key().is_empty() && b.arguments().is_empty());
        // What the file left out stays out.
        let written = serde_json::to_value(&defs).unwrap();
        assert_eq!(written["queues"][0], json!({"vhost": "/", "name": "q"}));
    }

    #[test]
    fn malformed_files_are_errors() {
        assert!(Definitions::from_json("[]").is_err());
        assert!(Definitions::from_json(r#"{"users": [{"tags": []}]}"#).is_err());
        assert!(Definitions::from_json(
            r#"{"bindings": [{"source":"x","destination":"q","destination_type":"topic"}]}"#
        )
        .is_err());
    }

    #[test]
    fn debug_hides_credentials() {
        let defs = Definitions::from_json(
            r#"{"users":[{"name":"u","password_hash":"c2VjcmV0aGFzaA==","password":"hunter2","tags":[]}]}"#,
        )
        .unwrap();
        let shown = format!("{defs:?}");
        assert!(!shown.contains("c2VjcmV0aGFzaA=="), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}
