//! The Redis store on the topologies production runs: a Redis Cluster
//! (three primaries, a replica each), a Sentinel-managed primary, and a
//! stable address in front of whichever node is primary. Through the built
//! binary, on real servers: exact limits across sidecars and shards,
//! failovers and resharding under load with nothing forwarded undecided,
//! recovery within 2 s of the new primary taking writes, readiness that
//! follows, TLS and a least-privilege user on the cluster.
//!
//! Every test takes [`SERIAL`]: each starts up to nine Redis processes and
//! several sidecars, and on two cores they would crowd each other's
//! budgets.

use crate::support;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::task::JoinSet;

use crate::support::client::{build, http1_client, send};
use crate::support::redis::{tls_files, RedisServer};
use crate::support::redis_sidecar::{
    readyz, readyz_becomes, redis_yaml, sample, start_ready, Load, Shot,
};
use crate::support::topology::{sentinel_tls_builder, RedisCluster, Relay, SentinelSet};
use crate::support::{clear_of_window_edge, Sidecar, Upstream};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const HOUR: Duration = Duration::from_secs(3600);
const EDGE_MARGIN: Duration = Duration::from_secs(30);

/// The recovery target: decisions succeed again this soon after the new
/// primary takes writes.
const RECOVERY: Duration = Duration::from_secs(2);

/// [`redis_yaml`] with `store.url` replaced by `store_lines` (each a
/// complete line under `store:`) and the budget raised to `budget`.
pub(crate) fn yaml_with(
    upstream: &Upstream,
    store_lines: &str,
    budget: &str,
    policies: &str,
    routes: &str,
) -> String {
    let yaml = redis_yaml(upstream, "URL", policies, routes);
    assert!(yaml.contains("  url: URL\n") && yaml.contains("  budget: 50ms\n"));
    yaml.replace("  url: URL\n", store_lines)
        .replace("  budget: 50ms\n", &format!("  budget: {budget}\n"))
}

fn cluster_lines(urls: &[String]) -> String {
    format!(
        "  topology: cluster\n  nodes: {}\n",
        RedisCluster::yaml_list(urls)
    )
}

/// One policy per algorithm, 5 an hour per API key, and a route to each.
const POLICIES: &str = "  fw: { algorithm: fixed-window, limit: 5, window: 1h }
  sc: { algorithm: sliding-counter, limit: 5, window: 1h }
  sl: { algorithm: sliding-log, limit: 5, window: 1h }
  tb: { algorithm: token-bucket, capacity: 5, refill_tokens: 1, refill_every: 1h }
  gc: { algorithm: gcra, limit: 5, window: 1h, burst: 5 }
";
const ALGORITHMS: [&str; 5] = ["fw", "sc", "sl", "tb", "gc"];

fn routes() -> String {
    ALGORITHMS
        .iter()
        .map(|a| {
            format!(
                "  - {{ name: {a}, match: {{ path_prefix: /{a} }}, subject: header:X-API-Key, policy: {a} }}\n"
            )
        })
        .collect()
}

