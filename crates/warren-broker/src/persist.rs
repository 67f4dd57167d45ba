//! Durability for the broker model: the message store handle, per-queue paging settings, and
//! the files of durable definitions (exchanges, queues, bindings) per vhost: a snapshot written
//! here, and a log of the changes since (see [`crate::vhost::log`]).
//!
//! A snapshot is `WARRENDEFS1\n`, a CRC32C of the rest, then one AMQP field table (the codec's
//! own encoding, so argument types survive exactly). Writes go to a temporary file that is
//! fsynced and renamed over the old one, and the directory is fsynced: after a crash the file is
//! either the old or the new version, never half of one.
//!
//! A snapshot or log that cannot be read stops the broker from starting: starting without it
//! would delete the messages of every queue it defines.

use crate::data_dir::DataDir;
use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use warren_amqp::table::{decode_table, Decoder, FieldTable, FieldValue};
use warren_store::{Store, StoreConfig};

const MAGIC: &[u8] = b"WARRENDEFS1\n";

/// Storage settings of a broker with a data directory.
#[derive(Debug, Clone)]
pub struct StorageOptions {
    /// Data directory: `messages/` (segments), `definitions/`, `spill/`.
    pub data_dir: PathBuf,
    /// Segment size, bytes.
    pub segment_size: u64,
    /// Largest batch of appends covered by one fsync, bytes.
    pub fsync_batch_bytes: usize,
    /// How long the store's writer waits for more appends before an fsync, microseconds.
    pub fsync_delay_us: u64,
    /// Ready messages a queue keeps in memory before paging to disk.
    pub queue_window: usize,
    /// Ready body bytes a queue keeps in memory before paging to disk.
    pub queue_window_bytes: usize,
    /// Unacknowledged deliveries a channel keeps in memory; beyond this it keeps their
    /// store locations only (bodies are read back on requeue or dead-lettering).
    pub unacked_window: usize,
    /// The same bound in body bytes.
    pub unacked_window_bytes: usize,
    /// A segment is compacted once its live records take less than this fraction of it.
    pub compaction_ratio: f64,
    /// ... and nothing in it has been settled for this long, ms.
    pub compaction_quiet_ms: u64,
}

impl StorageOptions {
    /// Defaults for `data_dir`: 64 MiB segments, 16 MiB fsync batches, no fsync delay, a
    /// window of 2048 messages or 8 MiB per queue and of unacknowledged messages per channel,
    /// compaction of segments less than half live and quiet for 2 s.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        StorageOptions {
            data_dir: data_dir.into(),
            segment_size: 64 * 1024 * 1024,
            fsync_batch_bytes: 16 * 1024 * 1024,
            fsync_delay_us: 0,
            queue_window: 2048,
            queue_window_bytes: 8 * 1024 * 1024,
            unacked_window: 2048,
            unacked_window_bytes: 8 * 1024 * 1024,
            compaction_ratio: 0.5,
            compaction_quiet_ms: 2000,
        }
    }

    pub(crate) fn store_config(&self) -> StoreConfig {
        StoreConfig {
            segment_size: self.segment_size,
            max_batch_bytes: self.fsync_batch_bytes,
            fsync_delay: std::time::Duration::from_micros(self.fsync_delay_us),
            compact_ratio: self.compaction_ratio,
            compact_quiet: std::time::Duration::from_millis(self.compaction_quiet_ms),
            ..StoreConfig::new(self.data_dir.join("messages"))
        }
    }
}

/// What a vhost needs to persist things.
pub struct Persistence {
    /// The message store.
    pub store: Store,
    /// Group commit of the definitions logs.
    pub(crate) defs: crate::defs_writer::DefsWriter,
    /// Paging settings.
    pub options: StorageOptions,
    /// The paging bounds and spill directory every queue's [`crate::queue::Backing`] shares.
    pub(crate) paging: std::sync::Arc<crate::queue::Paging>,
    spill_counter: AtomicU64,
    /// The locked data directory; `None` once the broker is closed (nothing is written then).
    dir: parking_lot::Mutex<Option<DataDir>>,
}

