//! `on_failure: local` under the built binary: three sidecars share one
//! real Redis with `local_share: 3`; with Redis killed each decides alone
//! within a third of the limit (429s, never 503s, nothing forwarded
//! without a decision), and with Redis back they share the limit again.

use std::time::{Duration, Instant};

use crate::support::ops::{metric, requests_counted, scrape};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{admin, readyz, redis_yaml, window_count, READY_DEADLINE};
use crate::support::{clear_of_window_edge, eventually, get, header, Sidecar, Upstream};
use http::StatusCode;
use serde_json::json;

/// The shared limit, per day so no run straddles a window edge
/// ([`clear_of_window_edge`] waits out the last minute of one).
const LIMIT: usize = 30;
const SHARE: usize = 3;
const WINDOW: Duration = Duration::from_secs(24 * 3600);
/// How soon after Redis is back every sidecar must decide on it again.
const BACK_WITHIN: Duration = Duration::from_secs(3);

/// One route `/api` by client address (one subject: every request comes
/// from 127.0.0.1, and the sidecars share the pseudonym key), decided
/// locally when Redis cannot. The over-limit cache is off, so every 429
/// after the outage is Redis's own.
fn config(upstream: &Upstream, redis: &RedisServer) -> String {
    redis_yaml(
        upstream,
        &redis.url(),
        &format!("  capped: {{ algorithm: fixed-window, limit: {LIMIT}, window: 24h }}\n"),
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: capped }\n",
    )
    .replace(
        "  on_failure: deny\n",
        &format!("  on_failure: local\n  local_share: {SHARE}\n"),
    )
    .replace("deny_cache_entries: 100000", "deny_cache_entries: 0")
}

/// `sluice_requests_total` of the route under `outcome`.
fn requests(text: &str, outcome: &str) -> f64 {
    metric(
        text,
        "sluice_requests_total",
        &[("route", "api"), ("policy", "capped"), ("outcome", outcome)],
    )
    .unwrap_or(0.0)
}

