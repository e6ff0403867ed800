//! What a request holds and owes, it keeps when its client hangs up:
//! the exchange with the app runs on, its in-flight place is held until
//! the app's response ends, and a charge made on response is made. The
//! upstream here works through hang-ups, as Werkzeug, gunicorn and Puma
//! do: it counts a request in progress until its delay is over, whether
//! or not sluice is still there to read the answer.
//!
//! Through the built binary, on the memory store and on real Redis.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::response_limits::charges;
use crate::support::client::REQUEST_DEADLINE;
use crate::support::ops::{metric, requests_counted, scrape};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{admin, redis_yaml, start_ready, window_count};
use crate::support::sidecar::Sidecar;
use crate::support::topology::RedisCluster;
use crate::support::{get, parse_status, read_head, Upstream};

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
fn cluster_yaml(
    upstream: &Upstream,
    cluster: &RedisCluster,
    policies: &str,
    routes: &str,
) -> String {
    let yaml = redis_yaml(upstream, "URL", policies, routes);
    assert!(yaml.contains("  url: URL\n") && yaml.contains("  budget: 50ms\n"));
    let nodes = format!(
        "  topology: cluster\n  nodes: {}\n",
        RedisCluster::yaml_list(&cluster.urls())
    );
    yaml.replace("  url: URL\n", &nodes)
        .replace("  budget: 50ms\n", "  budget: 1s\n")
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
async fn settled(upstream: &Upstream, within: Duration) {
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

// ---------------------------------------------------------------------
// Many clients hanging up at random moments on a Redis Cluster: over
// HTTP/1.1 (connections closed, or reset), over HTTP/2 (streams reset,
// connections dropped), and while a primary cannot be opened.
// ---------------------------------------------------------------------

/// A fixed window of 10 an hour per API key, every request a call to its
/// subject's primary (`lease: off`) unless `lease` says otherwise.
fn storm_policies(lease: &str) -> String {
    format!("  storm: {{ algorithm: fixed-window, limit: {STORM_LIMIT}, window: 1h, lease: {lease} }}\n")
}
const STORM_ROUTES: &str = "  - name: storm
    match: { path_prefix: /storm }
    policy: storm
    subject: header:X-API-Key
";
const STORM_LIMIT: usize = 10;
/// Eight subjects: spread over the three primaries' slots (that they are
/// is checked).
const STORM_SUBJECTS: usize = 8;
/// 25 requests a subject, 200 in all.
const STORM_EACH: usize = 25;
const STORM_CONCURRENCY: usize = 40;

/// The sidecar of a storm on `cluster`, with `store_lines` added to its
/// `store` section.
async fn storm_sidecar(
    upstream: &Upstream,
    cluster: &RedisCluster,
    lease: &str,
    store_lines: &str,
) -> Sidecar {
    let yaml = cluster_yaml(upstream, cluster, &storm_policies(lease), STORM_ROUTES)
        .replace("  budget: 1s\n", &format!("  budget: 1s\n{store_lines}"));
    start_ready(&yaml).await
}

/// How a client of a storm ends.
#[derive(Debug, Clone, Copy)]
enum Leaving {
    /// Reads its answer.
    Stays,
    /// Closes its connection (or resets its stream) after yielding this
    /// many times: at once, or a moment later, within a decision.
    Yields(u32),
    /// The same, after sleeping this many microseconds (tokio rounds up
    /// to its next millisecond): while a decision is on its way to a
    /// primary, or its reply on its way back.
    Sleeps(u64),
}

impl Leaving {
    /// About 60% of clients hang up, at a moment drawn from `rng`.
    fn draw(rng: &mut StdRng) -> Leaving {
        Leaving::draw_within(rng, 4_000)
    }

    /// As [`Leaving::draw`], sleepers gone within `us` microseconds.
    fn draw_within(rng: &mut StdRng, us: u64) -> Leaving {
        match rng.random_range(0..10u32) {
            0..=3 => Leaving::Stays,
            4..=6 => Leaving::Yields(rng.random_range(0..40)),
            _ => Leaving::Sleeps(rng.random_range(0..us)),
        }
    }

    async fn wait(self) {
        match self {
            Leaving::Stays => {}
            Leaving::Yields(n) => {
                for _ in 0..n {
                    tokio::task::yield_now().await;
                }
            }
            Leaving::Sleeps(us) => tokio::time::sleep(Duration::from_micros(us)).await,
        }
    }
}

/// A seed for a storm's draws, printed so that a failing run's draws can
/// be read back (their timing cannot).
fn storm_seed(what: &str) -> u64 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64;
    eprintln!("{what}: seed {seed}");
    seed
}

/// The subject of request `i` of a storm: round-robin over the subjects.
fn storm_key(i: usize) -> String {
    format!("storm-{}", i % STORM_SUBJECTS)
}

/// What the clients of a storm saw: per subject, the answers of those who
/// stayed; and how many hung up.
#[derive(Debug, Default)]
struct Seen {
    answers: HashMap<String, Vec<u16>>,
    hung_up: usize,
}

impl Seen {
    fn ok(&self, key: &str) -> usize {
        self.answers
            .get(key)
            .map_or(0, |a| a.iter().filter(|s| **s == 200).count())
    }

    fn all(&self) -> impl Iterator<Item = u16> + '_ {
        self.answers.values().flatten().copied()
    }
}

