//! Logging setup (metric names and recording helpers join it with the
//! operations work).

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
    METRICS.get().map(|h| h.render()).unwrap_or_default()
}

static METRICS: std::sync::OnceLock<metrics_exporter_prometheus::PrometheusHandle> =
    std::sync::OnceLock::new();

/// Installs the Prometheus recorder once per process.
pub fn init_metrics() {
    METRICS.get_or_init(|| {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .install_recorder()
            .expect("the only recorder installed in this process")
    });
}
