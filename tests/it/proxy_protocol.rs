//! The PROXY protocol from a trusted load balancer, through the binary: the
//! client its header carries is the client, for limits, for
//! `X-Forwarded-For` and for `max_connections_per_ip` (the balancer's own
//! connections hold no share); a header from any
//! other peer is never believed; a broken or unlisted one closes the
//! connection before anything reaches the app. And the lockout a proxy
//! causes while nothing is trusted is named in the logs.

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::client::{parse_status, read_head};
use crate::support::ops::{metric, scrape};
use crate::support::{Recorded, Sidecar, Upstream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One request per client an hour; 127.0.0.1 (the test) is the balancer.
fn config(upstream: &str, versions: &str, trusted: &str, server_extra: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  proxy_protocol: {versions}
{server_extra}
upstream:
  url: {upstream}
identity:
  trusted_proxies: {trusted}
policies:
  one: {{ algorithm: fixed-window, limit: 1, window: 1h }}
routes: []
default: {{ policy: one, subject: client_ip }}
"
    )
}

fn v1(client: &str, port: u16) -> Vec<u8> {
    format!("PROXY TCP4 {client} 10.0.0.5 {port} 8080\r\n").into_bytes()
}

/// A version 2 PROXY command for an IPv4 client, with one TLV after the
/// addresses (as AWS NLB sends).
fn v2(client: [u8; 4], port: u16) -> Vec<u8> {
    let mut body = client.to_vec();
    body.extend_from_slice(&[10, 0, 0, 5]);
    body.extend_from_slice(&port.to_be_bytes());
    body.extend_from_slice(&8080u16.to_be_bytes());
    body.extend_from_slice(&[0xEA, 0x00, 0x03, 0x01, b'v', b'p']);
    v2_raw(0x21, 0x11, &body)
}

fn v2_raw(version_command: u8, family: u8, body: &[u8]) -> Vec<u8> {
    let mut bytes = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    bytes.push(version_command);
    bytes.push(family);
    bytes.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    bytes.extend_from_slice(body);
    bytes
}

const GET: &[u8] = b"GET /x HTTP/1.1\r\nHost: app\r\n\r\n";

/// Writes `opening` and a GET on a new connection; the status, or `None`
/// when sluice closed the connection without answering.
async fn exchange(addr: SocketAddr, opening: &[u8]) -> Option<u16> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut bytes = opening.to_vec();
    bytes.extend_from_slice(GET);
    stream.write_all(&bytes).await.expect("write");
    answer(&mut stream).await
}

async fn answer(stream: &mut TcpStream) -> Option<u16> {
    let mut first = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.peek(&mut first))
        .await
        .expect("an answer or a close in time");
    match read {
        Ok(0) | Err(_) => None,
        Ok(_) => Some(parse_status(&read_head(stream).await.0)),
    }
}

/// The client `X-Forwarded-For` names last, as the app saw it.
fn forwarded_for(seen: &Recorded) -> String {
    let value = seen.header("x-forwarded-for").expect("X-Forwarded-For");
    value.rsplit(',').next().unwrap().trim().to_owned()
}

