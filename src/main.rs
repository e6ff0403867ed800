//! `sluice run` serves; `sluice check` validates and prints the route table,
//! or with `--explain` the routing of one described request.
//! Exit codes: 0 ok, 2 invalid configuration (or request description),
//! 1 runtime failure.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use sluice::app::Signal;
use sluice::config::Config;
use sluice::proxy::explain::{explain, Described, Source};
use sluice::proxy::Runtime;
use sluice::subject::PseudonymKey;
use sluice::telemetry::{self, LogFormat};

#[derive(Parser)]
#[command(
    name = "sluice",
    version,
    about = "A rate-limiting reverse proxy sidecar"
)]
struct Cli {
    /// Log line format.
    #[arg(long, value_enum, default_value_t = LogFormat::Json, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration and serve.
    Run {
        #[arg(long, env = "SLUICE_CONFIG")]
        config: PathBuf,
    },
    /// Validate the configuration and print the route table.
    Check {
        #[arg(long, env = "SLUICE_CONFIG")]
        config: PathBuf,
        /// Instead of the table, explain the routing of the request
        /// described in this JSON file (as `POST /explain` takes it):
        /// route, subjects, policies. No store is asked.
        #[arg(long, value_name = "REQUEST.json")]
        explain: Option<PathBuf>,
    },
}

const EXIT_RUNTIME: u8 = 1;
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config, explain } => match Config::load(&config) {
            Ok(config) => match explain {
                None => {
                    print!("{}", config.route_table());
                    if !config.live.policies.is_empty() {
                        print!("\n{}", config.count_notes());
                    }
                    ExitCode::SUCCESS
                }
                Some(request) => explain_offline(config, &request),
            },
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::from(EXIT_CONFIG)
            }
        },
        Command::Run { config } => {
            telemetry::init_logging(cli.log_format);
            // Validate fully before anything listens.
            let config = match Config::load(&config) {
                Ok(config) => config,
                Err(errors) => {
                    eprintln!("{errors}");
                    tracing::error!(errors = errors.len(), "invalid configuration: not starting");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            match run(config) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    tracing::error!(%error, "sluice stopped");
                    ExitCode::from(EXIT_RUNTIME)
                }
            }
        }
    }
}

/// `sluice check --explain`: the routing half of `POST /explain`, offline.
fn explain_offline(config: Config, request: &Path) -> ExitCode {
    let body = match std::fs::read(request) {
        Ok(body) => body,
        Err(error) => {
            eprintln!("{}: {error}", request.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let described = match Described::parse(&body) {
        Ok(described) => described,
        Err(bad) => {
            eprintln!("{}: {bad}", request.display());
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let live = config.live;
    // Pseudonyms match a sidecar's only under the configured key; without
    // one the explanation says so instead of showing any.
    let key = match &live.identity.pseudonym_key {
        Some(secret) => PseudonymKey::new(
            secret.expose().as_bytes(),
            live.identity.pseudonym_key_version,
        ),
        None => PseudonymKey::random(),
    };
    let runtime = Runtime::new(Arc::new(live), key);
    // Nothing offline awaits anything; a runtime only drives the future.
    let Ok(executor) = tokio::runtime::Builder::new_current_thread().build() else {
        eprintln!("cannot start a runtime");
        return ExitCode::from(EXIT_RUNTIME);
    };
    let explained = executor.block_on(explain(&runtime, Source::Offline, &described));
    let text = serde_json::to_string_pretty(&explained).unwrap_or_default();
    // A closed pipe (`| head`) is no failure of the explanation.
    let _ = writeln!(std::io::stdout(), "{text}");
    ExitCode::SUCCESS
}

fn run(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if config.boot.server.workers > 0 {
        builder.worker_threads(config.boot.server.workers);
    }
    let runtime = builder.enable_all().build()?;
    runtime.block_on(async move {
        telemetry::init_metrics();
        let bound = sluice::app::bind(config).await?;
        let traffic = bound.traffic_addr().map(|a| a.to_string()).unwrap_or_default();
        match bound.admin_addr() {
            Some(admin) => tracing::info!(traffic_addr = %traffic, admin_addr = %admin, version = env!("CARGO_PKG_VERSION"), "listening"),
            None => tracing::info!(traffic_addr = %traffic, version = env!("CARGO_PKG_VERSION"), "listening"),
        }
        bound.run(shutdown_signal()).await;
        Ok(())
    })
}

/// Resolves on the first SIGTERM or SIGINT; a second one exits at once.
async fn shutdown_signal() -> Signal {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        // Without signal handlers there is nothing to wait for but Ctrl-C.
        let _ = tokio::signal::ctrl_c().await;
        return Signal::Interrupt;
    };
    let first = tokio::select! {
        _ = term.recv() => Signal::Terminate,
        _ = int.recv() => Signal::Interrupt,
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second signal: exiting without draining");
        std::process::exit(i32::from(EXIT_RUNTIME));
    });
    first
}
