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
