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
//! to forget ([`entry::Cost`]), chosen among a few entries of the
//! newcomer's shard sampled at random (Redis's approximated LRU samples
//! the same way, [`evict`]): an expired entry first; then the live one
//! that has used the smallest share of its own limit, the oldest of
//! equals, so a flood of one-request subjects mostly evicts its own kind
//! while clients that keep coming stay; an entry that is refusing its
//! subject, or has nothing left to admit, only when every sample is, and
//! then the one whose refusal ends soonest, of equal ends the one that
//! began refusing last (refusing entries are what a flood most wants
//! erased). Forgetting an entry costs at most what its subject had used,
//! once: it starts again from a full quota. Evictions are counted
//! ([`MemoryStore::evictions`]).
//!
//! [`evict`]: MemoryStore::evict

mod clock;
mod entry;
mod evict;
mod key;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use indexmap::IndexMap;
use smallvec::SmallVec;

use crate::limit::algorithm::{self, State};
use crate::limit::{micros, Micros, Outcome, Unavailable};
use crate::sync;

pub use self::clock::Clock;
use self::entry::Entry;
use self::key::Key;
use super::spread::{self, spread, BuildPrecomputed};

use super::{Evaluation, Outcomes};

/// At most this many shards: a power of two well above the core counts
/// sluice runs on.
const SHARDS: usize = 64;

/// One shard per this many entries, up to [`SHARDS`]: eviction works within
/// a shard, so a store may exceed its bound by one entry per shard, and a
/// small store keeps that overshoot (and the sampling) exact with one.
const ENTRIES_PER_SHARD: usize = 1024;

/// Insertion-ordered so an entry can be picked by position: sampling for
/// eviction is O(1). `swap_remove` keeps removal O(1) too.
type Map = IndexMap<Key, Entry, BuildPrecomputed>;

/// An entry before a step: `None` when the step made the entry.
type Before = Option<Entry>;
type Shard = Mutex<Map>;

pub struct MemoryStore {
    shards: Box<[Shard]>,
    len: AtomicUsize,
    max_entries: usize,
    evictions: AtomicU64,
    grace: Micros,
    clock: Clock,
}

impl MemoryStore {
    pub fn new(max_entries: usize, grace: Duration) -> MemoryStore {
        MemoryStore {
            shards: (0..shard_count(max_entries))
                .map(|_| Mutex::new(IndexMap::default()))
                .collect(),
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
            let before = (i < last).then(|| map.get(&key).cloned());
            let outcome = self.step(map, key.clone(), evaluation, now, &protect);
            outcomes.list.push(outcome);
            if outcome.blocks(evaluation.policy.shadow) {
                for (key, before) in undo.into_iter().rev() {
                    let map = locked(&mut guards, self.shard_of(key.hash));
                    match before {
                        Some(was) => {
                            if let Some(entry) = map.get_mut(&key) {
                                *entry = was;
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
            hash: spread(evaluation.subject.digest()),
            policy: policy.name.clone(),
            revision: policy.revision.clone(),
            subject: *evaluation.subject,
        }
    }

    fn shard_of(&self, hash: u64) -> usize {
        spread::shard_of(hash, self.shards.len())
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
            entry.admitted(policy, &decision, now, horizon);
        } else {
            entry.refused(&decision, now);
        }
        Outcome::from_decision(decision)
    }

    /// Makes room in `map`, the locked shard of a newcomer whose key
    /// hashes to `seed`, by evicting the sampled entry that costs least to
    /// forget ([`evict::victim`]). Only this shard is touched, so no second
    /// lock is taken; a shard with nothing to evict (empty, or only the
    /// request's own keys) takes the newcomer beyond the bound, which a
    /// store can exceed by at most one entry per shard.
    fn evict(&self, map: &mut Map, seed: u64, now: Micros, protect: &[u64]) {
        if let Some(at) = evict::victim(map, seed, now, protect) {
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

/// A power of two from 1 to [`SHARDS`]: one per [`ENTRIES_PER_SHARD`].
fn shard_count(max_entries: usize) -> usize {
    (max_entries / ENTRIES_PER_SHARD)
        .clamp(1, SHARDS)
        .next_power_of_two()
        .min(SHARDS)
}
