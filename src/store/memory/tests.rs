use std::num::NonZeroU32;

use super::*;
use crate::limit::{Bands, Policy, WindowBand};
use crate::store::EvaluationId;
use crate::subject::{Pseudonym, PseudonymKey};

const SECOND: Micros = 1_000_000;

fn policy(name: &str, revision: &str, limit: u32) -> Policy {
    Policy::new(
        name,
        revision,
        Bands::FixedWindow(vec![WindowBand {
            limit: NonZeroU32::new(limit).unwrap(),
            window: Duration::from_secs(60),
        }]),
        false,
    )
}

fn subject(n: u32) -> Pseudonym {
    PseudonymKey::new(b"k", 1).pseudonym("ip", &n.to_be_bytes(), "r")
}

/// One unit of `policy` for `subject`.
fn unit<'a>(policy: &'a Policy, subject: &'a Pseudonym) -> Evaluation<'a> {
    Evaluation {
        policy,
        subject,
        cost: 1,
        deadline: tokio::time::Instant::now(),
        id: EvaluationId(0),
        settle_within: None,
    }
}

fn ask(store: &MemoryStore, policy: &Policy, subject: &Pseudonym, now: Micros) -> Outcome {
    store.evaluate_at(&unit(policy, subject), now)
}

fn allowed(outcome: Outcome) -> bool {
    matches!(outcome, Outcome::Allowed(_))
}

#[test]
fn policy_and_revision_keep_counters_apart() {
    let store = MemoryStore::new(100, Duration::ZERO);
    let now = 3_600 * SECOND;
    let (r1, r2, other) = (
        policy("p", "r1", 1),
        policy("p", "r2", 1),
        policy("q", "r1", 1),
    );
    let s = subject(1);
    assert!(allowed(ask(&store, &r1, &s, now)));
    assert!(!allowed(ask(&store, &r1, &s, now)));
    // Same subject and hash, another revision or policy: fresh counters.
    assert!(allowed(ask(&store, &r2, &s, now)));
    assert!(allowed(ask(&store, &other, &s, now)));
    assert!(!allowed(ask(&store, &r1, &s, now)));
    assert_eq!(store.len(), 3);
    assert!(allowed(ask(&store, &r1, &subject(2), now)));
}

/// Whether the store still holds `subject`'s entry for `policy`.
fn holds(store: &MemoryStore, policy: &Policy, subject: &Pseudonym) -> bool {
    let key = store.key(&unit(policy, subject));
    store.lock(store.shard_of(key.hash)).contains_key(&key)
}

#[test]
fn a_full_store_evicts_what_costs_least_to_forget() {
    let store = MemoryStore::new(3, Duration::ZERO);
    let p = policy("p", "r1", 3);
    let now = 3_600 * SECOND;
    let (frequent, once, refused) = (subject(1), subject(2), subject(3));
    for _ in 0..2 {
        assert!(allowed(ask(&store, &p, &frequent, now)));
    }
    assert!(allowed(ask(&store, &p, &once, now)));
    for _ in 0..3 {
        assert!(allowed(ask(&store, &p, &refused, now)));
    }
    assert!(!allowed(ask(&store, &p, &refused, now)));

    // The newcomer is admitted; the entry that admitted least goes.
    assert!(allowed(ask(&store, &p, &subject(4), now)));
    assert_eq!(store.len(), 3);
    assert_eq!(store.evictions(), 1);
    assert!(!holds(&store, &p, &once));
    assert!(holds(&store, &p, &frequent) && holds(&store, &p, &refused));
    // Still refused: its entry was kept.
    assert!(!allowed(ask(&store, &p, &refused, now)));

    // Of equals, the one to expire soonest (the oldest) goes.
    assert!(allowed(ask(&store, &p, &subject(5), now + SECOND)));
    assert!(!holds(&store, &p, &subject(4)) && holds(&store, &p, &frequent));
    // An expired entry goes before any live one.
    let q = Policy::new(
        "q",
        "r1",
        Bands::FixedWindow(vec![WindowBand {
            limit: NonZeroU32::new(9).unwrap(),
            window: Duration::from_secs(1),
        }]),
        false,
    );
    let store = MemoryStore::new(2, Duration::ZERO);
    assert!(allowed(ask(&store, &p, &subject(1), now)));
    assert!(allowed(ask(&store, &q, &subject(2), now)));
    assert!(allowed(ask(&store, &p, &subject(3), now + 5 * SECOND)));
    assert!(holds(&store, &p, &subject(1)) && !holds(&store, &q, &subject(2)));
}