/// One HTTP/1.1 request for `key` on a connection of its own: the status
/// read, or `None` once the client hung up as `leaving` says (half of
/// those with a reset: `SO_LINGER` 0, so the close is an RST).
async fn http1_client(
    addr: SocketAddr,
    path: &str,
    key: &str,
    leaving: Leaving,
    reset: bool,
) -> Option<u16> {
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: sluice.test\r\nX-API-Key: {key}\r\nConnection: close\r\n\r\n"
    );
    let mut stream = TcpStream::connect(addr).await.expect("connect to sluice");
    stream.write_all(head.as_bytes()).await.expect("send");
    if let Leaving::Stays = leaving {
        let (head, _) = tokio::time::timeout(REQUEST_DEADLINE, read_head(&mut stream))
            .await
            .unwrap_or_else(|_| panic!("{key}: no answer within {REQUEST_DEADLINE:?}"));
        return Some(parse_status(&head));
    }
    leaving.wait().await;
    if reset {
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .expect("SO_LINGER");
    }
    drop(stream);
    None
}

/// [`STORM_SUBJECTS`] × [`STORM_EACH`] requests over HTTP/1.1, at most
/// [`STORM_CONCURRENCY`] at once, most clients hanging up.
async fn http1_storm(addr: SocketAddr, seed: u64) -> Seen {
    let mut rng = StdRng::seed_from_u64(seed);
    let gate = Arc::new(Semaphore::new(STORM_CONCURRENCY));
    let mut tasks = JoinSet::new();
    for i in 0..STORM_SUBJECTS * STORM_EACH {
        let (leaving, reset) = (Leaving::draw(&mut rng), rng.random_bool(0.5));
        let gate = gate.clone();
        let key = storm_key(i);
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore open");
            let status = http1_client(addr, "/storm", &key, leaving, reset).await;
            (key, status)
        });
    }
    collect(tasks).await
}

async fn collect(mut tasks: JoinSet<(String, Option<u16>)>) -> Seen {
    let mut seen = Seen::default();
    while let Some(done) = tasks.join_next().await {
        let (key, status) = done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        match status {
            Some(status) => seen.answers.entry(key).or_default().push(status),
            None => seen.hung_up += 1,
        }
    }
    seen
}

