//! Limits charged by the response (`charge: { on: response }`, `cost: {
//! from_response_header }`): checked before forwarding, charging nothing,
//! and charged once the response head says what.
//!
//! Before forwarding, each such limit is read without charging (the
//! store's read-only step: the explain scripts on Redis, a peek on the
//! memory store), cost `cost` (1 for a cost from the response): a limit
//! already spent refuses the request, and nothing is forwarded or charged.
//! The request's other limits are then charged together as usual. A read
//! that refuses ends the request before the others are asked.
//!
//! When the head arrives, each limit whose statuses include the response's
//! is charged its units, in a task of its own: a client that goes away
//! once the head is in cannot take the charge with it. A charge larger
//! than what is left takes what is left (the limit ends spent, and the
//! next request is refused until it refills), so a subject cannot carry a
//! debt into a window it has not reached. Requests checked together may
//! all pass before any is charged: the overshoot is at most the requests
//! in flight when the limit was reached (a concurrency limit on the route
//! bounds it).

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::limit::{Outcome, Policy};
use crate::route::CostRead;
use crate::store::{Evaluation, EvaluationId, Outcomes, Source, Store};
use crate::subject::Pseudonym;

use super::plan::Limits;
use super::Check;
use crate::proxy::metrics::OnResponseCounters;

/// What became of a charge made on response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charged {
    /// The units were charged, all of them.
    Full,
    /// Fewer were left than the response cost: what was left was taken.
    TookRest,
    /// Nothing was left to take.
    Spent,
    /// The store made no decision: nothing is known to be charged.
    NoDecision,
}

impl Charged {
    pub const ALL: [Charged; 4] = [
        Charged::Full,
        Charged::TookRest,
        Charged::Spent,
        Charged::NoDecision,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Charged::Full => "charged",
            Charged::TookRest => "took_rest",
            Charged::Spent => "spent",
            Charged::NoDecision => "no_decision",
        }
    }
}

/// The store's answers for a request's rate limits: `outcomes` for every
/// one of them, as [`Store::evaluate_all`] gives them, and what was
/// charged, to give back when the request is refused.
pub(in crate::proxy) struct Asked<'e> {
    pub outcomes: Outcomes,
    /// The limits charged before forwarding and their outcomes, when some
    /// limits were only checked; `None`: every limit was charged.
    charged: Option<(SmallVec<[Evaluation<'e>; 2]>, Outcomes)>,
}

impl<'e> Asked<'e> {
    /// What was charged, out of `evaluations` (all of the request's).
    pub fn charged<'s>(
        &'s self,
        evaluations: &'s [Evaluation<'e>],
    ) -> (&'s [Evaluation<'e>], &'s Outcomes) {
        match &self.charged {
            None => (evaluations, &self.outcomes),
            Some((charged, outcomes)) => (charged, outcomes),
        }
    }
}

/// Asks `store` for `evaluations` (one per limit of `limits`): those
/// charged on response are read first, the others charged together.
pub(in crate::proxy) async fn ask<'e>(
    store: &Store,
    limits: &Limits<'_, '_>,
    evaluations: &[Evaluation<'e>],
) -> Asked<'e> {
    let later = |i: usize| limits[i].0.limit().on_response().is_some();
    if !(0..evaluations.len()).any(later) {
        return Asked {
            outcomes: store.evaluate_all(evaluations).await,
            charged: None,
        };
    }
    let mut read: SmallVec<[(usize, Outcome); 2]> = SmallVec::new();
    for (i, evaluation) in evaluations.iter().enumerate() {
        if !later(i) {
            continue;
        }
        let outcome = store.peek(evaluation).await;
        if outcome.blocks(evaluation.policy.shadow) {
            return Asked {
                outcomes: Outcomes::at(i, outcome),
                charged: Some((SmallVec::new(), Outcomes::empty())),
            };
        }
        read.push((i, outcome));
    }
    let at: SmallVec<[usize; 2]> = (0..evaluations.len()).filter(|&i| !later(i)).collect();
    let now: SmallVec<[Evaluation<'e>; 2]> = at.iter().map(|&i| evaluations[i]).collect();
    let charged = if now.is_empty() {
        Outcomes::empty()
    } else {
        store.evaluate_all(&now).await
    };
    Asked {
        outcomes: merged(evaluations.len(), &read, &at, &charged),
        charged: Some((now, charged)),
    }
}

/// One run of outcomes for all `n` limits, from those `read` (at their
/// indices) and those `charged` (for the limits at `at`, in order).
fn merged(n: usize, read: &[(usize, Outcome)], at: &[usize], charged: &Outcomes) -> Outcomes {
    if charged.first > 0 {
        // The over-limit cache (or a cost no policy admits) answered for
        // a later limit alone.
        let mut outcomes = Outcomes::at(at[charged.first], charged.list[0]);
        outcomes.source = charged.source;
        return outcomes;
    }
    // The charged run ended before its last limit: at its blocking answer.
    let ended = charged.list.len() < at.len();
    let mut outcomes = Outcomes::empty();
    let mut next = charged.list.iter();
    for i in 0..n {
        if let Some(&(_, outcome)) = read.iter().find(|(r, _)| *r == i) {
            outcomes.list.push(outcome);
            continue;
        }
        let Some(&outcome) = next.next() else { break };
        outcomes.list.push(outcome);
        if ended && next.len() == 0 {
            break;
        }
    }
    outcomes
}

