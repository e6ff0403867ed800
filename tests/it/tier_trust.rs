//! Who a tier header is believed from, through the binary: only the
//! components a route's `tiers.trusted_from` names (an auth gateway, here
//! a client bound to 127.0.0.2), never a forwarding proxy of
//! `identity.trusted_proxies` (127.0.0.1), which passes a client's own
//! header through. Nobody else's tier header reaches the app, on any
//! route.

use std::net::SocketAddr;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

use crate::support::client::{content_length, parse_status, read_head};
use crate::support::sidecar::run_binary;
use crate::support::{Sidecar, Upstream};

const GATEWAY: &str = "127.0.0.2";
const PROXY: &str = "127.0.0.1";

/// Free gets 2, pro 5; `/other` has no tiers and no limit.
fn config(upstream: &Upstream, trusted_from: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {}
identity:
  trusted_proxies: [127.0.0.1/32]
policies:
  p_free: {{ algorithm: fixed-window, limit: 2, window: 1h }}
  p_pro: {{ algorithm: fixed-window, limit: 5, window: 1h }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    subject: header:x-api-key
    tiers:
      header: X-Plan
      policies: {{ pro: p_pro }}
      default: p_free
{trusted_from}  - name: other
    match: {{ path_prefix: /other }}
    policy: none
",
        upstream.url()
    )
}

fn trusting_the_gateway(upstream: &Upstream) -> String {
    config(upstream, &format!("      trusted_from: [{GATEWAY}]\n"))
}

/// A GET of `path` with `headers` on a connection from `from` (a loopback
/// address): the status.
async fn get_from(from: &str, to: SocketAddr, path: &str, headers: &[(&str, &str)]) -> u16 {
    get_after(from, to, "", path, headers).await
}

