//! What a request holds and owes, it keeps when its client hangs up:
//! the exchange with the app runs on, its in-flight place is held until
//! the app's response ends, and a charge made on response is made. The
//! upstream here works through hang-ups, as Werkzeug, gunicorn and Puma
//! do: it counts a request in progress until its delay is over, whether
//! or not sluice is still there to read the answer.
//!
//! Through the built binary, on the memory store, on real Redis and on a
//! Redis Cluster; many clients hanging up at once on a cluster are in
//! `cluster_hang_ups`.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::redis_topologies::yaml_with;
use crate::response_limits::charges;
use crate::support::ops::{requests_counted, scrape};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{admin, redis_yaml, start_ready};
use crate::support::sidecar::Sidecar;
use crate::support::topology::RedisCluster;
use crate::support::{get, Upstream};

/// Where a sidecar keeps its counts.
#[derive(Clone, Copy)]
enum Store<'a> {
    Memory,
    Redis(&'a RedisServer),
    /// Three primaries (a replica each), on sluice's own cluster
    /// connection, every node given as a seed.
    Cluster(&'a RedisCluster),
}

/// [`redis_yaml`] on `cluster` (`topology: cluster`, every node a seed),
/// with a budget of 1 s: a cluster's six processes share the machine's
/// cores with the sidecar, and what is checked here is hanging up, not
/// the budget.
pub(crate) fn cluster_yaml(
    upstream: &Upstream,
    cluster: &RedisCluster,
    policies: &str,
    routes: &str,
) -> String {
    let nodes = format!(
        "  topology: cluster\n  nodes: {}\n",
        RedisCluster::yaml_list(&cluster.urls())
    );
    yaml_with(upstream, &nodes, "1s", policies, routes)
}

/// A sidecar on `store`, with `policies` and `routes` (YAML bodies,
/// indented two spaces) and `upstream_lines` added to its `upstream`
/// section. 127.0.0.1 is a trusted proxy, so each client names itself in
/// `X-Forwarded-For`.
async fn sidecar(
    upstream: &Upstream,
    store: Store<'_>,
    policies: &str,
    routes: &str,
    upstream_lines: &str,
) -> Sidecar {
    let url_line = format!("  url: {}\n", upstream.url());
    let with_lines = format!("{url_line}{upstream_lines}");
    let on_redis = |yaml: String| {
        yaml.replace(&url_line, &with_lines).replace(
            "identity:\n",
            "identity:\n  trusted_proxies: [127.0.0.1/32]\n",
        )
    };
    match store {
        Store::Redis(redis) => {
            start_ready(&on_redis(redis_yaml(
                upstream,
                &redis.url(),
                policies,
                routes,
            )))
            .await
        }
        Store::Cluster(cluster) => {
            start_ready(&on_redis(cluster_yaml(upstream, cluster, policies, routes))).await
        }
        Store::Memory => Sidecar::start(&format!(
            "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
{with_lines}identity:
  trusted_proxies: [127.0.0.1/32]
policies:
{policies}routes:
{routes}"
        )),
    }
}

/// Sends one request on a connection of its own and closes it `after`,
/// whatever has come back by then.
async fn hang_up(addr: SocketAddr, path: &str, headers: &[(&str, &str)], after: Duration) {
    let mut head = format!("GET {path} HTTP/1.1\r\nHost: sluice.test\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = TcpStream::connect(addr).await.expect("connect to sluice");
    stream.write_all(head.as_bytes()).await.expect("send");
    tokio::time::sleep(after).await;
    drop(stream);
}

/// Waits until the upstream has nothing in progress.
pub(crate) async fn settled(upstream: &Upstream, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    while upstream.in_flight() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the upstream still has {} requests in progress",
            upstream.in_flight()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const IN_FLIGHT: &str = "  in_flight: { algorithm: concurrency, limit: 3 }\n";
const IN_FLIGHT_ROUTES: &str = "  - name: slow
    match: { path_prefix: /slow }
    policy: in_flight
    subject: global
";

async fn hanging_up_does_not_free_an_in_flight_place(store: Store<'_>) {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(1500));
    upstream.work_through_hang_ups();
    let sluice = sidecar(&upstream, store, IN_FLIGHT, IN_FLIGHT_ROUTES, "").await;
    let addr = sluice.addr();

    // Twelve clients, each gone 0.2 s after sending, one after another:
    // the app is at its limit of 3 from the third on.
    for i in 0..12 {
        let client = format!("198.51.100.{}", i + 1);
        hang_up(
            addr,
            "/slow",
            &[("x-forwarded-for", &client)],
            Duration::from_millis(200),
        )
        .await;
    }
    settled(&upstream, Duration::from_secs(10)).await;
    assert!(
        upstream.peak_in_flight() <= 3,
        "the app had {} requests in progress against a limit of 3",
        upstream.peak_in_flight()
    );
    assert_eq!(upstream.peak_in_flight(), 3, "the limit was reached");

    // Every place came back once the app was done.
    for _ in 0..3 {
        let (status, ..) = get(addr, "/slow", &[]).await;
        assert_eq!(status, StatusCode::OK);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_up_does_not_free_an_in_flight_place_memory() {
    hanging_up_does_not_free_an_in_flight_place(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_up_does_not_free_an_in_flight_place_redis() {
    let redis = RedisServer::start();
    hanging_up_does_not_free_an_in_flight_place(Store::Redis(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_up_does_not_free_an_in_flight_place_cluster() {
    let cluster = RedisCluster::start();
    hanging_up_does_not_free_an_in_flight_place(Store::Cluster(&cluster)).await;
}

/// The same over HTTP/2: a stream reset (the client's request future
/// dropped) is a hang-up too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resetting_a_stream_does_not_free_an_in_flight_place() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(1500));
    upstream.work_through_hang_ups();
    let sluice = sidecar(&upstream, Store::Memory, IN_FLIGHT, IN_FLIGHT_ROUTES, "").await;
    let client = crate::support::client::http2_client();
    let uri = format!("http://{}/slow", sluice.addr());
    for _ in 0..8 {
        let request = http::Request::get(&uri)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .expect("a request");
        // Dropped unanswered after 0.2 s: h2 resets the stream.
        let _ = tokio::time::timeout(Duration::from_millis(200), client.request(request)).await;
    }
    settled(&upstream, Duration::from_secs(10)).await;
    assert!(
        upstream.peak_in_flight() <= 3,
        "the app had {} requests in progress against a limit of 3",
        upstream.peak_in_flight()
    );
}

const LOGIN_POLICIES: &str = "  failed_logins: { algorithm: fixed-window, limit: 5, window: 1h }\n";
const LOGIN_ROUTES: &str = "  - name: login
    match: { path: /login }
    policy: failed_logins
    charge: { on: response, statuses: [401, 403] }
";

async fn a_guess_that_hangs_up_is_still_charged(store: Store<'_>) {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(600));
    upstream.work_through_hang_ups();
    let sluice = sidecar(&upstream, store, LOGIN_POLICIES, LOGIN_ROUTES, "").await;
    let guesser = [
        ("x-forwarded-for", "198.51.100.7"),
        ("x-answer-status", "401"),
    ];

    // Five failed guesses, each client gone long before the app answers.
    for _ in 0..5 {
        hang_up(
            sluice.addr(),
            "/login",
            &guesser,
            Duration::from_millis(100),
        )
        .await;
        // One at a time: what is checked here is the hang-up, not
        // concurrent guesses.
        settled(&upstream, Duration::from_secs(5)).await;
    }
    charges(&sluice, ("login", "failed_logins"), "charged", 5.0).await;
    let (status, ..) = get(sluice.addr(), "/login", &guesser).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "the sixth guess");
    assert_eq!(upstream.count(), 5, "the sixth guess never reached the app");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guess_that_hangs_up_is_still_charged_memory() {
    a_guess_that_hangs_up_is_still_charged(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guess_that_hangs_up_is_still_charged_redis() {
    let redis = RedisServer::start();
    a_guess_that_hangs_up_is_still_charged(Store::Redis(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guess_that_hangs_up_is_still_charged_cluster() {
    let cluster = RedisCluster::start();
    a_guess_that_hangs_up_is_still_charged(Store::Cluster(&cluster)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reported_cost_is_charged_when_the_client_has_gone() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(600));
    upstream.work_through_hang_ups();
    upstream.add_response_header("x-tokens", "500");
    let policies = "  tokens: { algorithm: fixed-window, limit: 1000, window: 1h }\n";
    let routes = "  - name: complete
    match: { path: /complete }
    policy: tokens
    subject: header:X-Key
    cost: { from_response_header: X-Tokens, max: 1000, default: 1 }
";
    let sluice = sidecar(&upstream, Store::Memory, policies, routes, "").await;
    let key = [("x-key", "k1")];
    for _ in 0..2 {
        hang_up(sluice.addr(), "/complete", &key, Duration::from_millis(100)).await;
        settled(&upstream, Duration::from_secs(5)).await;
    }
    charges(&sluice, ("complete", "tokens"), "charged", 2.0).await;
    let (status, ..) = get(sluice.addr(), "/complete", &key).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "1,000 tokens were spent"
    );
}

async fn a_guess_the_app_answers_too_late_is_charged(store: Store<'_>) {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(800));
    let sluice = sidecar(
        &upstream,
        store,
        LOGIN_POLICIES,
        LOGIN_ROUTES,
        "  timeout: 200ms\n",
    )
    .await;
    let guesser = [
        ("x-forwarded-for", "198.51.100.9"),
        ("x-answer-status", "401"),
    ];
    for _ in 0..5 {
        let (status, ..) = get(sluice.addr(), "/login", &guesser).await;
        assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    }
    charges(&sluice, ("login", "failed_logins"), "charged", 5.0).await;
    let (status, ..) = get(sluice.addr(), "/login", &guesser).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guess_the_app_answers_too_late_is_charged_memory() {
    a_guess_the_app_answers_too_late_is_charged(Store::Memory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guess_the_app_answers_too_late_is_charged_redis() {
    let redis = RedisServer::start();
    a_guess_the_app_answers_too_late_is_charged(Store::Redis(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guess_the_app_answers_too_late_is_charged_cluster() {
    let cluster = RedisCluster::start();
    a_guess_the_app_answers_too_late_is_charged(Store::Cluster(&cluster)).await;
}

/// A client gone while Redis decides its request is counted once, as
/// `client_closed`: not as allowed (its future, and the count it would
/// have made, end with it), never forwarded. Redis is stopped so the call
/// is surely in flight when the client goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_before_its_decision_is_counted_as_closed() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let policies =
        "  per_client: { algorithm: fixed-window, limit: 100, window: 1h, lease: off }\n";
    let routes = "  - name: api
    match: { path_prefix: / }
    policy: per_client
";
    let yaml = redis_yaml(&upstream, &redis.url(), policies, routes)
        .replace("budget: 50ms", "budget: 3s")
        .replace(
            "identity:\n",
            "identity:\n  trusted_proxies: [127.0.0.1/32]\n",
        );
    let sluice = start_ready(&yaml).await;
    let client = [("x-forwarded-for", "198.51.100.9")];
    let (status, ..) = get(sluice.addr(), "/", &client).await;
    assert_eq!(status, StatusCode::OK, "one decided before Redis stops");

    redis.signal("STOP");
    hang_up(sluice.addr(), "/", &client, Duration::from_millis(300)).await;
    let counted = |text: &str, outcome: &str| requests_counted(text, "api", "per_client", outcome);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let text = loop {
        let text = scrape(admin(&sluice)).await;
        if counted(&text, "client_closed") > 0.0 || tokio::time::Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    redis.signal("CONT");
    assert_eq!(counted(&text, "client_closed"), 1.0, "{text}");
    assert_eq!(counted(&text, "allowed"), 1.0, "{text}");

    // Redis answers the abandoned call; nothing more is counted for it,
    // and nothing of it reaches the app.
    let (status, ..) = get(sluice.addr(), "/", &client).await;
    assert_eq!(status, StatusCode::OK);
    let text = scrape(admin(&sluice)).await;
    assert_eq!(counted(&text, "client_closed"), 1.0, "{text}");
    assert_eq!(counted(&text, "allowed"), 2.0, "{text}");
    assert_eq!(
        upstream.count(),
        2,
        "the abandoned request never reached the app"
    );
}
