//! Requests a hostile or broken client sends, through the built binary:
//! invalid `Host`s and request-targets are refused and never forwarded, a
//! refused framing closes the connection (nothing pipelined behind it is
//! served), a broken request body is the client's 400 and never the app's
//! 502, and HTTP/2 cookie fields reach an HTTP/1.1 app as one line.

use crate::support;
use std::time::Duration;

use crate::support::client::{build, http2_client, send};
use crate::support::{raw_exchange, Sidecar, Upstream};
use bytes::Bytes;
use http::{Method, Version};
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

/// A `Transfer-Encoding` that leaves where the body ends unknown (its
/// last coding not `chunked`, or any on HTTP/1.0) is answered 400 with a
/// problem body, as sluice's other refusals are, and closes: never a bare
/// 400, never forwarded, nothing pipelined behind it served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_cannot_be_framed_gets_a_400_problem_and_closes() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    let pipelined = "GET /after HTTP/1.1\r\nHost: app.test\r\n\r\n";
    for (first, bad) in [
        // The connection's first head, and one behind a served request.
        (
            "",
            "POST /a HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: gzip\r\n\r\nxyz",
        ),
        (
            "",
            "POST /a HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
        ),
        (
            "",
            "POST /a HTTP/1.0\r\nHost: app.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        ),
        (
            "GET /before HTTP/1.1\r\nHost: app.test\r\n\r\n",
            "POST /a HTTP/1.1\r\nHost: app.test\r\nTransfer-Encoding: gzip\r\n\r\n",
        ),
    ] {
        let served_before = upstream.count();
        let mut stream = TcpStream::connect(sluice.addr()).await.expect("connect");
        stream
            .write_all(format!("{first}{bad}{pipelined}").as_bytes())
            .await
            .expect("write");
        let responses = until_closed(&mut stream).await;
        let expected: &[u16] = if first.is_empty() {
            &[400]
        } else {
            &[200, 400]
        };
        assert_eq!(statuses(&responses), expected, "{bad:?}: {responses}");
        let refusal = responses.rsplit("HTTP/1.1 ").next().unwrap_or_default();
        assert!(
            refusal.contains("content-type: application/problem+json"),
            "{bad:?}: {refusal}"
        );
        assert!(
            refusal.contains(r#""status":400"#)
                && refusal.contains("where the body ends is unknown"),
            "{bad:?}: {refusal}"
        );
        assert_eq!(
            upstream.count() - served_before,
            usize::from(!first.is_empty()),
            "{bad:?}: only the request before it reached the app"
        );
    }
    assert!(upstream
        .requests()
        .iter()
        .all(|r| r.path != "/a" && r.path != "/after"));
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

fn admin_config(upstream: &Upstream, header_read_timeout: &str) -> String {
    config(upstream).replace(
        "  listen: 127.0.0.1:0\n",
        &format!("  listen: 127.0.0.1:0\n  admin: 127.0.0.1:0\n  header_read_timeout: {header_read_timeout}\n"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_to_the_admin_port_is_closed_at_the_header_read_timeout() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&admin_config(&upstream, "1s"));
    let admin = sluice.admin_addr().expect("admin address");
    let mut silent = TcpStream::connect(admin).await.expect("connect");
    let opened = std::time::Instant::now();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), silent.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "still open after 5 s: {read:?}"
    );
    let after = opened.elapsed();
    assert!(
        after >= Duration::from_millis(900),
        "closed too early: {after:?}"
    );
}

/// CPU seconds the process has used (utime + stime).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat")
        .1
        .split_whitespace()
        .collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_file_descriptors_neither_listener_spins_and_service_resumes() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&admin_config(&upstream, "30s"));
    let admin = sluice.admin_addr().expect("admin address");
    let limited = std::process::Command::new("prlimit")
        .arg("--pid")
        .arg(sluice.pid().to_string())
        .arg("--nofile=64:64")
        .status()
        .expect("run prlimit");
    assert!(limited.success());

    // Idle connections on both ports until sluice has no descriptor left.
    let mut held = Vec::new();
    for i in 0..120 {
        let addr = if i % 2 == 0 { sluice.addr() } else { admin };
        if let Ok(stream) = TcpStream::connect(addr).await {
            held.push(stream);
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cpu_before = cpu_seconds(sluice.pid());
    let lines_before = sluice
        .logs()
        .iter()
        .filter(|l| l.contains("accept failed"))
        .count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = cpu_seconds(sluice.pid()) - cpu_before;
    let lines = sluice
        .logs()
        .iter()
        .filter(|l| l.contains("accept failed"))
        .count()
        - lines_before;
    assert!(
        lines_before > 0,
        "descriptors never ran out (no accept failure logged)"
    );
    // Two listeners, at most one line a second each.
    assert!(lines <= 6, "{lines} accept-failure lines in 2 s");
    assert!(
        cpu < 0.5,
        "{cpu:.2} s of CPU in 2 s while out of descriptors"
    );

    drop(held);
    support::eventually(Duration::from_secs(5), || async {
        let healthy = support::ops::try_get(admin, "/healthz").await.ok()?;
        let served = support::ops::try_get(sluice.addr(), "/x").await.ok()?;
        (healthy.0 == http::StatusCode::OK && served.0 == http::StatusCode::OK).then_some(())
    })
    .await;
}

/// An HTTP/2 connection (prior knowledge) from a raw hyper client, and the
/// task that ends when the server closes it.
async fn h2_connection(
    addr: std::net::SocketAddr,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("h2 handshake");
    let closed = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, closed)
}

