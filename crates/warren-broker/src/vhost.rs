//! Virtual hosts: the exchanges, queues and bindings of one namespace, and the [`Broker`] that
//! holds every vhost and the user table.
//!
//! All topology changes (declare, delete, bind) take the vhost's write lock; routing a publish
//! takes the read lock only, so publishers on different connections route in parallel.

use crate::auth::Users;
use crate::error::{resource, BrokerError, Result};
use crate::exchange::{Binding, Destination, Exchange, ExchangeKind};
use crate::names;
use crate::queue::{Consumer, Queue, QueueCounts};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use warren_amqp::table::{FieldTable, FieldValue};

/// Queue arguments whose values must match when a queue is redeclared (RabbitMQ compares these
/// and ignores any other argument).
const EQUIVALENT_QUEUE_ARGS: &[&str] = &[
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    "x-max-in-memory-length",
    "x-max-in-memory-bytes",
    "x-max-priority",
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-queue-version",
    "x-single-active-consumer",
    "x-delivery-limit",
];

/// The broker: vhosts and users.
pub struct Broker {
    vhosts: RwLock<HashMap<String, Arc<VHost>>>,
    /// The user table.
    pub users: RwLock<Users>,
}

impl Broker {
    /// A broker with the default vhost `/` and the given users.
    pub fn new(users: Users) -> Self {
        let b = Broker {
            vhosts: RwLock::new(HashMap::new()),
            users: RwLock::new(users),
        };
        b.add_vhost("/");
        b
    }

    /// Creates a vhost with the standard exchanges if it does not exist; returns it.
    pub fn add_vhost(&self, name: &str) -> Arc<VHost> {
        self.vhosts
            .write()
            .entry(name.to_string())
            .or_insert_with(|| Arc::new(VHost::new(name)))
            .clone()
    }

    /// Looks up a vhost.
    pub fn vhost(&self, name: &str) -> Option<Arc<VHost>> {
        self.vhosts.read().get(name).cloned()
    }

    /// Names of all vhosts.
    pub fn vhost_names(&self) -> Vec<String> {
        self.vhosts.read().keys().cloned().collect()
    }
}

/// A virtual host.
pub struct VHost {
    /// The vhost's name (`/` by default).
    pub name: String,
    topology: RwLock<Topology>,
}

#[derive(Default)]
struct Topology {
    exchanges: HashMap<String, Exchange>,
    queues: HashMap<String, Arc<Queue>>,
}

/// The flags and arguments of exchange.declare.
#[derive(Debug, Clone, Default)]
pub struct ExchangeDeclare {
    /// Exchange name.
    pub name: String,
    /// Type name (`direct`, `fanout`, `topic`, `headers`).
    pub kind: String,
    /// Only check that the exchange exists.
    pub passive: bool,
    /// Survives restarts.
    pub durable: bool,
    /// Deleted with its last binding.
    pub auto_delete: bool,
    /// Not publishable by clients.
    pub internal: bool,
    /// Arguments.
    pub arguments: FieldTable,
}

/// The flags and arguments of queue.declare.
#[derive(Debug, Clone, Default)]
pub struct QueueDeclare {
    /// Queue name; empty asks the server for an `amq.gen-…` name.
    pub name: String,
    /// Only check that the queue exists.
    pub passive: bool,
    /// Survives restarts.
    pub durable: bool,
    /// Owned by the declaring connection and deleted with it.
    pub exclusive: bool,
    /// Deleted when its last consumer goes.
    pub auto_delete: bool,
    /// Arguments (`x-…`).
    pub arguments: FieldTable,
}

