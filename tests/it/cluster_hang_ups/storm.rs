//! The clients of a storm, and what is checked after one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::hang_ups::{cluster_yaml, settled};
use crate::support::client::REQUEST_DEADLINE;
use crate::support::ops::{metric, requests_counted, scrape};
use crate::support::redis_sidecar::{admin, start_ready, window_count};
use crate::support::sidecar::Sidecar;
use crate::support::topology::RedisCluster;
use crate::support::{get, parse_status, read_head, Upstream};

/// A fixed window of 10 an hour per API key, every request a call to its
/// subject's primary (`lease: off`) unless `lease` says otherwise.
pub(super) fn storm_policies(lease: &str) -> String {
    format!("  storm: {{ algorithm: fixed-window, limit: {STORM_LIMIT}, window: 1h, lease: {lease} }}\n")
}
pub(super) const STORM_ROUTES: &str = "  - name: storm
    match: { path_prefix: /storm }
    policy: storm
    subject: header:X-API-Key
";
pub(super) const STORM_LIMIT: usize = 10;
/// Eight subjects: spread over the three primaries' slots (that they are
/// is checked).
pub(super) const STORM_SUBJECTS: usize = 8;
/// 25 requests a subject, 200 in all.
pub(super) const STORM_EACH: usize = 25;
pub(super) const STORM_CONCURRENCY: usize = 40;

/// The sidecar of a storm on `cluster`, with `store_lines` added to its
/// `store` section.
pub(super) async fn storm_sidecar(
    upstream: &Upstream,
    cluster: &RedisCluster,
    lease: &str,
    store_lines: &str,
) -> Sidecar {
    // An HTTP/2 storm resets about 60% of each connection's 25 streams
    // right after their headers, as a rapid-reset attacker would: on a
    // loaded machine more than h2's 20 of them can be waiting for sluice
    // to accept them, and the connection is closed (`ENHANCE_YOUR_CALM`),
    // failing the streams that stayed. That guard is not what a storm is
    // for: its clients leave one by one, so it is set above their count.
    let yaml = cluster_yaml(upstream, cluster, &storm_policies(lease), STORM_ROUTES)
        .replace("  budget: 1s\n", &format!("  budget: 1s\n{store_lines}"))
        .replace(
            "  admin: 127.0.0.1:0\n",
            "  admin: 127.0.0.1:0\n  http2:\n    max_pending_accept_reset_streams: 64\n",
        );
    assert!(yaml.contains("max_pending_accept_reset_streams"), "{yaml}");
    start_ready(&yaml).await
}

/// How a client of a storm ends.
#[derive(Debug, Clone, Copy)]
pub(super) enum Leaving {
    /// Reads its answer.
    Stays,
    /// Closes its connection (or resets its stream) after yielding this
    /// many times: at once, or a moment later, within a decision.
    Yields(u32),
    /// The same, after sleeping this many microseconds (tokio rounds up
    /// to its next millisecond): while a decision is on its way to a
    /// primary, or its reply on its way back.
    Sleeps(u64),
}

impl Leaving {
    /// About 60% of clients hang up, at a moment drawn from `rng`.
    fn draw(rng: &mut StdRng) -> Leaving {
        Leaving::draw_within(rng, 4_000)
    }

    /// As [`Leaving::draw`], sleepers gone within `us` microseconds.
    fn draw_within(rng: &mut StdRng, us: u64) -> Leaving {
        match rng.random_range(0..10u32) {
            0..=3 => Leaving::Stays,
            4..=6 => Leaving::Yields(rng.random_range(0..40)),
            _ => Leaving::Sleeps(rng.random_range(0..us)),
        }
    }

    async fn wait(self) {
        match self {
            Leaving::Stays => {}
            Leaving::Yields(n) => {
                for _ in 0..n {
                    tokio::task::yield_now().await;
                }
            }
            Leaving::Sleeps(us) => tokio::time::sleep(Duration::from_micros(us)).await,
        }
    }
}

/// A seed for a storm's draws, printed so that a failing run's draws can
/// be read back (their timing cannot).
pub(super) fn storm_seed(what: &str) -> u64 {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos() as u64;
    eprintln!("{what}: seed {seed}");
    seed
}

/// The subject of request `i` of a storm: round-robin over the subjects.
pub(super) fn storm_key(i: usize) -> String {
    format!("storm-{}", i % STORM_SUBJECTS)
}

