//! The per-request service: validate → normalize the path → route (once
//! per method the request may run as) → subjects (one per limit) →
//! concurrency places → every rate limit at once → the judgement
//! ([`plan`]: pure, from the outcomes) → counted once → forward or answer.
//!
//! The decision is made before any byte of the request goes upstream.
//!
//! A request is checked against every limit of every route it matched,
//! together: all must let it through, and one refused consumes nothing of
//! any. Concurrency places are taken first (a cheap local try), then the
//! rate limits are asked in one store call; a request refused by either
//! gives its places back at once, so a 429 or 503 never holds one, and a
//! request refused for concurrency has charged no rate limit. The places
//! of a forwarded request are held by its response body, released when it
//! ends or the client goes away.

use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;

use futures_util::future::Either;
use futures_util::FutureExt as _;
use http::uri::PathAndQuery;
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use hyper::body::Incoming;
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::config::{Live, Underscores};
use crate::limit::{Decision, LimitPolicy, Outcome};
use crate::path;
use crate::route::{Limit, PathMatch, Route};
use crate::store::in_flight::{InFlight, Permit};
use crate::store::{Evaluation, Outcomes, Source, Store};
use crate::subject::{self, Pseudonym, Resolved, UnreadableForwardedFor};

use super::body::Body;
use super::buffered::{Buffering, Inbound, Stopped};
use super::fallback::Fallback;
use super::headers::{self, Invalid};
use super::metrics::{request_refused, DecisionSource, ProxyMetrics};
use super::overrides::{self, Methods, MAX_METHODS};
use super::respond::{self, Prepared};
use super::runtime::{Entry, LimitState, Runtime, SharedRuntime};
use super::underscores;
use super::untrusted_forwarder::UntrustedForwarder;
use super::upstream::Tunnels;
use super::upstream::{self, Upstream, UpstreamError};
use super::verdict::Verdict;
use super::ConnInfo;
use on_response::Reservation;
use plan::{Judgement, Passed, Refusal};
use std::time::Duration;

pub struct Proxy {
    runtime: SharedRuntime,
    store: Arc<Store>,
    /// Decides `on_failure: local` policies while the store cannot.
    fallback: Arc<Fallback>,
    /// Requests in flight per concurrency policy and subject; outlives
    /// reloads, as the requests it counts do.
    in_flight: Arc<InFlight>,
    /// Request bodies received before their request takes its places.
    buffering: Arc<Buffering>,
    upstream: Upstream,
    tunnels: Tunnels,
    metrics: ProxyMetrics,
    untrusted_forwarder: UntrustedForwarder,
}

/// One limit of a route the request matched, and the subject it counts.
#[derive(Clone, Copy)]
pub(super) struct Check<'r> {
    pub entry: Entry<'r>,
    /// The route's position among those the request matched.
    pub route_at: usize,
    /// Its index in `entry.route.limits`.
    pub limit: usize,
    pub subject: Pseudonym,
    /// How the subject was found (for `POST /explain`).
    pub resolved: Resolved,
    /// The request's tier on this route (0 for a route without tiers).
    pub tier: u8,
}

impl<'r> Check<'r> {
    pub fn limit(&self) -> &'r Limit {
        &self.entry.route.limits[self.limit]
    }

    pub fn state(&self) -> &'r LimitState {
        &self.entry.limits[self.limit]
    }

    /// The answers of this limit to a request of its tier.
    pub fn responses(&self) -> &'r Prepared {
        let responses = &self.state().responses;
        responses
            .get(usize::from(self.tier))
            .unwrap_or(&responses[0])
    }
}

/// Where routing leaves a request: matched, with a check for each of its
/// limits, or answered already.
// Made once a request and matched at once: boxing the larger side would
// allocate on every request to spare a move.
#[allow(clippy::large_enum_variant)]
enum Routing<'r> {
    Routed(Matched<'r>, SmallVec<[Check<'r>; 2]>),
    Answered(Response<Body>),
}

/// A request every limit let through.
struct Admitted<'r> {
    /// The `RateLimit` fields the response carries: of the rate limit with
    /// the least remaining (the first of them on ties).
    ratelimit: Option<(&'r Prepared, Decision)>,
    /// Its concurrency places, given back with the response body.
    permits: SmallVec<[Permit; 1]>,
    /// What the limits charged on response reserved.
    reservations: Reservations,
}

