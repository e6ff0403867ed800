//! What sluice limits is what the app sees: through the built binary, every
//! way of writing a request that an app would read as a limited one meets
//! that limit, and the app receives the request in the form that was
//! matched. Requests are written as raw bytes, so each is sent exactly as
//! the table says.

use crate::support::client::{request_h2, RawResponse};
use crate::support::{raw_exchange, Sidecar, Upstream};
use bytes::Bytes;
use http::{Method, StatusCode};

/// The values of `name` in a raw response head.
fn raw_header(head: &str, name: &str) -> Vec<String> {
    head.lines()
        .filter_map(|line| line.split_once(':'))
        .filter(|(n, _)| n.trim().eq_ignore_ascii_case(name))
        .map(|(_, v)| v.trim().to_owned())
        .collect()
}

/// The policy a response's `RateLimit-Policy` names: each route below has
/// its own, so this says which route the request matched.
fn policy_of(response: &RawResponse) -> String {
    let field = raw_header(&response.head, "ratelimit-policy");
    let first = field.first().unwrap_or_else(|| {
        panic!("no RateLimit-Policy in {}", response.head);
    });
    first
        .split('"')
        .nth(1)
        .unwrap_or_else(|| panic!("unquoted policy name: {first}"))
        .to_owned()
}

async fn send(sluice: &Sidecar, head: &str) -> RawResponse {
    let bytes = format!("{head}\r\nHost: app.test\r\nContent-Length: 0\r\n\r\n");
    raw_exchange(sluice.addr(), bytes.as_bytes()).await
}

