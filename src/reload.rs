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

use crate::config::{Config, StoreKind, Topology};
use crate::runtime::{Runtime, SharedRuntime};
use crate::store::Store;
use crate::subject::PseudonymKey;
use crate::telemetry;

/// How often the file is read to see whether it changed.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// Watches `path` until the task is dropped.
pub async fn watch(
    path: PathBuf,
    runtime: SharedRuntime,
    store: Arc<Store>,
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
        let applied = reload(
            &path,
            &runtime,
            if forced { "signal" } else { "file change" },
        );
        // The Redis store loads the scripts of policies it has not seen,
        // so their first requests need no NOSCRIPT round.
        if let (true, Store::Redis(redis, _)) = (applied, &*store) {
            redis.learn(&runtime.load().config.policies);
        }
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
    if old.server.idle_timeout != new.server.idle_timeout {
        changes.push("server.idle_timeout");
    }
    if old.server.send_timeout != new.server.send_timeout {
        changes.push("server.send_timeout");
    }
    if old.server.max_connections != new.server.max_connections {
        changes.push("server.max_connections");
    }
    if old.server.http2 != new.server.http2 {
        changes.push("server.http2");
    }
    if store_identity(&old.store.kind) != store_identity(&new.store.kind) {
        changes.push("store (kind and connection)");
    }
    // The upstream URL and timeout are read per request; the connect
    // timeout belongs to the pooled client built at start.
    if old.upstream.connect_timeout != new.upstream.connect_timeout {
        changes.push("upstream.connect_timeout");
    }
    changes
}

/// Every secret a topology holds, joined: a changed password counts.
fn secrets(topology: &Topology) -> String {
    match topology {
        Topology::Standalone { url } => url.expose().to_owned(),
        Topology::Cluster { nodes } => join(nodes),
        Topology::Sentinel {
            nodes, password, ..
        } => format!(
            "{}\n{}",
            join(nodes),
            password.as_ref().map_or("", |p| p.expose())
        ),
    }
}

fn join(urls: &[crate::config::Secret]) -> String {
    urls.iter()
        .map(|u| u.expose())
        .collect::<Vec<_>>()
        .join("\n")
}

/// What identifies a store connection. Debug output redacts the Redis URL
/// (it carries credentials), so the URL is compared on its own.
fn store_identity(kind: &StoreKind) -> (String, Option<String>) {
    match kind {
        StoreKind::Redis(redis) => (format!("{kind:?}"), Some(secrets(&redis.topology))),
        StoreKind::Memory(_) => (format!("{kind:?}"), None),
    }
}

async fn digest_of(path: &std::path::Path) -> Option<[u8; 32]> {
    let bytes = tokio::fs::read(path).await.ok()?;
    Some(Sha256::digest(&bytes).into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn config(listen: &str, redis_url: &str, limit: u32) -> Config {
        let text = format!(
            "version: 1
server: {{ listen: {listen} }}
upstream: {{ url: http://127.0.0.1:3000 }}
store: {{ kind: redis, url: {redis_url} }}
identity: {{ pseudonym_key: 0123456789abcdef0123 }}
policies:
  p: {{ algorithm: fixed-window, limit: {limit}, window: 1s }}
routes:
  - {{ name: r, policy: p }}
"
        );
        Config::parse(Path::new("test.yaml"), &text).expect("valid")
    }

    #[test]
    fn only_what_a_running_process_cannot_change_needs_a_restart() {
        let base = config("127.0.0.1:8080", "redis://127.0.0.1:6379", 5);
        assert!(needs_restart(
            &base,
            &config("127.0.0.1:8080", "redis://127.0.0.1:6379", 9)
        )
        .is_empty());
        assert_eq!(
            needs_restart(
                &base,
                &config("127.0.0.1:8081", "redis://127.0.0.1:6379", 5)
            ),
            ["server.listen"]
        );
        // The URL is redacted in Debug output; a changed password must still count.
        assert_eq!(
            needs_restart(
                &base,
                &config("127.0.0.1:8080", "redis://u:other@127.0.0.1:6379", 5)
            ),
            ["store (kind and connection)"]
        );
    }
}
