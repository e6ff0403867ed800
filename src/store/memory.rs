//! The embedded store: sharded maps of per-subject algorithm state.
//!
//! Concurrency: a key hashes to one of [`SHARDS`] shards, each a std
//! `Mutex<HashMap>`; a lock is held only for one pure algorithm step (no
//! await inside), so contention is per shard, never global. A request with
//! several limits ([`MemoryStore::evaluate_all`]) locks the shards of all
//! its keys at once, in ascending order (so two such requests can never
//! wait on each other in a cycle), steps every limit, and puts back the
//! state of each one charged if a later one blocks: all or nothing.
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
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use smallvec::SmallVec;

use crate::limit::algorithm::{self, State};
use crate::limit::{micros, Micros, Outcome, Unavailable};
use crate::subject::Pseudonym;

use super::{Evaluation, Outcomes};

/// A power of two well above the core counts sluice runs on.
const SHARDS: usize = 64;

/// (policy name, revision, pseudonym): a changed policy never mixes counters.
#[derive(Clone, PartialEq, Eq)]
struct Key {
    /// Computed once per request from the pseudonym, and used for both the
    /// shard and the map: hashing the names and the digest twice was a
    /// visible part of every decision. The pseudonym already names the
    /// route; the few keys that differ only in policy or revision (a
    /// route's several limits on one subject, a policy after a reload)
    /// share a hash and are told apart by `Eq`.
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

type Map = HashMap<Key, Entry, BuildHasherDefault<Precomputed>>;

/// An entry's state and expiry before a step: `None` when the step made
/// the entry.
type Before = Option<(State, Micros)>;
type Shard = Mutex<Map>;

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
        let key = self.key(evaluation);
        let mut map = self.lock(shard_of(key.hash));
        self.step(&mut map, key, evaluation, now)
    }

    /// Every rate limit of one request, together: see [`super::Outcomes`].
    /// When one blocks, every limit charged before it is put back as it
    /// was, inside the same critical section, so nobody ever sees the
    /// charge.
    pub fn evaluate_all(&self, evaluations: &[Evaluation<'_>]) -> Outcomes {
        self.evaluate_all_at(evaluations, self.clock.now())
    }

    /// [`MemoryStore::evaluate_all`] at a given time.
    pub fn evaluate_all_at(&self, evaluations: &[Evaluation<'_>], now: Micros) -> Outcomes {
        if let [one] = evaluations {
            return Outcomes::at(0, self.evaluate_at(one, now));
        }
        let keys: SmallVec<[Key; 2]> = evaluations.iter().map(|e| self.key(e)).collect();
        let mut shards: SmallVec<[usize; 2]> = keys.iter().map(|k| shard_of(k.hash)).collect();
        shards.sort_unstable();
        shards.dedup();
        // Ascending shard order: the one lock order every caller follows.
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Map>); 2]> =
            shards.iter().map(|&i| (i, self.lock(i))).collect();
        // What each charged limit held before, to put back if a later one
        // blocks.
        let mut undo: SmallVec<[(Key, Before); 2]> = SmallVec::new();
        let mut outcomes = Outcomes::empty();
        let last = evaluations.len() - 1;
        for (i, (evaluation, key)) in evaluations.iter().zip(keys).enumerate() {
            let map = locked(&mut guards, key.hash);
            // The last limit needs no copy: if it blocks it wrote nothing,
            // and if it admits nothing is undone.
            let before = (i < last).then(|| {
                map.get(&key)
                    .map(|entry| (entry.state.clone(), entry.expires_at))
            });
            let outcome = self.step(map, key.clone(), evaluation, now);
            outcomes.list.push(outcome);
            if outcome.blocks(evaluation.policy.shadow) {
                for (key, before) in undo.into_iter().rev() {
                    let map = locked(&mut guards, key.hash);
                    match before {
                        Some((state, expires_at)) => {
                            if let Some(entry) = map.get_mut(&key) {
                                entry.state = state;
                                entry.expires_at = expires_at;
                            }
                        }
                        None => {
                            if map.remove(&key).is_some() {
                                self.len.fetch_sub(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                return outcomes;
            }
            // A (shadow) denial wrote no state: nothing to undo.
            if let (Outcome::Allowed(_), Some(before)) = (outcome, before) {
                undo.push((key, before));
            }
        }
        outcomes
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

    fn lock(&self, shard: usize) -> MutexGuard<'_, Map> {
        // A poisoned shard only means another thread panicked mid-step; the
        // map itself is still consistent (steps write whole entries).
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One limit's step on its shard, already locked.
    fn step(&self, map: &mut Map, key: Key, evaluation: &Evaluation<'_>, now: Micros) -> Outcome {
        let policy = evaluation.policy;
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

/// The map of `hash`'s shard among those `evaluate_all` holds locked.
fn locked<'g>(guards: &'g mut [(usize, MutexGuard<'_, Map>)], hash: u64) -> &'g mut Map {
    let shard = shard_of(hash);
    // Cannot fail: the guards are the shards of every key of the request.
    let at = guards
        .iter()
        .position(|(i, _)| *i == shard)
        .expect("every key's shard is locked");
    &mut guards[at].1
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

    /// One unit of `policy` for `subject`.
    fn unit<'a>(policy: &'a Policy, subject: &'a Pseudonym) -> Evaluation<'a> {
        Evaluation {
            policy,
            subject,
            cost: 1,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(0),
        }
    }

    fn ask(store: &MemoryStore, policy: &Policy, subject: &Pseudonym, now: Micros) -> Outcome {
        store.evaluate_at(&unit(policy, subject), now)
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

    fn together(
        store: &MemoryStore,
        limits: &[(&Policy, &Pseudonym)],
        now: Micros,
    ) -> Vec<Outcome> {
        let evaluations: Vec<Evaluation<'_>> = limits
            .iter()
            .map(|(policy, subject)| Evaluation {
                policy,
                subject,
                cost: 1,
                deadline: tokio::time::Instant::now(),
                id: EvaluationId(0),
            })
            .collect();
        let outcomes = store.evaluate_all_at(&evaluations, now);
        assert_eq!(outcomes.first, 0);
        outcomes.list.to_vec()
    }

    #[test]
    fn several_limits_pass_together_or_charge_nothing() {
        let store = MemoryStore::new(100, Duration::ZERO);
        let now = 3_600 * SECOND;
        let (per_client, global) = (policy("per-client", "r", 5), policy("global", "r", 2));
        let everyone = subject(0);
        let (a, b, c) = (subject(1), subject(2), subject(3));
        for client in [&a, &b] {
            let outcomes = together(&store, &[(&per_client, client), (&global, &everyone)], now);
            assert!(outcomes.iter().all(|o| allowed(*o)), "{outcomes:?}");
        }
        // The global limit is spent: c is denied by it, and its own
        // per-client limit is not charged.
        let outcomes = together(&store, &[(&per_client, &c), (&global, &everyone)], now);
        assert_eq!(outcomes.len(), 2);
        assert!(
            allowed(outcomes[0]) && !allowed(outcomes[1]),
            "{outcomes:?}"
        );
        for _ in 0..5 {
            assert!(
                allowed(ask(&store, &per_client, &c, now)),
                "c's quota is whole"
            );
        }
        assert!(!allowed(ask(&store, &per_client, &c, now)));
        // The first limit denying stops there: the second is not asked.
        let outcomes = together(&store, &[(&per_client, &c), (&global, &everyone)], now);
        assert_eq!(outcomes.len(), 1);
    }

    #[test]
    fn an_entry_made_for_a_refused_request_is_taken_back() {
        let store = MemoryStore::new(100, Duration::ZERO);
        let now = 3_600 * SECOND;
        let (fresh, spent) = (policy("fresh", "r", 5), policy("spent", "r", 1));
        let s = subject(1);
        assert!(allowed(ask(&store, &spent, &s, now)));
        assert_eq!(store.len(), 1);
        let outcomes = together(&store, &[(&fresh, &s), (&spent, &s)], now);
        assert!(!allowed(outcomes[1]));
        assert_eq!(store.len(), 1, "the new subject's entry was removed again");
        // A full store refusing a newcomer half way undoes the rest too.
        let full = MemoryStore::new(1, Duration::ZERO);
        let outcomes = together(&full, &[(&fresh, &s), (&spent, &subject(2))], now);
        assert_eq!(
            outcomes[1],
            Outcome::Unavailable(Unavailable::AdmissionRejected)
        );
        assert_eq!(full.len(), 0);
    }

    #[test]
    fn a_shadow_denial_blocks_nothing() {
        let store = MemoryStore::new(100, Duration::ZERO);
        let now = 3_600 * SECOND;
        let real = policy("real", "r", 5);
        let shadow = Policy::new(
            "shadow",
            "r",
            Bands::FixedWindow(vec![WindowBand {
                limit: NonZeroU32::new(1).unwrap(),
                window: Duration::from_secs(60),
            }]),
            true,
        );
        let s = subject(1);
        assert!(allowed(ask(&store, &shadow, &s, now)));
        let outcomes = together(&store, &[(&shadow, &s), (&real, &s)], now);
        assert!(
            !allowed(outcomes[0]) && allowed(outcomes[1]),
            "{outcomes:?}"
        );
        for _ in 0..4 {
            assert!(allowed(ask(&store, &real, &s, now)));
        }
        assert!(
            !allowed(ask(&store, &real, &s, now)),
            "the real limit was charged"
        );
    }

    fn peek(store: &MemoryStore, policy: &Policy, subject: &Pseudonym, now: Micros) -> Outcome {
        store.peek_at(&unit(policy, subject), now)
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
