//! Durable definitions of a vhost: the snapshot of its durable exchanges, queues and bindings
//! (written at compaction, see [`super::log`]), its retry after a failed write, and reading it
//! back at start.

use super::*;

impl VHost {
    /// Writes the definitions again after a failed save, at most once a second.
    pub(super) fn retry_save(&self) {
        if !self.defs_dirty.load(Ordering::Relaxed) {
            return;
        }
        let now = std::time::Instant::now();
        {
            let mut at = self.defs_retry_at.lock();
            if at.is_some_and(|t| now < t) {
                return;
            }
            *at = Some(now + std::time::Duration::from_secs(1));
        }
        let topo = self.topology.write();
        if let Err(e) = self.store_snapshot(&topo) {
            tracing::debug!(vhost = %self.name, error = %e, "durable definitions still not stored");
        }
    }

    pub(super) fn load_definitions(&self, defs: &FieldTable) {
        let mut topo = self.topology.write();
        let list = |k: &str| -> Vec<FieldTable> {
            defs.get(k)
                .and_then(|v| v.as_array())
                .map(|a| a.iter().filter_map(|v| v.as_table().cloned()).collect())
                .unwrap_or_default()
        };
        for x in list("exchanges") {
            let name = get_str(&x, "name").to_string();
            let Some(kind) = ExchangeKind::parse(get_str(&x, "type")) else {
                continue;
            };
            topo.exchanges.entry(name.clone()).or_insert_with(|| {
                Exchange::new(
                    name,
                    kind,
                    true,
                    get_bool(&x, "auto_delete"),
                    get_bool(&x, "internal"),
                    get_table(&x, "arguments"),
                )
            });
        }
        for q in list("queues") {
            let name = get_str(&q, "name").to_string();
            let queue = self.new_queue(Queue::new(
                name.clone(),
                self.name.clone(),
                true,
                None,
                get_bool(&q, "auto_delete"),
                get_table(&q, "arguments"),
            ));
            topo.queues.insert(name, Arc::new(queue));
        }
        for b in list("bindings") {
            let dest_name = get_str(&b, "destination").to_string();
            let destination = if get_str(&b, "destination_type") == "exchange" {
                Destination::Exchange(dest_name)
            } else {
                Destination::Queue(dest_name)
            };
            if let Some(x) = topo.exchanges.get_mut(get_str(&b, "source")) {
                let added = x.bind(Binding {
                    destination,
                    routing_key: get_str(&b, "routing_key").to_string(),
                    arguments: get_table(&b, "arguments"),
                });
                topo.bindings += usize::from(added);
            }
        }
    }
}

impl Topology {
    /// The durable definitions of this vhost as a field table: `name`, `exchanges` (user
    /// exchanges only; the standard ones always exist), `queues` and `bindings`.
    pub(super) fn snapshot(&self, vhost: &str) -> FieldTable {
        let mut exchanges = Vec::new();
        let mut bindings = Vec::new();
        let mut xs: Vec<&Exchange> = self.exchanges.values().filter(|x| x.durable).collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in xs {
            if !x.name.is_empty() && !x.name.starts_with("amq.") {
                let mut t = FieldTable::new();
                t.insert("name", s(&x.name));
                t.insert("type", s(x.kind.as_str()));
                t.insert("auto_delete", FieldValue::Bool(x.auto_delete));
                t.insert("internal", FieldValue::Bool(x.internal));
                t.insert("arguments", FieldValue::Table(x.arguments.clone()));
                exchanges.push(FieldValue::Table(t));
            }
            for b in x.bindings() {
                if !self.destination_is_durable(&b.destination) {
                    continue;
                }
                let mut t = FieldTable::new();
                t.insert("source", s(&x.name));
                t.insert("destination", s(b.destination.name()));
                let kind = match b.destination {
                    Destination::Queue(_) => "queue",
                    Destination::Exchange(_) => "exchange",
                };
                t.insert("destination_type", s(kind));
                t.insert("routing_key", s(&b.routing_key));
                t.insert("arguments", FieldValue::Table(b.arguments.clone()));
                bindings.push(FieldValue::Table(t));
            }
        }
        let mut qs: Vec<&Arc<Queue>> = self
            .queues
            .values()
            .filter(|q| q.durable && q.exclusive_owner.is_none())
            .collect();
        qs.sort_by(|a, b| a.name.cmp(&b.name));
        let queues = qs
            .into_iter()
            .map(|q| {
                let mut t = FieldTable::new();
                t.insert("name", s(&q.name));
                t.insert("auto_delete", FieldValue::Bool(q.auto_delete));
                t.insert("arguments", FieldValue::Table(q.arguments.clone()));
                FieldValue::Table(t)
            })
            .collect();
        let mut t = FieldTable::new();
        t.insert("name", s(vhost));
        t.insert("exchanges", FieldValue::Array(exchanges));
        t.insert("queues", FieldValue::Array(queues));
        t.insert("bindings", FieldValue::Array(bindings));
        t
    }
}
