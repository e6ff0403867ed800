//! The refusal an app's clients expect, through the built binary:
//! `responses.refused` and `responses.unavailable` (status, body from a
//! file, content type, fields of their own), a route's own `responses:`
//! replacing the global ones, and a policy's `headers: off` keeping its
//! quota out of every answer.

use std::path::Path;

use http::StatusCode;
use serde_json::Value;
use tempfile::TempDir;

use crate::support::redis_sidecar::redis_yaml;
use crate::support::sidecar::{run_binary, write_config};
use crate::support::{get, header, Sidecar, Upstream};

const PAGE: &str = "<!doctype html><title>Slow down</title><p>Too many requests.</p>\n";
const BOT_PAGE: &str = "nothing to see here\n";
const DOWN_PAGE: &str = "<!doctype html><p>Back in a moment.</p>\n";
const MOBILE_JSON: &str = "{\"error\":\"busy\",\"code\":42}";

/// `files` written in a fresh directory; the paths are `dir/NAME`.
fn files(files: &[(&str, &str)]) -> TempDir {
    let dir = tempfile::tempdir().expect("a temporary directory");
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write a body file");
    }
    dir
}

fn at(dir: &TempDir, name: &str) -> String {
    dir.path().join(name).display().to_string()
}

/// The memory store; a client is its `X-Forwarded-For`.
fn memory_yaml(upstream: &Upstream, rest: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: {}
identity:
  trusted_proxies: [127.0.0.1/32]
{rest}",
        upstream.url()
    )
}

