//! How much time this process lost to its own event loop: the time a
//! task ready to run waited for a thread (CPU starvation: a cgroup's
//! `cpu.max` throttling the pod, a busy node, more work than cores).
//!
//! A call to Redis that misses its deadline while sluice was not running
//! says nothing about Redis: its reply may have sat in the socket, unread.
//! So the store gives a call back the time its process lost while it
//! waited ([`Lag::lost_since`]), and blames Redis only for a call that
//! had its whole budget of running time and still got no reply.
//!
//! Measured by a task that sleeps [`TICK`] at a time and records how late
//! it woke: a wake later than [`SLACK`] (timer rounding and an ordinary
//! wake-up) counts whole, as time no thread could run it; one within it
//! counts nothing. One wake every few
//! milliseconds, a lock taken per wake and per timed-out call: nothing on
//! the path of a call that meets its deadline.
//!
//! Only while calls are made: the task rests once no call has been in
//! flight for [`REST_AFTER`], and the next call wakes it ([`Lag::watch`]).
//! An idle sidecar on Redis woke some 170 times a second for nothing,
//! about 0.7% of a core. Time lost while it rests is not measured: a call
//! is given back what its process lost from when the task woke again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::sync;

/// How often the monitor wakes.
pub const TICK: Duration = Duration::from_millis(5);
/// Lateness up to this is not lost time: tokio's timer rounds to the
/// millisecond, and a thread takes a moment to wake.
pub const SLACK: Duration = Duration::from_millis(2);
/// The most a call is given back: a sidecar starved longer than this
/// learns nothing of Redis from a call that missed its deadline (and the
/// client has waited long enough).
pub const GIVEN_BACK: Duration = Duration::from_secs(1);
/// How many wakes are remembered: at least five seconds of them, longer
/// than any budget.
const KEPT: usize = 1024;
/// The monitor rests once no call has been in flight for this long.
pub const REST_AFTER: Duration = Duration::from_secs(1);

pub struct Lag {
    ring: Mutex<Ring>,
    /// Calls under way ([`Lag::watch`]).
    in_flight: AtomicUsize,
    /// The monitor rests: mirrors [`Ring::resting`], read without the lock.
    resting: AtomicBool,
    /// Wakes the resting monitor.
    wake: sync::Rouse,
}

struct Ring {
    /// `(when the monitor woke, lost in all until then)`, oldest first.
    wakes: VecDeque<(Instant, Duration)>,
    /// Lost in all, as of the last wake.
    lost: Duration,
    /// When the monitor last woke (or was woken from its rest).
    last: Instant,
    /// The monitor rests: no wake is due, so none is late.
    resting: bool,
}

