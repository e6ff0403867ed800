//! The book's rules, with the store's answers written by hand: when a
//! lease is asked for and how large, what a spent request is answered,
//! when a lease ends and what goes back.

use std::num::NonZeroU32;

use super::*;
use crate::limit::{Bands, BucketBand, WindowBand};
use crate::store::shards::SHARDS;
use crate::subject::PseudonymKey;

const MS: Duration = Duration::from_millis(1);

fn n(v: u32) -> NonZeroU32 {
    NonZeroU32::new(v).unwrap()
}

fn terms(ttl_ms: u64, max_share: u8) -> LeaseTerms {
    LeaseTerms {
        ttl: MS * ttl_ms as u32,
        max_share,
        auto: false,
    }
}

fn bucket(capacity: u32, lease: LeaseTerms) -> Policy {
    Policy::new(
        "p",
        "r1",
        Bands::TokenBucket(vec![BucketBand {
            capacity: n(capacity),
            refill_tokens: n(1),
            refill_every: Duration::from_secs(1),
            max_wait_us: 0,
        }]),
        false,
    )
    .with_lease(Some(lease))
}

fn window(limit: u32, lease: LeaseTerms) -> Policy {
    Policy::new(
        "w",
        "r1",
        Bands::FixedWindow(vec![WindowBand {
            limit: n(limit),
            window: Duration::from_secs(1),
        }]),
        false,
    )
    .with_lease(Some(lease))
}

fn sliding(limit: u32, lease: LeaseTerms) -> Policy {
    Policy::new(
        "s",
        "r1",
        Bands::SlidingCounter(vec![WindowBand {
            limit: n(limit),
            window: Duration::from_secs(1),
        }]),
        false,
    )
    .with_lease(Some(lease))
}

fn subject(s: &str) -> Pseudonym {
    PseudonymKey::new(b"k", 1).pseudonym("ip", s.as_bytes(), "r")
}

fn ask<'a>(policy: &'a Policy, subject: &'a Pseudonym, cost: u32, at: Instant) -> Evaluation<'a> {
    Evaluation {
        policy,
        subject,
        cost,
        deadline: at + Duration::from_secs(1),
        id: EvaluationId::fresh(),
        settle_within: None,
    }
}

fn allowed(remaining: u64, reset_ms: u32) -> Outcome {
    Outcome::Allowed(Decision {
        allowed: true,
        band: 0,
        remaining,
        reset_after: MS * reset_ms,
        retry_after: Duration::ZERO,
        approximate: false,
    })
}

fn remaining(outcome: Outcome) -> u64 {
    match outcome {
        Outcome::Allowed(d) => d.remaining,
        other => panic!("not allowed: {other:?}"),
    }
}

/// Asks, and answers as the store would with `left` units left after the
/// charge: the extra it was asked for, or `None` when spent locally.
fn request(
    book: &Leases,
    e: &Evaluation<'_>,
    now: Instant,
    left: u64,
    returns: &mut Vec<Return>,
) -> (Option<u32>, Outcome) {
    match book.before(e, now, returns, false) {
        Before::Spent(d, ..) => (None, Outcome::Allowed(d)),
        Before::Ask { extra } => {
            let answer = book.after(e, extra, now, allowed(left, 900), returns);
            (Some(extra), answer)
        }
        Before::Wait(_) => panic!("asked not to wait"),
    }
}

