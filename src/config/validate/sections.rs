//! The plain sections: server, upstream, store, identity, responses.

use std::net::{IpAddr, SocketAddr};
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::time::Duration;

use http::Uri;
use ipnet::IpNet;

use crate::path::{EscapedSlashes, PathParameters, PathRules};

use super::check::{self, Checker};
use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, Scalar, ScalarList};
use crate::config::{
    Http2, Identity, MemoryStore, MinUploadRate, OnFailure, ProxyProtocol, RedisStore, Responses,
    Secret, ServerBoot, ServerLive, StoreBoot, StoreKind, StoreLive, Tls, Topology, Underscores,
    UpstreamBoot, UpstreamLive,
};

pub fn server(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Server,
) -> Option<(ServerBoot, ServerLive)> {
    let listen = cx.required(&path.key("listen"), raw.listen.as_ref(), socket_addr);
    let admin = match &raw.admin {
        None => Some(None),
        Some(s) => cx.value(&path.key("admin"), s, socket_addr).map(Some),
    };
    if let (Some(listen), Some(Some(admin))) = (listen, admin) {
        if listen == admin && listen.port() != 0 {
            cx.error(&path.key("admin"), At::Value, "must differ from `listen`");
        }
    }
    let tls = match raw.tls {
        None => Some(None),
        Some(tls) => {
            let p = path.key("tls");
            let cert = cx.required(&p.key("cert"), tls.cert.as_ref(), file_path);
            let key = cx.required(&p.key("key"), tls.key.as_ref(), file_path);
            match (cert, key) {
                (Some(cert), Some(key)) => Some(Some(Tls { cert, key })),
                _ => None,
            }
        }
    };
    let shutdown_delay = cx.optional(
        &path.key("shutdown_delay"),
        raw.shutdown_delay.as_ref(),
        Duration::from_secs(5),
        check::duration,
    );
    let shutdown_grace = cx.optional(
        &path.key("shutdown_grace"),
        raw.shutdown_grace.as_ref(),
        Duration::from_secs(20),
        check::duration,
    );
    let header_read_timeout = cx.optional(
        &path.key("header_read_timeout"),
        raw.header_read_timeout.as_ref(),
        Duration::from_secs(10),
        check::positive_duration,
    );
    let body_idle_timeout = cx.optional(
        &path.key("body_idle_timeout"),
        raw.body_idle_timeout.as_ref(),
        Duration::from_secs(30),
        check::positive_duration,
    );
    let min_upload_rate = min_upload_rate(
        cx,
        &path.key("min_upload_rate"),
        raw.min_upload_rate.as_ref(),
    );
    // hyper refuses an HTTP/1 read buffer below 8 KiB.
    let max_header_bytes = cx.optional(
        &path.key("max_header_bytes"),
        raw.max_header_bytes.as_ref(),
        65_536,
        check::number(8_192, 16 * 1024 * 1024),
    );
    let workers = cx.optional(
        &path.key("workers"),
        raw.workers.as_ref(),
        0,
        check::number(0, 1024),
    );
    // nginx closes idle keep-alive connections after 75 s, HTTP/2 ones
    // included; a sidecar's clients are close by.
    let idle_timeout = cx.optional(
        &path.key("idle_timeout"),
        raw.idle_timeout.as_ref(),
        Duration::from_secs(60),
        check::positive_duration,
    );
    // nginx's send_timeout default.
    let send_timeout = cx.optional(
        &path.key("send_timeout"),
        raw.send_timeout.as_ref(),
        Duration::from_secs(60),
        check::positive_duration,
    );
    // nginx's worker_connections default; a sidecar fronts one app.
    let max_connections = cx.optional(
        &path.key("max_connections"),
        raw.max_connections.as_ref(),
        10_000,
        check::number(1, 1_000_000),
    );
    // A quarter of the pool by default: one address can no longer refuse
    // everyone, and a client behind a shared NAT (or a proxy that is not
    // trusted) still gets many connections.
    let per_ip_default = max_connections.map_or(1, |n| (n / 4).max(1));
    let ceiling = max_connections.unwrap_or(1_000_000);
    let max_connections_per_ip = cx.optional(
        &path.key("max_connections_per_ip"),
        raw.max_connections_per_ip.as_ref(),
        per_ip_default,
        |s| {
            check::number(1, 1_000_000)(s).and_then(|n| {
                if n > ceiling {
                    Err(format!("{n} is above max_connections ({ceiling})"))
                } else {
                    Ok(n)
                }
            })
        },
    );
    let http2 = http2(cx, &path.key("http2"), raw.http2.unwrap_or_default());
    let proxy_protocol = proxy_protocol(cx, &path.key("proxy_protocol"), raw.proxy_protocol);
    let paths = match raw.paths {
        None => Some(PathRules::default()),
        Some(raw) => paths(cx, &path.key("paths"), raw),
    };
    let underscores = cx.optional(
        &path.key("headers_with_underscores"),
        raw.headers_with_underscores.as_ref(),
        Underscores::Drop,
        |s| match s {
            "drop" => Ok(Underscores::Drop),
            "reject" => Ok(Underscores::Reject),
            "allow" => Ok(Underscores::Allow),
            _ => Err(format!(
                "unknown value `{s}`; expected drop, reject or allow"
            )),
        },
    );
    let explain_token = match raw.explain {
        None => Some(None),
        Some(explain) => cx
            .required(
                &path.key("explain").key("token"),
                explain.token.as_ref(),
                explain_token,
            )
            .map(Some),
    };
    let boot = ServerBoot {
        listen: listen?,
        admin: admin?,
        tls: tls?,
        shutdown_delay: shutdown_delay?,
        shutdown_grace: shutdown_grace?,
        header_read_timeout: header_read_timeout?,
        max_header_bytes: usize::try_from(max_header_bytes?).ok()?,
        workers: usize::try_from(workers?).ok()?,
        idle_timeout: idle_timeout?,
        send_timeout: send_timeout?,
        max_connections: usize::try_from(max_connections?).ok()?,
        max_connections_per_ip: usize::try_from(max_connections_per_ip?).ok()?,
        http2: http2?,
        proxy_protocol: proxy_protocol?,
    };
    let live = ServerLive {
        body_idle_timeout: body_idle_timeout?,
        min_upload_rate: min_upload_rate?,
        paths: paths?,
        underscores: underscores?,
        explain_token: explain_token?,
    };
    Some((boot, live))
}