/// A call under way, for as long as it is held: the monitor does not rest
/// meanwhile.
pub struct Watch<'a>(&'a Lag);

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Lag {
    pub fn new(now: Instant) -> Lag {
        Lag {
            ring: Mutex::new(Ring {
                wakes: VecDeque::with_capacity(KEPT),
                lost: Duration::ZERO,
                last: now,
                resting: false,
            }),
            in_flight: AtomicUsize::new(0),
            resting: AtomicBool::new(false),
            wake: sync::Rouse::default(),
        }
    }

    /// A call begins: the monitor measures until it ends, woken first if
    /// it rests. Sequentially consistent with [`Lag::rest`]: either the
    /// call sees the monitor resting and wakes it, or the monitor sees the
    /// call and does not rest.
    pub fn watch(&self) -> Watch<'_> {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        if self.resting.load(Ordering::SeqCst) {
            self.wake_up(Instant::now());
        }
        Watch(self)
    }

    /// The monitor is woken from its rest at `now`: it is due a tick later.
    fn wake_up(&self, now: Instant) {
        let mut ring = sync::lock(&self.ring);
        if !ring.resting {
            return;
        }
        ring.resting = false;
        ring.last = now;
        self.resting.store(false, Ordering::SeqCst);
        drop(ring);
        self.wake.rouse();
    }

    /// The monitor would rest, no call being in flight: whether it does
    /// (a call that began meanwhile keeps it up).
    fn rest(&self) -> bool {
        let mut ring = sync::lock(&self.ring);
        ring.resting = true;
        self.resting.store(true, Ordering::SeqCst);
        if self.in_flight.load(Ordering::SeqCst) == 0 {
            return true;
        }
        ring.resting = false;
        self.resting.store(false, Ordering::SeqCst);
        false
    }

    /// The monitor woke at `woke`, having asked to wake at `due`.
    pub fn woke(&self, due: Instant, woke: Instant) {
        let mut ring = sync::lock(&self.ring);
        ring.lost += late(woke.saturating_duration_since(due));
        ring.last = woke;
        if ring.wakes.len() == KEPT {
            ring.wakes.pop_front();
        }
        let lost = ring.lost;
        ring.wakes.push_back((woke, lost));
    }

    /// The time this process lost between `since` and `now`, at most
    /// `now - since`. A stall still going on (the monitor has not woken
    /// since it was due) counts up to `now`; a stall that began before
    /// `since` and ended after it counts whole, so this errs towards
    /// giving a call more time, never less.
    pub fn lost_since(&self, since: Instant, now: Instant) -> Duration {
        let ring = sync::lock(&self.ring);
        if ring.wakes.is_empty() {
            // No monitor (yet): nothing is known to be lost.
            return Duration::ZERO;
        }
        // What was lost by `since`: as of the last wake at or before it
        // (or, when `since` is older than every wake kept, the oldest).
        let before = ring.wakes.partition_point(|&(at, _)| at <= since);
        let by_since = match before {
            0 => ring.wakes.front().map_or(Duration::ZERO, |&(_, lost)| lost),
            n => ring.wakes[n - 1].1,
        };
        let pending = if ring.resting {
            Duration::ZERO
        } else {
            late(now.saturating_duration_since(ring.last + TICK))
        };
        (ring.lost + pending)
            .saturating_sub(by_since)
            .min(now.saturating_duration_since(since))
    }
}

/// Lost time, of a wake `lateness` late.
fn late(lateness: Duration) -> Duration {
    if lateness > SLACK {
        lateness
    } else {
        Duration::ZERO
    }
}

