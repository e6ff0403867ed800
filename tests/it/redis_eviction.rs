//! A full Redis evicting under the recommended `maxmemory-policy
//! volatile-lru`: a subject this sidecar's over-limit cache answers for
//! must not be what a flood of other subjects evicts first, or another
//! sidecar hands it a fresh window.
//!
//! Redis's LRU clock counts whole seconds, and its eviction pool keeps
//! the idle time a key had when it was sampled: a key touched four times
//! a second reads as at most one second idle, which only sets it apart
//! from keys two seconds idle or more. The guarantee holds while Redis
//! keeps more than two seconds of the flood's new keys, so the flood is
//! paced to keep about three (unpaced, 5,300 to 5,600 requests a second
//! fill this room in 1.5 s, and once in CI the key was evicted).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use tokio::task::JoinSet;

use crate::support::client::{build, http1_client, send};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{redis_yaml, sample, start_ready};
use crate::support::{get, Upstream};

/// The denied subject's limit, in a window no test outlives.
const LIMIT: usize = 5;
/// Room above what Redis holds once sluice has loaded its libraries:
/// some thousands of one-shot subjects (a state and a record each).
const ROOM: u64 = 4 * 1024 * 1024;
/// Requests of the flood in flight at once.
const FLOOD: usize = 32;
/// The flood's requests a second at most (two keys each): [`ROOM`]
/// holds about 16,000 keys, three seconds of them.
const RATE: f64 = 3_000.0;
/// What the test is about holds while Redis keeps at least this many
/// seconds of the flood's keys (the LRU clock's second, and one more).
const HELD_SECONDS: f64 = 2.0;
/// The flood runs until Redis has evicted this many times the keys it
/// held when it began to evict: every key not in use is long gone.
const TURNOVERS: u64 = 2;

fn info(conn: &mut redis::Connection, section: &str, field: &str) -> u64 {
    let text: String = redis::cmd("INFO").arg(section).query(conn).expect("INFO");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{field} in INFO {section}"))
}

fn dbsize(conn: &mut redis::Connection) -> u64 {
    redis::cmd("DBSIZE").query(conn).expect("DBSIZE")
}

/// Requests of `/api` under a new subject each, [`FLOOD`] at a time and
/// [`RATE`] a second at most, until `stop`; counts them in `sent`.
fn flood(addr: std::net::SocketAddr, stop: Arc<AtomicBool>, sent: Arc<AtomicUsize>) -> JoinSet<()> {
    let mut tasks = JoinSet::new();
    for lane in 0..FLOOD {
        let (stop, sent) = (stop.clone(), sent.clone());
        tasks.spawn(async move {
            let client = http1_client();
            let mut pace = tokio::time::interval(Duration::from_secs_f64(FLOOD as f64 / RATE));
            pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                pace.tick().await;
                let key = format!("flood-{lane}-{i}");
                let headers = [("x-client", key.as_str())];
                let (status, _, _) = send(
                    &client,
                    build(addr, Method::GET, "/api", &headers, Bytes::new()),
                )
                .await;
                assert_eq!(status, StatusCode::OK, "a flood request");
                sent.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
        });
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_subject_outlives_a_volatile_lru_flood_and_stays_refused_by_another_sidecar() {
    let redis = RedisServer::builder()
        .config("maxmemory-policy volatile-lru")
        .start();
    let upstream = Upstream::start().await;
    let yaml = redis_yaml(
        &upstream,
        &redis.url(),
        &format!("  five: {{ algorithm: fixed-window, limit: {LIMIT}, window: 1h }}\n"),
        "  - { name: api, match: { path_prefix: /api }, subject: header:X-Client, policy: five }\n",
    )
    // A loaded two-core machine: the flood is not about the budget.
    .replace("  budget: 50ms\n", "  budget: 500ms\n");
    let flooded = start_ready(&yaml).await;
    let other = start_ready(&yaml).await;
    let mut conn = redis.connection();
    let max = info(&mut conn, "memory", "used_memory") + ROOM;
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(max)
        .query(&mut conn)
        .expect("CONFIG SET maxmemory");

    // Over its limit, through the sidecar about to be flooded.
    let denied = [("x-client", "denied")];
    for _ in 0..LIMIT {
        assert_eq!(get(flooded.addr(), "/api", &denied).await.0, StatusCode::OK);
    }
    assert_eq!(
        get(flooded.addr(), "/api", &denied).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );

    // The flood, while the denied subject keeps asking the same sidecar
    // (answered by its over-limit cache).
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicUsize::new(0));
    let mut tasks = flood(flooded.addr(), stop.clone(), sent.clone());
    let started = Instant::now();
    let mut held_at_first_eviction = None;
    let mut first_eviction_after = Duration::ZERO;
    loop {
        assert_eq!(
            get(flooded.addr(), "/api", &denied).await.0,
            StatusCode::TOO_MANY_REQUESTS
        );
        let evicted = info(&mut conn, "stats", "evicted_keys");
        if evicted > 0 && held_at_first_eviction.is_none() {
            held_at_first_eviction = Some(dbsize(&mut conn).max(1));
            first_eviction_after = started.elapsed();
        }
        if let Some(held) = held_at_first_eviction {
            if evicted >= TURNOVERS * held {
                break;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "{evicted} keys evicted after {:?} and {} flood requests",
            started.elapsed(),
            sent.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    while let Some(done) = tasks.join_next().await {
        if let Err(e) = done {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    let evicted = info(&mut conn, "stats", "evicted_keys");
    let held = held_at_first_eviction.unwrap_or(0);
    // Redis filled up at the rate keys keep arriving, so it held this
    // many seconds of them.
    let held_seconds = first_eviction_after.as_secs_f64();
    let touched = sample(
        &flooded,
        "sluice_store_events_total",
        &[("kind", "touched")],
    )
    .await
    .unwrap_or(0.0);
    let hits = sample(&flooded, "sluice_local_deny_cache_hits_total", &[])
        .await
        .unwrap_or(0.0);
    println!(
        "flood: {} requests in {:?}, {evicted} keys evicted ({held} held at the first, \
         after {held_seconds:.1} s), the denied subject's key touched {touched} times \
         for {hits} local denials",
        sent.load(Ordering::Relaxed),
        started.elapsed(),
    );
    assert!(
        held_seconds >= HELD_SECONDS,
        "Redis held {held} keys, {held_seconds:.1} s of the flood's: too few to tell a key \
         touched four times a second from the flood's"
    );

    // The other sidecar has never seen the subject: it asks Redis.
    let (status, _, _) = get(other.addr(), "/api", &denied).await;
    assert_eq!(
        status,
        StatusCode::TOO_MANY_REQUESTS,
        "the denied subject's key was evicted: a fresh window on another sidecar"
    );
    assert_eq!(upstream.count(), LIMIT + sent.load(Ordering::Relaxed));
    // Four touches a second at most, however often the subject asked.
    assert!(touched >= 1.0, "the denied subject's key was never touched");
    assert!(
        touched <= 4.0 * started.elapsed().as_secs_f64() + 2.0,
        "{touched} touches in {:?}",
        started.elapsed()
    );
}