/// `server.proxy_protocol`: `v1`, `v2`, or a list of them.
fn proxy_protocol(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<ScalarList>,
) -> Option<ProxyProtocol> {
    let items = list_items(path, raw);
    let mut versions = ProxyProtocol::default();
    let mut ok = true;
    for (p, s) in &items {
        let version = cx.value(p, s, |s| match s {
            "v1" => Ok(1),
            "v2" => Ok(2),
            _ => Err(format!("unknown version `{s}`; expected v1 or v2")),
        });
        let seen = match version {
            Some(1) => std::mem::replace(&mut versions.v1, true),
            Some(_) => std::mem::replace(&mut versions.v2, true),
            None => {
                ok = false;
                continue;
            }
        };
        if seen {
            cx.error(p, At::Value, "is listed twice");
            ok = false;
        }
    }
    ok.then_some(versions)
}

/// A list's items with their paths; one value stands for a list of one.
fn list_items(path: &KeyPath, raw: Option<ScalarList>) -> Vec<(KeyPath, Scalar)> {
    match raw {
        None => Vec::new(),
        Some(ScalarList::One(s)) => vec![(path.clone(), s)],
        Some(ScalarList::Many(v)) => v
            .into_iter()
            .enumerate()
            .map(|(i, s)| (path.index(i), s))
            .collect(),
    }
}

/// Kestrel's `MinRequestBodyDataRate` default: 240 bytes a second, far
/// below any working network, after 5 s.
const MIN_UPLOAD_RATE: MinUploadRate = MinUploadRate {
    bytes_per_second: NonZeroU32::new(240).expect("not zero"),
    grace: Duration::from_secs(5),
};

/// `server.min_upload_rate`: `off` (or `0`), a rate in bytes a second
/// with the default grace, or `{ bytes_per_second, grace }`, each
/// defaulted. A grace under a second would judge a body by its first
/// moments, before TCP has opened its window (Kestrel refuses one too).
fn min_upload_rate(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<&raw::MinUploadRate>,
) -> Option<Option<MinUploadRate>> {
    let rate = |s: &str| {
        if s.trim() == "off" {
            return Ok(None);
        }
        let n = check::number_u32(0)(s)
            .map_err(|e| format!("{e}; write `off` or a number of bytes per second"))?;
        Ok(NonZeroU32::new(n))
    };
    match raw {
        None => Some(Some(MIN_UPLOAD_RATE)),
        Some(raw::MinUploadRate::One(s)) => cx.value(path, s, rate).map(|bytes_per_second| {
            bytes_per_second.map(|bytes_per_second| MinUploadRate {
                bytes_per_second,
                ..MIN_UPLOAD_RATE
            })
        }),
        Some(raw::MinUploadRate::Table(table)) => {
            let bytes_per_second = cx.optional(
                &path.key("bytes_per_second"),
                table.bytes_per_second.as_ref(),
                Some(MIN_UPLOAD_RATE.bytes_per_second),
                rate,
            );
            let grace = cx.optional(
                &path.key("grace"),
                table.grace.as_ref(),
                MIN_UPLOAD_RATE.grace,
                |s| {
                    let d = check::duration(s)?;
                    if d < Duration::from_secs(1) {
                        return Err(format!("`{s}` is shorter than the minimum of 1s"));
                    }
                    Ok(d)
                },
            );
            let (bytes_per_second, grace) = (bytes_per_second?, grace?);
            Some(bytes_per_second.map(|bytes_per_second| MinUploadRate {
                bytes_per_second,
                grace,
            }))
        }
    }
}

