//! The upload floor (`server.min_upload_rate`), through the built binary:
//! an upload trickled under it (a byte well inside every idle timeout) is
//! cut once its grace is over, on HTTP/1 and per HTTP/2 stream, and gives
//! back its in-flight place; one above the floor is not cut. Bodies here
//! stream (buffering off), so each upload holds its place as it arrives;
//! buffered ones are `request_buffering`'s.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::slow_clients::{h2_connect, h2_get, paced_upload};
use crate::support;
use crate::support::scripted::{Answer, Scripted};
use crate::support::{Sidecar, Upstream};

/// The floor the upload tests run under: 1000 B/s once 2 s of waiting on
/// the client are over, far above a trickle of a byte every 500 ms (2
/// B/s), each byte well inside the 30 s idle timeout.
const FLOOR: &str =
    "  body_idle_timeout: 30s\n  min_upload_rate: { bytes_per_second: 1000, grace: 2s }\n";
const GRACE: Duration = Duration::from_secs(2);
/// A trickle's pace, and how many bytes it announces: 500 s of body.
const TRICKLE_GAP: Duration = Duration::from_millis(500);
const TRICKLE_LEN: usize = 1000;
/// How long after its grace a trickle may go on before the test fails:
/// wide, for a loaded machine, and far short of the trickle's own end.
const CUT_WITHIN: Duration = Duration::from_secs(10);

/// `config`'s sidecar with three places in flight for everyone together,
/// the admin port, and [`FLOOR`]; bodies are not buffered, so an upload
/// holds its place as it streams (buffered ones: `request_buffering`).
fn three_places(upstream_url: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  request_buffering: {{ max_body: 0 }}
{FLOOR}upstream:
  url: {upstream_url}
  timeout: 60s
policies:
  three: {{ algorithm: concurrency, limit: 3 }}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, subject: global, policy: three }}
"
    )
}

/// How sluice ended a trickled upload.
#[derive(Debug, PartialEq, Eq)]
enum Ended {
    /// A response head with this status.
    Answered(u16),
    /// The connection closed or was reset before a whole head.
    Closed,
}

