//! Address claims a client makes for itself: every field an app framework
//! reads a client address, port or path prefix from reaches the app only
//! from a trusted proxy. Through the built binary, with an upstream that
//! records what reached it. The fields are the table in docs/SECURITY.md,
//! which a unit test holds equal to the table in the code.

use std::path::Path;

use crate::support::client::RawResponse;
use crate::support::{raw_exchange, Sidecar, Upstream};

/// The fields of the `| field | read by |` table under `### Address
/// claims` in docs/SECURITY.md, as written there.
fn documented_claims() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/SECURITY.md");
    let doc = std::fs::read_to_string(&path).expect("docs/SECURITY.md");
    let section = doc.split("### Address claims").nth(1).expect("section");
    section
        .lines()
        .skip_while(|line| !line.starts_with("| field | read by |"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let field = line.split('|').nth(1).unwrap_or_default().trim();
            field.trim_matches('`').to_owned()
        })
        .collect()
}

/// `identity` is the whole section, or empty.
fn config(upstream: &Upstream, identity: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
{identity}policies:
  plenty: {{ algorithm: sliding-log, limit: 100000, window: 1h }}
routes: []
default: {{ policy: plenty, subject: client_ip }}
",
        upstream.url()
    )
}

async fn send(sluice: &Sidecar, head: &str) -> RawResponse {
    let bytes = format!("{head}\r\nHost: app.test\r\nContent-Length: 0\r\n\r\n");
    raw_exchange(sluice.addr(), bytes.as_bytes()).await
}

