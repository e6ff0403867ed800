//! The five algorithms, one module each, and what they share.
//!
//! An algorithm module owns everything about its algorithm: its band type
//! (or the shared [`WindowBand`]), the validation of its parameters (read
//! through [`Params`], which the configuration implements: `limit` does not
//! depend on `config`),
//! its pure step, its band-level quota, horizon and maximum cost, the
//! numbers its Lua script is compiled with and the script itself
//! (`include_str!` of `lua/<name>.lua`), the text its derived revision is
//! made of, and its `sluice check` description. It says all of this by
//! implementing [`Spec`] and [`BandSpec`]; the rest of sluice reaches it only through
//! [`Bands`], [`Algorithm`] and [`evaluate`], which `registry.rs` generates
//! from one list.
//!
//! Adding a sixth algorithm takes:
//! 1. its module here, implementing [`Spec`] (and [`BandSpec`] for its
//!    band, unless it reuses one), and its `mod` line below (its vector
//!    table goes beside the others in `tests/`);
//! 2. its script, `lua/<name>.lua`, marking where `lua/common.lua` goes
//!    with `-- @common`, and its refund, `lua/refund/<name>.lua`;
//! 3. one line in the `register!` list in `registry.rs`.
//!
//! Everything else follows: the YAML name and its error messages, the
//! Redis script and its numbers, the memory store, `sluice check`, the
//! derived revision, `RateLimit-Policy`. Two things do not: a parameter
//! name no algorithm used before also needs its field in `config/raw.rs`
//! (`raw::Params` and the flat `raw::Policy`, serde having no other way to refuse
//! unknown keys), and the docs (`lua/README.md`, `docs/ALGORITHMS.md`,
//! `docs/CONFIGURATION.md`) describe it by hand. The whole checklist,
//! tests included, is in `docs/ALGORITHMS.md`, "Adding an algorithm".
//!
//! The steps: `(state, now, bands, cost) → (state, decision)`. See
//! `docs/ALGORITHMS.md` for the exact integer arithmetic, which the Lua
//! scripts follow too. Each algorithm's step checks one band (the sliding
//! log: every band against one log); [`evaluate`] runs it over every band
//! and writes all of them or none. Steps never read a clock, never panic
//! and never overflow (products that could be large are saturated or taken
//! in `u128`).
//!
//! A `now` earlier than the times a state holds is treated as that time (no
//! time has passed), so a clock stepping back admits nothing extra. Reported
//! durations still count from the caller's `now`, so `now + retry_after` is
//! the instant the request passes in the caller's own clock. Stores already
//! clamp their clock, for which this is a no-op.

pub mod fixed_window;
pub mod gcra;
mod params;
mod registry;

pub use params::Params;
pub mod sliding_counter;
pub mod sliding_log;
pub mod token_bucket;
mod window;

#[cfg(test)]
mod tests;

use std::fmt::Debug;
use std::hash::Hash;
use std::num::NonZeroU32;
use std::time::Duration;

use super::{Decision, Micros};

pub use gcra::GcraBand;
pub use registry::{evaluate, refund, Algorithm, Bands, State};
pub use token_bucket::BucketBand;
pub use window::WindowBand;

/// What an algorithm module provides; `registry.rs` turns the list of them
/// into [`Algorithm`], [`Bands`] and [`State`]. Only [`Spec::fresh`] (for
/// a subject never seen) and [`Spec::evaluate`] run per request; the rest
/// runs when a configuration loads.
pub trait Spec {
    /// Its name in YAML, in `sluice check` and in the derived revision.
    const NAME: &'static str;
    /// The keys one band takes, in the order the docs list them.
    const PARAMETERS: &'static [&'static str];
    /// The parameters whose change makes a subject's state mean something
    /// else, so the derived revision (and with it every count) starts
    /// afresh; a change to any other parameter keeps the counts. The
    /// algorithm itself and the number and order of bands always do.
    /// [`BandSpec::revision`] is made of exactly these (a unit test checks).
    const RESET_BY: &'static [&'static str];
    /// Whether it admits exactly its limit. Only the sliding counter
    /// estimates.
    const EXACT: bool = true;
    /// `lua/<name>.lua`, before `lua/common.lua` and the policy's numbers
    /// are spliced in.
    const LUA: &'static str;
    /// `lua/refund/<name>.lua`: how `lua/refund.lua` gives back what one
    /// admitted evaluation charged (Redis Cluster, several limits).
    const REFUND_LUA: &'static str;
    /// What the state key carries before the subject's pseudonym: the
    /// format of the state its script keeps there (`lua/README.md`,
    /// "KEYS"), empty for none. A new format takes a new mark, so a key
    /// written in the old one is never read (it expires with its TTL), and
    /// two algorithms never read each other's state under one revision.
    const STATE_MARK: &'static str;
    /// How many numbers each band keeps in the compact state, a string of
    /// numbers (`lua/state.lua`); 0 for a script that keeps no such state.
    /// The script says the same (`local per_band = …`; a unit test checks).
    const STATE_NUMBERS: usize;

    type Band: BandSpec;
    /// One subject's state under every band of a policy.
    type State: Debug + Clone + PartialEq + Eq;

    /// One band's parameters (the band `params` has selected), validated.
    /// Parameters outside [`Spec::PARAMETERS`] are already reported.
    fn band(params: &mut dyn Params) -> Option<Self::Band>;

    /// How long the band's state matters after its last admitted request:
    /// past this, dropping it is indistinguishable from keeping it.
    fn horizon(band: &Self::Band) -> Duration;

    /// A subject never seen before. Needs no `now`: the fresh state is
    /// written so that the step gives exactly the spec's "never seen"
    /// values at whatever time it is first evaluated.
    fn fresh(bands: &[Self::Band]) -> Self::State;
    /// Checks every band; charges all of them only if all admit `cost`. A
    /// state that does not fit `bands` reads as a subject never seen.
    fn evaluate(bands: &[Self::Band], state: &mut Self::State, now: Micros, cost: u32) -> Decision;
    /// Gives back `cost` units admitted at `at`, where the state still
    /// holds them (the twin of `lua/refund/<name>.lua`): a window since
    /// ended, or a log entry since dropped, needs nothing.
    fn refund(bands: &[Self::Band], state: &mut Self::State, at: Micros, cost: u32);
}

