//! The state every connection of a running broker shares: the broker model, the configuration
//! in force, connection counts, and the memory and disk alarms that pause publishers.
//!
//! [`crate::server`] creates it and runs the listeners and background tasks around it;
//! [`crate::connection`] reads it. Neither imports the other.

use crate::config::{Config, DiskFreeLimit};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use tracing::{info, warn};

/// State shared by every connection of a running broker.
pub struct ServerState {
    /// The broker model: vhosts, queues, users (shared with the cluster's member requests).
    pub broker: Arc<warren_broker::Broker>,
    /// Configuration in force.
    pub config: Config,
    /// Open connections and channels per vhost and user, for their limits.
    pub sessions: Arc<warren_broker::Sessions>,
    /// Users that may only log in from loopback addresses: `[auth] loopback_users` and the
    /// `[[users]]` marked `loopback_only`.
    pub loopback_users: Vec<String>,
    next_connection: AtomicU64,
    connections: AtomicUsize,
    /// Connections that declared the `connection.blocked` capability.
    blocked_listeners: parking_lot::Mutex<Vec<std::sync::Weak<crate::outbox::Outbox>>>,
    blocked: std::sync::atomic::AtomicBool,
    /// The memory alarm is on: publishers are paused.
    memory_alarm: std::sync::atomic::AtomicBool,
    /// The memory watermark in bytes.
    memory_limit: u64,
    /// The disk alarm is on: publishers are paused.
    disk_alarm: AtomicBool,
    /// The disk alarm's limit (changeable at run time).
    disk_limit: parking_lot::Mutex<DiskLimit>,
    /// The node's quorum queues: their shared Raft log and settings.
    pub quorum: Arc<warren_quorum::QuorumNode>,
    /// The quorum log's directory when the broker has no data directory (removed at close).
    quorum_scratch: Option<std::path::PathBuf>,
}

