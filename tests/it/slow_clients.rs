//! Slow clients, through the built binary: a slow but steady upload is
//! not the upstream's delay (`upstream.timeout` starts when the body has
//! been sent), a client that stops reading a large response holds only
//! bounded buffers (sluice stops reading the upstream), and slowhttptest's
//! slowloris and slow-body attacks are cut at the timeouts while a normal
//! client is served throughout. On HTTP/2, a stream whose client grants it
//! no flow-control window is reset at the send timeout, alone, and a
//! stream waiting on the upstream is not. The upload floor is
//! `upload_floor`'s; buffered uploads are `request_buffering`'s.

use crate::support;
use std::time::{Duration, Instant};

use crate::support::client::{read_head, REQUEST_DEADLINE};
use crate::support::scripted::{Answer, Scripted};
use crate::support::{Sidecar, Upstream};
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
    paced_upload(sluice, "/upload", pieces, 1, gap).await
}

/// Uploads `pieces` pieces of `len` bytes to `path`, `gap` apart, then
/// reads the response head: its status, and when the last byte was sent.
pub(crate) async fn paced_upload(
    sluice: &Sidecar,
    path: &str,
    pieces: usize,
    len: usize,
    gap: Duration,
) -> (u16, Instant) {
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    let total = pieces * len;
    let head = format!("POST {path} HTTP/1.1\r\nHost: app.test\r\nContent-Length: {total}\r\n\r\n");
    stream.write_all(head.as_bytes()).await.expect("write");
    let piece = vec![b'x'; len];
    for _ in 0..pieces {
        // Pacing the client, not waiting for an outcome.
        tokio::time::sleep(gap).await;
        stream.write_all(&piece).await.expect("sluice kept reading");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_stops_reading_is_cut_at_the_send_timeout() {
    const LEN: u64 = 1 << 30;
    let upstream = Scripted::start(Answer::Large(LEN)).await;
    let sluice = Sidecar::start(&config(&upstream.url(), "  send_timeout: 2s\n", "30s"));
    let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
    stream
        .write_all(b"GET /large HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .expect("write");
    let (head, rest) = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let stopped = Instant::now();

    // sluice gives up on the client, and with it on the upstream
    // connection, whose writes then fail.
    support::eventually(Duration::from_secs(15), || async {
        (upstream.broken() == 1).then_some(())
    })
    .await;
    let after = stopped.elapsed();
    assert!(
        after >= Duration::from_millis(1900) && after < Duration::from_secs(8),
        "cut {after:?} after the client stopped reading"
    );
    // The client reads what was on the way, then the end: far from 1 GiB.
    let mut got = rest.len() as u64;
    let mut buf = vec![0u8; 1 << 20];
    let drained = async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
            got += n as u64;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), drained)
        .await
        .expect("the connection was closed");
    assert!(got < LEN / 4, "{got} bytes reached a client that was cut");
}

/// One second of slowhttptest's CSV report (`-g -o`).
#[derive(Debug, Clone, Copy)]
struct Tick {
    second: u64,
    closed: u64,
    connected: u64,
}

/// A slowhttptest run: its report, the second it ended on and why.
struct Attack {
    ticks: Vec<Tick>,
    ended_on: u64,
    exit_status: String,
}

/// Runs `slowhttptest` with `args` against sluice, `connections` slow
/// connections for at most `length` seconds, while a normal client asks
/// for a page every 100 ms; every one of those must be answered 200.
async fn attack(sluice: &Sidecar, mode: &str, interval: u32, length: u32) -> Attack {
    let dir = tempfile::tempdir().expect("temp dir");
    let prefix = dir.path().join("report");
    let url = format!("http://{}/", sluice.addr());
    let mut command = tokio::process::Command::new("slowhttptest");
    command
        .arg(mode)
        .args(["-c", "30", "-r", "30", "-p", "2", "-g"])
        .args(["-i", &interval.to_string(), "-l", &length.to_string()])
        .arg("-o")
        .arg(&prefix)
        .args(["-u", &url])
        .kill_on_drop(true);
    let run = command.output();
    let normal = async {
        let mut served = 0;
        loop {
            let (status, _, _) = tokio::time::timeout(
                Duration::from_secs(2),
                support::get(sluice.addr(), "/normal", &[]),
            )
            .await
            .expect("a normal client was not served within 2 s during the attack");
            assert_eq!(status, 200);
            served += 1;
            tokio::time::sleep(Duration::from_millis(100)).await;
            if served >= 1000 {
                return;
            }
        }
    };
    let output = tokio::select! {
        output = run => output.expect("run slowhttptest (apt-get install slowhttptest)"),
        () = normal => panic!("slowhttptest ran for over 100 s"),
    };
    let text = strip_ansi(&String::from_utf8_lossy(&output.stdout));
    let csv = std::fs::read_to_string(prefix.with_extension("csv"))
        .unwrap_or_else(|e| panic!("no CSV report ({e}); output:\n{text}"));
    let ticks = csv
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<u64> = line
                .split(',')
                .map(|f| f.trim().parse().ok())
                .collect::<Option<_>>()?;
            Some(Tick {
                second: *fields.first()?,
                closed: *fields.get(1)?,
                connected: *fields.get(3)?,
            })
        })
        .collect();
    let ended_on = text
        .split("Test ended on ")
        .nth(1)
        .and_then(|rest| rest.split("th second").next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no end in slowhttptest's output:\n{text}"));
    let exit_status = text
        .split("Exit status: ")
        .nth(1)
        .and_then(|rest| rest.lines().next())
        .unwrap_or_default()
        .trim()
        .to_owned();
    // And after the attack, a normal client is still served.
    let (status, _, _) = support::get(sluice.addr(), "/after", &[]).await;
    assert_eq!(status, 200);
    Attack {
        ticks,
        ended_on,
        exit_status,
    }
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters final-letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The slow connections were open, then all closed by sluice at about
/// `timeout`, well before the attack's own length.
fn check_cut(attack: &Attack, timeout_secs: u64, length: u64) {
    let report = format!(
        "{:?}, ended on {} ({})",
        attack.ticks, attack.ended_on, attack.exit_status
    );
    assert_eq!(attack.exit_status, "No open connections left", "{report}");
    let held = attack.ticks.iter().map(|t| t.connected).max().unwrap_or(0);
    assert!(held >= 15, "the slow connections never opened: {report}");
    // Nothing closed in the first second: held until the timeout, not
    // refused.
    for tick in attack.ticks.iter().filter(|t| t.second + 1 < timeout_secs) {
        assert_eq!(tick.closed, 0, "closed before the timeout: {report}");
    }
    assert!(
        attack.ended_on >= timeout_secs - 1 && attack.ended_on <= timeout_secs + 3,
        "{report}"
    );
    assert!(attack.ended_on < length, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowhttptest_slowloris_is_cut_at_the_header_read_timeout() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream.url(),
        "  header_read_timeout: 2s\n  body_idle_timeout: 30s\n",
        "30s",
    ));
    // A header line every second: active, but never done.
    let attack = attack(&sluice, "-H", 1, 12).await;
    check_cut(&attack, 2, 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowhttptest_slow_body_is_cut_at_the_body_idle_timeout() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream.url(),
        "  header_read_timeout: 30s\n  body_idle_timeout: 2s\n",
        "30s",
    ));
    // A piece of body every 4 s, longer than the body idle timeout.
    let attack = attack(&sluice, "-B", 4, 12).await;
    check_cut(&attack, 2, 12);
}

