//! The memory store's clock.

use std::time::{SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::limit::{micros, Micros};

/// Wall-clock microseconds that never go backwards: fixed windows align to
/// the Unix epoch (so every sidecar agrees where a window starts), but a
/// wall-clock step must not rewind anyone's state. Anchored once at start,
/// advanced by the monotonic clock.
#[derive(Clone, Copy)]
pub struct Clock {
    wall_at_start: Micros,
    start: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Clock {
            wall_at_start: micros(wall),
            start: Instant::now(),
        }
    }

    pub fn now(&self) -> Micros {
        self.wall_at_start + micros(self.start.elapsed())
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}
