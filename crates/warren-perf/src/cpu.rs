//! CPU and memory accounting for the load generator itself and for the broker
//! under test.
//!
//! * The load generator's own CPU comes from `getrusage(RUSAGE_SELF)` (user +
//!   system time of every thread of this process, microsecond resolution).
//! * The broker's CPU comes from `/proc/<pid>/stat` fields 14 and 15 (`utime`,
//!   `stime`, in clock ticks, usually 10 ms each), summed over the given pids
//!   (RabbitMQ: `beam.smp` and `erl_child_setup`). Its RSS from `VmRSS` in
//!   `/proc/<pid>/status`.
//!
//! A [`CpuMeter`] snapshots both at the start of a measured window and
//! reports the difference at its end as a [`CpuReport`].

use std::time::Instant;

use serde::Serialize;

/// User + system CPU time of this process so far, in microseconds.
pub fn self_cpu_us() -> u64 {
    // SAFETY: getrusage only writes into the zeroed struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    if rc != 0 {
        return 0;
    }
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000 + t.tv_usec as u64;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn clock_ticks_per_sec() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// utime + stime of `pid` in microseconds, from `/proc/<pid>/stat`; `None` if
/// the process is gone or the file cannot be parsed.
pub fn proc_cpu_us(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may contain spaces:
    // fields are counted from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime field 15.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) * 1_000_000 / clock_ticks_per_sec())
}

/// Resident set size of `pid` in KiB (`VmRSS`), `None` if unknown.
pub fn proc_rss_kb(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Sum of [`proc_cpu_us`] over `pids` (missing processes count 0).
pub fn pids_cpu_us(pids: &[u32]) -> u64 {
    pids.iter().filter_map(|p| proc_cpu_us(*p)).sum()
}

/// Sum of [`proc_rss_kb`] over `pids`; `None` if `pids` is empty.
pub fn pids_rss_kb(pids: &[u32]) -> Option<u64> {
    if pids.is_empty() {
        return None;
    }
    Some(pids.iter().filter_map(|p| proc_rss_kb(*p)).sum())
}

/// CPU used over a measured window.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuReport {
    /// Length of the window in seconds.
    pub window_s: f64,
    /// The load generator's own CPU (user + system, all threads), seconds.
    pub client_cpu_s: f64,
    /// `client_cpu_s / window_s` in percent (200 = both cores of a 2-core machine).
    pub client_cpu_pct: f64,
    /// The broker's CPU over the window in seconds; `None` without `--broker-pid`.
    pub broker_cpu_s: Option<f64>,
    /// `broker_cpu_s / window_s` in percent.
    pub broker_cpu_pct: Option<f64>,
    /// Broker RSS at the end of the window, KiB; `None` without `--broker-pid`.
    pub broker_rss_kb: Option<u64>,
}

/// Snapshot of both CPU clocks at the start of a window.
pub struct CpuMeter {
    pids: Vec<u32>,
    t0: Instant,
    self0: u64,
    broker0: u64,
}

impl CpuMeter {
    /// Starts a window now; `pids` are the broker's processes (may be empty).
    pub fn start(pids: &[u32]) -> CpuMeter {
        CpuMeter {
            pids: pids.to_vec(),
            t0: Instant::now(),
            self0: self_cpu_us(),
            broker0: pids_cpu_us(pids),
        }
    }

    /// Ends the window and reports what was used since [`CpuMeter::start`].
    pub fn finish(&self) -> CpuReport {
        let window_s = self.t0.elapsed().as_secs_f64().max(1e-9);
        let client_cpu_s = self_cpu_us().saturating_sub(self.self0) as f64 / 1e6;
        let (broker_cpu_s, broker_cpu_pct, broker_rss_kb) = if self.pids.is_empty() {
            (None, None, None)
        } else {
            let b = pids_cpu_us(&self.pids).saturating_sub(self.broker0) as f64 / 1e6;
            (
                Some(b),
                Some(round2(100.0 * b / window_s)),
                pids_rss_kb(&self.pids),
            )
        };
        CpuReport {
            window_s: round3(window_s),
            client_cpu_s: round3(client_cpu_s),
            client_cpu_pct: round2(100.0 * client_cpu_s / window_s),
            broker_cpu_s: broker_cpu_s.map(round3),
            broker_cpu_pct,
            broker_rss_kb,
        }
    }
}

/// `x` rounded to 2 decimals.
pub fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// `x` rounded to 3 decimals.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Per-unit cost in microseconds: `cpu_s` spread over `units` (0 if none).
pub fn us_per(cpu_s: f64, units: u64) -> f64 {
    if units == 0 {
        0.0
    } else {
        round3(cpu_s * 1e6 / units as f64)
    }
}

/// Raises this process's open-file soft limit to its hard limit (or
/// `want`, whichever is lower) and returns the limit now in force.
pub fn raise_nofile(want: u64) -> u64 {
    // SAFETY: getrlimit/setrlimit only read and write the struct we pass.
    unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        let target = want.min(rl.rlim_max as u64);
        if (rl.rlim_cur as u64) < target {
            rl.rlim_cur = target as libc::rlim_t;
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl);
        }
        rl.rlim_cur as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_readable() {
        let me = std::process::id();
        // Burn a little CPU so the counters are not all zero.
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        assert!(self_cpu_us() > 0);
        assert!(proc_cpu_us(me).is_some());
        assert!(proc_rss_kb(me).unwrap() > 0);
        assert_eq!(pids_rss_kb(&[]), None);
        assert!(proc_cpu_us(u32::MAX).is_none());
    }

    #[test]
    fn per_unit_cost() {
        assert_eq!(us_per(1.0, 1_000_000), 1.0);
        assert_eq!(us_per(1.0, 0), 0.0);
    }
}
