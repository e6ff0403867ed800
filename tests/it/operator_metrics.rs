//! Metrics an operator can alert on, read from the built binary: every
//! metric of the table has its series from the start (at 0, so that
//! `increase()` sees the first event), what sluice counts as sent to Redis
//! is what Redis counts as received, and each decision is counted once,
//! under where it was made.

use std::collections::BTreeMap;
use std::time::Duration;

use http::StatusCode;
use sluice::telemetry::{Kind, ALL};

use crate::support::ops::{promtool_check, samples, scrape, Sample};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{admin, redis_yaml, start_ready};
use crate::support::{eventually, get, Sidecar, Upstream};

/// Metrics only the Redis store has: a sidecar on the memory store has
/// no connection, breaker, script, refund, over-limit cache or lease.
/// Every other metric has its series on either store.
const REDIS_ONLY: [&str; 18] = [
    "sluice_store_errors_total",
    "sluice_store_retries_total",
    "sluice_store_events_total",
    "sluice_store_breaker_open",
    "sluice_store_breaker_opened_total",
    "sluice_store_script_loads_total",
    "sluice_store_dedupe_hits_total",
    "sluice_refunds_total",
    "sluice_local_deny_cache_hits_total",
    "sluice_leases_granted_total",
    "sluice_leases_returned_total",
    "sluice_lease_units_returned_total",
    "sluice_lease_admitted_total",
    "sluice_lease_units_held",
    "sluice_redis_calls_total",
    "sluice_redis_call_duration_seconds",
    "sluice_redis_batches_total",
    "sluice_redis_batched_decisions_total",
];

const SECRET: &str = "an HS256 secret, 32 bytes or more";

/// Policies and routes that give every metric whose labels come from the
/// configuration its series: a concurrency policy (`in_flight`), a route
/// counting `Authorization` (`undecodable_credentials`), a `jwt:` subject
/// (`jwt_rejected`), a GCRA policy with a delay (`requests_delayed`,
/// `request_delay_seconds`), `exempt` and `deny` networks (`requests_exempted`,
/// `requests_denied`), a cost read from the response (`response_charges`,
/// `response_cost_fallbacks`).
const POLICIES: &str = "  hourly: { algorithm: fixed-window, limit: 5, window: 1h }
  three: { algorithm: concurrency, limit: 3 }
  tokens: { algorithm: fixed-window, limit: 1000, window: 1h }
  smooth: { algorithm: gcra, limit: 10, window: 1s, delay: { max_wait: 500ms } }
";
const ROUTES: &str =
    "  - { name: api, match: { path_prefix: /api }, subject: header:Authorization, policy: hourly }
  - { name: user, match: { path_prefix: /user }, subject: jwt:sub, policy: hourly }
  - { name: slots, match: { path_prefix: /slots }, subject: client_ip, policy: three }
  - { name: smooth, match: { path_prefix: /smooth }, subject: client_ip, policy: smooth }
  - { name: nets, match: { path_prefix: /nets }, policy: hourly, exempt: [10.9.0.0/16], deny: [10.8.0.0/16] }
  - name: complete
    match: { path: /v1/complete }
    subject: header:x-api-key
    policy: tokens
    cost: { from_response_header: X-Tokens-Used, max: 1000, default: 50 }
";

