//! Properties every algorithm holds, over many seeded pseudo-random
//! sequences of (now, cost) against random bands. The generator is a
//! SplitMix64, so a failing seed replays exactly.

use std::time::Duration;

use super::*;
use crate::limit::algorithm::{bind, BandVerdict};
use crate::limit::Decision;

const SEQUENCES: u64 = 250;
const STEPS: usize = 60;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    /// Uniform in `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    fn small(&mut self, hi: u64) -> u32 {
        u32::try_from(self.between(1, hi)).unwrap_or(1)
    }

    /// Whole milliseconds from 1 ms to 2 s.
    fn span(&mut self) -> Micros {
        MS * self.between(1, 20) * [1, 10, 100][self.below(3) as usize]
    }
}

fn random_bands(rng: &mut Rng, algorithm: Algorithm) -> Bands {
    let n = rng.between(1, 3);
    let windows = |rng: &mut Rng, hi| (0..n).map(|_| window(rng.small(hi), rng.span())).collect();
    match algorithm {
        Algorithm::FixedWindow => Bands::FixedWindow(windows(rng, 6)),
        // Larger limits so the previous window's weighting shows.
        Algorithm::SlidingCounter => Bands::SlidingCounter(windows(rng, 40)),
        Algorithm::SlidingLog => Bands::SlidingLog(windows(rng, 6)),
        Algorithm::TokenBucket => Bands::TokenBucket(
            (0..n)
                .map(|_| bucket(rng.small(6), rng.small(7), rng.span()))
                .collect(),
        ),
        Algorithm::Gcra => Bands::Gcra(
            (0..n)
                .map(|_| gcra(rng.small(10), rng.span(), rng.small(6)))
                .collect(),
        ),
    }
}

/// The next instant: often the same microsecond, mostly forward at several
/// scales, sometimes a clock stepping back.
fn next_now(rng: &mut Rng, now: Micros, scale: Micros, backwards: bool) -> Micros {
    match rng.below(20) {
        0..=5 => now,
        6..=11 => now + rng.below(MS),
        12..=17 => now + rng.below(scale),
        18 => now + rng.below(4 * scale),
        _ if backwards => now - rng.below(scale / 2 + 1),
        _ => now + rng.below(scale),
    }
}

fn next_cost(rng: &mut Rng, max_cost: u32) -> u32 {
    if rng.below(3) == 0 {
        rng.small(u64::from(max_cost))
    } else {
        1
    }
}

fn decide(bands: &Bands, state: &State, now: Micros, cost: u32) -> Decision {
    evaluate(bands, &mut state.clone(), now, cost)
}

/// Runs the random sequences of one algorithm, checking at every step:
/// - a denial writes nothing, and its retry_after is exact: the same
///   request passes at `now + retry_after` and not one microsecond earlier;
/// - `remaining` is exact at the same instant (whenever it is the whole
///   request's: when allowed, or with a single band);
/// - with a single band, the whole quota is back at `now + reset_after`,
///   and (exact algorithms) not one microsecond earlier;
/// - after `horizon` of idleness since the last admitted write, the state
///   decides every later request exactly like a fresh one.
fn check_properties(algorithm: Algorithm) {
    for seed in 0..SEQUENCES {
        let mut rng = Rng(seed << 8 | algorithm as u64);
        let bands = random_bands(&mut rng, algorithm);
        let max_cost = bands.max_cost();
        let horizon = micros(bands.horizon());
        let backwards = seed % 2 == 1;

        let mut state = State::new(&bands);
        let mut now = T0 + rng.below(10 * SEC);
        // The store's clock: admitted writes are stamped at most this.
        let mut latest = now;
        let mut written_at = None;
        for step in 0..STEPS {
            now = next_now(&mut rng, now, horizon, backwards);
            latest = latest.max(now);
            let cost = next_cost(&mut rng, max_cost);
            let at = format!(
                "{} seed {seed} step {step} (T0 + {} µs, cost {cost}) {bands:?}",
                algorithm.name(),
                i128::from(now) - i128::from(T0),
            );

            let before = state.clone();
            let d = evaluate(&bands, &mut state, now, cost);
            assert!(d.band < bands.len(), "{at}");
            assert_eq!(d.approximate, !algorithm.is_exact(), "{at}");
            if d.allowed {
                written_at = Some(latest);
                assert_eq!(d.retry_after, Duration::ZERO, "{at}");
            } else {
                assert_eq!(state, before, "{at}: a denial wrote");
                let r = micros(d.retry_after);
                assert!(r > 0, "{at}: denied with no wait");
                assert!(
                    !decide(&bands, &before, now + r - 1, cost).allowed,
                    "{at}: passes before retry_after {r}"
                );
                assert!(
                    decide(&bands, &before, now + r, cost).allowed,
                    "{at}: still denied at retry_after {r}"
                );
            }

            if d.allowed || bands.len() == 1 {
                let left = u32::try_from(d.remaining).unwrap_or(u32::MAX);
                if left > 0 {
                    assert!(
                        decide(&bands, &state, now, left).allowed,
                        "{at}: {left} remaining refused"
                    );
                }
                assert!(
                    !decide(&bands, &state, now, left.saturating_add(1)).allowed,
                    "{at}: more than {left} remaining admitted"
                );
            }

            if bands.len() == 1 {
                let reset = micros(d.reset_after);
                assert!(
                    decide(&bands, &state, now + reset, max_cost).allowed,
                    "{at}: quota not whole at reset_after {reset}"
                );
                if algorithm.is_exact() && reset > 0 {
                    assert!(
                        !decide(&bands, &state, now + reset - 1, max_cost).allowed,
                        "{at}: quota whole before reset_after {reset}"
                    );
                }
            }
        }

        if let Some(written_at) = written_at {
            let mut fresh = State::new(&bands);
            let mut now = written_at + horizon;
            for step in 0..20 {
                let cost = next_cost(&mut rng, max_cost);
                assert_eq!(
                    evaluate(&bands, &mut state, now, cost),
                    evaluate(&bands, &mut fresh, now, cost),
                    "{} seed {seed}: step {step} after the horizon {bands:?}",
                    algorithm.name()
                );
                now = next_now(&mut rng, now, horizon, false);
            }
        }
    }
}

