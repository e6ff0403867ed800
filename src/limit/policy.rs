//! A validated policy: which bands, which revision, and what requests read
//! of them, computed once.
//!
//! Built by `config::validate` from bands already known to be valid
//! (non-zero limits and windows, consistent burst), so the algorithms
//! never check parameters.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::{Algorithm, Bands};

/// A named, validated policy. Shared by reference between routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub name: Arc<str>,
    /// Part of every store key, so a changed policy never reads counters
    /// written under the old parameters. Derived from the parameters unless
    /// written explicitly.
    pub revision: Arc<str>,
    /// Count and report, never block.
    pub shadow: bool,
    /// What happens when the store cannot decide, when the policy says so
    /// rather than leaving it to `store.on_failure`. Not part of the
    /// derived revision: changing it changes no counter's meaning.
    pub on_failure: Option<OnFailure>,
    /// Whether, and how, a sidecar may take a block of a hot subject's
    /// quota at once and spend it without asking the store
    /// (`store::lease`). Not part of the derived revision: leases change
    /// who spends a count, not what it means.
    pub lease: Option<LeaseTerms>,
    /// The share of a band's quota (percent) an admitted request must
    /// have used up to be counted as near the limit
    /// (`sluice_near_limit_total`).
    pub near_limit: u8,
    /// `delay`: a request past the burst waits for its turn instead of a
    /// 429, when the turn comes within `max_wait` (GCRA only; the bands
    /// carry `max_wait` too, for the step).
    pub delay: Option<DelayTerms>,
    /// Whether its answers announce it: `RateLimit-Policy`, `RateLimit`
    /// and `Retry-After` (`headers: off` for a limit against abuse, where
    /// the quota would help the abuser).
    pub announce: bool,
    /// Private with what is derived from it, so the two cannot disagree;
    /// derived once here rather than on every request.
    bands: Bands,
    horizon: Duration,
    max_cost: u32,
    quotas: Box<[(u32, Duration)]>,
    /// A digest of every band's numbers: two policies of one revision
    /// (counts kept across a reload) that may still decide differently.
    numbers: u64,
}

impl Policy {
    pub fn new(
        name: impl Into<Arc<str>>,
        revision: impl Into<Arc<str>>,
        bands: Bands,
        shadow: bool,
    ) -> Policy {
        Policy {
            name: name.into(),
            revision: revision.into(),
            shadow,
            on_failure: None,
            lease: None,
            near_limit: 80,
            delay: None,
            announce: true,
            horizon: bands.horizon(),
            max_cost: bands.max_cost(),
            quotas: bands.quotas().into(),
            numbers: {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::hash::DefaultHasher::new();
                bands.hash(&mut hasher);
                hasher.finish()
            },
            bands,
        }
    }

    /// Equal for two policies with the same bands, numbers included (see
    /// the field); what a cached decision must match to be reused.
    pub fn numbers(&self) -> u64 {
        self.numbers
    }

    /// The policy with its own `on_failure`.
    pub fn with_on_failure(mut self, on_failure: Option<OnFailure>) -> Policy {
        self.on_failure = on_failure;
        self
    }

    /// The policy with its own near-limit share (percent used).
    pub fn with_near_limit(mut self, near_limit: u8) -> Policy {
        self.near_limit = near_limit;
        self
    }

    /// The policy announced in its answers, or not (`headers: off`).
    pub fn with_headers(mut self, announce: bool) -> Policy {
        self.announce = announce;
        self
    }

    /// Whether an admitted `decision` leaves less than the near-limit
    /// share of its binding band unused: more than `near_limit` percent of
    /// the quota is spent.
    pub fn near(&self, decision: &super::Decision) -> bool {
        let Some(&(quota, _)) = self.quotas.get(decision.band) else {
            return false;
        };
        let unused = 100 - u64::from(self.near_limit.min(100));
        u128::from(decision.remaining) * 100 < u128::from(quota) * u128::from(unused)
    }

    /// The policy with a delay: its bands take a turn up to `max_wait`
    /// ahead. `None` (the policy unchanged) for an algorithm other than
    /// GCRA.
    pub fn with_delay(self, delay: DelayTerms) -> Option<Policy> {
        let us = u64::try_from(delay.max_wait.as_micros()).unwrap_or(u64::MAX);
        let bands = self.bands.clone().delayed(us)?;
        // A turn taken ahead is state that must outlive its wait: the
        // horizon (the keys' life) and the numbers follow the new bands.
        let mut delayed = Policy::new(self.name, self.revision, bands, self.shadow);
        delayed.on_failure = self.on_failure;
        delayed.lease = self.lease;
        delayed.near_limit = self.near_limit;
        delayed.announce = self.announce;
        delayed.delay = Some(delay);
        Some(delayed)
    }

