//! Hot reload: the configuration file (and the JWT keys file and refusal
//! bodies it names) is polled and SIGHUP forces a check.
//!
//! Polling the file (once a second) rather than watching inodes is what
//! survives Kubernetes ConfigMap updates, which swap a `..data` symlink in
//! the mounted directory instead of writing the file. Each poll reads the
//! metadata of the file the path resolves to; only when that changed are
//! its bytes read and hashed, and only new bytes are applied. A new configuration
//! is validated fully, then swapped atomically; in-flight requests finish
//! under the runtime they loaded. An invalid file is refused, logged with its
//! errors and counted, and the last good configuration keeps serving.
//!
//! Only the live part of a configuration is applied. The boot part the
//! process started with stays in effect until a restart; each key of it a
//! new file changes is named in a warning.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::config::{Boot, Config, Live, StoreKind};
use crate::proxy::{Runtime, SharedRuntime};
use crate::store::Store;
use crate::subject::PseudonymKey;

mod revision;

pub use revision::loaded;

/// How often the file is read to see whether it changed.
pub const POLL_EVERY: Duration = Duration::from_secs(1);

/// Every this many polls the file is hashed even when its metadata says
/// it has not changed.
const REHASH_EVERY: u32 = 10;

/// Watches `path` until the task is dropped. `boot` is the part of the
/// configuration the process started with, which stays in effect.
pub async fn watch(
    path: PathBuf,
    boot: Boot,
    runtime: SharedRuntime,
    store: Arc<Store>,
    mut hangup: Option<tokio::signal::unix::Signal>,
) {
    let mut files = watched(&path, &runtime);
    let mut stamp = stamps_of(&files).await;
    let mut polls = 0u32;
    let mut last = digests_of(&files).await;
    let mut tick = tokio::time::interval(POLL_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = tick.tick() => false,
            Some(()) = async { match hangup.as_mut() { Some(s) => s.recv().await, None => std::future::pending().await } } => true,
        };
        // A file whose inode, size and times are all unchanged is not read:
        // hashing a large configuration every second is most of what an
        // idle sidecar spends. File times are only as fine as the kernel's
        // clock tick, so two writes of one size within a tick look alike:
        // every `REHASH_EVERY` polls the bytes are hashed anyway.
        let stamped = stamps_of(&files).await;
        polls = polls.wrapping_add(1);
        let readable = stamped.iter().all(Option::is_some);
        if !forced && readable && stamped == stamp && polls % REHASH_EVERY != 0 {
            continue;
        }
        stamp = stamped;
        let now = digests_of(&files).await;
        if !forced && now == last {
            continue;
        }
        // Remember what was tried, good or bad, so a bad file is reported
        // once rather than every second.
        last = now;
        let applied = reload(
            &path,
            &boot,
            &runtime,
            if forced { "signal" } else { "file change" },
        );
        // The Redis store loads the libraries of policies (and of routes'
        // several limits) it has not seen, so their first requests need no
        // reload round.
        // A reload may name another keys file.
        let named = watched(&path, &runtime);
        if named != files {
            files = named;
            stamp = stamps_of(&files).await;
            last = digests_of(&files).await;
        }
        if let (true, Store::Redis(redis, _)) = (applied, &*store) {
            let live = runtime.load().live.clone();
            redis.learn(&live.policies);
            redis.learn_routes(live.routes.iter().chain([&live.default]));
        }
    }
}

