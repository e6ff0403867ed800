//! `store.scripts`: a Redis user without Functions (as on the stores that
//! have none) limits exactly with `auto` and `eval`, cached scripts run
//! with `EVALSHA` only; `functions` there is not ready and says why; a
//! `SCRIPT FLUSH` under load costs one reload and no second charge; a
//! Cluster in eval mode, each node reloading its own scripts; a Sentinel
//! primary in eval mode, across a failover.
//!
//! Every test takes [`SERIAL`]: they start Redis and sidecars, and on two
//! cores their bursts would otherwise crowd each other's budgets.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::task::JoinSet;

use crate::support::client::{build, http1_client, send};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{
    commandstats, readyz, readyz_becomes, redis_yaml, reset_stats, sample, spread, start_ready,
    state_numbers, READY_DEADLINE,
};
use crate::support::topology::{RedisCluster, SentinelSet};
use crate::support::{clear_of_window_edge, count, eventually, Sidecar, Upstream};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const HOUR: Duration = Duration::from_secs(3600);
const EDGE_MARGIN: Duration = Duration::from_secs(20);

/// What a user needs for cached scripts (docs/REDIS.md): `EVALSHA`,
/// `SCRIPT LOAD` and the commands inside the scripts, on the key prefix.
/// No `FUNCTION`, no `FCALL`, no `EVAL`: `-@all` denies them.
const EVAL_ACL: &str = "user sluice on >pw resetchannels ~sluice:* -@all \
     +evalsha +script|load +ping +time +get +set +pexpire +touch \
     +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore";

/// Ten an hour, per algorithm, and a route to each.
const POLICIES: &str = "  fw: { algorithm: fixed-window, limit: 10, window: 1h }
  sc: { algorithm: sliding-counter, limit: 10, window: 1h }
  sl: { algorithm: sliding-log, limit: 10, window: 1h }
  tb: { algorithm: token-bucket, capacity: 10, refill_tokens: 1, refill_every: 1h }
  gc: { algorithm: gcra, limit: 10, window: 1h, burst: 10 }
  five: { algorithm: gcra, limit: 5, window: 1h, burst: 5 }
";
const ALGORITHMS: [&str; 5] = ["fw", "sc", "sl", "tb", "gc"];

fn routes(subject: &str) -> String {
    let mut routes: String = ALGORITHMS
        .iter()
        .map(|a| {
            format!("  - {{ name: {a}, match: {{ path_prefix: /{a} }}, subject: {subject}, policy: {a} }}\n")
        })
        .collect();
    // Two limits on one route: their keys are in different slots.
    routes.push_str(&format!(
        "  - name: both
    match: {{ path_prefix: /both }}
    limits:
      - {{ policy: fw, subject: {subject} }}
      - {{ policy: five, subject: {subject} }}
"
    ));
    routes
}

/// The sidecar's file for `url`, `store.scripts: <scripts>`, budget 1s
/// (these tests count decisions, not time).
fn yaml(upstream: &Upstream, store: &str, scripts: &str, subject: &str) -> String {
    let yaml = redis_yaml(upstream, "URL", POLICIES, &routes(subject));
    assert!(yaml.contains("  url: URL\n") && yaml.contains("  budget: 50ms\n"));
    yaml.replace("  url: URL\n", &format!("{store}  scripts: {scripts}\n"))
        .replace("  budget: 50ms\n", "  budget: 1s\n")
}

