//! An application that answers garbage, through the built binary: each
//! broken response head is a clean 502 with sluice's problem body, a body
//! that breaks after the head is a truncation the client can see (the
//! HTTP/1.1 connection closed, the HTTP/2 stream reset), and the upstream
//! connection that carried it is never used again.

use crate::support;
use std::time::Duration;

use crate::support::client::{build, http1_client, http2_client, REQUEST_DEADLINE};
use crate::support::scripted::{Answer, Scripted};
use crate::support::Sidecar;
use bytes::Bytes;
use http::{Method, Version};
use http_body_util::BodyExt;

/// What the client must see.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// sluice's own 502, a whole problem+json body.
    BadGateway,
    /// The upstream's status, then a body that ends in an error (never a
    /// clean end the client would take for the whole body).
    Truncated(u16),
    /// The upstream's answer, whole: the rows that show the table can fail.
    Whole(u16, &'static [u8]),
}

/// What the client saw.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    Whole(u16, Option<String>, Bytes),
    Truncated(u16),
}

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";

fn cases() -> Vec<(&'static str, Answer, Expect, bool)> {
    let big_header = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-Big: {}\r\n\r\nhello",
        "a".repeat(100 * 1024)
    );
    let many_headers = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n{}\r\nhello",
        (0..150)
            .map(|i| format!("X-H{i}: v\r\n"))
            .collect::<String>()
    );
    let mut flood = b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\n".repeat(50);
    flood.extend_from_slice(&b"HTTP/1.1 100 Continue\r\n\r\n".repeat(1000));
    flood.extend_from_slice(OK);
    let mut few = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(2);
    few.extend_from_slice(b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n");
    few.extend_from_slice(OK);
    let keep = |s: &[u8]| Answer::KeepOpen(s.to_vec());
    let close = |s: &[u8]| Answer::Close(s.to_vec());
    use Expect::*;
    // (name, what the upstream sends, what the client sees, reused after)
    vec![
        ("a good answer (control)", keep(OK), Whole(200, b"hello"), true),
        (
            "two 1xx then a good answer (control)",
            Answer::KeepOpen(few),
            Whole(200, b"hello"),
            true,
        ),
        (
            "Content-Length and Transfer-Encoding",
            keep(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            BadGateway,
            false,
        ),
        (
            "a transfer-coding that is not chunked",
            close(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello"),
            BadGateway,
            false,
        ),
        (
            "chunked after another coding",
            keep(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            BadGateway,
            false,
        ),
        (
            "chunked twice",
            keep(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
            BadGateway,
            false,
        ),
        (
            "two different Content-Lengths",
            keep(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
            BadGateway,
            false,
        ),
        (
            "a Content-Length list that disagrees",
            keep(b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!"),
            BadGateway,
            false,
        ),
        (
            "a status line that is not HTTP",
            keep(b"HELLO THERE\r\n\r\n"),
            BadGateway,
            false,
        ),
        ("closed before any byte", close(b""), BadGateway, false),
        (
            "a header block over the limit",
            Answer::KeepOpen(big_header.into_bytes()),
            BadGateway,
            false,
        ),
        (
            "more than 100 header fields",
            Answer::KeepOpen(many_headers.into_bytes()),
            BadGateway,
            false,
        ),
        ("a 1xx flood", Answer::KeepOpen(flood), BadGateway, false),
        (
            "a body shorter than its Content-Length",
            close(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello"),
            Truncated(200),
            false,
        ),
        (
            "a malformed chunk",
            keep(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nbroken\r\n"),
            Truncated(200),
            false,
        ),
        (
            "closed in the middle of a chunk",
            close(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nhello"),
            Truncated(200),
            false,
        ),
    ]
}

/// One request on a fresh client connection: after a truncation sluice
/// closes the HTTP/1.1 connection, and a pooled client could race that.
async fn exchange(sluice: &Sidecar, h2: bool) -> Seen {
    let client = if h2 { http2_client() } else { http1_client() };
    let mut request = build(sluice.addr(), Method::GET, "/x", &[], Bytes::new());
    if h2 {
        *request.version_mut() = Version::HTTP_2;
    }
    let seen = async {
        let response = client.request(request).await.expect("a response head");
        let status = response.status().as_u16();
        let content_type = support::header(response.headers(), "content-type").map(str::to_owned);
        match response.into_body().collect().await {
            Ok(body) => Seen::Whole(status, content_type, body.to_bytes()),
            Err(_) => Seen::Truncated(status),
        }
    };
    tokio::time::timeout(REQUEST_DEADLINE, seen)
        .await
        .expect("an answer in time")
}

fn check(name: &str, seen: &Seen, expect: Expect) {
    match (expect, seen) {
        (Expect::BadGateway, Seen::Whole(502, Some(content_type), body)) => {
            assert_eq!(content_type, "application/problem+json", "{name}");
            let json: serde_json::Value = serde_json::from_slice(body)
                .unwrap_or_else(|e| panic!("{name}: the 502 body is not JSON ({e}): {body:?}"));
            assert_eq!(json["status"], 502, "{name}: {json}");
        }
        (Expect::Truncated(want), Seen::Truncated(got)) => assert_eq!(want, *got, "{name}"),
        (Expect::Whole(want, body), Seen::Whole(got, _, got_body)) => {
            assert_eq!((want, body), (*got, &got_body[..]), "{name}");
        }
        _ => panic!("{name}: expected {expect:?}, saw {seen:?}"),
    }
}

async fn run_table(h2: bool) {
    let upstream = Scripted::start(Answer::KeepOpen(OK.to_vec())).await;
    let sluice = Sidecar::start(&upstream.sidecar_config());
    let admin = sluice.admin_addr().expect("admin address");
    let mut bad_gateways = 0.0;
    for (name, answer, expect, reused) in cases() {
        upstream.set_answer(answer);
        let seen = exchange(&sluice, h2).await;
        check(name, &seen, expect);
        bad_gateways += f64::from(u8::from(expect == Expect::BadGateway));
        let carried = *upstream
            .requests()
            .last()
            .expect("the request reached the upstream");

        // The next request: on the same connection only after a good answer.
        upstream.set_answer(Answer::KeepOpen(OK.to_vec()));
        let next = exchange(&sluice, h2).await;
        check(name, &next, Expect::Whole(200, b"hello"));
        let next_carried = *upstream.requests().last().expect("forwarded");
        assert_eq!(
            next_carried == carried,
            reused,
            "{name}: the broken answer came on upstream connection {carried}, the next request on {next_carried}"
        );
    }
    // Each 502 is sluice's own answer, counted by kind; none of them is
    // taken for an answer of the app's.
    let text = support::ops::scrape(admin).await;
    let responses = |class: &str| {
        support::ops::metric(
            &text,
            "sluice_upstream_responses_total",
            &[("route", "all"), ("status_class", class)],
        )
    };
    assert_eq!(responses("5xx"), Some(0.0), "{text}");
    let errors = |kind: &str| {
        support::ops::metric(
            &text,
            "sluice_upstream_errors_total",
            &[("route", "all"), ("kind", kind)],
        )
        .unwrap_or_else(|| panic!("no sluice_upstream_errors_total{{kind={kind:?}}}:\n{text}"))
    };
    assert!(errors("refused") >= 1.0, "{text}");
    assert!(errors("broken") >= 1.0, "{text}");
    assert_eq!(errors("refused") + errors("broken"), bad_gateways, "{text}");
    assert_eq!(errors("unreachable") + errors("timeout"), 0.0, "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_upstream_answers_over_http1() {
    run_table(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_upstream_answers_over_http2() {
    run_table(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1xx_flood_that_never_ends_is_a_502_not_a_hang() {
    let upstream = Scripted::start(Answer::KeepOpen(
        b"HTTP/1.1 100 Continue\r\n\r\n".repeat(200_000),
    ))
    .await;
    let sluice = Sidecar::start(&upstream.sidecar_config());
    let started = std::time::Instant::now();
    let seen = exchange(&sluice, false).await;
    check("an endless 1xx flood", &seen, Expect::BadGateway);
    // Well before `upstream.timeout` (5 s): the flood is cut by count.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_stalls_part_way_is_cut_at_the_upstream_timeout() {
    let stalls = [
        (
            "a body shorter than its Content-Length, the connection kept open",
            &b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello"[..],
        ),
        (
            "a chunked body that stops between chunks",
            &b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"[..],
        ),
    ];
    let upstream = Scripted::start(Answer::KeepOpen(OK.to_vec())).await;
    let sluice = Sidecar::start(
        &upstream
            .sidecar_config()
            .replace("timeout: 5s", "timeout: 1s"),
    );
    for h2 in [false, true] {
        for (name, answer) in stalls {
            upstream.set_answer(Answer::KeepOpen(answer.to_vec()));
            let started = std::time::Instant::now();
            let seen = exchange(&sluice, h2).await;
            let after = started.elapsed();
            check(name, &seen, Expect::Truncated(200));
            assert!(
                after >= Duration::from_millis(900) && after < Duration::from_secs(4),
                "{name} (h2: {h2}): cut after {after:?}"
            );
            let carried = *upstream.requests().last().expect("forwarded");
            upstream.set_answer(Answer::KeepOpen(OK.to_vec()));
            let next = exchange(&sluice, h2).await;
            check(name, &next, Expect::Whole(200, b"hello"));
            let next_carried = *upstream.requests().last().expect("forwarded");
            assert_ne!(
                carried, next_carried,
                "{name}: the stalled connection was reused"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_http1_a_truncated_body_ends_with_the_connection_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = Scripted::start(Answer::KeepOpen(OK.to_vec())).await;
    let sluice = Sidecar::start(&upstream.sidecar_config());
    let cases: [(&str, &[u8], &str); 2] = [
        (
            "a malformed chunk",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
            "transfer-encoding: chunked",
        ),
        (
            "a body shorter than its Content-Length",
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhello",
            "content-length: 100",
        ),
    ];
    for (name, answer, framing) in cases {
        upstream.set_answer(Answer::Close(answer.to_vec()));
        let mut stream = tokio::net::TcpStream::connect(sluice.addr())
            .await
            .expect("connect");
        stream
            .write_all(b"GET /x HTTP/1.1\r\nHost: app.test\r\n\r\n")
            .await
            .expect("write");
        let mut seen = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut seen));
        assert!(
            read.await.is_ok(),
            "{name}: the client connection stayed open"
        );
        let seen = String::from_utf8_lossy(&seen).to_lowercase();
        let (head, body) = seen
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("{name}: not a whole head: {seen:?}"));
        assert!(head.starts_with("http/1.1 200"), "{name}: {seen}");
        assert!(head.contains(framing), "{name}: {seen}");
        // What came is the start of the body, and nothing marks an end.
        assert!(body.contains("hello"), "{name}: {seen}");
        assert!(
            !body.contains("0\r\n\r\n") && body.len() < 100,
            "{name}: {seen}"
        );
    }
}
