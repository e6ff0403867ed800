//! The configuration-derived state one request runs under.
//!
//! A request loads the current [`Runtime`] once and keeps that `Arc` to the
//! end, so a reload swaps what new requests see while in-flight requests
//! finish under the one they started with. It holds only the live part of
//! a configuration: what is fixed at start is built into the listeners,
//! the store and the upstream client instead.
//!
//! The route table only matches; what the proxy needs per route (metric
//! handles, prepared answers) is built here beside it, one entry per route
//! in the table's order, so both are swapped together.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::log_budget::LogBudget;
use super::metrics::RouteMetrics;
use super::respond::Prepared;
use crate::config::Live;
use crate::limit::Policy;
use crate::route::{Route, RouteTable};
use crate::subject::PseudonymKey;

#[derive(Debug)]
pub struct Runtime {
    pub live: Arc<Live>,
    pub routes: RouteTable,
    /// Parallel to `routes.routes()`.
    states: Vec<RouteState>,
    pub key: PseudonymKey,
}

impl Runtime {
    /// `key` comes from the configuration, or is the random key generated
    /// once at start (kept across reloads so counters do not reset).
    pub fn new(live: Arc<Live>, key: PseudonymKey) -> Runtime {
        let routes = RouteTable::new(&live.routes, &live.default);
        Runtime {
            states: routes.routes().iter().map(RouteState::new).collect(),
            routes,
            live,
            key,
        }
    }

    /// The route at `i` (as [`RouteTable::find`] numbers them) and the
    /// proxy's state for it.
    pub(super) fn entry(&self, i: usize) -> Entry<'_> {
        let state = &self.states[i];
        Entry {
            route: &self.routes.routes()[i],
            metrics: &state.metrics,
            log_budget: &state.log_budget,
            limited: state.limited.as_ref(),
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
    /// `None` exactly when the route says `policy: none`.
    limited: Option<Limited>,
}

impl RouteState {
    fn new(route: &Route) -> RouteState {
        let policy = route.policy.as_ref().map(|p| &*p.name);
        RouteState {
            metrics: RouteMetrics::new(&route.name, policy),
            log_budget: LogBudget::default(),
            limited: route.policy.as_ref().map(|policy| Limited {
                responses: Prepared::new(route, policy),
                policy: policy.clone(),
            }),
        }
    }
}

/// A limited route's policy and its prepared responses.
#[derive(Debug)]
pub struct Limited {
    pub policy: Arc<Policy>,
    pub responses: Prepared,
}

/// A route a request matched, with what the proxy keeps for it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry<'r> {
    pub route: &'r Route,
    pub metrics: &'r RouteMetrics,
    pub log_budget: &'r LogBudget,
    pub limited: Option<&'r Limited>,
}
