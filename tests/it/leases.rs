//! Leases through the built binary, on real Redis: several sidecars on one
//! global limit never admit more than it, and reach it exactly once their
//! leases are back; far fewer store calls than requests; a sidecar killed
//! holding a lease under-admits by at most that lease; one stopped gives
//! its leases back; near the limit every request is decided by Redis, to
//! the last unit.
//!
//! Every test takes [`SERIAL`]: each starts Redis and several sidecars.

use std::time::Duration;

use http::StatusCode;

use crate::support::ops::{metric, scrape};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{
    admin, commandstats, redis_yaml, reset_stats, sample, spread, start_ready,
};
use crate::support::sidecar::Sidecar;
use crate::support::topology::RedisCluster;
use crate::support::{clear_of_window_edge, count, Upstream};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const HOUR: Duration = Duration::from_secs(3600);
const EDGE_MARGIN: Duration = Duration::from_secs(30);
/// Longer than any lease here (200 ms) and the upkeep that returns it.
const LEASES_BACK: Duration = Duration::from_millis(600);

/// One global limit of `limit` an hour, leased, per algorithm; a budget of
/// 1 s (a burst on two cores may outlast 50 ms, which the failure tests
/// cover).
fn yaml(upstream: &Upstream, redis_url: &str, algorithm: &str, limit: u32) -> String {
    let policy = match algorithm {
        "fw" => format!("algorithm: fixed-window, limit: {limit}, window: 1h"),
        "tb" => format!(
            "algorithm: token-bucket, capacity: {limit}, refill_tokens: 1, refill_every: 1h"
        ),
        // A day: one more unit every 288 s, none within a test.
        "gc" => format!("algorithm: gcra, limit: {limit}, window: 1d, burst: {limit}"),
        "sc" => format!("algorithm: sliding-counter, limit: {limit}, window: 1h"),
        other => panic!("no such algorithm here: {other}"),
    };
    redis_yaml(
        upstream,
        redis_url,
        &format!("  hot: {{ {policy}, lease: {{ ttl: 200ms, max_share: 20% }} }}\n"),
        "  - { name: api, match: { path_prefix: /api }, subject: global, policy: hot }\n",
    )
    .replace("  budget: 50ms\n", "  budget: 1s\n")
}

/// The `FCALL`s Redis ran since the last reset.
fn fcalls(conn: &mut redis::Connection) -> u64 {
    commandstats(conn)
        .into_iter()
        .find(|(name, _)| name == "fcall")
        .map_or(0, |(_, calls)| calls)
}

async fn held(sluice: &Sidecar) -> f64 {
    sample(sluice, "sluice_lease_units_held", &[])
        .await
        .unwrap_or(0.0)
}

/// Leases given back (or given up on) by `sluice`, whatever the result.
async fn leases_returned(sluice: &Sidecar) -> f64 {
    let text = scrape(admin(sluice)).await;
    ["returned", "unneeded", "failed"]
        .iter()
        .filter_map(|result| metric(&text, "sluice_leases_returned_total", &[("result", result)]))
        .sum()
}

async fn admitted_from_leases(sluices: &[Sidecar]) -> f64 {
    let mut total = 0.0;
    for sluice in sluices {
        let text = scrape(admin(sluice)).await;
        total += metric(&text, "sluice_lease_admitted_total", &[]).unwrap_or(0.0);
    }
    total
}

/// Sends batches of ten to `sluice` until it holds a lease (the last
/// request may have spent one to its end); how many were admitted.
async fn until_holding(sluice: &Sidecar) -> usize {
    let mut admitted = 0;
    for _ in 0..30 {
        let statuses = spread(&[sluice.addr()], "/api/x", 10, 10).await;
        admitted += count(&statuses, StatusCode::OK);
        if held(sluice).await > 0.0 {
            return admitted;
        }
    }
    panic!("no lease held after {admitted} admitted");
}

/// Offers `rounds` × `per_round` requests over `addrs`, waiting between
/// rounds for the leases to come back; the admitted count of each round.
async fn offer(addrs: &[std::net::SocketAddr], per_round: usize, rounds: usize) -> Vec<usize> {
    let mut admitted = Vec::new();
    for _ in 0..rounds {
        let statuses = spread(addrs, "/api/x", per_round, 30).await;
        let other = statuses
            .iter()
            .filter(|s| **s != StatusCode::OK && **s != StatusCode::TOO_MANY_REQUESTS)
            .count();
        assert_eq!(other, 0, "answers neither 200 nor 429: {statuses:?}");
        admitted.push(count(&statuses, StatusCode::OK));
        tokio::time::sleep(LEASES_BACK).await;
    }
    admitted
}

