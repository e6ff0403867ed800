//! Who is asking, seen end to end: X-Forwarded-For believed only from
//! trusted proxies, header subjects and their fallbacks, the shared bucket
//! for requests without a subject, and the Connection-header trick that
//! would make a proxy drop the header identity relies on.

use std::time::Duration;

use crate::support::{get, raw_exchange, Sidecar, Upstream};
use http::StatusCode;

const OK: StatusCode = StatusCode::OK;
const LIMITED: StatusCode = StatusCode::TOO_MANY_REQUESTS;

/// Routes `/ip` (client_ip), `/keyed` (header:X-API-Key, no fallback) and
/// `/either` ([header:X-API-Key, client_ip]) under sliding-log policies of
/// `limit` per hour (sliding: no aligned window edge to straddle).
fn config(upstream: &Upstream, limit: u32, identity: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {url}
{identity}
policies:
  ip: {{ algorithm: sliding-log, limit: {limit}, window: 1h }}
  keyed: {{ algorithm: sliding-log, limit: {limit}, window: 1h }}
  either: {{ algorithm: sliding-log, limit: {limit}, window: 1h }}
routes:
  - {{ name: ip, match: {{ path: /ip }}, subject: client_ip, policy: ip }}
  - {{ name: keyed, match: {{ path: /keyed }}, subject: header:X-API-Key, policy: keyed }}
  - name: either
    match: {{ path: /either }}
    subject: [header:X-API-Key, client_ip]
    policy: either
",
        url = upstream.url()
    )
}

