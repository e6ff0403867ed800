//! Where records are kept and how they are written: in the state or a key
//! of their own, for a record's life and no longer, in the stored layout,
//! band included; and what a decision answers, the policy's function
//! called directly, as Redis sees it.

use std::time::Duration;

use redis::Commands;
use tokio::time::Instant;

use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::held_record;
use crate::support::store_api::*;
use sluice::limit::{Bands, Policy};
use sluice::store::redis::RedisStore;

/// The library (its one function) whose code holds `marker`.
fn library_of(conn: &mut redis::Connection, marker: &str) -> String {
    let listed: Vec<Vec<redis::Value>> = redis::cmd("FUNCTION")
        .arg("LIST")
        .arg("WITHCODE")
        .query(conn)
        .expect("FUNCTION LIST");
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        _ => String::new(),
    };
    let found: Vec<String> = listed
        .iter()
        .filter(|fields| fields.iter().any(|f| text(f).contains(marker)))
        .filter_map(|fields| fields.get(1).map(text))
        .collect();
    assert_eq!(found.len(), 1, "{marker}: {found:?}");
    found[0].clone()
}

/// A decision's reply as `lua/README.md` ("Reply") says it comes: eight
/// integers, `{version, outcome, remaining, reset, retry, band, replayed,
/// skew}`; or the text its record was written in (alone, or last in a
/// state, after its last `|`), which is `{1, outcome, remaining, reset,
/// retry, band, 0, 0}`. The text, if it came as one.
fn reply_fields(value: &redis::Value) -> (Vec<i64>, Option<String>) {
    match value {
        redis::Value::Array(items) => {
            let ints = items
                .iter()
                .map(|item| match item {
                    redis::Value::Int(n) => *n,
                    other => panic!("not an integer: {other:?} in {value:?}"),
                })
                .collect();
            (ints, None)
        }
        redis::Value::BulkString(bytes) => {
            let text = String::from_utf8(bytes.clone()).expect("ASCII");
            let record = text.rsplit('|').next().expect("a record");
            let numbers: Vec<i64> = record
                .split(':')
                .map(|n| n.parse().unwrap_or_else(|_| panic!("{text}")))
                .collect();
            assert_eq!(numbers.len(), 6, "{text}");
            let mut fields = vec![1];
            fields.extend_from_slice(&numbers[..5]);
            fields.extend([0, 0]);
            (fields, Some(text))
        }
        other => panic!("not a decision's reply: {other:?}"),
    }
}

/// `policy`'s library, loaded by its first evaluation (of the subject
/// `warm`) and found in Redis by `marker`: numbers no other policy here
/// has.
async fn loaded_library(
    store: &RedisStore,
    conn: &mut redis::Connection,
    policy: &Policy,
    warm: &str,
    marker: &str,
) -> String {
    let warm = eval(store, policy, &subject(warm), 1).await;
    assert!(allowed(&warm), "{warm:?}");
    library_of(conn, marker)
}

/// [`decision_call`] made, and its reply read by [`reply_fields`].
fn decide_directly(
    conn: &mut redis::Connection,
    name: &str,
    key: &str,
    first: &str,
    id: u128,
    cost: Option<u32>,
) -> redis::RedisResult<(Vec<i64>, Option<String>)> {
    decision_call(name, key, first, id, cost)
        .query::<redis::Value>(conn)
        .map(|value| reply_fields(&value))
}

/// A decision's call as Redis sees it, the policy's function called
/// directly: `FCALL name 2 state record first id [cost]`.
fn decision_call(name: &str, key: &str, first: &str, id: u128, cost: Option<u32>) -> redis::Cmd {
    let id = format!("{id:032x}");
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(name)
        .arg(2)
        .arg(key)
        .arg(format!("{key}:e:{id}"))
        .arg(first)
        .arg(&id);
    if let Some(cost) = cost {
        cmd.arg(cost);
    }
    cmd
}

