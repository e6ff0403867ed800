//! Shared harness for the end-to-end tests: they run the built binary, never
//! the crate's internals, so they test what a user runs.
//!
//! - [`upstream`]: `Upstream`, the recording application behind sluice.
//! - [`sidecar`]: `Sidecar`, the `sluice` binary on a temporary config.
//! - [`client`]: requests, bursts, raw bytes.
//! - [`redis`]: `RedisServer`, a real redis-server on a free port (TLS, ACL).
//! - [`store_api`]: the Redis store through its library API: settings, policies, keys.
//! - [`scripted`]: `Scripted`, a raw upstream answering bytes a test wrote.
//! - [`tls`]: a self-signed certificate and a client that trusts it.
//! - [`faults`]: a blackhole in a network namespace, a relay that delays replies.
//! - [`lost_reply`]: a relay that forwards a command and loses its reply.
//! - [`tokens`]: `Issuer`, JWTs signed by PyJWT with generated keys, and their JWKS and PEM files.
//! - [`werkzeug`]: `Werkzeug`, a real Python app server reading `Basic` credentials.
//!
//! Each test file compiles this module on its own and uses only part of it.

pub mod cgroup;
pub mod client;
pub mod faults;
pub mod lost_reply;
pub mod ops;
pub mod redis;
pub mod redis_sidecar;
pub mod scripted;
pub mod sidecar;
pub mod store_api;
pub mod tls;
pub mod tokens;
pub mod topology;
pub mod upstream;
pub mod werkzeug;

use std::future::Future;
use std::net::TcpListener;
use std::time::{Duration, Instant};

pub use client::{
    burst, content_length, count, get, header, parse_status, raw_exchange, read_head,
    released_together, replies_released_together, request, Reply,
};
pub use sidecar::Sidecar;
pub use upstream::{Recorded, Upstream};

/// Polls `probe` every 20 ms until it yields `Some`, or panics once `within`
/// has passed. Use it instead of sleeping and hoping.
pub async fn eventually<T, F, Fut>(within: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "condition not met within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A port that was free a moment ago (bound to 0 and released). Something
/// else may take it before it is used; good enough for "nothing listens
/// here" and "this port must stay closed".
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// `len` deterministic bytes with no short period (xorshift), so a
/// truncated, reordered or duplicated chunk cannot compare equal.
pub fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// The parameters of a `RateLimit` or `RateLimit-Policy` field
/// (draft-ietf-httpapi-ratelimit-headers-11): the quoted policy name and
/// its `key=integer` parameters, e.g. `"api";r=0;t=17`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitItem {
    pub name: String,
    pub params: Vec<(String, u64)>,
}

impl RateLimitItem {
    pub fn param(&self, key: &str) -> Option<u64> {
        self.params.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

/// Parses the first list member of a structured-field value such as
/// `"api";q=100;w=60`; `None` when it does not have that shape.
pub fn parse_ratelimit(value: &str) -> Option<RateLimitItem> {
    let first = value.split(',').next()?.trim();
    let mut parts = first.split(';');
    let name = parts.next()?.trim();
    let name = name.strip_prefix('"')?.strip_suffix('"')?.to_owned();
    let mut params = Vec::new();
    for p in parts {
        let (k, v) = p.trim().split_once('=')?;
        params.push((k.trim().to_owned(), v.trim().parse().ok()?));
    }
    Some(RateLimitItem { name, params })
}

/// One policy per algorithm, each of 5 with a refill, an emission
/// interval or a window of 10 s or 50 s (the YAML under `policies:`), and
/// a route `/NAME` to each ([`EFFECTIVE_ROUTES`]), for
/// [`effective_window_failures`].
pub const EFFECTIVE_POLICIES: &str = "  fw: { algorithm: fixed-window, limit: 5, window: 1h }
  sl: { algorithm: sliding-log, limit: 5, window: 50s }
  sc: { algorithm: sliding-counter, limit: 5, window: 50s }
  tb: { algorithm: token-bucket, capacity: 5, refill_tokens: 1, refill_every: 10s }
  gc: { algorithm: gcra, limit: 5, window: 50s }
";
pub const EFFECTIVE_ROUTES: &str =
    "  - { name: fw, match: { path_prefix: /fw }, subject: client_ip, policy: fw }
  - { name: sl, match: { path_prefix: /sl }, subject: client_ip, policy: sl }
  - { name: sc, match: { path_prefix: /sc }, subject: client_ip, policy: sc }
  - { name: tb, match: { path_prefix: /tb }, subject: client_ip, policy: tb }
  - { name: gc, match: { path_prefix: /gc }, subject: client_ip, policy: gc }
";

/// Whole seconds, rounded up, left in the current window of `window`
/// seconds aligned to the Unix epoch.
fn left_in_window(window: u64) -> u64 {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    let window_us = u128::from(window) * 1_000_000;
    let left_us = window_us - since_epoch.as_micros() % window_us;
    u64::try_from(left_us.div_ceil(1_000_000)).expect("a window fits")
}

/// Two requests to each route of [`EFFECTIVE_ROUTES`] at `addr`, and what
/// the second's `RateLimit` should not have said: `r` is what is left
/// (3), `t` when that grows (draft-11's effective window), not when the
/// band is full again (which said 20 s for the bucket and the GCRA band,
/// and up to 100 s for the sliding counter).
pub async fn effective_window_failures(addr: std::net::SocketAddr) -> Vec<String> {
    // Route, and the range `t` must fall in (read just before the
    // requests; a second of slack for a slow machine).
    let expected = |route: &str| -> std::ops::RangeInclusive<u64> {
        match route {
            "fw" => {
                let left = left_in_window(3600);
                left.saturating_sub(1).max(1)..=left
            }
            // Until the aligned window under way ends.
            "sc" => {
                let left = left_in_window(50);
                left.saturating_sub(1).max(1)..=left
            }
            // The newest unit stays counted a whole window.
            "sl" => 50..=50,
            // The next token, the next emission interval: 10 s after the
            // first request.
            _ => 9..=10,
        }
    };
    let mut failures = Vec::new();
    for route in ["fw", "sl", "sc", "tb", "gc"] {
        let path = format!("/{route}");
        let want = expected(route);
        let mut last = None;
        for _ in 0..2 {
            last = Some(get(addr, &path, &[]).await);
        }
        let (status, headers, _) = last.expect("two requests");
        let item = header(&headers, "ratelimit").and_then(parse_ratelimit);
        let (r, t) = match &item {
            Some(item) if item.name == route => (item.param("r"), item.param("t")),
            _ => (None, None),
        };
        if status != http::StatusCode::OK || r != Some(3) || !t.is_some_and(|t| want.contains(&t)) {
            failures.push(format!(
                "{route}: {status}, r={r:?} t={t:?} (want r=3, t in {want:?}): {headers:?}"
            ));
        }
    }
    failures
}

/// Waits, if needed, until at least `margin` is left in the current window
/// of `window` aligned to the Unix epoch (how sluice aligns fixed windows),
/// so a test's requests do not straddle a window boundary by chance.
pub async fn clear_of_window_edge(window: Duration, margin: Duration) {
    assert!(margin < window, "a margin must be shorter than the window");
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970");
    let window_us = window.as_micros();
    let left_us = window_us - since_epoch.as_micros() % window_us;
    let left = Duration::from_micros(u64::try_from(left_us).expect("a window fits in u64 µs"));
    if left < margin {
        tokio::time::sleep(left + Duration::from_millis(5)).await;
    }
}
