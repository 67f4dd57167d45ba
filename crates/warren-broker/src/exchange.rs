//! Exchanges and their routing tables.
//!
//! Each exchange type keeps the structure that makes routing a lookup rather than a scan:
//! direct = hash map from routing key, fanout = list, topic = [`TopicTrie`], headers = list of
//! patterns. Every binding is also kept in [`Exchange::bindings`] in creation order, for
//! unbinding, listing and cleanup when a queue or exchange goes away.
//!
//! RabbitMQ's delayed-message exchange (`x-delayed-message`, see [`crate::delayed`]) keeps the
//! table of its `x-delayed-type` and routes like it once a message's delay is over.

use crate::headers::{self, MatchMode};
use crate::topic::TopicTrie;
use std::collections::HashMap;
use warren_amqp::table::FieldTable;

/// The four exchange types of AMQP 0-9-1 (section 3.1.3), and RabbitMQ's delayed-message
/// exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExchangeKind {
    /// Routes on exact routing-key equality.
    Direct,
    /// Routes to every bound destination.
    Fanout,
    /// Routes on routing-key patterns with `*` and `#`.
    Topic,
    /// Routes on message headers.
    Headers,
    /// `x-delayed-message` (the rabbitmq_delayed_message_exchange plugin's type): holds each
    /// message for its `x-delay` header, then routes as its `x-delayed-type` argument says.
    DelayedMessage,
}

impl ExchangeKind {
    /// Parses the `type` field of exchange.declare.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "direct" => Some(Self::Direct),
            "fanout" => Some(Self::Fanout),
            "topic" => Some(Self::Topic),
            "headers" => Some(Self::Headers),
            crate::delayed::TYPE => Some(Self::DelayedMessage),
            _ => None,
        }
    }
    /// The type name as sent on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Fanout => "fanout",
            Self::Topic => "topic",
            Self::Headers => "headers",
            Self::DelayedMessage => crate::delayed::TYPE,
        }
    }
}

/// What a binding points at: a queue, or another exchange (RabbitMQ's exchange-to-exchange
/// bindings extension).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Destination {
    /// A queue, by name.
    Queue(String),
    /// An exchange, by name.
    Exchange(String),
}

impl Destination {
    /// The destination's name.
    pub fn name(&self) -> &str {
        match self {
            Destination::Queue(n) | Destination::Exchange(n) => n,
        }
    }
}

/// One binding from an exchange to a destination. Two bindings are the same binding when
/// destination, routing key and arguments are all equal.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    /// Where matching messages go.
    pub destination: Destination,
    /// Binding key.
    pub routing_key: String,
    /// Binding arguments (the match pattern for headers exchanges).
    pub arguments: FieldTable,
}

#[derive(Debug)]
enum Table {
    Direct(HashMap<String, Vec<Destination>>),
    Fanout,
    Topic(TopicTrie<Destination>),
    Headers,
}

/// An exchange: its declared properties and its bindings.
#[derive(Debug)]
pub struct Exchange {
    /// Name (`""` is the default exchange).
    pub name: String,
    /// Type.
    pub kind: ExchangeKind,
    /// Survives a restart.
    pub durable: bool,
    /// Deleted when its last binding (as a source) is removed.
    pub auto_delete: bool,
    /// Clients cannot publish to it directly; only exchange-to-exchange bindings feed it.
    pub internal: bool,
    /// Declared arguments (e.g. `alternate-exchange`).
    pub arguments: FieldTable,
    bindings: Vec<Binding>,
    /// The policy and operator policy that apply, and their merged definition.
    applied: std::sync::Arc<crate::policy::Applied>,
    /// The type whose routing table this exchange keeps: `kind`, or the `x-delayed-type` of
    /// a delayed-message exchange.
    routing_kind: ExchangeKind,
    table: Table,
}