/// A Redis whose `sluice` user has no Functions and no `EVAL`, checked.
fn redis_without_functions() -> RedisServer {
    let redis = RedisServer::builder()
        .config("user default off")
        .config("user admin on >admin-pw ~* &* +@all")
        .config(EVAL_ACL)
        .admin("admin", "admin-pw")
        .start();
    let mut as_sluice = redis::Client::open(redis.url_as("sluice", "pw"))
        .expect("client")
        .get_connection()
        .expect("connect as sluice");
    for denied in [
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("#!lua name=x\nredis.register_function('x', function() return 1 end)")
            .clone(),
        redis::cmd("FCALL").arg("x").arg(1).arg("sluice:k").clone(),
        redis::cmd("EVAL")
            .arg("return 1")
            .arg(1)
            .arg("sluice:k")
            .clone(),
    ] {
        let answer: redis::RedisResult<redis::Value> = denied.query(&mut as_sluice);
        let error = answer.expect_err("the sluice user may run it");
        assert_eq!(error.code(), Some("NOPERM"), "{error}");
    }
    redis
}

fn calls(stats: &[(String, u64)], name: &str) -> u64 {
    stats
        .iter()
        .find(|(n, _)| n == name)
        .map_or(0, |(_, calls)| *calls)
}

/// Two sidecars on `redis` as the user without Functions, with `scripts`:
/// every limit exact, `EVALSHA` only.
async fn two_sidecars_limit_exactly(scripts: &str) {
    let _serial = SERIAL.lock().await;
    let redis = redis_without_functions();
    let upstream = Upstream::start().await;
    let store = format!("  url: {}\n", redis.url_as("sluice", "pw"));
    let yaml = yaml(&upstream, &store, scripts, "client_ip");
    let sidecars = [start_ready(&yaml).await, start_ready(&yaml).await];
    for sidecar in &sidecars {
        let (status, body) = readyz(sidecar).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["scripts"], "eval", "{body}");
        assert!(
            sidecar
                .logs()
                .iter()
                .any(|l| l.contains("scripts loaded") && l.contains("eval") && l.contains(scripts)),
            "the mode is not logged at start:\n{}",
            sidecar.logs().join("\n")
        );
    }
    let addrs: Vec<SocketAddr> = sidecars.iter().map(|s| s.addr()).collect();
    let mut admin = redis.connection();
    reset_stats(&mut admin);
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    for (i, a) in ALGORITHMS.iter().enumerate() {
        let statuses = spread(&addrs, &format!("/{a}/x"), 40, 40).await;
        assert_eq!(count(&statuses, StatusCode::OK), 10, "{a}: {statuses:?}");
        assert_eq!(
            count(&statuses, StatusCode::TOO_MANY_REQUESTS),
            30,
            "{a}: {statuses:?}"
        );
        assert_eq!(upstream.count(), 10 * (i + 1), "{a}");
    }
    let stats = commandstats(&mut admin);
    assert!(calls(&stats, "evalsha") >= 50, "{stats:?}");
    for never in ["fcall", "eval", "function|load"] {
        assert_eq!(calls(&stats, never), 0, "{never}: {stats:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_functions_limits_exactly_with_scripts_auto() {
    two_sidecars_limit_exactly("auto").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_functions_limits_exactly_with_scripts_eval() {
    two_sidecars_limit_exactly("eval").await;
}

/// In eval mode a route's limits go one call each (their keys are in
/// different slots), and what a later limit refuses is given back to the
/// earlier: the first limit keeps exactly what was admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_in_eval_mode_charge_only_what_was_admitted() {
    let _serial = SERIAL.lock().await;
    let redis = redis_without_functions();
    let upstream = Upstream::start().await;
    let store = format!("  url: {}\n", redis.url_as("sluice", "pw"));
    let sluice = start_ready(&yaml(&upstream, &store, "auto", "client_ip")).await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    // fw (10) then five (5): five admitted, and fw charged for five only.
    let statuses = spread(&[sluice.addr()], "/both/x", 20, 20).await;
    assert_eq!(count(&statuses, StatusCode::OK), 5, "{statuses:?}");
    let mut admin = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sluice:{fw:*")
        .query(&mut admin)
        .expect("KEYS");
    let states: Vec<&String> = keys.iter().filter(|k| !k.contains(":e:")).collect();
    assert_eq!(states.len(), 1, "{keys:?}");
    // Fixed window: `t`, the window's start, its count.
    let numbers = state_numbers(&mut admin, states[0]).expect("fw's state");
    assert_eq!(numbers.get(2), Some(&5), "{numbers:?}");
    // Every request fw admitted and five refused was given back: fw kept
    // 5 of its admissions, so the refunds are its admissions less 5. It
    // admitted at least 10 (a refusal by fw means 10 were held then) and
    // at most all 20; more than 10 when a refund landed before a later
    // request reached fw, which parallel requests may or may not see.
    let refunds = sample(&sluice, "sluice_refunds_total", &[("result", "refunded")])
        .await
        .expect("refunds counted");
    assert!((5.0..=15.0).contains(&refunds), "{refunds}");
    assert_eq!(calls(&commandstats(&mut admin), "fcall"), 0);
}

/// `functions` insists: on a user without them the sidecar is not ready,
/// and `/readyz` and `sluice check --connect` say why and what to set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_functions_without_functions_is_not_ready_and_says_why() {
    let _serial = SERIAL.lock().await;
    let redis = redis_without_functions();
    let upstream = Upstream::start().await;
    let store = format!("  url: {}\n", redis.url_as("sluice", "pw"));
    let yaml = yaml(&upstream, &store, "functions", "client_ip");
    let sluice = Sidecar::start(&yaml);
    let reason = eventually(READY_DEADLINE, || async {
        let (status, body) = readyz(&sluice).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
        let reason = body["reason"].as_str().unwrap_or_default().to_owned();
        reason.contains("store.scripts").then_some(reason)
    })
    .await;
    assert!(
        reason.contains("Redis Functions are not available")
            && reason.contains("function|load")
            && reason.contains("auto or eval"),
        "{reason}"
    );
    assert_eq!(
        get_status(sluice.addr(), "/fw/x").await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(upstream.count(), 0);

    // `sluice check --connect` stops at the scripts, saying the same.
    let dir = tempfile::tempdir().expect("temp dir");
    let (code, stdout) = check_connect(dir.path(), &yaml);
    assert_eq!(code, Some(1), "{stdout}");
    let failed = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("FAIL"))
        .unwrap_or_default();
    assert!(
        failed.contains("scripts:") && failed.contains("set it to auto or eval"),
        "{stdout}"
    );
    // With `auto`, the same user passes every step, in eval mode.
    let (code, stdout) = check_connect(
        dir.path(),
        &yaml.replace("scripts: functions", "scripts: auto"),
    );
    assert_eq!(code, Some(0), "{stdout}");
    assert!(
        stdout.contains("ok    scripts: eval (store.scripts: auto)")
            && stdout.contains("decided (EVALSHA"),
        "{stdout}"
    );
}

/// A `SCRIPT FLUSH` while requests run: the next call meets NOSCRIPT,
/// loads the script and runs it once more with the same evaluation id;
/// the limit stays exact, nothing charged twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_flush_costs_one_reload_and_no_second_charge() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let store = format!("  url: {}\n", redis.url());
    let sluice = start_ready(&yaml(&upstream, &store, "eval", "client_ip")).await;
    let mut admin = redis.connection();
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    for path in ["/fw/x", "/sl/x", "/both/x"] {
        let statuses = spread(&[sluice.addr()], path, 4, 1).await;
        assert_eq!(count(&statuses, StatusCode::OK), 4, "{path}: {statuses:?}");
    }
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut admin)
        .expect("SCRIPT FLUSH");
    let noscript = || async {
        sample(
            &sluice,
            "sluice_store_events_total",
            &[("kind", "noscript")],
        )
        .await
        .unwrap_or(0.0)
    };
    let before = noscript().await;
    // Each route counts its own: fw and sl 4 of 10 spent, both 4 of 5.
    let fw = spread(&[sluice.addr()], "/fw/x", 20, 10).await;
    assert_eq!(count(&fw, StatusCode::OK), 6, "{fw:?}");
    let sl = spread(&[sluice.addr()], "/sl/x", 20, 10).await;
    assert_eq!(count(&sl, StatusCode::OK), 6, "{sl:?}");
    let both = spread(&[sluice.addr()], "/both/x", 20, 10).await;
    assert_eq!(count(&both, StatusCode::OK), 1, "{both:?}");
    assert!(noscript().await > before, "no NOSCRIPT was met");
    assert_eq!(
        count(&fw, StatusCode::SERVICE_UNAVAILABLE) + count(&sl, StatusCode::SERVICE_UNAVAILABLE),
        0
    );
    let stats = commandstats(&mut admin);
    assert_eq!(calls(&stats, "eval"), 0, "{stats:?}");
}

