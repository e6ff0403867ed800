//! The Redis store driven through its library API against a real
//! `redis-server`: its settings, policies and subjects as the tests build
//! them, the documented key layout, and what Redis counted.

use std::num::NonZeroU32;
use std::time::Duration;

use redis::Commands;
use tokio::time::Instant;

use super::redis::RedisServer;
use sluice::config::{self, Secret, Topology};
use sluice::limit::{
    Algorithm, Bands, BucketBand, Decision, GcraBand, Micros, Outcome, Policy, WindowBand,
};
use sluice::store::redis::RedisStore;
use sluice::store::{Evaluation, EvaluationId};
use sluice::subject::{Pseudonym, PseudonymKey};

pub const BUDGET: Duration = Duration::from_millis(500);

pub fn redis_config(url: String) -> config::RedisStore {
    config::RedisStore {
        topology: Topology::Standalone { url: Secret(url) },
        pool_size: 2,
        ca_file: None,
        key_prefix: "sluice".to_owned(),
        max_clock_regression: Duration::from_secs(1),
        dedupe_window: Duration::from_secs(5),
        dedupe_max: 256,
        breaker_failures: 5,
        breaker_window: Duration::from_secs(10),
        breaker_min_calls: 10,
        breaker_failure_rate: 50,
        breaker_cooldown: Duration::from_secs(1),
        deny_cache_entries: 0,
        coalesce: true,
    }
}

/// Keys outlive their policy horizon by this much.
pub const TTL_GRACE: Duration = Duration::from_secs(1);

pub async fn connect_with(redis: config::RedisStore, budget: Duration) -> RedisStore {
    let store = RedisStore::connect(&redis, TTL_GRACE, budget, &[]).expect("connect");
    wait_ready(&store).await;
    store
}

pub async fn connect(server: &RedisServer) -> RedisStore {
    connect_with(redis_config(server.url()), BUDGET).await
}

pub async fn wait_ready(store: &RedisStore) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !store.ready() {
        assert!(Instant::now() < deadline, "store never became ready");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

pub fn window(limit: u32, window_ms: u64) -> WindowBand {
    WindowBand {
        limit: nz(limit),
        window: ms(window_ms),
    }
}

pub fn bucket(capacity: u32, refill: u32, every_ms: u64) -> BucketBand {
    BucketBand {
        capacity: nz(capacity),
        refill_tokens: nz(refill),
        refill_every: ms(every_ms),
        max_wait_us: 0,
    }
}

pub fn gcra(limit: u32, window_ms: u64, burst: u32) -> GcraBand {
    GcraBand {
        limit: nz(limit),
        window: ms(window_ms),
        burst: nz(burst),
        max_wait_us: 0,
    }
}

pub fn policy(name: &str, bands: Bands) -> Policy {
    Policy::new(name, "r1", bands, false)
}

pub fn subject(identity: &str) -> Pseudonym {
    PseudonymKey::new(b"redis store test key", 1).pseudonym(
        "header:x-api-key",
        identity.as_bytes(),
        "api",
    )
}

/// The documented key layout, written out independently of the store: the
/// mark names the state's format (none for the sliding log).
pub fn state_key(policy: &Policy, subject: &Pseudonym) -> String {
    let mark = match policy.algorithm() {
        Algorithm::FixedWindow => "fw2:",
        Algorithm::SlidingCounter => "sc2:",
        Algorithm::TokenBucket => "tb2:",
        Algorithm::Gcra => "gc2:",
        Algorithm::SlidingLog => "",
    };
    format!(
        "sluice:{{{}:{}:{mark}{subject}}}",
        policy.name, policy.revision
    )
}

/// The state string at `key` (`t:…`, `lua/README.md`), if any.
pub fn state_text(conn: &mut redis::Connection, key: &str) -> Option<String> {
    state_raw(conn, key).map(|raw| match raw.split_once('|') {
        Some((numbers, _)) => numbers.to_owned(),
        None => raw,
    })
}

/// The state string at `key` whole: its numbers, then the record it may
/// hold (`|<expires>|<resent>|<id>|<record>`, `lua/README.md`).
pub fn state_raw(conn: &mut redis::Connection, key: &str) -> Option<String> {
    conn.get(key).expect("GET state")
}

/// Sets the state's last write time `t` (its first number), keeping the
/// rest and the TTL; a subject with no state gets `t` alone, which the
/// scripts read as every band fresh.
pub fn pin_t(conn: &mut redis::Connection, key: &str, t: Micros) {
    let text = match state_text(conn, key) {
        Some(old) => match old.split_once(':') {
            Some((_, rest)) => format!("{t}:{rest}"),
            None => t.to_string(),
        },
        None => t.to_string(),
    };
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(text)
        .arg("KEEPTTL")
        .query(conn)
        .expect("pin t");
}

pub fn evaluation<'a>(policy: &'a Policy, subject: &'a Pseudonym, cost: u32) -> Evaluation<'a> {
    Evaluation {
        policy,
        subject,
        cost,
        deadline: Instant::now() + BUDGET,
        id: EvaluationId::fresh(),
        settle_within: None,
    }
}

pub async fn eval(store: &RedisStore, policy: &Policy, subject: &Pseudonym, cost: u32) -> Outcome {
    store.evaluate(&evaluation(policy, subject, cost)).await
}

pub fn allowed(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Allowed(_))
}

pub fn decision(outcome: &Outcome) -> Decision {
    match outcome {
        Outcome::Allowed(d) | Outcome::Denied(d) => *d,
        other => panic!("expected a decision, got {other:?}"),
    }
}

pub fn redis_time(conn: &mut redis::Connection) -> Micros {
    let (s, us): (u64, u64) = redis::cmd("TIME").query(conn).expect("TIME");
    s * 1_000_000 + us
}

pub fn commandstats(conn: &mut redis::Connection) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// Redis's `calls` of `command` in `INFO commandstats` since the last
/// `CONFIG RESETSTAT`.
pub fn calls_of(conn: &mut redis::Connection, command: &str) -> u64 {
    commandstats(conn)
        .iter()
        .find(|(name, _)| name == command)
        .map_or(0, |(_, calls)| *calls)
}

pub fn reset_stats(conn: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(conn)
        .expect("RESETSTAT");
}

/// The count a fixed window's state `t:s1:c1` holds.
pub fn fixed_count(conn: &mut redis::Connection, key: &str) -> Option<u64> {
    let text = state_text(conn, key)?;
    text.split(':').nth(2)?.parse().ok()
}

/// Evaluates `who` together, cost 1 each, while Redis holds writes for
/// 150 ms (`CLIENT PAUSE … WRITE`): on one lane the first two are sent
/// alone (its two calls in flight) and wait there, and the rest queue
/// behind them, one batch, however the threads of a busy machine are
/// scheduled.
pub async fn together(
    conn: &mut redis::Connection,
    store: &RedisStore,
    policy: &Policy,
    who: &[Pseudonym],
) -> Vec<Outcome> {
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(150)
        .arg("WRITE")
        .query(conn)
        .expect("CLIENT PAUSE");
    let evaluations: Vec<Evaluation<'_>> = who.iter().map(|s| evaluation(policy, s, 1)).collect();
    futures_util::future::join_all(evaluations.iter().map(|ev| store.evaluate(ev))).await
}
