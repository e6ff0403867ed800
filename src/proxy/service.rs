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
use http::uri::PathAndQuery;
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use hyper::body::Incoming;
use smallvec::SmallVec;
use tokio::time::Instant;

use crate::config::{Live, Underscores};
use crate::limit::Decision;
use crate::path;
use crate::route::{Limit, PathMatch};
use crate::store::in_flight::InFlight;
use crate::store::Store;
use crate::subject::{self, Pseudonym, Resolved, UnreadableForwardedFor};

use super::body::Body;
use super::buffered::{Buffering, Inbound, Stopped};
use super::fallback::Fallback;
use super::headers::{self, Invalid};
use super::metrics::{request_refused, ProxyMetrics};
use super::overrides::{self, Methods, MAX_METHODS};
use super::respond::{self, Prepared};
use super::runtime::{Entry, LimitState, Runtime, SharedRuntime};
use super::underscores;
use super::untrusted_forwarder::UntrustedForwarder;
use super::upstream::{self, Upstream, UpstreamError};
use super::verdict::Verdict;
use super::ConnInfo;

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
            untrusted_forwarder: UntrustedForwarder::new(),
        }
    }

    /// The answer to `request`, which came on the connection `conn`.
    ///
    /// A function that returns its future rather than an `async fn`: an
    /// `async fn` moves its arguments into locals of its own, and the
    /// request would take its room twice in a future that hyper moves
    /// whole for each request. The future owns what it borrows from, so
    /// that the listener holds it as it is, with nothing of its own.
    // Not the `async fn` clippy suggests, for the reason above.
    #[allow(clippy::manual_async_fn)]
    pub fn handle(
        self: Arc<Self>,
        mut request: Request<Incoming>,
        conn: Arc<ConnInfo>,
    ) -> impl Future<Output = Response<Body>> + Send + 'static {
        async move {
            let conn = &*conn;
            let arrival = Instant::now();
            // Loaded once: a reload mid-request does not change the rules it
            // is judged by.
            let runtime = self.runtime.load_full();
            let live = &*runtime.live;
            // Routed in a function of its own: what routing leaves behind (the
            // rest of `Routed`, the rewritten target) is dropped there, not
            // kept in this future through every await. The request is lent to
            // routing where it was captured: moved into a local, it would
            // take its room in the future twice.
            if live.identity.trusted_proxies.is_empty() {
                self.untrusted_forwarder
                    .observe(conn.peer.ip(), request.headers());
            }
            let (matched, checks) = match self.routed(&runtime, &mut request, conn, arrival) {
                Routing::Routed(matched, checks) => (matched, checks),
                Routing::Answered(response) => return response,
            };

            // A body that fits the buffer arrives whole before the request
            // takes a place in flight: a slow upload holds none (`buffered`).
            let mut arrival = arrival;
            let request = if Buffering::receives_first(&request, &checks, live) {
                match self.buffering.receive(request, &checks, live).await {
                    Ok(request) => {
                        // The decision's budget starts once the body is in,
                        // however long it took.
                        arrival = Instant::now();
                        request
                    }
                    Err(stopped) => return self.stopped(stopped, arrival),
                }
            } else {
                request.map(Inbound::Arriving)
            };

            // Most admissions end at once; only the rest are awaited. The
            // answer is matched where it is made: a named local would keep its
            // room in the future to the end of the scope.
            let admitted = match match self.admit(&matched, &checks, live, arrival) {
                Either::Left(now) => now.into_inner(),
                Either::Right(later) => later.await,
            } {
                Ok(admitted) => admitted,
                Err(response) => {
                    let (parts, body) = request.into_parts();
                    body.discard(&parts.headers, live);
                    return response;
                }
            };

            let primary = matched.primary();
            let (mut ratelimit, held) = admitted.split();
            // What the request holds is moved into the exchange, or was
            // dropped by `needed`: only what the response needs (its
            // `RateLimit` fields) is kept beside the forward's future. Each
            // branch awaits its own future where it is made: one chosen here
            // and awaited past the `match` was copied once more, into an
            // `Either`, on its way to the await (the forward's future is
            // about 1,400 bytes).
            let (mut response, charges) = match exchange::needed(&checks, held) {
                Some(held) => {
                    let (proxy, runtime) = (self.clone(), runtime.clone());
                    // Boxed, as every branch most requests never reach: a
                    // request's future is as large as its largest branch, and
                    // is moved whole into hyper's slot for each request,
                    // refusals included.
                    Box::pin(exchange::run(
                        proxy,
                        runtime,
                        request,
                        conn.clone(),
                        primary.at,
                        &checks,
                        held,
                    ))
                    .await
                }
                // Nothing held or owed: the exchange may go with the client.
                None => {
                    self.forward(request, conn, live, primary, |response, _| {
                        (response, exchange::Charges::new())
                    })
                    .await
                }
            };
            counted_in_ratelimit(&checks, &charges, &mut ratelimit);
            if let Some((prepared, decision)) = ratelimit {
                if !response.status().is_informational() {
                    respond::add_ratelimit_headers(response.headers_mut(), prepared, &decision);
                }
            }
            response
        }
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

    /// What `done` makes of the response and who gave it.
    fn forward<'a, T>(
        &'a self,
        request: Request<Inbound>,
        conn: &ConnInfo,
        live: &'a Live,
        entry: Entry<'a>,
        done: impl FnOnce(Response<Body>, Answered) -> T + 'a,
    ) -> impl Future<Output = T> + 'a {
        let sent = Instant::now();
        // Not awaited in an `async fn`: the future is the exchange's and
        // the little `done` adds, never a second copy of its arguments (a
        // request's future is moved whole into hyper's slot).
        upstream::forward(
            &self.upstream,
            request,
            sent,
            conn,
            live,
            &entry.route.upgrades,
            move |response| match response {
                Ok(response) => {
                    entry.metrics.upstream(response.status(), sent.elapsed());
                    done(response, Answered::App)
                }
                Err(error) => {
                    entry.metrics.upstream_error(error);
                    let answered = match error {
                        UpstreamError::Timeout => Answered::TimedOut,
                        _ => Answered::Sluice,
                    };
                    done(error.response(), answered)
                }
            },
        )
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
        self.upstream.drain_tunnels(deadline).await;
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

mod admission;
mod exchange;
pub(super) mod on_response;
pub(super) mod plan;
mod prepare;
mod turn;

pub(super) use prepare::{facts, prepare, Destination, Matched, Routed};