/// What a cluster user needs in eval mode: [`EVAL_ACL`], `CLUSTER SLOTS`,
/// which sluice reads the slot map from, and `ASKING` (a slot being
/// moved).
const CLUSTER_EVAL_ACL: &str = "user sluice on >pw resetchannels ~sluice:* -@all \
     +evalsha +script|load +ping +time +get +set +pexpire +touch \
     +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore +cluster|slots +asking";

/// A Cluster whose user has no Functions: `auto` settles on cached
/// scripts, every subject is limited exactly on whichever node owns it,
/// and a node whose scripts are flushed reloads its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_without_functions_limits_exactly_and_reloads_per_node() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::builder().config(CLUSTER_EVAL_ACL).start();
    let urls = cluster.urls_as("sluice", "pw");
    let upstream = Upstream::start().await;
    let store = format!(
        "  topology: cluster\n  nodes: {}\n",
        RedisCluster::yaml_list(&urls[..1])
    );
    let sluice = start_ready(&yaml(&upstream, &store, "auto", "header:X-API-Key")).await;
    assert_eq!(readyz(&sluice).await.1["scripts"], "eval");
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    for a in ["fw", "sl", "both"] {
        let limit = if a == "both" { 5 } else { 10 };
        for (key, s) in per_key(sluice.addr(), &format!("/{a}"), "a", 6, 14).await {
            assert_eq!(count(&s, StatusCode::OK), limit, "{a} {key}: {s:?}");
        }
    }
    // Every primary forgets its scripts; new subjects, spread over them.
    for port in cluster.primaries() {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query(&mut cluster.connection(port))
            .expect("SCRIPT FLUSH");
    }
    for (key, s) in per_key(sluice.addr(), "/gc", "b", 6, 14).await {
        assert_eq!(count(&s, StatusCode::OK), 10, "gc {key}: {s:?}");
    }
    let noscript = sample(
        &sluice,
        "sluice_store_events_total",
        &[("kind", "noscript")],
    )
    .await
    .unwrap_or(0.0);
    assert!(noscript >= 1.0, "no NOSCRIPT was met");
    readyz_becomes(&sluice, StatusCode::OK, READY_DEADLINE).await;
}

