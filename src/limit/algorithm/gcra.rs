//! GCRA: a smooth rate of one unit per emission interval `T`, with up to
//! `burst` units at once (tolerance `tau = burst * T`). Exact and one
//! integer of state per band.

use super::BandVerdict;
use crate::limit::{GcraBand, Micros};

/// The theoretical arrival time: when the band will have room for a full
/// burst again. The default `0` is a subject never seen: every step reads
/// `max(tat, now)`, so it behaves as the spec's `tat = now`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BandState {
    tat: Micros,
}

/// One band's step: the verdict, and the state to write if every band
/// admits (the input state, unchanged, when this band denies).
///
/// Needs no clamping of a clock that went back: an earlier `now` only
/// makes `tat` look further away, which admits less.
pub fn check(
    band: &GcraBand,
    state: &BandState,
    now: Micros,
    cost: u32,
) -> (BandState, BandVerdict) {
    // Rounded up by `emission_interval_us`; at least 1 µs for a window of
    // at least 1 ms, the floor only keeps `/` from panicking.
    let t = band.emission_interval_us().max(1);
    let tau = t.saturating_mul(u64::from(band.burst.get()));

    let tat0 = state.tat.max(now);
    // In u128: `cost * T` is bounded only by validation, and an admission
    // must not come from a sum wrapping or saturating near the end of time.
    let new_tat = u128::from(tat0) + u128::from(cost) * u128::from(t);
    let ahead = new_tat - u128::from(now);
    let allowed = ahead <= u128::from(tau);

    let verdict = if allowed {
        // ahead <= tau: always fits.
        let ahead = u64::try_from(ahead).unwrap_or(tau);
        BandVerdict {
            allowed,
            remaining: (tau - ahead) / t,
            reset_after: ahead,
            retry_after: 0,
        }
    } else {
        let held = tat0 - now;
        BandVerdict {
            allowed,
            remaining: tau.saturating_sub(held) / t,
            reset_after: held,
            retry_after: u64::try_from(ahead - u128::from(tau)).unwrap_or(u64::MAX),
        }
    };
    let next = if allowed {
        BandState {
            tat: u64::try_from(new_tat).unwrap_or(u64::MAX),
        }
    } else {
        *state
    };
    (next, verdict)
}
