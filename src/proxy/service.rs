//! The per-request service: validate → route → subject → limit → one
//! exhaustive match on the outcome → forward or answer.
//!
//! The decision is made before any byte of the request goes upstream.

use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::time::Instant;

use crate::config::{self, Config, OnFailure, Route};
use crate::limit::{Decision, Outcome};
use crate::route::Limited;
use crate::runtime::SharedRuntime;
use crate::store::{Evaluation, EvaluationId, Store};
use crate::subject;
use crate::telemetry::{self, RouteMetrics};

use super::body::Body;
use super::forward::{self, Upstream};
use super::headers::{self, Invalid};
use super::respond;
use super::upgrade::Tunnels;
use super::verdict::{Failure, Verdict};
use super::ConnInfo;

pub struct Proxy {
    runtime: SharedRuntime,
    store: Arc<Store>,
    upstream: Upstream,
    tunnels: Tunnels,
    decision_duration: metrics::Histogram,
    forwarded_without_decision: metrics::Counter,
}

/// What the outcome asks of the request.
enum Action {
    /// To the upstream; with a decision when its `RateLimit` fields are to
    /// be added to the response.
    Forward {
        ratelimit: Option<Decision>,
    },
    Respond(Response<Body>),
}

impl Proxy {
    pub fn new(runtime: SharedRuntime, store: Arc<Store>, upstream: Upstream) -> Proxy {
        Proxy {
            decision_duration: telemetry::decision_duration(store.kind()),
            forwarded_without_decision: telemetry::forwarded_without_decision(),
            runtime,
            store,
            upstream,
            tunnels: Tunnels::new(),
        }
    }

    pub async fn handle(&self, request: Request<Incoming>, conn: &ConnInfo) -> Response<Body> {
        let arrival = Instant::now();
        let checked = headers::check_head(
            request.method(),
            request.version(),
            request.uri(),
            request.headers(),
        );
        if let Err(invalid) = checked {
            return refuse(&invalid);
        }

        // Loaded once: a reload mid-request does not change the rules it
        // is judged by.
        let runtime = self.runtime.load_full();
        let config = &*runtime.config;
        let entry = runtime.routes.find(request.method(), request.uri().path());
        let (route, metrics) = (&entry.route, &entry.metrics);
        if let Err(invalid) = headers::check_connection(request.headers(), &route.subject) {
            return refuse(&invalid);
        }

        let Some(limited) = &entry.limited else {
            metrics.request(Verdict::Unlimited.label());
            return self.forward(request, conn, config, metrics).await;
        };
        let policy = &*limited.policy;

        let (subject, _) = subject::resolve(
            &route.subject,
            &route.name,
            conn.peer.ip(),
            request.headers(),
            &config.identity,
            &runtime.key,
        );
        let evaluation = Evaluation {
            policy,
            subject: &subject,
            cost: route.cost,
            deadline: arrival + config.store.budget,
            id: EvaluationId::random(),
        };
        let outcome = self.store.evaluate(&evaluation).await;
        self.decision_duration
            .record(arrival.elapsed().as_secs_f64());
        let (verdict, action) = decide(outcome, route, limited, config);

        metrics.request(verdict.label());
        if verdict.forwarded_without_decision() {
            self.forwarded_without_decision.increment(1);
        }
        if verdict != Verdict::Allowed && metrics.may_log(arrival.into_std()) {
            tracing::info!(
                route = %route.name,
                policy = %policy.name,
                outcome = verdict.label(),
                forwarded = verdict.forwarded(),
                "decision"
            );
        }

        match action {
            Action::Respond(response) => response,
            Action::Forward { ratelimit } => {
                let mut response = self.forward(request, conn, config, metrics).await;
                if let Some(decision) = ratelimit {
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
        }
    }

    async fn forward(
        &self,
        request: Request<Incoming>,
        conn: &ConnInfo,
        config: &Config,
        metrics: &RouteMetrics,
    ) -> Response<Body> {
        let sent = Instant::now();
        let response = forward::forward(&self.upstream, request, conn, config, &self.tunnels).await;
        metrics.upstream(response.status(), sent.elapsed());
        response
    }

    /// Lets upgraded connections run until `deadline`, then cuts them.
    pub async fn drain_tunnels(&self, deadline: Instant) {
        self.tunnels.drain(deadline).await;
    }
}

/// The one place an [`Outcome`] becomes an action. No catch-all arm: a new
/// outcome must be decided here before sluice builds.
fn decide(
    outcome: Outcome,
    route: &Route,
    limited: &Limited,
    config: &Config,
) -> (Verdict, Action) {
    let (policy, store) = (&*limited.policy, &config.store);
    match outcome {
        Outcome::Allowed(decision) => {
            // A shadow policy is invisible to clients.
            let show = config.responses.ratelimit_headers_on_allowed && !policy.shadow;
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
        Outcome::Unavailable(reason) => fail(Failure::Unavailable(reason), limited, store),
        Outcome::Indeterminate => fail(Failure::Indeterminate, limited, store),
        Outcome::Incompatible(reason) => {
            let response = respond::incompatible(route, policy, reason, store.failure_retry_after);
            (Verdict::Incompatible(reason), Action::Respond(response))
        }
    }
}

/// No decision could be made: `on_failure` says what happens.
fn fail(failure: Failure, limited: &Limited, store: &config::Store) -> (Verdict, Action) {
    match store.on_failure {
        OnFailure::Deny => {
            let response = respond::unavailable(&limited.responses, store.failure_retry_after);
            (Verdict::FailedClosed(failure), Action::Respond(response))
        }
        OnFailure::Allow => (
            Verdict::FailedOpen(failure),
            Action::Forward { ratelimit: None },
        ),
    }
}

fn refuse(invalid: &Invalid) -> Response<Body> {
    tracing::debug!(reason = invalid.reason(), "request refused");
    telemetry::request_refused(invalid.label());
    match invalid {
        Invalid::TransferCoding | Invalid::Connect => respond::not_implemented(invalid.reason()),
        Invalid::MissingHost
        | Invalid::DuplicateHost
        | Invalid::HostMismatch
        | Invalid::ConnectionNamesIdentity(_) => respond::bad_request(invalid.reason()),
    }
}

#[cfg(test)]
mod tests;
