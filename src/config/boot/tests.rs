//! Each key of the boot part, changed alone, is named; a change to the
//! live part names nothing.

use std::path::Path;

use crate::config::Config;

/// Every key written out, at its default, so one line can be changed.
const REDIS: &str = "version: 1
server:
  listen: 127.0.0.1:8080
  admin: 127.0.0.1:9901
  shutdown_delay: 5s
  shutdown_grace: 20s
  header_read_timeout: 10s
  body_idle_timeout: 30s
  min_upload_rate: { bytes_per_second: 240, grace: 5s }
  max_header_bytes: 65536
  workers: 0
  idle_timeout: 60s
  send_timeout: 60s
  max_connections: 10000
  max_connections_per_ip: 10
  http2: { max_concurrent_streams: 128 }
  proxy_protocol: [v2]
  paths: { merge_slashes: true }
upstream:
  url: http://127.0.0.1:3000
  connect_timeout: 1s
  timeout: 60s
store:
  kind: redis
  url: rediss://user:first-password@127.0.0.1:6379
  budget: 25ms
  on_failure: deny
  failure_retry_after: 1s
  ttl_grace: 5s
  pool_size: 16
  key_prefix: sluice
  max_clock_regression: 1s
  dedupe_window: 1s
  dedupe_max: 256
  breaker_failures: 5
  breaker_window: 10s
  breaker_min_calls: 10
  breaker_failure_rate: 50%
  breaker_cooldown: 1s
  deny_cache_entries: 100000
identity:
  trusted_proxies: [10.0.0.0/8]
  ipv6_prefix: 64
  pseudonym_key: 0123456789abcdef0123
  pseudonym_key_version: 1
responses:
  ratelimit_headers_on_allowed: true
policies:
  p: { algorithm: fixed-window, limit: 5, window: 1s }
routes:
  - { name: r, match: { path_prefix: /api }, policy: p }
default: { policy: none }
";

fn parse(text: &str) -> Config {
    match Config::parse(Path::new("lifetimes.yaml"), text) {
        Ok(config) => config,
        Err(errors) => panic!("{errors}\n{text}"),
    }
}

/// The boot keys `base` with `from` replaced by `to` changes.
fn changes(base: &str, from: &str, to: &str) -> Vec<&'static str> {
    assert!(base.contains(from), "`{from}` is not in the base file");
    let next = base.replacen(from, to, 1);
    parse(base).boot.changes(&parse(&next).boot)
}

fn memory() -> String {
    REDIS
        .replace("  kind: redis\n", "  kind: memory\n  max_entries: 1000\n")
        .lines()
        .filter(|l| {
            ![
                "  url: rediss:",
                "  pool_size",
                "  key_prefix",
                "  max_clock_regression",
                "  dedupe_",
                "  breaker_",
                "  deny_cache_entries",
            ]
            .iter()
            .any(|k| l.starts_with(k))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

#[test]
fn each_boot_key_changed_alone_is_named() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "listen: 127.0.0.1:8080",
            "listen: 127.0.0.1:8081",
            "server.listen",
        ),
        (
            "admin: 127.0.0.1:9901",
            "admin: 127.0.0.1:9902",
            "server.admin",
        ),
        (
            "  admin: 127.0.0.1:9901\n",
            "  admin: 127.0.0.1:9901\n  tls: { cert: c.pem, key: k.pem }\n",
            "server.tls",
        ),
        (
            "shutdown_delay: 5s",
            "shutdown_delay: 0s",
            "server.shutdown_delay",
        ),
        (
            "shutdown_grace: 20s",
            "shutdown_grace: 5s",
            "server.shutdown_grace",
        ),
        (
            "header_read_timeout: 10s",
            "header_read_timeout: 3s",
            "server.header_read_timeout",
        ),
        (
            "max_header_bytes: 65536",
            "max_header_bytes: 16384",
            "server.max_header_bytes",
        ),
        ("workers: 0", "workers: 2", "server.workers"),
        (
            "idle_timeout: 60s",
            "idle_timeout: 61s",
            "server.idle_timeout",
        ),
        (
            "send_timeout: 60s",
            "send_timeout: 5s",
            "server.send_timeout",
        ),
        (
            "max_connections: 10000",
            "max_connections: 20",
            "server.max_connections",
        ),
        (
            "max_connections_per_ip: 10",
            "max_connections_per_ip: 9",
            "server.max_connections_per_ip",
        ),
        (
            "max_concurrent_streams: 128",
            "max_concurrent_streams: 64",
            "server.http2",
        ),
        (
            "proxy_protocol: [v2]",
            "proxy_protocol: [v1, v2]",
            "server.proxy_protocol",
        ),
        (
            "connect_timeout: 1s",
            "connect_timeout: 2s",
            "upstream.connect_timeout",
        ),
        ("ttl_grace: 5s", "ttl_grace: 9s", "store.ttl_grace"),
        // A changed password is a change; its value is never named.
        ("first-password", "second-password", "store.url"),
        ("pool_size: 16", "pool_size: 4", "store.pool_size"),
        (
            "  url: rediss://user:first-password@127.0.0.1:6379\n",
            "  url: rediss://user:first-password@127.0.0.1:6379\n  ca_file: ca.pem\n",
            "store.ca_file",
        ),
        (
            "key_prefix: sluice",
            "key_prefix: other",
            "store.key_prefix",
        ),
        (
            "max_clock_regression: 1s",
            "max_clock_regression: 2s",
            "store.max_clock_regression",
        ),
        (
            "dedupe_window: 1s",
            "dedupe_window: 2s",
            "store.dedupe_window",
        ),
        ("dedupe_max: 256", "dedupe_max: 128", "store.dedupe_max"),
        (
            "breaker_failures: 5",
            "breaker_failures: 6",
            "store.breaker_failures",
        ),
        (
            "breaker_window: 10s",
            "breaker_window: 20s",
            "store.breaker_window",
        ),
        (
            "breaker_min_calls: 10",
            "breaker_min_calls: 30",
            "store.breaker_min_calls",
        ),
        (
            "breaker_failure_rate: 50%",
            "breaker_failure_rate: 60%",
            "store.breaker_failure_rate",
        ),
        (
            "breaker_cooldown: 1s",
            "breaker_cooldown: 2s",
            "store.breaker_cooldown",
        ),
        (
            "deny_cache_entries: 100000",
            "deny_cache_entries: 0",
            "store.deny_cache_entries",
        ),
        (
            "  url: rediss://user:first-password@127.0.0.1:6379\n",
            "  topology: cluster\n  nodes: [rediss://user:first-password@127.0.0.1:6379]\n",
            "store.topology",
        ),
    ];
    for (from, to, key) in cases {
        let named = changes(REDIS, from, to);
        assert_eq!(named, [*key], "{from} -> {to}");
        assert!(
            named.iter().all(|k| !k.contains("password")),
            "a secret is named: {named:?}"
        );
    }
}