/// Three sidecars, one global limit `L`, offered `3L` at once and then
/// more: the first burst admits at most `L`; by the end, with every lease
/// given back, exactly `L`, and the app saw exactly those.
async fn three_sidecars_admit_at_most_then_exactly_the_limit(algorithm: &str) {
    let _serial = SERIAL.lock().await;
    const L: usize = 300;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = yaml(&upstream, &redis.url(), algorithm, L as u32);
    let sluices = [
        start_ready(&yaml).await,
        start_ready(&yaml).await,
        start_ready(&yaml).await,
    ];
    let addrs: Vec<_> = sluices.iter().map(Sidecar::addr).collect();
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    let mut conn = redis.connection();
    reset_stats(&mut conn);

    let rounds = offer(&addrs, 3 * L, 4).await;
    let calls = fcalls(&mut conn);

    assert!(rounds[0] <= L, "{algorithm}: first burst {rounds:?}");
    let total: usize = rounds.iter().sum();
    assert_eq!(total, L, "{algorithm}: admitted per round {rounds:?}");
    assert_eq!(
        upstream.count(),
        L,
        "{algorithm}: requests that reached the app"
    );
    for sluice in &sluices {
        assert_eq!(held(sluice).await, 0.0, "{algorithm}: a lease still held");
    }
    let from_leases = admitted_from_leases(&sluices).await;
    assert!(
        from_leases >= (L / 2) as f64,
        "{algorithm}: only {from_leases} of {L} admitted from leases"
    );
    // 12·L requests were offered: one call per request without leases.
    // With them, a call grants, tops up or returns a lease, decides a
    // request near the limit, or asks again after a denial remembered
    // for a lease's life.
    let offered = 12 * L as u64;
    assert!(
        calls * 10 < offered,
        "{algorithm}: {calls} FCALLs for {offered} requests, {L} admitted ({from_leases} from leases)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sidecars_on_a_leased_fixed_window_admit_exactly_the_limit() {
    three_sidecars_admit_at_most_then_exactly_the_limit("fw").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sidecars_on_a_leased_token_bucket_admit_exactly_the_limit() {
    three_sidecars_admit_at_most_then_exactly_the_limit("tb").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sidecars_on_a_leased_gcra_admit_exactly_the_limit() {
    three_sidecars_admit_at_most_then_exactly_the_limit("gc").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sidecars_on_a_leased_sliding_counter_admit_exactly_the_limit() {
    three_sidecars_admit_at_most_then_exactly_the_limit("sc").await;
}

/// With no `lease` key, a global limit on Redis is leased (`lease: auto`):
/// three sidecars offered `12L` admit exactly `L` with a fraction of the
/// calls; `lease: off` pays a call for every admitted request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_global_limit_is_leased_by_default_and_lease_off_pays_a_call_per_request() {
    let _serial = SERIAL.lock().await;
    const L: usize = 300;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let written = yaml(&upstream, &redis.url(), "tb", L as u32);
    let default = written.replace(", lease: { ttl: 200ms, max_share: 20% }", "");
    assert_ne!(default, written);
    let off = written.replace("lease: { ttl: 200ms, max_share: 20% }", "lease: off");
    assert_ne!(off, written);
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    let mut conn = redis.connection();
    for (yaml, leased) in [(default, true), (off, false)] {
        // A bucket of its own for each: another policy name, another key.
        let yaml = if leased {
            yaml
        } else {
            yaml.replace("  hot:", "  cold:")
                .replace("policy: hot", "policy: cold")
        };
        let cap = L;
        let sluices = [
            start_ready(&yaml).await,
            start_ready(&yaml).await,
            start_ready(&yaml).await,
        ];
        let addrs: Vec<_> = sluices.iter().map(Sidecar::addr).collect();
        reset_stats(&mut conn);
        let before = upstream.count();
        let rounds = offer(&addrs, 3 * L, 4).await;
        let calls = fcalls(&mut conn);
        let total: usize = rounds.iter().sum();
        assert_eq!(total, cap, "leased {leased}: admitted per round {rounds:?}");
        assert_eq!(
            upstream.count() - before,
            cap,
            "leased {leased}: reached the app"
        );
        let from_leases = admitted_from_leases(&sluices).await;
        let offered = 12 * L as u64;
        if leased {
            assert!(
                from_leases >= (L / 2) as f64,
                "only {from_leases} from leases"
            );
            assert!(
                calls * 10 < offered,
                "{calls} FCALLs for {offered} requests"
            );
        } else {
            assert_eq!(from_leases, 0.0);
            assert!(calls >= cap as u64, "{calls} FCALLs for {cap} admitted");
        }
    }
}

/// One sidecar, one subject, requests one after another: with leases the
/// answers are the memory store's, request by request, `RateLimit`
/// included, for each leased algorithm; to the last unit, the last
/// requests decided by Redis one call each.
///
/// Exact while no lease ends with units left: those go back in a refund
/// that may reach Redis before or after the next request's call (on
/// another of the pooled connections), so the `remaining` answered about
/// then may be off by them (what is admitted is not). A lease here lasts
/// 10 s, and is spent long before it ends even on a loaded machine (at
/// 200 ms, a pause between two requests could outlast one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sidecar_with_leases_answers_as_the_memory_store_to_the_last_unit() {
    let _serial = SERIAL.lock().await;
    const L: usize = 60;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    for algorithm in ["fw", "tb", "gc", "sc"] {
        let leased = yaml(&upstream, &redis.url(), algorithm, L as u32)
            .replace("api", &format!("api_{algorithm}"))
            .replace("ttl: 200ms", "ttl: 10s")
            .replace("  budget: 1s\n", "  budget: 1s\n  dedupe_window: 20s\n");
        let memory = leased
            .replace(", lease: { ttl: 10s, max_share: 20% }", "")
            .replace("  dedupe_window: 20s\n", "")
            .replace(&format!("  url: {}\n", redis.url()), "")
            .replace("  kind: redis\n", "  kind: memory\n")
            .replace("  breaker_failures: 5\n  breaker_cooldown: 500ms\n", "")
            .replace("  deny_cache_entries: 100000\n", "");
        let (with_leases, on_memory) = (start_ready(&leased).await, start_ready(&memory).await);
        let path = format!("/api_{algorithm}/x");
        // Request by request, one to each at the same moment: status and
        // remaining equal, reset within the second they may straddle.
        let mut admitted = 0;
        for i in 0..2 * L {
            let mut answers = Vec::new();
            for sluice in [&with_leases, &on_memory] {
                let (status, headers, _) = crate::support::get(sluice.addr(), &path, &[]).await;
                let fields = crate::support::header(&headers, "ratelimit")
                    .and_then(crate::support::parse_ratelimit)
                    .map(|item| (item.param("r"), item.param("t")));
                answers.push((status, fields));
            }
            let (leased, memory) = (&answers[0], &answers[1]);
            let same = leased.0 == memory.0
                && match (leased.1, memory.1) {
                    (Some((r1, Some(t1))), Some((r2, Some(t2)))) => {
                        r1 == r2 && t1.abs_diff(t2) <= 1
                    }
                    (a, b) => a == b,
                };
            if !same {
                let returned = leases_returned(&with_leases).await;
                panic!(
                    "{algorithm}: request {i}: leased {leased:?}, memory {memory:?} \
                     ({returned} leases returned)"
                );
            }
            admitted += usize::from(leased.0 == StatusCode::OK);
        }
        assert_eq!(admitted, L, "{algorithm}");
        let from_leases = admitted_from_leases(std::slice::from_ref(&with_leases)).await;
        assert!(
            from_leases >= (L / 2) as f64,
            "{algorithm}: {from_leases} from leases"
        );
    }
}

/// A sidecar killed (SIGKILL) holding a lease: what it held is lost until
/// the window passes, never admitted twice. The other sidecar admits
/// exactly what Redis has left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_killed_holding_a_lease_under_admits_by_at_most_that_lease() {
    let _serial = SERIAL.lock().await;
    const L: usize = 400;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = yaml(&upstream, &redis.url(), "fw", L as u32).replace("ttl: 200ms", "ttl: 500ms");
    let doomed = start_ready(&yaml).await;
    let other = start_ready(&yaml).await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    let first = until_holding(&doomed).await;
    let held_when_killed = held(&doomed).await;
    doomed.signal("KILL");

    let rest = offer(&[other.addr()], L, 2).await;
    let admitted = first + rest.iter().sum::<usize>();
    assert!(admitted <= L, "{admitted} admitted of {L}");
    assert!(
        (L - admitted) as f64 <= held_when_killed,
        "{admitted} admitted of {L}: more lost than the {held_when_killed} units held"
    );
    assert_eq!(upstream.count(), admitted);
}

/// SIGTERM: the leases go back before exit, so another sidecar then
/// admits exactly what is left of the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_stopped_gives_its_leases_back() {
    let _serial = SERIAL.lock().await;
    const L: usize = 400;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = yaml(&upstream, &redis.url(), "fw", L as u32)
        .replace("ttl: 200ms", "ttl: 500ms")
        .replace(
            "  admin: 127.0.0.1:0\n",
            "  admin: 127.0.0.1:0\n  shutdown_delay: 0s\n",
        );
    let mut stopping = start_ready(&yaml).await;
    let other = start_ready(&yaml).await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    let first = until_holding(&stopping).await;
    stopping.signal("TERM");
    let exit = stopping.wait_exit(Duration::from_secs(10));
    assert!(
        exit.is_some_and(|s| s.success()),
        "{exit:?}\n{}",
        stopping.stderr()
    );

    // At once: nothing waits for a lease to end.
    let rest = spread(&[other.addr()], "/api/x", L, 10).await;
    assert_eq!(count(&rest, StatusCode::OK), L - first, "{rest:?}");
    assert_eq!(upstream.count(), L);
}

