//! Several limits of one request on Redis standalone: one `FCALL` of
//! the script made of theirs (`lua/several.lua`), all or nothing, against
//! a real `redis-server`; then two sidecars sharing it, end to end; and on
//! Redis Cluster, where they are evaluated in order, one call each, and
//! what a later limit refused is given back.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::Ordering;
use std::time::Duration;

use http::StatusCode;
use serde_json::Value;
use tokio::time::Instant;

use crate::support::lost_reply::relay;
use crate::support::ops::{metric, scrape};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{
    commandstats, redis_yaml, reset_stats, start_ready, window_count,
};
use crate::support::topology::RedisCluster;
use crate::support::{get, header, Upstream};
use sluice::config::{self, Secret, Topology};
use sluice::limit::{Bands, BucketBand, GcraBand, Outcome, Policy, Unavailable, WindowBand};
use sluice::store::redis::RedisStore;
use sluice::store::{Evaluation, EvaluationId, Outcomes};
use sluice::subject::{Pseudonym, PseudonymKey};

const BUDGET: Duration = Duration::from_millis(500);
const HOUR_MS: u64 = 3_600_000;

async fn connect(server: &RedisServer) -> RedisStore {
    connect_to(Topology::Standalone {
        url: Secret(server.url()),
    })
    .await
}

async fn connect_to(topology: Topology) -> RedisStore {
    connect_with(topology, 10).await
}

