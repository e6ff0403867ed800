//! Token bucket refilled by whole periods (seed 000): `refill_tokens` are
//! added per elapsed `refill_every`, never a fraction, so every value is an
//! integer and the Lua side agrees to the unit.

use super::BandVerdict;
use crate::limit::{micros, BucketBand, Micros};

/// `(tokens, last)`: tokens held as of `last`, the start of the current
/// refill period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BandState {
    tokens: u64,
    last: Micros,
}

impl BandState {
    /// A subject never seen. The spec's `(C, now)` needs a `now`; `(C, 0)`
    /// gives the same step at any time, because a full bucket takes `now` as
    /// its `last` (it keeps no phase).
    pub fn fresh(band: &BucketBand) -> BandState {
        BandState {
            tokens: u64::from(band.capacity.get()),
            last: 0,
        }
    }
}

/// One band's step: the verdict, and the state to write if every band
/// admits (the input state, unchanged, when this band denies).
pub fn check(
    band: &BucketBand,
    state: &BandState,
    now: Micros,
    cost: u32,
) -> (BandState, BandVerdict) {
    // Validated to at least 1 ms; the floor only keeps `/` from panicking.
    let period = micros(band.refill_every).max(1);
    let capacity = u64::from(band.capacity.get());
    let refill = u64::from(band.refill_tokens.get());
    let cost = u64::from(cost);

    // A clock behind `last` refills nothing.
    let t = now.max(state.last);
    let periods = (t - state.last) / period;
    let tokens = capacity.min(state.tokens.saturating_add(periods.saturating_mul(refill)));
    let last = if tokens == capacity {
        t
    } else {
        // periods * period <= t - last: cannot overflow.
        state.last + periods * period
    };

    let allowed = tokens >= cost;
    let after = if allowed { tokens - cost } else { tokens };
    // The instant `missing` more tokens are in, counting whole periods
    // from `last`.
    let refilled_at = |missing: u64| {
        last.saturating_add(missing.div_ceil(refill).saturating_mul(period))
            .saturating_sub(now)
    };
    let verdict = BandVerdict {
        allowed,
        remaining: after,
        reset_after: if after >= capacity {
            0
        } else {
            refilled_at(capacity - after)
        },
        retry_after: if allowed {
            0
        } else {
            refilled_at(cost - tokens)
        },
    };
    let next = if allowed {
        BandState {
            tokens: after,
            last,
        }
    } else {
        *state
    };
    (next, verdict)
}
