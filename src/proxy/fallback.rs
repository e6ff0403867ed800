//! `on_failure: local`: while the shared store cannot decide, this sidecar
//! decides alone, in memory, each quota divided by `store.local_share`
//! (the local fallback limiter).
//!
//! The fallback is entered by the first request of a `local` policy the
//! store could not decide, and left at the first decision the store makes
//! again (after an outage, the breaker's probe), whatever its policy. Its
//! state lives in a [`MemoryStore`] of its own, bounded like the embedded
//! store, and outlives the outage: what was granted alone is remembered
//! until it would have expired in one long outage (the policy's horizon
//! after the subject's last local admission), so a subject is granted its
//! local quota once per window however many times the store comes and
//! goes. The counts are never mixed with the store's: back on the store,
//! the store decides from its own; alone again, from these.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use http::HeaderValue;
use metrics::{Counter, Gauge};
use smallvec::SmallVec;

use super::log_budget::LogBudget;
use super::respond;
use crate::limit::{Incompatible, Outcome, Policy};
use crate::store::memory::MemoryStore;
use crate::store::memory_bound::Bound as MemoryBound;
use crate::store::{Evaluation, Outcomes};
use crate::sync;
use crate::telemetry::{STORE_FALLBACK, STORE_FALLBACKS, STORE_FALLBACK_SECONDS};

/// More distinct (policy, share) pairs than any configuration has; past
/// it (reload after reload during one outage) the list starts over.
const MAX_POLICIES: usize = 1024;

/// The local policies of a request's limits, in their order.
pub type Locals = SmallVec<[Arc<LocalPolicy>; 2]>;

/// A policy as this sidecar enforces it alone.
#[derive(Debug)]
pub struct LocalPolicy {
    pub policy: Policy,
    /// `RateLimit-Policy` with the local quotas, for local 429s.
    pub field: HeaderValue,
}

pub struct Fallback {
    store: MemoryStore,
    /// Read on every decision; the transitions themselves happen under
    /// `times`, so entering and leaving never interleave.
    active: AtomicBool,
    times: Mutex<Times>,
    /// Built on first use in an outage, dropped with the state.
    policies: Mutex<Vec<Shared>>,
    metrics: FallbackMetrics,
    /// A store failing one call in a hundred enters and leaves the
    /// fallback that often: a few lines a second say so, the counters say
    /// how much.
    log_budget: LogBudget,
}

#[derive(Default)]
struct Times {
    /// When the current fallback began.
    since: Option<Instant>,
    /// Time spent in earlier fallbacks.
    spent: Duration,
}

struct Shared {
    /// Held, so its address cannot be reused by another policy.
    of: Arc<Policy>,
    share: NonZeroU32,
    local: Arc<LocalPolicy>,
}

struct FallbackMetrics {
    active: Gauge,
    seconds: Counter,
    entered: Counter,
}

impl Fallback {
    pub fn new(max_entries: usize, grace: Duration) -> Fallback {
        Fallback {
            store: MemoryStore::new(max_entries, grace),
            active: AtomicBool::new(false),
            times: Mutex::new(Times::default()),
            policies: Mutex::new(Vec::new()),
            metrics: FallbackMetrics {
                active: metrics::gauge!(STORE_FALLBACK),
                seconds: metrics::counter!(STORE_FALLBACK_SECONDS),
                entered: metrics::counter!(STORE_FALLBACKS),
            },
            log_budget: LogBudget::default(),
        }
    }

    /// Bounded as the embedded store would be (a process with a shared
    /// store holds no other per-subject state of that size), with the
    /// default `ttl_grace`.
    pub fn for_sidecar() -> Fallback {
        Fallback::new(MemoryBound::resolve(None).entries(), Duration::from_secs(5))
    }

    /// Whether requests are being decided here rather than by the store.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Decides `evaluation` alone, its policy divided by `share`; enters
    /// the fallback if this is the first such decision.
    pub fn evaluate(
        &self,
        evaluation: &Evaluation<'_>,
        policy: &Arc<Policy>,
        share: NonZeroU32,
    ) -> (Outcome, Arc<LocalPolicy>) {
        self.enter();
        let local = self.local(policy, share);
        if evaluation.cost > local.policy.max_cost() {
            return (Outcome::Incompatible(Incompatible::CostAboveMaximum), local);
        }
        let outcome = self.store.evaluate(&Evaluation {
            policy: &local.policy,
            ..*evaluation
        });
        (outcome, local)
    }

