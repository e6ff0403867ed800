//! The Redis store through the built binary: limits exact across replicas
//! sharing one Redis, no raw identity and no immortal key in Redis, one
//! `FCALL` per decision and none for a subject already known to be over
//! its limit, and a least-privilege Redis user.
//!
//! Every test takes [`SERIAL`]: they start Redis and several sidecars, and
//! on two cores their bursts would otherwise crowd each other's budgets.

use crate::support;
use std::time::Duration;

use crate::support::ops::{metric, promtool_check, scrape};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{
    admin, commandstats, redis_yaml, reset_stats, sample, sent_by_clients, spread, start_ready,
};
use crate::support::sidecar::Sidecar;
use crate::support::{burst, clear_of_window_edge, count, get, released_together, Upstream};
use http::StatusCode;
use redis::Commands;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const HOUR: Duration = Duration::from_secs(3600);
/// Enough for any of these tests to finish inside one aligned window.
const EDGE_MARGIN: Duration = Duration::from_secs(20);
const REQUESTS: &str = "sluice_requests_total";

/// [`redis_yaml`] with a budget of 1s: these tests count decisions, and on
/// a busy two-core machine a burst may outlast 50ms and fail closed (503),
/// which the failure tests cover.
fn yaml(upstream: &Upstream, redis_url: &str, policies: &str, routes: &str) -> String {
    let yaml = redis_yaml(upstream, redis_url, policies, routes);
    assert!(yaml.contains("  budget: 50ms\n"), "{yaml}");
    yaml.replace("  budget: 50ms\n", "  budget: 1s\n")
}

/// One policy per exact algorithm, each admitting 25 an hour at most, and a
/// route `/NAME` to each, counted by client address (every request here
/// comes from 127.0.0.1: one subject).
const EXACT_POLICIES: &str = "  fw: { algorithm: fixed-window, limit: 25, window: 1h }
  sl: { algorithm: sliding-log, limit: 25, window: 1h }
  tb: { algorithm: token-bucket, capacity: 25, refill_tokens: 1, refill_every: 1h }
  gc: { algorithm: gcra, limit: 25, window: 1h, burst: 25 }
";
const EXACT_ROUTES: &str =
    "  - { name: fw, match: { path_prefix: /fw }, subject: client_ip, policy: fw }
  - { name: sl, match: { path_prefix: /sl }, subject: client_ip, policy: sl }
  - { name: tb, match: { path_prefix: /tb }, subject: client_ip, policy: tb }
  - { name: gc, match: { path_prefix: /gc }, subject: client_ip, policy: gc }
";

