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
        match builder {
            Ok(builder) => builder.install_recorder().ok(),
            Err(_) => None,
        }
    });
    if handle.is_some() {
        describe();
    }
    handle.is_some()
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

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(REQUESTS, "Requests by route, policy and decision outcome.");
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
