//! A circuit breaker in front of a remote store.
//!
//! While the store keeps failing, every request would otherwise wait out
//! its whole budget before failing anyway. After `threshold` consecutive
//! failures the breaker opens for `cooldown`: requests are refused at once
//! (AdmissionRejected). After the cool-down, exactly one request at a time
//! goes through as a probe; its success closes the breaker, its failure
//! opens it for another cool-down.
//!
//! Time is an input: every method takes `now`, so the logic is tested
//! without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

pub struct Breaker {
    /// 0 disables the breaker: it never opens.
    threshold: u32,
    cooldown: Duration,
    state: Mutex<State>,
    opened: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed {
        failures: u32,
    },
    /// Refusing until `until`; after it, the next request becomes the probe.
    Open {
        until: Instant,
    },
    /// One probe is in flight; everyone else is refused until it reports.
    Probing,
}

/// What a request learned about the store, reported through its [`Permit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// The store answered (whatever the answer).
    Answered,
    /// The store could not be reached or did not answer in time.
    Failed,
    /// Nothing was learned (the request gave up before reaching the store).
    Unknown,
}

/// Leave to ask the store once. Report what happened with
/// [`Permit::report`]; a permit dropped unreported counts as
/// [`Health::Unknown`], so a cancelled probe never wedges the breaker.
pub struct Permit<'a> {
    breaker: &'a Breaker,
    probe: bool,
    reported: bool,
}

impl Breaker {
    pub fn new(threshold: u32, cooldown: Duration) -> Breaker {
        Breaker {
            threshold,
            cooldown,
            state: Mutex::new(State::Closed { failures: 0 }),
            opened: AtomicU64::new(0),
        }
    }

