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

use std::collections::VecDeque;
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

pub struct Lag {
    ring: Mutex<Ring>,
}

struct Ring {
    /// `(when the monitor woke, lost in all until then)`, oldest first.
    wakes: VecDeque<(Instant, Duration)>,
    /// Lost in all, as of the last wake.
    lost: Duration,
    /// When the monitor last woke.
    last: Instant,
}

impl Lag {
    pub fn new(now: Instant) -> Lag {
        Lag {
            ring: Mutex::new(Ring {
                wakes: VecDeque::with_capacity(KEPT),
                lost: Duration::ZERO,
                last: now,
            }),
        }
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
        let pending = late(now.saturating_duration_since(ring.last + TICK));
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

/// Wakes every [`TICK`] and records how late, until the store that holds
/// `lag` is dropped.
pub async fn monitor(lag: Weak<Lag>) {
    loop {
        let due = Instant::now() + TICK;
        tokio::time::sleep_until(due).await;
        let Some(lag) = lag.upgrade() else {
            return;
        };
        lag.woke(due, Instant::now());
    }
}

#[cfg(test)]
mod tests {
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
}
