//! The breaker's rules: when it opens, when it closes, what it reports.

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
fn leaving_closed_wakes_the_resting_prober_and_a_dropped_breaker_too() {
    let b = breaker(10, 5, 50);
    let wake = b.left_closed();
    let t = Instant::now();
    for _ in 0..20 {
        answer(&b, t);
    }
    assert!(!sync::notified(&wake), "closed all along");
    for _ in 0..20 {
        fail(&b, t);
    }
    assert!(!b.closed());
    assert!(sync::notified(&wake), "opened");
    drop(b);
    assert!(sync::notified(&wake), "dropped");
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
