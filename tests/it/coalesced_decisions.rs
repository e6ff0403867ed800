//! Coalesced decisions (`store.coalesce`) through the built binary:
//! sidecars sharing one Redis, and a Redis Cluster, under concurrency, with
//! decisions batched (fewer `FCALL`s than decisions) and every subject's
//! limit exact; `coalesce: off` sends one call per decision.
//!
//! Every test takes [`SERIAL`]: each starts Redis and several sidecars.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::task::JoinSet;

use crate::support::client::{build, http1_client, send};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{commandstats, redis_yaml, reset_stats, sample, start_ready};
use crate::support::topology::RedisCluster;
use crate::support::{clear_of_window_edge, Sidecar, Upstream};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const HOUR: Duration = Duration::from_secs(3600);
const EDGE_MARGIN: Duration = Duration::from_secs(30);

/// 5 an hour per API key, no over-limit cache (every request asks
/// Redis), a budget long enough for a busy two-core machine.
fn yaml(upstream: &Upstream, store_lines: &str, coalesce: &str) -> String {
    let yaml = redis_yaml(
        upstream,
        "URL",
        "  fw: { algorithm: fixed-window, limit: 5, window: 1h }\n",
        "  - { name: fw, match: { path_prefix: /fw }, subject: header:X-API-Key, policy: fw }\n",
    );
    yaml.replace("  url: URL\n", store_lines)
        .replace(
            "  budget: 50ms\n",
            &format!("  budget: 1s\n  coalesce: {coalesce}\n"),
        )
        .replace(
            "  deny_cache_entries: 100000\n",
            "  deny_cache_entries: 0\n",
        )
}

/// `per_subject` requests for each of `subjects` API keys, round-robin
/// over `addrs`, at most `concurrency` in flight; statuses per key.
async fn per_subject(
    addrs: &[SocketAddr],
    subjects: usize,
    per_subject: usize,
    concurrency: usize,
) -> HashMap<String, Vec<StatusCode>> {
    let client = http1_client();
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    for i in 0..subjects * per_subject {
        let (client, gate) = (client.clone(), gate.clone());
        let addr = addrs[i % addrs.len()];
        let key = format!("key-{}", i % subjects);
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore open");
            let req = build(
                addr,
                Method::GET,
                "/fw",
                &[("x-api-key", &key)],
                Bytes::new(),
            );
            (key, send(&client, req).await.0)
        });
    }
    let mut out: HashMap<String, Vec<StatusCode>> = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        let (key, status) = done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        out.entry(key).or_default().push(status);
    }
    out
}

/// Every subject got exactly 5 admitted and the rest refused; the total
/// admitted.
fn exact(statuses: &HashMap<String, Vec<StatusCode>>, subjects: usize) -> usize {
    assert_eq!(statuses.len(), subjects);
    let mut admitted = 0;
    for (key, s) in statuses {
        let ok = s.iter().filter(|s| **s == StatusCode::OK).count();
        let refused = s
            .iter()
            .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
            .count();
        assert_eq!((ok, refused), (5, s.len() - 5), "{key}: {s:?}");
        admitted += ok;
    }
    admitted
}

/// Summed over `sidecars`.
async fn total(sidecars: &[Sidecar], name: &str) -> f64 {
    let mut total = 0.0;
    for sluice in sidecars {
        total += sample(sluice, name, &[]).await.unwrap_or(0.0);
    }
    total
}

fn fcalls(conn: &mut redis::Connection) -> u64 {
    commandstats(conn)
        .iter()
        .find(|(name, _)| name == "fcall")
        .map_or(0, |(_, calls)| *calls)
}

async fn three_sidecars_on_one_redis(coalesce: &str) -> (u64, f64, f64) {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let yaml = yaml(&upstream, &format!("  url: {}\n", redis.url()), coalesce);
    let sidecars = [
        start_ready(&yaml).await,
        start_ready(&yaml).await,
        start_ready(&yaml).await,
    ];
    let addrs: Vec<_> = sidecars.iter().map(Sidecar::addr).collect();
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    let mut conn = redis.connection();
    reset_stats(&mut conn);

    let (subjects, each) = (40, 12);
    let statuses = per_subject(&addrs, subjects, each, 64).await;

    let admitted = exact(&statuses, subjects);
    assert_eq!(upstream.count(), admitted, "requests that reached the app");
    let batches = total(&sidecars, "sluice_redis_batches_total").await;
    let batched = total(&sidecars, "sluice_redis_batched_decisions_total").await;
    let calls = fcalls(&mut conn);
    let decisions = (subjects * each) as u64;
    assert!(
        calls <= decisions,
        "{calls} FCALLs for {decisions} decisions"
    );
    (calls, batches, batched)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sidecars_batch_their_decisions_and_admit_exactly_the_limit() {
    let _serial = SERIAL.lock().await;
    let (calls, batches, batched) = three_sidecars_on_one_redis("on").await;
    assert!(batches >= 1.0, "no batch: {calls} calls");
    assert!(batched >= 2.0 * batches, "{batched} in {batches} batches");
    // Each batch of n decisions is one call instead of n.
    assert!(
        calls as f64 <= 480.0 - (batched - batches),
        "{calls} FCALLs, {batched} decisions in {batches} batches"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_coalesce_off_each_decision_is_its_own_call() {
    let _serial = SERIAL.lock().await;
    let (calls, batches, batched) = three_sidecars_on_one_redis("off").await;
    assert_eq!((calls, batches, batched), (480, 0.0, 0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_batches_per_slot_and_admits_exactly_the_limit() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let lines = format!(
        "  topology: cluster\n  nodes: {}\n",
        RedisCluster::yaml_list(&cluster.urls()[..1])
    );
    let yaml = yaml(&upstream, &lines, "on");
    let sidecars = [start_ready(&yaml).await, start_ready(&yaml).await];
    let addrs: Vec<_> = sidecars.iter().map(Sidecar::addr).collect();
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    // Few hot subjects, many requests each: a subject's requests share a
    // slot, so they batch; the subjects are spread over every primary.
    let (subjects, each) = (6, 40);
    let statuses = per_subject(&addrs, subjects, each, 64).await;

    let admitted = exact(&statuses, subjects);
    assert_eq!(upstream.count(), admitted, "requests that reached the app");
    let batches = total(&sidecars, "sluice_redis_batches_total").await;
    assert!(batches >= 1.0, "no batch on the cluster");
    // Never CROSSSLOT, nor any other script error.
    for sluice in &sidecars {
        let errors = sample(
            sluice,
            "sluice_store_errors_total",
            &[("kind", "script_errors")],
        )
        .await
        .unwrap_or(0.0);
        assert_eq!(errors, 0.0, "{}", sluice.logs().join("\n"));
        let refused = sample(sluice, "sluice_store_errors_total", &[("kind", "refused")])
            .await
            .unwrap_or(0.0);
        assert_eq!(refused, 0.0, "{}", sluice.logs().join("\n"));
    }
}