/// An HTTP/2 connection to sluice whose streams start with `window`
/// bytes of flow-control window, never raised by anything but `release`;
/// the task drives the connection and ends when sluice closes it.
pub(crate) async fn h2_connect(
    sluice: &Sidecar,
    window: u32,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    tokio::task::JoinHandle<()>,
) {
    let tcp = TcpStream::connect(sluice.addr()).await.expect("connect");
    let (client, connection) = h2::client::Builder::new()
        .initial_window_size(window)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .expect("HTTP/2 handshake");
    let driven = tokio::spawn(async move {
        let _ = connection.await;
    });
    (client, driven)
}

/// Sends `GET path` on `client` and waits for the response head.
pub(crate) async fn h2_get(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    path: &str,
) -> http::Response<h2::RecvStream> {
    let request = http::Request::get(format!("http://app.test{path}"))
        .body(())
        .expect("request");
    let mut ready = client.clone().ready().await.expect("ready to send");
    let (response, _) = ready.send_request(request, true).expect("send");
    *client = ready;
    tokio::time::timeout(REQUEST_DEADLINE, response)
        .await
        .expect("a response head in time")
        .expect("a response head")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_granted_no_window_is_reset_at_the_send_timeout() {
    const LEN: u64 = 1 << 30;
    let upstream = Scripted::start(Answer::Large(LEN)).await;
    let sluice = Sidecar::start(&config(&upstream.url(), "  send_timeout: 2s\n", "30s"));
    let (mut client, _driven) = h2_connect(&sluice, 0).await;

    let response = h2_get(&mut client, "/large").await;
    assert_eq!(response.status(), 200);
    let stopped = Instant::now();

    // The client never grants the stream a byte: h2 holds the first chunk
    // and stops asking for more; at the send timeout the stream is reset.
    let mut body = response.into_body();
    let ended = tokio::time::timeout(Duration::from_secs(15), body.data())
        .await
        .expect("the stream was reset");
    let after = stopped.elapsed();
    let error = match ended {
        Some(Err(error)) => error,
        other => panic!("the stream ended without a reset: {other:?}"),
    };
    assert_eq!(error.reason(), Some(h2::Reason::CANCEL), "{error}");
    assert!(
        after >= Duration::from_millis(1900) && after < Duration::from_secs(8),
        "reset {after:?} after the response head"
    );
    // And the upstream connection behind it was let go.
    support::eventually(Duration::from_secs(10), || async {
        (upstream.broken() == 1).then_some(())
    })
    .await;

    // Only that stream: the connection still serves the next request.
    let next = h2_get(&mut client, "/large").await;
    assert_eq!(next.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_stream_waiting_on_the_upstream_is_not_cut_at_the_send_timeout() {
    // Half the body, then the upstream goes quiet: sluice waits for it,
    // which is no fault of the client's, until `upstream.timeout`.
    let upstream = Scripted::start(Answer::KeepOpen(
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhello".to_vec(),
    ))
    .await;
    let sluice = Sidecar::start(&config(&upstream.url(), "  send_timeout: 1s\n", "4s"));
    let (mut client, _driven) = h2_connect(&sluice, 65_535).await;

    let response = h2_get(&mut client, "/half").await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let first = tokio::time::timeout(REQUEST_DEADLINE, body.data())
        .await
        .expect("the first half in time")
        .expect("data")
        .expect("data");
    assert_eq!(&first[..], b"hello");
    let _ = body.flow_control().release_capacity(first.len());
    let waiting = Instant::now();

    let ended = tokio::time::timeout(Duration::from_secs(15), body.data())
        .await
        .expect("the stream ended");
    assert!(
        matches!(ended, Some(Err(_))),
        "a body cut short must not end cleanly: {ended:?}"
    );
    let after = waiting.elapsed();
    assert!(
        after >= Duration::from_millis(3500),
        "cut {after:?} after the upstream went quiet: that is the send timeout, not the upstream's"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_holding_unsent_bytes_is_closed() {
    // A whole small body, of which the client takes one byte and no more:
    // the response is over for sluice, the rest waits in h2's buffers.
    let mut answer = b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n".to_vec();
    answer.extend(std::iter::repeat_n(b'x', 1000));
    let upstream = Scripted::start(Answer::KeepOpen(answer)).await;
    let sluice = Sidecar::start(&config(
        &upstream.url(),
        "  send_timeout: 1s\n  idle_timeout: 1s\n",
        "30s",
    ));
    let (mut client, driven) = h2_connect(&sluice, 1).await;
    let response = h2_get(&mut client, "/small").await;
    assert_eq!(response.status(), 200);
    let _body = response.into_body();
    drop(client);

    // Idle, then GOAWAY; the stream would hold the close open for ever.
    tokio::time::timeout(Duration::from_secs(15), driven)
        .await
        .expect("sluice closed the connection")
        .expect("the connection task");
}
