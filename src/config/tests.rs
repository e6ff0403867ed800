//! The whole loader, from YAML text to a `Config` or to every error in it.
//!
//! Error fixtures live in `tests/fixtures/config/`, one per class of
//! mistake; `tests/it/config_check.rs` runs the same files through the binary.

use std::env::VarError;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

use super::*;
use crate::limit::{Bands, BucketBand, GcraBand, LimitPolicy, WindowBand};
use crate::route::{PathMatch, Segment, SubjectSource};

const PSEUDONYM_KEY: &str = "0123456789abcdef0123456789abcdef";

fn env(name: &str) -> Result<String, VarError> {
    match name {
        "REDIS_URL" => Ok("redis://:hunter2@redis.internal:6379/0".to_owned()),
        "SLUICE_PSEUDONYM_KEY" => Ok(PSEUDONYM_KEY.to_owned()),
        "POOL" => Ok("32".to_owned()),
        _ => Err(VarError::NotPresent),
    }
}

fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(name)
}

fn load(path: &Path) -> Result<Config, ConfigErrors> {
    let text = std::fs::read_to_string(path).expect("fixture is readable");
    Config::parse_with_env(path, &text, &env)
}

fn fixture_errors(name: &str) -> (PathBuf, Vec<String>) {
    let path = fixture_path(name);
    match load(&path) {
        Ok(_) => panic!("{name} should be refused"),
        Err(errors) => (path, errors.iter().map(|e| e.to_string()).collect()),
    }
}

/// The fixture fails with exactly one error, at `line:col` on `key`, whose
/// message contains `says`.
fn assert_single(name: &str, line: usize, col: usize, key: &str, says: &str) {
    let (path, errors) = fixture_errors(name);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    let prefix = format!("{}:{line}:{col}: {key}: ", path.display());
    assert!(errors[0].starts_with(&prefix), "{} !~ {prefix}", errors[0]);
    assert!(errors[0].contains(name), "{}", errors[0]);
    assert!(errors[0].contains(says), "{} !~ {says}", errors[0]);
}

/// A valid file with a memory store, to which a test appends.
const BASE: &str = "\
version: 1
server:
  listen: 127.0.0.1:8080
upstream:
  url: http://127.0.0.1:3000
";

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse_with_env(Path::new("test.yaml"), text, &env)
}

fn parse_ok(text: &str) -> Config {
    match parse(text) {
        Ok(c) => c,
        Err(e) => panic!("should parse:\n{e}"),
    }
}

fn parse_err(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("should be refused:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

fn policy<'c>(c: &'c Config, name: &str) -> &'c crate::limit::Policy {
    c.live
        .policies
        .iter()
        .find(|p| &*p.name == name)
        .unwrap_or_else(|| panic!("policy {name}"))
}

