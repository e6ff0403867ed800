//! Least privilege, a password and a database in the URL, TLS, what
//! the keys hold and what a request costs Redis.

use super::*;

/// The ACL a deployment needs (lua/README.md): FCALL, FUNCTION LOAD, LIST and DELETE and
/// exactly the commands the scripts call, on the key prefix; never EVAL.
const SLUICE_ACL: &str = "user sluice on >sluice-pw resetchannels ~sluice:* -@all \
     +fcall +function|load +function|list +function|delete +ping +time +get +set +pexpire +touch \
     +zadd +zcount +zrange +zrangebyscore +zrem +zremrangebyscore";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_eval_limits_exactly() {
    let server = RedisServer::builder()
        .config("user default off")
        .config("user admin on >admin-pw ~* &* +@all")
        .config(SLUICE_ACL)
        .admin("admin", "admin-pw")
        .start();
    let store = connect_with(redis_config(server.url_as("sluice", "sluice-pw")), BUDGET).await;

    // The user really cannot EVAL.
    let client = redis::Client::open(server.url_as("sluice", "sluice-pw")).expect("client");
    let mut plain = client.get_connection().expect("connect as sluice");
    let eval: redis::RedisResult<i64> = redis::cmd("EVAL").arg("return 1").arg(0).query(&mut plain);
    assert!(eval.is_err(), "EVAL allowed");
    // Nor EVALSHA: every decision is an FCALL.
    let evalsha: redis::RedisResult<i64> = redis::cmd("EVALSHA")
        .arg("0".repeat(40))
        .arg(0)
        .query(&mut plain);
    assert_eq!(
        evalsha.err().and_then(|e| e.code().map(str::to_owned)),
        Some("NOPERM".to_owned()),
        "EVALSHA allowed"
    );

    for (name, bands) in slow_bands() {
        let policy = policy(name, bands);
        let subject = subject(name);
        let mut admitted = 0;
        for _ in 0..12 {
            let outcome = eval_one(&store, &policy, &subject).await;
            assert!(
                matches!(outcome, Outcome::Allowed(_) | Outcome::Denied(_)),
                "{name}: {outcome:?}"
            );
            admitted += usize::from(allowed(&outcome));
        }
        assert_eq!(admitted, 4, "{name}");
    }
}

async fn eval_one(store: &RedisStore, policy: &Policy, subject: &Pseudonym) -> Outcome {
    eval(store, policy, subject, 1).await
}

