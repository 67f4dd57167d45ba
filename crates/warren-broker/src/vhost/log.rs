//! The durable definitions of a vhost as a snapshot plus a log of the changes made since.
//!
//! A durable change (declare, delete, bind, unbind of durable things) is one record appended to
//! the vhost's log file and fsynced, instead of rewriting the whole definitions file: its cost
//! no longer grows with the number of queues. A record holds the primitive changes of one
//! topology change as plain data ([`TopologyCommand`]s: put or remove one exchange, queue or
//! binding), everything already decided (cascaded removals of auto-delete exchanges are listed,
//! not recomputed), so that replaying it is deterministic ([`VHost::apply`]).
//!
//! Files, in `<data>/definitions/`:
//! - `vhost-<hex name>.defs`: the snapshot (format in [`crate::persist`]); its
//!   `log_generation` is the first log generation it does not cover (absent in files written
//!   before the log existed: 0, which makes those files the first snapshot of an upgraded
//!   directory);
//! - `vhost-<hex name>.<generation>.log`: records `[u32 length][u32 CRC32C][field table]`.
//!
//! Compaction: when the log has grown past twice the snapshot (and at least
//! [`MIN_COMPACT_BYTES`]), a new snapshot covering everything is written (temporary file,
//! fsync, rename) with the next generation, appends go to that generation's log, and older
//! logs are deleted. Recovery reads the snapshot, then replays the logs of its generation and
//! later; an incomplete record at the end of a log (a crash mid-append) is cut off, a record
//! whose checksum does not match stops the start, as a damaged snapshot does.

use super::topology::not_stored;
use super::*;
use crate::policy::{ApplyTo, Policy, PolicyValue, Target};
use bytes::BufMut;
use std::path::{Path, PathBuf};
use warren_amqp::table::{decode_table, encode_table, Decoder};

/// No compaction before the log holds this much.
pub const MIN_COMPACT_BYTES: u64 = 256 * 1024;

/// One primitive change of a vhost's durable topology.
#[derive(Debug, Clone, PartialEq)]
pub enum TopologyCommand {
    /// Create (or keep) a durable exchange.
    PutExchange {
        /// Name.
        name: String,
        /// Type.
        kind: ExchangeKind,
        /// Deleted with its last binding.
        auto_delete: bool,
        /// Not publishable by clients.
        internal: bool,
        /// Arguments.
        arguments: FieldTable,
    },
    /// Create (or keep) a durable queue.
    PutQueue {
        /// Name.
        name: String,
        /// Deleted when its last consumer goes.
        auto_delete: bool,
        /// Arguments.
        arguments: FieldTable,
    },
    /// Add a binding.
    AddBinding {
        /// Source exchange.
        source: String,
        /// The binding.
        binding: Binding,
    },
    /// Remove an exchange (its bindings are listed separately).
    RemoveExchange {
        /// Name.
        name: String,
    },
    /// Remove a queue (its bindings are listed separately).
    RemoveQueue {
        /// Name.
        name: String,
    },
    /// Remove a binding.
    RemoveBinding {
        /// Source exchange.
        source: String,
        /// The binding.
        binding: Binding,
    },
    /// Create or replace a policy (or an operator policy).
    PutPolicy {
        /// An operator policy.
        operator: bool,
        /// The policy.
        policy: Policy,
    },
    /// Remove a policy (or an operator policy).
    RemovePolicy {
        /// An operator policy.
        operator: bool,
        /// Its name.
        name: String,
    },
}