#[test]
fn the_product_example_parses_into_domain_values() {
    let c = load(&fixture_path("product.yaml")).unwrap_or_else(|e| panic!("{e}"));

    let addr = |s: &str| s.parse::<SocketAddr>().expect("address");
    assert_eq!(c.boot.server.listen, addr("0.0.0.0:8080"));
    assert_eq!(c.boot.server.admin, Some(addr("0.0.0.0:9901")));
    let tls = c.boot.server.tls.as_ref().expect("tls");
    assert_eq!(tls.cert, PathBuf::from("/etc/sluice/tls.crt"));
    assert_eq!(tls.key, PathBuf::from("/etc/sluice/tls.key"));
    assert_eq!(c.boot.server.shutdown_grace, Duration::from_secs(20));
    assert_eq!(c.boot.server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(c.live.server.body_idle_timeout, Duration::from_secs(30));
    assert_eq!(c.boot.server.send_timeout, Duration::from_secs(60));
    assert_eq!(c.boot.server.max_header_bytes, 32_768);
    assert_eq!(c.boot.server.workers, 0);

    assert_eq!(c.live.upstream.url.to_string(), "http://127.0.0.1:3000/");
    assert_eq!(c.boot.upstream.connect_timeout, Duration::from_secs(1));
    assert_eq!(c.live.upstream.timeout, Duration::from_secs(60));

    assert_eq!(c.live.store.budget, Duration::from_millis(25));
    assert_eq!(c.live.store.on_failure, OnFailure::Deny);
    assert_eq!(c.live.store.failure_retry_after, Duration::from_secs(1));
    assert_eq!(c.boot.store.ttl_grace, Duration::from_secs(5));
    let StoreKind::Redis(redis) = &c.boot.store.kind else {
        panic!("redis store expected, got {:?}", c.boot.store.kind)
    };
    assert!(matches!(
        &redis.topology,
        Topology::Standalone { url } if url.expose() == "redis://:hunter2@redis.internal:6379/0"
    ));
    assert_eq!(redis.pool_size, 16);
    assert_eq!(redis.ca_file, None);
    assert_eq!(redis.key_prefix, "sluice");
    assert_eq!(redis.max_clock_regression, Duration::from_secs(1));
    assert_eq!(redis.dedupe_window, Duration::from_secs(1));
    assert_eq!(redis.dedupe_max, 256);
    assert_eq!(redis.breaker_failures, 5);
    assert_eq!(redis.breaker_window, Duration::from_secs(10));
    assert_eq!(redis.breaker_min_calls, 10);
    assert_eq!(redis.breaker_failure_rate, 50);
    assert_eq!(redis.breaker_cooldown, Duration::from_secs(1));
    assert!(
        !format!("{c:?}").contains("hunter2"),
        "Debug shows a secret"
    );

    assert_eq!(
        c.live.identity.trusted_proxies,
        vec!["10.0.0.0/8".parse::<IpNet>().expect("net")]
    );
    assert_eq!(c.live.identity.ipv6_prefix, 64);
    assert_eq!(
        c.live.identity.pseudonym_key.as_ref().map(Secret::expose),
        Some(PSEUDONYM_KEY)
    );
    assert_eq!(c.live.identity.pseudonym_key_version, 1);
    assert!(c.live.responses.ratelimit_headers_on_allowed);

    let names: Vec<&str> = c.live.policies.iter().map(|p| &*p.name).collect();
    // The rate policies: `in_flight` counts requests in flight, in no store.
    assert_eq!(
        names,
        ["api", "login", "search", "upload", "export", "app_cap"]
    );
    let window = |limit, secs| WindowBand {
        limit: nz(limit),
        window: Duration::from_secs(secs),
    };
    assert_eq!(
        *policy(&c, "api").bands(),
        Bands::SlidingCounter(vec![window(100, 60)])
    );
    assert_eq!(
        *policy(&c, "login").bands(),
        Bands::TokenBucket(vec![BucketBand {
            capacity: nz(5),
            refill_tokens: nz(1),
            refill_every: Duration::from_secs(10),
            max_wait_us: 0,
        }])
    );
    assert_eq!(
        *policy(&c, "search").bands(),
        Bands::SlidingLog(vec![window(20, 10)])
    );
    assert_eq!(
        *policy(&c, "upload").bands(),
        Bands::Gcra(vec![GcraBand {
            limit: nz(60),
            window: Duration::from_secs(60),
            burst: nz(10),
            max_wait_us: 0,
        }])
    );
    assert_eq!(
        *policy(&c, "export").bands(),
        Bands::FixedWindow(vec![window(10, 1), window(1000, 3600)])
    );
    assert!(policy(&c, "export").shadow);
    assert!(!policy(&c, "api").shadow);
    for p in &c.live.policies {
        assert_eq!(p.revision.len(), 12, "{}", p.revision);
        assert!(p
            .revision
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
    }

    let route_names: Vec<&str> = c.live.routes.iter().map(|r| &*r.name).collect();
    assert_eq!(route_names, ["login", "api", "health", "signup"]);
    let login = &c.live.routes[0];
    assert_eq!(login.matcher.methods, vec![http::Method::POST]);
    assert!(matches!(&login.matcher.path, PathMatch::Exact(p) if p == "/login"));
    assert_eq!(login.limits.len(), 1, "policy + subject is one limit");
    assert_eq!(login.limits[0].subject, vec![SubjectSource::ClientIp]);
    assert_eq!(&**login.limits[0].policy.name(), "login");
    assert_eq!(login.limits[0].cost, 1);
    let api = &c.live.routes[1];
    assert!(api.matcher.methods.is_empty());
    assert!(matches!(&api.matcher.path, PathMatch::Prefix(p) if p == "/api"));
    assert_eq!(
        api.limits[0].subject,
        vec![
            SubjectSource::Header(http::HeaderName::from_static("x-api-key")),
            SubjectSource::ClientIp
        ]
    );
    assert!(c.live.routes[2].limits.is_empty(), "policy: none");
    assert_eq!(&*c.live.default.name, "default");
    assert_eq!(&**c.live.default.limits[0].policy.name(), "api");
    assert_eq!(
        c.live.default.limits[0].subject,
        vec![SubjectSource::ClientIp]
    );
    assert!(matches!(c.live.default.matcher.path, PathMatch::Any));
}

#[test]
fn an_unknown_key_is_refused_where_it_is_written() {
    assert_single(
        "unknown_key.yaml",
        4,
        3,
        "server.shutdown_grase",
        "unknown key `shutdown_grase`",
    );
}

#[test]
fn a_route_naming_a_missing_policy_lists_the_known_ones() {
    assert_single(
        "missing_policy.yaml",
        17,
        13,
        "routes[1].policy",
        "unknown policy `login`; defined: api, or `none`",
    );
}

#[test]
fn an_unset_variable_is_named_and_comments_are_not_substituted() {
    assert_single(
        "unset_variable.yaml",
        9,
        8,
        "store.url",
        "environment variable `SLUICE_FIXTURE_REDIS_URL` is not set",
    );
}

#[test]
fn a_min_upload_rate_grace_under_a_second_is_refused() {
    assert_single(
        "bad_min_upload_rate.yaml",
        7,
        12,
        "server.min_upload_rate.grace",
        "`500ms` is shorter than the minimum of 1s",
    );
}

#[test]
fn min_upload_rate_is_off_a_rate_or_both_parts() {
    let rate = |value: &str| {
        let text = BASE.replace(
            "  listen: 127.0.0.1:8080\n",
            &format!("  listen: 127.0.0.1:8080\n  min_upload_rate: {value}\n"),
        );
        parse_ok(&text).live.server.min_upload_rate
    };
    let of = |bytes: u32, grace: u64| {
        Some(MinUploadRate {
            bytes_per_second: nz(bytes),
            grace: Duration::from_secs(grace),
        })
    };
    assert_eq!(rate("off"), None);
    assert_eq!(rate("0"), None);
    assert_eq!(rate("{ bytes_per_second: 0, grace: 9s }"), None);
    assert_eq!(rate("1000"), of(1000, 5));
    assert_eq!(rate("{ bytes_per_second: 1000, grace: 1s }"), of(1000, 1));
    assert_eq!(rate("{ grace: 10s }"), of(240, 10));
    assert_eq!(rate("{}"), of(240, 5));
}

#[test]
fn a_bad_min_upload_rate_is_named_where_it_is_written() {
    let errors = |value: &str| {
        parse_err(&BASE.replace(
            "  listen: 127.0.0.1:8080\n",
            &format!("  listen: 127.0.0.1:8080\n  min_upload_rate: {value}\n"),
        ))
    };
    assert_eq!(
        errors("fast"),
        ["test.yaml:4:20: server.min_upload_rate: `fast` is not a whole number; write `off` or a number of bytes per second"]
    );
    assert_eq!(
        errors("{ bytes_per_second: -5 }"),
        ["test.yaml:4:40: server.min_upload_rate.bytes_per_second: must be at least 0, not -5; write `off` or a number of bytes per second"]
    );
    assert_eq!(
        errors("{ bytes_per_second: 240, grace: 5 }"),
        ["test.yaml:4:52: server.min_upload_rate.grace: `5` has no unit; write a duration such as `5s` or `5ms`"]
    );
    let unknown = errors("{ rate: 240 }");
    assert_eq!(unknown.len(), 1, "{unknown:?}");
    assert!(
        unknown[0].starts_with("test.yaml:4:22: server.min_upload_rate.rate: unknown key `rate`"),
        "{unknown:?}"
    );
}

#[test]
fn a_bad_duration_is_refused() {
    assert_single(
        "bad_duration.yaml",
        7,
        12,
        "upstream.timeout",
        "`60x` is not a duration",
    );
}

#[test]
fn a_policy_needs_at_least_one_band() {
    assert_single(
        "empty_bands.yaml",
        9,
        12,
        "policies.export.bands",
        "needs at least one band",
    );
}

#[test]
fn a_zero_limit_is_refused_in_its_band() {
    assert_single(
        "zero_limit.yaml",
        11,
        18,
        "policies.export.bands[1].limit",
        "must be at least 1",
    );
}

#[test]
fn a_cost_above_the_policy_maximum_names_the_maximum() {
    assert_single(
        "cost_above_maximum.yaml",
        15,
        11,
        "routes[0].cost",
        "cost 6 is above the maximum 5 of policy `login`",
    );
}

#[test]
fn a_parameter_of_another_algorithm_is_refused() {
    assert_single(
        "foreign_parameter.yaml",
        11,
        5,
        "policies.api.capacity",
        "`capacity` is not a parameter of fixed-window; it takes limit, window",
    );
}

#[test]
fn a_redis_key_under_the_memory_store_is_named() {
    assert_single(
        "store_kind_mismatch.yaml",
        8,
        3,
        "store.pool_size",
        "`pool_size` applies only to `kind: redis`",
    );
}

#[test]
fn redis_requires_a_shared_pseudonym_key() {
    // Missing keys point at the mapping that should hold them.
    assert_single(
        "redis_without_pseudonym_key.yaml",
        10,
        3,
        "identity.pseudonym_key",
        "required with `store.kind: redis`",
    );
}

#[test]
fn route_names_are_unique() {
    assert_single(
        "duplicate_route.yaml",
        10,
        11,
        "routes[1].name",
        "route name `health` is already used by routes[0]",
    );
}

#[test]
fn a_yaml_syntax_error_has_a_position() {
    let (path, errors) = fixture_errors("yaml_syntax.yaml");
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].starts_with(&format!("{}:4:", path.display())),
        "{}",
        errors[0]
    );
}

#[test]
fn every_error_in_a_file_is_reported_at_once_in_file_order() {
    let (path, errors) = fixture_errors("several_errors.yaml");
    let expected = [
        (
            4,
            3,
            "server.listen_backlog",
            "unknown key `listen_backlog`",
        ),
        (
            6,
            8,
            "upstream.url",
            "`SLUICE_FIXTURE_UPSTREAM_URL` is not set",
        ),
        (8, 11, "store.budget", "`25` has no unit"),
        (16, 12, "policies.export.bands", "needs at least one band"),
        (
            21,
            11,
            "routes[0].cost",
            "above the maximum 100 of policy `api`",
        ),
        (24, 13, "routes[1].policy", "unknown policy `login`"),
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    for (got, (line, col, key, says)) in errors.iter().zip(expected) {
        let prefix = format!("{}:{line}:{col}: {key}: ", path.display());
        assert!(got.starts_with(&prefix), "{got} !~ {prefix}");
        assert!(got.contains(says), "{got} !~ {says}");
    }
}

#[test]
fn errors_display_one_per_line() {
    let errors =
        parse(&format!("{BASE}bogus: 1\nstore: {{ kind: disk }}\n")).expect_err("two errors");
    let text = errors.to_string();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "test.yaml:6:1: bogus: unknown key `bogus`, expected one of version, server, \
             upstream, store, identity, responses, policies, routes, default",
            "test.yaml:7:16: store.kind: unknown store kind `disk`; expected memory or redis",
        ]
    );
    let io = ConfigError::io(
        Path::new("/nope.yaml"),
        &std::io::Error::from(std::io::ErrorKind::NotFound),
    );
    assert!(io
        .to_string()
        .starts_with("/nope.yaml: cannot read the configuration: "));
}

fn with_policy(params: &str) -> String {
    format!("{BASE}policies:\n  p:\n{params}")
}

fn revision(params: &str) -> String {
    policy(&parse_ok(&with_policy(params)), "p")
        .revision
        .to_string()
}