/// What a Sentinel-managed primary's user needs in eval mode:
/// [`EVAL_ACL`] and `ROLE`, which the client checks the primary with.
const SENTINEL_EVAL_ACL: &str = "user sluice on >pw resetchannels ~sluice:* -@all \
     +evalsha +script|load +ping +time +get +set +pexpire +touch \
     +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore +role";

/// Sentinel in eval mode: exact on the primary, and after a failover on
/// the promoted replica, whose script cache nothing filled but NOSCRIPT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_primary_without_functions_limits_exactly_across_a_failover() {
    let _serial = SERIAL.lock().await;
    let set = SentinelSet::start_with(RedisServer::builder().config(SENTINEL_EVAL_ACL));
    let upstream = Upstream::start().await;
    let store = format!(
        "  topology: sentinel\n  sentinel:\n    master: {}\n    nodes: {}\n    username: sluice\n    password: pw\n",
        SentinelSet::MASTER,
        RedisCluster::yaml_list(&set.urls())
    );
    let sluice = start_ready(&yaml(&upstream, &store, "auto", "header:X-API-Key")).await;
    assert_eq!(readyz(&sluice).await.1["scripts"], "eval");
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    for (key, s) in per_key(sluice.addr(), "/fw", "a", 4, 14).await {
        assert_eq!(count(&s, StatusCode::OK), 10, "fw {key}: {s:?}");
    }

    let first = set.current_primary();
    let promoted = set.failover();
    assert_ne!(first, promoted);
    let (old, new) = if promoted == set.replica.port() {
        (&set.primary, &set.replica)
    } else {
        (&set.replica, &set.primary)
    };
    // The Sentinels turn the old primary into a replica shortly after:
    // from then on it refuses sluice's writes (READONLY).
    // A node being turned may close the connection that asks: asked again.
    eventually(Duration::from_secs(20), || async {
        let role: Option<Vec<redis::Value>> = redis::cmd("ROLE").query(&mut old.connection()).ok();
        role.filter(|r| r.first() == Some(&redis::Value::BulkString(b"slave".to_vec())))
            .map(|_| ())
    })
    .await;
    // Until sluice reconnects to the new primary, a request may get 503:
    // one new subject per try, so no try counts against the next ones.
    let mut tries = 0;
    eventually(Duration::from_secs(10), || {
        tries += 1;
        let key = format!("probe-{tries}");
        let addr = sluice.addr();
        async move {
            let request = build(
                addr,
                Method::GET,
                "/sl/x",
                &[("x-api-key", key.as_str())],
                Bytes::new(),
            );
            (send(&http1_client(), request).await.0 == StatusCode::OK).then_some(())
        }
    })
    .await;
    for a in ["fw", "sl", "both"] {
        let limit = if a == "both" { 5 } else { 10 };
        for (key, s) in per_key(sluice.addr(), &format!("/{a}"), "b", 4, 14).await {
            assert_eq!(count(&s, StatusCode::OK), limit, "{a} {key}: {s:?}");
        }
    }
    // Decided on the new primary, in eval mode, its scripts loaded there.
    let stats = commandstats(&mut new.connection());
    assert!(calls(&stats, "evalsha") > 0, "{stats:?}");
    assert!(calls(&stats, "script|load") > 0, "{stats:?}");
    assert_eq!(calls(&stats, "fcall"), 0, "{stats:?}");
}

