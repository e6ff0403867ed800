//! Where limiter state lives. One `evaluate` per limit, ending in exactly
//! one [`Outcome`], whatever the store; `evaluate_all` for every rate limit
//! of a request at once. `in_flight` counts what concurrency policies
//! limit, always in this process.

pub mod breaker;
pub mod deny_cache;
pub mod in_flight;
pub mod lag;
pub mod lease;
pub mod memory;
pub mod memory_bound;
pub mod redis;
mod shards;
mod spread;

use std::cell::Cell;
use std::fmt;
use std::future::Future;

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::limit::{Micros, Outcome, Policy};
use crate::subject::Pseudonym;

/// A server-generated id per evaluation (128 bits), never reused: the
/// Redis store's first send of an evaluation says so, and its script does
/// not look for a record a fresh id cannot have. An ambiguous store call is
/// retried with the same id, as a re-send; the Redis scripts then return the
/// recorded admission instead of charging twice.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EvaluationId(pub u128);

thread_local! {
    /// The next id this thread gives: a random start, then one after
    /// another.
    static NEXT_ID: Cell<u128> = Cell::new(rand::random());
}

impl EvaluationId {
    /// A fresh id. Each thread counts up from a random 128-bit start: two
    /// threads (of this sidecar or any other sharing the store) give the
    /// same id only if their starts fall within the ids they give of each
    /// other, which for 2^40 ids each is one chance in 2^87, the odds of two
    /// random ids meeting. Ids only ever go to the store, and what an id
    /// must be is unique, not secret: counting spares every evaluation a
    /// draw of the random generator (its cipher's block refilled every few
    /// ids).
    pub fn fresh() -> EvaluationId {
        NEXT_ID.with(|next| {
            let id = next.get();
            next.set(id.wrapping_add(1));
            EvaluationId(id)
        })
    }
}

impl fmt::Display for EvaluationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for EvaluationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EvaluationId({self})")
    }
}

/// One request's question to a store.
#[derive(Debug, Clone, Copy)]
pub struct Evaluation<'a> {
    pub policy: &'a Policy,
    pub subject: &'a Pseudonym,
    /// 1..=policy max cost (validated with the route).
    pub cost: u32,
    /// arrival + `store.budget`: the whole decision happens before it.
    pub deadline: Instant,
    pub id: EvaluationId,
    /// A reservation, settled once the app has answered (a limit charged
    /// on response), within this long: the store keeps what it needs to
    /// give the charge back (on Redis, the evaluation's record) that long.
    /// `None`: a charge that stands.
    pub settle_within: Option<std::time::Duration>,
}

/// The outcomes of one request's limits. One is held inline, which keeps
/// [`Outcomes`] small enough to be moved without a call to `memcpy` (it is
/// returned through every layer of a decision); a route of several limits
/// takes an allocation.
pub type OutcomeList = SmallVec<[Outcome; 1]>;

// Moved inline only below 128 bytes (measured: a call to `memcpy` for each
// move of the 168 bytes it had with two outcomes inline).
const _: () = assert!(std::mem::size_of::<Outcomes>() < 128);

/// What [`Store::evaluate_all`] found: the outcomes of `evaluations[first..]`,
/// in order, up to and including the first that blocks
/// ([`Outcome::blocks`]); the ones after it were not asked. `first` is 0
/// unless a later limit was known to block before any was asked (an
/// over-limit cache, a cost no policy admits, a store that cannot be
/// reached): the outcome is then that limit's alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcomes {
    pub first: usize,
    pub list: OutcomeList,
    /// [`Source::Store`] when the store itself was asked (by any of the
    /// limits), rather than the over-limit cache answering alone.
    pub source: Source,
    /// The memory store's time of decision, which giving back a
    /// reservation needs (0 from Redis, where the evaluation's record
    /// keeps it).
    pub at: Micros,
}

impl Outcomes {
    /// `outcome`, for `evaluations[at]`, from the store.
    pub fn at(at: usize, outcome: Outcome) -> Outcomes {
        Outcomes {
            first: at,
            list: smallvec::smallvec![outcome],
            source: Source::Store,
            at: 0,
        }
    }

    /// None yet, for `evaluations[0..]`, from the store.
    pub fn empty() -> Outcomes {
        Outcomes {
            first: 0,
            list: SmallVec::new(),
            source: Source::Store,
            at: 0,
        }
    }

    /// Each outcome with the index of its evaluation.
    pub fn iter(&self) -> impl Iterator<Item = (usize, Outcome)> + '_ {
        self.list
            .iter()
            .enumerate()
            .map(|(i, o)| (self.first + i, *o))
    }
}

/// A request's rate limits decided at once ([`Store::decide_now`]), or the
/// Redis call that decides them.
pub enum Decided<'s> {
    Now(Outcomes),
    Ask(Asking<'s>),
}

