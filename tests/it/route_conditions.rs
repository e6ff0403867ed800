//! Routes chosen by more than the path: the host a request names, a
//! header's value or presence, a query parameter as the app decodes it.
//! Each route has its own policy with its own small limit, so the
//! `RateLimit` field of each answer says which route's limit was charged,
//! and how much of it is left.

use crate::support::client::{raw_exchange, request_h2};
use crate::support::sidecar::{run_binary, write_config};
use crate::support::{get, header, parse_ratelimit, Sidecar, Upstream};
use bytes::Bytes;
use http::{Method, StatusCode};

fn config(upstream: &Upstream) -> String {
    format!(
        r#"version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {url}
policies:
  p_api: {{ algorithm: fixed-window, limit: 2, window: 1h }}
  p_tenants: {{ algorithm: fixed-window, limit: 3, window: 1h }}
  p_gold: {{ algorithm: fixed-window, limit: 4, window: 1h }}
  p_keyed: {{ algorithm: fixed-window, limit: 5, window: 1h }}
  p_v2: {{ algorithm: fixed-window, limit: 10, window: 1h }}
  p_debug: {{ algorithm: fixed-window, limit: 7, window: 1h }}
  p_local: {{ algorithm: fixed-window, limit: 8, window: 1h }}
  p_default: {{ algorithm: fixed-window, limit: 50, window: 1h }}
routes:
  - {{ name: api, match: {{ path_prefix: /a, hosts: [api.example.com] }}, policy: p_api }}
  - {{ name: tenants, match: {{ path_prefix: /a, hosts: ["*.example.com"] }}, policy: p_tenants }}
  - {{ name: gold, match: {{ path_prefix: /h, headers: {{ X-Tenant: gold }} }}, policy: p_gold }}
  - {{ name: keyed, match: {{ path_prefix: /h, headers: {{ X-Key: {{ present: true }} }} }}, policy: p_keyed }}
  - {{ name: v2, match: {{ path_prefix: /q, query: {{ version: "2" }} }}, policy: p_v2 }}
  - {{ name: debug, match: {{ path_prefix: /q, query: {{ debug: {{ present: true }} }} }}, policy: p_debug }}
  - {{ name: local, match: {{ path: /local, hosts: ["127.0.0.1"] }}, policy: p_local }}
  - {{ name: filler1, match: {{ path: /filler1 }}, policy: none }}
  - {{ name: filler2, match: {{ path: /filler2 }}, policy: none }}
default:
  policy: p_default
"#,
        url = upstream.url(),
    )
}

/// The policy that counted a GET of `path` with `headers`, and what it
/// has left (`r`); panics on anything but 200.
async fn charged(sluice: &Sidecar, path: &str, headers: &[(&str, &str)]) -> (String, u64) {
    let (status, h, body) = get(sluice.addr(), path, headers).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{path} {headers:?}: {}",
        String::from_utf8_lossy(&body)
    );
    let item = header(&h, "ratelimit")
        .and_then(parse_ratelimit)
        .unwrap_or_else(|| panic!("{path} {headers:?}: no RateLimit"));
    let left = item.param("r").expect("r");
    (item.name, left)
}

/// `sluice_requests_refused_total{reason}`.
async fn refused(sluice: &Sidecar, reason: &str) -> f64 {
    let admin = sluice.admin_addr().expect("an admin listener");
    let text = crate::support::ops::scrape(admin).await;
    crate::support::ops::metric(
        &text,
        "sluice_requests_refused_total",
        &[("reason", reason)],
    )
    .unwrap_or(0.0)
}