/// A URL's password without a user (`AUTH pw`, as `requirepass` wants)
/// and its database number (`SELECT`) are both honoured: the state is
/// written in that database and nowhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_and_a_database_in_the_url_are_used() {
    let server = RedisServer::builder()
        .config("requirepass db-pw")
        .admin("default", "db-pw")
        .start();
    let url = format!("{}/3", server.url().replacen("://", "://:db-pw@", 1));
    let store = connect_with(redis_config(url), BUDGET).await;
    let policy = policy("selected", Bands::FixedWindow(vec![window(2, 3_600_000)]));
    let subject = subject("selected");
    let outcomes = [
        eval_one(&store, &policy, &subject).await,
        eval_one(&store, &policy, &subject).await,
        eval_one(&store, &policy, &subject).await,
    ];
    assert!(
        allowed(&outcomes[0]) && allowed(&outcomes[1]),
        "{outcomes:?}"
    );
    assert!(matches!(outcomes[2], Outcome::Denied(_)), "{outcomes:?}");

    let key = state_key(&policy, &subject);
    let mut conn = server.connection();
    let in_db = |conn: &mut redis::Connection, db: i64| -> bool {
        redis::cmd("SELECT").arg(db).exec(conn).expect("SELECT");
        conn.exists(&key).expect("EXISTS")
    };
    assert!(in_db(&mut conn, 3), "no state in database 3");
    assert!(!in_db(&mut conn, 0), "state written to database 0");

    // A wrong password is refused at connecting: nothing is sent.
    let wrong = format!("{}/3", server.url().replacen("://", "://:not-it@", 1));
    let store = RedisStore::connect(&redis_config(wrong), TTL_GRACE, BUDGET, &[]).expect("connect");
    assert_eq!(
        eval_one(&store, &policy, &subject).await,
        Outcome::Unavailable(Unavailable::BeforeSend)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_over_tls_with_a_private_ca() {
    let dir = tempfile::tempdir().expect("temp dir");
    let files = support::redis::tls_files(dir.path());
    let server = RedisServer::builder().tls(files.clone()).start();
    assert!(server.url().starts_with("rediss://"));

    let mut config = redis_config(server.url());
    config.ca_file = Some(files.ca.clone());
    let store = connect_with(config, BUDGET).await;
    let policy = policy("tls", Bands::SlidingLog(vec![window(3, 3_600_000)]));
    let subject = subject("tls");
    let outcomes = [
        eval(&store, &policy, &subject, 1).await,
        eval(&store, &policy, &subject, 2).await,
        eval(&store, &policy, &subject, 1).await,
    ];
    assert!(
        allowed(&outcomes[0]) && allowed(&outcomes[1]),
        "{outcomes:?}"
    );
    assert!(matches!(outcomes[2], Outcome::Denied(_)), "{outcomes:?}");

    // Without the CA the server is not trusted: nothing is sent.
    let untrusting = redis_config(server.url());
    let store = RedisStore::connect(&untrusting, TTL_GRACE, BUDGET, &[]).expect("connect");
    assert_eq!(
        eval(&store, &policy, &subject, 1).await,
        Outcome::Unavailable(Unavailable::BeforeSend)
    );
    assert!(!store.ready());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_hold_no_identity_and_all_expire() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let identities = ["alice-api-key-7f3a9", "203.0.113.77", "2001:db8::42"];
    let mut admitted = 0;
    for (name, bands) in all_bands() {
        let policy = policy(name, bands);
        for identity in identities {
            let subject = PseudonymKey::new(b"redis store test key", 1).pseudonym(
                "header:x-api-key",
                identity.as_bytes(),
                "api",
            );
            for _ in 0..6 {
                if allowed(&eval(&store, &policy, &subject, 1).await) {
                    admitted += 1;
                }
            }
        }
    }
    let (leases, keys): (Vec<String>, Vec<String>) = conn
        .keys::<_, Vec<String>>("*")
        .expect("KEYS")
        .into_iter()
        .partition(|k| k.starts_with("sluice:library:"));
    // The libraries' leases expire too, and name nobody.
    assert!(!leases.is_empty());
    for lease in &leases {
        let ttl: i64 = conn.pttl(lease).expect("PTTL");
        assert!(ttl > 0, "{lease} has no TTL");
        assert!(identities.iter().all(|i| !lease.contains(i)), "{lease}");
    }
    // One state key per subject (a string, or the sliding log's sorted
    // set), and one record per admission (a denial leaves none): beside
    // it, or, the last of a compact state's, in the state.
    let records = keys.iter().filter(|k| k.contains("}:e:")).count();
    let held = keys
        .iter()
        .filter(|k| !k.contains("}:e:"))
        .filter(|k| {
            conn.key_type::<_, String>(*k).expect("TYPE") == "string"
                && held_record(&mut conn, k).is_some()
        })
        .count();
    let policies = all_bands().len();
    assert_eq!(keys.len() - records, policies * 3, "{keys:?}");
    assert!(admitted < policies * 3 * 6, "no denial: {admitted}");
    assert!(held > 0, "no record held in a state");
    assert_eq!(records + held, admitted, "{keys:?}");
    for key in keys {
        // A subject's keys share one Redis Cluster hash slot.
        let tag = &key[key.find('{').expect("hash tag")..=key.find('}').expect("hash tag")];
        assert!(tag.contains(":v1:"), "{key}");
        let ttl: i64 = conn.pttl(&key).expect("PTTL");
        assert!(ttl > 0, "{key} has no TTL");
        let dump = match conn.key_type::<_, String>(&key).expect("TYPE").as_str() {
            "hash" => format!(
                "{:?}",
                conn.hgetall::<_, Vec<(String, String)>>(&key)
                    .expect("HGETALL")
            ),
            "zset" => format!(
                "{:?}",
                conn.zrange_withscores::<_, Vec<(String, f64)>>(&key, 0, -1)
                    .expect("ZRANGE")
            ),
            "string" => conn.get::<_, String>(&key).expect("GET"),
            other => panic!("{key}: unexpected type {other}"),
        };
        for identity in identities {
            assert!(!key.contains(identity) && !dump.contains(identity), "{key}");
        }
    }
}

/// The commands the scripts call, which `INFO commandstats` counts too.
const SCRIPT_COMMANDS: [&str; 9] = [
    "time",
    "get",
    "set",
    "pexpire",
    "zadd",
    "zcount",
    "zrange",
    "zrangebyscore",
    "zremrangebyscore",
];

/// The target cost of a decision: one FCALL sent, nothing else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_fcall_per_decision() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let policy = policy("cost", Bands::Gcra(vec![gcra(1000, 1000, 1000)]));
    // A policy the store was not given at start: its first evaluation
    // loads its script (function not found, FUNCTION LOAD, FCALL). Counted after it.
    assert!(allowed(
        &eval(&store, &policy, &subject("cost-warm"), 1).await
    ));
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .expect("RESETSTAT");
    for i in 0..200 {
        let outcome = eval(&store, &policy, &subject(&format!("cost-{}", i % 7)), 1).await;
        assert!(allowed(&outcome), "{outcome:?}");
    }
    let stats = commandstats(&mut conn);
    let sent: Vec<_> = stats
        .iter()
        .filter(|(name, _)| {
            !SCRIPT_COMMANDS.contains(&name.as_str())
                && !matches!(name.as_str(), "info" | "config|resetstat")
        })
        .collect();
    assert_eq!(sent, [&("fcall".to_owned(), 200)], "{stats:?}");
}