/// Every route is generous and named after its own policy.
fn table_config(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
policies:
  p_login: {{ algorithm: sliding-log, limit: 10000, window: 1h }}
  p_exact: {{ algorithm: sliding-log, limit: 10000, window: 1h }}
  p_users: {{ algorithm: sliding-log, limit: 10000, window: 1h }}
  p_api: {{ algorithm: sliding-log, limit: 10000, window: 1h }}
  p_other: {{ algorithm: sliding-log, limit: 10000, window: 1h }}
routes:
  - {{ name: login, match: {{ path: /login }}, policy: p_login }}
  - {{ name: exact, match: {{ path: /Exact, case_sensitive: true }}, policy: p_exact }}
  - {{ name: users, match: {{ path: \"/users/{{id}}\" }}, policy: p_users }}
  - {{ name: api, match: {{ path_prefix: /api/ }}, policy: p_api }}
default: {{ policy: p_other, subject: client_ip }}
",
        upstream.url()
    )
}

enum Want {
    /// Matched under this policy and forwarded with this path and query.
    Routed(&'static str, &'static str),
    /// Refused by sluice; the upstream never hears of it.
    Refused,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_paths_match_their_normal_form_and_are_forwarded_in_it() {
    use Want::{Refused, Routed};
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&table_config(&upstream));

    let table: &[(&str, Want)] = &[
        ("/login", Routed("p_login", "/login")),
        ("/login/", Routed("p_login", "/login/")),
        ("//login", Routed("p_login", "/login")),
        ("/./login", Routed("p_login", "/login")),
        // Any letter case by default, forwarded as written.
        ("/LOGIN", Routed("p_login", "/LOGIN")),
        ("/%6cogin", Routed("p_login", "/login")),
        ("/%6Cogin/", Routed("p_login", "/login/")),
        (
            "/login;jsessionid=abc",
            Routed("p_login", "/login;jsessionid=abc"),
        ),
        ("/x/../login", Routed("p_login", "/login")),
        ("/x/%2e%2E/login", Routed("p_login", "/login")),
        ("/x;a=b/../login", Routed("p_login", "/login")),
        ("/login?x=1&y=%2F", Routed("p_login", "/login?x=1&y=%2F")),
        ("/Exact/", Routed("p_exact", "/Exact/")),
        ("/exact", Routed("p_other", "/exact")),
        ("/users/42", Routed("p_users", "/users/42")),
        ("/users//42/", Routed("p_users", "/users/42/")),
        ("/users/42/x", Routed("p_other", "/users/42/x")),
        ("/api", Routed("p_api", "/api")),
        ("/api/v1/../v2/items", Routed("p_api", "/api/v2/items")),
        ("/apix", Routed("p_other", "/apix")),
        ("/caf%c3%a9", Routed("p_other", "/caf%C3%A9")),
        ("/a%40b", Routed("p_other", "/a%40b")),
        ("/login%2f", Refused),
        ("/login%2F", Refused),
        ("/a%5cb", Refused),
        ("/login%00", Refused),
        ("/login%0d%0a", Refused),
        ("/../login", Refused),
        ("/x/../../login", Refused),
        ("/..;/login", Refused),
        ("/;x/login", Refused),
        ("/login%zz", Refused),
        ("/login%", Refused),
    ];

    let mut failures = Vec::new();
    for (raw, want) in table {
        let before = upstream.count();
        let response = send(&sluice, &format!("GET {raw} HTTP/1.1")).await;
        let outcome = match want {
            Routed(policy, forwarded) => {
                let seen = upstream.last().map(|r| r.path);
                let ok = response.status == 200
                    && policy_of(&response) == *policy
                    && upstream.count() == before + 1
                    && seen.as_deref() == Some(*forwarded);
                (!ok).then(|| {
                    format!(
                        "{raw}: want {policy} {forwarded}, got {} {:?} upstream {:?}",
                        response.status,
                        raw_header(&response.head, "ratelimit-policy"),
                        seen
                    )
                })
            }
            Refused => {
                let ok = response.status == 400 && upstream.count() == before;
                (!ok).then(|| {
                    format!(
                        "{raw}: want 400 and nothing forwarded, got {} (upstream {} → {})",
                        response.status,
                        before,
                        upstream.count()
                    )
                })
            }
        };
        failures.extend(outcome);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `POST /login` allows 2 an hour per client IP; everything else is free.
fn login_config(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
policies:
  two: {{ algorithm: sliding-log, limit: 2, window: 1h }}
routes:
  - {{ name: login, match: {{ methods: [POST], path: /login, case_sensitive: false }}, subject: client_ip, policy: two }}
  - {{ name: get, match: {{ methods: [GET], path: /get }}, subject: client_ip, policy: two }}
  - {{ name: free, match: {{ path_prefix: / }}, policy: none }}
",
        upstream.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spent_login_limit_holds_however_the_request_is_written() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&login_config(&upstream));
    for _ in 0..2 {
        assert_eq!(send(&sluice, "POST /login HTTP/1.1").await.status, 200);
    }
    assert_eq!(send(&sluice, "POST /login HTTP/1.1").await.status, 429);
    let spent = upstream.count();

    // Each of these reached the app as a login before paths, methods and
    // overrides were read the way the app reads them.
    let variants: &[(&str, u16)] = &[
        ("POST /login/ HTTP/1.1", 429),
        ("POST //login HTTP/1.1", 429),
        ("POST /./login HTTP/1.1", 429),
        ("POST /LOGIN HTTP/1.1", 429),
        ("POST /%6cogin HTTP/1.1", 429),
        ("POST /login;x=1 HTTP/1.1", 429),
        ("POST /x/../login HTTP/1.1", 429),
        ("POST /login?x=1 HTTP/1.1", 429),
        ("POST /login%2f HTTP/1.1", 400),
        ("POST /login%00 HTTP/1.1", 400),
        ("post /login HTTP/1.1", 400),
        ("PoSt /login HTTP/1.1", 400),
        ("GET /login HTTP/1.1\r\nX-HTTP-Method-Override: POST", 429),
        ("GET /login HTTP/1.1\r\nX-HTTP-Method: POST", 429),
        ("GET /login HTTP/1.1\r\nX-Method-Override: post", 429),
        ("GET /login?_method=POST HTTP/1.1", 429),
        ("PUT //LOGIN/ HTTP/1.1\r\nX-HTTP-Method-Override: POST", 429),
        (
            "GET /login HTTP/1.1\r\nX-HTTP-Method-Override: GET\r\nX-HTTP-Method-Override: POST",
            400,
        ),
    ];
    let mut failures = Vec::new();
    for (head, want) in variants {
        let got = send(&sluice, head).await.status;
        if got != *want {
            failures.push(format!("{head:?}: want {want}, got {got}"));
        }
    }
    for (method, path) in [("POST", "//login"), ("post", "/login"), ("PoSt", "/LOGIN")] {
        let method = Method::from_bytes(method.as_bytes()).expect("a method token");
        let (status, _, _) = request_h2(sluice.addr(), method.clone(), path, Bytes::new()).await;
        let want = if method == Method::POST {
            StatusCode::TOO_MANY_REQUESTS
        } else {
            StatusCode::BAD_REQUEST
        };
        if status != want {
            failures.push(format!("HTTP/2 {method} {path}: want {want}, got {status}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(
        upstream.count(),
        spent,
        "a variant of the spent login reached the app"
    );

    // A rewrite header naming the login is not passed to an app that might
    // route by it; the request itself is the free one it says it is.
    let response = send(
        &sluice,
        "POST /free HTTP/1.1\r\nX-Original-URL: /login\r\nX-Rewrite-URL: /login",
    )
    .await;
    assert_eq!(response.status, 200);
    let seen = upstream.last().expect("the free request");
    assert_eq!(seen.path, "/free");
    assert_eq!(seen.header("x-original-url"), None);
    assert_eq!(seen.header("x-rewrite-url"), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_counts_against_a_get_route() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&login_config(&upstream));
    assert_eq!(send(&sluice, "GET /get HTTP/1.1").await.status, 200);
    assert_eq!(send(&sluice, "HEAD /get HTTP/1.1").await.status, 200);
    assert_eq!(send(&sluice, "GET /get HTTP/1.1").await.status, 429);
    assert_eq!(send(&sluice, "HEAD /get HTTP/1.1").await.status, 429);
    assert_eq!(upstream.count(), 2);
    let methods: Vec<String> = upstream
        .requests()
        .iter()
        .map(|r| r.method.to_string())
        .collect();
    assert_eq!(methods, ["GET", "HEAD"], "HEAD is forwarded as HEAD");
}

/// `/api` by API key (2 an hour); `/ip` by client IP behind a trusted
/// proxy on loopback.
fn identity_config(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
identity:
  trusted_proxies: [127.0.0.0/8]
policies:
  two: {{ algorithm: sliding-log, limit: 2, window: 1h }}
routes:
  - {{ name: api, match: {{ path_prefix: /api }}, subject: header:X-API-Key, policy: two }}
  - {{ name: ip, match: {{ path_prefix: /ip }}, subject: client_ip, policy: two }}
",
        upstream.url()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_identity_header_sent_twice_is_refused_before_anything_is_charged() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&identity_config(&upstream));
    for _ in 0..2 {
        assert_eq!(
            send(&sluice, "GET /api/x HTTP/1.1\r\nX-API-Key: spent")
                .await
                .status,
            200
        );
    }
    assert_eq!(
        send(&sluice, "GET /api/x HTTP/1.1\r\nX-API-Key: spent")
            .await
            .status,
        429
    );
    let before = upstream.count();
    for head in [
        "GET /api/x HTTP/1.1\r\nX-API-Key: fresh-1\r\nX-API-Key: spent",
        "GET /api/x HTTP/1.1\r\nX-API-Key: spent\r\nX-API-Key: fresh-2",
        "GET /api/x HTTP/1.1\r\nx-api-key: fresh-3\r\nX-Api-Key: fresh-4",
        // Identity headers are refused twice on every route, not only the
        // ones that read them.
        "GET /ip HTTP/1.1\r\nX-API-Key: a\r\nX-API-Key: b",
    ] {
        assert_eq!(send(&sluice, head).await.status, 400, "{head:?}");
    }
    assert_eq!(
        upstream.count(),
        before,
        "a duplicated identity reached the app"
    );
    // The fresh keys above were not charged: each still has its 2.
    for _ in 0..2 {
        assert_eq!(
            send(&sluice, "GET /api/x HTTP/1.1\r\nX-API-Key: fresh-1")
                .await
                .status,
            200
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_identity_is_the_shared_bucket_of_absent_ones() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&identity_config(&upstream));
    assert_eq!(
        send(&sluice, "GET /api/x HTTP/1.1\r\nX-API-Key:")
            .await
            .status,
        200
    );
    assert_eq!(
        send(&sluice, "GET /api/x HTTP/1.1\r\nX-API-Key:   ")
            .await
            .status,
        200
    );
    assert_eq!(send(&sluice, "GET /api/x HTTP/1.1").await.status, 429);
    // A real key has a bucket of its own.
    assert_eq!(
        send(&sluice, "GET /api/x HTTP/1.1\r\nX-API-Key: k")
            .await
            .status,
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_forwarded_for_from_a_trusted_proxy_is_refused() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&identity_config(&upstream));
    for chain in [
        "not-an-address",
        "203.0.113.9, unknown",
        "203.0.113.9, 10.0.0.1.5",
    ] {
        let head = format!("GET /ip HTTP/1.1\r\nX-Forwarded-For: {chain}");
        assert_eq!(send(&sluice, &head).await.status, 400, "{chain}");
    }
    assert_eq!(upstream.count(), 0);
    // Junk left of the client is the client's own claim, never read.
    let response = send(
        &sluice,
        "GET /ip HTTP/1.1\r\nX-Forwarded-For: junk, 203.0.113.9",
    )
    .await;
    assert_eq!(response.status, 200);
    let seen = upstream.last().expect("forwarded");
    assert_eq!(
        seen.header("x-forwarded-for"),
        Some("junk, 203.0.113.9, 127.0.0.1")
    );
}

fn upgrade_config(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
policies:
  lots: {{ algorithm: sliding-log, limit: 10000, window: 1h }}
routes:
  - {{ name: foo, match: {{ path: /foo }}, policy: lots, upgrades: [foo] }}
  - {{ name: none, match: {{ path: /plain }}, policy: lots, upgrades: [] }}
  - {{ name: rest, match: {{ path_prefix: / }}, policy: lots }}
",
        upstream.url()
    )
}

const H2C: &str = "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_upgrades_reach_the_app_and_h2c_never_does() {
    let upstream = Upstream::start().await;
    upstream.answer_any_upgrade();
    let sluice = Sidecar::start(&upgrade_config(&upstream));

    // The app would switch to h2c if it were asked: this is what must
    // never reach it.
    let direct = raw_exchange(
        upstream.addr(),
        format!("GET /hello HTTP/1.1\r\nHost: app.test\r\n{H2C}\r\n\r\n").as_bytes(),
    )
    .await;
    assert_eq!(direct.status, 101, "{}", direct.head);
    let asked_directly = upstream.count();

    for (path, upgrade) in [
        ("/hello", H2C.to_owned()),
        (
            "/hello",
            "Connection: upgrade\r\nUpgrade: foo/1.0".to_owned(),
        ),
        ("/foo", H2C.to_owned()),
        (
            "/plain",
            "Connection: upgrade\r\nUpgrade: websocket".to_owned(),
        ),
    ] {
        let response = send(&sluice, &format!("GET {path} HTTP/1.1\r\n{upgrade}")).await;
        assert_eq!(
            response.status, 200,
            "{path} {upgrade:?}: {}",
            response.head
        );
        let seen = upstream.last().expect("forwarded as a plain request");
        for name in ["upgrade", "http2-settings"] {
            assert_eq!(
                seen.header(name),
                None,
                "{path} {upgrade:?}: {name} forwarded"
            );
        }
        assert!(
            !seen
                .header_all("connection")
                .iter()
                .any(|v| v.to_ascii_lowercase().contains("upgrade")),
            "{path} {upgrade:?}: Connection: upgrade forwarded"
        );
    }
    assert_eq!(upstream.count(), asked_directly + 4);

    // What a route allows passes, by protocol name, any version.
    let response = send(
        &sluice,
        "GET /foo HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: foo/1.0",
    )
    .await;
    assert_eq!(response.status, 101, "{}", response.head);
    assert_eq!(raw_header(&response.head, "upgrade"), ["foo/1.0"]);
    let response = send(
        &sluice,
        "GET /ws HTTP/1.1\r\nConnection: upgrade\r\nUpgrade: websocket",
    )
    .await;
    assert_eq!(response.status, 101, "{}", response.head);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_settings_change_what_is_matched_and_forwarded() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  paths: {{ merge_slashes: false, escaped_slashes: decode, path_parameters: strip }}
upstream:
  url: {}
policies:
  p_login: {{ algorithm: sliding-log, limit: 10000, window: 1h }}
  p_other: {{ algorithm: sliding-log, limit: 10000, window: 1h }}
routes:
  - {{ name: login, match: {{ path: /login }}, policy: p_login }}
default: {{ policy: p_other }}
",
        upstream.url()
    );
    let sluice = Sidecar::start(&yaml);
    for (raw, policy, forwarded) in [
        ("/login%2F", "p_login", "/login/"),
        ("/x%2F..%2Flogin", "p_login", "/login"),
        ("/login;jsessionid=1", "p_login", "/login"),
        ("//login", "p_other", "//login"),
    ] {
        let response = send(&sluice, &format!("GET {raw} HTTP/1.1")).await;
        assert_eq!(response.status, 200, "{raw}");
        assert_eq!(policy_of(&response), policy, "{raw}");
        assert_eq!(upstream.last().expect("forwarded").path, forwarded, "{raw}");
    }
}