/// A first send its own retry overtook (the retry went on another
/// connection after the first one failed; the first was held on its way: a
/// packet delayed, a proxy's queue) replays what the retry decided,
/// admitted or denied, and charges nothing: a first send claims its record
/// (`SET … NX`) before it writes the state. The policy's function called
/// directly, the retry (`0`) before the first send (`1`), as Redis would
/// see them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_send_its_retry_overtook_replays_the_retry() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let policy = policy("overtaken", Bands::FixedWindow(vec![window(3, 7_200_000)]));
    let marker = "local P_BAND_ARGS = {3, 7200000000}";
    let name = loaded_library(&store, &mut conn, &policy, "overtaken-warm", marker).await;
    let who = subject("overtaken");
    let key = state_key(&policy, &who);
    let fcall = |conn: &mut redis::Connection, first: &str, id: u128| {
        decide_directly(conn, &name, &key, first, id, Some(1)).map(|(fields, _)| fields)
    };
    // {version, outcome, remaining, reset, retry, band, replayed, skew}
    let retry = fcall(&mut conn, "0", 0xa).expect("the retry");
    assert_eq!((retry[1], retry[2], retry[6]), (1, 2, 0), "{retry:?}");
    let late = fcall(&mut conn, "1", 0xa).expect("the first send");
    assert_eq!((late[1], late[2], late[6]), (1, 2, 1), "{late:?}");
    assert_eq!(fixed_count(&mut conn, &key), Some(1), "charged twice");

    // A retry that denied records its denial, and the state says until
    // when a first send may find it; the first send arriving after it
    // replays that denial, though it would now be admitted (its count set
    // back to 0 here, as a new window would).
    for _ in 0..2 {
        assert!(allowed(&eval(&store, &policy, &who, 1).await));
    }
    let retry = fcall(&mut conn, "0", 0xb).expect("the retry");
    assert_eq!((retry[1], retry[6]), (0, 0), "{retry:?}");
    let raw = state_raw(&mut conn, &key).expect("state");
    let (numbers, tail) = raw.split_once('|').expect("the state says a retry ran");
    let mut numbers: Vec<&str> = numbers.split(':').collect();
    numbers[2] = "0";
    let emptied = format!("{}|{tail}", numbers.join(":"));
    let _: () = conn.set(&key, &emptied).expect("SET");
    let late = fcall(&mut conn, "1", 0xb).expect("the first send");
    assert_eq!((late[1], late[6]), (0, 1), "{late:?}");
    assert_eq!(
        state_raw(&mut conn, &key).as_deref(),
        Some(&emptied[..]),
        "a refused request charged"
    );
    let _: () = conn.del(&key).expect("DEL");

    // Not overtaken, a first send's denial leaves no record.
    for id in 0xc..0xf {
        let first = fcall(&mut conn, "1", id).expect("a first send");
        assert_eq!(first[1], 1, "{first:?}");
    }
    let denied = fcall(&mut conn, "1", 0xf).expect("a first send");
    assert_eq!((denied[1], denied[6]), (0, 0), "{denied:?}");
    let record: Option<String> = conn.get(format!("{key}:e:{:032x}", 0xf)).expect("GET");
    assert_eq!(record, None);

    // A call never sent as a first send (2: Redis Cluster, several limits
    // in one call) records its denial in its own key and writes no state:
    // no first send of its id can arrive after it.
    let before = state_raw(&mut conn, &key);
    let never = fcall(&mut conn, "2", 0x11).expect("never a first send");
    assert_eq!((never[1], never[6]), (0, 0), "{never:?}");
    assert_eq!(state_raw(&mut conn, &key), before);
    let record: Option<String> = conn.get(format!("{key}:e:{:032x}", 0x11)).expect("GET");
    assert!(record.is_some_and(|r| r.starts_with("0:")));

    // Anything but 1, 0 or 2 first is refused before any write.
    let refused = fcall(&mut conn, "3", 0x10).expect_err("refused");
    assert!(
        refused.to_string().contains("ARGV[1] is not 1"),
        "{refused}"
    );
    assert_eq!(fixed_count(&mut conn, &key), Some(3));
}