/// [`get_from`] after `opening` (a PROXY protocol header, or nothing).
async fn get_after(
    from: &str,
    to: SocketAddr,
    opening: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> u16 {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{from}:0").parse().expect("an address"))
        .expect("bind a loopback address");
    let mut stream: TcpStream = socket.connect(to).await.expect("connect");
    let mut request =
        format!("{opening}GET {path} HTTP/1.1\r\nHost: app.test\r\nConnection: close\r\n");
    for (name, value) in headers {
        request += &format!("{name}: {value}\r\n");
    }
    request += "\r\n";
    stream.write_all(request.as_bytes()).await.expect("write");
    let (head, mut body) = read_head(&mut stream).await;
    let len = content_length(&head).unwrap_or(0);
    let mut chunk = [0u8; 1024];
    while body.len() < len {
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    parse_status(&head)
}

/// Sends `n` requests for `key` claiming `pro` from `from`: how many
/// were admitted.
async fn admitted(sluice: &Sidecar, from: &str, key: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let headers = [
            ("x-api-key", key),
            ("x-plan", "pro"),
            ("x-forwarded-for", "203.0.113.7"),
        ];
        match get_from(from, sluice.addr(), "/api/items", &headers).await {
            200 => ok += 1,
            429 => {}
            other => panic!("unexpected {other}"),
        }
    }
    ok
}

/// The plans the app saw for `key`'s requests.
fn plans_seen(upstream: &Upstream, key: &str) -> Vec<Option<String>> {
    upstream
        .requests()
        .into_iter()
        .filter(|r| r.header("x-api-key") == Some(key))
        .map(|r| r.header("x-plan").map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_plan_through_a_trusted_proxy_gets_the_default_tier() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&trusting_the_gateway(&upstream));
    assert_eq!(
        admitted(&sluice, PROXY, "k-forwarded", 6).await,
        2,
        "a client's own plan, passed through a trusted proxy, chose the tier"
    );
    assert_eq!(
        plans_seen(&upstream, "k-forwarded"),
        vec![None, None],
        "a client's own plan reached the app"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_from_a_trusted_from_gateway_chooses_the_tier() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&trusting_the_gateway(&upstream));
    assert_eq!(admitted(&sluice, GATEWAY, "k-gateway", 6).await, 5);
    assert_eq!(
        plans_seen(&upstream, "k-gateway"),
        vec![Some("pro".to_owned()); 5],
        "the gateway's plan reaches the app"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_trusted_from_the_plan_is_never_believed() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream, ""));
    for from in [PROXY, GATEWAY] {
        let key = format!("k-nobody-{from}");
        assert_eq!(
            admitted(&sluice, from, &key, 4).await,
            2,
            "a plan from {from} was believed without `trusted_from`"
        );
        assert_eq!(plans_seen(&upstream, &key), vec![None, None]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_without_tiers_strips_the_plan_too() {
    let upstream = Upstream::start().await;
    // Believing no one: the plan is removed from everyone, a trusted
    // proxy too.
    let sluice = Sidecar::start(&config(&upstream, ""));
    let from_proxy = [("x-api-key", "k-other-proxy"), ("x-plan", "pro")];
    assert_eq!(
        get_from(PROXY, sluice.addr(), "/other", &from_proxy).await,
        200
    );
    assert_eq!(
        plans_seen(&upstream, "k-other-proxy"),
        vec![None],
        "a route without tiers passed a client's plan to the app"
    );
    drop(sluice);
    let sluice = Sidecar::start(&trusting_the_gateway(&upstream));
    assert_eq!(
        get_from(PROXY, sluice.addr(), "/other", &from_proxy).await,
        200
    );
    assert_eq!(plans_seen(&upstream, "k-other-proxy"), vec![None, None]);
    let from_gateway = [("x-api-key", "k-other-gateway"), ("x-plan", "pro")];
    assert_eq!(
        get_from(GATEWAY, sluice.addr(), "/other", &from_gateway).await,
        200
    );
    assert_eq!(
        plans_seen(&upstream, "k-other-gateway"),
        vec![Some("pro".to_owned())],
        "the gateway's plan is kept on every route"
    );
}

/// Behind a PROXY protocol balancer (127.0.0.1, trusted), the peer that
/// sent the request is the client its header names: `trusted_from` lists
/// the gateway, and the balancer itself speaks for no one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_proxy_protocol_balancer_the_named_client_is_the_peer() {
    let upstream = Upstream::start().await;
    let yaml = config(&upstream, "      trusted_from: [10.2.0.5, 127.0.0.1]\n").replace(
        "  admin: 127.0.0.1:0\n",
        "  admin: 127.0.0.1:0\n  proxy_protocol: [v1]\n",
    );
    let sluice = Sidecar::start(&yaml);
    let proxied = |client: &str| format!("PROXY TCP4 {client} 10.0.0.5 40000 8080\r\n");
    let plan = |key: &'static str| [("x-api-key", key), ("x-plan", "pro")];
    let through = |client: &'static str, key: &'static str| {
        let sluice = &sluice;
        let opening = proxied(client);
        async move {
            let mut ok = 0;
            for _ in 0..6 {
                let status =
                    get_after(PROXY, sluice.addr(), &opening, "/api/items", &plan(key)).await;
                ok += usize::from(status == 200);
            }
            ok
        }
    };
    assert_eq!(
        through("10.2.0.5", "k-gateway").await,
        5,
        "the gateway, named"
    );
    assert_eq!(
        through("198.51.100.7", "k-client").await,
        2,
        "a client named by the balancer chose its tier"
    );
    assert_eq!(plans_seen(&upstream, "k-client"), vec![None, None]);
    assert_eq!(
        plans_seen(&upstream, "k-gateway"),
        vec![Some("pro".to_owned()); 5]
    );
}

/// `X_Plan` is `X-Plan` to a CGI-style app (`HTTP_X_PLAN`): even where
/// underscored names are passed on, it never reaches the app.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underscored_twin_of_the_tier_header_never_reaches_the_app() {
    let upstream = Upstream::start().await;
    let yaml = config(&upstream, "").replace(
        "  admin: 127.0.0.1:0\n",
        "  admin: 127.0.0.1:0\n  headers_with_underscores: allow\n",
    );
    let sluice = Sidecar::start(&yaml);
    for path in ["/api/items", "/other"] {
        let twin = [("x-api-key", "k-twin"), ("X_Plan", "pro")];
        assert_eq!(
            get_from(PROXY, sluice.addr(), path, &twin).await,
            400,
            "{path}"
        );
    }
    assert_eq!(upstream.count(), 0, "an underscored plan reached the app");
}

#[test]
fn check_warns_of_a_header_tier_without_trusted_from() {
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("sluice.yaml");
    let upstream_url = "http://127.0.0.1:9";
    let yaml = config_for_check(upstream_url, "");
    std::fs::write(&path, yaml).expect("write");
    let (code, stdout, stderr) = run_binary(&["check", "--config", &path.to_string_lossy()], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("warning: route `api`: tiers by `x-plan` without `trusted_from`"),
        "no warning in\n{stdout}"
    );

    std::fs::write(
        &path,
        config_for_check(upstream_url, "      trusted_from: [10.0.0.0/8]\n"),
    )
    .expect("write");
    let (code, stdout, stderr) = run_binary(&["check", "--config", &path.to_string_lossy()], &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(!stdout.contains("warning"), "{stdout}");
}

#[test]
fn a_bad_trusted_from_names_its_key() {
    let dir = tempfile::tempdir().expect("a directory");
    let path = dir.path().join("sluice.yaml");
    let yaml = config_for_check(
        "http://127.0.0.1:9",
        "      trusted_from: [10.0.0.1/8, gateway]\n",
    );
    std::fs::write(&path, yaml).expect("write");
    let (code, _, stderr) = run_binary(&["check", "--config", &path.to_string_lossy()], &[]);
    assert_ne!(code, 0);
    for key in [
        "routes[0].tiers.trusted_from[0]: `10.0.0.1/8` has host bits set",
        "routes[0].tiers.trusted_from[1]: `gateway` is neither",
    ] {
        assert!(stderr.contains(key), "`{key}` not in\n{stderr}");
    }
}

fn config_for_check(upstream_url: &str, trusted_from: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {upstream_url}
policies:
  p_free: {{ algorithm: fixed-window, limit: 2, window: 1h }}
  p_pro: {{ algorithm: fixed-window, limit: 5, window: 1h }}
routes:
  - name: api
    match: {{ path_prefix: /api }}
    subject: header:x-api-key
    tiers:
      header: X-Plan
      policies: {{ pro: p_pro }}
      default: p_free
{trusted_from}"
    )
}