/// `per_subject` requests for each of `subjects` API keys, round-robin
/// over `addrs`, at most `concurrency` in flight; statuses per key.
async fn per_subject(
    addrs: &[SocketAddr],
    path: &str,
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
        let path = path.to_owned();
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore open");
            let req = build(
                addr,
                Method::GET,
                &path,
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

fn admitted(statuses: &[StatusCode]) -> usize {
    statuses.iter().filter(|s| **s == StatusCode::OK).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_sidecars_on_a_cluster_admit_exactly_the_limit_of_every_subject() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let yaml = yaml_with(
        &upstream,
        &cluster_lines(&cluster.urls()[..1]),
        "1s",
        POLICIES,
        &routes(),
    );
    let sidecars = [
        start_ready(&yaml).await,
        start_ready(&yaml).await,
        start_ready(&yaml).await,
    ];
    let addrs: Vec<_> = sidecars.iter().map(Sidecar::addr).collect();
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    let subjects = 12;
    let mut forwarded = 0;
    for a in ALGORITHMS {
        let statuses = per_subject(&addrs, &format!("/{a}"), subjects, 25, 30).await;
        assert_eq!(statuses.len(), subjects);
        for (key, s) in &statuses {
            let other = s
                .iter()
                .filter(|s| **s != StatusCode::OK && **s != StatusCode::TOO_MANY_REQUESTS)
                .count();
            assert_eq!(other, 0, "{a} {key}: {s:?}");
            if a == "sc" {
                // Approximate by design; with no previous window it may
                // never admit more than the limit.
                assert!(admitted(s) <= 5, "{a} {key}: {s:?}");
            } else {
                assert_eq!(admitted(s), 5, "{a} {key}: {s:?}");
            }
            forwarded += admitted(s);
        }
    }
    assert_eq!(upstream.count(), forwarded, "requests that reached the app");
    // The subjects really are spread over every primary.
    for primary in cluster.primaries() {
        let keys = cluster.keys(primary);
        assert!(
            keys.iter().any(|k| k.starts_with("sluice:")),
            "primary {primary} holds no subject: {keys:?}"
        );
    }

    // A second later, the subjects the over-limit caches answer have
    // their keys touched, each on its own primary, none dropped.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for sluice in &sidecars {
        for i in 0..subjects {
            let key = format!("key-{i}");
            let (status, _, _) = support::get(sluice.addr(), "/fw", &[("x-api-key", &key)]).await;
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{key}");
        }
    }
    let events = |kind: &'static str| {
        let sidecars = &sidecars;
        async move {
            let mut total = 0.0;
            for sluice in sidecars {
                total += sample(sluice, "sluice_store_events_total", &[("kind", kind)])
                    .await
                    .unwrap_or(0.0);
            }
            total
        }
    };
    let polled = Instant::now();
    let touched = loop {
        let n = events("touched").await;
        if n >= 1.0 {
            break n;
        }
        assert!(
            polled.elapsed() < Duration::from_secs(5),
            "no touch: {} dropped\n{}",
            events("touches_dropped").await,
            sidecars[0].logs().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(touched <= (3 * subjects) as f64, "{touched} touches");
    let dropped = events("touches_dropped").await;
    assert_eq!(
        dropped,
        0.0,
        "{:?}",
        sidecars
            .iter()
            .flat_map(|s| s.logs())
            .filter(|l| l.contains("TOUCH"))
            .collect::<Vec<_>>()
    );
}

/// What a least-privilege user on a cluster needs: the standalone line
/// plus `CLUSTER SLOTS`, which sluice reads the slot map from, and
/// `ASKING`, sent before a command to a slot being moved.
const CLUSTER_ACL: &str = "user sluice on >pw resetchannels ~sluice:* -@all \
     +fcall +function|load +function|list +function|delete +ping +time +get +set +pexpire +touch \
     +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore +cluster|slots +asking";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_with_a_least_privilege_user_limits_exactly() {
    let _serial = SERIAL.lock().await;
    let certs = tempfile::tempdir().expect("temp dir");
    let tls = tls_files(certs.path());
    let cluster = RedisCluster::builder()
        .tls(tls.clone())
        .config(CLUSTER_ACL)
        .start();
    let urls = cluster.urls_as("sluice", "pw");
    assert!(urls.iter().all(|u| u.starts_with("rediss://sluice:pw@")));
    // The user really cannot EVAL.
    let client = redis::Client::build_with_tls(
        urls[0].as_str(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(&tls.ca).expect("CA")),
        },
    )
    .expect("client");
    let mut conn = client.get_connection().expect("connect as sluice");
    let eval: redis::RedisResult<i64> = redis::cmd("EVAL").arg("return 1").arg(0).query(&mut conn);
    assert!(eval.is_err(), "the sluice user may EVAL");

    let upstream = Upstream::start().await;
    let store = format!(
        "{}  ca_file: {}\n",
        cluster_lines(&urls[..2]),
        tls.ca.display()
    );
    let sluice = start_ready(&yaml_with(&upstream, &store, "1s", POLICIES, &routes())).await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    for a in ALGORITHMS {
        let statuses = per_subject(&[sluice.addr()], &format!("/{a}"), 6, 8, 8).await;
        for (key, s) in &statuses {
            assert_eq!(
                admitted(s),
                5,
                "{a} {key}: {s:?}\n{}",
                sluice.logs().join("\n")
            );
        }
    }
}

/// A steady single-subject load and where each request ended.
struct Run {
    shots: Vec<Shot>,
}

impl Run {
    /// Shots that started at or after `t`.
    fn after(&self, t: Instant) -> impl Iterator<Item = &Shot> {
        self.shots.iter().filter(move |s| s.started >= t)
    }

    fn count(&self, status: StatusCode) -> usize {
        self.shots.iter().filter(|s| s.status == status).count()
    }

    /// Only 200 and 503 (with `Retry-After`) were answered.
    fn only_decided_answers(&self) {
        for shot in &self.shots {
            match shot.status {
                StatusCode::OK => {}
                StatusCode::SERVICE_UNAVAILABLE => {
                    assert!(shot.retry_after.is_some(), "a 503 without Retry-After")
                }
                other => panic!("answered {other}"),
            }
        }
    }

    /// The first request that started after `t` and ended in a 200, after
    /// which every request succeeded: when decisions came back.
    fn recovered_at(&self, t: Instant) -> Option<Instant> {
        let after: Vec<&Shot> = self.after(t).collect();
        let last_failure = after.iter().rposition(|s| s.status != StatusCode::OK);
        match last_failure {
            None => after.first().map(|s| s.started),
            Some(i) => after.get(i + 1).map(|s| s.started),
        }
    }

    fn summary(&self) -> String {
        format!(
            "{} requests: {} ok, {} 503",
            self.shots.len(),
            self.count(StatusCode::OK),
            self.count(StatusCode::SERVICE_UNAVAILABLE)
        )
    }
}

/// A generous limit: under load every decided request is a 200.
const OPEN_POLICY: &str = "  open: { algorithm: fixed-window, limit: 1000000, window: 1h }\n";
const OPEN_ROUTE: &str =
    "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: open }\n";

fn load(sluice: &Sidecar) -> Load {
    Load::start(sluice.addr(), "/api", 3, Duration::from_millis(5))
}

/// A sidecar on [`OPEN_POLICY`] over the store `store` (lines under
/// `store:`), budget 200 ms, already deciding.
async fn open_sidecar(upstream: &Upstream, store: &str) -> Sidecar {
    let sluice = start_ready(&yaml_with(
        upstream,
        store,
        "200ms",
        OPEN_POLICY,
        OPEN_ROUTE,
    ))
    .await;
    warmed(&sluice).await;
    sluice
}

/// Runs the steady load, lets it settle, runs `event` (a failover; it
/// returns when the new primary took writes), lets [`RECOVERY`] and a
/// second more pass, and returns every request's answer with that instant.
async fn through(
    sluice: &Sidecar,
    event: impl std::future::Future<Output = Instant>,
) -> (Run, Instant) {
    let running = load(sluice);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let writable = event.await;
    tokio::time::sleep(RECOVERY + Duration::from_secs(1)).await;
    let run = Run {
        shots: running.stop().await,
    };
    (run, writable)
}

/// Waits until the load has seen at least one success, so a failover hits
/// a sidecar that was deciding.
async fn warmed(sluice: &Sidecar) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, _, _) = support::get(sluice.addr(), "/api", &[]).await;
        if status == StatusCode::OK {
            return;
        }
        assert!(Instant::now() < deadline, "the sidecar never decided");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The invariants of every failover: only decided answers, every 200 went
