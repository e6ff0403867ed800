//! Token bucket refilled by whole periods: `refill_tokens` are
//! added per elapsed `refill_every`, never a fraction, so every value is an
//! integer and the Lua side agrees to the unit.

use std::num::NonZeroU32;
use std::time::Duration;

use super::{exact_in_lua, per_band, short, BandSpec, BandVerdict, Params, Spec};
use crate::limit::{micros, Decision, Micros};

/// Holds up to `capacity`; `refill_tokens` are added per whole
/// `refill_every` period (whole-period refill, integer-exact).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketBand {
    pub capacity: NonZeroU32,
    pub refill_tokens: NonZeroU32,
    /// At least one millisecond (validated).
    pub refill_every: Duration,
    /// `delay.max_wait` of the policy, in microseconds: a request the
    /// bucket has too few tokens for is admitted when they come within
    /// this, the tokens taken ahead (the refill stamp moves past now) and
    /// the request told to wait for them. 0: refused at once.
    pub max_wait_us: u64,
}

impl BucketBand {
    /// Time for an empty bucket to refill to capacity, in whole periods.
    pub fn full_refill(&self) -> Duration {
        let periods = self.capacity.get().div_ceil(self.refill_tokens.get());
        self.refill_every.saturating_mul(periods)
    }
}

pub struct TokenBucket;

impl Spec for TokenBucket {
    const NAME: &'static str = "token-bucket";
    const PARAMETERS: &'static [&'static str] = &["capacity", "refill_tokens", "refill_every"];
    /// Tokens in a bucket and the start of the refill period under way
    /// mean the same under any capacity (a fuller bucket than the new
    /// capacity is cut down to it) and any refill.
    const RESET_BY: &'static [&'static str] = &[];
    const LUA: &'static str = include_str!("../../../lua/token_bucket.lua");
    const REFUND_LUA: &'static str = include_str!("../../../lua/refund/token_bucket.lua");
    const STATE_MARK: &'static str = "tb2";
    const STATE_NUMBERS: usize = 2;
    type Band = BucketBand;
    type State = Vec<BandState>;

    fn band(params: &mut dyn Params) -> Option<BucketBand> {
        let capacity = params.count("capacity", None);
        let refill_tokens = params.count("refill_tokens", Some(NonZeroU32::MIN));
        let refill_every = params.window("refill_every");
        let band = BucketBand {
            capacity: capacity?,
            refill_tokens: refill_tokens?,
            refill_every: refill_every?,
            max_wait_us: 0,
        };
        let product = u128::from(band.capacity.get()) * band.refill_every.as_micros();
        exact_in_lua(params, "capacity", product, "capacity × refill_every")?;
        Some(band)
    }

    /// Tokens taken ahead (`delay`) move the refill stamp up to
    /// `max_wait` past now.
    fn horizon(band: &BucketBand) -> Duration {
        band.full_refill() + Duration::from_micros(band.max_wait_us)
    }

    fn fresh(bands: &[BucketBand]) -> Vec<BandState> {
        bands.iter().map(BandState::fresh).collect()
    }

    fn evaluate(
        bands: &[BucketBand],
        state: &mut Vec<BandState>,
        now: Micros,
        cost: u32,
    ) -> Decision {
        per_band::<Self, _>(bands, state, now, cost, check)
    }

    fn refund(bands: &[BucketBand], state: &mut Vec<BandState>, _at: Micros, cost: u32) {
        for (band, state) in bands.iter().zip(state.iter_mut()) {
            let capacity = u64::from(band.capacity.get());
            state.tokens = state.tokens.saturating_add(u64::from(cost)).min(capacity);
        }
    }
}

impl BandSpec for BucketBand {
    /// A bucket's window is the time to refill it whole.
    fn quota(&self) -> (u32, Duration) {
        (self.capacity.get(), self.full_refill())
    }

    fn max_cost(&self) -> u32 {
        self.capacity.get()
    }

    fn lua_args(&self) -> Vec<u64> {
        vec![
            u64::from(self.capacity.get()),
            u64::from(self.refill_tokens.get()),
            micros(self.refill_every),
            self.max_wait_us,
        ]
    }

    fn revision(&self) -> String {
        String::from(";bucket")
    }

    /// `5 (+1/10s)`.
    fn describe(&self) -> String {
        let delay = match self.max_wait_us {
            0 => String::new(),
            us => format!(" delay ≤{}", short(Duration::from_micros(us))),
        };
        format!(
            "{} (+{}/{}){delay}",
            self.capacity,
            self.refill_tokens,
            short(self.refill_every)
        )
    }

    /// Capacity and refill rate both divided. The rate is divided by
    /// tokens while there are at least `share` of them per period;
    /// otherwise by stretching the period (`refill_tokens` every
    /// `refill_every × share`), so a slow bucket is not handed the whole
    /// fleet's rate by rounding its one token up.
    fn shared(&self, share: NonZeroU32) -> BucketBand {
        let (refill_tokens, refill_every) = if self.refill_tokens >= share {
            (super::divided(self.refill_tokens, share), self.refill_every)
        } else {
            (
                self.refill_tokens,
                self.refill_every.saturating_mul(share.get()),
            )
        };
        BucketBand {
            capacity: super::divided(self.capacity, share),
            refill_tokens,
            refill_every,
            // A sidecar deciding alone takes no tokens ahead.
            max_wait_us: 0,
        }
    }
}

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

    let enough = tokens >= cost;
    // With a delay, tokens that come within `max_wait` are taken ahead:
    // the refill stamp moves on by the periods they need (past now), and
    // the request waits until then. Without enough tokens the stamp is
    // within one period of `t`, so the wait is never 0.
    let periods_ahead = if enough {
        0
    } else {
        (cost - tokens).div_ceil(refill)
    };
    let ready_at = last.saturating_add(periods_ahead.saturating_mul(period));
    let wait = ready_at.saturating_sub(now);
    // `periods_ahead` refills cover what was missing unless `cost` is
    // above `capacity` (which validation refuses).
    let filled = capacity.min(tokens.saturating_add(periods_ahead.saturating_mul(refill)));
    let taken_ahead = !enough && band.max_wait_us > 0 && wait <= band.max_wait_us && filled >= cost;
    let allowed = enough || taken_ahead;
    let (tokens, last) = if taken_ahead {
        (filled, ready_at)
    } else {
        (tokens, last)
    };
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
        // Admitted: the wait for its tokens. Refused: until it would be
        // admitted (with a wait).
        // Without a delay nothing is taken ahead: a stamp past now is a
        // clock gone back, and waits for nothing.
        retry_after: if allowed {
            if band.max_wait_us > 0 {
                wait
            } else {
                0
            }
        } else {
            wait.saturating_sub(band.max_wait_us)
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
