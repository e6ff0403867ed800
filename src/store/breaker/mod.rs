//! A circuit breaker in front of a remote store.
//!
//! While the store keeps failing, every request would otherwise wait out
//! its whole budget before failing anyway. The breaker opens on a failure
//! *rate*, not on a streak: any short stall fails every call in flight at
//! once, so under a flood of distinct subjects a blip of a few milliseconds
//! is a streak of dozens, and opening on it refuses everybody for a whole
//! cool-down over something the store already got over. It opens when,
//! over the last `window`, at least `min_calls` calls got a verdict, at
//! least `min_failures` of them failed, and the failures were at least
//! `failure_rate` percent of them. Open, it refuses requests at once
//! (AdmissionRejected) for `cooldown`; after the cool-down, exactly one
//! request at a time goes through as a probe; its success closes the
//! breaker (with an empty window), its failure opens it for another
//! cool-down.
//!
//! The window is [`BUCKETS`] buckets, each a tenth of it, in a ring: a call
//! adds to the bucket of its instant, the oldest bucket is reused when time
//! moves past it, and the totals are the sum of the buckets still inside
//! the window. Constant work per call and nothing allocated, at the price
//! of precision: the window is `window` long to within one bucket.
//!
//! Time is an input: every method takes `now`, so the logic is tested
//! without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::sync;
use tokio::time::Instant;

mod window;
use window::Window;
pub use window::BUCKETS;

/// When the breaker opens and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// How far back calls count.
    pub window: Duration,
    /// Fewer calls than this in the window never open it: a handful of
    /// requests says little about the store.
    pub min_calls: u32,
    /// Fewer failures than this in the window never open it.
    pub min_failures: u32,
    /// The share of the window's calls that failed, in percent, from which
    /// it opens (1 to 100).
    pub failure_rate: u8,
    pub cooldown: Duration,
}

pub struct Breaker {
    thresholds: Thresholds,
    guarded: Mutex<Guarded>,
    opened: AtomicU64,
}

struct Guarded {
    state: State,
    window: Window,
    /// When the breaker last opened from closed: the outage's start, for
    /// the line that says the store answers again.
    outage_since: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Closed,
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
    Failed(Cause),
    /// Nothing was learned (the request gave up before reaching the store).
    Unknown,
}

/// Why a call failed, as `sluice_store_errors_total` names its kind: the
/// line that says the breaker opened names the cause of most of the
/// window's failures, so the operator knows where to look first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// No connection (refused, DNS, TLS, authentication).
    Unreachable,
    /// Sent, and no reply within the budget.
    Timeout,
    /// Sent, and the connection broke before the reply.
    ConnectionLost,
    /// The store refused the command before running it (read-only replica,
    /// cluster down, busy script, ...). Not `OOM`: a Redis at `maxmemory`
    /// refusing a write answered, and the subject it concerned gets the
    /// failure answer for that request alone (`call`).
    Refused,
}

impl Cause {
    const ALL: [Cause; 4] = [
        Cause::Unreachable,
        Cause::Timeout,
        Cause::ConnectionLost,
        Cause::Refused,
    ];