/// Lines of the sidecar's output that say something panicked: Rust's
/// panic message on stderr (`thread '…' panicked at …`), and the log
/// line of a connection task that panicked (read as JSON, by its
/// message). Neither can come from a path or a name: stderr holds what
/// the process wrote, and only the message field is compared.
fn panics(sluice: &Sidecar) -> Vec<String> {
    let mut found: Vec<String> = sluice
        .stderr()
        .lines()
        .filter(|l| l.starts_with("thread '") && l.contains("' panicked at "))
        .map(str::to_owned)
        .collect();
    for line in sluice.logs() {
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let message = json
            .get("message")
            .or_else(|| json.get("fields").and_then(|f| f.get("message")));
        if message.and_then(|m| m.as_str()) == Some("connection task panicked") {
            found.push(line);
        }
    }
    found
}

fn assert_no_panic(sluice: &Sidecar, what: &str) {
    let found = panics(sluice);
    assert!(
        found.is_empty(),
        "{what}: sluice panicked:\n{}\n--- stderr ---\n{}",
        found.join("\n"),
        sluice.stderr()
    );
}

/// Per `sluice:{storm:…}` state key on every primary, its fixed window's
/// count; and the primaries holding one.
fn storm_counts(cluster: &RedisCluster) -> (Vec<u64>, Vec<u16>) {
    let mut counts = Vec::new();
    let mut holding = Vec::new();
    for primary in cluster.primaries() {
        let mut conn = cluster.connection(primary);
        let keys: Vec<String> = cluster
            .keys(primary)
            .into_iter()
            .filter(|k| k.starts_with("sluice:{storm:") && k.ends_with('}'))
            .collect();
        if !keys.is_empty() {
            holding.push(primary);
        }
        for key in keys {
            counts.push(window_count(&mut conn, &key).expect("a fixed window's count"));
        }
    }
    (counts, holding)
}

/// What a storm must leave, whoever hung up when:
/// - each subject's requests that reached the app are at most its limit,
///   and the 200s its staying clients saw are among them;
/// - the app received nothing sluice did not admit (`allowed`), and
///   sluice admitted nothing Redis did not charge;
/// - every staying client got a decided answer (200 or 429; 503 when
///   Redis could not decide, which forwards nothing);
/// - sluice is alive, has not panicked, and a fresh subject on the
///   cluster gets exactly its limit, then 429.
async fn assert_storm_exact(
    what: &str,
    sluice: &Sidecar,
    upstream: &Upstream,
    cluster: &RedisCluster,
    seen: &Seen,
) {
    // The upstream first: a request counted `allowed` is counted before it
    // is forwarded, so what the app received by now was counted by the
    // scrape below.
    settled(upstream, Duration::from_secs(10)).await;
    let received = upstream.requests();
    let text = scrape(admin(sluice)).await;
    let (counts, holding) = storm_counts(cluster);
    let counted = |outcome: &str| requests_counted(&text, "storm", "storm", outcome);
    let allowed = counted("allowed");
    let summary = format!(
        "{what}: {} hung up; staying clients' answers {:?}; app received {}; \
         allowed {allowed}, denied {}, client_closed {}, unavailable {}, indeterminate {}; \
         Redis counts {counts:?}",
        seen.hung_up,
        seen.answers,
        received.len(),
        counted("denied"),
        counted("client_closed"),
        counted("unavailable"),
        counted("indeterminate"),
    );
    eprintln!("{summary}");

    for s in 0..STORM_SUBJECTS {
        let key = storm_key(s);
        let reached = received
            .iter()
            .filter(|r| r.header("x-api-key") == Some(&key))
            .count();
        assert!(
            reached <= STORM_LIMIT,
            "{key}: {reached} requests reached the app, over the limit of {STORM_LIMIT}\n{summary}"
        );
        assert!(
            seen.ok(&key) <= reached,
            "{key}: {} clients saw 200, {reached} requests reached the app\n{summary}",
            seen.ok(&key)
        );
    }
    let odd: Vec<u16> = seen
        .all()
        .filter(|s| ![200, 429, 503].contains(s))
        .collect();
    assert!(
        odd.is_empty(),
        "answers neither decided nor 503: {odd:?}\n{summary}"
    );
    assert!(
        received.len() as f64 <= allowed,
        "the app received requests sluice did not admit\n{summary}"
    );
    let without = metric(&text, "sluice_forwarded_without_decision_total", &[]).unwrap_or(0.0);
    assert_eq!(without, 0.0, "forwarded without a decision\n{summary}");
    let charged: u64 = counts.iter().sum();
    assert!(
        allowed <= charged as f64,
        "sluice admitted {allowed}, Redis charged {charged}\n{summary}"
    );
    assert!(
        counts.iter().all(|&c| c <= STORM_LIMIT as u64),
        "a subject counted over its limit in Redis\n{summary}"
    );
    assert!(
        holding.len() >= 2,
        "the subjects are all on one primary ({holding:?}): the storm crossed no slots"
    );
    // The storm did what it is for: clients left while their decision was
    // on its way (on two cores, at 40 at once, dozens of them).
    assert!(
        counted("client_closed") > 0.0,
        "no client left mid-decision\n{summary}"
    );

    // Alive, and exact for fresh subjects.
    for fresh in 0..4 {
        let key = format!("fresh-{fresh}");
        let mut statuses = Vec::new();
        for _ in 0..=STORM_LIMIT {
            statuses.push(get(sluice.addr(), "/storm", &[("x-api-key", &key)]).await.0);
        }
        let mut want = vec![StatusCode::OK; STORM_LIMIT];
        want.push(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(statuses, want, "{what}: {key} after the storm\n{summary}");
    }
    assert_no_panic(sluice, what);
}

/// On a cluster, 200 requests of 8 subjects over HTTP/1.1, 40 at once,
/// about 60% of the clients hanging up (a close or a reset) at a random
/// moment after sending the request head, most while their decision is
/// on its way to or from a primary: no subject gets more than its limit
/// through, nothing undecided reaches the app, and the sidecar decides
/// exactly afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_clients_hanging_up_mid_decision_never_pass_more_than_the_limit() {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let sluice = storm_sidecar(&upstream, &cluster, "off", "").await;
    let seed = storm_seed("HTTP/1.1 hang-ups on a cluster");
    let seen = http1_storm(sluice.addr(), seed).await;
    assert_storm_exact(
        &format!("HTTP/1.1, seed {seed}"),
        &sluice,
        &upstream,
        &cluster,
        &seen,
    )
    .await;
}

