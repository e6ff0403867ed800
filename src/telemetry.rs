//! Logging setup, metric names and the helpers that record them.
//!
//! Labels are bounded: route, policy, outcome, store, kind, result. Never a
//! subject, a pseudonym or anything a client chose.

use tracing_subscriber::{fmt, prelude::*, EnvFilter};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One JSON object per line (the default: log pipelines parse it).
    Json,
    /// Human-readable lines.
    Text,
}

/// Installs the global subscriber. The filter comes from `SLUICE_LOG`, then
/// `RUST_LOG`, else `info`. Logs go to stdout; errors for people (bad
/// configuration) are printed to stderr by `main` directly.
pub fn init_logging(format: LogFormat) {
    let filter = std::env::var("SLUICE_LOG")
        .or_else(|_| std::env::var("RUST_LOG"))
        .ok()
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    match format {
        LogFormat::Json => registry
            .with(
                fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false),
            )
            .init(),
        LogFormat::Text => registry.with(fmt::layer()).init(),
    }
}

/// The Prometheus text exposition of every metric recorded so far; empty
/// when no recorder is installed (the library used without `main`).
pub fn render_metrics() -> String {
    METRICS
        .get()
        .and_then(|h| h.as_ref())
        .map(|h| h.render())
        .unwrap_or_default()
}

static METRICS: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
    std::sync::OnceLock::new();

/// Buckets for every `_seconds` histogram: sub-millisecond resolution for
/// decisions, up to a minute for slow upstreams.
const SECONDS_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Installs the Prometheus recorder once per process and describes every
/// metric. Returns false when another recorder was already installed (then
/// `/metrics` stays empty rather than the process failing).
pub fn init_metrics() -> bool {
    let handle = METRICS.get_or_init(|| {
        let builder = metrics_exporter_prometheus::PrometheusBuilder::new().set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Suffix("_seconds".into()),
            SECONDS_BUCKETS,
        );
        let handle = match builder {
            Ok(builder) => builder.install_recorder().ok(),
            Err(_) => None,
        };
        if let Some(handle) = &handle {
            spawn_upkeep(handle.clone());
        }
        handle
    });
    if handle.is_some() {
        describe();
    }
    handle.is_some()
}

/// How often histogram samples are folded into their buckets.
const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// The recorder keeps every histogram sample until upkeep (or a scrape)
/// folds it into buckets: without this, memory grows with traffic for as
/// long as nobody scrapes `/metrics`.
fn spawn_upkeep(handle: metrics_exporter_prometheus::PrometheusHandle) {
    let upkeep = async move {
        let mut tick = tokio::time::interval(UPKEEP_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            handle.run_upkeep();
        }
    };
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(upkeep);
        }
        // Outside a runtime (the library used on its own): metrics are
        // still recorded, and folded on every scrape.
        Err(_) => tracing::debug!("no runtime: histogram upkeep runs on scrape only"),
    }
}

