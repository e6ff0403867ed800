//! `store`: which store, its budget and failure answer, and every Redis key.

use std::time::Duration;

use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, Scalar, ScalarList};
use crate::config::validate::check::{self, Checker};
use crate::config::{
    MemoryStore, OnFailure, RedisStore, Scripts, Secret, StoreBoot, StoreKind, StoreLive, Topology,
};

use super::*;
use crate::config::keys;

/// Which store the file asks for; `None` when `kind` is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Redis,
}

const MEMORY_ONLY: [&str; 1] = ["max_entries"];
const REDIS_ONLY: [&str; 16] = [
    "url",
    "topology",
    "pool_size",
    "ca_file",
    "key_prefix",
    "scripts",
    "coalesce",
    "max_clock_regression",
    "dedupe_window",
    "dedupe_max",
    "breaker_failures",
    "breaker_window",
    "breaker_min_calls",
    "breaker_failure_rate",
    "breaker_cooldown",
    "deny_cache_entries",
];

pub fn store_kind(cx: &mut Checker<'_>, path: &KeyPath, raw: &raw::Store) -> Option<Kind> {
    cx.defaulted(path, &keys::STORE_KIND, raw.kind.as_ref(), |s| match s {
        "memory" => Ok(Kind::Memory),
        "redis" => Ok(Kind::Redis),
        _ => Err(format!(
            "unknown store kind `{s}`; expected memory or redis"
        )),
    })
}

pub fn store(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Store,
    kind: Option<Kind>,
) -> Option<(StoreBoot, StoreLive)> {
    let budget = cx.defaulted(
        path,
        &keys::STORE_BUDGET,
        raw.budget.as_ref(),
        check::positive_duration,
    );
    let on_failure = cx.defaulted(
        path,
        &keys::STORE_ON_FAILURE,
        raw.on_failure.as_ref(),
        on_failure,
    );
    // Whether anything uses it is only known once the policies are read
    // (`validate::local_fallback`).
    let local_share = cx.defaulted(
        path,
        &keys::STORE_LOCAL_SHARE,
        raw.local_share.as_ref(),
        check::positive,
    );
    let failure_retry_after = cx.defaulted(
        path,
        &keys::STORE_FAILURE_RETRY_AFTER,
        raw.failure_retry_after.as_ref(),
        check::positive_duration,
    );
    let ttl_grace = cx.defaulted(
        path,
        &keys::STORE_TTL_GRACE,
        raw.ttl_grace.as_ref(),
        check::duration,
    );
    let scripts = cx.defaulted(path, &keys::STORE_SCRIPTS, raw.scripts.as_ref(), scripts);
    let kind = match kind? {
        Kind::Memory => {
            refuse_other_kind(cx, path, &raw, &REDIS_ONLY, "redis");
            memory(cx, path, &raw).map(StoreKind::Memory)
        }
        Kind::Redis => {
            refuse_other_kind(cx, path, &raw, &MEMORY_ONLY, "memory");
            let mut redis = redis(cx, path, &raw);
            if let (Some(redis), Some(budget)) = (&mut redis, budget) {
                // Unwritten, it follows a long budget: `budget: 2s` alone
                // is a valid configuration.
                if raw.dedupe_window.is_none() {
                    redis.dedupe_window = redis.dedupe_window.max(budget);
                } else if redis.dedupe_window < budget {
                    cx.error(
                        &path.key("dedupe_window"),
                        At::Value,
                        "must be at least `budget`: a retry within the budget must find its record",
                    );
                }
            }
            redis.map(|r| StoreKind::Redis(Box::new(r)))
        }
    };
    let boot = StoreBoot {
        kind: kind?,
        ttl_grace: ttl_grace?,
        scripts: scripts?,
    };
    let live = StoreLive {
        budget: budget?,
        on_failure: on_failure?,
        local_share: local_share?,
        failure_retry_after: failure_retry_after?,
    };
    Some((boot, live))
}