/// What one band provides, whichever algorithm reads it: the three window
/// algorithms share [`WindowBand`], so these are written once for it.
pub trait BandSpec: Debug + Clone + PartialEq + Eq + Hash {
    /// `(quota, window)` for `RateLimit-Policy` (`q`, `w`) and `sluice
    /// check`.
    fn quota(&self) -> (u32, Duration);
    /// The largest cost the band could ever admit at once.
    fn max_cost(&self) -> u32;
    /// The band's numbers in `P_BAND_ARGS` (`lua/README.md`).
    fn lua_args(&self) -> Vec<u64>;
    /// The band's part of the derived revision: its algorithm's
    /// [`Spec::RESET_BY`] parameters. Changing what it is made of for an
    /// existing band changes every derived revision, and so resets every
    /// counter.
    fn revision(&self) -> String;
    /// The band in the `LIMITS` column of `sluice check`.
    fn describe(&self) -> String;
    /// The band one of `share` sidecars enforces alone while the shared
    /// store cannot decide (`on_failure: local`): its quota divided by
    /// `share`, rounded down, never below 1 (see [`divided`]). What
    /// "quota" means is the band's to say; docs/REDIS.md, "When the store
    /// is down: local fallback", lists them.
    fn shared(&self, share: NonZeroU32) -> Self;
}

/// Everything sluice derives from one band, gathered when a policy loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BandProfile {
    pub quota: u32,
    pub window: Duration,
    pub horizon: Duration,
    pub max_cost: u32,
    pub lua_args: Vec<u64>,
    pub revision: String,
    pub description: String,
}

fn profile<A: Spec>(band: &A::Band) -> BandProfile {
    let (quota, window) = band.quota();
    BandProfile {
        quota,
        window,
        horizon: A::horizon(band),
        max_cost: band.max_cost(),
        lua_args: band.lua_args(),
        revision: band.revision(),
        description: band.describe(),
    }
}

/// Every band of a policy, each checked against `A`'s parameters: `None`
/// if any is invalid or there is none (each error already reported).
fn parse<A: Spec>(params: &mut dyn Params) -> Option<Vec<A::Band>> {
    let count = params.bands();
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        params.select(i);
        let mut foreign = false;
        for key in params.written() {
            if !A::PARAMETERS.contains(&key) {
                foreign = true;
                let message = format!(
                    "`{key}` is not a parameter of {}; it takes {}",
                    A::NAME,
                    A::PARAMETERS.join(", ")
                );
                params.foreign(key, &message);
            }
        }
        if let Some(band) = A::band(params) {
            if !foreign {
                out.push(band);
            }
        }
    }
    (out.len() == count && !out.is_empty()).then_some(out)
}

/// The Redis scripts compute in doubles, exact up to 2^53: a band whose
/// time arithmetic could pass it is refused here rather than by the script
/// at run time.
fn exact_in_lua(
    params: &mut dyn Params,
    name: &'static str,
    product_us: u128,
    what: &str,
) -> Option<()> {
    if product_us >= 1 << 53 {
        let message = format!("{what} in microseconds must stay below 2^53 (about 285 years)");
        params.refuse(name, &message);
        return None;
    }
    Some(())
}

/// `n / share`, rounded down but at least 1: a fleet of `share` sidecars
/// then admits about `n` together, and never a sidecar nothing.
pub fn divided(n: NonZeroU32, share: NonZeroU32) -> NonZeroU32 {
    NonZeroU32::new(n.get() / share.get()).unwrap_or(NonZeroU32::MIN)
}

/// `1h`, `10s`, `1m30s`, `250ms`: no spaces, so `sluice check`'s columns
/// stay aligned.
fn short(d: Duration) -> String {
    humantime::format_duration(d).to_string().replace(' ', "")
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

/// [`Spec::evaluate`] of an algorithm with one state per band: runs `step`
/// over every band, then writes every band only if all admitted. The step
/// is pure, so it is simply run again to get the states to write: cheaper
/// than allocating to keep them.
fn per_band<A, S>(
    bands: &[A::Band],
    states: &mut Vec<S>,
    now: Micros,
    cost: u32,
    step: fn(&A::Band, &S, Micros, u32) -> (S, BandVerdict),
) -> Decision
where
    A: Spec<State = Vec<S>>,
{
    if states.len() != bands.len() {
        // Written under other bands: cannot happen through a store (the
        // revision is part of the key), but the only meaningful reading is
        // a subject never seen.
        *states = A::fresh(bands);
    }
    let approximate = !A::EXACT;
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
    // An admission's retry_after is its delay (gcra with `delay`): the
    // request waits for the slowest band's turn.
    let mut wait = 0;
    for (index, verdict) in verdicts.enumerate() {
        if verdict.allowed {
            wait = wait.max(verdict.retry_after);
        }
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
            retry_after: Duration::from_micros(if v.allowed { wait } else { v.retry_after }),
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