#[test]
fn a_subject_is_seen_at_the_door_then_followed_then_leased() {
    let book = Leases::new(64);
    let p = bucket(1000, terms(250, 10));
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    let (extra, _) = request(&book, &ask(&p, &a, 1, t0), t0, 900, &mut returns);
    assert_eq!(extra, Some(0), "first sight");
    assert_eq!(book.shards.len(), 0, "only seen at the door");
    // Followed from the second: what the store says is left is learnt.
    let (extra, _) = request(&book, &ask(&p, &a, 1, t0), t0 + MS, 899, &mut returns);
    assert_eq!(extra, Some(0));
    assert_eq!(book.shards.len(), 1);
    // Three in one period: the rate here is 3 per ttl, so 3 units more.
    let (extra, answer) = request(&book, &ask(&p, &a, 1, t0), t0 + MS * 2, 898, &mut returns);
    assert_eq!(extra, Some(3));
    // The lease is still the subject's: 895 in Redis and 3 held here.
    assert_eq!(remaining(answer), 898 + 3);
    assert_eq!(book.held(), 3);
    assert!(returns.is_empty());
}

#[test]
fn a_lease_pays_until_spent_and_the_answers_count_down() {
    let book = Leases::new(64).without_door();
    let p = window(1000, terms(250, 50));
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    let first = ask(&p, &a, 1, t0);
    assert_eq!(
        book.before(&first, t0, &mut returns, false),
        Before::Ask { extra: 0 }
    );
    book.after(&first, 0, t0, allowed(990, 900), &mut returns);
    let e = ask(&p, &a, 1, t0 + MS);
    let Before::Ask { extra } = book.before(&e, t0 + MS, &mut returns, false) else {
        panic!("spent without a lease");
    };
    assert_eq!(extra, 2);
    let answer = book.after(&e, extra, t0 + MS, allowed(987, 900), &mut returns);
    assert_eq!(remaining(answer), 989);
    let mut tops = Vec::new();
    for left in [1, 0] {
        let spent = book.before(&ask(&p, &a, 1, t0), t0 + MS * 2, &mut returns, false);
        let Before::Spent(d, top, _) = spent else {
            panic!("not spent from the lease: {spent:?}")
        };
        assert_eq!(d.remaining, 987 + left);
        // One millisecond since the grant was sent.
        assert_eq!(d.reset_after, MS * 899);
        tops.push(top.is_some());
    }
    // Below half of the grant at the last spend: a top-up.
    assert_eq!(tops, [false, true]);
    assert_eq!(book.held(), 0);
    // Spent out, the top-up on its way: the next request goes to the
    // store asking for nothing more, and nothing goes back.
    let again = book.before(&ask(&p, &a, 1, t0), t0 + MS * 3, &mut returns, false);
    assert_eq!(again, Before::Ask { extra: 0 });
    assert!(returns.is_empty());
}

#[test]
fn a_request_costing_more_than_is_left_goes_to_the_store_and_the_rest_goes_back() {
    let book = Leases::new(64).without_door();
    let p = bucket(1000, terms(250, 50));
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    request(&book, &ask(&p, &a, 1, t0), t0, 900, &mut returns);
    let grant = ask(&p, &a, 1, t0);
    let (extra, _) = request(&book, &grant, t0, 897, &mut returns);
    assert_eq!(extra, Some(2));
    let big = ask(&p, &a, 5, t0);
    assert!(matches!(
        book.before(&big, t0 + MS, &mut returns, false),
        Before::Ask { .. }
    ));
    assert_eq!(returns.len(), 1);
    assert_eq!((returns[0].units, returns[0].id), (2, grant.id));
    assert_eq!(book.held(), 0);
}