async fn from(sluice: &Sidecar, path: &str, client: &str) -> (StatusCode, http::HeaderMap, String) {
    let (status, headers, body) = get(sluice.addr(), path, &[("x-forwarded-for", client)]).await;
    (status, headers, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn a_refusal_is_answered_as_responses_refused_says_and_a_route_can_replace_it() {
    let upstream = Upstream::start().await;
    let dir = files(&[("429.html", PAGE), ("bots.txt", BOT_PAGE)]);
    let yaml = memory_yaml(
        &upstream,
        &format!(
            "responses:
  refused:
    status: 429
    content_type: text/html; charset=utf-8
    body_file: {page}
    headers: {{ X-Refused-By: sluice, Cache-Control: \"private, max-age=5\" }}
policies:
  one: {{ algorithm: fixed-window, limit: 1, window: 1h }}
routes:
  - name: bots
    match: {{ path_prefix: /bots }}
    policy: one
    responses:
      refused: {{ status: 200, content_type: text/plain, body_file: {bots} }}
  - name: mobile
    match: {{ path_prefix: /mobile }}
    policy: one
    responses:
      unavailable: {{ status: 503 }}
  - name: api
    match: {{ path_prefix: /api }}
    policy: one
",
            page = at(&dir, "429.html"),
            bots = at(&dir, "bots.txt"),
        ),
    );
    let sluice = Sidecar::start(&yaml);

    // The global answer: the file's bytes, its type, the route's fields;
    // the rate-limit fields as ever.
    assert_eq!(from(&sluice, "/api", "192.0.2.1").await.0, StatusCode::OK);
    let (status, headers, body) = from(&sluice, "/api", "192.0.2.1").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body, PAGE);
    assert_eq!(
        header(&headers, "content-type"),
        Some("text/html; charset=utf-8")
    );
    assert_eq!(header(&headers, "x-refused-by"), Some("sluice"));
    assert_eq!(
        header(&headers, "cache-control"),
        Some("private, max-age=5")
    );
    assert!(header(&headers, "retry-after").is_some(), "{headers:?}");
    assert!(header(&headers, "ratelimit").is_some(), "{headers:?}");
    assert_eq!(
        header(&headers, "content-length"),
        Some(&*PAGE.len().to_string())
    );

    // A route writing only `unavailable` keeps the global `refused`.
    assert_eq!(
        from(&sluice, "/mobile", "192.0.2.1").await.0,
        StatusCode::OK
    );
    let (status, headers, body) = from(&sluice, "/mobile", "192.0.2.1").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body, PAGE);
    assert_eq!(header(&headers, "x-refused-by"), Some("sluice"));

    // A route's own `refused` replaces the global one whole: its status,
    // its body, none of the global fields.
    assert_eq!(from(&sluice, "/bots", "192.0.2.1").await.0, StatusCode::OK);
    let (status, headers, body) = from(&sluice, "/bots", "192.0.2.1").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, BOT_PAGE);
    assert_eq!(header(&headers, "content-type"), Some("text/plain"));
    assert_eq!(header(&headers, "x-refused-by"), None);
    assert_eq!(header(&headers, "cache-control"), Some("no-store"));

    // Each route forwarded its first request only: the refusals, the 200
    // included, were sluice's.
    assert_eq!(upstream.count(), 3);
}

#[tokio::test]
async fn a_status_alone_keeps_the_problem_body_with_that_status() {
    let upstream = Upstream::start().await;
    let yaml = memory_yaml(
        &upstream,
        "responses:
  refused: { status: 403 }
policies:
  one: { algorithm: fixed-window, limit: 1, window: 1h }
routes:
  - { name: api, match: { path_prefix: /api }, policy: one }
",
    );
    let sluice = Sidecar::start(&yaml);
    from(&sluice, "/api", "192.0.2.2").await;
    let (status, headers, body) = from(&sluice, "/api", "192.0.2.2").await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(
        header(&headers, "content-type"),
        Some("application/problem+json")
    );
    let problem: Value = serde_json::from_str(&body).expect("a problem body");
    assert_eq!(problem["status"], 403);
    assert_eq!(problem["title"], "Forbidden");
    assert_eq!(problem["policy"], "one");
}

#[tokio::test]
async fn headers_off_keeps_a_policy_out_of_every_answer() {
    let upstream = Upstream::start().await;
    let yaml = memory_yaml(
        &upstream,
        "policies:
  quota: { algorithm: fixed-window, limit: 100, window: 1h }
  abuse: { algorithm: fixed-window, limit: 2, window: 1h, headers: off }
routes:
  - name: login
    match: { path: /login }
    limits:
      - { policy: quota, subject: client_ip }
      - { policy: abuse, subject: client_ip }
  - { name: signup, match: { path: /signup }, policy: abuse }
",
    );
    let sluice = Sidecar::start(&yaml);

    // A route with only the unannounced policy: nothing on allowed
    // responses, nothing on its 429, no retry time in its body.
    for _ in 0..2 {
        let (status, headers, _) = from(&sluice, "/signup", "192.0.2.3").await;
        assert_eq!(status, StatusCode::OK);
        for name in ["ratelimit", "ratelimit-policy", "retry-after"] {
            assert_eq!(
                header(&headers, name),
                None,
                "{name} on an allowed response"
            );
        }
    }
    let (status, headers, body) = from(&sluice, "/signup", "192.0.2.3").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    for name in ["ratelimit", "ratelimit-policy", "retry-after"] {
        assert_eq!(header(&headers, name), None, "{name} on the 429");
    }
    let problem: Value = serde_json::from_str(&body).expect("a problem body");
    assert_eq!(problem.get("retry_after"), None, "{problem}");
    assert!(
        !problem["detail"].as_str().unwrap().contains("retry"),
        "{problem}"
    );
    assert_eq!(problem["policy"], "abuse");

    // Beside an announced policy: only that one is listed and described.
    let (status, headers, _) = from(&sluice, "/login", "192.0.2.4").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        Some("\"quota\";q=100;w=3600")
    );
    let ratelimit = header(&headers, "ratelimit").expect("RateLimit of quota");
    assert!(ratelimit.starts_with("\"quota\";r=99;"), "{ratelimit}");
    from(&sluice, "/login", "192.0.2.4").await;
    // The third is refused by `abuse`: its 429 announces nothing.
    let (status, headers, _) = from(&sluice, "/login", "192.0.2.4").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    for name in ["ratelimit", "ratelimit-policy", "retry-after"] {
        assert_eq!(header(&headers, name), None, "{name} on the 429 of abuse");
    }
    assert_eq!(upstream.count(), 4);
}