/// [`connect_to`], its breaker opening only after `breaker_min_calls`.
async fn connect_with(topology: Topology, breaker_min_calls: u32) -> RedisStore {
    let redis = config::RedisStore {
        topology,
        pool_size: 2,
        ca_file: None,
        key_prefix: "sluice".to_owned(),
        max_clock_regression: Duration::from_secs(1),
        dedupe_window: Duration::from_secs(5),
        dedupe_max: 256,
        breaker_failures: 5,
        breaker_window: Duration::from_secs(10),
        breaker_min_calls,
        breaker_failure_rate: 50,
        breaker_cooldown: Duration::from_secs(1),
        deny_cache_entries: 0,
        coalesce: true,
    };
    let store = RedisStore::connect(&redis, Duration::from_secs(1), BUDGET, &[]).expect("connect");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store.ready() {
        assert!(Instant::now() < deadline, "store never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store
}

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

fn window(limit: u32) -> WindowBand {
    WindowBand {
        limit: nz(limit),
        window: Duration::from_millis(HOUR_MS),
    }
}

/// Every algorithm with a quota of 3 per hour: after one admitted unit,
/// each has exactly 2 left.
fn every_algorithm() -> Vec<Policy> {
    let bands = [
        Bands::FixedWindow(vec![window(3)]),
        Bands::SlidingCounter(vec![window(3)]),
        Bands::SlidingLog(vec![window(3)]),
        Bands::TokenBucket(vec![BucketBand {
            capacity: nz(3),
            refill_tokens: nz(1),
            refill_every: Duration::from_millis(HOUR_MS),
            max_wait_us: 0,
        }]),
        Bands::Gcra(vec![GcraBand {
            limit: nz(3),
            window: Duration::from_millis(HOUR_MS),
            burst: nz(3),
            max_wait_us: 0,
        }]),
    ];
    bands
        .into_iter()
        .map(|b| Policy::new(b.algorithm().name(), "r1", b, false))
        .collect()
}

fn subject(who: &str) -> Pseudonym {
    PseudonymKey::new(b"several", 1).pseudonym("ip", who.as_bytes(), "signup")
}

fn evaluation<'a>(policy: &'a Policy, subject: &'a Pseudonym, id: u128) -> Evaluation<'a> {
    Evaluation {
        policy,
        subject,
        cost: 1,
        deadline: Instant::now() + BUDGET,
        id: EvaluationId(id),
        settle_within: None,
    }
}

async fn together(store: &RedisStore, limits: &[(&Policy, &Pseudonym)], id: u128) -> Outcomes {
    let evaluations: Vec<Evaluation<'_>> =
        limits.iter().map(|(p, s)| evaluation(p, s, id)).collect();
    store.evaluate_all(&evaluations, None).await
}

fn remaining(outcome: &Outcome) -> (bool, u64) {
    match outcome {
        Outcome::Allowed(d) => (true, d.remaining),
        Outcome::Denied(d) => (false, d.remaining),
        other => panic!("no decision: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_call_admits_all_or_charges_none_for_every_algorithm() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let global = Policy::new("global", "r1", Bands::FixedWindow(vec![window(2)]), false);
    for (n, per_client) in every_algorithm().iter().enumerate() {
        let name = per_client.algorithm().name();
        let (a, b) = (subject(&format!("a{n}")), subject(&format!("b{n}")));
        let everyone = subject(&format!("everyone{n}"));
        let id = |k: u128| (n as u128) << 64 | k;
        // a twice: both pass, and spend the global limit.
        for k in 0..2 {
            let outcomes = together(&store, &[(per_client, &a), (&global, &everyone)], id(k)).await;
            assert_eq!(outcomes.first, 0);
            assert_eq!(outcomes.list.len(), 2, "{name}");
            assert!(
                outcomes.list.iter().all(|o| remaining(o).0),
                "{name}: {outcomes:?}"
            );
        }
        // b is denied by the global limit: its own limit is not charged.
        let outcomes = together(&store, &[(per_client, &b), (&global, &everyone)], id(2)).await;
        assert_eq!(outcomes.list.len(), 2, "{name}");
        assert!(
            remaining(&outcomes.list[0]).0,
            "{name}: b's own limit passed"
        );
        assert!(
            !remaining(&outcomes.list[1]).0,
            "{name}: the global limit denied"
        );
        let alone = store.evaluate(&evaluation(per_client, &b, id(3))).await;
        assert_eq!(
            remaining(&alone),
            (true, 2),
            "{name}: b's quota was untouched"
        );
        // A limit that blocks first: the second is not even asked.
        let spent = Policy::new("spent", "r1", Bands::FixedWindow(vec![window(1)]), false);
        assert!(remaining(&store.evaluate(&evaluation(&spent, &b, id(4))).await).0);
        let outcomes = together(&store, &[(&spent, &b), (per_client, &b)], id(5)).await;
        assert_eq!(outcomes.list.len(), 1, "{name}");
        let alone = store.evaluate(&evaluation(per_client, &b, id(6))).await;
        assert_eq!(
            remaining(&alone),
            (true, 1),
            "{name}: charged once, by id 3 only"
        );
    }
}

/// The state key of `policy` (a fixed window) for `subject`, and the
/// record key of evaluation `id` beside it.
/// Two GCRA limits with different numbers in one call: each limit's
/// emission interval and tolerance, worked out on its library's first call
/// and kept, are its own, in the first call and in every one after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gcra_limits_in_one_call_keep_their_own_numbers() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let gcra = |name: &str, limit: u32| {
        let bands = Bands::Gcra(vec![GcraBand {
            limit: nz(limit),
            window: Duration::from_millis(HOUR_MS),
            burst: nz(limit),
            max_wait_us: 0,
        }]);
        Policy::new(name, "r1", bands, false)
    };
    let (two, five) = (gcra("gcra-two", 2), gcra("gcra-five", 5));
    let who = subject("two-gcra");
    let mut left = Vec::new();
    for id in 1..=3 {
        let outcomes = together(&store, &[(&two, &who), (&five, &who)], id).await;
        left.push(outcomes.list.iter().map(remaining).collect::<Vec<_>>());
    }
    // The third is refused by the first limit (the second not asked), and
    // charges neither: the second, alone, has 3 left before it.
    assert_eq!(
        left,
        [
            vec![(true, 1), (true, 4)],
            vec![(true, 0), (true, 3)],
            vec![(false, 0)],
        ]
    );
    let alone = store.evaluate(&evaluation(&five, &who, 4)).await;
    assert_eq!(remaining(&alone), (true, 2));
}

fn fixed_keys(policy: &Policy, subject: &Pseudonym, id: u128) -> (String, String) {
    let state = format!(
        "sluice:{{{}:{}:fw2:{subject}}}",
        policy.name, policy.revision
    );
    let record = format!("{state}:e:{}", EvaluationId(id));
    (state, record)
}

/// A call of several limits whose reply is lost goes again: what its first
/// send admitted replays, charged once, and so does a shadow limit's
/// denial (several limits are always sent as a re-send could be: every
/// limit looks for its record and records its denial), blocking nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_call_replays_and_a_shadow_denial_blocks_nothing() {
    let server = RedisServer::start();
    let relay = relay(server.port()).await;
    let store = connect_to(Topology::Standalone {
        url: Secret(format!("redis://127.0.0.1:{}", relay.port)),
    })
    .await;
    let mut conn = server.connection();
    let real = Policy::new("real", "r1", Bands::FixedWindow(vec![window(5)]), false);
    let shadow = Policy::new("shadow", "r1", Bands::FixedWindow(vec![window(1)]), true);
    let s = subject("s");
    let (real_key, _) = fixed_keys(&real, &s, 7);
    let (shadow_key, _) = fixed_keys(&shadow, &s, 7);
    // The script of the two, in either order, is loaded by a first call
    // (another subject's), so the reply lost next is a decision's.
    let warm = subject("warm");
    let loaded = together(&store, &[(&real, &warm), (&shadow, &warm)], 5).await;
    assert_eq!(loaded.list.len(), 2, "{loaded:?}");
    let loaded = together(&store, &[(&shadow, &warm), (&real, &warm)], 6).await;
    assert_eq!(loaded.list.len(), 2, "{loaded:?}");

    relay.armed.store(true, Ordering::SeqCst);
    let first = together(&store, &[(&real, &s), (&shadow, &s)], 7).await;
    assert_eq!(relay.dropped.load(Ordering::SeqCst), 1);
    assert_eq!(store.stats().retries.load(Ordering::Relaxed), 1);
    // Both admitted the first time: both replay.
    assert_eq!(store.stats().dedupe_hits.load(Ordering::Relaxed), 2);
    assert_eq!(remaining(&first.list[0]), (true, 4));
    assert_eq!(remaining(&first.list[1]), (true, 0));
    assert_eq!(window_count(&mut conn, &real_key), Some(1));
    assert_eq!(window_count(&mut conn, &shadow_key), Some(1));

    // The shadow limit is spent; it denies, and the real one is charged,
    // once, though the reply is lost again.
    relay.armed.store(true, Ordering::SeqCst);
    let outcomes = together(&store, &[(&shadow, &s), (&real, &s)], 8).await;
    assert_eq!(relay.dropped.load(Ordering::SeqCst), 2);
    assert_eq!(outcomes.list.len(), 2);
    assert!(!remaining(&outcomes.list[0]).0);
    assert_eq!(remaining(&outcomes.list[1]), (true, 3));
    // Both replayed: the real limit's admission and the shadow's denial.
    assert_eq!(store.stats().retries.load(Ordering::Relaxed), 2);
    assert_eq!(
        store.stats().dedupe_hits.load(Ordering::Relaxed),
        4,
        "{outcomes:?}"
    );
    assert_eq!(window_count(&mut conn, &real_key), Some(2));
    assert_eq!(window_count(&mut conn, &shadow_key), Some(1));
    let (_, shadow_record) = fixed_keys(&shadow, &s, 8);
    let (_, real_record) = fixed_keys(&real, &s, 8);
    let exists: (bool, bool) = redis::pipe()
        .exists(&shadow_record)
        .exists(&real_record)
        .query(&mut conn)
        .expect("EXISTS");
    assert_eq!(exists, (true, true));
}

/// On Cluster, sluice's own connection re-sends a command only after
/// `MOVED` or `ASK` (it did not run), so a decision's first send says so
/// and its script does not look for a record a fresh id cannot have: one
/// `GET` a decision (its state). redis-rs's cluster client (nodes spoken
/// to over RESP3) re-sends by itself, so there every call looks: two. A
/// record planted under an id is replayed by the very first call with
/// that id either way (a first send claims its record with `SET NX`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_only_the_client_that_resends_by_itself_looks_for_records() {
    let cluster = RedisCluster::start();
    let policy = Policy::new("planted", "r1", Bands::FixedWindow(vec![window(50)]), false);
    for (client, query, gets_each) in [("sluice's", "", 1), ("redis-rs's", "?protocol=resp3", 2)] {
        let nodes = cluster
            .urls()
            .into_iter()
            .map(|url| Secret(format!("{url}{query}")))
            .collect();
        let store = connect_to(Topology::Cluster { nodes }).await;
        let s = subject(client);
        let (state, record) = fixed_keys(&policy, &s, 9);
        let mut conn = cluster.connection(cluster.primary_for(&state));
        let _: () = redis::cmd("SET")
            .arg(&record)
            .arg("1:42:1000:0:0:1")
            .query(&mut conn)
            .expect("SET record");
        let outcome = store.evaluate(&evaluation(&policy, &s, 9)).await;
        assert_eq!(remaining(&outcome), (true, 42), "{client}: {outcome:?}");
        assert_eq!(
            store.stats().dedupe_hits.load(Ordering::Relaxed),
            1,
            "{client}"
        );
        assert_eq!(window_count(&mut conn, &state), None, "{client}: charged");

        // Fresh ids are decided, each with one look at its record or none.
        reset_stats(&mut conn);
        for id in 10..14 {
            let outcome = store.evaluate(&evaluation(&policy, &s, id)).await;
            assert!(remaining(&outcome).0, "{client}: {outcome:?}");
        }
        let gets = commandstats(&mut conn)
            .into_iter()
            .find_map(|(name, calls)| (name == "get").then_some(calls));
        assert_eq!(gets, Some(4 * gets_each), "{client}");
    }
}

