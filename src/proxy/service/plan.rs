//! What a request's rate limits ask of it, as a pure function of the
//! answers it was given: [`plan`] reads the store's outcomes, [`Plan::settle`]
//! the local fallback's for the limits left to it. Neither asks a store,
//! charges, counts or logs; the proxy acts on the [`Judgement`], and
//! `POST /explain` calls the same two steps on outcomes read without
//! charging, so an explanation follows the rule a request is judged by.
//!
//! The rule, for every rate limit of every route the request matched, in
//! order:
//!
//! - the first limit whose answer refuses (429, or 503 when no decision
//!   could be made and `on_failure` says so) answers the request, unless a
//!   limit before it left to the local fallback (`on_failure: local`)
//!   refuses first: those are decided after the others, all together, so
//!   that a request refused anywhere charges none of them locally;
//! - a request nothing refuses goes on, counted once per matched route
//!   under that route's earliest limit whose verdict is not plain Allowed
//!   (a shadow denial, a local admission, no decision under
//!   `on_failure: allow`), or else its first; it carries the `RateLimit`
//!   fields of the limit with the least remaining (the first on ties).

use std::sync::Arc;
use std::time::Duration;

use http::Response;
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::config::{self, Live, OnFailure};
use crate::limit::{Decision, Outcome, Policy};
use crate::route::Route;
use crate::store::{Evaluation, EvaluationId, Outcomes};

use super::Check;
use crate::proxy::body::Body;
use crate::proxy::fallback::LocalPolicy;
use crate::proxy::overrides::MAX_METHODS;
use crate::proxy::respond::{self, Prepared};
use crate::proxy::verdict::{Failure, Verdict};

/// One rate limit of a request: the limit, its policy and what the store
/// is asked for it.
#[derive(Clone, Copy)]
pub(in crate::proxy) struct Rated<'e, 'a, 'r> {
    pub check: &'a Check<'r>,
    pub policy: &'r Arc<Policy>,
    pub evaluation: &'e Evaluation<'e>,
}

