//! Durable definitions of a vhost: the snapshot of its policies, durable exchanges, queues and
//! bindings
//! (written at compaction, see [`super::log`]), its retry after a failed write, and reading it
//! back at start.

use super::*;
use bytes::{BufMut, BytesMut};
use warren_amqp::table::{encode_field_value, put_shortstr};

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
        let list = |k: &str| {
            defs.get(k)
                .and_then(|v| v.as_array())
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_table())
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
                match TopologyCommand::from_entry(op, entry) {
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
    /// The durable definitions of this vhost as an AMQP-encoded field table (see
    /// [`Persistence::save_definitions`]): `name`, `policies`, `exchanges` (user exchanges
    /// only; the standard ones always exist), `queues`, `bindings` and `log_generation`.
    /// Each entry is the command that recreates it (its `op` is implied by the list).
    /// Encoded entry by entry: a vhost with 100,000 queues needs only the bytes (about 200
    /// per queue and binding), not a table of every entry first (about 1.3 KB each).
    pub(super) fn encode_snapshot(&self, vhost: &str, log_generation: u64) -> BytesMut {
        let mut buf = BytesMut::new();
        let entry = |buf: &mut BytesMut, c: TopologyCommand| {
            encode_field_value(&FieldValue::Table(c.to_table()), buf)
        };
        let table = open(&mut buf, None);
        put_shortstr(&mut buf, "name");
        encode_field_value(&s(vhost), &mut buf);

        put_shortstr(&mut buf, "policies");
        let list = open(&mut buf, Some(b'A'));
        for operator in [false, true] {
            for p in self.policies.of(operator).values() {
                entry(
                    &mut buf,
                    TopologyCommand::PutPolicy {
                        operator,
                        policy: p.clone(),
                    },
                );
            }
        }
        close(&mut buf, list);

        let mut xs: Vec<&Exchange> = self.exchanges.values().filter(|x| x.durable).collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        put_shortstr(&mut buf, "exchanges");
        let list = open(&mut buf, Some(b'A'));
        for x in xs
            .iter()
            .filter(|x| !x.name.is_empty() && !x.name.starts_with("amq."))
        {
            entry(
                &mut buf,
                TopologyCommand::PutExchange {
                    name: x.name.clone(),
                    kind: x.kind,
                    auto_delete: x.auto_delete,
                    internal: x.internal,
                    arguments: x.arguments.clone(),
                },
            );
        }
        close(&mut buf, list);

        let mut qs: Vec<&Arc<Queue>> = self
            .queues
            .values()
            .filter(|q| q.durable() && q.exclusive_owner().is_none())
            .collect();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        put_shortstr(&mut buf, "queues");
        let list = open(&mut buf, Some(b'A'));
        for q in qs {
            entry(
                &mut buf,
                TopologyCommand::PutQueue {
                    name: q.name().to_string(),
                    auto_delete: q.auto_delete(),
                    arguments: q.arguments().clone(),
                },
            );
        }
        close(&mut buf, list);

        put_shortstr(&mut buf, "bindings");
        let list = open(&mut buf, Some(b'A'));
        for x in xs {
            for b in x.bindings() {
                if self.destination_is_durable(&b.destination) {
                    entry(
                        &mut buf,
                        TopologyCommand::AddBinding {
                            source: x.name.clone(),
                            binding: b.clone(),
                        },
                    );
                }
            }
        }
        close(&mut buf, list);

        put_shortstr(&mut buf, "log_generation");
        encode_field_value(&FieldValue::I64(log_generation as i64), &mut buf);
        close(&mut buf, table);
        buf
    }
}

/// Starts a table (`tag` None: no type tag, as a top-level table) or a field value of type
/// `tag` whose payload is a `u32` length then its content: returns where the length goes.
fn open(buf: &mut BytesMut, tag: Option<u8>) -> usize {
    if let Some(t) = tag {
        buf.put_u8(t);
    }
    let start = buf.len();
    buf.put_u32(0);
    start
}

/// Writes the length of what followed [`open`] at `start`.
fn close(buf: &mut BytesMut, start: usize) {
    let len = (buf.len() - start - 4) as u32;
    buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
}
