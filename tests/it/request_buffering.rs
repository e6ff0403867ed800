//! Request buffering (`server.request_buffering`), through the built
//! binary: under a concurrency limit, a body that fits the buffer is
//! received whole before the request takes its place, so uploads sent just
//! above `server.min_upload_rate` hold no place while they arrive (HTTP/1,
//! and streams of one HTTP/2 connection), and other clients are served
//! throughout; the app gets the body byte for byte, however it was framed.
//! A body past `max_body` streams, what was read of it sent first, and
//! requests still streaming their bodies hold at most a quarter of a
//! limit's places, and leave the share once their bodies have arrived. A
//! body cut or broken while it is received is answered as before (408,
//! 400; on HTTP/2 that stream alone) and the app sees nothing of it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::support::client::{read_head, REQUEST_DEADLINE};
use crate::support::{self, Sidecar, Upstream};

/// Three places in flight for everyone together, the admin port, the
/// default upload floor (240 B/s after 5 s), and `buffering` as written.
fn three_places(upstream_url: &str, server: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
{server}upstream:
  url: {upstream_url}
  timeout: 60s
policies:
  three: {{ algorithm: concurrency, limit: 3 }}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, subject: global, policy: three }}
"
    )
}

/// 250 B/s, just above the default floor: 25 bytes every 100 ms.
const PIECE: usize = 25;
const GAP: Duration = Duration::from_millis(100);
/// The attack's upload size: far longer at 250 B/s than any test runs.
const UPLOAD: usize = 32_000;

/// A `POST` of `len` bytes announced in `Content-Length`, sent `piece`
/// bytes every `gap`; then its status (0 when sluice closed without one).
fn paced(
    addr: SocketAddr,
    path: String,
    len: usize,
    piece: usize,
    gap: Duration,
) -> JoinHandle<u16> {
    paced_counted(addr, path, len, piece, gap, Arc::default())
}

/// [`paced`], counting the body bytes written in `sent`.
fn paced_counted(
    addr: SocketAddr,
    path: String,
    len: usize,
    piece: usize,
    gap: Duration,
    sent: Arc<AtomicUsize>,
) -> JoinHandle<u16> {
    tokio::spawn(async move {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (mut read, mut write) = stream.into_split();
        let head =
            format!("POST {path} HTTP/1.1\r\nHost: app.test\r\nContent-Length: {len}\r\n\r\n");
        write
            .write_all(head.as_bytes())
            .await
            .expect("write the head");
        let body = support::pattern(len);
        let writer = async move {
            for chunk in body.chunks(piece) {
                // Pacing the client, not waiting for an outcome.
                tokio::time::sleep(gap).await;
                if write.write_all(chunk).await.is_err() {
                    break;
                }
                sent.fetch_add(chunk.len(), Ordering::SeqCst);
            }
            std::future::pending::<()>().await;
        };
        let reader = async {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    return support::client::parse_status(&head);
                }
                match read.read(&mut chunk).await {
                    Ok(0) | Err(_) => return 0,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        };
        tokio::select! {
            status = reader => status,
            () = writer => unreachable!("the writer never ends"),
        }
    })
}

async fn scrape(sluice: &Sidecar, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let text = support::ops::scrape(sluice.admin_addr().expect("admin port")).await;
    support::ops::metric(&text, name, labels)
}

async fn buffered_bytes(sluice: &Sidecar) -> f64 {
    scrape(sluice, "sluice_request_body_bytes_buffered", &[])
        .await
        .unwrap_or(0.0)
}

/// Waits until every upload has sent 1500 bytes: at 250 B/s, 6 s in,
/// past the floor's grace.
async fn past_the_grace(sent: &[Arc<AtomicUsize>]) {
    support::eventually(Duration::from_secs(30), || async {
        sent.iter()
            .all(|s| s.load(Ordering::SeqCst) >= 1500)
            .then_some(())
    })
    .await;
}