/// The same with the subjects' quotas leased (a hot subject's requests
/// spent from a block its sidecar took at once) and decisions coalesced
/// (those that arrive together sent as one call per slot, from a task of
/// their own): a client that hangs up while its decision waits in a
/// batch, or rides on a grant, takes nothing more than its own request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_hang_ups_amid_leases_and_coalesced_calls_never_pass_more_than_the_limit() {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let sluice = storm_sidecar(&upstream, &cluster, "auto", "  coalesce: on\n").await;
    let seed = storm_seed("HTTP/1.1 hang-ups, leases and coalescing, on a cluster");
    let seen = http1_storm(sluice.addr(), seed).await;
    // Leases given back go back within their ttl (250 ms) and 50 ms.
    assert_storm_exact(
        &format!("HTTP/1.1, leases, coalesced, seed {seed}"),
        &sluice,
        &upstream,
        &cluster,
        &seen,
    )
    .await;
}

/// [`STORM_SUBJECTS`] × [`STORM_EACH`] requests over HTTP/2 (prior
/// knowledge, in clear text, as sluice serves it), spread over
/// `connections` connections, [`STORM_CONCURRENCY`] streams at once in
/// all. About 60% of the streams are reset (`RST_STREAM`, `CANCEL`) at a
/// random moment after their headers; and every fourth connection is
/// dropped whole, at a random moment after its last request was sent,
/// with whatever streams it still had.
async fn http2_storm(addr: SocketAddr, seed: u64) -> Seen {
    const CONNECTIONS: usize = 8;
    let mut rng = StdRng::seed_from_u64(seed);
    let gate = Arc::new(Semaphore::new(STORM_CONCURRENCY));
    let mut seen = Seen::default();
    let mut conns = JoinSet::new();
    let total = STORM_SUBJECTS * STORM_EACH;
    for c in 0..CONNECTIONS {
        let tcp = TcpStream::connect(addr).await.expect("connect to sluice");
        let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        // Each connection's share of the requests, drawn here so that the
        // seed says them all.
        let mine: Vec<(String, Leaving)> = (c..total)
            .step_by(CONNECTIONS)
            .map(|i| (storm_key(i), Leaving::draw(&mut rng)))
            .collect();
        let dropped = (c % 4 == 3).then(|| Leaving::draw(&mut rng));
        let gate = gate.clone();
        conns.spawn(async move {
            let mut streams = JoinSet::new();
            for (key, leaving) in mine {
                let permit = gate.clone().acquire_owned().await.expect("semaphore open");
                let mut client = client
                    .clone()
                    .ready()
                    .await
                    .expect("the connection takes a stream");
                let request = http::Request::get("http://sluice.test/storm")
                    .header("x-api-key", &key)
                    .body(())
                    .expect("a request");
                let (response, mut stream) = client
                    .send_request(request, true)
                    .expect("send the headers");
                let doomed = dropped.is_some();
                streams.spawn(async move {
                    let _permit = permit;
                    if let Leaving::Stays = leaving {
                        // Unless its connection is dropped under it.
                        let answered = tokio::time::timeout(REQUEST_DEADLINE, response)
                            .await
                            .unwrap_or_else(|_| {
                                panic!("{key}: no answer within {REQUEST_DEADLINE:?}")
                            });
                        let status = match answered {
                            Ok(response) => Some(response.status().as_u16()),
                            Err(e) if doomed => {
                                let _ = e;
                                None
                            }
                            Err(e) => panic!("{key}: the stream failed: {e}"),
                        };
                        return (key, status);
                    }
                    leaving.wait().await;
                    stream.send_reset(h2::Reason::CANCEL);
                    drop(response);
                    (key, None)
                });
            }
            if let Some(leaving) = dropped {
                // The whole connection goes: its socket closed under the
                // streams still open on it.
                leaving.wait().await;
                driver.abort();
            }
            let mut answers = Vec::new();
            while let Some(done) = streams.join_next().await {
                answers.push(done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())));
            }
            answers
        });
    }
    while let Some(done) = conns.join_next().await {
        for (key, status) in done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())) {
            match status {
                Some(status) => seen.answers.entry(key).or_default().push(status),
                None => seen.hung_up += 1,
            }
        }
    }
    seen
}