    /// The policy with lease terms (`None`: never leased). The caller has
    /// checked [`Policy::lease_refused`].
    pub fn with_lease(mut self, lease: Option<LeaseTerms>) -> Policy {
        self.lease = lease;
        self
    }

    /// Why this policy's bands cannot be leased exactly, if they cannot.
    /// A lease is a charge of more units than the request's, made in the
    /// store at the grant and spent here later; that is exact where a unit
    /// charged now still counts when it is spent:
    ///
    /// - token-bucket: the tokens are taken out of the bucket at the grant;
    /// - gcra: the theoretical arrival time moves on by one emission
    ///   interval per unit at the grant;
    /// - fixed-window, one band: the units are counted in the window of the
    ///   grant, and the lease ends with that window (the store says when:
    ///   the one band's `reset_after`);
    /// - sliding-counter, one band: the same, in the current window: an
    ///   admitted request's count fades one window after its own ends, so
    ///   the window ends `reset_after − window` after the decision. Within
    ///   it the estimate only falls (the previous window's share fades), so
    ///   what the grant fitted still fits when it is spent.
    ///
    /// Of several bands, the store only says when the binding one's window
    /// ends. A sliding log entry is a time, and a unit spent later than its
    /// entry says would be counted as older than it is.
    /// How long after a leased grant, answered `reset_after` from the
    /// store, its units stay counted in the window they were charged in:
    /// the lease ends then at the latest. `None` for an algorithm whose
    /// units count wherever they are spent.
    pub fn lease_window_left(&self, reset_after: Duration) -> Option<Duration> {
        match self.algorithm() {
            Algorithm::FixedWindow => Some(reset_after),
            // `reset_after` is to the end of the next window: the count
            // fades through it.
            Algorithm::SlidingCounter => {
                let window = self.quotas.first().map_or(Duration::ZERO, |q| q.1);
                Some(reset_after.saturating_sub(window))
            }
            Algorithm::TokenBucket | Algorithm::Gcra | Algorithm::SlidingLog => None,
        }
    }

    pub fn lease_refused(&self) -> Option<&'static str> {
        match self.algorithm() {
            Algorithm::TokenBucket | Algorithm::Gcra => None,
            Algorithm::FixedWindow | Algorithm::SlidingCounter if self.bands.len() == 1 => None,
            Algorithm::FixedWindow => Some(
                "a fixed-window policy of several bands is never leased: the store says when only the binding band's window ends",
            ),
            Algorithm::SlidingCounter => Some(
                "a sliding-counter policy of several bands is never leased: the store says when only the binding band's window ends",
            ),
            Algorithm::SlidingLog => Some(
                "sliding-log is never leased: each admitted unit is an entry stamped with its time",
            ),
        }
    }

    /// Its own `on_failure`, else the store's.
    pub fn failure_mode(&self, store: OnFailure) -> OnFailure {
        self.on_failure.unwrap_or(store)
    }

    /// The policy one of `share` sidecars enforces alone while the store
    /// cannot decide: every band's quota divided by `share` (see
    /// [`Bands::shared`]). Same name and revision: its state lives in a
    /// store of its own, never beside the shared counters.
    pub fn shared(&self, share: NonZeroU32) -> Policy {
        Policy::new(
            self.name.clone(),
            self.revision.clone(),
            self.bands.shared(share),
            self.shadow,
        )
        .with_on_failure(self.on_failure)
    }

    pub fn bands(&self) -> &Bands {
        &self.bands
    }

    pub fn algorithm(&self) -> Algorithm {
        self.bands.algorithm()
    }

    /// See [`Bands::horizon`].
    pub fn horizon(&self) -> Duration {
        self.horizon
    }

    /// The largest cost a single request could ever be admitted with.
    pub fn max_cost(&self) -> u32 {
        self.max_cost
    }

    /// See [`Bands::quotas`].
    pub fn quotas(&self) -> &[(u32, Duration)] {
        &self.quotas
    }
}

/// How a policy is leased (`lease:` in the policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerms {
    /// The longest a lease is held before what is left of it goes back.
    pub ttl: Duration,
    /// The most of what the store says is left that one grant may take,
    /// in percent (1 to 100).
    pub max_share: u8,
    /// Chosen by `lease: auto` (the default), not written.
    pub auto: bool,
}

