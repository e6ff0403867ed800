//! Limits that use what the request or the app's answer says, through the
//! built binary, on the memory store and on real Redis: failed logins
//! counted and successful ones never; a cost the app reports; tiers
//! chosen by a header only a trusted proxy may set; admitted requests
//! near their limit counted.
//!
//! The upstream answers as each request asks (`x-answer-status`,
//! `x-answer-header`), as an app would answer a good or a bad password.

use std::time::Duration;

use http::StatusCode;

use crate::support::ops::scrape;
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{admin, redis_yaml, sample, start_ready};
use crate::support::sidecar::Sidecar;
use crate::support::{get, header, parse_ratelimit, Upstream};

const WITHIN: Duration = Duration::from_secs(5);

/// A sidecar on the memory store, or on `redis`, with `policies` and
/// `routes` (YAML bodies, indented two spaces) and `trusted` proxies.
pub(crate) async fn sidecar(
    upstream: &Upstream,
    redis: Option<&RedisServer>,
    trusted: &str,
    policies: &str,
    routes: &str,
) -> Sidecar {
    match redis {
        Some(redis) => {
            let yaml = redis_yaml(upstream, &redis.url(), policies, routes).replace(
                "identity:\n",
                &format!("identity:\n  trusted_proxies: [{trusted}]\n"),
            );
            start_ready(&yaml).await
        }
        None => Sidecar::start(&format!(
            "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {url}
identity:
  trusted_proxies: [{trusted}]
policies:
{policies}routes:
{routes}",
            url = upstream.url()
        )),
    }
}