#[test]
fn derived_revisions_follow_the_parameters_not_shadow() {
    let base = revision("    algorithm: fixed-window\n    limit: 10\n    window: 1s\n");
    let other_window = revision("    algorithm: fixed-window\n    limit: 10\n    window: 2s\n");
    let other_algorithm = revision("    algorithm: sliding-log\n    limit: 10\n    window: 1s\n");
    let shadowed =
        revision("    algorithm: fixed-window\n    limit: 10\n    window: 1s\n    shadow: true\n");
    let as_band =
        revision("    algorithm: fixed-window\n    bands: [{ limit: 10, window: 1000ms }]\n");
    let two_bands = revision(
        "    algorithm: fixed-window\n    bands: [{ limit: 10, window: 1s }, { limit: 100, window: 1m }]\n",
    );
    let swapped = revision(
        "    algorithm: fixed-window\n    bands: [{ limit: 100, window: 1m }, { limit: 10, window: 1s }]\n",
    );
    assert_ne!(base, other_window);
    assert_ne!(base, other_algorithm);
    assert_ne!(base, two_bands);
    assert_ne!(
        two_bands, swapped,
        "each band keeps its own count, in order"
    );
    assert_eq!(base, shadowed);
    assert_eq!(
        base, as_band,
        "one flat band and one listed band are the same policy"
    );

    // Writing a default out changes nothing.
    let gcra = revision("    algorithm: gcra\n    limit: 6\n    window: 1m\n");
    let gcra_burst = revision("    algorithm: gcra\n    limit: 6\n    window: 1m\n    burst: 6\n");
    assert_eq!(gcra, gcra_burst);
}

