//! Many clients hanging up at random moments on a Redis Cluster: over
//! HTTP/1.1 (connections closed, or reset), over HTTP/2 (streams reset,
//! connections dropped), amid leases and coalesced calls, and while a
//! primary cannot be opened. None passes more than its subject's limit,
//! nothing undecided reaches the app, sluice does not panic, and its
//! decisions are exact afterwards. The clients, the storms and their
//! checks are in `storm`.

mod storm;

use std::time::Duration;

use http::StatusCode;
use rand::rngs::StdRng;
use rand::SeedableRng;

use crate::hang_ups::cluster_yaml;
use crate::support::ops::{requests_counted, scrape};
use crate::support::redis_sidecar::{admin, start_ready};
use crate::support::sidecar::Sidecar;
use crate::support::topology::RedisCluster;
use crate::support::{get, Upstream};

use storm::*;

/// Which clients a storm has.
#[derive(Clone, Copy)]
enum Over {
    Http1,
    Http2,
}

/// A storm of `over`'s clients on a fresh cluster, its sidecar's policy
/// leased as `lease` says and `store_lines` added to its `store` section,
/// then every check of [`assert_storm_exact`].
async fn storm_on_a_cluster(over: Over, lease: &str, store_lines: &str, what: &str) {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let sluice = storm_sidecar(&upstream, &cluster, lease, store_lines).await;
    let seed = storm_seed(what);
    let seen = match over {
        Over::Http1 => http1_storm(sluice.addr(), seed).await,
        Over::Http2 => http2_storm(sluice.addr(), seed).await,
    };
    assert_storm_exact(
        &format!("{what}, seed {seed}"),
        &sluice,
        &upstream,
        &cluster,
        &seen,
    )
    .await;
}

/// On a cluster, 200 requests of 8 subjects over HTTP/1.1, 40 at once,
/// about 60% of the clients hanging up (a close or a reset) at a random
/// moment after sending the request head, most while their decision is
/// on its way to or from a primary: no subject gets more than its limit
/// through, nothing undecided reaches the app, and the sidecar decides
/// exactly afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_clients_hanging_up_mid_decision_never_pass_more_than_the_limit() {
    storm_on_a_cluster(Over::Http1, "off", "", "HTTP/1.1 hang-ups on a cluster").await;
}

/// The same with the subjects' quotas leased (a hot subject's requests
/// spent from a block its sidecar took at once) and decisions coalesced
/// (those that arrive together sent as one call per slot, from a task of
/// their own): a client that hangs up while its decision waits in a
/// batch, or rides on a grant, takes nothing more than its own request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_hang_ups_amid_leases_and_coalesced_calls_never_pass_more_than_the_limit() {
    storm_on_a_cluster(
        Over::Http1,
        "auto",
        "  coalesce: on\n",
        "HTTP/1.1 hang-ups, leases and coalescing, on a cluster",
    )
    .await;
}

/// On a cluster, the storm over HTTP/2: streams reset mid-decision and
/// connections dropped with streams in flight on them; the same
/// guarantees as over HTTP/1.1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_reset_streams_and_dropped_http2_connections_never_pass_more_than_the_limit() {
    storm_on_a_cluster(Over::Http2, "off", "", "HTTP/2 resets on a cluster").await;
}

const GONE_POLICIES: &str =
    "  gone: { algorithm: fixed-window, limit: 5, window: 1h, lease: off }\n";
const GONE_ROUTES: &str = "  - name: gone
    match: { path_prefix: /gone }
    policy: gone
    subject: header:X-API-Key
";

/// The `sluice:{gone:…}` state keys on every primary, with their primary.
fn gone_keys(cluster: &RedisCluster) -> Vec<(String, u16)> {
    cluster
        .primaries()
        .into_iter()
        .flat_map(|p| {
            cluster
                .keys(p)
                .into_iter()
                .filter(|k| k.starts_with("sluice:{gone:") && k.ends_with('}'))
                .map(move |k| (k, p))
        })
        .collect()
}

/// API keys `k-0`, `k-1`, … each asked once (one unit of its 5), with
/// the primary its state landed on, until two share the first one's
/// primary and one is elsewhere.
async fn place_subjects(sluice: &Sidecar, cluster: &RedisCluster) -> Vec<(String, u16)> {
    let mut placed: Vec<(String, u16)> = Vec::new();
    for i in 0..60 {
        let key = format!("k-{i}");
        let before = gone_keys(cluster);
        let (status, ..) = get(sluice.addr(), "/gone", &[("x-api-key", &key)]).await;
        assert_eq!(status, StatusCode::OK, "{key}'s first request");
        let new = gone_keys(cluster)
            .into_iter()
            .find(|k| !before.contains(k))
            .unwrap_or_else(|| panic!("{key}: no new state key"));
        placed.push((key, new.1));
        let first = placed[0].1;
        let on_first = placed.iter().filter(|(_, p)| *p == first).count();
        if on_first >= 2 && placed.iter().any(|(_, p)| *p != first) {
            return placed;
        }
    }
    panic!("60 subjects, not two on one primary and one elsewhere: {placed:?}");
}