#[test]
fn when_every_entry_is_refusing_the_refusal_that_ends_soonest_goes() {
    let store = MemoryStore::new(2, Duration::ZERO);
    let p = policy("p", "r1", 1);
    let now = 3_600 * SECOND + 30 * SECOND;
    let (early, late) = (subject(1), subject(2));
    // Refused until 3,640 s (a 10 s window) and 3,660 s (a minute).
    let short = Policy::new(
        "short",
        "r1",
        Bands::FixedWindow(vec![WindowBand {
            limit: NonZeroU32::new(1).unwrap(),
            window: Duration::from_secs(10),
        }]),
        false,
    );
    assert!(allowed(ask(&store, &short, &early, now)));
    assert!(!allowed(ask(&store, &short, &early, now)));
    assert!(allowed(ask(&store, &p, &late, now)));
    assert!(!allowed(ask(&store, &p, &late, now)));
    // A flood of subjects pushed over their limit cannot pin the store.
    assert!(allowed(ask(&store, &p, &subject(3), now)));
    assert!(!holds(&store, &short, &early));
    assert!(holds(&store, &p, &late));
}

#[test]
fn a_flood_of_one_request_subjects_evicts_its_own_kind() {
    let store = MemoryStore::new(2_000, Duration::ZERO);
    let p = policy("p", "r1", 3);
    let now = 3_600 * SECOND;
    let known: Vec<Pseudonym> = (0..20).map(subject).collect();
    for s in &known {
        for _ in 0..3 {
            assert!(allowed(ask(&store, &p, s, now)));
        }
    }
    for n in 1_000..30_000 {
        assert!(allowed(ask(&store, &p, &subject(n), now)), "newcomer {n}");
    }
    assert!(store.len() <= 2_000 + store.shards.len());
    assert!(store.evictions() >= 27_000, "{}", store.evictions());
    for s in &known {
        // Spent before the flood, still spent after it.
        assert!(!allowed(ask(&store, &p, s, now)));
    }
}

/// `n` requests of `cost` for `subject` under `policy`, each admitted.
fn spend(
    store: &MemoryStore,
    policy: &Policy,
    subject: &Pseudonym,
    n: u32,
    cost: u32,
    now: Micros,
) {
    for _ in 0..n {
        let evaluation = Evaluation {
            cost,
            ..unit(policy, subject)
        };
        assert!(allowed(store.evaluate_at(&evaluation, now)));
    }
}

#[test]
fn a_spent_subject_never_refused_outlives_a_flood_of_costly_requests() {
    let store = MemoryStore::new(3, Duration::ZERO);
    let now = 3_600 * SECOND;
    let (small, costly) = (policy("small", "r", 5), policy("costly", "r", 100));
    let spent = subject(1);
    spend(&store, &small, &spent, 5, 1, now);
    // One request each of cost 50 on another route sharing the store:
    // more units than the spent subject ever had, half of their own limit.
    for n in 1_000..1_100 {
        spend(&store, &costly, &subject(n), 1, 50, now + SECOND);
    }
    assert_eq!(store.evictions(), 98);
    assert!(holds(&store, &small, &spent));
    assert!(!allowed(ask(&store, &small, &spent, now + 2 * SECOND)));
}