async fn statuses(sluice: &Sidecar, path: &str, requests: &[&[(&str, &str)]]) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for headers in requests {
        out.push(get(sluice.addr(), path, headers).await.0);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_forwarded_for_from_an_untrusted_peer_creates_no_new_subject() {
    let upstream = Upstream::start().await;
    // 127.0.0.1 (the test client) is not a trusted proxy.
    let sluice = Sidecar::start(&config(
        &upstream,
        3,
        "identity: { trusted_proxies: [10.0.0.0/8] }",
    ));

    let mut got = Vec::new();
    for i in 0..6u8 {
        let xff = format!("203.0.113.{i}, 10.0.0.{i}");
        got.push(
            get(sluice.addr(), "/ip", &[("x-forwarded-for", &xff)])
                .await
                .0,
        );
    }

    assert_eq!(got, [OK, OK, OK, LIMITED, LIMITED, LIMITED]);
    assert_eq!(upstream.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trusted_chain_resolves_to_the_right_most_untrusted_address() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream,
        2,
        "identity: { trusted_proxies: [127.0.0.1/32] }",
    ));

    // Left-most entries are the client's to invent: they do not matter.
    let same_client = statuses(
        &sluice,
        "/ip",
        &[
            &[("x-forwarded-for", "6.6.6.6, 203.0.113.7")],
            &[("x-forwarded-for", "1.2.3.4, 203.0.113.7")],
            &[("x-forwarded-for", "203.0.113.7")],
            // A trusted hop on the right is skipped.
            &[("x-forwarded-for", "9.9.9.9, 203.0.113.7, 127.0.0.1")],
            // Several field lines form one list (RFC 9110 §5.3).
            &[
                ("x-forwarded-for", "6.6.6.6"),
                ("x-forwarded-for", "203.0.113.7"),
            ],
        ],
    )
    .await;
    assert_eq!(same_client, [OK, OK, LIMITED, LIMITED, LIMITED]);

    let others = statuses(
        &sluice,
        "/ip",
        &[
            // A different right-most untrusted address: its own bucket.
            &[("x-forwarded-for", "6.6.6.6, 203.0.113.8")],
            // No header: the trusted peer itself is the client.
            &[],
        ],
    )
    .await;
    assert_eq!(others, [OK, OK]);
    assert_eq!(upstream.count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_subject_header_is_limited_as_one_shared_bucket() {
    let upstream = Upstream::start().await;
    // Trusting the test client lets each request claim another address,
    // so a per-address fallback would never limit them.
    let sluice = Sidecar::start(&config(
        &upstream,
        2,
        "identity: { trusted_proxies: [127.0.0.1/32] }",
    ));

    let without_key = statuses(
        &sluice,
        "/keyed",
        &[
            &[("x-forwarded-for", "198.51.100.1")],
            &[("x-forwarded-for", "198.51.100.2")],
            &[("x-forwarded-for", "198.51.100.3")],
            &[],
        ],
    )
    .await;
    assert_eq!(without_key, [OK, OK, LIMITED, LIMITED]);

    let with_keys = statuses(
        &sluice,
        "/keyed",
        &[&[("x-api-key", "k1")], &[("x-api-key", "k2")]],
    )
    .await;
    assert_eq!(with_keys, [OK, OK]);
    assert_eq!(upstream.count(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_subject_takes_precedence_over_the_client_ip_fallback() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream, 2, ""));

    let key_a = [("x-api-key", "key-a")];
    let got = statuses(&sluice, "/either", &[&key_a, &key_a, &key_a]).await;
    assert_eq!(got, [OK, OK, LIMITED]);

    // Same client IP, another key: the key is the subject, not the IP.
    let got = statuses(&sluice, "/either", &[&[("x-api-key", "key-b")]]).await;
    assert_eq!(got, [OK]);

    // No key: the client IP, a bucket of its own.
    let got = statuses(&sluice, "/either", &[&[], &[], &[]]).await;
    assert_eq!(got, [OK, OK, LIMITED]);
    assert_eq!(upstream.count(), 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_naming_an_identity_header_is_refused_before_the_upstream() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream, 100, ""));

    let refused: [&[u8]; 3] = [
        b"GET /keyed HTTP/1.1\r\nHost: app.test\r\nConnection: X-API-Key\r\nX-API-Key: k1\r\n\r\n",
        b"GET /either HTTP/1.1\r\nHost: app.test\r\nConnection: keep-alive, x-api-key\r\nX-API-Key: k1\r\n\r\n",
        b"GET /ip HTTP/1.1\r\nHost: app.test\r\nConnection: X-Forwarded-For\r\nX-Forwarded-For: 6.6.6.6\r\n\r\n",
    ];
    for request in refused {
        let response = raw_exchange(sluice.addr(), request).await;
        assert_eq!(
            response.status,
            400,
            "{}\n{}",
            String::from_utf8_lossy(request),
            response.head
        );
    }
    assert_eq!(upstream.count(), 0);

    // Naming an unrelated header is fine (it is stripped, not refused).
    let response = raw_exchange(
        sluice.addr(),
        b"GET /keyed HTTP/1.1\r\nHost: app.test\r\nConnection: X-Other\r\nX-Other: 1\r\nX-API-Key: k1\r\n\r\n",
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.head);
    assert_eq!(upstream.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_identities_never_reach_the_logs_or_the_problem_body() {
    let upstream = Upstream::start().await;
    // Debug level: the decision and refusal lines are written too.
    let sluice = Sidecar::start_with_env(
        &config(
            &upstream,
            1,
            "identity: { trusted_proxies: [127.0.0.1/32] }",
        ),
        &[("SLUICE_LOG", "debug")],
    );
    let key = "raw-key-5f3a9c";
    let ip = "198.51.100.77";

    // Allowed, denied, and refused (Connection names the key header).
    for path in ["/keyed", "/keyed", "/ip", "/ip"] {
        let (_, _, body) = get(
            sluice.addr(),
            path,
            &[("x-api-key", key), ("x-forwarded-for", ip)],
        )
        .await;
        let body = String::from_utf8_lossy(&body);
        assert!(!body.contains(key) && !body.contains(ip), "{body}");
    }
    let refused = raw_exchange(
        sluice.addr(),
        format!(
            "GET /keyed HTTP/1.1\r\nHost: app.test\r\nConnection: x-api-key\r\n\
             X-API-Key: {key}\r\nX-Forwarded-For: {ip}\r\n\r\n"
        )
        .as_bytes(),
    )
    .await;
    assert_eq!(refused.status, 400, "{}", refused.head);
    // Log lines are written as requests finish; let the writer catch up.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let output = format!("{}\n{}", sluice.logs().join("\n"), sluice.stderr());
    assert!(!output.contains(key), "the API key was logged:\n{output}");
    assert!(
        !output.contains(ip),
        "the client address was logged:\n{output}"
    );
}