/// `server.http2`: nginx's `http2_max_concurrent_streams` (128) and h2's
/// own reset bounds (20 pending, 1024 local), written down so they are
/// known and can be changed.
fn http2(cx: &mut Checker<'_>, path: &KeyPath, raw: raw::Http2) -> Option<Http2> {
    let streams = cx.optional(
        &path.key("max_concurrent_streams"),
        raw.max_concurrent_streams.as_ref(),
        128,
        check::number(1, u64::from(u32::MAX)),
    );
    let pending = cx.optional(
        &path.key("max_pending_accept_reset_streams"),
        raw.max_pending_accept_reset_streams.as_ref(),
        20,
        check::number(1, 1_000_000),
    );
    let local = cx.optional(
        &path.key("max_local_error_reset_streams"),
        raw.max_local_error_reset_streams.as_ref(),
        1024,
        check::number(1, 1_000_000),
    );
    Some(Http2 {
        max_concurrent_streams: u32::try_from(streams?).ok()?,
        max_pending_accept_reset_streams: usize::try_from(pending?).ok()?,
        max_local_error_reset_streams: usize::try_from(local?).ok()?,
    })
}

/// `server.paths`: each default is the safe choice (see [`crate::path`]).
fn paths(cx: &mut Checker<'_>, path: &KeyPath, raw: raw::Paths) -> Option<PathRules> {
    let defaults = PathRules::default();
    let merge_slashes = cx.optional(
        &path.key("merge_slashes"),
        raw.merge_slashes.as_ref(),
        defaults.merge_slashes,
        check::boolean,
    );
    let escaped_slashes = cx.optional(
        &path.key("escaped_slashes"),
        raw.escaped_slashes.as_ref(),
        defaults.escaped_slashes,
        |s| match s {
            "reject" => Ok(EscapedSlashes::Reject),
            "keep" => Ok(EscapedSlashes::Keep),
            "decode" => Ok(EscapedSlashes::Decode),
            _ => Err(format!(
                "unknown value `{s}`; expected reject, keep or decode"
            )),
        },
    );
    let path_parameters = cx.optional(
        &path.key("path_parameters"),
        raw.path_parameters.as_ref(),
        defaults.path_parameters,
        |s| match s {
            "ignore" => Ok(PathParameters::Ignore),
            "strip" => Ok(PathParameters::Strip),
            "reject" => Ok(PathParameters::Reject),
            _ => Err(format!(
                "unknown value `{s}`; expected ignore, strip or reject"
            )),
        },
    );
    Some(PathRules {
        merge_slashes: merge_slashes?,
        escaped_slashes: escaped_slashes?,
        path_parameters: path_parameters?,
    })
}

/// Anyone who holds it can read whether a given key or address is active:
/// as long as a pseudonym key, and never printed.
fn explain_token(s: &str) -> Result<Secret, String> {
    if s.len() < 16 {
        return Err(format!(
            "must be at least 16 bytes long (it is {}); generate one with `openssl rand -hex 32`",
            s.len()
        ));
    }
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("may hold only visible ASCII characters (it is sent in a header)".to_owned());
    }
    Ok(Secret(s.to_owned()))
}

fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("`{s}` is not an address; write IP:PORT such as 0.0.0.0:8080 or [::]:8080")
    })
}

fn file_path(s: &str) -> Result<PathBuf, String> {
    check::text(s).map(PathBuf::from)
}