pub const REQUESTS: &str = "sluice_requests_total";
pub const DECISION_DURATION: &str = "sluice_decision_duration_seconds";
pub const STORE_ERRORS: &str = "sluice_store_errors_total";
pub const BREAKER_OPEN: &str = "sluice_store_breaker_open";
pub const SCRIPT_LOADS: &str = "sluice_store_script_loads_total";
pub const DEDUPE_HITS: &str = "sluice_store_dedupe_hits_total";
pub const FORWARDED_WITHOUT_DECISION: &str = "sluice_forwarded_without_decision_total";
pub const UPSTREAM_RESPONSES: &str = "sluice_upstream_responses_total";
pub const UPSTREAM_DURATION: &str = "sluice_upstream_duration_seconds";
pub const CONFIG_RELOADS: &str = "sluice_config_reloads_total";
pub const CONFIG_REVISION: &str = "sluice_config_revision";
pub const CONFIG_INFO: &str = "sluice_config_info";
pub const BUILD_INFO: &str = "sluice_build_info";
pub const MEMORY_SUBJECTS: &str = "sluice_memory_store_subjects";
pub const CONNECTIONS_REFUSED: &str = "sluice_connections_refused_total";

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(REQUESTS, "Requests by route, policy and decision outcome.");
    describe_counter!(
        REQUESTS_REFUSED,
        "Malformed requests refused before routing (400/501), by reason."
    );
    describe_counter!(
        STORE_RETRIES,
        "Indeterminate store calls retried with the same evaluation id."
    );
    describe_counter!(STORE_EVENTS, "Store conditions recovered from, by kind.");
    describe_counter!(BREAKER_OPENED, "Times the store breaker opened.");
    describe_histogram!(
        DECISION_DURATION,
        Unit::Seconds,
        "Time to reach a decision, by store."
    );
    describe_counter!(STORE_ERRORS, "Store failures by kind.");
    describe_gauge!(BREAKER_OPEN, "1 while the store breaker is open.");
    describe_counter!(
        SCRIPT_LOADS,
        "Lua scripts loaded into Redis (start and NOSCRIPT)."
    );
    describe_counter!(
        DEDUPE_HITS,
        "Retried evaluations answered from the recorded decision."
    );
    describe_counter!(
        FORWARDED_WITHOUT_DECISION,
        "Requests forwarded without a decision (on_failure: allow)."
    );
    describe_counter!(
        UPSTREAM_RESPONSES,
        "Upstream responses by route and status class."
    );
    describe_histogram!(
        UPSTREAM_DURATION,
        Unit::Seconds,
        "Time to the upstream's response head, by route."
    );
    describe_counter!(CONFIG_RELOADS, "Configuration reloads by result.");
    describe_gauge!(
        CONFIG_REVISION,
        "Number of configurations loaded since start (1 = the initial one)."
    );
    describe_gauge!(
        CONFIG_INFO,
        "1 for the configuration serving now, by content hash."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label says which sluice runs."
    );
    describe_gauge!(MEMORY_SUBJECTS, "Subjects tracked by the embedded store.");
    describe_counter!(
        CONNECTIONS_REFUSED,
        "Traffic connections closed at once because server.max_connections were open."
    );
    describe_counter!(
        DENY_CACHE_HITS,
        "Requests denied by the local over-limit cache without asking the store."
    );
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
}

pub fn config_reload(result: &'static str) {
    metrics::counter!(CONFIG_RELOADS, "result" => result).increment(1);
}

static CONFIG_HASH: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// Records that `config` now serves: bumps the revision and moves the info
/// gauge to its hash.
pub fn config_loaded(config: &crate::config::Config) {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{config:?}").as_bytes());
    let hash: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let mut current = CONFIG_HASH.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(old) = current.replace(hash.clone()) {
        metrics::gauge!(CONFIG_INFO, "hash" => old).set(0.0);
    }
    metrics::gauge!(CONFIG_INFO, "hash" => hash).set(1.0);
    metrics::gauge!(CONFIG_REVISION).increment(1.0);
}

/// Every `outcome` label value, in [`RouteMetrics`] index order.
pub const OUTCOMES: [&str; 7] = [
    "unlimited",
    "allowed",
    "denied",
    "shadow_denied",
    "unavailable",
    "indeterminate",
    "incompatible",
];

const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// Metric handles of one route, registered once when a configuration is
/// loaded so the request path does no registry lookups or label
/// allocations. Every series exists (at 0) from the start, which also makes
/// `rate()` well defined before the first event.
pub struct RouteMetrics {
    requests: [metrics::Counter; OUTCOMES.len()],
    upstream_responses: [metrics::Counter; STATUS_CLASSES.len()],
    upstream_duration: metrics::Histogram,
    log_budget: LogBudget,
}

impl RouteMetrics {
    pub fn new(route: &str, policy: Option<&str>) -> RouteMetrics {
        let route = route.to_owned();
        let policy = policy.unwrap_or("none").to_owned();
        RouteMetrics {
            requests: OUTCOMES.map(|outcome| {
                metrics::counter!(REQUESTS, "route" => route.clone(), "policy" => policy.clone(), "outcome" => outcome)
            }),
            upstream_responses: STATUS_CLASSES.map(|class| {
                metrics::counter!(UPSTREAM_RESPONSES, "route" => route.clone(), "status_class" => class)
            }),
            upstream_duration: metrics::histogram!(UPSTREAM_DURATION, "route" => route.clone()),
            log_budget: LogBudget::default(),
        }
    }

    /// Counts one request under `outcome` (one of [`OUTCOMES`]).
    pub fn request(&self, outcome: &str) {
        if let Some(i) = OUTCOMES.iter().position(|o| *o == outcome) {
            self.requests[i].increment(1);
        }
    }

    /// Counts the response to a forwarded request (the upstream's, or
    /// sluice's 502/504 when the upstream failed).
    pub fn upstream(&self, status: http::StatusCode, elapsed: std::time::Duration) {
        let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
        self.upstream_responses[class].increment(1);
        self.upstream_duration.record(elapsed.as_secs_f64());
    }

