//! The compiled route table: the first route in file order whose methods,
//! path and conditions (host, headers, query) match wins; `default` takes
//! the rest.
//!
//! A table of more than a few routes also holds an [`index::Index`], so a
//! request checks only the routes that could match its path. The table
//! holds routes only: what the proxy keeps per route (metric handles,
//! prepared responses) lives in the proxy, indexed by what [`RouteTable::find`]
//! returns.

mod addresses;
mod answers;
mod conditions;
mod index;
mod matcher;
pub mod query;
mod subject;
mod tiers;

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderName, Method};

use crate::limit::LimitPolicy;

pub use addresses::Addresses;
pub use answers::{Answers, CustomAnswer, CustomBody};
pub use conditions::{host_name, Ambiguous, Conditions, Facts, HostPattern, Unmet, Wanted};
pub use matcher::{Match, PathMatch, Segment};
pub use subject::SubjectSource;
pub use tiers::{TierBy, Tiers};

#[derive(Debug, Clone)]
pub struct Route {
    pub name: Arc<str>,
    pub matcher: Match,
    /// Checked together: every one must let a request through, and a
    /// request refused by one consumes nothing of any. Empty for `policy:
    /// none` (forwarded without limiting); `policy` + `subject` is a
    /// one-element list. Each names a different policy.
    pub limits: Vec<Limit>,
    /// `Upgrade` protocols passed through (lower-case names, without a
    /// version); `websocket` unless the route says otherwise, never `h2c`.
    pub upgrades: Arc<[Box<str>]>,
    /// The route's policy chosen by a header a gateway in its
    /// `trusted_from` sets: the limits of the other tiers do not apply to
    /// a request.
    pub tiers: Option<Arc<Tiers>>,
    /// What the route answers in place of sluice's own refusals: its own
    /// `responses:`, each answer falling back to the global one (already
    /// merged when the configuration loads).
    pub answers: Answers,
    /// `deny` and `exempt`: what the client address does on this route.
    pub addresses: Addresses,
}

/// One of a route's limits: a policy, who it counts, and what a request
/// costs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limit {
    pub policy: LimitPolicy,
    /// Tried in order; the first present wins. Never empty;
    /// [`SubjectSource::Global`] only alone.
    pub subject: Vec<SubjectSource>,
    /// Units charged per request; 1..=policy max cost (1 for concurrency).
    /// When the charge waits for the response, the units a request must
    /// find left to be forwarded.
    pub cost: u32,
    /// When the limit is charged: before forwarding, or once the response
    /// head says what to charge.
    pub charge: Charge,
    /// The tier (of [`Route::tiers`]) this limit is the policy of; `None`
    /// for a limit every request of the route counts against.
    pub tier: Option<u8>,
}

impl Limit {
    /// Whether the limit applies to a request of tier `tier`.
    pub fn applies(&self, tier: u8) -> bool {
        self.tier.is_none_or(|t| t == tier)
    }

    /// The response's charge, when it waits for one.
    /// The units taken before forwarding: `cost`; for a cost the response
    /// reports, its `reserve`, settled when the response head arrives.
    pub fn reserved_units(&self) -> u32 {
        match self.on_response().and_then(|on| on.from_header.as_ref()) {
            Some(from) => from.reserve,
            None => self.cost,
        }
    }

    pub fn on_response(&self) -> Option<&OnResponse> {
        match &self.charge {
            Charge::Request => None,
            Charge::Response(on) => Some(on),
        }
    }
}

/// When a limit is charged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Charge {
    /// Before the request is forwarded, `cost` units.
    #[default]
    Request,
    /// Reserved before forwarding (refused when spent), settled when the
    /// response head arrives: kept, given back or trued up.
    Response(Arc<OnResponse>),
}

/// What a response charges a limit that waits for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OnResponse {
    /// Only responses with one of these statuses are charged; `None`:
    /// every response the app gives.
    pub statuses: Option<Box<[u16]>>,
    /// The units are the number the app reports in a header, rather than
    /// the limit's `cost`.
    pub from_header: Option<ResponseCost>,
}

/// `cost: { from_response_header, max, default }`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseCost {
    pub header: HeaderName,
    /// The most one response is charged; a larger report is charged this.
    pub max: u32,
    /// Charged when the header is missing or not a whole number.
    pub default: u32,
    /// Held before forwarding (at least 1, at most `max`), and settled to
    /// the reported cost when the response head arrives.
    pub reserve: u32,
}

