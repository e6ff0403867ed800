//! Admission: whether a routed request goes on. Its concurrency places
//! are taken first, then every rate limit is asked at once ([`plan`]
//! judges the answers), a `delay`ed request waits its turn, and the
//! request is counted once. What the request holds and the `RateLimit`
//! fields its response carries come back in [`Admitted`]: at once for a
//! request nothing is awaited for, which makes no future ([`Admission`]).

use std::future::{Future, Ready};
use std::pin::Pin;
use std::time::Duration;

use futures_util::future::Either;
use http::Response;
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::config::Live;
use crate::limit::{Decision, LimitPolicy, Outcome};
use crate::store::in_flight::Permit;
use crate::store::{Decided, Evaluation, Outcomes, Source};

use super::on_response::Reservation;
use super::plan::{self, Judgement, Passed, Refusal};
use super::{exchange, turn, Check, Matched, Proxy};
use crate::proxy::body::Body;
use crate::proxy::metrics::DecisionSource;
use crate::proxy::respond::{self, Prepared};
use crate::proxy::runtime::Entry;
use crate::proxy::verdict::Verdict;

/// A request every limit let through.
pub(super) struct Admitted<'r> {
    /// The `RateLimit` fields the response carries: of the rate limit with
    /// the least remaining (the first of them on ties).
    ratelimit: Option<(&'r Prepared, Decision)>,
    /// Its concurrency places and what its limits charged on response
    /// reserved.
    held: exchange::Held,
}

