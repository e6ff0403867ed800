//! Running sluice as a sidecar: metrics, readiness, hot reload, graceful
//! shutdown, shadow policies and `on_failure`, against the built binary.

use crate::support;
use std::time::{Duration, Instant};

use crate::support::ops::{
    label_values, metric, promtool_check, refuses_connections, scrape, try_get, ConfigMapMount,
};
use crate::support::{
    clear_of_window_edge, eventually, get, header, parse_ratelimit, Sidecar, Upstream,
};
use http::StatusCode;
use serde_json::Value;

const HOUR: Duration = Duration::from_secs(3600);
/// Enough for any of these tests to finish inside one aligned window.
const EDGE_MARGIN: Duration = Duration::from_secs(20);
/// A reload is polled once a second; this leaves room for a slow machine.
const RELOAD_DEADLINE: Duration = Duration::from_secs(5);

const REQUESTS: &str = "sluice_requests_total";

/// A configuration with an admin listener. `store`, `policies` and
/// `routes` are the YAML bodies of those sections (indented two spaces).
fn config(upstream: &Upstream, server: &str, store: &str, policies: &str, routes: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
{server}upstream:
  url: {url}
store:
  kind: memory
{store}policies:
{policies}routes:
{routes}",
        url = upstream.url()
    )
}

/// Policy `p`, a fixed window of `limit` an hour, on route `api`
/// (`/api`, by client address) — the shape the reload tests rewrite.
fn fixed_window(upstream: &Upstream, limit: u32) -> String {
    config(
        upstream,
        "",
        "",
        &format!("  p: {{ algorithm: fixed-window, limit: {limit}, window: 1h }}\n"),
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: p }\n",
    )
}

fn admin(sluice: &Sidecar) -> std::net::SocketAddr {
    sluice.admin_addr().expect("the admin address is logged")
}

fn requests(text: &str, route: &str, policy: &str, outcome: &str) -> Option<f64> {
    metric(
        text,
        REQUESTS,
        &[("route", route), ("policy", policy), ("outcome", outcome)],
    )
}

/// Requests `/api` until one is answered 200 (after a reload raised the
/// limit), within [`RELOAD_DEADLINE`]; that response's headers.
async fn until_admitted(sluice: &Sidecar) -> http::HeaderMap {
    eventually(RELOAD_DEADLINE, || async {
        let (status, headers, _) = get(sluice.addr(), "/api", &[]).await;
        (status == StatusCode::OK).then_some(headers)
    })
    .await
}

/// Statuses of `n` sequential GETs of `/api`.
async fn statuses(sluice: &Sidecar, n: usize) -> Vec<StatusCode> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(get(sluice.addr(), "/api", &[]).await.0);
    }
    out
}

fn ok_then_429(ok: usize, denied: usize) -> Vec<StatusCode> {
    let mut v = vec![StatusCode::OK; ok];
    v.extend(vec![StatusCode::TOO_MANY_REQUESTS; denied]);
    v
}

