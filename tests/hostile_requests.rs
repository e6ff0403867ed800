//! Requests a hostile or broken client sends, through the built binary:
//! invalid `Host`s and request-targets are refused and never forwarded, a
//! refused framing closes the connection (nothing pipelined behind it is
//! served), a broken request body is the client's 400 and never the app's
//! 502, and HTTP/2 cookie fields reach an HTTP/1.1 app as one line.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Version};
use support::client::{build, http2_client, send};
use support::{raw_exchange, Sidecar, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
policies:
  lots: {{ algorithm: sliding-log, limit: 100000, window: 1h }}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, subject: client_ip, policy: lots }}
",
        upstream.url()
    )
}

/// Everything the server sends on one connection until it closes it (or
/// 5 s pass, which fails the test).
async fn until_closed(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "the connection stayed open: {:?}",
        String::from_utf8_lossy(&out)
    );
    String::from_utf8_lossy(&out).into_owned()
}

fn statuses(responses: &str) -> Vec<u16> {
    responses
        .split("HTTP/1.1 ")
        .skip(1)
        .filter_map(|r| r.get(..3)?.parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_hosts_and_request_targets_are_refused_and_never_forwarded() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    for host in ["", "a b", "app/x", "[::1", "app:99999", "u@app"] {
        let request = format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n");
        let response = raw_exchange(sluice.addr(), request.as_bytes()).await;
        assert_eq!(response.status, 400, "Host {host:?}: {}", response.head);
    }
    for target in ["app:80", "app.test:8080"] {
        let request =
            format!("POST {target} HTTP/1.1\r\nHost: app.test\r\nContent-Length: 0\r\n\r\n");
        let response = raw_exchange(sluice.addr(), request.as_bytes()).await;
        assert_eq!(response.status, 400, "{target}: {}", response.head);
    }
    assert_eq!(upstream.count(), 0, "an invalid request reached the app");
    // The valid forms still pass.
    for request in [
        "GET / HTTP/1.1\r\nHost: app.test:8080\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
        "GET http://app.test/x HTTP/1.1\r\nHost: app.test\r\n\r\n",
    ] {
        let response = raw_exchange(sluice.addr(), request.as_bytes()).await;
        assert_eq!(response.status, 200, "{request:?}: {}", response.head);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_transfer_coding_closes_the_connection() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    // A second request pipelined behind the refused one must not be served:
    // where the first ends is exactly what is in doubt.
    stream
        .write_all(
            b"POST /a HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked, chunked\r\n\r\n\
              0\r\n\r\n\
              GET /b HTTP/1.1\r\nHost: app.test\r\n\r\n",
        )
        .await
        .expect("write");
    let responses = until_closed(&mut stream).await;
    assert_eq!(statuses(&responses), [501], "{responses}");
    assert_eq!(upstream.count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_request_body_is_the_client_s_400_never_the_app_s_502() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));

    // An invalid chunk size part way through.
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    stream
        .write_all(
            b"POST /upload HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n\
              5\r\nhello\r\nzz\r\nbroken\r\n",
        )
        .await
        .expect("write");
    let responses = until_closed(&mut stream).await;
    assert_eq!(statuses(&responses), [400], "{responses}");

    // Fewer bytes than the Content-Length, then the client stops sending.
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    stream
        .write_all(b"POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: 100\r\n\r\nshort")
        .await
        .expect("write");
    stream.shutdown().await.expect("half-close");
    let responses = until_closed(&mut stream).await;
    assert!(
        statuses(&responses).iter().all(|s| *s == 400),
        "a short body was answered {responses}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_cookie_fields_reach_an_http1_app_as_one_line() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    let mut request = build(
        sluice.addr(),
        Method::GET,
        "/c",
        &[("cookie", "a=1"), ("cookie", "b=2")],
        Bytes::new(),
    );
    *request.version_mut() = Version::HTTP_2;
    let (status, _, _) = send(&http2_client(), request).await;
    assert_eq!(status, 200);
    let seen = upstream.last().expect("forwarded");
    assert_eq!(seen.header_all("cookie"), ["a=1; b=2"]);
}
