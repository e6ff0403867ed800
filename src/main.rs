//! `sluice run` serves; `sluice check` validates and prints the route table,
//! or with `--explain` the routing of one described request;
//! `sluice check-manifests` reads a Kubernetes rendering for sluice left out
//! or gone around; `sluice import ingress-nginx` writes a configuration
//! from Ingress manifests.
//! Exit codes: 0 ok, 2 invalid configuration (or request description),
//! 1 runtime failure.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use sluice::app::Signal;
use sluice::config::{Config, StoreKind};
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
        /// Check with every unset `${NAME}` filled by a placeholder (for
        /// CI without the secrets); the names filled are listed.
        #[arg(long)]
        allow_unset: bool,
        /// Also try the store with the configuration's settings and
        /// credentials: connection, server, function libraries, one
        /// evaluation per policy. Exits 1 when a step fails.
        #[arg(long, conflicts_with = "explain")]
        connect: bool,
    },
    /// Read rendered Kubernetes manifests (`helm template`, `kubectl
    /// kustomize`; multi-document YAML, `-` for standard input) and refuse
    /// them when a workload meant to run sluice does not, or a port of a
    /// Service selecting sluice's pods reaches the application around it.
    /// Exits 2 when something is refused.
    CheckManifests {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
    /// Write a sluice configuration (YAML, to standard output) with the
    /// limits another proxy was given.
    Import {
        #[command(subcommand)]
        from: ImportFrom,
    },
    /// Print every key of the sections (server, upstream, store, identity,
    /// responses): its default, whether a reload applies it or it needs a
    /// restart, and what it means.
    Keys {
        /// As the Markdown table of the configuration reference.
        #[arg(long)]
        markdown: bool,
    },
}

#[derive(Subcommand)]
enum ImportFrom {
    /// Ingress manifests (`networking.k8s.io/v1`, multi-document YAML,
    /// `-` for standard input) and their `nginx.ingress.kubernetes.io/`
    /// limit annotations: one route per path, every annotation not
    /// carried over named in a comment.
    IngressNginx {
        #[arg(required = true, value_name = "FILE")]
        files: Vec<PathBuf>,
    },
}

const EXIT_RUNTIME: u8 = 1;
const EXIT_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Keys { markdown } => {
            let table = if markdown {
                sluice::config::keys::markdown()
            } else {
                sluice::config::keys::text()
            };
            let mut out = Stdout::default();
            out.print(format_args!("{table}"));
            out.finish(ExitCode::SUCCESS)
        }
        Command::CheckManifests { files } => check_manifests(&files),
        Command::Import {
            from: ImportFrom::IngressNginx { files },
        } => import_ingress_nginx(&files),
        Command::Check {
            config,
            explain,
            allow_unset,
            connect,
        } => {
            let loaded = if allow_unset {
                Config::load_allowing_unset(&config)
            } else {
                Config::load(&config).map(|c| (c, Vec::new()))
            };
            match loaded {
                Ok((config, filled)) => match explain {
                    None => check(&config, &filled, connect),
                    Some(request) => explain_offline(config, &request),
                },
                Err(errors) => {
                    eprintln!("{errors}");
                    ExitCode::from(EXIT_CONFIG)
                }
            }
        }
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

/// `sluice check`: the route table, what resets each policy's counts, the
/// variables filled with placeholders, and with `--connect` what the store
/// said.
fn check(config: &Config, filled: &[(String, String)], connect: bool) -> ExitCode {
    let mut out = Stdout::default();
    let code = check_printing(&mut out, config, filled, connect);
    out.finish(code)
}