/// Each parameter of each algorithm, changed alone, starts the counts
/// afresh exactly when the algorithm names it in `RESET_BY`: a limit
/// raised mid-incident keeps every subject's count.
#[test]
fn a_changed_number_keeps_the_revision_unless_it_changes_what_the_state_means() {
    use crate::limit::algorithm::Algorithm;
    /// A parameter, its value, and the value it is changed to.
    type Change = (&'static str, &'static str, &'static str);
    let cases: &[(&str, &[Change])] = &[
        (
            "fixed-window",
            &[("limit", "10", "50"), ("window", "1m", "2m")],
        ),
        (
            "sliding-counter",
            &[("limit", "10", "50"), ("window", "1m", "2m")],
        ),
        (
            "sliding-log",
            &[("limit", "10", "50"), ("window", "1m", "2m")],
        ),
        (
            "token-bucket",
            &[
                ("capacity", "10", "50"),
                ("refill_tokens", "1", "5"),
                ("refill_every", "1s", "2s"),
            ],
        ),
        (
            "gcra",
            &[
                ("limit", "10", "50"),
                ("window", "1m", "2m"),
                ("burst", "10", "3"),
            ],
        ),
    ];
    assert_eq!(
        cases.len(),
        Algorithm::ALL.len(),
        "an algorithm is not covered"
    );
    for &(name, params) in cases {
        let algorithm = *Algorithm::ALL
            .iter()
            .find(|a| a.name() == name)
            .unwrap_or_else(|| panic!("no algorithm {name}"));
        let written = |changed: Option<&str>| {
            let mut text = format!("    algorithm: {name}\n");
            for &(key, before, after) in params {
                let value = if changed == Some(key) { after } else { before };
                text += &format!("    {key}: {value}\n");
            }
            revision(&text)
        };
        let base = written(None);
        let mut covered: Vec<&str> = Vec::new();
        for &(key, _, _) in params {
            covered.push(key);
            let resets = algorithm.reset_by().contains(&key);
            assert_eq!(
                written(Some(key)) != base,
                resets,
                "{name}: changing {key} {} the counts",
                if resets { "must reset" } else { "must keep" }
            );
        }
        let mut parameters: Vec<&str> = algorithm.parameters().to_vec();
        parameters.sort_unstable();
        covered.sort_unstable();
        assert_eq!(covered, parameters, "{name}: a parameter is not covered");
    }
}

#[test]
fn an_explicit_revision_wins() {
    let r =
        revision("    algorithm: fixed-window\n    limit: 10\n    window: 1s\n    revision: v7\n");
    assert_eq!(r, "v7");
    let errors = parse_err(&with_policy(
        "    algorithm: fixed-window\n    limit: 10\n    window: 1s\n    revision: \"{a}\"\n",
    ));
    assert!(
        errors[0].contains("policies.p.revision: `{a}` contains `{`"),
        "{errors:?}"
    );
}

#[test]
fn omitted_keys_take_their_documented_defaults() {
    let c = parse_ok(BASE);
    assert_eq!(c.boot.server.admin, None);
    assert!(c.boot.server.tls.is_none());
    assert_eq!(c.boot.server.shutdown_grace, Duration::from_secs(20));
    assert_eq!(c.boot.server.shutdown_delay, Duration::from_secs(5));
    assert_eq!(c.boot.server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(c.live.server.body_idle_timeout, Duration::from_secs(30));
    assert_eq!(
        c.live.server.min_upload_rate,
        Some(MinUploadRate {
            bytes_per_second: nz(240),
            grace: Duration::from_secs(5)
        })
    );
    assert_eq!(c.boot.server.send_timeout, Duration::from_secs(60));
    assert_eq!(c.boot.server.max_header_bytes, 32_768);
    assert_eq!(c.boot.server.workers, 0);
    assert_eq!(
        c.boot.server.request_heads,
        RequestHeads {
            per_connection: 2 << 20,
            per_client: 4 << 20,
            total: 16 << 20,
        }
    );
    let StoreKind::Memory(memory) = &c.boot.store.kind else {
        panic!("memory store is the default")
    };
    assert_eq!(
        memory.max_entries, None,
        "derived at start when not written"
    );
    assert_eq!(c.live.store.budget, Duration::from_millis(25));
    assert_eq!(c.live.store.on_failure, OnFailure::Deny);
    assert!(c.live.identity.trusted_proxies.is_empty());
    assert_eq!(c.live.identity.ipv6_prefix, 64);
    assert!(c.live.identity.pseudonym_key.is_none());
    assert_eq!(c.live.identity.pseudonym_key_version, 1);
    assert!(c.live.responses.ratelimit_headers_on_allowed);
    assert!(c.live.policies.is_empty() && c.live.routes.is_empty());
    // No `default:`: unmatched requests are forwarded unlimited.
    assert!(c.live.default.limits.is_empty());
}

#[test]
fn request_head_budgets_nest_and_a_client_budget_follows_the_total() {
    let base =
        "version: 1\nserver: { listen: 127.0.0.1:0, max_header_bytes: 16384, request_heads: ";
    let load = |heads: &str| {
        parse(&format!(
            "{base}{heads} }}\nupstream: {{ url: http://127.0.0.1:1 }}\n"
        ))
    };
    let c = load("{ per_connection: 100000, total: 1000000 }").expect("valid");
    assert_eq!(c.boot.server.request_heads.per_client, 250_000);
    let c = load("{ per_connection: 600000, total: 1000000 }").expect("valid");
    assert_eq!(
        c.boot.server.request_heads.per_client, 600_000,
        "never below a connection's"
    );
    for (heads, message) in [
        (
            "{ per_connection: 8192 }",
            "server.request_heads.per_connection: 8192 is below server.max_header_bytes (16384)",
        ),
        (
            "{ per_connection: 65536, per_client: 32768 }",
            "server.request_heads.per_client: 32768 is below per_connection (65536)",
        ),
        (
            "{ per_connection: 20000, per_client: 200000, total: 100000 }",
            "server.request_heads.total: 100000 is below per_client (200000)",
        ),
        ("{ totl: 1 }", "totl"),
    ] {
        let errors = load(heads).expect_err(heads).to_string();
        assert!(errors.contains(message), "{heads}: {errors}");
    }
}

#[test]
fn required_keys_are_reported_at_their_parent() {
    let errors = parse_err("version: 1\nserver:\n  admin: 127.0.0.1:9901\n");
    assert_eq!(
        errors,
        [
            "test.yaml:1:1: upstream.url: required key is missing",
            "test.yaml:3:3: server.listen: required key is missing",
        ]
    );
    let errors = parse_err("server: {}\n");
    assert!(errors
        .iter()
        .any(|e| e.contains("version: required key is missing")));
    let errors = parse_err(&BASE.replace("version: 1", "version: 2"));
    assert_eq!(
        errors,
        ["test.yaml:1:10: version: unsupported version 2; this sluice reads `version: 1`"]
    );
    assert_eq!(
        parse_err(""),
        ["test.yaml:1:1: the file is empty; start with `version: 1`"]
    );
}

#[test]
fn paths_compile_into_matchers() {
    let c = parse_ok(&format!(
        "{BASE}routes:
  - {{ name: a, match: {{ path: \"/users/{{id}}/posts\" }}, policy: none }}
  - {{ name: b, match: {{ path_prefix: /static/ }}, policy: none }}
  - {{ name: c, match: {{ path_prefix: / }}, policy: none }}
  - {{ name: d, match: {{ methods: [get, Post] }}, policy: none }}
"
    ));
    let PathMatch::Template(segments) = &c.live.routes[0].matcher.path else {
        panic!("template expected")
    };
    assert_eq!(
        segments,
        &[
            Segment::Literal("users".into()),
            Segment::Param("id".into()),
            Segment::Literal("posts".into())
        ]
    );
    assert!(matches!(&c.live.routes[1].matcher.path, PathMatch::Prefix(p) if p == "/static"));
    assert!(matches!(&c.live.routes[2].matcher.path, PathMatch::Prefix(p) if p == "/"));
    assert_eq!(
        c.live.routes[3].matcher.methods,
        [http::Method::GET, http::Method::POST]
    );
    assert!(matches!(c.live.routes[3].matcher.path, PathMatch::Any));
}

#[test]
fn bad_matchers_are_refused() {
    let errors = parse_err(&format!(
        "{BASE}routes:
  - {{ name: a, match: {{ path: /a, path_prefix: /b }}, policy: none }}
  - {{ name: b, match: {{ path: login }}, policy: none }}
  - {{ name: c, match: {{ path: \"/u/x{{id}}\" }}, policy: none }}
  - {{ name: d, match: {{ methods: [\"GE T\"] }}, policy: none }}
  - {{ name: default, policy: none }}
"
    ));
    let expected = [
        "routes[0].match.path_prefix: `path` and `path_prefix` exclude each other",
        "routes[1].match.path: `login` must start with `/`",
        "routes[2].match.path: `x{id}` in `/u/x{id}`: a `{name}` parameter must be a whole segment",
        "routes[3].match.methods[0]: `GE T` is not an HTTP method",
        "routes[4].name: `default` is reserved",
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    for (got, want) in errors.iter().zip(expected) {
        assert!(got.contains(want), "{got} !~ {want}");
    }
}

#[test]
fn subjects_are_a_value_or_a_list() {
    let c = parse_ok(&format!(
        "{BASE}policies: {{ p: {{ algorithm: fixed-window, limit: 1, window: 1s }} }}\nroutes:\n  - {{ name: a, subject: header:X-Tenant, policy: p }}\n"
    ));
    assert_eq!(
        c.live.routes[0].limits[0].subject,
        [SubjectSource::Header(http::HeaderName::from_static(
            "x-tenant"
        ))]
    );
    let errors = parse_err(&format!(
        "{BASE}routes:\n  - {{ name: a, subject: [client_ip, \"header:bad name\", ip], policy: none }}\n  - {{ name: b, subject: [], policy: none }}\n"
    ));
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(errors[0].contains("routes[0].subject[1]: `bad name` is not a valid header name"));
    assert!(errors[1].contains("routes[0].subject[2]: unknown subject `ip`"));
    assert!(errors[2].contains("routes[1].subject: needs at least one subject"));
}

const LIMITS_POLICIES: &str = "policies:
  login: { algorithm: token-bucket, capacity: 5, refill_tokens: 1, refill_every: 10s }
  app_cap: { algorithm: fixed-window, limit: 100, window: 1m }
  in_flight: { algorithm: concurrency, limit: 40 }
";

#[test]
fn a_route_may_list_several_limits_each_with_its_subject() {
    let c = parse_ok(&format!(
        "{BASE}{LIMITS_POLICIES}routes:
  - name: signup
    match: {{ methods: [POST], path: /signup }}
    limits:
      - {{ policy: login, subject: client_ip }}
      - {{ policy: app_cap, subject: global, cost: 2 }}
      - {{ policy: in_flight, subject: global }}
default:
  limits: [{{ policy: app_cap, subject: [header:X-API-Key, client_ip] }}]
"
    ));
    let signup = &c.live.routes[0];
    let names: Vec<&str> = signup.limits.iter().map(|l| &**l.policy.name()).collect();
    assert_eq!(names, ["login", "app_cap", "in_flight"]);
    assert_eq!(signup.limits[0].subject, [SubjectSource::ClientIp]);
    assert_eq!(signup.limits[1].subject, [SubjectSource::Global]);
    assert_eq!(signup.limits[1].cost, 2);
    match &signup.limits[2].policy {
        LimitPolicy::Concurrency(c) => {
            assert_eq!(c.limit, nz(40));
            assert_eq!(c.retry_after, Duration::from_secs(1), "the default");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(c.live.default.limits.len(), 1);
    // Stores see the rate policies only.
    let rates: Vec<&str> = c.live.policies.iter().map(|p| &*p.name).collect();
    assert_eq!(rates, ["login", "app_cap"]);
}

#[test]
fn limits_errors_name_their_key_path() {
    let errors = parse_err(&format!(
        "{BASE}{LIMITS_POLICIES}routes:
  - name: both
    policy: login
    subject: client_ip
    limits: [{{ policy: app_cap }}]
  - name: empty
    limits: []
  - name: bad
    limits:
      - {{ policy: login, subject: [global, client_ip] }}
      - {{ policy: none }}
      - {{ policy: login }}
      - {{ policy: in_flight, cost: 2 }}
      - {{ policy: missing }}
      - {{ policy: app_cap, subjct: global }}
"
    ));
    let expected = [
        "routes[0].policy: `policy` is written beside `limits`",
        "routes[0].subject: `subject` is written beside `limits`",
        "routes[1].limits: needs at least one limit",
        "routes[2].limits[5].subjct: unknown key `subjct`",
    ];
    for want in expected {
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "{want} not in {errors:#?}"
        );
    }
    let errors = parse_err(&format!(
        "{BASE}{LIMITS_POLICIES}routes:
  - name: bad
    limits:
      - {{ policy: login, subject: [global, client_ip] }}
      - {{ policy: none }}
      - {{ policy: login }}
      - {{ policy: in_flight, cost: 2 }}
      - {{ policy: missing }}
"
    ));
    let expected = [
        "routes[0].limits[0].subject[0]: `global` is the route's one bucket",
        "routes[0].limits[1].policy: `none` is not a limit",
        "routes[0].limits[2].policy: policy `login` is already routes[0].limits[0]",
        "routes[0].limits[3].cost: `cost` does not apply to concurrency policy `in_flight`",
        "routes[0].limits[4].policy: unknown policy `missing`",
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    for (got, want) in errors.iter().zip(expected) {
        assert!(got.contains(want), "{got} !~ {want}");
    }
}

#[test]
fn a_concurrency_policy_takes_a_limit_and_a_retry_after_only() {
    let c = parse_ok(&format!(
        "{BASE}policies:\n  busy: {{ algorithm: concurrency, limit: 4, retry_after: 250ms }}\nroutes:\n  - {{ name: a, policy: busy }}\n"
    ));
    match &c.live.routes[0].limits[0].policy {
        LimitPolicy::Concurrency(p) => {
            assert_eq!(p.limit, nz(4));
            assert_eq!(p.retry_after, Duration::from_millis(250));
        }
        other => panic!("{other:?}"),
    }
    assert!(c.live.policies.is_empty());
    let errors = parse_err(&format!(
        "{BASE}policies:
  busy: {{ algorithm: concurrency, limit: 0, window: 1s, shadow: true }}
  none_given: {{ algorithm: concurrency }}
  rate: {{ algorithm: fixed-window, limit: 1, window: 1s, retry_after: 1s }}
"
    ));
    let expected = [
        "policies.busy.window: `window` is not a parameter of concurrency",
        "policies.busy.shadow: `shadow` is not a parameter of concurrency",
        "policies.busy.limit: ",
        "policies.none_given.limit: required key is missing",
        "policies.rate.retry_after: `retry_after` is a parameter of concurrency only",
    ];
    for want in expected {
        assert!(
            errors.iter().any(|e| e.contains(want)),
            "{want} not in {errors:#?}"
        );
    }
}

#[test]
fn the_upstream_url_is_normalised() {
    let url = |u: &str| {
        parse(&BASE.replace("http://127.0.0.1:3000", u)).map(|c| c.live.upstream.url.to_string())
    };
    assert_eq!(url("http://app").ok().as_deref(), Some("http://app:80/"));
    assert_eq!(
        url("http://app:3000/base/").ok().as_deref(),
        Some("http://app:3000/base")
    );
    assert_eq!(
        url("http://[::1]:3000").ok().as_deref(),
        Some("http://[::1]:3000/")
    );
    for bad in [
        "https://app:443",
        "http://app:3000/?x=1",
        "app:3000",
        "http://u:p@app:1",
    ] {
        assert!(url(bad).is_err(), "{bad} accepted");
    }
}

#[test]
fn secrets_never_appear_in_messages() {
    let errors = parse_err(&format!(
        "{BASE}store:\n  kind: redis\n  url: http://:s3cr3t@redis:6379\nidentity:\n  pseudonym_key: tooshort-s3cr3t\n"
    ));
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors[0].contains("store.url: must start with redis:// or rediss://"));
    assert!(errors[1].contains("identity.pseudonym_key: must be at least 16 bytes"));
    assert!(errors.iter().all(|e| !e.contains("s3cr3t")), "{errors:#?}");
}

#[test]
fn variables_fill_any_scalar_and_dollar_dollar_escapes() {
    let c = parse_ok(&format!(
        "{BASE}store:
  kind: redis
  url: ${{REDIS_URL}}
  pool_size: ${{POOL}}
identity:
  pseudonym_key: \"$${{literal}}-$$-${{SLUICE_PSEUDONYM_KEY}}\"
"
    ));
    let StoreKind::Redis(redis) = &c.boot.store.kind else {
        panic!("redis")
    };
    assert_eq!(redis.pool_size, 32);
    assert_eq!(
        c.live.identity.pseudonym_key.as_ref().map(Secret::expose),
        Some(format!("${{literal}}-$$-{PSEUDONYM_KEY}").as_str())
    );
}

#[test]
fn policy_parameter_rules() {
    let errors = parse_err(&format!(
        "{BASE}policies:
  flat_and_bands:
    algorithm: fixed-window
    limit: 5
    bands: [{{ limit: 5, window: 1s }}]
  too_fine:
    algorithm: sliding-log
    limit: 5
    window: 1500us
  huge_counter:
    algorithm: sliding-counter
    limit: 4000000000
    window: 30d
  huge_bucket:
    algorithm: token-bucket
    capacity: 4000000000
    refill_every: 30d
  huge_gcra:
    algorithm: gcra
    limit: 1
    window: 300d
    burst: 4000000
  bucket:
    algorithm: token-bucket
    capacity: 5
    refill_every: 0s
  nope:
    algorithm: leaky-bucket
  none:
    algorithm: gcra
    limit: 1
    window: 1s
"
    ));
    let expected = [
        "policies.flat_and_bands.limit: `limit` is written beside `bands`",
        "policies.too_fine.window: `1500us` is not a whole number of milliseconds",
        "policies.huge_counter.limit: limit × window in milliseconds must stay below 2^53",
        "policies.huge_bucket.capacity: capacity × refill_every in microseconds must stay below 2^53",
        "policies.huge_gcra.burst: burst × window / limit in microseconds must stay below 2^53",
        "policies.bucket.refill_every: `0s` is shorter than the minimum of 1ms",
        "policies.nope.algorithm: unknown algorithm `leaky-bucket`; expected one of fixed-window, \
         sliding-counter, sliding-log, token-bucket, gcra",
        "policies.none: `none` is reserved",
    ];
    assert_eq!(errors.len(), expected.len(), "{errors:#?}");
    for (got, want) in errors.iter().zip(expected) {
        assert!(got.contains(want), "{got} !~ {want}");
    }
}

#[test]
fn a_route_on_an_invalid_policy_adds_no_second_error() {
    let errors = parse_err(&format!(
        "{BASE}policies:\n  p:\n    algorithm: fixed-window\n    limit: 0\n    window: 1s\nroutes:\n  - {{ name: a, policy: p, cost: 3 }}\n"
    ));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(errors[0].contains("policies.p.limit"));
}

#[test]
fn trusted_proxies_take_networks_and_addresses() {
    let c = parse_ok(&format!(
        "{BASE}identity:\n  trusted_proxies: [10.0.0.0/8, 192.168.1.7, \"fd00::/8\"]\n"
    ));
    let nets: Vec<String> = c
        .live
        .identity
        .trusted_proxies
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(nets, ["10.0.0.0/8", "192.168.1.7/32", "fd00::/8"]);
    let errors = parse_err(&format!(
        "{BASE}identity:\n  trusted_proxies: [10.0.0.1/8, proxy]\n  ipv6_prefix: 129\n"
    ));
    assert_eq!(errors.len(), 3, "{errors:#?}");
    assert!(errors[0]
        .contains("trusted_proxies[0]: `10.0.0.1/8` has host bits set; did you mean 10.0.0.0/8?"));
    assert!(errors[1].contains("trusted_proxies[1]: `proxy` is neither"));
    assert!(errors[2].contains("identity.ipv6_prefix: must be at most 128, not 129"));
}

#[test]
fn proxy_protocol_lists_versions_read_only_from_trusted_proxies() {
    let trusted = "identity:\n  trusted_proxies: [10.0.0.0/8]\n";
    let c = parse_ok(&format!("{BASE}{trusted}"));
    assert!(!c.boot.server.proxy_protocol.any(), "off unless listed");
    let with = |versions: &str| {
        format!("{BASE}{trusted}").replace(
            "  listen: 127.0.0.1:8080\n",
            &format!("  listen: 127.0.0.1:8080\n  proxy_protocol: {versions}\n"),
        )
    };
    let both = parse_ok(&with("[v1, v2]")).boot.server.proxy_protocol;
    assert!(both.v1 && both.v2);
    let one = parse_ok(&with("v2")).boot.server.proxy_protocol;
    assert!(!one.v1 && one.v2);

    let errors = parse_err(&with("[v2, v3, v2]"));
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors[0].contains("server.proxy_protocol[1]: unknown version `v3`; expected v1 or v2"));
    assert!(errors[1].contains("server.proxy_protocol[2]: is listed twice"));
    // Nothing trusted: no peer's header would ever be read.
    let errors = parse_err(&with("[v1]").replace(trusted, ""));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("server.proxy_protocol: a PROXY protocol header is read only from `identity.trusted_proxies`, which is empty"),
        "{errors:#?}"
    );
}

#[test]
fn the_shipped_configs_pass_without_any_environment() {
    for name in ["config/example.yaml", "config/quickstart.yaml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(name);
        let text = std::fs::read_to_string(&path).expect("readable");
        let c = Config::parse_with_env(&path, &text, &|_| Err(VarError::NotPresent))
            .unwrap_or_else(|e| panic!("{e}"));
        let table = c.route_table();
        for route in c.live.routes.iter().chain([&c.live.default]) {
            assert!(table.contains(&*route.name), "{table}");
        }
    }
}

#[test]
fn the_route_table_shows_limits_per_band() {
    let c = load(&fixture_path("product.yaml")).unwrap_or_else(|e| panic!("{e}"));
    let table = c.route_table();
    let lines: Vec<&str> = table.lines().collect();
    // One line per limit (a route without limits takes one too).
    let limits: usize = c.live.routes.iter().map(|r| r.limits.len().max(1)).sum();
    assert_eq!(lines.len(), 1 + limits + 1, "{table}");
    assert!(lines[0].starts_with("ROUTE"));
    assert!(lines[1].starts_with("login "), "{table}");
    assert!(lines[1].contains("POST"));
    assert!(lines[1].contains("exact /login"));
    assert!(lines[1].contains("token-bucket 5 (+1/10s)"));
    assert!(lines[2].contains("header:x-api-key,client_ip"));
    assert!(lines[2].contains("sliding-counter 100/1m"));
    assert!(lines[3].contains("none") && lines[3].contains("unlimited"));
    assert!(lines[4].starts_with("signup "));
    assert!(
        lines[5].starts_with(' ') && lines[5].contains("global") && lines[5].contains("app_cap")
    );
    assert!(lines[6].contains("concurrency 40 in flight"));
    assert!(lines[7].starts_with("default "));
    // Columns are aligned: every row's POLICY cell starts at the same place.
    let col = lines[0].find("POLICY").expect("header");
    for line in &lines[1..] {
        assert_ne!(line.as_bytes()[col], b' ', "{line}");
        assert_eq!(&line[col - 2..col], "  ", "{line}");
    }

    let exported = parse_ok(&format!(
        "{BASE}policies:\n  export:\n    algorithm: fixed-window\n    bands: [{{limit: 10, window: 1s}}, {{limit: 1000, window: 1h}}]\n    shadow: true\nroutes:\n  - {{ name: export, policy: export, cost: 2 }}\n"
    ));
    let row = exported.route_table();
    let row = row.lines().nth(1).expect("row");
    assert!(row.contains("fixed-window 10/1s + 1000/1h"), "{row}");
    assert!(row.contains(" 2 ") && row.contains(" yes "), "{row}");
}

fn route_path(c: &Config, name: &str) -> PathMatch {
    let route = c
        .live
        .routes
        .iter()
        .find(|r| &*r.name == name)
        .expect("route");
    route.matcher.path.clone()
}

#[test]
fn route_paths_are_stored_in_the_form_requests_are_matched_in() {
    let c = parse_ok(&format!(
        "{BASE}routes:
  - {{ name: a, match: {{ path: /log%69n/ }}, policy: none }}
  - {{ name: b, match: {{ path_prefix: //api/./v1/ }}, policy: none }}
  - {{ name: c, match: {{ path: \"/Users/{{id}}/%70osts/\" }}, policy: none }}
  - {{ name: d, match: {{ path: \"/v1/x%3AbatchGet\" }}, policy: none }}
  - {{ name: e, match: {{ path: / }}, policy: none }}
"
    ));
    assert!(matches!(route_path(&c, "a"), PathMatch::Exact(p) if p == "/login"));
    assert!(matches!(route_path(&c, "b"), PathMatch::Prefix(p) if p == "/api/v1"));
    assert!(matches!(
        route_path(&c, "c"),
        PathMatch::Template(s) if s == [
            Segment::Literal("Users".into()),
            Segment::Param("id".into()),
            Segment::Literal("posts".into()),
        ]
    ));
    assert!(matches!(route_path(&c, "d"), PathMatch::Exact(p) if p == "/v1/x:batchGet"));
    assert!(matches!(route_path(&c, "e"), PathMatch::Exact(p) if p == "/"));
}

#[test]
fn route_paths_that_requests_could_never_take_are_refused() {
    for (path, says) in [
        ("/files%2Fprivate", "encoded slash"),
        ("/../admin", "above the root"),
        ("/login;jsessionid", "contains `;`"),
        ("/a%zz", "invalid percent-escape"),
        ("\"/users/{id}/..\"", "not a path segment"),
    ] {
        let errors = parse_err(&format!(
            "{BASE}routes:\n  - {{ name: r, match: {{ path: {path} }}, policy: none }}\n"
        ));
        assert_eq!(errors.len(), 1, "{path}: {errors:#?}");
        assert!(
            errors[0].contains("routes[0].match.path: "),
            "{}",
            errors[0]
        );
        assert!(errors[0].contains(says), "{path}: {} !~ {says}", errors[0]);
    }
}

#[test]
fn path_settings_case_and_upgrades_have_safe_defaults() {
    let c = parse_ok(&format!(
        "{BASE}routes:\n  - {{ name: r, match: {{ path: /x }}, policy: none }}\n"
    ));
    assert_eq!(c.live.server.paths, crate::path::PathRules::default());
    // Any case by default: Express, Koa and Nest route `/LOGIN` to `/login`.
    assert!(!c.live.routes[0].matcher.case_sensitive);
    assert!(!c.route_table().contains("(exact case)"));
    assert_eq!(&*c.live.routes[0].upgrades, [Box::from("websocket")]);
    assert_eq!(&*c.live.default.upgrades, [Box::from("websocket")]);

    let c = parse_ok(&format!(
        "{BASE}routes:\n  - {{ name: r, match: {{ path: /x, case_sensitive: true }}, policy: none, upgrades: [WebSocket, foo, foo] }}\n  - {{ name: s, match: {{ path: /y }}, policy: none, upgrades: [] }}\n"
    ));
    assert!(c.live.routes[0].matcher.case_sensitive);
    assert!(!c.live.routes[1].matcher.case_sensitive);
    assert_eq!(
        &*c.live.routes[0].upgrades,
        [Box::from("websocket"), Box::from("foo")]
    );
    assert!(c.live.routes[1].upgrades.is_empty());
    let table = c.route_table();
    assert!(table.contains("exact /x (exact case)"), "{table}");
    assert!(table.contains("exact /y "), "{table}");
    assert!(!table.contains("exact /y (exact case)"), "{table}");
    assert!(table.contains("websocket,foo"), "{table}");

    let errors = parse_err(&format!(
        "{BASE}routes:\n  - {{ name: r, policy: none, upgrades: [h2c, \"web socket\"] }}\n"
    ));
    assert_eq!(errors.len(), 2, "{errors:#?}");
    assert!(errors[0].contains("routes[0].upgrades[0]: h2c is never passed"));
    assert!(errors[1].contains("routes[0].upgrades[1]: `web socket` is not a protocol name"));
}

const REDIS_BASE: &str = "\
version: 1
server:
  listen: 127.0.0.1:8080
upstream:
  url: http://127.0.0.1:3000
identity:
  pseudonym_key: \"0123456789abcdef0123456789abcdef\"
store:
  kind: redis
";

fn topology(c: &Config) -> &Topology {
    match &c.boot.store.kind {
        StoreKind::Redis(redis) => &redis.topology,
        StoreKind::Memory(_) => panic!("a redis store"),
    }
}

#[test]
fn each_topology_reads_its_own_keys() {
    let c = parse_ok(&format!("{REDIS_BASE}  url: redis://r:6379\n"));
    assert!(
        matches!(topology(&c), Topology::Standalone { url } if url.expose() == "redis://r:6379")
    );

    let c = parse_ok(&format!(
        "{REDIS_BASE}  topology: cluster\n  nodes: [redis://a:7000, \"redis://u:p@b:7001\"]\n"
    ));
    let Topology::Cluster { nodes } = topology(&c) else {
        panic!("cluster")
    };
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[1].expose(), "redis://u:p@b:7001");

    let c = parse_ok(&format!(
        "{REDIS_BASE}  topology: sentinel\n  sentinel:\n    master: mymaster\n    nodes: [redis://s1:26379, redis://s2:26379]\n    username: sluice\n    password: ${{POOL}}\n"
    ));
    let Topology::Sentinel {
        master,
        nodes,
        username,
        password,
    } = topology(&c)
    else {
        panic!("sentinel")
    };
    assert_eq!(master, "mymaster");
    assert_eq!(nodes.len(), 2);
    assert_eq!(username.as_deref(), Some("sluice"));
    assert_eq!(password.as_ref().map(|p| p.expose()), Some("32"));
    // The password is a secret: Debug never shows it.
    assert!(!format!("{c:?}").contains("32\""), "{c:?}");
}

#[test]
fn a_topology_refuses_the_keys_of_another_and_needs_its_own() {
    for (store, key, says) in [
        (
            "  topology: cluster\n  url: redis://r:6379\n  nodes: [redis://a:7000]\n",
            "store.url",
            "applies only to `topology: standalone`",
        ),
        ("  topology: cluster\n", "store.nodes", "required"),
        (
            "  topology: cluster\n  nodes: []\n",
            "store.nodes",
            "at least one URL",
        ),
        (
            "  topology: cluster\n  nodes: [redis://a:7000, rediss://b:7001]\n",
            "store.nodes",
            "mixes redis:// and rediss://",
        ),
        (
            "  topology: cluster\n  nodes: [http://a:7000]\n",
            "store.nodes[0]",
            "must start with redis://",
        ),
        (
            "  topology: sentinel\n",
            "store.sentinel",
            "required with `topology: sentinel`",
        ),
        (
            "  topology: sentinel\n  sentinel: { nodes: [redis://s:26379] }\n",
            "store.sentinel.master",
            "required",
        ),
        (
            "  url: redis://r:6379\n  sentinel: { master: m, nodes: [redis://s:26379] }\n",
            "store.sentinel",
            "applies only to `topology: sentinel`",
        ),
        (
            "  topology: cluster\n  nodes: [redis://a:7000]\n  ca_file: /ca.pem\n",
            "store.ca_file",
            "rediss://",
        ),
        (
            "  topology: ring\n  url: redis://r:6379\n",
            "store.topology",
            "unknown topology",
        ),
    ] {
        let errors = parse_err(&format!("{REDIS_BASE}{store}"));
        assert!(
            errors
                .iter()
                .any(|e| e.contains(&format!("{key}: ")) && e.contains(says)),
            "{store:?}: no `{key}: ...{says}` in {errors:#?}"
        );
    }
    let errors = parse_err(&format!(
        "{BASE}store:\n  nodes: [redis://a:7000]\n  topology: cluster\n"
    ));
    assert!(
        errors
            .iter()
            .any(|e| e.contains("store.nodes: `nodes` applies only to `kind: redis`")),
        "{errors:#?}"
    );
}

fn redis_of(c: &Config) -> &RedisStore {
    match &c.boot.store.kind {
        StoreKind::Redis(redis) => redis,
        StoreKind::Memory(_) => panic!("a redis store"),
    }
}

#[test]
fn the_breaker_reads_its_window_minimums_and_rate() {
    let c = parse_ok(&format!(
        "{REDIS_BASE}  url: redis://r:6379\n  breaker_failures: 7\n  breaker_window: 30s\n  \
         breaker_min_calls: 100\n  breaker_failure_rate: 25%\n  breaker_cooldown: 2s\n"
    ));
    let redis = redis_of(&c);
    assert_eq!(redis.breaker_failures, 7);
    assert_eq!(redis.breaker_window, Duration::from_secs(30));
    assert_eq!(redis.breaker_min_calls, 100);
    assert_eq!(redis.breaker_failure_rate, 25);
    assert_eq!(redis.breaker_cooldown, Duration::from_secs(2));
    let c = parse_ok(&format!(
        "{REDIS_BASE}  url: redis://r:6379\n  breaker_failure_rate: 100%\n"
    ));
    assert_eq!(redis_of(&c).breaker_failure_rate, 100);
}

#[test]
fn bad_breaker_settings_are_refused_where_they_are_written() {
    let cases = [
        (
            "breaker_failure_rate: 50",
            "breaker_failure_rate",
            "is not a percentage",
        ),
        (
            "breaker_failure_rate: 0.5",
            "breaker_failure_rate",
            "is not a percentage",
        ),
        (
            "breaker_failure_rate: 0%",
            "breaker_failure_rate",
            "must be at least 1",
        ),
        (
            "breaker_failure_rate: 101%",
            "breaker_failure_rate",
            "must be at most 100",
        ),
        (
            "breaker_min_calls: 0",
            "breaker_min_calls",
            "must be at least 1",
        ),
        (
            "breaker_failures: 0",
            "breaker_failures",
            "must be at least 1",
        ),
        (
            "breaker_window: 0s",
            "breaker_window",
            "must be longer than 0",
        ),
        ("breaker_window: 10", "breaker_window", "has no unit"),
        // Misspelt: unknown, at the key, with the file and line.
        (
            "breaker_min_call: 5",
            "breaker_min_call",
            "unknown key `breaker_min_call`",
        ),
        (
            "breaker_rate: 50%",
            "breaker_rate",
            "unknown key `breaker_rate`",
        ),
    ];
    for (line, key, says) in cases {
        let errors = parse_err(&format!("{REDIS_BASE}  url: redis://r:6379\n  {line}\n"));
        assert_eq!(errors.len(), 1, "{line}: {errors:#?}");
        // The line after `url`, the key at column 3.
        let prefix = format!("test.yaml:11:3: store.{key}: ");
        let at_value = format!("test.yaml:11:{}: store.{key}: ", key.len() + 5);
        assert!(
            errors[0].starts_with(&prefix) || errors[0].starts_with(&at_value),
            "{line}: {} !~ {prefix}",
            errors[0]
        );
        assert!(errors[0].contains(says), "{line}: {} !~ {says}", errors[0]);
    }
}

#[test]
fn breaker_keys_apply_only_to_redis() {
    let errors = parse_err(&format!(
        "{BASE}store:\n  kind: memory\n  breaker_min_calls: 5\n"
    ));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0]
            .contains("store.breaker_min_calls: `breaker_min_calls` applies only to `kind: redis`"),
        "{}",
        errors[0]
    );
}

#[test]
fn a_dedupe_window_shorter_than_the_budget_is_refused() {
    let errors = parse_err(&format!(
        "{REDIS_BASE}  url: redis://r:6379\n  budget: 2s\n  dedupe_window: 1s\n"
    ));
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("store.dedupe_window: must be at least `budget`"),
        "{}",
        errors[0]
    );
    parse_ok(&format!(
        "{REDIS_BASE}  url: redis://r:6379\n  budget: 1s\n  dedupe_window: 1s\n"
    ));
    // Unwritten, it follows the budget.
    let c = parse_ok(&format!(
        "{REDIS_BASE}  url: redis://r:6379\n  budget: 2s\n"
    ));
    let StoreKind::Redis(redis) = &c.boot.store.kind else {
        panic!("a Redis store");
    };
    assert_eq!(redis.dedupe_window, Duration::from_secs(2));
}

#[test]
fn glob_and_regex_syntax_in_a_route_path_is_an_error_that_says_what_to_write() {
    for (key, path, bad) in [
        ("path", "\"/api/*\"", '*'),
        ("path_prefix", "\"/api/*\"", '*'),
        ("path", "\"/v[0-9]+/x\"", '['),
        ("path", "\"/a]\"", ']'),
    ] {
        let errors = parse_err(&format!(
            "{BASE}routes:\n  - {{ name: r, match: {{ {key}: {path} }}, policy: none }}\n"
        ));
        assert_eq!(errors.len(), 1, "{errors:#?}");
        let e = &errors[0];
        assert!(e.contains(&format!("routes[0].match.{key}")), "{e}");
        assert!(e.contains(&format!("contains `{bad}`")), "{e}");
        assert!(
            e.contains("path_prefix: /api") && e.contains("/users/{id}"),
            "{e}"
        );
    }
    // The percent-encoded form is the literal character.
    parse_ok(&format!(
        "{BASE}routes:\n  - {{ name: r, match: {{ path: /a%2A }}, policy: none }}\n"
    ));
}

#[test]
fn headers_with_underscores_and_format_suffixes_are_read() {
    let c = parse_ok(&format!(
        "{BASE}routes:\n  - {{ name: r, match: {{ path: /login, format_suffix: true }}, policy: none }}\n"
    ));
    assert_eq!(c.live.server.underscores, Underscores::Drop);
    assert!(c.live.routes[0].matcher.format_suffix);

    let allow = BASE.replace(
        "  listen: 127.0.0.1:8080\n",
        "  listen: 127.0.0.1:8080\n  headers_with_underscores: allow\n",
    );
    let c = parse_ok(&format!(
        "{allow}policies:\n  p: {{ algorithm: fixed-window, limit: 1, window: 1s }}\nroutes:\n  - {{ name: r, policy: p, subject: header:X_Key }}\n"
    ));
    assert_eq!(c.live.server.underscores, Underscores::Allow);

    // Under drop (the default) and reject no request carries such a header.
    for mode in ["", "  headers_with_underscores: reject\n"] {
        let base = BASE.replace(
            "  listen: 127.0.0.1:8080\n",
            &format!("  listen: 127.0.0.1:8080\n{mode}"),
        );
        let errors = parse_err(&format!(
            "{base}policies:\n  p: {{ algorithm: fixed-window, limit: 1, window: 1s }}\nroutes:\n  - {{ name: r, policy: p, subject: [client_ip, header:X_Key] }}\n"
        ));
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(errors[0].contains("routes[0].subject[1]"), "{}", errors[0]);
        assert!(errors[0].contains("header names with `_`"), "{}", errors[0]);
    }
    let errors = parse_err(&BASE.replace(
        "  listen: 127.0.0.1:8080\n",
        "  listen: 127.0.0.1:8080\n  headers_with_underscores: keep\n",
    ));
    assert!(
        errors[0].contains("server.headers_with_underscores"),
        "{errors:#?}"
    );
    assert!(
        errors[0].contains("expected drop, reject or allow"),
        "{errors:#?}"
    );
    let errors = parse_err(&format!(
        "{BASE}routes:\n  - {{ name: r, match: {{ format_suffix: true }}, policy: none }}\n"
    ));
    assert!(
        errors[0].contains("routes[0].match.format_suffix"),
        "{errors:#?}"
    );
}

#[test]
fn connections_per_ip_default_to_256_at_most_an_eighth_of_the_pool_and_stay_inside_it() {
    let c = parse_ok(BASE);
    assert_eq!(c.boot.server.max_connections, 10_000);
    assert_eq!(c.boot.server.max_connections_per_ip, 256);
    let pool = |n: u32| {
        let yaml = BASE.replace(
            "  listen: 127.0.0.1:8080\n",
            &format!("  listen: 127.0.0.1:8080\n  max_connections: {n}\n"),
        );
        parse_ok(&yaml).boot.server.max_connections_per_ip
    };
    assert_eq!(pool(3), 1);
    assert_eq!(pool(100), 12);
    assert_eq!(pool(2_048), 256);
    assert_eq!(pool(1_000_000), 256);
    let above = BASE.replace(
        "  listen: 127.0.0.1:8080\n",
        "  listen: 127.0.0.1:8080\n  max_connections: 100\n  max_connections_per_ip: 101\n",
    );
    let errors = parse_err(&above);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("server.max_connections_per_ip"),
        "{}",
        errors[0]
    );
    assert!(
        errors[0].contains("above max_connections (100)"),
        "{}",
        errors[0]
    );
}

#[test]
fn check_says_what_starts_each_policys_counts_afresh() {
    let c = parse_ok(&format!(
        "{BASE}policies:
  pinned: {{ algorithm: gcra, limit: 6, window: 1m, revision: v7 }}
  paced: {{ algorithm: gcra, limit: 6, window: 1m }}
"
    ));
    let notes = c.count_notes();
    let line = |name: &str| {
        notes
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no line for {name}:\n{notes}"))
            .to_owned()
    };
    assert!(
        line("pinned").ends_with("a change of its written `revision` only"),
        "{notes}"
    );
    assert!(
        line("paced").ends_with("`limit`, `window`, the algorithm, the number or order of bands"),
        "{notes}"
    );
}

/// A Redis file whose one policy is `policy` (a flow mapping's body).
fn leased(policy: &str) -> String {
    format!(
        "version: 1
server: {{ listen: 127.0.0.1:8080 }}
upstream: {{ url: http://127.0.0.1:3000 }}
store: {{ kind: redis, url: redis://127.0.0.1:6379 }}
identity: {{ pseudonym_key: 0123456789abcdef0123 }}
policies:
  hot: {{ {policy} }}
routes:
  - {{ name: r, match: {{ path_prefix: /api }}, subject: global, policy: hot }}
"
    )
}

#[test]
fn a_lease_is_on_with_its_defaults_written_or_off() {
    use crate::limit::LeaseTerms;
    let tb = "algorithm: token-bucket, capacity: 100, refill_every: 1s";
    let terms = |text: &str| policy(&parse_ok(&leased(text)), "hot").lease;
    let defaults = LeaseTerms {
        ttl: Duration::from_millis(250),
        max_share: 10,
        auto: false,
    };
    let auto = LeaseTerms {
        auto: true,
        ..defaults
    };
    assert_eq!(terms(tb), Some(auto));
    assert_eq!(terms(&format!("{tb}, lease: auto")), Some(auto));
    assert_eq!(terms(&format!("{tb}, lease: off")), None);
    assert_eq!(terms(&format!("{tb}, lease: on")), Some(defaults));
    assert_eq!(terms(&format!("{tb}, lease: {{}}")), Some(defaults));
    assert_eq!(
        terms(&format!("{tb}, lease: {{ ttl: 100ms, max_share: 50% }}")),
        Some(LeaseTerms {
            ttl: Duration::from_millis(100),
            max_share: 50,
            auto: false,
        })
    );
    let gcra = "algorithm: gcra, limit: 10, window: 1s, lease: on";
    assert_eq!(terms(gcra), Some(defaults));
    let fw = "algorithm: fixed-window, limit: 10, window: 1s, lease: on";
    assert_eq!(terms(fw), Some(defaults));
    let sc = "algorithm: sliding-counter, limit: 10, window: 1s, lease: on";
    assert_eq!(terms(sc), Some(defaults));
}

#[test]
fn a_lease_that_cannot_be_exact_is_refused_at_its_key() {
    for (policy, says) in [
        (
            "algorithm: sliding-log, limit: 10, window: 1s, lease: on",
            "sliding-log is never leased",
        ),
        (
            "algorithm: sliding-counter, bands: [{ limit: 10, window: 1s }, { limit: 100, window: 1m }], lease: on",
            "a sliding-counter policy of several bands is never leased",
        ),
        (
            "algorithm: fixed-window, bands: [{ limit: 10, window: 1s }, { limit: 100, window: 1m }], lease: on",
            "a fixed-window policy of several bands is never leased",
        ),
        (
            "algorithm: concurrency, limit: 10, lease: on",
            "`lease` is not a parameter of concurrency",
        ),
        (
            "algorithm: gcra, limit: 10, window: 1s, lease: yes",
            "expected `auto`, `on`, `off` or `{ ttl, max_share }`",
        ),
        (
            "algorithm: gcra, limit: 10, window: 1s, lease: { ttl: 0s }",
            "policies.hot.lease.ttl",
        ),
        (
            "algorithm: gcra, limit: 10, window: 1s, lease: { max_share: 0% }",
            "policies.hot.lease.max_share",
        ),
        (
            "algorithm: gcra, limit: 10, window: 1s, lease: { for: 1s }",
            "unknown key",
        ),
        // The grant's record lives store.dedupe_window (1 s here).
        (
            "algorithm: gcra, limit: 10, window: 1s, lease: { ttl: 501ms }",
            "at most half `store.dedupe_window` (1s)",
        ),
    ] {
        let errors = parse_err(&leased(policy));
        assert_eq!(errors.len(), 1, "{policy}: {errors:?}");
        assert!(errors[0].starts_with("test.yaml:7:"), "{policy}: {errors:?}");
        assert!(errors[0].contains(says), "{policy}: {errors:?}");
    }
    // Half the record's life is allowed.
    parse_ok(&leased(
        "algorithm: gcra, limit: 10, window: 1s, lease: { ttl: 500ms }",
    ));
}

#[test]
fn lease_auto_leases_only_what_can_be_leased_and_is_silent_elsewhere() {
    let terms = |text: &str| policy(&parse_ok(&leased(text)), "hot").lease;
    for silent in [
        "algorithm: sliding-log, limit: 10, window: 1s",
        "algorithm: fixed-window, bands: [{ limit: 10, window: 1s }, { limit: 100, window: 1m }]",
        "algorithm: sliding-counter, bands: [{ limit: 10, window: 1s }, { limit: 100, window: 1m }], lease: auto",
        "algorithm: gcra, limit: 10, window: 1s, shadow: true",
        "algorithm: gcra, limit: 10, window: 1s, delay: { max_wait: 1s }",
        // A tenth of 9 is no unit: never granted anything.
        "algorithm: fixed-window, limit: 9, window: 1s",
        "algorithm: token-bucket, capacity: 9, refill_every: 1s",
    ] {
        assert_eq!(terms(silent), None, "{silent}");
    }
    for leased in [
        "algorithm: gcra, limit: 10, window: 1s",
        "algorithm: fixed-window, limit: 10, window: 1s",
        "algorithm: sliding-counter, limit: 10, window: 1s",
    ] {
        assert!(terms(leased).is_some_and(|t| t.auto), "{leased}");
    }
    // On the memory store nothing is leased, and nothing is refused.
    let memory = leased("algorithm: gcra, limit: 10, window: 1s").replace(
        "{ kind: redis, url: redis://127.0.0.1:6379 }",
        "{ kind: memory }",
    );
    assert_eq!(policy(&parse_ok(&memory), "hot").lease, None);
    // A short record's life shortens the automatic lease to half of it,
    // where a written one is refused.
    let short = |policy: &str| {
        leased(policy).replace(
            "url: redis://127.0.0.1:6379",
            "url: redis://127.0.0.1:6379, budget: 10ms, dedupe_window: 300ms",
        )
    };
    let auto = parse_ok(&short("algorithm: gcra, limit: 10, window: 1s"));
    let ttl = policy(&auto, "hot").lease.map(|t| t.ttl);
    assert_eq!(ttl, Some(Duration::from_millis(150)));
    let errors = parse_err(&short("algorithm: gcra, limit: 10, window: 1s, lease: on"));
    assert!(
        errors[0].contains("at most half `store.dedupe_window`"),
        "{errors:?}"
    );
}

#[test]
fn a_lease_on_the_memory_store_is_refused() {
    let text = leased("algorithm: gcra, limit: 10, window: 1s, lease: on").replace(
        "{ kind: redis, url: redis://127.0.0.1:6379 }",
        "{ kind: memory }",
    );
    let errors = parse_err(&text);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("policies.hot.lease") && errors[0].contains("only to `kind: redis`"),
        "{errors:?}"
    );
}