/// Each admitted evaluation leaves one record that lives `dedupe_window`
/// and no longer: in its state (a key, an expiry and a command fewer for
/// Redis) when the state holds no live record already, else in a key of
/// its own next to the state. The state holds one record at most, however
/// hot the subject. A denial leaves none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_admission_leaves_one_record_that_expires_with_the_window_and_a_denial_none() {
    let server = RedisServer::start();
    let mut conn = server.connection();
    let policy = policy("bounded", Bands::Gcra(vec![gcra(100, 3_600_000, 100)]));
    let records = |conn: &mut redis::Connection, key: &str| -> Vec<String> {
        conn.keys(format!("{key}:e:*")).expect("KEYS")
    };

    let mut config = redis_config(server.url());
    config.dedupe_window = ms(800);
    let store = connect_with(config, BUDGET).await;
    let busy = subject("bounded");
    let key = state_key(&policy, &busy);
    let mut admitted = Vec::new();
    for _ in 0..150 {
        let ev = evaluation(&policy, &busy, 1);
        if allowed(&store.evaluate(&ev).await) {
            admitted.push(ev.id);
        }
    }
    assert_eq!(admitted.len(), 100);
    // The state: t and a1, whatever the traffic, with its TTL, and the
    // first admission's record, alive through the others.
    let state = state_text(&mut conn, &key).expect("state");
    assert_eq!(state.split(':').count(), 2, "{state}");
    let ttl: i64 = conn.pttl(&key).expect("PTTL");
    assert!(ttl > 0, "{key}: {ttl} ms");
    // (The policy's first call loaded its library and went again as a
    // re-send could, recording in a key: the next is the state's.)
    let (held, text) = held_record(&mut conn, &key).expect("a record in the state");
    assert_eq!(held, admitted.remove(1).to_string());
    assert!(text.starts_with("1:"), "{text}");
    // One record per other admission, under its id, none for the 50
    // denials.
    let mut recorded = records(&mut conn, &key);
    recorded.sort();
    let mut want: Vec<String> = admitted.iter().map(|id| format!("{key}:e:{id}")).collect();
    want.sort();
    assert_eq!(recorded, want);
    for record in &recorded {
        let ttl: i64 = conn.pttl(record).expect("PTTL");
        assert!(ttl > 0 && ttl <= 800, "{record}: {ttl} ms");
        let text: String = conn.get(record).expect("GET");
        assert!(text.starts_with("1:"), "{record}: {text}");
    }

    // After the window every record key is gone: nothing accumulates.
    let deadline = Instant::now() + Duration::from_secs(5);
    while !records(&mut conn, &key).is_empty() {
        assert!(Instant::now() < deadline, "records outlived the window");
        tokio::time::sleep(ms(50)).await;
    }
    // A subject asked less than once a window (the many subjects of a busy
    // service) costs Redis one key: its state, holding its record; the
    // next admission takes the place of a record past its life.
    let cold = subject("bounded-cold");
    let cold_key = state_key(&policy, &cold);
    for _ in 0..2 {
        let ev = evaluation(&policy, &cold, 1);
        assert!(allowed(&store.evaluate(&ev).await));
        assert_eq!(records(&mut conn, &cold_key), Vec::<String>::new());
        let (held, _) = held_record(&mut conn, &cold_key).expect("a record in the state");
        assert_eq!(held, ev.id.to_string());
        tokio::time::sleep(ms(850)).await;
    }
}

