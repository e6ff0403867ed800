//! How many decisions a route may log: a flood of denials must not flood
//! the logs. Its own module because it is not a metric: it sits beside a
//! route's metric handles, and answers whether to log, not what to count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use tokio::time::Instant;

/// A per-second allowance packed in one atomic: high 32 bits the second,
/// low 32 bits how many were taken in it.
#[derive(Debug, Default)]
pub struct LogBudget(AtomicU64);

impl LogBudget {
    pub const PER_SECOND: u64 = 5;

    /// Whether one more line may be logged at `now`. The caller's clock
    /// reading is reused: under a flood this is asked for every request.
    pub fn take(&self, now: Instant) -> bool {
        // Seconds since the first call in this process: any fixed origin
        // will do, the budget only needs to know when a second turns.
        static ORIGIN: OnceLock<Instant> = OnceLock::new();
        let origin = *ORIGIN.get_or_init(|| now);
        let second = now.saturating_duration_since(origin).as_secs() & 0xffff_ffff;
        let mut current = self.0.load(Ordering::Relaxed);
        loop {
            let (at, taken) = (current >> 32, current & 0xffff_ffff);
            let next = if at == second {
                if taken >= Self::PER_SECOND {
                    return false;
                }
                current + 1
            } else {
                (second << 32) | 1
            };
            match self
                .0
                .compare_exchange_weak(current, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_a_few_per_second() {
        let budget = LogBudget::default();
        let start = Instant::now();
        let taken = (0..100).filter(|_| budget.take(start)).count() as u64;
        assert_eq!(taken, LogBudget::PER_SECOND);
        // The next second brings a fresh allowance.
        let next = start + std::time::Duration::from_secs(1);
        let taken = (0..100).filter(|_| budget.take(next)).count() as u64;
        assert_eq!(taken, LogBudget::PER_SECOND);
    }
}
