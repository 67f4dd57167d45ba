//! Exchanges and their routing tables.
//!
//! Each exchange type keeps the structure that makes routing a lookup rather than a scan:
//! direct = hash map from routing key, fanout = list, topic = [`TopicTrie`], headers = list of
//! patterns. Every binding is also kept in creation order ([`Exchange::bindings`], for
//! listing) and by destination, so that binding, unbinding and the cleanup when a queue or
//! exchange goes away cost the number of that destination's bindings, not of the
//! exchange's: the same with 100,000 queues bound as with one.
//!
//! RabbitMQ's delayed-message exchange (`x-delayed-message`, see [`crate::delayed`]) keeps the
//! table of its `x-delayed-type` and routes like it once a message's delay is over.

use crate::headers::{self, MatchMode};
use crate::topic::TopicTrie;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;
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
/// bindings extension). The name is shared: a vhost's bindings to a queue hold the queue's
/// own name (see `QueueBackend::shared_name`), so that a binding costs no copy of it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Destination {
    /// A queue, by name.
    Queue(Arc<str>),
    /// An exchange, by name.
    Exchange(Arc<str>),
}

impl Destination {
    /// The destination's name.
    pub fn name(&self) -> &str {
        match self {
            Destination::Queue(n) | Destination::Exchange(n) => n,
        }
    }