#[test]
fn a_lease_ends_with_its_ttl_and_a_fixed_window_with_its_window() {
    let book = Leases::new(64).without_door();
    let t0 = Instant::now();
    let mut returns = Vec::new();
    for (i, (p, reset_ms, lasts)) in [
        (bucket(1000, terms(250, 50)), 100, MS * 250),
        // The window ends 100 ms after the grant: so does the lease.
        (window(1000, terms(250, 50)), 100, MS * 100),
        // A sliding counter's count fades through the next window (1 s):
        // its window ends 100 ms after the grant.
        (sliding(1000, terms(250, 50)), 1100, MS * 100),
        (sliding(1000, terms(250, 50)), 1900, MS * 250),
    ]
    .into_iter()
    .enumerate()
    {
        let a = subject(&format!("a{i}"));
        request(&book, &ask(&p, &a, 1, t0), t0, 900, &mut returns);
        let grant = ask(&p, &a, 1, t0);
        assert!(matches!(
            book.before(&grant, t0, &mut returns, false),
            Before::Ask { extra: 2 }
        ));
        book.after(&grant, 2, t0, allowed(897, reset_ms), &mut returns);
        let before_end = t0 + lasts - MS;
        assert!(book.ended(before_end).is_empty());
        assert!(matches!(
            book.before(&ask(&p, &a, 1, t0), before_end, &mut returns, false),
            Before::Spent(..)
        ));
        let ended = book.ended(t0 + lasts);
        assert_eq!(ended.len(), 1, "{:?}", p.algorithm());
        assert_eq!((ended[0].units, ended[0].id), (1, grant.id));
        // Nothing more to give back, and nothing to spend.
        assert!(book.drain().is_empty());
        assert!(matches!(
            book.before(&ask(&p, &a, 1, t0), t0 + lasts, &mut returns, false),
            Before::Ask { .. }
        ));
    }
    assert!(returns.is_empty());
}

#[test]
fn a_spent_answer_says_when_the_bucket_would_be_full_with_what_is_held_back() {
    let book = Leases::new(64).without_door();
    // 1000 tokens, one back a second: 13 taken (one request, a lease of
    // 12) is full again in 13 s.
    let p = bucket(1000, terms(250, 50));
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    let first = ask(&p, &a, 1, t0);
    book.before(&first, t0, &mut returns, false);
    book.after(&first, 0, t0, allowed(999, 1_000), &mut returns);
    let grant = ask(&p, &a, 1, t0);
    assert_eq!(
        book.before(&grant, t0, &mut returns, false),
        Before::Ask { extra: 2 }
    );
    let answer = book.after(&grant, 2, t0, allowed(996, 4_000), &mut returns);
    // Its own and the first request's tokens out, the lease's not.
    let Outcome::Allowed(d) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!((d.remaining, d.reset_after), (998, MS * 2_000));
    let Before::Spent(d, ..) = book.before(&ask(&p, &a, 1, t0), t0 + MS * 10, &mut returns, false)
    else {
        panic!("not spent")
    };
    assert_eq!((d.remaining, d.reset_after), (997, MS * 2_990));
}

#[test]
fn near_the_limit_every_request_is_the_stores() {
    let t = terms(250, 10);
    // Plenty left: the rate here decides.
    assert_eq!(extra(t, 40, 1, Some(10_000), 10_000), 40);
    assert_eq!(extra(t, 40, 3, Some(10_000), 10_000), 120);
    // A tenth of what is left.
    assert_eq!(extra(t, 40, 1, Some(100), 10_000), 10);
    assert_eq!(extra(t, 40, 1, Some(9), 10_000), 0);
    // Never past the largest cost a request could have.
    assert_eq!(extra(t, 40, 1, Some(10_000), 25), 24);
    assert_eq!(extra(t, 40, 25, Some(10_000), 25), 0);
    // Seen once, or never answered.
    assert_eq!(extra(t, 1, 1, Some(10_000), 10_000), 0);
    assert_eq!(extra(t, 40, 1, None, 10_000), 0);
    assert_eq!(extra(terms(250, 100), 40, 1, Some(7), 10_000), 7);
}

