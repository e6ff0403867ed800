//! `subject: { all: [client_ip, header:X-API-Key] }` through the binary:
//! the pair is counted, so two keys from one address and one key from two
//! addresses each have their own limit; a request missing a part falls to
//! the list's next subject. Client addresses come through a trusted proxy
//! (127.0.0.1) in `X-Forwarded-For`.

use crate::support::{get, Sidecar, Upstream};

fn config(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
identity:
  trusted_proxies: [127.0.0.1/32]
policies:
  pair: {{ algorithm: fixed-window, limit: 2, window: 1h }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    subject: {{ all: [client_ip, \"header:X-API-Key\"] }}
    policy: pair
  - name: keyless
    match: {{ path_prefix: /keyless }}
    subject: [{{ all: [\"header:X-API-Key\", client_ip] }}, client_ip]
    policy: pair
",
        upstream.url()
    )
}

/// The statuses of `n` GETs of `path` from `client` with `key`.
async fn statuses(
    sluice: &Sidecar,
    path: &str,
    client: &str,
    key: Option<&str>,
    n: usize,
) -> Vec<u16> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let mut headers = vec![("x-forwarded-for", client)];
        if let Some(key) = key {
            headers.push(("x-api-key", key));
        }
        out.push(get(sluice.addr(), path, &headers).await.0.as_u16());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pair_is_counted_not_either_part() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    let (a, b) = ("203.0.113.1", "203.0.113.2");
    assert_eq!(
        statuses(&sluice, "/api/x", a, Some("k1"), 3).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(&sluice, "/api/x", a, Some("k2"), 3).await,
        [200, 200, 429],
        "a second key from the same address is another pair"
    );
    assert_eq!(
        statuses(&sluice, "/api/x", b, Some("k1"), 3).await,
        [200, 200, 429],
        "the same key from another address is another pair"
    );
    // Without the key, no pair: every keyless request of the route is one
    // shared bucket, whatever its address.
    assert_eq!(statuses(&sluice, "/api/x", a, None, 1).await, [200]);
    assert_eq!(statuses(&sluice, "/api/x", b, None, 2).await, [200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_missing_a_part_falls_to_the_next_subject() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    let (a, b) = ("198.51.100.1", "198.51.100.2");
    assert_eq!(
        statuses(&sluice, "/keyless/x", a, None, 3).await,
        [200, 200, 429]
    );
    assert_eq!(
        statuses(&sluice, "/keyless/x", b, None, 3).await,
        [200, 200, 429],
        "keyless requests are counted by address"
    );
    assert_eq!(
        statuses(&sluice, "/keyless/x", a, Some("k1"), 3).await,
        [200, 200, 429],
        "the pair is not the address alone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_part_a_proxy_would_drop_or_a_part_sent_twice_is_refused() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    let client = ("x-forwarded-for", "192.0.2.1");
    let named = get(
        sluice.addr(),
        "/api/x",
        &[client, ("x-api-key", "k1"), ("connection", "x-api-key")],
    )
    .await;
    assert_eq!(named.0.as_u16(), 400, "a part named in Connection");
    let twice = get(
        sluice.addr(),
        "/api/x",
        &[client, ("x-api-key", "k1"), ("x-api-key", "k2")],
    )
    .await;
    assert_eq!(twice.0.as_u16(), 400, "a part sent twice");
    assert!(upstream.requests().is_empty(), "nothing reached the app");
}
