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
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::sync;
use tokio::sync::Notify;
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
    /// Told when the breaker leaves `Closed`: the task that sends the
    /// probe rests while it is closed.
    left_closed: sync::Rouse,
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
            left_closed: sync::Rouse::default(),
        }
    }

    /// What wakes a task resting while the breaker is closed.
    pub fn left_closed(&self) -> Arc<Notify> {
        self.left_closed.listener()
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
        let was_closed = guarded.state == State::Closed;
        self.settle_locked(guarded, probe, health, now);
        if was_closed && guarded.state != State::Closed {
            self.left_closed.rouse();
        }
    }

    fn settle_locked(&self, guarded: &mut Guarded, probe: bool, health: Health, now: Instant) {
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
mod tests;
