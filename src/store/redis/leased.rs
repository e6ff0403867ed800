//! Leases on the Redis path (`store::lease` keeps the book): a request
//! spent from a lease is answered here; one that asks the store asks for
//! its lease in the same call, as a larger cost; what is left of a lease
//! goes back through the policy's refund script, in the background, when
//! it ends, and at once when sluice stops.

use std::sync::{Arc, Weak};
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use super::refund::Refund;
use super::{Inner, RedisStore};
use crate::limit::Outcome;
use crate::store::deny_cache::DenyCache;
use crate::store::lease::{Before, HeldView, Return, TopUp};
use crate::store::{Evaluation, EvaluationId, Outcomes, Source};
use crate::telemetry::{LEASES_RETURNED, LEASE_UNITS_RETURNED};

/// How often ended leases are looked for: a lease's units go back at most
/// this long after it ends (and well within its record's life: a lease
/// lasts at most half `store.dedupe_window`, at least 1 s by default).
const UPKEEP: Duration = Duration::from_millis(50);

/// The `result` labels of `sluice_leases_returned_total`.
pub(super) const RETURN_RESULTS: [&str; 3] = ["returned", "unneeded", "failed"];

/// What the book said of each rate limit of a request, in order.
pub type Befores = SmallVec<[Before; 2]>;

/// What leases make of a request ([`RedisStore::from_leases`]).
pub enum Leased {
    /// Every rate limit paid by a lease held here.
    Paid(Outcomes),
    /// Not all: what the book said of each, to act on in the store call.
    Ask(Befores),
    /// No limit is leased.
    None,
}