impl<'r> Admitted<'r> {
    /// Its `RateLimit` fields apart from what it holds. Taken whole (a
    /// field moved out of a local leaves the local's room in the future).
    fn split(self) -> (Option<(&'r Prepared, Decision)>, exchange::Held) {
        let held = exchange::Held {
            permits: self.permits,
            reservations: self.reservations,
        };
        (self.ratelimit, held)
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
fn settle_within(live: &Live) -> std::time::Duration {
    live.upstream.timeout + 2 * live.store.budget + std::time::Duration::from_secs(10)
}

impl Proxy {
    pub fn new(
        runtime: SharedRuntime,
        store: Arc<Store>,
        fallback: Arc<Fallback>,
        upstream: Upstream,
    ) -> Proxy {
        Proxy {
            metrics: ProxyMetrics::new(store.kind()),
            runtime,
            store,
            fallback,
            in_flight: InFlight::new(),
            buffering: Buffering::new(),
            upstream,
            tunnels: Tunnels::new(),
            untrusted_forwarder: UntrustedForwarder::new(),
        }
    }

    pub async fn handle(
        self: &Arc<Self>,
        request: Request<Incoming>,
        conn: &ConnInfo,
    ) -> Response<Body> {
        let arrival = Instant::now();
        // Loaded once: a reload mid-request does not change the rules it
        // is judged by.
        let runtime = self.runtime.load_full();
        let live = &*runtime.live;
        // Routed in a function of its own: what routing leaves behind (the
        // rest of `Routed`, the rewritten target) is dropped there, not
        // kept in this future through every await. The request is lent to
        // routing within this block: a local once lent keeps its room in
        // the future to the end of its scope, moved out or not.
        let (request, matched, checks) = {
            let mut request = request;
            if live.identity.trusted_proxies.is_empty() {
                self.untrusted_forwarder
                    .observe(conn.peer.ip(), request.headers());
            }
            match self.routed(&runtime, &mut request, conn, arrival) {
                Routing::Routed(matched, checks) => (request, matched, checks),
                Routing::Answered(response) => return response,
            }
        };

        // A body that fits the buffer arrives whole before the request
        // takes a place in flight: a slow upload holds none (`buffered`).
        let request = match self.buffering.receive(request, &checks, live).await {
            Ok(request) => request,
            Err(stopped) => return self.stopped(stopped, arrival),
        };
        // The decision's budget starts now, however long the body took.
        let arrival = Instant::now();

        let admitted = match self.admit(&matched, &checks, live, arrival).await {
            Ok(admitted) => admitted,
            Err(response) => {
                let (parts, body) = request.into_parts();
                body.discard(&parts.headers, live);
                return response;
            }
        };

        let primary = matched.primary();
        let (mut ratelimit, held) = admitted.split();
        // Chosen within this block, awaited past it: what the request holds
        // is moved into the exchange or dropped here, and only what the
        // response needs (its `RateLimit` fields) is kept beside the
        // forward's future.
        let exchange = match exchange::needed(&checks, held) {
            Some(held) => {
                let (proxy, runtime) = (self.clone(), runtime.clone());
                // Boxed, as every branch most requests never reach: a
                // request's future is as large as its largest branch, and
                // is moved whole into hyper's slot for each request,
                // refusals included.
                Either::Left(Box::pin(exchange::run(
                    proxy,
                    runtime,
                    request,
                    conn.clone(),
                    primary.at,
                    &checks,
                    held,
                )))
            }
            // Nothing held or owed: the exchange may go with the client.
            None => Either::Right(
                self.forward(request, conn, live, primary)
                    .map(|(response, _)| (response, exchange::Charges::new())),
            ),
        };
        let (mut response, charges) = exchange.await;
        counted_in_ratelimit(&checks, &charges, &mut ratelimit);
        if let Some((prepared, decision)) = ratelimit {
            if !response.status().is_informational() {
                respond::add_ratelimit_headers(response.headers_mut(), prepared, &decision);
            }
        }
        response
    }

    /// Routes `request`: the routes it matched and the check of each of
    /// their limits, with the request made what the app receives (the
    /// matched path, no underscored or unbelieved tier fields); or the
    /// answer that ends it.
    fn routed<'r>(
        &self,
        runtime: &'r Runtime,
        request: &mut Request<Incoming>,
        conn: &ConnInfo,
        arrival: Instant,
    ) -> Routing<'r> {
        let routed = prepare(
            runtime,
            request.method(),
            request.version(),
            request.uri(),
            request.headers(),
            conn.peer.ip(),
        );
        let Routed {
            matched,
            rewritten,
            checks,
            drop_underscored,
            exempted,
            ..
        } = match routed {
            Ok(Destination::Routes(routed)) => routed,
            Ok(Destination::Sluice) => return Routing::Answered(respond::server_options()),
            Ok(Destination::Denied(entry)) => {
                entry.metrics.denied();
                // Logged as other refusals are: a few a second per route.
                if entry.log_budget.take(arrival) {
                    tracing::info!(
                        route = %entry.route.name,
                        outcome = "address_denied",
                        forwarded = false,
                        "decision"
                    );
                }
                return Routing::Answered(respond::forbidden(&entry.route.name));
            }
            Err(invalid) => return Routing::Answered(refuse(&invalid)),
        };
        for (entry, limit) in exempted {
            entry.metrics.exempted(limit);
        }
        if drop_underscored {
            underscores::remove(request.headers_mut());
        }
        // A tier header from a peer not in `trusted_from` chose nothing,
        // and the app must not read it either, on whatever route: an app
        // behind a route without tiers may read the plan all the same.
        for header in runtime.routes.unbelieved_tier_headers(conn.peer.ip()) {
            request.headers_mut().remove(header);
        }
        // From here on the request carries the path that was matched, and
        // the app receives exactly that.
        if let Some(uri) = rewritten {
            *request.uri_mut() = uri;
        }
        Routing::Routed(matched, checks)
    }

    /// The answer to a request that ended while its body was received;
    /// one refused for the streaming share is counted as over its limit.
    fn stopped(&self, stopped: Stopped<'_, '_>, arrival: Instant) -> Response<Body> {
        match stopped {
            Stopped::Body(broken) => broken.response(),
            Stopped::Streaming { check, retry_after } => {
                let verdict = Verdict::ConcurrencyDenied;
                self.count_one(check.entry, check.limit, verdict, arrival);
                respond::over_concurrency(check.responses(), retry_after)
            }
        }
    }

    /// Every limit of every matched route, together: `Ok` to forward (with
    /// what the response needs), or the answer that ends the request.
    async fn admit<'r>(
        &self,
        matched: &Matched<'r>,
        checks: &[Check<'r>],
        live: &Live,
        arrival: Instant,
    ) -> Result<Admitted<'r>, Response<Body>> {
        if checks.is_empty() {
            // `policy: none` (or a tier that names it): nothing to take,
            // ask or wait for. Counted as every route's request is, and
            // spared the moves of an empty judgement through the rest.
            self.count(matched, checks, &Judgement::Passed(Passed::new()), arrival);
            return Ok(Admitted {
                ratelimit: None,
                permits: SmallVec::new(),
                reservations: Reservations::new(),
            });
        }
        let mut permits = SmallVec::new();
        // Judged within this block: what judging leaves (the judgement,
        // the turn) is lent here, and a local once lent keeps its room in
        // the future to the end of its scope; past it, only what a
        // `delay`ed request holds through its wait.
        let (ratelimit, reservations, waiting) = {
            let (judgement, reservations, turn) = match self.take_places(checks, &mut permits) {
                Some(refusal) => (Judgement::Refused(refusal), Reservations::new(), None),
                None => self.judge(checks, live, arrival).await,
            };
            // A request told to wait for its turn takes a place in its
            // limit's queue, or, the queue full, is refused and gives the
            // turn back.
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
                        return Err(self.queue_full(turn, live, arrival));
                    }
                }
            }
            self.count(matched, checks, &judgement, arrival);
            match judgement {
                // Its places go back as `permits` drops.
                Judgement::Refused(refusal) => return Err(refusal.response),
                Judgement::Passed(passed) => (passed.ratelimit, reservations, turn.zip(queued)),
            }
        };
        if let Some((turn, queued)) = waiting {
            // No place is held through the wait.
            drop(std::mem::take(&mut permits));
            permits = Box::pin(self.wait_for(turn, queued, checks, live, arrival)).await?;
        }
        Ok(Admitted {
            ratelimit,
            permits,
            reservations,
        })
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

    /// Asks the store for every rate limit at once, the local fallback for
    /// those it leaves to it, and judges the request by the answers
    /// ([`plan`]). What the store charged a refused request goes back.
    async fn judge<'a, 'r>(
        &self,
        checks: &'a [Check<'r>],
        live: &Live,
        arrival: Instant,
    ) -> (Judgement<'a, 'r>, Reservations, Option<turn::Turn<'a, 'r>>) {
        let deadline = arrival + live.store.budget;
        let (limits, evaluations) = plan::asked(checks, deadline, settle_within(live));
        if limits.is_empty() {
            return (Judgement::Passed(Passed::new()), Reservations::new(), None);
        }
        let outcomes = &self.store.evaluate_all(&evaluations).await;
        let judgement = self.judged(&limits, &evaluations, outcomes, live, arrival);
        if let Judgement::Refused(_) = judgement {
            self.store.give_back(&evaluations, outcomes).await;
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
        (
            judgement,
            reservations,
            turn(&limits, &evaluations, outcomes),
        )
    }

    /// The judgement of the store's `outcomes` for `limits`, with the local
    /// fallback's for those it left to it. Apart from [`Proxy::judge`]: the
    /// plan it reads (about 400 bytes) would otherwise keep its room in
    /// every request's future through the give-back that a refusal awaits.
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
            plan.settled(live)
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
    fn count_one(&self, entry: Entry<'_>, limit: usize, verdict: Verdict, arrival: Instant) {
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

    /// The response, and who gave it.
    fn forward<'a>(
        &'a self,
        request: Request<Inbound>,
        conn: &ConnInfo,
        live: &'a Live,
        entry: Entry<'a>,
    ) -> impl Future<Output = (Response<Body>, Answered)> + 'a {
        let sent = Instant::now();
        // Mapped, not awaited in an `async fn`: the future is the
        // exchange's and the little this adds, never a second copy of its
        // arguments (a request's future is moved whole into hyper's slot).
        upstream::forward(
            &self.upstream,
            request,
            conn,
            live,
            &entry.route.upgrades,
            &self.tunnels,
        )
        .map(move |response| match response {
            Ok(response) => {
                entry.metrics.upstream(response.status(), sent.elapsed());
                (response, Answered::App)
            }
            Err(error) => {
                entry.metrics.upstream_error(error);
                let answered = match error {
                    UpstreamError::Timeout => Answered::TimedOut,
                    _ => Answered::Sluice,
                };
                (error.response(), answered)
            }
        })
    }

    /// Whether `peer` is one of `identity.trusted_proxies` as configured
    /// now (the listener asks it of each new connection).
    pub fn trusts(&self, peer: std::net::IpAddr) -> bool {
        let runtime = self.runtime.load();
        crate::subject::resolve::trusted_peer(peer, &runtime.live.identity.trusted_proxies)
    }

    /// The local fallback, for its upkeep (sweeping, metrics).
    pub fn fallback(&self) -> &Arc<Fallback> {
        &self.fallback
    }

    /// Lets upgraded connections run until `deadline`, then cuts them.
    pub async fn drain_tunnels(&self, deadline: Instant) {
        self.tunnels.drain(deadline).await;
    }
}

