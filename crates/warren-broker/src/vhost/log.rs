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

use super::*;
use bytes::BufMut;
use std::io::Write;
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
        }
        t
    }

    /// Reads a command written by [`TopologyCommand::to_table`].
    pub fn from_table(t: &FieldTable) -> std::result::Result<Self, String> {
        let name = || get_str(t, "name").to_string();
        let binding = || {
            let dest = get_str(t, "destination").to_string();
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
        Ok(match get_str(t, "op") {
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
                Removed::Queue(q) => (q.durable && q.exclusive_owner.is_none()).then(|| {
                    TopologyCommand::RemoveQueue {
                        name: q.name.clone(),
                    }
                }),
                Removed::Binding(source, b) => Some(TopologyCommand::RemoveBinding {
                    source: source.clone(),
                    binding: b.clone(),
                }),
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
}

/// The log file of `vhost`'s `generation`.
pub(crate) fn log_path(dir: &Path, vhost: &str, generation: u64) -> PathBuf {
    dir.join(format!(
        "{}.{generation}.log",
        crate::persist::file_stem(vhost)
    ))
}

/// Appends one record holding `commands` to `path` and fsyncs it. On error whatever was written
/// is cut off again, so the file ends with whole records only.
fn append_record(path: &Path, commands: &[TopologyCommand]) -> std::io::Result<u64> {
    let list = commands
        .iter()
        .map(|c| FieldValue::Table(c.to_table()))
        .collect();
    let mut t = FieldTable::new();
    t.insert("commands", FieldValue::Array(list));
    let mut body = bytes::BytesMut::new();
    encode_table(&t, &mut body);
    let mut rec = Vec::with_capacity(body.len() + 8);
    rec.put_u32(body.len() as u32);
    rec.put_u32(crc32c::crc32c(&body));
    rec.extend_from_slice(&body);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let created = !path.exists();
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let before = f.metadata()?.len();
    let written = f.write_all(&rec).and_then(|()| f.sync_data());
    if let Err(e) = written {
        let _ = f.set_len(before);
        return Err(e);
    }
    if created {
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
    }
    Ok(rec.len() as u64)
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
        let commands = t
            .get("commands")
            .and_then(|v| v.as_array())
            .unwrap_or(&[])
            .iter()
            .filter_map(|v| v.as_table())
            .map(TopologyCommand::from_table)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        out.push(commands);
        at = end;
    }
    Ok(out)
}

impl VHost {
    /// Stores a durable change: `commands` appended to the log as one record and fsynced
    /// (called with the topology write lock held, so records follow the order of the changes);
    /// the log is compacted into a new snapshot when it has grown enough.
    ///
    /// Errors: the I/O error of the append. A change a client asked for is then rolled back
    /// and refused; one the broker made itself (auto-delete, expiry) stays, and the definitions
    /// are marked dirty so that [`VHost::sweep`] writes a whole snapshot again until one is
    /// stored.
    pub(super) fn save(
        &self,
        topo: &Topology,
        commands: Vec<TopologyCommand>,
    ) -> std::io::Result<()> {
        let Some(p) = &self.persist else {
            return Ok(());
        };
        if self.defs_dirty.load(Ordering::Relaxed) {
            // The log misses a change the broker made: only a whole snapshot is right now.
            return self.store_snapshot(topo);
        }
        if p.released() {
            return Err(std::io::Error::other("the broker is closed"));
        }
        let mut log = self.defs_log.lock();
        let path = log_path(&p.definitions_dir(), &self.name, log.generation);
        match append_record(&path, &commands) {
            Ok(n) => log.bytes += n,
            Err(e) => {
                drop(log);
                self.mark_dirty(&e);
                return Err(e);
            }
        }
        let compact = log.bytes > MIN_COMPACT_BYTES.max(2 * log.snapshot_bytes);
        drop(log);
        if compact {
            // The change is stored already; a failed compaction is tried again later.
            if let Err(e) = self.compact(topo) {
                tracing::warn!(vhost = %self.name, error = %e, "cannot compact the definitions log");
            }
        }
        Ok(())
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
        let mut log = self.defs_log.lock();
        let next = log.generation + 1;
        let mut snapshot = topo.snapshot(&self.name);
        snapshot.insert("log_generation", FieldValue::I64(next as i64));
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
        };
        Ok(())
    }

    /// The log generation appends go to.
    pub(super) fn log_generation(&self) -> u64 {
        self.defs_log.lock().generation
    }

    /// Recovery: the snapshot's generation and size are where the log continues.
    pub(super) fn set_log_start(&self, generation: u64, snapshot_bytes: u64) {
        let mut log = self.defs_log.lock();
        log.generation = generation;
        log.snapshot_bytes = snapshot_bytes;
        log.bytes = 0;
    }

    /// Recovery: replays the records of log `generation` (read by [`read_log`]) and continues
    /// appending to it when it is the newest.
    pub(super) fn replay_log(&self, generation: u64, records: &[Vec<TopologyCommand>], bytes: u64) {
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
                topo.exchanges.entry(name.clone()).or_insert_with(|| {
                    Exchange::new(
                        name.clone(),
                        *kind,
                        true,
                        *auto_delete,
                        *internal,
                        arguments.clone(),
                    )
                });
            }
            TopologyCommand::PutQueue {
                name,
                auto_delete,
                arguments,
            } => {
                if !topo.queues.contains_key(name) {
                    let queue = self.new_queue(Queue::new(
                        name.clone(),
                        self.name.clone(),
                        true,
                        None,
                        *auto_delete,
                        arguments.clone(),
                    ));
                    topo.queues.insert(name.clone(), Arc::new(queue));
                }
            }
            TopologyCommand::AddBinding { source, binding } => {
                if let Some(x) = topo.exchanges.get_mut(source) {
                    let added = x.bind(binding.clone());
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
                    topo.bindings -= x.bindings().len();
                }
            }
            TopologyCommand::RemoveQueue { name } => {
                topo.queues.remove(name);
            }
        }
    }
}
