//! `deny` and `exempt` through the binary: the client address is the one
//! `client_ip` subjects read (behind a trusted proxy's `X-Forwarded-For`,
//! or a trusted balancer's PROXY protocol header), never what the client
//! wrote itself. An exempt client is never counted and its requests make
//! no store call; a denied one is answered 403 problem+json and nothing
//! reaches the app.

use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::support::client::{parse_status, read_head};
use crate::support::ops::{metric, scrape};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{commandstats, redis_yaml, reset_stats, start_ready};
use crate::support::{get, Sidecar, Upstream};

/// One request an hour per client on `/api`, 10.0.0.0/8 exempt and
/// 203.0.113.0/24 denied; on `/both` the exemption covers only the first
/// of two limits.
fn config(upstream: &str, server_extra: &str, trusted: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
{server_extra}
upstream:
  url: {upstream}
identity:
  trusted_proxies: {trusted}
policies:
  one: {{ algorithm: fixed-window, limit: 1, window: 1h }}
  two: {{ algorithm: fixed-window, limit: 2, window: 1h }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    policy: one
    exempt: [10.0.0.0/8]
    deny: [203.0.113.0/24]
  - name: both
    match: {{ path_prefix: /both }}
    limits:
      - {{ policy: one, exempt: [10.0.0.0/8] }}
      - {{ policy: two }}
"
    )
}

async fn counter(sluice: &Sidecar, name: &str, labels: &[(&str, &str)]) -> f64 {
    let text = scrape(sluice.admin_addr().unwrap()).await;
    metric(&text, name, labels).unwrap_or_else(|| panic!("no {name} {labels:?}:\n{text}"))
}