/// `scripts`: how the Redis scripts run.
fn scripts(s: &str) -> Result<Scripts, String> {
    match s {
        "auto" => Ok(Scripts::Auto),
        "functions" => Ok(Scripts::Functions),
        "eval" => Ok(Scripts::Eval),
        _ => Err(format!("expected auto, functions or eval, not `{s}`")),
    }
}

/// `on_failure`, on the store or on a policy.
pub fn on_failure(s: &str) -> Result<OnFailure, String> {
    match s {
        "deny" => Ok(OnFailure::Deny),
        "allow" => Ok(OnFailure::Allow),
        "local" => Ok(OnFailure::Local),
        _ => Err(format!("expected deny, allow or local, not `{s}`")),
    }
}

fn store_key<'r>(raw: &'r raw::Store, key: &str) -> Option<&'r Scalar> {
    match key {
        "max_entries" => raw.max_entries.as_ref(),
        "url" => raw.url.as_ref(),
        "pool_size" => raw.pool_size.as_ref(),
        "ca_file" => raw.ca_file.as_ref(),
        "key_prefix" => raw.key_prefix.as_ref(),
        "scripts" => raw.scripts.as_ref(),
        "coalesce" => raw.coalesce.as_ref(),
        "max_clock_regression" => raw.max_clock_regression.as_ref(),
        "dedupe_window" => raw.dedupe_window.as_ref(),
        "dedupe_max" => raw.dedupe_max.as_ref(),
        "breaker_failures" => raw.breaker_failures.as_ref(),
        "breaker_window" => raw.breaker_window.as_ref(),
        "breaker_min_calls" => raw.breaker_min_calls.as_ref(),
        "breaker_failure_rate" => raw.breaker_failure_rate.as_ref(),
        "breaker_cooldown" => raw.breaker_cooldown.as_ref(),
        "deny_cache_entries" => raw.deny_cache_entries.as_ref(),
        "topology" => raw.topology.as_ref(),
        _ => None,
    }
}

fn refuse_other_kind(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: &raw::Store,
    keys: &[&str],
    other: &str,
) {
    // The two keys that are no scalars belong to Redis only.
    let written = |key: &str| match key {
        "nodes" => raw.nodes.is_some(),
        "sentinel" => raw.sentinel.is_some(),
        _ => store_key(raw, key).is_some(),
    };
    let redis_mappings = ["nodes", "sentinel"];
    let also: &[&str] = if other == "redis" {
        &redis_mappings
    } else {
        &[]
    };
    for key in keys.iter().chain(also) {
        if written(key) {
            cx.error(
                &path.key(key),
                At::Key,
                format!("`{key}` applies only to `kind: {other}`"),
            );
        }
    }
}

fn memory(cx: &mut Checker<'_>, path: &KeyPath, raw: &raw::Store) -> Option<MemoryStore> {
    // Unwritten: derived at start from the memory limit sluice runs under
    // (`store::memory_bound`).
    let max_entries = match raw.max_entries.as_ref() {
        None => None,
        Some(raw) => Some(cx.value(
            &path.key("max_entries"),
            raw,
            check::number(1, u64::from(u32::MAX)),
        )?),
    };
    Some(MemoryStore {
        max_entries: max_entries.and_then(|n| usize::try_from(n).ok()),
    })
}