impl VHost {
    /// A vhost with the default exchange and `amq.direct`, `amq.fanout`, `amq.topic`,
    /// `amq.headers` and `amq.match`, all durable, as RabbitMQ pre-declares them.
    pub fn new(name: &str) -> Self {
        let mut topo = Topology::default();
        for (n, k) in [
            ("", ExchangeKind::Direct),
            ("amq.direct", ExchangeKind::Direct),
            ("amq.fanout", ExchangeKind::Fanout),
            ("amq.topic", ExchangeKind::Topic),
            ("amq.headers", ExchangeKind::Headers),
            ("amq.match", ExchangeKind::Headers),
        ] {
            topo.exchanges.insert(
                n.into(),
                Exchange::new(n, k, true, false, false, FieldTable::new()),
            );
        }
        VHost {
            name: name.to_string(),
            topology: RwLock::new(topo),
        }
    }

    fn exchange_resource(&self, name: &str) -> String {
        resource("exchange", name, &self.name)
    }

    fn queue_resource(&self, name: &str) -> String {
        resource("queue", name, &self.name)
    }

    fn no_exchange(&self, name: &str) -> BrokerError {
        BrokerError::not_found(format!("no {}", self.exchange_resource(name)))
    }

    fn no_queue(&self, name: &str) -> BrokerError {
        BrokerError::not_found(format!("no {}", self.queue_resource(name)))
    }

    /// exchange.declare. Errors: 404 (passive, missing), 403 (`amq.` prefix or default
    /// exchange), 503 (unknown type), 406 (inequivalent type, flags or `alternate-exchange`).
    pub fn declare_exchange(&self, d: &ExchangeDeclare) -> Result<()> {
        if d.passive {
            let topo = self.topology.read();
            return match topo.exchanges.get(&d.name) {
                Some(_) => Ok(()),
                None => Err(self.no_exchange(&d.name)),
            };
        }
        if d.name.is_empty() {
            return Err(default_exchange_refused());
        }
        let kind = ExchangeKind::parse(&d.kind).ok_or_else(|| {
            BrokerError::command_invalid(format!("invalid exchange type '{}'", d.kind))
        })?;
        if d.name.starts_with("amq.") {
            return Err(BrokerError::access_refused(format!(
                "exchange name '{}' contains reserved prefix 'amq.*'",
                d.name
            )));
        }
        let mut topo = self.topology.write();
        if let Some(x) = topo.exchanges.get(&d.name) {
            let what = self.exchange_resource(&d.name);
            check_field(&what, "type", x.kind.as_str(), kind.as_str())?;
            check_field(&what, "durable", x.durable, d.durable)?;
            check_field(&what, "auto_delete", x.auto_delete, d.auto_delete)?;
            check_field(&what, "internal", x.internal, d.internal)?;
            check_args(&what, &x.arguments, &d.arguments, &["alternate-exchange"])?;
            return Ok(());
        }
        topo.exchanges.insert(
            d.name.clone(),
            Exchange::new(
                d.name.clone(),
                kind,
                d.durable,
                d.auto_delete,
                d.internal,
                d.arguments.clone(),
            ),
        );
        Ok(())
    }

    /// exchange.delete. Deleting a missing exchange succeeds, as in RabbitMQ. Errors: 403 for the
    /// default exchange and `amq.` exchanges, 406 with `if_unused` when it is a binding source.
    pub fn delete_exchange(&self, name: &str, if_unused: bool) -> Result<()> {
        if name.is_empty() {
            return Err(default_exchange_refused());
        }
        if name.starts_with("amq.") {
            return Err(BrokerError::access_refused(format!(
                "exchange name '{name}' contains reserved prefix 'amq.*'"
            )));
        }
        let mut topo = self.topology.write();
        let Some(x) = topo.exchanges.get(name) else {
            return Ok(());
        };
        if if_unused && !x.bindings().is_empty() {
            return Err(BrokerError::precondition_failed(format!(
                "{} in use",
                self.exchange_resource(name)
            )));
        }
        topo.remove_exchange(name);
        Ok(())
    }

    /// True when the exchange exists.
    pub fn exchange_exists(&self, name: &str) -> bool {
        self.topology.read().exchanges.contains_key(name)
    }

