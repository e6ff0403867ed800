//! The Redis store failing under the built binary: Redis killed under load
//! and replaced by an empty one, its function libraries flushed, its clients
//! paused, or not there at start. sluice must fail closed and fast, forward
//! nothing it could not decide, say so on `/readyz`, and recover by itself.
//!
//! Every test takes [`SERIAL`]: the latency bounds below are about sluice,
//! not about two tests fighting over two cores.

use crate::support;
use std::time::{Duration, Instant};

use crate::support::ops::{samples, scrape};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{
    admin, readyz, readyz_becomes, redis_yaml, sample, start_ready, Load, Shot,
};
use crate::support::{eventually, get, header, Upstream};
use http::StatusCode;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `store.budget` in [`config`].
const BUDGET: Duration = Duration::from_millis(50);
/// Scheduling slack on a loaded two-core machine, on top of the budget.
const MARGIN: Duration = Duration::from_millis(250);
/// How soon service must resume once Redis is back.
const RECOVERY: Duration = Duration::from_secs(5);

/// One route `/api` by client address under a limit no test reaches.
fn config(upstream: &Upstream, redis_url: &str) -> String {
    redis_yaml(
        upstream,
        redis_url,
        "  big: { algorithm: fixed-window, limit: 10000000, window: 1h, lease: off }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: big }\n",
    )
}