/// Three sidecars on one Redis, all forwarding to one upstream: 300
/// requests round-robin over them at concurrency 30 against a limit of 25.
async fn three_replicas_admit_exactly_25(name: &str) {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = yaml(&upstream, &redis.url(), EXACT_POLICIES, EXACT_ROUTES);
    let replicas = [
        start_ready(&yaml).await,
        start_ready(&yaml).await,
        start_ready(&yaml).await,
    ];
    let addrs: Vec<_> = replicas.iter().map(|s| s.addr()).collect();
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    let statuses = spread(&addrs, &format!("/{name}/x"), 300, 30).await;

    assert_eq!(count(&statuses, StatusCode::OK), 25, "{name}: {statuses:?}");
    assert_eq!(
        count(&statuses, StatusCode::TOO_MANY_REQUESTS),
        275,
        "{name}: {statuses:?}"
    );
    assert_eq!(
        upstream.count(),
        25,
        "{name}: requests that reached the app"
    );

    // Each replica counted its own share; together they account for all.
    let mut allowed = 0.0;
    let mut denied = 0.0;
    for sluice in &replicas {
        let text = scrape(admin(sluice)).await;
        let labels = |outcome| [("route", name), ("policy", name), ("outcome", outcome)];
        allowed += metric(&text, REQUESTS, &labels("allowed")).unwrap_or(0.0);
        denied += metric(&text, REQUESTS, &labels("denied")).unwrap_or(0.0);
        let decisions = metric(
            &text,
            "sluice_decision_duration_seconds_count",
            &[("store", "redis"), ("source", "store")],
        )
        .unwrap_or_else(|| panic!("no redis decision histogram:\n{text}"));
        assert!(decisions >= 1.0, "{name}: {decisions} decisions timed");
    }
    assert_eq!((allowed, denied), (25.0, 275.0), "{name}: metrics");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_one_fixed_window_exactly() {
    three_replicas_admit_exactly_25("fw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_one_sliding_log_exactly() {
    three_replicas_admit_exactly_25("sl").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_one_token_bucket_exactly() {
    three_replicas_admit_exactly_25("tb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_share_one_gcra_exactly() {
    three_replicas_admit_exactly_25("gc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_admits_exactly_10_of_100_released_together() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&yaml(
        &upstream,
        &redis.url(),
        "  log: { algorithm: sliding-log, limit: 10, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: log }\n",
    ))
    .await;

    let statuses = released_together(sluice.addr(), "/api", 100).await;

    assert_eq!(count(&statuses, StatusCode::OK), 10, "{statuses:?}");
    assert_eq!(count(&statuses, StatusCode::TOO_MANY_REQUESTS), 90);
    assert_eq!(upstream.count(), 10);
}

// ---------------------------------------------------------------------------
// What Redis holds
// ---------------------------------------------------------------------------

const RAW_KEY: &str = "raw-secret-key-123";
const RAW_IP: &str = "203.0.113.77";
const ALGORITHMS: [&str; 5] = ["fw", "sc", "sl", "tb", "gc"];

/// Every algorithm at 3 an hour, each behind a route counted by API key
/// (`/key/ALG`) and one counted by forwarded client address (`/ip/ALG`).
fn privacy_config(upstream: &Upstream, redis_url: &str) -> String {
    let policies = "  fw: { algorithm: fixed-window, limit: 3, window: 1h }
  sc: { algorithm: sliding-counter, limit: 3, window: 1h }
  sl: { algorithm: sliding-log, limit: 3, window: 1h }
  tb: { algorithm: token-bucket, capacity: 3, refill_every: 1h }
  gc: { algorithm: gcra, limit: 3, window: 1h }
";
    let routes: String = ALGORITHMS
        .iter()
        .map(|a| {
            format!(
                "  - {{ name: key-{a}, match: {{ path_prefix: /key/{a} }}, subject: header:x-api-key, policy: {a} }}\n\
                 \x20 - {{ name: ip-{a}, match: {{ path_prefix: /ip/{a} }}, subject: client_ip, policy: {a} }}\n"
            )
        })
        .collect();
    yaml(upstream, redis_url, policies, &routes).replace(
        "identity:\n",
        "identity:\n  trusted_proxies: [127.0.0.1/32]\n",
    )
}

/// Statuses of `n` sequential GETs.
async fn sequential(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> Vec<StatusCode> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get(addr, path, headers).await.0);
    }
    out
}

/// The whole content of `key`, as text, whatever its type.
fn dump(conn: &mut redis::Connection, key: &str) -> String {
    let kind: String = redis::cmd("TYPE").arg(key).query(conn).expect("TYPE");
    let content: redis::RedisResult<String> = match kind.as_str() {
        "hash" => redis::cmd("HGETALL")
            .arg(key)
            .query::<Vec<(String, String)>>(conn)
            .map(|v| format!("{v:?}")),
        "zset" => redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query::<Vec<(String, String)>>(conn)
            .map(|v| format!("{v:?}")),
        "string" => redis::cmd("GET").arg(key).query::<String>(conn),
        "list" => redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query::<Vec<String>>(conn)
            .map(|v| format!("{v:?}")),
        "set" => redis::cmd("SMEMBERS")
            .arg(key)
            .query::<Vec<String>>(conn)
            .map(|v| format!("{v:?}")),
        // Expired between SCAN and TYPE.
        "none" => Ok(String::new()),
        other => panic!("{key}: a {other} sluice should never write"),
    };
    content.unwrap_or_else(|e| panic!("{key} ({kind}): {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holds_no_raw_identity_and_every_key_expires() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&privacy_config(&upstream, &redis.url())).await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    let over = vec![
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::OK,
        StatusCode::TOO_MANY_REQUESTS,
        StatusCode::TOO_MANY_REQUESTS,
    ];
    for a in ALGORITHMS {
        let key = [("x-api-key", RAW_KEY)];
        let forwarded = [("x-forwarded-for", RAW_IP)];
        assert_eq!(
            sequential(sluice.addr(), &format!("/key/{a}"), &key, 5).await,
            over,
            "{a}"
        );
        assert_eq!(
            sequential(sluice.addr(), &format!("/ip/{a}"), &forwarded, 5).await,
            over,
            "{a}"
        );
        // Other identities are other subjects: the raw values really were
        // what was counted (and so what Redis was told about, hidden).
        let other_key = [("x-api-key", "another-key-456")];
        let other_ip = [("x-forwarded-for", "198.51.100.9")];
        assert_eq!(
            get(sluice.addr(), &format!("/key/{a}"), &other_key).await.0,
            StatusCode::OK,
            "{a}"
        );
        assert_eq!(
            get(sluice.addr(), &format!("/ip/{a}"), &other_ip).await.0,
            StatusCode::OK,
            "{a}"
        );
    }

    let mut conn = redis.connection();
    let keys: Vec<String> = conn
        .scan()
        .expect("SCAN")
        .collect::<Result<_, _>>()
        .expect("SCAN items");
    // Five algorithms, two routes, two subjects each: at least one key each.
    assert!(keys.len() >= 20, "only {} keys: {keys:?}", keys.len());
    let mut without_ttl = Vec::new();
    for key in &keys {
        let content = dump(&mut conn, key);
        for raw in [RAW_KEY, RAW_IP] {
            assert!(!key.contains(raw), "key {key:?} holds {raw}");
            assert!(
                !content.contains(raw),
                "key {key:?} holds {raw} in {content}"
            );
        }
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(&mut conn).expect("PTTL");
        // -2 is a key that expired since SCAN: what a TTL is for.
        if ttl == -1 {
            without_ttl.push(key.clone());
        }
    }
    assert!(
        without_ttl.is_empty(),
        "keys without a TTL: {without_ttl:?}"
    );

    let logs = format!("{}\n{}", sluice.logs().join("\n"), sluice.stderr());
    for raw in [RAW_KEY, RAW_IP] {
        assert!(!logs.contains(raw), "the log holds {raw}:\n{logs}");
    }
}

// ---------------------------------------------------------------------------
// What sluice sends
// ---------------------------------------------------------------------------

/// Two requests to `path` pass, and the 20 after them are refused with at
/// most one `FCALL` among them (the first denial may be Redis's own): the
/// rest come from the over-limit cache.
async fn refused_without_asking_redis(sluice: &Sidecar, redis: &RedisServer, path: &str) {
    assert_eq!(
        sequential(sluice.addr(), path, &[], 2).await,
        [StatusCode::OK; 2]
    );
    let mut conn = redis.connection();
    reset_stats(&mut conn);

    let denied = sequential(sluice.addr(), path, &[], 20).await;

    assert_eq!(denied, [StatusCode::TOO_MANY_REQUESTS; 20]);
    let stats = commandstats(&mut conn);
    let fcall = stats
        .iter()
        .find(|(name, _)| name == "fcall")
        .map_or(0, |(_, calls)| *calls);
    assert!(
        fcall <= 1,
        "{fcall} FCALL for 20 denials on {path}, already over a limit: {stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subject_over_its_limit_is_denied_locally_without_asking_redis() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&yaml(
        &upstream,
        &redis.url(),
        "  two: { algorithm: sliding-log, limit: 2, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: two }\n",
    ))
    .await;
    let hits = "sluice_local_deny_cache_hits_total";
    let hits_before = sample(&sluice, hits, &[]).await.unwrap_or(0.0);

    refused_without_asking_redis(&sluice, &redis, "/api").await;

    assert_eq!(upstream.count(), 2);
    let hits_after = sample(&sluice, hits, &[])
        .await
        .unwrap_or_else(|| panic!("no {hits} on /metrics"));
    assert!(
        hits_after - hits_before >= 19.0,
        "{hits}: {hits_before} -> {hits_after}"
    );
}

/// A route of several limits: one over its limit refuses from the over-limit
/// cache without asking Redis; a shadow one over its limit, remembered
/// too, ends nothing, and the limits beside it are still asked and charged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_denial_among_several_limits_refuses_and_a_shadow_one_does_not() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&yaml(
        &upstream,
        &redis.url(),
        "  two: { algorithm: sliding-log, limit: 2, window: 1h }
  wide: { algorithm: sliding-log, limit: 1000, window: 1h }
  watch: { algorithm: sliding-log, limit: 1, window: 1h, shadow: true }
  five: { algorithm: sliding-log, limit: 5, window: 1h }
",
        "  - name: api
    match: { path_prefix: /api }
    limits: [{ policy: wide, subject: client_ip }, { policy: two, subject: client_ip }]
  - name: watched
    match: { path_prefix: /watched }
    limits: [{ policy: watch, subject: client_ip }, { policy: five, subject: client_ip }]
",
    ))
    .await;

    refused_without_asking_redis(&sluice, &redis, "/api").await;

    assert_eq!(upstream.count(), 2);

    // `watch` denies from the second request on, and its denial is
    // remembered; `five` still counts every request, and refuses the sixth.
    let watched = sequential(sluice.addr(), "/watched", &[], 8).await;
    let mut expected = vec![StatusCode::OK; 5];
    expected.extend([StatusCode::TOO_MANY_REQUESTS; 3]);
    assert_eq!(watched, expected);
    assert_eq!(upstream.count(), 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_allowed_request_costs_exactly_one_fcall() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(
        &yaml(
            &upstream,
            &redis.url(),
            "  wide: { algorithm: gcra, limit: 100000, window: 1h, burst: 100000, lease: off }\n",
            "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: wide }\n",
        )
        // One call per decision: batching them is `coalesced_decisions`'.
        .replace("  budget: 1s\n", "  budget: 1s\n  coalesce: off\n"),
    )
    .await;
    // Opens every connection the sidecar keeps, so what follows is the
    // steady state (connecting sends CLIENT SETINFO and the like).
    let warm = burst(sluice.addr(), "/api", 20, 4).await;
    assert_eq!(count(&warm, StatusCode::OK), 20, "{warm:?}");
    let mut conn = redis.connection();
    reset_stats(&mut conn);

    const N: usize = 150;
    let statuses = burst(sluice.addr(), "/api", N, 10).await;

    assert_eq!(count(&statuses, StatusCode::OK), N, "{statuses:?}");
    let sent = sent_by_clients(&mut conn);
    assert_eq!(
        sent,
        [("fcall".to_owned(), N as u64)],
        "commands sent for {N} allowed requests (all: {:?})",
        commandstats(&mut conn)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_after_redis_traffic_pass_promtool() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&yaml(
        &upstream,
        &redis.url(),
        "  two: { algorithm: gcra, limit: 2, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: two }\n",
    ))
    .await;
    let statuses = sequential(sluice.addr(), "/api", &[], 5).await;
    assert_eq!(count(&statuses, StatusCode::OK), 2, "{statuses:?}");

    // Every store series exists once Redis served traffic.
    let text = scrape(admin(&sluice)).await;
    for name in [
        "sluice_store_breaker_open",
        "sluice_store_script_loads_total",
        "sluice_store_dedupe_hits_total",
        "sluice_local_deny_cache_hits_total",
        "sluice_forwarded_without_decision_total",
    ] {
        assert!(
            metric(&text, name, &[]).is_some(),
            "{name} missing:\n{text}"
        );
    }
    assert!(
        text.contains("sluice_store_errors_total{"),
        "no store error series:\n{text}"
    );
    promtool_check(&text);
}