/// What the clients of a storm saw: per subject, the answers of those who
/// stayed; and how many hung up.
#[derive(Debug, Default)]
pub(super) struct Seen {
    pub answers: HashMap<String, Vec<u16>>,
    pub hung_up: usize,
}

impl Seen {
    fn ok(&self, key: &str) -> usize {
        self.answers
            .get(key)
            .map_or(0, |a| a.iter().filter(|s| **s == 200).count())
    }

    fn all(&self) -> impl Iterator<Item = u16> + '_ {
        self.answers.values().flatten().copied()
    }
}

/// One HTTP/1.1 request for `key` on a connection of its own: the status
/// read, or `None` once the client hung up as `leaving` says (half of
/// those with a reset: `SO_LINGER` 0, so the close is an RST).
pub(super) async fn http1_client(
    addr: SocketAddr,
    path: &str,
    key: &str,
    leaving: Leaving,
    reset: bool,
) -> Option<u16> {
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: sluice.test\r\nX-API-Key: {key}\r\nConnection: close\r\n\r\n"
    );
    let mut stream = TcpStream::connect(addr).await.expect("connect to sluice");
    stream.write_all(head.as_bytes()).await.expect("send");
    if let Leaving::Stays = leaving {
        let (head, _) = tokio::time::timeout(REQUEST_DEADLINE, read_head(&mut stream))
            .await
            .unwrap_or_else(|_| panic!("{key}: no answer within {REQUEST_DEADLINE:?}"));
        return Some(parse_status(&head));
    }
    leaving.wait().await;
    if reset {
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .expect("SO_LINGER");
    }
    drop(stream);
    None
}

/// [`STORM_SUBJECTS`] × [`STORM_EACH`] requests over HTTP/1.1, at most
/// [`STORM_CONCURRENCY`] at once, most clients hanging up.
pub(super) async fn http1_storm(addr: SocketAddr, seed: u64) -> Seen {
    let mut rng = StdRng::seed_from_u64(seed);
    let gate = Arc::new(Semaphore::new(STORM_CONCURRENCY));
    let mut tasks = JoinSet::new();
    for i in 0..STORM_SUBJECTS * STORM_EACH {
        let (leaving, reset) = (Leaving::draw(&mut rng), rng.random_bool(0.5));
        let gate = gate.clone();
        let key = storm_key(i);
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore open");
            let status = http1_client(addr, "/storm", &key, leaving, reset).await;
            (key, status)
        });
    }
    collect(tasks).await
}

pub(super) async fn collect(mut tasks: JoinSet<(String, Option<u16>)>) -> Seen {
    let mut seen = Seen::default();
    while let Some(done) = tasks.join_next().await {
        let (key, status) = done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        match status {
            Some(status) => seen.answers.entry(key).or_default().push(status),
            None => seen.hung_up += 1,
        }
    }
    seen
}

/// Lines of the sidecar's output that say something panicked: Rust's
/// panic message on stderr (`thread '…' panicked at …`), and the log
/// line of a connection task that panicked (read as JSON, by its
/// message). Neither can come from a path or a name: stderr holds what
/// the process wrote, and only the message field is compared.
pub(super) fn panics(sluice: &Sidecar) -> Vec<String> {
    let mut found: Vec<String> = sluice
        .stderr()
        .lines()
        .filter(|l| l.starts_with("thread '") && l.contains("' panicked at "))
        .map(str::to_owned)
        .collect();
    for line in sluice.logs() {
        let Ok(json) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let message = json
            .get("message")
            .or_else(|| json.get("fields").and_then(|f| f.get("message")));
        if message.and_then(|m| m.as_str()) == Some("connection task panicked") {
            found.push(line);
        }
    }
    found
}

pub(super) fn assert_no_panic(sluice: &Sidecar, what: &str) {
    let found = panics(sluice);
    assert!(
        found.is_empty(),
        "{what}: sluice panicked:\n{}\n--- stderr ---\n{}",
        found.join("\n"),
        sluice.stderr()
    );
}

