//! No client can make sluice run out of memory with request heads. Under a
//! real cgroup limit of 128 MiB (the chart's default), with every other
//! setting at its default (but the connections one address may open: the
//! floods come from one), floods of HTTP/2 header lists held open on many
//! streams and of HTTP/1 heads sent all but their last line leave sluice
//! alive; a client at another address is still answered and counted
//! right throughout; past the budget the flood's heads are refused (and
//! counted); and once the flood has gone, RSS comes back to within a few
//! MB of where it was.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::support::cgroup::{launcher, rss_bytes, MemoryCgroup};
use crate::support::{self, Sidecar, Upstream};

/// The chart's default memory limit.
const LIMIT_BYTES: u64 = 128 << 20;

/// RSS after a flood may stay this far above idle (allocator slack).
const SLACK_BYTES: u64 = 8 << 20;

/// The flood's client address; the regular client is at another.
const FLOODER: &str = "127.0.0.1";
const REGULAR: &str = "127.0.0.2";

fn config(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  # The HTTP/1 flood's 2,000 connections from one address all reach
  # the head budget rather than the connection share.
  max_connections_per_ip: 2500
upstream:
  url: {}
  timeout: 60s
store:
  kind: memory
policies:
  p: {{ algorithm: fixed-window, limit: 100, window: 1h }}
routes:
  - {{ name: api, match: {{ path: /api }}, subject: client_ip, policy: p }}
  - {{ name: rest, match: {{ path_prefix: / }}, policy: none }}
",
        upstream.url()
    )
}

/// sluice in a fresh 128 MiB cgroup, and its RSS once it has served a
/// little.
async fn start(upstream: &Upstream) -> (MemoryCgroup, Sidecar, u64) {
    let cgroup = MemoryCgroup::new(LIMIT_BYTES);
    let launch = launcher(&cgroup);
    let launch: Vec<&str> = launch.iter().map(String::as_str).collect();
    let sluice = Sidecar::start_via(&config(upstream), &[], &launch);
    for _ in 0..20 {
        let _ = support::get(sluice.addr(), "/warm", &[]).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = rss_bytes(sluice.pid());
    assert!(idle > 0, "sluice runs");
    (cgroup, sluice, idle)
}

/// `GET /api` over HTTP/1 from the regular client's address: the status
/// and the remaining count it was told.
async fn regular_get(addr: SocketAddr) -> (u16, Option<u64>, String) {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{REGULAR}:0").parse().expect("address"))
        .expect("bind 127.0.0.2");
    let mut stream = socket.connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /api HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    // Generous: the debug build decodes the flood's lists on the same two
    // cores; what is asserted is that the client is answered, and right.
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut answer))
        .await
        .expect("an answer in time")
        .expect("read");
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or_default();
    let remaining = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("ratelimit: ")
                .or(l.strip_prefix("RateLimit: "))
        })
        .and_then(support::parse_ratelimit)
        .and_then(|item| item.param("r"));
    (status, remaining, text.into_owned())
}

