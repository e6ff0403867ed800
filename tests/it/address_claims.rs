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