const CLAIMS: &str = "\r\nX-Real-IP: 6.6.6.6\r\nTrue-Client-IP: 6.6.6.7\r\nCF-Connecting-IP: 6.6.6.8\r\nForwarded: for=6.6.6.9";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_clients_address_claims_do_not_reach_the_app() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream, ""));
    let head = format!("GET /x HTTP/1.1{CLAIMS}\r\nX-Forwarded-For: 6.6.6.10");
    assert_eq!(send(&sluice, &head).await.status, 200);
    let seen = upstream.last().expect("the request");
    assert_eq!(seen.header("x-real-ip"), Some("127.0.0.1"));
    for gone in ["true-client-ip", "cf-connecting-ip", "forwarded"] {
        assert_eq!(seen.header(gone), None, "{gone}: {:?}", seen.headers);
    }
    // X-Forwarded-For keeps the claim and appends the peer, as before.
    assert_eq!(seen.header("x-forwarded-for"), Some("6.6.6.10, 127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxys_address_claims_pass_and_forwarded_gains_this_hop() {
    let upstream = Upstream::start().await;
    let identity = "identity:\n  trusted_proxies: [127.0.0.0/8]\n";
    let sluice = Sidecar::start(&config(&upstream, identity));
    let head = format!("GET /x HTTP/1.1{CLAIMS}");
    assert_eq!(send(&sluice, &head).await.status, 200);
    let seen = upstream.last().expect("the request");
    assert_eq!(seen.header("x-real-ip"), Some("6.6.6.6"));
    assert_eq!(seen.header("true-client-ip"), Some("6.6.6.7"));
    assert_eq!(seen.header("cf-connecting-ip"), Some("6.6.6.8"));
    assert_eq!(seen.header("forwarded"), Some("for=6.6.6.9, for=127.0.0.1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_claim_reaches_the_app_only_from_a_trusted_proxy() {
    let claims = documented_claims();
    // The fields apps were seen to believe from anyone: the table must
    // hold them (and parsing it must have found it).
    for must in [
        "Client-IP",
        "X-Client-IP",
        "X-Cluster-Client-IP",
        "Fastly-Client-IP",
        "Forwarded-For",
        "X-Forwarded",
        "X-Original-Forwarded-For",
        "X-Forwarded-Port",
        "X-Forwarded-Prefix",
        "True-Client-IP",
        "CF-Connecting-IP",
    ] {
        assert!(claims.iter().any(|c| c == must), "{must} not in {claims:?}");
    }

    let upstream = Upstream::start().await;
    let untrusted = Sidecar::start(&config(&upstream, ""));
    for claim in &claims {
        // Alone, so no other field on the request sends it to the rewrite.
        let head = format!("GET /x HTTP/1.1\r\n{claim}: 6.6.6.6");
        assert_eq!(send(&untrusted, &head).await.status, 200, "{claim}");
        let seen = upstream.last().expect("the request");
        assert_eq!(seen.header(claim), None, "{claim}: {:?}", seen.headers);
        assert_eq!(seen.header("x-forwarded-for"), Some("127.0.0.1"));
        assert_eq!(seen.header("x-real-ip"), None, "not added when absent");
    }
    // All at once, each sent twice.
    let all: String = claims
        .iter()
        .map(|c| format!("\r\n{c}: 6.6.6.6\r\n{c}: 6.6.6.7"))
        .collect();
    let head = format!("GET /x HTTP/1.1{all}\r\nX-Real-IP: 6.6.6.8");
    assert_eq!(send(&untrusted, &head).await.status, 200);
    let seen = upstream.last().expect("the request");
    for claim in &claims {
        assert_eq!(seen.header(claim), None, "{claim}: {:?}", seen.headers);
    }
    assert_eq!(seen.header("x-real-ip"), Some("127.0.0.1"));

    // From a trusted proxy each is its word, passed as sent.
    let identity = "identity:\n  trusted_proxies: [127.0.0.0/8]\n";
    let trusted = Sidecar::start(&config(&upstream, identity));
    assert_eq!(send(&trusted, &head).await.status, 200);
    let seen = upstream.last().expect("the request");
    for claim in &claims {
        assert_eq!(
            seen.header_all(claim),
            ["6.6.6.6", "6.6.6.7"],
            "{claim}: {:?}",
            seen.headers
        );
    }
    assert_eq!(seen.header("x-real-ip"), Some("6.6.6.8"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_spelled_with_underscores_is_refused() {
    // A CGI-style server hands `Client_IP` to the app as `HTTP_CLIENT_IP`,
    // the variable Rails' `remote_ip` and PHP read `Client-IP` from.
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream, ""));
    for head in [
        "GET /x HTTP/1.1\r\nClient_IP: 6.6.6.6",
        "GET /x HTTP/1.1\r\nX_Cluster_Client_IP: 6.6.6.6",
        "GET /x HTTP/1.1\r\nX_Forwarded_Prefix: /admin",
    ] {
        assert_eq!(send(&sluice, head).await.status, 400, "{head:?}");
    }
    assert_eq!(upstream.count(), 0, "{:?}", upstream.requests());
}

/// A real CGI-style app server: Python's wsgiref, which hands each header
/// to the app as an `HTTP_*` variable, `-` and `_` folded. It answers with
/// `X-Seen`: every `HTTP_*` variable the app got, `NAME=value;` each.
struct WsgiApp {
    child: std::process::Child,
    port: u16,
}

const WSGI_APP: &str = r#"
import sys
from wsgiref.simple_server import make_server, WSGIRequestHandler
class Quiet(WSGIRequestHandler):
    def log_message(self, *args):
        pass
def app(environ, start_response):
    seen = "".join(k + "=" + v + ";" for k, v in sorted(environ.items()) if k.startswith("HTTP_"))
    start_response("200 OK", [("X-Seen", seen), ("Content-Length", "0")])
    return [b""]
server = make_server("127.0.0.1", 0, app, handler_class=Quiet)
print(server.server_port, flush=True)
server.serve_forever()
"#;

impl WsgiApp {
    /// Starts the app with `python3` (the test script's own requirement:
    /// a machine without it fails the run, it does not skip).
    fn start() -> WsgiApp {
        use std::io::BufRead as _;
        let mut child = std::process::Command::new("python3")
            .args(["-c", WSGI_APP])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs the WSGI app");
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .expect("the app's port");
        let port = line.trim().parse().expect("a port");
        WsgiApp { child, port }
    }
}

impl Drop for WsgiApp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cgi_style_app_sees_no_claim_of_an_untrusted_client() {
    let app = WsgiApp::start();
    let yaml = format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: http://127.0.0.1:{}
policies:
  plenty: {{ algorithm: sliding-log, limit: 100000, window: 1h }}
routes: []
default: {{ policy: plenty, subject: client_ip }}
",
        app.port
    );
    let sluice = Sidecar::start(&yaml);
    let claims = documented_claims();
    let all: String = claims.iter().map(|c| format!("\r\n{c}: 6.6.6.6")).collect();
    let head = format!("GET /x HTTP/1.1{all}\r\nX-Trace_Id: t");
    let response = send(&sluice, &head).await;
    assert_eq!(response.status, 200, "{}", response.head);
    let seen = response
        .head
        .lines()
        .find_map(|line| line.strip_prefix("x-seen: "))
        .unwrap_or_else(|| panic!("no X-Seen in {}", response.head));
    assert!(
        seen.contains("HTTP_X_FORWARDED_FOR=127.0.0.1;"),
        "sluice's own address reaches the app: {seen}"
    );
    // Neither the claims nor an underscored name reach the app.
    for claim in &claims {
        let variable = format!("HTTP_{}=", claim.to_uppercase().replace('-', "_"));
        assert!(!seen.contains(&variable), "{variable} in {seen}");
    }
    assert!(!seen.contains("HTTP_X_TRACE_ID="), "{seen}");
    assert!(!seen.contains("6.6.6.6"), "{seen}");
}