/// Waits until `/metrics` shows `name{labels}` at `value`.
async fn metric_reaches(
    admin: std::net::SocketAddr,
    name: &str,
    labels: &[(&str, &str)],
    value: f64,
) {
    let reached = tokio::time::timeout(RELOAD_DEADLINE, async {
        loop {
            let text = scrape(admin).await;
            if metric(&text, name, labels) == Some(value) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    if reached.is_err() {
        let text = scrape(admin).await;
        panic!(
            "{name}{labels:?} is {:?}, not {value}, after {RELOAD_DEADLINE:?}\n{text}",
            metric(&text, name, labels)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_traffic_by_route_policy_and_outcome_and_never_show_identities() {
    const SECRET: &str = "sk_live_51Hq9ZxQ7vTOPSECRET";
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream,
        "",
        "",
        "  p: { algorithm: fixed-window, limit: 3, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: header:X-API-Key, policy: p }\n  \
         - { name: free, match: { path_prefix: /free }, policy: none }\n",
    ));
    let admin = admin(&sluice);
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    let mut got = Vec::new();
    for _ in 0..5 {
        got.push(
            get(sluice.addr(), "/api/x", &[("X-API-Key", SECRET)])
                .await
                .0,
        );
    }
    assert_eq!(got, ok_then_429(3, 2));
    for _ in 0..2 {
        assert_eq!(get(sluice.addr(), "/free", &[]).await.0, StatusCode::OK);
    }
    assert_eq!(upstream.count(), 5);

    let text = scrape(admin).await;
    let show = |what: &str| format!("{what}\n--- /metrics ---\n{text}");
    assert_eq!(
        requests(&text, "api", "p", "allowed"),
        Some(3.0),
        "{}",
        show("allowed")
    );
    assert_eq!(
        requests(&text, "api", "p", "denied"),
        Some(2.0),
        "{}",
        show("denied")
    );
    assert_eq!(
        requests(&text, "free", "none", "unlimited"),
        Some(2.0),
        "{}",
        show("unlimited")
    );
    let api_2xx = [("route", "api"), ("status_class", "2xx")];
    assert_eq!(
        metric(&text, "sluice_upstream_responses_total", &api_2xx),
        Some(3.0),
        "{}",
        show("2xx of api (denied requests are not forwarded)")
    );
    assert_eq!(
        metric(
            &text,
            "sluice_upstream_responses_total",
            &[("route", "free"), ("status_class", "2xx")]
        ),
        Some(2.0),
        "{}",
        show("2xx of free")
    );
    assert_eq!(
        metric(
            &text,
            "sluice_upstream_duration_seconds_count",
            &[("route", "api")]
        ),
        Some(3.0),
        "{}",
        show("upstream duration count")
    );
    // `policy: none` takes no decision, so only the five /api requests.
    assert_eq!(
        metric(
            &text,
            "sluice_decision_duration_seconds_count",
            &[("store", "memory"), ("source", "store")]
        ),
        Some(5.0),
        "{}",
        show("decision duration count")
    );
    let sub_millisecond = support::ops::samples(&text).into_iter().any(|s| {
        s.name == "sluice_decision_duration_seconds_bucket"
            && s.labels
                .iter()
                .any(|(k, v)| k == "le" && v.parse::<f64>().is_ok_and(|le| le < 0.001))
    });
    assert!(sub_millisecond, "{}", show("no decision bucket below 1 ms"));
    assert_eq!(
        metric(
            &text,
            "sluice_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0),
        "{}",
        show("build info")
    );
    assert_eq!(
        metric(&text, "sluice_config_revision", &[]),
        Some(1.0),
        "{}",
        show("revision")
    );
    assert_eq!(
        metric(&text, "sluice_forwarded_without_decision_total", &[]),
        Some(0.0),
        "{}",
        show("forwarded without decision")
    );

    assert!(
        !text.contains(SECRET),
        "{}",
        show("the raw API key is exposed")
    );
    let addresses: Vec<String> = label_values(&text)
        .into_iter()
        .filter(|v| v.contains("127.0.0.1"))
        .collect();
    assert!(
        addresses.is_empty(),
        "client addresses as labels: {addresses:?}"
    );
    promtool_check(&text);

    let logs = sluice.logs().join("\n");
    assert!(!logs.contains(SECRET), "the raw API key is logged:\n{logs}");

    // Metrics live on the admin port only: on the traffic port the path
    // is just another request for the application.
    let (_, _, body) = get(sluice.addr(), "/metrics", &[]).await;
    assert!(
        !String::from_utf8_lossy(&body).contains(REQUESTS),
        "the traffic port serves metrics"
    );
}

/// An upstream that holds every answer for 1.5 s, and a request to it in
/// flight when this returns.
async fn slow_request_in_flight(
    sluice: &Sidecar,
    upstream: &Upstream,
) -> tokio::task::JoinHandle<support::Reply> {
    upstream.set_delay(Duration::from_millis(1500));
    let addr = sluice.addr();
    let in_flight = tokio::spawn(async move { get(addr, "/slow", &[]).await });
    eventually(Duration::from_secs(5), || async {
        (upstream.count() == 1).then_some(())
    })
    .await;
    in_flight
}

/// Drains at once on SIGTERM (no shutdown delay), for up to 5 s.
const GRACEFUL: &str = "  shutdown_delay: 0s\n  shutdown_grace: 5s\n";

fn slow_route(upstream: &Upstream) -> String {
    config(
        upstream,
        GRACEFUL,
        "",
        "  p: { algorithm: fixed-window, limit: 100, window: 1h }\n",
        "  - { name: slow, match: { path_prefix: /slow }, subject: client_ip, policy: p }\n",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_is_200_when_serving_and_503_as_soon_as_shutdown_begins() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&slow_route(&upstream));
    let admin = admin(&sluice);

    let (status, _, body) = get(admin, "/healthz", &[]).await;
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_slice(&body).expect("a JSON /healthz body");
    assert_eq!(body["status"], "alive");
    let (status, _, body) = get(admin, "/readyz", &[]).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let body: Value = serde_json::from_slice(&body).expect("a JSON /readyz body");
    assert_eq!(body["status"], "ready");

    let in_flight = slow_request_in_flight(&sluice, &upstream).await;
    sluice.signal("TERM");
    // The admin listener stays up while traffic drains, so the kubelet
    // sees readiness fail rather than a closed port.
    let (status, body) = eventually(Duration::from_secs(1), || async {
        match try_get(admin, "/readyz").await {
            Ok((StatusCode::OK, _, _)) => None,
            Ok((status, _, body)) => Some((status, body)),
            Err(e) => panic!("/readyz unreachable while a request drains: {e}"),
        }
    })
    .await;
    assert!(
        !in_flight.is_finished(),
        "the slow request ended before readiness failed"
    );
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    let body: Value = serde_json::from_slice(&body).expect("a JSON /readyz body");
    assert_eq!(body["status"], "not ready");
    assert_eq!(body["reason"], "shutting down");
    let (status, _, _) = try_get(admin, "/healthz")
        .await
        .expect("/healthz while draining");
    assert_eq!(
        status,
        StatusCode::OK,
        "the process still lives while draining"
    );

    assert_eq!(
        in_flight.await.expect("the in-flight request").0,
        StatusCode::OK
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_the_request_in_flight_refuses_new_connections_and_exits_0() {
    let upstream = Upstream::start().await;
    let mut sluice = Sidecar::start(&slow_route(&upstream));
    let in_flight = slow_request_in_flight(&sluice, &upstream).await;

    let signalled = Instant::now();
    sluice.signal("TERM");
    let traffic = sluice.addr();
    eventually(Duration::from_secs(1), || async {
        refuses_connections(traffic).await.then_some(())
    })
    .await;
    assert!(
        !in_flight.is_finished(),
        "new connections were refused only after the slow request ended"
    );

    let (status, _, body) = in_flight.await.expect("the in-flight request");
    assert_eq!(status, StatusCode::OK, "the in-flight request was cut");
    assert_eq!(&body[..], b"upstream ok");

    let grace = Duration::from_secs(5);
    let exit = tokio::task::block_in_place(|| sluice.wait_exit(grace));
    let exit = exit.unwrap_or_else(|| panic!("still running {grace:?} after SIGTERM"));
    assert_eq!(
        exit.code(),
        Some(0),
        "exit status {exit}\n{}",
        sluice.stderr()
    );
    assert!(
        signalled.elapsed() < grace,
        "exited after {:?}",
        signalled.elapsed()
    );
    assert_eq!(upstream.count(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_through_a_configmap_symlink_swap_applies_the_new_limit() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&fixed_window(&upstream, 2));
    let admin = admin(&sluice);
    let mut mount = ConfigMapMount::adopt(sluice.config_path());
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    assert_eq!(statuses(&sluice, 3).await, ok_then_429(2, 1));
    let info_before = config_info(&scrape(admin).await);

    mount.update(&fixed_window(&upstream, 5));

    // A raised limit keeps the count: the request that sees the new limit
    // is the third of five.
    let headers = until_admitted(&sluice).await;
    let policy = header(&headers, "ratelimit-policy")
        .and_then(parse_ratelimit)
        .unwrap_or_else(|| panic!("no RateLimit-Policy: {headers:?}"));
    assert_eq!(policy.param("q"), Some(5));
    assert_eq!(statuses(&sluice, 5).await, ok_then_429(2, 3));

    let text = scrape(admin).await;
    let reloads = |result| metric(&text, "sluice_config_reloads_total", &[("result", result)]);
    assert_eq!(reloads("success"), Some(1.0), "{text}");
    assert_eq!(reloads("failure").unwrap_or(0.0), 0.0, "{text}");
    assert_eq!(
        metric(&text, "sluice_config_revision", &[]),
        Some(2.0),
        "{text}"
    );
    let info_after = config_info(&text);
    assert_ne!(
        info_after, info_before,
        "sluice_config_info kept the old hash"
    );
}

/// Policy `p` (a fixed window of `limit` per `window`) on route `api`.
fn fixed(upstream: &Upstream, limit: u32, window: &str) -> String {
    config(
        upstream,
        "",
        "",
        &format!("  p: {{ algorithm: fixed-window, limit: {limit}, window: {window} }}\n"),
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: p }\n",
    )
}

/// The INFO lines a reload wrote about policy `p`'s counts.
fn count_lines(sluice: &Sidecar) -> Vec<String> {
    sluice
        .logs()
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|v| v["target"] == "sluice::reload" && v["policy"] == "p")
        .filter_map(|v| v["message"].as_str().map(str::to_owned))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_lowered_or_raised_by_a_reload_keeps_the_counts_and_a_new_window_starts_afresh() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&fixed(&upstream, 3, "1h"));
    let mut mount = ConfigMapMount::adopt(sluice.config_path());
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    assert_eq!(statuses(&sluice, 3).await, ok_then_429(3, 0));

    // Lowered under the count: denied at once, nothing left, never below.
    mount.update(&fixed(&upstream, 2, "1h"));
    let headers = eventually(RELOAD_DEADLINE, || async {
        let (status, headers, _) = get(sluice.addr(), "/api", &[]).await;
        assert_ne!(status, StatusCode::OK, "admitted past a lowered limit");
        let policy = header(&headers, "ratelimit-policy").and_then(parse_ratelimit)?;
        (policy.param("q") == Some(2)).then_some(headers)
    })
    .await;
    let state = header(&headers, "ratelimit")
        .and_then(parse_ratelimit)
        .unwrap_or_else(|| panic!("no RateLimit: {headers:?}"));
    assert_eq!(state.param("r"), Some(0), "{headers:?}");

    // Raised again: the three already admitted still count.
    mount.update(&fixed(&upstream, 5, "1h"));
    until_admitted(&sluice).await;
    assert_eq!(statuses(&sluice, 2).await, ok_then_429(1, 1));
    assert_eq!(upstream.count(), 5);
    assert_eq!(
        count_lines(&sluice),
        [
            "policy's numbers changed: its counts are kept",
            "policy's numbers changed: its counts are kept"
        ],
        "{}",
        sluice.logs().join("\n")
    );

    // Another window means another count: the policy starts afresh.
    mount.update(&fixed(&upstream, 5, "2h"));
    until_admitted(&sluice).await;
    assert_eq!(statuses(&sluice, 5).await, ok_then_429(4, 1));
    assert_eq!(
        count_lines(&sluice).last().map(String::as_str),
        Some("policy changed what its counts mean: its counts start afresh")
    );
}

/// The hash labelling the one `sluice_config_info` series at 1.
fn config_info(text: &str) -> String {
    let current: Vec<String> = support::ops::samples(text)
        .into_iter()
        .filter(|s| s.name == "sluice_config_info" && s.value == 1.0)
        .filter_map(|s| {
            s.labels
                .into_iter()
                .find(|(k, _)| k == "hash")
                .map(|(_, v)| v)
        })
        .collect();
    match current.as_slice() {
        [hash] => hash.clone(),
        _ => panic!("not exactly one sluice_config_info at 1: {current:?}\n{text}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_and_a_rewritten_file_applies() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&fixed_window(&upstream, 2));
    let admin = admin(&sluice);
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    assert_eq!(statuses(&sluice, 3).await, ok_then_429(2, 1));

    // The file is unchanged, so only the signal can cause this reload; the
    // same policy keeps its counters.
    sluice.signal("HUP");
    metric_reaches(
        admin,
        "sluice_config_reloads_total",
        &[("result", "success")],
        1.0,
    )
    .await;
    assert_eq!(
        metric(&scrape(admin).await, "sluice_config_revision", &[]),
        Some(2.0)
    );
    assert_eq!(
        statuses(&sluice, 1).await,
        ok_then_429(0, 1),
        "a same-config reload reset counters"
    );

    std::fs::write(sluice.config_path(), fixed_window(&upstream, 5)).expect("rewrite the file");
    sluice.signal("HUP");
    // The raised limit applies to the count the old one left (2).
    until_admitted(&sluice).await;
    assert_eq!(statuses(&sluice, 5).await, ok_then_429(2, 3));
}

/// The `change` field of every "needs a restart" warning logged so far.
fn restart_warnings(sluice: &Sidecar) -> Vec<String> {
    sluice
        .logs()
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|json| {
            let fields = match json.get("fields") {
                Some(nested) if nested.get("message").is_some() => nested.clone(),
                _ => json.clone(),
            };
            let message = fields.get("message")?.as_str()?;
            if json.get("level")?.as_str()? != "WARN" || !message.contains("needs a restart") {
                return None;
            }
            Some(fields.get("change")?.as_str()?.to_owned())
        })
        .collect()
}

/// Policy `p` as in [`fixed_window`], under a server section of its own.
fn fixed_window_with_server(upstream: &Upstream, limit: u32, server: &str) -> String {
    config(
        upstream,
        server,
        "",
        &format!("  p: {{ algorithm: fixed-window, limit: {limit}, window: 1h }}\n"),
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: p }\n",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_the_live_part_and_names_each_boot_change_it_cannot_apply() {
    let upstream = Upstream::start().await;
    let frozen = "  header_read_timeout: 10s\n  max_header_bytes: 65536\n  shutdown_grace: 20s\n";
    let sluice = Sidecar::start(&fixed_window_with_server(&upstream, 2, frozen));
    let mut mount = ConfigMapMount::adopt(sluice.config_path());
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    assert_eq!(statuses(&sluice, 3).await, ok_then_429(2, 1));
    assert_eq!(restart_warnings(&sluice), Vec::<String>::new());

    // The limit (live) and two keys fixed at start change at once.
    let thawed = "  header_read_timeout: 3s\n  max_header_bytes: 65536\n  shutdown_grace: 5s\n";
    mount.update(&fixed_window_with_server(&upstream, 5, thawed));

    // The new limit applies (to the count the old one left)...
    until_admitted(&sluice).await;
    assert_eq!(statuses(&sluice, 5).await, ok_then_429(2, 3));
    // ...and each frozen key is named, once, the unchanged one and the
    // live one not at all.
    let warned = eventually(RELOAD_DEADLINE, || async {
        let warned = restart_warnings(&sluice);
        (warned.len() >= 2).then_some(warned)
    })
    .await;
    assert_eq!(
        warned,
        ["server.shutdown_grace", "server.header_read_timeout"],
        "{}",
        sluice.logs().join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_change_is_refused_counted_and_the_old_limits_keep_applying() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&fixed_window(&upstream, 2));
    let admin = admin(&sluice);
    let mut mount = ConfigMapMount::adopt(sluice.config_path());
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    assert_eq!(statuses(&sluice, 3).await, ok_then_429(2, 1));

    let invalid = fixed_window(&upstream, 5).replace("policy: p }", "policy: missing }");
    assert_ne!(invalid, fixed_window(&upstream, 5));
    mount.update(&invalid);
    metric_reaches(
        admin,
        "sluice_config_reloads_total",
        &[("result", "failure")],
        1.0,
    )
    .await;

    assert_eq!(
        statuses(&sluice, 2).await,
        ok_then_429(0, 2),
        "the old limit stopped applying"
    );
    let text = scrape(admin).await;
    assert_eq!(
        metric(&text, "sluice_config_revision", &[]),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(
            &text,
            "sluice_config_reloads_total",
            &[("result", "success")]
        )
        .unwrap_or(0.0),
        0.0,
        "{text}"
    );
    assert_eq!(get(admin, "/readyz", &[]).await.0, StatusCode::OK);
    let logs = sluice.logs();
    assert!(
        logs.iter()
            .any(|l| l.contains("ERROR") && l.contains("missing")),
        "the refusal is not logged with its error:\n{}",
        logs.join("\n")
    );

    // Fixed, it applies; the bad file was counted once, not once a poll.
    mount.update(&fixed_window(&upstream, 5));
    until_admitted(&sluice).await;
    let text = scrape(admin).await;
    assert_eq!(
        metric(
            &text,
            "sluice_config_reloads_total",
            &[("result", "success")]
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &text,
            "sluice_config_reloads_total",
            &[("result", "failure")]
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_policy_forwards_everything_and_counts_shadow_denials() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&config(
        &upstream,
        "",
        "",
        "  p: { algorithm: fixed-window, limit: 2, window: 1h, shadow: true }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: p }\n",
    ));
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    for i in 0..6 {
        let (status, headers, _) = get(sluice.addr(), "/api", &[]).await;
        assert_eq!(status, StatusCode::OK, "request {i}");
        for name in ["ratelimit", "ratelimit-policy", "retry-after"] {
            assert!(
                headers.get(name).is_none(),
                "request {i} carries {name}: {headers:?}"
            );
        }
    }
    assert_eq!(upstream.count(), 6);

    let text = scrape(admin(&sluice)).await;
    assert_eq!(requests(&text, "api", "p", "allowed"), Some(2.0), "{text}");
    assert_eq!(
        requests(&text, "api", "p", "shadow_denied"),
        Some(4.0),
        "{text}"
    );
    assert_eq!(requests(&text, "api", "p", "denied"), Some(0.0), "{text}");
    assert_eq!(
        metric(
            &text,
            "sluice_upstream_responses_total",
            &[("route", "api"), ("status_class", "2xx")]
        ),
        Some(6.0),
        "{text}"
    );
}

/// A memory store with room for `entries` subjects: `/api` by API key (2 an
/// hour), `/ip` by client address behind a trusted loopback proxy.
fn small_store(upstream: &Upstream, entries: usize) -> String {
    config(
        upstream,
        "",
        &format!("  max_entries: {entries}\n  on_failure: deny\n"),
        "  p: { algorithm: fixed-window, limit: 2, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: header:X-API-Key, policy: p }
  - { name: ip, match: { path_prefix: /ip }, subject: client_ip, policy: p }
",
    )
    .replace(
        "store:\n",
        "identity:\n  trusted_proxies: [127.0.0.0/8]\nstore:\n",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_memory_store_evicts_the_cheapest_entry_and_keeps_the_refusing_one() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&small_store(&upstream, 2));
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    let key = |k: &'static str| [("X-API-Key", k)];

    // `spent` used its two and is refused; `once` made one request.
    for _ in 0..2 {
        assert_eq!(
            get(sluice.addr(), "/api", &key("spent")).await.0,
            StatusCode::OK
        );
    }
    assert_eq!(
        get(sluice.addr(), "/api", &key("spent")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        get(sluice.addr(), "/api", &key("once")).await.0,
        StatusCode::OK
    );
    // The store is full: a newcomer is decided, not refused.
    assert_eq!(
        get(sluice.addr(), "/api", &key("new")).await.0,
        StatusCode::OK
    );
    // The refusing entry was kept, so forgetting cost no extra admission.
    assert_eq!(
        get(sluice.addr(), "/api", &key("spent")).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(upstream.count(), 4);

    let text = eventually(RELOAD_DEADLINE, || async {
        let text = scrape(admin(&sluice)).await;
        (metric(&text, "sluice_memory_store_evictions_total", &[]) >= Some(1.0)).then_some(text)
    })
    .await;
    assert_eq!(
        requests(&text, "api", "p", "unavailable"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "sluice_forwarded_without_decision_total", &[]),
        Some(0.0),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_one_request_subjects_locks_nobody_out() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&small_store(&upstream, 200));
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    let addr = sluice.addr();
    for _ in 0..2 {
        assert_eq!(
            get(addr, "/api", &[("X-API-Key", "spent")]).await.0,
            StatusCode::OK
        );
    }
    // Ten times the store's room in fresh keys, one request each.
    let client = support::client::http1_client();
    let mut flood = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let client = client.clone();
        flood.spawn(async move {
            let mut statuses = Vec::new();
            for n in 0..250 {
                let key = format!("flood-{worker}-{n}");
                let request = support::client::build(
                    addr,
                    http::Method::GET,
                    "/api",
                    &[("X-API-Key", &key)],
                    bytes::Bytes::new(),
                );
                statuses.push(support::client::send(&client, request).await.0);
            }
            statuses
        });
    }
    let mut statuses = Vec::new();
    while let Some(done) = flood.join_next().await {
        statuses.extend(done.expect("flood task"));
    }
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "{statuses:?}"
    );

    // After it: a new key and a new address on another route are decided;
    // the spent key is still refused.
    assert_eq!(
        get(addr, "/api", &[("X-API-Key", "new")]).await.0,
        StatusCode::OK
    );
    assert_eq!(
        get(addr, "/ip", &[("X-Forwarded-For", "192.0.2.7")])
            .await
            .0,
        StatusCode::OK
    );
    assert_eq!(
        get(addr, "/api", &[("X-API-Key", "spent")]).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    let text = scrape(admin(&sluice)).await;
    assert_eq!(
        requests(&text, "api", "p", "unavailable"),
        Some(0.0),
        "{text}"
    );
    assert_eq!(
        requests(&text, "ip", "p", "unavailable"),
        Some(0.0),
        "{text}"
    );
}

#[tokio::test]
async fn malformed_requests_are_counted_by_reason_and_never_reach_the_upstream() {
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&fixed_window(&upstream, 100));
    let twice = b"GET /api HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n";
    let zipped =
        b"POST /api HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n";
    assert_eq!(
        support::raw_exchange(sluice.addr(), twice).await.status,
        400
    );
    assert_eq!(
        support::raw_exchange(sluice.addr(), twice).await.status,
        400
    );
    assert_eq!(
        support::raw_exchange(sluice.addr(), zipped).await.status,
        501
    );
    let unframed = b"POST /api HTTP/1.1\r\nHost: a.test\r\nTransfer-Encoding: gzip\r\n\r\n";
    assert_eq!(
        support::raw_exchange(sluice.addr(), unframed).await.status,
        400
    );

    let text = scrape(admin(&sluice)).await;
    let refused = |reason: &str| {
        metric(
            &text,
            "sluice_requests_refused_total",
            &[("reason", reason)],
        )
    };
    assert_eq!(refused("duplicate_host"), Some(2.0), "{text}");
    assert_eq!(refused("transfer_coding"), Some(1.0), "{text}");
    assert_eq!(refused("unframed_body"), Some(1.0), "{text}");
    assert_eq!(upstream.count(), 0);
    promtool_check(&text);
}

/// One request on an open connection, read whole; the response head.
async fn request_on(stream: &mut tokio::net::TcpStream, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!("GET {path} HTTP/1.1\r\nHost: sluice.test\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let (head, mut body) = support::read_head(stream).await;
    let length =
        support::content_length(&head).unwrap_or_else(|| panic!("no Content-Length: {head}"));
    let mut chunk = [0u8; 1024];
    while body.len() < length {
        let n = stream.read(&mut chunk).await.expect("read the body");
        assert!(n > 0, "closed inside the body");
        body.extend_from_slice(&chunk[..n]);
    }
    head
}

fn says_close(head: &str) -> bool {
    head.lines().any(|l| {
        l.split_once(':').is_some_and(|(name, value)| {
            name.eq_ignore_ascii_case("connection") && value.trim().eq_ignore_ascii_case("close")
        })
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_sigterm_sluice_serves_for_the_shutdown_delay_asking_clients_to_close_then_drains() {
    let upstream = Upstream::start().await;
    let delay = Duration::from_secs(2);
    let mut sluice = Sidecar::start(&config(
        &upstream,
        "  shutdown_delay: 2s\n  shutdown_grace: 5s\n",
        "",
        "  p: { algorithm: fixed-window, limit: 100, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: p }\n",
    ));
    let admin = admin(&sluice);
    let traffic = sluice.addr();
    let mut kept = tokio::net::TcpStream::connect(traffic)
        .await
        .expect("connect");
    let head = request_on(&mut kept, "/api/before").await;
    assert_eq!(support::parse_status(&head), 200, "{head}");
    assert!(!says_close(&head), "closed before any signal: {head}");

    let signalled = Instant::now();
    sluice.signal("TERM");
    eventually(Duration::from_secs(1), || async {
        matches!(
            try_get(admin, "/readyz").await,
            Ok((StatusCode::SERVICE_UNAVAILABLE, _, _))
        )
        .then_some(())
    })
    .await;
    // Not ready, but still serving: the kept-alive connection gets its
    // answer and is asked to close; a new connection is accepted and served.
    let head = request_on(&mut kept, "/api/during").await;
    assert_eq!(support::parse_status(&head), 200, "{head}");
    assert!(
        says_close(&head),
        "no Connection: close during the delay: {head}"
    );
    let mut rest = Vec::new();
    let read = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::io::AsyncReadExt::read_to_end(&mut kept, &mut rest),
    )
    .await;
    assert!(
        matches!(read, Ok(Ok(0))),
        "the connection stayed open after Connection: close: {read:?}"
    );
    let (status, headers, _) = get(traffic, "/api/new", &[]).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&headers, "connection"), Some("close"));
    assert!(
        signalled.elapsed() < delay,
        "the checks above outlasted the delay ({:?}); they prove nothing",
        signalled.elapsed()
    );

    // Then the drain: new connections refused, exit 0, no sooner than the delay.
    eventually(Duration::from_secs(4), || async {
        refuses_connections(traffic).await.then_some(())
    })
    .await;
    assert!(
        signalled.elapsed() >= delay,
        "refused after {:?}, before the {delay:?} delay",
        signalled.elapsed()
    );
    let exit = tokio::task::block_in_place(|| sluice.wait_exit(Duration::from_secs(5)))
        .expect("exited after the drain");
    assert_eq!(exit.code(), Some(0), "{}", sluice.stderr());
    assert_eq!(upstream.count(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_drains_at_once_whatever_the_shutdown_delay() {
    let upstream = Upstream::start().await;
    let mut sluice = Sidecar::start(&config(
        &upstream,
        "  shutdown_delay: 30s\n",
        "",
        "  p: { algorithm: fixed-window, limit: 100, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: p }\n",
    ));
    let signalled = Instant::now();
    sluice.signal("INT");
    let exit = tokio::task::block_in_place(|| sluice.wait_exit(Duration::from_secs(5)))
        .expect("SIGINT waited for the shutdown delay");
    assert_eq!(exit.code(), Some(0), "{}", sluice.stderr());
    assert!(signalled.elapsed() < Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_signal_exits_at_once_without_waiting_for_the_drain() {
    let upstream = Upstream::start().await;
    let mut sluice = Sidecar::start(&slow_route(&upstream));
    let in_flight = slow_request_in_flight(&sluice, &upstream).await;

    sluice.signal("TERM");
    let traffic = sluice.addr();
    // The first signal has been taken once the listener refuses.
    eventually(Duration::from_secs(1), || async {
        refuses_connections(traffic).await.then_some(())
    })
    .await;
    let second = Instant::now();
    sluice.signal("TERM");
    let exit = tokio::task::block_in_place(|| sluice.wait_exit(Duration::from_secs(5)))
        .expect("exited after the second signal");
    assert!(
        second.elapsed() < Duration::from_millis(1000),
        "took {:?}: the second signal waited for the drain",
        second.elapsed()
    );
    assert_ne!(
        exit.code(),
        Some(0),
        "an interrupted drain is not a clean exit"
    );
    // The request that was in flight was cut rather than completed.
    assert!(in_flight.await.is_err());
}
