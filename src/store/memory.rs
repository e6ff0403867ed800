//! The embedded store: sharded maps of per-subject algorithm state.
//!
//! Concurrency: a key hashes to one of [`SHARDS`] shards, each a std
//! `Mutex<HashMap>`; a lock is held only for one pure algorithm step (no
//! await inside), so contention is per shard, never global.
//!
//! Memory is bounded: each entry expires at its last admitted write plus the
//! policy's horizon plus a grace (after which it is indistinguishable from a
//! fresh subject), a sweeper drops expired entries, and at most
//! `max_entries` live at once. A new subject arriving at a full store is
//! refused (AdmissionRejected → `on_failure`); a live entry is never evicted
//! to make room, so no client is ever handed a fresh bucket early.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::limit::algorithm::{self, State};
use crate::limit::{micros, Micros, Outcome, Unavailable};
use crate::subject::Pseudonym;

use super::Evaluation;

/// A power of two well above the core counts sluice runs on.
const SHARDS: usize = 64;

/// (policy name, revision, pseudonym): a changed policy never mixes counters.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    policy: Arc<str>,
    revision: Arc<str>,
    subject: Pseudonym,
}

struct Entry {
    state: State,
    expires_at: Micros,
}

type Shard = Mutex<HashMap<Key, Entry>>;

pub struct MemoryStore {
    shards: Box<[Shard]>,
    hasher: std::collections::hash_map::RandomState,
    len: AtomicUsize,
    max_entries: usize,
    grace: Micros,
    clock: Clock,
}

/// Wall-clock microseconds that never go backwards: fixed windows align to
/// the Unix epoch (so every sidecar agrees where a window starts), but a
/// wall-clock step must not rewind anyone's state. Anchored once at start,
/// advanced by the monotonic clock.
#[derive(Clone, Copy)]
pub struct Clock {
    wall_at_start: Micros,
    start: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Clock {
            wall_at_start: micros(wall),
            start: Instant::now(),
        }
    }

    pub fn now(&self) -> Micros {
        self.wall_at_start + micros(self.start.elapsed())
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

impl MemoryStore {
    pub fn new(max_entries: usize, grace: Duration) -> MemoryStore {
        MemoryStore {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
            len: AtomicUsize::new(0),
            max_entries,
            grace: micros(grace),
            clock: Clock::new(),
        }
    }

    /// Subjects currently tracked (for metrics).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn evaluate(&self, evaluation: &Evaluation<'_>) -> Outcome {
        self.evaluate_at(evaluation, self.clock.now())
    }

    /// [`MemoryStore::evaluate`] at a given time (tests drive the clock).
    pub fn evaluate_at(&self, evaluation: &Evaluation<'_>, now: Micros) -> Outcome {
        let policy = evaluation.policy;
        let key = Key {
            policy: policy.name.clone(),
            revision: policy.revision.clone(),
            subject: *evaluation.subject,
        };
        let shard = &self.shards[self.shard_of(&key)];
        // A poisoned shard only means another thread panicked mid-step; the
        // map itself is still consistent (steps write whole entries).
        let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());

        let horizon = micros(policy.bands.horizon()) + self.grace;
        let live = map.get(&key).is_some_and(|e| e.expires_at > now);
        if !live && !map.contains_key(&key) && self.len.load(Ordering::Relaxed) >= self.max_entries
        {
            // Full: try to make room from expired entries of this shard
            // before refusing the newcomer.
            let before = map.len();
            map.retain(|_, e| e.expires_at > now);
            self.len.fetch_sub(before - map.len(), Ordering::Relaxed);
            if self.len.load(Ordering::Relaxed) >= self.max_entries {
                return Outcome::Unavailable(Unavailable::AdmissionRejected);
            }
        }

        let entry = map.entry(key).or_insert_with(|| {
            self.len.fetch_add(1, Ordering::Relaxed);
            Entry {
                state: State::new(&policy.bands),
                expires_at: 0,
            }
        });
        if entry.expires_at <= now {
            entry.state = State::new(&policy.bands);
        }
        let decision = algorithm::evaluate(&policy.bands, &mut entry.state, now, evaluation.cost);
        if decision.allowed {
            entry.expires_at = now + horizon;
        } else if entry.expires_at == 0 {
            // A fresh subject denied outright (cost above what is left
            // cannot happen for a fresh one, but keep the map tidy).
            entry.expires_at = now;
        }
        Outcome::from_decision(decision)
    }

    /// Drops expired entries. Called periodically by the sweeper task; the
    /// lock is taken one shard at a time.
    pub fn sweep(&self) -> usize {
        let now = self.clock.now();
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
            let before = map.len();
            map.retain(|_, e| e.expires_at > now);
            removed += before - map.len();
        }
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    fn shard_of(&self, key: &Key) -> usize {
        (self.hasher.hash_one(key) as usize) % SHARDS
    }
}