    /// queue.declare, for connection `connection_id`. Returns the queue and its counts.
    ///
    /// Errors: 404 (passive, missing), 403 (`amq.` prefix), 405 (exclusive to another
    /// connection, or exclusivity differs), 406 (inequivalent durable/auto_delete/arguments).
    pub fn declare_queue(
        &self,
        d: &QueueDeclare,
        connection_id: u64,
    ) -> Result<(Arc<Queue>, QueueCounts)> {
        if d.passive {
            let q = self.queue(&d.name, connection_id)?;
            let counts = q.counts();
            return Ok((q, counts));
        }
        let name = if d.name.is_empty() {
            names::queue_name()
        } else {
            if d.name.starts_with("amq.") {
                return Err(BrokerError::access_refused(format!(
                    "queue name '{}' contains reserved prefix 'amq.*'",
                    d.name
                )));
            }
            d.name.clone()
        };
        let mut topo = self.topology.write();
        if let Some(q) = topo.queues.get(&name) {
            let owner = d.exclusive.then_some(connection_id);
            if q.exclusive_owner != owner {
                // Reuse the 405 text of check_exclusive.
                return Err(q
                    .check_exclusive(u64::MAX)
                    .err()
                    .unwrap_or_else(|| locked_queue(q)));
            }
            let what = self.queue_resource(&name);
            check_field(&what, "durable", q.durable, d.durable)?;
            check_field(&what, "auto_delete", q.auto_delete, d.auto_delete)?;
            check_args(&what, &q.arguments, &d.arguments, EQUIVALENT_QUEUE_ARGS)?;
            let counts = q.counts();
            return Ok((q.clone(), counts));
        }
        let q = Arc::new(Queue::new(
            name.clone(),
            self.name.clone(),
            d.durable,
            d.exclusive.then_some(connection_id),
            d.auto_delete,
            d.arguments.clone(),
        ));
        topo.queues.insert(name, q.clone());
        Ok((q, QueueCounts::default()))
    }

    /// Looks a queue up for connection `connection_id`: 404 when missing, 405 when exclusive to
    /// another connection.
    pub fn queue(&self, name: &str, connection_id: u64) -> Result<Arc<Queue>> {
        let q = self
            .topology
            .read()
            .queues
            .get(name)
            .cloned()
            .ok_or_else(|| self.no_queue(name))?;
        q.check_exclusive(connection_id)?;
        Ok(q)
    }

    /// All queues, in no particular order.
    pub fn queues(&self) -> Vec<Arc<Queue>> {
        self.topology.read().queues.values().cloned().collect()
    }

    /// queue.delete; returns the number of ready messages deleted. A missing queue is deleted
    /// successfully with count 0, as in RabbitMQ. Errors: 405, 406 (`if_unused`, `if_empty`).
    pub fn delete_queue(
        &self,
        name: &str,
        if_unused: bool,
        if_empty: bool,
        connection_id: u64,
    ) -> Result<u32> {
        let q = {
            let mut topo = self.topology.write();
            let Some(q) = topo.queues.get(name).cloned() else {
                return Ok(0);
            };
            q.check_exclusive(connection_id)?;
            let counts = q.counts();
            if if_unused && counts.consumers > 0 {
                return Err(BrokerError::precondition_failed(format!(
                    "{} in use",
                    q.resource_name()
                )));
            }
            if if_empty && counts.ready > 0 {
                return Err(BrokerError::precondition_failed(format!(
                    "{} is not empty",
                    q.resource_name()
                )));
            }
            topo.remove_queue(name);
            q
        };
        Ok(finish_queue_delete(&q))
    }

