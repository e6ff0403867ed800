//! How failures are classified and answered: kill, restart, FUNCTION
//! FLUSH, CLIENT PAUSE, a lost reply, a far clock, corrupt state.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_fails_fast_and_a_fresh_one_recovers() {
    let mut server = RedisServer::start();
    let budget = ms(100);
    let mut config = redis_config(server.url());
    // Three calls, all failed: every threshold met at the third.
    config.breaker_failures = 3;
    config.breaker_min_calls = 3;
    config.breaker_cooldown = ms(300);
    let store = connect_with(config, budget).await;
    let policy = policy("kill", Bands::FixedWindow(vec![window(1000, 3_600_000)]));
    let subject = subject("kill");
    assert!(allowed(&eval(&store, &policy, &subject, 1).await));

    server.kill();
    let mut seen_rejected = false;
    for _ in 0..40 {
        let started = Instant::now();
        let ev = Evaluation {
            deadline: started + budget,
            ..evaluation(&policy, &subject, 1)
        };
        let outcome = store.evaluate(&ev).await;
        assert!(
            started.elapsed() <= budget + MARGIN,
            "took {:?}",
            started.elapsed()
        );
        assert!(
            matches!(outcome, Outcome::Unavailable(_) | Outcome::Indeterminate),
            "{outcome:?}"
        );
        seen_rejected |= outcome == Outcome::Unavailable(Unavailable::AdmissionRejected);
        tokio::time::sleep(ms(10)).await;
    }
    assert!(seen_rejected, "the breaker never opened");
    assert!(store.breaker_opened_total() >= 1);
    assert!(store.stats().unreachable.load(Ordering::Relaxed) >= 1);

    let loads_before = store.stats().script_loads.load(Ordering::Relaxed);
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if allowed(&eval(&store, &policy, &subject, 1).await) {
            break;
        }
        assert!(Instant::now() < deadline, "no recovery within 5 s");
        tokio::time::sleep(ms(50)).await;
    }
    // The fresh server had no scripts: function-not-found, then loaded again.
    assert!(store.stats().noscript.load(Ordering::Relaxed) >= 1);
    assert!(store.stats().script_loads.load(Ordering::Relaxed) > loads_before);
    assert!(store.ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn function_flush_is_absorbed() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let policy = policy("flush", Bands::FixedWindow(vec![window(5, 3_600_000)]));
    let subject = subject("flush");
    for _ in 0..3 {
        assert!(allowed(&eval(&store, &policy, &subject, 1).await));
    }
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut conn)
        .expect("FUNCTION FLUSH");
    let outcomes = [
        eval(&store, &policy, &subject, 1).await,
        eval(&store, &policy, &subject, 1).await,
        eval(&store, &policy, &subject, 1).await,
    ];
    assert!(
        allowed(&outcomes[0]) && allowed(&outcomes[1]),
        "{outcomes:?}"
    );
    assert!(matches!(outcomes[2], Outcome::Denied(_)), "{outcomes:?}");
    assert!(store.stats().noscript.load(Ordering::Relaxed) >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_pause_longer_than_the_budget_answers_within_it() {
    let server = RedisServer::start();
    let budget = ms(100);
    let mut config = redis_config(server.url());
    config.breaker_cooldown = ms(200);
    let store = connect_with(config, budget).await;
    let mut conn = server.connection();
    let policy = policy("pause", Bands::SlidingLog(vec![window(1000, 3_600_000)]));
    let subject = subject("pause");
    assert!(allowed(&eval(&store, &policy, &subject, 1).await));

    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(1500)
        .arg("ALL")
        .query(&mut conn)
        .expect("CLIENT PAUSE");
    let paused = Instant::now();
    while paused.elapsed() < ms(1000) {
        let started = Instant::now();
        let ev = Evaluation {
            deadline: started + budget,
            ..evaluation(&policy, &subject, 1)
        };
        let outcome = store.evaluate(&ev).await;
        assert!(
            started.elapsed() <= budget + MARGIN,
            "took {:?}",
            started.elapsed()
        );
        assert!(
            matches!(outcome, Outcome::Unavailable(_) | Outcome::Indeterminate),
            "{outcome:?}"
        );
    }
    assert!(store.stats().timeouts.load(Ordering::Relaxed) >= 1);

    let deadline = Instant::now() + Duration::from_secs(5);
    while !allowed(&eval(&store, &policy, &subject, 1).await) {
        assert!(Instant::now() < deadline, "no recovery after the pause");
        tokio::time::sleep(ms(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evaluation_failing_in_a_batch_fails_alone() {
    let server = RedisServer::start();
    let mut config = redis_config(server.url());
    config.pool_size = 1;
    let store = connect_with(config, BUDGET).await;
    let mut conn = server.connection();
    let policy = policy("batch-fail", Bands::FixedWindow(vec![window(5, 3_600_000)]));
    let warm = eval(&store, &policy, &subject("batch-fail-warm"), 1).await;
    assert!(allowed(&warm), "{warm:?}");
    let who: Vec<Pseudonym> = (0..6)
        .map(|i| subject(&format!("batch-fail-{i}")))
        .collect();
    let keys: Vec<String> = who.iter().map(|s| state_key(&policy, s)).collect();
    // Member 2's state is corrupt (the script's own check fails); member
    // 4's key is a hash (Redis refuses the script's GET): both raise an
    // error inside the batch, each before its own write.
    let _: () = conn.set(&keys[2], "not a number").expect("SET");
    let _: () = conn.hset(&keys[4], "c1", "1").expect("HSET");

    let outcomes = together(&mut conn, &store, &policy, &who).await;
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == 2 || i == 4 {
            assert_eq!(
                *outcome,
                Outcome::Incompatible(Incompatible::MalformedReply),
                "{i}"
            );
            let records: Vec<String> = conn.keys(format!("{}:e:*", keys[i])).expect("KEYS");
            assert!(records.is_empty(), "{i}: {records:?}");
        } else {
            let d = decision(outcome);
            assert!(d.allowed && d.remaining == 4, "{i}: {outcome:?}");
            assert_eq!(fixed_count(&mut conn, &keys[i]), Some(1), "{i}");
        }
    }
    assert_eq!(
        state_text(&mut conn, &keys[2]).as_deref(),
        Some("not a number")
    );
    // Members 2 to 5 went in one batch (0 and 1 were sent alone: the
    // lane's two calls in flight).
    assert_eq!(store.stats().batches.load(Ordering::Relaxed), 1);
    assert_eq!(store.stats().batched.load(Ordering::Relaxed), 4);
    assert_eq!(store.stats().script_errors.load(Ordering::Relaxed), 2);
    // Decided again, the members that succeeded count on.
    let again = together(&mut conn, &store, &policy, &who).await;
    assert_eq!(decision(&again[5]).remaining, 3, "{again:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clock_far_behind_the_last_write_is_unsafe() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let policy = policy("clock", Bands::FixedWindow(vec![window(5, 3_600_000)]));
    let subject = subject("clock");
    let key = state_key(&policy, &subject);
    assert!(allowed(&eval(&store, &policy, &subject, 1).await));

    // Within max_clock_regression (1 s): decided, no time counted.
    let now = redis_time(&mut conn);
    pin_t(&mut conn, &key, now + 500_000);
    assert!(allowed(&eval(&store, &policy, &subject, 1).await));
    assert_eq!(
        store.stats().clock_steps_absorbed.load(Ordering::Relaxed),
        1
    );

    // Beyond it: no decision, nothing written.
    pin_t(&mut conn, &key, now + 10_000_000);
    let before = state_text(&mut conn, &key);
    assert_eq!(
        eval(&store, &policy, &subject, 1).await,
        Outcome::Unavailable(Unavailable::ClockUnsafe)
    );
    let after = state_text(&mut conn, &key);
    assert_eq!(before, after);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_state_and_bad_costs_are_incompatible() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let policy = policy("corrupt", Bands::FixedWindow(vec![window(5, 3_600_000)]));

    let subject_a = subject("corrupt-a");
    let key = state_key(&policy, &subject_a);
    let now = redis_time(&mut conn);
    // Every number is checked, and a state refused is left as it was: no
    // write of the state, nor of a record.
    for corrupt in [
        "not a number".to_owned(),
        format!("{now}:0:x"),
        format!("{now}:0:-1"),
        format!("{now}:0:1.5"),
        format!("{now}:0:99999999999999999999"),
        format!("{now}:0:"),
        format!("{now}::1"),
        format!("{now}:0:1:"),
        format!("{now}:0"),
        format!(":{now}:0:1"),
    ] {
        let _: () = conn.set(&key, &corrupt).expect("SET");
        assert_eq!(
            eval(&store, &policy, &subject_a, 1).await,
            Outcome::Incompatible(Incompatible::MalformedReply),
            "{corrupt}"
        );
        assert_eq!(state_text(&mut conn, &key), Some(corrupt.clone()));
        let records: Vec<String> = conn.keys(format!("{key}:e:*")).expect("KEYS");
        assert!(records.is_empty(), "{corrupt}: {records:?}");
    }
    // A key of another type (a hash, as older versions kept under the
    // key without a mark) is refused as well.
    let _: () = conn.del(&key).expect("DEL");
    let _: () = conn.hset(&key, "c1", "1").expect("HSET");
    assert_eq!(
        eval(&store, &policy, &subject_a, 1).await,
        Outcome::Incompatible(Incompatible::MalformedReply)
    );

    let before = commandstats(&mut conn);
    let subject_b = subject("corrupt-b");
    assert_eq!(
        eval(&store, &policy, &subject_b, 6).await,
        Outcome::Incompatible(Incompatible::CostAboveMaximum)
    );
    assert_eq!(
        eval(&store, &policy, &subject_b, 0).await,
        Outcome::Incompatible(Incompatible::CostAboveMaximum)
    );
    // Past by more than the time a starved sidecar is given back (1 s):
    // spent however busy the machine is.
    let spent = Evaluation {
        deadline: Instant::now() - ms(1500),
        ..evaluation(&policy, &subject_b, 1)
    };
    assert_eq!(
        store.evaluate(&spent).await,
        Outcome::Unavailable(Unavailable::AdmissionRejected)
    );
    let fcall = |stats: &[(String, u64)]| {
        stats
            .iter()
            .find(|(n, _)| n == "fcall")
            .map_or(0, |(_, c)| *c)
    };
    assert_eq!(
        fcall(&commandstats(&mut conn)),
        fcall(&before),
        "Redis was asked anyway"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_redis_and_the_scripts() {
    let port = support::free_port();
    let config = redis_config(format!("redis://127.0.0.1:{port}"));
    let store = RedisStore::connect(&config, TTL_GRACE, BUDGET, &[]).expect("connect");
    tokio::time::sleep(ms(300)).await;
    assert!(!store.ready(), "ready with no Redis");
    let policy = policy("ready", Bands::FixedWindow(vec![window(5, 3_600_000)]));
    let subject = subject("ready");
    assert_eq!(
        eval(&store, &policy, &subject, 1).await,
        Outcome::Unavailable(Unavailable::BeforeSend)
    );
    let _server = RedisServer::builder().start_on(port);
    wait_ready(&store).await;
    assert!(allowed(&eval(&store, &policy, &subject, 1).await));
}