#[test]
fn one_request_at_a_time_asks_for_a_lease() {
    let book = Leases::new(64).without_door();
    let p = bucket(1000, terms(250, 50));
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    request(&book, &ask(&p, &a, 1, t0), t0, 900, &mut returns);
    let first = ask(&p, &a, 1, t0);
    assert!(
        matches!(book.before(&first, t0, &mut returns, false), Before::Ask { extra } if extra > 0)
    );
    assert_eq!(
        book.before(&ask(&p, &a, 1, t0), t0, &mut returns, false),
        Before::Ask { extra: 0 }
    );
    // A denial of the larger charge grants nothing and ends the asking.
    let denied = Outcome::Denied(Decision {
        allowed: false,
        retry_after: MS,
        ..match allowed(0, 900) {
            Outcome::Allowed(d) => d,
            _ => unreachable!(),
        }
    });
    assert_eq!(book.after(&first, 3, t0, denied, &mut returns), denied);
    assert_eq!(book.held(), 0);
    assert!(matches!(
        book.before(&ask(&p, &a, 1, t0), t0, &mut returns, false),
        Before::Ask { .. }
    ));
    assert!(returns.is_empty());
}

#[test]
fn new_numbers_or_a_drain_give_back_what_is_held() {
    let book = Leases::new(64).without_door();
    let (a, b) = (subject("a"), subject("b"));
    let p = bucket(1000, terms(250, 50));
    let t0 = Instant::now();
    let mut returns = Vec::new();
    for s in [&a, &b] {
        request(&book, &ask(&p, s, 1, t0), t0, 900, &mut returns);
        request(&book, &ask(&p, s, 1, t0), t0, 897, &mut returns);
    }
    assert_eq!(book.held(), 4);
    // The same name and revision, a larger bucket: a reload.
    let raised = bucket(2000, terms(250, 50));
    let e = ask(&raised, &a, 1, t0);
    assert_eq!(
        book.before(&e, t0, &mut returns, false),
        Before::Ask { extra: 0 }
    );
    assert_eq!(returns.len(), 1);
    assert_eq!(returns[0].units, 2);
    let drained = book.drain();
    assert_eq!(drained.iter().map(|r| r.units).sum::<u32>(), 2);
    assert_eq!(book.held(), 0);
}

#[test]
fn a_full_book_follows_no_one_new_and_drops_the_quiet() {
    // One per shard.
    let book = Leases::new(1);
    let p = bucket(1000, terms(250, 50));
    let t0 = Instant::now();
    let mut returns = Vec::new();
    let subjects: Vec<Pseudonym> = (0..200).map(|i| subject(&i.to_string())).collect();
    // A first request is only seen at the door: no one is followed.
    for s in &subjects {
        request(&book, &ask(&p, s, 1, t0), t0, 900, &mut returns);
    }
    assert_eq!(book.shards.len(), 0);
    for s in &subjects {
        request(&book, &ask(&p, s, 1, t0), t0, 900, &mut returns);
    }
    let followed = book.shards.len();
    assert_eq!(followed, SHARDS);
    // Every subject not followed is decided by the store, never leased.
    let leased = subjects
        .iter()
        .filter(|s| {
            let (extra, _) = request(&book, &ask(&p, s, 1, t0), t0, 897, &mut Vec::new());
            extra.unwrap_or(0) > 0
        })
        .count();
    assert_eq!(leased, SHARDS);
    // Two periods on, the quiet ones make room (each shard's holds a lease,
    // given back as it ends).
    let later = t0 + MS * 500;
    assert_eq!(book.ended(later).len(), SHARDS);
    assert_eq!(book.shards.len(), 0);
}

#[test]
fn a_shadow_policy_is_never_leased() {
    let book = Leases::new(64).without_door();
    let mut p = bucket(1000, terms(250, 50));
    p.shadow = true;
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    for _ in 0..5 {
        let (extra, _) = request(&book, &ask(&p, &a, 1, t0), t0, 900, &mut returns);
        assert_eq!(extra, Some(0));
    }
}

/// Grants a lease of `extra` for subject `s` (seen twice, the store saying
/// `left` after the grant, the window or bucket full again in `reset_ms`).
fn granted(book: &Leases, p: &Policy, s: &Pseudonym, t0: Instant, left: u64, reset_ms: u32) -> u32 {
    let mut returns = Vec::new();
    let first = ask(p, s, 1, t0);
    book.before(&first, t0, &mut returns, false);
    book.after(&first, 0, t0, allowed(left + 50, reset_ms), &mut returns);
    let grant = ask(p, s, 1, t0);
    let Before::Ask { extra } = book.before(&grant, t0, &mut returns, false) else {
        panic!("spent without a lease")
    };
    book.after(&grant, extra, t0, allowed(left, reset_ms), &mut returns);
    assert!(returns.is_empty());
    extra
}