/// Validates `path` and swaps its live part in; a change to its boot part
/// is logged, key by key, and not applied. Returns whether it was applied.
pub fn reload(path: &std::path::Path, boot: &Boot, runtime: &SharedRuntime, trigger: &str) -> bool {
    let config = match Config::load(path) {
        Ok(config) => config,
        Err(errors) => {
            revision::counted("failure");
            tracing::error!(
                trigger,
                file = %path.display(),
                errors = %errors,
                "configuration refused: the last good configuration keeps serving"
            );
            return false;
        }
    };
    if let Some(refusal) = unsafe_with(boot, &config) {
        revision::counted("failure");
        tracing::error!(
            trigger,
            file = %path.display(),
            errors = %refusal,
            "configuration refused: the last good configuration keeps serving"
        );
        return false;
    }
    for change in boot.changes(&config.boot) {
        tracing::warn!(
            trigger,
            change,
            "this change needs a restart; it is not applied until then"
        );
    }
    revision::loaded(&config);
    let live = config.live;
    let current = runtime.load_full();
    let key = match &live.identity.pseudonym_key {
        Some(secret) => PseudonymKey::new(
            secret.expose().as_bytes(),
            live.identity.pseudonym_key_version,
        ),
        // The key generated at start stays: a new one would reset everyone.
        None => current.key.clone(),
    };
    say_what_happens_to_counts(&current.live, &live);
    runtime.store(Arc::new(Runtime::new(Arc::new(live), key)));
    revision::counted("success");
    tracing::info!(trigger, file = %path.display(), "configuration reloaded");
    true
}

/// One line per policy a reload changes: whether its subjects' counts are
/// kept (its numbers changed, not what its state means) or start afresh
/// (a new revision).
fn say_what_happens_to_counts(old: &Live, new: &Live) {
    for policy in &new.policies {
        let Some(before) = old.policies.iter().find(|p| p.name == policy.name) else {
            continue;
        };
        if before.revision != policy.revision {
            tracing::info!(
                policy = %policy.name,
                revision = %policy.revision,
                previous_revision = %before.revision,
                "policy changed what its counts mean: its counts start afresh"
            );
        } else if before.numbers() != policy.numbers() {
            tracing::info!(
                policy = %policy.name,
                revision = %policy.revision,
                "policy's numbers changed: its counts are kept"
            );
        }
    }
}

/// A live part that the boot part in effect cannot serve safely. The new
/// file was checked against its own boot part; a reload keeps the old one,
/// so what ties the two must be checked again against that.
fn unsafe_with(boot: &Boot, config: &Config) -> Option<String> {
    // The listener reads PROXY headers as it started; with nothing trusted
    // the balancer's headers would reach HTTP and every connection through
    // it would fail.
    if boot.server.proxy_protocol.any() && config.live.identity.trusted_proxies.is_empty() {
        return Some(format!(
            "{}: identity.trusted_proxies: empty, while the server.proxy_protocol in effect \
             reads PROXY headers only from trusted peers, which a reload cannot change: \
             restart without proxy_protocol, or keep the load balancer's addresses trusted",
            config.source.display(),
        ));
    }
    let StoreKind::Redis(redis) = &boot.store.kind else {
        return None;
    };
    // A retry comes within one budget of the first attempt; its record
    // must still be there (`lua/README.md`, de-duplication), or a retry
    // after an ambiguous failure could be charged twice.
    let budget = config.live.store.budget;
    (budget > redis.dedupe_window).then(|| {
        format!(
            "{}: store.budget: {} is longer than the store.dedupe_window in effect ({}), \
             which a reload cannot change: restart with both, or keep the budget within it",
            config.source.display(),
            humantime::format_duration(budget),
            humantime::format_duration(redis.dedupe_window),
        )
    })
}

/// What changes whenever the file `path` resolves to is written or
/// swapped: its identity, size and modification and change times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// The configuration file, and the files it names whose change must
/// reload it too: `identity.jwt.keys_file`, which an identity provider's
/// key rotation rewrites without touching the configuration.
/// The configuration file and the files it names, read when it loads:
/// the JWT keys file, and every `body_file` of a custom refusal (a page
/// edited in its ConfigMap is served from the next poll, as the file is).
fn watched(path: &std::path::Path, runtime: &SharedRuntime) -> Vec<PathBuf> {
    let live = runtime.load().live.clone();
    let mut files = vec![path.to_path_buf()];
    files.extend(live.identity.jwt_keys_file.clone());
    let answers = live
        .routes
        .iter()
        .chain([&live.default])
        .map(|route| &route.answers)
        .chain([&live.responses.answers]);
    for answers in answers {
        let written = [&answers.refused, &answers.unavailable];
        for body in written
            .into_iter()
            .flatten()
            .filter_map(|a| a.body.as_ref())
        {
            if !files.contains(&body.file) {
                files.push(body.file.clone());
            }
        }
    }
    files
}