/// On a 3-primary Cluster: the same exactness, the leases' returns going
/// to the node of the subject's key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_three_sidecars_admit_exactly_the_limit() {
    let _serial = SERIAL.lock().await;
    const L: usize = 300;
    let cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let nodes = format!(
        "  topology: cluster\n  nodes: {}\n",
        RedisCluster::yaml_list(&cluster.urls()[..1])
    );
    let yaml = yaml(&upstream, "URL", "tb", L as u32).replace("  url: URL\n", &nodes);
    let sluices = [
        start_ready(&yaml).await,
        start_ready(&yaml).await,
        start_ready(&yaml).await,
    ];
    let addrs: Vec<_> = sluices.iter().map(Sidecar::addr).collect();

    let rounds = offer(&addrs, 3 * L, 4).await;

    assert!(rounds[0] <= L, "first burst {rounds:?}");
    assert_eq!(
        rounds.iter().sum::<usize>(),
        L,
        "admitted per round {rounds:?}"
    );
    assert_eq!(upstream.count(), L);
    assert!(admitted_from_leases(&sluices).await >= (L / 2) as f64);
}

/// `POST /explain` of a request to the hot route, with `token`.
async fn explain(sluice: &Sidecar, token: &str) -> serde_json::Value {
    let bearer = format!("Bearer {token}");
    let described = serde_json::json!({"method": "GET", "path": "/api/x", "peer": "127.0.0.1"});
    let (status, _, body) = crate::support::request(
        admin(sluice),
        http::Method::POST,
        "/explain",
        &[("Authorization", &bearer)],
        bytes::Bytes::from(described.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body:?}");
    serde_json::from_slice(&body).expect("JSON")
}

/// Explain says when the answer would come from a lease held here, with
/// what it holds, and spends nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_says_an_answer_comes_from_a_lease() {
    let _serial = SERIAL.lock().await;
    const TOKEN: &str = "lease-explain-token-8c41";
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = yaml(&upstream, &redis.url(), "tb", 10_000)
        .replace("ttl: 200ms", "ttl: 500ms")
        .replace(
            "  admin: 127.0.0.1:0\n",
            &format!("  admin: 127.0.0.1:0\n  explain: {{ token: {TOKEN} }}\n"),
        );
    let sluice = start_ready(&yaml).await;

    let cold = explain(&sluice, TOKEN).await;
    assert_eq!(cold["answer"]["from_lease"], false, "{cold}");
    assert!(
        cold["routes"][0]["limits"][0].get("lease").is_none(),
        "{cold}"
    );

    until_holding(&sluice).await;
    let units = held(&sluice).await;
    let hot = explain(&sluice, TOKEN).await;
    assert_eq!(hot["answer"]["from_lease"], true, "{hot}");
    let lease = &hot["routes"][0]["limits"][0]["lease"];
    assert_eq!(lease["answers"], true, "{hot}");
    assert_eq!(lease["units"].as_f64(), Some(units), "{hot}");
    assert_eq!(
        held(&sluice).await,
        units,
        "explaining spent from the lease"
    );
}

