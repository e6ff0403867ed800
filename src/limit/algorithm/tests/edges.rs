//! Edges every algorithm shares: idleness, clocks going back, costs and
//! instants far outside what validation lets through, foreign states.

use super::*;
use crate::limit::Decision;

/// One single-band policy per algorithm, all windows dividing a second so
/// `T0` is aligned to each.
fn one_band_each() -> Vec<Bands> {
    vec![
        Bands::FixedWindow(vec![window(3, SEC)]),
        Bands::SlidingCounter(vec![window(1000, SEC)]),
        Bands::SlidingLog(vec![window(3, SEC)]),
        Bands::TokenBucket(vec![bucket(5, 2, SEC)]),
        Bands::Gcra(vec![gcra(10, SEC, 3)]),
    ]
}

fn decide(bands: &Bands, state: &State, now: Micros, cost: u32) -> Decision {
    evaluate(bands, &mut state.clone(), now, cost)
}

#[test]
fn the_horizon_is_the_first_instant_idleness_forgets_everything() {
    for bands in one_band_each() {
        let name = bands.algorithm().name();
        let full = bands.max_cost();
        let horizon = micros(bands.horizon());
        let mut state = State::new(&bands);
        assert!(evaluate(&bands, &mut state, T0, full).allowed, "{name}");

        // One microsecond short, the state still weighs: a whole quota is
        // refused where a fresh subject would get it.
        let early = decide(&bands, &state, T0 + horizon - 1, full);
        assert!(!early.allowed, "{name}: horizon - 1 must still count");

        // From the horizon on, the old state and a fresh one agree on every
        // decision of the same sequence.
        let mut fresh = State::new(&bands);
        let mut now = T0 + horizon;
        for step in 0..40u64 {
            let cost = 1 + (step % u64::from(full)) as u32;
            let old = evaluate(&bands, &mut state, now, cost);
            let new = evaluate(&bands, &mut fresh, now, cost);
            assert_eq!(old, new, "{name}: step {step} after the horizon");
            now += (step * 37_337) % 300_000;
        }
    }
}

#[test]
fn a_clock_going_back_admits_nothing_extra() {
    for bands in one_band_each() {
        let name = bands.algorithm().name();
        let full = bands.max_cost();
        let at = T0 + 5 * SEC + 123_457;

        // Exhausted at `at`: nothing earlier may pass, nor change the state.
        let mut state = State::new(&bands);
        assert!(evaluate(&bands, &mut state, at, full).allowed, "{name}");
        let at_now = decide(&bands, &state, at, 1);
        for back in [1, 999, 500_000, SEC, 10 * SEC, at] {
            let before = state.clone();
            let d = evaluate(&bands, &mut state, at - back, 1);
            assert!(!d.allowed, "{name}: {back} µs back");
            assert_eq!(state, before, "{name}: {back} µs back");
            // Still the same instant to retry at, in the caller's clock.
            assert_eq!(
                at - back + micros(d.retry_after),
                at + micros(at_now.retry_after),
                "{name}: {back} µs back"
            );
        }

        // Half used at `at`: requests from earlier instants get at most the
        // other half.
        let mut state = State::new(&bands);
        let first = evaluate(&bands, &mut state, at, 1);
        assert!(first.allowed, "{name}");
        let admitted: u64 = (1..=10 * u64::from(full))
            .map(|i| evaluate(&bands, &mut state, at - i * 77_777, 1).allowed as u64)
            .sum();
        assert!(
            admitted <= first.remaining,
            "{name}: {admitted} admitted from the past, {} were left",
            first.remaining
        );
    }
}

#[test]
fn extreme_inputs_never_panic_nor_admit_above_the_limit() {
    for bands in one_band_each() {
        let name = bands.algorithm().name();
        for now in [0, 1, T0, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            let mut state = State::new(&bands);
            let d = evaluate(&bands, &mut state, now, u32::MAX);
            assert!(!d.allowed, "{name}: cost u32::MAX at {now}");
            evaluate(&bands, &mut state, now, 1);
            evaluate(&bands, &mut state, now, 0);
            evaluate(&bands, &mut state, 0, 1);
        }
    }
}

#[test]
fn a_state_of_other_bands_reads_as_a_subject_never_seen() {
    let all = one_band_each();
    for bands in &all {
        let name = bands.algorithm().name();
        let want = decide(bands, &State::new(bands), T0, 1);
        for other in all.iter().filter(|o| o.algorithm() != bands.algorithm()) {
            let mut foreign = State::new(other);
            evaluate(other, &mut foreign, T0, other.max_cost());
            assert_eq!(decide(bands, &foreign, T0, 1), want, "{name}");
        }
        // Same algorithm, another number of bands.
        let two = match bands {
            Bands::FixedWindow(b) => Bands::FixedWindow([b.clone(), b.clone()].concat()),
            Bands::SlidingCounter(b) => Bands::SlidingCounter([b.clone(), b.clone()].concat()),
            Bands::SlidingLog(b) => Bands::SlidingLog([b.clone(), b.clone()].concat()),
            Bands::TokenBucket(b) => Bands::TokenBucket([b.clone(), b.clone()].concat()),
            Bands::Gcra(b) => Bands::Gcra([b.clone(), b.clone()].concat()),
        };
        let mut used = State::new(&two);
        evaluate(&two, &mut used, T0, two.max_cost());
        if bands.algorithm() != Algorithm::SlidingLog {
            // The sliding log's one log serves any number of bands: it is
            // not foreign, and rightly still counts.
            assert_eq!(decide(bands, &used, T0, 1), want, "{name}: band count");
        }
    }
}