/// On a cluster, the storm over HTTP/2: streams reset mid-decision and
/// connections dropped with streams in flight on them; the same
/// guarantees as over HTTP/1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_reset_streams_and_dropped_http2_connections_never_pass_more_than_the_limit() {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let sluice = storm_sidecar(&upstream, &cluster, "off", "").await;
    let seed = storm_seed("HTTP/2 resets on a cluster");
    let seen = http2_storm(sluice.addr(), seed).await;
    assert_storm_exact(
        &format!("HTTP/2, seed {seed}"),
        &sluice,
        &upstream,
        &cluster,
        &seen,
    )
    .await;
}

const GONE_POLICIES: &str =
    "  gone: { algorithm: fixed-window, limit: 5, window: 1h, lease: off }\n";
const GONE_ROUTES: &str = "  - name: gone
    match: { path_prefix: /gone }
    policy: gone
    subject: header:X-API-Key
";

/// The `sluice:{gone:…}` state keys on every primary, with their primary.
fn gone_keys(cluster: &RedisCluster) -> Vec<(String, u16)> {
    cluster
        .primaries()
        .into_iter()
        .flat_map(|p| {
            cluster
                .keys(p)
                .into_iter()
                .filter(|k| k.starts_with("sluice:{gone:") && k.ends_with('}'))
                .map(move |k| (k, p))
        })
        .collect()
}

