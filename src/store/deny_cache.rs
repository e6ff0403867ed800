//! The local over-limit cache: once the shared store says a subject is
//! denied until T, this sidecar denies that subject locally until T without
//! asking the store again.
//!
//! Exact for every algorithm: a denial's `retry_after` is the earliest
//! instant the request could pass, and nothing but time can make room
//! (other sidecars can only consume more). The entry remembers the cost it
//! was denied at; a cheaper request is asked of the store. The deadline is
//! taken from the request's arrival, before the store was asked, so it can
//! only end early, never late.
//!
//! Leases break the premise: units another sidecar holds come back when
//! its lease ends. Under a leased policy a denial is remembered for at most
//! the lease's `ttl` and the time its return takes; its `Retry-After` is
//! still the store's.
//!
//! Reservations break it too: a limit charged on response reserves its
//! units before forwarding and gives back those the app's answer does not
//! charge, on any sidecar. A denial of a reservation is remembered for at
//! most [`RESERVED_RECHECK`]: a refund elsewhere is seen that late at most,
//! and a refused subject still asks the store no more than once a second.
//!
//! Bounded in entries; when full, the entry closest to expiry is evicted
//! (it would have been asked of the store again soonest anyway). The cache
//! never answers "allowed".
//!
//! A subject answered here is one whose key Redis no longer sees used:
//! under a `maxmemory-policy` by recency (`volatile-lru`), a flood of
//! other keys would make it the first evicted, and another sidecar would
//! hand the subject a fresh window. So a hit says when the subject's key
//! is due a `TOUCH` ([`Hit::touch`]): at most once per [`TOUCH_EVERY`] per
//! entry, whatever the subject's rate.

use std::time::Duration;

use tokio::time::Instant;

use crate::limit::{Decision, Policy};
use crate::subject::Pseudonym;
use crate::telemetry::DENY_CACHE_HITS;

use super::shards::{Shards, SubjectKey, SHARDS};

/// How long after a lease ends its units are back in the store at most
/// (the lease upkeep's period, and a call).
const LEASE_RETURNED: Duration = Duration::from_millis(100);

/// The longest a denial of a reservation is remembered.
pub const RESERVED_RECHECK: Duration = Duration::from_secs(1);

/// The longest a denied subject's key goes unseen by Redis while the
/// cache answers for it: a quarter of Redis's LRU clock (one second), so
/// the key reads, to eviction, as young as a key written a second ago
/// whenever Redis samples it. Once a second was not enough: Redis's
/// eviction pool keeps the idle time a key had when it was sampled, and a
/// key sampled just before its touch (idle 2 on the one-second clock) was
/// evicted among a flood's keys in one run of the eviction test.
pub const TOUCH_EVERY: Duration = Duration::from_millis(250);

/// A local denial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hit {
    pub decision: Decision,
    /// The subject's key is due a `TOUCH` (none was asked for it in the
    /// last [`TOUCH_EVERY`]).
    pub touch: bool,
}

#[derive(Clone, Copy)]
struct Entry {
    until: Instant,
    /// When the store is asked again however long the denial lasts: under
    /// a leased policy, units held by other sidecars come back within a
    /// lease's life, and room with them.
    recheck: Instant,
    cost: u32,
    /// The denying policy's [`Policy::numbers`]: a reload that raises a
    /// limit keeps the revision (and the counts), and a denial under the
    /// old numbers says nothing under the new ones.
    numbers: u64,
    decision: Decision,
    /// When the store last saw the subject's key: its denial, or the last
    /// `TOUCH` asked for it.
    touched: Instant,
}

pub struct DenyCache {
    shards: Shards<Entry>,
    per_shard: usize,
    hits: metrics::Counter,
}

impl DenyCache {
    /// `capacity` entries in all (at least one per shard).
    pub fn new(capacity: usize) -> DenyCache {
        DenyCache {
            shards: Shards::default(),
            per_shard: capacity.div_ceil(SHARDS).max(1),
            hits: metrics::counter!(DENY_CACHE_HITS),
        }
    }

