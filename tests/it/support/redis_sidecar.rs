//! For the end-to-end tests of the Redis store: a configuration with
//! `store.kind: redis`, readiness probes, a steady load recorded request by
//! request, and reading `INFO commandstats`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, StatusCode};
use serde_json::Value;
use tokio::task::JoinSet;

use super::client::{build, http1_client, send};
use super::ops::{metric, scrape};
use super::{get, header, Sidecar, Upstream};

/// Shared by every replica, so they derive the same pseudonyms.
pub const PSEUDONYM_KEY: &str = "0123456789abcdef0123456789abcdef";

/// How long a sidecar may take to connect to Redis and load its scripts
/// (the start-up task backs off up to 2 s between attempts).
pub const READY_DEADLINE: Duration = Duration::from_secs(10);

/// A configuration with an admin listener and the Redis store at
/// `redis_url`: budget 50ms, fail closed with `Retry-After: 1`, breaker
/// after 5 failures for 500ms, the local over-limit cache on. `policies`
/// and `routes` are the YAML bodies of those sections (indented two
/// spaces). Tests adjust a setting with `str::replace` on its line.
pub fn redis_yaml(upstream: &Upstream, redis_url: &str, policies: &str, routes: &str) -> String {
    format!(
        "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {upstream}
store:
  kind: redis
  url: {redis_url}
  budget: 50ms
  on_failure: deny
  failure_retry_after: 1s
  breaker_failures: 5
  breaker_cooldown: 500ms
  deny_cache_entries: 100000
identity:
  pseudonym_key: \"{PSEUDONYM_KEY}\"
policies:
{policies}routes:
{routes}",
        upstream = upstream.url()
    )
}

pub fn admin(sluice: &Sidecar) -> SocketAddr {
    sluice.admin_addr().expect("the admin address is logged")
}

/// `GET /readyz`: the status and the JSON body.
pub async fn readyz(sluice: &Sidecar) -> (StatusCode, Value) {
    let (status, _, body) = get(admin(sluice), "/readyz", &[]).await;
    let json = serde_json::from_slice(&body)
        .unwrap_or_else(|e| panic!("/readyz body is not JSON ({e}): {body:?}"));
    (status, json)
}

/// Polls `/readyz` every 20 ms until it answers `want`, or panics with the
/// last answer and the sidecar's log after `within`.
pub async fn readyz_becomes(sluice: &Sidecar, want: StatusCode, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let (status, body) = readyz(sluice).await;
        if status == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {status} {body} after {within:?}, not {want}\n--- log ---\n{}",
            sluice.logs().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Starts a sidecar on `yaml` and waits until it is ready (Redis answered,
/// scripts loaded).
pub async fn start_ready(yaml: &str) -> Sidecar {
    let sluice = Sidecar::start(yaml);
    readyz_becomes(&sluice, StatusCode::OK, READY_DEADLINE).await;
    sluice
}

/// The value of a sample on the sidecar's `/metrics`; `None` when absent.
pub async fn sample(sluice: &Sidecar, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    metric(&scrape(admin(sluice)).await, name, labels)
}

/// `GET`s of `path` over one pooled client, round-robin over `addrs`, at
/// most `concurrency` in flight; the statuses in completion order.
pub async fn spread(
    addrs: &[SocketAddr],
    path: &str,
    total: usize,
    concurrency: usize,
) -> Vec<StatusCode> {
    let client = http1_client();
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    for i in 0..total {
        let client = client.clone();
        let gate = gate.clone();
        let addr = addrs[i % addrs.len()];
        let path = path.to_owned();
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore open");
            send(&client, build(addr, Method::GET, &path, &[], Bytes::new()))
                .await
                .0
        });
    }
    let mut out = Vec::with_capacity(total);
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(status) => out.push(status),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    out
}

/// One request of a [`Load`], as the client saw it.
#[derive(Debug, Clone)]
pub struct Shot {
    pub started: Instant,
    pub elapsed: Duration,
    pub status: StatusCode,
    pub retry_after: Option<String>,
}

