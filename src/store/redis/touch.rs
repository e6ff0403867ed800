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
//! The task rests while the queue is empty: the first key queued wakes it,
//! and what is queued in the [`FLUSH_EVERY`] after goes with it.

use std::sync::{Mutex, Weak};
use std::time::Duration;

use redis::{RedisError, Value};
use tokio::time::timeout;

use crate::store::Evaluation;
use crate::sync;

use super::connect::Conn;
use super::pool::Stage;
use super::scripts::{self, StateKey};
use super::Inner;

/// How long the queue gathers keys once one is queued: a touch is this
/// late (and the pipeline's time) at most.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Keys waiting at most: 40,000 a second at most go to Redis.
pub const QUEUE: usize = 4096;
/// How long one pipeline may take before it is given up.
const SEND_TIMEOUT: Duration = Duration::from_secs(1);

#[derive(Default)]
pub(super) struct Touches {
    pending: Mutex<Vec<StateKey>>,
    /// Wakes the resting task: a key queued into the empty queue.
    queued: sync::Rouse,
}

impl Touches {
    /// Queues `key`; false when the queue is full.
    fn ask(&self, key: StateKey) -> bool {
        let mut pending = sync::lock(&self.pending);
        if pending.len() >= QUEUE {
            return false;
        }
        let first = pending.is_empty();
        pending.push(key);
        drop(pending);
        if first {
            self.queued.rouse();
        }
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
/// each on its own (concurrently, over the connection's clones), so that
/// each goes to the node that holds its key's slot.
async fn send(mut conn: Conn, keys: &[StateKey]) -> Result<(), RedisError> {
    let touch = |key: &StateKey| {
        let mut cmd = redis::cmd("TOUCH");
        cmd.arg(&key[..]);
        cmd
    };
    if matches!(conn, Conn::Shards(_) | Conn::Cluster(_)) {
        let calls = keys.iter().map(|key| {
            let mut conn = conn.clone();
            let cmd = touch(key);
            async move { cmd.query_async::<Value>(&mut conn).await }
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

/// Sends the queued touches, [`FLUSH_EVERY`] after the first of them,
/// until the store is dropped; rests while none is queued.
pub(super) async fn flush(inner: Weak<Inner>) {
    let Some(queued) = inner.upgrade().map(|store| store.touches.queued.listener()) else {
        return;
    };
    loop {
        // Not holding the store meanwhile: its drop wakes this too.
        queued.notified().await;
        tokio::time::sleep(FLUSH_EVERY).await;
        let Some(store) = inner.upgrade() else {
            return;
        };
        let keys = store.touches.take();
        if !keys.is_empty() {
            store.send_touches(keys).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &[u8]) -> StateKey {
        StateKey::from_slice(name)
    }

    #[test]
    fn the_first_key_queued_wakes_the_task_and_the_next_ones_go_with_it() {
        let touches = Touches::default();
        let wake = touches.queued.listener();
        assert!(!sync::notified(&wake), "nothing queued: the task rests");
        assert!(touches.ask(key(b"a")));
        assert!(sync::notified(&wake));
        assert!(touches.ask(key(b"b")));
        assert!(!sync::notified(&wake), "queued behind the first");
        assert_eq!(touches.take().len(), 2);
        assert!(touches.ask(key(b"c")));
        assert!(sync::notified(&wake), "the first since the queue was sent");
    }

    #[test]
    fn a_store_dropped_wakes_its_resting_task() {
        let touches = Touches::default();
        let wake = touches.queued.listener();
        drop(touches);
        assert!(sync::notified(&wake));
    }
}
