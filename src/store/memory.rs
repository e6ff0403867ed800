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
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
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
#[derive(Clone, PartialEq, Eq)]
struct Key {
    /// Computed once per request from the pseudonym, and used for both the
    /// shard and the map: hashing the names and the digest twice was a
    /// visible part of every decision. The pseudonym already names the
    /// route, hence its one policy; the rare keys that differ only in
    /// policy or revision (after a reload) share a hash and are told apart
    /// by `Eq`.
    hash: u64,
    policy: Arc<str>,
    revision: Arc<str>,
    subject: Pseudonym,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Hands the precomputed [`Key::hash`] to the map unchanged. It was made
/// with a randomly keyed SipHash, so clients cannot aim collisions at it.
#[derive(Default)]
struct Precomputed(u64);

impl Hasher for Precomputed {
    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is ever called (see `Key`'s `Hash`); this keeps
        // the hasher correct for anything else all the same (FxHash step).
        for byte in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(*byte)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

struct Entry {
    state: State,
    expires_at: Micros,
}

type Shard = Mutex<HashMap<Key, Entry, BuildHasherDefault<Precomputed>>>;

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
            shards: (0..SHARDS)
                .map(|_| Mutex::new(HashMap::default()))
                .collect(),
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
        let key = self.key(evaluation);
        let shard = &self.shards[shard_of(key.hash)];
        // A poisoned shard only means another thread panicked mid-step; the
        // map itself is still consistent (steps write whole entries).
        let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());

        let horizon = micros(policy.horizon()) + self.grace;
        // Only a subject the store does not hold yet needs room; the count
        // is read first so the usual case looks the key up once.
        if self.len.load(Ordering::Relaxed) >= self.max_entries && !map.contains_key(&key) {
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
                state: State::new(policy.bands()),
                expires_at: 0,
            }
        });
        if entry.expires_at <= now {
            entry.state = State::new(policy.bands());
        }
        let decision = algorithm::evaluate(policy.bands(), &mut entry.state, now, evaluation.cost);
        if decision.allowed {
            entry.expires_at = now + horizon;
        } else if entry.expires_at == 0 {
            // A fresh subject denied outright (cost above what is left
            // cannot happen for a fresh one, but keep the map tidy).
            entry.expires_at = now;
        }
        Outcome::from_decision(decision)
    }

    /// What `evaluation` would be answered now, charging nothing (for
    /// `POST /explain`): the step runs on a copy of the subject's state,
    /// and nothing is written back: no entry is made for a subject never
    /// seen, and no expiry moves.
    pub fn peek(&self, evaluation: &Evaluation<'_>) -> Outcome {
        self.peek_at(evaluation, self.clock.now())
    }

    /// [`MemoryStore::peek`] at a given time.
    pub fn peek_at(&self, evaluation: &Evaluation<'_>, now: Micros) -> Outcome {
        let policy = evaluation.policy;
        let key = self.key(evaluation);
        let shard = &self.shards[shard_of(key.hash)];
        let mut state = {
            let map = shard.lock().unwrap_or_else(|e| e.into_inner());
            match map.get(&key) {
                Some(entry) if entry.expires_at > now => entry.state.clone(),
                Some(_) => State::new(policy.bands()),
                None => {
                    // As `evaluate_at` would find it: a newcomer to a full
                    // store is refused unless this shard's expired entries
                    // make room.
                    let len = self.len.load(Ordering::Relaxed);
                    if len >= self.max_entries {
                        let expired = map.values().filter(|e| e.expires_at <= now).count();
                        if len - expired.min(len) >= self.max_entries {
                            return Outcome::Unavailable(Unavailable::AdmissionRejected);
                        }
                    }
                    State::new(policy.bands())
                }
            }
        };
        let decision = algorithm::evaluate(policy.bands(), &mut state, now, evaluation.cost);
        Outcome::from_decision(decision)
    }

    fn key(&self, evaluation: &Evaluation<'_>) -> Key {
        let policy = evaluation.policy;
        Key {
            hash: self.hasher.hash_one(evaluation.subject.digest()),
            policy: policy.name.clone(),
            revision: policy.revision.clone(),
            subject: *evaluation.subject,
        }
    }

    /// Drops every entry: what the local fallback does once the shared
    /// store decides again, so the next outage starts from nothing.
    pub fn clear(&self) -> usize {
        let mut removed = 0;
        for shard in self.shards.iter() {
            let mut map = shard.lock().unwrap_or_else(|e| e.into_inner());
            removed += map.len();
            map.clear();
        }
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }

    /// Drops expired entries. Called periodically by the sweeper task; the
    /// lock is taken one shard at a time.
    pub fn sweep(&self) -> usize {
        self.sweep_at(self.clock.now())
    }

    /// [`MemoryStore::sweep`] at a given time.
    pub fn sweep_at(&self, now: Micros) -> usize {
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
}