    /// Decides a request's several limits alone, together, each policy
    /// divided by `share`: all are admitted and charged, or the first that
    /// blocks answers ([`Outcomes`]: up to and including it) and none is
    /// charged, as the store would (a request refused by one limit
    /// consumes nothing of any). Enters the fallback.
    pub fn evaluate_all(
        &self,
        limits: &[(&Evaluation<'_>, &Arc<Policy>)],
        share: NonZeroU32,
    ) -> (Outcomes, Locals) {
        self.enter();
        let locals: Locals = limits.iter().map(|(_, p)| self.local(p, share)).collect();
        // A cost no local quota admits blocks before anything is charged;
        // the limits before it are only read, to find which blocks first.
        let too_costly = limits
            .iter()
            .zip(&locals)
            .any(|((e, _), l)| e.cost > l.policy.max_cost());
        if too_costly {
            let outcomes = self.peek_locals(limits, &locals);
            return (outcomes, locals);
        }
        let outcomes = {
            let evaluations: SmallVec<[Evaluation<'_>; 2]> = limits
                .iter()
                .zip(&locals)
                .map(|((e, _), l)| Evaluation {
                    policy: &l.policy,
                    ..**e
                })
                .collect();
            self.store.evaluate_all(&evaluations)
        };
        (outcomes, locals)
    }

    /// What [`Fallback::evaluate_all`] would answer now, charging nothing
    /// and entering nothing: for a request another limit refuses anyway,
    /// to find whether a local one before it refuses first.
    pub fn peek_all(
        &self,
        limits: &[(&Evaluation<'_>, &Arc<Policy>)],
        share: NonZeroU32,
    ) -> (Outcomes, Locals) {
        let locals: Locals = limits.iter().map(|(_, p)| self.local(p, share)).collect();
        let outcomes = self.peek_locals(limits, &locals);
        (outcomes, locals)
    }

    /// Each limit read in order, up to and including the first that
    /// blocks.
    fn peek_locals(&self, limits: &[(&Evaluation<'_>, &Arc<Policy>)], locals: &Locals) -> Outcomes {
        let mut outcomes = Outcomes::empty();
        for ((evaluation, _), local) in limits.iter().zip(locals) {
            let outcome = if evaluation.cost > local.policy.max_cost() {
                Outcome::Incompatible(Incompatible::CostAboveMaximum)
            } else {
                self.store.peek(&Evaluation {
                    policy: &local.policy,
                    ..**evaluation
                })
            };
            outcomes.list.push(outcome);
            if outcome.blocks(local.policy.shadow) {
                break;
            }
        }
        outcomes
    }

    /// What [`Fallback::evaluate`] would answer now, charging nothing and
    /// entering nothing (for `POST /explain`).
    pub fn peek(
        &self,
        evaluation: &Evaluation<'_>,
        policy: &Arc<Policy>,
        share: NonZeroU32,
    ) -> (Outcome, Arc<LocalPolicy>) {
        let local = self.local(policy, share);
        if evaluation.cost > local.policy.max_cost() {
            return (Outcome::Incompatible(Incompatible::CostAboveMaximum), local);
        }
        let outcome = self.store.peek(&Evaluation {
            policy: &local.policy,
            ..*evaluation
        });
        (outcome, local)
    }

    /// The store decided: back on it. What was counted alone is kept for
    /// the next outage (it expires as it would have in one long outage):
    /// dropping it would hand every subject its local quota afresh each
    /// time the store blinks. One atomic load when there is no fallback to
    /// leave.
    pub fn store_decided(&self) {
        if !self.active() {
            return;
        }
        let mut times = lock(&self.times);
        if !self.active() {
            return;
        }
        self.active.store(false, Ordering::Release);
        let lasted = times.since.take().map(|s| s.elapsed()).unwrap_or_default();
        times.spent += lasted;
        // The local policies are made again from whatever is configured
        // then; they keep their names and revisions, so the counts still
        // apply.
        lock(&self.policies).clear();
        self.metrics.active.set(0.0);
        if !self.log_budget.take(Instant::now()) {
            return;
        }
        tracing::info!(
            lasted_ms = u64::try_from(lasted.as_millis()).unwrap_or(u64::MAX),
            subjects_remembered = self.store.len(),
            "the store decides again: local fallback left, its counts kept for their windows"
        );
    }

    /// Starts deciding alone, if not already: a request of a `local` policy
    /// the store could not decide.
    pub fn enter(&self) {
        if self.active() {
            return;
        }
        let mut times = lock(&self.times);
        if self.active() {
            return;
        }
        times.since = Some(Instant::now());
        self.active.store(true, Ordering::Release);
        self.metrics.active.set(1.0);
        self.metrics.entered.increment(1);
        if !self.log_budget.take(Instant::now()) {
            return;
        }
        tracing::warn!(
            "the store cannot decide: deciding locally, each quota divided by store.local_share"
        );
    }

    fn local(&self, policy: &Arc<Policy>, share: NonZeroU32) -> Arc<LocalPolicy> {
        let mut list = lock(&self.policies);
        if let Some(found) = list
            .iter()
            .find(|s| Arc::ptr_eq(&s.of, policy) && s.share == share)
        {
            return found.local.clone();
        }
        if list.len() >= MAX_POLICIES {
            list.clear();
        }
        let shared = policy.shared(share);
        let local = Arc::new(LocalPolicy {
            field: respond::policy_field(&shared),
            policy: shared,
        });
        list.push(Shared {
            of: policy.clone(),
            share,
            local: local.clone(),
        });
        local
    }

    /// Drops expired local state and brings the time-in-fallback counter
    /// up to date; called once a second.
    pub fn tick(&self) {
        self.store.sweep();
        let times = lock(&self.times);
        let current = times.since.map(|s| s.elapsed()).unwrap_or_default();
        self.metrics
            .seconds
            .absolute((times.spent + current).as_secs());
    }

    /// Subjects whose local counts are held (decided alone in this
    /// outage or an earlier one whose counts have not expired).
    pub fn subjects(&self) -> usize {
        self.store.len()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its data whole: poison means nothing.
    sync::lock(m)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;
    use crate::limit::{Bands, WindowBand};
    use crate::store::EvaluationId;
    use crate::subject::PseudonymKey;

    fn policy(limit: u32) -> Arc<Policy> {
        Arc::new(Policy::new(
            "p",
            "r1",
            Bands::FixedWindow(vec![WindowBand {
                limit: NonZeroU32::new(limit).unwrap(),
                window: Duration::from_secs(24 * 3600),
            }]),
            false,
        ))
    }

    fn admitted(fallback: &Fallback, policy: &Arc<Policy>, share: u32, n: usize) -> usize {
        let subject = PseudonymKey::new(b"k", 1).pseudonym("ip", b"10.0.0.1", "r");
        let evaluation = Evaluation {
            policy,
            subject: &subject,
            cost: 1,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(0),
            settle_within: None,
        };
        let share = NonZeroU32::new(share).unwrap();
        (0..n)
            .filter(|_| {
                matches!(
                    fallback.evaluate(&evaluation, policy, share).0,
                    Outcome::Allowed(_)
                )
            })
            .count()
    }

    #[test]
    fn what_was_granted_alone_is_remembered_across_outages() {
        let fallback = Fallback::new(1000, Duration::ZERO);
        let p = policy(30);
        assert!(!fallback.active());
        assert_eq!(admitted(&fallback, &p, 3, 15), 10);
        assert!(fallback.active());
        assert_eq!(fallback.subjects(), 1);

        fallback.store_decided();
        assert!(!fallback.active());
        assert_eq!(fallback.subjects(), 1, "the local counts are kept");
        // The next outage in the same window grants nothing more...
        assert_eq!(admitted(&fallback, &p, 3, 15), 0);
        assert!(fallback.active());
        fallback.store_decided();
        // ...and under another share, what it allows beyond the 10 granted.
        assert_eq!(admitted(&fallback, &p, 2, 20), 5);
    }

    fn named(name: &str, limit: u32) -> Arc<Policy> {
        Arc::new(Policy::new(
            name,
            "r1",
            Bands::FixedWindow(vec![WindowBand {
                limit: NonZeroU32::new(limit).unwrap(),
                window: Duration::from_secs(24 * 3600),
            }]),
            false,
        ))
    }

    /// A request of `client` against a route-wide limit, then a per-client
    /// one, decided alone (`charge`) or read: the index of the limit that
    /// blocked, if one did.
    fn request(
        fallback: &Fallback,
        [global, per_client]: [&Arc<Policy>; 2],
        client: &[u8],
        cost: u32,
        charge: bool,
    ) -> Option<usize> {
        let key = PseudonymKey::new(b"k", 1);
        let everyone = key.pseudonym("global", b"", "r");
        let subject = key.pseudonym("ip", client, "r");
        let first = Evaluation {
            policy: global,
            subject: &everyone,
            cost,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(0),
            settle_within: None,
        };
        let second = Evaluation {
            policy: per_client,
            subject: &subject,
            ..first
        };
        let limits = [(&first, global), (&second, per_client)];
        let share = NonZeroU32::MIN;
        let (outcomes, locals) = if charge {
            fallback.evaluate_all(&limits, share)
        } else {
            fallback.peek_all(&limits, share)
        };
        assert_eq!(locals.len(), 2);
        let blocked = outcomes.iter().find(|(_, o)| o.blocks(false));
        blocked.map(|(at, _)| at)
    }

    #[test]
    fn a_request_one_local_limit_refuses_charges_none_of_the_others() {
        let fallback = Fallback::new(1000, Duration::ZERO);
        let (global, per_client) = (named("everyone", 3), named("per_ip", 2));
        let limits = [&global, &per_client];
        // Client A: two admitted; the third passes the route-wide limit
        // and is refused by its own, which must leave the first untouched.
        let a: Vec<_> = (0..3)
            .map(|_| request(&fallback, limits, b"10.0.0.1", 1, true))
            .collect();
        assert_eq!(a, [None, None, Some(1)]);
        assert!(fallback.active());
        // So client B still finds one place of three, and then none.
        assert_eq!(request(&fallback, limits, b"10.0.0.2", 1, true), None);
        assert_eq!(request(&fallback, limits, b"10.0.0.2", 1, true), Some(0));
    }

    #[test]
    fn reading_several_local_limits_charges_nothing() {
        let fallback = Fallback::new(1000, Duration::ZERO);
        let (global, per_client) = (named("everyone", 1), named("per_ip", 1));
        let limits = [&global, &per_client];
        for _ in 0..3 {
            assert_eq!(request(&fallback, limits, b"10.0.0.1", 1, false), None);
        }
        assert!(!fallback.active(), "reading enters nothing");
        assert_eq!(request(&fallback, limits, b"10.0.0.1", 1, true), None);
        assert_eq!(request(&fallback, limits, b"10.0.0.1", 1, false), Some(0));
    }

    #[test]
    fn a_cost_no_local_quota_admits_charges_nothing_of_the_limits_before_it() {
        let fallback = Fallback::new(1000, Duration::ZERO);
        let (global, per_client) = (named("everyone", 5), named("per_ip", 2));
        let limits = [&global, &per_client];
        // Cost 3: the route-wide limit would admit it, the per-client one
        // never can.
        assert_eq!(request(&fallback, limits, b"10.0.0.1", 3, true), Some(1));
        let key = PseudonymKey::new(b"k", 1);
        let everyone = key.pseudonym("global", b"", "r");
        let evaluation = Evaluation {
            policy: &global,
            subject: &everyone,
            cost: 5,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(0),
            settle_within: None,
        };
        let (outcome, _) = fallback.evaluate(&evaluation, &global, NonZeroU32::MIN);
        assert!(matches!(outcome, Outcome::Allowed(_)), "all 5 still there");
    }

    #[test]
    fn the_local_429_announces_the_local_quota() {
        let fallback = Fallback::new(1000, Duration::ZERO);
        let p = policy(30);
        let subject = PseudonymKey::new(b"k", 1).pseudonym("ip", b"10.0.0.1", "r");
        let evaluation = Evaluation {
            policy: &p,
            subject: &subject,
            cost: 1,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(0),
            settle_within: None,
        };
        let (_, local) = fallback.evaluate(&evaluation, &p, NonZeroU32::new(3).unwrap());
        assert_eq!(local.field, "\"p\";q=10;w=86400");
    }
}