#[test]
fn the_memory_stores_size_and_the_store_kind_are_boot_keys() {
    assert_eq!(
        changes(&memory(), "max_entries: 1000", "max_entries: 10"),
        ["store.max_entries"]
    );
    // Another kind is named once, not key by key.
    assert_eq!(
        changes(
            &memory(),
            "  kind: memory\n  max_entries: 1000\n",
            "  kind: redis\n  url: redis://127.0.0.1:6379\n",
        ),
        ["store.kind"]
    );
}

#[test]
fn cluster_and_sentinel_connections_are_boot_keys() {
    let cluster = REDIS.replace(
        "  url: rediss://user:first-password@127.0.0.1:6379\n",
        "  topology: cluster\n  nodes: [redis://a:7000, redis://b:7000]\n",
    );
    assert_eq!(
        changes(&cluster, "redis://b:7000", "redis://c:7000"),
        ["store.nodes"]
    );

    let sentinel = REDIS.replace(
        "  url: rediss://user:first-password@127.0.0.1:6379\n",
        "  topology: sentinel\n  sentinel:\n    master: main\n    nodes: [redis://s:26379]\n    username: u\n    password: first-password\n",
    );
    for (from, to, key) in [
        ("master: main", "master: other", "store.sentinel.master"),
        ("redis://s:26379", "redis://t:26379", "store.sentinel.nodes"),
        ("username: u", "username: v", "store.sentinel.username"),
        (
            "password: first-password",
            "password: second-password",
            "store.sentinel.password",
        ),
    ] {
        assert_eq!(changes(&sentinel, from, to), [key], "{from} -> {to}");
    }
}

#[test]
fn several_boot_changes_are_all_named_in_file_order() {
    let next = REDIS
        .replace("listen: 127.0.0.1:8080", "listen: 127.0.0.1:8081")
        .replace("header_read_timeout: 10s", "header_read_timeout: 3s")
        .replace("ttl_grace: 5s", "ttl_grace: 9s");
    assert_eq!(
        parse(REDIS).boot.changes(&parse(&next).boot),
        [
            "server.listen",
            "server.header_read_timeout",
            "store.ttl_grace"
        ]
    );
}

#[test]
fn a_change_to_the_live_part_names_nothing() {
    let cases: &[(&str, &str)] = &[
        ("body_idle_timeout: 30s", "body_idle_timeout: 5s"),
        (
            "bytes_per_second: 240, grace: 5s",
            "bytes_per_second: 1000, grace: 1s",
        ),
        (
            "min_upload_rate: { bytes_per_second: 240, grace: 5s }",
            "min_upload_rate: off",
        ),
        ("merge_slashes: true", "merge_slashes: false"),
        (
            "url: http://127.0.0.1:3000",
            "url: http://127.0.0.1:3001/v2",
        ),
        ("  timeout: 60s", "  timeout: 5s"),
        ("budget: 25ms", "budget: 50ms"),
        ("on_failure: deny", "on_failure: allow"),
        ("failure_retry_after: 1s", "failure_retry_after: 3s"),
        (
            "trusted_proxies: [10.0.0.0/8]",
            "trusted_proxies: [10.0.0.0/8, 192.168.0.0/16]",
        ),
        ("ipv6_prefix: 64", "ipv6_prefix: 56"),
        (
            "pseudonym_key: 0123456789abcdef0123",
            "pseudonym_key: fedcba9876543210fedc",
        ),
        ("pseudonym_key_version: 1", "pseudonym_key_version: 2"),
        (
            "ratelimit_headers_on_allowed: true",
            "ratelimit_headers_on_allowed: false",
        ),
        ("limit: 5", "limit: 9"),
        ("path_prefix: /api", "path_prefix: /v2"),
        ("default: { policy: none }", "default: { policy: p }"),
    ];
    let base = parse(REDIS);
    for (from, to) in cases {
        assert!(REDIS.contains(from), "`{from}` is not in the base file");
        let next = parse(&REDIS.replacen(from, to, 1));
        assert_eq!(next.boot, base.boot, "{from} -> {to}");
        assert!(base.boot.changes(&next.boot).is_empty(), "{from} -> {to}");
    }
}
