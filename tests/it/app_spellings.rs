//! Every spelling an app server accepts is the spelling sluice limits:
//! method overrides written percent-encoded or PHP's way, header names
//! with `_` that CGI-style servers read as the name with `-`,
//! `Authorization` schemes in any case and spacing, format suffixes and
//! asterisk-form targets (address claims: `address_claims`).
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
    let routes = "  - { name: login, match: { methods: [POST], path: /login, format_suffix: true, case_sensitive: true }, policy: three }
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
        // A format does not loosen `case_sensitive: true`.
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

/// Express, Koa and Nest route `/LOGIN` and `/Login/` to `/login`: a route
/// written without `case_sensitive` counts every spelling under one limit,
/// and `case_sensitive: true` keeps the old exact matching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_limit_every_letter_case_express_routes_unless_told_otherwise() {
    let upstream = Upstream::start().await;
    let routes = "  - { name: login, match: { methods: [POST], path: /login }, policy: three }
  - { name: api, match: { path_prefix: /api/ }, policy: three }
  - { name: strict, match: { path: /strict, case_sensitive: true }, policy: three }
";
    let sluice = Sidecar::start(&config(&upstream, "", "", routes));
    let table: &[(&str, u16)] = &[
        ("POST /LOGIN HTTP/1.1", 200),
        ("POST /Login HTTP/1.1", 200),
        ("POST /login HTTP/1.1", 200),
        // The fourth, in any spelling, is over the limit.
        ("POST /login HTTP/1.1", 429),
        ("POST /LOGIN HTTP/1.1", 429),
        ("POST /Login/ HTTP/1.1", 429),
        ("POST /lOgIn HTTP/1.1", 429),
        ("GET /API/x HTTP/1.1", 200),
        ("GET /api/y HTTP/1.1", 200),
        ("GET /Api HTTP/1.1", 200),
        ("GET /aPi/z/ HTTP/1.1", 429),
        ("GET /api HTTP/1.1", 429),
        // Segment-aware in any case: `/APIX` is another path.
        ("GET /APIX HTTP/1.1", 200),
        // `case_sensitive: true`: `/STRICT` is another path, counted under
        // the default.
        ("GET /strict HTTP/1.1", 200),
        ("GET /strict/ HTTP/1.1", 200),
        ("GET /strict HTTP/1.1", 200),
        ("GET /strict HTTP/1.1", 429),
        ("GET /STRICT HTTP/1.1", 200),
        ("GET /Strict HTTP/1.1", 200),
    ];
    let failures = mismatches(&sluice, table).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    let admitted = table.iter().filter(|(_, status)| *status == 200).count();
    assert_eq!(upstream.count(), admitted);

    // `sluice check` marks the exception, not the default.
    let (code, out, err) = support::sidecar::run_binary(
        &["check", "--config", &sluice.config_path().to_string_lossy()],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("exact /strict (exact case)"), "{out}");
    assert_eq!(out.matches("(exact case)").count(), 1, "{out}");
}

/// One catch-all route: the limit every request reaching the app is meant
/// to count against.
const CATCH_ALL: &str =
    "  - { name: everything, match: { path_prefix: / }, subject: client_ip, policy: three }\n";

/// `head` sent on its own connection: the status, the head and the body
/// its `Content-Length` announces.
async fn h1_exchange(sluice: &Sidecar, head: &str) -> (u16, String, Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("{head}\r\nHost: app.test\r\nContent-Length: 0\r\n\r\n");
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(sluice.addr())
            .await
            .expect("connect");
        stream.write_all(request.as_bytes()).await.expect("write");
        let (head, mut body) = support::read_head(&mut stream).await;
        let length = support::content_length(&head).unwrap_or_else(|| panic!("{head}"));
        while body.len() < length {
            let mut chunk = [0u8; 1024];
            let n = stream.read(&mut chunk).await.expect("read the body");
            assert!(n > 0, "the body was cut short: {head}");
            body.extend_from_slice(&chunk[..n]);
        }
        (support::parse_status(&head), head, body)
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("an answer in time")
}

