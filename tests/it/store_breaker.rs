//! The store breaker under the built binary, with the thresholds a file
//! gets when it writes none of them: a few moments in which every call in
//! flight misses the budget, amid many decided ones, must not refuse
//! everybody for a cool-down; a store that stays too slow must still open
//! it. Redis sits behind a relay that holds its replies back (a slow link,
//! or a slow Redis), switched on and off by the test.

use crate::support;
use std::time::{Duration, Instant};

use crate::support::cgroup::{launcher_into, CpuCgroup};
use crate::support::faults::DelayRelay;
use crate::support::ops::scrape;
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{admin, readyz_becomes, redis_yaml, start_ready, Load, Shot};
use crate::support::{eventually, get, Sidecar, Upstream};
use http::StatusCode;

/// Wide enough that a loaded two-core machine does not miss it by itself:
/// what misses it below is the relay.
const BUDGET: Duration = Duration::from_millis(200);
/// Well above the budget, so every reply held back misses it; short, so
/// the replies queued behind a held-back one are not held long.
const HELD: Duration = Duration::from_millis(500);
/// Closed-loop clients: at most this many calls in flight at once, and so
/// at most about this many failures each time the relay holds replies.
const LOOPS: usize = 8;
/// Decided answers between two slow moments: far more than the failures a
/// slow moment brings, inside a window of the default 10 s.
const DECIDED_BETWEEN: usize = 300;

fn config(upstream: &Upstream, redis_url: &str) -> String {
    let yaml = redis_yaml(
        upstream,
        redis_url,
        "  big: { algorithm: fixed-window, limit: 10000000, window: 1h, lease: off }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: big }\n",
    )
    .replace(
        "  budget: 50ms\n",
        &format!("  budget: {}ms\n", BUDGET.as_millis()),
    );
    assert!(yaml.contains("  budget: 200ms\n"));
    // Only `breaker_failures` and `breaker_cooldown` are written: the
    // window, the minimum of calls and the rate are the defaults.
    assert!(!yaml.contains("breaker_window") && !yaml.contains("breaker_min_calls"));
    yaml
}

async fn errors(sluice: &Sidecar, kind: &str) -> f64 {
    let text = scrape(admin(sluice)).await;
    support::ops::metric(&text, "sluice_store_errors_total", &[("kind", kind)]).unwrap_or(0.0)
}

async fn opened(sluice: &Sidecar) -> f64 {
    let text = scrape(admin(sluice)).await;
    support::ops::metric(&text, "sluice_store_breaker_opened_total", &[]).unwrap_or(0.0)
}

/// Waits until the upstream has seen `n` more requests than now.
async fn decided_more(upstream: &Upstream, n: usize) {
    let from = upstream.count();
    eventually(Duration::from_secs(30), || async {
        (upstream.count() >= from + n).then_some(())
    })
    .await;
}

