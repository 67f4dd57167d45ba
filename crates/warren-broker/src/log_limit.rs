//! Rate limits for warnings that one event per message would repeat without end.
//!
//! A failing disk or a full store refuses every publish, page-out and dead letter: one line
//! each is a flood (a hundred thousand lines in seconds) that hides everything else and fills
//! the disk the log is on. Such a call site owns a [`LogLimit`]: it logs the first event at
//! once, then at most one line per interval, which carries how many events it left out since
//! the line before (the `suppressed` field).

use parking_lot::Mutex;
use std::time::{Duration, Instant};

/// Interval between two lines of one call site, in seconds (see [`LogLimit`]).
pub const LOG_INTERVAL_SECS: u64 = 10;

/// One call site's rate limit: the first event passes, then one per interval.
///
/// ```
/// use warren_broker::log_limit::LogLimit;
/// static REFUSED: LogLimit = LogLimit::new();
/// if let Some(suppressed) = REFUSED.admit() {
///     tracing::warn!(suppressed, "publish refused");
/// }
/// ```
pub struct LogLimit {
    interval: Duration,
    state: Mutex<State>,
}

struct State {
    /// When the last line was logged.
    last: Option<Instant>,
    /// Events since then that were not logged.
    suppressed: u64,
}

impl LogLimit {
    /// A limit of one line per [`LOG_INTERVAL_SECS`].
    pub const fn new() -> Self {
        Self::every(Duration::from_secs(LOG_INTERVAL_SECS))
    }

    /// A limit of one line per `interval`.
    pub const fn every(interval: Duration) -> Self {
        LogLimit {
            interval,
            state: Mutex::new(State {
                last: None,
                suppressed: 0,
            }),
        }
    }

    /// Counts one event. `Some(n)` when it should be logged now, `n` being the events left
    /// out since the last line; `None` when it is to be left out.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// [`LogLimit::admit`] at time `now`.
    pub fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut st = self.state.lock();
        match st.last {
            Some(last) if now.saturating_duration_since(last) < self.interval => {
                st.suppressed += 1;
                None
            }
            _ => {
                st.last = Some(now);
                Some(std::mem::take(&mut st.suppressed))
            }
        }
    }
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_event_then_one_summary_per_interval() {
        let limit = LogLimit::every(Duration::from_secs(10));
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        assert_eq!(limit.admit_at(at(0)), Some(0));
        let logged: Vec<_> = (1..=109_887u64)
            .filter_map(|i| limit.admit_at(at(i * 12_000 / 109_887)))
            .collect();
        // 12 s of events: one more line at 10 s, carrying what it left out.
        assert_eq!(logged.len(), 1, "{logged:?}");
        assert!(logged[0] > 90_000, "{logged:?}");
        assert_eq!(limit.admit_at(at(25_000)), Some(109_886 - logged[0]));
        assert_eq!(limit.admit_at(at(25_001)), None);
        assert_eq!(limit.admit_at(at(35_001)), Some(1));
    }
}
