//! The node's resource use as RabbitMQ's `/api/nodes` reports it (rabbit_mgmt_wm_nodes and
//! the node's `rabbit_vm` / `rabbit_disk_monitor` figures), read from the operating system
//! (Linux `/proc`) and from the embedding server's alarm settings ([`Node`]).
//!
//! What each figure is for a Warren node, where RabbitMQ's Erlang notion has no exact
//! equivalent:
//!
//! - `mem_used`: the process's resident memory, bytes (`VmRSS` of `/proc/self/status`;
//!   RabbitMQ's `rss` calculation strategy); `mem_limit` the memory alarm's watermark, bytes.
//! - `disk_free`: free bytes on the data directory's file system (statvfs);
//!   `disk_free_limit` the disk alarm's limit, bytes.
//! - `fd_used`: open file descriptors (`/proc/self/fd`); `fd_total` their limit (the soft
//!   `RLIMIT_NOFILE`, "Max open files" of `/proc/self/limits`).
//! - `sockets_used`: those descriptors that are sockets (client connections, listeners, the
//!   cluster's links); `sockets_total` the descriptor limit again, since any descriptor may
//!   be a socket (Warren has no separate socket budget; RabbitMQ 4.0.1 and later report 0).
//! - `proc_used`: the process's threads (`Threads` of `/proc/self/status`); `proc_total` the
//!   most threads it may have: the soft `RLIMIT_NPROC` ("Max processes"), or the kernel's
//!   `threads-max` when that is unlimited. (Erlang processes, which RabbitMQ counts, have
//!   no equivalent: Warren's tasks are not bounded by a limit.)
//! - `run_queue`: the process's other threads that are runnable now (state `R` in
//!   `/proc/self/task/*/stat`), as Erlang's run queue counts processes waiting to run.
//! - `processors`: the CPUs the process may use.

use crate::backend::Node;

/// The node's resource figures at one moment (see the module's documentation for what
/// each is and its source).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeResources {
    /// Resident memory, bytes.
    pub mem_used: u64,
    /// The memory alarm's watermark, bytes.
    pub mem_limit: Option<u64>,
    /// Free bytes on the data directory's file system.
    pub disk_free: Option<u64>,
    /// The disk alarm's limit, bytes.
    pub disk_free_limit: Option<u64>,
    /// Open file descriptors.
    pub fd_used: u64,
    /// The file descriptor limit.
    pub fd_total: u64,
    /// Open sockets.
    pub sockets_used: u64,
    /// The most sockets: the file descriptor limit.
    pub sockets_total: u64,
    /// Threads of the process.
    pub proc_used: u64,
    /// The most threads it may have.
    pub proc_total: u64,
    /// Other threads runnable now.
    pub run_queue: u64,
    /// CPUs the process may use.
    pub processors: u64,
}

impl NodeResources {
    /// Reads the figures now: `/proc` for the process's, `node` for the alarms' limits and
    /// the free disk space. Figures that cannot be read are 0 (or `None`).
    pub fn read(node: &dyn Node) -> NodeResources {
        let (fd_used, sockets_used) = descriptors();
        let fd_total = limit("Max open files").unwrap_or(0);
        let proc_total = limit("Max processes")
            .or_else(|| read_u64("/proc/sys/kernel/threads-max"))
            .unwrap_or(0);
        NodeResources {
            mem_used: status_field("VmRSS:").map_or(0, |kib| kib * 1024),
            mem_limit: node.memory_limit(),
            disk_free: node.disk_free(),
            disk_free_limit: node.disk_free_limit(),
            fd_used,
            fd_total,
            sockets_used,
            sockets_total: fd_total,
            proc_used: status_field("Threads:").unwrap_or(0),
            proc_total,
            run_queue: run_queue(),
            processors: std::thread::available_parallelism().map_or(1, |p| p.get() as u64),
        }
    }

    /// The gauges the rate sampler keeps, in [`crate::rates::RESOURCE_FIELDS`]' order.
    pub fn gauges(&self) -> [u64; 5] {
        [
            self.mem_used,
            self.fd_used,
            self.sockets_used,
            self.disk_free.unwrap_or(0),
            self.proc_used,
        ]
    }
}

fn read_u64(path: &str) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// A numeric field of `/proc/self/status` (`VmRSS:` is in KiB).
fn status_field(name: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The soft limit of a `/proc/self/limits` row (`Max open files`); `None` when unlimited
/// or unknown.
fn limit(row: &str) -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let rest = limits.lines().find_map(|l| l.strip_prefix(row))?;
    rest.split_whitespace().next()?.parse().ok()
}

/// (open descriptors, of which sockets). The directory listing's own descriptor is not
/// counted.
fn descriptors() -> (u64, u64) {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return (0, 0);
    };
    let (mut fds, mut sockets) = (0u64, 0u64);
    for entry in dir.flatten() {
        // The listing's own descriptor is closed by the time it is looked at: not counted.
        if let Ok(target) = std::fs::read_link(entry.path()) {
            fds += 1;
            if target
                .as_os_str()
                .as_encoded_bytes()
                .starts_with(b"socket:")
            {
                sockets += 1;
            }
        }
    }
    (fds, sockets)
}

/// Threads of this process in state `R` (runnable), the calling one left out.
fn run_queue() -> u64 {
    let me = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_os_string()));
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    dir.flatten()
        .filter(|t| Some(t.file_name()) != me)
        .filter(|t| {
            std::fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
                // The state follows the command name, which is in parentheses and may hold
                // spaces or parentheses itself.
                stat.rfind(')')
                    .and_then(|i| stat[i + 1..].split_whitespace().next())
                    == Some("R")
            })
        })
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_figures_are_read() {
        let (fds, sockets) = descriptors();
        assert!(fds >= 3, "stdin, stdout, stderr at least: {fds}");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        // Other tests of this binary open and close descriptors meanwhile.
        let (fds2, sockets2) = descriptors();
        assert!(
            fds2 >= 1 && sockets2 >= 1,
            "{fds}/{sockets} then {fds2}/{sockets2}"
        );
        drop(listener);
        assert!(status_field("VmRSS:").unwrap() > 0);
        assert!(status_field("Threads:").unwrap() >= 1);
        assert!(limit("Max open files").unwrap() > 0);
        assert!(
            limit("Max processes")
                .or_else(|| read_u64("/proc/sys/kernel/threads-max"))
                .unwrap()
                > 0
        );
    }
}
