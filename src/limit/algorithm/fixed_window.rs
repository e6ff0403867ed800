//! Fixed window: `limit` units per window aligned to multiples of `window`
//! since the Unix epoch, so every sidecar agrees where a window starts.

use std::time::Duration;

use super::{per_band, window, BandVerdict, Params, Spec, WindowBand};
use crate::limit::{micros, Decision, Micros};

pub struct FixedWindow;

impl Spec for FixedWindow {
    const NAME: &'static str = "fixed-window";
    const PARAMETERS: &'static [&'static str] = window::PARAMETERS;
    const RESET_BY: &'static [&'static str] = window::RESET_BY;
    const LUA: &'static str = include_str!("../../../lua/fixed_window.lua");
    const REFUND_LUA: &'static str = include_str!("../../../lua/refund/fixed_window.lua");
    const STATE_MARK: &'static str = "fw2";
    const STATE_NUMBERS: usize = 2;
    type Band = WindowBand;
    type State = Vec<BandState>;

    fn band(params: &mut dyn Params) -> Option<WindowBand> {
        WindowBand::parse(params)
    }

    fn horizon(band: &WindowBand) -> Duration {
        band.window
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
            if state.start == at - at % w {
                state.count = state.count.saturating_sub(u64::from(cost));
            }
        }
    }
}

/// `(start, count)`: units admitted in the window starting at `start`.
/// The default `(0, 0)` is a subject never seen: a zero count reads the same
/// whichever window it names.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BandState {
    start: Micros,
    count: u64,
}

/// One band's step: the verdict, and the state to write if every band
/// admits (the input state, unchanged, when this band denies).
pub fn check(
    band: &WindowBand,
    state: &BandState,
    now: Micros,
    cost: u32,
) -> (BandState, BandVerdict) {
    // Validated to at least 1 ms; the floor only keeps `%` from panicking.
    let w = micros(band.window).max(1);
    let limit = u64::from(band.limit.get());
    let cost = u64::from(cost);

    // A clock behind the stored window stays in that window.
    let t = now.max(state.start);
    let ws = t - t % w;
    let count = if state.start == ws { state.count } else { 0 };
    let allowed = count.saturating_add(cost) <= limit;
    let after = if allowed { count + cost } else { count };
    let reset_after = ws.saturating_add(w).saturating_sub(now);

    let verdict = BandVerdict {
        allowed,
        remaining: limit.saturating_sub(after),
        reset_after,
        retry_after: if allowed { 0 } else { reset_after },
    };
    let next = if allowed {
        BandState {
            start: ws,
            count: after,
        }
    } else {
        *state
    };
    (next, verdict)
}
