//! `POST /explain` and `sluice check --explain` through the built binary,
//! on the memory store and on a real Redis: an explanation reads the state
//! without charging it, says what a request would be answered, explains
//! refusals, and never shows a raw identity.

use crate::support;
use std::net::SocketAddr;
use std::time::Duration;

use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{redis_yaml, start_ready};
use crate::support::sidecar::{run_binary, write_config};
use crate::support::tokens::{Issuer, Key, Spec};
use crate::support::{clear_of_window_edge, get, request, Sidecar, Upstream};
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::{json, Value};

const HOUR: Duration = Duration::from_secs(3600);
/// Enough for any of these tests to finish inside one aligned window.
const EDGE_MARGIN: Duration = Duration::from_secs(20);
const KEY: &str = "0123456789abcdef0123456789abcdef";
/// A client address and an API key no output may contain.
const PEER: &str = "10.0.0.7";
const API_KEY: &str = "k-7f3a9c-secret";
/// `server.explain.token` of every sidecar here: explain is off without one.
const TOKEN: &str = "explain-token-5b1e0c9d2a";

/// `yaml` (with an admin listener) with `POST /explain` turned on.
fn with_explain(yaml: &str) -> String {
    let on = format!("  admin: 127.0.0.1:0\n  explain: {{ token: {TOKEN} }}\n");
    assert!(yaml.contains("  admin: 127.0.0.1:0\n"), "{yaml}");
    yaml.replacen("  admin: 127.0.0.1:0\n", &on, 1)
}

const POLICIES: &str = "  login: { algorithm: fixed-window, limit: 5, window: 1h }
  keyed: { algorithm: token-bucket, capacity: 10, refill_tokens: 1, refill_every: 1s }
";
/// `/login` by client address; `/api` by API key, one shared bucket
/// without it.
const ROUTES: &str =
    "  - { name: login, match: { path_prefix: /login }, subject: client_ip, policy: login }
  - { name: api, match: { path_prefix: /api }, subject: \"header:x-api-key\", policy: keyed }
";

fn memory_yaml(upstream: &Upstream) -> String {
    with_explain(&memory_off_yaml(upstream))
}

/// [`memory_yaml`] without `server.explain`.
fn memory_off_yaml(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {}
store:
  kind: memory
identity:
  pseudonym_key: \"{KEY}\"
policies:
{POLICIES}routes:
{ROUTES}",
        upstream.url()
    )
}

fn admin(sluice: &Sidecar) -> SocketAddr {
    sluice.admin_addr().expect("the admin address is logged")
}

/// `POST /explain` with `body`: the status and the JSON answer.
async fn explain_raw(sluice: &Sidecar, body: impl Into<Bytes>) -> (StatusCode, Value) {
    let bearer = format!("Bearer {TOKEN}");
    let (status, _, body) = request(
        admin(sluice),
        Method::POST,
        "/explain",
        &[("Authorization", &bearer)],
        body.into(),
    )
    .await;
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("/explain answered no JSON ({e}): {body:?}"));
    (status, json)
}

