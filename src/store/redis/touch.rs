//! Keeping denied subjects' keys in Redis's sight.
//!
//! While this sidecar's over-limit cache answers a denied subject, Redis
//! sees nothing of its key: under `maxmemory-policy volatile-lru` the key
//! then ages like an idle one, and a flood of new keys through any sidecar
//! evicts it first; another sidecar, asking Redis, hands the subject a
//! fresh window. So each hit that finds its key due
//! ([`crate::store::deny_cache::TOUCH_EVERY`]: at most four times a second per
//! subject, however fast it asks) queues the key here, and a task sends
//! the queue every [`FLUSH_EVERY`] as one pipeline of `TOUCH`es (on a
//! cluster, one call a key, all at once, each to its key's node), which
//! updates a key's access time as a read would, without writing. Fire
//! and forget: the queue is bounded ([`QUEUE`]; a key that does not fit
//! is dropped, and its next hit a second later asks again), nothing waits
//! for the reply, and nothing is sent while the breaker refuses requests.

use std::sync::{Mutex, Weak};
use std::time::Duration;

use redis::{RedisError, Value};
use tokio::time::{timeout, MissedTickBehavior};

use crate::store::Evaluation;
use crate::sync;

use super::connect::Conn;
use super::pool::Stage;
use super::scripts::{self, StateKey};
use super::Inner;

/// How often the queue is sent: a touch is at most this late.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Keys waiting at most: 40,000 a second at most go to Redis.
pub const QUEUE: usize = 4096;
/// How long one pipeline may take before it is given up.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct Touches {
    pending: Mutex<Vec<StateKey>>,
}

impl Touches {
    /// Queues `key`; false when the queue is full.
    fn ask(&self, key: StateKey) -> bool {
        let mut pending = sync::lock(&self.pending);
        if pending.len() >= QUEUE {
            return false;
        }
        pending.push(key);
        true
    }

    fn take(&self) -> Vec<StateKey> {
        std::mem::take(&mut *sync::lock(&self.pending))
    }
}

impl Inner {
    /// Asks for `evaluation`'s state key to be touched.
    pub(super) fn touch(&self, evaluation: &Evaluation<'_>) {
        let key = scripts::state_key(self.scripts.common(), evaluation);
        if !self.touches.ask(key) {
            self.stats.touches_dropped.count();
        }
    }

    async fn send_touches(&self, keys: Vec<StateKey>) {
        let count = keys.len() as u64;
        let dropped = || {
            for _ in 0..count {
                self.stats.touches_dropped.count();
            }
        };
        // Redis is failing: a touch would only add to its load.
        if !self.breaker.closed() {
            return dropped();
        }
        let sent = timeout(SEND_TIMEOUT, async {
            let mut stage = Stage::Waiting;
            let checkout = self.lanes.acquire(&mut stage).await?;
            send(checkout.conn.clone(), &keys).await
        })
        .await;
        match sent {
            Ok(Ok(())) => {
                for _ in 0..count {
                    self.stats.touched.count();
                }
            }
            Ok(Err(e)) => {
                dropped();
                if self.stats.may_warn() {
                    tracing::warn!(
                        error = %e,
                        "redis: TOUCH of denied subjects' keys failed (the user needs +touch); under a volatile-lru policy their keys may be evicted first"
                    );
                }
            }
            Err(_) => {
                dropped();
                if self.stats.may_warn() {
                    tracing::warn!(
                        timeout_seconds = SEND_TIMEOUT.as_secs_f64(),
                        "redis: TOUCH of denied subjects' keys not answered in time"
                    );
                }
            }
        }
    }
}

/// One `TOUCH` per key: as one pipeline to a single node; on a cluster,
/// each on its own (concurrently, over the one multiplexed connection),
/// so that each goes to the node that holds its key's slot.
async fn send(mut conn: Conn, keys: &[StateKey]) -> Result<(), RedisError> {
    let touch = |key: &StateKey| {
        let mut cmd = redis::cmd("TOUCH");
        cmd.arg(&key[..]);
        cmd
    };
    if let Conn::Cluster(cluster) = &conn {
        let calls = keys.iter().map(|key| {
            let mut cluster = cluster.clone();
            let cmd = touch(key);
            async move { cmd.query_async::<Value>(&mut cluster).await }
        });
        for touched in futures_util::future::join_all(calls).await {
            touched?;
        }
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for key in keys {
        pipe.add_command(touch(key)).ignore();
    }
    pipe.query_async::<()>(&mut conn).await
}

/// Sends the queued touches every [`FLUSH_EVERY`] until the store is
/// dropped.
pub(super) async fn flush(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(store) = inner.upgrade() else {
            return;
        };
        let keys = store.touches.take();
        if !keys.is_empty() {
            store.send_touches(keys).await;
        }
    }
}
