//! Each client address's share of the connection pool, through the
//! binary: a few addresses holding every connection they can cannot
//! refuse anyone else, and a trusted proxy's connections (which carry
//! many clients) are not capped by the share at all. IPv6 clients come
//! from a local route of the documentation prefix on `lo` (added by the
//! test, root needed), counted per /64 and per /56.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::client::{content_length, parse_status, read_head};
use crate::support::ops::{metric, scrape};
use crate::support::{eventually, Sidecar, Upstream};

/// The share is left at its default; the connections held say nothing
/// for a minute without being closed for it.
fn config(upstream: &Upstream, server_extra: &str, trusted: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  header_read_timeout: 60s
{server_extra}
upstream:
  url: {}
identity:
  trusted_proxies: {trusted}
policies:
  p: {{ algorithm: fixed-window, limit: 100000, window: 1h }}
routes: []
default: {{ policy: p, subject: client_ip }}
",
        upstream.url()
    )
}

/// A connection from `ip` (a loopback address) to `to`.
async fn connect_from(ip: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{ip}:0").parse().expect("an address"))
        .expect("bind a loopback address");
    socket.connect(to).await.expect("connect")
}

/// Sends a kept-alive GET on `stream`: its status, or `None` when sluice
/// closed the connection without answering.
async fn get_on(stream: &mut TcpStream, extra_header: &str) -> Option<u16> {
    let request = format!("GET /x HTTP/1.1\r\nHost: app.test\r\n{extra_header}\r\n");
    if stream.write_all(request.as_bytes()).await.is_err() {
        return None;
    }
    let mut first = [0u8; 1];
    let read = tokio::time::timeout(Duration::from_secs(10), stream.peek(&mut first))
        .await
        .expect("an answer or a close in time");
    match read {
        Ok(0) | Err(_) => None,
        Ok(_) => {
            // The body read too, so the next answer starts clean.
            let (head, mut body) = read_head(stream).await;
            let len = content_length(&head).expect("a Content-Length");
            let mut chunk = [0u8; 1024];
            while body.len() < len {
                let n = stream.read(&mut chunk).await.expect("read the body");
                assert!(n > 0, "closed inside a body");
                body.extend_from_slice(&chunk[..n]);
            }
            Some(parse_status(&head))
        }
    }
}

async fn refused(sluice: &Sidecar, limit: &str) -> f64 {
    let text = scrape(sluice.admin_addr().expect("admin")).await;
    metric(
        &text,
        "sluice_connections_refused_total",
        &[("limit", limit)],
    )
    .unwrap_or_else(|| panic!("no {limit} count:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_addresses_holding_all_they_can_cannot_refuse_a_fifth() {
    let upstream = Upstream::start().await;
    // A pool of 400: an address's default share is 50 (an eighth).
    let sluice = Sidecar::start(&config(&upstream, "  max_connections: 400", "[]"));
    let addr = sluice.addr();
    const HOGS: [&str; 4] = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"];
    const TRIES: usize = 150;
    // Each of four addresses opens 150 connections and says nothing.
    let mut held = Vec::new();
    for ip in HOGS {
        for _ in 0..TRIES {
            held.push((ip, connect_from(ip, addr).await));
        }
    }
    // Every one accepted: each address kept its share of 50 and no more
    // (each was refused at least 100 of its 150, so 400 in all means
    // exactly 100 each).
    let want = (HOGS.len() * (TRIES - 50)) as f64;
    eventually(Duration::from_secs(10), || async {
        (refused(&sluice, "max_connections_per_ip").await == want).then_some(())
    })
    .await;
    // A fifth address is served, and the pool never filled.
    let mut fifth = connect_from("127.0.0.6", addr).await;
    assert_eq!(get_on(&mut fifth, "").await, Some(200));
    assert_eq!(refused(&sluice, "max_connections").await, 0.0);
    // The hogs' places are theirs: one of them is served on its own.
    let (_, hog) = held
        .iter_mut()
        .find(|(ip, _)| *ip == "127.0.0.2")
        .expect("a hog");
    assert_eq!(get_on(hog, "").await, Some(200));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxy_opens_more_connections_than_an_address_s_share() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream,
        "  max_connections: 40\n  max_connections_per_ip: 2",
        "[127.0.0.2]",
    ));
    let addr = sluice.addr();
    // An ingress (trusted, passing clients in X-Forwarded-For) holds ten
    // connections, each serving a client of its own.
    let mut ingress = Vec::new();
    for _ in 0..10 {
        ingress.push(connect_from("127.0.0.2", addr).await);
    }
    for (n, stream) in ingress.iter_mut().enumerate() {
        let forwarded = format!("X-Forwarded-For: 203.0.113.{n}\r\n");
        assert_eq!(
            get_on(stream, &forwarded).await,
            Some(200),
            "the ingress's connection {n}"
        );
    }
    // An address that is not trusted keeps its share of two.
    let mut direct = Vec::new();
    for _ in 0..3 {
        direct.push(connect_from("127.0.0.3", addr).await);
    }
    assert_eq!(get_on(&mut direct[0], "").await, Some(200));
    assert_eq!(get_on(&mut direct[1], "").await, Some(200));
    assert_eq!(get_on(&mut direct[2], "").await, None);
    assert_eq!(refused(&sluice, "max_connections_per_ip").await, 1.0);
    // The ingress's connections are all still served.
    for stream in &mut ingress {
        assert_eq!(get_on(stream, "").await, Some(200));
    }
}