/// Waits until the sidecar has made `n` charges on response with
/// `result` for `policy`; panics with what it counted otherwise.
pub(crate) async fn charges(sluice: &Sidecar, route_policy: (&str, &str), result: &str, n: f64) {
    let (route, policy) = route_policy;
    let labels = [("route", route), ("policy", policy), ("result", result)];
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let got = sample(sluice, "sluice_response_charges_total", &labels).await;
        if got == Some(n) {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let text = scrape(admin(sluice)).await;
            let counted: Vec<&str> = text
                .lines()
                .filter(|l| l.starts_with("sluice_response"))
                .collect();
            panic!(
                "{result} charges of {policy}: {got:?}, not {n}\n{}",
                counted.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn login(sluice: &Sidecar, client: &str, status: &str) -> StatusCode {
    let headers = [("x-forwarded-for", client), ("x-answer-status", status)];
    get(sluice.addr(), "/login", &headers).await.0
}

const LOGIN_POLICIES: &str =
    "  failed_logins: { algorithm: fixed-window, limit: 10, window: 1h }\n";
const LOGIN_ROUTES: &str = "  - name: login
    match: { path: /login }
    policy: failed_logins
    charge: { on: response, statuses: [401, 403] }
";

async fn failed_logins_count_and_successful_ones_never_do(redis: Option<&RedisServer>) {
    let upstream = Upstream::start().await;
    let sluice = sidecar(
        &upstream,
        redis,
        "127.0.0.1/32",
        LOGIN_POLICIES,
        LOGIN_ROUTES,
    )
    .await;
    let (guesser, user) = ("198.51.100.7", "198.51.100.8");

    // Successful logins are never counted, however many.
    for _ in 0..15 {
        assert_eq!(login(&sluice, guesser, "200").await, StatusCode::OK);
    }
    // Each gives its reservation back in a task of its own, once answered.
    charges(&sluice, ("login", "failed_logins"), "given_back", 15.0).await;
    // Ten failures: each forwarded, each answered 401 by the app.
    for i in 0..10 {
        let status = if i % 2 == 0 { "401" } else { "403" };
        assert_eq!(
            login(&sluice, guesser, status).await.as_u16(),
            status.parse::<u16>().unwrap()
        );
    }
    charges(&sluice, ("login", "failed_logins"), "charged", 10.0).await;
    let forwarded = upstream.count();
    assert_eq!(forwarded, 25);

    // The 11th, failing or not, is refused before it reaches the app.
    for status in ["401", "200"] {
        let (got, headers, _) = get(
            sluice.addr(),
            "/login",
            &[("x-forwarded-for", guesser), ("x-answer-status", status)],
        )
        .await;
        assert_eq!(got, StatusCode::TOO_MANY_REQUESTS);
        assert!(header(&headers, "retry-after").is_some());
    }
    assert_eq!(
        upstream.count(),
        forwarded,
        "a refused login reached the app"
    );

    // Another client's successful login passes, and its RateLimit fields
    // say nothing was taken from it.
    let (got, headers, _) = get(
        sluice.addr(),
        "/login",
        &[("x-forwarded-for", user), ("x-answer-status", "200")],
    )
    .await;
    assert_eq!(got, StatusCode::OK);
    let field = parse_ratelimit(header(&headers, "ratelimit").expect("RateLimit on a login"))
        .expect("a RateLimit item");
    assert_eq!(field.param("r"), Some(10), "{field:?}");
    // Its reservation is given back in a task of its own once the answer
    // is in (the fifteen of the guesser's successful logins and this one):
    // the next request is decided after it.
    charges(&sluice, ("login", "failed_logins"), "given_back", 16.0).await;
    // Its failure is then counted, and the field says so.
    let (got, headers, _) = get(
        sluice.addr(),
        "/login",
        &[("x-forwarded-for", user), ("x-answer-status", "401")],
    )
    .await;
    assert_eq!(got, StatusCode::UNAUTHORIZED);
    let field = parse_ratelimit(header(&headers, "ratelimit").unwrap()).unwrap();
    assert_eq!(field.param("r"), Some(9), "{field:?}");
    charges(&sluice, ("login", "failed_logins"), "charged", 11.0).await;

    // A client that hangs up once the head is in is charged all the same.
    upstream.respond_with_body_of(4 << 20);
    let mut raw = tokio::net::TcpStream::connect(sluice.addr()).await.unwrap();
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    raw.write_all(
        format!(
            "GET /login HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: {user}\r\nX-Answer-Status: 401\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut head = vec![0u8; 512];
    let n = raw.read(&mut head).await.unwrap();
    assert!(
        head[..n].starts_with(b"HTTP/1.1 401"),
        "{:?}",
        String::from_utf8_lossy(&head[..n])
    );
    drop(raw);
    charges(&sluice, ("login", "failed_logins"), "charged", 12.0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_count_and_successful_ones_never_do_memory() {
    failed_logins_count_and_successful_ones_never_do(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_count_and_successful_ones_never_do_redis() {
    let redis = RedisServer::start();
    failed_logins_count_and_successful_ones_never_do(Some(&redis)).await;
}

async fn a_cost_the_app_reports_is_charged(redis: Option<&RedisServer>) {
    let upstream = Upstream::start().await;
    let policies = "  tokens: { algorithm: fixed-window, limit: 1000, window: 1h }\n";
    let routes = "  - name: complete
    match: { path: /v1/complete }
    subject: header:x-api-key
    policy: tokens
    cost: { from_response_header: X-Tokens-Used, max: 1000, default: 50 }
";
    let sluice = sidecar(&upstream, redis, "127.0.0.1/32", policies, routes).await;
    let ask = |used: &'static str| {
        let addr = sluice.addr();
        async move {
            let answer = format!("x-tokens-used: {used}");
            let headers = [
                ("x-api-key", "team-a"),
                ("x-answer-header", answer.as_str()),
            ];
            get(addr, "/v1/complete", &headers).await
        }
    };

    let (status, headers, _) = ask("700").await;
    assert_eq!(status, StatusCode::OK);
    let field = parse_ratelimit(header(&headers, "ratelimit").unwrap()).unwrap();
    assert_eq!(field.param("r"), Some(300), "{field:?}");
    charges(&sluice, ("complete", "tokens"), "charged", 1.0).await;

    // 400 more than the 300 left: what is left is taken.
    let (status, headers, _) = ask("400").await;
    assert_eq!(status, StatusCode::OK);
    let field = parse_ratelimit(header(&headers, "ratelimit").unwrap()).unwrap();
    assert_eq!(field.param("r"), Some(0), "{field:?}");
    charges(&sluice, ("complete", "tokens"), "took_rest", 1.0).await;

    let (status, _, _) = ask("1").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(upstream.count(), 2, "the third request reached the app");

    // Another key: a report that is not a number charges the default,
    // one above `max` charges `max`, and both are counted.
    let other = |answer: &'static str| {
        let addr = sluice.addr();
        async move {
            let headers = [("x-api-key", "team-b"), ("x-answer-header", answer)];
            get(addr, "/v1/complete", &headers).await
        }
    };
    assert_eq!(other("x-tokens-used: lots").await.0, StatusCode::OK);
    assert_eq!(other("x-other: 1").await.0, StatusCode::OK);
    let fallbacks = |reason: &'static str| {
        let sluice = &sluice;
        async move {
            let labels = [
                ("route", "complete"),
                ("policy", "tokens"),
                ("reason", reason),
            ];
            sample(sluice, "sluice_response_cost_fallbacks_total", &labels).await
        }
    };
    charges(&sluice, ("complete", "tokens"), "charged", 3.0).await;
    assert_eq!(fallbacks("invalid").await, Some(1.0));
    assert_eq!(fallbacks("missing").await, Some(1.0));
    // 1000 − 50 − 50 = 900 left: a report of 5000 is charged 1000, of
    // which 900 are left.
    assert_eq!(other("x-tokens-used: 5000").await.0, StatusCode::OK);
    charges(&sluice, ("complete", "tokens"), "took_rest", 2.0).await;
    assert_eq!(fallbacks("above_max").await, Some(1.0));
    assert_eq!(
        other("x-tokens-used: 1").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_the_app_reports_is_charged_memory() {
    a_cost_the_app_reports_is_charged(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_the_app_reports_is_charged_redis() {
    let redis = RedisServer::start();
    a_cost_the_app_reports_is_charged(Some(&redis)).await;
}

const TIER_POLICIES: &str = "  p_free: { algorithm: fixed-window, limit: 2, window: 1h }
  p_pro: { algorithm: fixed-window, limit: 5, window: 1h }
";
const TIER_ROUTES: &str = "  - name: api
    match: { path_prefix: /api }
    subject: header:x-api-key
    tiers:
      header: X-Plan
      policies: { free: p_free, pro: p_pro, enterprise: none }
      default: p_free
      trusted_from: [127.0.0.1]
";

/// Sends `n` requests with `key` and `plan`; the admitted count, and the
/// `RateLimit-Policy` of the first answer.
async fn admitted(sluice: &Sidecar, key: &str, plan: Option<&str>, n: usize) -> (usize, String) {
    let mut ok = 0;
    let mut policy = String::new();
    for i in 0..n {
        let mut headers = vec![("x-api-key", key)];
        if let Some(plan) = plan {
            headers.push(("x-plan", plan));
        }
        let (status, answer, _) = get(sluice.addr(), "/api/items", &headers).await;
        if i == 0 {
            policy = header(&answer, "ratelimit-policy").unwrap_or("").to_owned();
        }
        match status {
            StatusCode::OK => ok += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected {other}"),
        }
    }
    (ok, policy)
}

async fn a_trusted_plan_header_chooses_the_tier(redis: Option<&RedisServer>) {
    let upstream = Upstream::start().await;
    // The gateway that sets the plan is the peer, and `trusted_from` names
    // it; `identity.trusted_proxies` has nothing to do with it.
    let trusting = sidecar(&upstream, redis, "10.9.9.9/32", TIER_POLICIES, TIER_ROUTES).await;

    let (pro, field) = admitted(&trusting, "k-pro", Some("pro"), 8).await;
    assert_eq!(pro, 5);
    assert_eq!(
        field, "\"p_pro\";q=5;w=3600",
        "only the request's tier is announced"
    );
    assert_eq!(
        upstream.last().unwrap().header("x-plan"),
        Some("pro"),
        "a trusted plan reaches the app"
    );
    let (free, field) = admitted(&trusting, "k-free", Some("free"), 4).await;
    assert_eq!((free, field.as_str()), (2, "\"p_free\";q=2;w=3600"));
    assert_eq!(
        admitted(&trusting, "k-none", None, 4).await.0,
        2,
        "no header: the default tier"
    );
    assert_eq!(
        admitted(&trusting, "k-odd", Some("gold"), 4).await.0,
        2,
        "an unknown value: the default"
    );
    let (enterprise, field) = admitted(&trusting, "k-ent", Some("enterprise"), 8).await;
    assert_eq!(
        (enterprise, field.as_str()),
        (8, ""),
        "a tier of `none` is not limited"
    );

    // The same header from a peer not in `trusted_from` counts for
    // nothing, and the app never sees it, even from a trusted proxy: a
    // forwarding proxy passes a client's own header through.
    let routes = TIER_ROUTES.replace("[127.0.0.1]", "[10.9.9.9]");
    let wary = sidecar(&upstream, redis, "127.0.0.1/32", TIER_POLICIES, &routes).await;
    let key = "k-claims-pro";
    assert_eq!(admitted(&wary, key, Some("pro"), 6).await.0, 2);
    let seen: Vec<_> = upstream
        .requests()
        .into_iter()
        .filter(|r| r.header("x-api-key") == Some(key))
        .collect();
    assert_eq!(seen.len(), 2);
    assert!(
        seen.iter().all(|r| r.header("x-plan").is_none()),
        "an untrusted plan reached the app"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_plan_header_chooses_the_tier_memory() {
    a_trusted_plan_header_chooses_the_tier(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_plan_header_chooses_the_tier_redis() {
    let redis = RedisServer::start();
    a_trusted_plan_header_chooses_the_tier(Some(&redis)).await;
}

async fn admitted_requests_near_the_limit_are_counted(redis: Option<&RedisServer>) {
    let upstream = Upstream::start().await;
    let policies = "  ten: { algorithm: fixed-window, limit: 10, window: 1h }
  bucket: { algorithm: token-bucket, capacity: 10, refill_every: 1h, near_limit: 50% }
";
    let routes = "  - name: ten
    match: { path: /ten }
    policy: ten
  - name: bucket
    match: { path: /bucket }
    policy: bucket
";
    let sluice = sidecar(&upstream, redis, "127.0.0.1/32", policies, routes).await;
    let near = |route: &'static str, policy: &'static str| {
        let sluice = &sluice;
        async move {
            let labels = [("route", route), ("policy", policy)];
            sample(sluice, "sluice_near_limit_total", &labels).await
        }
    };
    assert_eq!(
        near("ten", "ten").await,
        Some(0.0),
        "the series exists from the start"
    );
    for i in 1..=12 {
        let (status, _, _) = get(sluice.addr(), "/ten", &[]).await;
        assert_eq!(status == StatusCode::OK, i <= 10);
        // 80% by default: the 9th leaves 1 of 10 (less than 2), the 8th 2.
        let want = match i {
            ..=8 => 0.0,
            9 => 1.0,
            _ => 2.0,
        };
        assert_eq!(near("ten", "ten").await, Some(want), "after request {i}");
    }
    // 50%: from the 6th, which leaves 4 of 10.
    for _ in 0..8 {
        assert_eq!(get(sluice.addr(), "/bucket", &[]).await.0, StatusCode::OK);
    }
    assert_eq!(near("bucket", "bucket").await, Some(3.0));
    let text = scrape(admin(&sluice)).await;
    assert!(text.contains("# HELP sluice_near_limit_total"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_requests_near_the_limit_are_counted_memory() {
    admitted_requests_near_the_limit_are_counted(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_requests_near_the_limit_are_counted_redis() {
    let redis = RedisServer::start();
    admitted_requests_near_the_limit_are_counted(Some(&redis)).await;
}

const EXPLAIN_TOKEN: &str = "explain-token-e41c7d";

/// `POST /explain` of `described` on `sluice`.
async fn explain(sluice: &Sidecar, described: serde_json::Value) -> serde_json::Value {
    let bearer = format!("Bearer {EXPLAIN_TOKEN}");
    let (status, _, body) = crate::support::request(
        admin(sluice),
        http::Method::POST,
        "/explain",
        &[("Authorization", &bearer)],
        described.to_string().into(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    serde_json::from_slice(&body).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_and_check_show_charges_and_tiers() {
    let upstream = Upstream::start().await;
    let policies = format!("{LOGIN_POLICIES}  tokens: {{ algorithm: fixed-window, limit: 1000, window: 1h }}\n{TIER_POLICIES}");
    let routes = format!(
        "{LOGIN_ROUTES}  - name: complete
    match: {{ path: /v1/complete }}
    policy: tokens
    cost: {{ from_response_header: X-Tokens-Used, max: 900 }}
{TIER_ROUTES}"
    );
    let sluice = sidecar(&upstream, None, "127.0.0.1/32", &policies, &routes).await;
    // The sidecar's own file, with explain turned on, for the check and a
    // second sidecar.
    let yaml = std::fs::read_to_string(sluice.config_path())
        .unwrap()
        .replacen(
            "  admin: 127.0.0.1:0\n",
            &format!("  admin: 127.0.0.1:0\n  explain: {{ token: {EXPLAIN_TOKEN} }}\n"),
            1,
        );
    drop(sluice);
    let sluice = Sidecar::start(&yaml);

    let login = explain(
        &sluice,
        serde_json::json!({"method": "POST", "path": "/login"}),
    )
    .await;
    let charge = &login["routes"][0]["limits"][0]["charge"];
    assert_eq!(charge["on"], "response", "{login}");
    assert_eq!(charge["statuses"], serde_json::json!([401, 403]));
    let complete = explain(
        &sluice,
        serde_json::json!({"method": "POST", "path": "/v1/complete"}),
    )
    .await;
    let units = &complete["routes"][0]["limits"][0]["charge"]["units"];
    assert_eq!(units["from_response_header"], "x-tokens-used", "{complete}");
    assert_eq!(
        (units["max"].as_u64(), units["default"].as_u64()),
        (Some(900), Some(900))
    );

    let pro = serde_json::json!({"method": "GET", "path": "/api/x", "headers": {"x-plan": "pro", "x-api-key": "k"}});
    let trusted = explain(&sluice, pro.clone()).await;
    let tiers = &trusted["routes"][0]["tiers"];
    assert_eq!(
        (tiers["trusted"].as_bool(), tiers["chosen"].as_str()),
        (Some(true), Some("p_pro")),
        "{trusted}"
    );
    assert_eq!(tiers["trusted_from"], serde_json::json!(["127.0.0.1/32"]));
    assert_eq!(trusted["routes"][0]["limits"][0]["policy"], "p_pro");
    assert_eq!(trusted["routes"][0]["limits"].as_array().unwrap().len(), 1);
    let mut from_outside = pro;
    from_outside["peer"] = serde_json::json!("192.0.2.9");
    let untrusted = explain(&sluice, from_outside).await;
    assert_eq!(
        untrusted["routes"][0]["tiers"]["chosen"], "p_free",
        "{untrusted}"
    );
    assert_eq!(untrusted["routes"][0]["limits"][0]["policy"], "p_free");

    let (code, stdout, stderr) = crate::support::sidecar::run_binary(
        &["check", "--config", &sluice.config_path().to_string_lossy()],
        &[],
    );
    assert_eq!(code, 0, "{stderr}");
    for shown in [
        "1 on 401,403",
        "x-tokens-used ≤900 (else 900) on response",
        "p_free (x-plan: free,default)",
        "p_pro (x-plan: pro)",
        "none (x-plan: enterprise)",
    ] {
        assert!(stdout.contains(shown), "`{shown}` not in\n{stdout}");
    }
}