fn check_printing(
    out: &mut Stdout,
    config: &Config,
    filled: &[(String, String)],
    connect: bool,
) -> ExitCode {
    out.print(format_args!("{}", config.route_table()));
    let addresses = config.address_notes();
    if !addresses.is_empty() {
        out.print(format_args!("\n{addresses}"));
    }
    if !config.live.policies.is_empty() {
        out.print(format_args!("\n{}", config.count_notes()));
    }
    let answers = config.answer_notes();
    if !answers.is_empty() {
        out.print(format_args!("\n{answers}"));
    }
    let warnings = config.tier_warnings();
    if !warnings.is_empty() {
        out.print(format_args!("\n{warnings}"));
    }
    if !filled.is_empty() {
        let names: Vec<&str> = filled.iter().map(|(n, _)| n.as_str()).collect();
        out.print(format_args!(
            "\nUnset, checked with a placeholder in their place: {}\n",
            names.join(", ")
        ));
    }
    if !connect {
        return ExitCode::SUCCESS;
    }
    out.print(format_args!("\n"));
    let StoreKind::Redis(redis) = &config.boot.store.kind else {
        out.print(format_args!(
            "store: memory, inside the process: nothing to connect to\n"
        ));
        return ExitCode::SUCCESS;
    };
    if !filled.is_empty() {
        eprintln!(
            "--connect needs the real settings, and {} unset",
            if filled.len() == 1 {
                "one variable is"
            } else {
                "some variables are"
            }
        );
        return ExitCode::from(EXIT_CONFIG);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot start a runtime: {error}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    let steps = runtime.block_on(sluice::store::redis::inspect::inspect(
        redis,
        config.boot.store.scripts,
        config.boot.store.ttl_grace,
        &config.live.policies,
    ));
    let steps = match steps {
        Ok(steps) => steps,
        Err(error) => {
            eprintln!("store: {error}");
            return ExitCode::from(EXIT_RUNTIME);
        }
    };
    out.print(format_args!("Store (redis):\n"));
    let mut failed = false;
    for step in &steps {
        match &step.found {
            Ok(found) => out.print(format_args!("  ok    {}: {found}\n", step.what)),
            Err(why) => {
                failed = true;
                out.print(format_args!("  FAIL  {}: {why}\n", step.what));
            }
        }
    }
    if failed {
        ExitCode::from(EXIT_RUNTIME)
    } else {
        ExitCode::SUCCESS
    }
}

/// `sluice check-manifests`: the objects of every file, checked together
/// (a Service and the workload it selects may come from different files).
fn check_manifests(files: &[PathBuf]) -> ExitCode {
    let mut objects = Vec::new();
    for file in files {
        let (name, text) = read_input(file);
        let text = match text {
            Ok(text) => text,
            Err(error) => {
                eprintln!("{name}: {error}");
                return ExitCode::from(EXIT_RUNTIME);
            }
        };
        match sluice::manifests::load(&name, &text) {
            Ok(found) => objects.extend(found),
            Err(error) => {
                eprintln!("{error}");
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    let report = sluice::manifests::check(&objects);
    let mut out = Stdout::default();
    out.print(format_args!("{report}"));
    out.finish(if report.errors() > 0 {
        ExitCode::from(EXIT_CONFIG)
    } else {
        ExitCode::SUCCESS
    })
}

/// The text of `file` (`-`: standard input), named for messages.
fn read_input(file: &Path) -> (String, std::io::Result<String>) {
    if file.as_os_str() == "-" {
        let mut text = String::new();
        let read = std::io::Read::read_to_string(&mut std::io::stdin(), &mut text);
        ("standard input".to_owned(), read.map(|_| text))
    } else {
        (file.display().to_string(), std::fs::read_to_string(file))
    }
}

/// `sluice import ingress-nginx`: every file read first, then one
/// configuration for all their Ingresses.
fn import_ingress_nginx(files: &[PathBuf]) -> ExitCode {
    let mut read = Vec::with_capacity(files.len());
    for file in files {
        match read_input(file) {
            (name, Ok(text)) => read.push((name, text)),
            (name, Err(error)) => {
                eprintln!("{name}: {error}");
                return ExitCode::from(EXIT_RUNTIME);
            }
        }
    }
    match sluice::import::ingress_nginx::import(&read) {
        Ok(config) => {
            // A closed pipe (`| head`) is no failure of the import.
            let _ = write!(std::io::stdout(), "{config}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::from(EXIT_CONFIG)
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
    let mut out = Stdout::default();
    out.print(format_args!("{text}\n"));
    out.finish(ExitCode::SUCCESS)
}

/// Standard output of the commands that print. A reader that goes away
/// (`sluice check | head`) ends the printing, not the command: what is
/// left is dropped and the command's own exit code stands, as `grep` or
/// `cat` behave when their pipe closes (Rust ignores SIGPIPE, so the
/// write fails with `EPIPE` where a C tool would be killed). Any other
/// write error is reported on stderr and exits 1: the output is lost.
#[derive(Default)]
struct Stdout {
    failed: Option<std::io::Error>,
}

impl Stdout {
    fn print(&mut self, text: std::fmt::Arguments<'_>) {
        if self.failed.is_some() {
            return;
        }
        let mut stdout = std::io::stdout().lock();
        if let Err(error) = stdout.write_fmt(text).and_then(|()| stdout.flush()) {
            self.failed = Some(error);
        }
    }

    /// `code`, unless the output could not be written for another reason
    /// than its reader leaving.
    fn finish(self, code: ExitCode) -> ExitCode {
        match self.failed {
            None => code,
            Some(error) if error.kind() == std::io::ErrorKind::BrokenPipe => code,
            Some(error) => {
                eprintln!("cannot write to standard output: {error}");
                ExitCode::from(EXIT_RUNTIME)
            }
        }
    }
}

fn run(config: Config) -> Result<(), Box<dyn std::error::Error>> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if config.boot.server.workers > 0 {
        builder.worker_threads(config.boot.server.workers);
    }
    let runtime = builder.enable_all().build()?;
    runtime.block_on(async move {
        telemetry::init_metrics();
        // Caught from before "listening" is logged: a signal sent as soon
        // as sluice says it listens drains as any other.
        let signals = Signals::install();
        let bound = sluice::app::bind(config).await?;
        let traffic = bound.traffic_addr().map(|a| a.to_string()).unwrap_or_default();
        match bound.admin_addr() {
            Some(admin) => tracing::info!(traffic_addr = %traffic, admin_addr = %admin, version = env!("CARGO_PKG_VERSION"), "listening"),
            None => tracing::info!(traffic_addr = %traffic, version = env!("CARGO_PKG_VERSION"), "listening"),
        }
        bound.run(signals.first()).await;
        Ok(())
    })
}

/// SIGTERM and SIGINT, caught once installed (until then the default
/// action would end the process without draining).
struct Signals {
    streams: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    fn install() -> Signals {
        use tokio::signal::unix::{signal, SignalKind};
        let streams = match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(term), Ok(int)) => Some((term, int)),
            _ => None,
        };
        Signals { streams }
    }

    /// Resolves on the first SIGTERM or SIGINT; a second one exits at once.
    async fn first(self) -> Signal {
        let Some((mut term, mut int)) = self.streams else {
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
}