async fn stamps_of(files: &[PathBuf]) -> Vec<Option<Stamp>> {
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        out.push(stamp_of(file).await);
    }
    out
}

async fn digests_of(files: &[PathBuf]) -> Vec<Option<[u8; 32]>> {
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        out.push(digest_of(file).await);
    }
    out
}

async fn stamp_of(path: &std::path::Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt;
    // Follows the symlinks, as reading does: a ConfigMap swap changes the
    // file the path resolves to.
    let meta = tokio::fs::metadata(path).await.ok()?;
    Some(Stamp {
        dev: meta.dev(),
        ino: meta.ino(),
        len: meta.len(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        ctime: (meta.ctime(), meta.ctime_nsec()),
    })
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

    fn needs_restart(old: &Config, new: &Config) -> Vec<&'static str> {
        old.boot.changes(&new.boot)
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
            ["store.url"]
        );
    }

    #[test]
    fn a_reload_that_changes_both_parts_applies_the_live_one() {
        let text = |header_read: &str, timeout: &str| {
            format!(
                "version: 1
server: {{ listen: 127.0.0.1:0, header_read_timeout: {header_read} }}
upstream: {{ url: http://127.0.0.1:3000, timeout: {timeout} }}
policies:
  p: {{ algorithm: fixed-window, limit: 5, window: 1s }}
routes:
  - {{ name: r, policy: p }}
"
            )
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sluice.yaml");
        let start = Config::parse(&path, &text("10s", "60s")).expect("valid");
        let runtime: SharedRuntime = Arc::new(arc_swap::ArcSwap::from_pointee(Runtime::new(
            Arc::new(start.live),
            PseudonymKey::random(),
        )));

        std::fs::write(&path, text("3s", "7s")).expect("write");
        assert!(reload(&path, &start.boot, &runtime, "test"));
        assert_eq!(runtime.load().live.upstream.timeout, Duration::from_secs(7));
    }

    #[test]
    fn a_reload_is_refused_when_its_budget_outlasts_the_dedupe_window_in_effect() {
        let text = |budget: &str, window: &str| {
            format!(
                "version: 1
server: {{ listen: 127.0.0.1:0 }}
upstream: {{ url: http://127.0.0.1:3000 }}
store: {{ kind: redis, url: redis://127.0.0.1:1, budget: {budget}, dedupe_window: {window} }}
identity: {{ pseudonym_key: a-key-of-sixteen-bytes }}
policies:
  p: {{ algorithm: fixed-window, limit: 5, window: 1s }}
routes:
  - {{ name: r, policy: p }}
"
            )
        };
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("sluice.yaml");
        let start = Config::parse(&path, &text("25ms", "1s")).expect("valid");
        let runtime: SharedRuntime = Arc::new(arc_swap::ArcSwap::from_pointee(Runtime::new(
            Arc::new(start.live.clone()),
            PseudonymKey::random(),
        )));

        // Valid on its own (3 s of records for a 2 s budget), but the 1 s
        // window started with stays in effect.
        std::fs::write(&path, text("2s", "3s")).expect("write");
        assert!(Config::load(&path).is_ok());
        assert!(!reload(&path, &start.boot, &runtime, "test"));
        assert_eq!(runtime.load().live.store.budget, Duration::from_millis(25));

        // Within the window in effect: applied (the window change is warned about).
        std::fs::write(&path, text("1s", "3s")).expect("write");
        assert!(reload(&path, &start.boot, &runtime, "test"));
        assert_eq!(runtime.load().live.store.budget, Duration::from_secs(1));
    }
}