/// The Redis call of [`Decided::Ask`], with what the leases held here
/// said of each limit.
pub struct Asking<'s> {
    store: &'s redis::RedisStore,
    cache: Option<&'s deny_cache::DenyCache>,
    befores: Option<redis::Befores>,
    /// When the over-limit cache was found to remember no denial of any
    /// limit (it is not asked again).
    remembers_none: Option<Instant>,
}

impl<'s> Asking<'s> {
    /// The outcomes of `evaluations`, those given to
    /// [`Store::decide_now`]. Not boxed: a Redis call's future is several
    /// KB, for the caller to box with whatever else it awaits.
    pub fn ask<'a>(
        &'a self,
        evaluations: &'a [Evaluation<'_>],
    ) -> impl Future<Output = Outcomes> + Send + 'a {
        let befores = self.befores.as_deref();
        let asked = redis::Asked {
            befores,
            remembers_none: self.remembers_none,
        };
        self.store.decide_all(evaluations, self.cache, asked)
    }
}

/// The configured store. An enum rather than a trait object: two variants,
/// async methods, no boxing on the hot path.
pub enum Store {
    Memory(memory::MemoryStore),
    /// Redis, with this sidecar's local over-limit cache in front (`None`
    /// when `deny_cache_entries: 0`). The memory store needs no such cache:
    /// asking it costs what asking the cache would.
    Redis(redis::RedisStore, Option<deny_cache::DenyCache>),
}

/// Who gave an outcome: the store, or this sidecar's over-limit cache in
/// front of it. A remembered denial says nothing about whether the store
/// decides right now, which the local fallback needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Store,
    DenyCache,
    /// Every limit was spent from a lease this sidecar holds.
    Lease,
}

impl Store {
    pub async fn evaluate(&self, evaluation: &Evaluation<'_>) -> Outcome {
        self.evaluate_sourced(evaluation).await.0
    }

    /// [`Store::evaluate`], saying where the outcome came from.
    pub async fn evaluate_sourced(&self, evaluation: &Evaluation<'_>) -> (Outcome, Source) {
        match self {
            // Decides at once; no future to hold.
            Store::Memory(store) => (store.evaluate(evaluation), Source::Store),
            // Boxed: a Redis round trip is a large future (several KB), and
            // held inline it would make every connection's in-flight request
            // future that large, memory-store requests included.
            Store::Redis(store, cache) => {
                Box::pin(evaluate_shared(store, cache.as_ref(), evaluation)).await
            }
        }
    }

