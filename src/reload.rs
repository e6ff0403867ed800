//! Hot reload: the configuration file is polled and SIGHUP forces a check.
//!
//! Polling the file's bytes (once a second) rather than watching inodes is
//! what survives Kubernetes ConfigMap updates, which swap a `..data` symlink
//! in the mounted directory instead of writing the file. A new configuration
//! is validated fully, then swapped atomically; in-flight requests finish
//! under the runtime they loaded. An invalid file is refused, logged with its
//! errors and counted, and the last good configuration keeps serving.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::runtime::{Runtime, SharedRuntime};
use crate::subject::PseudonymKey;
use crate::telemetry;

/// How often the file is read to see whether it changed.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// Watches `path` until the task is dropped.
pub async fn watch(
    path: PathBuf,
    runtime: SharedRuntime,
    mut hangup: Option<tokio::signal::unix::Signal>,
) {
    let mut last = digest_of(&path).await;
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hangup.as_mut() { Some(s) => s.recv().await, None => std::future::pending().await } } => true,
        };
        let now = digest_of(&path).await;
        if !forced && now == last {
            continue;
        }
        // Remember what was tried, good or bad, so a bad file is reported
        // once rather than every second.
        last = now;
        reload(
            &path,
            &runtime,
            if forced { "signal" } else { "file change" },
        );
    }
}

/// Validates `path` and swaps it in. Returns whether it was applied.
pub fn reload(path: &std::path::Path, runtime: &SharedRuntime, trigger: &str) -> bool {
    let config = match Config::load(path) {
        Ok(config) => config,
        Err(errors) => {
            telemetry::config_reload("failure");
            tracing::error!(
                trigger,
                file = %path.display(),
                errors = %errors,
                "configuration refused: the last good configuration keeps serving"
            );
            return false;
        }
    };
    let current = runtime.load_full();
    for change in needs_restart(&current.config, &config) {
        tracing::warn!(
            trigger,
            change,
            "this change needs a restart; it is not applied until then"
        );
    }
    let key = match &config.identity.pseudonym_key {
        Some(secret) => PseudonymKey::new(
            secret.expose().as_bytes(),
            config.identity.pseudonym_key_version,
        ),
        // The key generated at start stays: a new one would reset everyone.
        None => current.key.clone(),
    };
    let next = Runtime::new(Arc::new(config), key);
    telemetry::config_loaded(&next.config);
    runtime.store(Arc::new(next));
    telemetry::config_reload("success");
    tracing::info!(trigger, file = %path.display(), "configuration reloaded");
    true
}

/// What a reload cannot apply to a running process.
fn needs_restart(old: &Config, new: &Config) -> Vec<&'static str> {
    let mut changes = Vec::new();
    if old.server.listen != new.server.listen {
        changes.push("server.listen");
    }
    if old.server.admin != new.server.admin {
        changes.push("server.admin");
    }
    if format!("{:?}", old.server.tls) != format!("{:?}", new.server.tls) {
        changes.push("server.tls");
    }
    if old.server.workers != new.server.workers {
        changes.push("server.workers");
    }
    if format!("{:?}", old.store.kind) != format!("{:?}", new.store.kind) {
        changes.push("store (kind and connection)");
    }
    if format!("{:?}", old.upstream) != format!("{:?}", new.upstream) {
        changes.push("upstream");
    }
    changes
}

async fn digest_of(path: &std::path::Path) -> Option<[u8; 32]> {
    let bytes = tokio::fs::read(path).await.ok()?;
    Some(Sha256::digest(&bytes).into())
}