impl Shot {
    pub fn ended(&self) -> Instant {
        self.started + self.elapsed
    }
}

/// `loops` tasks each sending `GET path` one after another (with `pause`
/// between), until [`Load::stop`].
pub struct Load {
    stop: Arc<AtomicBool>,
    tasks: JoinSet<Vec<Shot>>,
}

impl Load {
    pub fn start(addr: SocketAddr, path: &str, loops: usize, pause: Duration) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = JoinSet::new();
        for _ in 0..loops {
            let stop = stop.clone();
            let path = path.to_owned();
            tasks.spawn(async move {
                // One client per loop: its own keep-alive connection.
                let client = http1_client();
                let mut shots = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let (status, headers, _) =
                        send(&client, build(addr, Method::GET, &path, &[], Bytes::new())).await;
                    shots.push(Shot {
                        started,
                        elapsed: started.elapsed(),
                        status,
                        retry_after: header(&headers, "retry-after").map(str::to_owned),
                    });
                    tokio::time::sleep(pause).await;
                }
                shots
            });
        }
        Load { stop, tasks }
    }

    /// Stops every loop after its current request; all shots, by start.
    pub async fn stop(mut self) -> Vec<Shot> {
        self.stop.store(true, Ordering::SeqCst);
        let mut shots = Vec::new();
        while let Some(done) = self.tasks.join_next().await {
            match done {
                Ok(mut s) => shots.append(&mut s),
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
        shots.sort_by_key(|s| s.started);
        shots
    }
}

/// `(command, calls)` from `INFO commandstats`, e.g. `("fcall", 12)`;
/// subcommands read as `config|resetstat`.
pub fn commandstats(conn: &mut redis::Connection) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest.split(',').find_map(|kv| kv.strip_prefix("calls="))?;
            Some((name.to_owned(), calls.parse().ok()?))
        })
        .collect()
}

/// The commands the scripts call: `INFO commandstats` counts them too,
/// though sluice itself never sends them.
pub const SCRIPT_COMMANDS: [&str; 9] = [
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

/// `CONFIG RESETSTAT`.
pub fn reset_stats(conn: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(conn)
        .expect("CONFIG RESETSTAT");
}

/// What was sent to Redis since the last reset, leaving out what the
/// scripts ran and what the test itself sent (INFO, CONFIG RESETSTAT).
pub fn sent_by_clients(conn: &mut redis::Connection) -> Vec<(String, u64)> {
    commandstats(conn)
        .into_iter()
        .filter(|(name, _)| {
            !SCRIPT_COMMANDS.contains(&name.as_str())
                && !matches!(name.as_str(), "info" | "config|resetstat")
        })
        .collect()
}

/// The numbers of the state string at `key` (`t` first, then each band's,
/// `lua/README.md`), or `None` when the subject has no state.
pub fn state_numbers(conn: &mut redis::Connection, key: &str) -> Option<Vec<u64>> {
    let raw: Option<String> = redis::cmd("GET").arg(key).query(conn).expect("GET state");
    raw.map(|raw| {
        // The numbers end where a record held in the state starts.
        raw.split('|')
            .next()
            .unwrap_or_default()
            .split(':')
            .map(|n| n.parse().expect("a number in the state"))
            .collect()
    })
}

/// The record a compact state holds after its numbers (`|<expires>|
/// <resent>|<id>|<record>`, `lua/README.md`): the id of the first send's
/// admission it keeps, and its record; `None` when the state holds none.
pub fn held_record(conn: &mut redis::Connection, key: &str) -> Option<(String, String)> {
    let raw: Option<String> = redis::cmd("GET").arg(key).query(conn).expect("GET state");
    let raw = raw?;
    let mut parts = raw.split('|').skip(3);
    let (id, record) = (parts.next()?, parts.next()?);
    Some((id.to_owned(), record.to_owned()))
}

/// A fixed window's first band's count (`t:s1:c1…`), if any.
pub fn window_count(conn: &mut redis::Connection, key: &str) -> Option<u64> {
    state_numbers(conn, key).map(|numbers| numbers[2])
}