/// to the app and nothing else did, and decisions came back within
/// [`RECOVERY`] of `writable`.
fn assert_recovered(
    what: &str,
    run: &Run,
    upstream: &Upstream,
    writable: Instant,
    sluice: &Sidecar,
) {
    run.only_decided_answers();
    assert_eq!(
        upstream.count(),
        run.count(StatusCode::OK) + 1,
        "{what}: the app saw a request sluice did not allow ({})",
        run.summary()
    );
    let back = run.recovered_at(writable).unwrap_or_else(|| {
        panic!(
            "{what}: decisions never came back ({})\n{}",
            run.summary(),
            sluice.logs().join("\n")
        )
    });
    let took = back.saturating_duration_since(writable);
    assert!(
        took <= RECOVERY,
        "{what}: decisions came back {took:?} after the new primary took writes ({})",
        run.summary()
    );
    eprintln!(
        "{what}: back {took:?} after the new primary took writes; {}",
        run.summary()
    );
}

/// The primary holding the sidecar's one subject (the only `sluice:` key
/// besides the probe's).
fn primary_of_subject(cluster: &RedisCluster) -> u16 {
    cluster
        .primaries()
        .into_iter()
        .find(|p| {
            cluster
                .keys(*p)
                .iter()
                .any(|k| k.starts_with("sluice:{open:"))
        })
        .expect("a primary holds the subject")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_and_a_killed_primary_cost_no_undecided_request() {
    let _serial = SERIAL.lock().await;
    let mut cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let sluice = open_sidecar(&upstream, &cluster_lines(&cluster.urls())).await;

    // A planned failover: the replica takes over with no write lost.
    let primary = primary_of_subject(&cluster);
    let replica = cluster.replica_of(primary);
    let (run, writable) = through(&sluice, async {
        cluster.failover(replica);
        Instant::now()
    })
    .await;
    assert_recovered("CLUSTER FAILOVER", &run, &upstream, writable, &sluice);
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY).await;

    // A crash: the primary is killed, the cluster promotes its replica.
    cluster.wait_formed();
    let primary = primary_of_subject(&cluster);
    let replica = cluster.replica_of(primary);
    let before = upstream.count();
    let (run, writable) = through(&sluice, async {
        cluster.node_mut(primary).kill();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !cluster.primaries().contains(&replica) {
            assert!(Instant::now() < deadline, "the replica was never promoted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Instant::now()
    })
    .await;
    run.only_decided_answers();
    assert_eq!(upstream.count() - before, run.count(StatusCode::OK));
    let back = run.recovered_at(writable).expect("decisions came back");
    let took = back.saturating_duration_since(writable);
    assert!(
        took <= RECOVERY,
        "kill -9: back after {took:?} ({})",
        run.summary()
    );
    eprintln!(
        "kill -9 of a primary: back {took:?} after promotion; {}",
        run.summary()
    );
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY).await;
    // The promoted replicas had the libraries already (replicated from
    // their primaries): not one call needed loading them.
    let mut conn = cluster.node(replica).connection();
    assert!(!support::redis::function_libraries(&mut conn, Some("sluice_*")).is_empty());
    assert_no_library_was_missing(&sluice).await;
}

/// No FCALL met function not found (`kind="noscript"`).
async fn assert_no_library_was_missing(sluice: &Sidecar) {
    let missing = support::redis_sidecar::sample(
        sluice,
        "sluice_store_events_total",
        &[("kind", "noscript")],
    )
    .await
    .unwrap_or(0.0);
    assert_eq!(missing, 0.0, "function not found after a failover");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_followed_without_a_restart() {
    let _serial = SERIAL.lock().await;
    let set = SentinelSet::start();
    let upstream = Upstream::start().await;
    let store = format!(
        "  topology: sentinel\n  sentinel: {{ master: {}, nodes: {} }}\n",
        SentinelSet::MASTER,
        RedisCluster::yaml_list(&set.urls())
    );
    let sluice = open_sidecar(&upstream, &store).await;
    assert_eq!(set.current_primary(), set.primary.port());

    let mut promoted = 0;
    let (run, writable) = through(&sluice, async {
        promoted = set.failover();
        Instant::now()
    })
    .await;
    assert_eq!(promoted, set.replica.port());
    assert_recovered("SENTINEL FAILOVER", &run, &upstream, writable, &sluice);
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY).await;
    // The new primary had every library already, by replication.
    assert!(
        !support::redis::function_libraries(&mut set.replica.connection(), Some("sluice_*"))
            .is_empty()
    );
    assert_no_library_was_missing(&sluice).await;
    // Decisions land on the new primary.
    let mut conn = set.replica.connection();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sluice:{open:*")
        .query(&mut conn)
        .expect("KEYS");
    assert!(!keys.is_empty(), "the new primary holds no state");
}

/// A primary and its replica behind a relay, and the failover a managed
/// service performs: the replica is promoted, the relay sends new
/// connections to it, and the old primary becomes a replica of it, keeping
/// the connections it had (every script on them now gets `READONLY`).
struct StablePair {
    primary: RedisServer,
    replica: RedisServer,
    relay: Relay,
}

impl StablePair {
    async fn start() -> StablePair {
        let primary = RedisServer::start();
        let replica = RedisServer::builder()
            .config(&format!("replicaof 127.0.0.1 {}", primary.port()))
            .start();
        let relay = Relay::start(primary.port()).await;
        StablePair {
            primary,
            replica,
            relay,
        }
    }

    fn demote_primary_only(&self) {
        let mut old = self.primary.connection();
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(self.replica.port())
            .query(&mut old)
            .expect("REPLICAOF on the old primary");
    }

    /// Returns when the new primary takes writes.
    fn fail_over(&self) -> Instant {
        let mut new = self.replica.connection();
        let _: () = redis::cmd("REPLICAOF")
            .arg("NO")
            .arg("ONE")
            .query(&mut new)
            .expect("promote the replica");
        let writable = Instant::now();
        self.relay.switch(self.replica.port());
        self.demote_primary_only();
        writable
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_behind_a_stable_address_is_followed_without_a_restart() {
    let _serial = SERIAL.lock().await;
    let pair = StablePair::start().await;
    let upstream = Upstream::start().await;
    let sluice = open_sidecar(&upstream, &format!("  url: {}\n", pair.relay.url())).await;

    let (run, writable) = through(&sluice, async { pair.fail_over() }).await;
    assert_recovered(
        "failover behind a stable address",
        &run,
        &upstream,
        writable,
        &sluice,
    );
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_stays_failed_while_every_decision_fails_and_recovers_without_traffic() {
    let _serial = SERIAL.lock().await;
    let pair = StablePair::start().await;
    let upstream = Upstream::start().await;
    let sluice = open_sidecar(&upstream, &format!("  url: {}\n", pair.relay.url())).await;

    // Both nodes are replicas now: every decision fails, whatever sluice
    // reconnects to.
    let mut replica = pair.replica.connection();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(pair.primary.port())
        .query(&mut replica)
        .expect("keep the replica a replica");
    pair.demote_primary_only();
    let running = load(&sluice);
    readyz_becomes(
        &sluice,
        StatusCode::SERVICE_UNAVAILABLE,
        Duration::from_secs(3),
    )
    .await;
    // Sampled for three seconds (six breaker cool-downs, each ending in a
    // failed probe): never ready.
    let until = Instant::now() + Duration::from_secs(3);
    let mut samples = 0;
    while Instant::now() < until {
        let (status, body) = readyz(&sluice).await;
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "ready while failing: {body}"
        );
        samples += 1;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = Run {
        shots: running.stop().await,
    };
    assert!(samples > 50, "only {samples} samples");
    assert_eq!(run.count(StatusCode::OK), 0, "{}", run.summary());
    assert_eq!(upstream.count(), 1, "nothing undecided reached the app");

    // With no traffic at all (a pod Kubernetes stopped sending to), the
    // store's own probe finds the new primary and readiness comes back.
    let mut new = pair.replica.connection();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut new)
        .expect("promote");
    pair.relay.switch(pair.replica.port());
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY + Duration::from_secs(1)).await;
    let (status, _, _) = support::get(sluice.addr(), "/api", &[]).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_under_load_forwards_nothing_undecided_and_never_over_admits() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start();
    let urls = cluster.urls();
    reshard_under_load("resharding", cluster, &urls).await;
}

/// The same with the least-privilege user of [`CLUSTER_ACL`]: each slot
/// moved is answered `MOVED`, and the sidecars read the slot map again
/// (`CLUSTER SLOTS`) on the connections they hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_with_a_least_privilege_user_forwards_nothing_undecided() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::builder().config(CLUSTER_ACL).start();
    let urls = cluster.urls_as("sluice", "pw");
    reshard_under_load("resharding, least privilege", cluster, &urls).await;
}

/// Moves a third of the slots from one primary to another while two
/// sidecars on `urls` decide for 24 subjects: none over its limit, nothing
/// reaches the app undecided, few 503s (keys caught mid-migration).
async fn reshard_under_load(what: &str, cluster: RedisCluster, urls: &[String]) {
    let upstream = Upstream::start().await;
    let yaml = yaml_with(
        &upstream,
        &cluster_lines(urls),
        "200ms",
        "  tight: { algorithm: sliding-log, limit: 40, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: header:X-API-Key, policy: tight }\n",
    );
    let sidecars = [start_ready(&yaml).await, start_ready(&yaml).await];
    let addrs: Vec<_> = sidecars.iter().map(Sidecar::addr).collect();
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;

    // Move a third of the slots from one primary to another while 24
    // subjects keep asking, 60 requests each against a limit of 40.
    let primaries = cluster.primaries();
    let id = |port: u16| -> String {
        let mut conn = cluster.connection(port);
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut conn)
            .expect("CLUSTER MYID")
    };
    let (from, to) = (id(primaries[0]), id(primaries[1]));
    let seed = format!("127.0.0.1:{}", primaries[0]);
    let load = tokio::spawn({
        let addrs = addrs.clone();
        async move { per_subject(&addrs, "/api", 24, 60, 12).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let out = tokio::task::spawn_blocking(move || {
        let out = cluster.cli_cluster(&[
            "reshard",
            &seed,
            "--cluster-from",
            &from,
            "--cluster-to",
            &to,
            "--cluster-slots",
            "2000",
            "--cluster-yes",
            "--cluster-pipeline",
            "10",
        ]);
        (out, cluster)
    })
    .await
    .expect("reshard");
    let (out, cluster) = out;
    assert!(
        out.status.success(),
        "reshard failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let statuses = load.await.expect("load");
    let mut refused = 0;
    let mut allowed = 0;
    for (key, s) in &statuses {
        assert!(
            admitted(s) <= 40,
            "{what}: {key} admitted {} of 60",
            admitted(s)
        );
        for status in s {
            match *status {
                StatusCode::OK => allowed += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                StatusCode::SERVICE_UNAVAILABLE => refused += 1,
                other => panic!("{what}: {key}: answered {other}"),
            }
        }
    }
    assert_eq!(
        upstream.count(),
        allowed,
        "{what}: the app saw an undecided request"
    );
    eprintln!(
        "{what}: 2000 slots moved under load: {allowed} allowed, {refused} answered 503 of {}",
        24 * 60
    );
    // 503s come only from keys caught mid-migration, a small share.
    assert!(
        refused * 10 < 24 * 60,
        "{what}: {refused} of {} answered 503",
        24 * 60
    );
    drop(cluster);
}

/// The failover allowance, measured: a replica that lags (its replication
/// link goes silent) is promoted after its primary dies. Every admission
/// the primary had not passed on is lost, and the subject is admitted that
/// many times again: over-admission equals what was lost, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_over_admits_exactly_what_the_lagging_replica_had_not_received() {
    let _serial = SERIAL.lock().await;
    let mut primary = RedisServer::start();
    let link = Relay::start(primary.port()).await;
    let replica = RedisServer::builder()
        .config(&format!("replicaof 127.0.0.1 {}", link.port()))
        .start();
    let front = Relay::start(primary.port()).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica.connection())
            .expect("INFO");
        if info.contains("master_link_status:up") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica never synced:\n{info}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let upstream = Upstream::start().await;
    let store = format!("  url: {}\n", front.url());
    let sluice = start_ready(&yaml_with(
        &upstream,
        &store,
        "200ms",
        "  twenty: { algorithm: sliding-log, limit: 20, window: 1h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: twenty }\n",
    ))
    .await;
    let admit = |n: usize| {
        let addr = sluice.addr();
        async move {
            let mut ok = 0;
            for _ in 0..n {
                if support::get(addr, "/api", &[]).await.0 == StatusCode::OK {
                    ok += 1;
                }
            }
            ok
        }
    };

    // Five admitted and replicated. WAIT waits for this connection's own
    // last write: one written after the five, so they are acknowledged too.
    assert_eq!(admit(5).await, 5);
    let mut conn = primary.connection();
    let _: () = redis::cmd("SET")
        .arg("replicated-up-to-here")
        .arg(1)
        .query(&mut conn)
        .expect("SET");
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query(&mut conn)
        .expect("WAIT");
    assert_eq!(acked, 1, "the replica never acknowledged");

    // The link goes silent; ten more are admitted on the primary alone.
    link.hold(true);
    assert_eq!(admit(10).await, 10);
    let offset = |c: &mut redis::Connection| -> i64 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(c)
            .expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("master_repl_offset:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("master_repl_offset")
    };
    let mut replica_conn = replica.connection();
    assert!(
        offset(&mut conn) > offset(&mut replica_conn),
        "the replica kept up"
    );

    // The primary dies; the replica is promoted and the address moves.
    primary.kill();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut replica_conn)
        .expect("promote");
    front.switch(replica.port());

    // The promoted replica remembers 5 of the 15: the subject gets 15 more.
    let mut again = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut denied = 0;
    while denied < 5 {
        assert!(Instant::now() < deadline, "never limited again");
        match support::get(sluice.addr(), "/api", &[]).await.0 {
            StatusCode::OK => again += 1,
            StatusCode::TOO_MANY_REQUESTS => denied += 1,
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let total = 15 + again;
    let over = total - 20;
    eprintln!(
        "failover allowance: 10 admissions not replicated; {total} admitted against a limit of 20 \
         (over-admission {over})"
    );
    assert_eq!(over, 10, "over-admission must equal the admissions lost");
    assert_eq!(upstream.count(), total);
}

/// On a Sentinel-managed primary the user also needs `ROLE`: the client
/// checks that the node the Sentinels name really is the primary.
const SENTINEL_ACL: &str = "user sluice on >pw resetchannels ~sluice:* -@all \
     +fcall +function|load +function|list +function|delete +ping +time +get +set +pexpire +touch \
     +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore +role";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_primary_with_a_least_privilege_user_limits_exactly() {
    let _serial = SERIAL.lock().await;
    let set = SentinelSet::start_with(RedisServer::builder().config(SENTINEL_ACL));
    let upstream = Upstream::start().await;
    let store = format!(
        "  topology: sentinel\n  sentinel:\n    master: {}\n    nodes: {}\n    username: sluice\n    password: pw\n",
        SentinelSet::MASTER,
        RedisCluster::yaml_list(&set.urls())
    );
    let sluice = start_ready(&yaml_with(&upstream, &store, "1s", POLICIES, &routes())).await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    for a in ALGORITHMS {
        let statuses = per_subject(&[sluice.addr()], &format!("/{a}"), 4, 8, 8).await;
        for (key, s) in &statuses {
            assert_eq!(
                admitted(s),
                5,
                "{a} {key}: {s:?}\n{}",
                sluice.logs().join("\n")
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_node_that_lost_its_libraries_gets_them_back_within_the_budget() {
    let _serial = SERIAL.lock().await;
    let cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&yaml_with(
        &upstream,
        &cluster_lines(&cluster.urls()),
        "1s",
        POLICIES,
        &routes(),
    ))
    .await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    // Every node forgets every library (a new node, an emptied one, an
    // operator's FUNCTION FLUSH). A replica refuses the flush (a write) and
    // gets it from its primary by replication.
    let mut flushed = 0;
    for node in &cluster.nodes {
        let mut conn = node.connection();
        let flush: redis::RedisResult<()> = redis::cmd("FUNCTION").arg("FLUSH").query(&mut conn);
        match flush {
            Ok(()) => flushed += 1,
            Err(e) => assert_eq!(e.code(), Some("READONLY"), "FUNCTION FLUSH: {e}"),
        }
    }
    assert!(flushed >= 3, "{flushed} primaries flushed");
    let loads_before =
        support::redis_sidecar::sample(&sluice, "sluice_store_script_loads_total", &[])
            .await
            .unwrap_or(0.0);
    // Subjects on every primary; not one request may fail for it.
    for a in ALGORITHMS {
        let statuses = per_subject(&[sluice.addr()], &format!("/{a}"), 12, 6, 6).await;
        for (key, s) in &statuses {
            assert_eq!(
                admitted(s),
                5,
                "{a} {key}: {s:?}\n{}",
                sluice.logs().join("\n")
            );
        }
    }
    let noscript = support::redis_sidecar::sample(
        &sluice,
        "sluice_store_events_total",
        &[("kind", "noscript")],
    )
    .await
    .unwrap_or(0.0);
    let loads = support::redis_sidecar::sample(&sluice, "sluice_store_script_loads_total", &[])
        .await
        .unwrap_or(0.0);
    // Each primary answered function not found at least once per library
    // it was asked to run, and got that library loaded on it alone.
    assert!(noscript >= 3.0, "{noscript} function-not-found replies");
    assert!(
        loads - loads_before >= 3.0,
        "{} loads",
        loads - loads_before
    );
    assert!(
        loads - loads_before <= noscript,
        "loads {} > function-not-founds {noscript}",
        loads - loads_before
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_set_over_tls_limits_exactly_and_fails_over() {
    let _serial = SERIAL.lock().await;
    let certs = tempfile::tempdir().expect("temp dir");
    let tls = tls_files(certs.path());
    let set = SentinelSet::start_tls(sentinel_tls_builder(&tls), Some(tls.clone()));
    let urls = set.urls();
    assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
    let upstream = Upstream::start().await;
    let store = format!(
        "  topology: sentinel\n  sentinel: {{ master: {}, nodes: {} }}\n  ca_file: {}\n",
        SentinelSet::MASTER,
        RedisCluster::yaml_list(&urls),
        tls.ca.display()
    );
    let sluice = start_ready(&yaml_with(&upstream, &store, "1s", POLICIES, &routes())).await;
    clear_of_window_edge(HOUR, EDGE_MARGIN).await;
    let statuses = per_subject(&[sluice.addr()], "/sl", 4, 8, 8).await;
    for (key, s) in &statuses {
        assert_eq!(admitted(s), 5, "{key}: {s:?}\n{}", sluice.logs().join("\n"));
    }
    // The limits survive a planned failover (no write lost): every subject
    // is still spent on the new primary.
    set.failover();
    let deadline = Instant::now() + RECOVERY + Duration::from_secs(2);
    loop {
        let (status, _, _) = support::get(sluice.addr(), "/sl", &[("x-api-key", "key-0")]).await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "a spent subject was admitted"
        );
        assert!(Instant::now() < deadline, "no decision after the failover");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