/// `on_failure: local`: with Redis gone, a lease held is spent first, each
/// of its units a 200 with no store call; the local fallback takes over
/// only once it is spent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_gone_a_lease_is_spent_before_the_local_fallback() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = yaml(&upstream, &redis.url(), "tb", 10_000)
        .replace("ttl: 200ms", "ttl: 500ms")
        .replace(
            "  on_failure: deny\n",
            "  on_failure: local\n  local_share: 3\n",
        )
        .replace("  budget: 1s\n", "  budget: 100ms\n");
    let sluice = start_ready(&yaml).await;
    until_holding(&sluice).await;
    redis.kill();

    let units = held(&sluice).await as usize;
    let before = admitted_from_leases(std::slice::from_ref(&sluice)).await;
    for i in 0..units {
        let (status, _, _) = crate::support::get(sluice.addr(), "/api/x", &[]).await;
        assert_eq!(status, StatusCode::OK, "request {i} of the {units} held");
    }
    let after = admitted_from_leases(std::slice::from_ref(&sluice)).await;
    assert_eq!(after - before, units as f64, "admitted from the lease");
    let fallbacks = sample(&sluice, "sluice_store_fallbacks_total", &[]).await;
    assert_eq!(
        fallbacks.unwrap_or(0.0),
        0.0,
        "the fallback took over early"
    );
    // Spent: the next request is the local fallback's.
    let (status, _, _) = crate::support::get(sluice.addr(), "/api/x", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let fallbacks = sample(&sluice, "sluice_store_fallbacks_total", &[]).await;
    assert_eq!(fallbacks, Some(1.0), "the fallback did not take over");
}