pub fn upstream(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Upstream,
) -> Option<(UpstreamBoot, UpstreamLive)> {
    let url = cx.required(&path.key("url"), raw.url.as_ref(), upstream_url);
    let connect_timeout = cx.optional(
        &path.key("connect_timeout"),
        raw.connect_timeout.as_ref(),
        Duration::from_secs(1),
        check::positive_duration,
    );
    let timeout = cx.optional(
        &path.key("timeout"),
        raw.timeout.as_ref(),
        Duration::from_secs(60),
        check::positive_duration,
    );
    let boot = UpstreamBoot {
        connect_timeout: connect_timeout?,
    };
    let live = UpstreamLive {
        url: url?,
        timeout: timeout?,
    };
    Some((boot, live))
}

/// `http://host[:port][/base]`, normalised to an explicit port and a base
/// path without a trailing slash (`/` when there is none), so the forwarder
/// only ever appends the request path.
pub fn upstream_url(s: &str) -> Result<Uri, String> {
    let uri: Uri = s
        .parse()
        .map_err(|_| format!("`{s}` is not a URL; write http://host:port"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(format!(
                "scheme `{other}` is not supported; the upstream is spoken to in plain http://"
            ))
        }
        None => return Err(format!("`{s}` has no scheme; write http://{s}")),
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("`{s}` has no host"))?;
    if authority.as_str().contains('@') {
        return Err("must not contain credentials (user@)".to_owned());
    }
    if authority.host().is_empty() {
        return Err(format!("`{s}` has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("`{s}` must not have a query (`?...`)"));
    }
    let port = authority.port_u16().unwrap_or(80);
    let base = uri.path().trim_end_matches('/');
    let base = if base.is_empty() { "/" } else { base };
    format!("http://{}:{port}{base}", authority.host())
        .parse()
        .map_err(|_| format!("`{s}` is not a URL; write http://host:port"))
}

/// Which store the file asks for; `None` when `kind` is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Redis,
}

const MEMORY_ONLY: [&str; 1] = ["max_entries"];
const REDIS_ONLY: [&str; 14] = [
    "url",
    "topology",
    "pool_size",
    "ca_file",
    "key_prefix",
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
    cx.optional(
        &path.key("kind"),
        raw.kind.as_ref(),
        Kind::Memory,
        |s| match s {
            "memory" => Ok(Kind::Memory),
            "redis" => Ok(Kind::Redis),
            _ => Err(format!(
                "unknown store kind `{s}`; expected memory or redis"
            )),
        },
    )
}

pub fn store(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Store,
    kind: Option<Kind>,
) -> Option<(StoreBoot, StoreLive)> {
    let budget = cx.optional(
        &path.key("budget"),
        raw.budget.as_ref(),
        Duration::from_millis(25),
        check::positive_duration,
    );
    let on_failure = cx.optional(
        &path.key("on_failure"),
        raw.on_failure.as_ref(),
        OnFailure::Deny,
        on_failure,
    );
    // Whether anything uses it is only known once the policies are read
    // (`validate::local_fallback`).
    let local_share = cx.optional(
        &path.key("local_share"),
        raw.local_share.as_ref(),
        NonZeroU32::MIN,
        check::positive,
    );
    let failure_retry_after = cx.optional(
        &path.key("failure_retry_after"),
        raw.failure_retry_after.as_ref(),
        Duration::from_secs(1),
        check::positive_duration,
    );
    let ttl_grace = cx.optional(
        &path.key("ttl_grace"),
        raw.ttl_grace.as_ref(),
        Duration::from_secs(5),
        check::duration,
    );
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
    };
    let live = StoreLive {
        budget: budget?,
        on_failure: on_failure?,
        local_share: local_share?,
        failure_retry_after: failure_retry_after?,
    };
    Some((boot, live))
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
    let pool_size = cx.optional(
        &path.key("pool_size"),
        raw.pool_size.as_ref(),
        16,
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
    let key_prefix = cx.optional(
        &path.key("key_prefix"),
        raw.key_prefix.as_ref(),
        "sluice".to_owned(),
        key_prefix,
    );
    let max_clock_regression = cx.optional(
        &path.key("max_clock_regression"),
        raw.max_clock_regression.as_ref(),
        Duration::from_secs(1),
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
    let dedupe_max = cx.optional(
        &path.key("dedupe_max"),
        raw.dedupe_max.as_ref(),
        256,
        check::number_u32(1),
    );
    // The breaker opens on a failure rate over a window, never on a
    // streak (`store::breaker`). `breaker_failures` once counted a streak;
    // it keeps its name and its plain meaning, failures needed to open,
    // so files that set it still load and never open the breaker on fewer.
    let breaker_failures = cx.optional(
        &path.key("breaker_failures"),
        raw.breaker_failures.as_ref(),
        5,
        check::number_u32(1),
    );
    let breaker_window = cx.optional(
        &path.key("breaker_window"),
        raw.breaker_window.as_ref(),
        Duration::from_secs(10),
        check::positive_duration,
    );
    // 10 calls at 50% is 5 failures, the default `breaker_failures`: a
    // quiet store opens the breaker after a handful of failures, about as
    // the old streak did, and a busy one is judged by the rate.
    let breaker_min_calls = cx.optional(
        &path.key("breaker_min_calls"),
        raw.breaker_min_calls.as_ref(),
        10,
        check::number_u32(1),
    );
    let breaker_failure_rate = cx.optional(
        &path.key("breaker_failure_rate"),
        raw.breaker_failure_rate.as_ref(),
        50,
        check::percent,
    );
    let breaker_cooldown = cx.optional(
        &path.key("breaker_cooldown"),
        raw.breaker_cooldown.as_ref(),
        Duration::from_secs(1),
        check::positive_duration,
    );
    let deny_cache_entries = cx.optional(
        &path.key("deny_cache_entries"),
        raw.deny_cache_entries.as_ref(),
        100_000,
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
    })
}

/// `store.topology` and the keys that say where its nodes are: `url` for
/// standalone, `nodes` for cluster, `sentinel` for sentinel. A key of
/// another topology is an error, not silently unused.
fn topology(cx: &mut Checker<'_>, path: &KeyPath, raw: &raw::Store) -> Option<Topology> {
    let name = cx.optional(
        &path.key("topology"),
        raw.topology.as_ref(),
        "standalone",
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

pub fn identity(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Identity,
    kind: Option<Kind>,
) -> Option<Identity> {
    let trusted_proxies = trusted_proxies(cx, &path.key("trusted_proxies"), raw.trusted_proxies);
    let ipv6_prefix = cx.optional(
        &path.key("ipv6_prefix"),
        raw.ipv6_prefix.as_ref(),
        64,
        check::number(1, 128),
    );
    let pseudonym_key = match &raw.pseudonym_key {
        None => {
            if kind == Some(Kind::Redis) {
                cx.error(
                    &path.key("pseudonym_key"),
                    At::Key,
                    "required with `store.kind: redis`: every replica must derive the same pseudonyms",
                );
                None
            } else {
                Some(None)
            }
        }
        Some(s) => cx
            .value(&path.key("pseudonym_key"), s, pseudonym_key)
            .map(Some),
    };
    let pseudonym_key_version = cx.optional(
        &path.key("pseudonym_key_version"),
        raw.pseudonym_key_version.as_ref(),
        1,
        check::number_u32(1),
    );
    Some(Identity {
        trusted_proxies: trusted_proxies?,
        ipv6_prefix: u8::try_from(ipv6_prefix?).ok()?,
        pseudonym_key: pseudonym_key?,
        pseudonym_key_version: pseudonym_key_version?,
    })
}

/// A secret: never repeated in a message.
fn pseudonym_key(s: &str) -> Result<Secret, String> {
    if s.len() < 16 {
        return Err(format!(
            "must be at least 16 bytes long (it is {})",
            s.len()
        ));
    }
    Ok(Secret(s.to_owned()))
}

fn trusted_proxies(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<ScalarList>,
) -> Option<Vec<IpNet>> {
    let items = list_items(path, raw);
    let mut nets = Vec::with_capacity(items.len());
    let mut ok = true;
    for (p, s) in &items {
        match cx.value(p, s, network) {
            Some(net) => nets.push(net),
            None => ok = false,
        }
    }
    ok.then_some(nets)
}

/// A CIDR (`10.0.0.0/8`) or a bare address (one host).
fn network(s: &str) -> Result<IpNet, String> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(IpNet::from(ip));
    }
    let net: IpNet = s
        .parse()
        .map_err(|_| format!("`{s}` is neither an IP address nor a CIDR such as 10.0.0.0/8"))?;
    if net.trunc() != net {
        return Err(format!(
            "`{s}` has host bits set; did you mean {}?",
            net.trunc()
        ));
    }
    Ok(net)
}

pub fn responses(cx: &mut Checker<'_>, path: &KeyPath, raw: raw::Responses) -> Option<Responses> {
    let on_allowed = cx.optional(
        &path.key("ratelimit_headers_on_allowed"),
        raw.ratelimit_headers_on_allowed.as_ref(),
        true,
        check::boolean,
    )?;
    Some(Responses {
        ratelimit_headers_on_allowed: on_allowed,
    })
}