    /// Deletes `queue` if it is still the one registered under its name (auto-delete after the
    /// last consumer, exclusive queues when their connection closes).
    pub fn remove_queue(&self, queue: &Arc<Queue>) {
        {
            let mut topo = self.topology.write();
            match topo.queues.get(&queue.name) {
                Some(q) if Arc::ptr_eq(q, queue) => topo.remove_queue(&queue.name),
                _ => return,
            }
        }
        finish_queue_delete(queue);
    }

    /// Deletes every queue exclusive to `connection_id`.
    pub fn remove_exclusive_queues(&self, connection_id: u64) {
        let owned: Vec<Arc<Queue>> = self
            .topology
            .read()
            .queues
            .values()
            .filter(|q| q.exclusive_owner == Some(connection_id))
            .cloned()
            .collect();
        for q in owned {
            self.remove_queue(&q);
        }
    }

    /// queue.purge; returns the number of messages purged.
    pub fn purge_queue(&self, name: &str, connection_id: u64) -> Result<u32> {
        Ok(self.queue(name, connection_id)?.purge())
    }

    /// queue.bind / exchange.bind. `destination` must exist (404), `source` must exist (404) and
    /// must not be the default exchange (403). Headers bindings need a valid `x-match` (406).
    pub fn bind(
        &self,
        source: &str,
        destination: Destination,
        routing_key: &str,
        arguments: &FieldTable,
        connection_id: u64,
    ) -> Result<()> {
        if source.is_empty() {
            return Err(default_exchange_refused());
        }
        let mut topo = self.topology.write();
        self.check_destination(&topo, &destination, connection_id)?;
        let x = topo
            .exchanges
            .get_mut(source)
            .ok_or_else(|| self.no_exchange(source))?;
        if x.kind == ExchangeKind::Headers
            && crate::headers::MatchMode::from_args(arguments).is_none()
        {
            return Err(BrokerError::precondition_failed(format!(
                "Invalid x-match field value {:?}; expected all, any, all-with-x, or any-with-x",
                arguments.get("x-match")
            )));
        }
        x.bind(Binding {
            destination,
            routing_key: routing_key.to_string(),
            arguments: arguments.clone(),
        });
        Ok(())
    }

    /// queue.unbind / exchange.unbind. Removing a binding that does not exist succeeds, as in
    /// RabbitMQ; a missing source or destination is 404.
    pub fn unbind(
        &self,
        source: &str,
        destination: Destination,
        routing_key: &str,
        arguments: &FieldTable,
        connection_id: u64,
    ) -> Result<()> {
        if source.is_empty() {
            return Err(default_exchange_refused());
        }
        let mut topo = self.topology.write();
        self.check_destination(&topo, &destination, connection_id)?;
        let x = topo
            .exchanges
            .get_mut(source)
            .ok_or_else(|| self.no_exchange(source))?;
        let removed = x.unbind(&Binding {
            destination,
            routing_key: routing_key.to_string(),
            arguments: arguments.clone(),
        });
        if removed && x.auto_delete && x.bindings().is_empty() {
            topo.remove_exchange(source);
        }
        Ok(())
    }

    fn check_destination(
        &self,
        topo: &Topology,
        destination: &Destination,
        connection_id: u64,
    ) -> Result<()> {
        match destination {
            Destination::Queue(q) => topo
                .queues
                .get(q)
                .ok_or_else(|| self.no_queue(q))?
                .check_exclusive(connection_id),
            Destination::Exchange(x) if topo.exchanges.contains_key(x) => Ok(()),
            Destination::Exchange(x) => Err(self.no_exchange(x)),
        }
    }