    /// A permit to ask the store, or `None` while the breaker is open (or
    /// its single probe is still out).
    pub fn try_acquire(&self, now: Instant) -> Option<Permit<'_>> {
        let mut state = self.lock();
        let probe = match *state {
            State::Closed { .. } => false,
            State::Open { until } if now >= until => {
                *state = State::Probing;
                true
            }
            State::Open { .. } | State::Probing => return None,
        };
        Some(Permit {
            breaker: self,
            probe,
            reported: false,
        })
    }

    /// False while requests are being refused: open and still cooling down,
    /// or a probe is out. True once the cool-down is over, so that traffic
    /// can bring the probe that closes it.
    pub fn admits(&self, now: Instant) -> bool {
        match *self.lock() {
            State::Closed { .. } => true,
            State::Open { until } => now >= until,
            State::Probing => false,
        }
    }

    /// True only while the breaker is closed: the last decisions reached
    /// the store. Readiness follows this, not [`Breaker::admits`]: a
    /// breaker waiting for its probe, or probing, has not seen the store
    /// decide again.
    pub fn closed(&self) -> bool {
        matches!(*self.lock(), State::Closed { .. })
    }

    /// True when the cool-down is over and nobody has taken the probe yet.
    pub fn wants_probe(&self, now: Instant) -> bool {
        matches!(*self.lock(), State::Open { until } if now >= until)
    }

    /// How many times the breaker has opened (for metrics).
    pub fn opened_total(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    fn settle(&self, probe: bool, health: Health, now: Instant) {
        let mut state = self.lock();
        let next = match (*state, probe, health) {
            (_, _, Health::Unknown) if probe => Some(State::Open { until: now }),
            (_, _, Health::Unknown) => None,
            (State::Probing, true, Health::Answered) => Some(State::Closed { failures: 0 }),
            (State::Probing, true, Health::Failed) => Some(self.open(now)),
            (State::Closed { .. }, false, Health::Answered) => Some(State::Closed { failures: 0 }),
            (State::Closed { failures }, false, Health::Failed) => {
                let failures = failures.saturating_add(1);
                if self.threshold > 0 && failures >= self.threshold {
                    Some(self.open(now))
                } else {
                    Some(State::Closed { failures })
                }
            }
            // Requests admitted before the breaker opened report late; the
            // probe alone decides when it closes again.
            _ => None,
        };
        if let Some(next) = next {
            *state = next;
        }
    }

    fn open(&self, now: Instant) -> State {
        self.opened.fetch_add(1, Ordering::Relaxed);
        State::Open {
            until: now + self.cooldown,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a plain value written whole; a panic elsewhere while
        // holding the lock cannot leave it half-updated.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Permit<'_> {
    pub fn is_probe(&self) -> bool {
        self.probe
    }

    pub fn report(mut self, health: Health, now: Instant) {
        self.reported = true;
        self.breaker.settle(self.probe, health, now);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.reported {
            self.breaker
                .settle(self.probe, Health::Unknown, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COOLDOWN: Duration = Duration::from_secs(2);

    fn fail(b: &Breaker, now: Instant) {
        b.try_acquire(now)
            .expect("admitted")
            .report(Health::Failed, now);
    }

    #[test]
    fn opens_after_consecutive_failures_only() {
        let b = Breaker::new(3, COOLDOWN);
        let t = Instant::now();
        fail(&b, t);
        fail(&b, t);
        // A success in between resets the count.
        b.try_acquire(t).unwrap().report(Health::Answered, t);
        fail(&b, t);
        fail(&b, t);
        assert!(b.try_acquire(t).is_some());
        assert_eq!(b.opened_total(), 0);
        fail(&b, t);
        assert!(b.try_acquire(t).is_none());
        assert!(!b.admits(t));
        assert_eq!(b.opened_total(), 1);
    }

    #[test]
    fn unknown_outcomes_neither_count_nor_reset() {
        let b = Breaker::new(2, COOLDOWN);
        let t = Instant::now();
        fail(&b, t);
        b.try_acquire(t).unwrap().report(Health::Unknown, t);
        drop(b.try_acquire(t).unwrap());
        fail(&b, t);
        assert!(b.try_acquire(t).is_none());
    }

    #[test]
    fn one_probe_at_a_time_after_the_cooldown() {
        let b = Breaker::new(1, COOLDOWN);
        let t = Instant::now();
        fail(&b, t);
        assert!(b
            .try_acquire(t + COOLDOWN - Duration::from_millis(1))
            .is_none());
        let later = t + COOLDOWN;
        assert!(b.admits(later));
        let probe = b.try_acquire(later).expect("probe");
        assert!(probe.is_probe());
        assert!(b.try_acquire(later).is_none(), "a second probe");
        assert!(!b.admits(later));
        probe.report(Health::Answered, later);
        let next = b.try_acquire(later).expect("closed");
        assert!(!next.is_probe());
    }

    #[test]
    fn a_failed_probe_opens_for_another_cooldown() {
        let b = Breaker::new(1, COOLDOWN);
        let t = Instant::now();
        fail(&b, t);
        let probe_at = t + COOLDOWN;
        b.try_acquire(probe_at)
            .unwrap()
            .report(Health::Failed, probe_at);
        assert_eq!(b.opened_total(), 2);
        assert!(b.try_acquire(probe_at + COOLDOWN / 2).is_none());
        assert!(b.try_acquire(probe_at + COOLDOWN).is_some());
    }

    #[test]
    fn an_abandoned_probe_lets_the_next_request_probe() {
        let b = Breaker::new(1, COOLDOWN);
        let t = Instant::now();
        fail(&b, t);
        let probe = b.try_acquire(t + COOLDOWN).unwrap();
        drop(probe);
        let next = b.try_acquire(t + COOLDOWN).expect("another probe");
        assert!(next.is_probe());
    }

    #[test]
    fn late_reports_do_not_close_or_reopen() {
        let b = Breaker::new(1, COOLDOWN);
        let t = Instant::now();
        let early = b.try_acquire(t).unwrap();
        fail(&b, t);
        early.report(Health::Answered, t);
        assert!(b.try_acquire(t).is_none(), "a late success closed it");
        assert_eq!(b.opened_total(), 1);
    }

    #[test]
    fn threshold_zero_never_opens() {
        let b = Breaker::new(0, COOLDOWN);
        let t = Instant::now();
        for _ in 0..100 {
            fail(&b, t);
        }
        assert!(b.try_acquire(t).is_some());
    }
}
