use super::*;

#[test]
fn drains_then_refills_by_whole_periods() {
    let bands = Bands::TokenBucket(vec![bucket(3, 1, SEC)]);
    run(
        &bands,
        &[
            // A new subject starts full; the phase starts at its first request.
            ok(T0 + 123, 1, 2, SEC),
            ok(T0 + 123, 1, 1, 2 * SEC),
            ok(T0 + 123, 1, 0, 3 * SEC),
            deny(T0 + 500_000, 1, 0, 2_500_123, 500_123),
            deny(T0 + 1_000_122, 1, 0, 2_000_001, 1),
            ok(T0 + 1_000_123, 1, 0, 3 * SEC),
            // 1.5 periods later: one token, not 1.5.
            deny(T0 + 2_500_000, 2, 1, 1_500_123, 500_123),
            ok(T0 + 3_000_123, 2, 0, 3 * SEC),
            // Refilled past full: a full bucket keeps no phase.
            ok(T0 + 10 * SEC, 1, 2, SEC),
        ],
    );
}

#[test]
fn several_tokens_per_period_round_waits_up_to_whole_periods() {
    let bands = Bands::TokenBucket(vec![bucket(5, 2, SEC)]);
    run(
        &bands,
        &[
            ok(T0, 5, 0, 3 * SEC),
            // 2 tokens; 1 more is a whole period away, and 5 are two.
            deny(T0 + SEC, 3, 2, 2 * SEC, SEC),
            deny(T0 + 2 * SEC - 1, 5, 2, SEC + 1, SEC + 1),
            // 4 tokens.
            deny(T0 + 2 * SEC, 5, 4, SEC, SEC),
            // 6 capped at 5.
            ok(T0 + 3 * SEC, 5, 0, 3 * SEC),
        ],
    );
}

#[test]
fn a_band_that_denies_charges_no_other_band() {
    let bands = Bands::TokenBucket(vec![bucket(2, 1, SEC), bucket(3, 1, 10 * SEC)]);
    run(
        &bands,
        &[
            ok(T0, 1, 1, SEC),
            ok(T0, 1, 0, 2 * SEC),
            // Band 1 still holds a token; it must not be taken.
            deny(T0 + 1, 1, 0, 2 * SEC - 1, SEC - 1),
            // Band 1's last token; both at 0, the lower index binds.
            ok(T0 + SEC, 1, 0, 2 * SEC),
            // Band 0 has refilled one; band 1 is empty for 8 s more.
            deny(T0 + 2 * SEC, 1, 0, 28 * SEC, 8 * SEC).band(1),
            ok(T0 + 10 * SEC, 1, 0, 30 * SEC).band(1),
        ],
    );
}