    /// Routes a basic.publish: fills `out` with each queue the message goes to, once.
    ///
    /// Follows exchange-to-exchange bindings (each exchange visited once, so binding cycles
    /// terminate) and the `alternate-exchange` of an exchange that routes nowhere. Errors:
    /// 404 for a missing exchange, 403 for an internal one.
    pub fn route(
        &self,
        exchange: &str,
        routing_key: &str,
        headers: Option<&FieldTable>,
        out: &mut Vec<Arc<Queue>>,
    ) -> Result<()> {
        let topo = self.topology.read();
        if exchange.is_empty() {
            if let Some(q) = topo.queues.get(routing_key) {
                out.push(q.clone());
            }
            return Ok(());
        }
        let x = topo
            .exchanges
            .get(exchange)
            .ok_or_else(|| self.no_exchange(exchange))?;
        if x.internal {
            return Err(BrokerError::access_refused(format!(
                "cannot publish to internal {}",
                self.exchange_resource(exchange)
            )));
        }
        let mut visited: Vec<&str> = Vec::new();
        topo.route_from(x, routing_key, headers, &mut visited, out);
        let mut current = x;
        while out.is_empty() {
            let Some(ae) = current.alternate_exchange() else {
                break;
            };
            let Some(next) = topo.exchanges.get(ae) else {
                break;
            };
            if visited.contains(&next.name.as_str()) {
                break;
            }
            topo.route_from(next, routing_key, headers, &mut visited, out);
            current = next;
        }
        Ok(())
    }

    /// Registers a consumer on queue `name` for connection `connection_id` (404, 405, 403).
    pub fn consume(
        &self,
        name: &str,
        consumer: Consumer,
        connection_id: u64,
    ) -> Result<Arc<Queue>> {
        let q = self.queue(name, connection_id)?;
        q.add_consumer(consumer)?;
        Ok(q)
    }
}

impl Topology {
    fn route_from<'a>(
        &'a self,
        x: &'a Exchange,
        routing_key: &str,
        headers: Option<&FieldTable>,
        visited: &mut Vec<&'a str>,
        out: &mut Vec<Arc<Queue>>,
    ) {
        visited.push(&x.name);
        let mut next: Vec<&'a Exchange> = Vec::new();
        x.route(routing_key, headers, &mut |d| match d {
            Destination::Queue(name) => {
                if let Some(q) = self.queues.get(name) {
                    if !out.iter().any(|o| Arc::ptr_eq(o, q)) {
                        out.push(q.clone());
                    }
                }
            }
            Destination::Exchange(name) => {
                if let Some(e) = self.exchanges.get(name) {
                    next.push(e);
                }
            }
        });
        for e in next {
            if !visited.contains(&e.name.as_str()) {
                self.route_from(e, routing_key, headers, visited, out);
            }
        }
    }

    /// Removes an exchange, its bindings as a source and as a destination, and then any
    /// auto-delete exchange left without bindings.
    fn remove_exchange(&mut self, name: &str) {
        self.exchanges.remove(name);
        self.unbind_everywhere(&Destination::Exchange(name.to_string()));
    }

    fn remove_queue(&mut self, name: &str) {
        self.queues.remove(name);
        self.unbind_everywhere(&Destination::Queue(name.to_string()));
    }

    fn unbind_everywhere(&mut self, dest: &Destination) {
        let mut emptied = Vec::new();
        for x in self.exchanges.values_mut() {
            if x.unbind_destination(dest) > 0 && x.auto_delete && x.bindings().is_empty() {
                emptied.push(x.name.clone());
            }
        }
        for name in emptied {
            self.remove_exchange(&name);
        }
    }
}

/// Marks a queue deleted and cancels its consumers; returns its ready-message count.
fn finish_queue_delete(q: &Arc<Queue>) -> u32 {
    let (count, consumers) = q.mark_deleted();
    for c in consumers {
        c.target.cancelled_by_broker(&c.tag);
    }
    count
}

fn locked_queue(q: &Queue) -> BrokerError {
    BrokerError::resource_locked(format!(
        "cannot obtain exclusive access to locked {}. It could be originally declared on another \
         connection or the exclusive property value does not match that of the original \
         declaration.",
        q.resource_name()
    ))
}

fn default_exchange_refused() -> BrokerError {
    BrokerError::access_refused("operation not permitted on the default exchange")
}

