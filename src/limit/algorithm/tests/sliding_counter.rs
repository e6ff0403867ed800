use super::*;

#[test]
fn fills_then_waits_for_the_previous_window_to_fade() {
    let bands = Bands::SlidingCounter(vec![window(10, SEC)]);
    run(
        &bands,
        &[
            ok(T0, 6, 4, 2 * SEC),
            ok(T0 + 500_000, 4, 0, 1_500_000),
            // cur + 1 > 10: only the next window helps, once 10 weighs < 10,
            // i.e. after its first whole millisecond.
            deny(T0 + 600_000, 1, 0, 1_400_000, 401_000),
            // Next window, first millisecond: 10 * 1000/1000 = 10 still.
            deny(T0 + 1_000_999, 1, 0, 999_001, 1),
            // floor(10 * 999/1000) = 9, plus 1.
            ok(T0 + 1_001_000, 1, 0, 1_999_000),
            // Halfway: cur 1 + floor(10 * 500/1000) = 6; 6 + 5 > 10.
            // 1 + floor(10 * 499/1000) = 5 fits 5 at the 501st ms.
            deny(T0 + 1_500_000, 5, 4, 1_500_000, 1_000),
            deny(T0 + 1_500_999, 5, 4, 1_499_001, 1),
            ok(T0 + 1_501_000, 5, 0, 1_499_000),
            // Two windows on, neither counts any more.
            ok(T0 + 3 * SEC, 10, 0, 2 * SEC),
        ],
    );
}

#[test]
fn the_previous_window_weighs_by_the_share_still_covered() {
    let bands = Bands::SlidingCounter(vec![window(100, SEC)]);
    run(
        &bands,
        &[
            ok(T0, 100, 0, 2 * SEC),
            // 250 ms into the next window: floor(100 * 750/1000) = 75.
            deny(T0 + 1_250_000, 26, 25, 750_000, 1_000),
            ok(T0 + 1_250_000, 25, 0, 1_750_000),
            // 25 + 75 = 100; at 251 ms: 25 + floor(100 * 749/1000) = 99.
            deny(T0 + 1_250_000, 1, 0, 1_750_000, 1_000),
            ok(T0 + 1_251_000, 1, 0, 1_749_000),
        ],
    );
}

#[test]
fn a_full_weight_previous_window_waits_for_the_next_one() {
    // A 1 ms window has one weighting step: the previous window counts
    // whole until the current one ends.
    let bands = Bands::SlidingCounter(vec![window(5, MS)]);
    run(
        &bands,
        &[
            ok(T0, 5, 0, 2 * MS),
            deny(T0 + MS, 1, 0, MS, MS),
            deny(T0 + 2 * MS - 1, 1, 0, 1, 1),
            ok(T0 + 2 * MS, 1, 4, 2 * MS),
        ],
    );
}

#[test]
fn a_band_that_denies_charges_no_other_band() {
    let bands = Bands::SlidingCounter(vec![window(5, SEC), window(8, 10 * SEC)]);
    run(
        &bands,
        &[
            ok(T0, 5, 0, 2 * SEC),
            deny(T0 + 1, 1, 0, 2 * SEC - 1, 1_000_999),
            // Band 0: 0 + floor(5 * 999/1000) = 4, and 4 + 3 > 5; band 1
            // (5 of 8, had the denial above charged it 6) would admit.
            deny(T0 + 1_001_000, 3, 1, 999_000, 400_000),
            // Band 0 at 401 ms: floor(5 * 599/1000) = 2, + 3 = 5; band 1:
            // 5 + 3 = 8. Both at 0: the lower index binds.
            ok(T0 + 1_401_000, 3, 0, 1_599_000),
            // Both deny; band 1 must wait for its next window.
            deny(T0 + 1_401_001, 1, 0, 18_598_999, 8_599_999).band(1),
        ],
    );
}