/// `n` GETs one after the other (each alone, so only the uploads could
/// hold the places), each answered 200.
async fn others_served(addr: SocketAddr, n: usize) {
    for i in 0..n {
        let (status, _, _) = support::get(addr, &format!("/other/{i}"), &[]).await;
        assert_eq!(status, StatusCode::OK, "client {i} of {n} was not served");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_uploads_just_above_the_floor_hold_no_place() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&three_places(&upstream.url(), ""));
    let addr = sluice.addr();
    let sent: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
    let uploads: Vec<_> = (0..3)
        .map(|i| {
            let path = format!("/upload/{i}");
            paced_counted(addr, path, UPLOAD, PIECE, GAP, sent[i].clone())
        })
        .collect();
    past_the_grace(&sent).await;

    others_served(addr, 47).await;
    assert!(
        uploads.iter().all(|u| !u.is_finished()),
        "an upload above the floor was cut"
    );
    // The app saw the others only, never more at once than the limit.
    assert_eq!(upstream.count(), 47);
    assert!(upstream.peak_in_flight() <= 3);
    // What they sent is held by sluice (some of it may still be on the
    // way).
    assert!(buffered_bytes(&sluice).await >= 3.0 * 1000.0);
    for upload in uploads {
        upload.abort();
    }
    // The uploads' bytes are given back when their clients go.
    support::eventually(Duration::from_secs(10), || async {
        (buffered_bytes(&sluice).await == 0.0).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_http2_uploads_on_one_connection_hold_no_place() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&three_places(&upstream.url(), ""));
    let tcp = TcpStream::connect(sluice.addr()).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    let _driven = tokio::spawn(async move {
        let _ = connection.await;
    });

    let mut client = client;
    let mut uploads = Vec::new();
    let sent: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
    for i in 0..3 {
        let request = http::Request::post(format!("http://app.test/upload/{i}"))
            .header(http::header::CONTENT_LENGTH, UPLOAD)
            .body(())
            .expect("request");
        let mut ready = client.clone().ready().await.expect("ready to send");
        let (response, mut body) = ready.send_request(request, false).expect("send");
        client = ready;
        let sent = sent[i].clone();
        let trickling = tokio::spawn(async move {
            for chunk in support::pattern(UPLOAD).chunks(PIECE) {
                // Pacing the client, not waiting for an outcome.
                tokio::time::sleep(GAP).await;
                if body
                    .send_data(Bytes::copy_from_slice(chunk), false)
                    .is_err()
                {
                    break;
                }
                sent.fetch_add(chunk.len(), Ordering::SeqCst);
            }
            std::future::pending::<()>().await;
        });
        uploads.push((response, trickling));
    }
    past_the_grace(&sent).await;

    // Other requests on the same connection are served, one at a time.
    for i in 0..20 {
        let request = http::Request::get(format!("http://app.test/other/{i}"))
            .body(())
            .expect("request");
        let mut ready = client.clone().ready().await.expect("ready to send");
        let (response, _) = ready.send_request(request, true).expect("send");
        client = ready;
        let response = tokio::time::timeout(REQUEST_DEADLINE, response)
            .await
            .expect("a response head in time")
            .expect("a response head");
        assert_eq!(response.status(), 200, "stream {i} was not served");
    }
    assert_eq!(upstream.count(), 20);
    assert!(upstream.peak_in_flight() <= 3);
    for (_, trickling) in uploads {
        trickling.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffered_body_reaches_the_app_byte_for_byte() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&three_places(&upstream.url(), ""));
    let addr = sluice.addr();
    let body = support::pattern(40_000);

    // Content-Length.
    let (status, _, _) = support::request(
        addr,
        Method::POST,
        "/length",
        &[],
        Bytes::from(body.clone()),
    )
    .await;
    assert_eq!(status, 200);

    // Chunked, in pieces of uneven sizes, with an empty-looking tail.
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut wire =
        b"POST /chunked HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for chunk in body.chunks(7_777) {
        wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        wire.extend_from_slice(chunk);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    stream.write_all(&wire).await.expect("write");
    let (head, _) = tokio::time::timeout(REQUEST_DEADLINE, read_head(&mut stream))
        .await
        .expect("a response in time");
    assert_eq!(support::client::parse_status(&head), 200, "{head}");

    // HTTP/2.
    let (status, _, _) =
        support::client::request_h2(addr, Method::POST, "/h2", Bytes::from(body.clone())).await;
    assert_eq!(status, 200);

    let seen = upstream.requests();
    for path in ["/length", "/chunked", "/h2"] {
        let got = seen
            .iter()
            .find(|r| r.path == path)
            .unwrap_or_else(|| panic!("the app got {path}"));
        assert!(got.body == body, "{path}: the body changed on the way");
        // Received whole, it goes with its length.
        assert_eq!(got.header("content-length"), Some("40000"), "{path}");
    }
    support::eventually(Duration::from_secs(5), || async {
        (buffered_bytes(&sluice).await == 0.0).then_some(())
    })
    .await;
}

/// Buffering up to 1 KiB only.
const SMALL_BUFFER: &str = "  request_buffering: { max_body: 1024, total: 1048576 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_past_the_buffer_streams_whole() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&three_places(&upstream.url(), SMALL_BUFFER));
    let addr = sluice.addr();
    let body = support::pattern(200_000);

    // Announced larger than the buffer: streamed from the start.
    let (status, _, _) = support::request(
        addr,
        Method::POST,
        "/length",
        &[],
        Bytes::from(body.clone()),
    )
    .await;
    assert_eq!(status, 200);

    // Chunked: read into the buffer until it goes past, then streamed,
    // what was read first.
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut wire =
        b"POST /chunked HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for chunk in body.chunks(300) {
        wire.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        wire.extend_from_slice(chunk);
        wire.extend_from_slice(b"\r\n");
    }
    wire.extend_from_slice(b"0\r\n\r\n");
    stream.write_all(&wire).await.expect("write");
    let (head, _) = tokio::time::timeout(REQUEST_DEADLINE, read_head(&mut stream))
        .await
        .expect("a response in time");
    assert_eq!(support::client::parse_status(&head), 200, "{head}");

    let seen = upstream.requests();
    for path in ["/length", "/chunked"] {
        let got = seen
            .iter()
            .find(|r| r.path == path)
            .unwrap_or_else(|| panic!("the app got {path}"));
        assert!(got.body == body, "{path}: the body changed on the way");
    }
    assert_eq!(
        scrape(
            &sluice,
            "sluice_request_bodies_streamed_total",
            &[("reason", "max_body")]
        )
        .await,
        Some(2.0)
    );
}

