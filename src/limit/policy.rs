//! A validated policy: which algorithm, which bands, which revision.
//!
//! Built by `config::validate`; every band is already known to be
//! valid (non-zero limits and windows, consistent burst), so the algorithms
//! never check parameters.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

/// The five algorithms. Derived from [`Bands`], never stored beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    FixedWindow,
    SlidingCounter,
    SlidingLog,
    TokenBucket,
    Gcra,
}

impl Algorithm {
    /// The name used in YAML, `check` output and Lua script names.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::SlidingCounter => "sliding-counter",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::TokenBucket => "token-bucket",
            Algorithm::Gcra => "gcra",
        }
    }

    /// Every algorithm but the sliding counter admits exactly its limit.
    pub fn is_exact(self) -> bool {
        !matches!(self, Algorithm::SlidingCounter)
    }
}

/// `limit` units per `window` (fixed-window, sliding-counter, sliding-log).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowBand {
    pub limit: NonZeroU32,
    /// At least one millisecond (validated).
    pub window: Duration,
}

/// Token bucket: holds up to `capacity`; `refill_tokens` are added per whole
/// `refill_every` period (seed 000's whole-period refill, integer-exact).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BucketBand {
    pub capacity: NonZeroU32,
    pub refill_tokens: NonZeroU32,
    /// At least one millisecond (validated).
    pub refill_every: Duration,
}

/// GCRA: a smooth rate of `limit` per `window`, at most `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GcraBand {
    pub limit: NonZeroU32,
    /// At least one millisecond (validated).
    pub window: Duration,
    pub burst: NonZeroU32,
}

/// Every band of a policy shares its algorithm; all must pass, and a request
/// denied by any band consumes nothing of any band. Never empty (validated).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Bands {
    FixedWindow(Vec<WindowBand>),
    SlidingCounter(Vec<WindowBand>),
    SlidingLog(Vec<WindowBand>),
    TokenBucket(Vec<BucketBand>),
    Gcra(Vec<GcraBand>),
}

impl Bands {
    pub fn algorithm(&self) -> Algorithm {
        match self {
            Bands::FixedWindow(_) => Algorithm::FixedWindow,
            Bands::SlidingCounter(_) => Algorithm::SlidingCounter,
            Bands::SlidingLog(_) => Algorithm::SlidingLog,
            Bands::TokenBucket(_) => Algorithm::TokenBucket,
            Bands::Gcra(_) => Algorithm::Gcra,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Bands::FixedWindow(b) | Bands::SlidingCounter(b) | Bands::SlidingLog(b) => b.len(),
            Bands::TokenBucket(b) => b.len(),
            Bands::Gcra(b) => b.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(quota, window)` of each band, for `RateLimit-Policy` (`q`, `w`)
    /// and `sluice check`. A bucket's window is the time to refill it whole.
    pub fn quotas(&self) -> Vec<(u32, Duration)> {
        match self {
            Bands::FixedWindow(b) | Bands::SlidingCounter(b) | Bands::SlidingLog(b) => {
                b.iter().map(|b| (b.limit.get(), b.window)).collect()
            }
            Bands::TokenBucket(b) => b
                .iter()
                .map(|b| (b.capacity.get(), b.full_refill()))
                .collect(),
            Bands::Gcra(b) => b.iter().map(|b| (b.limit.get(), b.window)).collect(),
        }
    }

    /// The largest cost a single request could ever be admitted with.
    pub fn max_cost(&self) -> u32 {
        let per_band = |b: &Bands| -> Vec<u32> {
            match b {
                Bands::FixedWindow(b) | Bands::SlidingCounter(b) | Bands::SlidingLog(b) => {
                    b.iter().map(|b| b.limit.get()).collect()
                }
                Bands::TokenBucket(b) => b.iter().map(|b| b.capacity.get()).collect(),
                Bands::Gcra(b) => b.iter().map(|b| b.burst.get()).collect(),
            }
        };
        per_band(self).into_iter().min().unwrap_or(0)
    }

    /// How long a subject's state matters after its last admitted request:
    /// past this, dropping the state is indistinguishable from keeping it.
    /// Stores set their TTL to this plus a grace.
    pub fn horizon(&self) -> Duration {
        let each: Vec<Duration> = match self {
            Bands::FixedWindow(b) | Bands::SlidingLog(b) => b.iter().map(|b| b.window).collect(),
            // The previous window still weighs on the current one.
            Bands::SlidingCounter(b) => b.iter().map(|b| b.window.saturating_mul(2)).collect(),
            Bands::TokenBucket(b) => b.iter().map(|b| b.full_refill()).collect(),
            Bands::Gcra(b) => b.iter().map(|b| b.burst_span()).collect(),
        };
        each.into_iter().max().unwrap_or_default()
    }
}

impl BucketBand {
    /// Time for an empty bucket to refill to capacity, in whole periods.
    pub fn full_refill(&self) -> Duration {
        let periods = self.capacity.get().div_ceil(self.refill_tokens.get());
        self.refill_every.saturating_mul(periods)
    }
}

impl GcraBand {
    /// Emission interval in microseconds, rounded up so a rounding error can
    /// only ever admit less, never more, than `limit` per `window`.
    pub fn emission_interval_us(&self) -> u64 {
        super::micros(self.window).div_ceil(u64::from(self.limit.get()))
    }

    /// Time for a full burst to drain back to nothing.
    pub fn burst_span(&self) -> Duration {
        Duration::from_micros(
            self.emission_interval_us()
                .saturating_mul(u64::from(self.burst.get())),
        )
    }
}

/// A named, validated policy. Shared by reference between routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub name: Arc<str>,
    /// Part of every store key, so a changed policy never reads counters
    /// written under the old parameters. Derived from the parameters unless
    /// written explicitly.
    pub revision: Arc<str>,
    /// Count and report, never block.
    pub shadow: bool,
    /// Private with what is derived from it, so the two cannot disagree;
    /// derived once here rather than on every request.
    bands: Bands,
    horizon: Duration,
    max_cost: u32,
    quotas: Box<[(u32, Duration)]>,
}

impl Policy {
    pub fn new(
        name: impl Into<Arc<str>>,
        revision: impl Into<Arc<str>>,
        bands: Bands,
        shadow: bool,
    ) -> Policy {
        Policy {
            name: name.into(),
            revision: revision.into(),
            shadow,
            horizon: bands.horizon(),
            max_cost: bands.max_cost(),
            quotas: bands.quotas().into(),
            bands,
        }
    }

    pub fn bands(&self) -> &Bands {
        &self.bands
    }

    pub fn algorithm(&self) -> Algorithm {
        self.bands.algorithm()
    }

    /// See [`Bands::horizon`].
    pub fn horizon(&self) -> Duration {
        self.horizon
    }

    /// The largest cost a single request could ever be admitted with.
    pub fn max_cost(&self) -> u32 {
        self.max_cost
    }

    /// See [`Bands::quotas`].
    pub fn quotas(&self) -> &[(u32, Duration)] {
        &self.quotas
    }
}
