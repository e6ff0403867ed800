//! The embedded store: sharded maps of per-subject algorithm state.
//!
//! Concurrency: a key hashes to one of up to [`SHARDS`] shards, each a std
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
//! `max_entries` live at once (give or take one per shard: see [`evict`]).
//!
//! A full store never refuses a new subject: that would let one client who
//! mints subjects (random API keys, addresses of a /64) lock every new
//! client out until entries expire. It evicts, in O(1), what costs least
//! to forget, chosen among a few entries of the newcomer's shard sampled
//! at random (Redis's approximated LRU samples the same way): an expired
//! entry first; then the live one that admitted the fewest units, the
//! oldest of equals, so a flood of one-request subjects mostly evicts its
//! own kind while clients that keep coming stay; an entry that is refusing
//! its subject only when every sample is, and then the one whose refusal
//! ends soonest (refusing entries are what a flood most wants erased).
//! Forgetting an entry costs at most what it had admitted, once: its
//! subject starts again from a full quota. Evictions are counted
//! ([`MemoryStore::evictions`]).
//!
//! [`evict`]: MemoryStore::evict

use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use indexmap::IndexMap;
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::limit::algorithm::{self, State};
use crate::limit::{micros, Micros, Outcome, Unavailable};
use crate::subject::Pseudonym;
use crate::sync;

use super::{Evaluation, Outcomes};

/// At most this many shards: a power of two well above the core counts
/// sluice runs on.
const SHARDS: usize = 64;

/// One shard per this many entries, up to [`SHARDS`]: eviction works within
/// a shard, so a store may exceed its bound by one entry per shard, and a
/// small store keeps that overshoot (and the sampling) exact with one.
const ENTRIES_PER_SHARD: usize = 1024;

/// Entries a full store looks at to choose what to evict. Five is Redis's
/// `maxmemory-samples` default: with a store that is mostly a flood of
/// one-request subjects, a frequent subject is among the five and still
/// loses to one of them.
const SAMPLES: usize = 5;

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
    /// Units admitted since the entry was (re)made: what forgetting it
    /// would hand back.
    admitted: u32,
    /// While the entry refuses its subject: when the latest refusal ends
    /// (its retry-after). 0 when it is not refusing.
    refusing_until: Micros,
}

impl Entry {
    fn fresh(policy: &crate::limit::Policy) -> Entry {
        Entry {
            state: State::new(policy.bands()),
            expires_at: 0,
            admitted: 0,
            refusing_until: 0,
        }
    }

    /// Lower is cheaper to forget: expired, then not refusing (fewest
    /// units admitted, then the soonest to expire), then refusing (the
    /// refusal that ends soonest).
    fn cost_to_forget(&self, now: Micros) -> (u8, u64, Micros) {
        if self.expires_at <= now {
            (0, 0, 0)
        } else if self.refusing_until <= now {
            (1, u64::from(self.admitted), self.expires_at)
        } else {
            (2, self.refusing_until, 0)
        }
    }
}

/// Insertion-ordered so an entry can be picked by position: sampling for
/// eviction is O(1). `swap_remove` keeps removal O(1) too.
type Map = IndexMap<Key, Entry, BuildHasherDefault<Precomputed>>;

/// An entry's state and expiry before a step: `None` when the step made
/// the entry.
type Before = Option<(State, Micros)>;
type Shard = Mutex<Map>;

pub struct MemoryStore {
    shards: Box<[Shard]>,
    hasher: std::collections::hash_map::RandomState,
    len: AtomicUsize,
    max_entries: usize,
    evictions: AtomicU64,
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
            shards: (0..shard_count(max_entries))
                .map(|_| Mutex::new(IndexMap::default()))
                .collect(),
            hasher: Default::default(),
            len: AtomicUsize::new(0),
            max_entries,
            evictions: AtomicU64::new(0),
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

    /// Entries evicted so far to make room for new subjects.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }

    pub fn evaluate(&self, evaluation: &Evaluation<'_>) -> Outcome {
        self.evaluate_at(evaluation, self.clock.now())
    }