fn is(policy: &str, left: u64) -> (String, u64) {
    (policy.to_owned(), left)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_chooses_the_route_without_its_port_in_any_case() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    let host = |h: &'static str| [("host", h)];
    assert_eq!(
        charged(&sluice, "/a", &host("api.example.com")).await,
        is("p_api", 1)
    );
    assert_eq!(
        charged(&sluice, "/a/x", &host("API.Example.COM:8443")).await,
        is("p_api", 0)
    );
    // A trailing dot names the same host: the third request is over
    // `api`'s limit of 2, not counted elsewhere.
    let (status, h, _) = get(sluice.addr(), "/a", &host("api.example.com.")).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&h, "ratelimit")
            .and_then(parse_ratelimit)
            .map(|r| r.name),
        Some("p_api".to_owned())
    );
    // One or more labels below example.com; never example.com itself.
    assert_eq!(
        charged(&sluice, "/a", &host("eu.example.com")).await,
        is("p_tenants", 2)
    );
    assert_eq!(
        charged(&sluice, "/a", &host("a.b.EXAMPLE.com:80")).await,
        is("p_tenants", 1)
    );
    assert_eq!(
        charged(&sluice, "/a", &host("example.com")).await,
        is("p_default", 49)
    );
    assert_eq!(
        charged(&sluice, "/a", &host("api.example.com.evil.org")).await,
        is("p_default", 48)
    );
    // The host is matched on the path's routes only.
    assert_eq!(
        charged(&sluice, "/other", &host("api.example.com")).await,
        is("p_default", 47)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absolute_target_naming_another_host_than_host_is_refused() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    // The target's authority and Host agree (port and case aside): routed
    // by it.
    let same = raw_exchange(
        sluice.addr(),
        b"GET http://api.example.com/a HTTP/1.1\r\nHost: API.example.com:80\r\n\r\n",
    )
    .await;
    assert_eq!(same.status, 200, "{}", same.head);
    assert!(
        same.head.to_ascii_lowercase().contains("\"p_api\""),
        "{}",
        same.head
    );
    // They disagree: the app may read either, so neither chooses a route.
    let forwarded = upstream.count();
    let other = raw_exchange(
        sluice.addr(),
        b"GET http://api.example.com/a HTTP/1.1\r\nHost: eu.example.com\r\n\r\n",
    )
    .await;
    assert_eq!(other.status, 400, "{}", other.head);
    assert_eq!(upstream.count(), forwarded, "nothing forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_authority_chooses_the_route() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    // `:authority` is 127.0.0.1:PORT, with no Host field.
    let (status, h, _) = request_h2(sluice.addr(), Method::GET, "/local", Bytes::new()).await;
    assert_eq!(status, StatusCode::OK);
    let item = header(&h, "ratelimit")
        .and_then(parse_ratelimit)
        .expect("RateLimit");
    assert_eq!((item.name.as_str(), item.param("r")), ("p_local", Some(7)));
    // And HTTP/1's `Host: 127.0.0.1:PORT` the same.
    assert_eq!(charged(&sluice, "/local", &[]).await, is("p_local", 6));
    let (status, h, _) = request_h2(sluice.addr(), Method::GET, "/a", Bytes::new()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        header(&h, "ratelimit")
            .and_then(parse_ratelimit)
            .map(|r| r.name),
        Some("p_default".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_chooses_the_route_by_its_exact_value_or_its_presence() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    assert_eq!(
        charged(&sluice, "/h", &[("x-tenant", "gold")]).await,
        is("p_gold", 3)
    );
    // Values are case-sensitive; any name case is the same header.
    assert_eq!(
        charged(&sluice, "/h", &[("X-TENANT", "gold")]).await,
        is("p_gold", 2)
    );
    assert_eq!(
        charged(&sluice, "/h", &[("x-tenant", "Gold")]).await,
        is("p_default", 49)
    );
    // Present with any value, an empty one too.
    assert_eq!(
        charged(&sluice, "/h", &[("x-key", "")]).await,
        is("p_keyed", 4)
    );
    assert_eq!(
        charged(
            &sluice,
            "/h/deeper",
            &[("x-tenant", "silver"), ("x-key", "k1")]
        )
        .await,
        is("p_keyed", 3)
    );
    assert_eq!(charged(&sluice, "/h", &[]).await, is("p_default", 48));
    // Named by `Connection`, a header is removed before the app sees it:
    // no route matches it either.
    assert_eq!(
        charged(&sluice, "/h", &[("x-key", "k2"), ("connection", "X-Key")]).await,
        is("p_default", 47)
    );

    // Sent twice, whatever the values: refused, nothing forwarded, nothing
    // charged.
    let forwarded = upstream.count();
    for pairs in [
        [("x-tenant", "gold"), ("x-tenant", "gold")],
        [("x-tenant", "silver"), ("x-tenant", "gold")],
        [("x-key", "a"), ("X-Key", "b")],
    ] {
        let (status, _, body) = get(sluice.addr(), "/h", &pairs).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{pairs:?}");
        assert!(
            String::from_utf8_lossy(&body).contains("routes are chosen by"),
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
    assert_eq!(upstream.count(), forwarded);
    assert_eq!(refused(&sluice, "duplicate_route_header").await, 3.0);
    assert_eq!(
        charged(&sluice, "/h", &[("x-tenant", "gold")]).await,
        is("p_gold", 1)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_parameter_chooses_the_route_as_the_app_decodes_it() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(&upstream));
    let mut left = 10;
    for path in [
        "/q?version=2",
        // Percent-encoded names and values, `;` as a separator, a repeat
        // of the same value, a name in PHP's spelling.
        "/q?%76ersion=2",
        "/q?version=%32",
        "/q?a=1;version=2",
        "/q?version=2&version=%32",
        "/q?+version=2",
        // Names in any case, as ASP.NET reads them.
        "/q?VERSION=2",
    ] {
        left -= 1;
        assert_eq!(
            charged(&sluice, path, &[]).await,
            is("p_v2", left),
            "{path}"
        );
    }
    assert_eq!(charged(&sluice, "/q?debug", &[]).await, is("p_debug", 6));
    assert_eq!(
        charged(&sluice, "/q?version=3&debug=", &[]).await,
        is("p_debug", 5)
    );
    let mut left = 50;
    for path in ["/q?version=2+", "/q?version=two", "/q?versions=2", "/q"] {
        left -= 1;
        assert_eq!(
            charged(&sluice, path, &[]).await,
            is("p_default", left),
            "{path}"
        );
    }
    // Two different values: apps disagree on which they read, so the
    // request is refused rather than routed by either.
    let forwarded = upstream.count();
    for path in [
        "/q?version=1&version=2",
        "/q?version=2&%76ersion=1",
        "/q?version=2;version",
        "/q?version=2&Version=1",
        "/other?version=1&version=2",
    ] {
        let (status, _, body) = get(sluice.addr(), path, &[]).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert!(
            String::from_utf8_lossy(&body).contains("query parameter"),
            "{}",
            String::from_utf8_lossy(&body)
        );
    }
    assert_eq!(upstream.count(), forwarded);
    assert_eq!(refused(&sluice, "duplicate_route_parameter").await, 5.0);
}

/// `sluice check` shows each route's conditions beside its path, and
/// `--explain` names the condition that passed over a route (never a
/// value the request sent).
#[tokio::test]
async fn check_shows_the_conditions_and_explain_why_a_route_was_passed_over() {
    let upstream = Upstream::start().await;
    let (dir, path) = write_config(&config(&upstream));
    let path = path.to_str().expect("a UTF-8 path");
    let (code, table, stderr) = run_binary(&["check", "--config", path], &[]);
    assert_eq!(code, 0, "{stderr}");
    for shown in [
        "prefix /a [host api.example.com]",
        "prefix /a [host *.example.com]",
        "prefix /h [x-tenant: gold]",
        "prefix /h [x-key present]",
        "prefix /q [?version=2]",
        "prefix /q [?debug present]",
    ] {
        assert!(table.contains(shown), "{shown} in\n{table}");
    }
    let explain = |described: serde_json::Value| {
        let file = dir.path().join("request.json");
        std::fs::write(&file, described.to_string()).expect("write the request");
        let file = file.to_str().expect("a UTF-8 path");
        let (code, stdout, stderr) =
            run_binary(&["check", "--config", path, "--explain", file], &[]);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<serde_json::Value>(&stdout).expect("JSON on stdout")
    };
    let explained = explain(serde_json::json!({
        "method": "GET", "path": "/h", "headers": { "X-Tenant": "silver-secret" }
    }));
    assert_eq!(explained["routes"][0]["route"], "default", "{explained}");
    assert_eq!(
        explained["passed_over"],
        serde_json::json!([
            { "route": "gold", "unmet": "header x-tenant" },
            { "route": "keyed", "unmet": "header x-key" },
        ]),
        "{explained}"
    );
    assert!(!explained.to_string().contains("silver-secret"));
    let explained = explain(serde_json::json!({
        "method": "GET", "path": "http://eu.example.com/a?debug"
    }));
    assert_eq!(explained["routes"][0]["route"], "tenants", "{explained}");
    assert_eq!(
        explained["passed_over"],
        serde_json::json!([{ "route": "api", "unmet": "host" }]),
        "{explained}"
    );
    let explained = explain(serde_json::json!({
        "method": "GET", "path": "/q?version=1&version=2"
    }));
    assert_eq!(explained["answer"]["status"], 400, "{explained}");
    assert_eq!(
        explained["refused"]["label"], "duplicate_route_parameter",
        "{explained}"
    );
}