#[test]
fn entries_are_ranked_by_the_share_of_their_own_limit() {
    let store = MemoryStore::new(2, Duration::ZERO);
    let now = 3_600 * SECOND;
    let (small, large) = (policy("small", "r", 10), policy("large", "r", 1_000));
    let (half, twentieth) = (subject(1), subject(2));
    // Half of 10, then a twentieth of 1,000 (ten times the units).
    spend(&store, &small, &half, 5, 1, now);
    spend(&store, &large, &twentieth, 1, 50, now + SECOND);
    assert!(allowed(ask(&store, &large, &subject(3), now + 2 * SECOND)));
    assert!(holds(&store, &small, &half));
    assert!(!holds(&store, &large, &twentieth));
}

#[test]
fn of_refusals_ending_at_one_edge_the_one_refusing_longest_is_kept() {
    let store = MemoryStore::new(4, Duration::ZERO);
    let p = policy("p", "r", 1);
    // Every refusal below ends at the window's edge, 3,660 s.
    let start = 3_600 * SECOND;
    let longest = subject(1);
    spend(&store, &p, &longest, 1, 1, start);
    assert!(!allowed(ask(&store, &p, &longest, start)));
    // A flood of subjects each pushed over its limit, later in the window.
    for n in 1_000..1_200u32 {
        let at = start + SECOND + Micros::from(n);
        spend(&store, &p, &subject(n), 1, 1, at);
        assert!(!allowed(ask(&store, &p, &subject(n), at)));
    }
    assert!(store.evictions() >= 190, "{}", store.evictions());
    assert!(holds(&store, &p, &longest));
    assert!(!allowed(ask(&store, &p, &longest, start + 50 * SECOND)));
}

fn together(store: &MemoryStore, limits: &[(&Policy, &Pseudonym)], now: Micros) -> Vec<Outcome> {
    let evaluations: Vec<Evaluation<'_>> = limits
        .iter()
        .map(|(policy, subject)| Evaluation {
            policy,
            subject,
            cost: 1,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(0),
            settle_within: None,
        })
        .collect();
    let outcomes = store.evaluate_all_at(&evaluations, now);
    assert_eq!(outcomes.first, 0);
    outcomes.list.to_vec()
}

#[test]
fn several_limits_pass_together_or_charge_nothing() {
    let store = MemoryStore::new(100, Duration::ZERO);
    let now = 3_600 * SECOND;
    let (per_client, global) = (policy("per-client", "r", 5), policy("global", "r", 2));
    let everyone = subject(0);
    let (a, b, c) = (subject(1), subject(2), subject(3));
    for client in [&a, &b] {
        let outcomes = together(&store, &[(&per_client, client), (&global, &everyone)], now);
        assert!(outcomes.iter().all(|o| allowed(*o)), "{outcomes:?}");
    }
    // The global limit is spent: c is denied by it, and its own
    // per-client limit is not charged.
    let outcomes = together(&store, &[(&per_client, &c), (&global, &everyone)], now);
    assert_eq!(outcomes.len(), 2);
    assert!(
        allowed(outcomes[0]) && !allowed(outcomes[1]),
        "{outcomes:?}"
    );
    for _ in 0..5 {
        assert!(
            allowed(ask(&store, &per_client, &c, now)),
            "c's quota is whole"
        );
    }
    assert!(!allowed(ask(&store, &per_client, &c, now)));
    // The first limit denying stops there: the second is not asked.
    let outcomes = together(&store, &[(&per_client, &c), (&global, &everyone)], now);
    assert_eq!(outcomes.len(), 1);
}

#[test]
fn an_entry_made_for_a_refused_request_is_taken_back() {
    let store = MemoryStore::new(100, Duration::ZERO);
    let now = 3_600 * SECOND;
    let (fresh, spent) = (policy("fresh", "r", 5), policy("spent", "r", 1));
    let s = subject(1);
    assert!(allowed(ask(&store, &spent, &s, now)));
    assert_eq!(store.len(), 1);
    let outcomes = together(&store, &[(&fresh, &s), (&spent, &s)], now);
    assert!(!allowed(outcomes[1]));
    assert_eq!(store.len(), 1, "the new subject's entry was removed again");
    // A full store never makes room for one of a request's subjects
    // by evicting another of them: it goes beyond its bound instead.
    let full = MemoryStore::new(1, Duration::ZERO);
    let outcomes = together(&full, &[(&fresh, &s), (&spent, &subject(2))], now);
    assert!(outcomes.iter().all(|o| allowed(*o)), "{outcomes:?}");
    assert_eq!((full.len(), full.evictions()), (2, 0));
    assert!(allowed(ask(&full, &fresh, &subject(3), now)));
    assert_eq!((full.len(), full.evictions()), (2, 1));
}

