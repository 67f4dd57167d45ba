//! The embeddable broker: start it on an address inside any Rust program, get the bound address
//! back, and shut it down gracefully.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! let broker = warren_server::Broker::builder().bind("127.0.0.1:0").start().await?;
//! println!("AMQP on {}", broker.amqp_addr());
//! broker.shutdown().await;
//! # Ok(()) }
//! ```

use crate::config::{Config, DiskFreeLimit};
use crate::listen::{ListenAddr, ListenError};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{info, warn};
use warren_broker::{User, Users};

/// State shared by every connection of a running broker.
pub struct ServerState {
    /// The broker model: vhosts, queues, users.
    pub broker: warren_broker::Broker,
    /// Configuration in force.
    pub config: Config,
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

/// Returns the system allocator's free heap pages to the OS (glibc keeps them otherwise, and
/// they count as resident). The `warren` binary allocates with mimalloc, which returns memory
/// by itself; this matters to programs that embed the broker on the system allocator.
fn release_free_heap() {
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
    /// A fresh state for `config`: users from the config, or guest/guest (loopback only);
    /// with a data directory, durable definitions and messages are recovered from it.
    ///
    /// Errors: the message store could not be opened.
    pub fn new(config: Config) -> std::io::Result<Self> {
        let users = if config.users.is_empty() {
            Users::with_default_guest()
        } else {
            let mut u = Users::new();
            for c in &config.users {
                u.add(User {
                    name: c.name.clone(),
                    password: c.password.clone(),
                    tags: c.tags.clone(),
                    loopback_only: c.loopback_only,
                });
            }
            u
        };
        let broker = match config.storage.options() {
            None => warren_broker::Broker::new(users),
            Some(opts) => {
                let (broker, report) = warren_broker::Broker::open(users, opts)
                    .map_err(|e| std::io::Error::other(e.to_string()))?;
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
        broker.set_limits(config.limits.limits());
        let memory_limit = config.memory.limit(total_memory().unwrap_or(u64::MAX));
        let disk_limit = DiskLimit {
            limit: config.storage.disk_free_limit,
            memory_relative: config.storage.disk_free_limit_relative,
        };
        Ok(ServerState {
            broker,
            config,
            next_connection: AtomicU64::new(1),
            connections: AtomicUsize::new(0),
            blocked_listeners: parking_lot::Mutex::new(Vec::new()),
            blocked: std::sync::atomic::AtomicBool::new(false),
            memory_alarm: std::sync::atomic::AtomicBool::new(false),
            memory_limit,
            disk_alarm: AtomicBool::new(false),
            disk_limit: parking_lot::Mutex::new(disk_limit),
        })
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
        let l = *self.disk_limit.lock();
        let limit = if l.memory_relative > 0.0 {
            (total_memory().unwrap_or(0) as f64 * l.memory_relative) as u64
        } else {
            l.limit.bytes(total)
        };
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
    fn check_blocked(&self) {
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
        let failed = memory || disk || self.broker.store().is_some_and(|s| s.is_failed());
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

/// Entry point of the embedding API.
pub struct Broker;

impl Broker {
    /// A builder with the default configuration ([`Config::default`]).
    pub fn builder() -> BrokerBuilder {
        BrokerBuilder {
            config: Config::default(),
            management: false,
        }
    }
}

/// Configures and starts a broker.
pub struct BrokerBuilder {
    config: Config,
    management: bool,
}

impl BrokerBuilder {
    /// Replaces the whole configuration.
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// Keeps durable state in `dir` (by default the broker runs in memory).
    pub fn data_dir(mut self, dir: impl Into<std::path::PathBuf>) -> Self {
        self.config.storage.data_dir = Some(dir.into());
        self
    }

    /// Sets the AMQP listen address ([`ListenAddr`]: `"127.0.0.1:0"` picks a free port,
    /// `"5672"` listens on every interface, `"localhost:5672"` on the host's addresses).
    ///
    /// # Panics
    /// When `addr` is not a listen address.
    pub fn bind(mut self, addr: &str) -> Self {
        self.config.amqp.listen = addr
            .parse()
            .unwrap_or_else(|e: String| panic!("bind(): {e}"));
        self
    }

    /// Serves the management HTTP API on `config.management.listen` too (off by default for
    /// an embedded broker; the `warren` binary turns it on unless `[management] enabled` is
    /// false).
    pub fn management(mut self, on: bool) -> Self {
        self.management = on;
        self
    }

    /// Recovers durable state, binds the listeners and starts accepting connections on the
    /// current tokio runtime.
    ///
    /// Errors: the data directory or the store could not be opened (message naming the
    /// directory), or a listener could not be bound ([`ListenError`] naming the address).
    pub async fn start(self) -> std::io::Result<RunningBroker> {
        // Recover first, listen after: clients never wait on a broker that is still recovering.
        let listen: ListenAddr = self.config.amqp.listen.clone();
        let config = self.config;
        let state = Arc::new(tokio::task::spawn_blocking(move || ServerState::new(config)).await??);
        let listeners = match listen.bind("amqp.listen").await {
            Ok(l) => l,
            Err(e) => {
                // Release the data directory for whoever starts next.
                state.broker.close();
                return Err(std::io::Error::other(e));
            }
        };
        let addrs: Vec<SocketAddr> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let (tx, rx) = watch::channel(false);
        let (management_addrs, management_tasks) = if self.management {
            let listen = state.config.management.listen.clone();
            match crate::management::start(&listen, state.clone(), &addrs, rx.clone()).await {
                Ok(m) => m,
                Err(e) => {
                    state.broker.close();
                    return Err(e);
                }
            }
        } else {
            (Vec::new(), Vec::new())
        };
        for a in &addrs {
            info!(addr = %a, "started TCP listener for AMQP 0-9-1");
        }
        let task = tokio::spawn(accept_loop(listeners, state.clone(), rx));
        Ok(RunningBroker {
            amqp_addrs: addrs,
            management_addrs,
            management_tasks,
            state,
            shutdown: tx,
            task,
        })
    }
}

/// The error of a listener that could not be bound, as a [`ListenError`] inside the
/// `io::Error` that [`BrokerBuilder::start`] returns.
pub fn listen_error(e: &std::io::Error) -> Option<&ListenError> {
    e.get_ref()?.downcast_ref()
}

/// A running broker.
pub struct RunningBroker {
    amqp_addrs: Vec<SocketAddr>,
    management_addrs: Vec<SocketAddr>,
    management_tasks: Vec<tokio::task::JoinHandle<()>>,
    state: Arc<ServerState>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl RunningBroker {
    /// The address of the (first) AMQP listener: the IPv4 one when a bare port binds both
    /// families.
    pub fn amqp_addr(&self) -> SocketAddr {
        self.amqp_addrs[0]
    }

    /// The addresses of every AMQP listener.
    pub fn amqp_addrs(&self) -> &[SocketAddr] {
        &self.amqp_addrs
    }

    /// The addresses of the management HTTP API's listeners (none unless
    /// [`BrokerBuilder::management`] turned it on).
    pub fn management_addrs(&self) -> &[SocketAddr] {
        &self.management_addrs
    }

    /// The shared state (broker model and configuration).
    pub fn state(&self) -> &Arc<ServerState> {
        &self.state
    }

    /// Stops accepting, closes every connection with 320 CONNECTION_FORCED and waits (up to a
    /// few seconds) for them to finish.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(15), self.task).await;
        for t in self.management_tasks {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

/// How often expired messages and unused queues are looked for, in ms: a message outlives its
/// TTL by at most this much when nothing else touches its queue.
const SWEEP_MS: u64 = 50;

/// Accepts on one listener and hands each connection to the accept loop.
async fn accept_from(
    listener: TcpListener,
    accepted: tokio::sync::mpsc::Sender<(tokio::net::TcpStream, SocketAddr, SocketAddr)>,
) {
    let local = match listener.local_addr() {
        Ok(a) => a,
        Err(_) => return,
    };
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if accepted.send((stream, peer, local)).await.is_err() {
                    return;
                }
            }
            Err(e) => {
                warn!(%local, error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// The broker's lifecycle: accepts on every listener, runs the periodic checks, and on
/// shutdown stops accepting on all listeners, closes every connection with 320
/// CONNECTION_FORCED and closes the store (final fsync).
async fn accept_loop(
    listeners: Vec<TcpListener>,
    state: Arc<ServerState>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut acceptors = JoinSet::new();
    let (accepted_tx, mut accepted) = tokio::sync::mpsc::channel(64);
    for l in listeners {
        acceptors.spawn(accept_from(l, accepted_tx.clone()));
    }
    drop(accepted_tx);
    let mut tasks = JoinSet::new();
    let mut health = tokio::time::interval(Duration::from_millis(250));
    // Message TTLs and queue expiry (x-message-ttl, expiration, x-expires).
    let mut sweep = tokio::time::interval(Duration::from_millis(SWEEP_MS));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = health.tick() => state.check_blocked(),
            _ = sweep.tick() => state.broker.sweep(),
            Some((stream, peer, local)) = accepted.recv() => {
                if state.connection_count() >= state.config.amqp.max_connections {
                    warn!(%peer, "connection refused: max_connections reached");
                    drop(stream);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let st = state.clone();
                let rx = shutdown.clone();
                st.connections.fetch_add(1, Ordering::Relaxed);
                info!("accepting AMQP connection ({peer} -> {local})");
                tasks.spawn(async move {
                    crate::connection::serve(st.clone(), stream, peer, local, rx).await;
                    st.connections.fetch_sub(1, Ordering::Relaxed);
                });
            }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            _ = shutdown.changed() => break,
        }
    }
    // Stop accepting on every listener (dropping them closes the sockets).
    acceptors.shutdown().await;
    drop(accepted);
    if !tasks.is_empty() {
        info!(
            connections = tasks.len(),
            "closing client connections (each waits briefly for its connection.close-ok)"
        );
    }
    let _ = tokio::time::timeout(Duration::from_secs(12), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    tasks.abort_all();
    state.broker.close();
    info!("broker stopped");
}
