use super::*;

#[test]
fn admits_exactly_the_limit_then_denies_until_the_window_rolls() {
    let bands = Bands::FixedWindow(vec![window(3, SEC)]);
    run(
        &bands,
        &[
            ok(T0 + 100_000, 1, 2, 900_000),
            ok(T0 + 200_000, 1, 1, 800_000),
            ok(T0 + 300_000, 1, 0, 700_000),
            deny(T0 + 400_000, 1, 0, 600_000, 600_000),
            deny(T0 + SEC - 1, 1, 0, 1, 1),
            ok(T0 + SEC, 1, 2, SEC),
        ],
    );
}

#[test]
fn windows_align_to_the_epoch_not_to_the_first_request() {
    let bands = Bands::FixedWindow(vec![window(2, SEC)]);
    run(
        &bands,
        &[
            ok(T0 + 999_000, 1, 1, 1_000),
            ok(T0 + 999_500, 1, 0, 500),
            deny(T0 + 999_999, 1, 0, 1, 1),
            ok(T0 + SEC, 2, 0, SEC),
        ],
    );
}

#[test]
fn a_cost_above_what_is_left_is_denied_whole() {
    let bands = Bands::FixedWindow(vec![window(5, SEC)]);
    run(
        &bands,
        &[
            ok(T0, 3, 2, SEC),
            deny(T0 + 1, 3, 2, SEC - 1, SEC - 1),
            ok(T0 + 2, 2, 0, SEC - 2),
            deny(T0 + 3, 1, 0, SEC - 3, SEC - 3),
            ok(T0 + SEC, 5, 0, SEC),
        ],
    );
}

#[test]
fn a_band_that_denies_charges_no_other_band() {
    // `run` asserts the state is untouched by each denial; the binding band
    // moves from the per-second band to the per-10 s one as it fills.
    let bands = Bands::FixedWindow(vec![window(2, SEC), window(3, 10 * SEC)]);
    run(
        &bands,
        &[
            ok(T0, 1, 1, SEC),
            ok(T0 + 1, 1, 0, SEC - 1),
            deny(T0 + 2, 1, 0, SEC - 2, SEC - 2),
            ok(T0 + SEC, 1, 0, 9 * SEC).band(1),
            deny(T0 + SEC + 1, 1, 0, 9 * SEC - 1, 9 * SEC - 1).band(1),
            ok(T0 + 10 * SEC, 2, 0, SEC),
        ],
    );
}

#[test]
fn the_denying_band_with_the_longest_wait_binds() {
    let bands = Bands::FixedWindow(vec![window(1, SEC), window(1, 10 * SEC)]);
    run(
        &bands,
        &[
            // Both at 0 remaining: the lower index wins the tie.
            ok(T0, 1, 0, SEC),
            deny(T0 + 1, 1, 0, 10 * SEC - 1, 10 * SEC - 1).band(1),
            // The per-second band would admit again; the other still binds.
            deny(T0 + SEC, 1, 0, 9 * SEC, 9 * SEC).band(1),
            ok(T0 + 10 * SEC, 1, 0, SEC),
        ],
    );
}

#[test]
fn equal_bands_bind_on_the_lowest_index() {
    let bands = Bands::FixedWindow(vec![window(2, SEC), window(2, SEC)]);
    run(
        &bands,
        &[
            ok(T0, 1, 1, SEC),
            ok(T0, 1, 0, SEC),
            deny(T0, 1, 0, SEC, SEC),
        ],
    );
}