/// Per `sluice:{storm:…}` state key on every primary, its fixed window's
/// count; and the primaries holding one.
pub(super) fn storm_counts(cluster: &RedisCluster) -> (Vec<u64>, Vec<u16>) {
    let mut counts = Vec::new();
    let mut holding = Vec::new();
    for primary in cluster.primaries() {
        let mut conn = cluster.connection(primary);
        let keys: Vec<String> = cluster
            .keys(primary)
            .into_iter()
            .filter(|k| k.starts_with("sluice:{storm:") && k.ends_with('}'))
            .collect();
        if !keys.is_empty() {
            holding.push(primary);
        }
        for key in keys {
            counts.push(window_count(&mut conn, &key).expect("a fixed window's count"));
        }
    }
    (counts, holding)
}

/// What a storm must leave, whoever hung up when:
/// - each subject's requests that reached the app are at most its limit,
///   and the 200s its staying clients saw are among them;
/// - the app received nothing sluice did not admit (`allowed`), and
///   sluice admitted nothing Redis did not charge;
/// - every staying client got a decided answer (200 or 429; 503 when
///   Redis could not decide, which forwards nothing);
/// - sluice is alive, has not panicked, and a fresh subject on the
///   cluster gets exactly its limit, then 429.
pub(super) async fn assert_storm_exact(
    what: &str,
    sluice: &Sidecar,
    upstream: &Upstream,
    cluster: &RedisCluster,
    seen: &Seen,
) {
    // The upstream first: a request counted `allowed` is counted before it
    // is forwarded, so what the app received by now was counted by the
    // scrape below.
    settled(upstream, Duration::from_secs(10)).await;
    let received = upstream.requests();
    let text = scrape(admin(sluice)).await;
    let (counts, holding) = storm_counts(cluster);
    let counted = |outcome: &str| requests_counted(&text, "storm", "storm", outcome);
    let allowed = counted("allowed");
    let summary = format!(
        "{what}: {} hung up; staying clients' answers {:?}; app received {}; \
         allowed {allowed}, denied {}, client_closed {}, unavailable {}, indeterminate {}; \
         Redis counts {counts:?}",
        seen.hung_up,
        seen.answers,
        received.len(),
        counted("denied"),
        counted("client_closed"),
        counted("unavailable"),
        counted("indeterminate"),
    );
    eprintln!("{summary}");

    for s in 0..STORM_SUBJECTS {
        let key = storm_key(s);
        let reached = received
            .iter()
            .filter(|r| r.header("x-api-key") == Some(&key))
            .count();
        assert!(
            reached <= STORM_LIMIT,
            "{key}: {reached} requests reached the app, over the limit of {STORM_LIMIT}\n{summary}"
        );
        assert!(
            seen.ok(&key) <= reached,
            "{key}: {} clients saw 200, {reached} requests reached the app\n{summary}",
            seen.ok(&key)
        );
    }
    let odd: Vec<u16> = seen
        .all()
        .filter(|s| ![200, 429, 503].contains(s))
        .collect();
    assert!(
        odd.is_empty(),
        "answers neither decided nor 503: {odd:?}\n{summary}"
    );
    assert!(
        received.len() as f64 <= allowed,
        "the app received requests sluice did not admit\n{summary}"
    );
    let without = metric(&text, "sluice_forwarded_without_decision_total", &[]).unwrap_or(0.0);
    assert_eq!(without, 0.0, "forwarded without a decision\n{summary}");
    let charged: u64 = counts.iter().sum();
    assert!(
        allowed <= charged as f64,
        "sluice admitted {allowed}, Redis charged {charged}\n{summary}"
    );
    assert!(
        counts.iter().all(|&c| c <= STORM_LIMIT as u64),
        "a subject counted over its limit in Redis\n{summary}"
    );
    assert!(
        holding.len() >= 2,
        "the subjects are all on one primary ({holding:?}): the storm crossed no slots"
    );
    // The storm did what it is for: clients left while their decision was
    // on its way (on two cores, at 40 at once, dozens of them).
    assert!(
        counted("client_closed") > 0.0,
        "no client left mid-decision\n{summary}"
    );

    // Alive, and exact for fresh subjects.
    for fresh in 0..4 {
        let key = format!("fresh-{fresh}");
        let mut statuses = Vec::new();
        for _ in 0..=STORM_LIMIT {
            statuses.push(get(sluice.addr(), "/storm", &[("x-api-key", &key)]).await.0);
        }
        let mut want = vec![StatusCode::OK; STORM_LIMIT];
        want.push(StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(statuses, want, "{what}: {key} after the storm\n{summary}");
    }
    assert_no_panic(sluice, what);
}

/// [`STORM_SUBJECTS`] × [`STORM_EACH`] requests over HTTP/2 (prior
/// knowledge, in clear text, as sluice serves it), spread over
/// `connections` connections, [`STORM_CONCURRENCY`] streams at once in
/// all. About 60% of the streams are reset (`RST_STREAM`, `CANCEL`) at a
/// random moment after their headers; and every fourth connection is
/// dropped whole, at a random moment after its last request was sent,
/// with whatever streams it still had.
pub(super) async fn http2_storm(addr: SocketAddr, seed: u64) -> Seen {
    const CONNECTIONS: usize = 8;
    let mut rng = StdRng::seed_from_u64(seed);
    let gate = Arc::new(Semaphore::new(STORM_CONCURRENCY));
    let mut seen = Seen::default();
    let mut conns = JoinSet::new();
    let total = STORM_SUBJECTS * STORM_EACH;
    for c in 0..CONNECTIONS {
        let tcp = TcpStream::connect(addr).await.expect("connect to sluice");
        let (client, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        // Each connection's share of the requests, drawn here so that the
        // seed says them all.
        let mine: Vec<(String, Leaving)> = (c..total)
            .step_by(CONNECTIONS)
            .map(|i| (storm_key(i), Leaving::draw(&mut rng)))
            .collect();
        let dropped = (c % 4 == 3).then(|| Leaving::draw(&mut rng));
        let gate = gate.clone();
        conns.spawn(async move {
            let mut streams = JoinSet::new();
            for (key, leaving) in mine {
                let permit = gate.clone().acquire_owned().await.expect("semaphore open");
                let mut client = client
                    .clone()
                    .ready()
                    .await
                    .expect("the connection takes a stream");
                let request = http::Request::get("http://sluice.test/storm")
                    .header("x-api-key", &key)
                    .body(())
                    .expect("a request");
                let (response, mut stream) = client
                    .send_request(request, true)
                    .expect("send the headers");
                let doomed = dropped.is_some();
                streams.spawn(async move {
                    let _permit = permit;
                    if let Leaving::Stays = leaving {
                        // Unless its connection is dropped under it.
                        let answered = tokio::time::timeout(REQUEST_DEADLINE, response)
                            .await
                            .unwrap_or_else(|_| {
                                panic!("{key}: no answer within {REQUEST_DEADLINE:?}")
                            });
                        let status = match answered {
                            Ok(response) => Some(response.status().as_u16()),
                            Err(e) if doomed => {
                                let _ = e;
                                None
                            }
                            Err(e) => panic!("{key}: the stream failed: {e}"),
                        };
                        return (key, status);
                    }
                    leaving.wait().await;
                    stream.send_reset(h2::Reason::CANCEL);
                    drop(response);
                    (key, None)
                });
            }
            if let Some(leaving) = dropped {
                // The whole connection goes: its socket closed under the
                // streams still open on it.
                leaving.wait().await;
                driver.abort();
            }
            let mut answers = Vec::new();
            while let Some(done) = streams.join_next().await {
                answers.push(done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())));
            }
            answers
        });
    }
    while let Some(done) = conns.join_next().await {
        for (key, status) in done.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())) {
            match status {
                Some(status) => seen.answers.entry(key).or_default().push(status),
                None => seen.hung_up += 1,
            }
        }
    }
    seen
}

/// `total` requests over HTTP/1.1, round-robin over `keys`, 20 at once,
/// about 60% of the clients hanging up within `within_us`.
pub(super) async fn gone_storm(
    addr: SocketAddr,
    keys: &[String],
    total: usize,
    within_us: u64,
    rng: &mut StdRng,
) -> Seen {
    let gate = Arc::new(Semaphore::new(20));
    let mut tasks = JoinSet::new();
    for i in 0..total {
        let (leaving, reset) = (Leaving::draw_within(rng, within_us), rng.random_bool(0.5));
        let gate = gate.clone();
        let key = keys[i % keys.len()].clone();
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore open");
            let status = http1_client(addr, "/gone", &key, leaving, reset).await;
            (key, status)
        });
    }
    collect(tasks).await
}

/// A port that accepts connections and holds them, answering nothing:
/// a node whose opening hangs (its handshake never answered).
pub(super) async fn silent_port(
    port: u16,
) -> (
    tokio::task::JoinHandle<()>,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the dead primary's port");
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counting = accepted.clone();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            counting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            held.push(socket);
        }
    });
    (task, accepted)
}
