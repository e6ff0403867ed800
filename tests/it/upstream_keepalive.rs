//! sluice's kept-alive connections to the app, through the built binary,
//! against an app that closes them: a request that meets a connection the
//! app has just closed is sent again on a new one when that cannot repeat
//! its effect (an idempotent request with no body), and is a 502 otherwise;
//! a connection the app closed is never handed a request.

use crate::support;
use std::time::Duration;

use crate::support::client::{build, http1_client, request, send};
use crate::support::scripted::{Answer, Scripted};
use crate::support::Sidecar;
use bytes::Bytes;
use http::Method;

const OK: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello";

async fn resends(sluice: &Sidecar) -> f64 {
    let admin = sluice.admin_addr().expect("admin address");
    let text = support::ops::scrape(admin).await;
    support::ops::metric(&text, "sluice_upstream_resends_total", &[]).unwrap_or(0.0)
}

#[tokio::test]
async fn a_get_that_meets_a_connection_the_app_just_closed_is_sent_again_on_a_new_one() {
    let upstream = Scripted::start(Answer::FirstOnly(OK.to_vec())).await;
    let sluice = Sidecar::start(&upstream.sidecar_config());

    let (status, _, body) = request(sluice.addr(), Method::GET, "/a", &[], Bytes::new()).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"hello"[..]));
    // The second request meets connection 1, which the app closes on
    // reading it; sluice sends it again on connection 2.
    let (status, _, body) = request(sluice.addr(), Method::GET, "/b", &[], Bytes::new()).await;
    assert_eq!((status.as_u16(), &body[..]), (200, &b"hello"[..]));
    assert_eq!(upstream.requests(), vec![1, 1, 2]);
    assert_eq!(resends(&sluice).await, 1.0);

    // DELETE and HEAD are resent the same way (HEAD last: the app answers
    // it with a body, which spoils the connection it came on).
    for method in [Method::DELETE, Method::HEAD] {
        let before = upstream.requests().len();
        let (status, _, _) = request(sluice.addr(), method.clone(), "/c", &[], Bytes::new()).await;
        assert_eq!(status.as_u16(), 200, "{method}");
        let carried = &upstream.requests()[before..];
        assert_eq!(carried.len(), 2, "{method}: {carried:?}");
        assert_ne!(
            carried[0], carried[1],
            "{method}: resent on a new connection"
        );
    }
    assert_eq!(resends(&sluice).await, 3.0);
}

#[tokio::test]
async fn a_post_that_meets_a_connection_the_app_just_closed_is_a_502_and_never_sent_twice() {
    let upstream = Scripted::start(Answer::FirstOnly(OK.to_vec())).await;
    let sluice = Sidecar::start(&upstream.sidecar_config());

    let (status, _, _) = request(sluice.addr(), Method::GET, "/a", &[], Bytes::new()).await;
    assert_eq!(status.as_u16(), 200);
    let (status, _, _) = request(sluice.addr(), Method::POST, "/b", &[], Bytes::new()).await;
    assert_eq!(status.as_u16(), 502);
    // The POST reached the app once, on the connection it closed.
    assert_eq!(upstream.requests(), vec![1, 1]);
    assert_eq!(resends(&sluice).await, 0.0);
    // The closed connection is gone: the next request goes on a new one.
    let (status, _, _) = request(sluice.addr(), Method::GET, "/c", &[], Bytes::new()).await;
    assert_eq!(status.as_u16(), 200);
    assert_eq!(upstream.requests(), vec![1, 1, 2]);
}

#[tokio::test]
async fn connections_the_app_closes_after_each_answer_are_never_reused() {
    // No `Connection: close`: the app just closes after answering.
    let upstream = Scripted::start(Answer::Close(OK.to_vec())).await;
    let sluice = Sidecar::start(&upstream.sidecar_config());
    // One kept-alive client connection, requests back to back.
    let client = http1_client();
    for n in 1..=30 {
        let (status, _, body) = send(
            &client,
            build(sluice.addr(), Method::POST, "/x", &[], Bytes::new()),
        )
        .await;
        assert_eq!(
            (status.as_u16(), &body[..]),
            (200, &b"hello"[..]),
            "request {n}"
        );
    }
    // Every POST on a connection of its own, each reaching the app once. (A
    // POST may still be resent: one whose connection hyper found closed
    // before writing a byte of it.)
    assert_eq!(upstream.requests(), (1..=30).collect::<Vec<_>>());
}

#[tokio::test]
async fn connections_the_app_closes_when_idle_are_not_used_after_it_did() {
    let upstream =
        Scripted::start(Answer::IdleClose(OK.to_vec(), Duration::from_millis(100))).await;
    let sluice = Sidecar::start(&upstream.sidecar_config());
    let client = http1_client();
    // Back to back: one connection carries them all.
    for _ in 0..3 {
        let (status, _, _) = send(
            &client,
            build(sluice.addr(), Method::POST, "/x", &[], Bytes::new()),
        )
        .await;
        assert_eq!(status.as_u16(), 200);
    }
    assert_eq!(upstream.requests(), vec![1, 1, 1]);
    // After the app's keep-alive timeout: a new connection each time, and
    // no POST ever met a closed one (no 502).
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (status, _, _) = send(
            &client,
            build(sluice.addr(), Method::POST, "/x", &[], Bytes::new()),
        )
        .await;
        assert_eq!(status.as_u16(), 200);
    }
    assert_eq!(upstream.requests(), vec![1, 1, 1, 2, 3, 4]);
}

