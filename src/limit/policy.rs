//! A validated policy: which bands, which revision, and what requests read
//! of them, computed once.
//!
//! Built by `config::validate` from bands already known to be valid
//! (non-zero limits and windows, consistent burst), so the algorithms
//! never check parameters.

use std::sync::Arc;
use std::time::Duration;

use super::{Algorithm, Bands};

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