#[test]
fn a_shadow_denial_blocks_nothing() {
    let store = MemoryStore::new(100, Duration::ZERO);
    let now = 3_600 * SECOND;
    let real = policy("real", "r", 5);
    let shadow = Policy::new(
        "shadow",
        "r",
        Bands::FixedWindow(vec![WindowBand {
            limit: NonZeroU32::new(1).unwrap(),
            window: Duration::from_secs(60),
        }]),
        true,
    );
    let s = subject(1);
    assert!(allowed(ask(&store, &shadow, &s, now)));
    let outcomes = together(&store, &[(&shadow, &s), (&real, &s)], now);
    assert!(
        !allowed(outcomes[0]) && allowed(outcomes[1]),
        "{outcomes:?}"
    );
    for _ in 0..4 {
        assert!(allowed(ask(&store, &real, &s, now)));
    }
    assert!(
        !allowed(ask(&store, &real, &s, now)),
        "the real limit was charged"
    );
}

fn peek(store: &MemoryStore, policy: &Policy, subject: &Pseudonym, now: Micros) -> Outcome {
    store.peek_at(&unit(policy, subject), now)
}

#[test]
fn peeking_charges_nothing_and_stores_nothing() {
    let store = MemoryStore::new(2, Duration::ZERO);
    let p = policy("p", "r1", 3);
    let now = 3_600 * SECOND;
    let s = subject(1);
    // A subject never seen: a full quota, and no entry made for it.
    let Outcome::Allowed(fresh) = peek(&store, &p, &s, now) else {
        panic!("a fresh subject is admitted");
    };
    assert_eq!(fresh.remaining, 2);
    assert_eq!(store.len(), 0);
    assert!(allowed(ask(&store, &p, &s, now)));
    for _ in 0..3 {
        let Outcome::Allowed(d) = peek(&store, &p, &s, now + SECOND) else {
            panic!("two are left");
        };
        assert_eq!(d.remaining, 1, "what one more would leave");
    }
    assert!(allowed(ask(&store, &p, &s, now)));
    assert!(allowed(ask(&store, &p, &s, now)));
    assert!(matches!(peek(&store, &p, &s, now), Outcome::Denied(_)));
    assert!(!allowed(ask(&store, &p, &s, now)));
    // Past the entry's expiry it reads as fresh, and stays expired.
    let later = now + 61 * SECOND;
    assert!(allowed(peek(&store, &p, &s, later)));
    assert_eq!(store.sweep_at(later), 1);
}

#[test]
fn peeking_a_newcomer_at_a_full_store_says_it_would_be_admitted_and_evicts_nothing() {
    let store = MemoryStore::new(1, Duration::ZERO);
    let p = policy("p", "r1", 3);
    let now = 3_600 * SECOND;
    assert!(allowed(ask(&store, &p, &subject(1), now)));
    assert!(allowed(peek(&store, &p, &subject(2), now)));
    assert!(allowed(peek(&store, &p, &subject(1), now)));
    assert_eq!((store.len(), store.evictions()), (1, 0));
}

#[test]
fn subjects_spread_over_every_shard() {
    let store = MemoryStore::new(100_000, Duration::ZERO);
    let p = policy("p", "r1", 10);
    for n in 0..4_096 {
        assert!(allowed(ask(&store, &p, &subject(n), SECOND)));
    }
    let sizes: Vec<usize> = store.shards.iter().map(|s| sync::lock(s).len()).collect();
    assert_eq!(sizes.iter().sum::<usize>(), 4_096);
    // 64 expected per shard; a shard under a quarter of that would mean
    // the shard index is not drawn from the hash's spread bits.
    assert!(sizes.iter().all(|&n| n >= 16), "{sizes:?}");
}