/// A cold subject's first admission writes its state and its record as
/// one string, laid out as `lua/README.md` says ("State", "Records"):
/// `t:start:count|expires|resent|id|outcome:remaining:reset:retry:band:t`.
/// Sidecars of two versions read each other's during a rolling upgrade,
/// so the text itself is pinned here, each number against the decision
/// and the clock it was made at, however the script comes to write it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_first_admission_writes_its_state_and_record_in_the_stored_layout() {
    const WINDOW_US: u64 = 60_000_000;
    let server = RedisServer::start();
    let mut conn = server.connection();
    let policy = policy("layout", Bands::FixedWindow(vec![window(10, 60_000)]));
    let mut config = redis_config(server.url());
    config.dedupe_window = ms(800);
    let store = connect_with(config, BUDGET).await;
    // The policy's first call loads its library and goes again as a
    // re-send could (which marks its state resent): another subject's.
    assert!(allowed(
        &eval(&store, &policy, &subject("layout-warm"), 1).await
    ));

    let cold = subject("layout-cold");
    let key = state_key(&policy, &cold);
    let ev = evaluation(&policy, &cold, 1);
    let decided = decision(&store.evaluate(&ev).await);
    assert!(decided.allowed);
    let raw = state_raw(&mut conn, &key).expect("a state");
    let parts: Vec<&str> = raw.split('|').collect();
    let numbers = |text: &str| -> Vec<u64> {
        text.split(':')
            .map(|n| {
                n.parse()
                    .unwrap_or_else(|_| panic!("not a number in {raw}"))
            })
            .collect()
    };
    let [state, expires, resent, id, record] = parts[..] else {
        panic!("not numbers and a held record: {raw}");
    };
    let [t, start, count] = numbers(state)[..] else {
        panic!("not t:start:count: {raw}");
    };
    assert_eq!(start, t - t % WINDOW_US, "{raw}");
    assert_eq!(count, 1, "{raw}");
    assert_eq!(numbers(expires), [t + 800_000], "{raw}");
    assert_eq!(resent, "0", "{raw}");
    assert_eq!(id, ev.id.to_string(), "{raw}");
    let reset = start + WINDOW_US - t;
    assert_eq!(numbers(record), [1, 9, reset, 0, 0, t], "{raw}");
    assert_eq!(
        (decided.remaining, decided.reset_after, decided.band),
        (9, Duration::from_micros(reset), 0)
    );
}

/// A record's retry and band are written as text when they are `0` (most
/// admissions), and formatted otherwise: an admission bound by a policy's
/// second band keeps `1` for its band, in the state's held record and in
/// a record's own key alike, and a re-send of either id replays it. The
/// policy's function called directly, as Redis sees the calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_of_the_second_band_keeps_its_band_in_the_state_and_in_its_key() {
    const WIDE_US: u64 = 7_300_000_000;
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    // The second band has less left after an admission (2 of 3, beside 9
    // of 10): it binds.
    let policy = policy(
        "second-band",
        Bands::FixedWindow(vec![window(10, 60_000), window(3, 7_300_000)]),
    );
    let marker = "local P_BAND_ARGS = {10, 60000000, 3, 7300000000}";
    let name = loaded_library(&store, &mut conn, &policy, "second-band-warm", marker).await;
    let who = subject("second-band");
    let key = state_key(&policy, &who);
    let fcall = |conn: &mut redis::Connection, first: &str, id: u128| {
        decide_directly(conn, &name, &key, first, id, None)
    };
    let numbers = |text: &str| -> Vec<u64> {
        text.split(':')
            .map(|n| {
                n.parse()
                    .unwrap_or_else(|_| panic!("not a number in {text}"))
            })
            .collect()
    };

    // {version, outcome, remaining, reset, retry, band, replayed, skew}
    let (first, text) = fcall(&mut conn, "1", 0x21).expect("a first send");
    assert_eq!(
        (first[1], first[2], first[5], first[6]),
        (1, 2, 1, 0),
        "{first:?}"
    );
    let (held, record) = held_record(&mut conn, &key).expect("a held record");
    assert_eq!(held, format!("{:032x}", 0x21));
    let raw = state_raw(&mut conn, &key).expect("a state");
    let t = numbers(raw.split('|').next().expect("numbers"))[0];
    let reset = t - t % WIDE_US + WIDE_US - t;
    assert_eq!(numbers(&record), [1, 2, reset, 0, 1, t], "{raw}");
    assert_eq!(u64::try_from(first[3]).ok(), Some(reset));
    // Its reply is the state it wrote, the record last: no table made.
    assert_eq!(text.as_deref(), Some(&raw[..]));

    // The state holds a live record: the next admission's goes to a key of
    // its own.
    let (second, text) = fcall(&mut conn, "1", 0x22).expect("a first send");
    assert_eq!((second[1], second[2], second[5]), (1, 1, 1), "{second:?}");
    let own: String = conn
        .get(format!("{key}:e:{:032x}", 0x22))
        .expect("the record's key");
    // Its reply is the record it wrote.
    assert_eq!(text.as_deref(), Some(&own[..]));
    let own = numbers(&own);
    assert_eq!((own[0], own[1], own[3], own[4]), (1, 1, 0, 1), "{own:?}");

    // Each id sent again replays its band, and charges nothing.
    for (id, remaining) in [(0x21, 2), (0x22, 1)] {
        let (again, _) = fcall(&mut conn, "0", id).expect("a re-send");
        assert_eq!(
            (again[1], again[2], again[5], again[6]),
            (1, remaining, 1, 1),
            "{again:?}"
        );
    }
    let count = numbers(
        state_raw(&mut conn, &key)
            .expect("a state")
            .split('|')
            .next()
            .expect("numbers"),
    )[4];
    assert_eq!(count, 2, "charged again");

    // Sent without a cost, each call cost 1; with too few arguments or too
    // many, a call is refused before any write.
    for extra in [&[][..], &["1", "5000", "x"][..]] {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(&name).arg(2).arg(&key).arg(format!("{key}:e:1"));
        if !extra.is_empty() {
            cmd.arg("1").arg(format!("{:032x}", 0x23)).arg(extra);
        }
        let refused = cmd.query::<Vec<i64>>(&mut conn).expect_err("refused");
        assert!(
            refused.to_string().contains("expects 2 to 4 arguments"),
            "{refused}"
        );
    }
    assert_eq!(
        state_raw(&mut conn, &key).map(|raw| numbers(raw.split('|').next().expect("numbers"))[4]),
        Some(2)
    );
}

