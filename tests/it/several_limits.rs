//! Several limits on one route, end to end on the memory store: every
//! limit must pass, and a request one of them refuses consumes nothing of
//! the others. And `algorithm: concurrency`: at most N requests in flight
//! to the upstream, the places given back however a request ends.

use crate::support;
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::support::ops::{metric, requests_counted, scrape};
use crate::support::{
    clear_of_window_edge, count, get, header, parse_ratelimit, replies_released_together, Sidecar,
    Upstream,
};
use http::StatusCode;
use serde_json::Value;
use tokio::io::AsyncWriteExt;

/// The global limit's window: short, so a test can wait for the next one.
const GLOBAL_WINDOW: Duration = Duration::from_secs(4);

fn several_limits(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {url}
identity:
  trusted_proxies: [127.0.0.1/32]
policies:
  per_ip: {{ algorithm: fixed-window, limit: 5, window: 1h }}
  everyone: {{ algorithm: fixed-window, limit: 12, window: {global}s }}
routes:
  - name: login
    match: {{ path: /login }}
    limits:
      - {{ policy: per_ip, subject: client_ip }}
      - {{ policy: everyone, subject: global }}
",
        url = upstream.url(),
        global = GLOBAL_WINDOW.as_secs(),
    )
}

const CLIENTS: [&str; 3] = ["198.51.100.1", "198.51.100.2", "198.51.100.3"];

async fn login(sluice: &Sidecar, client: &str) -> (StatusCode, http::HeaderMap, Value) {
    let (status, headers, body) =
        get(sluice.addr(), "/login", &[("x-forwarded-for", client)]).await;
    let problem = serde_json::from_slice(&body).unwrap_or(Value::Null);
    (status, headers, problem)
}