    /// [`MemoryStore::evaluate`] at a given time (tests drive the clock).
    pub fn evaluate_at(&self, evaluation: &Evaluation<'_>, now: Micros) -> Outcome {
        let key = self.key(evaluation);
        let mut map = self.lock(self.shard_of(key.hash));
        let protect = [key.hash];
        self.step(&mut map, key, evaluation, now, &protect)
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
            let mut outcomes = Outcomes::at(0, self.evaluate_at(one, now));
            outcomes.at = now;
            return outcomes;
        }
        let keys: SmallVec<[Key; 2]> = evaluations.iter().map(|e| self.key(e)).collect();
        // Room for one of this request's subjects is never made by
        // evicting another: its charge could then not be put back.
        let protect: SmallVec<[u64; 2]> = keys.iter().map(|k| k.hash).collect();
        let mut shards: SmallVec<[usize; 2]> = keys.iter().map(|k| self.shard_of(k.hash)).collect();
        shards.sort_unstable();
        shards.dedup();
        // Ascending shard order: the one lock order every caller follows.
        let mut guards: SmallVec<[(usize, MutexGuard<'_, Map>); 2]> =
            shards.iter().map(|&i| (i, self.lock(i))).collect();
        // What each charged limit held before, to put back if a later one
        // blocks.
        let mut undo: SmallVec<[(Key, Before); 2]> = SmallVec::new();
        let mut outcomes = Outcomes::empty();
        outcomes.at = now;
        let last = evaluations.len() - 1;
        for (i, (evaluation, key)) in evaluations.iter().zip(keys).enumerate() {
            let map = locked(&mut guards, self.shard_of(key.hash));
            // The last limit needs no copy: if it blocks it wrote nothing,
            // and if it admits nothing is undone.
            let before = (i < last).then(|| {
                map.get(&key)
                    .map(|entry| (entry.state.clone(), entry.expires_at))
            });
            let outcome = self.step(map, key.clone(), evaluation, now, &protect);
            outcomes.list.push(outcome);
            if outcome.blocks(evaluation.policy.shadow) {
                for (key, before) in undo.into_iter().rev() {
                    let map = locked(&mut guards, self.shard_of(key.hash));
                    match before {
                        Some((state, expires_at)) => {
                            if let Some(entry) = map.get_mut(&key) {
                                entry.state = state;
                                entry.expires_at = expires_at;
                            }
                        }
                        None => {
                            if map.swap_remove(&key).is_some() {
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

    fn shard_of(&self, hash: u64) -> usize {
        shard_of(hash, self.shards.len())
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Map> {
        // A poisoned shard only means another thread panicked mid-step; the
        // map itself is still consistent (steps write whole entries).
        sync::lock(&self.shards[shard])
    }

    /// One limit's step on its shard, already locked. `protect`: the
    /// hashes of the request's keys, never evicted for it.
    fn step(
        &self,
        map: &mut Map,
        key: Key,
        evaluation: &Evaluation<'_>,
        now: Micros,
        protect: &[u64],
    ) -> Outcome {
        let policy = evaluation.policy;
        let horizon = micros(policy.horizon()) + self.grace;
        // Only a subject the store does not hold yet needs room; the count
        // is read first so the usual case looks the key up once.
        if self.len.load(Ordering::Relaxed) >= self.max_entries && !map.contains_key(&key) {
            if self.max_entries == 0 {
                // A store with room for nothing cannot decide at all.
                return Outcome::Unavailable(Unavailable::AdmissionRejected);
            }
            self.evict(map, key.hash, now, protect);
        }

        let entry = map.entry(key).or_insert_with(|| {
            self.len.fetch_add(1, Ordering::Relaxed);
            Entry::fresh(policy)
        });
        if entry.expires_at <= now {
            *entry = Entry::fresh(policy);
        }
        let decision = algorithm::evaluate(policy.bands(), &mut entry.state, now, evaluation.cost);
        if decision.allowed {
            entry.expires_at = now + horizon;
            entry.admitted = entry.admitted.saturating_add(evaluation.cost);
            entry.refusing_until = 0;
        } else {
            entry.refusing_until = now.saturating_add(micros(decision.retry_after));
            if entry.expires_at == 0 {
                // A fresh subject denied outright (cost above what is left
                // cannot happen for a fresh one, but keep the map tidy).
                entry.expires_at = now;
            }
        }
        Outcome::from_decision(decision)
    }

    /// Makes room in `map`, the locked shard of a newcomer whose key
    /// hashes to `seed`, by evicting the sampled entry that costs least to
    /// forget. The sample's positions come from the newcomer's hash (a
    /// keyed SipHash: a client cannot aim them). Only this shard is
    /// touched, so no second lock is taken; a shard with nothing to evict
    /// (empty, or only the request's own keys) takes the newcomer beyond
    /// the bound, which a store can exceed by at most one entry per shard.
    fn evict(&self, map: &mut Map, seed: u64, now: Micros, protect: &[u64]) {
        let len = map.len();
        if len == 0 {
            return;
        }
        let mut victim: Option<(usize, (u8, u64, Micros))> = None;
        let mut state = seed;
        for i in 0..SAMPLES.min(len) {
            // A shard no larger than the sample is looked at whole.
            let at = if len <= SAMPLES {
                i
            } else {
                state = splitmix(state);
                // `len` fits in u64 and the remainder is below it.
                (state % len as u64) as usize
            };
            let Some((key, entry)) = map.get_index(at) else {
                continue;
            };
            if protect.contains(&key.hash) {
                continue;
            }
            let cost = entry.cost_to_forget(now);
            if victim.is_none_or(|(_, best)| cost < best) {
                victim = Some((at, cost));
            }
        }
        if let Some((at, _)) = victim {
            map.swap_remove_index(at);
            self.len.fetch_sub(1, Ordering::Relaxed);
            self.evictions.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// What `evaluation` would be answered now, charging nothing (for
    /// `POST /explain`): the step runs on a copy of the subject's state,
    /// and nothing is written back: no entry is made for a subject never
    /// seen, and no expiry moves.
    /// Gives back `units` of what `evaluation` reserved at `at` (a limit
    /// charged on response, settled): as `lua/refund.lua` does on Redis,
    /// each algorithm undoing its own step where the state still holds it.
    /// An entry since forgotten needs nothing.
    pub fn refund(&self, evaluation: &Evaluation<'_>, at: Micros, units: u32) {
        let key = self.key(evaluation);
        let mut map = self.lock(self.shard_of(key.hash));
        if let Some(entry) = map.get_mut(&key) {
            algorithm::refund(evaluation.policy.bands(), &mut entry.state, at, units);
            entry.admitted = entry.admitted.saturating_sub(units);
        }
    }

    pub fn peek(&self, evaluation: &Evaluation<'_>) -> Outcome {
        self.peek_at(evaluation, self.clock.now())
    }

    /// [`MemoryStore::peek`] at a given time.
    pub fn peek_at(&self, evaluation: &Evaluation<'_>, now: Micros) -> Outcome {
        let policy = evaluation.policy;
        let key = self.key(evaluation);
        let shard = &self.shards[self.shard_of(key.hash)];
        let mut state = {
            let map = sync::lock(shard);
            match map.get(&key) {
                Some(entry) if entry.expires_at > now => entry.state.clone(),
                Some(_) => State::new(policy.bands()),
                None if self.max_entries == 0 => {
                    return Outcome::Unavailable(Unavailable::AdmissionRejected);
                }
                // A newcomer is admitted even to a full store (someone
                // else makes room), so it starts fresh.
                None => State::new(policy.bands()),
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
            let mut map = sync::lock(shard);
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
            let mut map = sync::lock(shard);
            let before = map.len();
            map.retain(|_, e| e.expires_at > now);
            removed += before - map.len();
        }
        self.len.fetch_sub(removed, Ordering::Relaxed);
        removed
    }
}

/// The map of `shard` among those `evaluate_all` holds locked.
fn locked<'g>(guards: &'g mut [(usize, MutexGuard<'_, Map>)], shard: usize) -> &'g mut Map {
    // Cannot fail: the guards are the shards of every key of the request.
    let at = guards
        .iter()
        .position(|(i, _)| *i == shard)
        .expect("every key's shard is locked");
    &mut guards[at].1
}

/// One step of SplitMix64: spreads consecutive states over all 64 bits.
fn splitmix(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Bits 32 and up: the map inside a shard indexes by the low bits and tags
/// by the top seven, so the shard must come from neither or every key of a
/// shard would crowd the same buckets.
fn shard_of(hash: u64, shards: usize) -> usize {
    ((hash >> 32) as usize) % shards
}

/// A power of two from 1 to [`SHARDS`]: one per [`ENTRIES_PER_SHARD`].
fn shard_count(max_entries: usize) -> usize {
    (max_entries / ENTRIES_PER_SHARD)
        .clamp(1, SHARDS)
        .next_power_of_two()
        .min(SHARDS)
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
            settle_within: None,
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

    /// Whether the store still holds `subject`'s entry for `policy`.
    fn holds(store: &MemoryStore, policy: &Policy, subject: &Pseudonym) -> bool {
        let key = store.key(&unit(policy, subject));
        store.lock(store.shard_of(key.hash)).contains_key(&key)
    }

    #[test]
    fn a_full_store_evicts_what_costs_least_to_forget() {
        let store = MemoryStore::new(3, Duration::ZERO);
        let p = policy("p", "r1", 3);
        let now = 3_600 * SECOND;
        let (frequent, once, refused) = (subject(1), subject(2), subject(3));
        for _ in 0..2 {
            assert!(allowed(ask(&store, &p, &frequent, now)));
        }
        assert!(allowed(ask(&store, &p, &once, now)));
        for _ in 0..3 {
            assert!(allowed(ask(&store, &p, &refused, now)));
        }
        assert!(!allowed(ask(&store, &p, &refused, now)));

        // The newcomer is admitted; the entry that admitted least goes.
        assert!(allowed(ask(&store, &p, &subject(4), now)));
        assert_eq!(store.len(), 3);
        assert_eq!(store.evictions(), 1);
        assert!(!holds(&store, &p, &once));
        assert!(holds(&store, &p, &frequent) && holds(&store, &p, &refused));
        // Still refused: its entry was kept.
        assert!(!allowed(ask(&store, &p, &refused, now)));

        // Of equals, the one to expire soonest (the oldest) goes.
        assert!(allowed(ask(&store, &p, &subject(5), now + SECOND)));
        assert!(!holds(&store, &p, &subject(4)) && holds(&store, &p, &frequent));
        // An expired entry goes before any live one.
        let q = Policy::new(
            "q",
            "r1",
            Bands::FixedWindow(vec![WindowBand {
                limit: NonZeroU32::new(9).unwrap(),
                window: Duration::from_secs(1),
            }]),
            false,
        );
        let store = MemoryStore::new(2, Duration::ZERO);
        assert!(allowed(ask(&store, &p, &subject(1), now)));
        assert!(allowed(ask(&store, &q, &subject(2), now)));
        assert!(allowed(ask(&store, &p, &subject(3), now + 5 * SECOND)));
        assert!(holds(&store, &p, &subject(1)) && !holds(&store, &q, &subject(2)));
    }

    #[test]
    fn when_every_entry_is_refusing_the_refusal_that_ends_soonest_goes() {
        let store = MemoryStore::new(2, Duration::ZERO);
        let p = policy("p", "r1", 1);
        let now = 3_600 * SECOND + 30 * SECOND;
        let (early, late) = (subject(1), subject(2));
        // Refused until 3,640 s (a 10 s window) and 3,660 s (a minute).
        let short = Policy::new(
            "short",
            "r1",
            Bands::FixedWindow(vec![WindowBand {
                limit: NonZeroU32::new(1).unwrap(),
                window: Duration::from_secs(10),
            }]),
            false,
        );
        assert!(allowed(ask(&store, &short, &early, now)));
        assert!(!allowed(ask(&store, &short, &early, now)));
        assert!(allowed(ask(&store, &p, &late, now)));
        assert!(!allowed(ask(&store, &p, &late, now)));
        // A flood of subjects pushed over their limit cannot pin the store.
        assert!(allowed(ask(&store, &p, &subject(3), now)));
        assert!(!holds(&store, &short, &early));
        assert!(holds(&store, &p, &late));
    }

    #[test]
    fn a_flood_of_one_request_subjects_evicts_its_own_kind() {
        let store = MemoryStore::new(2_000, Duration::ZERO);
        let p = policy("p", "r1", 3);
        let now = 3_600 * SECOND;
        let known: Vec<Pseudonym> = (0..20).map(subject).collect();
        for s in &known {
            for _ in 0..3 {
                assert!(allowed(ask(&store, &p, s, now)));
            }
        }
        for n in 1_000..30_000 {
            assert!(allowed(ask(&store, &p, &subject(n), now)), "newcomer {n}");
        }
        assert!(store.len() <= 2_000 + store.shards.len());
        assert!(store.evictions() >= 27_000, "{}", store.evictions());
        for s in &known {
            // Spent before the flood, still spent after it.
            assert!(!allowed(ask(&store, &p, s, now)));
        }
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
                settle_within: None,
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
        // A full store never makes room for one of a request's subjects
        // by evicting another of them: it goes beyond its bound instead.
        let full = MemoryStore::new(1, Duration::ZERO);
        let outcomes = together(&full, &[(&fresh, &s), (&spent, &subject(2))], now);
        assert!(outcomes.iter().all(|o| allowed(*o)), "{outcomes:?}");
        assert_eq!((full.len(), full.evictions()), (2, 0));
        assert!(allowed(ask(&full, &fresh, &subject(3), now)));
        assert_eq!((full.len(), full.evictions()), (2, 1));
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
    fn peeking_a_newcomer_at_a_full_store_says_it_would_be_admitted_and_evicts_nothing() {
        let store = MemoryStore::new(1, Duration::ZERO);
        let p = policy("p", "r1", 3);
        let now = 3_600 * SECOND;
        assert!(allowed(ask(&store, &p, &subject(1), now)));
        assert!(allowed(peek(&store, &p, &subject(2), now)));
        assert!(allowed(peek(&store, &p, &subject(1), now)));
        assert_eq!((store.len(), store.evictions()), (1, 0));
    }

    #[test]
    fn subjects_spread_over_every_shard() {
        let store = MemoryStore::new(100_000, Duration::ZERO);
        let p = policy("p", "r1", 10);
        for n in 0..4_096 {
            assert!(allowed(ask(&store, &p, &subject(n), SECOND)));
        }
        let sizes: Vec<usize> = store.shards.iter().map(|s| sync::lock(s).len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 4_096);
        // 64 expected per shard; a shard under a quarter of that would mean
        // the shard index is not drawn from the hash's spread bits.
        assert!(sizes.iter().all(|&n| n >= 16), "{sizes:?}");
    }
}
