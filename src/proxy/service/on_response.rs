//! Limits charged by the response (`charge: { on: response }`, `cost: {
//! from_response_header }`): reserved before forwarding, settled once the
//! response head says what they owe.
//!
//! Before forwarding, each such limit is charged with the request's other
//! limits, in the same call: `cost` units, or for a cost the app reports,
//! `reserve` (default: `default`). A spent limit refuses the request, and
//! concurrent requests cannot all pass a check that charges nothing: 100
//! concurrent guesses against a limit of 5 forward 5. The store keeps what
//! it needs to give the reservation back (on Redis, the evaluation's
//! record, kept for `upstream.timeout` and a margin).
//!
//! When the head arrives, in a task of its own (a client that goes away
//! takes nothing with it), the reservation is settled: kept for a listed
//! status; given back for an unlisted one; for a reported cost, the
//! difference given back or, for more than was reserved, charged (a charge
//! larger than what is left takes what is left, so a subject cannot carry
//! a debt into a window it has not reached). What cannot be given back
//! (the store not answering, a record expired) stands: a reservation can
//! only ever over-count, never let a guess through uncounted.
//!
//! The cost: a successful answer holds its unit while the app works on
//! it, so a burst of successes larger than what is left is refused in
//! part (docs/LIMITS.md, "Limits that know the answer").

use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use tokio::time::Instant;

use crate::limit::{Micros, Outcome, Policy};
use crate::route::CostRead;
use crate::store::{Evaluation, EvaluationId, Source, Store};
use crate::subject::Pseudonym;

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
    /// The response was not charged: the reservation went back.
    GivenBack,
}

impl Charged {
    pub const ALL: [Charged; 5] = [
        Charged::Full,
        Charged::TookRest,
        Charged::Spent,
        Charged::NoDecision,
        Charged::GivenBack,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Charged::Full => "charged",
            Charged::TookRest => "took_rest",
            Charged::Spent => "spent",
            Charged::NoDecision => "no_decision",
            Charged::GivenBack => "given_back",
        }
    }
}

/// What a response owes one limit charged on response.
pub(in crate::proxy) struct Due {
    units: u32,
    read: CostRead,
}

impl Due {
    pub fn units(&self) -> u32 {
        self.units
    }
}

/// What `check`, a limit charged on response, is owed by a response with
/// `status` and `headers`; `None` when this response charges nothing.
pub(in crate::proxy) fn due(check: &Check<'_>, status: u16, headers: &HeaderMap) -> Option<Due> {
    let limit = check.limit();
    let (units, read) = limit.on_response()?.units(status, headers, limit.cost)?;
    Some(Due { units, read })
}

/// What `check` is owed when the app did not answer within
/// `upstream.timeout`
/// ([`OnResponse::units_timed_out`](crate::route::OnResponse::units_timed_out)).
pub(in crate::proxy) fn due_timed_out(check: &Check<'_>) -> Option<Due> {
    let limit = check.limit();
    let (units, read) = limit.on_response()?.units_timed_out(limit.cost);
    Some(Due { units, read })
}

/// What a limit charged on response took before forwarding.
#[derive(Debug, Clone, Copy)]
pub(in crate::proxy) struct Reservation {
    pub units: u32,
    /// The evaluation that took them, whose record gives them back.
    pub id: EvaluationId,
    /// The memory store's time of decision ([`crate::store::Outcomes::at`]).
    pub at: Micros,
}

/// One limit to settle once the response head is in (or it is known that
/// none will come).
pub(in crate::proxy) struct Settlement {
    pub policy: Arc<Policy>,
    pub subject: Pseudonym,
    /// `None`: nothing was reserved (a shadow denial, no decision under
    /// `on_failure: allow`, the local fallback), and what is due is
    /// charged as it is.
    pub reserved: Option<Reservation>,
    /// What the response owes; `None`: nothing.
    pub due: Option<Due>,
    pub counters: Option<OnResponseCounters>,
}

impl Settlement {
    /// The settlement of `check`, a limit charged on response; `None` for
    /// a limit that is not.
    pub fn of(
        check: &Check<'_>,
        reserved: Option<Reservation>,
        due: Option<Due>,
    ) -> Option<Settlement> {
        let limit = check.limit();
        limit.on_response()?;
        Some(Settlement {
            policy: limit.policy.as_rate()?.clone(),
            subject: check.subject,
            reserved,
            due,
            counters: check.entry.metrics.on_response(check.limit),
        })
    }
}

/// Settles `settlement` in a task of its own, within `budget` per store
/// call.
pub(in crate::proxy) fn settle(store: &Arc<Store>, settlement: Settlement, budget: Duration) {
    let store = store.clone();
    tokio::spawn(async move {
        let Settlement {
            policy,
            subject,
            reserved,
            due,
            counters,
        } = settlement;
        let read = due.as_ref().map_or(CostRead::Exact, |due| due.read);
        let owed = due.as_ref().map(Due::units);
        let charged = match (reserved, owed) {
            (None, None) => return,
            (None, Some(0)) => Charged::Full,
            (None, Some(units)) => take(&store, &policy, &subject, units, budget).await,
            (Some(r), owed) => {
                let owed = owed.unwrap_or(0);
                let evaluation = Evaluation {
                    policy: &policy,
                    subject: &subject,
                    cost: r.units,
                    deadline: Instant::now() + budget,
                    id: r.id,
                    settle_within: None,
                };
                // A refund that cannot be made leaves the reservation
                // charged: counted so.
                let given = owed < r.units
                    && store
                        .refund_reserved(&evaluation, r.at, r.units - owed)
                        .await;
                match owed.checked_sub(r.units) {
                    None if owed == 0 && given => Charged::GivenBack,
                    None | Some(0) => Charged::Full,
                    Some(more) => match take(&store, &policy, &subject, more, budget).await {
                        Charged::Full => Charged::Full,
                        Charged::NoDecision => Charged::NoDecision,
                        // The reservation was charged: some of it was taken.
                        Charged::TookRest | Charged::Spent | Charged::GivenBack => {
                            Charged::TookRest
                        }
                    },
                }
            }
        };
        if let Some(counters) = &counters {
            counters.count(charged, read);
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
            id: EvaluationId::fresh(),
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