impl<'r> Admitted<'r> {
    /// Its `RateLimit` fields apart from what it holds. Taken whole (a
    /// field moved out of a local leaves the local's room in the future).
    pub(super) fn split(self) -> (Option<(&'r Prepared, Decision)>, exchange::Held) {
        (self.ratelimit, self.held)
    }
}

/// What each limit charged on response reserved: its index among the
/// request's checks, and the reservation.
type Reservations = SmallVec<[(usize, Reservation); 1]>;

/// The wait of a request some limit admitted on condition it wait for its
/// turn (`delay`): the longest of them, with every rate limit's charge to
/// give back should it not wait it out. `None` for a request that goes on
/// at once (shadow and local answers never wait).
fn turn<'a, 'r>(
    limits: &plan::Limits<'a, 'r>,
    evaluations: &[crate::store::Evaluation<'_>],
    outcomes: &crate::store::Outcomes,
) -> Option<turn::Turn<'a, 'r>> {
    let mut longest: Option<(Duration, &'a Check<'r>)> = None;
    for (i, outcome) in outcomes.iter() {
        if let (Outcome::Allowed(decision), Some(&(check, _))) = (outcome, limits.get(i)) {
            if decision.retry_after > longest.map_or(Duration::ZERO, |(w, _)| w) {
                longest = Some((decision.retry_after, check));
            }
        }
    }
    let (wait, check) = longest?;
    let owed = outcomes
        .iter()
        .filter(|(_, outcome)| matches!(outcome, Outcome::Allowed(_)))
        .filter_map(|(i, _)| {
            let (evaluation, &(_, policy)) = (evaluations.get(i)?, limits.get(i)?);
            Some(turn::Owed::new(evaluation, policy, outcomes.at))
        })
        .collect();
    Some(turn::Turn { wait, check, owed })
}

/// How long a reservation may wait for its settlement: the app's turn
/// (`upstream.timeout`) and a margin for the request body and the store
/// calls on either side. A settlement later than this finds nothing to
/// give back, and the reservation stands.
pub(super) fn settle_within(live: &Live) -> std::time::Duration {
    live.upstream.timeout + 2 * live.store.budget + std::time::Duration::from_secs(10)
}

/// How a request's admission ends: at once, for most (no limit, the
/// memory store, leases held here), or once a Redis call or a `delay`ed
/// turn is over. Only those make a future, boxed: the request's future
/// keeps no room for what most requests decide without one.
pub(super) type Admission<'f, 'r> =
    Either<Ready<Ended<'r>>, Pin<Box<dyn Future<Output = Ended<'r>> + Send + 'f>>>;

/// What admission ends with: the request admitted, or the answer that
/// ends it.
type Ended<'r> = Result<Admitted<'r>, Response<Body>>;

/// An admission ended at once.
fn now<'f, 'r>(ended: Ended<'r>) -> Admission<'f, 'r> {
    Either::Left(std::future::ready(ended))
}

/// A request whose limits are being asked of the store: dropped before
/// it is judged (its client went away and its future with it), it is
/// counted `client_closed` under each matched route's first limit. The
/// store may have charged it; nothing was forwarded.
struct Unanswered<'f, 'r> {
    proxy: &'f Proxy,
    matched: &'f Matched<'r>,
    checks: &'f [Check<'r>],
    arrival: Instant,
}

impl Drop for Unanswered<'_, '_> {
    fn drop(&mut self) {
        for (route_at, entry) in self.matched.iter().enumerate() {
            let limit = plan::first_limit(route_at, self.checks).unwrap_or(0);
            self.proxy
                .count_one(entry, limit, Verdict::ClientClosed, self.arrival);
        }
    }
}

/// What judging leaves: the judgement, what the limits charged on
/// response reserved, and the turn of a request told to wait for it.
type Judged<'a, 'r> = (Judgement<'a, 'r>, Reservations, Option<turn::Turn<'a, 'r>>);

impl Proxy {
    /// Every limit of every matched route, together: `Ok` to forward (with
    /// what the response needs), or the answer that ends the request.
    pub(super) fn admit<'f, 'r>(
        &'f self,
        matched: &'f Matched<'r>,
        checks: &'f [Check<'r>],
        live: &'f Live,
        arrival: Instant,
    ) -> Admission<'f, 'r> {
        if checks.is_empty() {
            // `policy: none` (or a tier that names it): nothing to take,
            // ask or wait for. Counted as every route's request is, and
            // spared the moves of an empty judgement through the rest.
            self.count(matched, checks, &Judgement::Passed(Passed::new()), arrival);
            return now(Ok(Admitted {
                ratelimit: None,
                held: exchange::Held {
                    permits: SmallVec::new(),
                    reservations: Reservations::new(),
                },
            }));
        }
        let mut permits = SmallVec::new();
        if let Some(refusal) = self.take_places(checks, &mut permits) {
            let judged = (Judgement::Refused(refusal), Reservations::new(), None);
            return self.admitted(matched, checks, judged, permits, live, arrival);
        }
        let deadline = arrival + live.store.budget;
        let (limits, evaluations) = plan::asked(checks, deadline, settle_within(live));
        if limits.is_empty() {
            let judged = (Judgement::Passed(Passed::new()), Reservations::new(), None);
            return self.admitted(matched, checks, judged, permits, live, arrival);
        }
        match self.store.decide_now(&evaluations) {
            // Nothing to give back for a refusal decided here: the memory
            // store charges a refused request nothing, and a lease's units
            // stay spent (`RedisStore::give_back`).
            Decided::Now(outcomes) => {
                let judged = self.judge(checks, &limits, &evaluations, &outcomes, live, arrival);
                self.admitted(matched, checks, judged, permits, live, arrival)
            }
            Decided::Ask(asking) => Either::Right(Box::pin(async move {
                let unanswered = Unanswered {
                    proxy: self,
                    matched,
                    checks,
                    arrival,
                };
                let outcomes = asking.ask(&evaluations).await;
                let judged = self.judge(checks, &limits, &evaluations, &outcomes, live, arrival);
                if let Judgement::Refused(_) = judged.0 {
                    self.store.give_back(&evaluations, &outcomes).await;
                }
                // Counted under its verdict from here on.
                std::mem::forget(unanswered);
                self.admitted(matched, checks, judged, permits, live, arrival)
                    .await
            })),
        }
    }

