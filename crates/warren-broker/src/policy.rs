//! Policies and operator policies (rabbitmq.com/docs/policies): named, per-vhost settings that
//! apply to every queue or exchange whose name matches a regular expression, now and later.
//!
//! - Of the policies matching an object (by `pattern` and `apply-to`), the one with the
//!   highest `priority` applies; on equal priorities the name that sorts first (RabbitMQ
//!   lists policies by name and keeps that order when sorting by priority). The same holds
//!   for operator policies, chosen separately.
//! - The applied policy and operator policy are merged into the object's *effective policy
//!   definition*: for `max-length`, `max-length-bytes`, `message-ttl` and `expires` the lower
//!   value wins (`rabbit_policies:merge_policy_value`), for other keys the operator's.
//! - A queue's own `x-` arguments are merged with that definition as RabbitMQ's classic
//!   queues do (`rabbit_queue_type_util:args_policy_lookup`): the lower value of the numeric
//!   limits above and of `consumer-timeout`, the argument for `dead-letter-exchange`,
//!   `dead-letter-routing-key` and `overflow` (see [`effective_queue_args`]); an exchange's
//!   `alternate-exchange` argument wins over the policy's.
//!
//! Validation follows `rabbit_policies:validate_policy0` and `rabbit_policy`, with the
//! reasons RabbitMQ's management API reports (`Validation failed\n\n<reason>\n`).

use std::collections::BTreeMap;

use crate::args::{Overflow, QueueArgs};
use regex::Regex;
use serde_json::Value;

/// The keys a policy may set. The last seven are accepted (so that RabbitMQ 4's policies and
/// exports load) and have no effect yet: see [`NO_EFFECT_KEYS`].
pub const POLICY_KEYS: [&str; 16] = [
    "alternate-exchange",
    "consumer-timeout",
    "dead-letter-exchange",
    "dead-letter-routing-key",
    "expires",
    "max-length",
    "max-length-bytes",
    "message-ttl",
    "overflow",
    "queue-mode",
    "delivery-limit",
    "dead-letter-strategy",
    "queue-leader-locator",
    "queue-version",
    "max-age",
    "initial-cluster-size",
];

/// Policy keys Warren accepts and does not act on: `queue-mode` (every classic queue pages
/// to disk), the quorum queue keys `delivery-limit` and `dead-letter-strategy` (a quorum
/// queue takes them from its arguments at declaration), `queue-version` (classic queue
/// storage version) and the stream keys `max-age` and `initial-cluster-size`.
/// (`queue-leader-locator` places a new quorum queue's first leader.)
pub const NO_EFFECT_KEYS: [&str; 6] = [
    "queue-mode",
    "delivery-limit",
    "dead-letter-strategy",
    "queue-version",
    "max-age",
    "initial-cluster-size",
];

/// The keys an operator policy may set (the limits an operator imposes).
pub const OPERATOR_POLICY_KEYS: [&str; 4] =
    ["expires", "max-length", "max-length-bytes", "message-ttl"];

/// The keys whose lower value wins when a policy and an operator policy (or a queue
/// argument) both set them.
const LOWER_WINS: [&str; 4] = ["expires", "max-length", "max-length-bytes", "message-ttl"];

/// What kind of object a policy applies to (`apply-to`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApplyTo {
    /// Queues and exchanges.
    #[default]
    All,
    /// Queues only.
    Queues,
    /// Exchanges only.
    Exchanges,
    /// Classic queues only (RabbitMQ 4).
    ClassicQueues,
    /// Quorum queues only (RabbitMQ 4).
    QuorumQueues,
    /// Streams only (RabbitMQ 4): accepted, applies to no Warren queue (Warren has no
    /// streams).
    Streams,
}

/// What a policy is matched against: an exchange, or a queue of a type (its
/// [`crate::queue::QueueBackend::kind`]: `classic`, `quorum`, ...), for the `apply-to`
/// values that name queue types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target<'a> {
    /// An exchange.
    Exchange,
    /// A queue of this type.
    Queue(&'a str),
}