/// API keys `k-0`, `k-1`, … each asked once (one unit of its 5), with
/// the primary its state landed on, until two share the first one's
/// primary and one is elsewhere.
async fn place_subjects(sluice: &Sidecar, cluster: &RedisCluster) -> Vec<(String, u16)> {
    let mut placed: Vec<(String, u16)> = Vec::new();
    for i in 0..60 {
        let key = format!("k-{i}");
        let before = gone_keys(cluster);
        let (status, ..) = get(sluice.addr(), "/gone", &[("x-api-key", &key)]).await;
        assert_eq!(status, StatusCode::OK, "{key}'s first request");
        let new = gone_keys(cluster)
            .into_iter()
            .find(|k| !before.contains(k))
            .unwrap_or_else(|| panic!("{key}: no new state key"));
        placed.push((key, new.1));
        let first = placed[0].1;
        let on_first = placed.iter().filter(|(_, p)| *p == first).count();
        if on_first >= 2 && placed.iter().any(|(_, p)| *p != first) {
            return placed;
        }
    }
    panic!("60 subjects, not two on one primary and one elsewhere: {placed:?}");
}

/// `total` requests over HTTP/1.1, round-robin over `keys`, 20 at once,
/// about 60% of the clients hanging up within `within_us`.
async fn gone_storm(
    addr: SocketAddr,
    keys: &[String],
    total: usize,
    within_us: u64,
    rng: &mut StdRng,
) -> Seen {
    let gate = Arc::new(Semaphore::new(20));
    let mut tasks = JoinSet::new();
    for i in 0..total {
        let (leaving, reset) = (Leaving::draw_within(rng, within_us), rng.random_bool(0.5));
        let gate = gate.clone();
        let key = keys[i % keys.len()].clone();
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore open");
            let status = http1_client(addr, "/gone", &key, leaving, reset).await;
            (key, status)
        });
    }
    collect(tasks).await
}

/// A port that accepts connections and holds them, answering nothing:
/// a node whose opening hangs (its handshake never answered).
async fn silent_port(
    port: u16,
) -> (
    tokio::task::JoinHandle<()>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the dead primary's port");
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = accepted.clone();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(socket);
        }
    });
    (task, accepted)
}