/// `local 2001:db8::/32` routed to `lo` while it lives: every address of
/// the documentation prefix is this machine's, so a test can connect from
/// any of them (bound with IPV6_FREEBIND). Removed on drop.
struct DocumentationPrefix;

impl DocumentationPrefix {
    const ROUTE: [&'static str; 4] = ["local", "2001:db8::/32", "dev", "lo"];

    fn add() -> DocumentationPrefix {
        let status = std::process::Command::new("ip")
            .args(["-6", "route", "replace"])
            .args(Self::ROUTE)
            .status()
            .expect("run ip");
        assert!(
            status.success(),
            "ip -6 route replace local 2001:db8::/32 dev lo (root needed)"
        );
        DocumentationPrefix
    }
}

impl Drop for DocumentationPrefix {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["-6", "route", "del"])
            .args(Self::ROUTE)
            .status();
    }
}

/// A connection from `ip`, an address of [`DocumentationPrefix`], to `to`.
async fn connect_from_v6(ip: &str, to: SocketAddr) -> TcpStream {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV6, socket2::Type::STREAM, None).expect("socket");
    socket.set_freebind_v6(true).expect("IPV6_FREEBIND");
    socket.set_nonblocking(true).expect("non-blocking");
    let from: SocketAddr = format!("[{ip}]:0").parse().expect("an address");
    socket.bind(&from.into()).expect("bind");
    let socket = TcpSocket::from_std_stream(socket.into());
    socket.connect(to).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slash_64s_of_one_slash_56_cannot_refuse_another_slash_56() {
    let _prefix = DocumentationPrefix::add();
    let upstream = Upstream::start().await;
    // A pool of 400: a /64's share is 50 (an eighth), a /56's four shares.
    let yaml = config(&upstream, "  max_connections: 400", "[]")
        .replace("listen: 127.0.0.1:0", "listen: \"[::1]:0\"");
    let sluice = Sidecar::start(&yaml);
    let addr = sluice.addr();
    // Eight /64s of one /56 (a home customer has 256), 60 connections each:
    // without the /56's cap they would fill the pool.
    let mut held = Vec::new();
    for net in 0..8 {
        for host in 0..60 {
            let ip = format!("2001:db8:0:1{net:02x}::{:x}", host + 1);
            held.push(connect_from_v6(&ip, addr).await);
        }
    }
    // The first four /64s kept 50 each (10 refused each for the /64), and
    // then the /56 was full: 200 of it kept, 240 refused for the /56.
    eventually(Duration::from_secs(10), || async {
        let per_64 = refused(&sluice, "max_connections_per_ip").await;
        let per_56 = refused(&sluice, "max_connections_per_ipv6_56").await;
        (per_64 == 40.0 && per_56 == 240.0).then_some(())
    })
    .await;
    // Another /56 is served, and the pool never filled.
    let mut other = connect_from_v6("2001:db8:0:200::1", addr).await;
    assert_eq!(get_on(&mut other, "").await, Some(200));
    assert_eq!(refused(&sluice, "max_connections").await, 0.0);
}