/// How a response's cost was read, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostRead {
    /// The limit's own `cost`, or the app's number as it reported it.
    Exact,
    /// The header was absent: the default was charged.
    Missing,
    /// The header was not one whole number: the default was charged.
    Invalid,
    /// The app reported more than `max`: `max` was charged.
    AboveMax,
    /// The app did not answer within `upstream.timeout`: charged as a
    /// listed status without a reported cost would be.
    TimedOut,
}

impl CostRead {
    pub const FALLBACKS: [CostRead; 4] = [
        CostRead::Missing,
        CostRead::Invalid,
        CostRead::AboveMax,
        CostRead::TimedOut,
    ];

    pub fn label(self) -> &'static str {
        match self {
            CostRead::Exact => "exact",
            CostRead::Missing => "missing",
            CostRead::Invalid => "invalid",
            CostRead::AboveMax => "above_max",
            CostRead::TimedOut => "timed_out",
        }
    }
}

impl OnResponse {
    /// The units a response with `status` and `headers` charges (none for
    /// a status not listed), `cost` being the limit's fixed cost.
    pub fn units(
        &self,
        status: u16,
        headers: &http::HeaderMap,
        cost: u32,
    ) -> Option<(u32, CostRead)> {
        if let Some(statuses) = &self.statuses {
            if !statuses.contains(&status) {
                return None;
            }
        }
        let Some(from) = &self.from_header else {
            return Some((cost, CostRead::Exact));
        };
        let mut values = headers.get_all(&from.header).iter();
        let read = match (values.next(), values.next()) {
            (None, _) => return Some((from.default, CostRead::Missing)),
            (Some(value), None) => whole_number(value.as_bytes()),
            // Two reports of one cost: neither can be chosen.
            (Some(_), Some(_)) => None,
        };
        Some(match read {
            None => (from.default, CostRead::Invalid),
            Some(n) if n > u64::from(from.max) => (from.max, CostRead::AboveMax),
            // At most `max`, a u32.
            Some(n) => (n as u32, CostRead::Exact),
        })
    }
}

impl OnResponse {
    /// The units charged when the app did not answer within
    /// `upstream.timeout` (sluice's 504). The app had the request and may
    /// well have done the work, so the 504 stands for a listed status:
    /// were it given back, a guess slow enough to time out would never be
    /// counted. The cost is the limit's `cost`, or the reported cost's
    /// `default`, as for a listed answer that reports none.
    pub fn units_timed_out(&self, cost: u32) -> (u32, CostRead) {
        let units = self.from_header.as_ref().map_or(cost, |from| from.default);
        (units, CostRead::TimedOut)
    }
}

/// Digits only, optional surrounding whitespace; saturates rather than
/// overflows (anything that large is above any `max`).
fn whole_number(bytes: &[u8]) -> Option<u64> {
    let digits = bytes.trim_ascii();
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(digits.iter().fold(0u64, |n, d| {
        n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
    }))
}

impl Route {
    /// Every subject source of every limit, in order, repeats included.
    pub fn subject_sources(&self) -> impl Iterator<Item = &SubjectSource> + Clone {
        self.limits.iter().flat_map(|l| l.subject.iter())
    }
}

#[derive(Debug)]
pub struct RouteTable {
    /// In file order, the default last.
    routes: Vec<Route>,
    /// `None` for a table small enough to scan.
    index: Option<index::Index>,
    /// Every header a subject is read from, in any route: a request
    /// carrying one of them twice is refused before routing.
    identity_headers: Vec<HeaderName>,
    /// Every route's tiers, the default's too: each one's header (tiers
    /// by header) is removed from every request its `trusted_from` did not
    /// send.
    tiers: Vec<Arc<Tiers>>,
    /// The identity headers, every tier header and every header a route's
    /// conditions read: the headers a name spelled with `_` must not stand
    /// for.
    read_headers: Vec<HeaderName>,
    /// Every header a route's conditions read: refused when sent twice.
    condition_headers: Vec<HeaderName>,
    /// Every query parameter a route's conditions read (folded form):
    /// refused when sent with two values.
    condition_params: Vec<Box<[u8]>>,
    /// Whether any route matches on the host.
    reads_host: bool,
}

