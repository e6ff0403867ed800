//! Limits charged on response are exact under concurrency: each request
//! reserves its units before it is forwarded, and the reservation is
//! settled when the app answers (kept for a listed status, given back for
//! another, trued up to a reported cost). Through the built binary, on
//! the memory store and on real Redis, for every algorithm (each store
//! gives back with its own twin of the refund).

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use tokio::task::JoinSet;

use crate::response_limits::{charges, sidecar};
use crate::support::redis::RedisServer;
use crate::support::sidecar::Sidecar;
use crate::support::{get, Upstream};

/// `n` GETs of `path` with `headers`, all at once; their statuses.
async fn concurrently(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    n: usize,
) -> Vec<StatusCode> {
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let path = path.to_owned();
        let headers: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        tasks.spawn(async move {
            let headers: Vec<(&str, &str)> = headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            get(addr, &path, &headers).await.0
        });
    }
    let mut statuses = Vec::with_capacity(n);
    while let Some(status) = tasks.join_next().await {
        statuses.push(status.expect("a request task"));
    }
    statuses
}

fn count(statuses: &[StatusCode], status: u16) -> usize {
    statuses.iter().filter(|s| s.as_u16() == status).count()
}

/// The same limit of 5 a window (or a bucket of 5), in each algorithm.
const ALGORITHMS: [(&str, &str); 5] = [
    ("fixed-window", "limit: 5, window: 1h"),
    ("sliding-counter", "limit: 5, window: 1h"),
    ("sliding-log", "limit: 5, window: 1h"),
    (
        "token-bucket",
        "capacity: 5, refill_tokens: 1, refill_every: 1h",
    ),
    ("gcra", "limit: 5, window: 1h"),
];

const LOGIN_ROUTES: &str = "  - name: login
    match: { path: /login }
    policy: failed_logins
    charge: { on: response, statuses: [401, 403] }
";

async fn login_sidecar(
    upstream: &Upstream,
    redis: Option<&RedisServer>,
    algorithm: (&str, &str),
) -> Sidecar {
    let (name, numbers) = algorithm;
    let policies = format!("  failed_logins: {{ algorithm: {name}, {numbers} }}\n");
    sidecar(upstream, redis, "127.0.0.1/32", &policies, LOGIN_ROUTES).await
}

async fn parallel_guesses_forward_at_most_the_limit(redis: Option<&RedisServer>) {
    let upstream = Upstream::start().await;
    // Every guess is in flight while the others are decided.
    upstream.set_delay(Duration::from_millis(300));
    let sluice = login_sidecar(&upstream, redis, ALGORITHMS[0]).await;
    let guesser = [
        ("x-forwarded-for", "198.51.100.7"),
        ("x-answer-status", "401"),
    ];

    let statuses = concurrently(sluice.addr(), "/login", &guesser, 100).await;
    assert_eq!(upstream.count(), 5, "forwarded: {statuses:?}");
    assert_eq!(count(&statuses, 401), 5);
    assert_eq!(count(&statuses, 429), 95);
    charges(&sluice, ("login", "failed_logins"), "charged", 5.0).await;
    let (status, ..) = get(sluice.addr(), "/login", &guesser).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_guesses_forward_at_most_the_limit_memory() {
    parallel_guesses_forward_at_most_the_limit(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_guesses_forward_at_most_the_limit_redis() {
    let redis = RedisServer::start();
    parallel_guesses_forward_at_most_the_limit(Some(&redis)).await;
}

/// Successful logins hold a unit only while the app works: once they are
/// answered, the whole limit is there for failures again.
async fn successes_give_their_reservations_back(redis: Option<&RedisServer>) {
    for algorithm in ALGORITHMS {
        let upstream = Upstream::start().await;
        // Long enough that all eight are decided before the first answer
        // gives its unit back, on a loaded machine too.
        upstream.set_delay(Duration::from_secs(1));
        let sluice = login_sidecar(&upstream, redis, algorithm).await;
        let user = [
            ("x-forwarded-for", "198.51.100.8"),
            ("x-answer-status", "200"),
        ];

        let statuses = concurrently(sluice.addr(), "/login", &user, 8).await;
        assert_eq!(count(&statuses, 200), 5, "{}: {statuses:?}", algorithm.0);
        assert_eq!(count(&statuses, 429), 3, "{}: {statuses:?}", algorithm.0);
        charges(&sluice, ("login", "failed_logins"), "given_back", 5.0).await;
        upstream.set_delay(Duration::ZERO);

        // Given back: five failures still pass, the sixth is refused.
        let guess = [
            ("x-forwarded-for", "198.51.100.8"),
            ("x-answer-status", "401"),
        ];
        for i in 0..5 {
            let (status, ..) = get(sluice.addr(), "/login", &guess).await;
            assert_eq!(status.as_u16(), 401, "{}: failure {i}", algorithm.0);
        }
        let (status, ..) = get(sluice.addr(), "/login", &guess).await;
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{}", algorithm.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successes_give_their_reservations_back_memory() {
    successes_give_their_reservations_back(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn successes_give_their_reservations_back_redis() {
    let redis = RedisServer::start();
    successes_give_their_reservations_back(Some(&redis)).await;
}

const TOKEN_ROUTES: &str = "  - name: complete
    match: { path: /complete }
    policy: tokens
    subject: header:X-Key
    cost: { from_response_header: X-Tokens, max: 1000, default: 500 }
";

async fn reported_costs_are_reserved_then_settled(redis: Option<&RedisServer>) {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_millis(300));
    let policies = "  tokens: { algorithm: fixed-window, limit: 1000, window: 1h }\n";
    let sluice = sidecar(&upstream, redis, "127.0.0.1/32", policies, TOKEN_ROUTES).await;

    // Twenty 500-token completions at once against 1,000: two pass.
    let key = [("x-key", "k1"), ("x-answer-header", "X-Tokens: 500")];
    let statuses = concurrently(sluice.addr(), "/complete", &key, 20).await;
    assert_eq!(upstream.count(), 2, "{statuses:?}");
    assert_eq!(count(&statuses, 429), 18);
    charges(&sluice, ("complete", "tokens"), "charged", 2.0).await;
    let (status, ..) = get(sluice.addr(), "/complete", &key).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "1,000 tokens spent");

    // A completion that reports less than the reserve gets the rest back:
    // two of 100 leave 800, so a third fits (reserve 500) and reports 800
    // (300 more than reserved), leaving nothing.
    let small = [("x-key", "k2"), ("x-answer-header", "X-Tokens: 100")];
    let statuses = concurrently(sluice.addr(), "/complete", &small, 2).await;
    assert_eq!(count(&statuses, 200), 2, "{statuses:?}");
    charges(&sluice, ("complete", "tokens"), "charged", 4.0).await;
    let large = [("x-key", "k2"), ("x-answer-header", "X-Tokens: 800")];
    let (status, headers, _) = get(sluice.addr(), "/complete", &large).await;
    assert_eq!(status, StatusCode::OK);
    let ratelimit = crate::support::header(&headers, "ratelimit")
        .unwrap_or_default()
        .to_owned();
    assert!(ratelimit.contains("r=0"), "RateLimit: {ratelimit}");
    charges(&sluice, ("complete", "tokens"), "charged", 5.0).await;
    let (status, ..) = get(sluice.addr(), "/complete", &small).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "k2 spent its 1,000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_costs_are_reserved_then_settled_memory() {
    reported_costs_are_reserved_then_settled(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reported_costs_are_reserved_then_settled_redis() {
    let redis = RedisServer::start();
    reported_costs_are_reserved_then_settled(Some(&redis)).await;
}
