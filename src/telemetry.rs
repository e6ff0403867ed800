//! Logging setup and the metrics recorder.
//!
//! Metric names and descriptions are one table ([`names`]); the handles
//! live with what they measure, registered once from those names.

mod names;

pub use names::*;

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

/// Buckets for every histogram: sub-millisecond resolution for decisions,
/// up to a minute for slow upstreams.
const SECONDS_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Installs the Prometheus recorder once per process and describes every
/// metric. Returns false when another recorder was already installed (then
/// `/metrics` stays empty rather than the process failing).
pub fn init_metrics() -> bool {
    let handle = METRICS.get_or_init(|| {
        let mut builder = Ok(metrics_exporter_prometheus::PrometheusBuilder::new());
        for metric in ALL.iter().filter(|m| m.kind == Kind::Histogram) {
            let name = metrics_exporter_prometheus::Matcher::Full(metric.name.into());
            builder = builder.and_then(|b| b.set_buckets_for_metric(name, SECONDS_BUCKETS));
        }
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
        for metric in ALL {
            metric.describe();
        }
        metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
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
