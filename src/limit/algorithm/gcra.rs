//! GCRA: a smooth rate of one unit per emission interval `T`, with up to
//! `burst` units at once (tolerance `tau = burst * T`). Exact and one
//! integer of state per band.

use std::num::NonZeroU32;
use std::time::Duration;

use super::{exact_in_lua, per_band, short, BandSpec, BandVerdict, Params, Spec};
use crate::limit::{micros, Decision, Micros};

/// A smooth rate of `limit` per `window`, at most `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GcraBand {
    pub limit: NonZeroU32,
    /// At least one millisecond (validated).
    pub window: Duration,
    pub burst: NonZeroU32,
    /// `delay.max_wait` of the policy, in microseconds: a request past the
    /// burst is admitted when its turn comes within this, and told to
    /// wait for it (`retry_after` of an admission). 0: refused as soon as
    /// the burst is spent.
    pub max_wait_us: u64,
}

impl GcraBand {
    /// Emission interval in microseconds, rounded up so a rounding error can
    /// only ever admit less, never more, than `limit` per `window`.
    pub fn emission_interval_us(&self) -> u64 {
        micros(self.window).div_ceil(u64::from(self.limit.get()))
    }

    /// Time for a full burst to drain back to nothing.
    pub fn burst_span(&self) -> Duration {
        Duration::from_micros(
            self.emission_interval_us()
                .saturating_mul(u64::from(self.burst.get())),
        )
    }
}

pub struct Gcra;

impl Spec for Gcra {
    const NAME: &'static str = "gcra";
    const PARAMETERS: &'static [&'static str] = &["limit", "window", "burst"];
    /// The state is a theoretical arrival time, a debt measured in
    /// emission intervals (`window / limit`): under another interval it
    /// would stand for another number of requests. The burst only says how
    /// much debt is tolerated.
    const RESET_BY: &'static [&'static str] = &["limit", "window"];
    const LUA: &'static str = include_str!("../../../lua/gcra.lua");
    const REFUND_LUA: &'static str = include_str!("../../../lua/refund/gcra.lua");
    const STATE_MARK: &'static str = "gc2";
    const STATE_NUMBERS: usize = 1;
    type Band = GcraBand;
    type State = Vec<BandState>;

    fn band(params: &mut dyn Params) -> Option<GcraBand> {
        let limit = params.count("limit", None);
        let window = params.window("window");
        let limit = limit?;
        let burst = params.count("burst", Some(limit));
        let band = GcraBand {
            limit,
            window: window?,
            burst: burst?,
            max_wait_us: 0,
        };
        let product = u128::from(band.burst.get()) * u128::from(band.emission_interval_us());
        exact_in_lua(params, "burst", product, "burst × window / limit")?;
        Some(band)
    }

    /// A turn taken ahead (`delay`) moves the arrival time up to
    /// `max_wait` past the burst.
    fn horizon(band: &GcraBand) -> Duration {
        band.burst_span() + Duration::from_micros(band.max_wait_us)
    }

    fn fresh(bands: &[GcraBand]) -> Vec<BandState> {
        vec![BandState::default(); bands.len()]
    }

    fn evaluate(
        bands: &[GcraBand],
        state: &mut Vec<BandState>,
        now: Micros,
        cost: u32,
    ) -> Decision {
        per_band::<Self, _>(bands, state, now, cost, check)
    }

    fn refund(bands: &[GcraBand], state: &mut Vec<BandState>, _at: Micros, cost: u32) {
        for (band, state) in bands.iter().zip(state.iter_mut()) {
            let t = band.emission_interval_us().max(1);
            state.tat = state.tat.saturating_sub(u64::from(cost).saturating_mul(t));
        }
    }
}

impl BandSpec for GcraBand {
    fn quota(&self) -> (u32, Duration) {
        (self.limit.get(), self.window)
    }

    fn max_cost(&self) -> u32 {
        self.burst.get()
    }

    /// The script derives `T` and `tau` from these itself.
    fn lua_args(&self) -> Vec<u64> {
        vec![
            u64::from(self.limit.get()),
            micros(self.window),
            u64::from(self.burst.get()),
            self.max_wait_us,
        ]
    }

    fn revision(&self) -> String {
        format!(
            ";limit={},window_ms={}",
            self.limit,
            self.window.as_millis()
        )
    }

    /// `60/1m burst 10`, and `delay ≤500ms` with a delay.
    fn describe(&self) -> String {
        let delay = match self.max_wait_us {
            0 => String::new(),
            us => format!(" delay ≤{}", short(Duration::from_micros(us))),
        };
        format!(
            "{}/{} burst {}{delay}",
            self.limit,
            short(self.window),
            self.burst
        )
    }

    /// The rate (`limit` per `window`) and the burst both divided.
    fn shared(&self, share: NonZeroU32) -> GcraBand {
        GcraBand {
            limit: super::divided(self.limit, share),
            window: self.window,
            burst: super::divided(self.burst, share),
            // A sidecar deciding alone takes no turn ahead: no other
            // sidecar would see it, so past its share it refuses.
            max_wait_us: 0,
        }
    }
}

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
    // With a delay, a request past the burst whose turn comes within
    // `max_wait` is admitted now, its turn taken, and waits for it: the
    // wait is how far past the burst it lands.
    let allowed = ahead <= u128::from(tau) + u128::from(band.max_wait_us);

    let verdict = if allowed {
        // ahead <= tau + max_wait, both u64 (validated small).
        let ahead = u64::try_from(ahead).unwrap_or(u64::MAX);
        BandVerdict {
            allowed,
            remaining: tau.saturating_sub(ahead) / t,
            reset_after: ahead,
            retry_after: ahead.saturating_sub(tau),
        }
    } else {
        let held = tat0 - now;
        BandVerdict {
            allowed,
            remaining: tau.saturating_sub(held) / t,
            reset_after: held,
            // Until it would be admitted: with a delay, told to wait.
            retry_after: u64::try_from(ahead - u128::from(tau) - u128::from(band.max_wait_us))
                .unwrap_or(u64::MAX),
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
