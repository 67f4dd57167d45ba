//! Exchanges and their routing tables.
//!
//! Each exchange type keeps the structure that makes routing a lookup rather than a scan:
//! direct = hash map from routing key, fanout = list, topic = [`TopicTrie`], headers = list of
//! patterns. Every binding is also kept in creation order ([`Exchange::bindings`], for
//! listing) and by destination, so that binding, unbinding and the cleanup when a queue or
//! exchange goes away cost the same with one binding as with 100,000.
//!
//! RabbitMQ's delayed-message exchange (`x-delayed-message`, see [`crate::delayed`]) keeps the
//! table of its `x-delayed-type` and routes like it once a message's delay is over.

use crate::headers::{self, MatchMode};
use crate::topic::TopicTrie;
use std::collections::{BTreeMap, HashMap};
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
    /// Every binding, by creation number (creation order).
    bindings: BTreeMap<u64, Binding>,
    /// The creation numbers of each destination's bindings.
    by_destination: HashMap<Destination, Vec<u64>>,
    /// The creation number of the next binding.
    next_binding: u64,
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
            bindings: BTreeMap::new(),
            by_destination: HashMap::new(),
            next_binding: 0,
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
    pub fn bindings(
        &self,
    ) -> impl ExactSizeIterator<Item = &Binding> + DoubleEndedIterator + Clone {
        self.bindings.values()
    }

    /// The number of bindings (with this exchange as their source).
    pub fn binding_count(&self) -> usize {
        self.bindings.len()
    }

    /// Whether the identical binding (destination, key and arguments) exists. Costs a hash
    /// lookup and a look at the destination's own bindings, whatever the exchange's size.
    pub fn has_binding(&self, binding: &Binding) -> bool {
        self.find(binding).is_some()
    }

    /// The creation number of the binding identical to `binding`.
    fn find(&self, binding: &Binding) -> Option<u64> {
        self.by_destination
            .get(&binding.destination)?
            .iter()
            .copied()
            .find(|n| self.bindings.get(n) == Some(binding))
    }

    /// Whether a binding to `dest` with routing key `key` exists (whatever its arguments).
    fn has_key(&self, key: &str, dest: &Destination) -> bool {
        self.by_destination.get(dest).is_some_and(|ns| {
            ns.iter()
                .any(|n| self.bindings.get(n).is_some_and(|b| b.routing_key == key))
        })
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
        if self.has_binding(&binding) {
            return false;
        }
        // The routing table holds (key, destination) once, whatever the arguments.
        if !self.has_key(&binding.routing_key, &binding.destination) {
            match &mut self.table {
                Table::Direct(map) => map
                    .entry(binding.routing_key.clone())
                    .or_default()
                    .push(binding.destination.clone()),
                Table::Topic(trie) => {
                    trie.insert(&binding.routing_key, binding.destination.clone())
                }
                Table::Fanout | Table::Headers => {}
            }
        }
        let n = self.next_binding;
        self.next_binding += 1;
        self.by_destination
            .entry(binding.destination.clone())
            .or_default()
            .push(n);
        self.bindings.insert(n, binding);
        true
    }

    /// Removes a binding; returns whether it existed.
    pub fn unbind(&mut self, binding: &Binding) -> bool {
        let Some(n) = self.find(binding) else {
            return false;
        };
        self.bindings.remove(&n);
        if let Some(ns) = self.by_destination.get_mut(&binding.destination) {
            ns.retain(|&m| m != n);
            if ns.is_empty() {
                self.by_destination.remove(&binding.destination);
            }
        }
        self.reindex_key(&binding.routing_key, &binding.destination);
        true
    }

    /// Bindings to `destination`, in creation order.
    pub fn bindings_to<'a>(
        &'a self,
        destination: &Destination,
    ) -> impl Iterator<Item = &'a Binding> + 'a {
        self.by_destination
            .get(destination)
            .map(|ns| ns.as_slice())
            .unwrap_or_default()
            .iter()
            .filter_map(|n| self.bindings.get(n))
    }

    /// Removes every binding to `destination`; returns them, in creation order.
    pub fn unbind_destination(&mut self, destination: &Destination) -> Vec<Binding> {
        let removed: Vec<Binding> = self
            .by_destination
            .remove(destination)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|n| self.bindings.remove(&n))
            .collect();
        for b in &removed {
            self.reindex_key(&b.routing_key, &b.destination);
        }
        removed
    }

    /// After removing a binding, drops (key, destination) from the index unless another binding
    /// with the same key and destination (different arguments) remains.
    fn reindex_key(&mut self, key: &str, dest: &Destination) {
        if self.has_key(key, dest) {
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
            Table::Fanout => self.bindings.values().for_each(|b| out(&b.destination)),
            Table::Topic(trie) => trie.matches(routing_key, out),
            Table::Headers => {
                for b in self.bindings.values() {
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
        assert_eq!(x.unbind_destination(&q("b")).len(), 1);
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

    #[test]
    fn bindings_keep_creation_order_and_are_found_by_destination() {
        let mut x = Exchange::new(
            "t",
            ExchangeKind::Topic,
            false,
            false,
            false,
            FieldTable::new(),
        );
        for i in 0..1000 {
            assert!(x.bind(binding(q(&format!("q{i}")), &format!("k.{i}.#"))));
        }
        let mut with_args = binding(q("q7"), "k.7.#");
        with_args
            .arguments
            .insert("x-foo", warren_amqp::table::FieldValue::Bool(true));
        assert!(x.bind(with_args.clone()));
        assert!(!x.bind(with_args.clone()));
        assert!(x.bind(binding(q("q7"), "other")));
        assert_eq!(x.binding_count(), 1002);
        assert!(x.has_binding(&binding(q("q999"), "k.999.#")));
        assert!(!x.has_binding(&binding(q("q999"), "k.998.#")));
        // Unbinding one of two bindings with the same key keeps the route.
        assert!(x.unbind(&binding(q("q7"), "k.7.#")));
        assert_eq!(routed(&x, "k.7.z"), vec![q("q7")]);
        let to7: Vec<&str> = x
            .bindings_to(&q("q7"))
            .map(|b| b.routing_key.as_str())
            .collect();
        assert_eq!(to7, ["k.7.#", "other"]);
        let gone = x.unbind_destination(&q("q7"));
        assert_eq!(gone, vec![with_args, binding(q("q7"), "other")]);
        assert!(routed(&x, "k.7.z").is_empty());
        assert!(routed(&x, "other").is_empty());
        assert_eq!(x.bindings_to(&q("q7")).count(), 0);
        // The rest, in creation order.
        let keys: Vec<&str> = x.bindings().map(|b| b.routing_key.as_str()).collect();
        assert_eq!(keys.len(), 999);
        assert_eq!(keys[..3], ["k.0.#", "k.1.#", "k.2.#"]);
        assert_eq!(keys[7], "k.8.#");
        assert_eq!(routed(&x, "k.500.a.b"), vec![q("q500")]);
    }
}
