//! The configuration-derived state one request runs under.
//!
//! A request loads the current [`Runtime`] once and keeps that `Arc` to the
//! end, so a reload swaps what new requests see while in-flight requests
//! finish under the one they started with. It holds only the live part of
//! a configuration: what is fixed at start is built into the listeners,
//! the store and the upstream client instead.
//!
//! The route table only matches; what the proxy needs per route (metric
//! handles, prepared answers per limit, the pseudonym of a `global`
//! subject) is built here beside it, one entry per route in the table's
//! order, so both are swapped together.

use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::log_budget::LogBudget;
use super::metrics::RouteMetrics;
use super::respond::Prepared;
use crate::config::Live;
use crate::route::{Route, RouteTable, SubjectSource};
use crate::subject::jwt::Rejected;
use crate::subject::{self, Pseudonym, PseudonymKey};

#[derive(Debug)]
pub struct Runtime {
    pub live: Arc<Live>,
    pub routes: RouteTable,
    /// Parallel to `routes.routes()`.
    states: Vec<RouteState>,
    pub key: PseudonymKey,
    /// `sluice_jwt_rejected_total` by reason, when `identity.jwt` is set:
    /// each series there at zero from the start.
    jwt_rejected: Option<[metrics::Counter; Rejected::ALL.len()]>,
}

impl Runtime {
    /// `key` comes from the configuration, or is the random key generated
    /// once at start (kept across reloads so counters do not reset).
    pub fn new(live: Arc<Live>, key: PseudonymKey) -> Runtime {
        let routes = RouteTable::new(&live.routes, &live.default);
        let jwt_rejected = live.identity.jwt.as_ref().map(|_| {
            Rejected::ALL.map(|reason| {
                metrics::counter!(crate::telemetry::JWT_REJECTED, "reason" => reason.label())
            })
        });
        Runtime {
            jwt_rejected,
            states: routes
                .routes()
                .iter()
                .map(|route| RouteState::new(route, &key))
                .collect(),
            routes,
            live,
            key,
        }
    }

    /// Counts a request whose bearer token was read and not believed.
    pub fn jwt_rejected(&self, reason: Rejected) {
        if let Some(counters) = &self.jwt_rejected {
            counters[reason as usize].increment(1);
        }
    }

    /// The route at `i` (as [`RouteTable::find`] numbers them) and the
    /// proxy's state for it.
    pub(super) fn entry(&self, i: usize) -> Entry<'_> {
        let state = &self.states[i];
        Entry {
            at: i,
            route: &self.routes.routes()[i],
            metrics: &state.metrics,
            log_budget: &state.log_budget,
            limits: &state.limits,
        }
    }
}

/// Shared between every connection and the reloader.
pub type SharedRuntime = Arc<ArcSwap<Runtime>>;

/// What the proxy keeps for one route, built when a configuration loads.
#[derive(Debug)]
struct RouteState {
    metrics: RouteMetrics,
    /// Decisions other than Allowed logged, at most a few a second per
    /// route.
    log_budget: LogBudget,
    /// Parallel to `route.limits`; empty exactly when the route says
    /// `policy: none`.
    limits: Vec<LimitState>,
}

impl RouteState {
    fn new(route: &Route, key: &PseudonymKey) -> RouteState {
        RouteState {
            metrics: RouteMetrics::new(route),
            log_budget: LogBudget::default(),
            limits: (0..route.limits.len())
                .map(|i| LimitState {
                    // One set per tier: `RateLimit-Policy` lists the limits
                    // of the request's tier only.
                    responses: (0..route.tiers.as_ref().map_or(1, |t| t.count()))
                        .map(|tier| Prepared::for_tier(route, i, tier))
                        .collect(),
                    fixed_subject: (route.limits[i].subject == [SubjectSource::Global])
                        .then(|| subject::global(&route.name, key)),
                    waiting: AtomicU32::new(0),
                    delayed: route.limits[i]
                        .policy
                        .as_rate()
                        .filter(|p| p.delay.is_some())
                        .map(|p| Delayed::new(&route.name, &p.name)),
                })
                .collect(),
        }
    }
}

/// What the proxy keeps for one limit of a route.
#[derive(Debug)]
pub struct LimitState {
    /// By the request's tier (one for a route without tiers).
    pub responses: Box<[Prepared]>,
    /// The pseudonym of `subject: global`, the same for every request:
    /// made here rather than per request.
    pub fixed_subject: Option<Pseudonym>,
    /// Requests waiting for their turn (`delay`) under this limit now.
    pub waiting: AtomicU32,
    /// Their metrics, for a policy with a `delay`.
    pub delayed: Option<Delayed>,
}

/// `sluice_requests_delayed_total` and `sluice_request_delay_seconds` of
/// one limit of a route.
#[derive(Debug)]
pub struct Delayed {
    pub count: metrics::Counter,
    pub waited: metrics::Histogram,
}

impl Delayed {
    fn new(route: &str, policy: &str) -> Delayed {
        let (route, policy) = (route.to_owned(), policy.to_owned());
        Delayed {
            count: metrics::counter!(crate::telemetry::REQUESTS_DELAYED, "route" => route.clone(), "policy" => policy.clone()),
            waited: crate::telemetry::histogram(
                crate::telemetry::REQUEST_DELAY,
                &[("route", &route), ("policy", &policy)],
            ),
        }
    }
}

/// A route a request matched, with what the proxy keeps for it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry<'r> {
    /// Its number in the route table ([`Runtime::entry`] gives it back).
    pub at: usize,
    pub route: &'r Route,
    pub metrics: &'r RouteMetrics,
    pub log_budget: &'r LogBudget,
    /// Parallel to `route.limits`.
    pub limits: &'r [LimitState],
}