/// Every registered algorithm, so a new one is checked without naming it
/// here ([`random_bands`] fails to compile until it can make its bands).
#[test]
fn every_algorithm_keeps_its_properties() {
    for &algorithm in Algorithm::ALL {
        check_properties(algorithm);
    }
}

/// docs/ALGORITHMS.md's sliding log, literally: one timestamp per admitted
/// unit, every count a scan. The real log shares entries and searches.
fn spec_log(bands: &[WindowBand], units: &mut Vec<Micros>, now: Micros, cost: u32) -> Decision {
    let t = units.last().map_or(now, |&newest| newest.max(now));
    let cost = u64::from(cost);
    let counted: Vec<Vec<Micros>> = bands
        .iter()
        .map(|b| {
            let w = micros(b.window);
            units.iter().copied().filter(|&ts| t - ts < w).collect()
        })
        .collect();
    let allowed = bands
        .iter()
        .zip(&counted)
        .all(|(b, c)| c.len() as u64 + cost <= u64::from(b.limit.get()));
    let verdicts = bands.iter().zip(&counted).map(|(b, c)| {
        let (w, limit, count) = (micros(b.window), u64::from(b.limit.get()), c.len() as u64);
        let fits = count + cost <= limit;
        BandVerdict {
            allowed: fits,
            remaining: limit.saturating_sub(count + if allowed { cost } else { 0 }),
            reset_after: if allowed {
                t + w - now
            } else {
                c.last().map_or(0, |newest| newest + w - now)
            },
            retry_after: if fits {
                0
            } else {
                c[(count + cost - limit - 1) as usize] + w - now
            },
        }
    });
    let decision = bind(verdicts, false);
    if allowed {
        units.extend(std::iter::repeat_n(t, cost as usize));
    }
    decision
}

#[test]
fn the_sliding_log_decides_as_the_spec_written_literally() {
    for seed in 0..SEQUENCES {
        let mut rng = Rng(seed << 8 | 0xAB);
        let bands = random_bands(&mut rng, Algorithm::SlidingLog);
        let Bands::SlidingLog(windows) = &bands else {
            unreachable!("asked for a sliding log")
        };
        let horizon = micros(bands.horizon());
        let mut state = State::new(&bands);
        let mut units = Vec::new();
        let mut now = T0;
        for step in 0..3 * STEPS {
            now = next_now(&mut rng, now, horizon, seed % 2 == 1);
            let cost = next_cost(&mut rng, bands.max_cost());
            assert_eq!(
                evaluate(&bands, &mut state, now, cost),
                spec_log(windows, &mut units, now, cost),
                "seed {seed} step {step} {bands:?}"
            );
        }
    }
}