impl ApplyTo {
    /// RabbitMQ's name: `all`, `queues`, `exchanges`, `classic_queues`, `quorum_queues`,
    /// `streams`.
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyTo::All => "all",
            ApplyTo::Queues => "queues",
            ApplyTo::Exchanges => "exchanges",
            ApplyTo::ClassicQueues => "classic_queues",
            ApplyTo::QuorumQueues => "quorum_queues",
            ApplyTo::Streams => "streams",
        }
    }

    /// Parses RabbitMQ's name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "all" => Some(ApplyTo::All),
            "queues" => Some(ApplyTo::Queues),
            "exchanges" => Some(ApplyTo::Exchanges),
            "classic_queues" => Some(ApplyTo::ClassicQueues),
            "quorum_queues" => Some(ApplyTo::QuorumQueues),
            "streams" => Some(ApplyTo::Streams),
            _ => None,
        }
    }
}

/// One value of a policy definition: the keys above take integers or strings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PolicyValue {
    /// An integer (`message-ttl`, `max-length`, …).
    Int(i64),
    /// A string (`dead-letter-exchange`, `overflow`, …).
    Text(String),
}

impl PolicyValue {
    /// The value as JSON.
    pub fn to_json(&self) -> Value {
        match self {
            PolicyValue::Int(i) => Value::from(*i),
            PolicyValue::Text(s) => Value::from(s.as_str()),
        }
    }

    fn int(&self) -> Option<i64> {
        match self {
            PolicyValue::Int(i) => Some(*i),
            PolicyValue::Text(_) => None,
        }
    }

    fn text(&self) -> Option<&str> {
        match self {
            PolicyValue::Text(s) => Some(s),
            PolicyValue::Int(_) => None,
        }
    }
}

/// A policy definition: key to value, validated.
pub type Definition = BTreeMap<String, PolicyValue>;

/// A named policy of a vhost.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Name, unique in its vhost (among policies, or among operator policies).
    pub name: String,
    /// The regular expression names are matched against (unanchored, as in RabbitMQ).
    pub pattern: String,
    regex: Regex,
    /// What it applies to.
    pub apply_to: ApplyTo,
    /// Higher wins.
    pub priority: i64,
    /// The settings.
    pub definition: Definition,
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
            && self.pattern == other.pattern
            && self.apply_to == other.apply_to
            && self.priority == other.priority
            && self.definition == other.definition
    }
}

/// RabbitMQ's `~p` of a JSON value as the management API decodes it: strings are
/// binaries (`<<"x">>`), lists are lists.
fn erlang_term(v: &Value) -> String {
    match v {
        Value::String(s) => format!("<<\"{s}\">>"),
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(erlang_term).collect::<Vec<_>>().join(",")
        ),
        Value::Object(_) => "[{...}]".into(),
    }
}

fn validation_failed(reason: impl std::fmt::Display) -> String {
    format!("Validation failed\n\n{reason}\n")
}

