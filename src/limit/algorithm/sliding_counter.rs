//! Sliding counter (approximate): the current aligned window's count plus
//! the previous window's, weighted by how much of it the sliding window
//! still covers (Cloudflare's estimate). The weighting is in whole
//! milliseconds so the Lua side's products stay exact in doubles.

use std::time::Duration;

use super::{per_band, window, BandVerdict, Params, Spec, WindowBand};
use crate::limit::{micros, Decision, Micros};

pub struct SlidingCounter;

impl Spec for SlidingCounter {
    const NAME: &'static str = "sliding-counter";
    const PARAMETERS: &'static [&'static str] = window::PARAMETERS;
    const RESET_BY: &'static [&'static str] = window::RESET_BY;
    const EXACT: bool = false;
    const LUA: &'static str = include_str!("../../../lua/sliding_counter.lua");
    const REFUND_LUA: &'static str = include_str!("../../../lua/refund/sliding_counter.lua");
    const STATE_MARK: &'static str = "sc2";
    const STATE_NUMBERS: usize = 3;
    type Band = WindowBand;
    type State = Vec<BandState>;

    fn band(params: &mut dyn Params) -> Option<WindowBand> {
        let band = WindowBand::parse(params)?;
        // The weighting multiplies counts by whole milliseconds; past 2^53
        // the doubles Lua computes with are no longer exact.
        if u128::from(band.limit.get()) * band.window.as_millis() >= 1 << 53 {
            params.refuse(
                "limit",
                "limit × window in milliseconds must stay below 2^53 for sliding-counter",
            );
            return None;
        }
        Some(band)
    }

    /// The previous window still weighs on the current one.
    fn horizon(band: &WindowBand) -> Duration {
        band.window.saturating_mul(2)
    }

    fn fresh(bands: &[WindowBand]) -> Vec<BandState> {
        vec![BandState::default(); bands.len()]
    }

    fn evaluate(
        bands: &[WindowBand],
        state: &mut Vec<BandState>,
        now: Micros,
        cost: u32,
    ) -> Decision {
        per_band::<Self, _>(bands, state, now, cost, check)
    }

    fn refund(bands: &[WindowBand], state: &mut Vec<BandState>, at: Micros, cost: u32) {
        for (band, state) in bands.iter().zip(state.iter_mut()) {
            let w = micros(band.window).max(1);
            let charged = at - at % w;
            // The charged window is the current one, or the previous once
            // the band has moved one window on.
            if state.start == charged {
                state.cur = state.cur.saturating_sub(u64::from(cost));
            } else if state.start == charged.saturating_add(w) {
                state.prev = state.prev.saturating_sub(u64::from(cost));
            }
        }
    }
}

/// `(start, cur, prev)`: units admitted in the window starting at `start`
/// and in the one before it. The default is a subject never seen: zero
/// counts read the same whichever window they name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BandState {
    start: Micros,
    cur: u64,
    prev: u64,
}

/// One band's step: the verdict, and the state to write if every band
/// admits (the input state, unchanged, when this band denies).
pub fn check(
    band: &WindowBand,
    state: &BandState,
    now: Micros,
    cost: u32,
) -> (BandState, BandVerdict) {
    // Windows are whole milliseconds (validated); the floors only keep the
    // divisions from panicking.
    let w = micros(band.window).max(1);
    let w_ms = (w / 1000).max(1);
    let limit = u64::from(band.limit.get());
    let cost = u64::from(cost);

    // A clock behind the stored window stays in that window.
    let t = now.max(state.start);
    let ws = t - t % w;
    let (cur, prev) = if state.start == ws {
        (state.cur, state.prev)
    } else if ws.checked_sub(w) == Some(state.start) {
        (0, state.cur)
    } else {
        (0, 0)
    };

    let e_ms = (t - ws) / 1000;
    let est = cur.saturating_add(weighted(prev, w_ms.saturating_sub(e_ms), w_ms));
    let allowed = est.saturating_add(cost) <= limit;
    let remaining = if allowed {
        limit - est - cost
    } else {
        limit.saturating_sub(est)
    };
    let cur_after = if allowed { cur + cost } else { cur };

    let reset_at = if cur_after > 0 {
        Some(ws.saturating_add(w.saturating_mul(2)))
    } else if prev > 0 {
        Some(ws.saturating_add(w))
    } else {
        None
    };
    let retry_after = if allowed {
        0
    } else {
        // Admission only gets easier with time, so the first millisecond at
        // which the estimate fits is the exact answer. While `cur + cost`
        // fits, that is later in this window as `prev` fades; otherwise this
        // window's `cur` must become the fading `prev` of the next one.
        let (room, base, fading) = match limit.checked_sub(cur.saturating_add(cost)) {
            Some(room) => (room, ws, prev),
            None => (limit.saturating_sub(cost), ws.saturating_add(w), cur),
        };
        let e2 = first_fitting_ms(room, fading, w_ms);
        base.saturating_add(e2.saturating_mul(1000))
            .saturating_sub(now)
    };

    let verdict = BandVerdict {
        allowed,
        remaining,
        reset_after: reset_at.map_or(0, |at| at.saturating_sub(now)),
        retry_after,
    };
    let next = if allowed {
        BandState {
            start: ws,
            cur: cur_after,
            prev,
        }
    } else {
        *state
    };
    (next, verdict)
}

/// `floor(prev * left_ms / w_ms)`: the share of the previous window still
/// covered. `u128` because the product is only bounded by validation.
fn weighted(prev: u64, left_ms: u64, w_ms: u64) -> u64 {
    let share = u128::from(prev) * u128::from(left_ms) / u128::from(w_ms);
    u64::try_from(share).unwrap_or(u64::MAX)
}

/// The first elapsed millisecond `e` of a window at which
/// `weighted(fading, w_ms - e, w_ms) <= room`:
/// `floor(fading * (w_ms - e) / w_ms) <= room`
/// ⇔ `w_ms - e <= floor(((room + 1) * w_ms - 1) / fading)`.
/// `w_ms` when only the next window helps.
fn first_fitting_ms(room: u64, fading: u64, w_ms: u64) -> u64 {
    if fading == 0 {
        return 0;
    }
    let most_left = (u128::from(room) + 1) * u128::from(w_ms) - 1;
    let most_left = u64::try_from(most_left / u128::from(fading)).unwrap_or(u64::MAX);
    w_ms.saturating_sub(most_left)
}