async fn rejected(sluice: &Sidecar, reason: &str) -> f64 {
    let text = scrape(sluice.admin_addr().unwrap()).await;
    metric(
        &text,
        "sluice_proxy_protocol_rejected_total",
        &[("reason", reason)],
    )
    .unwrap_or_else(|| panic!("no {reason} count:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_a_trusted_balancer_names_is_the_client() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream.url(), "[v1, v2]", "[127.0.0.1]", ""));
    let addr = sluice.addr();

    assert_eq!(exchange(addr, &v1("203.0.113.7", 51000)).await, Some(200));
    assert_eq!(forwarded_for(&upstream.last().unwrap()), "203.0.113.7");
    // The same client again, by the other version: its limit is spent.
    assert_eq!(
        exchange(addr, &v2([203, 0, 113, 7], 51001)).await,
        Some(429)
    );
    // Another client behind the same balancer has a limit of its own.
    assert_eq!(
        exchange(addr, &v2([198, 51, 100, 9], 51002)).await,
        Some(200)
    );
    assert_eq!(forwarded_for(&upstream.last().unwrap()), "198.51.100.9");
    // IPv6 in version 1.
    let six = b"PROXY TCP6 2001:db8::7 2001:db8::1 443 8080\r\n";
    assert_eq!(exchange(addr, six).await, Some(200));
    assert_eq!(forwarded_for(&upstream.last().unwrap()), "2001:db8::7");

    // LOCAL (a health check) and UNKNOWN carry no client: the balancer's
    // own address stands, and it is one client of its own.
    assert_eq!(exchange(addr, &v2_raw(0x20, 0x00, &[])).await, Some(200));
    assert_eq!(forwarded_for(&upstream.last().unwrap()), "127.0.0.1");
    assert_eq!(exchange(addr, b"PROXY UNKNOWN\r\n").await, Some(429));
    // A trusted peer may also speak plain HTTP (an ingress controller
    // beside the balancer): it is the peer, as before.
    assert_eq!(exchange(addr, b"").await, Some(429));
    assert_eq!(upstream.count(), 4);

    let text = scrape(sluice.admin_addr().unwrap()).await;
    let headers = |v| {
        metric(
            &text,
            "sluice_proxy_protocol_headers_total",
            &[("version", v)],
        )
    };
    assert_eq!(headers("v1"), Some(3.0), "{text}");
    assert_eq!(headers("v2"), Some(3.0), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_from_an_untrusted_peer_is_never_believed() {
    let upstream = Upstream::start().await;
    // 127.0.0.1 is not the balancer here.
    let sluice = Sidecar::start(&config(&upstream.url(), "[v1, v2]", "[10.0.0.0/8]", ""));
    let addr = sluice.addr();

    // Not read as a header: as HTTP it is no request at all.
    assert_eq!(exchange(addr, &v1("203.0.113.7", 51000)).await, Some(400));
    let status = exchange(addr, &v2([203, 0, 113, 7], 51000)).await;
    assert!(matches!(status, Some(400) | None), "{status:?}");
    assert_eq!(upstream.count(), 0);
    // The peer's own limit was never touched by a spoofed one.
    assert_eq!(exchange(addr, b"").await, Some(200));
    assert_eq!(forwarded_for(&upstream.last().unwrap()), "127.0.0.1");
    assert_eq!(exchange(addr, b"").await, Some(429));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_or_unlisted_header_closes_the_connection_before_the_app() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream.url(),
        "[v2]",
        "[127.0.0.1]",
        "  header_read_timeout: 1s",
    ));
    let addr = sluice.addr();

    // Version 1 is not listed.
    assert_eq!(exchange(addr, &v1("203.0.113.7", 51000)).await, None);
    assert_eq!(rejected(&sluice, "version").await, 1.0);
    // A datagram family, a truncated address block.
    assert_eq!(exchange(addr, &v2_raw(0x21, 0x12, &[1; 12])).await, None);
    assert_eq!(exchange(addr, &v2_raw(0x21, 0x11, &[1; 4])).await, None);
    assert_eq!(rejected(&sluice, "malformed").await, 2.0);
    // A length beyond the bound, refused from the fixed part alone.
    let mut long = v2_raw(0x21, 0x11, &[]);
    long[14..16].copy_from_slice(&60_000u16.to_be_bytes());
    assert_eq!(exchange(addr, &long).await, None);
    assert_eq!(rejected(&sluice, "too_long").await, 1.0);
    // Half a signature, then nothing: closed at the head deadline.
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled.write_all(b"\r\n\r\n\0\r").await.unwrap();
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut byte)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    assert_eq!(rejected(&sluice, "timeout").await, 1.0);
    assert_eq!(upstream.count(), 0);

    // The listener serves on.
    assert_eq!(
        exchange(addr, &v2([203, 0, 113, 7], 51000)).await,
        Some(200)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_per_ip_count_the_client_the_header_names() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream.url(),
        "[v1]",
        "[127.0.0.1]",
        "  max_connections_per_ip: 1",
    ));
    let addr = sluice.addr();

    // Two clients through one balancer, each holding a connection (one
    // after the other: a connection still sending its header holds the
    // balancer's own place until it is read).
    let keep_alive = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: app\r\n\r\n").into_bytes();
    let mut first = TcpStream::connect(addr).await.unwrap();
    first.write_all(&v1("203.0.113.7", 51000)).await.unwrap();
    first.write_all(&keep_alive("/b")).await.unwrap();
    assert_eq!(answer(&mut first).await, Some(200));
    let mut second = TcpStream::connect(addr).await.unwrap();
    second.write_all(&v1("198.51.100.9", 51001)).await.unwrap();
    second.write_all(&keep_alive("/a")).await.unwrap();
    assert_eq!(answer(&mut second).await, Some(200));
    // The first client's second connection is one too many.
    assert_eq!(exchange(addr, &v1("203.0.113.7", 51002)).await, None);
    let text = scrape(sluice.admin_addr().unwrap()).await;
    assert_eq!(
        metric(
            &text,
            "sluice_connections_refused_total",
            &[("limit", "max_connections_per_ip")]
        ),
        Some(1.0),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_ignored_for_want_of_trusted_proxies_is_named_in_a_warning() {
    let upstream = Upstream::start().await;
    let yaml = config(&upstream.url(), "[]", "[]", "").replace(
        "policies:\n  one: { algorithm: fixed-window, limit: 1, window: 1h }",
        "policies:\n  one: { algorithm: fixed-window, limit: 100, window: 1h }",
    );
    let sluice = Sidecar::start(&yaml);
    let addr = sluice.addr();
    let forwarded = b"GET /x HTTP/1.1\r\nHost: app\r\nX-Forwarded-For: 203.0.113.7\r\n\r\n";
    for _ in 0..3 {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(forwarded).await.unwrap();
        assert_eq!(answer(&mut stream).await, Some(200));
    }
    // Without the header: nothing to warn about.
    assert_eq!(exchange(addr, b"").await, Some(200));

    let text = scrape(sluice.admin_addr().unwrap()).await;
    assert_eq!(
        metric(&text, "sluice_forwarded_for_ignored_total", &[]),
        Some(3.0),
        "{text}"
    );
    let warnings: Vec<serde_json::Value> = sluice
        .logs()
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["level"] == "WARN" && line["peer"] == "127.0.0.1")
        .collect();
    assert_eq!(
        warnings.len(),
        1,
        "one WARN, not one a request: {warnings:#?}"
    );
    let message = warnings[0]["message"].as_str().unwrap();
    assert!(
        message.contains("identity.trusted_proxies is empty"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_tls_the_header_comes_before_the_handshake() {
    let upstream = Upstream::start().await;
    let certified = crate::support::tls::self_signed(&[]);
    let tls = format!(
        "  tls: {{ cert: {}, key: {} }}",
        certified.cert.path().display(),
        certified.key.path().display()
    );
    let sluice = Sidecar::start(&config(&upstream.url(), "[v2]", "[127.0.0.1]", &tls));

    let mut tcp = TcpStream::connect(sluice.addr()).await.unwrap();
    tcp.write_all(&v2([203, 0, 113, 7], 51000)).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = certified.connector.connect(name, tcp).await.unwrap();
    tls.write_all(GET).await.unwrap();
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    while !answer.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tls.read(&mut chunk).await.unwrap();
        assert!(n > 0, "{:?}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(parse_status(&String::from_utf8_lossy(&answer)), 200);
    assert_eq!(forwarded_for(&upstream.last().unwrap()), "203.0.113.7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_sent_a_byte_at_a_time_is_read_whole() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream.url(), "[v1, v2]", "[127.0.0.1]", ""));
    for opening in [v1("203.0.113.7", 51000), v2([198, 51, 100, 9], 51001)] {
        let mut stream = TcpStream::connect(sluice.addr()).await.unwrap();
        stream.set_nodelay(true).unwrap();
        for byte in &opening {
            stream.write_all(&[*byte]).await.unwrap();
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        stream.write_all(GET).await.unwrap();
        assert_eq!(answer(&mut stream).await, Some(200));
    }
    let seen: Vec<String> = upstream.requests().iter().map(forwarded_for).collect();
    assert_eq!(seen, ["203.0.113.7", "198.51.100.9"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_share_is_the_named_client_s_and_the_balancer_has_none() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream.url(),
        "[v1, v2]",
        "[127.0.0.1]",
        "  max_connections_per_ip: 2",
    ));
    let addr = sluice.addr();
    let keep_alive = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: app\r\n\r\n").into_bytes();
    let mut held = Vec::new();
    // Through the balancer, each named client holds its share of two and
    // no more: seven connections from one balancer address, six held.
    for (n, client) in ["203.0.113.7", "198.51.100.9", "192.0.2.33"]
        .iter()
        .enumerate()
    {
        for k in 0..2u16 {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(&v1(client, 51000 + k)).await.unwrap();
            stream
                .write_all(&keep_alive(&format!("/{n}/{k}")))
                .await
                .unwrap();
            let status = answer(&mut stream).await;
            // Only the first request of each client is within its limit.
            assert_eq!(
                status,
                Some(if k == 0 { 200 } else { 429 }),
                "{client} #{k}"
            );
            held.push(stream);
        }
    }
    assert_eq!(exchange(addr, &v1("198.51.100.9", 51009)).await, None);
    // The balancer's own connections (a LOCAL health check, or plain HTTP
    // with the clients in X-Forwarded-For) carry no client of their own:
    // no share holds them.
    for _ in 0..3 {
        let mut local = TcpStream::connect(addr).await.unwrap();
        local.write_all(&v2_raw(0x20, 0x00, &[])).await.unwrap();
        local.write_all(&keep_alive("/health")).await.unwrap();
        assert!(answer(&mut local).await.is_some(), "a LOCAL connection");
        held.push(local);
        let mut plain = TcpStream::connect(addr).await.unwrap();
        plain.write_all(&keep_alive("/plain")).await.unwrap();
        assert!(answer(&mut plain).await.is_some(), "a plain connection");
        held.push(plain);
    }
    let text = scrape(sluice.admin_addr().unwrap()).await;
    assert_eq!(
        metric(
            &text,
            "sluice_connections_refused_total",
            &[("limit", "max_connections_per_ip")]
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(held.len(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_peer_that_says_nothing_is_bounded_to_a_quarter_of_the_pool() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream.url(),
        "[v1]",
        "[127.0.0.1]",
        "  max_connections: 8\n  max_connections_per_ip: 1",
    ));
    let addr = sluice.addr();
    // Two silent connections from the balancer hold a quarter of the pool
    // while their headers are awaited; a third is closed at once.
    let _first = TcpStream::connect(addr).await.unwrap();
    let second = TcpStream::connect(addr).await.unwrap();
    assert_eq!(exchange(addr, &v1("203.0.113.7", 51000)).await, None);
    // One gone: a header can be read again, and its client counted.
    drop(second);
    let served = crate::support::eventually(Duration::from_secs(5), || async {
        exchange(addr, &v1("203.0.113.8", 51001)).await
    })
    .await;
    assert_eq!(served, 200);
    assert_eq!(forwarded_for(&upstream.last().unwrap()), "203.0.113.8");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_cannot_stop_trusting_the_balancer_the_listener_reads() {
    let upstream = Upstream::start().await;
    let yaml = config(&upstream.url(), "[v2]", "[127.0.0.1]", "");
    let sluice = Sidecar::start(&yaml);
    let untrusting = yaml
        .replace("  proxy_protocol: [v2]\n", "")
        .replace("trusted_proxies: [127.0.0.1]", "trusted_proxies: []");
    std::fs::write(sluice.config_path(), untrusting).unwrap();
    sluice.signal("HUP");
    let admin = sluice.admin_addr().unwrap();
    crate::support::eventually(Duration::from_secs(5), || async {
        let text = scrape(admin).await;
        let failed = metric(
            &text,
            "sluice_config_reloads_total",
            &[("result", "failure")],
        );
        (failed >= Some(1.0)).then_some(())
    })
    .await;
    // The balancer's headers are still read.
    assert_eq!(
        exchange(sluice.addr(), &v2([203, 0, 113, 7], 51000)).await,
        Some(200)
    );
    assert_eq!(forwarded_for(&upstream.last().unwrap()), "203.0.113.7");
}