/// Validates one key of a definition as `rabbit_policies:validate_policy0` does.
fn validate_value(key: &str, v: &Value) -> Result<PolicyValue, String> {
    let int = v.as_i64();
    let text = v.as_str();
    let bad = |what: &str| Err(format!("{} is not a valid {what}", erlang_term(v)));
    match key {
        "message-ttl" => match int {
            Some(n) if (0..=crate::args::MAX_EXPIRY).contains(&n) => Ok(PolicyValue::Int(n)),
            _ => bad("message TTL"),
        },
        "expires" => match int {
            Some(n) if (1..=crate::args::MAX_EXPIRY).contains(&n) => Ok(PolicyValue::Int(n)),
            _ => bad("queue expiry"),
        },
        "max-length" => match int {
            Some(n) if n >= 0 => Ok(PolicyValue::Int(n)),
            _ => bad("maximum length"),
        },
        "max-length-bytes" => match int {
            Some(n) if n >= 0 => Ok(PolicyValue::Int(n)),
            _ => bad("maximum length in bytes"),
        },
        "consumer-timeout" => match int {
            Some(n) if n >= 0 => Ok(PolicyValue::Int(n)),
            _ => bad("consumer timeout"),
        },
        "dead-letter-exchange" => match text {
            Some(s) => Ok(PolicyValue::Text(s.into())),
            None => bad("dead letter exchange name"),
        },
        "dead-letter-routing-key" => match text {
            Some(s) => Ok(PolicyValue::Text(s.into())),
            None => bad("dead letter routing key"),
        },
        "alternate-exchange" => match text {
            Some(s) => Ok(PolicyValue::Text(s.into())),
            None => bad("alternate exchange name"),
        },
        "overflow" => match text {
            Some(s @ ("drop-head" | "reject-publish" | "reject-publish-dlx")) => {
                Ok(PolicyValue::Text(s.into()))
            }
            _ => bad("overflow value"),
        },
        "queue-mode" => match text {
            Some(s @ ("default" | "lazy")) => Ok(PolicyValue::Text(s.into())),
            _ => bad("queue-mode value"),
        },
        "delivery-limit" => match int {
            Some(n) if n >= -1 => Ok(PolicyValue::Int(n)),
            _ => bad("delivery limit"),
        },
        "queue-version" => match int {
            Some(n @ (1 | 2)) => Ok(PolicyValue::Int(n)),
            _ => bad("queue version"),
        },
        "initial-cluster-size" => match int {
            Some(n) if n >= 1 => Ok(PolicyValue::Int(n)),
            _ => bad("initial cluster size"),
        },
        "dead-letter-strategy" => match text {
            Some(s @ ("at-most-once" | "at-least-once")) => Ok(PolicyValue::Text(s.into())),
            _ => bad("dead letter strategy"),
        },
        "queue-leader-locator" => match text {
            Some(s @ ("client-local" | "balanced" | "random" | "least-leaders")) => {
                Ok(PolicyValue::Text(s.into()))
            }
            _ => bad("queue leader locator"),
        },
        "max-age" => match text {
            Some(s) if !s.is_empty() => Ok(PolicyValue::Text(s.into())),
            _ => bad("max age"),
        },
        _ => Err(format!(
            "[{{<<\"{key}\">>,{}}}] are not recognised policy settings",
            erlang_term(v)
        )),
    }
}

/// Validates a definition (a JSON object) for a policy (`operator`: an operator policy).
///
/// Errors: RabbitMQ's validation reason, e.g. `Validation failed\n\n[{<<"foo">>,1}] are not
/// recognised policy settings\n` or `Validation failed\n\n-1 is not a valid message TTL\n`.
pub fn parse_definition(v: &Value, operator: bool) -> Result<Definition, String> {
    let Some(obj) = v.as_object() else {
        return Err(validation_failed(format!(
            "{} is not a valid policy definition",
            erlang_term(v)
        )));
    };
    let allowed: &[&str] = if operator {
        &OPERATOR_POLICY_KEYS
    } else {
        &POLICY_KEYS
    };
    // RabbitMQ validates the known keys first, then lists the unknown ones with their values.
    let mut out = Definition::new();
    let mut unknown = Vec::new();
    for (k, val) in obj {
        if allowed.contains(&k.as_str()) {
            out.insert(
                k.clone(),
                validate_value(k, val).map_err(validation_failed)?,
            );
        } else {
            unknown.push(format!("{{<<\"{k}\">>,{}}}", erlang_term(val)));
        }
    }
    if !unknown.is_empty() {
        return Err(validation_failed(format!(
            "[{}] are not recognised policy settings",
            unknown.join(",")
        )));
    }
    if out.is_empty() {
        return Err(validation_failed("no policy provided"));
    }
    Ok(out)
}