fn memory_config(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {}
store:
  kind: memory
identity:
  jwt: {{ secret: \"{SECRET}\", audiences: [billing] }}
policies:
{POLICIES}routes:
{ROUTES}",
        upstream.url()
    )
}

fn redis_config(upstream: &Upstream, redis: &RedisServer) -> String {
    redis_yaml(upstream, &redis.url(), POLICIES, ROUTES).replace(
        "identity:\n",
        &format!("identity:\n  jwt: {{ secret: \"{SECRET}\", audiences: [billing] }}\n"),
    )
}

/// The metric a sample belongs to: a histogram's `_bucket`, `_sum` and
/// `_count` are its own.
fn family(sample: &Sample) -> &str {
    let histogram = ALL.iter().filter(|m| m.kind == Kind::Histogram).find(|m| {
        ["_bucket", "_sum", "_count"]
            .iter()
            .any(|suffix| sample.name.strip_suffix(suffix) == Some(m.name))
    });
    histogram.map_or(sample.name.as_str(), |m| m.name)
}

/// Every sample of `text`, by metric.
fn by_metric(text: &str) -> BTreeMap<String, Vec<Sample>> {
    let mut out: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    for sample in samples(text) {
        out.entry(family(&sample).to_owned())
            .or_default()
            .push(sample);
    }
    out
}

/// Every metric of the table but `absent` has a series in `text`; every
/// counter and histogram is at 0 but those in `counted` (what the start
/// itself did); nothing is exported that the table does not name.
fn every_series_from_the_start(text: &str, absent: &[&str], counted: &[&str]) {
    let found = by_metric(text);
    let missing: Vec<&str> = ALL
        .iter()
        .map(|m| m.name)
        .filter(|name| !absent.contains(name) && !found.contains_key(*name))
        .collect();
    assert!(
        missing.is_empty(),
        "no series before any request for {missing:?}\n{text}"
    );
    for name in absent {
        assert!(
            !found.contains_key(*name),
            "{name} is said to need another store, yet it is exported"
        );
    }
    let unknown: Vec<&String> = found
        .keys()
        .filter(|name| ALL.iter().all(|m| m.name != name.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "exported but not in the table: {unknown:?}"
    );
    for metric in ALL.iter().filter(|m| m.kind != Kind::Gauge) {
        if counted.contains(&metric.name) {
            continue;
        }
        for sample in found.get(metric.name).into_iter().flatten() {
            assert_eq!(sample.value, 0.0, "{sample:?} before any request");
        }
    }
}

/// Label values of `name`'s series for `label`.
fn values_of(text: &str, name: &str, label: &str) -> Vec<String> {
    let mut values: Vec<String> = samples(text)
        .into_iter()
        .filter(|s| s.name == name)
        .filter_map(|s| {
            s.labels
                .into_iter()
                .find(|(k, _)| k == label)
                .map(|(_, v)| v)
        })
        .collect();
    values.sort();
    values.dedup();
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_has_its_series_at_zero_before_any_request_on_the_memory_store() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&memory_config(&upstream));
    let admin = sluice.admin_addr().expect("the admin address is logged");
    let text = scrape(admin).await;
    promtool_check(&text);
    every_series_from_the_start(&text, &REDIS_ONLY, &[]);
    // The series an alert reads for its first event, each label there.
    assert_eq!(
        values_of(&text, "sluice_config_reloads_total", "result"),
        ["failure", "success"]
    );
    let reasons = values_of(&text, "sluice_requests_refused_total", "reason");
    for reason in [
        "framing",
        "missing_host",
        "path_above_root",
        "transfer_coding",
    ] {
        assert!(
            reasons.iter().any(|r| r == reason),
            "{reason} in {reasons:?}"
        );
    }
    assert_eq!(
        values_of(&text, "sluice_decision_duration_seconds_count", "source"),
        ["deny_cache", "failed", "lease", "local", "store"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_has_its_series_at_zero_before_any_request_on_the_redis_store() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&redis_config(&upstream, &redis)).await;
    let text = scrape(admin(&sluice)).await;
    promtool_check(&text);
    // Readiness needed Redis to answer and the scripts to load: those
    // calls are counted already.
    let counted = [
        "sluice_redis_calls_total",
        "sluice_redis_call_duration_seconds",
        "sluice_store_script_loads_total",
    ];
    every_series_from_the_start(&text, &[], &counted);
    assert_eq!(
        values_of(&text, "sluice_leases_returned_total", "result"),
        ["failed", "returned", "unneeded"]
    );
    assert_eq!(
        values_of(&text, "sluice_redis_calls_total", "command"),
        [
            "evalsha",
            "fcall",
            "function_load",
            "other",
            "script_load",
            "touch"
        ]
    );
    assert_eq!(
        values_of(&text, "sluice_redis_calls_total", "result"),
        ["connection_lost", "error", "ok", "timeout"]
    );
}

/// `(calls + rejected_calls)` of each command in `INFO commandstats`:
/// every command Redis received, run or refused.
fn received(conn: &mut redis::Connection) -> BTreeMap<String, u64> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix(key))
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            Some((name.to_owned(), field("calls=") + field("rejected_calls=")))
        })
        .collect()
}

/// `sluice_redis_calls_total{command}`, every result together.
fn sent(text: &str, command: &str) -> u64 {
    samples(text)
        .into_iter()
        .filter(|s| s.name == "sluice_redis_calls_total")
        .filter(|s| s.labels.iter().any(|(k, v)| k == "command" && v == command))
        .map(|s| s.value as u64)
        .sum()
}

fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    crate::support::ops::metric(text, name, labels).unwrap_or(0.0)
}

/// What the Redis side and sluice say of the commands of a request's
/// path: the script calls, their loads, the touches.
#[derive(Debug, PartialEq)]
struct Both {
    calls: (u64, u64),
    loads: (u64, u64),
    touch: (u64, u64),
}

/// How `store.scripts` runs the scripts: sluice's `command` label and
/// Redis's commandstats name, for the call and for the load.
struct Mode {
    scripts: &'static str,
    call: (&'static str, &'static str),
    load: (&'static str, &'static str),
    /// What empties the node of them.
    flush: (&'static str, &'static str),
}

