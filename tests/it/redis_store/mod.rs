//! The Redis store against real `redis-server` processes: the same decisions
//! as the memory store, exact limits under concurrency, all-or-nothing
//! bands, and the failure classification (kill, restart, FUNCTION FLUSH,
//! CLIENT PAUSE, a lost reply, ACL, TLS).

use crate::support;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rand::{Rng, SeedableRng};
use redis::Commands;
use tokio::time::Instant;

use crate::support::redis::RedisServer;
use crate::support::redis_sidecar::held_record;
use crate::support::store_api::*;
use sluice::limit::{
    Bands, BucketBand, GcraBand, Incompatible, Micros, Outcome, Policy, Unavailable, WindowBand,
};
use sluice::store::memory::MemoryStore;
use sluice::store::redis::RedisStore;
use sluice::store::{Evaluation, EvaluationId};
use sluice::subject::{Pseudonym, PseudonymKey};

mod access;
mod conformance;
mod exactness;
mod failures;

/// Scheduling slack on a loaded two-core machine.
const MARGIN: Duration = Duration::from_millis(150);

fn all_bands() -> Vec<(&'static str, Bands)> {
    vec![
        (
            "fixed",
            Bands::FixedWindow(vec![window(4, 1000), window(7, 3000)]),
        ),
        (
            "counter",
            Bands::SlidingCounter(vec![window(4, 1000), window(7, 3000)]),
        ),
        (
            "log",
            Bands::SlidingLog(vec![window(4, 1000), window(7, 3000)]),
        ),
        (
            "bucket",
            Bands::TokenBucket(vec![bucket(4, 1, 250), bucket(7, 2, 1000)]),
        ),
        (
            "gcra",
            Bands::Gcra(vec![gcra(8, 1000, 4), gcra(20, 10_000, 7)]),
        ),
        // With `delay`: past the burst, admitted and told to wait.
        (
            "bucket-delay",
            Bands::TokenBucket(vec![
                BucketBand {
                    max_wait_us: 300_000,
                    ..bucket(4, 1, 250)
                },
                BucketBand {
                    max_wait_us: 300_000,
                    ..bucket(7, 2, 1000)
                },
            ]),
        ),
        (
            "gcra-delay",
            Bands::Gcra(vec![
                GcraBand {
                    max_wait_us: 300_000,
                    ..gcra(8, 1000, 4)
                },
                GcraBand {
                    max_wait_us: 300_000,
                    ..gcra(20, 10_000, 7)
                },
            ]),
        ),
    ]
}

/// Every registered algorithm is in both conformance tables: one added to
/// the registry and not here fails, rather than going unchecked.
#[test]
fn the_conformance_tables_hold_every_algorithm() {
    for (name, table) in [("all_bands", all_bands()), ("slow_bands", slow_bands())] {
        let covered: Vec<sluice::limit::Algorithm> =
            table.iter().map(|(_, bands)| bands.algorithm()).collect();
        for algorithm in sluice::limit::Algorithm::ALL {
            assert!(
                covered.contains(algorithm),
                "{} is registered but not in {name}",
                algorithm.name()
            );
        }
    }
}

/// [`all_bands`]' limits over hours: a burst that counts its admissions
/// cannot straddle a fixed window's edge or earn a refill, however slow
/// the machine (a fixed window is aligned to the clock, so even a fast
/// burst of 1-second windows can meet an edge).
fn slow_bands() -> Vec<(&'static str, Bands)> {
    const HOUR: u64 = 3_600_000;
    vec![
        (
            "fixed",
            Bands::FixedWindow(vec![window(4, HOUR), window(7, 3 * HOUR)]),
        ),
        (
            "counter",
            Bands::SlidingCounter(vec![window(4, HOUR), window(7, 3 * HOUR)]),
        ),
        (
            "log",
            Bands::SlidingLog(vec![window(4, HOUR), window(7, 3 * HOUR)]),
        ),
        (
            "bucket",
            Bands::TokenBucket(vec![bucket(4, 1, HOUR), bucket(7, 2, 3 * HOUR)]),
        ),
        (
            "gcra",
            Bands::Gcra(vec![gcra(8, HOUR, 4), gcra(20, 10 * HOUR, 7)]),
        ),
    ]
}