/// What `before` says of `e` at `now`, spent: its answer, top-up and
/// which lease paid.
fn spend(book: &Leases, e: &Evaluation<'_>, now: Instant) -> (Decision, Option<Box<TopUp>>, Spend) {
    match book.before(e, now, &mut Vec::new(), false) {
        Before::Spent(decision, top, spend) => (decision, top, spend),
        other => panic!("not spent from the lease: {other:?}"),
    }
}

#[test]
fn a_lease_spent_below_half_is_topped_up_once_in_the_background() {
    let book = Leases::new(64).without_door();
    let p = window(10_000, terms(250, 50));
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    // Seen twice: a lease of 2. Spent to 1: half of it, no top-up yet.
    assert_eq!(granted(&book, &p, &a, t0, 5_000, 900), 2);
    let e = ask(&p, &a, 1, t0);
    assert_eq!(spend(&book, &e, t0 + MS).1, None, "at half");
    // Spent out: below half. Four requests seen in the period: 4 units.
    let top = spend(&book, &e, t0 + MS).1.expect("a top-up");
    assert_eq!(top.units, 4);
    // One asks at a time: the next finds the lease spent, and asks for
    // none in its call.
    assert_eq!(
        book.before(&e, t0 + MS, &mut returns, false),
        Before::Ask { extra: 0 }
    );
    // It lands: 4 units, lasting from this grant, answered as Redis said.
    let id = EvaluationId::fresh();
    book.topped(&top, id, t0 + MS * 2, allowed(4_990, 898), &mut returns);
    assert!(returns.is_empty());
    assert_eq!(book.held(), 4);
    let (d, ..) = spend(&book, &e, t0 + MS * 3);
    assert_eq!((d.remaining, d.reset_after), (4_993, MS * 897));
    let drained = book.drain();
    assert_eq!((drained[0].units, drained[0].id), (3, id));
}

#[test]
fn a_top_up_that_cannot_join_goes_back_and_a_refused_one_grants_nothing() {
    let book = Leases::new(64).without_door();
    let t0 = Instant::now();
    let mut returns = Vec::new();
    // A fixed window's lease ends with its window, 100 ms on; the top-up
    // was counted in the next one (it ends 1.1 s on).
    let p = window(10_000, terms(250, 50));
    let a = subject("a");
    granted(&book, &p, &a, t0, 5_000, 100);
    spend(&book, &ask(&p, &a, 1, t0), t0);
    let top = spend(&book, &ask(&p, &a, 1, t0), t0).1.expect("a top-up");
    let id = EvaluationId::fresh();
    book.topped(&top, id, t0, allowed(4_990, 1_100), &mut returns);
    assert_eq!(returns.len(), 1);
    assert_eq!((returns[0].units, returns[0].id), (top.units, id));
    assert_eq!(book.held(), 0);

    // A bucket's top-up refused: nothing held, and none asked again with
    // nothing left in the store.
    let b = subject("b");
    let bucket = bucket(10_000, terms(250, 50));
    returns.clear();
    granted(&book, &bucket, &b, t0, 5_000, 900);
    spend(&book, &ask(&bucket, &b, 1, t0), t0);
    let e = ask(&bucket, &b, 1, t0);
    let top = spend(&book, &e, t0).1.expect("a top-up");
    let denied = Outcome::Denied(Decision {
        allowed: false,
        retry_after: MS,
        ..match allowed(0, 900) {
            Outcome::Allowed(d) => d,
            _ => unreachable!(),
        }
    });
    book.topped(&top, EvaluationId::fresh(), t0, denied, &mut returns);
    assert!(returns.is_empty());
    assert_eq!(book.held(), 0);
    assert_eq!(
        book.before(&e, t0, &mut returns, false),
        Before::Ask { extra: 0 }
    );
}