    /// A local denial for this subject at `now`, if the store already said
    /// so for at least this cost.
    pub fn check(
        &self,
        policy: &Policy,
        subject: &Pseudonym,
        cost: u32,
        now: Instant,
    ) -> Option<Hit> {
        let key = SubjectKey::new(policy, subject);
        let mut shard = self.shards.lock(&key);
        let found = shard.get_mut(&key)?;
        if found.recheck <= now || found.numbers != policy.numbers() {
            shard.remove(&key);
            return None;
        }
        if cost < found.cost {
            return None;
        }
        let touch = now.saturating_duration_since(found.touched) >= TOUCH_EVERY;
        if touch {
            found.touched = now;
        }
        let entry = *found;
        drop(shard);
        self.hits.increment(1);
        let left = entry.until - now;
        let decision = Decision {
            retry_after: left,
            reset_after: entry
                .decision
                .reset_after
                .saturating_sub(entry.decision.retry_after)
                + left,
            ..entry.decision
        };
        Some(Hit { decision, touch })
    }

    /// Forgets a denial of `subject` under `policy`: units were given back
    /// here, and the store may admit it again.
    pub fn forget(&self, policy: &Policy, subject: &Pseudonym) {
        let key = SubjectKey::new(policy, subject);
        self.shards.lock(&key).remove(&key);
    }

    /// Records a store denial of a request that arrived at `arrival`.
    pub fn remember(
        &self,
        policy: &Policy,
        subject: &Pseudonym,
        cost: u32,
        arrival: Instant,
        decision: &Decision,
    ) {
        self.remember_denial(policy, subject, cost, arrival, decision, false);
    }

    /// [`DenyCache::remember`]; `reserved`: the denied request reserved
    /// its units, to be settled on response.
    pub fn remember_denial(
        &self,
        policy: &Policy,
        subject: &Pseudonym,
        cost: u32,
        arrival: Instant,
        decision: &Decision,
        reserved: bool,
    ) {
        if decision.allowed || decision.retry_after == Duration::ZERO {
            return;
        }
        let key = SubjectKey::new(policy, subject);
        let until = arrival + decision.retry_after;
        let mut recheck = match policy.lease {
            Some(lease) => until.min(arrival + lease.ttl + LEASE_RETURNED),
            None => until,
        };
        if reserved {
            recheck = recheck.min(arrival + RESERVED_RECHECK);
        }
        let mut shard = self.shards.lock(&key);
        if shard.len() >= self.per_shard && !shard.contains_key(&key) {
            let now = Instant::now();
            shard.retain(|_, e| e.recheck > now);
            if shard.len() >= self.per_shard {
                // Evict the entry closest to expiry.
                if let Some(soonest) = shard
                    .iter()
                    .min_by_key(|(_, e)| e.recheck)
                    .map(|(k, _)| k.clone())
                {
                    shard.remove(&soonest);
                }
            }
        }
        shard.insert(
            key,
            Entry {
                until,
                recheck,
                cost,
                numbers: policy.numbers(),
                decision: *decision,
                touched: arrival,
            },
        );
    }

    pub fn len(&self) -> usize {
        self.shards.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Bands, WindowBand};
    use crate::subject::PseudonymKey;
    use std::num::NonZeroU32;

    fn policy() -> Policy {
        limited(1)
    }

    fn limited(limit: u32) -> Policy {
        Policy::new(
            "p",
            "r1",
            Bands::FixedWindow(vec![WindowBand {
                limit: NonZeroU32::new(limit).unwrap(),
                window: Duration::from_secs(10),
            }]),
            false,
        )
    }

    fn denied(retry: Duration) -> Decision {
        Decision {
            allowed: false,
            band: 0,
            remaining: 0,
            reset_after: retry,
            retry_after: retry,
            approximate: false,
        }
    }

    fn subject(s: &str) -> Pseudonym {
        PseudonymKey::new(b"k", 1).pseudonym("ip", s.as_bytes(), "r")
    }

    #[test]
    fn a_denied_reservation_is_asked_again_within_a_second_or_once_given_back_here() {
        let cache = DenyCache::new(100);
        let (p, s) = (policy(), subject("a"));
        let t0 = Instant::now();
        let hour = denied(Duration::from_secs(3600));
        cache.remember_denial(&p, &s, 1, t0, &hour, true);
        assert!(cache
            .check(&p, &s, 1, t0 + Duration::from_millis(900))
            .is_some());
        // Units given back on another sidecar are seen a second later.
        assert!(cache.check(&p, &s, 1, t0 + RESERVED_RECHECK).is_none());
        // Given back here: at once.
        cache.remember_denial(&p, &s, 1, t0, &hour, true);
        cache.forget(&p, &s);
        assert!(cache.check(&p, &s, 1, t0).is_none());
    }

