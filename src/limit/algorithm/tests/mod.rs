//! Vector tables per algorithm (one file each), the properties every
//! algorithm must hold over seeded pseudo-random sequences
//! (`properties.rs`), and the edges shared by all (`edges.rs`).

mod edges;
mod fixed_window;
mod gcra;
mod properties;
mod sliding_counter;
mod sliding_log;
mod token_bucket;

use std::num::NonZeroU32;
use std::time::Duration;

use super::{evaluate, State};
use crate::limit::{micros, Algorithm, Bands, BucketBand, GcraBand, Micros, WindowBand};

/// 2023-11-14T22:13:20Z: aligned to every window the tables use, and far
/// from the epoch so alignment is really exercised.
const T0: Micros = 1_700_000_000_000_000;
const SEC: Micros = 1_000_000;
const MS: Micros = 1_000;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap_or(NonZeroU32::MIN)
}

fn window(limit: u32, window: Micros) -> WindowBand {
    WindowBand {
        limit: nz(limit),
        window: Duration::from_micros(window),
    }
}

fn bucket(capacity: u32, refill_tokens: u32, refill_every: Micros) -> BucketBand {
    BucketBand {
        capacity: nz(capacity),
        refill_tokens: nz(refill_tokens),
        refill_every: Duration::from_micros(refill_every),
        max_wait_us: 0,
    }
}

fn gcra(limit: u32, window: Micros, burst: u32) -> GcraBand {
    GcraBand {
        limit: nz(limit),
        window: Duration::from_micros(window),
        burst: nz(burst),
        max_wait_us: 0,
    }
}

/// One request of a table and what it must decide; durations in µs.
#[derive(Debug, Clone, Copy)]
struct Row {
    now: Micros,
    cost: u32,
    allowed: bool,
    remaining: u64,
    reset_after: Micros,
    retry_after: Micros,
    band: usize,
}

fn ok(now: Micros, cost: u32, remaining: u64, reset_after: Micros) -> Row {
    Row {
        now,
        cost,
        allowed: true,
        remaining,
        reset_after,
        retry_after: 0,
        band: 0,
    }
}

fn deny(now: Micros, cost: u32, remaining: u64, reset_after: Micros, retry_after: Micros) -> Row {
    Row {
        now,
        cost,
        allowed: false,
        remaining,
        reset_after,
        retry_after,
        band: 0,
    }
}

impl Row {
    /// The binding band this row must report (0 unless said).
    fn band(self, band: usize) -> Row {
        Row { band, ..self }
    }
}

/// Runs the rows in order against one subject. Every decision must match
/// its row exactly, and a denial must leave the state untouched (nothing
/// of any band is consumed).
fn run(bands: &Bands, rows: &[Row]) -> State {
    let mut state = State::new(bands);
    for (i, row) in rows.iter().enumerate() {
        let before = state.clone();
        let d = evaluate(bands, &mut state, row.now, row.cost);
        let got = (
            d.allowed,
            d.band,
            d.remaining,
            micros(d.reset_after),
            micros(d.retry_after),
        );
        let want = (
            row.allowed,
            row.band,
            row.remaining,
            row.reset_after,
            row.retry_after,
        );
        assert_eq!(
            got,
            want,
            "row {i} (T0 + {} µs, cost {}): (allowed, band, remaining, reset_after, retry_after)",
            row.now.wrapping_sub(T0),
            row.cost
        );
        assert_eq!(
            d.approximate,
            bands.algorithm() == Algorithm::SlidingCounter,
            "row {i}: approximate"
        );
        if !d.allowed {
            assert_eq!(state, before, "row {i}: a denial must write nothing");
        }
    }
    state
}