/// What Redis counted for the one subject in the current window.
fn charged(redis: &RedisServer) -> u64 {
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*{capped:*")
        .query(&mut conn)
        .expect("KEYS");
    let states: Vec<&String> = keys.iter().filter(|k| !k.contains("}:e:")).collect();
    assert!(states.len() <= 1, "one subject, one state key: {states:?}");
    states
        .first()
        .map_or(0, |key| window_count(&mut conn, key).unwrap_or(0))
}

/// Started, and its store connected: readiness says nothing of deciding
/// locally (under `local` it is 200 either way).
async fn start_on_redis(yaml: &str) -> Sidecar {
    let sluice = Sidecar::start(yaml);
    eventually(READY_DEADLINE, || async {
        let (status, body) = readyz(&sluice).await;
        let connected = json!({"status": "ready", "scripts": "functions"});
        (status == StatusCode::OK && body == connected).then_some(())
    })
    .await;
    sluice
}

/// A sidecar on `redis_url` deciding alone (`on_failure: local`,
/// `local_share: 1`) when it cannot, with no over-limit cache, and the
/// test's loopback peer trusted to name clients in `X-Forwarded-For`.
fn alone_on_failure(upstream: &Upstream, redis_url: &str, policies: &str, routes: &str) -> String {
    let yaml = redis_yaml(upstream, redis_url, policies, routes)
        .replace(
            "  on_failure: deny\n",
            "  on_failure: local\n  local_share: 1\n",
        )
        .replace("deny_cache_entries: 100000", "deny_cache_entries: 0")
        .replace(
            "identity:\n",
            "identity:\n  trusted_proxies: [127.0.0.1/32]\n",
        );
    assert!(yaml.contains("on_failure: local") && yaml.contains("trusted_proxies"));
    yaml
}

#[tokio::test(flavor = "multi_thread")]
async fn with_redis_down_each_sidecar_enforces_its_share_and_shares_the_limit_again_once_back() {
    clear_of_window_edge(WINDOW, Duration::from_secs(60)).await;
    let mut redis = RedisServer::start();
    let mut upstreams = Vec::new();
    for _ in 0..SHARE {
        upstreams.push(Upstream::start().await);
    }
    let mut sidecars = Vec::new();
    for upstream in &upstreams {
        sidecars.push(start_on_redis(&config(upstream, &redis)).await);
    }

    // Redis decides: one request per sidecar, counted once each in Redis.
    for sluice in &sidecars {
        let (status, _, _) = get(sluice.addr(), "/api", &[]).await;
        assert_eq!(status, StatusCode::OK);
    }
    assert_eq!(charged(&redis), SHARE as u64);

    tokio::task::block_in_place(|| redis.kill());

    // Each sidecar alone: 30 / 3 = 10 admitted, the rest 429 with the
    // local figures, none 503.
    let per_sidecar = LIMIT / SHARE + 5;
    for (i, (sluice, upstream)) in sidecars.iter().zip(&upstreams).enumerate() {
        let before = upstream.count();
        let mut ok = 0;
        for _ in 0..per_sidecar {
            let (status, headers, _) = get(sluice.addr(), "/api", &[]).await;
            match status {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS => {
                    assert!(header(&headers, "retry-after").is_some());
                    assert_eq!(
                        header(&headers, "ratelimit-policy"),
                        Some(format!("\"capped\";q={};w=86400", LIMIT / SHARE).as_str()),
                        "a local 429 announces the local quota"
                    );
                }
                other => panic!("sidecar {i}: answered {other} with Redis down"),
            }
        }
        assert!(
            (1..=LIMIT / SHARE).contains(&ok),
            "sidecar {i} admitted {ok} alone"
        );
        assert_eq!(
            upstream.count() - before,
            ok,
            "sidecar {i}: forwarded what it did not admit"
        );
        let text = scrape(admin(sluice)).await;
        assert_eq!(requests(&text, "local_allowed"), ok as f64, "{text}");
        assert_eq!(
            requests(&text, "local_denied"),
            (per_sidecar - ok) as f64,
            "{text}"
        );
        assert_eq!(requests(&text, "unavailable"), 0.0, "{text}");
        assert_eq!(requests(&text, "indeterminate"), 0.0, "{text}");
        assert_eq!(
            metric(&text, "sluice_forwarded_without_decision_total", &[]),
            Some(0.0)
        );
        assert_eq!(metric(&text, "sluice_store_fallback", &[]), Some(1.0));
        assert_eq!(
            metric(&text, "sluice_store_fallbacks_total", &[]),
            Some(1.0)
        );
        // Still ready: taking every replica out of its Service would turn
        // the outage into a total one.
        let (status, body) = readyz(sluice).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["store"], "store not answering: deciding locally");
        println!("sidecar {i}: {ok} of {per_sidecar} admitted alone");
    }

    // The time in fallback is counted while it lasts.
    eventually(Duration::from_secs(5), || async {
        let text = scrape(admin(&sidecars[0])).await;
        (metric(&text, "sluice_store_fallback_seconds_total", &[]) >= Some(1.0)).then_some(())
    })
    .await;

    tokio::task::block_in_place(|| redis.restart());
    let restarted = Instant::now();
    // Back on Redis: a request each until one is Redis's decision.
    let mut store_allowed_during_recovery = 0;
    for (i, sluice) in sidecars.iter().enumerate() {
        let before = requests(&scrape(admin(sluice)).await, "allowed");
        loop {
            let (status, _, _) = get(sluice.addr(), "/api", &[]).await;
            let text = scrape(admin(sluice)).await;
            if requests(&text, "allowed") > before {
                assert_eq!(status, StatusCode::OK);
                store_allowed_during_recovery += 1;
                assert_eq!(metric(&text, "sluice_store_fallback", &[]), Some(0.0));
                break;
            }
            assert!(
                restarted.elapsed() < BACK_WITHIN,
                "sidecar {i} still decides alone {:?} after Redis is back ({status})",
                restarted.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let back = restarted.elapsed();
    println!("every sidecar decides on Redis again {back:?} after its restart");
    assert!(back < BACK_WITHIN, "back after {back:?}");

    // Shared again: the restarted Redis counts from nothing, and the three
    // together admit the limit, not a third of it each.
    let forwarded_before: Vec<usize> = upstreams.iter().map(Upstream::count).collect();
    let mut ok = store_allowed_during_recovery;
    let mut denied = 0;
    for i in 0..LIMIT + 6 {
        let (status, _, _) = get(sidecars[i % SHARE].addr(), "/api", &[]).await;
        match status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => denied += 1,
            other => panic!("answered {other} with Redis back"),
        }
    }
    assert_eq!(ok, LIMIT, "the fleet admitted {ok} on the shared store");
    assert_eq!(charged(&redis), LIMIT as u64);
    let forwarded: usize = upstreams
        .iter()
        .zip(&forwarded_before)
        .map(|(u, before)| u.count() - before)
        .sum();
    assert_eq!(forwarded + store_allowed_during_recovery, ok);
    let mut store_denied = 0.0;
    for sluice in &sidecars {
        let text = scrape(admin(sluice)).await;
        store_denied += requests(&text, "denied");
        assert_eq!(
            metric(&text, "sluice_forwarded_without_decision_total", &[]),
            Some(0.0)
        );
    }
    assert_eq!(store_denied, denied as f64, "every 429 is Redis's own");
}

/// A route with several limits while Redis is down: each limit the store
/// did not decide follows its own `on_failure` (here both `local`, with a
/// share of 1): a per-client limit of 5 and a global one of 8, enforced
/// together by this sidecar alone, never a 503.
#[tokio::test(flavor = "multi_thread")]
async fn with_redis_down_each_of_several_limits_follows_its_own_on_failure() {
    clear_of_window_edge(WINDOW, Duration::from_secs(60)).await;
    let mut redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let policies = "  per_ip: { algorithm: fixed-window, limit: 5, window: 24h }
  everyone: { algorithm: fixed-window, limit: 8, window: 24h }
";
    let routes = "  - name: login
    match: { path: /login }
    limits:
      - { policy: per_ip, subject: client_ip }
      - { policy: everyone, subject: global }
";
    let yaml = alone_on_failure(&upstream, &redis.url(), policies, routes);
    let sluice = start_on_redis(&yaml).await;
    assert_eq!(get(sluice.addr(), "/login", &[]).await.0, StatusCode::OK);
    tokio::task::block_in_place(|| redis.kill());

    // Two clients, 6 each, decided here: the first gets its own 5, the
    // second what the route has left of 8 (Redis's earlier count is not
    // known here: the fallback never saw it).
    let mut admitted = Vec::new();
    for client in ["198.51.100.1", "198.51.100.2"] {
        let mut n = 0;
        for _ in 0..6 {
            let (status, _, _) = get(sluice.addr(), "/login", &[("x-forwarded-for", client)]).await;
            match status {
                StatusCode::OK => n += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("{client}: {other}, never a 503 under local"),
            }
        }
        admitted.push(n);
    }
    assert_eq!(admitted, [5, 3]);
    let text = scrape(admin(&sluice)).await;
    let counted = |policy: &str, outcome: &str| requests_counted(&text, "login", policy, outcome);
    assert_eq!(counted("per_ip", "local_allowed"), 8.0);
    assert_eq!(
        counted("per_ip", "local_denied") + counted("everyone", "local_denied"),
        4.0
    );
}

/// Several limits decided locally are all or nothing, as on the store: a
/// request its own per-client limit refuses after the route-wide one let
/// it through has charged nothing of the route-wide one, and a request a
/// fail-closed limit refuses has charged nothing of the local one before
/// it. The limits that pass are listed first, so they are decided (and,
/// without that rule, charged) before the one that refuses.
#[tokio::test(flavor = "multi_thread")]
async fn with_redis_down_a_request_one_local_limit_refuses_charges_none_of_the_others() {
    clear_of_window_edge(WINDOW, Duration::from_secs(60)).await;
    let mut redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let policies = "  everyone: { algorithm: fixed-window, limit: 3, window: 24h }
  per_ip: { algorithm: fixed-window, limit: 2, window: 24h }
  once: { algorithm: fixed-window, limit: 1, window: 24h }
  closed: { algorithm: fixed-window, limit: 100, window: 24h, on_failure: deny }
";
    let routes = "  - name: login
    match: { path: /login }
    limits:
      - { policy: everyone, subject: global }
      - { policy: per_ip, subject: client_ip }
  - name: mixed
    match: { path: /mixed }
    limits:
      - { policy: once, subject: global }
      - { policy: closed, subject: global }
";
    let yaml = alone_on_failure(&upstream, &redis.url(), policies, routes);
    let sluice = start_on_redis(&yaml).await;
    tokio::task::block_in_place(|| redis.kill());

    // A limit that fails closed refuses every request while Redis is
    // down; the local limit before it is read, never charged, so it would
    // still admit its one request: each answer is the 503, never a 429.
    for _ in 0..3 {
        let (status, _, _) = get(sluice.addr(), "/mixed", &[]).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    }
    let text = scrape(admin(&sluice)).await;
    let mixed = |policy: &str, outcome: &str| requests_counted(&text, "mixed", policy, outcome);
    assert_eq!(
        mixed("closed", "unavailable") + mixed("closed", "indeterminate"),
        3.0,
        "{text}"
    );
    assert_eq!(mixed("once", "local_denied"), 0.0, "{text}");
    assert_eq!(upstream.count(), 0);

    // A: 2 of 3 (its own limit refuses the third); B: the route's third
    // place, then nothing.
    let mut answers = Vec::new();
    for client in [
        "198.51.100.1",
        "198.51.100.1",
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.2",
    ] {
        let (status, headers, _) =
            get(sluice.addr(), "/login", &[("x-forwarded-for", client)]).await;
        answers.push((
            status.as_u16(),
            header(&headers, "ratelimit").map(str::to_owned),
        ));
    }
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 429, 200, 429], "{answers:?}");
    assert_eq!(upstream.count(), 3);
    // Each 429 names the limit that refused.
    assert!(
        answers[2]
            .1
            .as_deref()
            .is_some_and(|r| r.starts_with("\"per_ip\"")),
        "{answers:?}"
    );
    assert!(
        answers[4]
            .1
            .as_deref()
            .is_some_and(|r| r.starts_with("\"everyone\"")),
        "{answers:?}"
    );

    let text = scrape(admin(&sluice)).await;
    let counted = |policy: &str, outcome: &str| requests_counted(&text, "login", policy, outcome);
    assert_eq!(counted("everyone", "local_allowed"), 3.0, "{text}");
    assert_eq!(counted("per_ip", "local_denied"), 1.0, "{text}");
    assert_eq!(counted("everyone", "local_denied"), 1.0, "{text}");
    assert_eq!(counted("everyone", "unavailable"), 0.0, "{text}");
}