/// Past the default `max_body`.
const LARGE: usize = 100_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_still_streaming_hold_at_most_a_quarter_of_the_places() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&three_places(&upstream.url(), ""));
    let addr = sluice.addr();

    // A slow upload past the default buffer (64 KiB) streams, and holds a
    // place.
    let first = paced(addr, "/large/first".into(), LARGE, PIECE, GAP);
    support::eventually(Duration::from_secs(10), || async {
        (upstream.count() == 1).then_some(())
    })
    .await;
    // A quarter of 3 is one: a second one is refused at once, and never
    // reaches the app.
    let second = paced(addr, "/large/second".into(), LARGE, PIECE, GAP);
    let status = tokio::time::timeout(REQUEST_DEADLINE, second)
        .await
        .expect("an answer in time")
        .expect("the upload task");
    assert_eq!(status, 503);
    assert_eq!(upstream.count(), 1);
    // So is one that writes its whole upload before it reads anything,
    // and it reads its 503: the body is read and thrown away, where
    // leaving it unread would close the connection under its writes.
    let mut eager = TcpStream::connect(addr).await.expect("connect");
    let body = support::pattern(4 << 20);
    let head = format!(
        "POST /large/eager HTTP/1.1\r\nHost: app.test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    let written = tokio::time::timeout(REQUEST_DEADLINE, async {
        eager.write_all(head.as_bytes()).await?;
        eager.write_all(&body).await
    })
    .await
    .expect("the body is read");
    written.expect("the connection stays open under the writes");
    let (head, _) = read_head(&mut eager).await;
    assert_eq!(support::client::parse_status(&head), 503);
    assert_eq!(upstream.count(), 1);

    // The other places serve everyone else, a small upload included.
    others_served(addr, 10).await;
    let (status, _, _) = support::request(
        addr,
        Method::POST,
        "/small",
        &[],
        Bytes::from(vec![b'x'; 500]),
    )
    .await;
    assert_eq!(status, 200);
    assert!(!first.is_finished(), "the streaming upload was cut");
    assert!(upstream.peak_in_flight() <= 3);
    assert_eq!(
        scrape(
            &sluice,
            "sluice_requests_total",
            &[
                ("route", "all"),
                ("policy", "three"),
                ("outcome", "concurrency_denied")
            ]
        )
        .await,
        Some(2.0)
    );
    first.abort();

    // Once the streaming one is gone, the next may stream.
    support::eventually(Duration::from_secs(10), || async {
        (upstream.in_flight() == 0).then_some(())
    })
    .await;
    let body = Bytes::from(support::pattern(LARGE));
    let (status, _, _) = support::request(addr, Method::POST, "/large/third", &[], body).await;
    assert_eq!(status, 200);
    // The first and the third streamed; the refused one did not.
    assert_eq!(
        scrape(
            &sluice,
            "sluice_request_bodies_streamed_total",
            &[("reason", "max_body")]
        )
        .await,
        Some(2.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_cut_while_buffered_takes_no_place_and_never_reaches_the_app() {
    let upstream = Upstream::start().await;
    let floor = "  min_upload_rate: { bytes_per_second: 1000, grace: 2s }\n";
    let sluice = Sidecar::start(&three_places(&upstream.url(), floor));
    let addr = sluice.addr();

    // Three trickles far under the floor (2 B/s).
    let sent: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
    let trickles: Vec<_> = (0..3)
        .map(|i| {
            let path = format!("/trickle/{i}");
            let gap = Duration::from_millis(500);
            paced_counted(addr, path, 1000, 1, gap, sent[i].clone())
        })
        .collect();
    support::eventually(Duration::from_secs(10), || async {
        sent.iter()
            .all(|s| s.load(Ordering::SeqCst) >= 1)
            .then_some(())
    })
    .await;
    // While they arrive, everyone else is served.
    others_served(addr, 10).await;
    for (i, trickle) in trickles.into_iter().enumerate() {
        let status = tokio::time::timeout(Duration::from_secs(20), trickle)
            .await
            .unwrap_or_else(|_| panic!("trickle {i} was not cut"))
            .expect("the trickle task");
        // 408, or closed if the answer was lost to the close.
        assert!(status == 408 || status == 0, "trickle {i}: {status}");
    }
    assert_eq!(
        scrape(
            &sluice,
            "sluice_request_bodies_cut_total",
            &[("reason", "min_upload_rate")]
        )
        .await,
        Some(3.0)
    );

    // A body that ends before its Content-Length: 400.
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"POST /short HTTP/1.1\r\nHost: app.test\r\nContent-Length: 1000\r\n\r\n")
        .await
        .expect("write");
    stream.write_all(&[b'y'; 500]).await.expect("write");
    stream.shutdown().await.expect("half-close");
    let (head, _) = tokio::time::timeout(REQUEST_DEADLINE, read_head(&mut stream))
        .await
        .expect("a response in time");
    assert_eq!(support::client::parse_status(&head), 400, "{head}");

    // The app saw only the others, and nothing is held.
    assert_eq!(upstream.count(), 10);
    support::eventually(Duration::from_secs(5), || async {
        (buffered_bytes(&sluice).await == 0.0).then_some(())
    })
    .await;
    others_served(addr, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_buffering_settings_are_named() {
    let (code, _, stderr) = {
        let yaml = three_places(
            "http://127.0.0.1:1",
            "  request_buffering: { max_body: 65536, total: 1000 }\n",
        );
        let (_dir, path) = support::sidecar::write_config(&yaml);
        support::sidecar::run_binary(&["check", "--config", path.to_str().unwrap()], &[])
    };
    assert_ne!(code, 0);
    assert!(
        stderr.contains("server.request_buffering.total: 1000 is below max_body (65536)"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_upload_that_has_arrived_leaves_the_streaming_share() {
    let upstream = Upstream::start().await;
    upstream.set_delay(Duration::from_secs(3));
    let sluice = Sidecar::start(&three_places(&upstream.url(), ""));
    let addr = sluice.addr();
    let post = |path: &'static str| {
        let body = Bytes::from(support::pattern(LARGE));
        tokio::spawn(async move {
            support::request(addr, Method::POST, path, &[], body)
                .await
                .0
        })
    };

    // The first large upload streams; once the app has read all of it
    // (and takes its time answering), it holds an ordinary place.
    let first = post("/large/first");
    support::eventually(Duration::from_secs(10), || async {
        (upstream.requests().len() == 1).then_some(())
    })
    .await;
    // So the next large upload may stream beside it.
    let second = post("/large/second");
    assert_eq!(first.await.expect("the first upload"), StatusCode::OK);
    assert_eq!(second.await.expect("the second upload"), StatusCode::OK);
    assert_eq!(upstream.peak_in_flight(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_cut_while_buffered_is_answered_alone() {
    let upstream = Upstream::start().await;
    let floor = "  min_upload_rate: { bytes_per_second: 1000, grace: 2s }\n";
    let sluice = Sidecar::start(&three_places(&upstream.url(), floor));
    let tcp = TcpStream::connect(sluice.addr()).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
    let _driven = tokio::spawn(async move {
        let _ = connection.await;
    });

    // A stream trickling its body far under the floor (2 B/s).
    let request = http::Request::post("http://app.test/trickle")
        .header(http::header::CONTENT_LENGTH, 1000)
        .body(())
        .expect("request");
    let mut ready = client.clone().ready().await.expect("ready to send");
    let (response, mut body) = ready.send_request(request, false).expect("send");
    let trickling = tokio::spawn(async move {
        loop {
            // Pacing the client, not waiting for an outcome.
            tokio::time::sleep(Duration::from_millis(500)).await;
            if body.send_data(Bytes::from_static(b"x"), false).is_err() {
                break;
            }
        }
        std::future::pending::<()>().await;
    });
    let response = tokio::time::timeout(Duration::from_secs(20), response)
        .await
        .expect("the trickle was cut")
        .expect("an answer before any reset");
    assert_eq!(response.status(), 408);
    trickling.abort();

    // The connection goes on; the app never saw the trickle.
    let request = http::Request::get("http://app.test/next")
        .body(())
        .expect("request");
    let mut ready = ready.ready().await.expect("ready to send");
    let (next, _) = ready.send_request(request, true).expect("send");
    let next = tokio::time::timeout(REQUEST_DEADLINE, next)
        .await
        .expect("a response head in time")
        .expect("a response head");
    assert_eq!(next.status(), 200);
    assert_eq!(upstream.count(), 1);
}

/// The decision's budget starts once the body is in: on Redis, an upload
/// that took far longer than `store.budget` (50 ms here) to arrive is
/// still decided, not refused for a budget spent while it was received.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_body_on_redis_is_decided_within_a_budget_of_its_own() {
    let redis = crate::support::redis::RedisServer::start();
    let upstream = Upstream::start().await;
    let policies = "  three: { algorithm: concurrency, limit: 3 }\n  hourly: { algorithm: fixed-window, limit: 100, window: 1h }\n";
    let routes = "  - name: all
    match: { path_prefix: / }
    limits:
      - { policy: three, subject: global }
      - { policy: hourly, subject: client_ip }
";
    let yaml = crate::support::redis_sidecar::redis_yaml(&upstream, &redis.url(), policies, routes);
    let sluice = crate::support::redis_sidecar::start_ready(&yaml).await;
    // 1,000 bytes in 40 pieces 25 ms apart: a second in all.
    let status = paced(
        sluice.addr(),
        "/upload".to_owned(),
        1000,
        PIECE,
        Duration::from_millis(25),
    )
    .await
    .expect("the upload task");
    assert_eq!(status, 200);
    assert_eq!(upstream.count(), 1);
}