/// An HTTP/2 request whose `:path` is exactly `*`, which hyper's client
/// cannot write; h2 sends the URI's parts as they are. With `authority`,
/// as browsers and curl send it: `:scheme`, `:authority` and `:path`, which
/// hyper hands sluice as a URI with a scheme, an authority and the path
/// `*`. Without, `:scheme` alone (h2 adds `http` to a request with no
/// authority) and a `Host` field.
async fn h2_asterisk(
    sluice: &Sidecar,
    method: http::Method,
    authority: bool,
    headers: &[(&str, &str)],
) -> (u16, http::HeaderMap, Vec<u8>) {
    let tcp = tokio::net::TcpStream::connect(sluice.addr())
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    let mut request = http::Request::builder().method(method.clone());
    request = if authority {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        parts.authority = Some(http::uri::Authority::from_static("app.test"));
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("*"));
        request.uri(http::Uri::from_parts(parts).expect("a URI"))
    } else {
        request.uri("*").header("host", "app.test")
    };
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request.body(()).expect("request");
    let exchange = async {
        let mut client = client.ready().await.expect("ready");
        let (response, _) = client.send_request(request, true).expect("send");
        let response = response
            .await
            .unwrap_or_else(|e| panic!("HTTP/2 {method} *: {e}"));
        let (head, mut body) = response.into_parts();
        let mut bytes = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("the body");
            let _ = body.flow_control().release_capacity(chunk.len());
            bytes.extend_from_slice(&chunk);
        }
        (head.status.as_u16(), head.headers, bytes)
    };
    tokio::time::timeout(Duration::from_secs(10), exchange)
        .await
        .expect("an answer in time")
}

