//! The proxy's metric handles, registered once: per route when a
//! configuration loads, per process for the rest. The request path does
//! no registry lookups and no label allocations, and every series exists
//! (at 0) from the start, which also makes `rate()` well defined before
//! the first event.

use std::time::Duration;

use http::StatusCode;
use metrics::{Counter, Gauge, Histogram};

use crate::limit::LimitPolicy;
use crate::route::{CostRead, Route, SubjectSource};

use crate::telemetry::{
    DECISION_DURATION, FORWARDED_WITHOUT_DECISION, IN_FLIGHT, NEAR_LIMIT, REQUESTS,
    REQUESTS_DENIED, REQUESTS_EXEMPTED, REQUESTS_REFUSED, REQUEST_BODIES_CUT, RESPONSE_CHARGES,
    RESPONSE_COST_FALLBACKS, UNDECODABLE_CREDENTIALS, UPSTREAM_DURATION, UPSTREAM_ERRORS,
    UPSTREAM_RESPONSES,
};

use super::body::Cut;
use super::headers::Invalid;
use super::service::on_response::Charged;
use super::upstream::UpstreamError;
use super::verdict::{OutcomeLabel, Verdict};

const STATUS_CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

/// The handles counted under one route's name.
pub struct RouteMetrics {
    /// Per limit of the route (one, `policy="none"`, for a route without
    /// limits), each indexed by [`OutcomeLabel`]: every verdict has its
    /// counter under every policy.
    requests: Box<[[Counter; OutcomeLabel::ALL.len()]]>,
    /// Per limit of the route: requests in flight under its policy, for a
    /// concurrency limit. Labelled by policy alone, so every route naming
    /// the policy (and every configuration, across reloads) moves the one
    /// series: a permit taken under an older configuration gives its
    /// place back to the same gauge it rose.
    in_flight: Box<[Option<Gauge>]>,
    /// Per limit of the route, for a rate limit: admitted requests near it.
    near_limit: Box<[Option<Counter>]>,
    /// Per limit of the route charged on response: by [`Charged::ALL`],
    /// and the cost header's fallbacks by [`CostRead::FALLBACKS`].
    on_response: Box<[Option<OnResponseCounters>]>,
    upstream_responses: [Counter; STATUS_CLASSES.len()],
    /// Indexed as [`UpstreamError::KINDS`].
    upstream_errors: [Counter; UpstreamError::KINDS.len()],
    upstream_duration: Histogram,
    /// When a limit of the route counts `header:Authorization`: requests
    /// whose `Basic` credential went to the shared undecodable bucket.
    undecodable: Option<Counter>,
    /// Per limit of the route that exempts some network: requests that
    /// skipped it.
    exempted: Box<[Option<Counter>]>,
    /// When the route denies some network: requests answered 403.
    denied: Option<Counter>,
}

