//! A call whose reply is lost is retried once, with the same evaluation
//! id, and charged once: alone and in a batch; a re-send replays the
//! record a first send left.

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Commands;

use crate::support::lost_reply::{relay, relay_on};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::held_record;
use crate::support::store_api::*;
use sluice::limit::{Bands, Outcome};
use sluice::subject::Pseudonym;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_retried_once_and_charged_once() {
    let server = RedisServer::start();
    let relay = relay(server.port()).await;
    let mut config = redis_config(format!("redis://127.0.0.1:{}", relay.port));
    config.pool_size = 1;
    let store = connect_with(config, Duration::from_secs(2)).await;
    let mut conn = server.connection();

    let cases = [
        ("fixed", Bands::FixedWindow(vec![window(5, 3_600_000)])),
        ("log", Bands::SlidingLog(vec![window(5, 3_600_000)])),
    ];
    for (round, (name, bands)) in cases.into_iter().enumerate() {
        let policy = policy(name, bands);
        let subject = subject(name);
        let key = state_key(&policy, &subject);
        // The policy's script is loaded by its first evaluation (another
        // subject's), so the reply dropped next is a decision's.
        let warm = eval(&store, &policy, &self::subject(&format!("warm-{name}")), 1).await;
        assert!(allowed(&warm), "{name}: {warm:?}");
        relay.armed.store(true, Ordering::SeqCst);
        let outcome = eval(&store, &policy, &subject, 2).await;
        assert_eq!(relay.dropped.load(Ordering::SeqCst), round + 1, "{name}");
        // The recorded decision: the first (and only) charge of 2 out of 5.
        let d = decision(&outcome);
        assert!(d.allowed && d.remaining == 3, "{name}: {outcome:?}");
        let charged: u64 = if name == "log" {
            conn.zcard(&key).expect("ZCARD")
        } else {
            // t:s1:c1
            let text = state_text(&mut conn, &key).expect("state");
            text.split(':')
                .nth(2)
                .expect("c1")
                .parse()
                .expect("a count")
        };
        assert_eq!(charged, 2, "{name}: charged twice or not at all");
        assert_eq!(
            store.stats().retries.load(Ordering::Relaxed),
            round as u64 + 1
        );
        assert_eq!(
            store.stats().dedupe_hits.load(Ordering::Relaxed),
            round as u64 + 1
        );
    }

    // A first send's denial leaves no record: its retry is decided afresh,
    // denied again, charges nothing, and records that denial (a first send
    // it overtook, arriving later, would replay it).
    let policy = policy("deny", Bands::FixedWindow(vec![window(1, 3_600_000)]));
    let subject = subject("deny");
    let key = state_key(&policy, &subject);
    assert!(allowed(&eval(&store, &policy, &subject, 1).await));
    relay.armed.store(true, Ordering::SeqCst);
    let denied = evaluation(&policy, &subject, 1);
    let outcome = store.evaluate(&denied).await;
    assert_eq!(relay.dropped.load(Ordering::SeqCst), 3);
    assert!(matches!(outcome, Outcome::Denied(_)), "{outcome:?}");
    assert_eq!(store.stats().retries.load(Ordering::Relaxed), 3);
    assert_eq!(store.stats().dedupe_hits.load(Ordering::Relaxed), 2);
    assert_eq!(fixed_count(&mut conn, &key), Some(1));
    let record: Option<String> = conn
        .get(format!("{key}:e:{}", denied.id))
        .expect("GET record");
    assert!(
        record.as_deref().is_some_and(|r| r.starts_with("0:")),
        "{record:?}"
    );
}

