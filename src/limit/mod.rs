//! Policies, the decisions they produce, and the pure algorithm steps;
//! `concurrency` is the one policy kind that counts requests in flight
//! instead of a rate.
//!
//! Time here is an input: every step takes `now` in integer microseconds
//! since the Unix epoch ([`Micros`]), never reads a clock itself.

pub mod algorithm;
pub mod concurrency;
pub mod outcome;
pub mod policy;

pub use algorithm::{Algorithm, Bands, BucketBand, GcraBand, WindowBand};
pub use concurrency::{Concurrency, LimitPolicy};
pub use outcome::{Decision, Incompatible, Outcome, Unavailable};
pub use policy::{DelayTerms, LeaseTerms, OnFailure, Policy};

/// Microseconds since the Unix epoch. Integer so Lua (doubles) and Rust agree
/// exactly, and fine enough that a GCRA emission interval never rounds to 0.
pub type Micros = u64;

/// Converts a duration to whole microseconds, saturating.
pub fn micros(d: std::time::Duration) -> Micros {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}