/// A slot being moved, then moved. While it moves, its old node answers
/// `ASK` for a key it does not have, and the decision goes to the new
/// node right after `ASKING`, which refuses a script of several keys it
/// does not all have yet (`TRYAGAIN`): refused, nothing charged on either
/// node. Once moved, the old node answers `MOVED` and the decision is made
/// on the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_slot_being_moved_is_followed_with_ask_then_moved() {
    let cluster = RedisCluster::start();
    let nodes = cluster.urls().into_iter().map(Secret).collect();
    let store = connect_to(Topology::Cluster { nodes }).await;
    let policy = Policy::new("moving", "r1", Bands::FixedWindow(vec![window(50)]), false);
    let s = subject("moving");
    let (state, _) = fixed_keys(&policy, &s, 1);
    let from = cluster.primary_for(&state);
    let to = *cluster
        .primaries()
        .iter()
        .find(|&&p| p != from)
        .expect("another primary");
    let mut source = cluster.connection(from);
    let mut target = cluster.connection(to);
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&state)
        .query(&mut source)
        .expect("KEYSLOT");
    let id = |conn: &mut redis::Connection| -> String {
        redis::cmd("CLUSTER").arg("MYID").query(conn).expect("MYID")
    };
    let (from_id, to_id) = (id(&mut source), id(&mut target));
    let setslot = |conn: &mut redis::Connection, how: &str, node: &str| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(how)
            .arg(node)
            .query(conn)
            .unwrap_or_else(|e| panic!("SETSLOT {how}: {e}"));
    };
    let keys_in_slot = |conn: &mut redis::Connection| -> u64 {
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(conn)
            .expect("COUNTKEYSINSLOT")
    };
    setslot(&mut target, "IMPORTING", &from_id);
    setslot(&mut source, "MIGRATING", &to_id);
    reset_stats(&mut target);

    let outcome = store.evaluate(&evaluation(&policy, &s, 1)).await;
    assert!(
        matches!(outcome, Outcome::Unavailable(Unavailable::Refused)),
        "{outcome:?}"
    );
    let asked = commandstats(&mut target)
        .into_iter()
        .find_map(|(name, calls)| (name == "asking").then_some(calls));
    assert_eq!(asked, Some(1), "the new node was not asked");
    assert_eq!(keys_in_slot(&mut source), 0, "charged on the old node");
    assert_eq!(keys_in_slot(&mut target), 0, "charged on the new node");

    // Moved: every primary learns the slot's new node.
    for port in cluster.primaries() {
        setslot(&mut cluster.connection(port), "NODE", &to_id);
    }
    for (id, left) in [(2, 49), (3, 48)] {
        let outcome = store.evaluate(&evaluation(&policy, &s, id)).await;
        assert_eq!(remaining(&outcome), (true, left), "{outcome:?}");
    }
    assert_eq!(keys_in_slot(&mut source), 0, "decided on the old node");
    assert!(keys_in_slot(&mut target) >= 1, "nothing on the new node");
}