impl RedisStore {
    /// A request every rate limit of which a lease held here pays for,
    /// answered at once, with no future to make; else what the book said
    /// of each, for [`RedisStore::decide_all`] to act on.
    pub fn from_leases(&self, evaluations: &[Evaluation<'_>]) -> Leased {
        // A reservation is settled by a refund that needs the store's
        // record of it, which a lease's spending leaves none of: a request
        // with one asks the store for every limit.
        if !evaluations.iter().any(|e| e.policy.lease.is_some())
            || evaluations.iter().any(|e| e.settle_within.is_some())
        {
            return Leased::None;
        }
        let leases = &self.inner.leases;
        let now = Instant::now();
        let mut returns = Vec::new();
        let mut befores: Befores = evaluations
            .iter()
            // One limit may wait for the grant of its lease on its way.
            .map(|e| leases.before(e, now, &mut returns, evaluations.len() == 1))
            .collect();
        self.give_back_leases(returns);
        // Whether the request is paid or not, a lease running low is
        // topped up.
        for before in befores.iter_mut() {
            if let Before::Spent(_, top, _) = before {
                if let Some(top) = top.take() {
                    self.top_up(top);
                }
            }
        }
        let list: Option<crate::store::OutcomeList> = befores.iter().map(spent).collect();
        let Some(list) = list else {
            return Leased::Ask(befores);
        };
        leases.admitted();
        Leased::Paid(Outcomes {
            first: 0,
            list,
            source: Source::Lease,
            at: 0,
        })
    }

    /// One rate limit, not paid by a lease: from the store (asking for a
    /// lease where the book said so), behind the over-limit cache.
    pub(super) async fn evaluate_leased(
        &self,
        evaluation: &Evaluation<'_>,
        cache: Option<&DenyCache>,
        before: &Before,
    ) -> Outcomes {
        let leases = &self.inner.leases;
        let extra = match before {
            // Paid: answered by `from_leases`.
            Before::Spent(..) => 0,
            Before::Ask { extra } => *extra,
            // The lease is spent and its grant on its way: wait for it,
            // for at most half of what is left of the budget (the other
            // half is the store's, should the grant not come), and look
            // again (not waiting twice).
            Before::Wait(answered) => {
                let mut answered = answered.clone();
                let now = Instant::now();
                let until = now + evaluation.deadline.saturating_duration_since(now) / 2;
                let _ = tokio::time::timeout_at(until, answered.changed()).await;
                let mut returns = Vec::new();
                let again = leases.before(evaluation, Instant::now(), &mut returns, false);
                self.give_back_leases(returns);
                match again {
                    Before::Spent(decision, top, _) => {
                        leases.admitted();
                        if let Some(top) = top {
                            self.top_up(top);
                        }
                        let mut outcomes = Outcomes::at(0, Outcome::Allowed(decision));
                        outcomes.source = Source::Lease;
                        return outcomes;
                    }
                    Before::Ask { extra } => extra,
                    Before::Wait(_) => 0,
                }
            }
        };
        let extra = match extra {
            0 => {
                let (outcome, source) =
                    crate::store::evaluate_shared(self, cache, evaluation).await;
                self.settle(evaluation, 0, Instant::now(), outcome);
                let mut outcomes = Outcomes::at(0, outcome);
                outcomes.source = source;
                return outcomes;
            }
            extra => extra,
        };
        // The request's own cost first: a remembered denial of it stands.
        let asked = Instant::now();
        if let Some(cache) = cache {
            let e = evaluation;
            if let Some(hit) = cache.check(e.policy, e.subject, e.cost, asked) {
                if hit.touch {
                    self.touch(e);
                }
                leases.asked(evaluation);
                let mut outcomes = Outcomes::at(0, Outcome::Denied(hit.decision));
                outcomes.source = Source::DenyCache;
                return outcomes;
            }
        }
        let take = Evaluation {
            cost: evaluation.cost + extra,
            ..*evaluation
        };
        let outcome = self.inner.evaluate(&take).await;
        let outcome = self.settle(&take, extra, asked, outcome);
        let outcome = match outcome {
            // The larger charge did not fit. The request alone may; and if
            // not, its own denial says when it could pass (the larger
            // one's would say later) and is remembered.
            Outcome::Denied(_) => {
                let alone = Evaluation {
                    id: EvaluationId::fresh(),
                    ..*evaluation
                };
                let (outcome, source) = crate::store::evaluate_shared(self, cache, &alone).await;
                self.settle(&alone, 0, Instant::now(), outcome);
                let mut outcomes = Outcomes::at(0, outcome);
                outcomes.source = source;
                return outcomes;
            }
            other => other,
        };
        Outcomes::at(0, outcome)
    }

    /// Several rate limits. Those a lease held here pays for are spent
    /// from it; the rest go to Redis in one call (not on Cluster, where
    /// they are decided one by one and a later refusal would give back
    /// what an earlier grant charged: `None` there, decided as without
    /// leases, unless every limit was paid), asking for their leases where
    /// the book says so. A refusal charges nothing in that call and the
    /// spent units go back to their leases. `None`: decide them as without
    /// leases.
    pub(super) async fn evaluate_all_leased(
        &self,
        evaluations: &[Evaluation<'_>],
        one_call: bool,
        befores: &[Before],
    ) -> Option<Outcomes> {
        let leases = &self.inner.leases;
        let unspend = || {
            for (e, before) in evaluations.iter().zip(befores) {
                if let Before::Spent(_, _, spend) = before {
                    leases.unspend(e, *spend);
                }
            }
        };
        if !one_call {
            unspend();
            for (e, before) in evaluations.iter().zip(befores) {
                if let Before::Ask { extra } = before {
                    if *extra > 0 {
                        leases.asked(e);
                    }
                }
            }
            return None;
        }
        // The limits Redis is asked for, in the order written.
        let asked_for: SmallVec<[usize; 2]> = (0..evaluations.len())
            .filter(|&i| matches!(befores[i], Before::Ask { .. }))
            .collect();
        let extras: SmallVec<[u32; 2]> = asked_for
            .iter()
            .map(|&i| match befores[i] {
                Before::Ask { extra } => extra,
                // Several limits never wait.
                Before::Spent(..) | Before::Wait(_) => 0,
            })
            .collect();
        let takes: SmallVec<[Evaluation<'_>; 2]> = asked_for
            .iter()
            .zip(&extras)
            .map(|(&i, &extra)| Evaluation {
                cost: evaluations[i].cost + extra,
                ..evaluations[i]
            })
            .collect();
        let sent_at = Instant::now();
        let mut outcomes = self.several_or_one(&takes).await;
        let mut extras = extras;
        if blocked(&takes, &outcomes) && extras.iter().any(|&x| x > 0) {
            // All or nothing: nothing was charged. The request alone may
            // fit where it and its leases did not (under new ids: fresh
            // evaluations, each sent as a first attempt).
            for (e, extra) in takes.iter().zip(&extras) {
                if *extra > 0 {
                    leases.asked(e);
                }
            }
            let alone: SmallVec<[Evaluation<'_>; 2]> = asked_for
                .iter()
                .map(|&i| Evaluation {
                    id: EvaluationId::fresh(),
                    ..evaluations[i]
                })
                .collect();
            let sent_at = Instant::now();
            outcomes = self.several_or_one(&alone).await;
            extras = SmallVec::new();
            outcomes = self.settle_all(&alone, &extras, sent_at, outcomes);
        } else {
            outcomes = self.settle_all(&takes, &extras, sent_at, outcomes);
        }
        if blocked(&takes, &outcomes) {
            unspend();
        }
        if outcomes.first > 0 {
            // A limit known to block before any was asked: its alone.
            let first = asked_for[outcomes.first];
            return Some(Outcomes::at(first, outcomes.list[0]));
        }
        // Every limit's outcome in the order written, up to the first that
        // blocks: the spent ones' from their leases, the others' from Redis.
        let mut merged = Outcomes::empty();
        let mut answered = outcomes.list.iter();
        for (e, before) in evaluations.iter().zip(befores) {
            let outcome = match spent(before) {
                Some(outcome) => outcome,
                None => match answered.next() {
                    Some(outcome) => *outcome,
                    None => break,
                },
            };
            merged.list.push(outcome);
            if outcome.blocks(e.policy.shadow) {
                break;
            }
        }
        Some(merged)
    }

    /// One call for `takes`: of the script of several limits, or the
    /// policy's own for one.
    async fn several_or_one(&self, takes: &[Evaluation<'_>]) -> Outcomes {
        match takes {
            [one] => Outcomes::at(0, self.inner.evaluate(one).await),
            several => self.inner.evaluate_several(several).await,
        }
    }

    /// [`RedisStore::settle`] for each limit answered (`extras` missing:
    /// none asked for a lease).
    fn settle_all(
        &self,
        takes: &[Evaluation<'_>],
        extras: &[u32],
        asked: Instant,
        mut outcomes: Outcomes,
    ) -> Outcomes {
        let first = outcomes.first;
        for (i, outcome) in outcomes.list.iter_mut().enumerate() {
            if let Some(take) = takes.get(first + i) {
                let extra = extras.get(first + i).copied().unwrap_or(0);
                *outcome = self.settle(take, extra, asked, *outcome);
            }
        }
        outcomes
    }

    /// Tells the book the store's answer to `take` (asked for `extra`
    /// units beyond the request's cost), and gives back what it hands out.
    pub(super) fn settle(
        &self,
        take: &Evaluation<'_>,
        extra: u32,
        sent_at: Instant,
        outcome: Outcome,
    ) -> Outcome {
        let mut returns = Vec::new();
        let outcome = self
            .inner
            .leases
            .after(take, extra, sent_at, outcome, &mut returns);
        self.give_back_leases(returns);
        outcome
    }

    /// The request is refused before the store is asked (the over-limit
    /// cache): what `befores` spent goes back to the leases, and the asks
    /// for leases are off.
    pub(super) fn not_asked(&self, evaluations: &[Evaluation<'_>], befores: &[Before]) {
        for (e, before) in evaluations.iter().zip(befores) {
            match before {
                Before::Spent(_, _, spend) => self.inner.leases.unspend(e, *spend),
                Before::Ask { extra } if *extra > 0 => self.inner.leases.asked(e),
                Before::Ask { .. } | Before::Wait(_) => {}
            }
        }
    }

    /// See [`crate::store::Store::lease`].
    pub fn lease(&self, evaluation: &Evaluation<'_>) -> Option<HeldView> {
        self.inner.leases.peek(evaluation, Instant::now())
    }

    /// Asks for `top` in the background: the requests meanwhile are paid
    /// by what is left of the lease.
    fn top_up(&self, top: Box<TopUp>) {
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move {
            let id = EvaluationId::fresh();
            let sent_at = Instant::now();
            let grant = Evaluation {
                policy: &top.policy,
                subject: &top.subject,
                cost: top.units,
                deadline: sent_at + inner.budget,
                id,
                settle_within: None,
            };
            let outcome = inner.evaluate(&grant).await;
            let mut returns = Vec::new();
            inner
                .leases
                .topped(&top, id, sent_at, outcome, &mut returns);
            inner.return_leases(returns).await;
        });
    }

    fn give_back_leases(&self, returns: Vec<Return>) {
        if returns.is_empty() {
            return;
        }
        let inner = Arc::clone(&self.inner);
        tokio::spawn(async move { inner.return_leases(returns).await });
    }

    /// Gives back every lease held, ended or not, and waits for the answers
    /// (a sidecar stopping: what it held is the others' again at once).
    pub async fn return_leases(&self) {
        let returns = self.inner.leases.drain();
        if !returns.is_empty() {
            tracing::info!(leases = returns.len(), "returning the leases held");
        }
        self.inner.return_leases(returns).await;
    }
}

impl Inner {
    /// Each return is one refund call, all at once, within one budget.
    async fn return_leases(&self, returns: Vec<Return>) {
        if returns.is_empty() {
            return;
        }
        let deadline = Instant::now() + self.budget;
        let calls = returns.iter().map(|r| async move {
            let refund = self.refund_one(&r.evaluation(deadline), deadline).await;
            self.leases.returned(r);
            (refund, r.units)
        });
        for (refund, units) in futures_util::future::join_all(calls).await {
            let result = match refund {
                Refund::Refunded => {
                    metrics::counter!(LEASE_UNITS_RETURNED).increment(u64::from(units));
                    RETURN_RESULTS[0]
                }
                // The grant's record is gone or says nothing was charged.
                Refund::Unneeded => RETURN_RESULTS[1],
                Refund::Failed => RETURN_RESULTS[2],
            };
            metrics::counter!(LEASES_RETURNED, "result" => result).increment(1);
        }
    }
}

/// A request's outcome from its lease, if one paid for it.
fn spent(before: &Before) -> Option<Outcome> {
    match before {
        Before::Spent(decision, ..) => Some(Outcome::Allowed(*decision)),
        Before::Ask { .. } | Before::Wait(_) => None,
    }
}

/// Whether a limit blocked the request: a refusal of all of them.
fn blocked(takes: &[Evaluation<'_>], outcomes: &Outcomes) -> bool {
    outcomes
        .iter()
        .any(|(i, o)| o.blocks(takes.get(i).is_some_and(|e| e.policy.shadow)))
}

/// Gives back the leases that ended, every [`UPKEEP`], while the store
/// lives; rests while no subject is followed (no lease can end), until
/// one is.
pub(super) async fn upkeep(inner: Weak<Inner>) {
    let Some(wake) = inner.upgrade().map(|store| store.leases.waker()) else {
        return;
    };
    let mut tick = tokio::time::interval(UPKEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        {
            let Some(inner) = inner.upgrade() else { return };
            let returns = inner.leases.ended(Instant::now());
            if !returns.is_empty() {
                tokio::spawn(async move { inner.return_leases(returns).await });
                continue;
            }
            if !inner.leases.rest() {
                continue;
            }
        }
        // Not holding the store meanwhile: its drop wakes this too.
        wake.notified().await;
        tick.reset();
    }
}
