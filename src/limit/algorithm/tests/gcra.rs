use super::*;

#[test]
fn a_burst_then_one_per_emission_interval() {
    // 10 per second: T = 100 ms; burst 3: tau = 300 ms.
    let bands = Bands::Gcra(vec![gcra(10, SEC, 3)]);
    run(
        &bands,
        &[
            ok(T0, 1, 2, 100_000),
            ok(T0, 1, 1, 200_000),
            ok(T0, 1, 0, 300_000),
            deny(T0, 1, 0, 300_000, 100_000),
            deny(T0 + 99_999, 1, 0, 200_001, 1),
            // Smooth from here: one every T, never two.
            ok(T0 + 100_000, 1, 0, 300_000),
            ok(T0 + 200_000, 1, 0, 300_000),
            deny(T0 + 250_000, 1, 0, 250_000, 50_000),
            ok(T0 + 300_000, 1, 0, 300_000),
            // Idle past the theoretical arrival time: a whole burst again.
            ok(T0 + SEC, 3, 0, 300_000),
            deny(T0 + SEC + 100_000, 2, 1, 200_000, 100_000),
            ok(T0 + SEC + 100_000, 1, 0, 300_000),
        ],
    );
}

#[test]
fn the_emission_interval_rounds_up() {
    // 3 per ms: T = ceil(1000 / 3) = 334 µs, so never 4 in a millisecond.
    let bands = Bands::Gcra(vec![gcra(3, MS, 1)]);
    run(
        &bands,
        &[
            ok(T0, 1, 0, 334),
            deny(T0 + 333, 1, 0, 1, 1),
            ok(T0 + 334, 1, 0, 334),
            ok(T0 + 668, 1, 0, 334),
            deny(T0 + MS, 1, 0, 2, 2),
            ok(T0 + 1_002, 1, 0, 334),
        ],
    );
}

#[test]
fn a_band_that_denies_charges_no_other_band() {
    // Band 0: T = 500 ms, tau = 1 s. Band 1: T = 3_333_334 µs, tau 3 T.
    let bands = Bands::Gcra(vec![gcra(2, SEC, 2), gcra(3, 10 * SEC, 3)]);
    run(
        &bands,
        &[
            ok(T0, 1, 1, 500_000),
            ok(T0, 1, 0, SEC),
            deny(T0 + 1, 1, 0, 999_999, 499_999),
            ok(T0 + 500_000, 1, 0, SEC),
            // Band 0 would admit; band 1's third unit was its last.
            deny(T0 + SEC, 1, 0, 9_000_002, 2_333_334).band(1),
        ],
    );
}
