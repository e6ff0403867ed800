//! Requests in flight to the upstream, per (concurrency policy, subject):
//! what `algorithm: concurrency` counts. Local to this process by nature
//! (it counts what this sidecar is forwarding now), so it never reaches
//! Redis, whatever the store.
//!
//! A [`Permit`] is one request in flight; dropping it gives the place
//! back, so a request that ends in any way (its response body finished,
//! the client gone, the upstream failed, the task cancelled) releases it.
//! An entry lives only while its count is above zero: the table holds at
//! most one entry per request in flight, never a history of subjects.
//!
//! The table outlives configurations: it belongs to the proxy, and a
//! reload that changes a policy's `limit` applies it to the next request
//! while the requests already in flight keep their places.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use metrics::Gauge;

use crate::limit::Concurrency;
use crate::subject::Pseudonym;
use crate::sync;

use super::spread::{self, spread, BuildPrecomputed};

/// Shards, as in the memory store: a lock is held for one counter update.
const SHARDS: usize = 16;

#[derive(Clone, PartialEq, Eq)]
struct Key {
    policy: Arc<str>,
    subject: Pseudonym,
}

/// By the subject's [`spread`] alone, as the other books of subjects.
impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(spread(self.subject.digest()));
    }
}

type Map = HashMap<Key, u32, BuildPrecomputed>;
type Shard = Mutex<Map>;

pub struct InFlight {
    shards: Box<[Shard]>,
}

impl InFlight {
    pub fn new() -> Arc<InFlight> {
        Arc::new(InFlight {
            shards: (0..SHARDS).map(|_| Mutex::new(Map::default())).collect(),
        })
    }

    /// A place among `policy.limit` for `subject`, or `None` when every
    /// place is taken. `gauge` (`sluice_in_flight_requests` of the policy)
    /// rises with the place and falls when the permit drops.
    pub fn try_acquire(
        self: &Arc<Self>,
        policy: &Concurrency,
        subject: &Pseudonym,
        gauge: &Gauge,
    ) -> Option<Permit> {
        let key = Key {
            policy: policy.name.clone(),
            subject: *subject,
        };
        let shard = self.shard_of(&key);
        let mut map = self.lock(shard);
        let count = map.entry(key.clone()).or_insert(0);
        if *count >= policy.limit.get() {
            // Never 0 here (a limit is at least 1), so no empty entry stays.
            return None;
        }
        *count += 1;
        drop(map);
        gauge.increment(1.0);
        Some(Permit {
            table: self.clone(),
            shard,
            key,
            gauge: gauge.clone(),
        })
    }

    /// Requests in flight under `policy` for `subject` (tests, explain).
    pub fn count(&self, policy: &str, subject: &Pseudonym) -> u32 {
        let key = Key {
            policy: policy.into(),
            subject: *subject,
        };
        let map = self.lock(self.shard_of(&key));
        map.get(&key).copied().unwrap_or(0)
    }

    /// Distinct (policy, subject) pairs with a request in flight.
    pub fn len(&self) -> usize {
        (0..SHARDS).map(|i| self.lock(i).len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard_of(&self, key: &Key) -> usize {
        spread::shard_of(spread(key.subject.digest()), SHARDS)
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Map> {
        // A poisoned shard only means a thread panicked between two whole
        // counter updates: the map is still consistent.
        sync::lock(&self.shards[shard])
    }
}

/// One request in flight; released when dropped.
pub struct Permit {
    table: Arc<InFlight>,
    shard: usize,
    key: Key,
    gauge: Gauge,
}

impl Drop for Permit {
    fn drop(&mut self) {
        {
            let mut map = self.table.lock(self.shard);
            if let Some(count) = map.get_mut(&self.key) {
                *count -= 1;
                if *count == 0 {
                    map.remove(&self.key);
                }
            }
        }
        self.gauge.decrement(1.0);
    }
}

impl std::fmt::Debug for Permit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Permit")
            .field("policy", &self.key.policy)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::time::Duration;

    use super::*;
    use crate::subject::PseudonymKey;

    fn policy(name: &str, limit: u32) -> Concurrency {
        Concurrency {
            name: name.into(),
            limit: NonZeroU32::new(limit).unwrap(),
            retry_after: Duration::from_secs(1),
            announce: true,
        }
    }

    fn subject(n: u8) -> Pseudonym {
        PseudonymKey::new(b"k", 1).pseudonym("ip", &[n], "r")
    }

    #[test]
    fn at_most_the_limit_and_a_dropped_permit_frees_its_place() {
        let table = InFlight::new();
        let p = policy("p", 2);
        let a = table
            .try_acquire(&p, &subject(1), &Gauge::noop())
            .expect("first");
        let b = table
            .try_acquire(&p, &subject(1), &Gauge::noop())
            .expect("second");
        assert!(table.try_acquire(&p, &subject(1), &Gauge::noop()).is_none());
        // Another subject and another policy count apart.
        let other = table
            .try_acquire(&p, &subject(2), &Gauge::noop())
            .expect("another subject");
        let q = table
            .try_acquire(&policy("q", 1), &subject(1), &Gauge::noop())
            .expect("another policy");
        assert_eq!(table.count("p", &subject(1)), 2);
        drop(a);
        assert_eq!(table.count("p", &subject(1)), 1);
        let c = table
            .try_acquire(&p, &subject(1), &Gauge::noop())
            .expect("a place was freed");
        drop((b, c, other, q));
        assert!(table.is_empty(), "entries at 0 are removed");
    }

    #[test]
    fn a_lower_limit_after_a_reload_admits_nobody_until_below_it() {
        let table = InFlight::new();
        let held: Vec<Permit> = (0..3)
            .map(|_| {
                table
                    .try_acquire(&policy("p", 3), &subject(1), &Gauge::noop())
                    .unwrap()
            })
            .collect();
        assert!(table
            .try_acquire(&policy("p", 2), &subject(1), &Gauge::noop())
            .is_none());
        drop(held);
        assert!(table
            .try_acquire(&policy("p", 2), &subject(1), &Gauge::noop())
            .is_some());
    }
}