    /// The end of an admission once judged: counted, and refused, or
    /// admitted with what it holds; a request told to wait for its turn
    /// takes a place in its limit's queue and waits, or, the queue full, is
    /// refused and gives the turn back.
    fn admitted<'f, 'r>(
        &'f self,
        matched: &Matched<'r>,
        checks: &'f [Check<'r>],
        (judgement, reservations, turn): Judged<'f, 'r>,
        permits: SmallVec<[Permit; 1]>,
        live: &'f Live,
        arrival: Instant,
    ) -> Admission<'f, 'r> {
        let mut queued = None;
        if let (Judgement::Passed(_), Some(waiting)) = (&judgement, &turn) {
            let max = waiting
                .check
                .limit()
                .policy
                .as_rate()
                .and_then(|p| p.delay)
                .map_or(0, |d| d.max_queued);
            queued = turn::Queued::take(&waiting.check.state().waiting, max);
            if queued.is_none() {
                if let Some(turn) = turn {
                    return now(Err(self.queue_full(turn, live, arrival)));
                }
            }
        }
        self.count(matched, checks, &judgement, arrival);
        let ratelimit = match judgement {
            // Its places go back as `permits` drops.
            Judgement::Refused(refusal) => return now(Err(refusal.response)),
            Judgement::Passed(passed) => passed.ratelimit,
        };
        let Some((turn, queued)) = turn.zip(queued) else {
            let held = exchange::Held {
                permits,
                reservations,
            };
            return now(Ok(Admitted { ratelimit, held }));
        };
        // No place is held through the wait.
        drop(permits);
        Either::Right(Box::pin(async move {
            let permits = self.wait_for(turn, queued, checks, live, arrival).await?;
            let held = exchange::Held {
                permits,
                reservations,
            };
            Ok(Admitted { ratelimit, held })
        }))
    }

    /// The 429 of a request whose turn came with its limit's queue full:
    /// its turns go back first.
    fn queue_full(
        &self,
        turn: turn::Turn<'_, '_>,
        live: &Live,
        arrival: Instant,
    ) -> Response<Body> {
        let check = turn.check;
        turn::give_back(&self.store, turn.owed, live.store.budget);
        self.count_one(check.entry, check.limit, Verdict::Denied, arrival);
        let decision = Decision {
            allowed: false,
            band: 0,
            remaining: 0,
            reset_after: turn.wait,
            retry_after: turn.wait,
            approximate: false,
        };
        respond::too_many_requests(check.responses(), &decision)
    }

    /// Holds an admitted request for its turn, holding no concurrency
    /// place meanwhile (they were given back with `permits`); takes its
    /// places again after it. A client gone meanwhile, or no place after
    /// the wait, gives the turn back.
    async fn wait_for<'r>(
        &self,
        turn: turn::Turn<'_, 'r>,
        queued: turn::Queued<'_>,
        checks: &[Check<'r>],
        live: &Live,
        arrival: Instant,
    ) -> Result<SmallVec<[Permit; 1]>, Response<Body>> {
        let budget = live.store.budget;
        let unclaimed = turn::Unclaimed::new(&self.store, turn.owed, budget);
        tokio::time::sleep(turn.wait).await;
        let owed = unclaimed.claim();
        drop(queued);
        if let Some(delayed) = &turn.check.state().delayed {
            delayed.count.increment(1);
            delayed.waited.record(turn.wait.as_secs_f64());
        }
        let mut permits = SmallVec::new();
        if let Some(refusal) = self.take_places(checks, &mut permits) {
            turn::give_back(&self.store, owed, budget);
            self.count_one(
                refusal.check.entry,
                refusal.check.limit,
                refusal.verdict,
                arrival,
            );
            return Err(refusal.response);
        }
        Ok(permits)
    }

    /// Takes a place of every concurrency limit, a local try before any
    /// store is asked; the refusal of the first that has none free.
    fn take_places<'a, 'r>(
        &self,
        checks: &'a [Check<'r>],
        permits: &mut SmallVec<[Permit; 1]>,
    ) -> Option<Refusal<'a, 'r>> {
        for check in checks {
            if let LimitPolicy::Concurrency(policy) = &check.limit().policy {
                // Registered with the route: every concurrency limit has one.
                let noop = metrics::Gauge::noop();
                let gauge = check.entry.metrics.in_flight(check.limit).unwrap_or(&noop);
                match self.in_flight.try_acquire(policy, &check.subject, gauge) {
                    Some(permit) => permits.push(permit),
                    None => {
                        let responses = check.responses();
                        return Some(Refusal {
                            check,
                            verdict: Verdict::ConcurrencyDenied,
                            response: respond::over_concurrency(responses, policy.retry_after),
                        });
                    }
                }
            }
        }
        None
    }

    /// The judgement of the store's `outcomes` (and the local fallback's,
    /// for the limits it left to it), what the limits charged on response
    /// reserved, and the turn of a `delay`ed request.
    fn judge<'a, 'r>(
        &self,
        checks: &'a [Check<'r>],
        limits: &plan::Limits<'a, 'r>,
        evaluations: &[Evaluation<'a>],
        outcomes: &Outcomes,
        live: &Live,
        arrival: Instant,
    ) -> Judged<'a, 'r> {
        let judgement = self.judged(limits, evaluations, outcomes, live, arrival);
        if let Judgement::Refused(_) = judgement {
            return (judgement, Reservations::new(), None);
        }
        // What the store took for the limits charged on response, to be
        // settled when the app answers.
        let mut reservations = Reservations::new();
        for (i, outcome) in outcomes.iter() {
            let (Some(evaluation), Some(&(check, _))) = (evaluations.get(i), limits.get(i)) else {
                continue;
            };
            if check.limit().on_response().is_none() || !matches!(outcome, Outcome::Allowed(_)) {
                continue;
            }
            if let Some(index) = checks.iter().position(|c| std::ptr::eq(c, check)) {
                let reserved = Reservation {
                    units: evaluation.cost,
                    id: evaluation.id,
                    at: outcomes.at,
                };
                reservations.push((index, reserved));
            }
        }
        (judgement, reservations, turn(limits, evaluations, outcomes))
    }

    /// The judgement of the store's `outcomes` for `limits`, with the local
    /// fallback's for those it left to it.
    fn judged<'a, 'r>(
        &self,
        limits: &plan::Limits<'a, 'r>,
        evaluations: &[Evaluation<'a>],
        outcomes: &Outcomes,
        live: &Live,
        arrival: Instant,
    ) -> Judgement<'a, 'r> {
        let store_decided = outcomes.list.iter().any(plan::decided);
        if outcomes.source == Source::Store && store_decided {
            self.fallback.store_decided();
        }

        let rated = plan::rated(limits, evaluations);
        let plan = plan::plan(&rated, outcomes, live);
        let source = match outcomes.source {
            _ if plan.locals().next().is_some() => DecisionSource::Local,
            Source::Lease => DecisionSource::Lease,
            Source::DenyCache => DecisionSource::DenyCache,
            Source::Store if store_decided => DecisionSource::Store,
            Source::Store => DecisionSource::Failed,
        };
        self.metrics.decided(source, arrival.elapsed());
        if plan.locals().next().is_none() {
            plan.settled()
        } else {
            let asked: SmallVec<[_; 2]> = plan.locals().collect();
            let share = live.store.local_share;
            let (local, shared) = if plan.refused() {
                // Refused anyway: the local limits before the refusing
                // one are only read, to find whether one of them refuses
                // first.
                self.fallback.enter();
                self.fallback.peek_all(&asked, share)
            } else {
                self.fallback.evaluate_all(&asked, share)
            };
            plan.settle(&local, &shared, live)
        }
    }

    /// Counts the request: once, under the route and limit that refused
    /// it; or, when it goes on, once per matched route, under the limit
    /// whose verdict is not Allowed (a shadow denial, no decision under
    /// `on_failure: allow`) or else the route's first.
    fn count(
        &self,
        matched: &Matched<'_>,
        checks: &[Check<'_>],
        judgement: &Judgement<'_, '_>,
        arrival: Instant,
    ) {
        match judgement {
            Judgement::Refused(refusal) => {
                let check = refusal.check;
                self.count_one(check.entry, check.limit, refusal.verdict, arrival);
            }
            Judgement::Passed(passed) => {
                for (route_at, entry) in matched.iter().enumerate() {
                    let (limit, verdict) = passed.counted(route_at, checks);
                    self.count_one(entry, limit, verdict, arrival);
                    for &(_, near) in passed.near.iter().filter(|(at, _)| *at == route_at) {
                        entry.metrics.near_limit(near);
                    }
                }
            }
        }
    }

    /// Counts one request under `entry`'s route and the policy of its limit
    /// `limit`, and logs what was not a plain pass (a few a second per
    /// route at most).
    pub(super) fn count_one(
        &self,
        entry: Entry<'_>,
        limit: usize,
        verdict: Verdict,
        arrival: Instant,
    ) {
        entry.metrics.request(limit, &verdict);
        if verdict.forwarded_without_decision() {
            self.metrics.forwarded_without_decision.increment(1);
        }
        let plain = matches!(verdict, Verdict::Allowed | Verdict::Unlimited);
        if !plain && entry.log_budget.take(arrival) {
            let policy = entry
                .route
                .limits
                .get(limit)
                .map_or("none", |l| &**l.policy.name());
            tracing::info!(
                route = %entry.route.name,
                policy = %policy,
                outcome = verdict.label(),
                forwarded = verdict.forwarded(),
                "decision"
            );
        }
    }
}