/// Who answered a forwarded request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Answered {
    /// The app: its response head came.
    App,
    /// Nobody in time: sluice's 504 for `upstream.timeout`.
    TimedOut,
    /// sluice, for any other failure of the exchange (502, 408, 400).
    Sluice,
}

/// Counts each charge made on response in the `RateLimit` fields, when
/// they are the fields of the limit charged: the decision left what its
/// reservation did not take; what is left is what the response owes.
fn counted_in_ratelimit<'r>(
    checks: &[Check<'r>],
    charges: &exchange::Charges,
    ratelimit: &mut Option<(&'r Prepared, Decision)>,
) {
    let Some((prepared, decision)) = ratelimit else {
        return;
    };
    for (index, check) in checks.iter().enumerate() {
        if check.limit().on_response().is_none() || !std::ptr::eq(*prepared, check.responses()) {
            continue;
        }
        let units = charges
            .iter()
            .find(|(at, _)| *at == index)
            .map_or(0, |(_, units)| *units);
        let before = decision.remaining + u64::from(check.limit().reserved_units());
        decision.remaining = before.saturating_sub(u64::from(units));
    }
}

/// The answer to the stand-in of an HTTP/1 head whose body cannot be
/// framed (`server::framing`), counted.
pub fn refuse_unframed_body() -> Response<Body> {
    refuse(&Invalid::UnframedBody)
}

fn refuse(invalid: &Invalid) -> Response<Body> {
    tracing::debug!(reason = invalid.reason(), "request refused");
    request_refused(invalid.label());
    refusal(invalid)
}

/// The answer to a request refused before any decision; counted by the
/// caller (an explanation builds it without counting it).
pub(super) fn refusal(invalid: &Invalid) -> Response<Body> {
    match invalid {
        Invalid::TransferCoding => respond::closing(respond::not_implemented(invalid.reason())),
        Invalid::Connect => respond::not_implemented(invalid.reason()),
        // A malformed request line or Host: what else the client sent on
        // the connection is not to be trusted either (nginx closes after
        // a 400 too).
        Invalid::BadHost
        | Invalid::RequestTarget
        | Invalid::MissingHost
        | Invalid::DuplicateHost
        | Invalid::HostMismatch
        | Invalid::MethodCase
        | Invalid::UnframedBody => respond::closing(respond::bad_request(invalid.reason())),
        // A well-framed request refused for what it asks: the connection
        // stays usable.
        Invalid::ConnectionNamesIdentity(_)
        | Invalid::Path(_)
        | Invalid::DuplicateIdentity(_)
        | Invalid::DuplicateRouteHeader(_)
        | Invalid::DuplicateRouteParameter
        | Invalid::ForwardedFor
        | Invalid::MethodOverride
        | Invalid::AsteriskForm
        | Invalid::UnderscoreHeader
        | Invalid::UnderscoreStandsFor(_) => respond::bad_request(invalid.reason()),
    }
}

mod exchange;
pub(super) mod on_response;
pub(super) mod plan;
mod prepare;
mod turn;

pub(super) use prepare::{facts, prepare, Destination, Matched, Routed};
