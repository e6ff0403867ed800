//! The per-request service: validate → normalize the path → route (once
//! per method the request may run as) → subjects → limits → one exhaustive
//! match on each outcome → forward or answer.
//!
//! The decision is made before any byte of the request goes upstream.

use std::net::IpAddr;
use std::sync::Arc;

use http::uri::PathAndQuery;
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::config::{self, Live, OnFailure};
use crate::limit::{Decision, Outcome};
use crate::path;
use crate::route::Route;
use crate::store::{Evaluation, EvaluationId, Source, Store};
use crate::subject::{self, Pseudonym, Resolved, UnreadableForwardedFor};

use super::body::Body;
use super::fallback::Fallback;
use super::forward::{self, Upstream};
use super::headers::{self, Invalid};
use super::metrics::{request_refused, ProxyMetrics};
use super::overrides::{self, Methods, MAX_METHODS};
use super::respond;
use super::runtime::{Entry, Limited, Runtime, SharedRuntime};
use super::upgrade::Tunnels;
use super::verdict::{Failure, Verdict};
use super::ConnInfo;

pub struct Proxy {
    runtime: SharedRuntime,
    store: Arc<Store>,
    /// Decides `on_failure: local` policies while the store cannot.
    fallback: Arc<Fallback>,
    upstream: Upstream,
    tunnels: Tunnels,
    metrics: ProxyMetrics,
}

/// What deciding alone needs, should the store not decide.
pub(super) struct Local<'a> {
    pub fallback: &'a Fallback,
    pub evaluation: &'a Evaluation<'a>,
    /// `false` for `POST /explain`: the local answer is read, not charged.
    pub charge: bool,
}

/// What the outcome asks of the request.
pub(super) enum Action {
    /// To the upstream; with a decision when its `RateLimit` fields are to
    /// be added to the response.
    Forward {
        ratelimit: Option<Decision>,
    },
    Respond(Response<Body>),
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
            upstream,
            tunnels: Tunnels::new(),
        }
    }

    pub async fn handle(&self, mut request: Request<Incoming>, conn: &ConnInfo) -> Response<Body> {
        let arrival = Instant::now();
        // Loaded once: a reload mid-request does not change the rules it
        // is judged by.
        let runtime = self.runtime.load_full();
        let live = &*runtime.live;
        let routed = prepare(
            &runtime,
            request.method(),
            request.version(),
            request.uri(),
            request.headers(),
            conn.peer.ip(),
        );
        let Routed {
            matched,
            rewritten,
            subjects,
        } = match routed {
            Ok(routed) => routed,
            Err(invalid) => return refuse(&invalid),
        };
        // From here on the request carries the path that was matched, and
        // the app receives exactly that.
        if let Some(uri) = rewritten {
            *request.uri_mut() = uri;
        }

        // Every route the request matched must let it through; the first
        // to refuse answers, and the ones after it are not charged.
        let mut ratelimit = None;
        for (entry, subject) in matched.iter().zip(&subjects) {
            let subject = subject.as_ref().map(|(pseudonym, _)| pseudonym);
            match self.check(entry, subject, live, arrival).await {
                Ok(allowed) => ratelimit = ratelimit.or(allowed),
                Err(response) => return response,
            }
        }

        let primary = matched.primary();
        let mut response = self.forward(request, conn, live, primary).await;
        if let Some((limited, decision)) = ratelimit {
            if !response.status().is_informational() {
                respond::add_ratelimit_headers(
                    response.headers_mut(),
                    &limited.responses,
                    &decision,
                );
            }
        }
        response
    }

    /// One route's limit for this request: `Ok` to go on (with the
    /// decision whose `RateLimit` fields the response should carry), or
    /// the answer that ends the request.
    async fn check<'r>(
        &self,
        entry: Entry<'r>,
        subject: Option<&Pseudonym>,
        live: &Live,
        arrival: Instant,
    ) -> Result<Option<(&'r Limited, Decision)>, Response<Body>> {
        let (route, metrics) = (entry.route, entry.metrics);
        let (Some(limited), Some(subject)) = (entry.limited, subject) else {
            metrics.request(&Verdict::Unlimited);
            return Ok(None);
        };
        let policy = &*limited.policy;
        let evaluation = Evaluation {
            policy,
            subject,
            cost: route.cost,
            deadline: arrival + live.store.budget,
            id: EvaluationId::random(),
        };
        let (outcome, source) = self.store.evaluate_sourced(&evaluation).await;
        if source == Source::Store && matches!(outcome, Outcome::Allowed(_) | Outcome::Denied(_)) {
            self.fallback.store_decided();
        }
        self.metrics
            .decision_duration
            .record(arrival.elapsed().as_secs_f64());
        let local = Local {
            fallback: &self.fallback,
            evaluation: &evaluation,
            charge: true,
        };
        let (verdict, action) = decide(outcome, route, limited, live, &local);

        metrics.request(&verdict);
        if verdict.forwarded_without_decision() {
            self.metrics.forwarded_without_decision.increment(1);
        }
        if verdict != Verdict::Allowed && entry.log_budget.take(arrival.into_std()) {
            tracing::info!(
                route = %route.name,
                policy = %policy.name,
                outcome = verdict.label(),
                forwarded = verdict.forwarded(),
                "decision"
            );
        }
        match action {
            Action::Respond(response) => Err(response),
            Action::Forward { ratelimit } => Ok(ratelimit.map(|decision| (limited, decision))),
        }
    }

    async fn forward(
        &self,
        request: Request<Incoming>,
        conn: &ConnInfo,
        live: &Live,
        entry: Entry<'_>,
    ) -> Response<Body> {
        let sent = Instant::now();
        let response = forward::forward(
            &self.upstream,
            request,
            conn,
            live,
            &entry.route.upgrades,
            &self.tunnels,
        )
        .await;
        entry.metrics.upstream(response.status(), sent.elapsed());
        response
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

/// What the routing half found for a request: the routes it matched, the
/// URI to forward when normalization changed the path, and the subject of
/// each limited route, in the order of `matched`.
pub(super) struct Routed<'r> {
    pub matched: Matched<'r>,
    pub rewritten: Option<Uri>,
    pub subjects: [Option<(Pseudonym, Resolved)>; MAX_METHODS],
}

