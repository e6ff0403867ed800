//! The band shape fixed-window, sliding-counter and sliding-log share:
//! `limit` units per `window`. What differs between them (the horizon, the
//! sliding counter's extra bound) stays in each algorithm's module.

use std::num::NonZeroU32;
use std::time::Duration;

use super::{short, BandSpec, Params};
use crate::limit::micros;

/// `limit` units per `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WindowBand {
    pub limit: NonZeroU32,
    /// At least one millisecond (validated).
    pub window: Duration,
}

pub(super) const PARAMETERS: &[&str] = &["limit", "window"];
/// A count (or a log of times) within a window: a new window would read
/// it over the wrong stretch of time.
pub(super) const RESET_BY: &[&str] = &["window"];

impl WindowBand {
    pub(super) fn parse(params: &mut dyn Params) -> Option<WindowBand> {
        let limit = params.count("limit", None);
        let window = params.window("window");
        Some(WindowBand {
            limit: limit?,
            window: window?,
        })
    }
}

impl BandSpec for WindowBand {
    fn quota(&self) -> (u32, Duration) {
        (self.limit.get(), self.window)
    }

    /// `limit / share` per the same window: the three window algorithms
    /// count requests per window, and that count is their quota.
    fn shared(&self, share: NonZeroU32) -> WindowBand {
        WindowBand {
            limit: super::divided(self.limit, share),
            window: self.window,
        }
    }

    fn max_cost(&self) -> u32 {
        self.limit.get()
    }

    fn lua_args(&self) -> Vec<u64> {
        vec![u64::from(self.limit.get()), micros(self.window)]
    }

    /// A count in an aligned window: the window gives it its meaning, the
    /// limit only says how far it may go.
    fn revision(&self) -> String {
        format!(";window_ms={}", self.window.as_millis())
    }

    /// `10/1s`.
    fn describe(&self) -> String {
        format!("{}/{}", self.limit, short(self.window))
    }
}