/// A sliding log keeps every record in a key of its own, and answers an
/// admission with the record's text, as it wrote it (`lua/README.md`,
/// "Reply"): no table for Redis to convert. A re-send records, and
/// answers, its denial too; a first send's denial records nothing and
/// answers the eight integers. The policy's function called directly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sliding_log_answers_an_admission_with_the_record_it_wrote() {
    let server = RedisServer::start();
    let store = connect(&server).await;
    let mut conn = server.connection();
    let policy = policy("log-text", Bands::SlidingLog(vec![window(2, 7_400_000)]));
    let marker = "local P_BAND_ARGS = {2, 7400000000}";
    let name = loaded_library(&store, &mut conn, &policy, "log-text-warm", marker).await;
    let key = state_key(&policy, &subject("log-text"));
    let fcall = |conn: &mut redis::Connection, first: &str, id: u128| {
        decide_directly(conn, &name, &key, first, id, None)
    };
    let record = |conn: &mut redis::Connection, id: u128| -> Option<String> {
        conn.get(format!("{key}:e:{id:032x}")).expect("GET")
    };

    // {version, outcome, remaining, reset, retry, band, replayed, skew}
    for (id, remaining) in [(0x31, 1), (0x32, 0)] {
        let (fields, text) = fcall(&mut conn, "1", id).expect("a first send");
        assert_eq!(
            (fields[1], fields[2], fields[6]),
            (1, remaining, 0),
            "{fields:?}"
        );
        assert_eq!(text, record(&mut conn, id), "answered with its record");
    }
    let (denied, text) = fcall(&mut conn, "1", 0x33).expect("a first send");
    assert_eq!((denied[0], denied[1], denied[6]), (1, 0, 0), "{denied:?}");
    assert!(denied[4] > 0, "a denial says when to retry: {denied:?}");
    assert_eq!((text, record(&mut conn, 0x33)), (None, None));
    let (denied, text) = fcall(&mut conn, "2", 0x34).expect("never a first send");
    assert_eq!((denied[1], denied[2]), (0, 0), "{denied:?}");
    assert!(text.is_some(), "recorded, and answered with its record");
    assert_eq!(text, record(&mut conn, 0x34));
}