/// Everything a request goes through before a store is asked: the head
/// checks, the identity headers, the methods it may run as, the path
/// normalized and routed, and every subject resolved. The proxy and
/// `POST /explain` both call it, so an explanation follows the very rules
/// a request is judged by.
pub(super) fn prepare<'r>(
    runtime: &'r Runtime,
    method: &Method,
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
    peer: IpAddr,
) -> Result<Routed<'r>, Invalid> {
    headers::check_head(method, version, uri, headers)?;
    let live = &*runtime.live;
    headers::check_identity_headers(headers, runtime.routes.identity_headers())?;
    let methods = overrides::methods(method, headers, uri.query())?;
    let (matched, rewritten) = route(runtime, &methods, uri, live)?;

    // Every subject is resolved before anything is charged, so a
    // request refused for one route consumes nothing of another.
    let mut subjects: [Option<(Pseudonym, Resolved)>; MAX_METHODS] = Default::default();
    for (entry, slot) in matched.iter().zip(subjects.iter_mut()) {
        let route = entry.route;
        headers::check_connection(headers, &route.subject)?;
        if entry.limited.is_some() {
            let resolved = subject::resolve(
                &route.subject,
                &route.name,
                peer,
                headers,
                &live.identity,
                &runtime.key,
            );
            match resolved {
                Ok(found) => *slot = Some(found),
                Err(UnreadableForwardedFor) => return Err(Invalid::ForwardedFor),
            }
        }
    }
    Ok(Routed {
        matched,
        rewritten,
        subjects,
    })
}

/// The one place an [`Outcome`] becomes an action (a local fallback's
/// outcome too, through [`decide_locally`]). No catch-all arm: a new
/// outcome must be decided here before sluice builds.
pub(super) fn decide(
    outcome: Outcome,
    route: &Route,
    limited: &Limited,
    live: &Live,
    local: &Local<'_>,
) -> (Verdict, Action) {
    let (policy, store) = (&*limited.policy, &live.store);
    match outcome {
        Outcome::Allowed(decision) => {
            // A shadow policy is invisible to clients.
            let show = live.responses.ratelimit_headers_on_allowed && !policy.shadow;
            let ratelimit = show.then_some(decision);
            (Verdict::Allowed, Action::Forward { ratelimit })
        }
        Outcome::Denied(decision) => {
            if policy.shadow {
                (Verdict::ShadowDenied, Action::Forward { ratelimit: None })
            } else {
                let response = respond::too_many_requests(&limited.responses, &decision);
                (Verdict::Denied, Action::Respond(response))
            }
        }
        Outcome::Unavailable(reason) => fail(Failure::Unavailable(reason), limited, live, local),
        Outcome::Indeterminate => fail(Failure::Indeterminate, limited, live, local),
        Outcome::Incompatible(reason) => {
            let response = respond::incompatible(route, policy, reason, store.failure_retry_after);
            (Verdict::Incompatible(reason), Action::Respond(response))
        }
    }
}

