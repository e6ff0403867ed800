//! The Redis store's metric handles, registered once when the store is
//! built. One field per condition, so counting one is a field access, not
//! a lookup by name; each also keeps this store's own tally, which holds
//! whether or not a recorder is installed (tests read it).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use metrics::{Counter, Gauge};

use crate::telemetry::{
    BREAKER_OPEN, BREAKER_OPENED, DEDUPE_HITS, LEASES_RETURNED, LEASE_UNITS_RETURNED,
    REDIS_BATCHED, REDIS_BATCHES, REFUNDS, SCRIPT_LOADS, STORE_ERRORS, STORE_EVENTS, STORE_RETRIES,
};

#[derive(Debug)]
pub struct RedisStats {
    /// The last second a warning was logged (see [`RedisStats::may_warn`]).
    warned_at: AtomicU64,

    /// `FUNCTION LOAD`s that succeeded (at start and after function not
    /// found).
    pub script_loads: Stat,
    /// Retries that found their evaluation id already applied.
    pub dedupe_hits: Stat,
    /// Indeterminate attempts retried with the same evaluation id.
    pub retries: Stat,
    /// Calls that decided several evaluations (`store.coalesce`).
    pub batches: Stat,
    /// The evaluations those calls decided.
    pub batched: Stat,

    // Refunds (`sluice_refunds_total`), on Redis Cluster: what an admitted
    // limit charged, given back because a later limit of the request
    // refused it.
    /// Given back.
    pub refunded: Stat,
    /// Nothing to give back: the evaluation's record says it charged
    /// nothing, or is gone (it never ran, or ran longer ago than
    /// `dedupe_window`).
    pub refund_unneeded: Stat,
    /// Not known to be given back: Redis did not answer in time, or the
    /// breaker was open. The charge may stand.
    pub refund_failed: Stat,

    // Conditions recovered from (`sluice_store_events_total`), rather than
    // failed decisions.
    /// Function-not-found replies (the node did not have the library;
    /// named `noscript` since sluice ran scripts with `EVALSHA`).
    pub noscript: Stat,
    /// Decisions taken while the Redis clock was behind a key's last write
    /// (by less than the bound: no time counted as passing).
    pub clock_steps_absorbed: Stat,
    /// Connections retired because their node could no longer take writes
    /// (READONLY, MASTERDOWN, LOADING: a failover), so the next one finds
    /// the new primary.
    pub reconnects: Stat,
    /// Probes the store sent on its own to learn whether Redis decides
    /// again, while the breaker was open and no request came to probe.
    pub probes: Stat,
    /// Calls that missed their deadline while this sidecar itself was
    /// starved of CPU for longer than it gives back (`store::lag`): not
    /// counted against Redis by the breaker.
    pub starved: Stat,
    /// Denied subjects' keys `TOUCH`ed so that Redis's eviction sees them
    /// in use while the over-limit cache answers for them.
    pub touched: Stat,
    /// Touches dropped: their queue was full, or Redis did not take them.
    pub touches_dropped: Stat,

    // Failures (`sluice_store_errors_total`).
    /// Unavailable(BeforeSend): connecting failed or timed out.
    pub unreachable: Stat,
    /// Unavailable(Refused): Redis refused to run the script (BUSY,
    /// LOADING, READONLY, ...).
    pub refused: Stat,
    /// Unavailable(Refused): Redis is out of memory (`maxmemory` reached,
    /// nothing it may evict) and refused the script, or its library's load.
    pub out_of_memory: Stat,
    /// Unavailable(AdmissionRejected): the budget ran out before sending.
    pub budget_spent: Stat,
    /// Unavailable(AdmissionRejected): the breaker was open.
    pub breaker_rejected: Stat,
    /// Unavailable(ClockUnsafe).
    pub clock_unsafe: Stat,
    /// Indeterminate: sent, then the deadline passed.
    pub timeouts: Stat,
    /// Indeterminate: sent, then the connection failed.
    pub connection_lost: Stat,
    /// Incompatible: a reply of the wrong shape or version.
    pub malformed: Stat,
    /// Incompatible: the script raised an error.
    pub script_errors: Stat,

    // The breaker keeps its own state; these mirror it when `/metrics` is
    // scraped (see [`RedisStats::publish_breaker`]).
    breaker_open: Gauge,
    breaker_opened: Counter,
}

impl RedisStats {
    pub(super) fn new() -> RedisStats {
        let event = |kind: &'static str| Stat::new(metrics::counter!(STORE_EVENTS, "kind" => kind));
        let error = |kind: &'static str| Stat::new(metrics::counter!(STORE_ERRORS, "kind" => kind));
        let refund =
            |result: &'static str| Stat::new(metrics::counter!(REFUNDS, "result" => result));
        // Counted by a lookup as leases end (see `leased`); there at 0
        // from the start.
        for result in super::leased::RETURN_RESULTS {
            metrics::counter!(LEASES_RETURNED, "result" => result).increment(0);
        }
        metrics::counter!(LEASE_UNITS_RETURNED).increment(0);
        RedisStats {
            warned_at: AtomicU64::new(0),
            script_loads: Stat::new(metrics::counter!(SCRIPT_LOADS)),
            dedupe_hits: Stat::new(metrics::counter!(DEDUPE_HITS)),
            retries: Stat::new(metrics::counter!(STORE_RETRIES)),
            batches: Stat::new(metrics::counter!(REDIS_BATCHES)),
            batched: Stat::new(metrics::counter!(REDIS_BATCHED)),
            refunded: refund("refunded"),
            refund_unneeded: refund("unneeded"),
            refund_failed: refund("failed"),
            noscript: event("noscript"),
            clock_steps_absorbed: event("clock_steps_absorbed"),
            reconnects: event("reconnects"),
            probes: event("probes"),
            starved: event("starved"),
            touched: event("touched"),
            touches_dropped: event("touches_dropped"),
            unreachable: error("unreachable"),
            refused: error("refused"),
            out_of_memory: error("oom"),
            budget_spent: error("budget_spent"),
            breaker_rejected: error("breaker_rejected"),
            clock_unsafe: error("clock_unsafe"),
            timeouts: error("timeouts"),
            connection_lost: error("connection_lost"),
            malformed: error("malformed"),
            script_errors: error("script_errors"),
            breaker_open: metrics::gauge!(BREAKER_OPEN),
            breaker_opened: metrics::counter!(BREAKER_OPENED),
        }
    }

    /// At most one warning a second: a failing Redis fails every request,
    /// and the counters already count each one; the log needs an example.
    pub(super) fn may_warn(&self) -> bool {
        let second = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.warned_at.swap(second, Ordering::Relaxed) != second
    }

    /// Whether the breaker is open follows from the time as much as from
    /// events, so it is read when scraped rather than pushed.
    pub(super) fn publish_breaker(&self, open: bool, opened_total: u64) {
        self.breaker_open.set(if open { 1.0 } else { 0.0 });
        self.breaker_opened.absolute(opened_total);
    }
}

/// One condition: its exported counter and this store's tally of it.
#[derive(Debug)]
pub struct Stat {
    tally: AtomicU64,
    counter: Counter,
}

impl Stat {
    fn new(counter: Counter) -> Stat {
        Stat {
            tally: AtomicU64::new(0),
            counter,
        }
    }

    pub(super) fn count(&self) {
        self.count_n(1);
    }

    pub(super) fn count_n(&self, n: u64) {
        self.tally.fetch_add(n, Ordering::Relaxed);
        self.counter.increment(n);
    }

    /// How many times this store counted it.
    pub fn load(&self, order: Ordering) -> u64 {
        self.tally.load(order)
    }
}