/// A definitions file that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot read durable definitions {}: {reason}; not starting, since starting without them \
     would delete the messages of every queue they define (move the file away to start without \
     them)",
    path.display()
)]
pub struct DefinitionsError {
    /// The file.
    pub path: PathBuf,
    /// Why.
    pub reason: String,
}

impl Persistence {
    pub(crate) fn new(store: Store, options: StorageOptions, dir: DataDir) -> Self {
        let paging = std::sync::Arc::new(crate::queue::Paging {
            window: options.queue_window,
            window_bytes: options.queue_window_bytes,
            unacked_window: options.unacked_window,
            unacked_window_bytes: options.unacked_window_bytes,
            spill_dir: options.data_dir.join("spill"),
        });
        Persistence {
            store,
            defs: crate::defs_writer::DefsWriter::start(),
            options,
            paging,
            spill_counter: AtomicU64::new(0),
            dir: parking_lot::Mutex::new(Some(dir)),
        }
    }

    /// Releases the data directory's lock; later saves fail. Called once the store is closed.
    pub(crate) fn release(&self) {
        self.dir.lock().take();
    }

    /// A fresh spill file number (spill files are scratch space, named by a counter; see
    /// [`crate::queue::Backing::spill_path`]).
    pub fn spill_number(&self) -> u64 {
        self.spill_counter.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn definitions_dir(&self) -> PathBuf {
        self.options.data_dir.join("definitions")
    }

    /// Writes `body`, a field table in AMQP encoding (its `u32` length, then its entries; see
    /// `Topology::encode_snapshot`), as vhost `vhost`'s definitions, atomically: when this
    /// returns `Ok`, the new definitions are on disk (fsynced, directory included). Returns
    /// the bytes written.
    ///
    /// Errors: any I/O error (the old file, or the new one, is left whole), or the broker is
    /// closed.
    pub fn save_definitions(&self, vhost: &str, body: &[u8]) -> std::io::Result<u64> {
        // Held during the write: a broker that has released the directory writes nothing.
        let held = self.dir.lock();
        if held.is_none() {
            return Err(std::io::Error::other("the broker is closed"));
        }
        let dir = self.definitions_dir();
        std::fs::create_dir_all(&dir)?;
        let mut out = Vec::with_capacity(body.len() + 16);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&crc32c::crc32c(body).to_be_bytes());
        out.extend_from_slice(body);
        let path = dir.join(file_name(vhost));
        let tmp = path.with_extension("tmp");
        let written = (|| {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(&out)?;
            f.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&dir)?.sync_all()?;
        Ok(out.len() as u64)
    }

    /// Reads every vhost's definitions.
    ///
    /// Errors: a definitions file that cannot be read or fails its checksum.
    pub fn load_definitions(&self) -> Result<Vec<(FieldTable, u64)>, DefinitionsError> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(self.definitions_dir()) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => {
                return Err(DefinitionsError {
                    path: self.definitions_dir(),
                    reason: e.to_string(),
                })
            }
        };
        for e in entries.filter_map(|e| e.ok()) {
            let path = e.path();
            if path.extension().is_none_or(|x| x != "defs") {
                continue;
            }
            let t = read_definitions(&path).map_err(|reason| DefinitionsError {
                path: path.clone(),
                reason,
            })?;
            let size = std::fs::metadata(&path).map_or(0, |m| m.len());
            out.push((t, size));
        }
        Ok(out)
    }
}

/// The access-control database changed at run time (users, vhosts, permissions), in
/// RabbitMQ's definitions format: `<data_dir>/access.json`.
const ACCESS_FILE: &str = "access.json";