impl Exchange {
    /// A new exchange with no bindings. A delayed-message exchange routes as its
    /// `x-delayed-type` argument (validated at exchange.declare; direct when it is unusable).
    pub fn new(
        name: impl Into<String>,
        kind: ExchangeKind,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: FieldTable,
    ) -> Self {
        let routing_kind = match kind {
            ExchangeKind::DelayedMessage => {
                crate::delayed::routing_kind(&arguments).unwrap_or(ExchangeKind::Direct)
            }
            other => other,
        };
        let table = match routing_kind {
            ExchangeKind::Direct | ExchangeKind::DelayedMessage => Table::Direct(HashMap::new()),
            ExchangeKind::Fanout => Table::Fanout,
            ExchangeKind::Topic => Table::Topic(TopicTrie::new()),
            ExchangeKind::Headers => Table::Headers,
        };
        Exchange {
            name: name.into(),
            kind,
            durable,
            auto_delete,
            internal,
            arguments,
            bindings: Vec::new(),
            applied: std::sync::Arc::default(),
            routing_kind,
            table,
        }
    }

    /// The type this exchange routes as: its own, or a delayed-message exchange's
    /// `x-delayed-type`.
    pub fn routing_kind(&self) -> ExchangeKind {
        self.routing_kind
    }

    /// Bindings in creation order.
    pub fn bindings(&self) -> &[Binding] {
        &self.bindings
    }

    /// The alternate exchange (RabbitMQ extension): the `alternate-exchange` argument, else
    /// the one of the policy that applies.
    pub fn alternate_exchange(&self) -> Option<&str> {
        match self.arguments.get("alternate-exchange") {
            Some(v) => v.as_str(),
            None => self.applied.alternate_exchange(),
        }
    }

    /// The policy and operator policy applied to the exchange.
    pub fn applied_policy(&self) -> &std::sync::Arc<crate::policy::Applied> {
        &self.applied
    }

    /// Applies `applied` (the policies matching the exchange now).
    pub fn apply_policy(&mut self, applied: crate::policy::Applied) {
        if *self.applied != applied {
            self.applied = std::sync::Arc::new(applied);
        }
    }

    /// Adds a binding; returns false when the identical binding already exists (binding is
    /// idempotent in AMQP).
    pub fn bind(&mut self, binding: Binding) -> bool {
        if self.bindings.contains(&binding) {
            return false;
        }
        match &mut self.table {
            Table::Direct(map) => {
                let dests = map.entry(binding.routing_key.clone()).or_default();
                if !dests.contains(&binding.destination) {
                    dests.push(binding.destination.clone());
                }
            }
            Table::Topic(trie) => trie.insert(&binding.routing_key, binding.destination.clone()),
            Table::Fanout | Table::Headers => {}
        }
        self.bindings.push(binding);
        true
    }

    /// Removes a binding; returns whether it existed.
    pub fn unbind(&mut self, binding: &Binding) -> bool {
        let Some(pos) = self.bindings.iter().position(|b| b == binding) else {
            return false;
        };
        self.bindings.remove(pos);
        self.reindex_key(&binding.routing_key, &binding.destination);
        true
    }

    /// Removes every binding to `destination`; returns how many were removed.
    pub fn unbind_destination(&mut self, destination: &Destination) -> usize {
        let removed: Vec<Binding> = self
            .bindings
            .iter()
            .filter(|b| &b.destination == destination)
            .cloned()
            .collect();
        self.bindings.retain(|b| &b.destination != destination);
        for b in &removed {
            self.reindex_key(&b.routing_key, &b.destination);
        }
        removed.len()
    }

    /// After removing a binding, drops (key, destination) from the index unless another binding
    /// with the same key and destination (different arguments) remains.
    fn reindex_key(&mut self, key: &str, dest: &Destination) {
        let still = self
            .bindings
            .iter()
            .any(|b| b.routing_key == key && &b.destination == dest);
        if still {
            return;
        }
        match &mut self.table {
            Table::Direct(map) => {
                if let Some(v) = map.get_mut(key) {
                    v.retain(|d| d != dest);
                    if v.is_empty() {
                        map.remove(key);
                    }
                }
            }
            Table::Topic(trie) => {
                trie.remove(key, dest);
            }
            Table::Fanout | Table::Headers => {}
        }
    }

