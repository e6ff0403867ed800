//! The breaker's window: calls and failures of the last `window`, in
//! [`BUCKETS`] slices of a ring, so that a call costs constant work and
//! nothing is allocated.

use std::time::Duration;

use tokio::time::Instant;

use super::Cause;

/// How many slices the window is cut into.
pub const BUCKETS: usize = 10;

/// Calls and failures of the last window, in [`BUCKETS`] slices.
pub(super) struct Window {
    origin: Instant,
    /// At least 1, so a window shorter than [`BUCKETS`] nanoseconds still
    /// divides.
    bucket_nanos: u128,
    buckets: [Bucket; BUCKETS],
}

/// One slice: the calls of the slice numbered `slot` since the origin.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    slot: u64,
    calls: u32,
    failures: u32,
    /// The failures by [`Cause`], in [`Cause::ALL`] order.
    causes: [u32; Cause::ALL.len()],
}

impl Window {
    pub(super) fn new(window: Duration, origin: Instant) -> Window {
        Window {
            origin,
            bucket_nanos: (window.as_nanos() / BUCKETS as u128).max(1),
            buckets: [Bucket::default(); BUCKETS],
        }
    }

    fn slot(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.origin).as_nanos();
        u64::try_from(since / self.bucket_nanos).unwrap_or(u64::MAX)
    }

    pub(super) fn record(&mut self, now: Instant, failed: Option<Cause>) {
        let slot = self.slot(now);
        let bucket = &mut self.buckets[(slot % BUCKETS as u64) as usize];
        if bucket.slot < slot {
            *bucket = Bucket {
                slot,
                ..Bucket::default()
            };
        } else if bucket.slot > slot {
            // A report a whole window late: its slice is already reused,
            // and it is too old to count.
            return;
        }
        bucket.calls = bucket.calls.saturating_add(1);
        if let Some(cause) = failed {
            bucket.failures = bucket.failures.saturating_add(1);
            let count = &mut bucket.causes[cause as usize];
            *count = count.saturating_add(1);
        }
    }

    /// The cause of most failures inside the window ending at `now` (the
    /// first of [`Cause::ALL`] on a tie), and how many it caused.
    pub(super) fn main_cause(&self, now: Instant) -> Option<(Cause, u64)> {
        let slot = self.slot(now);
        let mut counts = [0u64; Cause::ALL.len()];
        for b in self
            .buckets
            .iter()
            .filter(|b| b.slot <= slot && slot - b.slot < BUCKETS as u64)
        {
            for (total, n) in counts.iter_mut().zip(b.causes) {
                *total += u64::from(n);
            }
        }
        Cause::ALL
            .into_iter()
            .zip(counts)
            .filter(|&(_, n)| n > 0)
            .fold(None, |best: Option<(Cause, u64)>, (cause, n)| match best {
                Some((_, most)) if most >= n => best,
                _ => Some((cause, n)),
            })
    }

    /// `(calls, failures)` of the buckets inside the window ending at `now`.
    pub(super) fn totals(&self, now: Instant) -> (u64, u64) {
        let slot = self.slot(now);
        self.buckets
            .iter()
            .filter(|b| b.slot <= slot && slot - b.slot < BUCKETS as u64)
            .fold((0, 0), |(calls, failures), b| {
                (calls + u64::from(b.calls), failures + u64::from(b.failures))
            })
    }

    pub(super) fn clear(&mut self) {
        self.buckets = [Bucket::default(); BUCKETS];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(10);
    const BUCKET: Duration = Duration::from_secs(1);

    #[test]
    fn the_main_cause_is_what_most_failures_in_the_window_were() {
        let t = Instant::now();
        let mut w = Window::new(WINDOW, t);
        assert_eq!(w.main_cause(t), None);
        w.record(t, None);
        assert_eq!(w.main_cause(t), None, "a success is no cause");
        for _ in 0..3 {
            w.record(t, Some(Cause::Timeout));
        }
        w.record(t + BUCKET, Some(Cause::Unreachable));
        assert_eq!(w.main_cause(t + BUCKET), Some((Cause::Timeout, 3)));
        for _ in 0..3 {
            w.record(t + BUCKET * 2, Some(Cause::Unreachable));
        }
        assert_eq!(w.main_cause(t + BUCKET * 2), Some((Cause::Unreachable, 4)));
        // The timeouts leave the window with their slice.
        assert_eq!(w.main_cause(t + WINDOW), Some((Cause::Unreachable, 4)));
        w.record(t + WINDOW, Some(Cause::Refused));
        w.record(t + WINDOW, Some(Cause::Refused));
        w.record(t + WINDOW, Some(Cause::Refused));
        w.record(t + WINDOW, Some(Cause::Refused));
        // A tie goes to the first in declaration order.
        assert_eq!(w.main_cause(t + WINDOW), Some((Cause::Unreachable, 4)));
        assert_eq!(
            w.main_cause(t + WINDOW + BUCKET * 2),
            Some((Cause::Refused, 4))
        );
    }
}