impl TopologyCommand {
    /// The command as a field table (`op` names it; the other fields are those of the
    /// snapshot's entries).
    pub fn to_table(&self) -> FieldTable {
        let mut t = FieldTable::new();
        match self {
            TopologyCommand::PutExchange {
                name,
                kind,
                auto_delete,
                internal,
                arguments,
            } => {
                t.insert("op", s("put_exchange"));
                t.insert("name", s(name));
                t.insert("type", s(kind.as_str()));
                t.insert("auto_delete", FieldValue::Bool(*auto_delete));
                t.insert("internal", FieldValue::Bool(*internal));
                t.insert("arguments", FieldValue::Table(arguments.clone()));
            }
            TopologyCommand::PutQueue {
                name,
                auto_delete,
                arguments,
            } => {
                t.insert("op", s("put_queue"));
                t.insert("name", s(name));
                t.insert("auto_delete", FieldValue::Bool(*auto_delete));
                t.insert("arguments", FieldValue::Table(arguments.clone()));
            }
            TopologyCommand::AddBinding { source, binding }
            | TopologyCommand::RemoveBinding { source, binding } => {
                let op = match self {
                    TopologyCommand::AddBinding { .. } => "add_binding",
                    _ => "remove_binding",
                };
                t.insert("op", s(op));
                t.insert("source", s(source));
                t.insert("destination", s(binding.destination.name()));
                let kind = match binding.destination {
                    Destination::Queue(_) => "queue",
                    Destination::Exchange(_) => "exchange",
                };
                t.insert("destination_type", s(kind));
                t.insert("routing_key", s(&binding.routing_key));
                t.insert("arguments", FieldValue::Table(binding.arguments.clone()));
            }
            TopologyCommand::RemoveExchange { name } => {
                t.insert("op", s("remove_exchange"));
                t.insert("name", s(name));
            }
            TopologyCommand::RemoveQueue { name } => {
                t.insert("op", s("remove_queue"));
                t.insert("name", s(name));
            }
            TopologyCommand::PutPolicy { operator, policy } => {
                t.insert("op", s("put_policy"));
                t.insert("operator", FieldValue::Bool(*operator));
                t.insert("name", s(&policy.name));
                t.insert("pattern", s(&policy.pattern));
                t.insert("apply_to", s(policy.apply_to.as_str()));
                t.insert("priority", FieldValue::I64(policy.priority));
                let mut d = FieldTable::new();
                for (k, v) in &policy.definition {
                    d.insert(
                        k.as_str(),
                        match v {
                            PolicyValue::Int(i) => FieldValue::I64(*i),
                            PolicyValue::Text(x) => s(x),
                        },
                    );
                }
                t.insert("definition", FieldValue::Table(d));
            }
            TopologyCommand::RemovePolicy { operator, name } => {
                t.insert("op", s("remove_policy"));
                t.insert("operator", FieldValue::Bool(*operator));
                t.insert("name", s(name));
            }
        }
        t
    }

    /// Puts `commands` in `t` under `commands`, an array of [`TopologyCommand::to_table`]s
    /// (a definitions log record, a replicated change).
    pub fn put_list(t: &mut FieldTable, commands: &[TopologyCommand]) {
        let list = commands
            .iter()
            .map(|c| FieldValue::Table(c.to_table()))
            .collect();
        t.insert("commands", FieldValue::Array(list));
    }

    /// The commands [`TopologyCommand::put_list`] put in `t` (none when absent).
    ///
    /// Errors: a command that does not read (see [`TopologyCommand::from_table`]).
    pub fn list_from(t: &FieldTable) -> std::result::Result<Vec<TopologyCommand>, String> {
        t.get("commands")
            .and_then(|v| v.as_array())
            .unwrap_or(&[])
            .iter()
            .filter_map(|v| v.as_table())
            .map(TopologyCommand::from_table)
            .collect()
    }

    /// Reads a command written by [`TopologyCommand::to_table`].
    pub fn from_table(t: &FieldTable) -> std::result::Result<Self, String> {
        Self::from_entry(get_str(t, "op"), t)
    }