    /// Whether a decision other than Allowed may be logged at `now`: at
    /// most [`LogBudget::PER_SECOND`] a second per route, so a flood of
    /// denials cannot flood the logs. The caller's clock reading is reused:
    /// under a flood this is asked for every request.
    pub fn may_log(&self, now: std::time::Instant) -> bool {
        self.log_budget.take(now)
    }
}

impl std::fmt::Debug for RouteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteMetrics").finish_non_exhaustive()
    }
}

/// A per-second allowance packed in one atomic: high 32 bits the second,
/// low 32 bits how many were taken in it.
#[derive(Default)]
struct LogBudget(std::sync::atomic::AtomicU64);

impl LogBudget {
    const PER_SECOND: u64 = 5;

    fn take(&self, now: std::time::Instant) -> bool {
        use std::sync::atomic::Ordering;
        // Seconds since the first call in this process: any fixed origin
        // will do, the budget only needs to know when a second turns.
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        let origin = *ORIGIN.get_or_init(|| now);
        let second = now.saturating_duration_since(origin).as_secs() & 0xffff_ffff;
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            let (at, taken) = (current >> 32, current & 0xffff_ffff);
            let next = if at == second {
                if taken >= Self::PER_SECOND {
                    return false;
                }
                current + 1
            } else {
                (second << 32) | 1
            };
            match self
                .0
                .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }
}

/// The decision-latency histogram of a store (`store` label).
pub fn decision_duration(store: &'static str) -> metrics::Histogram {
    metrics::histogram!(DECISION_DURATION, "store" => store)
}

pub fn forwarded_without_decision() -> metrics::Counter {
    metrics::counter!(FORWARDED_WITHOUT_DECISION)
}

pub fn memory_subjects(n: usize) {
    metrics::gauge!(MEMORY_SUBJECTS).set(n as f64);
}

pub const REQUESTS_REFUSED: &str = "sluice_requests_refused_total";

/// Counts a request refused before routing (400/501), by a bounded reason.
/// Rare by nature, so the registry lookup is acceptable here.
pub fn request_refused(reason: &'static str) {
    metrics::counter!(REQUESTS_REFUSED, "reason" => reason).increment(1);
}

pub const DENY_CACHE_HITS: &str = "sluice_local_deny_cache_hits_total";

/// Requests denied from the local over-limit cache, without a store call.
pub fn deny_cache_hits() -> metrics::Counter {
    metrics::counter!(DENY_CACHE_HITS)
}

pub const STORE_RETRIES: &str = "sluice_store_retries_total";
pub const STORE_EVENTS: &str = "sluice_store_events_total";
pub const BREAKER_OPENED: &str = "sluice_store_breaker_opened_total";

/// Copies the store's own counters into the exported metrics. Called when
/// `/metrics` is scraped, so the request path only touches atomics.
pub fn sync_store(store: &crate::store::Store) {
    let crate::store::Store::Redis(redis, _) = store else {
        return;
    };
    for (kind, value) in redis.stats().counters() {
        match kind {
            "script_loads" => metrics::counter!(SCRIPT_LOADS).absolute(value),
            "dedupe_hits" => metrics::counter!(DEDUPE_HITS).absolute(value),
            "retries" => metrics::counter!(STORE_RETRIES).absolute(value),
            // Recovered conditions rather than failed decisions.
            "noscript" | "clock_steps_absorbed" | "reconnects" | "probes" => {
                metrics::counter!(STORE_EVENTS, "kind" => kind).absolute(value)
            }
            _ => metrics::counter!(STORE_ERRORS, "kind" => kind).absolute(value),
        }
    }
    metrics::gauge!(BREAKER_OPEN).set(if redis.breaker_open() { 1.0 } else { 0.0 });
    metrics::counter!(BREAKER_OPENED).absolute(redis.breaker_opened_total());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_budget_allows_a_few_per_second() {
        let budget = LogBudget::default();
        let start = std::time::Instant::now();
        let taken = (0..100).filter(|_| budget.take(start)).count() as u64;
        assert_eq!(taken, LogBudget::PER_SECOND);
        // The next second brings a fresh allowance.
        let next = start + std::time::Duration::from_secs(1);
        let taken = (0..100).filter(|_| budget.take(next)).count() as u64;
        assert_eq!(taken, LogBudget::PER_SECOND);
    }
}