    /// True for the default exchange (the empty name), which takes no bindings.
    pub fn is_default_exchange(&self) -> bool {
        matches!(self, Destination::Exchange(x) if x.is_empty())
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
    bindings: BindingSet,
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
            bindings: BindingSet::default(),
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
    pub fn bindings(&self) -> impl Iterator<Item = &Binding> + Clone {
        self.bindings.iter()
    }

    /// The number of bindings (with this exchange as their source).
    pub fn binding_count(&self) -> usize {
        self.bindings.live
    }

    /// Whether the identical binding (destination, key and arguments) exists. Costs a hash
    /// lookup and a look at the destination's own bindings, whatever the exchange's size.
    pub fn has_binding(&self, binding: &Binding) -> bool {
        self.bindings.find(binding).is_some()
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
        if !self
            .bindings
            .has_key(&binding.routing_key, &binding.destination)
        {
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
        self.bindings.insert(binding);
        true
    }

    /// Removes a binding; returns whether it existed.
    pub fn unbind(&mut self, binding: &Binding) -> bool {
        if !self.bindings.remove(binding) {
            return false;
        }
        self.reindex_key(&binding.routing_key, &binding.destination);
        true
    }

    /// Bindings to `destination`, in creation order.
    pub fn bindings_to<'a>(
        &'a self,
        destination: &Destination,
    ) -> impl Iterator<Item = &'a Binding> + 'a {
        let slots = self.bindings.slots_of(destination);
        let destination = destination.clone();
        slots
            .iter()
            .filter_map(|&i| self.bindings.slots[i as usize].as_ref())
            .filter(move |b| b.destination == destination)
    }

    /// Removes every binding to `destination`; returns them, in creation order.
    pub fn unbind_destination(&mut self, destination: &Destination) -> Vec<Binding> {
        let removed = self.bindings.remove_destination(destination);
        for b in &removed {
            self.reindex_key(&b.routing_key, &b.destination);
        }
        removed
    }

    /// After removing a binding, drops (key, destination) from the index unless another binding
    /// with the same key and destination (different arguments) remains.
    fn reindex_key(&mut self, key: &str, dest: &Destination) {
        if self.bindings.has_key(key, dest) {
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
                for b in self.bindings.iter() {
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

/// An exchange's bindings: a list in creation order (a removed binding leaves a hole until
/// holes outnumber bindings, when the list is compacted), and an index from each
/// destination to its bindings' places in the list. The index is keyed by the hash of the
/// destination (with the index's own randomly keyed hasher), so that it holds no copy of the
/// destination's name: about 40 bytes per binding beside the binding itself.
#[derive(Debug, Default)]
struct BindingSet {
    slots: Vec<Option<Binding>>,
    /// Bindings in `slots` (the others are holes).
    live: usize,
    /// Places in `slots` of the bindings whose destination has this hash.
    by_destination: HashMap<u64, Places>,
}

/// The places of the bindings to one destination (or to several whose hashes collide).
#[derive(Debug)]
enum Places {
    One(u32),
    Many(Vec<u32>),
}

impl Places {
    fn as_slice(&self) -> &[u32] {
        match self {
            Places::One(i) => std::slice::from_ref(i),
            Places::Many(v) => v,
        }
    }
}

impl BindingSet {
    fn iter(&self) -> impl Iterator<Item = &Binding> + Clone {
        self.slots.iter().flatten()
    }

    fn hash(&self, d: &Destination) -> u64 {
        self.by_destination.hasher().hash_one(d)
    }

    /// The places of the bindings whose destination hashes as `d`'s (check each binding).
    fn slots_of(&self, d: &Destination) -> &[u32] {
        self.by_destination
            .get(&self.hash(d))
            .map_or(&[], Places::as_slice)
    }

    fn find(&self, b: &Binding) -> Option<u32> {
        self.slots_of(&b.destination)
            .iter()
            .copied()
            .find(|&i| self.slots[i as usize].as_ref() == Some(b))
    }

    /// Whether a binding to `dest` with routing key `key` exists (whatever its arguments).
    fn has_key(&self, key: &str, dest: &Destination) -> bool {
        self.slots_of(dest).iter().any(|&i| {
            self.slots[i as usize]
                .as_ref()
                .is_some_and(|b| b.routing_key == key && &b.destination == dest)
        })
    }

    fn index(&mut self, h: u64, i: u32) {
        match self.by_destination.entry(h) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Places::One(i));
            }
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let p = e.get_mut();
                match p {
                    Places::One(j) => *p = Places::Many(vec![*j, i]),
                    Places::Many(v) => v.push(i),
                }
            }
        }
    }

    fn insert(&mut self, b: Binding) {
        let h = self.hash(&b.destination);
        let i = u32::try_from(self.slots.len()).expect("fewer than 2^32 binding places");
        self.slots.push(Some(b));
        self.live += 1;
        self.index(h, i);
    }

    /// Takes the binding at place `i` out of the list and the index.
    fn take(&mut self, h: u64, i: u32) -> Option<Binding> {
        let b = self.slots[i as usize].take()?;
        self.live -= 1;
        if let Some(p) = self.by_destination.get_mut(&h) {
            match p {
                Places::One(_) => {
                    self.by_destination.remove(&h);
                }
                Places::Many(v) => {
                    v.retain(|&j| j != i);
                    if let [only] = v.as_slice() {
                        *p = Places::One(*only);
                    }
                }
            }
        }
        Some(b)
    }

    fn remove(&mut self, b: &Binding) -> bool {
        let Some(i) = self.find(b) else {
            return false;
        };
        let h = self.hash(&b.destination);
        self.take(h, i);
        self.compact();
        true
    }

    /// Removes every binding to `d`; returns them in creation order. Costs the number of
    /// `d`'s bindings (the index entry goes at once, then any colliding destination's places
    /// are put back).
    fn remove_destination(&mut self, d: &Destination) -> Vec<Binding> {
        let h = self.hash(d);
        let Some(places) = self.by_destination.remove(&h) else {
            return Vec::new();
        };
        let mut removed = Vec::new();
        let mut others = Vec::new();
        for &i in places.as_slice() {
            let slot = &mut self.slots[i as usize];
            if slot.as_ref().is_some_and(|b| &b.destination == d) {
                removed.extend(slot.take());
                self.live -= 1;
            } else {
                others.push(i);
            }
        }
        for i in others {
            self.index(h, i);
        }
        self.compact();
        removed
    }

    /// Closes the holes once they outnumber the bindings (and number more than 64): each
    /// binding moves at most once per as many removals, so removal stays O(1) amortized.
    fn compact(&mut self) {
        let holes = self.slots.len() - self.live;
        if holes <= 64 || holes <= self.live {
            return;
        }
        self.slots.retain(Option::is_some);
        self.slots.shrink_to_fit();
        self.by_destination.clear();
        for i in 0..self.slots.len() {
            let h = self.hash(&self.slots[i].as_ref().expect("kept").destination);
            self.index(h, i as u32);
        }
        self.by_destination.shrink_to_fit();
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
        // Removing most of them compacts the list; what is left keeps its order and is
        // still found by destination.
        for i in (0..1000).filter(|i| i % 10 != 3) {
            let b = binding(q(&format!("q{i}")), &format!("k.{i}.#"));
            assert_eq!(x.unbind(&b), i != 7, "q{i}");
        }
        let keys: Vec<&str> = x.bindings().map(|b| b.routing_key.as_str()).collect();
        assert_eq!(keys.len(), 100);
        assert_eq!(keys[..3], ["k.3.#", "k.13.#", "k.23.#"]);
        assert_eq!(x.binding_count(), 100);
        assert!(x.has_binding(&binding(q("q993"), "k.993.#")));
        assert!(!x.has_binding(&binding(q("q994"), "k.994.#")));
        assert_eq!(x.unbind_destination(&q("q993")).len(), 1);
        assert!(x.bind(binding(q("q993"), "again")));
        assert_eq!(
            x.bindings().last().map(|b| b.routing_key.as_str()),
            Some("again")
        );
        assert_eq!(routed(&x, "k.983.z"), vec![q("q983")]);
        assert!(routed(&x, "k.984.z").is_empty());
        // One destination with many bindings, between others: all go at once, in order.
        for i in 0..3000 {
            x.bind(binding(q("many"), &format!("m.{i}")));
            x.bind(binding(q(&format!("o{i}")), &format!("m.{i}")));
        }
        let gone = x.unbind_destination(&q("many"));
        assert_eq!(gone.len(), 3000);
        assert_eq!(gone[2999].routing_key, "m.2999");
        assert!(gone
            .windows(2)
            .all(|w| w[0].routing_key != w[1].routing_key));
        assert_eq!(routed(&x, "m.17"), vec![q("o17")]);
        assert_eq!(x.binding_count(), 3100);
    }
}
