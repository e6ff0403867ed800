//! The same decisions as the memory store, to the microsecond.

use super::*;

/// (advance µs, cost) per request.
type Steps = Vec<(Micros, u32)>;

/// Runs `steps` of (advance µs, cost) against both stores at exactly the
/// same times. Redis decides at `max(TIME, t)`, `t` being the key's last
/// write: pinning `t` ahead of `TIME` (within `max_clock_regression`) makes
/// Redis decide at a chosen instant, so decisions and every duration must
/// match to the microsecond.
async fn conform_pinned(
    server: &RedisServer,
    store: &RedisStore,
    name: &str,
    bands: Bands,
    steps: &[(Micros, u32)],
) {
    let memory = MemoryStore::new(1000, Duration::from_secs(1));
    let policy = policy(name, bands);
    let subject = subject(name);
    let key = state_key(&policy, &subject);
    let mut conn = server.connection();
    let mut now = redis_time(&mut conn) + 60_000_000;
    for (i, &(advance, cost)) in steps.iter().enumerate() {
        now += advance;
        pin_t(&mut conn, &key, now);
        let ev = evaluation(&policy, &subject, cost);
        let from_redis = store.evaluate(&ev).await;
        let from_memory = memory.evaluate_at(&ev, now);
        assert_eq!(
            from_redis, from_memory,
            "{name}: step {i} (advance {advance} us, cost {cost}) differs"
        );
    }
}

fn random_steps(seed: u64, bands: &Bands, longest: Micros, n: usize) -> Steps {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let max_cost = bands.max_cost();
    (0..n)
        .map(|_| {
            let advance = match rng.random_range(0..10) {
                0..=3 => 0,
                4..=7 => rng.random_range(0..longest / 4),
                _ => rng.random_range(0..longest * 3 / 2),
            };
            let cost = if rng.random_bool(0.7) {
                1
            } else {
                rng.random_range(1..=max_cost)
            };
            (advance, cost)
        })
        .collect()
}

/// Hand-written sequences: fill a band, deny, cross window boundaries,
/// multi-unit costs, long idle gaps.
fn designed_table() -> Vec<(&'static str, Bands, Steps)> {
    let ms = 1000;
    vec![
        (
            "fixed-designed",
            Bands::FixedWindow(vec![window(3, 1000), window(5, 2000)]),
            vec![
                (150 * ms, 1),
                (0, 1),
                (0, 1),
                (0, 1),
                (1000 * ms, 1),
                (0, 1),
                (0, 1),
                (0, 2),
                (900 * ms, 2),
                (5000 * ms, 3),
            ],
        ),
        (
            "counter-designed",
            Bands::SlidingCounter(vec![window(10, 1000)]),
            vec![
                (310 * ms, 4),
                (0, 6),
                (0, 1),
                (1000 * ms, 3),
                (0, 2),
                (200 * ms, 2),
                (2000 * ms, 1),
                (999 * ms, 10),
                (ms, 1),
            ],
        ),
        (
            "bucket-designed",
            Bands::TokenBucket(vec![bucket(4, 1, 500), bucket(10, 5, 2000)]),
            vec![
                (100 * ms, 3),
                (0, 2),
                (600 * ms, 2),
                (0, 1),
                (2000 * ms, 4),
                (0, 1),
                (499 * ms, 1),
                (ms, 1),
            ],
        ),
        (
            "gcra-designed",
            Bands::Gcra(vec![gcra(10, 1000, 3), gcra(20, 10_000, 10)]),
            vec![
                (100 * ms, 1),
                (0, 2),
                (0, 1),
                (150 * ms, 1),
                (0, 1),
                (1000 * ms, 3),
                (99 * ms, 1),
                (ms, 1),
            ],
        ),
    ]
}

