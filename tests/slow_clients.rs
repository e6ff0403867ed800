//! Slow clients, through the built binary: a slow but steady upload is
//! not the upstream's delay (`upstream.timeout` starts when the body has
//! been sent), a client that stops reading a large response holds only
//! bounded buffers (sluice stops reading the upstream), and slowhttptest's
//! slowloris and slow-body attacks are cut at the timeouts while a normal
//! client is served throughout.

mod support;

use std::time::{Duration, Instant};

use support::client::{read_head, REQUEST_DEADLINE};
use support::scripted::{Answer, Scripted};
use support::{Sidecar, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config(upstream_url: &str, server: &str, upstream_timeout: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
{server}upstream:
  url: {upstream_url}
  timeout: {upstream_timeout}
policies:
  lots: {{ algorithm: sliding-log, limit: 100000, window: 1h }}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, subject: client_ip, policy: lots }}
"
    )
}

/// Uploads `pieces` bytes one at a time, `gap` apart, then reads the
/// response head: its status, and when the last byte was sent.
async fn slow_upload(sluice: &Sidecar, pieces: usize, gap: Duration) -> (u16, Instant) {
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    let head =
        format!("POST /upload HTTP/1.1\r\nHost: app.test\r\nContent-Length: {pieces}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("write");
    for _ in 0..pieces {
        // Pacing the client, not waiting for an outcome.
        tokio::time::sleep(gap).await;
        stream.write_all(b"x").await.expect("sluice kept reading");
    }
    let last_byte = Instant::now();
    let (head, _) = tokio::time::timeout(REQUEST_DEADLINE, read_head(&mut stream))
        .await
        .expect("a response in time");
    (support::client::parse_status(&head), last_byte)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_steady_upload_is_not_a_504_and_a_stall_after_it_is() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream.url(), "  body_idle_timeout: 5s\n", "1s"));
    // 2.4 s of upload against a 1 s upstream timeout, each gap well under
    // the body idle timeout; the app reads the whole body first.
    let started = Instant::now();
    let (status, _) = slow_upload(&sluice, 8, Duration::from_millis(300)).await;
    assert!(started.elapsed() > Duration::from_secs(2));
    assert_eq!(status, 200, "a steady upload was cut");
    let seen = upstream.last().expect("the app got the request");
    assert_eq!(&seen.body[..], b"xxxxxxxx");

    // The app stalls once it has the body: 504, one timeout after the end.
    upstream.set_delay(Duration::from_secs(4));
    let (status, last_byte) = slow_upload(&sluice, 4, Duration::from_millis(300)).await;
    let after = last_byte.elapsed();
    assert_eq!(status, 504);
    assert!(
        after >= Duration::from_millis(900) && after < Duration::from_millis(2500),
        "504 {after:?} after the last byte"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_makes_sluice_stop_reading_the_upstream() {
    const LEN: u64 = 1 << 30;
    let upstream = Scripted::start(Answer::Large(LEN)).await;
    let sluice = Sidecar::start(&config(&upstream.url(), "", "5s"));
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    stream
        .write_all(b"GET /large HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .expect("write");
    let (head, _) = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    // The client reads nothing more. The upstream's writes must stop: the
    // socket buffers on both sides and hyper's bounded buffers fill, and
    // no more is read. Poll until the count holds still for a second.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (mut last, mut still_since) = (upstream.written(), Instant::now());
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = upstream.written();
        if now != last {
            (last, still_since) = (now, Instant::now());
        } else if still_since.elapsed() >= Duration::from_secs(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the upstream never stopped: {now} bytes"
        );
    }
    eprintln!("read from the upstream while the client read nothing: {last} bytes");
    // Loopback socket buffers are a few MiB each way; 1 GiB buffered
    // would be sluice reading on without bound.
    assert!(
        last < 64 << 20,
        "{last} bytes read from the upstream while the client read none"
    );

    // Reading again resumes the flow: bytes keep coming from the upstream.
    let mut buf = vec![0u8; 1 << 20];
    let resumed = async {
        while upstream.written() < last + (64 << 20) {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "sluice closed the connection");
        }
    };
    tokio::time::timeout(Duration::from_secs(20), resumed)
        .await
        .expect("the response flows again once the client reads");
}