/// An explanation that must succeed; also checks it shows no raw identity.
async fn explain(sluice: &Sidecar, described: &Value) -> Value {
    let (status, json) = explain_raw(sluice, described.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let text = json.to_string();
    for raw in [PEER, API_KEY] {
        assert!(!text.contains(raw), "the explanation shows {raw}: {text}");
    }
    json
}

fn login() -> Value {
    json!({"method": "GET", "path": "/login", "peer": PEER, "headers": {"X-API-Key": API_KEY}})
}

/// The first limit of the first route.
fn first_limit(explained: &Value) -> &Value {
    &explained["routes"][0]["limits"][0]
}

/// Requests from [`PEER`]: the sidecar sees 127.0.0.1, so these go by the
/// described peer only when it is 127.0.0.1.
fn from_loopback(mut described: Value) -> Value {
    described["peer"] = json!("127.0.0.1");
    described
}

/// Three real requests on a limit of 5; the explanation says 2 are left,
/// twice, and the fourth and fifth real requests pass, the sixth is the
/// first denied.
async fn explain_consumes_nothing(sluice: &Sidecar, store: &str) {
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    for _ in 0..3 {
        assert_eq!(get(sluice.addr(), "/login", &[]).await.0, StatusCode::OK);
    }
    let described = from_loopback(login());
    for _ in 0..2 {
        let explained = explain(sluice, &described).await;
        assert_eq!(explained["routes"][0]["route"], "login", "{explained}");
        let limit = first_limit(&explained);
        assert_eq!(limit["policy"], "login");
        assert_eq!(limit["algorithm"], "fixed-window");
        assert_eq!(limit["shadow"], false);
        assert_eq!(limit["subject"]["kind"], "client_ip");
        assert_eq!(limit["subject"]["resolved"], true);
        assert!(limit["subject"]["pseudonym"]
            .as_str()
            .is_some_and(|p| p.starts_with("v1:")));
        assert_eq!(limit["state"]["store"], store, "{explained}");
        assert_eq!(limit["state"]["remaining"], 2, "{explained}");
        assert_eq!(limit["state"]["retry_after_seconds"], 0.0);
        let reset = limit["state"]["reset_seconds"].as_f64().unwrap_or(0.0);
        assert!(reset > 0.0 && reset <= 3600.0, "{explained}");
        assert_eq!(explained["answer"]["status"], 200, "{explained}");
        assert_eq!(explained["answer"]["outcome"], "allowed");
    }
    for _ in 0..2 {
        assert_eq!(get(sluice.addr(), "/login", &[]).await.0, StatusCode::OK);
    }
    let explained = explain(sluice, &described).await;
    let state = &first_limit(&explained)["state"];
    assert_eq!(state["remaining"], 0, "{explained}");
    assert!(state["retry_after_seconds"].as_f64().unwrap_or(0.0) > 0.0);
    assert_eq!(explained["answer"]["status"], 429, "{explained}");
    assert_eq!(explained["answer"]["outcome"], "denied");
    assert_eq!(
        get(sluice.addr(), "/login", &[]).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another client's bucket is untouched, and explaining it makes none.
    let other = explain(sluice, &login()).await;
    assert_eq!(first_limit(&other)["state"]["remaining"], 5, "{other}");
    assert_ne!(
        first_limit(&other)["subject"]["pseudonym"],
        first_limit(&explained)["subject"]["pseudonym"]
    );
}

#[tokio::test]
async fn explaining_on_the_memory_store_reads_the_state_without_charging() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&memory_yaml(&upstream));
    explain_consumes_nothing(&sluice, "memory").await;
    assert_eq!(upstream.count(), 5, "explanations are never forwarded");
}

#[tokio::test]
async fn explaining_on_redis_reads_the_state_without_charging_or_writing() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml =
        redis_yaml(&upstream, &redis.url(), POLICIES, ROUTES).replace("budget: 50ms", "budget: 1s");
    let sluice = start_ready(&with_explain(&yaml)).await;
    explain_consumes_nothing(&sluice, "redis").await;
    // The unknown client's explanation wrote nothing: only the loopback
    // client's state key exists (beside the evaluation records).
    let mut conn = redis.connection();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).expect("KEYS");
    // Besides the libraries' leases (lua/README.md, "Libraries").
    let states: Vec<&String> = keys
        .iter()
        .filter(|k| !k.contains("}:e:") && !k.starts_with("sluice:library:"))
        .collect();
    assert_eq!(states.len(), 1, "{keys:?}");
    let written: u64 = redis::cmd("INFO")
        .arg("commandstats")
        .query::<String>(&mut conn)
        .map(|info| {
            info.lines()
                .filter(|l| l.starts_with("cmdstat_eval:"))
                .count() as u64
        })
        .expect("INFO");
    assert_eq!(written, 0, "sluice never sends EVAL");

    // Redis gone: the explanation says so and what on_failure answers.
    drop(redis);
    let explained = support::eventually(Duration::from_secs(5), || async {
        let explained = explain(&sluice, &from_loopback(login())).await;
        (first_limit(&explained)["state"]["store"] == "unavailable").then_some(explained)
    })
    .await;
    assert_eq!(explained["answer"]["status"], 503, "{explained}");
    assert!(explained["answer"]["why"]
        .as_str()
        .is_some_and(|w| w.contains("on_failure is deny")));
}

