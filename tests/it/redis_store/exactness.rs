//! Exact limits under concurrency; a denial writes nothing.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let mut config = redis_config(server.url());
    config.pool_size = 4;
    let store = Arc::new(connect_with(config, Duration::from_secs(5)).await);
    let hour = 3_600_000;
    let cases = [
        ("log", Bands::SlidingLog(vec![window(10, hour)])),
        ("fixed", Bands::FixedWindow(vec![window(10, hour)])),
        ("bucket", Bands::TokenBucket(vec![bucket(10, 1, hour)])),
        ("gcra", Bands::Gcra(vec![gcra(10, hour, 10)])),
    ];
    for (name, bands) in cases {
        let policy = Arc::new(policy(name, bands));
        let subject = subject(name);
        let release = Arc::new(tokio::sync::Barrier::new(100));
        let tasks: Vec<_> = (0..100)
            .map(|_| {
                let (store, policy, release) = (store.clone(), policy.clone(), release.clone());
                tokio::spawn(async move {
                    release.wait().await;
                    let ev = Evaluation {
                        policy: &policy,
                        subject: &subject,
                        cost: 1,
                        deadline: Instant::now() + Duration::from_secs(5),
                        id: EvaluationId::fresh(),
                        settle_within: None,
                    };
                    store.evaluate(&ev).await
                })
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            let outcome = task.await.expect("task");
            assert!(
                matches!(outcome, Outcome::Allowed(_) | Outcome::Denied(_)),
                "{name}: {outcome:?}"
            );
            admitted += usize::from(allowed(&outcome));
        }
        assert_eq!(admitted, 10, "{name}");
    }
}

/// A request denied by one band leaves every band's stored state as it was:
/// checked in Redis itself, not through the next decision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_request_writes_nothing_to_any_band() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let hour = 3_600_000;
    let cases = [
        (
            "fixed",
            Bands::FixedWindow(vec![window(100, hour), window(2, hour)]),
        ),
        (
            "counter",
            Bands::SlidingCounter(vec![window(100, hour), window(2, hour)]),
        ),
        (
            "log",
            Bands::SlidingLog(vec![window(100, hour), window(2, hour)]),
        ),
        (
            "bucket",
            Bands::TokenBucket(vec![bucket(100, 1, hour), bucket(2, 1, hour)]),
        ),
        (
            "gcra",
            Bands::Gcra(vec![gcra(100, hour, 100), gcra(2, hour, 2)]),
        ),
    ];
    for (name, bands) in cases {
        let policy = policy(name, bands);
        let subject = subject(name);
        let key = state_key(&policy, &subject);
        for _ in 0..2 {
            assert!(allowed(&eval(&store, &policy, &subject, 1).await), "{name}");
        }
        // A denial records its decision, beside the state, never in it.
        let snapshot = |conn: &mut redis::Connection| -> Vec<(String, String)> {
            if name == "log" {
                conn.zrange_withscores(&key, 0, -1).expect("ZRANGE")
            } else {
                state_text(conn, &key)
                    .map(|text| ("state".to_owned(), text))
                    .into_iter()
                    .collect()
            }
        };
        let before = snapshot(&mut conn);
        assert!(!before.is_empty(), "{name}: nothing stored");
        let denied = eval(&store, &policy, &subject, 1).await;
        assert_eq!(decision(&denied).band, 1, "{name}: {denied:?}");
        assert!(!decision(&denied).allowed);
        assert_eq!(
            snapshot(&mut conn),
            before,
            "{name}: a denied request wrote"
        );
    }
}
