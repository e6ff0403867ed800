//! A lease held for one subject, and the answers it gives: what a request
//! spent from it is told, and a store answer with the subject's units here
//! counted as its own.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::super::EvaluationId;
use crate::limit::{Bands, Decision, Policy};

#[derive(Clone)]
pub(super) struct Held {
    pub(super) policy: Arc<Policy>,
    /// The latest grant's: what is left goes back through its record.
    pub(super) id: EvaluationId,
    /// This lease's, from its grant on: a top-up joining it keeps it, a
    /// new grant gets its own ([`super::Spend`]).
    pub(super) generation: u64,
    pub(super) left: u32,
    /// Units the latest grant brought: a lease spent below half of them
    /// is topped up ahead of its end.
    pub(super) size: u32,
    pub(super) until: Instant,
    /// Taken before the grant was sent: every instant derived from it is
    /// at or before the store's own.
    pub(super) sent_at: Instant,
    /// The store's answer at the grant; its `remaining` counts the lease
    /// as spent.
    pub(super) granted: Decision,
}

impl Held {
    /// The answer to a request spent from this lease at `now`, `left`
    /// being what is left of it after the request.
    /// `more`: units of this subject's that the grant's answer counts as
    /// charged and no lease here holds (on their way back to the store).
    /// Never those of an ask sent after the grant: that answer still
    /// counts them as the store's.
    pub(super) fn decision(&self, now: Instant, more: u32) -> Decision {
        let unspent = self.left.saturating_add(more);
        Decision {
            allowed: true,
            band: self.granted.band,
            remaining: self.granted.remaining + u64::from(unspent),
            reset_after: reset_with(&self.policy, &self.granted, unspent)
                .saturating_sub(now.saturating_duration_since(self.sent_at)),
            retry_after: Duration::ZERO,
            // A sliding counter's estimate stays one.
            approximate: self.granted.approximate,
        }
    }
}

/// A lease as `POST /explain` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldView {
    /// What a request would be answered from it now.
    pub answer: Decision,
    /// Units it holds before that request.
    pub units: u32,
    /// Until it ends.
    pub lasts: Duration,
}

/// The grant's binding band back to full, as it would be with `unspent`
/// of the lease's units never charged: the store said when it would be
/// with all of them spent. A token bucket refills by whole periods of
/// `refill_tokens`, a GCRA's arrival time moves one interval per unit; a
/// fixed window is full again when it ends, whatever was spent, and a
/// sliding counter one window later.
pub(super) fn reset_with(policy: &Policy, granted: &Decision, unspent: u32) -> Duration {
    let unspent = u64::from(unspent);
    match policy.bands() {
        Bands::TokenBucket(bands) => {
            let Some(band) = bands.get(granted.band) else {
                return granted.reset_after;
            };
            let capacity = u64::from(band.capacity.get());
            let refill = u64::from(band.refill_tokens.get());
            let charged = granted.remaining.min(capacity);
            let uncharged = (charged + unspent).min(capacity);
            if uncharged == capacity {
                return Duration::ZERO;
            }
            let periods = |deficit: u64| deficit.div_ceil(refill);
            let fewer = periods(capacity - charged) - periods(capacity - uncharged);
            let fewer = u32::try_from(fewer).unwrap_or(u32::MAX);
            granted
                .reset_after
                .saturating_sub(band.refill_every.saturating_mul(fewer))
        }
        Bands::Gcra(bands) => match bands.get(granted.band) {
            Some(band) => granted.reset_after.saturating_sub(Duration::from_micros(
                unspent.saturating_mul(band.emission_interval_us()),
            )),
            None => granted.reset_after,
        },
        Bands::FixedWindow(_) | Bands::SlidingCounter(_) | Bands::SlidingLog(_) => {
            granted.reset_after
        }
    }
}

/// `decision` from Redis with `more` units the subject has here or on
/// their way counted as its own.
pub(super) fn with_more(policy: &Policy, decision: Decision, more: u32) -> Decision {
    if more == 0 {
        return decision;
    }
    Decision {
        remaining: decision.remaining + u64::from(more),
        reset_after: reset_with(policy, &decision, more),
        ..decision
    }
}