#[test]
fn a_request_finding_the_lease_spent_waits_for_the_grant_on_its_way() {
    let book = Leases::new(64).without_door();
    let p = window(10_000, terms(250, 50));
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    granted(&book, &p, &a, t0, 5_000, 900);
    let e = ask(&p, &a, 1, t0);
    spend(&book, &e, t0);
    let top = spend(&book, &e, t0).1.expect("a top-up");
    // Spent, the top-up on its way: one limit may wait for it, several
    // (or a second look) go to the store asking for nothing.
    let Before::Wait(answered) = book.before(&e, t0, &mut returns, true) else {
        panic!("not told to wait")
    };
    assert_eq!(
        book.before(&e, t0, &mut returns, false),
        Before::Ask { extra: 0 }
    );
    assert!(
        !answered.has_changed().unwrap_or(true),
        "told before the answer"
    );
    book.topped(
        &top,
        EvaluationId::fresh(),
        t0,
        allowed(4_990, 899),
        &mut returns,
    );
    assert!(
        answered.has_changed().unwrap_or(false),
        "not told of the answer"
    );
    assert!(matches!(
        book.before(&e, t0, &mut returns, true),
        Before::Spent(..)
    ));
    // An ended lease is not waited for.
    assert!(matches!(
        book.before(&e, t0 + MS * 260, &mut returns, true),
        Before::Ask { .. }
    ));
}

#[test]
fn a_lease_spent_while_its_top_up_is_on_its_way_counts_down_by_one() {
    let book = Leases::new(64).without_door();
    let p = window(10_000, terms(250, 50));
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    // Three requests seen, the third granted a lease of 3: 5_045 left in
    // Redis, 3 held here.
    let first = ask(&p, &a, 1, t0);
    book.before(&first, t0, &mut returns, false);
    book.after(&first, 0, t0, allowed(5_050, 900), &mut returns);
    let second = ask(&p, &a, 1, t0);
    assert_eq!(
        book.before(&second, t0, &mut returns, false),
        Before::Ask { extra: 2 }
    );
    book.asked(&second);
    book.after(&second, 0, t0, allowed(5_049, 900), &mut returns);
    let third = ask(&p, &a, 1, t0);
    assert_eq!(
        book.before(&third, t0, &mut returns, false),
        Before::Ask { extra: 3 }
    );
    let answer = book.after(&third, 3, t0, allowed(5_045, 900), &mut returns);
    assert_eq!(remaining(answer), 5_048);
    // Each request spent from the lease is answered one less, as if every
    // one had gone to the store: the top-up asked for at the second is
    // not yet charged, and the grant's answer counts it as left in Redis.
    let e = ask(&p, &a, 1, t0);
    assert_eq!(spend(&book, &e, t0 + MS).0.remaining, 5_047);
    let (d, top, _) = spend(&book, &e, t0 + MS);
    assert_eq!(d.remaining, 5_046);
    let top = top.expect("a top-up");
    assert_eq!(spend(&book, &e, t0 + MS).0.remaining, 5_045);
    // It lands, charged after those three: 5_045 less its units.
    let left = 5_045 - u64::from(top.units);
    book.topped(
        &top,
        EvaluationId::fresh(),
        t0 + MS,
        allowed(left, 899),
        &mut returns,
    );
    assert!(returns.is_empty());
    assert_eq!(spend(&book, &e, t0 + MS * 2).0.remaining, 5_044);
}