    /// The `kind` label of `sluice_store_errors_total` counting it.
    pub fn kind(self) -> &'static str {
        match self {
            Cause::Unreachable => "unreachable",
            Cause::Timeout => "timeouts",
            Cause::ConnectionLost => "connection_lost",
            Cause::Refused => "refused",
        }
    }
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
    pub fn new(thresholds: Thresholds) -> Breaker {
        Breaker {
            thresholds,
            guarded: Mutex::new(Guarded {
                state: State::Closed,
                window: Window::new(thresholds.window, Instant::now()),
                outage_since: None,
            }),
            opened: AtomicU64::new(0),
        }
    }

    /// A permit to ask the store, or `None` while the breaker is open (or
    /// its single probe is still out).
    pub fn try_acquire(&self, now: Instant) -> Option<Permit<'_>> {
        let mut guarded = self.lock();
        let probe = match guarded.state {
            State::Closed => false,
            State::Open { until } if now >= until => {
                guarded.state = State::Probing;
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
        match self.lock().state {
            State::Closed => true,
            State::Open { until } => now >= until,
            State::Probing => false,
        }
    }

    /// True only while the breaker is closed: the last decisions reached
    /// the store. Readiness follows this, not [`Breaker::admits`]: a
    /// breaker waiting for its probe, or probing, has not seen the store
    /// decide again.
    pub fn closed(&self) -> bool {
        self.lock().state == State::Closed
    }

    /// True when the cool-down is over and nobody has taken the probe yet.
    pub fn wants_probe(&self, now: Instant) -> bool {
        matches!(self.lock().state, State::Open { until } if now >= until)
    }

    /// How many times the breaker has opened (for metrics).
    pub fn opened_total(&self) -> u64 {
        self.opened.load(Ordering::Relaxed)
    }

    fn settle(&self, probe: bool, health: Health, now: Instant) {
        let mut guarded = self.lock();
        let guarded = &mut *guarded;
        match (guarded.state, probe, health) {
            (_, true, Health::Unknown) => guarded.state = State::Open { until: now },
            (_, false, Health::Unknown) => {}
            (State::Probing, true, Health::Answered) => {
                // What the window held led to the opening; counting it
                // again would reopen on the first failure after recovery.
                guarded.window.clear();
                guarded.state = State::Closed;
                // One line per outage, whatever the traffic: the operator
                // reads when it ended and how long it lasted.
                if let Some(since) = guarded.outage_since.take() {
                    tracing::info!(
                        outage_seconds = now.saturating_duration_since(since).as_secs_f64(),
                        "store: answering again; the breaker is closed"
                    );
                }
            }
            (State::Probing, true, Health::Failed(_)) => guarded.state = self.open(now),
            (State::Closed, false, Health::Answered) => guarded.window.record(now, None),
            (State::Closed, false, Health::Failed(cause)) => {
                guarded.window.record(now, Some(cause));
                let (calls, failures) = guarded.window.totals(now);
                if self.trips(calls, failures) {
                    guarded.state = self.open(now);
                    guarded.outage_since = Some(now);
                    // Once per opening from closed (a failed probe reopens
                    // silently): never a line per request.
                    let (cause, of_failures) = guarded.window.main_cause(now).unwrap_or((cause, 1));
                    tracing::warn!(
                        cause = cause.kind(),
                        of_failures,
                        calls,
                        failures,
                        window_seconds = self.thresholds.window.as_secs_f64(),
                        cooldown_seconds = self.thresholds.cooldown.as_secs_f64(),
                        "store: stopped answering; the breaker is open and requests get the on_failure answer at once (cause: what most of the window's failures were; all of them: sluice_store_errors_total by kind)"
                    );
                }
            }
            // Requests admitted before the breaker opened report late; the
            // probe alone decides when it closes again.
            _ => {}
        }
    }

    fn trips(&self, calls: u64, failures: u64) -> bool {
        let t = &self.thresholds;
        calls >= u64::from(t.min_calls)
            && failures >= u64::from(t.min_failures)
            && failures * 100 >= u64::from(t.failure_rate) * calls
    }

    fn open(&self, now: Instant) -> State {
        self.opened.fetch_add(1, Ordering::Relaxed);
        State::Open {
            until: now + self.thresholds.cooldown,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Guarded> {
        // Each field is written whole under the lock; a panic elsewhere
        // while holding it cannot leave either half-updated.
        sync::lock(&self.guarded)
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
    const WINDOW: Duration = Duration::from_secs(10);
    const BUCKET: Duration = Duration::from_secs(1);

    fn breaker(min_calls: u32, min_failures: u32, failure_rate: u8) -> Breaker {
        Breaker::new(Thresholds {
            window: WINDOW,
            min_calls,
            min_failures,
            failure_rate,
            cooldown: COOLDOWN,
        })
    }

    /// Opens on the first failure: for the tests of what follows opening.
    fn hair_trigger() -> Breaker {
        breaker(1, 1, 100)
    }

    fn fail(b: &Breaker, now: Instant) {
        b.try_acquire(now)
            .expect("admitted")
            .report(Health::Failed(Cause::Unreachable), now);
    }

    fn answer(b: &Breaker, now: Instant) {
        b.try_acquire(now)
            .expect("admitted")
            .report(Health::Answered, now);
    }

    #[test]
    fn a_streak_amid_many_answers_does_not_open() {
        // The defaults, and the shape that used to open the breaker: a
        // stall failing every call in flight at once, amid thousands of
        // answers.
        let b = breaker(10, 5, 50);
        let t = Instant::now();
        for i in 0..3000 {
            answer(&b, t + Duration::from_millis(i));
        }
        let stall = t + Duration::from_secs(3);
        for _ in 0..200 {
            fail(&b, stall);
        }
        assert!(b.closed());
        assert_eq!(b.opened_total(), 0);
    }

    #[test]
    fn a_rate_below_the_threshold_never_opens() {
        let b = breaker(20, 5, 50);
        let t = Instant::now();
        // 49 failures in every 100 calls, spread evenly, for ten windows:
        // 49% of any run of calls from the first, and under 50% of any
        // run longer than 100 (a window holds about 1,000).
        for i in 0..10_000u64 {
            let now = t + Duration::from_millis(10 * i);
            if 49 * (i + 1) / 100 > 49 * i / 100 {
                fail(&b, now);
            } else {
                answer(&b, now);
            }
        }
        assert!(b.closed());
        assert_eq!(b.opened_total(), 0);
    }

    #[test]
    fn opens_once_the_rate_is_reached() {
        let b = breaker(20, 5, 50);
        let t = Instant::now();
        for _ in 0..10 {
            answer(&b, t);
        }
        for _ in 0..9 {
            fail(&b, t);
        }
        assert!(b.closed(), "9 of 19 calls");
        fail(&b, t);
        assert!(!b.closed(), "10 of 20 calls is 50%");
        assert!(b.try_acquire(t).is_none());
        assert!(!b.admits(t));
        assert_eq!(b.opened_total(), 1);
    }

    #[test]
    fn fewer_calls_than_the_minimum_never_open() {
        let b = breaker(20, 5, 50);
        let t = Instant::now();
        for _ in 0..19 {
            fail(&b, t);
        }
        assert!(b.closed(), "19 calls, all failed");
        fail(&b, t);
        assert!(!b.closed(), "the 20th");
    }

    #[test]
    fn fewer_failures_than_the_minimum_never_open() {
        let b = breaker(1, 5, 50);
        let t = Instant::now();
        for _ in 0..4 {
            fail(&b, t);
        }
        assert!(b.closed(), "4 failures, every call failed");
        fail(&b, t);
        assert!(!b.closed(), "the 5th");
    }

    #[test]
    fn failures_age_out_of_the_window() {
        let t = Instant::now();
        // Still inside: the 20th failure, just under a window later, opens.
        let b = breaker(20, 5, 50);
        for _ in 0..19 {
            fail(&b, t);
        }
        fail(&b, t + WINDOW - BUCKET - Duration::from_millis(1));
        assert!(!b.closed(), "failures a little less than a window old");

        // A window and a bucket later the first 19 no longer count.
        let b = breaker(20, 5, 50);
        for _ in 0..19 {
            fail(&b, t);
        }
        let later = t + WINDOW + BUCKET;
        fail(&b, later);
        assert!(b.closed(), "failures older than the window counted");
        for _ in 0..18 {
            fail(&b, later);
        }
        assert!(b.closed(), "19 calls in this window");
        fail(&b, later);
        assert!(!b.closed());
    }

    #[test]
    fn answers_age_out_too() {
        // A store that answered a lot, then fails every call: once the
        // answers leave the window, the failures alone open it.
        let b = breaker(20, 5, 50);
        let t = Instant::now();
        for _ in 0..1000 {
            answer(&b, t);
        }
        let mut now = t;
        while b.closed() {
            now += Duration::from_millis(100);
            assert!(now < t + WINDOW + 2 * BUCKET, "never opened");
            fail(&b, now);
        }
        assert!(now > t + WINDOW - BUCKET, "opened at {:?}", now - t);
    }

    #[test]
    fn a_late_report_from_a_whole_window_ago_is_dropped() {
        let b = breaker(20, 5, 50);
        let t = Instant::now();
        let later = t + WINDOW;
        for _ in 0..19 {
            fail(&b, later);
        }
        // Same bucket of the ring, a window earlier.
        b.try_acquire(t)
            .unwrap()
            .report(Health::Failed(Cause::Unreachable), t);
        assert!(b.closed(), "a report older than the window counted");
        fail(&b, later);
        assert!(!b.closed(), "the old report wiped the current bucket");
    }

    #[test]
    fn unknown_outcomes_neither_count_nor_reset() {
        let b = breaker(3, 3, 100);
        let t = Instant::now();
        fail(&b, t);
        fail(&b, t);
        b.try_acquire(t).unwrap().report(Health::Unknown, t);
        drop(b.try_acquire(t).unwrap());
        assert!(b.closed(), "an unknown outcome counted as a call");
        fail(&b, t);
        assert!(b.try_acquire(t).is_none());
    }

    #[test]
    fn one_probe_at_a_time_after_the_cooldown() {
        let b = hair_trigger();
        let t = Instant::now();
        fail(&b, t);
        assert!(b
            .try_acquire(t + COOLDOWN - Duration::from_millis(1))
            .is_none());
        let later = t + COOLDOWN;
        assert!(b.admits(later));
        assert!(b.wants_probe(later));
        assert!(!b.closed(), "waiting for its probe");
        let probe = b.try_acquire(later).expect("probe");
        assert!(probe.is_probe());
        assert!(b.try_acquire(later).is_none(), "a second probe");
        assert!(!b.admits(later));
        assert!(!b.wants_probe(later));
        probe.report(Health::Answered, later);
        assert!(b.closed());
        let next = b.try_acquire(later).expect("closed");
        assert!(!next.is_probe());
    }

    #[test]
    fn closing_starts_an_empty_window() {
        let b = breaker(20, 5, 50);
        let t = Instant::now();
        for _ in 0..20 {
            fail(&b, t);
        }
        assert!(!b.closed());
        let probe_at = t + COOLDOWN;
        b.try_acquire(probe_at)
            .unwrap()
            .report(Health::Answered, probe_at);
        assert!(b.closed());
        // Within the same window as the 20 failures, which no longer count.
        for _ in 0..19 {
            fail(&b, probe_at);
        }
        assert!(b.closed(), "the failures before the opening counted again");
        assert_eq!(b.opened_total(), 1);
    }

    #[test]
    fn a_failed_probe_opens_for_another_cooldown() {
        let b = hair_trigger();
        let t = Instant::now();
        fail(&b, t);
        let probe_at = t + COOLDOWN;
        b.try_acquire(probe_at)
            .unwrap()
            .report(Health::Failed(Cause::Unreachable), probe_at);
        assert_eq!(b.opened_total(), 2);
        assert!(b.try_acquire(probe_at + COOLDOWN / 2).is_none());
        assert!(b.try_acquire(probe_at + COOLDOWN).is_some());
    }

    #[test]
    fn an_abandoned_probe_lets_the_next_request_probe() {
        let b = hair_trigger();
        let t = Instant::now();
        fail(&b, t);
        let probe = b.try_acquire(t + COOLDOWN).unwrap();
        drop(probe);
        let next = b.try_acquire(t + COOLDOWN).expect("another probe");
        assert!(next.is_probe());
    }

    #[test]
    fn late_reports_do_not_close_or_reopen() {
        let b = hair_trigger();
        let t = Instant::now();
        let early = b.try_acquire(t).unwrap();
        let also_early = b.try_acquire(t).unwrap();
        fail(&b, t);
        early.report(Health::Answered, t);
        assert!(b.try_acquire(t).is_none(), "a late success closed it");
        also_early.report(Health::Failed(Cause::Unreachable), t);
        assert_eq!(b.opened_total(), 1, "a late failure opened it again");
    }
}
