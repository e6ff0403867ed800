//! The sidecar's own books of subjects (the over-limit cache, the leases):
//! one policy's subject as the key, and sixteen maps behind their own
//! locks, so requests of different subjects seldom wait for each other.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::limit::Policy;
use crate::subject::Pseudonym;
use crate::sync;

use super::spread::{self, spread, BuildPrecomputed};

pub const SHARDS: usize = 16;

/// One subject of one policy, under its revision (a policy changed in what
/// its counts mean is another key).
#[derive(Clone, PartialEq, Eq)]
pub struct SubjectKey {
    policy: Arc<str>,
    revision: Arc<str>,
    pub subject: Pseudonym,
}

/// Hashed by the subject's [`spread`] alone (twice per lookup: the shard,
/// then the map): the digest is already a keyed hash of who is asking, so
/// it spreads subjects as well as the whole key would, at a fraction of
/// the cost; the few policies of one subject are told apart by `Eq`.
impl Hash for SubjectKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(spread(self.subject.digest()));
    }
}

impl SubjectKey {
    pub fn new(policy: &Policy, subject: &Pseudonym) -> SubjectKey {
        SubjectKey {
            policy: policy.name.clone(),
            revision: policy.revision.clone(),
            subject: *subject,
        }
    }
}

pub type Map<V> = HashMap<SubjectKey, V, BuildPrecomputed>;

pub struct Shards<V> {
    shards: Box<[Mutex<Map<V>>]>,
}

impl<V> Default for Shards<V> {
    fn default() -> Shards<V> {
        Shards {
            shards: (0..SHARDS).map(|_| Mutex::new(Map::default())).collect(),
        }
    }
}

impl<V> Shards<V> {
    /// Which shard holds `key`.
    pub fn index(&self, key: &SubjectKey) -> usize {
        spread::shard_of(spread(key.subject.digest()), SHARDS)
    }

    /// The shard that holds `key`. A poisoned shard holds whole entries
    /// only: it is used on.
    pub fn lock(&self, key: &SubjectKey) -> MutexGuard<'_, Map<V>> {
        sync::lock(&self.shards[self.index(key)])
    }

    /// Every shard, locked one after another.
    pub fn each(&self) -> impl Iterator<Item = MutexGuard<'_, Map<V>>> {
        self.shards.iter().map(sync::lock)
    }

    /// Entries in all.
    pub fn len(&self) -> usize {
        self.each().map(|s| s.len()).sum()
    }
}
