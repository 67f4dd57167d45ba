//! The [`Broker`]: every vhost, the access-control database, the read model and, for a
//! durable broker, the data directory it opened and recovered.

use crate::clock::{Clock, SystemClock};
use crate::delayed;

use crate::limits::Limits;
use crate::persist::{get_str, Persistence, StorageOptions};
use crate::queue::QueueKind;
use crate::vhost::{finish_queue_delete, VHost};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use warren_store::spill::SpillEntry;
use warren_store::{RecoveryReport, Store};

/// The broker: vhosts and the access-control database.
pub struct Broker {
    vhosts: RwLock<HashMap<String, Arc<VHost>>>,
    access: parking_lot::RwLock<crate::access::AccessControl>,
    /// Bumped each time the access-control database may have changed (see
    /// [`Broker::access_generation`]).
    access_generation: AtomicU64,
    persist: Option<Arc<Persistence>>,
    ids: Arc<AtomicU64>,
    clock: Arc<dyn Clock>,
    limits: Arc<RwLock<Limits>>,
    registry: Arc<crate::registry::Registry>,
    /// The access-control database was loaded from the data directory (changed at run time
    /// before), not built from scratch.
    access_restored: bool,
    /// Kinds of queue besides classic, registered on every vhost (see
    /// [`Broker::set_queue_kind`]).
    queue_kinds: RwLock<Vec<(String, Arc<dyn QueueKind>)>>,
    /// Where metadata changes are replicated, in a cluster (see [`crate::replica`]).
    replicator: crate::replica::ReplicatorSlot,
    /// The access-control database as this node last replicated or applied it (as stored),
    /// what the next local change is compared with.
    access_replicated: parking_lot::Mutex<String>,
}

/// Kinds of queue to register on every vhost before recovery (see [`Broker::open_with`]).
pub type QueueKinds = Vec<(String, Arc<dyn QueueKind>)>;

impl Default for Broker {
    fn default() -> Self {
        Self::new()
    }
}