/// Two leased limits on one route (standalone: one call decides both and
/// grants both leases): exact to the tighter one, most requests with no
/// call. A route whose second limit is not leased costs one call per
/// request, for that limit only (the leased one spends its lease), and
/// no request of it counts as admitted from leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_limits_are_admitted_from_leases_only_when_every_one_has_one() {
    let _serial = SERIAL.lock().await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let policies = "  wide: { algorithm: token-bucket, capacity: 100000, refill_tokens: 1, refill_every: 1h, lease: { ttl: 500ms, max_share: 20% } }
  tight: { algorithm: gcra, limit: 300, window: 1d, burst: 300, lease: { ttl: 500ms, max_share: 20% } }
  plain: { algorithm: gcra, limit: 100000, window: 1d, burst: 100000, lease: off }
";
    let routes = "  - name: both
    match: { path_prefix: /both }
    limits:
      - { policy: wide, subject: global }
      - { policy: tight, subject: client_ip }
  - name: mixed
    match: { path_prefix: /mixed }
    limits:
      - { policy: wide, subject: global }
      - { policy: plain, subject: client_ip }
";
    // Calls counted one per decision: none batched together.
    let yaml = redis_yaml(&upstream, &redis.url(), policies, routes)
        .replace("  budget: 50ms\n", "  budget: 1s\n  coalesce: off\n");
    let sluice = start_ready(&yaml).await;
    let mut conn = redis.connection();
    reset_stats(&mut conn);

    let statuses = spread(&[sluice.addr()], "/both/x", 600, 10).await;
    assert_eq!(count(&statuses, StatusCode::OK), 300, "{statuses:?}");
    let calls = fcalls(&mut conn);
    let from_leases = admitted_from_leases(std::slice::from_ref(&sluice)).await;
    assert!(from_leases >= 150.0, "{from_leases} of 300 from leases");
    assert!(calls < 200, "{calls} FCALLs for 600 requests, 300 admitted");

    tokio::time::sleep(LEASES_BACK).await;
    reset_stats(&mut conn);
    let before = admitted_from_leases(std::slice::from_ref(&sluice)).await;
    let statuses = spread(&[sluice.addr()], "/mixed/x", 200, 10).await;
    assert_eq!(count(&statuses, StatusCode::OK), 200, "{statuses:?}");
    let after = admitted_from_leases(std::slice::from_ref(&sluice)).await;
    assert_eq!(
        after, before,
        "a request admitted with a limit that holds no lease"
    );
    // One call per request, and a few for `wide`'s leases (grants when
    // spent out, returns).
    let calls = fcalls(&mut conn);
    assert!(
        (200..=220).contains(&calls),
        "{calls} FCALLs for 200 requests"
    );
    assert_eq!(upstream.count(), 500);
}