    /// Reads a command `op` from a table of the snapshot's entry format (a snapshot's
    /// exchanges are `put_exchange` entries, its queues `put_queue`, its bindings
    /// `add_binding`).
    pub fn from_entry(op: &str, t: &FieldTable) -> std::result::Result<Self, String> {
        let name = || get_str(t, "name").to_string();
        let binding = || {
            let dest: Arc<str> = get_str(t, "destination").into();
            Binding {
                destination: if get_str(t, "destination_type") == "exchange" {
                    Destination::Exchange(dest)
                } else {
                    Destination::Queue(dest)
                },
                routing_key: get_str(t, "routing_key").to_string(),
                arguments: get_table(t, "arguments"),
            }
        };
        Ok(match op {
            "put_exchange" => TopologyCommand::PutExchange {
                name: name(),
                kind: ExchangeKind::parse(get_str(t, "type"))
                    .ok_or_else(|| format!("unknown exchange type '{}'", get_str(t, "type")))?,
                auto_delete: get_bool(t, "auto_delete"),
                internal: get_bool(t, "internal"),
                arguments: get_table(t, "arguments"),
            },
            "put_queue" => TopologyCommand::PutQueue {
                name: name(),
                auto_delete: get_bool(t, "auto_delete"),
                arguments: get_table(t, "arguments"),
            },
            "add_binding" => TopologyCommand::AddBinding {
                source: get_str(t, "source").to_string(),
                binding: binding(),
            },
            "remove_binding" => TopologyCommand::RemoveBinding {
                source: get_str(t, "source").to_string(),
                binding: binding(),
            },
            "remove_exchange" => TopologyCommand::RemoveExchange { name: name() },
            "remove_queue" => TopologyCommand::RemoveQueue { name: name() },
            "put_policy" => {
                let mut definition = crate::policy::Definition::new();
                for (k, v) in get_table(t, "definition").iter() {
                    let v = match v {
                        FieldValue::I64(i) => PolicyValue::Int(*i),
                        other => PolicyValue::Text(other.as_str().unwrap_or_default().into()),
                    };
                    definition.insert(k.to_string(), v);
                }
                let priority = match t.get("priority") {
                    Some(FieldValue::I64(i)) => *i,
                    _ => 0,
                };
                TopologyCommand::PutPolicy {
                    operator: get_bool(t, "operator"),
                    policy: Policy::new(
                        name(),
                        get_str(t, "pattern"),
                        ApplyTo::parse(get_str(t, "apply_to")).unwrap_or_default(),
                        priority,
                        definition,
                    )?,
                }
            }
            "remove_policy" => TopologyCommand::RemovePolicy {
                operator: get_bool(t, "operator"),
                name: name(),
            },
            other => return Err(format!("unknown definitions command '{other}'")),
        })
    }

    /// The removals `undo` recorded, as commands (removed queues that were never stored are
    /// left out; removing what is not there is a no-op on replay).
    pub(super) fn removals(undo: &Undo) -> Vec<TopologyCommand> {
        undo.steps
            .iter()
            .filter_map(|step| match step {
                Removed::Exchange(x) => x.durable.then(|| TopologyCommand::RemoveExchange {
                    name: x.name.clone(),
                }),
                Removed::Queue(q) => (q.durable() && q.exclusive_owner().is_none()).then(|| {
                    TopologyCommand::RemoveQueue {
                        name: q.name().to_string(),
                    }
                }),
                Removed::Binding(source, b) => Some(TopologyCommand::RemoveBinding {
                    source: source.clone(),
                    binding: b.clone(),
                }),
                // Additions are undone by removal, which is listed where it happens; policy
                // changes are recorded by the change itself.
                Removed::AddedExchange(_)
                | Removed::AddedQueue(_)
                | Removed::AddedBinding(..)
                | Removed::Policy { .. } => None,
            })
            .collect()
    }
}

/// Where a vhost's log stands.
#[derive(Debug, Default)]
pub(crate) struct LogState {
    /// The generation appends go to.
    generation: u64,
    /// Bytes in that generation's log.
    bytes: u64,
    /// Bytes of the last snapshot.
    snapshot_bytes: u64,
    /// A compaction's snapshot is being written.
    compacting: bool,
}

/// The log file of `vhost`'s `generation`.
pub(crate) fn log_path(dir: &Path, vhost: &str, generation: u64) -> PathBuf {
    dir.join(format!(
        "{}.{generation}.log",
        crate::persist::file_stem(vhost)
    ))
}