impl RouteMetrics {
    pub fn new(route: &Route) -> RouteMetrics {
        let name = route.name.to_string();
        let mut policies: Vec<String> = route
            .limits
            .iter()
            .map(|l| l.policy.name().to_string())
            .collect();
        if policies.is_empty() {
            policies.push("none".to_owned());
        }
        let in_flight = route
            .limits
            .iter()
            .map(|l| match &l.policy {
                LimitPolicy::Concurrency(c) => {
                    Some(metrics::gauge!(IN_FLIGHT, "policy" => c.name.to_string()))
                }
                LimitPolicy::Rate(_) => None,
            })
            .collect();
        let near_limit = route
            .limits
            .iter()
            .map(|l| {
                let policy = l.policy.as_rate()?.name.to_string();
                Some(metrics::counter!(NEAR_LIMIT, "route" => name.clone(), "policy" => policy))
            })
            .collect();
        let on_response = route
            .limits
            .iter()
            .map(|l| {
                l.on_response()?;
                let policy = l.policy.name().to_string();
                Some(OnResponseCounters {
                    charged: Charged::ALL.map(|result| {
                        metrics::counter!(RESPONSE_CHARGES, "route" => name.clone(), "policy" => policy.clone(), "result" => result.label())
                    }),
                    fallbacks: CostRead::FALLBACKS.map(|reason| {
                        metrics::counter!(RESPONSE_COST_FALLBACKS, "route" => name.clone(), "policy" => policy.clone(), "reason" => reason.label())
                    }),
                })
            })
            .collect();
        let undecodable = route
            .subject_sources()
            .flat_map(SubjectSource::parts)
            .any(|s| matches!(s, SubjectSource::Header(h) if h == http::header::AUTHORIZATION))
            .then(|| metrics::counter!(UNDECODABLE_CREDENTIALS, "route" => name.clone()));
        let exempted = route
            .limits
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let policy = l.policy.name().to_string();
                (!route.addresses.exempt_from(i).is_empty()).then(|| {
                    metrics::counter!(REQUESTS_EXEMPTED, "route" => name.clone(), "policy" => policy)
                })
            })
            .collect();
        let denied = (!route.addresses.deny.is_empty())
            .then(|| metrics::counter!(REQUESTS_DENIED, "route" => name.clone()));
        let route = name;
        RouteMetrics {
            undecodable,
            exempted,
            denied,
            in_flight,
            near_limit,
            on_response,
            requests: policies
                .into_iter()
                .map(|policy| {
                    OutcomeLabel::ALL.map(|outcome| {
                        metrics::counter!(REQUESTS, "route" => route.clone(), "policy" => policy.clone(), "outcome" => outcome.label())
                    })
                })
                .collect(),
            upstream_responses: STATUS_CLASSES.map(|class| {
                metrics::counter!(UPSTREAM_RESPONSES, "route" => route.clone(), "status_class" => class)
            }),
            upstream_errors: UpstreamError::KINDS.map(|kind| {
                metrics::counter!(UPSTREAM_ERRORS, "route" => route.clone(), "kind" => kind)
            }),
            upstream_duration: crate::telemetry::histogram(UPSTREAM_DURATION, &[("route", &route)]),
        }
    }

    /// Counts one routed request under its verdict and the policy of
    /// `limit` (the route's limit that decided it; 0 for a route without
    /// limits).
    pub fn request(&self, limit: usize, verdict: &Verdict) {
        if let Some(counters) = self.requests.get(limit) {
            counters[verdict.outcome() as usize].increment(1);
        }
    }

    /// The in-flight gauge of the route's limit `limit`, when it is a
    /// concurrency limit.
    pub fn in_flight(&self, limit: usize) -> Option<&Gauge> {
        self.in_flight.get(limit)?.as_ref()
    }

    /// Counts a request whose `Basic` credential went to the route's
    /// shared undecodable bucket.
    pub fn undecodable(&self) {
        if let Some(counter) = &self.undecodable {
            counter.increment(1);
        }
    }

    /// Counts a request that skipped the route's limit `limit`, its
    /// client address being exempt from it.
    pub fn exempted(&self, limit: usize) {
        if let Some(Some(counter)) = self.exempted.get(limit) {
            counter.increment(1);
        }
    }

    /// Counts a request answered 403 for the route's `deny`.
    pub fn denied(&self) {
        if let Some(counter) = &self.denied {
            counter.increment(1);
        }
    }

    /// Counts an admitted request near the route's limit `limit`.
    pub fn near_limit(&self, limit: usize) {
        if let Some(Some(counter)) = self.near_limit.get(limit) {
            counter.increment(1);
        }
    }

    /// The counters of the route's limit `limit`, when it is charged on
    /// response (cloned into the charge, which outlives the request).
    pub fn on_response(&self, limit: usize) -> Option<OnResponseCounters> {
        self.on_response.get(limit)?.clone()
    }

    /// Counts the response to a forwarded request (the upstream's, or
    /// sluice's 502/504 when the upstream failed).
    pub fn upstream(&self, status: StatusCode, elapsed: Duration) {
        let class = usize::from(status.as_u16() / 100).clamp(1, 5) - 1;
        self.upstream_responses[class].increment(1);
        self.upstream_duration.record(elapsed.as_secs_f64());
    }

    /// A forwarded request that got sluice's answer instead of the app's.
    pub fn upstream_error(&self, error: UpstreamError) {
        self.upstream_errors[error.index()].increment(1);
    }
}

/// The counters of one limit charged on response.
#[derive(Clone)]
pub struct OnResponseCounters {
    charged: [Counter; Charged::ALL.len()],
    fallbacks: [Counter; CostRead::FALLBACKS.len()],
}

impl OnResponseCounters {
    /// Counts a charge's result, and how its cost was read.
    pub fn count(&self, charged: Charged, read: CostRead) {
        self.charged[charged as usize].increment(1);
        if let Some(i) = CostRead::FALLBACKS.iter().position(|&r| r == read) {
            self.fallbacks[i].increment(1);
        }
    }
}