    /// Calls `out` with each destination matching a message; a destination may be reported more
    /// than once.
    pub fn route(
        &self,
        routing_key: &str,
        headers: Option<&FieldTable>,
        out: &mut impl FnMut(&Destination),
    ) {
        match &self.table {
            Table::Direct(map) => {
                if let Some(dests) = map.get(routing_key) {
                    dests.iter().for_each(&mut *out);
                }
            }
            Table::Fanout => self.bindings.iter().for_each(|b| out(&b.destination)),
            Table::Topic(trie) => trie.matches(routing_key, out),
            Table::Headers => {
                for b in &self.bindings {
                    let mode = MatchMode::from_args(&b.arguments).unwrap_or(MatchMode::All);
                    if headers::matches(&b.arguments, mode, headers) {
                        out(&b.destination);
                    }
                }
            }
        }
    }

    /// Routes a message that carries several routing keys (its routing key, then its `CC`
    /// and `BCC` header keys: RabbitMQ's sender-selected distribution): direct and topic
    /// exchanges match each key, fanout and headers exchanges ignore keys and route once.
    /// A destination may be reported more than once.
    ///
    /// A topic exchange visits at most `*budget` trie nodes for all keys together (see
    /// [`TopicTrie::matches_within`]); returns false when that was not enough.
    pub fn route_keys(
        &self,
        keys: &[&str],
        headers: Option<&FieldTable>,
        budget: &mut usize,
        out: &mut impl FnMut(&Destination),
    ) -> bool {
        match &self.table {
            Table::Topic(trie) => keys.iter().all(|key| trie.matches_within(key, budget, out)),
            Table::Direct(_) => {
                for key in keys {
                    self.route(key, headers, out);
                }
                true
            }
            Table::Fanout | Table::Headers => {
                self.route("", headers, out);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(n: &str) -> Destination {
        Destination::Queue(n.into())
    }
    fn binding(d: Destination, key: &str) -> Binding {
        Binding {
            destination: d,
            routing_key: key.into(),
            arguments: FieldTable::new(),
        }
    }
    fn routed(x: &Exchange, key: &str) -> Vec<Destination> {
        let mut v = Vec::new();
        x.route(key, None, &mut |d| {
            if !v.contains(d) {
                v.push(d.clone())
            }
        });
        v
    }

    #[test]
    fn direct_bind_unbind() {
        let mut x = Exchange::new(
            "x",
            ExchangeKind::Direct,
            false,
            false,
            false,
            FieldTable::new(),
        );
        assert!(x.bind(binding(q("a"), "k")));
        assert!(!x.bind(binding(q("a"), "k")));
        assert!(x.bind(binding(q("b"), "k")));
        assert_eq!(routed(&x, "k"), vec![q("a"), q("b")]);
        assert!(routed(&x, "other").is_empty());
        assert!(x.unbind(&binding(q("a"), "k")));
        assert_eq!(routed(&x, "k"), vec![q("b")]);
        assert_eq!(x.unbind_destination(&q("b")), 1);
        assert!(routed(&x, "k").is_empty());
    }

    #[test]
    fn same_key_different_args_keeps_route() {
        let mut x = Exchange::new(
            "x",
            ExchangeKind::Topic,
            false,
            false,
            false,
            FieldTable::new(),
        );
        let mut b2 = binding(q("a"), "k.*");
        b2.arguments
            .insert("x-foo", warren_amqp::table::FieldValue::Bool(true));
        x.bind(binding(q("a"), "k.*"));
        x.bind(b2.clone());
        x.unbind(&b2);
        assert_eq!(routed(&x, "k.z"), vec![q("a")]);
    }

    #[test]
    fn fanout_ignores_key() {
        let mut x = Exchange::new(
            "f",
            ExchangeKind::Fanout,
            false,
            false,
            false,
            FieldTable::new(),
        );
        x.bind(binding(q("a"), ""));
        x.bind(binding(Destination::Exchange("e".into()), "zzz"));
        assert_eq!(routed(&x, "anything").len(), 2);
    }
}