/// Holds Redis's replies back until every loop's call missed the budget
/// at least once, then lets them through again.
async fn slow_moment(sluice: &Sidecar, relay: &DelayRelay) {
    let before = errors(sluice, "timeouts").await;
    relay.set_delay(HELD);
    eventually(Duration::from_secs(10), || async {
        (errors(sluice, "timeouts").await >= before + LOOPS as f64).then_some(())
    })
    .await;
    relay.set_delay(Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moments_of_calls_over_the_budget_do_not_refuse_everybody_but_a_slow_store_does() {
    let redis = RedisServer::start();
    let relay = DelayRelay::start(redis.port()).await;
    let upstream = Upstream::start().await;
    let sluice = start_ready(&config(&upstream, &relay.url())).await;

    let load = Load::start(sluice.addr(), "/api", LOOPS, Duration::from_millis(5));
    for _ in 0..3 {
        decided_more(&upstream, DECIDED_BETWEEN).await;
        slow_moment(&sluice, &relay).await;
    }
    decided_more(&upstream, DECIDED_BETWEEN).await;
    let shots = load.stop().await;

    // Each slow moment failed a streak of calls (every loop's, more than
    // `breaker_failures`), and not one request was refused without asking
    // Redis: each 503 is a call that waited out its own budget.
    let timeouts = errors(&sluice, "timeouts").await;
    let rejected = errors(&sluice, "breaker_rejected").await;
    let failed: Vec<&Shot> = shots
        .iter()
        .filter(|s| s.status != StatusCode::OK)
        .collect();
    let ok = shots.len() - failed.len();
    println!(
        "slow moments: {ok} decided, {} failed, {timeouts} timeouts, {rejected} refused by the breaker",
        failed.len()
    );
    assert!(timeouts >= 3.0 * LOOPS as f64, "{timeouts} timeouts");
    assert_eq!(opened(&sluice).await, 0.0, "the breaker opened");
    assert_eq!(rejected, 0.0);
    for shot in &failed {
        assert_eq!(shot.status, StatusCode::SERVICE_UNAVAILABLE, "{shot:?}");
        // The budget runs from when sluice read the request, after the
        // client started its clock; a quarter off for timer rounding.
        assert!(
            shot.elapsed >= BUDGET * 3 / 4,
            "answered 503 without waiting for Redis: {shot:?}"
        );
    }
    // Most requests were decided: far fewer failed than were admitted.
    assert!(
        failed.len() * 4 <= shots.len(),
        "{} of {} requests failed",
        failed.len(),
        shots.len()
    );
    assert_eq!(upstream.count(), ok, "forwarded without a 200");

    // Redis stays that slow: once the decided calls have left the window,
    // the failures alone are the rate, and the breaker opens: refused at
    // once, and not ready.
    let load = Load::start(sluice.addr(), "/api", LOOPS, Duration::from_millis(5));
    relay.set_delay(HELD);
    let slowed = Instant::now();
    eventually(Duration::from_secs(30), || async {
        (opened(&sluice).await >= 1.0).then_some(())
    })
    .await;
    println!("slow store: breaker open {:?} after", slowed.elapsed());
    readyz_becomes(
        &sluice,
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_secs(5),
    )
    .await;
    // The load goes on until the open breaker has refused some of it (the
    // shots in flight when it opened still waited out their budget).
    eventually(Duration::from_secs(10), || async {
        (errors(&sluice, "breaker_rejected").await >= 1.0).then_some(())
    })
    .await;
    let shots = load.stop().await;
    assert!(
        shots
            .iter()
            .any(|s| s.status == StatusCode::SERVICE_UNAVAILABLE && s.elapsed < BUDGET / 2),
        "no request refused at once while the breaker was open"
    );
    assert!(errors(&sluice, "breaker_rejected").await >= 1.0);

    // Fast again: the probe closes it.
    relay.set_delay(Duration::ZERO);
    eventually(Duration::from_secs(10), || async {
        (get(sluice.addr(), "/api", &[]).await.0 == StatusCode::OK).then_some(())
    })
    .await;
    readyz_becomes(&sluice, StatusCode::OK, Duration::from_secs(10)).await;

    // The outage is in the logs: a warning when the store stopped
    // answering, a line when it answered again; once per opening, never
    // once per request (hundreds were refused).
    let said = |start: &'static str, level: &'static str| {
        let logs = sluice.logs();
        logs.iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|v| {
                v["level"] == level && v["message"].as_str().is_some_and(|m| m.starts_with(start))
            })
            .count()
    };
    let ended = eventually(Duration::from_secs(5), || async {
        let n = said("store: answering again", "INFO");
        (n > 0).then_some(n)
    })
    .await;
    let began = said("store: stopped answering", "WARN");
    // It says why: Redis was slow, so calls timed out, or new connections
    // (the ones that timed out are replaced) could not be set up in time.
    let causes: Vec<String> = sluice
        .logs()
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| {
            v["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("store: stopped answering"))
        })
        .map(|v| v["cause"].to_string())
        .collect();
    assert!(
        !causes.is_empty()
            && causes
                .iter()
                .all(|c| c == "\"timeouts\"" || c == "\"unreachable\""),
        "causes named: {causes:?}"
    );
    let openings = opened(&sluice).await;
    assert!(
        began >= 1 && began as f64 <= openings,
        "{began} warnings, {openings} openings"
    );
    assert!(ended <= began, "{ended} recoveries after {began} outages");
}

/// sluice starved of CPU by its cgroup's quota (a pod's CPU limit on a
/// busy node), Redis healthy and fast: the time sluice itself did not run
/// is not Redis's. Asserted: under a closed-loop load for [`STARVED_FOR`],
/// with the quota throttling sluice in many periods, not one request is
/// answered 503, and the breaker never opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_starved_sidecar_does_not_open_its_breaker_against_a_healthy_redis() {
    /// 5 ms of CPU in every 100 ms, every thread of sluice together.
    const QUOTA: Duration = Duration::from_millis(5);
    const PERIOD: Duration = Duration::from_millis(100);
    const STARVED_FOR: Duration = Duration::from_secs(8);
    /// The chart's budget: a starved sidecar misses it on every freeze.
    const TIGHT: Duration = Duration::from_millis(25);
    let cgroup = CpuCgroup::new();
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = redis_yaml(
        &upstream,
        &redis.url(),
        "  big: { algorithm: fixed-window, limit: 10000000, window: 1h, lease: off }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: big }\n",
    )
    .replace(
        "  budget: 50ms\n",
        &format!("  budget: {}ms\n", TIGHT.as_millis()),
    );
    let launch = launcher_into(&cgroup.procs());
    let launch: Vec<&str> = launch.iter().map(String::as_str).collect();
    let sluice = Sidecar::start_via(&yaml, &[], &launch);
    readyz_becomes(&sluice, StatusCode::OK, Duration::from_secs(10)).await;

    cgroup.limit(QUOTA, PERIOD);
    let load = Load::start(sluice.addr(), "/api", LOOPS * 2, Duration::ZERO);
    tokio::time::sleep(STARVED_FOR).await;
    let shots = load.stop().await;
    let throttled = cgroup.throttled();
    let text = scrape(admin(&sluice)).await;
    let events = |kind: &str| {
        support::ops::metric(&text, "sluice_store_events_total", &[("kind", kind)]).unwrap_or(0.0)
    };
    let errors = |kind: &str| {
        support::ops::metric(&text, "sluice_store_errors_total", &[("kind", kind)]).unwrap_or(0.0)
    };
    let refused = shots
        .iter()
        .filter(|s| s.status == StatusCode::SERVICE_UNAVAILABLE)
        .count();
    let slowest = shots.iter().map(|s| s.elapsed).max().unwrap_or_default();
    println!(
        "starved: {} requests in {STARVED_FOR:?}, throttled in {throttled} periods, {refused} answered 503, \
         slowest {slowest:?}; {} timeouts, {} given up starved, {} budget spent before sending",
        shots.len(),
        errors("timeouts"),
        events("starved"),
        errors("budget_spent"),
    );
    assert!(
        throttled >= 10,
        "the quota hardly throttled sluice ({throttled} periods): no starvation tested"
    );
    assert_eq!(refused, 0, "answered 503 while Redis was healthy");
    assert!(shots.iter().all(|s| s.status == StatusCode::OK));
    assert_eq!(
        support::ops::metric(&text, "sluice_store_breaker_opened_total", &[]),
        Some(0.0),
        "the breaker opened: {text}"
    );
    assert_eq!(errors("breaker_rejected"), 0.0);
    drop(sluice);
}