const FUNCTIONS: Mode = Mode {
    scripts: "functions",
    call: ("fcall", "fcall"),
    load: ("function_load", "function|load"),
    flush: ("FUNCTION", "FLUSH"),
};

const EVAL: Mode = Mode {
    scripts: "eval",
    call: ("evalsha", "evalsha"),
    load: ("script_load", "script|load"),
    flush: ("SCRIPT", "FLUSH"),
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_calls_counted_by_sluice_equal_what_redis_received_and_each_decision_counts_once() {
    calls_equal_commandstats(&FUNCTIONS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_calls_counted_by_sluice_equal_what_redis_received_with_cached_scripts() {
    calls_equal_commandstats(&EVAL).await;
}

async fn calls_equal_commandstats(mode: &Mode) {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    // `/api`: 5 an hour per user, so the over-limit cache answers the
    // rest (and touches the keys); `/hot`: one shared subject paid from
    // leases, returned when they end.
    let policies = "  hourly: { algorithm: fixed-window, limit: 5, window: 1h }
  hot: { algorithm: fixed-window, limit: 100000, window: 1h, lease: { ttl: 200ms, max_share: 20% } }
";
    let routes =
        "  - { name: api, match: { path_prefix: /api }, subject: header:x-user, policy: hourly }
  - { name: hot, match: { path_prefix: /hot }, subject: global, policy: hot }
";
    let yaml = redis_yaml(&upstream, &redis.url(), policies, routes).replace(
        "  budget: 50ms\n",
        &format!("  budget: 1s\n  scripts: {}\n", mode.scripts),
    );
    let sluice = start_ready(&yaml).await;
    let mut conn = redis.connection();
    let redis = &redis;

    let mut sent_requests = 0u64;
    let mut statuses = Vec::new();
    for round in 0..2 {
        for user in ["ann", "bob", "cy"] {
            for _ in 0..10 {
                let user = format!("{user}-{round}");
                statuses.push(get(sluice.addr(), "/api", &[("x-user", &user)]).await.0);
                sent_requests += 1;
            }
        }
        for _ in 0..60 {
            statuses.push(get(sluice.addr(), "/hot", &[]).await.0);
            sent_requests += 1;
        }
        if round == 0 {
            // Every script gone: the next calls answer function not found
            // (NOSCRIPT), load theirs again and call once more.
            let _: () = redis::cmd(mode.flush.0)
                .arg(mode.flush.1)
                .query(&mut conn)
                .expect("flush the scripts");
        }
    }
    // A denied subject's key is touched at most four times a second: ask
    // again until one is due and sent.
    let (addr, admin) = (sluice.addr(), admin(&sluice));
    eventually(Duration::from_secs(5), || {
        sent_requests += 1;
        async move {
            let (status, _, _) = get(addr, "/api", &[("x-user", "ann-1")]).await;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
            let touched = value(
                &scrape(admin).await,
                "sluice_store_events_total",
                &[("kind", "touched")],
            );
            (touched > 0.0).then_some(())
        }
    })
    .await;
    let denied = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!(denied, 30, "5 of 10 per user and round admitted");
    assert_eq!(statuses.len() as u64 - denied as u64, 30 + 120);

    // Once the leases went back and the touches were sent, both sides
    // agree on every command sluice sends on a request's path.
    let (text, both) = eventually(Duration::from_secs(10), || async move {
        {
            let text = scrape(admin).await;
            let redis = received(&mut redis.connection());
            let on_redis = |name: &str| redis.get(name).copied().unwrap_or(0);
            let both = Both {
                calls: (sent(&text, mode.call.0), on_redis(mode.call.1)),
                loads: (sent(&text, mode.load.0), on_redis(mode.load.1)),
                touch: (sent(&text, "touch"), on_redis("touch")),
            };
            let held = value(&text, "sluice_lease_units_held", &[]);
            let agree = both.calls.0 == both.calls.1
                && both.loads.0 == both.loads.1
                && both.touch.0 == both.touch.1;
            (held == 0.0 && agree).then_some((text, both))
        }
    })
    .await;
    println!("{}: sluice vs INFO commandstats: {both:?}", mode.scripts);
    // Each path was taken: reloads, touches, lease returns, errors.
    assert!(
        both.loads.0 >= 4,
        "start and reloads: {both:?}\n{:?}\n{text}",
        received(&mut redis.connection())
    );
    assert!(both.touch.0 > 0, "touches: {both:?}");
    let errors = value(
        &text,
        "sluice_redis_calls_total",
        &[("command", mode.call.0), ("result", "error")],
    );
    assert!(
        errors >= 1.0,
        "function not found (NOSCRIPT) after the flush"
    );
    // Nothing of the other mode was sent.
    let other = if mode.scripts == "eval" {
        FUNCTIONS
    } else {
        EVAL
    };
    assert_eq!(sent(&text, other.call.0), 0, "{}", other.call.0);
    let returned = value(
        &text,
        "sluice_leases_returned_total",
        &[("result", "returned")],
    );
    assert!(returned >= 1.0, "leases went back");

    // Each request with a rate limit counted once, under where it was
    // decided.
    let decided = |source: &str| {
        value(
            &text,
            "sluice_decision_duration_seconds_count",
            &[("store", "redis"), ("source", source)],
        )
    };
    let total: f64 = ["store", "deny_cache", "lease", "local", "failed"]
        .iter()
        .map(|s| decided(s))
        .sum();
    assert_eq!(total as u64, sent_requests, "one decision a request");
    assert_eq!(
        decided("deny_cache"),
        value(&text, "sluice_local_deny_cache_hits_total", &[])
    );
    assert!(decided("deny_cache") >= 24.0, "4 of the 5 denials per user");
    assert_eq!(
        decided("lease"),
        value(&text, "sluice_lease_admitted_total", &[])
    );
    assert!(decided("lease") > 0.0);
    assert_eq!(decided("local") + decided("failed"), 0.0);
    // What the store decided took one `FCALL` each, besides the reloads'
    // second calls, the refunds and lease returns.
    assert!(decided("store") as u64 <= both.calls.0);
}

/// docs/OPERATIONS.md's metric table has a row for every metric of the
/// table in the code, and no row for one sluice does not export.
#[test]
fn the_operations_guide_lists_every_metric_with_its_labels() {
    let guide = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/OPERATIONS.md"))
        .expect("docs/OPERATIONS.md");
    let rows: Vec<&str> = guide
        .lines()
        .map(str::trim_start)
        .filter(|line| line.starts_with("| `sluice_"))
        .collect();
    let documented: Vec<&str> = rows
        .iter()
        .filter_map(|row| row.strip_prefix("| `")?.split('`').next())
        .collect();
    for metric in ALL {
        assert!(
            documented.contains(&metric.name),
            "{} has no row in docs/OPERATIONS.md",
            metric.name
        );
    }
    for name in &documented {
        assert!(
            ALL.iter().any(|m| m.name == *name),
            "docs/OPERATIONS.md lists {name}, which sluice does not export"
        );
    }
    // Three cells: metric, type, labels.
    for row in rows {
        assert_eq!(row.matches(" | ").count(), 2, "{row}");
    }
}

/// A call Redis does not answer within the budget is counted as a
/// `timeout`: it was sent all the same, and once Redis runs it, both sides
/// count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_past_its_deadline_counts_as_a_timeout_and_both_sides_still_agree() {
    let redis = RedisServer::builder()
        .config("enable-debug-command yes")
        .start();
    let upstream = Upstream::start().await;
    let yaml = redis_yaml(
        &upstream,
        &redis.url(),
        "  hourly: { algorithm: fixed-window, limit: 1000, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: header:x-user, policy: hourly }\n",
    );
    let sluice = start_ready(&yaml).await;
    let (addr, admin) = (sluice.addr(), admin(&sluice));
    assert_eq!(
        get(addr, "/api", &[("x-user", "ann")]).await.0,
        StatusCode::OK
    );

    // Redis busy for a second: the next decision waits past its 50 ms
    // budget and gets `on_failure: deny`.
    let mut sleeper = redis.connection();
    let asleep = std::thread::spawn(move || {
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(1)
            .query(&mut sleeper)
            .expect("DEBUG SLEEP");
    });
    eventually(Duration::from_secs(5), || async move {
        let (status, _, _) = get(addr, "/api", &[("x-user", "ann")]).await;
        (status == StatusCode::SERVICE_UNAVAILABLE).then_some(())
    })
    .await;
    asleep.join().expect("the sleeper thread");

    let redis = &redis;
    let (timeouts, both) = eventually(Duration::from_secs(10), || async move {
        let text = scrape(admin).await;
        let fcall = received(&mut redis.connection())
            .get("fcall")
            .copied()
            .unwrap_or(0);
        let timeouts = value(
            &text,
            "sluice_redis_calls_total",
            &[("command", "fcall"), ("result", "timeout")],
        );
        (sent(&text, "fcall") == fcall && timeouts >= 1.0).then_some((timeouts, fcall))
    })
    .await;
    println!("fcall timeouts {timeouts}, fcall on both sides {both}");
}
