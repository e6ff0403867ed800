//! Store faults under the built binary, beyond Redis killed or paused
//! (`redis_failures.rs`): Redis hung by `SIGSTOP` with commands queued
//! behind it, a network blackhole, replies delayed around the budget, Redis
//! out of memory, and Redis restarted empty.
//!
//! Every test checks the same invariants over every answer of its run:
//!
//! 1. nothing forwarded without a decision: the upstream saw exactly the
//!    requests sluice answered 200;
//! 2. every answer came within the budget (plus [`MARGIN`], see there);
//! 3. sluice answered only 200, 429 and 503;
//! 4. admitted ≤ limit, counted at the upstream and read back from Redis.
//!
//! Every test takes [`SERIAL`]: the latency bounds are about sluice, not
//! about two tests fighting over two cores.

use std::time::{Duration, Instant};

use crate::support::faults::{DelayRelay, Netns};
use crate::support::ops::{metric, scrape};
use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::{
    admin, held_record, readyz_becomes, redis_yaml, start_ready, window_count, Load, Shot,
};
use crate::support::{clear_of_window_edge, eventually, get, header, Sidecar, Upstream};
use http::StatusCode;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `store.budget` of every test but the latency one.
const BUDGET: Duration = Duration::from_millis(50);
/// What an answer may take beyond the budget, measured at the client.
///
/// sluice's own bound is the budget plus about 10 ms; the client adds an
/// HTTP exchange and, on this two-core machine shared with compilers and
/// other test processes, scheduling stalls of up to a hundred milliseconds
/// or so now and then. A per-request bound of 250 ms absorbs those, and is
/// still an order of magnitude below what a sluice that waited on Redis
/// would show: a 3 s `SIGSTOP`, a blackhole until the 2 s connect timeout,
/// a reply 150 ms late on top of the budget.
const MARGIN: Duration = Duration::from_millis(250);
/// How soon service must resume once the fault is gone.
const RECOVERY: Duration = Duration::from_secs(5);
/// The capped policy's window: one day, so no test run straddles a window
/// edge by chance ([`clear_of_window_edge`] waits out the last minute).
const WINDOW: Duration = Duration::from_secs(24 * 3600);

/// One route `/api` by client address under `capped`, a fixed window of
/// `limit` a day. De-duplication records live 30 s so the test can read
/// them back after the run; the over-limit cache is off so every decision,
/// 429s included, is Redis's.
fn capped(upstream: &Upstream, redis_url: &str, limit: u32, budget: Duration) -> String {
    redis_yaml(
        upstream,
        redis_url,
        &format!(
            "  capped: {{ algorithm: fixed-window, limit: {limit}, window: 24h, lease: off }}\n"
        ),
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: capped }\n",
    )
    .replace(
        "  budget: 50ms\n",
        &format!("  budget: {}ms\n  dedupe_window: 30s\n", budget.as_millis()),
    )
    .replace("deny_cache_entries: 100000", "deny_cache_entries: 0")
}

/// One request outside a [`Load`], timed the same way.
async fn hit(addr: std::net::SocketAddr, path: &str) -> Shot {
    let started = Instant::now();
    let (status, headers, _) = get(addr, path, &[]).await;
    Shot {
        started,
        elapsed: started.elapsed(),
        status,
        retry_after: header(&headers, "retry-after").map(str::to_owned),
    }
}