async fn refused_as_asterisk(sluice: &Sidecar) -> f64 {
    let admin = sluice.admin_addr().expect("an admin listener");
    let text = support::ops::scrape(admin).await;
    let labels = [("reason", "asterisk_form")];
    support::ops::metric(&text, "sluice_requests_refused_total", &labels).unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asterisk_target_is_for_options_alone_on_http1_and_http2() {
    let upstream = Upstream::start().await;
    let admin = "  admin: 127.0.0.1:0\n";
    let sluice = Sidecar::start(&config(&upstream, admin, "", CATCH_ALL));
    let (status, _, http1_body) = h1_exchange(&sluice, "GET * HTTP/1.1").await;
    assert_eq!(status, 400);
    let problem: serde_json::Value = serde_json::from_slice(&http1_body).expect("a problem");
    assert_eq!(
        problem["detail"],
        "a request-target of * is for OPTIONS only"
    );
    for method in ["POST", "DELETE", "HEAD", "PUT"] {
        let response = send(&sluice, &format!("{method} * HTTP/1.1")).await;
        assert_eq!(response.status, 400, "{method} *: {}", response.head);
    }
    let mut refused = 5;

    // HTTP/2, as every client sends it (with `:authority`) and without:
    // the same 400 and the same problem, counted under the same reason.
    for authority in [true, false] {
        for method in ["GET", "POST", "DELETE", "PUT", "PATCH"] {
            let method = http::Method::from_bytes(method.as_bytes()).expect("a method");
            let (status, headers, body) =
                h2_asterisk(&sluice, method.clone(), authority, &[]).await;
            let what = format!("HTTP/2 {method} * (authority: {authority})");
            assert_eq!(status, 400, "{what}");
            assert_eq!(
                headers["content-type"], "application/problem+json",
                "{what}"
            );
            assert_eq!(body, http1_body, "{what}");
            refused += 1;
        }
    }
    assert_eq!(upstream.count(), 0, "{:?}", upstream.requests());
    assert_eq!(refused_as_asterisk(&sluice).await, f64::from(refused));

    // The catch-all still limits every path, `/*` included.
    for _ in 0..3 {
        assert_eq!(send(&sluice, "GET /* HTTP/1.1").await.status, 200);
    }
    assert_eq!(send(&sluice, "GET /* HTTP/1.1").await.status, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_asterisk_is_answered_by_sluice_and_never_forwarded() {
    let upstream = Upstream::start().await;
    let admin = "  admin: 127.0.0.1:0\n";
    let sluice = Sidecar::start(&config(&upstream, admin, "", CATCH_ALL));
    // More than the catch-all's three: none of them is counted, since
    // none reaches the app.
    for _ in 0..4 {
        let (status, head, body) = h1_exchange(&sluice, "OPTIONS * HTTP/1.1").await;
        assert_eq!(status, 200, "{head}");
        let allow = head.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("allow").then(|| value.trim())
        });
        assert_eq!(
            allow,
            Some("GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS"),
            "{head}"
        );
        assert_eq!(support::content_length(&head), Some(0), "{head}");
        assert!(body.is_empty());
    }
    for authority in [true, false] {
        let (status, headers, body) =
            h2_asterisk(&sluice, http::Method::OPTIONS, authority, &[]).await;
        let what = format!("HTTP/2 OPTIONS * (authority: {authority})");
        assert_eq!(status, 200, "{what}");
        assert_eq!(
            headers["allow"], "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS",
            "{what}"
        );
        assert_eq!(headers["content-length"], "0", "{what}");
        assert!(body.is_empty(), "{what}");
    }
    assert_eq!(upstream.count(), 0, "{:?}", upstream.requests());

    // Overridden to another method, it is that method's `*`: an app that
    // honours the override would run it as `/*`.
    let head = "OPTIONS * HTTP/1.1\r\nX-HTTP-Method-Override: POST";
    assert_eq!(h1_exchange(&sluice, head).await.0, 400);
    let overridden = [("x-http-method-override", "DELETE")];
    let (status, _, _) = h2_asterisk(&sluice, http::Method::OPTIONS, true, &overridden).await;
    assert_eq!(status, 400);
    assert_eq!(upstream.count(), 0, "{:?}", upstream.requests());
    assert_eq!(refused_as_asterisk(&sluice).await, 2.0);
    // The catch-all's quota is whole.
    for _ in 0..3 {
        assert_eq!(send(&sluice, "GET /x HTTP/1.1").await.status, 200);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn options_asterisk_reaches_the_app_under_a_route_written_for_it() {
    let upstream = Upstream::start().await;
    let server_route = "  - { name: server, match: { methods: [OPTIONS], path: \"*\" }, subject: client_ip, policy: three }\n";
    let routes = format!("{server_route}{CATCH_ALL}");
    let sluice = Sidecar::start(&config(&upstream, "", "", &routes));
    for n in 0..3 {
        let (status, head, _) = h1_exchange(&sluice, "OPTIONS * HTTP/1.1").await;
        assert_eq!(status, 200, "{head}");
        assert_eq!(upstream.count(), n + 1);
    }
    assert_eq!(upstream.last().expect("forwarded").path, "*");
    // Counted under its own route: the fourth is over its limit of three,
    // the catch-all untouched.
    assert_eq!(h1_exchange(&sluice, "OPTIONS * HTTP/1.1").await.0, 429);
    let (status, _, _) = h2_asterisk(&sluice, http::Method::OPTIONS, true, &[]).await;
    assert_eq!(status, 429);
    // Any other method on `*` is still refused.
    assert_eq!(h1_exchange(&sluice, "GET * HTTP/1.1").await.0, 400);
    assert_eq!(send(&sluice, "GET /x HTTP/1.1").await.status, 200);
    assert_eq!(upstream.count(), 4);
}

const AUTHORIZATION_ROUTE: &str = "  - { name: api, match: { path_prefix: /api }, subject: header:Authorization, policy: three }\n";

/// The status of `GET path` with `Authorization: value`, and what the app
/// said it read (`X-App-User`, from the Werkzeug app).
async fn basic(sluice: &Sidecar, path: &str, value: &str) -> (u16, Option<String>) {
    let reply = send(
        sluice,
        &format!("GET {path} HTTP/1.1\r\nAuthorization: {value}"),
    )
    .await;
    let user = reply.head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("x-app-user")
            .then(|| value.trim().to_owned())
    });
    (reply.status, user)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_basic_credential_is_counted_by_what_the_app_decodes_in_any_spelling() {
    let app = support::werkzeug::Werkzeug::start();
    let yaml = format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
policies:
  three: {{ algorithm: sliding-log, limit: 3, window: 1h }}
  plenty: {{ algorithm: sliding-log, limit: 100000, window: 1h }}
routes:
{AUTHORIZATION_ROUTE}default: {{ policy: plenty, subject: client_ip }}
",
        app.url()
    );
    let sluice = Sidecar::start(&yaml);
    // `alice:s3cret1` needs padding: five spellings of it.
    let needs_padding = [
        "Basic YWxpY2U6czNjcmV0MQ==",
        "Basic YWxpY2U6czNjcmV0MQ====",
        "Basic YWxp*Y2U6czNjcmV0MQ==",
        "basic  YWxpY2U6czNjcmV0MQ==",
        "Basic YWxpY2U6czNjcmV0MQ",
    ];
    let no_padding = [
        "Basic YWxpY2U6czNjcmV0",
        "Basic YWxpY2U6czNjcmV0==",
        "Basic YWxp*Y2U6czNjcmV0",
        "basic  YWxpY2U6czNjcmV0",
    ];
    // Werkzeug, unlimited under the default route, reads every spelling
    // as the one credential (but the unpadded one, which it refuses and
    // Node's decoder reads as `alice:s3cret1`).
    for (spellings, credential) in [
        (&needs_padding[..4], "alice:s3cret1"),
        (&no_padding[..], "alice:s3cret"),
    ] {
        for value in spellings {
            let read = basic(&sluice, "/plain", value).await;
            assert_eq!(read, (200, Some(credential.to_owned())), "{value:?}");
        }
    }
    assert_eq!(
        basic(&sluice, "/plain", needs_padding[4]).await,
        (200, Some("-".to_owned()))
    );

    // Under a limit of 3 an hour, three spellings spend it, and the 4th
    // request is refused whatever its spelling.
    let mut failures = Vec::new();
    for (spellings, credential) in [
        (&needs_padding[..], "alice:s3cret1"),
        (&no_padding[..], "alice:s3cret"),
    ] {
        for value in &spellings[..3] {
            let read = basic(&sluice, "/api/x", value).await;
            if read != (200, Some(credential.to_owned())) {
                failures.push(format!(
                    "{value:?}: want 200 read as {credential}, got {read:?}"
                ));
            }
        }
        for value in spellings {
            let status = basic(&sluice, "/api/x", value).await.0;
            if status != 429 {
                failures.push(format!("{value:?} after three: want 429, got {status}"));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undecodable_basic_credentials_share_one_bucket_per_route() {
    let upstream = Upstream::start().await;
    let admin = "  admin: 127.0.0.1:0\n";
    let sluice = Sidecar::start(&config(&upstream, admin, "", AUTHORIZATION_ROUTE));
    // Nothing to decode, data after padding (Node stops at the `=`, Python
    // reads on), the URL-safe alphabet (Node reads `-`, Python skips it).
    let undecodable = [
        "Basic !!!",
        "Basic ====",
        "Basic YWxp-Y2U6czNjcmV0",
        "Basic YQ==YQ==",
        "Basic *",
        "basic  =YWxpY2U6czNjcmV0",
    ];
    let mut got = Vec::new();
    for value in undecodable {
        got.push(basic(&sluice, "/api/x", value).await.0);
    }
    assert_eq!(got, [200, 200, 200, 429, 429, 429], "{undecodable:?}");
    // A credential that decodes has its own bucket.
    assert_eq!(
        basic(&sluice, "/api/x", "Basic YWxpY2U6czNjcmV0").await.0,
        200
    );
    assert_eq!(upstream.count(), 4);

    let text = support::ops::scrape(sluice.admin_addr().expect("an admin listener")).await;
    let labels = [("route", "api")];
    assert_eq!(
        support::ops::metric(&text, "sluice_undecodable_credentials_total", &labels),
        Some(6.0)
    );
}