    #[test]
    fn denies_until_the_recorded_instant_and_not_after() {
        let cache = DenyCache::new(100);
        let (p, s) = (policy(), subject("a"));
        let t0 = Instant::now();
        cache.remember(&p, &s, 1, t0, &denied(Duration::from_secs(2)));
        let d = cache
            .check(&p, &s, 1, t0 + Duration::from_millis(500))
            .expect("denied locally")
            .decision;
        assert!(!d.allowed);
        assert_eq!(d.retry_after, Duration::from_millis(1500));
        assert!(cache
            .check(&p, &s, 1, t0 + Duration::from_secs(2))
            .is_none());
        assert!(cache.is_empty(), "an expired entry is dropped when seen");
    }

    #[test]
    fn under_a_leased_policy_a_denial_is_asked_again_once_leases_are_back() {
        let cache = DenyCache::new(100);
        let p = policy().with_lease(Some(crate::limit::LeaseTerms {
            ttl: Duration::from_millis(200),
            max_share: 10,
            auto: false,
        }));
        let s = subject("a");
        let t0 = Instant::now();
        cache.remember(&p, &s, 1, t0, &denied(Duration::from_secs(3600)));
        // Within the lease's life and its return: denied here, with the
        // store's Retry-After.
        let d = cache
            .check(&p, &s, 1, t0 + Duration::from_millis(299))
            .expect("denied locally")
            .decision;
        assert_eq!(
            d.retry_after,
            Duration::from_secs(3600) - Duration::from_millis(299)
        );
        assert!(cache
            .check(&p, &s, 1, t0 + Duration::from_millis(300))
            .is_none());
    }

    #[test]
    fn a_cheaper_request_or_another_subject_asks_the_store() {
        let cache = DenyCache::new(100);
        let p = policy();
        let t0 = Instant::now();
        cache.remember(&p, &subject("a"), 3, t0, &denied(Duration::from_secs(5)));
        assert!(cache.check(&p, &subject("a"), 1, t0).is_none());
        assert!(cache.check(&p, &subject("a"), 3, t0).is_some());
        assert!(cache.check(&p, &subject("b"), 3, t0).is_none());
        let mut changed = policy();
        changed.revision = "r2".into();
        assert!(
            cache.check(&changed, &subject("a"), 3, t0).is_none(),
            "a new revision starts over"
        );
        assert!(
            cache.check(&limited(2), &subject("a"), 3, t0).is_none(),
            "a raised limit under the same revision asks the store"
        );
        assert!(
            cache.check(&p, &subject("a"), 3, t0).is_none(),
            "the entry of the old numbers is gone"
        );
    }

    #[test]
    fn a_hit_asks_for_a_touch_at_most_once_a_period() {
        let cache = DenyCache::new(100);
        let (p, s) = (policy(), subject("a"));
        let t0 = Instant::now();
        cache.remember(&p, &s, 1, t0, &denied(Duration::from_secs(60)));
        let touches = |from: Duration, to: Duration| {
            let mut at = from;
            let mut n = 0;
            while at < to {
                n += u32::from(cache.check(&p, &s, 1, t0 + at).expect("denied").touch);
                at += Duration::from_millis(10);
            }
            n
        };
        // The denial itself was the store seeing the key.
        assert_eq!(touches(Duration::ZERO, TOUCH_EVERY), 0);
        // Then one a period, however many hits: 100 a second here.
        assert_eq!(touches(TOUCH_EVERY, TOUCH_EVERY * 5), 4);
    }

    #[test]
    fn allowed_decisions_are_never_cached() {
        let cache = DenyCache::new(100);
        let mut d = denied(Duration::from_secs(5));
        d.allowed = true;
        cache.remember(&policy(), &subject("a"), 1, Instant::now(), &d);
        assert!(cache.is_empty());
    }

    #[test]
    fn full_shards_evict_the_entry_closest_to_expiry() {
        let cache = DenyCache::new(SHARDS); // one entry per shard
        let p = policy();
        let t0 = Instant::now();
        // Find two subjects in the same shard.
        let first = subject("s0");
        let shard_of = |s: &Pseudonym| cache.shards.index(&SubjectKey::new(&p, s));
        let second = (1..10_000)
            .map(|i| subject(&format!("s{i}")))
            .find(|s| shard_of(s) == shard_of(&first))
            .expect("some subject shares a shard");
        cache.remember(&p, &first, 1, t0, &denied(Duration::from_secs(60)));
        cache.remember(&p, &second, 1, t0, &denied(Duration::from_secs(30)));
        assert!(cache.check(&p, &second, 1, t0).is_some());
        assert!(
            cache.check(&p, &first, 1, t0).is_none(),
            "the sooner-expiring entry was evicted"
        );
        assert_eq!(cache.len(), 1);
    }
}
