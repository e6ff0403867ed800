//! The memory store's bound comes from the memory sluice really has: run
//! under a real cgroup memory limit, with `max_entries` not written, sluice
//! derives its bound from the limit, makes room for new subjects beyond
//! it by evicting (never growing past it), keeps the subjects that matter,
//! and is never killed. With a small `max_entries`: what a full store keeps
//! under a flood (a spent subject, the subject refused longest).

use crate::support;
use crate::support::cgroup::{rss_bytes, MemoryCgroup};
use std::sync::Arc;
use std::time::Duration;

use crate::support::client::{build, http1_client, send};
use crate::support::{clear_of_window_edge, get, Sidecar, Upstream};
use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// (50 MiB − the 48 MiB reserve) ÷ 320 bytes: 6,553 subjects.
const LIMIT_BYTES: u64 = 50 << 20;
const EXPECTED_ENTRIES: u64 = 6_553;

fn config(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {}
store:
  kind: memory
  on_failure: deny
policies:
  p: {{ algorithm: fixed-window, limit: 100, window: 1h }}
routes:
  - {{ name: api, match: {{ path_prefix: /api }}, subject: header:X-Key, policy: p }}
",
        upstream.url()
    )
}

fn bound_line(sidecar: &Sidecar) -> Option<Value> {
    sidecar.logs().iter().find_map(|line| {
        let v: Value = serde_json::from_str(line).ok()?;
        let flat = v.get("fields").cloned().unwrap_or_else(|| v.clone());
        flat.get("max_entries").is_some().then_some(flat)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_memory_limit_new_subjects_meet_the_store_s_bound_before_the_kernel_s() {
    let upstream = Upstream::start().await;
    let cgroup = MemoryCgroup::new(LIMIT_BYTES);
    let enter = format!("echo $$ > '{}' && exec \"$@\"", cgroup.procs());
    let sluice = Sidecar::start_via(&config(&upstream), &[], &["sh", "-c", &enter, "sh"]);
    clear_of_window_edge(Duration::from_secs(3600), Duration::from_secs(30)).await;

    let bound = bound_line(&sluice).expect("the bound is logged at start");
    assert_eq!(
        bound["max_entries"].as_u64(),
        Some(EXPECTED_ENTRIES),
        "{bound}"
    );
    assert_eq!(
        bound["memory_limit_bytes"].as_u64(),
        Some(LIMIT_BYTES),
        "{bound}"
    );

    // One request per subject, up to the bound, over a few connections.
    let addr = sluice.addr();
    let client = http1_client();
    let gate = Arc::new(Semaphore::new(16));
    let mut flood = JoinSet::new();
    for n in 0..EXPECTED_ENTRIES {
        let permit = gate.clone().acquire_owned().await.expect("semaphore");
        let client = client.clone();
        flood.spawn(async move {
            let key = format!("subject-{n}");
            let request = build(addr, Method::GET, "/api", &[("X-Key", &key)], Bytes::new());
            let status = send(&client, request).await.0;
            drop(permit);
            status
        });
    }
    let mut refused = 0;
    while let Some(status) = flood.join_next().await {
        if status.expect("request task") != StatusCode::OK {
            refused += 1;
        }
    }
    assert_eq!(refused, 0, "every subject within the bound is served");
    assert_eq!(upstream.count() as u64, EXPECTED_ENTRIES);

    // A subject that keeps coming is worth more than any one-request one.
    for _ in 0..5 {
        assert_eq!(
            get(addr, "/api", &[("X-Key", "regular")]).await.0,
            StatusCode::OK
        );
    }

    // Beyond the bound: new subjects are still decided (each evicts an
    // entry that admitted least), and the store does not grow.
    for n in 0..2_000 {
        let key = format!("newcomer-{n}");
        assert_eq!(
            get(addr, "/api", &[("X-Key", &key)]).await.0,
            StatusCode::OK,
            "{key}"
        );
    }
    let admin = sluice.admin_addr().expect("an admin port");
    // One entry per shard of overshoot at most (8 shards at this size);
    // the sweeper publishes both once a second, so the last second's
    // newcomers may not be counted yet.
    support::eventually(Duration::from_secs(5), || async {
        let text = support::ops::scrape(admin).await;
        let held = support::ops::metric(&text, "sluice_memory_store_subjects", &[])?;
        let evicted = support::ops::metric(&text, "sluice_memory_store_evictions_total", &[])?;
        (held <= (EXPECTED_ENTRIES + 8) as f64 && evicted >= 1_900.0).then_some(())
    })
    .await;
    // The regular subject was kept: its count went on (limit 100: 6 used).
    let (status, headers, _) = get(addr, "/api", &[("X-Key", "regular")]).await;
    assert_eq!(status, StatusCode::OK);
    let remaining = support::client::header(&headers, "ratelimit")
        .and_then(support::parse_ratelimit)
        .and_then(|item| item.param("r"));
    assert_eq!(remaining, Some(94), "{headers:?}");

    // The store stopped well inside the limit: the kernel never had to act.
    let rss = rss_bytes(sluice.pid());
    assert!(
        rss > 0 && rss < LIMIT_BYTES,
        "RSS {rss} under a {LIMIT_BYTES}-byte limit"
    );
    assert_eq!(cgroup.limit_hits(), 0, "the cgroup's limit was reached");
    drop(sluice);
}

/// A memory store of 16 entries (one shard, so every newcomer's sample
/// can reach every entry) shared by a cheap route (`small`: 5 an hour,
/// or `once`: 1 an hour) and a costly one (`cost: 50` of 100 an hour).
fn small_store(upstream: &Upstream) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {}
store:
  kind: memory
  max_entries: 16
  on_failure: deny
policies:
  small: {{ algorithm: fixed-window, limit: 5, window: 1h }}
  once: {{ algorithm: fixed-window, limit: 1, window: 1h }}
  costly: {{ algorithm: fixed-window, limit: 100, window: 1h }}
routes:
  - {{ name: api, match: {{ path: /api }}, subject: header:X-Key, policy: small }}
  - {{ name: login, match: {{ path: /login }}, subject: header:X-Key, policy: once }}
  - {{ name: export, match: {{ path: /export }}, subject: header:X-Key, policy: costly, cost: 50 }}
",
        upstream.url()
    )
}

/// `path` as `key`: the status and the `r` of its `RateLimit`.
async fn ask(sluice: &Sidecar, path: &str, key: &str) -> (StatusCode, Option<u64>) {
    let (status, headers, _) = get(sluice.addr(), path, &[("X-Key", key)]).await;
    let remaining = support::client::header(&headers, "ratelimit")
        .and_then(support::parse_ratelimit)
        .and_then(|item| item.param("r"));
    (status, remaining)
}

/// Waits until the store has evicted at least `n` entries.
async fn evicted_at_least(sluice: &Sidecar, n: f64) {
    let admin = sluice.admin_addr().expect("an admin port");
    support::eventually(Duration::from_secs(5), || async {
        let text = support::ops::scrape(admin).await;
        let evicted = support::ops::metric(&text, "sluice_memory_store_evictions_total", &[])?;
        (evicted >= n).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_spent_subject_never_refused_outlives_a_flood_on_a_costly_route() {
    clear_of_window_edge(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&small_store(&upstream));
    for _ in 0..5 {
        assert_eq!(ask(&sluice, "/api", "spent").await.0, StatusCode::OK);
    }
    // One request each on the costly route: 50 units, ten times what the
    // spent subject ever had, half of their own limit.
    for n in 0..300 {
        let (status, remaining) = ask(&sluice, "/export", &format!("flood-{n}")).await;
        assert_eq!((status, remaining), (StatusCode::OK, Some(50)), "flood-{n}");
    }
    evicted_at_least(&sluice, 280.0).await;
    let (status, _) = ask(&sluice, "/api", "spent").await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the spent subject was forgotten"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn of_subjects_refused_until_one_window_edge_the_one_refused_longest_outlives_a_flood() {
    clear_of_window_edge(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let upstream = Upstream::start().await;
    let sluice = Sidecar::start(&small_store(&upstream));
    assert_eq!(ask(&sluice, "/login", "first").await.0, StatusCode::OK);
    assert_eq!(
        ask(&sluice, "/login", "first").await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Each newcomer pushed over its limit too: every one of them is
    // refused until the same edge of the hour.
    for n in 0..300 {
        let key = format!("flood-{n}");
        assert_eq!(
            ask(&sluice, "/login", &key).await.0,
            StatusCode::OK,
            "{key}"
        );
        assert_eq!(
            ask(&sluice, "/login", &key).await.0,
            StatusCode::TOO_MANY_REQUESTS,
            "{key}"
        );
    }
    evicted_at_least(&sluice, 280.0).await;
    assert_eq!(
        ask(&sluice, "/login", "first").await.0,
        StatusCode::TOO_MANY_REQUESTS,
        "the subject refused longest was forgotten"
    );
}