/// No decision could be made: `on_failure` (the policy's, else the
/// store's) says what happens.
fn fail(failure: Failure, limited: &Limited, live: &Live, local: &Local<'_>) -> (Verdict, Action) {
    let store = &live.store;
    match limited.policy.failure_mode(store.on_failure) {
        OnFailure::Deny => fail_closed(failure, limited, store),
        OnFailure::Allow => (
            Verdict::FailedOpen(failure),
            Action::Forward { ratelimit: None },
        ),
        OnFailure::Local => decide_locally(failure, limited, live, local),
    }
}

fn fail_closed(
    failure: Failure,
    limited: &Limited,
    store: &config::StoreLive,
) -> (Verdict, Action) {
    let response = respond::unavailable(&limited.responses, store.failure_retry_after);
    (Verdict::FailedClosed(failure), Action::Respond(response))
}

/// `on_failure: local`: this sidecar's share of the policy, decided here.
fn decide_locally(
    failure: Failure,
    limited: &Limited,
    live: &Live,
    local: &Local<'_>,
) -> (Verdict, Action) {
    let (policy, store) = (&limited.policy, &live.store);
    let (outcome, shared) = if local.charge {
        local
            .fallback
            .evaluate(local.evaluation, policy, store.local_share)
    } else {
        local
            .fallback
            .peek(local.evaluation, policy, store.local_share)
    };
    match outcome {
        // No `RateLimit` fields: the response would pair the shared
        // policy's `RateLimit-Policy` with a count kept here alone.
        Outcome::Allowed(_) => (Verdict::LocalAllowed, Action::Forward { ratelimit: None }),
        Outcome::Denied(_) if policy.shadow => (
            Verdict::LocalShadowDenied,
            Action::Forward { ratelimit: None },
        ),
        Outcome::Denied(decision) => {
            let response =
                respond::too_many_requests_local(&limited.responses, &shared.field, &decision);
            (Verdict::LocalDenied, Action::Respond(response))
        }
        // The local store is full (a newcomer is never given room by
        // forgetting someone), or the request costs more than the local
        // share could ever admit: no decision here either.
        Outcome::Unavailable(_) | Outcome::Indeterminate | Outcome::Incompatible(_) => {
            fail_closed(failure, limited, store)
        }
    }
}

/// The routes a request matched: one per distinct route its methods
/// found, the wire method's first. Nothing is allocated.
pub(super) struct Matched<'r> {
    entries: [Option<Entry<'r>>; MAX_METHODS],
}

impl<'r> Matched<'r> {
    pub(super) fn iter(&self) -> impl Iterator<Item = Entry<'r>> + '_ {
        self.entries.iter().flatten().copied()
    }

    /// The wire method's route: its metrics count the upstream's answer,
    /// and it says which upgrades pass.
    fn primary(&self) -> Entry<'r> {
        self.iter()
            .next()
            .expect("the wire method always finds a route (the default at worst)")
    }
}

/// Normalizes the path and finds the route of each method the request may
/// run as; the URI to forward when normalization changed the path.
fn route<'r>(
    runtime: &'r Runtime,
    methods: &Methods,
    uri: &Uri,
    live: &Live,
) -> Result<(Matched<'r>, Option<Uri>), Invalid> {
    let normal = path::normalize(uri.path(), &live.server.paths).map_err(Invalid::Path)?;
    let mut matched = Matched {
        entries: [None; MAX_METHODS],
    };
    for (i, method) in methods.iter().enumerate() {
        let entry = runtime.entry(runtime.routes.find(method, &normal.matching));
        if !matched_already(&matched.entries, entry.route) {
            matched.entries[i] = Some(entry);
        }
    }
    let rewritten = if normal.unchanged() {
        None
    } else {
        Some(with_path(uri, &normal.forward))
    };
    Ok((matched, rewritten))
}

fn matched_already(entries: &[Option<Entry>], route: &Route) -> bool {
    entries
        .iter()
        .flatten()
        .any(|e| std::ptr::eq(e.route, route))
}

/// `uri` with its path replaced and its query kept as sent.
fn with_path(uri: &Uri, path: &str) -> Uri {
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    // A normalized path holds only characters a URI path may: this parses.
    parts.path_and_query = PathAndQuery::try_from(path_and_query).ok();
    Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
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
        | Invalid::MethodCase => respond::closing(respond::bad_request(invalid.reason())),
        // A well-framed request refused for what it asks: the connection
        // stays usable.
        Invalid::ConnectionNamesIdentity(_)
        | Invalid::Path(_)
        | Invalid::DuplicateIdentity(_)
        | Invalid::ForwardedFor
        | Invalid::MethodOverride => respond::bad_request(invalid.reason()),
    }
}

#[cfg(test)]
mod tests;
