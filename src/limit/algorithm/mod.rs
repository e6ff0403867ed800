//! The pure algorithm steps: `(state, now, bands, cost) → (state, decision)`.
//! See `docs/ALGORITHMS.md` for the exact integer arithmetic, which the Lua
//! scripts follow too.

use super::{Bands, Decision, Micros};

/// The state of one subject under one policy: one entry per band.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State;

impl State {
    /// A subject never seen before.
    pub fn new(_bands: &Bands) -> State {
        State
    }
}

/// Checks every band; charges all of them only if all admit `cost`.
pub fn evaluate(_bands: &Bands, _state: &mut State, _now: Micros, _cost: u32) -> Decision {
    unimplemented!("algorithms")
}
