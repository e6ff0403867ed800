//! Libraries no sidecar uses any more.
//!
//! Redis keeps function libraries across restarts and replicates them, so
//! the library of a policy since changed or removed would stay forever.
//! Each sidecar holds a lease on every library it uses: a key
//! `sluice:library:<name>` set with a TTL of [`LEASE`] before the library
//! is loaded, and renewed every [`RENEW_EVERY`] while the sidecar runs. At
//! start, once its own libraries are loaded, a sidecar deletes the
//! `sluice_*` libraries whose lease has expired: no sidecar has used them
//! for a day. It never deletes anything on a configuration reload, and
//! never a library whose lease is alive, so a sidecar mid-rollout keeps
//! the libraries of its older configuration.
//!
//! The lease keys sit under `sluice:library:`, whatever the store's key
//! prefix: library names are shared by every sidecar of a Redis, so their
//! leases must be too.

use std::sync::Weak;
use std::time::Duration;

use redis::{RedisError, Value};

use super::connect::Conn;
use super::pool::Stage;
use super::scripts::{Script, LIBRARY_PREFIX};
use super::Inner;

/// How long a library outlives its last user.
pub const LEASE: Duration = Duration::from_secs(24 * 60 * 60);
/// How often a running sidecar renews its leases: a Redis unreachable for
/// most of a day still leaves the libraries in use alone.
pub const RENEW_EVERY: Duration = Duration::from_secs(60 * 60);
/// Where the leases are.
pub const LEASE_PREFIX: &str = "sluice:library:";

/// `SET sluice:library:<name> 1 PX <lease>`.
fn lease_command(name: &str) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(format!("{LEASE_PREFIX}{name}"))
        .arg(1)
        .arg("PX")
        .arg(LEASE.as_millis() as u64);
    cmd
}

impl Inner {
    /// Takes (or renews) the lease on `script`'s library.
    pub(super) async fn lease(&self, script: &Script, conn: &mut Conn) -> Result<(), RedisError> {
        lease_command(&script.name).query_async::<()>(conn).await
    }

    /// Deletes the `sluice_*` libraries no sidecar holds a lease on, but
    /// never one of this sidecar's; returns how many went. A user without
    /// `+function|list +function|delete` deletes nothing.
    pub(super) async fn prune(&self) -> Result<usize, RedisError> {
        let mut stage = Stage::Waiting;
        let checkout = self.lanes.acquire(&mut stage).await?;
        let mut conn = checkout.conn.clone();
        let mut list = redis::cmd("FUNCTION");
        // A glob pattern (Redis 7.0).
        list.arg("LIST")
            .arg("LIBRARYNAME")
            .arg(format!("{LIBRARY_PREFIX}*"));
        let listed: Value = list.query_async(&mut conn).await?;
        let ours = self.scripts.names();
        let mut deleted = 0;
        for name in library_names(&listed) {
            if !name.starts_with(LIBRARY_PREFIX) || ours.contains(&name) {
                continue;
            }
            let lease: Option<String> = redis::cmd("GET")
                .arg(format!("{LEASE_PREFIX}{name}"))
                .query_async(&mut conn)
                .await?;
            if lease.is_some() {
                continue;
            }
            // On a cluster, every primary; one that lacks it answers an
            // error, which changes nothing.
            let gone: Result<(), RedisError> = redis::cmd("FUNCTION")
                .arg("DELETE")
                .arg(&name)
                .query_async(&mut conn)
                .await;
            match gone {
                Ok(()) => deleted += 1,
                Err(e) => tracing::debug!(error = %e, library = %name, "redis: not deleted"),
            }
        }
        Ok(deleted)
    }
}

/// The `library_name` of every library `FUNCTION LIST` answered with
/// (RESP2: a flat array of names and values per library; RESP3: a map).
fn library_names(listed: &Value) -> Vec<String> {
    let Value::Array(libraries) = listed else {
        return Vec::new();
    };
    let text = |v: &Value| match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    libraries
        .iter()
        .filter_map(|library| match library {
            Value::Array(fields) => fields
                .chunks(2)
                .find(|pair| text(&pair[0]).as_deref() == Some("library_name"))
                .and_then(|pair| pair.get(1).and_then(text)),
            Value::Map(fields) => fields
                .iter()
                .find(|(k, _)| text(k).as_deref() == Some("library_name"))
                .and_then(|(_, v)| text(v)),
            _ => None,
        })
        .collect()
}

/// Renews this sidecar's leases every [`RENEW_EVERY`] until the store is
/// dropped; a failed renewal waits for the next.
pub(super) async fn renew(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(RENEW_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is now: start-up takes the leases itself.
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(store) = inner.upgrade() else {
            return;
        };
        // Cached scripts have no leases: nothing deletes them.
        if store.modes.current() != super::mode::Mode::Functions {
            continue;
        }
        let renewed = tokio::time::timeout(super::PREPARE_TIMEOUT, async {
            let mut stage = Stage::Waiting;
            let checkout = store.lanes.acquire(&mut stage).await?;
            let mut conn = checkout.conn.clone();
            for script in store.scripts.every() {
                store.lease(&script, &mut conn).await?;
            }
            Ok::<(), RedisError>(())
        })
        .await;
        if !matches!(renewed, Ok(Ok(()))) {
            tracing::warn!("redis: could not renew the libraries' leases; trying again later");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn library_names_are_read_from_either_protocol() {
        let resp2 = Value::Array(vec![Value::Array(vec![
            bulk("library_name"),
            bulk("sluice_ab"),
            bulk("engine"),
            bulk("LUA"),
        ])]);
        assert_eq!(library_names(&resp2), ["sluice_ab"]);
        let resp3 = Value::Array(vec![Value::Map(vec![(
            bulk("library_name"),
            bulk("sluice_cd"),
        )])]);
        assert_eq!(library_names(&resp3), ["sluice_cd"]);
        assert!(library_names(&Value::Nil).is_empty());
    }
}
