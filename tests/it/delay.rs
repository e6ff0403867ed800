//! `delay` on a GCRA policy, through the binary: past the burst, a
//! request whose turn comes within `max_wait` waits for it rather than
//! being refused; its turn is taken in the store, so three sidecars on one
//! Redis admit exactly what one would; a full queue, or a client gone
//! while it waits, gives the turn back.

use std::time::{Duration, Instant};

use http::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::ops::{metric, scrape};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{redis_yaml, start_ready};
use crate::support::{count, get, released_together, Sidecar, Upstream};

/// 10 in 5 s (a turn each 500 ms), a burst of 10 (the default), a wait
/// of at most 2.5 s: 15 at once get through, the last five 0.5..2.5 s
/// late. Turns far apart, so a burst that reaches sluice over a few tens
/// of milliseconds on a busy machine is still one burst.
const POLICY: &str =
    "  smooth: { algorithm: gcra, limit: 10, window: 5s, delay: { max_wait: 2500ms, max_queued: QUEUE } }\n";
const ROUTES: &str =
    "  - { name: api, match: { path_prefix: /api }, subject: global, policy: smooth }\n";

fn memory_yaml(upstream: &Upstream, queue: u32) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {}
policies:
{}routes:
{ROUTES}",
        upstream.url(),
        POLICY.replace("QUEUE", &queue.to_string())
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_past_the_limit_waits_for_its_turns_instead_of_a_429() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&memory_yaml(&upstream, 100));
    let started = Instant::now();
    let statuses = released_together(sluice.addr(), "/api/x", 16).await;
    let took = started.elapsed();
    assert_eq!(count(&statuses, StatusCode::OK), 15, "{statuses:?}");
    assert_eq!(count(&statuses, StatusCode::TOO_MANY_REQUESTS), 1);
    // The fifth waited its 2.5 s: never sooner (only later, on a busy
    // machine).
    assert!(took >= Duration::from_millis(2400), "{took:?}");
    let metrics = scrape(sluice.admin_addr().expect("admin")).await;
    let delayed = [("route", "api"), ("policy", "smooth")];
    assert_eq!(
        metric(&metrics, "sluice_requests_delayed_total", &delayed),
        Some(5.0)
    );
    assert_eq!(
        metric(&metrics, "sluice_request_delay_seconds_count", &delayed),
        Some(5.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_and_gives_the_turn_back() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&memory_yaml(&upstream, 2));
    let statuses = released_together(sluice.addr(), "/api/x", 15).await;
    // The burst, and two waiting: the three others found the queue full.
    assert_eq!(count(&statuses, StatusCode::OK), 12, "{statuses:?}");
    assert_eq!(count(&statuses, StatusCode::TOO_MANY_REQUESTS), 3);
    // Their turns went back: three more wait and pass (two queued at a
    // time: one after the other), rather than being refused.
    let mut later = Vec::new();
    for _ in 0..3 {
        later.push(get(sluice.addr(), "/api/x", &[]).await.0);
    }
    assert_eq!(count(&later, StatusCode::OK), 3, "{later:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_it_waits_gives_its_turn_back() {
    let upstream = Upstream::start().await;
    // Two a second, a burst of 2, waits of up to 3 s: turns 0.5 s apart,
    // far longer than a client takes to hang up.
    let slow = memory_yaml(&upstream, 100).replace(
        "limit: 10, window: 5s, delay: { max_wait: 2500ms,",
        "limit: 2, window: 1s, delay: { max_wait: 3s,",
    );
    let sluice = Sidecar::start(&slow);
    let burst = released_together(sluice.addr(), "/api/x", 2).await;
    assert_eq!(count(&burst, StatusCode::OK), 2);
    // Five whose turns come 0.5..2.5 s from now, each gone at once.
    for _ in 0..5 {
        let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
        stream
            .write_all(b"GET /api/x HTTP/1.1\r\nHost: app.test\r\n\r\n")
            .await
            .expect("write");
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(stream);
    }
    // Had they kept their turns, three of these would be refused (the
    // fifth's turn is 2.5 s away; these would come after it).
    let after = released_together(sluice.addr(), "/api/x", 4).await;
    assert_eq!(count(&after, StatusCode::OK), 4, "{after:?}");
    assert_eq!(
        upstream.count(),
        6,
        "a client gone while it waited reached the app"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sidecars_on_redis_admit_exactly_the_burst_and_the_turns() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = redis_yaml(
        &upstream,
        &redis.url(),
        &POLICY.replace("QUEUE", "100"),
        ROUTES,
    );
    let sidecars = [
        start_ready(&yaml).await,
        start_ready(&yaml).await,
        start_ready(&yaml).await,
    ];
    // Warm each sidecar's connection, then let the bucket drain.
    for s in &sidecars {
        assert_eq!(get(s.addr(), "/warm", &[]).await.0, StatusCode::OK);
    }
    let mut tasks = Vec::new();
    for s in &sidecars {
        let addr = s.addr();
        tasks.push(tokio::spawn(async move {
            released_together(addr, "/api/x", 8).await
        }));
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.extend(t.await.expect("a sidecar's burst"));
    }
    assert_eq!(count(&statuses, StatusCode::OK), 15, "{statuses:?}");
    assert_eq!(count(&statuses, StatusCode::TOO_MANY_REQUESTS), 9);
    let mut delayed = 0.0;
    for s in &sidecars {
        let metrics = scrape(s.admin_addr().expect("admin")).await;
        delayed += metric(
            &metrics,
            "sluice_requests_delayed_total",
            &[("route", "api"), ("policy", "smooth")],
        )
        .unwrap_or(0.0);
    }
    assert_eq!(delayed, 5.0, "turns past the burst, across the sidecars");
}

#[test]
fn delay_is_refused_where_it_cannot_work() {
    for (policy, want) in [
        (
            "{ algorithm: fixed-window, limit: 5, window: 1s, delay: { max_wait: 1s } }",
            "`delay` is for gcra and token-bucket",
        ),
        (
            "{ algorithm: gcra, limit: 5, window: 1s, delay: { max_wait: 2m } }",
            "at most 1m",
        ),
        (
            "{ algorithm: gcra, limit: 5, window: 1s, delay: {} }",
            "delay.max_wait: required key is missing",
        ),
        (
            "{ algorithm: gcra, limit: 5, window: 1s, shadow: true, delay: { max_wait: 1s } }",
            "never holds a request back",
        ),
    ] {
        let yaml = format!(
            "version: 1
server: {{ listen: 127.0.0.1:0 }}
upstream: {{ url: http://127.0.0.1:9 }}
policies:
  p: {policy}
routes:
  - {{ name: api, policy: p }}
"
        );
        let (_dir, path) = crate::support::sidecar::write_config(&yaml);
        let (code, _, stderr) = crate::support::sidecar::run_binary(
            &["check", "--config", &path.to_string_lossy()],
            &[],
        );
        assert_eq!(code, 2, "{policy}");
        assert!(stderr.contains(want), "{want} not in {stderr}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_for_its_turn_holds_no_in_flight_place() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
policies:
{}  one: {{ algorithm: concurrency, limit: 1 }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    limits: [{{ policy: smooth, subject: \"header:x-user\" }}, {{ policy: one, subject: global }}]
",
        upstream.url(),
        POLICY.replace("QUEUE", "100")
    );
    let sluice = Sidecar::start(&yaml);
    let alice = [("x-user", "alice")];
    for i in 0..10 {
        let (status, _, body) = get(sluice.addr(), "/api/x", &alice).await;
        assert_eq!(status, StatusCode::OK, "{i}: {body:?}");
    }
    // Alice's next turn is about 0.5 s away; the route's one place is
    // free meanwhile for bob, who has a turn now.
    let addr = sluice.addr();
    let waiting = tokio::spawn(async move { get(addr, "/api/x", &alice).await.0 });
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        !waiting.is_finished(),
        "the request did not wait for its turn"
    );
    assert_eq!(
        get(sluice.addr(), "/api/x", &[("x-user", "bob")]).await.0,
        StatusCode::OK,
        "the waiting request held the one place"
    );
    assert_eq!(waiting.await.expect("the waiting request"), StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bucket_takes_its_tokens_ahead_and_waits_for_them() {
    let upstream = Upstream::start().await;
    // 5 tokens, one back every 500 ms, waits of up to 1.5 s: 5 at once,
    // three more 0.5, 1 and 1.5 s late, the ninth refused.
    let yaml = memory_yaml(&upstream, 100)
        .replace(
            "algorithm: gcra, limit: 10, window: 5s,",
            "algorithm: token-bucket, capacity: 5, refill_every: 500ms,",
        )
        .replace("max_wait: 2500ms", "max_wait: 1500ms");
    let sluice = Sidecar::start(&yaml);
    let started = Instant::now();
    let statuses = released_together(sluice.addr(), "/api/x", 9).await;
    let took = started.elapsed();
    assert_eq!(count(&statuses, StatusCode::OK), 8, "{statuses:?}");
    assert_eq!(count(&statuses, StatusCode::TOO_MANY_REQUESTS), 1);
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    assert_eq!(upstream.count(), 8);
}