fn redis(cx: &mut Checker<'_>, path: &KeyPath, raw: &raw::Store) -> Option<RedisStore> {
    let topology = topology(cx, path, raw);
    let pool_size = cx.defaulted(
        path,
        &keys::STORE_POOL_SIZE,
        raw.pool_size.as_ref(),
        check::number(1, 1024),
    );
    let ca_file = match &raw.ca_file {
        None => Some(None),
        Some(s) => cx.value(&path.key("ca_file"), s, file_path).map(Some),
    };
    if let (Some(topology), Some(Some(_))) = (&topology, &ca_file) {
        let urls: Vec<&Secret> = match topology {
            Topology::Standalone { url } => vec![url],
            Topology::Cluster { nodes } | Topology::Sentinel { nodes, .. } => {
                nodes.iter().collect()
            }
        };
        if !urls.iter().all(|u| u.expose().starts_with("rediss://")) {
            cx.error(
                &path.key("ca_file"),
                At::Key,
                "`ca_file` applies only to rediss:// (TLS) urls",
            );
        }
    }
    let key_prefix = cx.defaulted(
        path,
        &keys::STORE_KEY_PREFIX,
        raw.key_prefix.as_ref(),
        key_prefix,
    );
    let max_clock_regression = cx.defaulted(
        path,
        &keys::STORE_MAX_CLOCK_REGRESSION,
        raw.max_clock_regression.as_ref(),
        check::duration,
    );
    // A record must outlive every retry of its evaluation, and retries
    // come within the budget of the first attempt (checked against the
    // budget in `store`).
    let dedupe_window = cx.optional(
        &path.key("dedupe_window"),
        raw.dedupe_window.as_ref(),
        Duration::from_secs(1),
        check::positive_duration,
    );
    let dedupe_max = cx.defaulted(
        path,
        &keys::STORE_DEDUPE_MAX,
        raw.dedupe_max.as_ref(),
        check::number_u32(1),
    );
    // The breaker opens on a failure rate over a window, never on a
    // streak (`store::breaker`). `breaker_failures` once counted a streak;
    // it keeps its name and its plain meaning, failures needed to open,
    // so files that set it still load and never open the breaker on fewer.
    let breaker_failures = cx.defaulted(
        path,
        &keys::STORE_BREAKER_FAILURES,
        raw.breaker_failures.as_ref(),
        check::number_u32(1),
    );
    let breaker_window = cx.defaulted(
        path,
        &keys::STORE_BREAKER_WINDOW,
        raw.breaker_window.as_ref(),
        check::positive_duration,
    );
    // 10 calls at 50% is 5 failures, the default `breaker_failures`: a
    // quiet store opens the breaker after a handful of failures, about as
    // the old streak did, and a busy one is judged by the rate.
    let breaker_min_calls = cx.defaulted(
        path,
        &keys::STORE_BREAKER_MIN_CALLS,
        raw.breaker_min_calls.as_ref(),
        check::number_u32(1),
    );
    let breaker_failure_rate = cx.defaulted(
        path,
        &keys::STORE_BREAKER_FAILURE_RATE,
        raw.breaker_failure_rate.as_ref(),
        check::percent,
    );
    let breaker_cooldown = cx.defaulted(
        path,
        &keys::STORE_BREAKER_COOLDOWN,
        raw.breaker_cooldown.as_ref(),
        check::positive_duration,
    );
    let coalesce = cx.defaulted(
        path,
        &keys::STORE_COALESCE,
        raw.coalesce.as_ref(),
        check::on_off,
    );
    let deny_cache_entries = cx.defaulted(
        path,
        &keys::STORE_DENY_CACHE_ENTRIES,
        raw.deny_cache_entries.as_ref(),
        check::number_u32(0),
    );
    Some(RedisStore {
        deny_cache_entries: usize::try_from(deny_cache_entries?).ok()?,
        topology: topology?,
        pool_size: usize::try_from(pool_size?).ok()?,
        ca_file: ca_file?,
        key_prefix: key_prefix?,
        max_clock_regression: max_clock_regression?,
        dedupe_window: dedupe_window?,
        dedupe_max: dedupe_max?,
        breaker_failures: breaker_failures?,
        breaker_window: breaker_window?,
        breaker_min_calls: breaker_min_calls?,
        breaker_failure_rate: breaker_failure_rate?,
        breaker_cooldown: breaker_cooldown?,
        coalesce: coalesce?,
    })
}