#[test]
fn a_refused_request_gives_its_unit_back_to_the_lease_it_was_spent_from_only() {
    let book = Leases::new(64).without_door();
    let p = window(10_000, terms(250, 50));
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    // A lease of 2 in a window that ends 100 ms on: one unit spent by a
    // request another limit then refuses, the refusal coming back while
    // the lease is still held: the unit is the lease's again.
    assert_eq!(granted(&book, &p, &a, t0, 5_000, 100), 2);
    let e = ask(&p, &a, 1, t0);
    let (.., paid) = spend(&book, &e, t0 + MS);
    assert_eq!(book.held(), 1);
    book.unspend(&e, paid);
    assert_eq!(book.held(), 2);

    // Spent again, and the refusal comes back late: the lease ended with
    // its window meanwhile (giving back the one unit not spent) and the
    // next window's grant is held now. The spent unit was charged in the
    // window that ended; the new lease's window never counted it.
    let (.., paid) = spend(&book, &e, t0 + MS * 2);
    let ended = book.ended(t0 + MS * 100);
    assert_eq!(ended.iter().map(|r| r.units).sum::<u32>(), 1);
    let next = ask(&p, &a, 1, t0 + MS * 101);
    let Before::Ask { extra } = book.before(&next, t0 + MS * 101, &mut returns, false) else {
        panic!("spent from an ended lease")
    };
    assert!(extra > 0);
    book.after(
        &next,
        extra,
        t0 + MS * 101,
        allowed(9_000, 999),
        &mut returns,
    );
    assert_eq!(book.held(), u64::from(extra));
    book.unspend(&e, paid);
    assert_eq!(book.held(), u64::from(extra), "the next window's lease");
    assert!(returns.is_empty());
}

#[test]
fn a_lease_joined_by_its_top_up_takes_back_a_unit_spent_before() {
    let book = Leases::new(64).without_door();
    let p = window(10_000, terms(250, 50));
    let a = subject("a");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    granted(&book, &p, &a, t0, 5_000, 900);
    let e = ask(&p, &a, 1, t0);
    spend(&book, &e, t0 + MS);
    let (_, top, paid) = spend(&book, &e, t0 + MS);
    // The top-up lands in the same window: one lease still, so the unit
    // spent before it goes back into it.
    let top = top.expect("a top-up");
    let id = EvaluationId::fresh();
    book.topped(&top, id, t0 + MS * 2, allowed(4_990, 898), &mut returns);
    assert_eq!(book.held(), u64::from(top.units));
    book.unspend(&e, paid);
    assert_eq!(book.held(), u64::from(top.units) + 1);
    assert!(returns.is_empty());
}

#[test]
fn the_upkeep_rests_while_no_subject_is_followed_and_a_followed_one_wakes_it() {
    let book = Leases::new(64).without_door();
    let wake = book.waker();
    assert!(book.rest(), "an empty book: nothing can end");
    assert!(!crate::sync::notified(&wake));
    let policy = bucket(1000, terms(1000, 10));
    let who = subject("192.0.2.1");
    let t0 = Instant::now();
    let mut returns = Vec::new();
    book.before(&ask(&policy, &who, 1, t0), t0, &mut returns, false);
    assert!(
        crate::sync::notified(&wake),
        "the first subject followed wakes the upkeep"
    );
    assert!(!book.rest(), "a subject is followed");
    // Another subject while the upkeep is up: no wake is needed.
    let other = subject("192.0.2.2");
    book.before(&ask(&policy, &other, 1, t0), t0, &mut returns, false);
    assert!(!crate::sync::notified(&wake));
    // Both gone quiet (twice their ttl) and dropped: the upkeep rests.
    assert!(book.ended(t0 + Duration::from_secs(3)).is_empty());
    assert!(book.rest());
    book.before(&ask(&policy, &other, 1, t0), t0, &mut returns, false);
    assert!(
        crate::sync::notified(&wake),
        "followed again after the rest"
    );
}

#[test]
fn a_book_dropped_wakes_its_resting_upkeep() {
    let book = Leases::new(64);
    let wake = book.waker();
    assert!(book.rest());
    drop(book);
    assert!(crate::sync::notified(&wake));
}