#[tokio::test]
async fn an_unresolved_subject_is_explained_as_the_shared_bucket() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&memory_yaml(&upstream));
    let explained = explain(&sluice, &json!({"method": "GET", "path": "/api/items"})).await;
    let subject = &first_limit(&explained)["subject"];
    assert_eq!(explained["routes"][0]["route"], "api");
    assert_eq!(subject["resolved"], false, "{explained}");
    assert_eq!(subject["kind"], "unresolved");
    assert!(subject["note"]
        .as_str()
        .is_some_and(|n| n.contains("shared bucket")));
    assert_eq!(explained["request"]["peer_given"], false);
    // With the key, it resolves; the key itself is never shown.
    let keyed = explain(
        &sluice,
        &json!({"method": "GET", "path": "/api/items", "headers": {"x-api-key": API_KEY}}),
    )
    .await;
    assert_eq!(first_limit(&keyed)["subject"]["kind"], "header", "{keyed}");
    assert_eq!(first_limit(&keyed)["state"]["remaining"], 10);
}

#[tokio::test]
async fn a_basic_credential_is_explained_by_what_it_decodes_to() {
    let upstream = Upstream::start().await;
    let yaml = memory_yaml(&upstream).replace("\"header:x-api-key\"", "header:Authorization");
    let sluice = Sidecar::start(&yaml);
    let subject = |explained: &Value| first_limit(explained)["subject"].clone();
    let with = |value: &str| json!({"method": "GET", "path": "/api/items", "headers": {"Authorization": value}});
    let plain = subject(&explain(&sluice, &with("Basic YWxpY2U6czNjcmV0")).await);
    let respelled = subject(&explain(&sluice, &with("basic  YWxp*Y2U6czNjcmV0==")).await);
    assert_eq!(plain["kind"], "header", "{plain}");
    assert_eq!(plain["pseudonym"], respelled["pseudonym"], "{respelled}");

    let undecodable = subject(&explain(&sluice, &with("Basic !!!")).await);
    assert_eq!(undecodable["kind"], "undecodable", "{undecodable}");
    assert_eq!(undecodable["resolved"], false);
    assert!(undecodable["note"]
        .as_str()
        .is_some_and(|n| n.contains("shared bucket")));
    let other = subject(&explain(&sluice, &with("Basic YQ==YQ==")).await);
    assert_eq!(undecodable["pseudonym"], other["pseudonym"], "{other}");
    assert_ne!(undecodable["pseudonym"], plain["pseudonym"]);
}

#[tokio::test]
async fn a_request_the_proxy_refuses_is_explained_as_refused() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&memory_yaml(&upstream));
    for (described, label) in [
        (json!({"method": "get", "path": "/login"}), "method_case"),
        (
            json!({"method": "GET", "path": "/api", "headers": {"X-API-Key": [API_KEY, "other"]}}),
            "duplicate_identity",
        ),
        (json!({"method": "GET", "path": "/a/%2e%2e/%2e%2e/etc"}), ""),
    ] {
        let explained = explain(&sluice, &described).await;
        assert_eq!(explained["answer"]["status"], 400, "{explained}");
        assert_eq!(explained["answer"]["outcome"], "refused");
        if !label.is_empty() {
            assert_eq!(explained["refused"]["label"], label, "{explained}");
        }
        assert!(explained.get("routes").is_none());
        // And the proxy does answer it 400.
    }
    let (status, _, _) = get(sluice.addr(), "/a/%2e%2e/%2e%2e/etc", &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // A method override: both methods, as the proxy matches them.
    let explained = explain(
        &sluice,
        &json!({"method": "GET", "path": "/api?_method=DELETE", "headers": {"x-api-key": "a"}}),
    )
    .await;
    assert_eq!(
        explained["runs_as"],
        json!(["GET", "DELETE"]),
        "{explained}"
    );
    assert_eq!(explained["routes"][0]["methods"], json!(["GET", "DELETE"]));
}