/// A first send does not look for its record (a fresh id has none): one
/// GET, its state's. A re-send (the retry after a lost reply) looks, and
/// replays what the first send admitted; a denial's re-send finds nothing
/// and is decided afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_send_reads_no_record_and_a_re_send_replays_one() {
    let server = RedisServer::start();
    let relay = relay(server.port()).await;
    let mut config = redis_config(format!("redis://127.0.0.1:{}", relay.port));
    config.pool_size = 1;
    config.coalesce = false;
    let store = connect_with(config, Duration::from_secs(2)).await;
    let mut conn = server.connection();
    let policy = policy("first", Bands::FixedWindow(vec![window(5, 3_600_000)]));
    let warm = eval(&store, &policy, &subject("first-warm"), 1).await;
    assert!(allowed(&warm), "{warm:?}");

    // A first send reads its state and no record (its id is fresh), and
    // writes one key: the state, which holds the admission's record.
    let fresh = subject("fresh");
    let key = state_key(&policy, &fresh);
    reset_stats(&mut conn);
    let outcome = eval(&store, &policy, &fresh, 1).await;
    // (Counted before this test's own GETs below.)
    assert_eq!(
        calls_of(&mut conn, "get"),
        1,
        "{:?}",
        commandstats(&mut conn)
    );
    assert_eq!(calls_of(&mut conn, "set"), 1);
    assert_eq!(
        held_record(&mut conn, &key).map(|(_, record)| record[..2].to_owned()),
        Some("1:".to_owned())
    );
    assert_eq!(decision(&outcome).remaining, 4, "{outcome:?}");
    assert_eq!(fixed_count(&mut conn, &key), Some(1));
    assert_eq!(store.stats().dedupe_hits.load(Ordering::Relaxed), 0);

    // Its reply lost, the call goes again saying so: it finds the record
    // the first send left in the state (a second GET) and replays it.
    let lost = subject("lost");
    let key = state_key(&policy, &lost);
    reset_stats(&mut conn);
    relay.armed.store(true, Ordering::SeqCst);
    let outcome = eval(&store, &policy, &lost, 2).await;
    assert_eq!(calls_of(&mut conn, "fcall"), 2);
    assert_eq!(
        calls_of(&mut conn, "get"),
        2,
        "{:?}",
        commandstats(&mut conn)
    );
    // The first send's SET, none by the replay.
    assert_eq!(calls_of(&mut conn, "set"), 1);
    assert_eq!(relay.dropped.load(Ordering::SeqCst), 1);
    assert_eq!(decision(&outcome).remaining, 3, "{outcome:?}");
    assert_eq!(fixed_count(&mut conn, &key), Some(2), "charged once");
    assert_eq!(store.stats().retries.load(Ordering::Relaxed), 1);
    assert_eq!(store.stats().dedupe_hits.load(Ordering::Relaxed), 1);

    // A denial's re-send reads the state again, finds no record there or
    // under its id (a third GET), denies again and records the denial:
    // its record, and the state (its numbers as they were) saying until
    // when a first send may find that record.
    for _ in 0..3 {
        assert!(allowed(&eval(&store, &policy, &lost, 1).await));
    }
    reset_stats(&mut conn);
    relay.armed.store(true, Ordering::SeqCst);
    let outcome = eval(&store, &policy, &lost, 1).await;
    assert_eq!(
        calls_of(&mut conn, "get"),
        3,
        "{:?}",
        commandstats(&mut conn)
    );
    assert_eq!(calls_of(&mut conn, "set"), 2);
    assert_eq!(relay.dropped.load(Ordering::SeqCst), 2);
    assert!(matches!(outcome, Outcome::Denied(_)), "{outcome:?}");
    assert_eq!(store.stats().dedupe_hits.load(Ordering::Relaxed), 1);
    assert_eq!(fixed_count(&mut conn, &key), Some(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_batch_reply_is_retried_once_and_charged_once() {
    let server = RedisServer::start();
    let relay = relay_on(server.port(), b"_batch").await;
    let mut config = redis_config(format!("redis://127.0.0.1:{}", relay.port));
    config.pool_size = 1;
    let store = connect_with(config, Duration::from_secs(2)).await;
    let mut conn = server.connection();
    let policy = policy("lost-batch", Bands::FixedWindow(vec![window(5, 3_600_000)]));
    let warm = eval(&store, &policy, &subject("lost-batch-warm"), 1).await;
    assert!(allowed(&warm), "{warm:?}");

    relay.armed.store(true, Ordering::SeqCst);
    let who: Vec<Pseudonym> = (0..6)
        .map(|i| subject(&format!("lost-batch-{i}")))
        .collect();
    let outcomes = together(&mut conn, &store, &policy, &who).await;
    assert_eq!(
        relay.dropped.load(Ordering::SeqCst),
        1,
        "no batch reply was lost: {outcomes:?}, {} batches",
        store.stats().batches.load(Ordering::Relaxed)
    );
    for (i, outcome) in outcomes.iter().enumerate() {
        let d = decision(outcome);
        assert!(d.allowed && d.remaining == 4, "{i}: {outcome:?}");
        let key = state_key(&policy, &who[i]);
        assert_eq!(
            fixed_count(&mut conn, &key),
            Some(1),
            "{i}: charged twice or not at all"
        );
    }
    // The first two went alone (the lane's two calls in flight, held by
    // the pause); the other four queued and went as one batch once they
    // had waited their longest. The connection carrying all three calls
    // lost their replies: each call went again (a retry counts no new
    // batch), and every decision replayed its record.
    assert_eq!(store.stats().batches.load(Ordering::Relaxed), 1);
    assert_eq!(store.stats().batched.load(Ordering::Relaxed), 4);
    assert_eq!(store.stats().retries.load(Ordering::Relaxed), 3);
    assert_eq!(store.stats().dedupe_hits.load(Ordering::Relaxed), 6);
}
