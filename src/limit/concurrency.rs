//! `algorithm: concurrency`: at most `limit` requests of one subject in
//! flight to the upstream from this sidecar at once.
//!
//! Unlike the rate algorithms it keeps no history and never reaches a
//! store: what it counts is requests this process is forwarding right now
//! (`store::in_flight`), so it is local to the sidecar by nature.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

/// A validated concurrency policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    pub name: Arc<str>,
    /// Requests in flight at once, per subject.
    pub limit: NonZeroU32,
    /// `Retry-After` of the 503 a request over the limit gets.
    pub retry_after: Duration,
    /// Whether its answers carry `RateLimit-Policy` and `Retry-After`
    /// (`headers: off`: not).
    pub announce: bool,
}

/// What a route's limit names: a rate policy, evaluated by the store, or a
/// concurrency policy, counted in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitPolicy {
    Rate(Arc<super::Policy>),
    Concurrency(Arc<Concurrency>),
}

impl LimitPolicy {
    /// Whether its answers announce it (no `headers: off`).
    pub fn announced(&self) -> bool {
        match self {
            LimitPolicy::Rate(p) => p.announce,
            LimitPolicy::Concurrency(c) => c.announce,
        }
    }

    pub fn name(&self) -> &Arc<str> {
        match self {
            LimitPolicy::Rate(p) => &p.name,
            LimitPolicy::Concurrency(c) => &c.name,
        }
    }

    /// The largest cost one request may be charged.
    pub fn max_cost(&self) -> u32 {
        match self {
            LimitPolicy::Rate(p) => p.max_cost(),
            // One request is one request in flight.
            LimitPolicy::Concurrency(_) => 1,
        }
    }

    pub fn as_rate(&self) -> Option<&Arc<super::Policy>> {
        match self {
            LimitPolicy::Rate(p) => Some(p),
            LimitPolicy::Concurrency(_) => None,
        }
    }

    /// Count and report, never block. Concurrency policies always block.
    pub fn shadow(&self) -> bool {
        match self {
            LimitPolicy::Rate(p) => p.shadow,
            LimitPolicy::Concurrency(_) => false,
        }
    }
}
