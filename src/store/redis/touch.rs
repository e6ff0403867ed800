//! Keeping denied subjects' keys in Redis's sight.
//!
//! While this sidecar's over-limit cache answers a denied subject, Redis
//! sees nothing of its key: under `maxmemory-policy volatile-lru` the key
//! then ages like an idle one, and a flood of new keys through any sidecar
//! evicts it first; another sidecar, asking Redis, hands the subject a
//! fresh window. So each hit that finds its key due
//! ([`crate::store::deny_cache::TOUCH_EVERY`]: at most once a second per
//! subject, however fast it asks) queues the key here, and a task sends
//! the queue every [`FLUSH_EVERY`] as one pipeline of `TOUCH`es (which
//! updates a key's access time, as a read would, without writing). Fire
//! and forget: the queue is bounded ([`QUEUE`]; a key that does not fit
//! is dropped, and its next hit a second later asks again), nothing waits
//! for the reply, and nothing is sent while the breaker refuses requests.

use std::sync::{Mutex, Weak};
use std::time::Duration;

use tokio::time::{timeout, MissedTickBehavior};

use crate::store::Evaluation;
use crate::sync;

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
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("TOUCH").arg(&key[..]).ignore();
        }
        let sent = timeout(SEND_TIMEOUT, async {
            let mut stage = Stage::Waiting;
            let checkout = self.lanes.acquire(&mut stage).await?;
            let mut conn = checkout.conn.clone();
            pipe.query_async::<()>(&mut conn).await
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
            Err(_) => dropped(),
        }
    }
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