/// Until the next window of `window` aligned to the Unix epoch has begun.
async fn next_window(window: Duration) {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    let left = window.as_micros() - since_epoch.as_micros() % window.as_micros();
    tokio::time::sleep(Duration::from_micros(left as u64) + Duration::from_millis(20)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_must_pass_and_a_refused_request_consumes_nothing() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&several_limits(&upstream));
    // 18 requests inside one window of the global limit.
    clear_of_window_edge(GLOBAL_WINDOW, Duration::from_secs(3)).await;

    // Three clients, six requests each, all at once.
    let mut tasks = tokio::task::JoinSet::new();
    for client in CLIENTS {
        let addr = sluice.addr();
        tasks.spawn(async move {
            let mut admitted = 0;
            let mut denied_by = Vec::new();
            for _ in 0..6 {
                let (status, headers, body) =
                    get(addr, "/login", &[("x-forwarded-for", client)]).await;
                match status {
                    StatusCode::OK => admitted += 1,
                    StatusCode::TOO_MANY_REQUESTS => {
                        let problem: Value = serde_json::from_slice(&body).unwrap();
                        let policy = problem["policy"].as_str().unwrap().to_owned();
                        // `RateLimit` describes the limit that denied.
                        let ratelimit = header(&headers, "ratelimit")
                            .and_then(parse_ratelimit)
                            .expect("a 429 carries RateLimit");
                        assert_eq!(ratelimit.name, policy);
                        assert_eq!(ratelimit.param("r"), Some(0));
                        // `RateLimit-Policy` lists every limit of the route.
                        assert_eq!(
                            header(&headers, "ratelimit-policy"),
                            Some(r#""per_ip";q=5;w=3600, "everyone";q=12;w=4"#)
                        );
                        denied_by.push(policy);
                    }
                    other => panic!("{client}: {other}"),
                }
            }
            (client, admitted, denied_by)
        });
    }
    let mut admitted: HashMap<&str, u64> = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        let (client, n, denied_by) = done.unwrap();
        assert!(n <= 5, "{client} admitted {n} over its own limit of 5");
        // A client stopped by its own limit had all 5 first.
        for policy in &denied_by {
            if policy == "per_ip" {
                assert_eq!(n, 5, "{client} denied by per_ip after {n}");
            } else {
                assert_eq!(policy, "everyone");
            }
        }
        admitted.insert(client, n);
    }
    let total: u64 = admitted.values().sum();
    assert_eq!(
        total, 12,
        "the route admits exactly its global limit: {admitted:?}"
    );
    assert_eq!(upstream.count(), 12);

    // In the next global window, each client has exactly what its own
    // limit left: requests the global limit refused charged nothing of
    // per_ip (and those per_ip refused charged nothing of the global one,
    // or it would have admitted fewer than 12 above).
    next_window(GLOBAL_WINDOW).await;
    for client in CLIENTS {
        let left = 5 - admitted[client];
        for i in 0..left {
            let (status, _, _) = login(&sluice, client).await;
            assert_eq!(
                status,
                StatusCode::OK,
                "{client}: request {i} of the {left} left"
            );
        }
        let (status, _, problem) = login(&sluice, client).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{client}");
        assert_eq!(problem["policy"], "per_ip", "{client}");
        assert_eq!(problem["route"], "login");
    }
    assert_eq!(upstream.count(), 15);

    // Counted once per request, under the limit that decided it (allowed:
    // the route's first limit).
    let text = scrape(sluice.admin_addr().unwrap()).await;
    let counted = |policy: &str, outcome: &str| requests_counted(&text, "login", policy, outcome);
    assert_eq!(counted("per_ip", "allowed"), 15.0);
    assert_eq!(counted("everyone", "allowed"), 0.0);
    let denied = counted("per_ip", "denied") + counted("everyone", "denied");
    // 24 requests, 15 admitted.
    assert_eq!(denied, 9.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_responses_carry_the_limit_with_the_least_left() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&several_limits(&upstream));
    clear_of_window_edge(GLOBAL_WINDOW, Duration::from_secs(3)).await;
    let ratelimit = |headers: &http::HeaderMap| {
        let item = header(headers, "ratelimit")
            .and_then(parse_ratelimit)
            .expect("RateLimit on an allowed response");
        (item.name.clone(), item.param("r").unwrap())
    };
    // 4 left of per_ip (5), 11 of everyone (12): per_ip binds.
    let (status, headers, _) = login(&sluice, CLIENTS[0]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ratelimit(&headers), ("per_ip".to_owned(), 4));
    // Two other clients spend 10 of everyone: 1 left, it binds.
    for client in &CLIENTS[1..] {
        for _ in 0..5 {
            assert_eq!(login(&sluice, client).await.0, StatusCode::OK);
        }
    }
    let (status, headers, _) = login(&sluice, CLIENTS[0]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(ratelimit(&headers), ("everyone".to_owned(), 0));
}

fn in_flight(upstream: &str, limits: &str, policies: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {upstream}
policies:
  in_flight: {{ algorithm: concurrency, limit: 4, retry_after: 2s }}
{policies}routes:
  - name: app
    match: {{ path_prefix: /app }}
{limits}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_the_limit_is_in_flight_and_the_rest_get_503() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(500));
    let yaml = in_flight(
        &upstream.url(),
        "    policy: in_flight\n    subject: global\n",
        "",
    );
    let sluice = Sidecar::start(&yaml);

    let replies = replies_released_together(sluice.addr(), "/app/x", 20).await;
    let statuses: Vec<StatusCode> = replies.iter().map(|r| r.0).collect();
    assert!(
        upstream.peak_in_flight() <= 4,
        "peak {}",
        upstream.peak_in_flight()
    );
    assert_eq!(count(&statuses, StatusCode::OK), 4, "{statuses:?}");
    assert_eq!(upstream.count(), 4, "exactly the limit was forwarded");
    assert_eq!(count(&statuses, StatusCode::SERVICE_UNAVAILABLE), 16);
    for (status, headers, body) in &replies {
        if *status != StatusCode::SERVICE_UNAVAILABLE {
            continue;
        }
        assert_eq!(header(headers, "retry-after"), Some("2"));
        assert_eq!(
            header(headers, "ratelimit-policy"),
            Some(r#""in_flight";q=4;qu="concurrent-requests""#)
        );
        let problem: Value = serde_json::from_slice(body).unwrap();
        assert_eq!(problem["policy"], "in_flight");
        assert_eq!(problem["route"], "app");
    }

    // Every place was given back with its response: 4 more pass together.
    let again = replies_released_together(sluice.addr(), "/app/x", 4).await;
    assert!(again.iter().all(|r| r.0 == StatusCode::OK), "{again:?}");
    assert_eq!(upstream.count(), 8);
    assert!(upstream.peak_in_flight() <= 4);

    let text = scrape(sluice.admin_addr().unwrap()).await;
    let counted = |outcome: &str| {
        metric(
            &text,
            "sluice_requests_total",
            &[
                ("route", "app"),
                ("policy", "in_flight"),
                ("outcome", outcome),
            ],
        )
    };
    assert_eq!(counted("concurrency_denied"), Some(16.0));
    assert_eq!(counted("allowed"), Some(8.0));
}

/// `sluice_in_flight_requests{policy}` rises with each place taken and
/// falls as each response ends; a request refused for concurrency never
/// moves it, and no label names a subject.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_gauge_counts_the_places_held() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_secs(3));
    let yaml = in_flight(
        &upstream.url(),
        "    policy: in_flight\n    subject: client_ip\n",
        "",
    );
    let sluice = Sidecar::start(&yaml);
    let admin = sluice.admin_addr().unwrap();
    let gauge = |text: &str| {
        metric(
            text,
            "sluice_in_flight_requests",
            &[("policy", "in_flight")],
        )
    };
    assert_eq!(
        gauge(&scrape(admin).await),
        Some(0.0),
        "registered with the route, before any request"
    );

    let held: Vec<_> = (0..4)
        .map(|_| {
            let addr = sluice.addr();
            tokio::spawn(async move { get(addr, "/app/slow", &[]).await.0 })
        })
        .collect();
    support::eventually(Duration::from_secs(5), || async {
        (upstream.in_flight() == 4).then_some(())
    })
    .await;
    let text = scrape(admin).await;
    assert_eq!(gauge(&text), Some(4.0), "{text}");
    // One series, labelled by the policy alone.
    let series: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("sluice_in_flight_requests"))
        .collect();
    assert_eq!(
        series,
        [r#"sluice_in_flight_requests{policy="in_flight"} 4"#]
    );

    // Refused for concurrency: no place, no rise.
    assert_eq!(
        get(sluice.addr(), "/app/x", &[]).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(gauge(&scrape(admin).await), Some(4.0));

    for request in held {
        assert_eq!(request.await.unwrap(), StatusCode::OK);
    }
    // Each place is given back once its response has been written.
    support::eventually(Duration::from_secs(5), || async {
        (gauge(&scrape(admin).await) == Some(0.0)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_refusals_charge_no_rate_limit_and_429s_hold_no_place() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(600));
    let yaml = in_flight(
        &upstream.url(),
        "    limits:\n      - { policy: three, subject: global }\n      - { policy: one, subject: global }\n",
        "  three: { algorithm: fixed-window, limit: 3, window: 1h }\n  one: { algorithm: concurrency, limit: 1 }\n",
    );
    let sluice = Sidecar::start(&yaml);
    clear_of_window_edge(Duration::from_secs(3600), Duration::from_secs(10)).await;

    // One request holds the only place; the five that come meanwhile are
    // refused for concurrency, and charge nothing of `three`.
    let addr = sluice.addr();
    let held = tokio::spawn(async move { get(addr, "/app/slow", &[]).await.0 });
    support::eventually(Duration::from_secs(5), || async {
        (upstream.in_flight() == 1).then_some(())
    })
    .await;
    for _ in 0..5 {
        let (status, headers, _) = get(sluice.addr(), "/app/x", &[]).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            header(&headers, "ratelimit-policy"),
            Some(r#""three";q=3;w=3600, "one";q=1;qu="concurrent-requests""#)
        );
    }
    assert_eq!(held.await.unwrap(), StatusCode::OK);

    // 2 of `three` are left.
    upstream.set_delay(Duration::ZERO);
    for _ in 0..2 {
        assert_eq!(get(sluice.addr(), "/app/x", &[]).await.0, StatusCode::OK);
    }
    // Over `three`: 429, and the place it took first is given back at once
    // (a leaked one would turn the next answer into a 503).
    for _ in 0..3 {
        let (status, _, body) = get(sluice.addr(), "/app/x", &[]).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
        let problem: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(problem["policy"], "three");
    }
    assert_eq!(upstream.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_place_is_given_back_when_the_upstream_fails_or_once_the_app_is_done() {
    // Nothing listens on the upstream's port: every forward is a 502, and
    // the one place must come back each time.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let one = "    policy: one\n    subject: global\n";
    let policies = "  one: { algorithm: concurrency, limit: 1 }\n";
    let sluice = Sidecar::start(&in_flight(&dead, one, policies));
    for _ in 0..3 {
        assert_eq!(
            get(sluice.addr(), "/app/x", &[]).await.0,
            StatusCode::BAD_GATEWAY
        );
    }

    // A client that leaves before the answer keeps its place until the app
    // is done with its request (the app is still working on it), and then
    // gives it back.
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_secs(2));
    let sluice = Sidecar::start(&in_flight(&upstream.url(), one, policies));
    let addr = sluice.addr();
    let mut gone = tokio::net::TcpStream::connect(addr).await.unwrap();
    gone.write_all(b"GET /app/slow HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    support::eventually(Duration::from_secs(5), || async {
        (upstream.in_flight() == 1).then_some(())
    })
    .await;
    assert_eq!(
        get(sluice.addr(), "/app/x", &[]).await.0,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // The upstream is still at it (2 s): the client's going changes nothing.
    drop(gone);
    upstream.set_delay(Duration::ZERO);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        get(addr, "/app/x", &[]).await.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "the place is held while the app works"
    );
    support::eventually(Duration::from_secs(5), || async {
        (get(addr, "/app/x", &[]).await.0 == StatusCode::OK).then_some(())
    })
    .await;
}
