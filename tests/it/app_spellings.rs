//! Every spelling an app server accepts is the spelling sluice limits:
//! method overrides written percent-encoded or PHP's way, header names
//! with `_` that CGI-style servers read as the name with `-`,
//! `Authorization` schemes in any case and spacing, format suffixes,
//! asterisk-form targets, and address claims a client makes for itself.
//! Through the built binary, with an upstream that records what reached
//! it; each spelling below reached the app unlimited before sluice read it
//! the app's way.

use crate::support;
use std::time::Duration;

use crate::support::client::RawResponse;
use crate::support::{raw_exchange, Sidecar, Upstream};

/// `extra_server` goes under `server:`, `identity` is the whole section
/// (or empty); every route spends after `limit` requests an hour.
fn config(upstream: &Upstream, extra_server: &str, identity: &str, routes: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
{extra_server}upstream:
  url: {}
{identity}policies:
  three: {{ algorithm: sliding-log, limit: 3, window: 1h }}
  plenty: {{ algorithm: sliding-log, limit: 100000, window: 1h }}
routes:
{routes}default: {{ policy: plenty, subject: client_ip }}
",
        upstream.url()
    )
}

/// `head` is the request line and any header lines; `Host` and an empty
/// body are added.
async fn send(sluice: &Sidecar, head: &str) -> RawResponse {
    let bytes = format!("{head}\r\nHost: app.test\r\nContent-Length: 0\r\n\r\n");
    raw_exchange(sluice.addr(), bytes.as_bytes()).await
}

/// Sends each `(head, status)` and returns the ones answered otherwise.
async fn mismatches(sluice: &Sidecar, table: &[(&str, u16)]) -> Vec<String> {
    let mut out = Vec::new();
    for (head, want) in table {
        let got = send(sluice, head).await.status;
        if got != *want {
            out.push(format!("{head:?}: want {want}, got {got}"));
        }
    }
    out
}

const DELETE_ROUTE: &str =
    "  - { name: delete, match: { methods: [DELETE], path: /items }, policy: three }\n";