fn sum(text: &str, name: &str) -> f64 {
    samples(text)
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

fn requests(text: &str, outcome: &str) -> f64 {
    support::ops::metric(
        text,
        "sluice_requests_total",
        &[("route", "api"), ("policy", "big"), ("outcome", outcome)],
    )
    .unwrap_or(0.0)
}

/// Waits until the upstream has seen `n` more requests than `from`.
async fn forwarded_more(upstream: &Upstream, from: usize, n: usize) {
    eventually(RECOVERY, || async {
        (upstream.count() >= from + n).then_some(())
    })
    .await;
}

/// Asserts every shot is a fail-closed answer: 503 with `Retry-After: 1`.
fn all_failed_closed(what: &str, shots: &[&Shot]) {
    for shot in shots {
        assert_eq!(
            shot.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{what}: {shot:?}"
        );
        assert_eq!(shot.retry_after.as_deref(), Some("1"), "{what}: {shot:?}");
    }
}

/// The slowest of `shots`, asserted within the budget plus [`MARGIN`].
fn within_budget(what: &str, shots: &[&Shot]) -> Duration {
    let slowest = shots.iter().map(|s| s.elapsed).max().unwrap_or_default();
    assert!(
        slowest <= BUDGET + MARGIN,
        "{what}: slowest answer took {slowest:?} (budget {BUDGET:?} + {MARGIN:?}); {} answers",
        shots.len()
    );
    slowest
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_fails_closed_fast_and_a_fresh_redis_restores_service() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&config(&upstream, &redis.url())).await;
    let loads_before = sample(&sluice, "sluice_store_script_loads_total", &[])
        .await
        .unwrap_or(0.0);

    let load = Load::start(sluice.addr(), "/api", 20, Duration::from_millis(5));
    forwarded_more(&upstream, 0, 50).await;
    let killing = Instant::now();
    tokio::task::block_in_place(|| redis.kill());
    let killed = Instant::now();

    // While the load goes on, readiness fails and the breaker shows open.
    let body = readyz_becomes(
        &sluice,
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_secs(2),
    )
    .await;
    assert!(
        body["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "/readyz 503 without a reason: {body}"
    );
    eventually(Duration::from_secs(2), || async {
        (sample(&sluice, "sluice_store_breaker_open", &[]).await == Some(1.0)).then_some(())
    })
    .await;
    tokio::time::sleep_until((killed + Duration::from_millis(1500)).into()).await;
    let shots = load.stop().await;

    let after: Vec<&Shot> = shots.iter().filter(|s| s.started >= killed).collect();
    let in_flight: Vec<&Shot> = shots
        .iter()
        .filter(|s| s.started < killed && s.ended() > killing)
        .collect();
    assert!(
        after.len() >= 100,
        "only {} requests after the kill",
        after.len()
    );
    all_failed_closed("after the kill", &after);
    for shot in &in_flight {
        assert!(
            matches!(
                shot.status,
                StatusCode::OK | StatusCode::SERVICE_UNAVAILABLE
            ),
            "in flight at the kill: {shot:?}"
        );
    }
    let answered: Vec<&Shot> = shots.iter().filter(|s| s.ended() > killing).collect();
    let slowest = within_budget("after the kill", &answered);
    println!(
        "kill: {} answers after the kill, {} in flight, slowest {slowest:?}",
        after.len(),
        in_flight.len()
    );
    // Nothing reached the app but the requests answered 200.
    let ok = shots.iter().filter(|s| s.status == StatusCode::OK).count();
    assert_eq!(
        upstream.count(),
        ok,
        "forwarded without a 200 to show for it"
    );

    let text = scrape(admin(&sluice)).await;
    assert_eq!(
        support::ops::metric(&text, "sluice_forwarded_without_decision_total", &[]),
        Some(0.0),
        "{text}"
    );
    let failed = shots
        .iter()
        .filter(|s| s.status == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    assert_eq!(
        requests(&text, "unavailable") + requests(&text, "indeterminate"),
        failed as f64,
        "{text}"
    );
    assert!(sum(&text, "sluice_store_errors_total") >= 1.0, "{text}");

    // An empty Redis on the same port: no keys, no scripts.
    tokio::task::block_in_place(|| redis.restart());
    let restarted = Instant::now();
    eventually(RECOVERY, || async {
        (get(sluice.addr(), "/api", &[]).await.0 == StatusCode::OK).then_some(())
    })
    .await;
    let resumed = restarted.elapsed();
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY).await;
    println!(
        "kill: service resumed {resumed:?} after the restart, ready {:?}",
        restarted.elapsed()
    );
    let loads_after = sample(&sluice, "sluice_store_script_loads_total", &[])
        .await
        .unwrap_or(0.0);
    assert!(
        loads_after > loads_before,
        "scripts not loaded into the fresh Redis: {loads_before} -> {loads_after}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_mid_run_costs_no_request() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    // A budget wide enough for a loaded machine: what is asserted is that
    // the reload and the second FCALL cost no request, not how fast
    // they are (the benchmark measures that).
    let yaml = config(&upstream, &redis.url()).replace("  budget: 50ms\n", "  budget: 1s\n");
    assert!(yaml.contains("  budget: 1s\n"));
    let sluice = start_ready(&yaml).await;
    let mut conn = redis.connection();

    let load = Load::start(sluice.addr(), "/api", 10, Duration::from_millis(2));
    forwarded_more(&upstream, 0, 30).await;
    let loads_before = sample(&sluice, "sluice_store_script_loads_total", &[])
        .await
        .unwrap_or(0.0);
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut conn)
        .expect("FUNCTION FLUSH");
    let flushed_at = upstream.count();
    forwarded_more(&upstream, flushed_at, 200).await;
    let shots = load.stop().await;

    let failed: Vec<&Shot> = shots
        .iter()
        .filter(|s| s.status != StatusCode::OK)
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}",
        failed.len(),
        shots.len()
    );
    assert_eq!(upstream.count(), shots.len());
    let text = scrape(admin(&sluice)).await;
    let loads_after = sum(&text, "sluice_store_script_loads_total");
    assert!(
        loads_after > loads_before,
        "sluice_store_script_loads_total {loads_before} -> {loads_after}"
    );
    assert!(
        support::ops::metric(&text, "sluice_store_events_total", &[("kind", "noscript")])
            .is_some_and(|n| n >= 1.0),
        "no function-not-found counted:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_longer_than_the_budget_fails_closed_fast_and_forwards_nothing() {
    const PAUSE: Duration = Duration::from_millis(1500);
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&config(&upstream, &redis.url())).await;
    let mut conn = redis.connection();

    let load = Load::start(sluice.addr(), "/api", 20, Duration::from_millis(5));
    forwarded_more(&upstream, 0, 50).await;
    let pausing = Instant::now();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(PAUSE.as_millis() as u64)
        .arg("ALL")
        .query(&mut conn)
        .expect("CLIENT PAUSE");
    let paused = Instant::now();
    // Stop looking a little before Redis resumes.
    let looking_until = pausing + PAUSE - Duration::from_millis(100);
    tokio::time::sleep_until(looking_until.into()).await;
    let forwarded_during = upstream.count();
    let shots = load.stop().await;

    let during: Vec<&Shot> = shots
        .iter()
        .filter(|s| s.started >= paused && s.ended() <= looking_until)
        .collect();
    assert!(
        during.len() >= 20,
        "only {} requests during the pause",
        during.len()
    );
    all_failed_closed("during the pause", &during);
    let answered: Vec<&Shot> = shots
        .iter()
        .filter(|s| s.ended() > pausing && s.started < looking_until)
        .collect();
    let slowest = within_budget("during the pause", &answered);
    println!(
        "pause: {} answers during the pause, slowest {slowest:?}",
        during.len()
    );
    let admitted_before = shots
        .iter()
        .filter(|s| s.started < paused && s.status == StatusCode::OK)
        .count();
    assert_eq!(
        forwarded_during, admitted_before,
        "forwarded while Redis was paused"
    );
    for shot in shots.iter().filter(|s| s.started >= paused) {
        assert_ne!(
            shot.status,
            StatusCode::OK,
            "admitted during the pause: {shot:?}"
        );
    }
    let text = scrape(admin(&sluice)).await;
    assert_eq!(
        support::ops::metric(&text, "sluice_forwarded_without_decision_total", &[]),
        Some(0.0),
        "{text}"
    );
    assert!(
        support::ops::metric(&text, "sluice_store_errors_total", &[("kind", "timeouts")])
            .is_some_and(|n| n >= 1.0),
        "no timeout counted:\n{text}"
    );

    eventually(RECOVERY, || async {
        (get(sluice.addr(), "/api", &[]).await.0 == StatusCode::OK).then_some(())
    })
    .await;
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_started_before_its_redis_is_not_ready_until_redis_answers() {
    let _serial = SERIAL.lock().await;
    let port = support::free_port();
    let upstream = Upstream::start().await;
    let sluice = support::Sidecar::start(&config(&upstream, &format!("redis://127.0.0.1:{port}")));

    let (status, body) = readyz(&sluice).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["status"], "not ready", "{body}");
    assert!(
        body["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "no reason given: {body}"
    );
    let (status, headers, _) = get(sluice.addr(), "/api", &[]).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(header(&headers, "retry-after"), Some("1"));
    assert_eq!(upstream.count(), 0, "forwarded with no Redis to decide");

    let _redis = tokio::task::block_in_place(|| RedisServer::builder().start_on(port));
    let started = Instant::now();
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY).await;
    println!("ready {:?} after Redis started", started.elapsed());
    assert_eq!(get(sluice.addr(), "/api", &[]).await.0, StatusCode::OK);
    assert_eq!(upstream.count(), 1);
}

