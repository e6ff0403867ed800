//! Logging setup and the metrics recorder.
//!
//! Metric names and descriptions are one table ([`names`]); the handles
//! live with what they measure, registered once from those names. Counters
//! and gauges go through the Prometheus recorder; histograms are sluice's
//! own ([`histogram`]), rendered beside them.

mod histogram;
mod names;

pub use histogram::{histogram, SECONDS_BUCKETS};
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
    let Some(handle) = METRICS.get().and_then(|h| h.as_ref()) else {
        return String::new();
    };
    let mut out = handle.render();
    histogram::render_into(&mut out);
    out
}

static METRICS: std::sync::OnceLock<Option<metrics_exporter_prometheus::PrometheusHandle>> =
    std::sync::OnceLock::new();

/// Installs the Prometheus recorder once per process and describes every
/// metric. Returns false when another recorder was already installed (then
/// `/metrics` stays empty rather than the process failing).
pub fn init_metrics() -> bool {
    let handle = METRICS.get_or_init(|| {
        let builder = metrics_exporter_prometheus::PrometheusBuilder::new();
        // No upkeep task: it only folds the recorder's histogram samples,
        // and the recorder has none (`histogram`).
        builder.install_recorder().ok()
    });
    if handle.is_some() {
        for metric in ALL {
            metric.describe();
        }
        metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    }
    handle.is_some()
}