/// Redis paused five times within one window (`SIGSTOP`, then `SIGCONT`),
/// the sidecar back on it between pauses: what the local fallback granted
/// a subject in the first outage is remembered in the next ones, so the
/// subject gets its local quota once for the window, not once per pause.
#[tokio::test(flavor = "multi_thread")]
async fn a_subject_gets_its_local_quota_once_a_window_however_often_redis_pauses() {
    const LOCAL: usize = 5;
    const PAUSES: usize = 5;
    let hour = Duration::from_secs(3600);
    clear_of_window_edge(hour, Duration::from_secs(120)).await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let policies = "  hourly: { algorithm: fixed-window, limit: 5, window: 1h }\n";
    let routes =
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: hourly }\n";
    let yaml = alone_on_failure(&upstream, &redis.url(), policies, routes);
    let sluice = start_on_redis(&yaml).await;
    // Four of five on Redis: one left there.
    for _ in 0..4 {
        assert_eq!(get(sluice.addr(), "/api", &[]).await.0, StatusCode::OK);
    }

    let mut admitted_alone = Vec::new();
    for pause in 0..PAUSES {
        tokio::task::block_in_place(|| redis.signal("STOP"));
        let mut ok = 0;
        for _ in 0..40 {
            match get(sluice.addr(), "/api", &[]).await.0 {
                StatusCode::OK => ok += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("pause {pause}: {other}, never a 503 under local"),
            }
        }
        admitted_alone.push(ok);
        tokio::task::block_in_place(|| redis.signal("CONT"));
        // A request at a time until one is Redis's again: the fallback is
        // left between pauses, as the outages are separate.
        eventually(Duration::from_secs(10), || async {
            let _ = get(sluice.addr(), "/api", &[]).await;
            let text = scrape(admin(&sluice)).await;
            (metric(&text, "sluice_store_fallback", &[]) == Some(0.0)).then_some(())
        })
        .await;
    }
    println!("admitted alone in each pause: {admitted_alone:?}");

    let text = scrape(admin(&sluice)).await;
    assert_eq!(
        metric(&text, "sluice_store_fallbacks_total", &[]),
        Some(PAUSES as f64),
        "{admitted_alone:?}"
    );
    assert_eq!(admitted_alone[0], LOCAL, "{admitted_alone:?}");
    assert_eq!(
        requests_counted(&text, "api", "hourly", "local_allowed"),
        LOCAL as f64,
        "granted alone over {PAUSES} pauses: {admitted_alone:?}"
    );
}