#[tokio::test]
async fn a_custom_unavailable_answers_when_the_store_cannot_decide() {
    let upstream = Upstream::start().await;
    // Bound and dropped: nothing listens there.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let redis_url = format!("redis://{}", closed.local_addr().unwrap());
    drop(closed);
    let dir = files(&[("503.html", DOWN_PAGE), ("mobile.json", MOBILE_JSON)]);
    let yaml = redis_yaml(
        &upstream,
        &redis_url,
        "  api: { algorithm: fixed-window, limit: 100, window: 1h }\n",
        "  - { name: web, match: { path_prefix: /web }, policy: api }
  - name: mobile
    match: { path_prefix: /mobile }
    policy: api
    responses:
      unavailable: { status: 429, content_type: application/json, body_file: MOBILE }
",
    )
    .replace("MOBILE", &at(&dir, "mobile.json"))
    .replace(
        "policies:\n",
        &format!(
            "responses:
  unavailable:
    content_type: text/html
    body_file: {}
    headers: {{ X-Store: down }}
policies:\n",
            at(&dir, "503.html")
        ),
    );
    let sluice = Sidecar::start(&yaml);

    let (status, headers, body) = from(&sluice, "/web", "192.0.2.5").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(body, DOWN_PAGE);
    assert_eq!(header(&headers, "content-type"), Some("text/html"));
    assert_eq!(header(&headers, "x-store"), Some("down"));
    assert_eq!(header(&headers, "retry-after"), Some("1"));

    let (status, headers, body) = from(&sluice, "/mobile", "192.0.2.5").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body, MOBILE_JSON);
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    assert_eq!(header(&headers, "x-store"), None);
    assert_eq!(upstream.count(), 0);
}

/// `sluice check` on `yaml`: exit code and stderr.
fn check(yaml: &str) -> (i32, String) {
    let (_dir, path) = write_config(yaml);
    let (code, _, stderr) = run_binary(&["check", "--config", &path.display().to_string()], &[]);
    (code, stderr)
}

fn with_responses(responses: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
upstream:
  url: http://127.0.0.1:9
{responses}policies:
  one: {{ algorithm: fixed-window, limit: 1, window: 1h }}
routes:
  - {{ name: api, policy: one }}
"
    )
}

#[test]
fn a_missing_body_file_is_a_configuration_error_at_its_key() {
    let missing = Path::new("/nonexistent/sluice/429.html");
    let (code, stderr) = check(&with_responses(&format!(
        "responses:\n  refused: {{ content_type: text/html, body_file: {} }}\n",
        missing.display()
    )));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("responses.refused.body_file: cannot read `/nonexistent/sluice/429.html`"),
        "{stderr}"
    );
}

#[test]
fn a_body_file_over_64_kib_is_refused() {
    let dir = files(&[("big.html", &"x".repeat(64 * 1024 + 1))]);
    let (code, stderr) = check(&with_responses(&format!(
        "responses:\n  unavailable: {{ content_type: text/html, body_file: {} }}\n",
        at(&dir, "big.html")
    )));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("responses.unavailable.body_file: "),
        "{stderr}"
    );
    assert!(stderr.contains("larger than 64 KiB"), "{stderr}");
}

#[test]
fn forbidden_headers_and_statuses_are_refused_at_their_keys() {
    let (code, stderr) = check(&with_responses(
        "responses:
  refused:
    status: 302
    headers: { Content-Length: \"5\", Retry-After: \"9\", X-Fine: yes }
  unavailable: { status: 200 }
",
    ));
    assert_eq!(code, 2, "{stderr}");
    for expected in [
        "responses.refused.status: 302 cannot be this answer's status",
        "responses.refused.headers.Content-Length: `content-length` is a framing or hop-by-hop field",
        "responses.refused.headers.Retry-After: `retry-after` is sent by sluice",
        "responses.unavailable.status: 200 cannot be this answer's status",
    ] {
        assert!(stderr.contains(expected), "missing {expected:?} in:\n{stderr}");
    }
    assert!(!stderr.contains("X-Fine"), "{stderr}");

    // The same rules in a route's own `responses:`.
    let (code, stderr) = check(&with_responses("").replace(
        "  - { name: api, policy: one }\n",
        "  - { name: api, policy: one, responses: { refused: { headers: { Connection: close } } } }\n",
    ));
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("routes[0].responses.refused.headers.Connection: "),
        "{stderr}"
    );
}