fn h2_get(addr: std::net::SocketAddr, path: &str) -> http::Request<http_body_util::Empty<Bytes>> {
    http::Request::builder()
        .uri(format!("http://{addr}{path}"))
        .body(http_body_util::Empty::new())
        .expect("request")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_http2_connection_is_closed_after_the_idle_timeout_and_a_long_request_is_not() {
    let upstream = Upstream::start().await;
    let yaml = config(&upstream).replace(
        "  listen: 127.0.0.1:0\n",
        "  listen: 127.0.0.1:0\n  idle_timeout: 1s\n  header_read_timeout: 30s\n",
    );
    let sluice = Sidecar::start(&yaml);

    let (mut sender, closed) = h2_connection(sluice.addr()).await;
    let response = sender
        .send_request(h2_get(sluice.addr(), "/x"))
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    drop(response);
    let idle_from = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!closed.is_finished(), "closed before the idle timeout");
    tokio::time::timeout(Duration::from_secs(3), closed)
        .await
        .expect("an idle HTTP/2 connection stayed open")
        .expect("connection task");
    let after = idle_from.elapsed();
    assert!(
        after >= Duration::from_millis(900),
        "closed after {after:?}"
    );

    // A request that takes longer than the idle timeout is not idle.
    upstream.set_delay(Duration::from_millis(2500));
    let (mut sender, closed) = h2_connection(sluice.addr()).await;
    let response = sender
        .send_request(h2_get(sluice.addr(), "/slow"))
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    drop(response);
    tokio::time::timeout(Duration::from_secs(3), closed)
        .await
        .expect("closed in the end")
        .expect("connection task");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_connections_new_ones_are_closed_and_open_ones_are_served() {
    let upstream = Upstream::start().await;
    let yaml = admin_config(&upstream, "30s").replace(
        "  admin: 127.0.0.1:0\n",
        "  admin: 127.0.0.1:0\n  max_connections: 3\n  max_connections_per_ip: 3\n",
    );
    let sluice = Sidecar::start(&yaml);
    let admin = sluice.admin_addr().expect("admin address");
    let mut open = Vec::new();
    for _ in 0..3 {
        open.push(TcpStream::connect(sluice.addr()).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The fourth is closed at once, before any byte is answered.
    let mut extra = TcpStream::connect(sluice.addr()).await.expect("connect");
    let _ = extra
        .write_all(b"GET /x HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await;
    let answer = until_closed(&mut extra).await;
    assert!(answer.is_empty(), "served beyond max_connections: {answer}");
    // The admin port does not count, and the open connections are served.
    let (status, _, _) = support::get(admin, "/healthz", &[]).await;
    assert_eq!(status, 200);
    open[0]
        .write_all(b"GET /x HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let served = until_closed(&mut open[0]).await;
    assert_eq!(statuses(&served), [200], "{served}");
    let text = support::ops::scrape(admin).await;
    let refused = support::ops::metric(
        &text,
        "sluice_connections_refused_total",
        &[("limit", "max_connections")],
    )
    .unwrap_or(0.0);
    assert!(refused >= 1.0, "refused connections not counted:\n{text}");
}

/// A connection from `ip` (a loopback address) to `to`.
async fn connect_from(ip: &str, to: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{ip}:0").parse().expect("an address"))
        .expect("bind a loopback address");
    socket.connect(to).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_cannot_take_every_connection() {
    let upstream = Upstream::start().await;
    let yaml = admin_config(&upstream, "30s").replace(
        "  admin: 127.0.0.1:0\n",
        "  admin: 127.0.0.1:0\n  max_connections: 20\n  max_connections_per_ip: 3\n",
    );
    let sluice = Sidecar::start(&yaml);
    let admin = sluice.admin_addr().expect("admin address");
    // One client holds three connections open and says nothing.
    let mut hog = Vec::new();
    for _ in 0..3 {
        hog.push(connect_from("127.0.0.2", sluice.addr()).await);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut fourth = connect_from("127.0.0.2", sluice.addr()).await;
    let _ = fourth
        .write_all(b"GET /x HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await;
    let answer = until_closed(&mut fourth).await;
    assert!(
        answer.is_empty(),
        "a fourth connection from one address: {answer}"
    );

    // Everyone else is served.
    for ip in ["127.0.0.3", "127.0.0.4"] {
        let mut other = connect_from(ip, sluice.addr()).await;
        other
            .write_all(b"GET /x HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let served = until_closed(&mut other).await;
        assert_eq!(statuses(&served), [200], "{ip}: {served}");
    }
    // A place given back is the address's again.
    drop(hog.pop());
    let text = support::eventually(Duration::from_secs(5), || async {
        let mut again = connect_from("127.0.0.2", sluice.addr()).await;
        again
            .write_all(b"GET /x HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let served = until_closed(&mut again).await;
        (statuses(&served) == [200]).then_some(served)
    })
    .await;
    assert!(!text.is_empty());

    let text = support::ops::scrape(admin).await;
    let per_ip = |limit: &str| {
        support::ops::metric(
            &text,
            "sluice_connections_refused_total",
            &[("limit", limit)],
        )
    };
    assert!(per_ip("max_connections_per_ip") >= Some(1.0), "{text}");
    assert_eq!(per_ip("max_connections"), Some(0.0), "{text}");
}