#[tokio::test]
async fn an_asterisk_target_is_explained_as_the_wire_answers_it() {
    let upstream = Upstream::start().await;
    let catch_all =
        "  - { name: everything, match: { path_prefix: / }, subject: client_ip, policy: login }\n";
    let yaml = format!("{}{catch_all}", memory_yaml(&upstream));
    let sluice = Sidecar::start(&yaml);
    let (dir, config) = write_config(&yaml);
    let offline = |described: &Value| {
        let file = dir.path().join("asterisk.json");
        std::fs::write(&file, described.to_string()).expect("write the request");
        let args = [
            "check",
            "--config",
            config.to_str().expect("a UTF-8 path"),
            "--explain",
            file.to_str().expect("a UTF-8 path"),
        ];
        let (code, stdout, stderr) = run_binary(&args, &[]);
        assert_eq!(code, 0, "{stderr}");
        serde_json::from_str::<Value>(&stdout).expect("JSON on stdout")
    };
    for method in ["GET", "POST", "DELETE"] {
        let described = json!({"method": method, "path": "*"});
        for explained in [explain(&sluice, &described).await, offline(&described)] {
            assert_eq!(explained["answer"]["status"], 400, "{explained}");
            assert_eq!(
                explained["refused"]["label"], "asterisk_form",
                "{explained}"
            );
        }
        let wire = format!("{method} * HTTP/1.1\r\nHost: app\r\nContent-Length: 0\r\n\r\n");
        let answered = support::raw_exchange(sluice.addr(), wire.as_bytes()).await;
        assert_eq!(answered.status, 400, "{}", answered.head);
    }
    let described = json!({"method": "OPTIONS", "path": "*"});
    for explained in [explain(&sluice, &described).await, offline(&described)] {
        let answer = &explained["answer"];
        assert_eq!(answer["status"], 200, "{explained}");
        assert_eq!(answer["outcome"], "answered", "{explained}");
        assert_eq!(answer["forwarded"], false, "{explained}");
        assert_eq!(
            answer["allow"],
            "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS"
        );
        assert!(explained.get("routes").is_none(), "{explained}");
    }
    let wire = b"OPTIONS * HTTP/1.1\r\nHost: app\r\n\r\n";
    let answered = support::raw_exchange(sluice.addr(), wire).await;
    assert_eq!(answered.status, 200, "{}", answered.head);
    assert_eq!(upstream.count(), 0);
}

