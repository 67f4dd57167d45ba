//! Durable definitions of a vhost: the snapshot of its policies, durable exchanges, queues and
//! bindings
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

    pub(crate) fn load_definitions(&self, defs: &FieldTable) {
        let mut topo = self.topology.write();
        let list = |k: &str| -> Vec<FieldTable> {
            defs.get(k)
                .and_then(|v| v.as_array())
                .map(|a| a.iter().filter_map(|v| v.as_table().cloned()).collect())
                .unwrap_or_default()
        };
        // Policies first (they apply to what is created next), then exchanges, then queues,
        // then the bindings between them.
        for (key, op) in [
            ("policies", "put_policy"),
            ("exchanges", "put_exchange"),
            ("queues", "put_queue"),
            ("bindings", "add_binding"),
        ] {
            for entry in list(key) {
                match TopologyCommand::from_entry(op, &entry) {
                    Ok(c) => self.apply(&mut topo, &c),
                    Err(reason) => {
                        tracing::warn!(vhost = %self.name, %reason, "skipping a stored definition")
                    }
                }
            }
        }
    }
}

impl Topology {
    /// The durable definitions of this vhost as a field table: `name`, `exchanges` (user
    /// exchanges only; the standard ones always exist), `queues` and `bindings`.
    pub(super) fn snapshot(&self, vhost: &str) -> FieldTable {
        // Entries are the commands that recreate them (their `op` is implied by the list).
        let entry = |c: TopologyCommand| FieldValue::Table(c.to_table());
        let mut exchanges = Vec::new();
        let mut bindings = Vec::new();
        let mut xs: Vec<&Exchange> = self.exchanges.values().filter(|x| x.durable).collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in xs {
            if !x.name.is_empty() && !x.name.starts_with("amq.") {
                exchanges.push(entry(TopologyCommand::PutExchange {
                    name: x.name.clone(),
                    kind: x.kind,
                    auto_delete: x.auto_delete,
                    internal: x.internal,
                    arguments: x.arguments.clone(),
                }));
            }
            for b in x.bindings() {
                if self.destination_is_durable(&b.destination) {
                    bindings.push(entry(TopologyCommand::AddBinding {
                        source: x.name.clone(),
                        binding: b.clone(),
                    }));
                }
            }
        }
        let mut qs: Vec<&Arc<Queue>> = self
            .queues
            .values()
            .filter(|q| q.durable() && q.exclusive_owner().is_none())
            .collect();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        let queues = qs
            .into_iter()
            .map(|q| {
                entry(TopologyCommand::PutQueue {
                    name: q.name().to_string(),
                    auto_delete: q.auto_delete(),
                    arguments: q.arguments().clone(),
                })
            })
            .collect();
        let policies = [false, true]
            .into_iter()
            .flat_map(|operator| {
                self.policies
                    .of(operator)
                    .values()
                    .map(move |p| TopologyCommand::PutPolicy {
                        operator,
                        policy: p.clone(),
                    })
            })
            .map(entry)
            .collect();
        let mut t = FieldTable::new();
        t.insert("name", s(vhost));
        t.insert("policies", FieldValue::Array(policies));
        t.insert("exchanges", FieldValue::Array(exchanges));
        t.insert("queues", FieldValue::Array(queues));
        t.insert("bindings", FieldValue::Array(bindings));
        t
    }
}