#[tokio::test]
async fn a_resent_request_is_held_to_the_same_1xx_limit() {
    let upstream = Scripted::start(Answer::FirstOnly(OK.to_vec())).await;
    let sluice = Sidecar::start(&upstream.sidecar_config());
    let (status, _, _) = request(sluice.addr(), Method::GET, "/a", &[], Bytes::new()).await;
    assert_eq!(status.as_u16(), 200);

    // The resend goes on a new connection, which answers a flood of 1xx
    // before its 200: a 502, as on a first attempt.
    let mut flood = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(100);
    flood.extend_from_slice(OK);
    upstream.set_answer(Answer::FirstOnly(flood));
    let (status, _, _) = request(sluice.addr(), Method::GET, "/b", &[], Bytes::new()).await;
    assert_eq!(status.as_u16(), 502);
    assert_eq!(upstream.requests(), vec![1, 1, 2]);
    assert_eq!(resends(&sluice).await, 1.0);
}

#[tokio::test]
async fn a_resent_request_counts_the_1xx_of_both_attempts() {
    // Ten `1xx` before each answer: under the limit of 16 alone.
    let continues = b"HTTP/1.1 100 Continue\r\n\r\n".repeat(10);
    let first = [&continues[..], OK].concat();
    let upstream = Scripted::start(Answer::FirstThenClose(first, continues)).await;
    let sluice = Sidecar::start(&upstream.sidecar_config());
    let (status, _, _) = request(sluice.addr(), Method::GET, "/a", &[], Bytes::new()).await;
    assert_eq!(status.as_u16(), 200);

    // The kept connection answers ten `1xx` and closes; the resend's new
    // connection ten more and a 200: twenty for one request, a 502.
    let (status, _, _) = request(sluice.addr(), Method::GET, "/b", &[], Bytes::new()).await;
    assert_eq!(upstream.requests(), vec![1, 1, 2]);
    assert_eq!(resends(&sluice).await, 1.0);
    assert_eq!(status.as_u16(), 502);
}

/// Two requests on one client connection to sluice, in front of
/// `sidecar`: the two response heads, and whatever body followed each.
async fn two_on_one_connection(sluice: &Sidecar) -> Vec<(String, Vec<u8>)> {
    let mut stream = tokio::net::TcpStream::connect(sluice.addr())
        .await
        .expect("connect");
    let mut out = Vec::new();
    for _ in 0..2 {
        use tokio::io::AsyncWriteExt as _;
        stream
            .write_all(b"GET /index.html HTTP/1.1\r\nHost: app.test\r\n\r\n")
            .await
            .expect("the connection is still open");
        let (head, mut body) = support::client::read_head(&mut stream).await;
        // Read the rest of this response by its framing.
        let framed = |body: &[u8]| {
            if head
                .to_ascii_lowercase()
                .contains("transfer-encoding: chunked")
            {
                body.ends_with(b"0\r\n\r\n")
            } else {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(|v| v.trim().to_owned())
                    })
                    .and_then(|v| v.parse::<usize>().ok())
                    .expect("a length or chunked");
                body.len() >= length
            }
        };
        while !framed(&body) {
            use tokio::io::AsyncReadExt as _;
            let mut buf = [0u8; 4096];
            let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf))
                .await
                .expect("the body in time")
                .expect("read");
            assert!(n > 0, "closed mid-body after {head}");
            body.extend_from_slice(&buf[..n]);
        }
        out.push((head, body));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_keep_http11_and_their_connection_behind_an_http10_app() {
    // Python's http.server speaks HTTP/1.0, as many legacy apps do.
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::write(dir.path().join("index.html"), "hello from 1.0\n").expect("write");
    let port = support::free_port();
    let mut app = std::process::Command::new("python3")
        .args([
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            &port.to_string(),
        ])
        .current_dir(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("python3 -m http.server");
    support::eventually(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
    })
    .await;
    let yaml = format!(
        "version: 1\nserver:\n  listen: 127.0.0.1:0\nupstream:\n  url: http://127.0.0.1:{port}\n"
    );
    let sluice = Sidecar::start(&yaml);
    let answers = two_on_one_connection(&sluice).await;
    let _ = app.kill();
    let _ = app.wait();
    for (head, body) in &answers {
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            String::from_utf8_lossy(body).contains("hello from 1.0"),
            "{head}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_delimited_http10_answer_reaches_the_client_framed_on_a_kept_connection() {
    let upstream = Scripted::start(Answer::Close(
        b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the app closes".to_vec(),
    ))
    .await;
    let sluice = Sidecar::start(&upstream.sidecar_config());
    let answers = two_on_one_connection(&sluice).await;
    for (head, body) in &answers {
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("transfer-encoding: chunked"),
            "{head}"
        );
        assert!(
            String::from_utf8_lossy(body).contains("until the app closes"),
            "{head}"
        );
    }
    assert_eq!(
        upstream.connections(),
        2,
        "each 1.0 answer closed its app connection"
    );
}