/// While a primary cannot be opened (it and its replica killed: first
/// its port refusing connections, then a port that takes them and never
/// answers, so every decision of its subjects waits in the opening of its
/// connection), clients hang up at random moments, most while a decision
/// is in that opening or waiting for another's: its subjects are answered
/// 503 and nothing of theirs reaches the app, the other primaries'
/// subjects are decided meanwhile, sluice does not panic, and once the
/// primary is back (empty: its counts were lost with it) its subjects are
/// decided again, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_hang_ups_while_a_primary_cannot_be_opened_leave_decisions_exact_once_it_is_back(
) {
    // The other primaries keep serving their slots while one is down.
    let mut cluster = RedisCluster::builder()
        .config("cluster-require-full-coverage no")
        .start();
    let upstream = Upstream::start().await;
    // The breaker kept shut: every decision goes to the node.
    let yaml = cluster_yaml(&upstream, &cluster, GONE_POLICIES, GONE_ROUTES).replace(
        "  budget: 1s\n",
        "  budget: 1s\n  breaker_min_calls: 1000000\n",
    );
    let sluice = start_ready(&yaml).await;
    let placed = place_subjects(&sluice, &cluster).await;
    let victim = placed[0].1;
    let on_victim: Vec<String> = placed
        .iter()
        .filter(|(_, p)| *p == victim)
        .map(|(k, _)| k.clone())
        .collect();
    let elsewhere: Vec<String> = placed
        .iter()
        .filter(|(_, p)| *p != victim)
        .map(|(k, _)| k.clone())
        .collect();
    let mut keys = on_victim.clone();
    keys.extend(elsewhere.iter().cloned());
    let seed = storm_seed("hang-ups while a primary cannot be opened");
    let mut rng = StdRng::seed_from_u64(seed);

    let replica = cluster.replica_of(victim);
    cluster.node_mut(replica).kill();
    cluster.node_mut(victim).kill();
    let forwarded_before = upstream.count();

    // Its port refuses connections.
    let refused = gone_storm(sluice.addr(), &keys, 80, 4_000, &mut rng).await;
    // Its port takes connections and never answers: an opening hangs
    // until its decision's budget is spent, or its client leaves.
    let (silent, accepted) = silent_port(victim).await;
    // A node whose opening failed is not tried again for 100 ms, and the
    // refused port's last failure may be just now: a storm over in less
    // than that (its answers are fast while nothing is tried) would
    // never reach the silent port. Waited out, so the next decision of
    // the victim's subjects opens it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closed = |text: &str| requests_counted(text, "gone", "gone", "client_closed");
    let closed_before = closed(&scrape(admin(&sluice)).await);
    let hanging = gone_storm(sluice.addr(), &keys, 100, 300_000, &mut rng).await;
    silent.abort();
    let _ = silent.await;
    let opened = accepted.load(std::sync::atomic::Ordering::SeqCst);
    let closed_while_silent = closed(&scrape(admin(&sluice)).await) - closed_before;

    let summary = format!(
        "seed {seed}, victim {victim}: {on_victim:?} on it, {elsewhere:?} elsewhere\n\
         port refused: {refused:?}\nport silent ({opened} connections taken, {closed_while_silent} clients gone mid-decision): {hanging:?}"
    );
    eprintln!("{summary}");
    assert!(
        opened > 0,
        "no decision tried to open the silent node\n{summary}"
    );
    // Clients left while their decision was opening the node, or waiting
    // for another's opening (nothing else keeps a decision that long).
    assert!(
        closed_while_silent > 0.0,
        "no client left mid-decision while the node was silent\n{summary}"
    );
    for seen in [&refused, &hanging] {
        for key in &on_victim {
            let answers = seen.answers.get(key).cloned().unwrap_or_default();
            assert!(
                answers.iter().all(|s| *s == 503),
                "{key}, on the dead primary, was answered {answers:?}\n{summary}"
            );
        }
        for key in &elsewhere {
            let answers = seen.answers.get(key).cloned().unwrap_or_default();
            assert!(
                answers.iter().all(|s| *s == 200 || *s == 429),
                "{key}, on a live primary, was answered {answers:?}\n{summary}"
            );
        }
    }
    let reached = |key: &str| {
        upstream
            .requests()
            .iter()
            .filter(|r| r.header("x-api-key") == Some(key))
            .count()
    };
    for key in &on_victim {
        assert_eq!(
            reached(key),
            1,
            "{key} reached the app undecided\n{summary}"
        );
    }
    for key in &elsewhere {
        assert!(reached(key) <= 5, "{key} passed its limit\n{summary}");
    }
    assert!(upstream.count() >= forwarded_before);
    assert_no_panic(&sluice, "while a primary could not be opened");

    // Back on its port, with its slots and nothing else.
    cluster.node_mut(victim).restart();
    cluster.wait_formed();
    let (probe, exact) = (&on_victim[0], &on_victim[1]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, ..) = get(sluice.addr(), "/gone", &[("x-api-key", probe)]).await;
        if status == StatusCode::OK {
            break;
        }
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{probe} while the primary comes back"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "{probe} still undecided 20 s after its primary came back\n{}",
            sluice.logs().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(get(sluice.addr(), "/gone", &[("x-api-key", exact)]).await.0);
    }
    let mut want = vec![StatusCode::OK; 5];
    want.push(StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        statuses, want,
        "{exact} once its primary is back\n{summary}"
    );
    for key in &elsewhere {
        let (status, ..) = get(sluice.addr(), "/gone", &[("x-api-key", key)]).await;
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
            "{key}: {status}"
        );
    }
    assert_no_panic(&sluice, "after the primary came back");
}