    /// Every rate limit of one request, checked together: all must pass,
    /// and when one blocks none is charged. The memory store checks them in
    /// one critical section; Redis in one call of one script (on Cluster,
    /// in order, one call each: docs/LIMITS.md, "Several limits on one route").
    pub async fn evaluate_all(&self, evaluations: &[Evaluation<'_>]) -> Outcomes {
        match self.decide_now(evaluations) {
            Decided::Now(outcomes) => outcomes,
            // Boxed, as in `evaluate`.
            Decided::Ask(asking) => Box::pin(asking.ask(evaluations)).await,
        }
    }

    /// [`Store::evaluate_all`] as far as it goes without waiting: the
    /// memory store's outcomes, those of a request every limit of which a
    /// lease held here pays for, or a denial the over-limit cache
    /// remembers; else the Redis call still to make. A request decided here
    /// makes no future at all.
    pub fn decide_now(&self, evaluations: &[Evaluation<'_>]) -> Decided<'_> {
        match self {
            Store::Memory(store) => Decided::Now(store.evaluate_all(evaluations)),
            Store::Redis(store, cache) => {
                let befores = match store.from_leases(evaluations) {
                    redis::Leased::Paid(outcomes) => return Decided::Now(outcomes),
                    redis::Leased::Ask(befores) => Some(befores),
                    redis::Leased::None => None,
                };
                let cache = cache.as_ref();
                // A denial the over-limit cache remembers is answered here
                // too, no future made. Not with leases in play: what their
                // book said is for the call to settle.
                let mut remembers_none = None;
                if let (Some(cache), None) = (cache, &befores) {
                    let asked = Instant::now();
                    if let Some(outcomes) = store.remembered(evaluations, cache, None, asked) {
                        return Decided::Now(outcomes);
                    }
                    remembers_none = Some(asked);
                }
                Decided::Ask(Asking {
                    store,
                    cache,
                    befores,
                    remembers_none,
                })
            }
        }
    }

    /// Gives back what [`Store::evaluate_all`] charged for `evaluations`,
    /// the request having been refused (by one of its limits, or by
    /// `on_failure` where the store could not decide). Only Redis Cluster,
    /// which decides a route's limits one call each, can have charged any:
    /// elsewhere a refused request was charged nothing, and this returns
    /// at once.
    pub async fn give_back(&self, evaluations: &[Evaluation<'_>], outcomes: &Outcomes) {
        match self {
            Store::Memory(_) => {}
            Store::Redis(store, _) => Box::pin(store.give_back(evaluations, outcomes)).await,
        }
    }

    /// Gives back `units` of what `evaluation` reserved (a limit charged on
    /// response, settled once the app answered). `at`: the memory store's
    /// time of decision ([`Outcomes::at`]). Whether they were given back:
    /// on Redis a refund that cannot be made leaves the charge standing.
    pub async fn refund_reserved(
        &self,
        evaluation: &Evaluation<'_>,
        at: Micros,
        units: u32,
    ) -> bool {
        match self {
            Store::Memory(store) => {
                store.refund(evaluation, at, units);
                true
            }
            Store::Redis(store, cache) => {
                let given = Box::pin(store.refund_reserved(evaluation, units)).await;
                if let (true, Some(cache)) = (given, cache) {
                    cache.forget(evaluation.policy, evaluation.subject);
                }
                given
            }
        }
    }

    /// What `evaluation` would be answered now, charging nothing and
    /// writing nothing (for `POST /explain`). The local over-limit cache
    /// is not consulted: it only repeats a denial the store would give.
    pub async fn peek(&self, evaluation: &Evaluation<'_>) -> Outcome {
        match self {
            Store::Memory(store) => store.peek(evaluation),
            Store::Redis(store, _) => Box::pin(store.peek(evaluation)).await,
        }
    }

    /// The `store` label of metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(..) => "redis",
        }
    }

    /// Brings the metrics read from the store's state up to date; called
    /// when `/metrics` is scraped, so the request path only counts.
    pub fn publish_metrics(&self) {
        match self {
            Store::Memory(_) => {}
            Store::Redis(store, _) => store.publish_metrics(),
        }
    }

    /// Gives back every lease this sidecar holds (it is stopping).
    pub async fn return_leases(&self) {
        match self {
            Store::Memory(_) => {}
            Store::Redis(store, _) => store.return_leases().await,
        }
    }

    /// The lease held here that would pay for `evaluation` now, if any
    /// (for `POST /explain`; nothing is spent).
    pub fn lease(&self, evaluation: &Evaluation<'_>) -> Option<lease::HeldView> {
        match self {
            Store::Memory(_) => None,
            Store::Redis(store, _) => store.lease(evaluation),
        }
    }

    /// Whether the store can currently make decisions (for `/readyz`).
    pub fn ready(&self) -> bool {
        match self {
            Store::Memory(_) => true,
            Store::Redis(store, _) => store.ready(),
        }
    }

    /// How the Redis scripts run (`functions` or `eval`), once known; and
    /// why the store cannot become ready as configured, when known (for
    /// `/readyz`).
    pub fn scripts(&self) -> (Option<&'static str>, Option<String>) {
        match self {
            Store::Memory(_) => (None, None),
            Store::Redis(store, _) => (store.scripts_mode(), store.refused()),
        }
    }
}

/// Redis behind the local over-limit cache.
pub(crate) async fn evaluate_shared(
    store: &redis::RedisStore,
    cache: Option<&deny_cache::DenyCache>,
    evaluation: &Evaluation<'_>,
) -> (Outcome, Source) {
    let Some(cache) = cache else {
        return (store.evaluate(evaluation).await, Source::Store);
    };
    // Taken before the store is asked, so a remembered denial can only end
    // early, never late.
    let asked = Instant::now();
    if let Some(decision) = store.remembered_denial(evaluation, cache, asked) {
        return (Outcome::Denied(decision), Source::DenyCache);
    }
    let outcome = evaluate_remembering(store, cache, evaluation, asked).await;
    (outcome, Source::Store)
}

/// Redis's outcome for `evaluation`, the over-limit cache having
/// remembered no denial of it at `asked`; a denial is remembered.
pub(crate) async fn evaluate_remembering(
    store: &redis::RedisStore,
    cache: &deny_cache::DenyCache,
    evaluation: &Evaluation<'_>,
    asked: Instant,
) -> Outcome {
    let outcome = store.evaluate(evaluation).await;
    if let Outcome::Denied(decision) = &outcome {
        let Evaluation {
            policy,
            subject,
            cost,
            ..
        } = *evaluation;
        let reserved = evaluation.settle_within.is_some();
        cache.remember_denial(policy, subject, cost, asked, decision, reserved);
    }
    outcome
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::EvaluationId;

    #[test]
    fn evaluation_ids_are_never_given_twice_on_one_thread_or_across_threads() {
        let here: Vec<EvaluationId> = (0..1000).map(|_| EvaluationId::fresh()).collect();
        let there: Vec<EvaluationId> =
            std::thread::spawn(|| (0..1000).map(|_| EvaluationId::fresh()).collect())
                .join()
                .unwrap();
        let all: HashSet<EvaluationId> = here.iter().chain(&there).copied().collect();
        assert_eq!(all.len(), 2000);
        // Each thread from a start of its own: the two runs do not meet.
        let (a, b) = (here[0].0, there[0].0);
        assert!(a.abs_diff(b) > 1000, "{a:x} and {b:x}");
    }
}
