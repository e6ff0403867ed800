use super::*;

#[test]
fn admits_exactly_the_limit_in_any_window() {
    let bands = Bands::SlidingLog(vec![window(3, SEC)]);
    run(
        &bands,
        &[
            ok(T0, 1, 2, SEC),
            ok(T0, 1, 1, SEC),
            ok(T0, 1, 0, SEC),
            deny(T0, 1, 0, SEC, SEC),
            deny(T0 + SEC - 1, 1, 0, 1, 1),
            // An entry at `ts` counts while `now - ts < W`.
            ok(T0 + SEC, 2, 1, SEC),
            deny(T0 + 1_500_000, 2, 1, 500_000, 500_000),
            ok(T0 + 1_500_000, 1, 0, SEC),
            deny(T0 + 2 * SEC, 3, 2, 500_000, 500_000),
        ],
    );
}

#[test]
fn a_cost_waits_for_the_kth_oldest_unit() {
    let bands = Bands::SlidingLog(vec![window(5, SEC)]);
    run(
        &bands,
        &[
            ok(T0, 2, 3, SEC),
            ok(T0 + 100_000, 2, 1, SEC),
            ok(T0 + 200_000, 1, 0, SEC),
            // 5 + 3 - 5 = 3 units must leave; the 3rd oldest is at 100 ms.
            deny(T0 + 300_000, 3, 0, 900_000, 800_000),
            deny(T0 + 1_099_999, 3, 2, 100_001, 1),
            ok(T0 + 1_100_000, 3, 1, SEC),
        ],
    );
}

#[test]
fn requests_of_the_same_microsecond_never_collapse() {
    let bands = Bands::SlidingLog(vec![window(1000, SEC)]);
    let at = T0 + 5;
    let mut rows: Vec<Row> = (0..1000).map(|i| ok(at, 1, 999 - i, SEC)).collect();
    rows.push(deny(at, 1, 0, SEC, SEC));
    rows.push(deny(at + SEC - 1, 1, 0, 1, 1));
    rows.push(ok(at + SEC, 1, 999, SEC));
    run(&bands, &rows);
}

#[test]
fn a_band_that_denies_charges_no_other_band() {
    let bands = Bands::SlidingLog(vec![window(2, SEC), window(3, 10 * SEC)]);
    run(
        &bands,
        &[
            ok(T0, 1, 1, SEC),
            ok(T0 + 1, 1, 0, SEC),
            deny(T0 + 2, 1, 0, 999_999, 999_998),
            // Both earlier units have left band 0 (1 s and 1 s + 1 ago).
            ok(T0 + SEC + 1, 1, 0, 10 * SEC).band(1),
            // Band 0 would admit a second unit; band 1 holds 3.
            deny(T0 + SEC + 2, 1, 0, 9_999_999, 8_999_998).band(1),
        ],
    );
}
