//! sluice as a reverse proxy: what reaches the upstream and what comes back.

use crate::support;
use std::time::Duration;

use crate::support::client::{read_head, request_h2};
use crate::support::{free_port, get, pattern, raw_exchange, request, Recorded, Sidecar, Upstream};
use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const FIVE_MB: usize = 5 * 1024 * 1024;

/// `/limited` allows one request an hour; every other path goes through a
/// generous policy, so the whole decision path runs on every test.
fn config(upstream_url: &str, upstream_extra: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {upstream_url}
{upstream_extra}
policies:
  one: {{ algorithm: sliding-log, limit: 1, window: 1h }}
  lots: {{ algorithm: sliding-log, limit: 10000, window: 1h }}
routes:
  - {{ name: limited, match: {{ path_prefix: /limited }}, subject: client_ip, policy: one }}
  - {{ name: open, match: {{ path_prefix: / }}, subject: client_ip, policy: lots }}
"
    )
}

async fn start() -> (Upstream, Sidecar) {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream.url(), ""));
    (upstream, sluice)
}

fn only_request(upstream: &Upstream) -> Recorded {
    let requests = upstream.requests();
    assert_eq!(requests.len(), 1, "{requests:#?}");
    requests.into_iter().next().expect("one request")
}

/// The tokens of every `Connection` field line, lower-cased.
fn connection_tokens(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect()
}