/// A scratch directory for the quorum queues of a broker without a data directory.
fn scratch_dir() -> std::path::PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    std::env::temp_dir().join(format!(
        "warren-quorum-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// The quorum service's cluster settings from `[cluster]` (validated with the configuration;
/// the secret file is read again here).
fn cluster_settings(
    c: &crate::config::ClusterConfig,
    tls: &crate::tls::TlsConfig,
) -> std::io::Result<warren_quorum::ClusterSettings> {
    let invalid = |key: &str, e: String| std::io::Error::other(format!("invalid {key}: {e}"));
    let tls = if c.tls {
        let (server, client) = crate::tls::load_cluster_configs(tls)
            .map_err(|e| invalid("cluster.tls", e.to_string()))?;
        Some(warren_quorum::transport::ClusterTls {
            server: Arc::new(server),
            client: Arc::new(client),
        })
    } else {
        None
    };
    Ok(warren_quorum::ClusterSettings {
        node_id: c.node_id,
        nodes: c.nodes().map_err(|e| invalid("cluster.seed_nodes", e))?,
        secret: c.secret().map_err(|e| invalid("cluster.secret_file", e))?,
        tls,
    })
}

/// Binds `[cluster] listen` (a bare port: every IPv4 interface).
///
/// Errors: the address does not resolve or cannot be bound (the message names the key).
fn bind_cluster(listen: &crate::listen::ListenAddr) -> std::io::Result<std::net::TcpListener> {
    use crate::listen::ListenAddr;
    let bound = match listen {
        ListenAddr::Port(p) => std::net::TcpListener::bind(("0.0.0.0", *p)),
        ListenAddr::Addr(a) => std::net::TcpListener::bind(a),
        ListenAddr::Host(h, p) => std::net::TcpListener::bind((h.as_str(), *p)),
    };
    bound.map_err(|e| {
        std::io::Error::new(
            e.kind(),
            format!("cannot listen on cluster.listen = {listen}: {e}"),
        )
    })
}

/// Declares and deletes this node's members of quorum queues at other nodes' request, in the
/// broker's vhosts (the vhost must exist here; vhosts reach every node through the cluster's
/// metadata group). Weak: the
/// broker holds the quorum service, which holds this.
struct MemberHost(std::sync::Weak<warren_broker::Broker>);

/// The connection id member declares and deletes act as (no client connection).
const CLUSTER_CONNECTION_ID: u64 = 0;

impl warren_quorum::MemberHost for MemberHost {
    fn start_member(
        &self,
        vhost: &str,
        name: &str,
        arguments: warren_amqp::table::FieldTable,
    ) -> Result<bool, String> {
        let broker = self.0.upgrade().ok_or("the broker is stopping")?;
        let vh = broker
            .vhost(vhost)
            .ok_or_else(|| format!("no vhost '{vhost}' on this node"))?;
        let d = warren_broker::vhost::QueueDeclare {
            name: name.to_string(),
            passive: false,
            durable: true,
            exclusive: false,
            auto_delete: false,
            arguments,
        };
        // The stand-in through which this node reached the queue makes way for the member
        // in one step (the bindings stay). The declare that made the queue reaches the other
        // nodes already.
        warren_broker::replica::unreplicated(|| vh.declare_in_place_of_stand_in(&d))
            .map(|(_, created)| created)
            .map_err(|e| e.text)
    }

    fn broker(&self) -> Option<Arc<warren_broker::Broker>> {
        self.0.upgrade()
    }

    fn delete_member(&self, vhost: &str, name: &str) -> Result<(), String> {
        let broker = self.0.upgrade().ok_or("the broker is stopping")?;
        let Some(vh) = broker.vhost(vhost) else {
            return Ok(());
        };
        // The delete (or member removal) that asked for this reaches the other nodes already.
        warren_broker::replica::unreplicated(|| {
            vh.delete_queue(name, false, false, CLUSTER_CONNECTION_ID)
        })
        .map(|_| ())
        .map_err(|e| e.text)
    }
}

/// The disk alarm's setting: the configured limit, or RabbitMQ's memory-relative one.
#[derive(Debug, Clone, Copy)]
struct DiskLimit {
    limit: DiskFreeLimit,
    memory_relative: f64,
}

/// (free bytes available to the broker, total bytes) of the file system holding `path`.
fn disk_space(path: &std::path::Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: statvfs writes into the zeroed struct we pass; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok((st.f_bavail as u64 * frsize, st.f_blocks as u64 * frsize))
}

/// Total memory of the machine in bytes (`MemTotal` of /proc/meminfo), if known.
fn total_memory() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Returns freed heap pages to the OS, which would otherwise count as resident: mimalloc's
/// (the `warren` binary's allocator) and the system allocator's (for programs that embed the
/// broker on it).
///
/// mimalloc returns freed pages only when the thread that freed them allocates or frees
/// again after a delay: the gigabyte of a recovery's map of 10,000,000 messages stayed
/// resident while the broker sat idle after it.
fn release_free_heap() {
    // SAFETY: mi_collect only frees and purges mimalloc's unused pages; it has no
    // preconditions, and costs nothing when mimalloc is not the allocator.
    unsafe {
        libmimalloc_sys::mi_collect(true);
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free heap pages; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// This process's resident memory in bytes (/proc/self/statm), if known.
fn resident_memory() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).unwrap_or(4096))
}

/// The reason sent in connection.blocked while the message store cannot write (RabbitMQ sends
/// the same text for its disk alarm).
pub const BLOCKED_REASON: &str = "low on disk";

impl ServerState {
    /// A fresh state for `config`: with a data directory, durable definitions and messages are
    /// recovered from it; then users, vhosts and permissions are set up from the configuration
    /// and the definitions file ([`crate::provision`]; guest/guest when neither names users).
    ///
    /// Errors: the message store could not be opened; a user, vhost or permission entry or the
    /// definitions file could not be applied.
    pub fn new(config: Config) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
        let quorum_scratch = config.storage.data_dir.is_none().then(scratch_dir);
        let quorum_dir = match (&config.storage.data_dir, &quorum_scratch) {
            (Some(d), _) => d.join("quorum"),
            (None, Some(s)) => s.clone(),
            (None, None) => unreachable!("a scratch directory without a data directory"),
        };
        let quorum_config = warren_quorum::QuorumConfig::new(quorum_dir);
        let quorum = match &config.cluster {
            None => warren_quorum::QuorumNode::new(quorum_config, runtime),
            Some(c) => {
                let settings = cluster_settings(c, &config.tls)?;
                if let Some(dir) = &config.storage.data_dir {
                    // A data directory in use by another process is refused before this
                    // node talks to the cluster under that process's node id.
                    drop(
                        warren_broker::data_dir::DataDir::open(dir)
                            .map_err(|e| std::io::Error::other(e.to_string()))?,
                    );
                }
                let listener = bind_cluster(&c.listen)?;
                warren_quorum::QuorumNode::clustered(quorum_config, runtime, settings, listener)?
            }
        };
        let kind: Arc<dyn warren_broker::queue::QueueKind> =
            warren_quorum::QuorumKind::new(quorum.clone());
        let broker = match config.storage.options() {
            None => {
                let b = warren_broker::Broker::new();
                b.set_queue_kind("quorum", kind);
                b
            }
            Some(opts) => {
                let (broker, report) =
                    warren_broker::Broker::open_with(opts, vec![("quorum".into(), kind)])
                        .map_err(|e| std::io::Error::other(e.to_string()))?;
                quorum.finish_recovery();
                info!(
                    messages = report.messages,
                    segments = report.segments,
                    truncated_bytes = report.truncated_bytes,
                    corrupt_records = report.corrupt_records,
                    missing_segments = report.missing_segments.len(),
                    ms = report.duration.as_millis() as u64,
                    "recovered durable state"
                );
                // Recovery's scratch maps are gone; hand their pages back to the OS.
                release_free_heap();
                broker
            }
        };
        let broker = Arc::new(broker);
        quorum.set_member_host(Arc::new(MemberHost(Arc::downgrade(&broker))));
        broker.set_limits(config.limits.limits());
        if let Err(e) = crate::provision::provision(&broker, &config) {
            broker.close();
            quorum.close();
            return Err(std::io::Error::other(e.to_string()));
        }
        // In a cluster, metadata changes are replicated from here on (provisioning from the
        // configuration above stays local to each node).
        if let Some(group) = warren_quorum::MetadataGroup::start(&quorum, Arc::downgrade(&broker)) {
            broker.set_replicator(group);
        }
        let mut loopback_users = config.auth.loopback_users.clone();
        loopback_users.extend(
            config
                .users
                .iter()
                .filter(|u| u.loopback_only)
                .map(|u| u.name.clone()),
        );
        let memory_limit = config.memory.limit(total_memory().unwrap_or(u64::MAX));
        let disk_limit = DiskLimit {
            limit: config.storage.disk_free_limit,
            memory_relative: config.storage.disk_free_limit_relative,
        };
        Ok(ServerState {
            broker,
            config,
            sessions: warren_broker::Sessions::new(),
            loopback_users,
            next_connection: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            blocked_listeners: parking_lot::Mutex::new(Vec::new()),
            blocked: std::sync::atomic::AtomicBool::new(false),
            memory_alarm: std::sync::atomic::AtomicBool::new(false),
            memory_limit,
            disk_alarm: AtomicBool::new(false),
            disk_limit: parking_lot::Mutex::new(disk_limit),
            quorum,
            quorum_scratch,
        })
    }

    /// Stops the broker's storage: the message store and definitions writer, then the
    /// quorum queues' log; releases the data directory.
    pub fn close(&self) {
        self.broker.close();
        self.quorum.close();
        if let Some(d) = &self.quorum_scratch {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// Changes the disk alarm's limit while the broker runs (as RabbitMQ's
    /// `rabbitmqctl set_disk_free_limit`); `memory_relative` above 0 replaces `limit` with a
    /// multiple of the machine's memory. Takes effect at the next check (within 250 ms).
    pub fn set_disk_free_limit(&self, limit: DiskFreeLimit, memory_relative: f64) {
        *self.disk_limit.lock() = DiskLimit {
            limit,
            memory_relative,
        };
    }

    /// The disk alarm's limit in bytes for a file system of `total` bytes.
    fn disk_limit_bytes(&self, total: u64) -> u64 {
        let l = *self.disk_limit.lock();
        if l.memory_relative > 0.0 {
            (total_memory().unwrap_or(0) as f64 * l.memory_relative) as u64
        } else {
            l.limit.bytes(total)
        }
    }

    /// The directory whose file system the disk figures are about: the data directory, or
    /// the working directory for a broker without one (which has no disk alarm).
    fn disk_dir(&self) -> std::path::PathBuf {
        self.config
            .storage
            .data_dir
            .clone()
            .unwrap_or_else(|| std::path::PathBuf::from("."))
    }

    /// Free bytes on the data directory's file system now (RabbitMQ's `disk_free`), read
    /// with statvfs; `None` when it cannot be read.
    pub fn disk_free(&self) -> Option<u64> {
        disk_space(&self.disk_dir()).ok().map(|(free, _)| free)
    }

    /// The disk alarm's limit in bytes as it applies now (RabbitMQ's `disk_free_limit`):
    /// `storage.disk_free_limit` (a percentage of the file system's size when so given), or
    /// `disk_free_limit_relative` times the machine's memory.
    pub fn disk_free_limit(&self) -> u64 {
        let total = disk_space(&self.disk_dir()).map_or(0, |(_, total)| total);
        self.disk_limit_bytes(total)
    }

    /// The memory alarm's watermark in bytes (RabbitMQ's `mem_limit`): `[memory]
    /// high_watermark` applied to the machine's memory, or the absolute limit configured.
    pub fn memory_limit(&self) -> u64 {
        self.memory_limit
    }

    /// True while the disk alarm is on (free space below `disk_free_limit`).
    pub fn disk_alarm(&self) -> bool {
        self.disk_alarm.load(Ordering::Relaxed)
    }

    /// True while publishing connections must not be read from: the memory or the disk
    /// alarm is on.
    pub fn publishers_paused(&self) -> bool {
        self.memory_alarm() || self.disk_alarm()
    }

    /// Follows the free space of the data directory's file system (RabbitMQ's disk alarm);
    /// returns whether the alarm is on. A broker without a data directory has no disk alarm.
    fn check_disk(&self) -> bool {
        let Some(dir) = &self.config.storage.data_dir else {
            return false;
        };
        let (free, total) = match disk_space(dir) {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "cannot read free disk space");
                return self.disk_alarm();
            }
        };
        let limit = self.disk_limit_bytes(total);
        let low = free < limit;
        if self.disk_alarm.swap(low, Ordering::Relaxed) != low {
            if low {
                warn!(
                    dir = %dir.display(),
                    "free disk space is insufficient: {free} bytes free, limit {limit} bytes; \
                     publishers blocked"
                );
            } else {
                info!(
                    dir = %dir.display(),
                    "free disk space is sufficient again: {free} bytes free, limit {limit} bytes; \
                     publishers unblocked"
                );
            }
        }
        low
    }

    /// Registers a connection for connection.blocked / unblocked notifications; it is told at
    /// once if publishing is currently blocked.
    pub fn listen_blocked(&self, outbox: &Arc<crate::outbox::Outbox>) {
        let mut l = self.blocked_listeners.lock();
        l.retain(|w| w.strong_count() > 0);
        l.push(Arc::downgrade(outbox));
        if self.blocked.load(Ordering::Relaxed) {
            outbox.send(0, &blocked_method(true, self.blocked_reason()));
        }
    }

    /// True while the memory alarm is on (publishing connections wait).
    pub fn memory_alarm(&self) -> bool {
        self.memory_alarm.load(Ordering::Relaxed)
    }

    fn blocked_reason(&self) -> &'static str {
        if self.memory_alarm() && !self.disk_alarm() {
            "low on memory"
        } else {
            BLOCKED_REASON
        }
    }

    /// Follows the memory alarm and the message store's health: when memory use goes over the
    /// watermark or store writes start failing, every listening connection gets
    /// connection.blocked; when both are fine again, connection.unblocked.
    pub(crate) fn check_blocked(&self) {
        let mut rss = resident_memory().unwrap_or(0);
        if rss > self.memory_limit {
            // Freed heap may still count as resident: give it back before deciding.
            release_free_heap();
            rss = resident_memory().unwrap_or(0);
        }
        let memory = rss > self.memory_limit;
        if self.memory_alarm.swap(memory, Ordering::Relaxed) != memory {
            warn!(
                rss_mb = rss >> 20,
                limit_mb = self.memory_limit >> 20,
                "memory alarm {}",
                if memory {
                    "set: publishers paused"
                } else {
                    "cleared"
                }
            );
        }
        let disk = self.check_disk();
        let failed = memory
            || disk
            || self.broker.store().is_some_and(|s| s.is_failed())
            || self.quorum.log_failed();
        if self.blocked.swap(failed, Ordering::Relaxed) == failed {
            return;
        }
        warn!(
            blocked = failed,
            "publishers {}",
            if failed { "blocked" } else { "unblocked" }
        );
        let l = self.blocked_listeners.lock();
        for o in l.iter().filter_map(|w| w.upgrade()) {
            o.send(0, &blocked_method(failed, self.blocked_reason()));
        }
    }

    /// A new process-unique connection id.
    pub fn next_connection_id(&self) -> u64 {
        self.next_connection.fetch_add(1, Ordering::Relaxed)
    }

    /// Connections currently open.
    pub fn connection_count(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }

    /// Counts a connection accepted.
    pub(crate) fn connection_opened(&self) {
        self.connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection gone.
    pub(crate) fn connection_closed(&self) {
        self.connections.fetch_sub(1, Ordering::Relaxed);
    }
}

fn blocked_method(blocked: bool, reason: &str) -> warren_amqp::Method {
    use warren_amqp::generated::{ConnectionBlocked, ConnectionUnblocked};
    if blocked {
        warren_amqp::Method::ConnectionBlocked(ConnectionBlocked {
            reason: reason.into(),
        })
    } else {
        warren_amqp::Method::ConnectionUnblocked(ConnectionUnblocked {})
    }
}
