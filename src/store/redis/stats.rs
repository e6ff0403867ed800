//! Counters for metrics. Plain atomics: the metrics exporter reads them;
//! the hot path only adds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Debug, Default)]
pub struct RedisStats {
    /// The last second a warning was logged (see [`RedisStats::may_warn`]).
    warned_at: AtomicU64,

    /// `SCRIPT LOAD`s that succeeded (at start and after `NOSCRIPT`).
    pub script_loads: AtomicU64,
    /// `NOSCRIPT` replies (Redis lost its script cache).
    pub noscript: AtomicU64,
    /// Retries that found their evaluation id already applied.
    pub dedupe_hits: AtomicU64,
    /// Indeterminate attempts retried with the same evaluation id.
    pub retries: AtomicU64,
    /// Decisions taken while the Redis clock was behind a key's last write
    /// (by less than the bound: no time counted as passing).
    pub clock_steps_absorbed: AtomicU64,
    /// Connections retired because their node could no longer take writes
    /// (READONLY, MASTERDOWN, LOADING: a failover), so the next one finds
    /// the new primary.
    pub reconnects: AtomicU64,
    /// Probes the store sent on its own to learn whether Redis decides
    /// again, while the breaker was open and no request came to probe.
    pub probes: AtomicU64,

    /// Errors by kind. Unavailable(BeforeSend): connecting failed or timed out.
    pub unreachable: AtomicU64,
    /// Unavailable(BeforeSend): Redis refused to run the script (OOM, BUSY,
    /// LOADING, READONLY, ...).
    pub refused: AtomicU64,
    /// Unavailable(AdmissionRejected): the budget ran out before sending.
    pub budget_spent: AtomicU64,
    /// Unavailable(AdmissionRejected): the breaker was open.
    pub breaker_rejected: AtomicU64,
    /// Unavailable(ClockUnsafe).
    pub clock_unsafe: AtomicU64,
    /// Indeterminate: sent, then the deadline passed.
    pub timeouts: AtomicU64,
    /// Indeterminate: sent, then the connection failed.
    pub connection_lost: AtomicU64,
    /// Incompatible: a reply of the wrong shape or version.
    pub malformed: AtomicU64,
    /// Incompatible: the script raised an error.
    pub script_errors: AtomicU64,
}

impl RedisStats {
    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// At most one warning a second: a failing Redis fails every request,
    /// and the counters already count each one; the log needs an example.
    pub(super) fn may_warn(&self) -> bool {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.warned_at.swap(second, Ordering::Relaxed) != second
    }

    /// Every counter with a short, bounded name (for a `kind` label).
    pub fn counters(&self) -> [(&'static str, u64); 16] {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        [
            ("script_loads", read(&self.script_loads)),
            ("noscript", read(&self.noscript)),
            ("dedupe_hits", read(&self.dedupe_hits)),
            ("retries", read(&self.retries)),
            ("clock_steps_absorbed", read(&self.clock_steps_absorbed)),
            ("reconnects", read(&self.reconnects)),
            ("probes", read(&self.probes)),
            ("unreachable", read(&self.unreachable)),
            ("refused", read(&self.refused)),
            ("budget_spent", read(&self.budget_spent)),
            ("breaker_rejected", read(&self.breaker_rejected)),
            ("clock_unsafe", read(&self.clock_unsafe)),
            ("timeouts", read(&self.timeouts)),
            ("connection_lost", read(&self.connection_lost)),
            ("malformed", read(&self.malformed)),
            ("script_errors", read(&self.script_errors)),
        ]
    }
}