/// The user a deployment should create (lua/README.md): `FCALL`,
/// `FUNCTION LOAD` (and LIST, DELETE) and the commands the functions call, on the key prefix.
const SLUICE_ACL: &str = "user sluice on >pw resetchannels ~sluice:* -@all \
     +fcall +function|load +function|list +function|delete +ping +time +get +set +pexpire +touch \
     +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_user_that_may_not_eval_limits_exactly() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::builder()
        .config("user default off")
        .config("user admin on >admin-pw ~* &* +@all")
        .config(SLUICE_ACL)
        .admin("admin", "admin-pw")
        .start();
    let url = redis.url_as("sluice", "pw");
    assert_eq!(url, format!("redis://sluice:pw@127.0.0.1:{}", redis.port()));
    // The user really cannot EVAL, nor can anyone without a password.
    let mut as_sluice = redis::Client::open(url.as_str())
        .expect("client")
        .get_connection()
        .expect("connect as sluice");
    let eval: redis::RedisResult<i64> = redis::cmd("EVAL")
        .arg("return 1")
        .arg(0)
        .query(&mut as_sluice);
    assert!(eval.is_err(), "the sluice user may EVAL");

    let upstream = Upstream::start().await;
    let policies = "  fw: { algorithm: fixed-window, limit: 5, window: 1h }
  sc: { algorithm: sliding-counter, limit: 5, window: 1h }
  sl: { algorithm: sliding-log, limit: 5, window: 1h }
  tb: { algorithm: token-bucket, capacity: 5, refill_every: 1h }
  gc: { algorithm: gcra, limit: 5, window: 1h }