/// A primary gone (it and its replica killed) and its port answering no
/// one: its subjects' decisions are refused unsent, and the node is not
/// tried again for a while after it could not be opened: far fewer
/// connections reach its port than decisions are asked (one each without
/// the pause). The breaker is kept shut, so every decision asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_node_that_cannot_be_opened_is_not_tried_for_every_decision() {
    let mut cluster = RedisCluster::start();
    let nodes = cluster.urls().into_iter().map(Secret).collect();
    let store = connect_with(Topology::Cluster { nodes }, 1_000_000).await;
    let policy = Policy::new("gone", "r1", Bands::FixedWindow(vec![window(1000)]), false);
    let s = subject("gone");
    let (state, _) = fixed_keys(&policy, &s, 1);
    assert!(remaining(&store.evaluate(&evaluation(&policy, &s, 1)).await).0);

    let primary = cluster.primary_for(&state);
    let replica = cluster.replica_of(primary);
    cluster.node_mut(replica).kill();
    cluster.node_mut(primary).kill();
    // Whatever connects is let in and dropped at once: a node that cannot
    // be opened, each attempt counted.
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", primary))
        .await
        .expect("the dead primary's port");
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = accepted.clone();
    let acceptor = tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            counting.fetch_add(1, Ordering::Relaxed);
            drop(socket);
        }
    });

    const ASKED: usize = 200;
    for id in 2..2 + ASKED as u128 {
        let outcome = store.evaluate(&evaluation(&policy, &s, id)).await;
        assert!(
            !matches!(outcome, Outcome::Allowed(_) | Outcome::Denied(_)),
            "decided by a dead node: {outcome:?}"
        );
    }
    let opened = accepted.load(Ordering::Relaxed);
    acceptor.abort();
    assert!(
        opened * 4 < ASKED,
        "{opened} connections for {ASKED} decisions"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sidecars_on_one_redis_admit_exactly_and_charge_nothing_on_denial() {
    let server = RedisServer::start();
    let upstream = Upstream::start().await;
    let policies = "  per_ip: { algorithm: fixed-window, limit: 5, window: 1h }
  everyone: { algorithm: fixed-window, limit: 12, window: 1h }
";
    let routes = "  - name: login
    match: { path: /login }
    limits:
      - { policy: per_ip, subject: client_ip }
      - { policy: everyone, subject: global }
";
    let yaml = redis_yaml(&upstream, &server.url(), policies, routes).replace(
        "identity:\n",
        "identity:\n  trusted_proxies: [127.0.0.1/32]\n",
    );
    let sidecars = [start_ready(&yaml).await, start_ready(&yaml).await];
    let mut conn = server.connection();
    reset_stats(&mut conn);

    // Three clients, six requests each, spread over both sidecars, all at
    // once.
    let clients = ["198.51.100.1", "198.51.100.2", "198.51.100.3"];
    let mut tasks = tokio::task::JoinSet::new();
    for (c, client) in clients.into_iter().enumerate() {
        let addrs = [sidecars[0].addr(), sidecars[1].addr()];
        tasks.spawn(async move {
            let mut admitted = 0u64;
            let mut denied_by = Vec::new();
            for i in 0..6 {
                let addr = addrs[(c + i) % 2];
                let (status, _, body) = get(addr, "/login", &[("x-forwarded-for", client)]).await;
                match status {
                    StatusCode::OK => admitted += 1,
                    StatusCode::TOO_MANY_REQUESTS => {
                        let problem: Value = serde_json::from_slice(&body).unwrap();
                        denied_by.push(problem["policy"].as_str().unwrap().to_owned());
                    }
                    other => panic!("{client}: {other}"),
                }
            }
            (client, admitted, denied_by)
        });
    }
    let mut admitted: HashMap<&str, u64> = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        let (client, n, denied_by) = done.unwrap();
        assert!(n <= 5, "{client}: {n}");
        if denied_by.iter().any(|p| p == "per_ip") {
            assert_eq!(n, 5, "{client} denied by per_ip after {n}");
        }
        admitted.insert(client, n);
    }
    assert_eq!(admitted.values().sum::<u64>(), 12, "{admitted:?}");
    assert_eq!(upstream.count(), 12);
    // One FCALL per request that reached Redis, never two.
    let fcall = commandstats(&mut conn)
        .into_iter()
        .find(|(name, _)| name == "fcall")
        .map_or(0, |(_, calls)| calls);
    assert!(fcall <= 18, "{fcall} FCALL for 18 requests");

    // What each client's own limit holds in Redis: exactly what it was
    // admitted, whatever the global limit refused it.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("sluice:{per_ip:*")
        .query(&mut conn)
        .unwrap();
    let mut counts: Vec<u64> = keys
        .iter()
        .filter(|k| !k.contains(":e:"))
        .map(|k| window_count(&mut conn, k).expect("a count"))
        .collect();
    let mut want: Vec<u64> = admitted.values().copied().filter(|n| *n > 0).collect();
    counts.sort_unstable();
    want.sort_unstable();
    assert_eq!(counts, want, "per_ip counters");
    let everyone: Vec<String> = redis::cmd("KEYS")
        .arg("sluice:{everyone:*")
        .query(&mut conn)
        .unwrap();
    let everyone: Vec<&String> = everyone.iter().filter(|k| !k.contains(":e:")).collect();
    assert_eq!(
        everyone.len(),
        1,
        "one global bucket for the route: {everyone:?}"
    );
    let count = window_count(&mut conn, everyone[0]).expect("a count");
    assert_eq!(count, 12);

    // RateLimit-Policy names both limits on either sidecar.
    let (_, headers, _) = get(
        sidecars[1].addr(),
        "/login",
        &[("x-forwarded-for", "203.0.113.9")],
    )
    .await;
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        Some(r#""per_ip";q=5;w=3600, "everyone";q=12;w=3600"#)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_what_a_later_limit_refused_is_given_back_once_for_every_algorithm() {
    let cluster = RedisCluster::start();
    let nodes = cluster.urls().into_iter().map(Secret).collect();
    let store = connect_to(Topology::Cluster { nodes }).await;
    // One request a route-wide limit of 1 admits, then refuses: every
    // refused request was first charged to the algorithm's own limit.
    let blocker = Policy::new("blocker", "r1", Bands::FixedWindow(vec![window(1)]), false);
    let mut id = 1u128;
    for (n, policy) in every_algorithm().iter().enumerate() {
        let name = policy.algorithm().name();
        let client = subject(&format!("client-{n}"));
        let route = subject(&format!("route-{n}"));
        let limits = [(policy, &client), (&blocker, &route)];
        id += 1;
        let first = together(&store, &limits, id).await;
        assert!(
            first.list.iter().all(|o| matches!(o, Outcome::Allowed(_))),
            "{name}: {first:?}"
        );
        let before = store.stats().refunded.load(Ordering::Relaxed);
        for attempt in 0..4 {
            id += 1;
            let evaluations: Vec<Evaluation<'_>> =
                limits.iter().map(|(p, s)| evaluation(p, s, id)).collect();
            let outcomes = store.evaluate_all(&evaluations, None).await;
            // Charged to its own limit, refused by the route's.
            let seen: Vec<bool> = outcomes.list.iter().map(|o| remaining(o).0).collect();
            assert_eq!(
                seen,
                [true, false],
                "{name}, attempt {attempt}: {outcomes:?}"
            );
            store.give_back(&evaluations, &outcomes).await;
            // Sent again, the same refund gives back nothing more.
            let unneeded = store.stats().refund_unneeded.load(Ordering::Relaxed);
            store.give_back(&evaluations, &outcomes).await;
            assert_eq!(
                store.stats().refund_unneeded.load(Ordering::Relaxed),
                unneeded + 1,
                "{name}: a refund sent twice"
            );
        }
        assert_eq!(
            store.stats().refunded.load(Ordering::Relaxed),
            before + 4,
            "{name}"
        );
        // Only the first request is still charged to the client's own
        // quota of 3: exactly 2 more are admitted.
        let mut admitted = 0;
        for _ in 0..4 {
            id += 1;
            if remaining(&store.evaluate(&evaluation(policy, &client, id)).await).0 {
                admitted += 1;
            }
        }
        assert_eq!(
            admitted, 2,
            "{name}: refunds gave back exactly what was charged"
        );
    }
    assert_eq!(store.stats().refund_failed.load(Ordering::Relaxed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_limits_are_evaluated_in_order_and_a_refusal_is_refunded() {
    let cluster = RedisCluster::start();
    let upstream = Upstream::start().await;
    let policies = "  per_key: { algorithm: fixed-window, limit: 5, window: 1h }
  everyone: { algorithm: fixed-window, limit: 12, window: 1h }
";
    // The route-wide limit first: each request the per-key limit refuses
    // has already been charged to it.
    let routes = "  - name: login
    match: { path: /login }
    limits:
      - { policy: everyone, subject: global }
      - { policy: per_key, subject: header:X-API-Key }
";
    let nodes = format!(
        "  topology: cluster\n  nodes: {}\n  budget: 1s\n",
        RedisCluster::yaml_list(&cluster.urls()[..1])
    );
    let yaml = redis_yaml(&upstream, "URL", policies, routes)
        .replace("  url: URL\n", &nodes)
        .replace("  budget: 50ms\n", "");
    let sluice = start_ready(&yaml).await;
    let mut admitted = HashMap::new();
    let mut refused_by = HashMap::new();
    for key in ["a", "b", "c"] {
        for _ in 0..6 {
            let (status, _, body) = get(sluice.addr(), "/login", &[("x-api-key", key)]).await;
            match status {
                StatusCode::OK => *admitted.entry(key).or_insert(0) += 1,
                StatusCode::TOO_MANY_REQUESTS => {
                    let problem: Value = serde_json::from_slice(&body).unwrap();
                    let policy = problem["policy"].as_str().unwrap().to_owned();
                    *refused_by.entry((key, policy)).or_insert(0) += 1;
                }
                other => panic!("{key}: {other} {body:?}"),
            }
        }
    }
    // Exact however the keys are spread over the slots (never CROSSSLOT):
    // the 6th requests of a and b, refused by their own limit, were given
    // back to the route's, so c finds the 2 it has left. Without the
    // refunds the route would be spent before c came.
    assert_eq!(admitted, HashMap::from([("a", 5), ("b", 5), ("c", 2)]));
    assert_eq!(upstream.count(), 12);
    let per_key = "per_key".to_owned();
    let everyone = "everyone".to_owned();
    assert_eq!(
        refused_by,
        HashMap::from([
            (("a", per_key.clone()), 1),
            (("b", per_key), 1),
            (("c", everyone), 4)
        ])
    );
    let metrics = scrape(sluice.admin_addr().expect("an admin listener")).await;
    assert_eq!(
        metric(&metrics, "sluice_refunds_total", &[("result", "refunded")]),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        metric(&metrics, "sluice_refunds_total", &[("result", "failed")]),
        Some(0.0)
    );
}