impl std::fmt::Debug for RouteMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteMetrics").finish_non_exhaustive()
    }
}

/// Where a request's rate limits were decided: the `source` label of
/// `sluice_decision_duration_seconds`, one sample per request that has a
/// rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionSource {
    /// The store was asked (Redis: one call, or one per limit on
    /// Cluster; a lease's grant rides on it) and decided.
    Store,
    /// The over-limit cache in front of Redis repeated a denial: Redis
    /// was not asked.
    DenyCache,
    /// Every limit was spent from a lease this sidecar holds: Redis was
    /// not asked.
    Lease,
    /// The store could not decide and the local fallback did, for at
    /// least one limit (`on_failure: local`).
    Local,
    /// The store could not decide, and `on_failure` (allow, deny)
    /// answered: no decision was made.
    Failed,
}

impl DecisionSource {
    pub const ALL: [DecisionSource; 5] = [
        DecisionSource::Store,
        DecisionSource::DenyCache,
        DecisionSource::Lease,
        DecisionSource::Local,
        DecisionSource::Failed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            DecisionSource::Store => "store",
            DecisionSource::DenyCache => "deny_cache",
            DecisionSource::Lease => "lease",
            DecisionSource::Local => "local",
            DecisionSource::Failed => "failed",
        }
    }
}

// `DecisionSource as usize` indexes the histograms built from `ALL`.
const _: () = {
    let mut i = 0;
    while i < DecisionSource::ALL.len() {
        assert!(DecisionSource::ALL[i] as usize == i);
        i += 1;
    }
};

/// The handles of the proxy as a whole.
pub struct ProxyMetrics {
    /// Time to a decision, under the store's `store` label, by
    /// [`DecisionSource`].
    decision_duration: [Histogram; DecisionSource::ALL.len()],
    pub forwarded_without_decision: Counter,
}

impl ProxyMetrics {
    pub fn new(store: &'static str) -> ProxyMetrics {
        // Counted by a lookup when it happens (rare), but there at 0 from
        // the start, every reason: an alert on `increase()` then sees the
        // first one.
        for invalid in Invalid::kinds() {
            metrics::counter!(REQUESTS_REFUSED, "reason" => invalid.label()).increment(0);
        }
        metrics::counter!(REQUESTS_REFUSED, "reason" => REFUSED_FRAMING).increment(0);
        ProxyMetrics {
            decision_duration: DecisionSource::ALL.map(|source| {
                crate::telemetry::histogram(
                    DECISION_DURATION,
                    &[("store", store), ("source", source.label())],
                )
            }),
            forwarded_without_decision: metrics::counter!(FORWARDED_WITHOUT_DECISION),
        }
    }
}

impl ProxyMetrics {
    /// One request's decision, made at `source`, `elapsed` after it was
    /// asked for.
    pub fn decided(&self, source: DecisionSource, elapsed: Duration) {
        self.decision_duration[source as usize].record(elapsed.as_secs_f64());
    }
}

/// The reason of a request whose framing the server refused (before
/// hyper parsed it; see `server::framing`).
pub const REFUSED_FRAMING: &str = "framing";

/// Counts a request refused before routing (400/501), by a bounded reason.
/// Rare by nature, so the registry lookup is acceptable here.
pub fn request_refused(reason: &'static str) {
    metrics::counter!(REQUESTS_REFUSED, "reason" => reason).increment(1);
}

/// `sluice_request_bodies_cut_total`, one series per [`Cut`], each at 0
/// from the start.
#[derive(Clone)]
pub struct BodyCuts([Counter; Cut::ALL.len()]);

impl BodyCuts {
    pub fn new() -> BodyCuts {
        BodyCuts(Cut::ALL.map(|cut| metrics::counter!(REQUEST_BODIES_CUT, "reason" => cut.label())))
    }

    /// Counts `error` when it is a cut request body; says whether it was.
    pub fn count(&self, error: &(dyn std::error::Error + 'static)) -> Option<Cut> {
        let cut = Cut::of(error)?;
        self.0[cut as usize].increment(1);
        Some(cut)
    }
}

impl std::fmt::Debug for BodyCuts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BodyCuts").finish_non_exhaustive()
    }
}