/// While a primary cannot be opened (it and its replica killed: first
/// its port refusing connections, then a port that takes them and never
/// answers, so every decision of its subjects waits in the opening of its
/// connection), clients hang up at random moments, most while a decision
/// is in that opening or waiting for another's: its subjects are answered
/// 503 and nothing of theirs reaches the app, the other primaries'
/// subjects are decided meanwhile, sluice does not panic, and once the
/// primary is back (empty: its counts were lost with it) its subjects are
/// decided again, exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_hang_ups_while_a_primary_cannot_be_opened_leave_decisions_exact_once_it_is_back(
) {
    // The other primaries keep serving their slots while one is down.
    let mut cluster = RedisCluster::builder()
        .config("cluster-require-full-coverage no")
        .start();
    let upstream = Upstream::start().await;
    // The breaker kept shut: every decision goes to the node.
    let yaml = cluster_yaml(&upstream, &cluster, GONE_POLICIES, GONE_ROUTES).replace(
        "  budget: 1s\n",
        "  budget: 1s\n  breaker_min_calls: 1000000\n",
    );
    let sluice = start_ready(&yaml).await;
    let placed = place_subjects(&sluice, &cluster).await;
    let victim = placed[0].1;
    let on_victim: Vec<String> = placed
        .iter()
        .filter(|(_, p)| *p == victim)
        .map(|(k, _)| k.clone())
        .collect();
    let elsewhere: Vec<String> = placed
        .iter()
        .filter(|(_, p)| *p != victim)
        .map(|(k, _)| k.clone())
        .collect();
    let mut keys = on_victim.clone();
    keys.extend(elsewhere.iter().cloned());
    let seed = storm_seed("hang-ups while a primary cannot be opened");
    let mut rng = StdRng::seed_from_u64(seed);

    let replica = cluster.replica_of(victim);
    cluster.node_mut(replica).kill();
    cluster.node_mut(victim).kill();
    let forwarded_before = upstream.count();

    // Its port refuses connections.
    let refused = gone_storm(sluice.addr(), &keys, 80, 4_000, &mut rng).await;
    // Its port takes connections and never answers: an opening hangs
    // until its decision's budget is spent, or its client leaves.
    let (silent, accepted) = silent_port(victim).await;
    // A node whose opening failed is not tried again for 100 ms, and the
    // refused port's last failure may be just now: a storm over in less
    // than that (its answers are fast while nothing is tried) would
    // never reach the silent port. Waited out, so the next decision of
    // the victim's subjects opens it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let closed = |text: &str| requests_counted(text, "gone", "gone", "client_closed");
    let closed_before = closed(&scrape(admin(&sluice)).await);
    let hanging = gone_storm(sluice.addr(), &keys, 100, 300_000, &mut rng).await;
    silent.abort();
    let _ = silent.await;
    let opened = accepted.load(std::sync::atomic::Ordering::SeqCst);
    let closed_while_silent = closed(&scrape(admin(&sluice)).await) - closed_before;

    let summary = format!(
        "seed {seed}, victim {victim}: {on_victim:?} on it, {elsewhere:?} elsewhere\n\
         port refused: {refused:?}\nport silent ({opened} connections taken, {closed_while_silent} clients gone mid-decision): {hanging:?}"
    );
    eprintln!("{summary}");
    assert!(
        opened > 0,
        "no decision tried to open the silent node\n{summary}"
    );
    // Clients left while their decision was opening the node, or waiting
    // for another's opening (nothing else keeps a decision that long).
    assert!(
        closed_while_silent > 0.0,
        "no client left mid-decision while the node was silent\n{summary}"
    );
    for seen in [&refused, &hanging] {
        for key in &on_victim {
            let answers = seen.answers.get(key).cloned().unwrap_or_default();
            assert!(
                answers.iter().all(|s| *s == 503),
                "{key}, on the dead primary, was answered {answers:?}\n{summary}"
            );
        }
        for key in &elsewhere {
            let answers = seen.answers.get(key).cloned().unwrap_or_default();
            assert!(
                answers.iter().all(|s| *s == 200 || *s == 429),
                "{key}, on a live primary, was answered {answers:?}\n{summary}"
            );
        }
    }
    let reached = |key: &str| {
        upstream
            .requests()
            .iter()
            .filter(|r| r.header("x-api-key") == Some(key))
            .count()
    };
    for key in &on_victim {
        assert_eq!(
            reached(key),
            1,
            "{key} reached the app undecided\n{summary}"
        );
    }
    for key in &elsewhere {
        assert!(reached(key) <= 5, "{key} passed its limit\n{summary}");
    }
    assert!(upstream.count() >= forwarded_before);
    assert_no_panic(&sluice, "while a primary could not be opened");

    // Back on its port, with its slots and nothing else.
    cluster.node_mut(victim).restart();
    cluster.wait_formed();
    let (probe, exact) = (&on_victim[0], &on_victim[1]);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, ..) = get(sluice.addr(), "/gone", &[("x-api-key", probe)]).await;
        if status == StatusCode::OK {
            break;
        }
        assert_eq!(
            status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{probe} while the primary comes back"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "{probe} still undecided 20 s after its primary came back\n{}",
            sluice.logs().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(get(sluice.addr(), "/gone", &[("x-api-key", exact)]).await.0);
    }
    let mut want = vec![StatusCode::OK; 5];
    want.push(StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        statuses, want,
        "{exact} once its primary is back\n{summary}"
    );
    for key in &elsewhere {
        let (status, ..) = get(sluice.addr(), "/gone", &[("x-api-key", key)]).await;
        assert!(
            status == StatusCode::OK || status == StatusCode::TOO_MANY_REQUESTS,
            "{key}: {status}"
        );
    }
    assert_no_panic(&sluice, "after the primary came back");
}
