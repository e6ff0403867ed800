//! Wires the pieces: bind the listeners, report their addresses, serve
//! traffic and admin, and drain on shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admin::{self, Health};
use crate::config::{Boot, Config, Live, StoreKind};
use crate::proxy::fallback::Fallback;
use crate::proxy::{Proxy, Runtime, SharedRuntime, Upstream};
use crate::server;
use crate::store::deny_cache::DenyCache;
use crate::store::memory::MemoryStore;
use crate::store::memory_bound::Bound as MemoryBound;
use crate::store::redis::{RedisSetupError, RedisStore};
use crate::store::Store;
use crate::subject::PseudonymKey;
use crate::{reload, telemetry};

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[from] server::tls::TlsError),
    #[error("Redis store: {0}")]
    Redis(#[from] RedisSetupError),
}

/// Listeners bound and everything built, nothing served yet.
pub struct Bound {
    /// What the listeners, the store and the upstream client were built
    /// from; a reload compares with it and never changes it.
    boot: Boot,
    source: PathBuf,
    runtime: SharedRuntime,
    store: Arc<Store>,
    traffic: TcpListener,
    admin: Option<TcpListener>,
    tls: Option<tokio_rustls::TlsAcceptor>,
    /// Installed before the addresses are reported, so a SIGHUP sent as
    /// soon as sluice is up reloads instead of killing the process.
    hangup: Option<tokio::signal::unix::Signal>,
}

/// Builds the store and runtime and binds the listeners. The configuration
/// is already valid: nothing listens before it is.
pub async fn bind(config: Config) -> Result<Bound, AppError> {
    let key = match &config.live.identity.pseudonym_key {
        Some(secret) => PseudonymKey::new(
            secret.expose().as_bytes(),
            config.live.identity.pseudonym_key_version,
        ),
        None => {
            tracing::warn!(
                "identity.pseudonym_key is not set: using a random key generated at start \
                 (subjects get new pseudonyms, and fresh counters, on every restart)"
            );
            PseudonymKey::random()
        }
    };
    let store = Arc::new(build_store(&config.boot, &config.live)?);
    let tls = match &config.boot.server.tls {
        Some(tls) => Some(server::tls::acceptor(tls)?),
        None => None,
    };
    let traffic = listen("traffic", config.boot.server.listen).await?;
    let admin = match config.boot.server.admin {
        Some(addr) => Some(listen("admin", addr).await?),
        None => None,
    };
    reload::loaded(&config);
    let Config { source, boot, live } = config;
    let runtime = Arc::new(ArcSwap::from_pointee(Runtime::new(Arc::new(live), key)));
    let hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(error) => {
            tracing::warn!(%error, "cannot listen for SIGHUP; reloading on file change only");
            None
        }
    };
    Ok(Bound {
        boot,
        source,
        hangup,
        runtime,
        store,
        traffic,
        admin,
        tls,
    })
}

/// The store is built from the boot part; the live part gives the
/// policies whose scripts are loaded first and the budget at start.
fn build_store(boot: &Boot, live: &Live) -> Result<Store, AppError> {
    let ttl_grace = boot.store.ttl_grace;
    Ok(match &boot.store.kind {
        StoreKind::Memory(memory) => {
            let bound = MemoryBound::resolve(memory.max_entries);
            match bound {
                MemoryBound::Configured(entries) => {
                    tracing::info!(max_entries = entries, "memory store bound as configured")
                }
                MemoryBound::FromMemoryLimit { limit, entries } => tracing::info!(
                    max_entries = entries,
                    memory_limit_bytes = limit,
                    "memory store bound derived from the memory limit"
                ),
                MemoryBound::Default(entries) => tracing::info!(
                    max_entries = entries,
                    "memory store bound: no memory limit found, the default applies"
                ),
            }
            Store::Memory(MemoryStore::new(bound.entries(), ttl_grace))
        }
        StoreKind::Redis(redis) => {
            // Connects in the background: readiness turns true once Redis
            // answered and the scripts are loaded.
            let store = RedisStore::connect_running(
                redis,
                boot.store.scripts,
                ttl_grace,
                live.store.budget,
                &live.policies,
            )?;
            store.learn_routes(live.routes.iter().chain([&live.default]));
            let cache =
                (redis.deny_cache_entries > 0).then(|| DenyCache::new(redis.deny_cache_entries));
            Store::Redis(store, cache)
        }
    })
}

