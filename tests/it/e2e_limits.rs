//! Limits enforced end to end: the built binary in front of a recording
//! upstream, counting what really got through.

use std::time::Duration;

use crate::support::{
    burst, clear_of_window_edge, content_length, count, effective_window_failures, eventually, get,
    header, parse_ratelimit, parse_status, released_together, Sidecar, Upstream,
    EFFECTIVE_POLICIES, EFFECTIVE_ROUTES,
};
use http::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HOUR: Duration = Duration::from_secs(3600);
/// Enough for any of these tests to finish inside one aligned window.
const EDGE_MARGIN: Duration = Duration::from_secs(10);

/// One route `/limited` (name `api`) under policy `p`, written as `policy`
/// (the YAML mapping below `p:`, indented four spaces).
fn one_policy(upstream: &Upstream, policy: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {url}
policies:
  p:
{policy}
routes:
  - name: api
    match: {{ path_prefix: /limited }}
    subject: client_ip
    policy: p
",
        url = upstream.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_5_admits_exactly_5_then_answers_429_with_headers_and_problem_body() {
    let upstream = Upstream::start().await;
    let yaml = one_policy(
        &upstream,
        "    algorithm: fixed-window\n    limit: 5\n    window: 1h",
    )
    .replace(
        "  listen: 127.0.0.1:0\n",
        "  listen: 127.0.0.1:0\n  admin: 127.0.0.1:0\n",
    );
    let sluice = Sidecar::start(&yaml);
    let admin = sluice.admin_addr().expect("the admin address is logged");
    assert_ne!(admin, sluice.addr());
    assert_eq!(get(admin, "/healthz", &[]).await.0, StatusCode::OK);
    assert_eq!(upstream.count(), 0, "the admin port is not proxied");
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    for expected_remaining in (0..5).rev() {
        let (status, headers, _) = get(sluice.addr(), "/limited/x", &[]).await;
        assert_eq!(status, StatusCode::OK);
        let ratelimit = header(&headers, "ratelimit")
            .and_then(parse_ratelimit)
            .unwrap_or_else(|| panic!("allowed response without a RateLimit field: {headers:?}"));
        assert_eq!(ratelimit.name, "p");
        assert_eq!(ratelimit.param("r"), Some(expected_remaining));
    }
    assert_eq!(upstream.count(), 5);

    let (status, headers, body) = get(sluice.addr(), "/limited/x", &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(upstream.count(), 5, "a denied request reached the upstream");

    let retry_after: u64 = header(&headers, "retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("429 without an integer Retry-After: {headers:?}"));
    assert!(
        (1..=3600).contains(&retry_after),
        "Retry-After {retry_after}"
    );

    let policy = header(&headers, "ratelimit-policy")
        .and_then(parse_ratelimit)
        .unwrap_or_else(|| panic!("429 without RateLimit-Policy: {headers:?}"));
    assert_eq!(policy.name, "p");
    assert_eq!(policy.param("q"), Some(5));
    assert_eq!(policy.param("w"), Some(3600));

    let ratelimit = header(&headers, "ratelimit")
        .and_then(parse_ratelimit)
        .unwrap_or_else(|| panic!("429 without RateLimit: {headers:?}"));
    assert_eq!(ratelimit.name, "p");
    assert_eq!(ratelimit.param("r"), Some(0));
    let reset = ratelimit.param("t").expect("RateLimit t=");
    assert!((1..=3600).contains(&reset), "t={reset}");

    let content_type = header(&headers, "content-type").unwrap_or_default();
    assert!(
        content_type.starts_with("application/problem+json"),
        "content-type {content_type:?}"
    );
    let problem: Value = serde_json::from_slice(&body).expect("a JSON problem body");
    assert_eq!(problem["status"], 429);
    assert_eq!(problem["route"], "api");
    assert_eq!(problem["policy"], "p");
    assert!(problem["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(problem["detail"].as_str().is_some_and(|d| !d.is_empty()));
}

/// Atomicity: 100 requests at concurrency 20 against a limit of 10 must let
/// exactly 10 through, whatever the interleaving.
async fn concurrent_admissions(policy: &str) {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&one_policy(&upstream, policy));
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    let statuses = burst(sluice.addr(), "/limited", 100, 20).await;

    assert_eq!(count(&statuses, StatusCode::OK), 10, "{statuses:?}");
    assert_eq!(count(&statuses, StatusCode::TOO_MANY_REQUESTS), 90);
    assert_eq!(upstream.count(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fixed_window_admits_exactly_the_limit_under_concurrency() {
    concurrent_admissions("    algorithm: fixed-window\n    limit: 10\n    window: 1h").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_sliding_log_admits_exactly_the_limit_under_concurrency() {
    concurrent_admissions("    algorithm: sliding-log\n    limit: 10\n    window: 1h").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_token_bucket_admits_exactly_the_capacity_under_concurrency() {
    concurrent_admissions(
        "    algorithm: token-bucket\n    capacity: 10\n    refill_tokens: 1\n    refill_every: 1h",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_gcra_with_burst_equal_to_limit_admits_exactly_the_limit_under_concurrency() {
    concurrent_admissions("    algorithm: gcra\n    limit: 10\n    window: 1h\n    burst: 10")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_requests_released_together_admit_exactly_the_limit() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&one_policy(
        &upstream,
        "    algorithm: sliding-log\n    limit: 10\n    window: 1h",
    ));

    let statuses = released_together(sluice.addr(), "/limited", 100).await;

    assert_eq!(count(&statuses, StatusCode::OK), 10, "{statuses:?}");
    assert_eq!(count(&statuses, StatusCode::TOO_MANY_REQUESTS), 90);
    assert_eq!(upstream.count(), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cost_3_on_a_limit_of_10_admits_3_requests_for_every_exact_algorithm() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {url}
policies:
  fw: {{ algorithm: fixed-window, limit: 10, window: 1h }}
  sl: {{ algorithm: sliding-log, limit: 10, window: 1h }}
  tb: {{ algorithm: token-bucket, capacity: 10, refill_tokens: 1, refill_every: 1h }}
  gcra: {{ algorithm: gcra, limit: 10, window: 1h, burst: 10 }}
routes:
  - {{ name: fw, match: {{ path: /fw }}, subject: client_ip, policy: fw, cost: 3 }}
  - {{ name: sl, match: {{ path: /sl }}, subject: client_ip, policy: sl, cost: 3 }}
  - {{ name: tb, match: {{ path: /tb }}, subject: client_ip, policy: tb, cost: 3 }}
  - {{ name: gcra, match: {{ path: /gcra }}, subject: client_ip, policy: gcra, cost: 3 }}
",
        url = upstream.url()
    );
    let sluice = Sidecar::start(&yaml);
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    for route in ["/fw", "/sl", "/tb", "/gcra"] {
        let before = upstream.count();
        let mut statuses = Vec::new();
        for _ in 0..4 {
            statuses.push(get(sluice.addr(), route, &[]).await.0);
        }
        assert_eq!(
            statuses,
            [
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS
            ],
            "route {route}"
        );
        assert_eq!(upstream.count() - before, 3, "route {route}");
    }
}

/// A 1-per-second band and a 3-per-hour band. While the short band denies,
/// requests keep arriving (a burst, then polling every 20 ms); if a denied
/// request charged the hour band, it would be spent long before the short
/// band reopens. Correct: exactly three requests pass in all.
async fn denied_by_one_band_consumes_nothing_of_the_other(algorithm: &str) {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&one_policy(
        &upstream,
        &format!(
            "    algorithm: {algorithm}
    bands:
      - {{ limit: 1, window: 1s }}
      - {{ limit: 3, window: 1h }}"
        ),
    ));
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    // Room for the first request and the burst inside one aligned second.
    clear_of_window_edge(Duration::from_secs(1), Duration::from_millis(700)).await;

    let addr = sluice.addr();
    assert_eq!(get(addr, "/limited", &[]).await.0, StatusCode::OK);
    for _ in 0..5 {
        assert_eq!(
            get(addr, "/limited", &[]).await.0,
            StatusCode::TOO_MANY_REQUESTS,
            "the 1-per-second band must deny within the same second"
        );
    }
    for nth in [2, 3] {
        eventually(Duration::from_secs(5), || async move {
            let status = get(addr, "/limited", &[]).await.0;
            assert!(
                status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
                "unexpected {status}"
            );
            (status == StatusCode::OK).then_some(())
        })
        .await;
        assert_eq!(upstream.count(), nth);
    }

    // The short band has reopened; the hour band alone is spent now.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, _, body) = get(addr, "/limited", &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let problem: Value = serde_json::from_slice(&body).expect("a JSON problem body");
    assert_eq!(problem["policy"], "p");
    assert_eq!(upstream.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixed_window_bands_a_request_denied_by_one_band_consumes_nothing() {
    denied_by_one_band_consumes_nothing_of_the_other("fixed-window").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_bands_a_request_denied_by_one_band_consumes_nothing() {
    denied_by_one_band_consumes_nothing_of_the_other("sliding-log").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_none_route_is_never_limited() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {url}
policies:
  one: {{ algorithm: fixed-window, limit: 1, window: 1h }}
routes:
  - name: health
    match: {{ path: /health }}
    policy: none
  - name: api
    match: {{ path_prefix: /api }}
    subject: client_ip
    policy: one
default: {{ policy: one, subject: client_ip }}
",
        url = upstream.url()
    );
    let sluice = Sidecar::start(&yaml);
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    let statuses = burst(sluice.addr(), "/health", 30, 5).await;
    assert_eq!(count(&statuses, StatusCode::OK), 30, "{statuses:?}");
    assert_eq!(upstream.count(), 30);

    // The same client is limited elsewhere: the route really was exempt.
    assert_eq!(get(sluice.addr(), "/api/x", &[]).await.0, StatusCode::OK);
    assert_eq!(
        get(sluice.addr(), "/api/x", &[]).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(upstream.count(), 31);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_requests_use_the_default_policy() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {url}
policies:
  big: {{ algorithm: fixed-window, limit: 100, window: 1h }}
  tiny: {{ algorithm: fixed-window, limit: 2, window: 1h }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    subject: client_ip
    policy: big
default: {{ policy: tiny, subject: client_ip }}
",
        url = upstream.url()
    );
    let sluice = Sidecar::start(&yaml);
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    let addr = sluice.addr();

    // Different unmatched paths share the default route's bucket.
    assert_eq!(get(addr, "/a", &[]).await.0, StatusCode::OK);
    assert_eq!(get(addr, "/b/c", &[]).await.0, StatusCode::OK);
    let (status, headers, body) = get(addr, "/d", &[]).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let policy = header(&headers, "ratelimit-policy").and_then(parse_ratelimit);
    assert_eq!(
        policy.map(|p| (p.name.clone(), p.param("q"))),
        Some(("tiny".to_owned(), Some(2)))
    );
    let problem: Value = serde_json::from_slice(&body).expect("a JSON problem body");
    assert_eq!(problem["route"], "default");
    assert_eq!(problem["policy"], "tiny");

    // A matched route is not charged by the default's denial.
    assert_eq!(get(addr, "/api/x", &[]).await.0, StatusCode::OK);
    assert_eq!(upstream.count(), 3);
}

/// For every algorithm, a 429's `Retry-After` and its `RateLimit` `t` say
/// the same wait: a token bucket refills one token long before it is full,
/// and `t` once said the full time (10 s against 50 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_and_the_ratelimit_reset_agree_for_every_algorithm() {
    let policies = [
        "    algorithm: token-bucket\n    capacity: 5\n    refill_tokens: 1\n    refill_every: 10s",
        "    algorithm: fixed-window\n    limit: 5\n    window: 1h",
        "    algorithm: sliding-log\n    limit: 5\n    window: 50s",
        "    algorithm: sliding-counter\n    limit: 5\n    window: 50s",
        "    algorithm: gcra\n    limit: 5\n    window: 50s",
    ];
    let mut failures = Vec::new();
    for policy in policies {
        let upstream = Upstream::start().await;
        let sluice = Sidecar::start(&one_policy(&upstream, policy));
        let mut denial = None;
        for _ in 0..20 {
            let (status, headers, _) = get(sluice.addr(), "/limited", &[]).await;
            if status == StatusCode::TOO_MANY_REQUESTS {
                denial = Some(headers);
                break;
            }
        }
        let headers = denial.unwrap_or_else(|| panic!("never denied under {policy}"));
        let retry_after: Option<u64> = header(&headers, "retry-after").and_then(|v| v.parse().ok());
        let t = header(&headers, "ratelimit")
            .and_then(parse_ratelimit)
            .and_then(|item| item.param("t"));
        if retry_after.is_none() || retry_after != t {
            failures.push(format!("{policy:?}: Retry-After {retry_after:?}, t={t:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// An admitted request's `RateLimit` under each algorithm, on the memory
/// store: `r` is what is left now and `t` the effective window (when `r`
/// next grows), as draft-ietf-httpapi-ratelimit-headers-11 reads them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admitted_requests_t_is_its_effective_window_for_every_algorithm() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {url}
policies:
{EFFECTIVE_POLICIES}routes:
{EFFECTIVE_ROUTES}",
        url = upstream.url()
    );
    let sluice = Sidecar::start(&yaml);
    // Away from the edges of the aligned windows, so `t` cannot be read
    // in one window and answered in the next.
    clear_of_window_edge(HOUR, Duration::from_secs(10)).await;
    clear_of_window_edge(Duration::from_secs(50), Duration::from_secs(5)).await;
    let failures = effective_window_failures(sluice.addr()).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// HTTP/1.1 requests pipelined in one write to a limited route are each
/// judged and each answered, in order, on the connection they came on: a
/// refusal, answered at once with no app in between, neither holds back
/// nor loses the requests queued behind it, and leaves the connection
/// open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_to_a_limited_route_are_each_answered_in_order() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&one_policy(
        &upstream,
        "    algorithm: sliding-log\n    limit: 3\n    window: 1h",
    ));
    let get = "GET /limited/x HTTP/1.1\r\nHost: app.test\r\n\r\n";
    let post = "POST /limited/y HTTP/1.1\r\nHost: app.test\r\nContent-Length: 5\r\n\r\nhello";

    // The admitted ones first, forwarded, then the refusals behind them.
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    stream
        .write_all(get.repeat(5).as_bytes())
        .await
        .expect("write");
    let mut read = Vec::new();
    assert_eq!(
        next_statuses(&mut stream, &mut read, 5).await,
        [200, 200, 200, 429, 429]
    );
    assert_eq!(upstream.count(), 3);

    // A connection whose first request is refused, one with a body among
    // those behind it; then one more on the same connection.
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    stream
        .write_all(format!("{get}{post}{get}").as_bytes())
        .await
        .expect("write");
    let mut read = Vec::new();
    assert_eq!(
        next_statuses(&mut stream, &mut read, 3).await,
        [429, 429, 429]
    );
    stream.write_all(get.as_bytes()).await.expect("write");
    assert_eq!(next_statuses(&mut stream, &mut read, 1).await, [429]);
    assert_eq!(upstream.count(), 3, "no refused request reached the app");
}

#[tokio::test]
async fn a_refused_client_that_writes_its_whole_upload_first_still_reads_its_429() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&one_policy(
        &upstream,
        "    algorithm: sliding-log\n    limit: 1\n    window: 1h",
    ));
    let get = "GET /limited/x HTTP/1.1\r\nHost: app.test\r\n\r\n";
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    stream.write_all(get.as_bytes()).await.expect("write");
    let mut read = Vec::new();
    assert_eq!(next_statuses(&mut stream, &mut read, 1).await, [200]);

    // Refused, and written whole before anything is read, as most upload
    // code does: 8 MiB with a length, 4 MiB chunked, then one more. Were
    // the bodies left unread, the connection would close under the writes
    // (a broken pipe, the 429s never seen).
    let body = vec![b'x'; 8 << 20];
    let mut requests = format!(
        "POST /limited/up HTTP/1.1\r\nHost: app.test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    requests.extend_from_slice(&body);
    requests.extend_from_slice(
        b"POST /limited/up HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n",
    );
    for chunk in body[..4 << 20].chunks(64 << 10) {
        requests.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        requests.extend_from_slice(chunk);
        requests.extend_from_slice(b"\r\n");
    }
    requests.extend_from_slice(b"0\r\n\r\n");
    requests.extend_from_slice(get.as_bytes());
    tokio::time::timeout(Duration::from_secs(20), stream.write_all(&requests))
        .await
        .expect("the bodies are read")
        .expect("the connection stays open under the writes");
    assert_eq!(
        next_statuses(&mut stream, &mut read, 3).await,
        [429, 429, 429]
    );
    stream.write_all(get.as_bytes()).await.expect("write");
    assert_eq!(next_statuses(&mut stream, &mut read, 1).await, [429]);

    // On HTTP/2 the stream of a refused upload is not reset after its
    // answer (curl 7.88 drops an answer so ended): the client sends the
    // rest whole, and the stream ends as any other.
    let tcp = TcpStream::connect(sluice.addr()).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    let _driven = tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = http::Request::post("http://app.test/limited/up")
        .header(http::header::CONTENT_LENGTH, body.len())
        .body(())
        .expect("request");
    let mut ready = client.ready().await.expect("ready to send");
    let (response, mut upload) = ready.send_request(request, false).expect("send");
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("an answer before the body")
        .expect("an answer");
    assert_eq!(response.status(), 429);
    let mut left = &body[..];
    while !left.is_empty() {
        upload.reserve_capacity(left.len());
        let granted = tokio::time::timeout(
            Duration::from_secs(10),
            std::future::poll_fn(|cx| upload.poll_capacity(cx)),
        )
        .await
        .expect("window for the rest of the body")
        .expect("the stream open")
        .expect("the stream not reset");
        let (now, rest) = left.split_at(granted.min(left.len()));
        upload
            .send_data(bytes::Bytes::copy_from_slice(now), rest.is_empty())
            .expect("the stream not reset");
        left = rest;
    }
    let mut answer = response.into_body();
    let mut got = 0;
    while let Some(chunk) = answer.data().await {
        got += chunk.expect("the answer's body").len();
    }
    assert!(got > 0, "a problem+json body");

    // A client that waits to be told to send (`Expect: 100-continue`) is
    // told no: the 429 comes first, and its connection closes then, with
    // nothing waiting for a body it will not send.
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    let waiting = format!(
        "POST /limited/up HTTP/1.1\r\nHost: app.test\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    stream.write_all(waiting.as_bytes()).await.expect("write");
    let mut read = Vec::new();
    assert_eq!(next_statuses(&mut stream, &mut read, 1).await, [429]);
    let mut rest = [0u8; 64];
    let end = tokio::time::timeout(Duration::from_secs(2), stream.read(&mut rest)).await;
    assert!(matches!(end, Ok(Ok(0))), "{end:?}");
    assert_eq!(upstream.count(), 1, "no refused request reached the app");
}

/// The statuses of the next `n` responses on `stream`, each read whole by
/// its `Content-Length`; `read` keeps what arrived past the last of them.
/// Fails if they are not all there within 5 s.
async fn next_statuses(stream: &mut TcpStream, read: &mut Vec<u8>, n: usize) -> Vec<u16> {
    let responses = async {
        let mut statuses = Vec::new();
        let mut chunk = [0u8; 4096];
        while statuses.len() < n {
            let whole = read
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map(|end| {
                    let head = String::from_utf8_lossy(&read[..end]).into_owned();
                    let body = content_length(&head)
                        .unwrap_or_else(|| panic!("no Content-Length: {head}"));
                    (head, end + 4 + body)
                })
                .filter(|(_, len)| read.len() >= *len);
            if let Some((head, len)) = whole {
                statuses.push(parse_status(&head));
                read.drain(..len);
                continue;
            }
            let got = stream.read(&mut chunk).await.expect("read");
            assert!(
                got > 0,
                "closed after {statuses:?}: {:?}",
                String::from_utf8_lossy(read)
            );
            read.extend_from_slice(&chunk[..got]);
        }
        statuses
    };
    tokio::time::timeout(Duration::from_secs(5), responses)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "not {n} responses within 5 s: {:?}",
                String::from_utf8_lossy(read)
            )
        })
}