async fn status_from(sluice: &Sidecar, path: &str, forwarded_for: &str) -> StatusCode {
    get(sluice.addr(), path, &[("x-forwarded-for", forwarded_for)])
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_exempt_clients_are_never_counted_and_denied_ones_get_403() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream.url(), "", "[127.0.0.1]"));
    let exempted = [("route", "api"), ("policy", "one")];
    let denied = [("route", "api")];
    // Registered at zero before anything happened.
    assert_eq!(
        counter(&sluice, "sluice_requests_exempted_total", &exempted).await,
        0.0
    );
    assert_eq!(
        counter(&sluice, "sluice_requests_denied_total", &denied).await,
        0.0
    );

    for _ in 0..5 {
        assert_eq!(
            status_from(&sluice, "/api", "10.1.2.3").await,
            StatusCode::OK
        );
    }
    assert_eq!(upstream.count(), 5);
    assert_eq!(
        counter(&sluice, "sluice_requests_exempted_total", &exempted).await,
        5.0
    );

    // Anyone else is limited as before.
    assert_eq!(
        status_from(&sluice, "/api", "198.51.100.1").await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(&sluice, "/api", "198.51.100.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // An exempt address written by the client, left of the entry the
    // trusted proxy added, exempts nothing.
    let claimed = "10.0.0.1, 198.51.100.2";
    assert_eq!(status_from(&sluice, "/api", claimed).await, StatusCode::OK);
    assert_eq!(
        status_from(&sluice, "/api", claimed).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let forwarded = upstream.count();

    // Denied: 403 problem+json naming the route, nothing forwarded, and
    // no limit charged (the same address's first request elsewhere passes).
    let (status, headers, body) = get(
        sluice.addr(),
        "/api/x",
        &[("x-forwarded-for", "203.0.113.9")],
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(headers["content-type"], "application/problem+json");
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["status"], 403);
    assert_eq!(problem["route"], "api");
    assert!(!String::from_utf8_lossy(&body).contains("203.0.113.9"));
    assert_eq!(
        status_from(&sluice, "/api", "203.0.113.9").await,
        StatusCode::FORBIDDEN
    );
    assert_eq!(upstream.count(), forwarded);
    assert_eq!(
        counter(&sluice, "sluice_requests_denied_total", &denied).await,
        2.0
    );
    assert_eq!(
        status_from(&sluice, "/both", "203.0.113.9").await,
        StatusCode::OK
    );

    // An X-Forwarded-For the trusted proxy sent that cannot be read is
    // still a 400: no guess lets a denied client through.
    assert_eq!(
        status_from(&sluice, "/api", "not-an-address").await,
        StatusCode::BAD_REQUEST
    );

    // `/both`: exempt from `one`, still counted by `two`.
    for _ in 0..2 {
        assert_eq!(
            status_from(&sluice, "/both", "10.9.9.9").await,
            StatusCode::OK
        );
    }
    assert_eq!(
        status_from(&sluice, "/both", "10.9.9.9").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    let both = [("route", "both"), ("policy", "one")];
    assert_eq!(
        counter(&sluice, "sluice_requests_exempted_total", &both).await,
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_trusted_proxies_a_forwarded_for_header_exempts_nobody() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream.url(), "", "[]"));
    // The test connects from 127.0.0.1: that is the client, whatever it
    // writes.
    assert_eq!(
        status_from(&sluice, "/api", "10.1.2.3").await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(&sluice, "/api", "10.1.2.3").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status_from(&sluice, "/api", "203.0.113.9").await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

fn v1(client: &str, port: u16) -> Vec<u8> {
    format!("PROXY TCP4 {client} 10.0.0.5 {port} 8080\r\n").into_bytes()
}

/// A PROXY header naming `client`, then a GET of `path`: the status.
async fn through_balancer(addr: SocketAddr, client: &str, port: u16, path: &str) -> u16 {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let mut bytes = v1(client, port);
    bytes.extend_from_slice(format!("GET {path} HTTP/1.1\r\nHost: app\r\n\r\n").as_bytes());
    stream.write_all(&bytes).await.expect("write");
    let head = tokio::time::timeout(Duration::from_secs(10), read_head(&mut stream))
        .await
        .expect("an answer in time")
        .0;
    parse_status(&head)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_proxy_protocol_header_exempt_clients_pass_and_denied_ones_get_403() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream.url(),
        "  proxy_protocol: v1",
        "[127.0.0.1]",
    ));
    let addr = sluice.addr();
    for port in 0..4 {
        assert_eq!(
            through_balancer(addr, "10.1.2.3", 50000 + port, "/api").await,
            200
        );
    }
    assert_eq!(upstream.count(), 4);
    assert_eq!(
        through_balancer(addr, "203.0.113.7", 50010, "/api").await,
        403
    );
    assert_eq!(upstream.count(), 4);
    assert_eq!(
        through_balancer(addr, "198.51.100.9", 50011, "/api").await,
        200
    );
    assert_eq!(
        through_balancer(addr, "198.51.100.9", 50012, "/api").await,
        429
    );
    let exempted = [("route", "api"), ("policy", "one")];
    assert_eq!(
        counter(&sluice, "sluice_requests_exempted_total", &exempted).await,
        4.0
    );
    assert_eq!(
        counter(&sluice, "sluice_requests_denied_total", &[("route", "api")]).await,
        1.0
    );
}

/// Calls of the scripts' commands (Functions or cached scripts) since the
/// last reset.
fn script_calls(conn: &mut redis::Connection) -> u64 {
    commandstats(conn)
        .iter()
        .filter(|(name, _)| matches!(name.as_str(), "fcall" | "evalsha" | "eval"))
        .map(|(_, calls)| calls)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_exempt_requests_make_no_store_call() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = redis_yaml(
        &upstream,
        &redis.url(),
        "  one: { algorithm: fixed-window, limit: 1, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, policy: one, exempt: [10.0.0.0/8] }\n",
    )
    .replace("identity:\n", "identity:\n  trusted_proxies: [127.0.0.1]\n");
    let sluice = start_ready(&yaml).await;
    let mut conn = redis.connection();
    reset_stats(&mut conn);
    for _ in 0..20 {
        assert_eq!(
            status_from(&sluice, "/api", "10.1.2.3").await,
            StatusCode::OK
        );
    }
    assert_eq!(upstream.count(), 20);
    assert_eq!(script_calls(&mut conn), 0);
    // A client that is not exempt is decided in Redis, as always.
    assert_eq!(
        status_from(&sluice, "/api", "198.51.100.1").await,
        StatusCode::OK
    );
    assert_eq!(
        status_from(&sluice, "/api", "198.51.100.1").await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert!(script_calls(&mut conn) >= 1);
}

#[test]
fn check_lists_the_rules_and_explain_says_denied_and_exempt() {
    use crate::support::sidecar::{run_binary, write_config};
    let (dir, path) = write_config(&config("http://127.0.0.1:9", "", "[127.0.0.1]"));
    let config = path.to_str().unwrap();
    let (code, out, err) = run_binary(&["check", "--config", config], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("api: deny 203.0.113.0/24 (403, before any limit)"),
        "{out}"
    );
    assert!(
        out.contains("api: exempt 10.0.0.0/8 from policy one"),
        "{out}"
    );
    assert!(
        out.contains("both: exempt 10.0.0.0/8 from policy one"),
        "{out}"
    );

    let explain = |forwarded_for: &str, path: &str| {
        let request = dir.path().join("request.json");
        let described = serde_json::json!({
            "method": "GET",
            "path": path,
            "headers": { "X-Forwarded-For": forwarded_for },
            "peer": "127.0.0.1",
        });
        std::fs::write(&request, described.to_string()).unwrap();
        let request = request.to_str().unwrap();
        let (code, out, err) =
            run_binary(&["check", "--config", config, "--explain", request], &[]);
        assert_eq!(code, 0, "{err}");
        serde_json::from_str::<serde_json::Value>(&out).unwrap()
    };
    let denied = explain("203.0.113.9", "/api");
    assert_eq!(denied["answer"]["status"], 403, "{denied:#}");
    assert_eq!(denied["denied"], "api");
    assert!(!denied.to_string().contains("203.0.113.9"), "{denied:#}");
    let exempt = explain("10.1.2.3", "/both");
    let limits = &exempt["routes"][0]["limits"];
    let one = limits
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["policy"] == "one")
        .unwrap();
    assert_eq!(one["exempt"], true, "{exempt:#}");
    let two = limits
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["policy"] == "two")
        .unwrap();
    assert!(two.get("exempt").is_none(), "{exempt:#}");
}