/// One charge to make once the response head is in.
pub(in crate::proxy) struct Due {
    policy: Arc<Policy>,
    subject: Pseudonym,
    units: u32,
    read: CostRead,
    counters: Option<OnResponseCounters>,
}

impl Due {
    pub fn units(&self) -> u32 {
        self.units
    }
}

/// The charge `check` is due for a response with `status` and `headers`,
/// if it is charged on response and this response charges it.
pub(in crate::proxy) fn due(check: &Check<'_>, status: u16, headers: &HeaderMap) -> Option<Due> {
    let limit = check.limit();
    let on = limit.on_response()?;
    let policy = limit.policy.as_rate()?;
    let (units, read) = on.units(status, headers, limit.cost)?;
    Some(Due {
        policy: policy.clone(),
        subject: check.subject,
        units,
        read,
        counters: check.entry.metrics.on_response(check.limit),
    })
}

/// The charge `check` is due when the app did not answer within
/// `upstream.timeout`, if it is charged on response
/// ([`OnResponse::units_timed_out`](crate::route::OnResponse::units_timed_out)).
pub(in crate::proxy) fn due_timed_out(check: &Check<'_>) -> Option<Due> {
    let limit = check.limit();
    let on = limit.on_response()?;
    let policy = limit.policy.as_rate()?;
    let (units, read) = on.units_timed_out(limit.cost);
    Some(Due {
        policy: policy.clone(),
        subject: check.subject,
        units,
        read,
        counters: check.entry.metrics.on_response(check.limit),
    })
}

/// Makes `due` in a task of its own, within `budget` per store call.
pub(in crate::proxy) fn charge(store: &Arc<Store>, due: Due, budget: Duration) {
    let store = store.clone();
    tokio::spawn(async move {
        let charged = if due.units == 0 {
            Charged::Full
        } else {
            take(&store, &due.policy, &due.subject, due.units, budget).await
        };
        if let Some(counters) = &due.counters {
            counters.count(charged, due.read);
        }
    });
}

/// Charges `units`, or what is left when fewer are: a denial says how many
/// remain, and those are asked for instead (again if another sidecar took
/// some meanwhile, a few times at most).
async fn take(
    store: &Store,
    policy: &Policy,
    subject: &Pseudonym,
    units: u32,
    budget: Duration,
) -> Charged {
    // Validation keeps `max` within the policy's; a fixed cost is too.
    let mut units = units.min(policy.max_cost());
    let mut took_rest = false;
    for _ in 0..4 {
        let evaluation = Evaluation {
            policy,
            subject,
            cost: units,
            deadline: Instant::now() + budget,
            id: EvaluationId::random(),
            settle_within: None,
        };
        let outcomes = store.evaluate_all(std::slice::from_ref(&evaluation)).await;
        match outcomes.list.first() {
            Some(Outcome::Allowed(_)) if took_rest => return Charged::TookRest,
            Some(Outcome::Allowed(_)) => return Charged::Full,
            Some(Outcome::Denied(decision)) => {
                let left = decision.remaining.min(u64::from(u32::MAX)) as u32;
                if left == 0 || left >= units {
                    return Charged::Spent;
                }
                // What the over-limit cache remembers may be older than
                // the store's count: only the store says what is left.
                if outcomes.source == Source::DenyCache && took_rest {
                    return Charged::Spent;
                }
                units = left;
                took_rest = true;
            }
            Some(Outcome::Unavailable(_) | Outcome::Indeterminate | Outcome::Incompatible(_))
            | None => return Charged::NoDecision,
        }
    }
    Charged::Spent
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Decision, Unavailable};

    fn allowed() -> Outcome {
        Outcome::Allowed(Decision {
            allowed: true,
            band: 0,
            remaining: 3,
            reset_after: Duration::from_secs(1),
            retry_after: Duration::ZERO,
            approximate: false,
        })
    }

    fn denied() -> Outcome {
        let Outcome::Allowed(d) = allowed() else {
            unreachable!()
        };
        Outcome::Denied(Decision {
            allowed: false,
            remaining: 0,
            ..d
        })
    }

    fn charged(list: &[Outcome]) -> Outcomes {
        let mut outcomes = Outcomes::empty();
        outcomes.list.extend_from_slice(list);
        outcomes
    }

    #[test]
    fn the_read_and_the_charged_outcomes_keep_the_limits_order() {
        let read = [(1, allowed())];
        let merged = merged(3, &read, &[0, 2], &charged(&[allowed(), denied()]));
        assert_eq!(merged.first, 0);
        assert_eq!(&merged.list[..], &[allowed(), allowed(), denied()]);
    }

    #[test]
    fn a_charged_run_that_ends_early_ends_the_merged_run() {
        // The first charged limit refuses: the store asked no further.
        let read = [(2, allowed())];
        let none = Outcome::Unavailable(Unavailable::BeforeSend);
        let merged = merged(3, &read, &[0, 1], &charged(&[none]));
        assert_eq!(&merged.list[..], &[none]);
    }

    #[test]
    fn an_answer_for_a_later_limit_alone_keeps_its_index() {
        let mut cached = Outcomes::at(1, denied());
        cached.source = Source::DenyCache;
        let merged = merged(3, &[(0, allowed())], &[1, 2], &cached);
        assert_eq!(merged.first, 2);
        assert_eq!(&merged.list[..], &[denied()]);
        assert_eq!(merged.source, Source::DenyCache);
    }
}