";
    let routes: String = ALGORITHMS
        .iter()
        .map(|a| {
            format!("  - {{ name: {a}, match: {{ path_prefix: /{a} }}, subject: client_ip, policy: {a} }}\n")
        })
        .collect();
    let sluice = start_ready(&yaml(&upstream, &url, policies, &routes)).await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    for (i, a) in ALGORITHMS.iter().enumerate() {
        let statuses = burst(sluice.addr(), &format!("/{a}"), 20, 5).await;
        assert_eq!(count(&statuses, StatusCode::OK), 5, "{a}: {statuses:?}");
        assert_eq!(
            count(&statuses, StatusCode::TOO_MANY_REQUESTS),
            15,
            "{a}: {statuses:?}"
        );
        assert_eq!(upstream.count(), 5 * (i + 1), "{a}");
    }
}

/// A policy a reload adds is compiled and its script loaded as the new
/// configuration takes over: its first requests need no function-not-found round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_added_by_a_reload_is_loaded_before_its_first_request() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let one = "  fw: { algorithm: fixed-window, limit: 5, window: 1h }\n";
    let route = "  - { name: fw, match: { path_prefix: /fw }, subject: client_ip, policy: fw }\n";
    let sluice = start_ready(&yaml(&upstream, &redis.url(), one, route)).await;
    assert_eq!(get(sluice.addr(), "/fw", &[]).await.0, StatusCode::OK);
    let loads = |text: &str| metric(text, "sluice_store_script_loads_total", &[]).unwrap_or(0.0);
    let before = loads(&scrape(admin(&sluice)).await);

    let two = format!("{one}  gc: {{ algorithm: gcra, limit: 7, window: 1h }}\n");
    let routes = format!(
        "{route}  - {{ name: gc, match: {{ path_prefix: /gc }}, subject: client_ip, policy: gc }}\n"
    );
    std::fs::write(
        sluice.config_path(),
        yaml(&upstream, &redis.url(), &two, &routes),
    )
    .expect("rewrite the file");
    sluice.signal("HUP");
    support::eventually(Duration::from_secs(5), || async {
        (loads(&scrape(admin(&sluice)).await) > before).then_some(())
    })
    .await;
    assert_eq!(get(sluice.addr(), "/gc", &[]).await.0, StatusCode::OK);
    let text = scrape(admin(&sluice)).await;
    let noscript =
        metric(&text, "sluice_store_events_total", &[("kind", "noscript")]).unwrap_or(0.0);
    assert_eq!(
        noscript, 0.0,
        "the new policy's first request met function-not-found"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_only_numbers_keeps_the_counts_in_redis() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let policies = |limit: u32| {
        format!(
            "  fw: {{ algorithm: fixed-window, limit: {limit}, window: 1h }}
  tb: {{ algorithm: token-bucket, capacity: {limit}, refill_tokens: 1, refill_every: 1h }}
"
        )
    };
    let routes = "  - { name: fw, match: { path_prefix: /fw }, subject: client_ip, policy: fw }
  - { name: tb, match: { path_prefix: /tb }, subject: client_ip, policy: tb }
";
    let sluice = start_ready(&yaml(&upstream, &redis.url(), &policies(2), routes)).await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    let statuses = |path: &'static str, n: usize| {
        let addr = sluice.addr();
        async move {
            let mut out = Vec::new();
            for _ in 0..n {
                out.push(get(addr, path, &[]).await.0.as_u16());
            }
            out
        }
    };
    for path in ["/fw", "/tb"] {
        // The third is denied, and that denial is cached in the sidecar.
        assert_eq!(statuses(path, 3).await, [200, 200, 429], "{path}");
    }
    let reload = |limit: u32| {
        std::fs::write(
            sluice.config_path(),
            yaml(&upstream, &redis.url(), &policies(limit), routes),
        )
        .expect("rewrite the file");
        sluice.signal("HUP");
    };
    let policy_q = |headers: &http::HeaderMap| {
        support::header(headers, "ratelimit-policy")
            .and_then(support::parse_ratelimit)
            .and_then(|p| p.param("q"))
    };

    // Lowered under the count: Redis holds 2 against a limit of 1, and
    // answers a denial with nothing left (not a reply out of range).
    reload(1);
    for path in ["/fw", "/tb"] {
        let headers = support::eventually(Duration::from_secs(5), || async {
            let (status, headers, _) = get(sluice.addr(), path, &[]).await;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{path}: {headers:?}");
            (policy_q(&headers) == Some(1)).then_some(headers)
        })
        .await;
        let state = support::header(&headers, "ratelimit")
            .and_then(support::parse_ratelimit)
            .unwrap_or_else(|| panic!("{path}: no RateLimit: {headers:?}"));
        assert_eq!(state.param("r"), Some(0), "{path}: {headers:?}");
    }

    // Raised: the fixed window admits what the count leaves (4 - 2), at
    // once, though a denial under the old numbers was cached; the bucket
    // keeps its spent tokens and refills at its rate.
    reload(4);
    support::eventually(Duration::from_secs(5), || async {
        let (status, headers, _) = get(sluice.addr(), "/tb", &[]).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "/tb: {headers:?}");
        (policy_q(&headers) == Some(4)).then_some(())
    })
    .await;
    assert_eq!(statuses("/fw", 3).await, [200, 200, 429]);
    assert_eq!(upstream.count(), 6);
    let text = scrape(admin(&sluice)).await;
    let outcome = |o: &str| {
        metric(
            &text,
            REQUESTS,
            &[("route", "fw"), ("policy", "fw"), ("outcome", o)],
        )
        .unwrap_or(0.0)
    };
    assert_eq!(outcome("incompatible"), 0.0, "{text}");
}

/// An admitted request's `RateLimit` under each algorithm, decided by
/// Redis: the same `r` and `t` as the memory store gives (draft-11's
/// available quota and effective window), from the scripts' replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_requests_t_is_its_effective_window_for_every_algorithm() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&yaml(
        &upstream,
        &redis.url(),
        support::EFFECTIVE_POLICIES,
        support::EFFECTIVE_ROUTES,
    ))
    .await;
    clear_of_window_edge(HOUR, Duration::from_secs(10)).await;
    clear_of_window_edge(Duration::from_secs(50), Duration::from_secs(5)).await;
    let failures = support::effective_window_failures(sluice.addr()).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