/// Wakes every [`TICK`] and records how late, resting while no call is
/// made, until the store that holds `lag` is dropped.
pub async fn monitor(lag: Weak<Lag>) {
    let Some(wake) = lag.upgrade().map(|lag| lag.wake.listener()) else {
        return;
    };
    let rest_after = REST_AFTER.as_millis() / TICK.as_millis();
    let mut idle_ticks = 0;
    loop {
        let due = Instant::now() + TICK;
        tokio::time::sleep_until(due).await;
        {
            let Some(lag) = lag.upgrade() else {
                return;
            };
            lag.woke(due, Instant::now());
            if lag.in_flight.load(Ordering::SeqCst) > 0 {
                idle_ticks = 0;
                continue;
            }
            idle_ticks += 1;
            if idle_ticks < rest_after || !lag.rest() {
                continue;
            }
        }
        idle_ticks = 0;
        // Not holding the store meanwhile: its drop wakes this too.
        wake.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Wakes on time from `from` for `count` ticks; returns the last.
    fn on_time(lag: &Lag, from: Instant, count: u32) -> Instant {
        let mut at = from;
        for _ in 0..count {
            let due = at + TICK;
            lag.woke(due, due + MS);
            at = due + MS;
        }
        at
    }

    #[test]
    fn without_a_monitor_nothing_is_lost() {
        let t = Instant::now();
        let lag = Lag::new(t);
        assert_eq!(
            lag.lost_since(t, t + Duration::from_secs(5)),
            Duration::ZERO
        );
    }

    #[test]
    fn wakes_on_time_lose_nothing() {
        let t = Instant::now();
        let lag = Lag::new(t);
        let last = on_time(&lag, t, 100);
        assert_eq!(lag.lost_since(t, last), Duration::ZERO);
        assert_eq!(lag.lost_since(t, last + TICK), Duration::ZERO);
    }

    #[test]
    fn a_wake_later_than_the_slack_is_lost_time_whole() {
        let t = Instant::now();
        let lag = Lag::new(t);
        let before = on_time(&lag, t, 10);
        let due = before + TICK;
        let woke = due + 80 * MS;
        lag.woke(due, woke);
        let after = on_time(&lag, woke, 10);
        assert_eq!(lag.lost_since(before, after), 80 * MS);
        assert_eq!(
            lag.lost_since(woke, after),
            Duration::ZERO,
            "the stall ended before"
        );
        assert_eq!(lag.lost_since(t, after), 80 * MS);
    }

    #[test]
    fn a_stall_still_going_on_counts_up_to_now() {
        let t = Instant::now();
        let lag = Lag::new(t);
        let last = on_time(&lag, t, 10);
        let now = last + TICK + 50 * MS;
        assert_eq!(lag.lost_since(last, now), 50 * MS);
        // Never more than the time asked about.
        assert_eq!(lag.lost_since(now - 10 * MS, now), 10 * MS);
    }

    #[test]
    fn wakes_older_than_those_kept_count_from_the_oldest() {
        let t = Instant::now();
        let lag = Lag::new(t);
        let due = t + TICK;
        lag.woke(due, due + 100 * MS);
        let last = on_time(&lag, due + 100 * MS, KEPT as u32);
        // The late wake left the ring: what it lost is no longer told
        // apart from what came before it.
        assert_eq!(lag.lost_since(t, last), Duration::ZERO);
    }

    #[test]
    fn a_resting_monitor_is_not_late() {
        let t = Instant::now();
        let lag = Lag::new(t);
        let last = on_time(&lag, t, 10);
        assert!(lag.rest(), "no call is in flight");
        // A minute without a wake: the monitor was not due.
        let later = last + Duration::from_secs(60);
        assert_eq!(lag.lost_since(last, later), Duration::ZERO);
    }

    #[test]
    fn the_monitor_does_not_rest_while_a_call_is_in_flight() {
        let t = Instant::now();
        let lag = Lag::new(t);
        on_time(&lag, t, 3);
        let watch = lag.watch();
        assert!(!lag.rest());
        assert!(!lag.resting.load(Ordering::SeqCst));
        drop(watch);
        assert!(lag.rest());
    }

    #[test]
    fn a_call_wakes_a_resting_monitor_and_lost_time_counts_from_then() {
        let t = Instant::now();
        let lag = Lag::new(t);
        on_time(&lag, t, 3);
        assert!(lag.rest());
        let _watch = lag.watch();
        assert!(!lag.resting.load(Ordering::SeqCst));
        let woken = sync::lock(&lag.ring).last;
        // The monitor does not come back: from its wake-up on, what it
        // misses past its tick and slack is lost.
        let now = woken + TICK + 50 * MS;
        assert_eq!(lag.lost_since(woken, now), 50 * MS);
        assert_eq!(lag.lost_since(woken, woken + TICK + SLACK), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn the_monitor_rests_without_calls_wakes_for_one_and_ends_with_its_store() {
        let lag = Arc::new(Lag::new(Instant::now()));
        let task = tokio::spawn(monitor(Arc::downgrade(&lag)));
        let wakes = |lag: &Lag| sync::lock(&lag.ring).wakes.len();
        tokio::time::sleep(REST_AFTER / 2).await;
        assert!(!lag.resting.load(Ordering::SeqCst));
        tokio::time::sleep(REST_AFTER).await;
        assert!(lag.resting.load(Ordering::SeqCst), "a second without calls");
        let rested = wakes(&lag);
        tokio::time::sleep(REST_AFTER).await;
        assert_eq!(wakes(&lag), rested, "no wake while resting");
        let watch = lag.watch();
        tokio::time::sleep(10 * TICK).await;
        assert!(wakes(&lag) >= rested + 9, "woken by the call");
        assert!(!lag.resting.load(Ordering::SeqCst));
        // Kept up while the call lasts.
        tokio::time::sleep(3 * REST_AFTER).await;
        assert!(!lag.resting.load(Ordering::SeqCst));
        drop(watch);
        tokio::time::sleep(2 * REST_AFTER).await;
        assert!(lag.resting.load(Ordering::SeqCst));
        drop(lag);
        tokio::time::timeout(Duration::from_secs(1), task)
            .await
            .expect("the monitor ends with its store")
            .expect("it does not panic");
    }
}