/// Why a durable broker could not start.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The data directory cannot be used (not a directory, locked by another broker, a
    /// format this build does not know).
    #[error(transparent)]
    DataDir(#[from] crate::data_dir::DataDirError),
    /// The message store failed to open or recover.
    #[error("message store {}: {source}", dir.display())]
    Store {
        /// The store's directory.
        dir: std::path::PathBuf,
        /// The cause.
        source: warren_store::StoreError,
    },
    /// A definitions file cannot be read.
    #[error(transparent)]
    Definitions(#[from] crate::persist::DefinitionsError),
}

impl Broker {
    /// An in-memory broker with the default vhost `/` and RabbitMQ's first-boot access
    /// control (user `guest` with full permissions on `/`, see
    /// [`AccessControl::with_default_guest`](crate::access::AccessControl::with_default_guest)):
    /// nothing survives a restart and queues are bounded by memory only.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An in-memory broker whose TTLs and expiries are measured with `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        let b = Broker {
            vhosts: RwLock::new(HashMap::new()),
            access: parking_lot::RwLock::new(crate::access::AccessControl::with_default_guest()),
            access_generation: AtomicU64::new(0),
            persist: None,
            ids: Arc::new(AtomicU64::new(1)),
            clock,
            limits: Arc::default(),
            registry: crate::registry::Registry::new(),
            access_restored: false,
            queue_kinds: RwLock::new(Vec::new()),
            replicator: Arc::default(),
            access_replicated: parking_lot::Mutex::new(String::new()),
        };
        b.add_vhost("/");
        b
    }

    /// A durable broker on `options.data_dir`: locks the directory for as long as the broker
    /// lives (until [`Broker::close`]), checks its format version, recovers durable
    /// definitions and the messages of durable queues, and pages every queue beyond its
    /// in-memory window to disk.
    ///
    /// Errors: [`OpenError`]: the directory is unusable or in use by another broker, the
    /// store cannot be opened, or a definitions file cannot be read.
    pub fn open(
        options: StorageOptions,
    ) -> std::result::Result<(Broker, RecoveryReport), OpenError> {
        Self::open_with(options, Vec::new())
    }

    /// [`Broker::open`] with kinds of queue besides classic (see [`Broker::set_queue_kind`])
    /// registered on every vhost before the durable queues are recovered.
    pub fn open_with(
        options: StorageOptions,
        kinds: QueueKinds,
    ) -> std::result::Result<(Broker, RecoveryReport), OpenError> {
        let dir = crate::data_dir::DataDir::open(&options.data_dir)?;
        let (store, recovered) =
            Store::open(options.store_config()).map_err(|source| OpenError::Store {
                dir: options.data_dir.join("messages"),
                source,
            })?;
        let _ = std::fs::remove_dir_all(options.data_dir.join("spill"));
        let persist = Arc::new(Persistence::new(store.clone(), options, dir));
        let definitions = match persist.load_definitions() {
            Ok(d) => d,
            Err(e) => {
                store.close();
                return Err(e.into());
            }
        };
        // Users, vhosts and permissions changed at run time before (see ops::admin).
        let stored_access = match persist.load_access() {
            Ok(None) => None,
            Ok(Some(text)) => match crate::definitions::import::parse_stored_access(&text) {
                Ok(a) => Some(a),
                Err(reason) => {
                    store.close();
                    return Err(crate::persist::DefinitionsError {
                        path: options_dir(&persist).join("access.json"),
                        reason,
                    }
                    .into());
                }
            },
            Err(e) => {
                store.close();
                return Err(e.into());
            }
        };
        let access_restored = stored_access.is_some();
        let b = Broker {
            vhosts: RwLock::new(HashMap::new()),
            access: parking_lot::RwLock::new(
                stored_access.unwrap_or_else(crate::access::AccessControl::with_default_guest),
            ),
            access_generation: AtomicU64::new(0),
            persist: Some(persist.clone()),
            ids: Arc::new(AtomicU64::new(0)),
            clock: Arc::new(SystemClock),
            limits: Arc::default(),
            registry: crate::registry::Registry::new(),
            access_restored,
            queue_kinds: RwLock::new(kinds),
            replicator: Arc::default(),
            access_replicated: parking_lot::Mutex::new(String::new()),
        };
        let mut snapshots = Vec::with_capacity(definitions.len());
        for (defs, size) in definitions {
            let vh = b.add_vhost(get_str(&defs, "name"));
            let generation = defs.get("log_generation").and_then(|v| v.as_i64());
            vh.set_log_start(generation.unwrap_or(0).max(0) as u64, size);
            snapshots.push((vh, defs));
        }
        // The changes since each snapshot, from its generation on; older logs were compacted
        // into it (a crash came between the snapshot's rename and their removal). All are
        // read before anything is built, so that a queue removed later in the replay is never
        // built (`VHost::expect_removes`).
        let mut logs = Vec::new();
        for (vhost, generation, path) in persist.log_files() {
            let vh = b.add_vhost(&vhost);
            if generation < vh.log_generation() {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            let records = match crate::vhost::log::read_log(&path) {
                Ok(r) => r,
                Err(reason) => {
                    store.close();
                    return Err(crate::persist::DefinitionsError { path, reason }.into());
                }
            };
            let bytes = std::fs::metadata(&path).map_or(0, |m| m.len());
            vh.expect_removes(&records);
            logs.push((vh, generation, records, bytes));
        }
        for (vh, defs) in snapshots {
            vh.load_definitions(&defs);
        }
        for (vh, generation, records, bytes) in logs {
            vh.replay_log(generation, &records, bytes);
        }
        b.add_vhost("/");
        for (key, entries) in recovered.queues {
            if let Some((vhost, exchange, due_ms)) = delayed::parse_store_key(&key) {
                // Persistent messages held by a durable delayed exchange.
                match b.vhost(vhost).filter(|v| v.holds_durably(exchange)) {
                    Some(v) => v.recover_delayed(exchange, due_ms, &entries),
                    None => {
                        for e in entries {
                            store.ack(&key, e.id, e.location);
                        }
                    }
                }
                continue;
            }
            let queue = key.split_once('\u{1f}').and_then(|(v, q)| {
                let v = b.vhost(v)?;
                let q = v.durable_queue(q)?;
                Some((v, q))
            });
            match queue {
                Some((v, q)) => {
                    q.recover(&mut entries.into_iter().map(SpillEntry::from));
                    v.track_use(&q);
                }
                None => {
                    for e in entries {
                        store.ack(&key, e.id, e.location);
                    }
                }
            }
        }
        // Once every queue is back (a dead-letter target included), over-long queues shed
        // their heads as they would have had the messages come back while running.
        for v in b.vhosts.read().values() {
            for q in v.queues() {
                q.enforce_limits();
            }
        }
        Ok((b, recovered.report))
    }

    /// The access-control database (users, vhost records, permissions), for reading.
    pub fn access(&self) -> parking_lot::RwLockReadGuard<'_, crate::access::AccessControl> {
        self.access.read()
    }

    /// The access-control database, for changing. Every call counts as a change: decisions
    /// cached under an older [`Broker::access_generation`] are dropped.
    pub fn access_mut(&self) -> parking_lot::RwLockWriteGuard<'_, crate::access::AccessControl> {
        let guard = self.access.write();
        self.access_generation.fetch_add(1, Ordering::Release);
        guard
    }

    /// A number that changes whenever the access-control database may have changed, for
    /// caches of access decisions (a channel's publish permission, as RabbitMQ caches its
    /// permission checks per channel).
    pub fn access_generation(&self) -> u64 {
        self.access_generation.load(Ordering::Acquire)
    }

    /// True when the access-control database was loaded from the data directory, where
    /// [`crate::ops::admin::Admin`] stores it after a change at run time.
    pub fn access_restored(&self) -> bool {
        self.access_restored
    }

    /// Stores the access-control database `json` (a definitions document) in the data
    /// directory; nothing to do for an in-memory broker.
    ///
    /// Errors: the file could not be written and fsynced.
    pub(crate) fn store_access(&self, json: &str) -> std::io::Result<()> {
        match &self.persist {
            Some(p) => p.save_access(json),
            None => Ok(()),
        }
    }

    /// Sets where this broker's metadata changes are replicated from now on (the cluster's
    /// metadata group, see [`crate::replica`]); a second call changes nothing.
    pub fn set_replicator(&self, r: Arc<dyn crate::replica::MetadataReplicator>) {
        *self.access_replicated.lock() = self.access_json();
        let _ = self.replicator.set(r);
    }

    /// The access-control database as stored in `access.json`.
    pub fn access_json(&self) -> String {
        crate::definitions::export::export_access(&self.access()).to_json()
    }

    /// What changed in the access-control database since this node last replicated or
    /// applied it, now that it is `json` (see [`crate::replica::access_delta`]); `None`
    /// when nothing did.
    pub(crate) fn access_change(&self, json: &str) -> Option<String> {
        let mut last = self.access_replicated.lock();
        let before = std::mem::replace(&mut *last, json.to_string());
        match crate::replica::access_delta(&before, json) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "access-control change not compared");
                None
            }
        }
    }

    /// The replicator set by [`Broker::set_replicator`], if any.
    pub fn replicator(&self) -> Option<&Arc<dyn crate::replica::MetadataReplicator>> {
        self.replicator.get()
    }

    /// Applies a durable topology change of `vhost` made on another node (see
    /// [`VHost::apply_replicated`]); a vhost this node does not have is skipped. Returns
    /// how many commands were applied.
    pub fn apply_replicated_topology(
        &self,
        vhost: &str,
        commands: &[crate::vhost::log::TopologyCommand],
    ) -> usize {
        match self.vhost(vhost) {
            Some(v) => v.apply_replicated(commands),
            None => {
                tracing::warn!(%vhost, "a replicated definitions change for a vhost this node does not have");
                0
            }
        }
    }

    /// Applies `delta`, a change of the access-control database made on another node (see
    /// [`crate::replica::access_delta`]): the entries it names are added, replaced or removed
    /// (under the database's lock, so that a change made here meanwhile is kept), vhosts new
    /// in it are created, vhosts gone from it are deleted with their connections (320
    /// CONNECTION_FORCED), connections of users gone from it are closed, and the database is
    /// stored here. Blocks on file writes: call it off the async runtime's threads.
    ///
    /// Errors: `delta` does not apply, or the database could not be stored.
    pub fn apply_replicated_access_delta(&self, delta: &str) -> std::result::Result<(), String> {
        let (json, gone_vhosts, gone_users, new_vhosts) = {
            let mut access = self.access_mut();
            let current = crate::definitions::export::export_access(&access).to_json();
            let json = crate::replica::apply_access_delta(&current, delta)?;
            let new = crate::definitions::import::parse_stored_access(&json)?;
            let gone_vhosts: Vec<String> = access
                .vhosts()
                .filter(|v| new.vhost(&v.name).is_none())
                .map(|v| v.name.clone())
                .collect();
            let gone_users: Vec<String> = access
                .users()
                .filter(|u| new.user(&u.name).is_none())
                .map(|u| u.name.clone())
                .collect();
            let new_vhosts: Vec<String> = new
                .vhosts()
                .filter(|v| access.vhost(&v.name).is_none())
                .map(|v| v.name.clone())
                .collect();
            *access = new;
            (json, gone_vhosts, gone_users, new_vhosts)
        };
        {
            // What this node has replicated or applied moves on by the same change; a local
            // change not compared yet stays out of it.
            let mut last = self.access_replicated.lock();
            if let Ok(moved) = crate::replica::apply_access_delta(&last, delta) {
                *last = moved;
            }
        }
        for v in &new_vhosts {
            self.add_vhost(v);
        }
        for v in &gone_vhosts {
            let reason = crate::ops::admin::vhost_deleted_reason(v);
            self.registry.close_where(|c| c.vhost == *v, &reason);
            if let Err(e) = self.remove_vhost(v) {
                tracing::warn!(vhost = %v, error = %e, "a vhost deleted in the cluster: its definitions could not be removed");
            }
            tracing::info!(vhost = %v, "vhost deleted in the cluster");
        }
        for u in &gone_users {
            let reason = crate::ops::admin::user_deleted_reason(u);
            self.registry.close_where(|c| c.user == *u, &reason);
        }
        self.store_access(&json).map_err(|e| e.to_string())
    }

    /// The read model: live connections and channels, message counts (see
    /// [`crate::registry`]).
    pub fn registry(&self) -> &Arc<crate::registry::Registry> {
        &self.registry
    }

    /// The message store, for a durable broker.
    pub fn store(&self) -> Option<&Store> {
        self.persist.as_ref().map(|p| &p.store)
    }

    /// Sets the per-vhost caps on queues, exchanges and bindings of every vhost (see
    /// [`Limits`]; [`Limits::default`] until set). Declares already made stay.
    pub fn set_limits(&self, limits: Limits) {
        *self.limits.write() = limits;
    }

    /// The per-vhost caps in force.
    pub fn limits(&self) -> Limits {
        *self.limits.read()
    }

    /// Stops the message store's writer after a final fsync and releases the data
    /// directory's lock (another broker may open it from then on).
    pub fn close(&self) {
        if let Some(p) = &self.persist {
            p.defs.close();
            p.store.close();
            p.release();
        }
    }

    /// Creates a vhost with the standard exchanges if it does not exist; returns it.
    pub fn add_vhost(&self, name: &str) -> Arc<VHost> {
        self.vhosts
            .write()
            .entry(name.to_string())
            .or_insert_with(|| {
                let v = Arc::new_cyclic(|me| {
                    VHost::new(name)
                        .attached(
                            self.persist.clone(),
                            self.ids.clone(),
                            self.clock.clone(),
                            self.limits.clone(),
                            me.clone(),
                        )
                        .counting_churn_in(self.registry.churn().clone())
                        .replicating_to(self.replicator.clone())
                });
                for (kind, k) in self.queue_kinds.read().iter() {
                    v.set_queue_kind(kind, k.clone());
                }
                v
            })
            .clone()
    }

    /// Registers a kind of queue under `x-queue-type` `name` on every vhost, present and
    /// future (see [`VHost::set_queue_kind`]). Durable queues of that kind recovered before
    /// the call were recovered as classic queues: a durable broker registers its kinds with
    /// [`Broker::open_with`].
    pub fn set_queue_kind(&self, name: &str, kind: Arc<dyn QueueKind>) {
        self.queue_kinds
            .write()
            .push((name.to_string(), kind.clone()));
        for v in self.vhosts.read().values() {
            v.set_queue_kind(name, kind.clone());
        }
    }

    /// Deletes vhost `name` with everything in it (RabbitMQ's `rabbit_vhost:delete`): its
    /// queues are deleted (their consumers get basic.cancel, their stored messages are
    /// dropped), its exchanges and bindings go, and a durable broker removes the vhost's
    /// definitions from its data directory, so that it does not come back at the next start.
    /// The vhost's connections are not closed here (see
    /// [`crate::registry::Registry::close_where`]); whatever they still do touches nothing.
    ///
    /// Blocks until the definitions files are removed (the definitions writer first writes
    /// what was queued before): call it off the async runtime's threads. Returns false when
    /// there was no such vhost.
    ///
    /// Errors: the definitions files could not be removed (the vhost is gone from memory;
    /// the files are removed at the next start if it is not recreated).
    pub fn remove_vhost(&self, name: &str) -> std::io::Result<bool> {
        let Some(v) = self.vhosts.write().remove(name) else {
            return Ok(false);
        };
        let queues = v.clear_for_removal();
        for q in &queues {
            finish_queue_delete(q);
        }
        crate::registry::bump_by(&self.registry.churn().queue_deleted, queues.len() as u64);
        self.registry.forget_vhost(name);
        let Some(p) = &self.persist else {
            return Ok(true);
        };
        // Records queued for this vhost before the flag was set are written first; then its
        // snapshot and logs are removed.
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = p.definitions_dir();
        let stem = crate::persist::file_stem(name);
        p.defs.after_written(Box::new(move |_| {
            let _ = tx.send(remove_vhost_files(&dir, &stem));
        }));
        rx.recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the broker is closed")))?;
        Ok(true)
    }

    /// Periodic housekeeping of every vhost (see [`VHost::sweep`]).
    pub fn sweep(&self) {
        let vhosts: Vec<Arc<VHost>> = self.vhosts.read().values().cloned().collect();
        for v in vhosts {
            v.sweep();
        }
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

fn options_dir(p: &Persistence) -> std::path::PathBuf {
    p.data_dir().to_path_buf()
}

/// Removes a vhost's definitions snapshot and log files (names starting `<stem>.`) from
/// `dir`, and makes the removal durable.
fn remove_vhost_files(dir: &std::path::Path, stem: &str) -> std::io::Result<()> {
    let prefix = format!("{stem}.");
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for e in entries {
        let e = e?;
        if e.file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
        {
            std::fs::remove_file(e.path())?;
        }
    }
    std::fs::File::open(dir)?.sync_all()
}