impl Policy {
    /// A policy from validated parts.
    ///
    /// Errors: the pattern is not a regular expression (RabbitMQ's reason).
    pub fn new(
        name: impl Into<String>,
        pattern: impl Into<String>,
        apply_to: ApplyTo,
        priority: i64,
        definition: Definition,
    ) -> Result<Self, String> {
        let pattern = pattern.into();
        let regex = Regex::new(&pattern).map_err(|e| {
            let why = match &e {
                regex::Error::Syntax(s) => s.lines().last().unwrap_or_default().trim().to_string(),
                other => other.to_string(),
            };
            validation_failed(format!(
                "pattern should be regular expression but is invalid: {{\"{why}\",0}}"
            ))
        })?;
        Ok(Policy {
            name: name.into(),
            pattern,
            regex,
            apply_to,
            priority,
            definition,
        })
    }

    /// A policy from the JSON body of `PUT /api/policies/<vhost>/<name>` (or of a
    /// definitions file's entry): `pattern` (required), `definition` (required), `priority`
    /// (default 0), `apply-to` (default `all`).
    ///
    /// Errors: RabbitMQ's validation reasons.
    pub fn from_json(name: &str, body: &Value, operator: bool) -> Result<Self, String> {
        let missing = |k: &str| format!("[{{key_missing,{k}}}]");
        let pattern = match body.get("pattern") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => {
                return Err(validation_failed(format!(
                    "pattern should be regular expression but is invalid: {}",
                    erlang_term(other)
                )))
            }
            None => return Err(missing("pattern")),
        };
        let definition = parse_definition(
            body.get("definition")
                .ok_or_else(|| missing("definition"))?,
            operator,
        )?;
        let priority = match body.get("priority") {
            None | Some(Value::Null) => 0,
            Some(v) => v.as_i64().ok_or_else(|| {
                validation_failed(format!(
                    "priority should be a number, actually was {}",
                    erlang_term(v)
                ))
            })?,
        };
        let apply_to = match body.get("apply-to") {
            None | Some(Value::Null) => ApplyTo::All,
            Some(v) => v.as_str().and_then(ApplyTo::parse).ok_or_else(|| {
                validation_failed(format!(
                    "apply-to '{}' unrecognised; should be one of: 'queues', 'classic_queues',  \
                     'quorum_queues', 'streams', 'exchanges', or 'all'",
                    v.as_str().map_or_else(|| erlang_term(v), String::from)
                ))
            })?,
        };
        Policy::new(name, pattern, apply_to, priority, definition)
    }

    /// The policy as RabbitMQ's management API shows it (without `vhost`).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "name": self.name,
            "pattern": self.pattern,
            "apply-to": self.apply_to.as_str(),
            "priority": self.priority,
            "definition": definition_json(&self.definition),
        })
    }

    fn matches(&self, name: &str, target: Target<'_>) -> bool {
        let kind = match (self.apply_to, target) {
            (ApplyTo::All, _) => true,
            (ApplyTo::Exchanges, t) => t == Target::Exchange,
            (_, Target::Exchange) => false,
            (ApplyTo::Queues, Target::Queue(_)) => true,
            (ApplyTo::ClassicQueues, Target::Queue(t)) => t == "classic",
            (ApplyTo::QuorumQueues, Target::Queue(t)) => t == "quorum",
            (ApplyTo::Streams, Target::Queue(t)) => t == "stream",
        };
        kind && self.regex.is_match(name)
    }
}

/// A definition as a JSON object.
pub fn definition_json(d: &Definition) -> Value {
    Value::Object(d.iter().map(|(k, v)| (k.clone(), v.to_json())).collect())
}

/// The policies of a vhost.
#[derive(Debug, Clone, Default)]
pub struct Policies {
    /// Policies by name.
    pub user: BTreeMap<String, Policy>,
    /// Operator policies by name.
    pub operator: BTreeMap<String, Policy>,
}

/// What applies to one queue or exchange: the names of the chosen policy and operator policy
/// and their merged definition (the management API's `policy`, `operator_policy` and
/// `effective_policy_definition`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// The policy applied, if any.
    pub policy: Option<String>,
    /// The operator policy applied, if any.
    pub operator_policy: Option<String>,
    /// Their merged definition.
    pub definition: Definition,
}