async fn listen(what: &'static str, addr: SocketAddr) -> Result<TcpListener, AppError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| AppError::Bind { what, addr, source })
}

/// What asked the process to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM, as Kubernetes sends: wait `server.shutdown_delay`, then
    /// drain.
    Terminate,
    /// SIGINT (Ctrl-C at a terminal): drain at once.
    Interrupt,
}

impl Bound {
    pub fn traffic_addr(&self) -> Option<SocketAddr> {
        self.traffic.local_addr().ok()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Serves until `shutdown` resolves, then fails readiness at once. On
    /// SIGTERM it goes on accepting and serving for `server.shutdown_delay`
    /// (HTTP/1 responses asking the client to close), the time the
    /// endpoints take to drop the pod; then, and at once on SIGINT, it stops
    /// accepting and drains in-flight requests for up to
    /// `server.shutdown_grace`.
    pub async fn run(self, shutdown: impl Future<Output = Signal>) {
        let boot = self.boot;
        let fallback = Arc::new(Fallback::for_sidecar());
        let health = Arc::new(Health::new(
            self.runtime.clone(),
            self.store.clone(),
            fallback.clone(),
        ));
        let (stop_tx, stop_rx) = watch::channel(false);

        let sweeper = spawn_sweeper(self.store.clone());
        let reloader = tokio::spawn(reload::watch(
            self.source,
            boot.clone(),
            self.runtime.clone(),
            self.store.clone(),
            self.hangup,
        ));
        let upstream = Upstream::new(&boot.upstream);
        let proxy = Arc::new(Proxy::new(
            self.runtime.clone(),
            self.store.clone(),
            fallback.clone(),
            upstream,
        ));
        let fallback = spawn_fallback_upkeep(fallback);
        let settings = server::Settings::from(&boot.server);
        let mut stop = stop_rx.clone();
        let winding_down = Arc::new(AtomicBool::new(false));
        let traffic = tokio::spawn(server::serve(
            self.traffic,
            self.tls,
            settings,
            proxy,
            winding_down.clone(),
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
        ));

        // Started last, once every metric handle of the proxy and the
        // traffic listener is registered: its first scrape shows every
        // series. The admin listener outlives traffic so probes see the drain
        // (readiness 503) instead of a refused connection; it stops with the
        // process.
        let admin = self.admin.map(|listener| {
            tokio::spawn(admin::serve(
                listener,
                health.clone(),
                boot.server.header_read_timeout,
                std::future::pending(),
            ))
        });

        let signal = shutdown.await;
        health.begin_shutdown();
        let delay = match signal {
            Signal::Terminate => boot.server.shutdown_delay,
            Signal::Interrupt => Duration::ZERO,
        };
        if !delay.is_zero() {
            winding_down.store(true, Ordering::Relaxed);
            tracing::info!(
                ?delay,
                "shutting down: not ready, still serving while endpoints drop this instance"
            );
            tokio::time::sleep(delay).await;
        }
        tracing::info!(grace = ?boot.server.shutdown_grace, "shutting down: draining");
        let _ = stop_tx.send(true);
        let _ = traffic.await;
        // Every request is answered: what leases hold is no one's now.
        self.store.return_leases().await;
        if let Some(admin) = admin {
            admin.abort();
        }
        sweeper.abort();
        fallback.abort();
        reloader.abort();
        tracing::info!("stopped");
    }
}

/// Once a second: the local fallback's expired state dropped and its time
/// counted.
fn spawn_fallback_upkeep(fallback: Arc<Fallback>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            fallback.tick();
        }
    })
}

/// Drops expired memory-store entries once a second, so idle subjects cost
/// nothing even if they never come back.
fn spawn_sweeper(store: Arc<Store>) -> tokio::task::JoinHandle<()> {
    let subjects = metrics::gauge!(telemetry::MEMORY_SUBJECTS);
    let evictions = metrics::counter!(telemetry::MEMORY_EVICTIONS);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tick.tick().await;
            #[allow(irrefutable_let_patterns)]
            if let Store::Memory(memory) = &*store {
                memory.sweep();
                subjects.set(memory.len() as f64);
                evictions.absolute(memory.evictions());
            }
        }
    })
}