/// The rate limits among `checks`, in order, each with what the store is
/// asked for it (a fresh evaluation id, due by `deadline`). A limit
/// charged on response reserves its units, to be settled within
/// `settle_within`.
pub(in crate::proxy) fn asked<'a, 'r>(
    checks: &'a [Check<'r>],
    deadline: Instant,
    settle_within: Duration,
) -> (Limits<'a, 'r>, SmallVec<[Evaluation<'a>; 2]>) {
    checks
        .iter()
        .filter_map(|check| {
            let limit = check.limit();
            let policy = limit.policy.as_rate()?;
            let evaluation = Evaluation {
                policy,
                subject: &check.subject,
                cost: limit.reserved_units(),
                deadline,
                id: EvaluationId::fresh(),
                // A turn taken ahead (`delay`) may be given back up to
                // `max_wait` later: its record must outlive that.
                settle_within: limit
                    .on_response()
                    .map(|_| settle_within)
                    .or_else(|| policy.delay.map(|d| d.max_wait + Duration::from_secs(5))),
            };
            Some(((check, policy), evaluation))
        })
        .unzip()
}

/// A request's rate limits and their policies, as [`asked`] finds them.
pub(in crate::proxy) type Limits<'a, 'r> = SmallVec<[(&'a Check<'r>, &'r Arc<Policy>); 2]>;

/// Each of `limits` with its evaluation, for [`plan`].
pub(in crate::proxy) fn rated<'e, 'a, 'r>(
    limits: &[(&'a Check<'r>, &'r Arc<Policy>)],
    evaluations: &'e [Evaluation<'e>],
) -> SmallVec<[Rated<'e, 'a, 'r>; 2]> {
    limits
        .iter()
        .zip(evaluations)
        .map(|(&(check, policy), evaluation)| Rated {
            check,
            policy,
            evaluation,
        })
        .collect()
}

/// What one limit's answer asks of the request.
pub(in crate::proxy) enum Step {
    Decided(Verdict, Action),
    /// The store made no decision and the policy's `on_failure` is
    /// `local`: the local fallback decides, for this `Failure`.
    Local(Failure),
}

/// What a decided limit asks of the request.
pub(in crate::proxy) enum Action {
    /// To the upstream; with a decision when its `RateLimit` fields are to
    /// be added to the response.
    Forward {
        ratelimit: Option<Decision>,
    },
    Respond(Response<Body>),
}

/// The limit that ends a request, and its answer.
pub(in crate::proxy) struct Refusal<'a, 'r> {
    pub check: &'a Check<'r>,
    pub verdict: Verdict,
    pub response: Response<Body>,
}

/// What a request that goes on is counted as and carries.
pub(in crate::proxy) struct Passed<'r> {
    /// Per matched route: the limit it is counted under and the verdict,
    /// when not Allowed.
    noted: [Option<(usize, Verdict)>; MAX_METHODS],
    /// The `RateLimit` fields the response carries.
    pub ratelimit: Option<(&'r Prepared, Decision)>,
    /// The limits (route, limit) the request was admitted near to
    /// ([`Policy::near`]).
    pub near: SmallVec<[(usize, usize); 1]>,
}

/// What becomes of a request: the one place it is counted reads this.
pub(in crate::proxy) enum Judgement<'a, 'r> {
    Refused(Refusal<'a, 'r>),
    Passed(Passed<'r>),
}

/// The store's answers read; the limits left to the local fallback still
/// to be decided, by [`Plan::settle`].
pub(in crate::proxy) struct Plan<'e, 'a, 'r> {
    /// In order, each with why the store did not decide it.
    locals: SmallVec<[(Rated<'e, 'a, 'r>, Failure); 2]>,
    /// The first limit the store's answers refuse at.
    refused: Option<Refusal<'a, 'r>>,
    passed: Passed<'r>,
}

impl<'r> Passed<'r> {
    pub fn new() -> Passed<'r> {
        Passed {
            noted: [None; MAX_METHODS],
            ratelimit: None,
            near: SmallVec::new(),
        }
    }

    /// The limit of the `route_at`-th route matched that its request is
    /// counted under, and the verdict; `checks` are the request's limits
    /// (a route has none for `policy: none`, or a tier whose policy is).
    pub fn counted(&self, route_at: usize, checks: &[Check<'_>]) -> (usize, Verdict) {
        match self.noted.get(route_at).copied().flatten() {
            Some(noted) => noted,
            None => match first_limit(route_at, checks) {
                Some(limit) => (limit, Verdict::Allowed),
                None => (0, Verdict::Unlimited),
            },
        }
    }

    /// Notes what a limit that lets the request go on asks of it: the
    /// route's verdict, when not Allowed, from its earliest such limit
    /// (local limits are decided after the others), and the `RateLimit`
    /// fields of the rate limit with the least remaining.
    fn note(&mut self, check: &Check<'r>, verdict: Verdict, ratelimit: Option<Decision>) {
        if let Some(slot) = self.noted.get_mut(check.route_at) {
            let earlier = slot.is_none_or(|(limit, _)| check.limit < limit);
            if verdict != Verdict::Allowed && earlier {
                *slot = Some((check.limit, verdict));
            }
        }
        if let Some(decision) = ratelimit {
            let fewer = |(_, best): &(_, Decision)| decision.remaining < best.remaining;
            if self.ratelimit.as_ref().is_none_or(fewer) {
                self.ratelimit = Some((check.responses(), decision));
            }
        }
    }
}

/// The first limit of the `route_at`-th route matched among the request's
/// `checks`: what its request is counted under when no limit noted a
/// verdict of its own. `None` for a route without limits.
pub fn first_limit(route_at: usize, checks: &[Check<'_>]) -> Option<usize> {
    checks
        .iter()
        .find(|c| c.route_at == route_at)
        .map(|c| c.limit)
}

/// Reads the store's `outcomes` for `rated` (as [`Store::evaluate_all`]
/// gives them: a run from `outcomes.first`, a limit it could not decide
/// leaving the ones after it undecided too).
///
/// [`Store::evaluate_all`]: crate::store::Store::evaluate_all
pub(in crate::proxy) fn plan<'e, 'a, 'r>(
    rated: &[Rated<'e, 'a, 'r>],
    outcomes: &Outcomes,
    live: &Live,
) -> Plan<'e, 'a, 'r> {
    // Limits before `outcomes.first` were not asked: one at `first` (the
    // over-limit cache's denial) refuses the request.
    let answered = rated.get(outcomes.first..).unwrap_or_default();
    debug_assert!(
        outcomes.list.len() <= answered.len(),
        "the store answered {} limits of {}",
        outcomes.first + outcomes.list.len(),
        rated.len()
    );
    // A run stops at the first answer that blocks. The limits after an
    // undecided one follow its outcome, each its own `on_failure`; any
    // other limit left without an answer is not let through unjudged: it
    // is one the store gave no confirmed reply for.
    let rest = match outcomes.list.last() {
        Some(&last) if !decided(&last) => last,
        _ => Outcome::Indeterminate,
    };
    let unanswered = answered.get(outcomes.list.len()..).unwrap_or_default();
    let steps = answered
        .iter()
        .zip(outcomes.list.iter().copied())
        .chain(unanswered.iter().map(|limit| (limit, rest)));

    let mut plan = Plan {
        locals: SmallVec::new(),
        refused: None,
        passed: Passed::new(),
    };
    for (&limit, outcome) in steps {
        let check = limit.check;
        let responses = check.responses();
        if let Outcome::Allowed(decision) = &outcome {
            if limit.policy.near(decision) {
                plan.passed.near.push((check.route_at, check.limit));
            }
        }
        match decide(outcome, check.entry.route, limit.policy, responses, live) {
            Step::Local(failure) => plan.locals.push((limit, failure)),
            Step::Decided(verdict, Action::Respond(response)) => {
                plan.refused = Some(Refusal {
                    check,
                    verdict,
                    response,
                });
                break;
            }
            Step::Decided(verdict, Action::Forward { ratelimit }) => {
                plan.passed.note(check, verdict, ratelimit);
            }
        }
    }
    plan
}

impl<'e, 'a, 'r> Plan<'e, 'a, 'r> {
    /// The limits the local fallback is to decide, in order.
    pub fn locals(&self) -> impl Iterator<Item = (&'e Evaluation<'e>, &'r Arc<Policy>)> + '_ {
        self.locals
            .iter()
            .map(|(limit, _)| (limit.evaluation, limit.policy))
    }

    /// Whether the store's answers refuse the request already: the local
    /// limits are then only read, to find whether one refuses first.
    pub fn refused(&self) -> bool {
        self.refused.is_some()
    }

    /// The judgement, the local fallback having answered [`Plan::locals`]
    /// with `outcomes` (a run from `outcomes.first`, up to the first that
    /// blocks), each enforced as `shared`.
    pub fn settle(
        self,
        outcomes: &Outcomes,
        shared: &[Arc<LocalPolicy>],
        live: &Live,
    ) -> Judgement<'a, 'r> {
        let Plan {
            locals,
            refused,
            mut passed,
        } = self;
        debug_assert_eq!(
            locals.len(),
            shared.len(),
            "one local policy per local limit"
        );
        let answered = locals
            .iter()
            .zip(shared)
            .skip(outcomes.first)
            .zip(outcomes.list.iter().copied());
        for ((&(limit, failure), shared), outcome) in answered {
            let check = limit.check;
            let responses = check.responses();
            let policy = limit.policy;
            match local_verdict(failure, outcome, policy, shared, responses, &live.store) {
                (verdict, Action::Respond(response)) => {
                    return Judgement::Refused(Refusal {
                        check,
                        verdict,
                        response,
                    });
                }
                (verdict, Action::Forward { ratelimit }) => passed.note(check, verdict, ratelimit),
            }
        }
        match refused {
            Some(refusal) => Judgement::Refused(refusal),
            None => Judgement::Passed(passed),
        }
    }

    /// The judgement, when no limit was left to the local fallback: the
    /// store's answers alone (most requests), without the fallback's
    /// answers to read.
    pub fn settled(self) -> Judgement<'a, 'r> {
        debug_assert!(self.locals.is_empty(), "a limit left to the fallback");
        match self.refused {
            Some(refusal) => Judgement::Refused(refusal),
            None => Judgement::Passed(self.passed),
        }
    }
}

/// A decision, rather than no decision at all.
pub(in crate::proxy) fn decided(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Allowed(_) | Outcome::Denied(_))
}

/// The one place a store's [`Outcome`] becomes a step, for one rate limit
/// (`policy`, answered with `responses`); the local fallback's outcome
/// becomes one in [`local_verdict`]. No catch-all arm: a new outcome must
/// be decided here before sluice builds.
pub(in crate::proxy) fn decide(
    outcome: Outcome,
    route: &Route,
    policy: &Arc<Policy>,
    responses: &Prepared,
    live: &Live,
) -> Step {
    let store = &live.store;
    match outcome {
        Outcome::Allowed(decision) => {
            // A shadow policy is invisible to clients.
            // Nor is one with `headers: off`.
            let show =
                live.responses.ratelimit_headers_on_allowed && !policy.shadow && policy.announce;
            let ratelimit = show.then_some(decision);
            Step::Decided(Verdict::Allowed, Action::Forward { ratelimit })
        }
        Outcome::Denied(decision) => {
            if policy.shadow {
                Step::Decided(Verdict::ShadowDenied, Action::Forward { ratelimit: None })
            } else {
                let response = respond::too_many_requests(responses, &decision);
                Step::Decided(Verdict::Denied, Action::Respond(response))
            }
        }
        Outcome::Unavailable(reason) => fail(Failure::Unavailable(reason), policy, responses, live),
        Outcome::Indeterminate => fail(Failure::Indeterminate, policy, responses, live),
        Outcome::Incompatible(reason) => {
            let response =
                respond::incompatible(responses, route, policy, reason, store.failure_retry_after);
            Step::Decided(Verdict::Incompatible(reason), Action::Respond(response))
        }
    }
}

/// No decision could be made: `on_failure` (the policy's, else the
/// store's) says what happens.
fn fail(failure: Failure, policy: &Policy, responses: &Prepared, live: &Live) -> Step {
    let store = &live.store;
    match policy.failure_mode(store.on_failure) {
        OnFailure::Deny => {
            let (verdict, action) = fail_closed(failure, responses, store);
            Step::Decided(verdict, action)
        }
        OnFailure::Allow => Step::Decided(
            Verdict::FailedOpen(failure),
            Action::Forward { ratelimit: None },
        ),
        OnFailure::Local => Step::Local(failure),
    }
}

fn fail_closed(
    failure: Failure,
    responses: &Prepared,
    store: &config::StoreLive,
) -> (Verdict, Action) {
    let response = respond::unavailable(responses, store.failure_retry_after);
    (Verdict::FailedClosed(failure), Action::Respond(response))
}

/// What the local fallback's `outcome` for `policy` (enforced as
/// `shared`) asks of the request; `failure` is why the store did not
/// decide.
pub(in crate::proxy) fn local_verdict(
    failure: Failure,
    outcome: Outcome,
    policy: &Policy,
    shared: &LocalPolicy,
    responses: &Prepared,
    store: &config::StoreLive,
) -> (Verdict, Action) {
    match outcome {
        // No `RateLimit` fields: the response would pair the shared
        // policy's `RateLimit-Policy` with a count kept here alone.
        Outcome::Allowed(_) => (Verdict::LocalAllowed, Action::Forward { ratelimit: None }),
        Outcome::Denied(_) if policy.shadow => (
            Verdict::LocalShadowDenied,
            Action::Forward { ratelimit: None },
        ),
        Outcome::Denied(decision) => {
            let response = respond::too_many_requests_local(responses, &shared.field, &decision);
            (Verdict::LocalDenied, Action::Respond(response))
        }
        // The local store has no room at all (`max_entries` 0: a full
        // one evicts instead), or the request costs more than the local
        // share could ever admit: no decision here either.
        Outcome::Unavailable(_) | Outcome::Indeterminate | Outcome::Incompatible(_) => {
            fail_closed(failure, responses, store)
        }
    }
}

#[cfg(test)]
mod tests;