async fn spend_deletes(sluice: &Sidecar) {
    for _ in 0..3 {
        assert_eq!(send(sluice, "DELETE /items HTTP/1.1").await.status, 200);
    }
    assert_eq!(send(sluice, "DELETE /items HTTP/1.1").await.status, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_delete_limit_holds_for_every_override_spelling() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream, "", "", DELETE_ROUTE));
    spend_deletes(&sluice).await;
    let spent = upstream.count();

    let table: &[(&str, u16)] = &[
        ("POST /items?_method=DELETE HTTP/1.1", 429),
        // Express's qs, Rack, PHP and Spring decode names and values.
        ("POST /items?%5Fmethod=DELETE HTTP/1.1", 429),
        ("POST /items?%5fmethod=delete HTTP/1.1", 429),
        ("POST /items?_method=%44ELETE HTTP/1.1", 429),
        ("POST /items?_%6Dethod=DELETE HTTP/1.1", 429),
        // PHP: `.` in a parameter name is `_`, leading spaces are dropped.
        ("POST /items?.method=DELETE HTTP/1.1", 429),
        ("POST /items?%2Emethod=DELETE HTTP/1.1", 429),
        ("POST /items?+_method=DELETE HTTP/1.1", 429),
        // Rack before 3 splits on `;` too.
        ("POST /items?a=1;_method=DELETE HTTP/1.1", 429),
        // Puma reads it as X-HTTP-Method-Override; dropped by default,
        // so refused rather than guessed at.
        (
            "POST /items HTTP/1.1\r\nX_HTTP_Method_Override: DELETE",
            400,
        ),
        ("POST /items HTTP/1.1\r\nX_HTTP_Method: DELETE", 400),
        // Names that decode to something else are not overrides.
        ("POST /items?_method2=DELETE HTTP/1.1", 200),
        ("POST /items?m.ethod=DELETE HTTP/1.1", 200),
        // Two spellings naming different methods: the app reads one.
        ("POST /items?_method=PUT&%5Fmethod=DELETE HTTP/1.1", 400),
    ];
    let failures = mismatches(&sluice, table).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let forwarded: Vec<String> = upstream.requests()[spent..]
        .iter()
        .map(|r| r.path.clone())
        .collect();
    assert_eq!(
        forwarded,
        ["/items?_method2=DELETE", "/items?m.ethod=DELETE"],
        "only the requests that name no DELETE reach the app"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underscored_override_header_is_matched_as_one_when_underscores_are_allowed() {
    let upstream = Upstream::start().await;
    let server = "  headers_with_underscores: allow\n";
    let sluice = Sidecar::start(&config(&upstream, server, "", DELETE_ROUTE));
    spend_deletes(&sluice).await;
    let spent = upstream.count();
    let table: &[(&str, u16)] = &[
        (
            "POST /items HTTP/1.1\r\nX_HTTP_Method_Override: DELETE",
            429,
        ),
        (
            "POST /items HTTP/1.1\r\nx-http_method-OVERRIDE: delete",
            429,
        ),
        ("POST /items HTTP/1.1\r\nX_Method_Override: DELETE", 429),
        // Both spellings at once: which one the app reads is its choice.
        (
            "POST /items HTTP/1.1\r\nX-HTTP-Method: GET\r\nX_HTTP_Method: DELETE",
            400,
        ),
    ];
    let failures = mismatches(&sluice, table).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(upstream.count(), spent);

    // Under allow, other underscored names reach the app as sent.
    assert_eq!(
        send(&sluice, "GET /free HTTP/1.1\r\nX_Trace: t-1")
            .await
            .status,
        200
    );
    let seen = upstream.last().expect("the free request");
    assert_eq!(seen.header("x_trace"), Some("t-1"));
}

const KEY_ROUTE: &str =
    "  - { name: api, match: { path_prefix: /api }, subject: header:X-API-Key, policy: three }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underscored_twin_of_the_identity_header_never_reaches_the_app() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream, "", "", KEY_ROUTE));

    // A fresh key for sluice, the victim's for a CGI-style app.
    let attack = "GET /api/x HTTP/1.1\r\nX-API-Key: fresh-1\r\nX_API_Key: victim";
    assert_eq!(send(&sluice, attack).await.status, 400);
    let alone = "GET /api/x HTTP/1.1\r\nX_API_Key: victim";
    assert_eq!(send(&sluice, alone).await.status, 400);
    for claim in ["X_Forwarded_For: 6.6.6.6", "X_Real_IP: 6.6.6.6"] {
        let head = format!("GET /api/x HTTP/1.1\r\nX-API-Key: k\r\n{claim}");
        assert_eq!(send(&sluice, &head).await.status, 400, "{claim}");
    }
    assert_eq!(upstream.count(), 0, "a refused request reached the app");

    // Any other underscored name is dropped (nginx's default), the
    // request served.
    let head = "GET /api/x HTTP/1.1\r\nX-API-Key: k\r\nX_Trace: t-1\r\nX-Kept: yes";
    assert_eq!(send(&sluice, head).await.status, 200);
    let seen = upstream.last().expect("the request");
    assert_eq!(seen.header("x_trace"), None, "{:?}", seen.headers);
    assert_eq!(seen.header("x-kept"), Some("yes"));
    assert_eq!(seen.header("x-api-key"), Some("k"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_reject_any_underscored_name_is_refused() {
    let upstream = Upstream::start().await;
    let server = "  headers_with_underscores: reject\n";
    let sluice = Sidecar::start(&config(&upstream, server, "", KEY_ROUTE));
    let refused = send(&sluice, "GET /free HTTP/1.1\r\nX_Trace: t-1").await;
    assert_eq!(refused.status, 400);
    assert_eq!(
        send(&sluice, "GET /free HTTP/1.1\r\nX-Trace: t-1")
            .await
            .status,
        200
    );
    assert_eq!(upstream.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorization_subject_is_one_credential_in_any_scheme_case_and_spacing() {
    let upstream = Upstream::start().await;
    let route = "  - { name: api, match: { path_prefix: /api }, subject: header:Authorization, policy: three }\n";
    let sluice = Sidecar::start(&config(&upstream, "", "", route));
    for _ in 0..3 {
        let head = "GET /api/x HTTP/1.1\r\nAuthorization: Bearer tok-1";
        assert_eq!(send(&sluice, head).await.status, 200);
    }
    let spent = upstream.count();
    let mut table: Vec<(String, u16)> = [
        "Bearer tok-1",
        "Bearer  tok-1",
        "bearer tok-1",
        "BEARER tok-1",
        "Bearer\ttok-1",
        "Bearer \t tok-1",
        "Bearer tok-1  ",
    ]
    .iter()
    .map(|v| (format!("GET /api/x HTTP/1.1\r\nAuthorization: {v}"), 429))
    .collect();
    for spaces in 1..=20 {
        let value = format!("Bearer{}tok-1", " ".repeat(spaces));
        table.push((
            format!("GET /api/x HTTP/1.1\r\nAuthorization: {value}"),
            429,
        ));
    }
    // The credential itself is case-sensitive: another token is another
    // client.
    table.push((
        "GET /api/x HTTP/1.1\r\nAuthorization: Bearer TOK-1".to_owned(),
        200,
    ));
    let table: Vec<(&str, u16)> = table.iter().map(|(h, s)| (h.as_str(), *s)).collect();
    let failures = mismatches(&sluice, &table).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(upstream.count(), spent + 1);
    // Forwarded as the client wrote it: sluice reads, it does not rewrite.
    let seen = upstream.last().expect("the other token");
    assert_eq!(seen.header("authorization"), Some("Bearer TOK-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_suffix_route_limits_the_formats_rails_routes_to_it() {
    let upstream = Upstream::start().await;
    let routes = "  - { name: login, match: { methods: [POST], path: /login, format_suffix: true }, policy: three }
  - { name: edit, match: { path: \"/users/{id}/edit\", format_suffix: true }, policy: three }
  - { name: plain, match: { methods: [POST], path: /plain }, policy: three }
";
    let sluice = Sidecar::start(&config(&upstream, "", "", routes));
    for head in [
        "POST /login HTTP/1.1",
        "POST /login.json HTTP/1.1",
        "POST /login.html/ HTTP/1.1",
    ] {
        assert_eq!(send(&sluice, head).await.status, 200, "{head}");
    }
    for _ in 0..3 {
        assert_eq!(send(&sluice, "POST /plain HTTP/1.1").await.status, 200);
    }
    let spent = upstream.count();
    let table: &[(&str, u16)] = &[
        ("POST /login HTTP/1.1", 429),
        ("POST /login.json HTTP/1.1", 429),
        ("POST /login.xml HTTP/1.1", 429),
        ("POST /LOGIN.json HTTP/1.1", 200),
        ("POST /login.json/x HTTP/1.1", 200),
        // Without the option a format is another path.
        ("POST /plain HTTP/1.1", 429),
        ("POST /plain.json HTTP/1.1", 200),
    ];
    let failures = mismatches(&sluice, table).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(upstream.count(), spent + 3);
    for _ in 0..3 {
        assert_eq!(
            send(&sluice, "GET /users/7/edit.json HTTP/1.1")
                .await
                .status,
            200
        );
    }
    assert_eq!(
        send(&sluice, "GET /users/7/edit HTTP/1.1").await.status,
        429
    );

    // `sluice check` shows the option.
    let (code, out, err) = support::sidecar::run_binary(
        &["check", "--config", &sluice.config_path().to_string_lossy()],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("exact /login(.format)"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn case_insensitive_routes_limit_what_express_routes_in_any_case() {
    let upstream = Upstream::start().await;
    let routes = "  - { name: login, match: { methods: [POST], path: /login, case_sensitive: false }, policy: three }\n";
    let sluice = Sidecar::start(&config(&upstream, "", "", routes));
    for head in [
        "POST /login HTTP/1.1",
        "POST /LOGIN HTTP/1.1",
        "POST /Login/ HTTP/1.1",
    ] {
        assert_eq!(send(&sluice, head).await.status, 200, "{head}");
    }
    assert_eq!(send(&sluice, "POST /lOgIn HTTP/1.1").await.status, 429);
    assert_eq!(upstream.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asterisk_target_is_for_options_alone_on_http1_and_http2() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream, "", "", DELETE_ROUTE));
    for method in ["GET", "POST", "DELETE", "HEAD", "PUT"] {
        let response = send(&sluice, &format!("{method} * HTTP/1.1")).await;
        assert_eq!(response.status, 400, "{method} *");
    }
    assert_eq!(upstream.count(), 0);
    assert_eq!(send(&sluice, "OPTIONS * HTTP/1.1").await.status, 200);
    let seen = upstream.last().expect("OPTIONS *");
    assert_eq!((seen.method.as_str(), seen.path.as_str()), ("OPTIONS", "*"));

    for (method, want) in [(http::Method::GET, 400), (http::Method::POST, 400)] {
        let status = h2_asterisk(&sluice, method.clone()).await;
        assert_eq!(status, want, "HTTP/2 {method} *");
    }
    assert_eq!(upstream.count(), 1);
}

/// An HTTP/2 request with `:path: *`, which hyper's client cannot write.
async fn h2_asterisk(sluice: &Sidecar, method: http::Method) -> u16 {
    let tcp = tokio::net::TcpStream::connect(sluice.addr())
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let request = http::Request::builder()
        .method(method)
        .uri("*")
        .header("host", "app.test")
        .body(())
        .expect("request");
    let mut client = client.ready().await.expect("ready");
    let (response, _) = client.send_request(request, true).expect("send");
    let response = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("an answer in time");
    match response {
        Ok(response) => response.status().as_u16(),
        Err(error) => panic!("HTTP/2 *: {error}"),
    }
}

const CLAIMS: &str = "\r\nX-Real-IP: 6.6.6.6\r\nTrue-Client-IP: 6.6.6.7\r\nCF-Connecting-IP: 6.6.6.8\r\nForwarded: for=6.6.6.9";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_clients_address_claims_do_not_reach_the_app() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream, "", "", DELETE_ROUTE));
    let head = format!("GET /free HTTP/1.1{CLAIMS}\r\nX-Forwarded-For: 6.6.6.10");
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
    let sluice = Sidecar::start(&config(&upstream, "", identity, DELETE_ROUTE));
    let head = format!("GET /free HTTP/1.1{CLAIMS}");
    assert_eq!(send(&sluice, &head).await.status, 200);
    let seen = upstream.last().expect("the request");
    assert_eq!(seen.header("x-real-ip"), Some("6.6.6.6"));
    assert_eq!(seen.header("true-client-ip"), Some("6.6.6.7"));
    assert_eq!(seen.header("cf-connecting-ip"), Some("6.6.6.8"));
    assert_eq!(seen.header("forwarded"), Some("for=6.6.6.9, for=127.0.0.1"));
}