/// `per_key` requests for each of `keys` API keys (`<tag>-<n>`), at most
/// 14 in flight; the statuses per key.
async fn per_key(
    addr: SocketAddr,
    path: &str,
    tag: &str,
    keys: usize,
    per_key: usize,
) -> HashMap<String, Vec<StatusCode>> {
    let client = http1_client();
    let gate = Arc::new(tokio::sync::Semaphore::new(14));
    let mut tasks = JoinSet::new();
    for i in 0..keys * per_key {
        let (client, gate) = (client.clone(), gate.clone());
        let key = format!("{tag}-{}", i % keys);
        let path = format!("{path}/x");
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore open");
            let headers = [("x-api-key", key.as_str())];
            let request = build(addr, Method::GET, &path, &headers, Bytes::new());
            (key.clone(), send(&client, request).await.0)
        });
    }
    let mut out: HashMap<String, Vec<StatusCode>> = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((key, status)) => out.entry(key).or_default().push(status),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    assert_eq!(out.len(), keys);
    out
}

async fn get_status(addr: SocketAddr, path: &str) -> StatusCode {
    crate::support::get(addr, path, &[]).await.0
}

/// `sluice check --connect` on `yaml`: its exit code and what it printed.
fn check_connect(dir: &std::path::Path, yaml: &str) -> (Option<i32>, String) {
    let path = dir.join("check.yaml");
    std::fs::write(&path, yaml).expect("write the file");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("check")
        .arg("--config")
        .arg(&path)
        .arg("--connect")
        .env_remove("SLUICE_CONFIG")
        .stdin(Stdio::null())
        .output()
        .expect("run sluice check");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
