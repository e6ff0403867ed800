//! The pure algorithm steps: `(state, now, bands, cost) → (state, decision)`.
//! See `docs/ALGORITHMS.md` for the exact integer arithmetic, which the Lua
//! scripts follow too.
//!
//! Each algorithm file holds one band's step; [`evaluate`] runs it over every
//! band and writes all of them or none. Steps never read a clock, never
//! panic and never overflow (products that could be large are saturated or
//! taken in `u128`).
//!
//! A `now` earlier than the times a state holds is treated as that time (no
//! time has passed), so a clock stepping back admits nothing extra. Reported
//! durations still count from the caller's `now`, so `now + retry_after` is
//! the instant the request passes in the caller's own clock. Stores already
//! clamp their clock, for which this is a no-op.

pub mod fixed_window;
pub mod gcra;
pub mod sliding_counter;
pub mod sliding_log;
pub mod token_bucket;

#[cfg(test)]
mod tests;

use std::time::Duration;

use super::{Bands, Decision, Micros};

/// The state of one subject under one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State(PerAlgorithm);

/// One entry per band, except the sliding log, whose one log serves every
/// band (an entry counts in each band whose window still covers it).
#[derive(Debug, Clone, PartialEq, Eq)]
enum PerAlgorithm {
    FixedWindow(Vec<fixed_window::BandState>),
    SlidingCounter(Vec<sliding_counter::BandState>),
    SlidingLog(sliding_log::Log),
    TokenBucket(Vec<token_bucket::BandState>),
    Gcra(Vec<gcra::BandState>),
}

impl State {
    /// A subject never seen before. Needs no `now`: each band's fresh state
    /// is written so that the step arithmetic gives exactly the spec's
    /// "never seen" values at whatever time it is first evaluated.
    pub fn new(bands: &Bands) -> State {
        State(match bands {
            Bands::FixedWindow(b) => {
                PerAlgorithm::FixedWindow(vec![fixed_window::BandState::default(); b.len()])
            }
            Bands::SlidingCounter(b) => {
                PerAlgorithm::SlidingCounter(vec![sliding_counter::BandState::default(); b.len()])
            }
            Bands::SlidingLog(_) => PerAlgorithm::SlidingLog(sliding_log::Log::default()),
            Bands::TokenBucket(b) => {
                PerAlgorithm::TokenBucket(b.iter().map(token_bucket::BandState::fresh).collect())
            }
            Bands::Gcra(b) => PerAlgorithm::Gcra(vec![gcra::BandState::default(); b.len()]),
        })
    }
}

/// One band's answer to one request. Durations are in microseconds from the
/// caller's `now`; `retry_after` is 0 when the band admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BandVerdict {
    pub allowed: bool,
    /// Units left in this band: after the request if admitted, before it
    /// if not.
    pub remaining: u64,
    /// Until this band's quota is back to full.
    pub reset_after: Micros,
    /// When denied: the exact wait after which this band admits the same
    /// cost, nothing else having been admitted meanwhile.
    pub retry_after: Micros,
}

/// Checks every band; charges all of them only if all admit `cost`.
///
/// `cost` is expected within `1..=bands.max_cost()` (validated before a
/// store is asked); a larger cost is denied without panicking, but its
/// `retry_after` then promises nothing.
pub fn evaluate(bands: &Bands, state: &mut State, now: Micros, cost: u32) -> Decision {
    match (bands, &mut state.0) {
        (Bands::FixedWindow(b), PerAlgorithm::FixedWindow(s)) if s.len() == b.len() => {
            per_band(b, s, now, cost, fixed_window::check, false)
        }
        (Bands::SlidingCounter(b), PerAlgorithm::SlidingCounter(s)) if s.len() == b.len() => {
            per_band(b, s, now, cost, sliding_counter::check, true)
        }
        (Bands::SlidingLog(b), PerAlgorithm::SlidingLog(log)) => {
            let decision = bind(
                b.iter()
                    .map(|band| sliding_log::check(band, log, now, cost)),
                false,
            );
            if decision.allowed {
                sliding_log::admit(b, log, now, cost);
            }
            decision
        }
        (Bands::TokenBucket(b), PerAlgorithm::TokenBucket(s)) if s.len() == b.len() => {
            per_band(b, s, now, cost, token_bucket::check, false)
        }
        (Bands::Gcra(b), PerAlgorithm::Gcra(s)) if s.len() == b.len() => {
            per_band(b, s, now, cost, gcra::check, false)
        }
        // A state written under other bands. Cannot happen through a store
        // (the policy revision is part of the key), but if it did, the only
        // meaningful reading is a subject never seen. Recurses once at most:
        // `State::new` always matches its bands.
        _ => {
            *state = State::new(bands);
            evaluate(bands, state, now, cost)
        }
    }
}

/// Runs a per-band step over every band, then writes every band only if all
/// admitted. The step is pure, so it is simply run again to get the states
/// to write: cheaper than allocating to keep them.
fn per_band<B, S>(
    bands: &[B],
    states: &mut [S],
    now: Micros,
    cost: u32,
    step: fn(&B, &S, Micros, u32) -> (S, BandVerdict),
    approximate: bool,
) -> Decision {
    let decision = bind(
        bands
            .iter()
            .zip(states.iter())
            .map(|(band, state)| step(band, state, now, cost).1),
        approximate,
    );
    if decision.allowed {
        for (band, state) in bands.iter().zip(states.iter_mut()) {
            *state = step(band, state, now, cost).0;
        }
    }
    decision
}

/// Picks the binding band (docs/ALGORITHMS.md, "Bands, all or nothing"):
/// when every band admits, the one with the least remaining; otherwise the
/// denying band with the largest retry_after. Lowest index on ties.
///
/// Reporting the largest retry_after is exact for the whole request: no
/// band's admission can be lost by waiting (counts only drain, tokens only
/// refill), so once the slowest denying band admits, all do.
fn bind(verdicts: impl Iterator<Item = BandVerdict>, approximate: bool) -> Decision {
    let mut least_remaining: Option<(usize, BandVerdict)> = None;
    let mut longest_retry: Option<(usize, BandVerdict)> = None;
    for (index, verdict) in verdicts.enumerate() {
        let best = if verdict.allowed {
            &mut least_remaining
        } else {
            &mut longest_retry
        };
        let better = match best {
            None => true,
            Some((_, b)) if verdict.allowed => verdict.remaining < b.remaining,
            Some((_, b)) => verdict.retry_after > b.retry_after,
        };
        if better {
            *best = Some((index, verdict));
        }
    }
    match longest_retry.or(least_remaining) {
        Some((band, v)) => Decision {
            allowed: v.allowed,
            band,
            remaining: v.remaining,
            reset_after: Duration::from_micros(v.reset_after),
            retry_after: Duration::from_micros(v.retry_after),
            approximate,
        },
        // No band at all (validation forbids it): nothing limits the request.
        None => Decision {
            allowed: true,
            band: 0,
            remaining: 0,
            reset_after: Duration::ZERO,
            retry_after: Duration::ZERO,
            approximate,
        },
    }
}