#[tokio::test]
async fn a_malformed_explain_body_is_refused_with_a_json_error() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&memory_yaml(&upstream));
    for body in [
        "",
        "{",
        "[1]",
        r#"{"path": "/"}"#,
        r#"{"method": "GET", "path": "/", "peer": "nowhere"}"#,
        r#"{"method": "GET", "path": "/", "extra": 1}"#,
    ] {
        let (status, json) = explain_raw(&sluice, body.to_owned()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {json}");
        assert!(
            json["error"].as_str().is_some_and(|e| !e.is_empty()),
            "{json}"
        );
    }
    let (status, json) = explain_raw(&sluice, vec![b' '; 65 * 1024]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{json}");
    let (status, _, _) = get(admin(&sluice), "/explain", &[]).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    // Nothing of it reached the upstream, and the sidecar still serves.
    assert_eq!(get(sluice.addr(), "/login", &[]).await.0, StatusCode::OK);
    assert_eq!(upstream.count(), 1);
}

#[tokio::test]
async fn check_explain_routes_a_described_request_offline() {
    let upstream = Upstream::start().await;
    let (dir, config) = write_config(&memory_yaml(&upstream));
    let described = dir.path().join("request.json");
    std::fs::write(&described, login().to_string()).expect("write the request");
    let args = [
        "check",
        "--config",
        config.to_str().expect("a UTF-8 path"),
        "--explain",
        described.to_str().expect("a UTF-8 path"),
    ];
    let (code, stdout, stderr) = run_binary(&args, &[]);
    assert_eq!(code, 0, "{stderr}");
    let explained: Value = serde_json::from_str(&stdout).expect("JSON on stdout");
    assert_eq!(explained["routes"][0]["route"], "login", "{stdout}");
    let limit = first_limit(&explained);
    assert_eq!(limit["policy"], "login");
    assert_eq!(limit["subject"]["kind"], "client_ip");
    assert!(limit.get("state").is_none(), "no store offline: {stdout}");
    for raw in [PEER, API_KEY] {
        assert!(!stdout.contains(raw), "{stdout}");
    }
    // The same pseudonym a running sidecar shows, under the same key.
    let sluice = Sidecar::start(&memory_yaml(&upstream));
    let online = explain(&sluice, &login()).await;
    assert_eq!(
        first_limit(&online)["subject"]["pseudonym"],
        limit["subject"]["pseudonym"]
    );

    // A bad description exits 2 and says why.
    std::fs::write(&described, r#"{"method": "GET"}"#).expect("write the request");
    let (code, _, stderr) = run_binary(&args, &[]);
    assert_eq!(code, 2);
    assert!(stderr.contains("missing field `path`"), "{stderr}");
}

const ALGORITHMS: [&str; 5] = ["fw", "sc", "sl", "tb", "gc"];
/// One policy per algorithm, each admitting 5 an hour, and a route `/NAME`
/// to each, by client address.
const EVERY_ALGORITHM: &str = "  fw: { algorithm: fixed-window, limit: 5, window: 1h }
  sc: { algorithm: sliding-counter, limit: 5, window: 1h }
  sl: { algorithm: sliding-log, limit: 5, window: 1h }
  tb: { algorithm: token-bucket, capacity: 5, refill_every: 1h }
  gc: { algorithm: gcra, limit: 5, window: 1h }
";

fn every_algorithm_routes() -> String {
    ALGORITHMS
        .iter()
        .map(|a| {
            format!("  - {{ name: {a}, match: {{ path_prefix: /{a} }}, subject: client_ip, policy: {a} }}\n")
        })
        .collect()
}

/// For each algorithm: 3 requests of 5, explained twice as 2 left, then
/// the 4th and 5th pass and the 6th is the first denied.
async fn every_algorithm_reads_without_charging(sluice: &Sidecar) {
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    for a in ALGORITHMS {
        let path = format!("/{a}");
        for _ in 0..3 {
            assert_eq!(
                get(sluice.addr(), &path, &[]).await.0,
                StatusCode::OK,
                "{a}"
            );
        }
        let described = json!({"method": "GET", "path": path, "peer": "127.0.0.1"});
        for _ in 0..2 {
            let explained = explain(sluice, &described).await;
            let limit = first_limit(&explained);
            assert_eq!(limit["policy"], a, "{explained}");
            assert_eq!(limit["state"]["remaining"], 2, "{a}: {explained}");
            assert_eq!(explained["answer"]["status"], 200, "{a}: {explained}");
        }
        for _ in 0..2 {
            assert_eq!(
                get(sluice.addr(), &path, &[]).await.0,
                StatusCode::OK,
                "{a}"
            );
        }
        let explained = explain(sluice, &described).await;
        assert_eq!(explained["answer"]["status"], 429, "{a}: {explained}");
        assert_eq!(
            get(sluice.addr(), &path, &[]).await.0,
            StatusCode::TOO_MANY_REQUESTS,
            "{a}"
        );
    }
}

#[tokio::test]
async fn every_algorithm_is_explained_without_charging_on_the_memory_store() {
    let upstream = Upstream::start().await;
    let yaml = memory_yaml(&upstream)
        .replace(POLICIES, EVERY_ALGORITHM)
        .replace(ROUTES, &every_algorithm_routes());
    let sluice = Sidecar::start(&yaml);
    every_algorithm_reads_without_charging(&sluice).await;
}

/// The user a deployment should create (lua/README.md): the read-only
/// scripts need nothing more than the others.
const SLUICE_ACL: &str = "user sluice on >pw resetchannels ~sluice:* -@all \
     +fcall +function|load +function|list +function|delete +ping +time +get +set +pexpire +touch \
     +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore";

#[tokio::test]
async fn every_algorithm_is_explained_on_redis_by_a_user_that_may_not_eval() {
    let redis = RedisServer::builder()
        .config("user default off")
        .config("user admin on >admin-pw ~* &* +@all")
        .config(SLUICE_ACL)
        .admin("admin", "admin-pw")
        .start();
    let upstream = Upstream::start().await;
    let yaml = redis_yaml(
        &upstream,
        &redis.url_as("sluice", "pw"),
        EVERY_ALGORITHM,
        &every_algorithm_routes(),
    )
    .replace("budget: 50ms", "budget: 1s");
    let sluice = start_ready(&with_explain(&yaml)).await;
    every_algorithm_reads_without_charging(&sluice).await;
}

#[tokio::test]
async fn with_redis_down_and_on_failure_local_the_local_answer_is_explained_without_charging() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    // Limit 6 shared by two sidecars: 3 each while Redis is away.
    let policies = "  login: { algorithm: fixed-window, limit: 6, window: 1h }\n";
    let routes =
        "  - { name: login, match: { path_prefix: /login }, subject: client_ip, policy: login }\n";
    let yaml = redis_yaml(&upstream, &redis.url(), policies, routes)
        .replace("on_failure: deny", "on_failure: local\n  local_share: 2");
    let sluice = start_ready(&with_explain(&yaml)).await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    drop(redis);

    let described = from_loopback(login());
    let explained = support::eventually(Duration::from_secs(5), || async {
        let explained = explain(&sluice, &described).await;
        (first_limit(&explained)["state"]["store"] == "unavailable").then_some(explained)
    })
    .await;
    for _ in 0..2 {
        let again = explain(&sluice, &described).await;
        assert_eq!(again["answer"]["status"], 200, "{again}");
        assert_eq!(again["answer"]["outcome"], "local_allowed", "{again}");
    }
    assert_eq!(
        explained["answer"]["outcome"], "local_allowed",
        "{explained}"
    );

    // The explanations took nothing of the local share: all three of it
    // are left for real requests, and the fourth is denied here.
    for n in 1..=3 {
        let status = get(sluice.addr(), "/login", &[]).await.0;
        assert_eq!(
            status,
            StatusCode::OK,
            "request {n} of the local share of 3"
        );
    }
    let over = explain(&sluice, &described).await;
    assert_eq!(over["answer"]["status"], 429, "{over}");
    assert_eq!(over["answer"]["outcome"], "local_denied", "{over}");
    let status = get(sluice.addr(), "/login", &[]).await.0;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn explain_is_off_by_default_and_answers_only_the_configured_token() {
    let upstream = Upstream::start().await;
    let described = login().to_string();
    let ask = |sluice: &Sidecar, authorization: Option<String>| {
        let admin = admin(sluice);
        let body = Bytes::from(described.clone());
        async move {
            let headers: Vec<(&str, &str)> = authorization
                .as_deref()
                .map(|a| vec![("Authorization", a)])
                .unwrap_or_default();
            request(admin, Method::POST, "/explain", &headers, body).await
        }
    };

    // Off: whoever asks, whatever they bear, learns nothing.
    let off = Sidecar::start(&memory_off_yaml(&upstream));
    for authorization in [None, Some(format!("Bearer {TOKEN}"))] {
        let (status, _, body) = ask(&off, authorization).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        let text = String::from_utf8_lossy(&body);
        assert!(
            !text.contains("pseudonym") && !text.contains("remaining"),
            "{text}"
        );
        assert!(text.contains("server.explain.token"), "{text}");
    }

    let on = Sidecar::start(&memory_yaml(&upstream));
    for authorization in [
        None,
        Some("Bearer wrong-token-of-some-length".to_owned()),
        Some(format!("Bearer {TOKEN}x")),
        Some(format!("Basic {TOKEN}")),
        Some(TOKEN.to_owned()),
    ] {
        let (status, headers, body) = ask(&on, authorization.clone()).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{authorization:?}");
        assert!(headers.contains_key("www-authenticate"), "{headers:?}");
        let text = String::from_utf8_lossy(&body);
        assert!(!text.contains("pseudonym"), "{text}");
    }
    for authorization in [format!("Bearer {TOKEN}"), format!("bearer  {TOKEN}")] {
        let (status, _, body) = ask(&on, Some(authorization.clone())).await;
        assert_eq!(status, StatusCode::OK, "{authorization}");
        let explained: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(explained["routes"][0]["route"], "login", "{explained}");
    }
    // The probes and metrics need no token.
    assert_eq!(get(admin(&on), "/readyz", &[]).await.0, StatusCode::OK);
    assert_eq!(get(admin(&off), "/metrics", &[]).await.0, StatusCode::OK);
}

#[test]
fn a_short_explain_token_is_a_configuration_error() {
    let yaml = "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
  explain: { token: tok3n-z }
upstream:
  url: http://127.0.0.1:9
";
    let (dir, config) = write_config(yaml);
    let (code, _, stderr) =
        run_binary(&["check", "--config", config.to_str().expect("UTF-8")], &[]);
    drop(dir);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("server.explain.token"), "{stderr}");
    assert!(stderr.contains("at least 16 bytes"), "{stderr}");
    assert!(
        !stderr.contains(": short"),
        "the token is never printed: {stderr}"
    );
}

#[tokio::test]
async fn a_combined_subject_and_a_token_claim_are_explained() {
    let issuer = Issuer::new();
    let upstream = Upstream::start().await;
    let secret = "an HS256 secret, 32 bytes or more";
    let yaml = memory_yaml(&upstream)
        .replace(
            "identity:\n",
            &format!("identity:\n  jwt: {{ secret: \"{secret}\", audiences: [billing] }}\n"),
        )
        .replace(
            "subject: client_ip, policy: login",
            "subject: { all: [client_ip, \"header:x-api-key\"] }, policy: login",
        )
        .replace(
            "subject: \"header:x-api-key\"",
            "subject: [jwt:sub, client_ip]",
        );
    let sluice = Sidecar::start(&yaml);

    let pair = explain(&sluice, &login()).await;
    let subject = &first_limit(&pair)["subject"];
    assert_eq!(subject["kind"], "all", "{pair}");
    assert_eq!(
        subject["sources"][0],
        "{ all: [client_ip, header:x-api-key] }"
    );
    let other_key = explain(
        &sluice,
        &json!({"method": "GET", "path": "/login", "peer": PEER, "headers": {"X-API-Key": "k-2"}}),
    )
    .await;
    assert_ne!(
        first_limit(&other_key)["subject"]["pseudonym"],
        subject["pseudonym"]
    );

    let spec = |sub: &str, aud: &str| Spec {
        alg: "HS256",
        key: Key::Secret(secret),
        kid: None,
        claims: json!({ "sub": sub, "aud": aud, "exp": 300 }),
    };
    let tokens = issuer.sign(&[spec("alice-7f3a", "billing"), spec("alice-7f3a", "payroll")]);
    let bearer = |token: &str| json!({"method": "GET", "path": "/api/items", "peer": PEER, "headers": {"Authorization": format!("Bearer {token}")}});
    let good = explain(&sluice, &bearer(&tokens[0])).await;
    assert_eq!(good["request"]["token"], "verified", "{good}");
    assert_eq!(first_limit(&good)["subject"]["kind"], "jwt");
    assert!(
        !good.to_string().contains("alice-7f3a"),
        "the claim is shown: {good}"
    );
    let misaddressed = explain(&sluice, &bearer(&tokens[1])).await;
    assert_eq!(
        misaddressed["request"]["token"], "rejected: audience",
        "{misaddressed}"
    );
    assert_eq!(
        first_limit(&misaddressed)["subject"]["kind"],
        "client_ip",
        "a rejected token falls to the next subject"
    );
}