// ---------------------------------------------------------------------------
// Libraries no sidecar uses any more
// ---------------------------------------------------------------------------

fn load_library(conn: &mut redis::Connection, name: &str) {
    let code =
        format!("#!lua name={name}\nredis.register_function('{name}', function() return 1 end)\n");
    let _: String = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg(code)
        .query(conn)
        .expect("FUNCTION LOAD");
}

async fn connect_policies(server: &RedisServer, policies: &[Policy]) -> RedisStore {
    let policies: Vec<Arc<Policy>> = policies.iter().cloned().map(Arc::new).collect();
    let store = RedisStore::connect(&redis_config(server.url()), TTL_GRACE, BUDGET, &policies)
        .expect("connect");
    wait_ready(&store).await;
    store
}

/// Waits until `name` is gone from the server: the start's prune ran.
async fn until_deleted(conn: &mut redis::Connection, name: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while support::redis::function_libraries(conn, None)
        .iter()
        .any(|l| l == name)
    {
        assert!(Instant::now() < deadline, "{name} was never deleted");
        tokio::time::sleep(ms(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_deletes_only_the_libraries_nobody_holds_a_lease_on() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    // Left by a policy nobody has run for a day (its lease expired), held
    // by another sidecar (a live lease), and another application's.
    let stale = format!("sluice_{}", "0".repeat(40));
    let held = format!("sluice_{}", "1".repeat(40));
    for name in [&stale, &held, &"other_app".to_owned()] {
        load_library(&mut conn, name);
    }
    let _: () = conn
        .set_ex(format!("sluice:library:{held}"), 1, 600)
        .expect("SET");

    let first = policy("first", Bands::FixedWindow(vec![window(5, 3_600_000)]));
    let store = connect_policies(&server, std::slice::from_ref(&first)).await;
    until_deleted(&mut conn, &stale).await;
    let after_start = support::redis::function_libraries(&mut conn, None);
    assert!(after_start.contains(&held), "{after_start:?}");
    assert!(
        after_start.contains(&"other_app".to_owned()),
        "{after_start:?}"
    );
    // Its own: the policy's and the probe's, each leased for a day.
    let own: Vec<&String> = after_start
        .iter()
        .filter(|l| l.starts_with("sluice_") && **l != held)
        .collect();
    assert_eq!(own.len(), 2, "{after_start:?}");
    for name in &own {
        let ttl: i64 = conn.pttl(format!("sluice:library:{name}")).expect("PTTL");
        assert!(
            ttl > 23 * 3_600_000 && ttl <= 24 * 3_600_000,
            "{name}: {ttl}"
        );
    }

    // Another sidecar with another configuration starts (a rollout): it
    // prunes (another stale library goes) but leaves the first sidecar's,
    // which decides on without reloading anything.
    let stale_again = format!("sluice_{}", "2".repeat(40));
    load_library(&mut conn, &stale_again);
    let second = policy("second", Bands::Gcra(vec![gcra(10, 1000, 10)]));
    let other = connect_policies(&server, std::slice::from_ref(&second)).await;
    until_deleted(&mut conn, &stale_again).await;
    let now = support::redis::function_libraries(&mut conn, None);
    for name in &own {
        assert!(now.contains(name), "{name} deleted: {now:?}");
    }
    assert!(allowed(&eval(&store, &first, &subject("lease"), 1).await));
    assert!(allowed(&eval(&other, &second, &subject("lease"), 1).await));
    assert_eq!(store.stats().noscript.load(Ordering::Relaxed), 0);
    assert_eq!(other.stats().noscript.load(Ordering::Relaxed), 0);

    // A reload deletes nothing: the first sidecar learns a changed policy
    // and keeps the old one's library (a sidecar mid-rollout may use it).
    let changed = policy("first", Bands::FixedWindow(vec![window(6, 3_600_000)]));
    store.learn(&[Arc::new(changed.clone())]);
    assert!(allowed(&eval(&store, &changed, &subject("lease"), 1).await));
    let after_reload = support::redis::function_libraries(&mut conn, None);
    for name in &own {
        assert!(
            after_reload.contains(name),
            "{name} deleted: {after_reload:?}"
        );
    }
}

/// A reservation (a limit charged on response) is given back by its record
/// long after `dedupe_window`, and the memory store's twin of each refund
/// gives back the same: the two stores agree on what is left after a
/// partial refund, for every algorithm.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_given_back_after_the_dedupe_window_alike_on_both_stores() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let mut config = redis_config(server.url());
    config.dedupe_window = ms(800);
    let redis = connect_with(config, BUDGET).await;
    let memory = MemoryStore::new(1000, Duration::from_secs(1));
    let hour = 3_600_000;
    let cases = [
        ("fixed", Bands::FixedWindow(vec![window(4, hour)])),
        ("counter", Bands::SlidingCounter(vec![window(4, hour)])),
        ("log", Bands::SlidingLog(vec![window(4, hour)])),
        ("bucket", Bands::TokenBucket(vec![bucket(4, 1, hour)])),
        ("gcra", Bands::Gcra(vec![gcra(4, hour, 4)])),
    ];
    // The stores' clocks differ: what is compared is the verdict and what
    // is left.
    let left = |outcome: &Outcome| (allowed(outcome), decision(outcome).remaining);
    let mut reserved = Vec::new();
    for (name, bands) in &cases {
        let policy = policy(&format!("reserve-{name}"), bands.clone());
        let who = subject(name);
        let ev = Evaluation {
            settle_within: Some(Duration::from_secs(30)),
            ..evaluation(&policy, &who, 3)
        };
        let on_redis = redis.evaluate(&ev).await;
        let on_memory = memory.evaluate_all(std::slice::from_ref(&ev));
        assert_eq!(decision(&on_redis).remaining, 1, "{name}: {on_redis:?}");
        assert_eq!(left(&on_memory.list[0]), left(&on_redis), "{name}");
        let record = format!("{}:e:{}", state_key(&policy, &who), ev.id);
        let ttl: i64 = conn.pttl(&record).expect("PTTL");
        assert!(
            ttl > 25_000,
            "{name}: the reservation's record lives {ttl} ms"
        );
        let (id, at) = (ev.id, on_memory.at);
        reserved.push((policy, who, id, at));
    }
    // Past the dedupe window: a retry's record would be gone by now.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for (policy, who, id, at) in &reserved {
        let name = &policy.name;
        let ev = Evaluation {
            id: *id,
            ..evaluation(policy, who, 3)
        };
        assert!(redis.refund_reserved(&ev, 2).await, "{name}: given back");
        memory.refund(&ev, *at, 2);
        // 4 - 3 + 2: three left on both.
        let on_redis = eval(&redis, policy, who, 3).await;
        let on_memory = memory.evaluate(&evaluation(policy, who, 3));
        assert!(allowed(&on_redis), "{name}: {on_redis:?}");
        assert_eq!(left(&on_memory), left(&on_redis), "{name}");
        let refused = eval(&redis, policy, who, 1).await;
        assert!(!allowed(&refused), "{name}: {refused:?}");
        let on_memory = memory.evaluate(&evaluation(policy, who, 1));
        assert_eq!(left(&on_memory), left(&refused), "{name}");
        // Given back once only.
        assert!(!redis.refund_reserved(&ev, 2).await, "{name}: twice");
    }
}