impl Applied {
    fn int(&self, key: &str) -> Option<u64> {
        self.definition
            .get(key)
            .and_then(PolicyValue::int)
            .map(|n| n.max(0) as u64)
    }

    fn text(&self, key: &str) -> Option<&str> {
        self.definition.get(key).and_then(PolicyValue::text)
    }

    /// The policy's `alternate-exchange`.
    pub fn alternate_exchange(&self) -> Option<&str> {
        self.text("alternate-exchange")
    }
}

/// The winner among `policies` for an object named `name`: the highest priority, then the
/// first name.
fn choose<'p>(
    policies: &'p BTreeMap<String, Policy>,
    name: &str,
    target: Target<'_>,
) -> Option<&'p Policy> {
    let mut best: Option<&Policy> = None;
    for p in policies.values() {
        if p.matches(name, target) && best.is_none_or(|b| p.priority > b.priority) {
            best = Some(p);
        }
    }
    best
}

impl Policies {
    /// What applies to the queue or exchange (`target`) named `name`.
    pub fn applied(&self, name: &str, target: Target<'_>) -> Applied {
        let user = choose(&self.user, name, target);
        let operator = choose(&self.operator, name, target);
        let mut definition = user.map(|p| p.definition.clone()).unwrap_or_default();
        if let Some(op) = operator {
            for (k, v) in &op.definition {
                let merged = match (definition.get(k), v) {
                    (Some(PolicyValue::Int(a)), PolicyValue::Int(b))
                        if LOWER_WINS.contains(&k.as_str()) =>
                    {
                        PolicyValue::Int(*a.min(b))
                    }
                    _ => v.clone(),
                };
                definition.insert(k.clone(), merged);
            }
        }
        Applied {
            policy: user.map(|p| p.name.clone()),
            operator_policy: operator.map(|p| p.name.clone()),
            definition,
        }
    }

    /// The policies of one kind (`operator`), by name.
    pub fn of(&self, operator: bool) -> &BTreeMap<String, Policy> {
        if operator {
            &self.operator
        } else {
            &self.user
        }
    }

    /// The policies of one kind, mutable.
    pub fn of_mut(&mut self, operator: bool) -> &mut BTreeMap<String, Policy> {
        if operator {
            &mut self.operator
        } else {
            &mut self.user
        }
    }
}

