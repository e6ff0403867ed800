//! Through the binary: only admissions leave records, a first send reads
//! none, and a refund finds its record in the state or its key and gives
//! back once.

use std::time::Duration;

use redis::Commands;

use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{held_record, redis_yaml, start_ready};
use crate::support::store_api::*;
use crate::support::{clear_of_window_edge, get, Upstream};
use http::StatusCode;
use sluice::limit::Bands;

/// Through the binary: only an admitted request leaves a de-duplication
/// record (`<state>:e:<id>`), on every algorithm and on a route of several
/// limits, and a decision's first send reads no record: a compact-state
/// decision `GET`s its state and nothing else, the sliding log nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_admissions_leave_records_and_a_first_send_reads_none() {
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let policies = "  fw: { algorithm: fixed-window, limit: 3, window: 1h, lease: off }
  sc: { algorithm: sliding-counter, limit: 3, window: 1h, lease: off }
  sl: { algorithm: sliding-log, limit: 3, window: 1h }
  tb: { algorithm: token-bucket, capacity: 3, refill_tokens: 1, refill_every: 1h, lease: off }
  gc: { algorithm: gcra, limit: 3, window: 1h, burst: 3, lease: off }
  wide: { algorithm: fixed-window, limit: 1000, window: 1h, lease: off }
";
    let mut routes: String = ["fw", "sc", "sl", "tb", "gc"]
        .iter()
        .map(|a| {
            format!(
                "  - {{ name: {a}, match: {{ path_prefix: /{a} }}, subject: client_ip, policy: {a} }}\n"
            )
        })
        .collect();
    routes.push_str(
        "  - name: both
    match: { path_prefix: /both }
    limits:
      - { policy: fw, subject: client_ip }
      - { policy: wide, subject: global }
",
    );
    // A budget of 1s: this counts decisions, and on a busy two-core machine
    // a 50ms one may fail closed. Every denial goes to Redis: no over-limit
    // cache answering for it.
    let yaml = redis_yaml(&upstream, &redis.url(), policies, &routes)
        .replace("  budget: 50ms\n", "  budget: 1s\n")
        .replace(
            "  deny_cache_entries: 100000\n",
            "  deny_cache_entries: 0\n",
        );
    let sluice = start_ready(&yaml).await;
    let mut conn = redis.connection();
    // Records in keys of their own, and those held in their states.
    let records = |conn: &mut redis::Connection| -> usize {
        let keys: Vec<String> = conn.keys("sluice:*").expect("KEYS");
        let (own, states): (Vec<String>, Vec<String>) =
            keys.into_iter().partition(|k| k.contains("}:e:"));
        let held = states
            .iter()
            .filter(|k| !k.starts_with("sluice:library:"))
            .filter(|k| {
                let kind: String = redis::cmd("TYPE").arg(k).query(conn).expect("TYPE");
                kind == "string" && held_record(conn, k).is_some()
            })
            .count();
        own.len() + held
    };
    let calls = |conn: &mut redis::Connection, command: &str| -> u64 {
        commandstats(conn)
            .into_iter()
            .find(|(name, _)| name == command)
            .map_or(0, |(_, calls)| calls)
    };
    clear_of_window_edge(Duration::from_secs(3600), Duration::from_secs(20)).await;

    // (path, the GETs of its six decisions, its records): a compact state
    // is one GET a decision; the sliding log reads a sorted set. Several
    // limits are always sent as a re-send could be (`lua/several.lua`):
    // each limit GETs its state, then its record; a request refused by the
    // first limit reads the first's only (the script stops there, writing
    // nothing), an admitted one both.
    let cases = [
        ("/fw", 6, 3),
        ("/sc", 6, 3),
        ("/sl", 0, 3),
        ("/tb", 6, 3),
        ("/gc", 6, 3),
        ("/both", 3 * 4 + 3 * 2, 3 * 2),
    ];
    let mut total = 0;
    for (path, gets, kept) in cases {
        reset_stats(&mut conn);
        let mut statuses = Vec::new();
        for _ in 0..6 {
            statuses.push(get(sluice.addr(), path, &[]).await.0);
        }
        assert_eq!(
            statuses[..],
            [
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::OK,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::TOO_MANY_REQUESTS
            ],
            "{path}"
        );
        assert_eq!(calls(&mut conn, "fcall"), 6, "{path}");
        assert_eq!(
            calls(&mut conn, "get"),
            gets,
            "{path}: {:?}",
            commandstats(&mut conn)
        );
        total += kept;
        assert_eq!(records(&mut conn), total, "{path}: a denial left a record");
    }
    assert_eq!(upstream.count(), 18);
}

/// A refund finds the record wherever it is: in the state (a first send's
/// admission where the state held no live one) or in its own key (those
/// while it did), gives back what it says was charged once, and marks it
/// so that a second refund gives back nothing; the state keeps the record
/// it holds, marked. On every compact-state algorithm, standalone (first
/// sends).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_finds_a_record_in_the_state_or_its_key_and_gives_back_once() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let compact = [
        ("fixed", Bands::FixedWindow(vec![window(3, 3_600_000)])),
        ("counter", Bands::SlidingCounter(vec![window(3, 3_600_000)])),
        ("bucket", Bands::TokenBucket(vec![bucket(3, 1, 3_600_000)])),
        ("gcra", Bands::Gcra(vec![gcra(3, 3_600_000, 3)])),
    ];
    for (name, bands) in compact {
        let policy = policy(&format!("refunded-{name}"), bands);
        // A policy's first call loads its library and goes again as a
        // re-send could: made here, what follows are first sends.
        let warm = eval(&store, &policy, &subject(&format!("warm-{name}")), 1).await;
        assert!(allowed(&warm), "{name}: {warm:?}");
        let who = subject(&format!("refunded-{name}"));
        let key = state_key(&policy, &who);
        // Held in the state: given back once.
        let a = evaluation(&policy, &who, 1);
        assert!(allowed(&store.evaluate(&a).await), "{name}");
        assert!(store.refund_reserved(&a, 1).await, "{name}: held record");
        assert!(!store.refund_reserved(&a, 1).await, "{name}: twice");
        let (held, record) = held_record(&mut conn, &key).expect("held");
        assert_eq!(held, a.id.to_string(), "{name}");
        assert!(record.starts_with("0:"), "{name}: {record}");

        // In their own keys while the state holds a live record.
        let (b, c) = (evaluation(&policy, &who, 1), evaluation(&policy, &who, 1));
        for ev in [&b, &c] {
            assert!(allowed(&store.evaluate(ev).await), "{name}");
            let own: Option<String> = conn.get(format!("{key}:e:{}", ev.id)).expect("GET");
            assert!(own.is_some_and(|r| r.starts_with("1:")), "{name}");
        }
        for ev in [&b, &c] {
            assert!(store.refund_reserved(ev, 1).await, "{name}");
            assert!(!store.refund_reserved(ev, 1).await, "{name}: twice");
        }
        let (held, record) = held_record(&mut conn, &key).expect("held");
        assert_eq!(held, a.id.to_string(), "{name}");
        assert!(record.starts_with("0:"), "{name}: {record}");

        // Everything given back: exactly the limit is admitted again.
        let mut admitted = 0;
        for _ in 0..5 {
            if allowed(&eval(&store, &policy, &who, 1).await) {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 3, "{name}: refunds gave back what was charged");
    }
}