/// Polls the regular client every 200 ms until `done`; every answer must
/// be a 200 with the count one lower than the last.
async fn regular_client(addr: SocketAddr, first_remaining: u64, until: Instant) -> u64 {
    let mut expected = first_remaining;
    while Instant::now() < until {
        let (status, remaining, text) = regular_get(addr).await;
        assert_eq!(
            status, 200,
            "the regular client is answered during the flood: {text:?}"
        );
        assert_eq!(remaining, Some(expected), "and counted right");
        expected -= 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    expected
}

/// Waits until sluice's RSS is within [`SLACK_BYTES`] of `idle`, for at
/// most 15 s; the last reading.
async fn settles(sluice: &Sidecar, idle: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let rss = rss_bytes(sluice.pid());
        if rss <= idle + SLACK_BYTES || Instant::now() >= deadline {
            return rss;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Samples sluice's RSS every 100 ms until `until`, failing if it dies;
/// the peak.
async fn watch_until(sluice: &mut Sidecar, until: Instant) -> u64 {
    let mut peak = 0;
    while Instant::now() < until {
        peak = peak.max(rss_bytes(sluice.pid()));
        assert!(
            sluice.wait_exit(Duration::ZERO).is_none(),
            "sluice died during the flood (peak RSS {peak})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    peak
}

/// sluice is alive after the flood, and its peak stayed under the limit.
fn survived(sluice: &mut Sidecar, peak: u64) {
    assert!(
        sluice.wait_exit(Duration::ZERO).is_none(),
        "sluice died (peak RSS {peak})"
    );
    assert!(peak < LIMIT_BYTES, "peak RSS {peak}");
}

async fn refused(sluice: &Sidecar, reason: &str) -> f64 {
    let text = support::ops::scrape(sluice.admin_addr().expect("admin")).await;
    support::ops::metric(
        &text,
        "sluice_head_budget_refused_total",
        &[("reason", reason)],
    )
    .unwrap_or(0.0)
}

/// One HTTP/2 connection that opens streams (up to `streams`) whose header
/// lists are `list_bytes` as RFC 9113 counts them, none of them ended, and
/// keeps them open until `until`. The statuses its streams were answered
/// with, as far as they were.
async fn hold_streams(
    addr: SocketAddr,
    streams: usize,
    list_bytes: usize,
    until: Instant,
) -> Vec<u16> {
    let Ok(tcp) = TcpStream::connect(addr).await else {
        return Vec::new();
    };
    let Ok((client, connection)) = h2::client::Builder::new().handshake::<_, Bytes>(tcp).await
    else {
        return Vec::new();
    };
    let driven = tokio::spawn(async move {
        let _ = connection.await;
    });
    // One field repeated: after its first time the dynamic table sends it
    // as one byte, so a large list costs the client almost nothing to send.
    let value = "v".repeat(1000);
    let fields = list_bytes / ("x-pad".len() + value.len() + 32);
    let mut open = Vec::new();
    let mut client = client;
    for _ in 0..streams {
        let mut request = http::Request::get(format!("http://app.test/slow/{}", open.len()));
        for _ in 0..fields {
            request = request.header("x-pad", &value);
        }
        let request = request.body(()).expect("request");
        let ready = tokio::time::timeout_at(until, client.clone().ready()).await;
        let Ok(Ok(mut ready)) = ready else { break };
        match ready.send_request(request, false) {
            Ok((response, body)) => open.push((response, body)),
            Err(_) => break,
        }
        client = ready;
    }
    let mut bodies = Vec::new();
    let mut responses = JoinSet::new();
    for (response, body) in open {
        bodies.push(body);
        responses.spawn(tokio::time::timeout_at(until, response));
    }
    let mut statuses = Vec::new();
    while let Some(answer) = responses.join_next().await {
        if let Ok(Ok(Ok(response))) = answer {
            statuses.push(response.status().as_u16());
        }
    }
    tokio::time::sleep_until(until).await;
    drop(bodies);
    driven.abort();
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_header_list_flood_leaves_sluice_alive_inside_128_mib() {
    let upstream = Upstream::start().await;
    // The app never answers a request whose body has not ended: every
    // stream the flood opens is held for as long as the client holds it.
    let (cgroup, mut sluice, idle) = start(&upstream).await;
    let addr = sluice.addr();
    let (_, first, _) = regular_get(addr).await;
    let first = first.expect("a count");

    let until = Instant::now() + Duration::from_secs(8);
    let mut flood = JoinSet::new();
    // 80 connections of 128 streams, none ended: half with 60 KB lists
    // (over the default header list bound: h2 refuses those with 431),
    // half with lists just under it.
    for n in 0..80 {
        let list = if n % 2 == 0 { 60_000 } else { 30_000 };
        flood.spawn(hold_streams(addr, 128, list, until));
    }
    let regular = tokio::spawn(regular_client(addr, first - 1, until));
    let peak = watch_until(&mut sluice, until).await;
    let mut answered = std::collections::BTreeMap::<u16, usize>::new();
    while let Some(statuses) = flood.join_next().await {
        for status in statuses.expect("flood task") {
            *answered.entry(status).or_default() += 1;
        }
    }
    regular.await.expect("the regular client");
    survived(&mut sluice, peak);
    let reasons = [
        refused(&sluice, "connection").await,
        refused(&sluice, "client").await,
        refused(&sluice, "total").await,
    ];
    assert!(
        reasons[0] + reasons[1] > 0.0,
        "the flood's streams went past their connection's or their address's budget: \
         {reasons:?} (connection, client, total); answered {answered:?}"
    );
    assert!(
        answered.get(&503).copied().unwrap_or(0) > 0,
        "refused streams are answered 503: {answered:?}"
    );

    let settled = settles(&sluice, idle).await;
    assert!(
        settled <= idle + SLACK_BYTES,
        "RSS {settled} 15 s after the flood, idle {idle} (peak {peak})"
    );
    assert_eq!(cgroup.limit_hits(), 0, "the cgroup's limit was reached");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_partial_head_flood_leaves_sluice_alive_inside_128_mib() {
    let upstream = Upstream::start().await;
    let (cgroup, mut sluice, idle) = start(&upstream).await;
    let addr = sluice.addr();
    let (_, first, _) = regular_get(addr).await;
    let first = first.expect("a count");

    // 2,000 connections from one address, each sending header lines and
    // never the blank line that ends the head.
    let until = Instant::now() + Duration::from_secs(8);
    // Half of them over the default head bound (hyper refuses those with
    // 431), half just under it (held until `header_read_timeout`).
    let heads = [60_000, 30_000].map(|len| {
        let mut head = b"GET /api HTTP/1.1\r\nHost: app.test\r\n".to_vec();
        while head.len() < len - 1100 {
            let line = format!("X-Pad-{}: {}\r\n", head.len(), "p".repeat(1000));
            head.extend_from_slice(line.as_bytes());
        }
        Bytes::from(head)
    });
    let mut flood = JoinSet::new();
    for n in 0..2_000 {
        let head = heads[n % 2].clone();
        flood.spawn(async move {
            let socket = TcpSocket::new_v4().ok()?;
            socket.bind(format!("{FLOODER}:0").parse().ok()?).ok()?;
            let mut stream = socket.connect(addr).await.ok()?;
            let _ = stream.write_all(&head).await;
            let mut answer = Vec::new();
            let _ = tokio::time::timeout_at(until, stream.read_to_end(&mut answer)).await;
            Some(
                String::from_utf8_lossy(&answer)
                    .get(9..12)
                    .map(str::to_owned),
            )
        });
    }
    let regular = tokio::spawn(regular_client(addr, first - 1, until));
    let peak = watch_until(&mut sluice, until).await;
    let mut answered = std::collections::BTreeMap::<String, usize>::new();
    while let Some(status) = flood.join_next().await {
        let status = status.expect("flood task").flatten().unwrap_or_default();
        *answered.entry(status).or_default() += 1;
    }
    regular.await.expect("the regular client");
    survived(&mut sluice, peak);
    assert!(
        refused(&sluice, "client").await > 0.0,
        "the flood's heads went past its address's budget: {answered:?}"
    );
    assert!(
        answered.get("503").copied().unwrap_or(0) > 0,
        "refused heads are answered 503: {answered:?}"
    );

    let settled = settles(&sluice, idle).await;
    assert!(
        settled <= idle + SLACK_BYTES,
        "RSS {settled} 15 s after the flood, idle {idle} (peak {peak})"
    );
    assert_eq!(cgroup.limit_hits(), 0, "the cgroup's limit was reached");
}