/// Random sequences' algorithms: every pinned one, two bands each.
fn random_table() -> Vec<(&'static str, Bands, Micros)> {
    vec![
        (
            "fixed-random",
            Bands::FixedWindow(vec![window(5, 700), window(12, 3000)]),
            3_000_000,
        ),
        (
            "counter-random",
            Bands::SlidingCounter(vec![window(5, 700), window(12, 3000)]),
            3_000_000,
        ),
        (
            "bucket-random",
            Bands::TokenBucket(vec![bucket(5, 2, 300), bucket(12, 3, 1100)]),
            4_000_000,
        ),
        (
            "gcra-random",
            Bands::Gcra(vec![gcra(7, 1000, 3), gcra(30, 9000, 8)]),
            9_000_000,
        ),
        (
            "bucket-delay-random",
            Bands::TokenBucket(vec![
                BucketBand {
                    max_wait_us: 700_000,
                    ..bucket(5, 2, 300)
                },
                BucketBand {
                    max_wait_us: 700_000,
                    ..bucket(12, 3, 1100)
                },
            ]),
            4_000_000,
        ),
        (
            "gcra-delay-random",
            Bands::Gcra(vec![
                GcraBand {
                    max_wait_us: 400_000,
                    ..gcra(7, 1000, 3)
                },
                GcraBand {
                    max_wait_us: 400_000,
                    ..gcra(30, 9000, 8)
                },
            ]),
            9_000_000,
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_table_matches_the_memory_store() {
    let server = RedisServer::start();
    let mut config = redis_config(server.url());
    // Room for pinning Redis' decision time ahead of its clock.
    config.max_clock_regression = Duration::from_secs(24 * 3600);
    let store = connect_with(config, BUDGET).await;

    let ms = 1000;
    let designed = designed_table();
    for (name, bands, steps) in designed {
        conform_pinned(&server, &store, name, bands, &steps).await;
    }
    // 10/s, burst 10, a delay of 500 ms: 15 at once are admitted, the
    // last five told to wait 100..500 ms; the 16th is refused.
    let delayed = Bands::Gcra(vec![GcraBand {
        max_wait_us: 500_000,
        ..gcra(10, 1000, 10)
    }]);
    let policy = policy("gcra-delay-designed", delayed.clone());
    let memory = MemoryStore::new(1000, Duration::from_secs(1));
    let who = subject("gcra-delay-designed");
    let waits: Vec<Option<u64>> = (0..16)
        .map(
            |_| match memory.evaluate_at(&evaluation(&policy, &who, 1), 5_000_000) {
                Outcome::Allowed(d) => Some(d.retry_after.as_millis() as u64),
                _ => None,
            },
        )
        .collect();
    let mut want: Vec<Option<u64>> = vec![Some(0); 10];
    want.extend([100, 200, 300, 400, 500].map(Some));
    want.push(None);
    assert_eq!(waits, want);
    // A bucket of 5, one token back each 200 ms, waits of up to 600 ms:
    // 5 at once, then three told to wait 200, 400 and 600 ms, the ninth
    // refused.
    let bucket_delayed = Bands::TokenBucket(vec![BucketBand {
        max_wait_us: 600_000,
        ..bucket(5, 1, 200)
    }]);
    let bucket_policy = self::policy("bucket-delay-designed", bucket_delayed.clone());
    let who = subject("bucket-delay-designed");
    let waits: Vec<Option<u64>> = (0..9)
        .map(
            |_| match memory.evaluate_at(&evaluation(&bucket_policy, &who, 1), 5_000_000) {
                Outcome::Allowed(d) => Some(d.retry_after.as_millis() as u64),
                _ => None,
            },
        )
        .collect();
    let mut want: Vec<Option<u64>> = vec![Some(0); 5];
    want.extend([200, 400, 600].map(Some));
    want.push(None);
    assert_eq!(waits, want);
    conform_pinned(
        &server,
        &store,
        "bucket-delay-designed",
        bucket_delayed,
        &[(0, 1); 9]
            .iter()
            .copied()
            .chain([(150 * ms, 1), (0, 2), (900 * ms, 3), (50 * ms, 1)])
            .collect::<Vec<_>>(),
    )
    .await;
    conform_pinned(
        &server,
        &store,
        "gcra-delay-designed",
        delayed,
        &[(0, 1); 16]
            .iter()
            .copied()
            .chain([(150 * ms, 1), (0, 2), (600 * ms, 1)])
            .collect::<Vec<_>>(),
    )
    .await;

    // Random sequences, every pinned algorithm, two bands each.
    let random = random_table();
    for (seed, (name, bands, longest)) in random.into_iter().enumerate() {
        let steps = random_steps(seed as u64, &bands, longest, 300);
        conform_pinned(&server, &store, name, bands, &steps).await;
    }
}

/// [`conform_pinned`] for `subjects` subjects of one policy at once: at
/// every step each subject's key is pinned, then all are evaluated
/// together. On one lane, the first two are sent alone (its two calls in
/// flight) and the others queue behind them and go out as one batch:
/// every subject must still decide as the memory store does, to the
/// microsecond.
async fn conform_batched(
    server: &RedisServer,
    store: &RedisStore,
    name: &str,
    bands: Bands,
    steps: &[(Micros, u32)],
    subjects: usize,
) {
    let memory = MemoryStore::new(1000, Duration::from_secs(1));
    let policy = policy(name, bands);
    let who: Vec<Pseudonym> = (0..subjects)
        .map(|i| subject(&format!("{name}#{i}")))
        .collect();
    let keys: Vec<String> = who.iter().map(|s| state_key(&policy, s)).collect();
    let mut conn = server.connection();
    let mut now = redis_time(&mut conn) + 60_000_000;
    for (i, &(advance, cost)) in steps.iter().enumerate() {
        now += advance;
        for key in &keys {
            pin_t(&mut conn, key, now);
        }
        let evaluations: Vec<Evaluation<'_>> =
            who.iter().map(|s| evaluation(&policy, s, cost)).collect();
        let from_redis =
            futures_util::future::join_all(evaluations.iter().map(|ev| store.evaluate(ev))).await;
        for (j, (ev, from_redis)) in evaluations.iter().zip(from_redis).enumerate() {
            let from_memory = memory.evaluate_at(ev, now);
            assert_eq!(
                from_redis, from_memory,
                "{name}: subject {j}, step {i} (advance {advance} us, cost {cost}) differs"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_table_matches_the_memory_store_through_batches() {
    let server = RedisServer::start();
    let mut config = redis_config(server.url());
    config.max_clock_regression = Duration::from_secs(24 * 3600);
    // One lane: one call in flight, the others queue behind it.
    config.pool_size = 1;
    let store = connect_with(config, BUDGET).await;
    for (name, bands, steps) in designed_table() {
        conform_batched(&server, &store, name, bands, &steps, 5).await;
    }
    for (seed, (name, bands, longest)) in random_table().into_iter().enumerate() {
        let steps = random_steps(seed as u64, &bands, longest, 60);
        conform_batched(&server, &store, name, bands, &steps, 5).await;
    }
    let batches = store.stats().batches.load(Ordering::Relaxed);
    let batched = store.stats().batched.load(Ordering::Relaxed);
    assert!(batches > 0, "nothing went through the batch path");
    assert!(
        batched >= 2 * batches,
        "{batched} decisions in {batches} batches"
    );
}

/// More numbers than one Lua pattern captures (32): the state is read by
/// the scripts' general path, and decides the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_of_many_bands_conforms_too() {
    let server = RedisServer::start();
    let mut config = redis_config(server.url());
    // Room for pinning Redis' decision time ahead of its clock.
    config.max_clock_regression = Duration::from_secs(24 * 3600);
    let store = connect_with(config, BUDGET).await;
    let counter: Vec<WindowBand> = (1..=11).map(|i| window(3 + i, 300 * i as u64)).collect();
    let fixed: Vec<WindowBand> = (1..=16).map(|i| window(3 + i, 300 * i as u64)).collect();
    for (seed, (name, bands)) in [
        ("counter-many", Bands::SlidingCounter(counter)),
        ("fixed-many", Bands::FixedWindow(fixed)),
    ]
    .into_iter()
    .enumerate()
    {
        let steps = random_steps(seed as u64 + 100, &bands, 5_000_000, 150);
        conform_pinned(&server, &store, name, bands, &steps).await;
    }
}

/// A policy whose explicit revision is kept across a change of its bands
/// shares the state key: the bands both versions have keep their numbers,
/// a new band starts afresh, and a band no longer configured is dropped at
/// the next write, as fields of a hash once were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bands_kept_under_one_revision_keep_their_counts() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let one = Policy::new(
        "kept",
        "same",
        Bands::FixedWindow(vec![window(5, 3_600_000)]),
        false,
    );
    let two = Policy::new(
        "kept",
        "same",
        Bands::FixedWindow(vec![window(5, 3_600_000), window(3, 3_600_000)]),
        false,
    );
    let subject = subject("kept");
    let key = state_key(&one, &subject);
    assert_eq!(key, state_key(&two, &subject));
    for left in [4, 3] {
        assert_eq!(
            decision(&eval(&store, &one, &subject, 1).await).remaining,
            left
        );
    }
    // Band 1 has 2 of 5, band 2 is new: 2 of 3 left either way.
    let d = decision(&eval(&store, &two, &subject, 1).await);
    assert!(d.allowed && d.remaining == 2 && d.band == 0, "{d:?}");
    assert_eq!(
        state_text(&mut conn, &key)
            .expect("state")
            .split(':')
            .count(),
        5
    );
    // Back to one band: its count is the one both charged.
    let d = decision(&eval(&store, &one, &subject, 1).await);
    assert!(d.allowed && d.remaining == 1, "{d:?}");
    assert_eq!(
        state_text(&mut conn, &key)
            .expect("state")
            .split(':')
            .count(),
        3
    );
    // Another algorithm under the same revision never reads it.
    let bucket = Policy::new(
        "kept",
        "same",
        Bands::TokenBucket(vec![bucket(5, 1, 3_600_000)]),
        false,
    );
    assert_ne!(state_key(&bucket, &subject), key);
    let d = decision(&eval(&store, &bucket, &subject, 1).await);
    assert!(d.allowed && d.remaining == 4, "{d:?}");
}

/// The sliding log keeps one entry per admitted unit, so its time cannot be
/// pinned through a field. Instead the log is aged by moving every entry
/// back by the step's advance: Redis decides at its own `TIME`, a few
/// milliseconds of real time apart between steps. The steps keep every
/// entry at least 40 ms away from a window edge, so decisions must match
/// exactly and durations within that slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sliding_log_conforms_with_redis_time() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let bands = Bands::SlidingLog(vec![window(3, 1000), window(5, 3000)]);
    let ms = 1000;
    let steps: Vec<(Micros, u32)> = vec![
        (100 * ms, 1),
        (100 * ms, 2),
        (100 * ms, 1),
        (850 * ms, 1),
        (0, 1),
        (500 * ms, 1),
        (0, 1),
        (1500 * ms, 2),
        (0, 3),
        (3100 * ms, 3),
    ];
    let slack = Duration::from_millis(40);

    for attempt in 0.. {
        let name = format!("log-designed-{attempt}");
        let policy = policy(&name, bands.clone());
        let subject = subject(&name);
        let key = state_key(&policy, &subject);
        let memory = MemoryStore::new(1000, Duration::from_secs(1));
        let mut conn = server.connection();
        let started = std::time::Instant::now();
        let mut now = redis_time(&mut conn);
        let mut results = Vec::new();
        for &(advance, cost) in &steps {
            now += advance;
            let entries: Vec<(String, f64)> = conn.zrange_withscores(&key, 0, -1).expect("ZRANGE");
            for (member, score) in entries {
                let _: () = redis::cmd("ZADD")
                    .arg(&key)
                    .arg("XX")
                    .arg(score - advance as f64)
                    .arg(member)
                    .query(&mut conn)
                    .expect("ZADD XX");
            }
            let ev = evaluation(&policy, &subject, cost);
            results.push((
                store.evaluate(&ev).await,
                memory.evaluate_at(&ev, now + started.elapsed().as_micros() as u64),
            ));
        }
        // On a machine too loaded to keep the slack, run it again.
        if started.elapsed() > slack {
            assert!(attempt < 5, "machine too loaded for this test");
            continue;
        }
        for (i, (from_redis, from_memory)) in results.iter().enumerate() {
            let (r, m) = (decision(from_redis), decision(from_memory));
            let close = |a: Duration, b: Duration| a.abs_diff(b) <= slack;
            assert!(
                r.allowed == m.allowed
                    && r.band == m.band
                    && r.remaining == m.remaining
                    && close(r.reset_after, m.reset_after)
                    && close(r.retry_after, m.retry_after),
                "step {i}: redis {r:?} memory {m:?}"
            );
        }
        break;
    }
}