/// One record holding `commands`: `[u32 length][u32 CRC32C][field table]`.
fn encode_record(commands: &[TopologyCommand]) -> Vec<u8> {
    let mut t = FieldTable::new();
    TopologyCommand::put_list(&mut t, commands);
    let mut body = bytes::BytesMut::new();
    encode_table(&t, &mut body);
    let mut rec = Vec::with_capacity(body.len() + 8);
    rec.put_u32(body.len() as u32);
    rec.put_u32(crc32c::crc32c(&body));
    rec.extend_from_slice(&body);
    rec
}

/// Receives the outcome of durable changes whose replies wait for it (see [`deferring`]).
pub trait DurableSink: Send + Sync {
    /// A change was applied in memory and its record queued: its reply must wait.
    fn begin(&self);
    /// That change is on disk (`Ok`), or was rolled back because its record could not be
    /// written (`Err`: the refusal, 541 INTERNAL_ERROR).
    fn settled(&self, outcome: std::result::Result<(), BrokerError>);
}

thread_local! {
    static DEFERRING: std::cell::RefCell<Option<Arc<dyn DurableSink>>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` (topology operations on this thread) with durable changes deferred to `sink`:
/// each is applied in memory and its record queued for the next group commit, and `sink`
/// learns when it is on disk, instead of the call blocking until then. The caller holds the
/// change's reply (and what follows it) until [`DurableSink::settled`]. Without this, a
/// durable change returns once its record is fsynced.
pub fn deferring<R>(sink: &Arc<dyn DurableSink>, f: impl FnOnce() -> R) -> R {
    struct Reset(Option<Arc<dyn DurableSink>>);
    impl Drop for Reset {
        fn drop(&mut self) {
            let prev = self.0.take();
            DEFERRING.with(|d| *d.borrow_mut() = prev);
        }
    }
    let prev = DEFERRING.with(|d| d.borrow_mut().replace(sink.clone()));
    let _reset = Reset(prev);
    f()
}

/// The records of a log file, each a list of commands. An incomplete record at the end is cut
/// off the file (a crash during its append); a record with a checksum mismatch is an error.
pub(crate) fn read_log(path: &Path) -> std::result::Result<Vec<Vec<TopologyCommand>>, String> {
    let raw = std::fs::read(path).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let mut at = 0usize;
    while at < raw.len() {
        let header_end = at + 8;
        let torn = |what: &str| -> std::result::Result<(), String> {
            tracing::warn!(file = %path.display(), offset = at, "cutting a torn definitions record: {what}");
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| e.to_string())?;
            f.set_len(at as u64).map_err(|e| e.to_string())?;
            f.sync_all().map_err(|e| e.to_string())
        };
        if header_end > raw.len() {
            torn("incomplete header")?;
            break;
        }
        let len = u32::from_be_bytes(raw[at..at + 4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_be_bytes(raw[at + 4..at + 8].try_into().expect("4 bytes"));
        let end = header_end.saturating_add(len);
        if end > raw.len() {
            torn("incomplete body")?;
            break;
        }
        let body = &raw[header_end..end];
        if crc32c::crc32c(body) != crc {
            return Err(format!("checksum mismatch in the record at offset {at}"));
        }
        let t = decode_table(&mut Decoder::new(body), 64).map_err(|e| e.to_string())?;
        out.push(TopologyCommand::list_from(&t)?);
        at = end;
    }
    Ok(out)
}

impl VHost {
    /// Stores a durable change already applied to `topo`: `commands` become one record of the
    /// log, written by the next group commit (called with the topology write lock held, so
    /// records follow the order of the changes). Under [`deferring`] the call returns at once
    /// and the sink learns the outcome; otherwise it returns once the record is fsynced. The
    /// log is compacted into a new snapshot when it has grown enough.
    ///
    /// Errors: 541 INTERNAL_ERROR `<what> because the definitions could not be stored: <why>`,
    /// with the change rolled back by `undo` (a deferred change is rolled back when its write
    /// fails, and the sink gets the refusal).
    pub(super) fn save(
        &self,
        topo: &mut Topology,
        commands: Vec<TopologyCommand>,
        undo: Undo,
        what: String,
    ) -> Result<()> {
        if !self.removed.load(Ordering::Acquire) {
            self.replicate(&commands, Some(&what));
        }
        let Some(p) = &self.persist else {
            return Ok(());
        };
        if self.removed.load(Ordering::Acquire) {
            // A deleted vhost: its files are gone and stay gone.
            return Ok(());
        }
        let refuse = |topo: &mut Topology, undo: Undo, e: &dyn std::fmt::Display| {
            topo.rollback(undo, &self.sweeps);
            Err(not_stored(&what, e))
        };
        if p.released() {
            return refuse(topo, undo, &"the broker is closed");
        }
        if self.defs_dirty.load(Ordering::Relaxed) {
            // The log misses a change the broker made: only a whole snapshot is right now.
            return match self.store_snapshot(topo) {
                Ok(()) => Ok(()),
                Err(e) => refuse(topo, undo, &e),
            };
        }
        let record = encode_record(&commands);
        let path = {
            let mut log = self.defs_log.lock();
            log.bytes += record.len() as u64;
            log_path(&p.definitions_dir(), &self.name, log.generation)
        };
        match DEFERRING.with(|d| d.borrow().clone()) {
            Some(sink) => {
                sink.begin();
                let vhost = self.me.clone();
                let callback =
                    Box::new(
                        move |outcome: std::result::Result<(), String>| match outcome {
                            Ok(()) => sink.settled(Ok(())),
                            Err(e) => {
                                if let Some(v) = vhost.upgrade() {
                                    v.topology.write().rollback(undo, &v.sweeps);
                                    v.mark_dirty(&std::io::Error::other(e.clone()));
                                }
                                sink.settled(Err(not_stored(&what, &e)));
                            }
                        },
                    );
                p.defs
                    .append(path, record, crate::defs_writer::Waiter::Callback(callback));
            }
            None => {
                if let Err(e) = p.defs.append_and_wait(path, record) {
                    // What is on disk is in doubt now: the next change stores a snapshot.
                    self.mark_dirty(&std::io::Error::other(e.clone()));
                    return refuse(topo, undo, &e);
                }
            }
        }
        self.maybe_compact(topo);
        Ok(())
    }

    /// Stores a change the broker made by itself (auto-delete, exclusive queues of a closed
    /// connection): nobody waits for it; if its record cannot be written, the definitions are
    /// marked dirty and the sweep stores a whole snapshot.
    pub(super) fn save_detached(&self, topo: &mut Topology, commands: Vec<TopologyCommand>) {
        if !self.removed.load(Ordering::Acquire) {
            self.replicate(&commands, None);
        }
        self.store_detached(topo, commands);
    }

    /// Writes `commands` to the log as [`VHost::save_detached`] does, without replicating
    /// them (changes that came from the cluster).
    pub(super) fn store_detached(&self, topo: &mut Topology, commands: Vec<TopologyCommand>) {
        let Some(p) = &self.persist else {
            return;
        };
        if self.removed.load(Ordering::Acquire) {
            return;
        }
        if p.released() {
            return;
        }
        if self.defs_dirty.load(Ordering::Relaxed) {
            let _ = self.store_snapshot(topo);
            return;
        }
        let record = encode_record(&commands);
        let path = {
            let mut log = self.defs_log.lock();
            log.bytes += record.len() as u64;
            log_path(&p.definitions_dir(), &self.name, log.generation)
        };
        let vhost = self.me.clone();
        let callback = Box::new(move |outcome: std::result::Result<(), String>| {
            if let (Err(e), Some(v)) = (outcome, vhost.upgrade()) {
                v.mark_dirty(&std::io::Error::other(e));
            }
        });
        p.defs
            .append(path, record, crate::defs_writer::Waiter::Callback(callback));
        self.maybe_compact(topo);
    }

    /// Hands a change to the cluster's metadata group, when there is one. For a change a
    /// client asked for (`what` names it), under [`deferring`] the reply also waits until
    /// the change is committed; a change that cannot be committed is refused with 541
    /// INTERNAL_ERROR `<what> because the change could not be replicated: <why>` (it stays
    /// on this node). A change the broker made by itself (`what` is `None`) is waited for by
    /// nobody.
    fn replicate(&self, commands: &[TopologyCommand], what: Option<&str>) {
        let Some(r) = self.replicator.get() else {
            return;
        };
        if crate::replica::is_unreplicated() {
            return;
        }
        if commands.is_empty() {
            return;
        }
        let waiting = what.and_then(|w| DEFERRING.with(|d| d.borrow().clone()).map(|s| (s, w)));
        let done: crate::replica::Done = match waiting {
            Some((sink, what)) => {
                sink.begin();
                let what = what.to_string();
                Box::new(move |outcome| {
                    sink.settled(outcome.map_err(|e| {
                        BrokerError::internal(format!(
                            "{what} because the change could not be replicated: {e}"
                        ))
                    }))
                })
            }
            None => {
                let vhost = self.name.clone();
                Box::new(move |outcome| {
                    if let Err(e) = outcome {
                        tracing::warn!(%vhost, error = %e, "a definitions change was not replicated");
                    }
                })
            }
        };
        r.topology(&self.name, commands.to_vec(), done);
    }

    /// A replicated exchange declare whose exchange is here with another definition (the
    /// same exchange declared at the same moment on two nodes, each applying its own first):
    /// the exchange takes the replicated definition and keeps its bindings, so that every
    /// node ends with the definition later in the log. Returns whether `c` was that.
    fn redefine_exchange(&self, topo: &mut Topology, c: &TopologyCommand) -> bool {
        let TopologyCommand::PutExchange {
            name,
            kind,
            auto_delete,
            internal,
            arguments,
        } = c
        else {
            return false;
        };
        let Some(x) = topo.exchanges.get(name) else {
            return false;
        };
        if x.durable
            && x.kind == *kind
            && x.auto_delete == *auto_delete
            && x.internal == *internal
            && x.arguments == *arguments
        {
            return false;
        }
        tracing::info!(
            vhost = %self.name,
            exchange = %name,
            "exchange redefined by a declare made at the same moment on another node"
        );
        let mut nx = Exchange::new(
            name.clone(),
            *kind,
            true,
            *auto_delete,
            *internal,
            arguments.clone(),
        );
        nx.apply_policy(topo.policies.applied(name, Target::Exchange));
        if let Some(old) = topo.exchanges.insert(name.clone(), nx) {
            let nx = topo.exchanges.get_mut(name).expect("just inserted");
            for b in old.bindings() {
                nx.bind(b.clone());
            }
        }
        true
    }

    /// Applies a durable topology change another node of the cluster made (see
    /// [`crate::replica`]) and writes it to this vhost's log: exchanges, bindings and
    /// policies; queues are never created or removed this way. A binding to a queue this
    /// node does not have is kept too (routing skips it), so that it routes once the queue
    /// gets a member here. Returns how many commands were applied.
    pub fn apply_replicated(&self, commands: &[TopologyCommand]) -> usize {
        let mut topo = self.topology.write();
        let applied: Vec<TopologyCommand> = commands
            .iter()
            .filter(|c| crate::replica::replicated_kind(c))
            .cloned()
            .collect();
        for c in &applied {
            if !self.redefine_exchange(&mut topo, c) {
                self.apply(&mut topo, c);
            }
        }
        let n = applied.len();
        if n > 0 {
            self.store_detached(&mut topo, applied);
        }
        n
    }

    /// Compacts when the log has outgrown its threshold: the snapshot is taken and encoded
    /// now (under the topology lock, so that it holds exactly the changes queued so far; about
    /// 200 bytes per entry), appends go to the next generation from now on, and the writer
    /// thread writes the snapshot once the records before it are written (writing it holds no
    /// lock), then deletes the older logs. When a write failed meanwhile (a change in the snapshot may be rolled
    /// back), the snapshot is not written: recovery then replays both generations.
    fn maybe_compact(&self, topo: &Topology) {
        let Some(p) = &self.persist else {
            return;
        };
        let (snapshot, next) = {
            let mut log = self.defs_log.lock();
            if log.compacting || log.bytes <= MIN_COMPACT_BYTES.max(2 * log.snapshot_bytes) {
                return;
            }
            log.compacting = true;
            log.generation += 1;
            log.bytes = 0;
            (
                topo.encode_snapshot(&self.name, log.generation),
                log.generation,
            )
        };
        let failures = p.defs.failures();
        let vhost = self.me.clone();
        p.defs.after_written(Box::new(move |ok| {
            let Some(v) = vhost.upgrade() else {
                return;
            };
            let Some(p) = &v.persist else {
                return;
            };
            if v.removed.load(Ordering::Acquire) {
                v.defs_log.lock().compacting = false;
                return;
            }
            let written = if ok && p.defs.failures() == failures {
                match p.save_definitions(&v.name, &snapshot) {
                    Ok(n) => {
                        let dir = p.definitions_dir();
                        for generation in 0..next {
                            let old = log_path(&dir, &v.name, generation);
                            if old.exists() {
                                let _ = std::fs::remove_file(old);
                            }
                        }
                        Some(n)
                    }
                    Err(e) => {
                        tracing::warn!(vhost = %v.name, error = %e, "cannot compact the definitions log");
                        None
                    }
                }
            } else {
                None
            };
            let mut log = v.defs_log.lock();
            log.compacting = false;
            if let Some(n) = written {
                log.snapshot_bytes = n;
            }
        }));
    }

    fn mark_dirty(&self, e: &std::io::Error) {
        if !self.defs_dirty.swap(true, Ordering::Relaxed) {
            tracing::error!(
                vhost = %self.name,
                error = %e,
                "cannot store durable definitions; changes that need it are refused, \
                 and storing them is retried every second"
            );
        }
    }

    /// Writes a snapshot of everything in `topo` and starts the next log generation.
    pub(super) fn store_snapshot(&self, topo: &Topology) -> std::io::Result<()> {
        match self.compact(topo) {
            Ok(()) => {
                if self.defs_dirty.swap(false, Ordering::Relaxed) {
                    tracing::info!(vhost = %self.name, "durable definitions stored again");
                }
                Ok(())
            }
            Err(e) => {
                self.mark_dirty(&e);
                Err(e)
            }
        }
    }

    /// Compaction (see the module docs): snapshot with the next generation, then the older
    /// logs go.
    fn compact(&self, topo: &Topology) -> std::io::Result<()> {
        let Some(p) = &self.persist else {
            return Ok(());
        };
        if self.removed.load(Ordering::Acquire) {
            return Ok(());
        }
        let mut log = self.defs_log.lock();
        let next = log.generation + 1;
        let snapshot = topo.encode_snapshot(&self.name, next);
        let written = p.save_definitions(&self.name, &snapshot)?;
        let dir = p.definitions_dir();
        for generation in 0..next {
            let old = log_path(&dir, &self.name, generation);
            if old.exists() {
                let _ = std::fs::remove_file(old);
            }
        }
        *log = LogState {
            generation: next,
            bytes: 0,
            snapshot_bytes: written,
            compacting: log.compacting,
        };
        Ok(())
    }

    /// The log generation appends go to.
    pub(crate) fn log_generation(&self) -> u64 {
        self.defs_log.lock().generation
    }

    /// Recovery: the snapshot's generation and size are where the log continues.
    pub(crate) fn set_log_start(&self, generation: u64, snapshot_bytes: u64) {
        let mut log = self.defs_log.lock();
        log.generation = generation;
        log.snapshot_bytes = snapshot_bytes;
        log.bytes = 0;
    }

    /// Recovery, before the snapshot is loaded and any log replayed: notes the queues that
    /// `records` remove. A queue put (by the snapshot or a record) and removed later in the
    /// replay is not built at all: building it would start it (a quorum queue's group takes
    /// its recovered Raft log), and a queue of the same name declared after the removal must
    /// find that state, not a fresh one.
    pub(crate) fn expect_removes(&self, records: &[Vec<TopologyCommand>]) {
        let mut pending = self.replay_removes.lock();
        for c in records.iter().flatten() {
            if let TopologyCommand::RemoveQueue { name } = c {
                *pending.entry(name.clone()).or_default() += 1;
            }
        }
    }

    /// Recovery: replays the records of log `generation` (read by [`read_log`]) and continues
    /// appending to it when it is the newest.
    pub(crate) fn replay_log(&self, generation: u64, records: &[Vec<TopologyCommand>], bytes: u64) {
        let mut topo = self.topology.write();
        for record in records {
            for c in record {
                self.apply(&mut topo, c);
            }
        }
        let mut log = self.defs_log.lock();
        if generation >= log.generation {
            log.generation = generation;
            log.bytes = bytes;
        }
    }

    /// Applies one command to `topo`: the one deterministic function recovery replays (no
    /// clock, no randomness, no I/O). Putting what exists keeps it; removing what is not there
    /// does nothing.
    pub(super) fn apply(&self, topo: &mut Topology, c: &TopologyCommand) {
        match c {
            TopologyCommand::PutExchange {
                name,
                kind,
                auto_delete,
                internal,
                arguments,
            } => {
                if !topo.exchanges.contains_key(name) {
                    let mut x = Exchange::new(
                        name.clone(),
                        *kind,
                        true,
                        *auto_delete,
                        *internal,
                        arguments.clone(),
                    );
                    x.apply_policy(topo.policies.applied(name, Target::Exchange));
                    topo.exchanges.insert(name.clone(), x);
                }
            }
            TopologyCommand::PutQueue {
                name,
                auto_delete,
                arguments,
            } => {
                // Removed later in the replay: not built (see `expect_removes`).
                let removed_later = self.replay_removes.lock().get(name).is_some_and(|n| *n > 0);
                if !removed_later && !topo.queues.contains_key(name.as_str()) {
                    let queue =
                        self.new_queue(name.clone(), true, None, *auto_delete, arguments.clone());
                    if queue.apply_policy(topo.policies.applied(name, Target::Queue(queue.kind())))
                    {
                        // After the policy: a sweep may have dropped the new queue meanwhile.
                        self.sweeps.add(&queue);
                    }
                    topo.queues.insert(queue.shared_name(), queue);
                }
            }
            TopologyCommand::AddBinding { source, binding } => {
                let binding = Binding {
                    destination: topo.shared(binding.destination.clone()),
                    ..binding.clone()
                };
                if let Some(x) = topo.exchanges.get_mut(source) {
                    let added = x.bind(binding);
                    topo.bindings += usize::from(added);
                }
            }
            TopologyCommand::RemoveBinding { source, binding } => {
                if let Some(x) = topo.exchanges.get_mut(source) {
                    let removed = x.unbind(binding);
                    topo.bindings -= usize::from(removed);
                }
            }
            TopologyCommand::RemoveExchange { name } => {
                if let Some(x) = topo.exchanges.remove(name) {
                    topo.bindings -= x.binding_count();
                }
            }
            TopologyCommand::RemoveQueue { name } => {
                topo.queues.remove(name.as_str());
                let mut pending = self.replay_removes.lock();
                if let Some(n) = pending.get_mut(name) {
                    *n -= 1;
                    if *n == 0 {
                        pending.remove(name);
                    }
                }
            }
            TopologyCommand::PutPolicy { operator, policy } => {
                topo.policies
                    .of_mut(*operator)
                    .insert(policy.name.clone(), policy.clone());
                topo.reapply_policies(&self.sweeps);
            }
            TopologyCommand::RemovePolicy { operator, name } => {
                topo.policies.of_mut(*operator).remove(name);
                topo.reapply_policies(&self.sweeps);
            }
        }
    }
}

/// The bindings to queue `name` in `topo`, as the records that add them: what a node writes
/// again when its copy of the queue makes way for a stand-in (see
/// [`VHost::hand_over_queue`]).
pub(super) fn bindings_to(topo: &Topology, name: &str) -> Vec<TopologyCommand> {
    let dest = Destination::Queue(name.into());
    topo.exchanges
        .values()
        .flat_map(|x| {
            x.bindings_to(&dest).map(|b| TopologyCommand::AddBinding {
                source: x.name.clone(),
                binding: b.clone(),
            })
        })
        .collect()
}