#[test]
fn check_shows_each_routes_answer_and_the_unannounced_policies() {
    let dir = files(&[("429.html", PAGE)]);
    let yaml = with_responses(&format!(
        "responses:\n  refused: {{ content_type: text/html, body_file: {}, headers: {{ X-Refused-By: sluice }} }}\n",
        at(&dir, "429.html")
    ))
    .replace(
        "policies:\n",
        "policies:\n  abuse: { algorithm: fixed-window, limit: 9, window: 1m, headers: off }\n",
    )
    .replace(
        "  - { name: api, policy: one }\n",
        "  - { name: api, match: { path: /api }, policy: one }
  - { name: bots, policy: abuse, responses: { refused: { status: 200 } } }
",
    );
    let (_dir, path) = write_config(&yaml);
    let (code, stdout, stderr) =
        run_binary(&["check", "--config", &path.display().to_string()], &[]);
    assert_eq!(code, 0, "{stderr}");
    let page = format!(
        "api      refused 429 (a concurrency limit: 503) text/html from {} ({} bytes), with x-refused-by",
        at(&dir, "429.html"),
        PAGE.len()
    );
    for expected in [
        "Answered in place of sluice's own problem+json:",
        &page,
        "bots     refused 200 problem+json",
        "Never announced (headers: off: no RateLimit, RateLimit-Policy or Retry-After): abuse",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
}

#[tokio::test]
async fn explain_says_what_a_refused_request_would_be_answered() {
    const TOKEN: &str = "explain-token-4c2d9e7f1a";
    let upstream = Upstream::start().await;
    let dir = files(&[("429.html", PAGE)]);
    let yaml = memory_yaml(
        &upstream,
        &format!(
            "responses:
  refused: {{ status: 403, content_type: text/html, body_file: {} }}
policies:
  one: {{ algorithm: fixed-window, limit: 1, window: 1h, headers: off }}
routes:
  - {{ name: api, policy: one }}
",
            at(&dir, "429.html")
        ),
    )
    .replace(
        "  listen: 127.0.0.1:0\n",
        &format!("  listen: 127.0.0.1:0\n  admin: 127.0.0.1:0\n  explain: {{ token: {TOKEN} }}\n"),
    );
    let sluice = Sidecar::start(&yaml);
    assert_eq!(get(sluice.addr(), "/", &[]).await.0, StatusCode::OK);
    let described = serde_json::json!({"method": "GET", "path": "/", "peer": "127.0.0.1"});
    let (status, _, body) = crate::support::request(
        sluice.admin_addr().expect("the admin address is logged"),
        http::Method::POST,
        "/explain",
        &[("Authorization", &format!("Bearer {TOKEN}"))],
        described.to_string().into(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let explained: Value = serde_json::from_slice(&body).expect("JSON");
    let answer = &explained["answer"];
    assert_eq!(answer["status"], 403, "{explained}");
    assert_eq!(
        answer["response"]["content_type"], "text/html",
        "{explained}"
    );
    let fields = answer["response"]["fields"].as_array().expect("fields");
    assert!(
        !fields
            .iter()
            .any(|f| f == "retry-after" || f == "ratelimit-policy"),
        "{explained}"
    );
}

#[tokio::test]
async fn a_body_file_edited_in_place_is_served_after_the_reload_and_a_removed_one_is_refused() {
    let upstream = Upstream::start().await;
    let dir = files(&[("429.html", PAGE)]);
    let yaml = memory_yaml(
        &upstream,
        &format!(
            "responses:
  refused: {{ content_type: text/html, body_file: {} }}
policies:
  one: {{ algorithm: fixed-window, limit: 1, window: 1h }}
routes:
  - {{ name: api, policy: one }}
",
            at(&dir, "429.html")
        ),
    );
    let sluice = Sidecar::start(&yaml);
    from(&sluice, "/", "192.0.2.9").await;
    assert_eq!(from(&sluice, "/", "192.0.2.9").await.2, PAGE);

    // The file alone changes: it is watched like the configuration.
    const EDITED: &str = "<p>edited</p>\n";
    std::fs::write(dir.path().join("429.html"), EDITED).unwrap();
    crate::support::eventually(std::time::Duration::from_secs(10), || async {
        (from(&sluice, "/", "192.0.2.9").await.2 == EDITED).then_some(())
    })
    .await;

    // Gone: the reload is refused at the key, the last good body serves.
    std::fs::remove_file(dir.path().join("429.html")).unwrap();
    sluice.signal("HUP");
    crate::support::eventually(std::time::Duration::from_secs(10), || async {
        let logs = sluice.logs().join("\n");
        logs.contains("responses.refused.body_file").then_some(())
    })
    .await;
    let (status, _, body) = from(&sluice, "/", "192.0.2.9").await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(body, EDITED);
}