/// Bits 32 and up: the map inside a shard indexes by the low bits and tags
/// by the top seven, so the shard must come from neither or every key of a
/// shard would crowd the same buckets.
fn shard_of(hash: u64) -> usize {
    ((hash >> 32) as usize) % SHARDS
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::limit::{Bands, Policy, WindowBand};
    use crate::store::EvaluationId;
    use crate::subject::PseudonymKey;

    const SECOND: Micros = 1_000_000;

    fn policy(name: &str, revision: &str, limit: u32) -> Policy {
        Policy::new(
            name,
            revision,
            Bands::FixedWindow(vec![WindowBand {
                limit: NonZeroU32::new(limit).unwrap(),
                window: Duration::from_secs(60),
            }]),
            false,
        )
    }

    fn subject(n: u32) -> Pseudonym {
        PseudonymKey::new(b"k", 1).pseudonym("ip", &n.to_be_bytes(), "r")
    }

    fn ask(store: &MemoryStore, policy: &Policy, subject: &Pseudonym, now: Micros) -> Outcome {
        let evaluation = Evaluation {
            policy,
            subject,
            cost: 1,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(0),
        };
        store.evaluate_at(&evaluation, now)
    }

    fn allowed(outcome: Outcome) -> bool {
        matches!(outcome, Outcome::Allowed(_))
    }

    #[test]
    fn policy_and_revision_keep_counters_apart() {
        let store = MemoryStore::new(100, Duration::ZERO);
        let now = 3_600 * SECOND;
        let (r1, r2, other) = (
            policy("p", "r1", 1),
            policy("p", "r2", 1),
            policy("q", "r1", 1),
        );
        let s = subject(1);
        assert!(allowed(ask(&store, &r1, &s, now)));
        assert!(!allowed(ask(&store, &r1, &s, now)));
        // Same subject and hash, another revision or policy: fresh counters.
        assert!(allowed(ask(&store, &r2, &s, now)));
        assert!(allowed(ask(&store, &other, &s, now)));
        assert!(!allowed(ask(&store, &r1, &s, now)));
        assert_eq!(store.len(), 3);
        assert!(allowed(ask(&store, &r1, &subject(2), now)));
    }

    #[test]
    fn a_full_store_refuses_newcomers_but_serves_known_subjects() {
        let store = MemoryStore::new(2, Duration::ZERO);
        let p = policy("p", "r1", 10);
        let now = 3_600 * SECOND;
        assert!(allowed(ask(&store, &p, &subject(1), now)));
        assert!(allowed(ask(&store, &p, &subject(2), now)));
        assert_eq!(
            ask(&store, &p, &subject(3), now),
            Outcome::Unavailable(Unavailable::AdmissionRejected)
        );
        assert!(allowed(ask(&store, &p, &subject(1), now)));
        // Once the known subjects expire there is room again.
        let later = now + 121 * SECOND;
        store.sweep_at(later);
        assert!(allowed(ask(&store, &p, &subject(3), later)));
        assert_eq!(store.len(), 1);
    }

    fn peek(store: &MemoryStore, policy: &Policy, subject: &Pseudonym, now: Micros) -> Outcome {
        let evaluation = Evaluation {
            policy,
            subject,
            cost: 1,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(0),
        };
        store.peek_at(&evaluation, now)
    }

    #[test]
    fn peeking_charges_nothing_and_stores_nothing() {
        let store = MemoryStore::new(2, Duration::ZERO);
        let p = policy("p", "r1", 3);
        let now = 3_600 * SECOND;
        let s = subject(1);
        // A subject never seen: a full quota, and no entry made for it.
        let Outcome::Allowed(fresh) = peek(&store, &p, &s, now) else {
            panic!("a fresh subject is admitted");
        };
        assert_eq!(fresh.remaining, 2);
        assert_eq!(store.len(), 0);
        assert!(allowed(ask(&store, &p, &s, now)));
        for _ in 0..3 {
            let Outcome::Allowed(d) = peek(&store, &p, &s, now + SECOND) else {
                panic!("two are left");
            };
            assert_eq!(d.remaining, 1, "what one more would leave");
        }
        assert!(allowed(ask(&store, &p, &s, now)));
        assert!(allowed(ask(&store, &p, &s, now)));
        assert!(matches!(peek(&store, &p, &s, now), Outcome::Denied(_)));
        assert!(!allowed(ask(&store, &p, &s, now)));
        // Past the entry's expiry it reads as fresh, and stays expired.
        let later = now + 61 * SECOND;
        assert!(allowed(peek(&store, &p, &s, later)));
        assert_eq!(store.sweep_at(later), 1);
    }

    #[test]
    fn peeking_a_newcomer_at_a_full_store_says_it_would_be_refused() {
        let store = MemoryStore::new(1, Duration::ZERO);
        let p = policy("p", "r1", 3);
        let now = 3_600 * SECOND;
        assert!(allowed(ask(&store, &p, &subject(1), now)));
        assert_eq!(
            peek(&store, &p, &subject(2), now),
            Outcome::Unavailable(Unavailable::AdmissionRejected)
        );
        assert!(allowed(peek(&store, &p, &subject(1), now)));
        assert_eq!(store.len(), 1);
    }

    #[test]
    fn subjects_spread_over_every_shard() {
        let store = MemoryStore::new(100_000, Duration::ZERO);
        let p = policy("p", "r1", 10);
        for n in 0..4_096 {
            assert!(allowed(ask(&store, &p, &subject(n), SECOND)));
        }
        let sizes: Vec<usize> = store
            .shards
            .iter()
            .map(|s| s.lock().unwrap().len())
            .collect();
        assert_eq!(sizes.iter().sum::<usize>(), 4_096);
        // 64 expected per shard; a shard under a quarter of that would mean
        // the shard index is not drawn from the hash's spread bits.
        assert!(sizes.iter().all(|&n| n >= 16), "{sizes:?}");
    }
}