fn lower(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The settings a queue acts on: its `declared` arguments (parsed from `arguments`) merged
/// with what `applied` to it, as RabbitMQ's classic queues resolve them: the lower of the
/// argument and the policy for `message-ttl`, `expires`, `max-length` and
/// `max-length-bytes`, and for `consumer-timeout` (as RabbitMQ's channel resolves it, whatever
/// the queue type); the argument, when given, for `dead-letter-exchange`,
/// `dead-letter-routing-key` and `overflow`.
pub fn effective_queue_args(
    declared: &QueueArgs,
    overflow_declared: bool,
    applied: &Applied,
) -> QueueArgs {
    let mut out = declared.clone();
    out.message_ttl = lower(declared.message_ttl, applied.int("message-ttl"));
    out.expires = lower(declared.expires, applied.int("expires"));
    out.max_length = lower(declared.max_length, applied.int("max-length"));
    out.max_length_bytes = lower(declared.max_length_bytes, applied.int("max-length-bytes"));
    out.consumer_timeout = lower(declared.consumer_timeout, applied.int("consumer-timeout"));
    if !overflow_declared {
        out.overflow = match applied.text("overflow") {
            Some("reject-publish") => Overflow::RejectPublish,
            Some("reject-publish-dlx") => Overflow::RejectPublishDlx,
            _ => Overflow::DropHead,
        };
    }
    if declared.dead_letter_exchange.is_none() {
        out.dead_letter_exchange = applied.text("dead-letter-exchange").map(String::from);
    }
    if declared.dead_letter_routing_key.is_none() {
        out.dead_letter_routing_key = applied.text("dead-letter-routing-key").map(String::from);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn policy(name: &str, pattern: &str, apply_to: ApplyTo, priority: i64, def: Value) -> Policy {
        Policy::new(
            name,
            pattern,
            apply_to,
            priority,
            parse_definition(&def, false).unwrap(),
        )
        .unwrap()
    }

    fn policies(list: Vec<Policy>, ops: Vec<Policy>) -> Policies {
        Policies {
            user: list.into_iter().map(|p| (p.name.clone(), p)).collect(),
            operator: ops.into_iter().map(|p| (p.name.clone(), p)).collect(),
        }
    }

    #[test]
    fn highest_priority_wins_then_first_name() {
        let ps = policies(
            vec![
                policy("b", "^q", ApplyTo::All, 1, json!({"max-length": 1})),
                policy("a", "^q", ApplyTo::All, 1, json!({"max-length": 2})),
                policy("low", ".*", ApplyTo::All, 0, json!({"max-length": 3})),
                policy(
                    "high-x",
                    ".*",
                    ApplyTo::Exchanges,
                    9,
                    json!({"alternate-exchange": "ae"}),
                ),
            ],
            vec![],
        );
        let q = ps.applied("q1", Target::Queue("classic"));
        assert_eq!(q.policy.as_deref(), Some("a"));
        assert_eq!(q.int("max-length"), Some(2));
        assert_eq!(
            ps.applied("other", Target::Queue("classic"))
                .policy
                .as_deref(),
            Some("low")
        );
        assert_eq!(
            ps.applied("q1", Target::Exchange).policy.as_deref(),
            Some("high-x")
        );
        assert_eq!(
            Policies::default().applied("q", Target::Queue("classic")),
            Applied::default()
        );
    }

    #[test]
    fn operator_policy_takes_the_lower_limit() {
        let op = Policy::new(
            "op",
            ".*",
            ApplyTo::Queues,
            0,
            parse_definition(&json!({"max-length": 5, "message-ttl": 100000}), true).unwrap(),
        )
        .unwrap();
        let ps = policies(
            vec![policy(
                "p",
                ".*",
                ApplyTo::All,
                0,
                json!({"max-length": 10, "message-ttl": 1000, "dead-letter-exchange": "dlx"}),
            )],
            vec![op],
        );
        let a = ps.applied("q", Target::Queue("classic"));
        assert_eq!(a.operator_policy.as_deref(), Some("op"));
        assert_eq!(a.int("max-length"), Some(5));
        assert_eq!(a.int("message-ttl"), Some(1000));
        assert_eq!(a.text("dead-letter-exchange"), Some("dlx"));
    }

    #[test]
    fn arguments_and_policy_precedence() {
        let applied = Applied {
            definition: parse_definition(
                &json!({"max-length": 10, "message-ttl": 500, "expires": 60000,
                        "overflow": "reject-publish", "dead-letter-exchange": "pdlx",
                        "dead-letter-routing-key": "prk", "consumer-timeout": 30000}),
                false,
            )
            .unwrap(),
            ..Applied::default()
        };
        let declared = QueueArgs {
            max_length: Some(20),
            message_ttl: Some(100),
            dead_letter_exchange: Some("adlx".into()),
            overflow: Overflow::DropHead,
            consumer_timeout: Some(60000),
            ..QueueArgs::default()
        };
        let e = effective_queue_args(&declared, true, &applied);
        assert_eq!(e.consumer_timeout, Some(30000));
        assert_eq!(e.max_length, Some(10));
        assert_eq!(e.message_ttl, Some(100));
        assert_eq!(e.expires, Some(60000));
        assert_eq!(e.overflow, Overflow::DropHead);
        assert_eq!(e.dead_letter_exchange.as_deref(), Some("adlx"));
        assert_eq!(e.dead_letter_routing_key.as_deref(), Some("prk"));
        let e = effective_queue_args(&QueueArgs::default(), false, &applied);
        assert_eq!(e.consumer_timeout, Some(30000));
        let short = QueueArgs {
            consumer_timeout: Some(5000),
            ..QueueArgs::default()
        };
        assert_eq!(
            effective_queue_args(&short, false, &applied).consumer_timeout,
            Some(5000)
        );
        assert_eq!(e.overflow, Overflow::RejectPublish);
        assert_eq!(e.dead_letter_exchange.as_deref(), Some("pdlx"));
        assert_eq!(
            effective_queue_args(&declared, true, &Applied::default()),
            declared
        );
    }

    #[test]
    fn validation_reasons() {
        let err = |v: Value, op: bool| parse_definition(&v, op).unwrap_err();
        assert_eq!(
            err(json!({"foo": 1}), false),
            "Validation failed\n\n[{<<\"foo\">>,1}] are not recognised policy settings\n"
        );
        assert_eq!(
            err(json!({"foo": 1, "message-ttl": -1}), false),
            "Validation failed\n\n-1 is not a valid message TTL\n"
        );
        assert_eq!(
            err(json!({}), false),
            "Validation failed\n\nno policy provided\n"
        );
        assert_eq!(
            err(json!({"dead-letter-exchange": 1}), false),
            "Validation failed\n\n1 is not a valid dead letter exchange name\n"
        );
        assert_eq!(
            err(json!({"message-ttl": 1.5}), false),
            "Validation failed\n\n1.5 is not a valid message TTL\n"
        );
        assert_eq!(
            Policy::from_json("p", &json!({"definition": {"max-length": 1}}), false).unwrap_err(),
            "[{key_missing,pattern}]"
        );
        assert_eq!(
            Policy::from_json(
                "p",
                &json!({"pattern": "q", "definition": {"max-length": 1}, "priority": "x"}),
                false
            )
            .unwrap_err(),
            "Validation failed\n\npriority should be a number, actually was <<\"x\">>\n"
        );
        assert_eq!(
            Policy::from_json("p", &json!({"pattern": "q", "definition": {"max-length": 1}, "apply-to": "bogus"}), false).unwrap_err(),
            "Validation failed\n\napply-to 'bogus' unrecognised; should be one of: 'queues', 'classic_queues',  'quorum_queues', 'streams', 'exchanges', or 'all'\n"
        );
        assert_eq!(
            err(json!({"message-ttl": -1}), false),
            "Validation failed\n\n-1 is not a valid message TTL\n"
        );
        assert_eq!(
            err(json!({"max-length": "x"}), false),
            "Validation failed\n\n<<\"x\">> is not a valid maximum length\n"
        );
        assert_eq!(
            err(json!({"consumer-timeout": -1}), false),
            "Validation failed\n\n-1 is not a valid consumer timeout\n"
        );
        assert_eq!(
            err(json!({"consumer-timeout": "60000"}), false),
            "Validation failed\n\n<<\"60000\">> is not a valid consumer timeout\n"
        );
        assert_eq!(
            err(json!({"consumer-timeout": 60000}), true),
            "Validation failed\n\n[{<<\"consumer-timeout\">>,60000}] are not recognised policy settings\n"
        );
        assert_eq!(
            err(json!({"overflow": "drop-tail"}), false),
            "Validation failed\n\n<<\"drop-tail\">> is not a valid overflow value\n"
        );
        assert_eq!(
            err(json!({"dead-letter-exchange": "x"}), true),
            "Validation failed\n\n[{<<\"dead-letter-exchange\">>,<<\"x\">>}] are not recognised policy settings\n"
        );
        assert!(Policy::from_json(
            "p",
            &json!({"pattern": "(", "definition": {"max-length": 1}}),
            false
        )
        .is_err());
        let p = Policy::from_json(
            "p",
            &json!({"pattern": "^a", "definition": {"queue-mode": "lazy"}}),
            false,
        )
        .unwrap();
        assert_eq!((p.apply_to, p.priority), (ApplyTo::All, 0));
    }
}