impl Persistence {
    /// Writes the access-control database `json` (a definitions document) atomically: when
    /// this returns `Ok`, it is on disk (fsynced, directory included).
    ///
    /// Errors: any I/O error (the old file is left whole), or the broker is closed.
    pub(crate) fn save_access(&self, json: &str) -> std::io::Result<()> {
        let held = self.dir.lock();
        if held.is_none() {
            return Err(std::io::Error::other("the broker is closed"));
        }
        let path = self.options.data_dir.join(ACCESS_FILE);
        let tmp = path.with_extension("tmp");
        let written = (|| {
            use std::io::Write;
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(json.as_bytes())?;
            f.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(&self.options.data_dir)?.sync_all()
    }

    /// The access-control database saved by [`Persistence::save_access`], if any.
    ///
    /// Errors: the file exists but cannot be read.
    pub(crate) fn load_access(&self) -> Result<Option<String>, DefinitionsError> {
        let path = self.options.data_dir.join(ACCESS_FILE);
        match std::fs::read_to_string(&path) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(DefinitionsError {
                path,
                reason: e.to_string(),
            }),
        }
    }
}

impl Persistence {
    /// The data directory.
    pub(crate) fn data_dir(&self) -> &Path {
        &self.options.data_dir
    }

    /// True once the broker has released its data directory: nothing is written any more.
    pub(crate) fn released(&self) -> bool {
        self.dir.lock().is_none()
    }

    /// The definitions log files as (vhost, generation, path), oldest generation first.
    pub(crate) fn log_files(&self) -> Vec<(String, u64, PathBuf)> {
        let mut out: Vec<(String, u64, PathBuf)> = std::fs::read_dir(self.definitions_dir())
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let (vhost, generation) = parse_log_name(e.file_name().to_str()?)?;
                Some((vhost, generation, e.path()))
            })
            .collect();
        out.sort_by_key(|(_, generation, _)| *generation);
        out
    }
}

fn read_definitions(path: &Path) -> Result<FieldTable, String> {
    let raw = std::fs::read(path).map_err(|e| e.to_string())?;
    let rest = raw.strip_prefix(MAGIC).ok_or("not a definitions file")?;
    if rest.len() < 4 {
        return Err("truncated".into());
    }
    let crc = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
    let body = &rest[4..];
    if crc32c::crc32c(body) != crc {
        return Err("checksum mismatch".into());
    }
    decode_table(&mut Decoder::new(body), 64).map_err(|e| e.to_string())
}

/// File name for a vhost's definitions: the name hex-encoded, so any vhost name is safe.
fn file_name(vhost: &str) -> String {
    format!("{}.defs", file_stem(vhost))
}

/// `vhost-<name in hex>`: the start of the names of a vhost's definitions files.
pub(crate) fn file_stem(vhost: &str) -> String {
    let hex: String = vhost.bytes().map(|b| format!("{b:02x}")).collect();
    format!("vhost-{hex}")
}

/// The vhost and generation of a log file named `vhost-<hex>.<generation>.log`.
fn parse_log_name(name: &str) -> Option<(String, u64)> {
    let rest = name.strip_prefix("vhost-")?.strip_suffix(".log")?;
    let (hex, generation) = rest.split_once('.')?;
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    Some((String::from_utf8(bytes).ok()?, generation.parse().ok()?))
}

/// Helpers to build and read definition tables.
pub(crate) fn s(v: &str) -> FieldValue {
    FieldValue::LongString(Bytes::copy_from_slice(v.as_bytes()))
}

pub(crate) fn get_str<'a>(t: &'a FieldTable, k: &str) -> &'a str {
    t.get(k).and_then(|v| v.as_str()).unwrap_or("")
}

pub(crate) fn get_bool(t: &FieldTable, k: &str) -> bool {
    t.get(k).and_then(|v| v.as_bool()).unwrap_or(false)
}

pub(crate) fn get_table(t: &FieldTable, k: &str) -> FieldTable {
    t.get(k)
        .and_then(|v| v.as_table())
        .cloned()
        .unwrap_or_default()
}