/// The values of `name` in a raw response head.
fn raw_header(head: &str, name: &str) -> Vec<String> {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hop_by_hop_and_connection_named_headers_are_stripped_both_ways() {
    let (upstream, sluice) = start().await;
    upstream.add_response_header("connection", "x-up-hop");
    upstream.add_response_header("x-up-hop", "1");
    upstream.add_response_header("keep-alive", "timeout=5");
    upstream.add_response_header("proxy-connection", "keep-alive");
    upstream.add_response_header("x-up-end-to-end", "kept");

    // The upstream really sends what sluice must strip.
    let direct = raw_exchange(upstream.addr(), b"GET / HTTP/1.1\r\nHost: up.test\r\n\r\n").await;
    for name in ["x-up-hop", "keep-alive", "proxy-connection"] {
        assert!(
            !raw_header(&direct.head, name).is_empty(),
            "{}",
            direct.head
        );
    }
    let before = upstream.count();

    // Raw bytes, so every header is certainly sent as written.
    let response = raw_exchange(
        sluice.addr(),
        b"GET /hop HTTP/1.1\r\n\
          Host: app.test\r\n\
          Connection: keep-alive, X-Hop-Custom\r\n\
          X-Hop-Custom: secret\r\n\
          Keep-Alive: timeout=5\r\n\
          TE: trailers\r\n\
          Trailer: X-Checksum\r\n\
          Upgrade: example/1\r\n\
          Proxy-Authorization: Basic Zm9vOmJhcg==\r\n\
          Proxy-Connection: keep-alive\r\n\
          X-End-To-End: kept\r\n\
          \r\n",
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.head);

    let requests = upstream.requests();
    assert_eq!(upstream.count(), before + 1);
    let seen = requests.last().expect("the forwarded request");
    for name in [
        "x-hop-custom",
        "keep-alive",
        "te",
        "trailer",
        "upgrade",
        "proxy-authorization",
        "proxy-connection",
    ] {
        assert!(
            seen.header(name).is_none(),
            "{name} reached the upstream: {:?}",
            seen.headers
        );
    }
    let tokens = connection_tokens(&seen.header_all("connection"));
    assert!(
        tokens.iter().all(|t| t == "keep-alive" || t == "close"),
        "Connection reached the upstream: {tokens:?}"
    );
    assert_eq!(seen.header("x-end-to-end"), Some("kept"));

    let head = &response.head;
    for name in ["x-up-hop", "keep-alive", "proxy-connection"] {
        assert!(
            raw_header(head, name).is_empty(),
            "{name} reached the client:\n{head}"
        );
    }
    let tokens = connection_tokens(&raw_header(head, "connection"));
    assert!(
        tokens.iter().all(|t| t == "keep-alive" || t == "close"),
        "the upstream's Connection reached the client:\n{head}"
    );
    assert_eq!(raw_header(head, "x-up-end-to-end"), ["kept"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_headers_are_set_and_host_is_kept() {
    let (upstream, sluice) = start().await;

    let (status, _, _) = get(
        sluice.addr(),
        "/fwd/a?x=1&y=two",
        &[
            ("host", "app.example:8443"),
            ("x-forwarded-for", "198.51.100.1"),
        ],
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let seen = only_request(&upstream);
    assert_eq!(seen.path, "/fwd/a?x=1&y=two");
    assert_eq!(seen.header("host"), Some("app.example:8443"));
    assert_eq!(seen.header("x-forwarded-host"), Some("app.example:8443"));
    assert_eq!(seen.header("x-forwarded-proto"), Some("http"));
    let chain: Vec<String> = seen
        .header_all("x-forwarded-for")
        .iter()
        .flat_map(|v| v.split(','))
        .map(|a| a.trim().to_owned())
        .collect();
    assert_eq!(chain, ["198.51.100.1", "127.0.0.1"]);

    let (status, _, _) = get(sluice.addr(), "/fwd/b", &[("host", "other.example")]).await;
    assert_eq!(status, StatusCode::OK);
    let seen = upstream.last().expect("a second request");
    assert_eq!(seen.header_all("x-forwarded-for"), ["127.0.0.1"]);
    assert_eq!(seen.header("host"), Some("other.example"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_is_502() {
    // Nothing listens there.
    let url = format!("http://127.0.0.1:{}", free_port());
    let sluice = Sidecar::start(&config(&url, "").replace(
        "  listen: 127.0.0.1:0\n",
        "  listen: 127.0.0.1:0\n  admin: 127.0.0.1:0\n",
    ));

    let (status, _, _) = get(sluice.addr(), "/x", &[]).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(upstream_errors(&sluice, "unreachable").await, 1.0);
    assert_eq!(upstream_errors(&sluice, "timeout").await, 0.0);
}

/// `sluice_upstream_errors_total{route="open",kind}`.
async fn upstream_errors(sluice: &Sidecar, kind: &str) -> f64 {
    let admin = sluice.admin_addr().expect("an admin listener");
    let text = support::ops::scrape(admin).await;
    let labels = [("route", "open"), ("kind", kind)];
    support::ops::metric(&text, "sluice_upstream_errors_total", &labels)
        .unwrap_or_else(|| panic!("no {kind} count:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_slower_than_the_timeout_is_504() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_secs(3));
    let sluice = Sidecar::start(&config(&upstream.url(), "  timeout: 200ms").replace(
        "  listen: 127.0.0.1:0\n",
        "  listen: 127.0.0.1:0\n  admin: 127.0.0.1:0\n",
    ));

    let (status, _, _) = get(sluice.addr(), "/slow", &[]).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(upstream.count(), 1, "a 504 is for a request that was sent");
    assert_eq!(upstream_errors(&sluice, "timeout").await, 1.0);
    assert_eq!(upstream_errors(&sluice, "unreachable").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_megabyte_request_body_reaches_the_upstream_intact_and_comes_back() {
    let (upstream, sluice) = start().await;
    upstream.echo_body();
    let body = pattern(FIVE_MB);

    let (status, _, echoed) = request(
        sluice.addr(),
        Method::POST,
        "/upload",
        &[],
        Bytes::from(body.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let seen = only_request(&upstream);
    assert_eq!(seen.body.len(), FIVE_MB);
    assert!(seen.body == body, "the request body changed on the way");
    assert!(echoed == body, "the echoed body changed on the way back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_megabyte_response_body_reaches_the_client_intact() {
    let (upstream, sluice) = start().await;
    upstream.respond_with_body_of(FIVE_MB);

    let (status, _, body) = get(sluice.addr(), "/download", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body.len(), FIVE_MB);
    assert!(
        body == pattern(FIVE_MB),
        "the response body changed on the way"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_request_body_is_forwarded() {
    let (upstream, sluice) = start().await;

    let response = raw_exchange(
        sluice.addr(),
        b"POST /chunked HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n\
          5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(response.status, 200, "{}", response.head);
    assert_eq!(only_request(&upstream).body, "hello world");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_framing_is_refused_before_the_upstream() {
    let (upstream, sluice) = start().await;

    let missing_host = raw_exchange(sluice.addr(), b"GET /x HTTP/1.1\r\n\r\n").await;
    assert_eq!(missing_host.status, 400, "{}", missing_host.head);

    let two_hosts = raw_exchange(
        sluice.addr(),
        b"GET /x HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
    )
    .await;
    assert_eq!(two_hosts.status, 400, "{}", two_hosts.head);

    let gzip_chunked = raw_exchange(
        sluice.addr(),
        b"POST /x HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n\
          5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert!(
        [400, 501].contains(&gzip_chunked.status),
        "{}",
        gzip_chunked.head
    );

    assert_eq!(upstream.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_prior_knowledge_request_is_served() {
    let (upstream, sluice) = start().await;

    let (status, _, body) = request_h2(sluice.addr(), Method::GET, "/h2?q=1", Bytes::new()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "upstream ok");
    let seen = only_request(&upstream);
    assert_eq!(seen.path, "/h2?q=1");
    // HTTP/2 carries the host as :authority; the upstream still sees it.
    assert_eq!(
        seen.header("host"),
        Some(sluice.addr().to_string().as_str())
    );
    // The app is spoken to in HTTP/1.1 whatever the client spoke.
    assert_eq!(seen.version, http::Version::HTTP_11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrade_passes_bytes_both_ways() {
    let (upstream, sluice) = start().await;

    let exchange = async {
        let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
        stream
            .write_all(
                b"GET /ws HTTP/1.1\r\nHost: app.test\r\nConnection: Upgrade\r\n\
                  Upgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                  Sec-WebSocket-Version: 13\r\n\r\n",
            )
            .await
            .expect("write the upgrade request");
        let (head, early) = read_head(&mut stream).await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        assert!(early.is_empty(), "bytes before any were sent: {early:?}");

        for message in [b"hello through sluice".to_vec(), pattern(64 * 1024)] {
            stream.write_all(&message).await.expect("write upgraded");
            let mut echoed = vec![0u8; message.len()];
            stream.read_exact(&mut echoed).await.expect("read the echo");
            assert!(echoed == message, "the upgraded stream changed the bytes");
        }
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("the upgraded exchange finished in time");

    let seen = only_request(&upstream);
    assert_eq!(seen.header("upgrade"), Some("websocket"));
    assert!(connection_tokens(&seen.header_all("connection")).contains(&"upgrade".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_never_reaches_the_upstream() {
    let (upstream, sluice) = start().await;
    let addr = sluice.addr();

    let (status, headers, _) = request(
        addr,
        Method::POST,
        "/limited",
        &[],
        Bytes::from_static(b"first"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.contains_key("ratelimit"), "{headers:?}");

    let big = Bytes::from(pattern(1024 * 1024));
    let (status, _, _) = request(addr, Method::POST, "/limited", &[], big).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    // A later request that does go through: if the denied one had been
    // forwarded at all, it would be recorded before this one.
    let (status, _, _) = get(addr, "/marker", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let paths: Vec<String> = upstream.requests().into_iter().map(|r| r.path).collect();
    assert_eq!(paths, ["/limited", "/marker"]);
    assert_eq!(upstream.count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http10_request_without_host_reaches_the_app_with_the_upstreams_host() {
    let (upstream, sluice) = start().await;
    let response = raw_exchange(sluice.addr(), b"GET /old HTTP/1.0\r\n\r\n").await;
    assert_eq!(response.status, 200, "{}", response.head);
    // Sent upstream as HTTP/1.1, which needs a Host: the upstream URL's
    // authority, as a client of that URL would send it.
    let seen = only_request(&upstream);
    assert_eq!(
        seen.header("host"),
        Some(upstream.addr().to_string().as_str())
    );
    assert_eq!(seen.header("x-forwarded-host"), None);
}
