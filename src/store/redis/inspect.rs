//! `sluice check --connect`: Redis tried with the configuration's own
//! settings and credentials, one step at a time, as a starting sidecar
//! would, each step's finding reported. It stops at the first step that
//! fails: the later ones could only fail the same way.
//!
//! It writes what a starting sidecar writes and nothing else: the
//! configuration's libraries (with their leases) or cached scripts, as
//! `store.scripts` settles, and one evaluation per
//! policy for a subject no request can have (the breaker probe's), each
//! under its own TTL. It deletes nothing.

use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use tokio::time::{timeout, Instant};

use super::mode::Mode;
use super::pool::Stage;
use super::{Inner, RedisSetupError};
use crate::config::{self, Topology};
use crate::limit::{Outcome, Policy};
use crate::store::{Evaluation, EvaluationId};

/// One step and what it found: `Ok` with what was seen, or `Err` with why
/// it failed and what to change.
#[derive(Debug)]
pub struct Step {
    pub what: String,
    pub found: Result<String, String>,
}

/// How long each step may take: a store that answers takes milliseconds;
/// one that does not is reported rather than waited on.
const STEP_TIMEOUT: Duration = Duration::from_secs(5);

/// Tries every step; the last one returned failed, or all passed.
pub async fn inspect(
    redis: &config::RedisStore,
    scripts: config::Scripts,
    ttl_grace: Duration,
    policies: &[Arc<Policy>],
) -> Result<Vec<Step>, RedisSetupError> {
    let inner = Inner::new(redis, scripts, ttl_grace, STEP_TIMEOUT)?;
    let mut steps = Vec::new();
    let mut step = |what: String, found: Result<String, String>| {
        let ok = found.is_ok();
        steps.push(Step { what, found });
        ok
    };

    let mut stage = Stage::Waiting;
    let checkout = match timeout(STEP_TIMEOUT, inner.lanes.acquire(&mut stage)).await {
        Ok(Ok(checkout)) => checkout,
        Ok(Err(error)) => {
            step(
                topology(&redis.topology),
                Err(format!("cannot connect: {error}")),
            );
            return Ok(steps);
        }
        Err(_) => {
            step(
                topology(&redis.topology),
                Err(format!("no connection within {STEP_TIMEOUT:?}")),
            );
            return Ok(steps);
        }
    };
    let mut conn = checkout.conn.clone();
    if !step(topology(&redis.topology), Ok("connected".to_owned())) {
        return Ok(steps);
    }

    let ping: Result<String, _> = redis::cmd("PING").query_async(&mut conn).await;
    let pinged = match ping {
        Ok(pong) => Ok(pong),
        Err(e) => Err(format!("{e} (the user needs +ping)")),
    };
    if !step("PING".to_owned(), pinged) {
        return Ok(steps);
    }

    let info: Result<Value, _> = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await;
    let server = match info {
        Ok(value) => server_line(&value, &redis.topology),
        // sluice never needs INFO: a least-privilege user may lack it.
        Err(e) if e.code() == Some("NOPERM") => {
            Ok("INFO not permitted (sluice does not need it)".to_owned())
        }
        Err(e) => Err(e.to_string()),
    };
    if !step("server".to_owned(), server) {
        return Ok(steps);
    }

    for policy in policies {
        inner.scripts.get(policy);
    }
    let loaded = timeout(STEP_TIMEOUT, inner.load_all()).await;
    let mode = inner.modes.current();
    let count = inner.scripts.names().len();
    let loaded = match (loaded, mode) {
        (Ok(Ok(())), Mode::Functions) => Ok(format!(
            "functions (store.scripts: {}): {} loaded (FUNCTION LOAD, and SET of their leases)",
            scripts.name(),
            plural(count, "function library", "function libraries")
        )),
        (Ok(Ok(())), Mode::Eval) => Ok(format!(
            "eval (store.scripts: {}): {} loaded (SCRIPT LOAD), run with EVALSHA",
            scripts.name(),
            plural(count, "script", "scripts")
        )),
        (Ok(Err(e)), _) => Err(match inner.modes.refused() {
            Some(why) => why,
            None if mode == Mode::Eval && scripts == config::Scripts::Auto => format!(
                "{e} (no Functions here: the user needs +function|load for them, \
                 or +evalsha +script|load for cached scripts)"
            ),
            None if mode == Mode::Eval => {
                format!("{e} (the user needs +evalsha +script|load)")
            }
            None => format!("{e} (the user needs +function|load and +set on the lease keys)"),
        }),
        (Err(_), _) => Err(format!("not done within {STEP_TIMEOUT:?}")),
    };
    if !step("scripts".to_owned(), loaded) {
        return Ok(steps);
    }

    let call = match mode {
        Mode::Functions => "FCALL",
        Mode::Eval => "EVALSHA",
    };
    for policy in policies {
        let evaluation = Evaluation {
            policy,
            subject: &inner.probe.subject,
            cost: 1,
            deadline: Instant::now() + STEP_TIMEOUT,
            id: EvaluationId::fresh(),
            settle_within: None,
        };
        let found = match inner.evaluate(&evaluation).await {
            Outcome::Allowed(_) | Outcome::Denied(_) => Ok(format!(
                "decided ({call} and the commands inside the script are permitted)"
            )),
            other => Err(format!(
                "no decision: {other:?} (a script error such as NOPERM means the user lacks \
                 {call} or a command the script runs: +get +set +time +pexpire, and for the \
                 sliding log +zadd +zcount +zrange +zrangebyscore +zremrangebyscore)"
            )),
        };
        if !step(format!("policy {}", policy.name), found) {
            return Ok(steps);
        }
    }
    Ok(steps)
}

/// The topology as configured: what the first step tries.
fn topology(topology: &Topology) -> String {
    match topology {
        Topology::Standalone { .. } => "standalone".to_owned(),
        Topology::Cluster { nodes } => {
            format!(
                "cluster ({})",
                plural(nodes.len(), "seed node", "seed nodes")
            )
        }
        Topology::Sentinel { master, nodes, .. } => format!(
            "sentinel (master {master}, {})",
            plural(nodes.len(), "sentinel", "sentinels")
        ),
    }
}

/// `Redis 7.0.15, redis_mode standalone`, or an error when the server's
/// mode is not the configured topology's.
fn server_line(value: &Value, topology: &Topology) -> Result<String, String> {
    let text = match value {
        Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        Value::VerbatimString { text, .. } => text.clone(),
        Value::SimpleString(s) => s.clone(),
        // A cluster answers per node; the first says enough.
        Value::Map(nodes) => match nodes.first() {
            Some((_, Value::BulkString(bytes))) => String::from_utf8_lossy(bytes).into_owned(),
            Some((_, Value::VerbatimString { text, .. })) => text.clone(),
            _ => String::new(),
        },
        _ => String::new(),
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let version = field("redis_version").unwrap_or("?");
    let mode = field("redis_mode").unwrap_or("?");
    let expected = match topology {
        Topology::Cluster { .. } => "cluster",
        Topology::Standalone { .. } | Topology::Sentinel { .. } => "standalone",
    };
    if mode != "?" && mode != expected {
        return Err(format!(
            "Redis {version} runs as {mode}, but the configuration says topology {}",
            match topology {
                Topology::Cluster { .. } => "cluster",
                Topology::Standalone { .. } => "standalone",
                Topology::Sentinel { .. } => "sentinel",
            }
        ));
    }
    Ok(format!("Redis {version}, {mode}"))
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