/// A `POST` announcing [`TRICKLE_LEN`] bytes, sent one every
/// [`TRICKLE_GAP`], until sluice answers or closes; how it ended and how
/// long after the head. Fails the test past the grace and [`CUT_WITHIN`].
async fn trickle(addr: std::net::SocketAddr, path: &str) -> (Ended, Duration) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut read, mut write) = stream.into_split();
    let head =
        format!("POST {path} HTTP/1.1\r\nHost: app.test\r\nContent-Length: {TRICKLE_LEN}\r\n\r\n");
    write
        .write_all(head.as_bytes())
        .await
        .expect("write the head");
    let started = Instant::now();
    let writer = async move {
        for _ in 0..TRICKLE_LEN {
            // Pacing the client, not waiting for an outcome.
            tokio::time::sleep(TRICKLE_GAP).await;
            if write.write_all(b"x").await.is_err() {
                break;
            }
        }
        // Cut or not, the reader says how it ended.
        std::future::pending::<()>().await;
    };
    let reader = async {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                return Ended::Answered(support::client::parse_status(&head));
            }
            match read.read(&mut chunk).await {
                Ok(0) | Err(_) => return Ended::Closed,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let ended = tokio::time::timeout(GRACE + CUT_WITHIN, async {
        tokio::select! {
            ended = reader => ended,
            () = writer => unreachable!("the writer never ends"),
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{path}: a trickle under the floor was not cut"));
    (ended, started.elapsed())
}

/// The trickle was ended by the floor: answered 408 (or, if the 408 was
/// lost to the close, closed), no sooner than its grace.
fn assert_cut_at_the_floor(what: &str, ended: &Ended, after: Duration) {
    eprintln!("{what}: {ended:?} {after:?} after its head");
    assert!(
        matches!(ended, Ended::Answered(408) | Ended::Closed),
        "{what}: {ended:?}"
    );
    assert!(after >= GRACE, "{what}: cut {after:?} in, inside the grace");
}

/// `sluice_request_bodies_cut_total{reason}`.
async fn cuts(sluice: &Sidecar, reason: &str) -> Option<f64> {
    let text = support::ops::scrape(sluice.admin_addr().expect("admin port")).await;
    support::ops::metric(
        &text,
        "sluice_request_bodies_cut_total",
        &[("reason", reason)],
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_trickled_under_the_floor_are_cut_and_give_their_places_back() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&three_places(&upstream.url()));
    let addr = sluice.addr();
    let uploads: Vec<_> = (0..3)
        .map(|i| tokio::spawn(async move { trickle(addr, &format!("/upload/{i}")).await }))
        .collect();

    // All three are with the app, holding every place: a fourth is
    // refused.
    support::eventually(Duration::from_secs(5), || async {
        (upstream.count() == 3).then_some(())
    })
    .await;
    let (status, _, _) = support::get(addr, "/fourth", &[]).await;
    assert_eq!(status, 503, "three uploads should hold every place");

    for (i, upload) in uploads.into_iter().enumerate() {
        let (ended, after) = upload.await.expect("the trickle task");
        assert_cut_at_the_floor(&format!("upload {i}"), &ended, after);
    }
    // The places came back: the fourth client is served.
    support::eventually(Duration::from_secs(5), || async {
        let (status, _, _) = support::get(addr, "/fourth", &[]).await;
        (status == 200).then_some(())
    })
    .await;
    assert_eq!(cuts(&sluice, "min_upload_rate").await, Some(3.0));
    assert_eq!(cuts(&sluice, "body_idle_timeout").await, Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_above_the_floor_is_not_cut_beside_one_under_it() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&three_places(&upstream.url()));
    let addr = sluice.addr();
    let trickled = tokio::spawn(async move { trickle(addr, "/trickled").await });

    // 2000 B/s, twice the floor, for 5 s: 200 bytes every 100 ms.
    let started = Instant::now();
    let (status, _) = paced_upload(&sluice, "/steady", 50, 200, Duration::from_millis(100)).await;
    assert!(started.elapsed() >= Duration::from_secs(5));
    assert_eq!(status, 200, "an upload above the floor was cut");
    let seen = upstream.requests();
    let steady = seen
        .iter()
        .find(|r| r.path == "/steady")
        .expect("the app got the steady upload");
    assert_eq!(steady.body.len(), 10_000);

    let (ended, after) = trickled.await.expect("the trickle task");
    assert_cut_at_the_floor("the trickle beside it", &ended, after);
    assert_eq!(cuts(&sluice, "min_upload_rate").await, Some(1.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_the_app_already_answered_is_cut_at_the_floor_all_the_same() {
    // The app answers at once, then reads the body as it comes and
    // ignores it.
    let upstream = Scripted::start(Answer::KeepOpen(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nearly".to_vec(),
    ))
    .await;
    let sluice = Sidecar::start(&three_places(&upstream.url()));
    let stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    let (mut read, mut write) = stream.into_split();
    let head = format!(
        "POST /answered-early HTTP/1.1\r\nHost: app.test\r\nContent-Length: {TRICKLE_LEN}\r\n\r\n"
    );
    write
        .write_all(head.as_bytes())
        .await
        .expect("write the head");
    let started = Instant::now();
    let writer = async move {
        loop {
            // Pacing the client, not waiting for an outcome.
            tokio::time::sleep(TRICKLE_GAP).await;
            if write.write_all(b"x").await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    };
    // The whole answer, then the end of the connection.
    let reader = async {
        let mut got = Vec::new();
        let mut answered = None;
        let mut chunk = [0u8; 4096];
        loop {
            match read.read(&mut chunk).await {
                Ok(0) | Err(_) => return (got, answered),
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
            if answered.is_none() && got.ends_with(b"early") {
                answered = Some(started.elapsed());
            }
        }
    };
    let (got, answered) = tokio::time::timeout(GRACE + CUT_WITHIN, async {
        tokio::select! {
            ended = reader => ended,
            () = writer => unreachable!("the writer never ends"),
        }
    })
    .await
    .expect("an upload under the floor was not cut after an early answer");
    let cut = started.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let answered = answered.unwrap_or_else(|| panic!("the early answer, whole: {text}"));
    assert!(answered < GRACE, "answered {answered:?} in");
    assert!(cut >= GRACE, "cut {cut:?} in, inside the grace");
    support::eventually(Duration::from_secs(5), || async {
        (cuts(&sluice, "min_upload_rate").await == Some(1.0)).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_streams_trickled_under_the_floor_are_cut_alone() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&three_places(&upstream.url()));
    let (mut client, _driven) = h2_connect(&sluice, 65_535).await;

    let mut streams = Vec::new();
    for i in 0..3 {
        let request = http::Request::post(format!("http://app.test/upload/{i}"))
            .header(http::header::CONTENT_LENGTH, TRICKLE_LEN)
            .body(())
            .expect("request");
        let mut ready = client.clone().ready().await.expect("ready to send");
        let (response, mut body) = ready.send_request(request, false).expect("send");
        client = ready;
        let trickling = tokio::spawn(async move {
            for _ in 0..TRICKLE_LEN {
                // Pacing the client, not waiting for an outcome.
                tokio::time::sleep(TRICKLE_GAP).await;
                if body
                    .send_data(bytes::Bytes::from_static(b"x"), false)
                    .is_err()
                {
                    break;
                }
            }
            std::future::pending::<()>().await;
        });
        streams.push((response, trickling, Instant::now()));
    }

    // Every place is held by a stream of this one connection; another
    // stream on it is refused, and answered.
    support::eventually(Duration::from_secs(5), || async {
        (upstream.count() == 3).then_some(())
    })
    .await;
    let refused = h2_get(&mut client, "/fourth").await;
    assert_eq!(refused.status(), 503);

    for (i, (response, trickling, started)) in streams.into_iter().enumerate() {
        let ended = tokio::time::timeout(GRACE + CUT_WITHIN, response)
            .await
            .unwrap_or_else(|_| panic!("stream {i}: a trickle under the floor was not cut"));
        let after = started.elapsed();
        // A response head is on the stream before any reset that follows it.
        let response = ended.unwrap_or_else(|e| panic!("stream {i}: reset before an answer: {e}"));
        assert_eq!(response.status(), 408, "stream {i}");
        assert!(after >= GRACE, "stream {i}: cut {after:?} in");
        trickling.abort();
    }

    // The connection goes on, and the places came back.
    support::eventually(Duration::from_secs(5), || {
        let mut client = client.clone();
        async move { (h2_get(&mut client, "/fourth").await.status() == 200).then_some(()) }
    })
    .await;
    assert_eq!(cuts(&sluice, "min_upload_rate").await, Some(3.0));
}