fn check_field<T: PartialEq + std::fmt::Display>(
    what: &str,
    field: &str,
    current: T,
    received: T,
) -> Result<()> {
    if current == received {
        return Ok(());
    }
    Err(BrokerError::precondition_failed(format!(
        "inequivalent arg '{field}' for {what}: received '{received}' but current is '{current}'"
    )))
}

fn check_args(
    what: &str,
    current: &FieldTable,
    received: &FieldTable,
    keys: &[&str],
) -> Result<()> {
    for key in keys {
        let (c, r) = (current.get(key), received.get(key));
        let same = match (c, r) {
            (None, None) => true,
            (Some(a), Some(b)) => a == b || (a.as_i64().is_some() && a.as_i64() == b.as_i64()),
            _ => false,
        };
        if !same {
            return Err(BrokerError::precondition_failed(format!(
                "inequivalent arg '{key}' for {what}: received {} but current is {}",
                describe_arg(r),
                describe_arg(c)
            )));
        }
    }
    Ok(())
}

/// RabbitMQ's wording for an argument value in inequivalence errors:
/// `the value '2000' of type 'signedint'`, or `none`.
fn describe_arg(v: Option<&FieldValue>) -> String {
    let Some(v) = v else {
        return "none".into();
    };
    let (ty, shown) = match v {
        FieldValue::Bool(b) => ("bool", b.to_string()),
        FieldValue::I8(i) => ("byte", i.to_string()),
        FieldValue::U8(i) => ("unsignedbyte", i.to_string()),
        FieldValue::I16(i) => ("short", i.to_string()),
        FieldValue::U16(i) => ("unsignedshort", i.to_string()),
        FieldValue::I32(i) => ("signedint", i.to_string()),
        FieldValue::U32(i) => ("unsignedint", i.to_string()),
        FieldValue::I64(i) => ("long", i.to_string()),
        FieldValue::F32(f) => ("float", f.to_string()),
        FieldValue::F64(f) => ("double", f.to_string()),
        FieldValue::Decimal { scale, value } => ("decimal", format!("{value}e-{scale}")),
        FieldValue::LongString(b) => ("longstr", String::from_utf8_lossy(b).into_owned()),
        FieldValue::ByteArray(b) => ("binary", format!("{b:?}")),
        FieldValue::Array(a) => ("array", format!("{a:?}")),
        FieldValue::Timestamp(t) => ("timestamp", t.to_string()),
        FieldValue::Table(t) => ("table", format!("{t:?}")),
        FieldValue::Void => ("void", "void".into()),
    };
    format!("the value '{shown}' of type '{ty}'")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qd(name: &str) -> QueueDeclare {
        QueueDeclare {
            name: name.into(),
            ..Default::default()
        }
    }

    #[test]
    fn declare_equivalence() {
        let v = VHost::new("/");
        v.declare_queue(&qd("q"), 1).unwrap();
        let err = v
            .declare_queue(
                &QueueDeclare {
                    durable: true,
                    ..qd("q")
                },
                1,
            )
            .unwrap_err();
        assert_eq!(err.code, 406);
        assert_eq!(
            err.text,
            "inequivalent arg 'durable' for queue 'q' in vhost '/': received 'true' but current is 'false'"
        );
        let mut args = FieldTable::new();
        args.insert("x-message-ttl", FieldValue::I32(2000));
        let err = v
            .declare_queue(
                &QueueDeclare {
                    arguments: args,
                    ..qd("q")
                },
                1,
            )
            .unwrap_err();
        assert_eq!(
            err.text,
            "inequivalent arg 'x-message-ttl' for queue 'q' in vhost '/': received the value '2000' of type 'signedint' but current is none"
        );
        // Unknown arguments are not compared.
        let mut args = FieldTable::new();
        args.insert("x-custom", FieldValue::I32(1));
        assert!(v
            .declare_queue(
                &QueueDeclare {
                    arguments: args,
                    ..qd("q")
                },
                1
            )
            .is_ok());
    }

    #[test]
    fn exclusive_queues_are_locked() {
        let v = VHost::new("/");
        v.declare_queue(
            &QueueDeclare {
                exclusive: true,
                ..qd("ex")
            },
            1,
        )
        .unwrap();
        assert_eq!(v.queue("ex", 2).unwrap_err().code, 405);
        assert_eq!(v.declare_queue(&qd("ex"), 2).unwrap_err().code, 405);
        assert!(v.queue("ex", 1).is_ok());
        v.remove_exclusive_queues(1);
        assert_eq!(v.queue("ex", 1).unwrap_err().code, 404);
    }

    #[test]
    fn routing_through_exchanges_and_alternate() {
        let v = VHost::new("/");
        for q in ["a", "b", "alt"] {
            v.declare_queue(&qd(q), 1).unwrap();
        }
        let mut args = FieldTable::new();
        args.insert(
            "alternate-exchange",
            FieldValue::LongString(bytes::Bytes::from_static(b"ae")),
        );
        v.declare_exchange(&ExchangeDeclare {
            name: "x".into(),
            kind: "direct".into(),
            arguments: args,
            ..Default::default()
        })
        .unwrap();
        v.declare_exchange(&ExchangeDeclare {
            name: "ae".into(),
            kind: "fanout".into(),
            ..Default::default()
        })
        .unwrap();
        v.declare_exchange(&ExchangeDeclare {
            name: "t".into(),
            kind: "topic".into(),
            ..Default::default()
        })
        .unwrap();
        let none = FieldTable::new();
        v.bind("x", Destination::Queue("a".into()), "k", &none, 1)
            .unwrap();
        v.bind("x", Destination::Exchange("t".into()), "k", &none, 1)
            .unwrap();
        v.bind("t", Destination::Queue("b".into()), "#", &none, 1)
            .unwrap();
        v.bind("t", Destination::Exchange("x".into()), "#", &none, 1)
            .unwrap(); // cycle
        v.bind("ae", Destination::Queue("alt".into()), "", &none, 1)
            .unwrap();
        let names = |key: &str| {
            let mut out = Vec::new();
            v.route("x", key, None, &mut out).unwrap();
            out.iter().map(|q| q.name.clone()).collect::<Vec<_>>()
        };
        assert_eq!(names("k"), vec!["a", "b"]);
        assert_eq!(names("other"), vec!["alt"]);
        let mut out = Vec::new();
        assert_eq!(v.route("nope", "k", None, &mut out).unwrap_err().code, 404);
    }

    #[test]
    fn auto_delete_exchange_goes_with_last_binding() {
        let v = VHost::new("/");
        v.declare_queue(&qd("q"), 1).unwrap();
        v.declare_exchange(&ExchangeDeclare {
            name: "ad".into(),
            kind: "fanout".into(),
            auto_delete: true,
            ..Default::default()
        })
        .unwrap();
        v.bind(
            "ad",
            Destination::Queue("q".into()),
            "",
            &FieldTable::new(),
            1,
        )
        .unwrap();
        v.delete_queue("q", false, false, 1).unwrap();
        assert!(!v.exchange_exists("ad"));
    }

    #[test]
    fn reserved_names_and_default_exchange() {
        let v = VHost::new("/");
        let e = v
            .declare_exchange(&ExchangeDeclare {
                name: "amq.foo".into(),
                kind: "direct".into(),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(e.code, 403);
        assert_eq!(v.declare_queue(&qd("amq.q"), 1).unwrap_err().code, 403);
        assert_eq!(v.delete_exchange("", false).unwrap_err().code, 403);
        let e = v
            .declare_exchange(&ExchangeDeclare {
                name: "x".into(),
                kind: "nope".into(),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(e.code, 503);
    }
}