/// What happens to a request when the store cannot decide: the store's
/// `on_failure`, or a policy's own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// 503 with `Retry-After: failure_retry_after` (the default).
    Deny,
    /// Forward without a decision (counted).
    Allow,
    /// Decide in this sidecar's memory, each quota divided by
    /// `local_share`, until the store decides again.
    Local,
}

impl OnFailure {
    pub fn name(self) -> &'static str {
        match self {
            OnFailure::Deny => "deny",
            OnFailure::Allow => "allow",
            OnFailure::Local => "local",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{BucketBand, GcraBand, WindowBand};

    fn n(v: u32) -> NonZeroU32 {
        NonZeroU32::new(v).unwrap()
    }

    fn window(limit: u32) -> WindowBand {
        WindowBand {
            limit: n(limit),
            window: Duration::from_secs(60),
        }
    }

    fn policy(bands: Bands) -> Policy {
        Policy::new("p", "r1", bands, false)
    }

    #[test]
    fn window_quotas_are_divided_rounded_down_and_at_least_one() {
        for bands in [
            Bands::FixedWindow(vec![window(30), window(1000), window(2)]),
            Bands::SlidingCounter(vec![window(30), window(1000), window(2)]),
            Bands::SlidingLog(vec![window(30), window(1000), window(2)]),
        ] {
            let local = policy(bands).shared(n(3));
            let quotas: Vec<u32> = local.quotas().iter().map(|(q, _)| *q).collect();
            assert_eq!(quotas, [10, 333, 1], "{:?}", local.algorithm());
            assert!(local
                .quotas()
                .iter()
                .all(|(_, w)| *w == Duration::from_secs(60)));
            assert_eq!((&*local.name, &*local.revision), ("p", "r1"));
        }
    }

    #[test]
    fn a_share_of_one_changes_nothing() {
        let p = policy(Bands::Gcra(vec![GcraBand {
            limit: n(60),
            window: Duration::from_secs(60),
            burst: n(10),
            max_wait_us: 0,
        }]));
        assert_eq!(p.shared(NonZeroU32::MIN).bands(), p.bands());
    }

    #[test]
    fn a_bucket_divides_capacity_and_rate() {
        let fast = BucketBand {
            capacity: n(100),
            refill_tokens: n(10),
            refill_every: Duration::from_secs(1),
            max_wait_us: 0,
        };
        let slow = BucketBand {
            capacity: n(5),
            refill_tokens: n(1),
            refill_every: Duration::from_secs(10),
            max_wait_us: 0,
        };
        let local = policy(Bands::TokenBucket(vec![fast, slow])).shared(n(3));
        let Bands::TokenBucket(bands) = local.bands() else {
            panic!("still a bucket")
        };
        // Enough tokens per period: divided by tokens.
        assert_eq!(
            bands[0],
            BucketBand {
                capacity: n(33),
                refill_tokens: n(3),
                refill_every: Duration::from_secs(1),
                max_wait_us: 0,
            }
        );
        // One token per period: the period is stretched, so the rate is a
        // third as well (1 per 30 s), not rounded up to the fleet's.
        assert_eq!(
            bands[1],
            BucketBand {
                capacity: n(1),
                refill_tokens: n(1),
                refill_every: Duration::from_secs(30),
                max_wait_us: 0,
            }
        );
    }

    #[test]
    fn gcra_divides_rate_and_burst() {
        let p = policy(Bands::Gcra(vec![GcraBand {
            limit: n(60),
            window: Duration::from_secs(60),
            burst: n(2),
            max_wait_us: 0,
        }]));
        let Bands::Gcra(bands) = p.shared(n(4)).bands().clone() else {
            panic!("still gcra")
        };
        assert_eq!(bands[0].limit, n(15));
        assert_eq!(bands[0].burst, n(1));
        assert_eq!(bands[0].window, Duration::from_secs(60));
    }

    #[test]
    fn a_policy_override_wins_over_the_store() {
        let p = policy(Bands::FixedWindow(vec![window(30)]));
        assert_eq!(p.failure_mode(OnFailure::Deny), OnFailure::Deny);
        let p = p.with_on_failure(Some(OnFailure::Local));
        assert_eq!(p.failure_mode(OnFailure::Deny), OnFailure::Local);
        assert_eq!(p.failure_mode(OnFailure::Allow), OnFailure::Local);
        // The local copy keeps it.
        assert_eq!(p.shared(n(3)).on_failure, Some(OnFailure::Local));
    }
}

/// `delay: { max_wait, max_queued }` of a GCRA policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelayTerms {
    /// The longest a request is held for its turn.
    pub max_wait: Duration,
    /// The most requests of one route's limit waiting at once in this
    /// sidecar; past it, 429 (and the turn is given back).
    pub max_queued: u32,
}