/// `INFO memory`'s `used_memory`.
fn used_memory(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(conn)
        .expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// Fills Redis past a `maxmemory` it is then held over (junk without a
/// TTL, a limit half a MiB below what it holds: transient buffers, a
/// client's query buffer among them, count in `used_memory`, and a limit
/// just reached comes and goes with them). After sluice has loaded its
/// libraries: a Redis full from the start refuses those too.
fn fill(conn: &mut redis::Connection) {
    let junk = vec![b'x'; 16 * 1024];
    for i in 0..64 {
        let _: () = redis::cmd("SET")
            .arg(format!("junk:{i}"))
            .arg(&junk)
            .query(conn)
            .expect("SET junk");
    }
    let limit = used_memory(conn) - 512 * 1024;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(limit)
        .query(conn)
        .expect("CONFIG SET maxmemory");
    let refused: redis::RedisResult<()> = redis::cmd("SET").arg("junk:more").arg(&junk).query(conn);
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.code()),
        Some("OOM"),
        "{refused:?}"
    );
}

/// An `OOM` is Redis answering, at once: the request it concerns gets the
/// failure answer, and nobody else is refused for it. Asserted: while
/// Redis is full, each of one client's requests (more than the breaker's
/// minimum of calls, every one refused) is 503 with `Retry-After: 1`,
/// counted once as `oom`; the breaker never opens (no opening counted or
/// logged, `/readyz` stays 200); and the moment Redis has room again,
/// another client's very first request is decided, where a breaker opened
/// by the first client's refusals would answer it 503 for a cool-down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_fails_each_request_closed_and_never_opens_the_breaker() {
    /// More than the breaker's minimum of calls (10), all refused.
    const REQUESTS: usize = 30;
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::builder()
        .config("maxmemory-policy noeviction")
        .start();
    let upstream = Upstream::start().await;
    let yaml = config(&upstream, &redis.url())
        .replace("subject: client_ip", "subject: header:X-Client")
        // Long enough that an opened breaker would still refuse at the end.
        .replace("  breaker_cooldown: 500ms\n", "  breaker_cooldown: 60s\n");
    assert!(yaml.contains("breaker_cooldown: 60s"));
    let sluice = start_ready(&yaml).await;
    let first = [("x-client", "first")];
    let other = [("x-client", "other")];
    assert_eq!(get(sluice.addr(), "/api", &first).await.0, StatusCode::OK);

    let mut conn = redis.connection();
    fill(&mut conn);
    for _ in 0..REQUESTS {
        let (status, headers, _) = get(sluice.addr(), "/api", &first).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&headers, "retry-after"), Some("1"));
    }
    assert_eq!(upstream.count(), 1, "forwarded while Redis was full");
    let (ready, body) = readyz(&sluice).await;
    assert_eq!(
        ready,
        StatusCode::OK,
        "not ready while Redis answers: {body}"
    );
    let text = scrape(admin(&sluice)).await;
    let kind = |kind: &str| {
        support::ops::metric(&text, "sluice_store_errors_total", &[("kind", kind)]).unwrap_or(0.0)
    };
    assert_eq!(kind("oom"), REQUESTS as f64, "{text}");
    assert_eq!(kind("refused"), 0.0, "{text}");
    assert_eq!(kind("breaker_rejected"), 0.0, "{text}");
    // Nothing ran, so nothing is indeterminate.
    assert_eq!(requests(&text, "unavailable"), REQUESTS as f64, "{text}");
    assert_eq!(requests(&text, "indeterminate"), 0.0, "{text}");
    assert_eq!(
        support::ops::metric(&text, "sluice_store_breaker_opened_total", &[]),
        Some(0.0),
        "{text}"
    );
    let logs = sluice.logs().join("\n");
    assert!(
        logs.contains("redis: out of memory")
            && logs.contains("command not allowed when used memory"),
        "no log line says Redis is out of memory:\n{logs}"
    );
    assert!(
        !logs.contains("store: stopped answering"),
        "the breaker opened:\n{logs}"
    );

    // Room again: the other client is decided at once, no cool-down.
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(0)
        .query(&mut conn)
        .expect("CONFIG SET maxmemory");
    assert_eq!(get(sluice.addr(), "/api", &other).await.0, StatusCode::OK);
    assert_eq!(get(sluice.addr(), "/api", &first).await.0, StatusCode::OK);
    assert_eq!(upstream.count(), 3);
}