/// Sends requests one by one until one is answered `want`, within `within`;
/// every answer is kept in `shots`.
async fn hit_until(
    sluice: &Sidecar,
    path: &str,
    want: StatusCode,
    within: Duration,
    shots: &mut Vec<Shot>,
) -> Duration {
    let from = Instant::now();
    let deadline = from + within;
    loop {
        let shot = hit(sluice.addr(), path).await;
        let status = shot.status;
        shots.push(shot);
        if status == want {
            return from.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "no {want} on {path} within {within:?}; last {status}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits until the upstream has seen more than `from` requests.
async fn forwarded_after(upstream: &Upstream, from: usize) -> Duration {
    let start = Instant::now();
    eventually(RECOVERY, || async {
        (upstream.count() > from).then_some(())
    })
    .await;
    start.elapsed()
}

/// What the answers of a run add up to.
#[derive(Debug)]
struct Tally {
    ok: usize,
    denied: usize,
    failed: usize,
    p50: Duration,
    p99: Duration,
    max: Duration,
}

/// Invariants 1 to 3 over every answer of a run, and 4 as the upstream
/// counts it: `forwarded` is what the upstream saw of these requests.
fn invariants(
    what: &str,
    shots: &[Shot],
    forwarded: usize,
    limit: usize,
    budget: Duration,
) -> Tally {
    for shot in shots {
        assert!(
            matches!(
                shot.status,
                StatusCode::OK | StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
            ),
            "{what}: sluice answered {shot:?}"
        );
        if shot.status != StatusCode::OK {
            assert!(
                shot.retry_after.is_some(),
                "{what}: no Retry-After: {shot:?}"
            );
        }
        assert!(
            shot.elapsed <= budget + MARGIN,
            "{what}: an answer took {:?} (budget {budget:?} + {MARGIN:?}): {shot:?}",
            shot.elapsed
        );
    }
    let count = |s: StatusCode| shots.iter().filter(|x| x.status == s).count();
    let ok = count(StatusCode::OK);
    assert_eq!(
        forwarded, ok,
        "{what}: forwarded without a 200 to show for it"
    );
    assert!(ok <= limit, "{what}: {ok} admitted over a limit of {limit}");
    let mut times: Vec<Duration> = shots.iter().map(|s| s.elapsed).collect();
    times.sort_unstable();
    let at = |q: f64| times[((times.len() - 1) as f64 * q) as usize];
    let tally = Tally {
        ok,
        denied: count(StatusCode::TOO_MANY_REQUESTS),
        failed: count(StatusCode::SERVICE_UNAVAILABLE),
        p50: at(0.5),
        p99: at(0.99),
        max: at(1.0),
    };
    println!(
        "{what}: {} answers: {} 200, {} 429, {} 503; latency p50 {:?}, p99 {:?}, max {:?}",
        shots.len(),
        tally.ok,
        tally.denied,
        tally.failed,
        tally.p50,
        tally.p99,
        tally.max
    );
    tally
}

/// What Redis holds for `policy`'s one subject: the count charged in the
/// current window, and the evaluation records (one per evaluation id that
/// ran, each with its decision).
#[derive(Debug)]
struct Charged {
    count: u64,
    records: usize,
    allowed_records: usize,
}

fn read_back(conn: &mut redis::Connection, policy: &str) -> Charged {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("*{{{policy}:*"))
        .query(conn)
        .expect("KEYS");
    let (records, states): (Vec<String>, Vec<String>) =
        keys.into_iter().partition(|k| k.contains("}:e:"));
    assert_eq!(states.len(), 1, "one subject, one state key: {states:?}");
    let count = window_count(conn, &states[0]);
    // A first send's admission may keep its record in the state.
    let held = held_record(conn, &states[0]);
    let mut allowed_records = held.iter().filter(|(_, r)| r.starts_with("1:")).count();
    for chunk in records.chunks(500) {
        let values: Vec<Option<String>> = redis::cmd("MGET").arg(chunk).query(conn).expect("MGET");
        allowed_records += values
            .iter()
            .flatten()
            .filter(|v| v.starts_with("1:"))
            .count();
    }
    Charged {
        count: count.unwrap_or(0),
        records: records.len() + usize::from(held.is_some()),
        allowed_records,
    }
}

/// A store counter by kind, whether sluice files it as an error or an event.
fn store_kind(text: &str, kind: &str) -> f64 {
    ["sluice_store_errors_total", "sluice_store_events_total"]
        .iter()
        .filter_map(|name| metric(text, name, &[("kind", kind)]))
        .sum()
}

fn script_loads(text: &str) -> f64 {
    metric(text, "sluice_store_script_loads_total", &[]).unwrap_or(0.0)
}

fn outcome(text: &str, policy: &str, outcome: &str) -> f64 {
    metric(
        text,
        "sluice_requests_total",
        &[("route", "api"), ("policy", policy), ("outcome", outcome)],
    )
    .unwrap_or(0.0)
}

async fn nothing_forwarded_undecided(sluice: &Sidecar) -> String {
    let text = scrape(admin(sluice)).await;
    assert_eq!(
        metric(&text, "sluice_forwarded_without_decision_total", &[]),
        Some(0.0),
        "{text}"
    );
    text
}

/// Every shot that started after `from` and ended before `until` is a 503.
fn failed_closed_between(what: &str, shots: &[Shot], from: Instant, until: Instant) -> usize {
    let during: Vec<&Shot> = shots
        .iter()
        .filter(|s| s.started >= from && s.ended() <= until)
        .collect();
    for shot in &during {
        assert_eq!(
            shot.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{what}: {shot:?}"
        );
    }
    during.len()
}

/// The checks after a fault with queued or resent commands: the policy
/// was driven past its limit, so Redis counted exactly `limit`; each unit
/// charged has exactly one evaluation record that says allowed (a retry
/// that charged again would leave a charge without a record of its own);
/// and what was charged but not forwarded is no more than the requests
/// sluice called Indeterminate (sent, no reply: the only ones that may have
/// been charged without a decision).
fn charged_once(what: &str, charged: &Charged, limit: usize, ok: usize, indeterminate: f64) {
    assert_eq!(charged.count, limit as u64, "{what}: {charged:?}");
    assert_eq!(
        charged.allowed_records, limit,
        "{what}: charges without an evaluation of their own: {charged:?}"
    );
    let unanswered = limit - ok;
    assert!(
        unanswered as f64 <= indeterminate,
        "{what}: {unanswered} charged but not forwarded, only {indeterminate} indeterminate"
    );
    println!(
        "{what}: Redis counted {} = {ok} forwarded + {unanswered} charged by queued \
         commands whose answer was 503 ({indeterminate} indeterminate); {} records",
        charged.count, charged.records
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_hung_by_sigstop_answers_503_fast_and_its_queued_commands_never_over_admit() {
    const LIMIT: usize = 200;
    const HUNG: Duration = Duration::from_secs(3);
    let _serial = SERIAL.lock().await;
    clear_of_window_edge(WINDOW, Duration::from_secs(60)).await;
    let redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&capped(&upstream, &redis.url(), LIMIT as u32, BUDGET)).await;

    let load = Load::start(sluice.addr(), "/api", 4, Duration::from_millis(10));
    eventually(RECOVERY, || async {
        (upstream.count() >= 50).then_some(())
    })
    .await;
    redis.signal("STOP");
    let stopped = Instant::now();
    tokio::time::sleep(HUNG).await;
    let forwarded_while_hung = upstream.count();
    // A request sent just before SIGCONT is decided by Redis once it runs
    // again, within its budget: only one answered before then was
    // answered while Redis was stopped.
    let resuming = Instant::now();
    redis.signal("CONT");
    let resumed = Instant::now();

    // The commands queued in Redis's socket run now; service returns.
    let back = forwarded_after(&upstream, forwarded_while_hung).await;
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY).await;
    let mut extra = Vec::new();
    hit_until(
        &sluice,
        "/api",
        StatusCode::TOO_MANY_REQUESTS,
        Duration::from_secs(10),
        &mut extra,
    )
    .await;
    let mut shots = load.stop().await;
    shots.extend(extra);

    let hung = failed_closed_between("while hung", &shots, stopped, resumed);
    assert!(hung >= 50, "only {hung} answers while Redis was stopped");
    let admitted_while_hung: Vec<&Shot> = shots
        .iter()
        .filter(|s| s.status == StatusCode::OK && s.started >= stopped && s.ended() <= resuming)
        .collect();
    assert!(
        admitted_while_hung.is_empty(),
        "admitted while Redis was stopped: {admitted_while_hung:?}"
    );
    let tally = invariants("sigstop", &shots, upstream.count(), LIMIT, BUDGET);
    println!("sigstop: {hung} answers while hung, service back {back:?} after SIGCONT");

    let text = nothing_forwarded_undecided(&sluice).await;
    let charged = read_back(&mut redis.connection(), "capped");
    charged_once(
        "sigstop",
        &charged,
        LIMIT,
        tally.ok,
        outcome(&text, "capped", "indeterminate"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackholed_redis_answers_503_within_the_budget_and_service_returns() {
    const LIMIT: usize = 200;
    const DARK: Duration = Duration::from_secs(2);
    let _serial = SERIAL.lock().await;
    clear_of_window_edge(WINDOW, Duration::from_secs(60)).await;
    // A network namespace, not a firewall rule: this machine has no
    // iptables or nft, and loopback cannot be blackholed for one port
    // without one. Redis in a namespace of the test's own, reached over a
    // veth, can be cut off by a zero-length queue on the veth (`tc`) with
    // nothing else on the machine affected.
    let netns = Netns::create();
    let redis = netns.redis();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&capped(&upstream, &redis.url(), LIMIT as u32, BUDGET)).await;

    let load = Load::start(sluice.addr(), "/api", 4, Duration::from_millis(10));
    eventually(RECOVERY, || async {
        (upstream.count() >= 50).then_some(())
    })
    .await;
    netns.blackhole(true);
    let dark = Instant::now();
    tokio::time::sleep(DARK).await;
    let forwarded_while_dark = upstream.count();
    netns.blackhole(false);
    let lit = Instant::now();

    let back = forwarded_after(&upstream, forwarded_while_dark).await;
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY).await;
    let mut extra = Vec::new();
    hit_until(
        &sluice,
        "/api",
        StatusCode::TOO_MANY_REQUESTS,
        Duration::from_secs(10),
        &mut extra,
    )
    .await;
    let mut shots = load.stop().await;
    shots.extend(extra);

    let during = failed_closed_between("blackholed", &shots, dark, lit);
    assert!(during >= 50, "only {during} answers during the blackhole");
    let tally = invariants("blackhole", &shots, upstream.count(), LIMIT, BUDGET);
    println!("blackhole: {during} answers in the dark, service back {back:?} after");

    let text = nothing_forwarded_undecided(&sluice).await;
    assert!(
        store_kind(&text, "timeouts") + store_kind(&text, "unreachable") >= 1.0,
        "{text}"
    );
    let charged = read_back(&mut redis.connection(), "capped");
    charged_once(
        "blackhole",
        &charged,
        LIMIT,
        tally.ok,
        outcome(&text, "capped", "indeterminate"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_delayed_around_the_budget_are_decided_in_time_or_503_and_never_misattributed() {
    // A budget with room for a 20 ms delay on a loaded machine, and a
    // breaker that never opens: every request below waits out its own
    // deadline, so late replies pile up on the connections.
    const BUDGET: Duration = Duration::from_millis(100);
    const BELOW: Duration = Duration::from_millis(20);
    const ABOVE: Duration = Duration::from_millis(150);
    let _serial = SERIAL.lock().await;
    clear_of_window_edge(WINDOW, Duration::from_secs(60)).await;
    let redis = RedisServer::start();
    let relay = DelayRelay::start(redis.port()).await;
    let upstream = Upstream::start().await;
    let yaml = redis_yaml(
        &upstream,
        &relay.url(),
        "  big: { algorithm: fixed-window, limit: 10000000, window: 24h, lease: off }\n  \
         one: { algorithm: fixed-window, limit: 1, window: 24h }\n",
        "  - { name: api, match: { path_prefix: /api }, subject: client_ip, policy: big }\n  \
         - { name: deny, match: { path_prefix: /deny }, subject: client_ip, policy: one }\n",
    )
    .replace("budget: 50ms", "budget: 100ms")
    .replace("breaker_failures: 5", "breaker_failures: 1000000")
    .replace("deny_cache_entries: 100000", "deny_cache_entries: 0");
    let sluice = start_ready(&yaml).await;
    // `/deny` spends its one admission now: from here on Redis denies it.
    let mut shots = vec![hit(sluice.addr(), "/deny").await];
    assert_eq!(shots[0].status, StatusCode::OK);
    hit_until(
        &sluice,
        "/deny",
        StatusCode::TOO_MANY_REQUESTS,
        RECOVERY,
        &mut shots,
    )
    .await;

    // Below the budget: every decision made, none faster than the delay.
    relay.set_delay(BELOW);
    let load = Load::start(sluice.addr(), "/api", 4, Duration::from_millis(5));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let below = load.stop().await;
    assert!(below.len() >= 40, "only {} requests", below.len());
    for shot in &below {
        assert_eq!(shot.status, StatusCode::OK, "{BELOW:?} late: {shot:?}");
        assert!(shot.elapsed >= BELOW, "faster than the relay: {shot:?}");
    }
    let tally = invariants(
        "delay below",
        &below,
        upstream.count() - 1,
        usize::MAX,
        BUDGET,
    );
    assert!(tally.max <= BUDGET + MARGIN);

    // Above the budget: 503 at the deadline, nothing forwarded.
    relay.set_delay(ABOVE);
    let switched = Instant::now();
    let forwarded_before = upstream.count();
    let load = Load::start(sluice.addr(), "/api", 4, Duration::from_millis(5));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let above = load.stop().await;
    assert!(above.len() >= 20, "only {} requests", above.len());
    for shot in &above {
        assert_eq!(
            shot.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{ABOVE:?} late: {shot:?}"
        );
        assert!(
            shot.elapsed >= BUDGET,
            "503 before the budget was spent: {shot:?}"
        );
    }
    invariants(
        "delay above",
        &above,
        upstream.count() - forwarded_before,
        usize::MAX,
        BUDGET,
    );
    println!("delay above: switched {:?} before", switched.elapsed());

    // Late replies and prompt ones interleaved: `/api` is always allowed and
    // `/deny` always denied, so a reply delivered to the wrong request would
    // show as a 429 on `/api` or a 200 (and a forward) on `/deny`.
    let forwarded_before = upstream.count();
    let apis = Load::start(sluice.addr(), "/api", 3, Duration::from_millis(3));
    let denies = Load::start(sluice.addr(), "/deny", 3, Duration::from_millis(3));
    for i in 0..30 {
        relay.set_delay(if i % 2 == 0 { ABOVE } else { Duration::ZERO });
        tokio::time::sleep(Duration::from_millis(70)).await;
    }
    relay.set_delay(Duration::ZERO);
    let mut mixed = apis.stop().await;
    let denied = denies.stop().await;
    let count = |v: &[Shot], s: StatusCode| v.iter().filter(|x| x.status == s).count();
    for shot in &mixed {
        assert_ne!(
            shot.status,
            StatusCode::TOO_MANY_REQUESTS,
            "/api got a denial: {shot:?}"
        );
    }
    for shot in &denied {
        assert_ne!(
            shot.status,
            StatusCode::OK,
            "/deny got an admission: {shot:?}"
        );
    }
    assert!(
        count(&mixed, StatusCode::OK) >= 20 && count(&denied, StatusCode::TOO_MANY_REQUESTS) >= 20,
        "too few decisions to tell: {} 200 on /api, {} 429 on /deny",
        count(&mixed, StatusCode::OK),
        count(&denied, StatusCode::TOO_MANY_REQUESTS)
    );
    assert!(
        count(&mixed, StatusCode::SERVICE_UNAVAILABLE) >= 20,
        "too few late replies to tell"
    );
    println!(
        "mixed: /deny {} 429, {} 503",
        count(&denied, StatusCode::TOO_MANY_REQUESTS),
        count(&denied, StatusCode::SERVICE_UNAVAILABLE)
    );
    mixed.extend(denied);
    invariants(
        "mixed",
        &mixed,
        upstream.count() - forwarded_before,
        usize::MAX,
        BUDGET,
    );
    shots.extend(below.into_iter().chain(above).chain(mixed));
    invariants("delays", &shots, upstream.count(), usize::MAX, BUDGET);
    let deny_forwarded = upstream
        .requests()
        .iter()
        .filter(|r| r.path == "/deny")
        .count();
    assert_eq!(deny_forwarded, 1, "/deny admitted over its limit of 1");
    let charged = read_back(&mut redis.connection(), "one");
    assert_eq!(
        charged.count, 1,
        "/deny charged more than once: {charged:?}"
    );
    nothing_forwarded_undecided(&sluice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_out_of_memory_refuses_the_scripts_whole_and_service_resumes_when_freed() {
    const LIMIT: usize = 150;
    let _serial = SERIAL.lock().await;
    clear_of_window_edge(WINDOW, Duration::from_secs(60)).await;
    let redis = RedisServer::builder()
        .config("maxmemory-policy noeviction")
        .start();
    let upstream = Upstream::start().await;
    let sluice = start_ready(&capped(&upstream, &redis.url(), LIMIT as u32, BUDGET)).await;
    let mut conn = redis.connection();

    let load = Load::start(sluice.addr(), "/api", 4, Duration::from_millis(10));
    eventually(RECOVERY, || async {
        (upstream.count() >= 30).then_some(())
    })
    .await;
    let used = |conn: &mut redis::Connection| -> u64 {
        let info: String = redis::cmd("INFO").arg("memory").query(conn).expect("INFO");
        info.lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("used_memory")
    };
    let config_set = |conn: &mut redis::Connection, key: &str, value: &str| {
        let _: () = redis::cmd("CONFIG")
            .arg("SET")
            .arg(key)
            .arg(value)
            .query(conn)
            .expect("CONFIG SET");
    };
    let max = used(&mut conn) + 4 * 1024 * 1024;
    config_set(&mut conn, "maxmemory", &max.to_string());
    let junk = vec![b'x'; 64 * 1024];
    let mut keys = 0usize;
    loop {
        let set: redis::RedisResult<()> = redis::cmd("SET")
            .arg(format!("junk:{keys}"))
            .arg(&junk)
            .query(&mut conn);
        match set {
            Ok(()) => keys += 1,
            Err(e) if e.code() == Some("OOM") => break,
            Err(e) => panic!("SET junk: {e}"),
        }
        assert!(keys < 1000, "still no OOM after {keys} junk keys");
    }
    // Hold Redis well over its limit, so client buffers that come and go
    // cannot let one write through for a moment.
    let half = used(&mut conn) / 2;
    config_set(&mut conn, "maxmemory", &half.to_string());
    let full = Instant::now();
    let before = read_back(&mut conn, "capped").count;
    let forwarded_full = upstream.count();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = read_back(&mut conn, "capped").count;
    let forwarded_later = upstream.count();
    let freeing = Instant::now();
    assert_eq!(after, before, "charged while Redis refused writes");

    // Freed: the junk goes, the limit stays.
    for chunk in (0..keys).collect::<Vec<_>>().chunks(200) {
        let names: Vec<String> = chunk.iter().map(|i| format!("junk:{i}")).collect();
        let _: usize = redis::cmd("DEL")
            .arg(names)
            .query(&mut conn)
            .expect("DEL junk");
    }
    let back = forwarded_after(&upstream, forwarded_later).await;
    readyz_becomes(&sluice, StatusCode::OK, RECOVERY).await;
    let mut extra = Vec::new();
    hit_until(
        &sluice,
        "/api",
        StatusCode::TOO_MANY_REQUESTS,
        Duration::from_secs(10),
        &mut extra,
    )
    .await;
    let mut shots = load.stop().await;
    shots.extend(extra);

    // Anything sent once the junk was in was refused whole (a request in
    // flight as the limit was lowered may have been decided).
    let during = failed_closed_between("out of memory", &shots, full, freeing);
    assert!(during >= 50, "only {during} answers while out of memory");
    assert!(
        forwarded_later <= forwarded_full + 4,
        "forwarded while full: {forwarded_full} -> {forwarded_later}"
    );
    let tally = invariants("oom", &shots, upstream.count(), LIMIT, BUDGET);
    println!("oom: {keys} junk keys of 64 KiB, {during} answers while full, service back {back:?} after freeing");
    let text = nothing_forwarded_undecided(&sluice).await;
    assert!(
        store_kind(&text, "oom") >= 1.0,
        "no out-of-memory refusal counted:\n{text}"
    );
    // Redis's own account: it refused with OOM, the scripts never ran.
    let errors: String = redis::cmd("INFO")
        .arg("errorstats")
        .query(&mut conn)
        .expect("INFO errorstats");
    let refused_oom: u64 = errors
        .lines()
        .find_map(|l| l.strip_prefix("errorstat_OOM:count="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        refused_oom as f64 >= store_kind(&text, "oom"),
        "Redis refused {refused_oom} with OOM:\n{errors}"
    );
    let charged = read_back(&mut conn, "capped");
    charged_once(
        "oom",
        &charged,
        LIMIT,
        tally.ok,
        outcome(&text, "capped", "indeterminate"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_reloads_its_scripts_and_opens_a_fresh_window_of_exactly_the_limit() {
    // The over-admission allowance of an empty restart: every count is
    // gone, so each subject gets a whole fresh window, `LIMIT` more and no
    // more. The budget is generous so no decision times out on a healthy
    // Redis: the counts are then exact, not bounded.
    const LIMIT: usize = 50;
    const BUDGET: Duration = Duration::from_millis(300);
    let _serial = SERIAL.lock().await;
    clear_of_window_edge(WINDOW, Duration::from_secs(60)).await;
    let mut redis = RedisServer::start();
    let upstream = Upstream::start().await;
    let mut sluice = start_ready(&capped(&upstream, &redis.url(), LIMIT as u32, BUDGET)).await;

    let load = Load::start(sluice.addr(), "/api", 3, Duration::from_millis(5));
    let mut extra = Vec::new();
    hit_until(
        &sluice,
        "/api",
        StatusCode::TOO_MANY_REQUESTS,
        Duration::from_secs(10),
        &mut extra,
    )
    .await;
    let first_window = upstream.count();
    assert_eq!(
        first_window, LIMIT,
        "the first window admitted {first_window}"
    );
    assert_eq!(
        read_back(&mut redis.connection(), "capped").count,
        LIMIT as u64
    );
    let text = scrape(admin(&sluice)).await;
    let noscript_before = store_kind(&text, "noscript");
    let loads_before = script_loads(&text);

    tokio::task::block_in_place(|| redis.restart());
    let restarted = Instant::now();
    let back = forwarded_after(&upstream, first_window).await;
    hit_until(
        &sluice,
        "/api",
        StatusCode::TOO_MANY_REQUESTS,
        Duration::from_secs(10),
        &mut extra,
    )
    .await;
    let mut shots = load.stop().await;
    shots.extend(extra);

    assert!(
        sluice.wait_exit(Duration::ZERO).is_none(),
        "sluice exited across the Redis restart"
    );
    let second_window = upstream.count() - first_window;
    assert_eq!(
        second_window, LIMIT,
        "the fresh window admitted {second_window}"
    );
    let tally = invariants("restart", &shots, upstream.count(), 2 * LIMIT, BUDGET);
    assert_eq!(tally.ok, 2 * LIMIT);
    println!("restart: service back {back:?} after the restart; {first_window} + {second_window} admitted");
    let text = nothing_forwarded_undecided(&sluice).await;
    assert!(
        store_kind(&text, "noscript") > noscript_before,
        "no function-not-found seen:\n{text}"
    );
    assert!(
        script_loads(&text) > loads_before,
        "scripts not reloaded:\n{text}"
    );
    let charged = read_back(&mut redis.connection(), "capped");
    // Evaluations in flight at the kill are Indeterminate (503), but the
    // Redis they may have charged is gone: the fresh one counts only what
    // it admitted, each once.
    charged_once("restart", &charged, LIMIT, second_window, 0.0);
    println!(
        "restart: {} function-not-found, {} scripts loaded since the restart",
        store_kind(&text, "noscript") - noscript_before,
        script_loads(&text) - loads_before
    );
    println!("restart: fresh Redis after {:?}", restarted.elapsed());
}