impl RouteTable {
    /// `routes` in file order; `default` for requests none of them match.
    pub fn new(routes: &[Route], default: &Route) -> RouteTable {
        let mut identity_headers: Vec<HeaderName> = Vec::new();
        for route in routes.iter().chain(std::iter::once(default)) {
            let claim_tiers = route
                .tiers
                .as_ref()
                .is_some_and(|t| matches!(t.by, TierBy::Claim(_)));
            let token = claim_tiers.then_some(&http::header::AUTHORIZATION);
            for name in route
                .subject_sources()
                .flat_map(SubjectSource::headers)
                .chain(token)
            {
                if !identity_headers.contains(name) {
                    identity_headers.push(name.clone());
                }
            }
        }
        let mut tiers: Vec<Arc<Tiers>> = Vec::new();
        for route in routes.iter().chain(std::iter::once(default)) {
            if let Some(t) = &route.tiers {
                if !tiers.iter().any(|known| **known == **t) {
                    tiers.push(t.clone());
                }
            }
        }
        let mut read_headers = identity_headers.clone();
        for header in tiers.iter().filter_map(|t| t.header()) {
            if !read_headers.contains(header) {
                read_headers.push(header.clone());
            }
        }
        let mut condition_headers: Vec<HeaderName> = Vec::new();
        let mut condition_params: Vec<Box<[u8]>> = Vec::new();
        for conditions in routes.iter().map(|r| &r.matcher.conditions) {
            for (name, _) in &conditions.headers {
                if !condition_headers.contains(name) {
                    condition_headers.push(name.clone());
                }
                if !read_headers.contains(name) {
                    read_headers.push(name.clone());
                }
            }
            for (name, _) in &conditions.query {
                if !condition_params.contains(name) {
                    condition_params.push(name.clone());
                }
            }
        }
        RouteTable {
            index: (routes.len() >= index::SCAN_BELOW).then(|| index::Index::new(routes)),
            reads_host: routes
                .iter()
                .any(|r| !r.matcher.conditions.hosts.is_empty()),
            condition_headers,
            condition_params,
            routes: routes
                .iter()
                .chain(std::iter::once(default))
                .cloned()
                .collect(),
            identity_headers,
            tiers,
            read_headers,
        }
    }

    /// The tier headers a request from `peer` must not carry to the app,
    /// whatever route it takes: a header is kept only when `peer` is in
    /// the `trusted_from` of every tiers reading it (a gateway trusted for
    /// one route does not speak for another's).
    pub fn unbelieved_tier_headers(&self, peer: IpAddr) -> impl Iterator<Item = &HeaderName> {
        self.tiers
            .iter()
            .filter_map(move |t| t.header().filter(|_| !t.believes(peer)))
    }

    pub fn identity_headers(&self) -> &[HeaderName] {
        &self.identity_headers
    }

    /// Every header a route reads from the request: its subjects', its
    /// tiers' and its conditions'.
    pub fn read_headers(&self) -> &[HeaderName] {
        &self.read_headers
    }

    /// Every route in the order [`RouteTable::find`] numbers them: file
    /// order, the default last.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Whether any route matches on the host.
    pub fn reads_host(&self) -> bool {
        self.reads_host
    }

    /// Refuses a request that sends a header a route's conditions read
    /// more than once, or such a query parameter with two values: checked
    /// before routing, so no route is chosen by a copy the app may not
    /// read.
    pub fn check_conditions(
        &self,
        headers: &http::HeaderMap,
        query: Option<&str>,
    ) -> Result<(), Ambiguous> {
        for name in &self.condition_headers {
            let mut values = headers.get_all(name).iter();
            if values.next().is_some() && values.next().is_some() {
                return Err(Ambiguous::Header(name.clone()));
            }
        }
        if let Some(q) = query.filter(|_| !self.condition_params.is_empty()) {
            for name in &self.condition_params {
                query::value_of(q, name).map_err(|query::TwoValues| Ambiguous::Query)?;
            }
        }
        Ok(())
    }

    /// The position in [`RouteTable::routes`] of the route `method`,
    /// `path` and `facts` match. `path` is the request path without the
    /// query, in its matching form ([`crate::path::normalize`]). Conditions
    /// are checked only on the routes whose path matched.
    pub fn find(&self, method: &Method, path: &str, facts: &Facts) -> usize {
        let default = self.routes.len() - 1;
        let matching = |i: usize| self.routes[i].matcher.admits(method, path, facts);
        let found = match &self.index {
            Some(index) => index.first(path, matching),
            None => (0..default).find(|&i| matching(i)),
        };
        found.unwrap_or(default)
    }

    /// The route `method` and `path` match, for a request `facts` describe.
    pub fn route_for(&self, method: &Method, path: &str, facts: &Facts) -> &Route {
        &self.routes[self.find(method, path, facts)]
    }

    /// The route `method` and `path` match for a request with no host,
    /// headers or query.
    #[cfg(test)]
    pub fn route(&self, method: &Method, path: &str) -> &Route {
        self.route_for(method, path, &Facts::default())
    }
}

#[cfg(test)]
mod tests;