/// `store.topology` and the keys that say where its nodes are: `url` for
/// standalone, `nodes` for cluster, `sentinel` for sentinel. A key of
/// another topology is an error, not silently unused.
fn topology(cx: &mut Checker<'_>, path: &KeyPath, raw: &raw::Store) -> Option<Topology> {
    let name = cx.defaulted(
        path,
        &keys::STORE_TOPOLOGY,
        raw.topology.as_ref(),
        |s| match s {
            "standalone" => Ok("standalone"),
            "cluster" => Ok("cluster"),
            "sentinel" => Ok("sentinel"),
            _ => Err(format!(
                "unknown topology `{s}`; expected standalone, cluster or sentinel"
            )),
        },
    )?;
    let foreign = [
        ("url", raw.url.is_some(), "standalone"),
        ("nodes", raw.nodes.is_some(), "cluster"),
        ("sentinel", raw.sentinel.is_some(), "sentinel"),
    ];
    for (key, written, belongs) in foreign {
        if written && belongs != name {
            cx.error(
                &path.key(key),
                At::Key,
                format!("`{key}` applies only to `topology: {belongs}` (this store is {name})"),
            );
        }
    }
    match name {
        "cluster" => {
            let nodes = redis_urls(cx, &path.key("nodes"), raw.nodes.clone())?;
            Some(Topology::Cluster { nodes })
        }
        "sentinel" => {
            let p = path.key("sentinel");
            let Some(sentinel) = &raw.sentinel else {
                cx.error(
                    &p,
                    At::Key,
                    "required with `topology: sentinel`: { master: NAME, nodes: [URL, ...] }",
                );
                return None;
            };
            let master = cx.required(&p.key("master"), sentinel.master.as_ref(), check::text);
            let nodes = redis_urls(cx, &p.key("nodes"), sentinel.nodes.clone());
            let username = match &sentinel.username {
                None => Some(None),
                Some(s) => cx.value(&p.key("username"), s, check::text).map(Some),
            };
            let password = match &sentinel.password {
                None => Some(None),
                Some(s) => cx
                    .value(&p.key("password"), s, |s| {
                        Ok::<_, String>(Secret(s.to_owned()))
                    })
                    .map(Some),
            };
            Some(Topology::Sentinel {
                master: master?,
                nodes: nodes?,
                username: username?,
                password: password?,
            })
        }
        _ => {
            let url = cx.required(&path.key("url"), raw.url.as_ref(), redis_url)?;
            Some(Topology::Standalone { url })
        }
    }
}

/// A required, non-empty list of `redis://` / `rediss://` URLs, all of one
/// scheme.
fn redis_urls(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<ScalarList>,
) -> Option<Vec<Secret>> {
    let items: Vec<(KeyPath, Scalar)> = match raw {
        None => {
            cx.error(
                path,
                At::Key,
                "required: a list of redis:// or rediss:// URLs",
            );
            return None;
        }
        Some(ScalarList::One(s)) => vec![(path.clone(), s)],
        Some(ScalarList::Many(v)) => v
            .into_iter()
            .enumerate()
            .map(|(i, s)| (path.index(i), s))
            .collect(),
    };
    if items.is_empty() {
        cx.error(path, At::Value, "needs at least one URL");
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (p, s) in &items {
        match cx.value(p, s, redis_url) {
            Some(url) => out.push(url),
            None => ok = false,
        }
    }
    if ok {
        let tls = out
            .iter()
            .filter(|u| u.expose().starts_with("rediss://"))
            .count();
        if tls != 0 && tls != out.len() {
            cx.error(
                path,
                At::Value,
                "mixes redis:// and rediss://; use one scheme for every node",
            );
            return None;
        }
    }
    ok.then_some(out)
}

/// The URL carries credentials: no message here repeats it.
fn redis_url(s: &str) -> Result<Secret, String> {
    let rest = s
        .strip_prefix("redis://")
        .or_else(|| s.strip_prefix("rediss://"))
        .ok_or("must start with redis:// or rediss://")?;
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    if host.is_empty() || host.starts_with('/') || host.starts_with(':') {
        return Err("has no host after redis:// or rediss://".to_owned());
    }
    Ok(Secret(s.to_owned()))
}

/// Letters, digits, `_`, `-`, `.`, `:`; never `{`/`}`, which would pick
/// a Redis Cluster hash slot for every key at once.
fn key_prefix(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 64 {
        return Err("must be 1 to 64 characters".to_owned());
    }
    if let Some(bad) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':')))
    {
        return Err(format!(
            "`{s}` contains `{bad}`; use letters, digits, `_`, `-`, `.` and `:`"
        ));
    }
    Ok(s.to_owned())
}
