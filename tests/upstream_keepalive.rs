//! sluice's kept-alive connections to the app, through the built binary,
//! against an app that closes them: a request that meets a connection the
//! app has just closed is sent again on a new one when that cannot repeat
//! its effect (an idempotent request with no body), and is a 502 otherwise;
//! a connection the app closed is never handed a request.

mod support;

use std::time::Duration;

use bytes::Bytes;
use http::Method;
use support::client::{build, http1_client, request, send};
use support::scripted::{Answer, Scripted};
use support::Sidecar;

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
