//! Leases: a sidecar that sees a subject often takes a block of its quota
//! in the same call that decides a request, and spends it here, without a
//! store call, until it is spent or its `ttl` ends; what is left then goes
//! back to the store (docs/REDIS.md, "Leases").
//!
//! A lease is a charge of `cost + extra` units instead of `cost`, made by
//! the policy's own script: the store's count is charged before a leased
//! unit is spent, so no request is admitted that the store did not count.
//! What leases cost is early refusals elsewhere: units held here are spent
//! by nobody else until they are spent or given back. The giving back is
//! the policy's refund script, run with the grant's evaluation id and the
//! units left: it gives back at most once, and only if the grant's record
//! (which lives `store.dedupe_window`, at least twice the lease) says it
//! was admitted.
//!
//! This book holds, per policy and subject: how often the subject came
//! (requests in the current `ttl` and in the one before), what the store
//! last said was left, and the lease held, if any. It never calls the
//! store: the Redis store asks it before a call ([`Leases::before`]),
//! tells it the answer ([`Leases::after`]) and gives back what it hands
//! out ([`Return`]). Bounded in subjects: a subject that finds its shard
//! full is simply not followed, and so decided one call per request.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use super::shards::{Shards, SubjectKey};
use super::{Evaluation, EvaluationId};
use crate::limit::{Algorithm, Decision, LeaseTerms, Outcome, Policy};
use crate::subject::Pseudonym;
use crate::telemetry::{LEASES_GRANTED, LEASE_ADMITTED, LEASE_UNITS_HELD};

mod doorkeeper;
mod entry;
mod held;

use doorkeeper::Doorkeeper;
pub use entry::extra;
use entry::{make_room, Entry};
pub use held::HeldView;
use held::{with_more, Held};

/// Subjects followed at once, per sidecar. An entry is about 200 bytes.
pub const FOLLOWED: usize = 65_536;

/// Unspent units of a lease, to give back to the store with the grant's
/// evaluation id.
pub struct Return {
    pub policy: Arc<Policy>,
    pub subject: Pseudonym,
    pub id: EvaluationId,
    pub units: u32,
}

impl Return {
    /// The refund of these units, as an evaluation of the grant's id.
    pub fn evaluation(&self, deadline: Instant) -> Evaluation<'_> {
        Evaluation {
            policy: &self.policy,
            subject: &self.subject,
            cost: self.units,
            deadline,
            id: self.id,
            settle_within: None,
        }
    }
}

impl PartialEq for Before {
    fn eq(&self, other: &Before) -> bool {
        match (self, other) {
            (Before::Wait(_), Before::Wait(_)) => true,
            (Before::Spent(a, x, s), Before::Spent(b, y, t)) => a == b && x == y && s == t,
            (Before::Ask { extra: a }, Before::Ask { extra: b }) => a == b,
            _ => false,
        }
    }
}

/// A block to add to a lease, asked for in the background.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopUp {
    pub policy: Arc<Policy>,
    pub subject: Pseudonym,
    pub units: u32,
}

/// Which lease a request was spent from: [`Leases::unspend`] gives its
/// units back to that lease only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spend {
    generation: u64,
}

/// What to do with one evaluation before the store is asked.
#[derive(Debug, Clone)]
pub enum Before {
    /// The lease held is spent and a grant for it is on its way: wait
    /// for it (within the request's deadline), then ask again.
    Wait(watch::Receiver<()>),
    /// Admitted from the lease held: no store call; and a top-up to ask
    /// for in the background, when the lease is spent below half of what
    /// its last grant brought and no one is asking already, so a hot
    /// subject's requests keep being paid while the grant is on its way
    /// (instead of each going to the store until it lands). The
    /// [`Spend`] gives the unit back, should another limit refuse.
    Spent(Decision, Option<Box<TopUp>>, Spend),
    /// Ask the store, for `extra` units more than the request's cost (0:
    /// no lease).
    Ask { extra: u32 },
}

pub struct Leases {
    shards: Shards<Entry>,
    /// `None` in the book's own tests, which follow every subject at once.
    door: Option<Doorkeeper>,
    per_shard: usize,
    /// The last lease's [`Held::generation`].
    generations: AtomicU64,
    /// Some subject may be followed: the upkeep ([`Leases::ended`], every
    /// 50 ms) has work. Cleared as it finds the book empty and rests.
    followed: AtomicBool,
    /// Wakes the resting upkeep: a subject followed again.
    wake: crate::sync::Rouse,
    granted: metrics::Counter,
    admitted: metrics::Counter,
    held: metrics::Gauge,
}

impl Default for Leases {
    fn default() -> Leases {
        Leases::new(FOLLOWED)
    }
}

impl Leases {
    /// Following at most `subjects` subjects (at least one per shard).
    pub fn new(subjects: usize) -> Leases {
        Leases {
            shards: Shards::default(),
            door: Some(Doorkeeper::default()),
            per_shard: subjects.div_ceil(super::shards::SHARDS).max(1),
            generations: AtomicU64::new(0),
            followed: AtomicBool::new(false),
            wake: crate::sync::Rouse::default(),
            granted: metrics::counter!(LEASES_GRANTED),
            admitted: metrics::counter!(LEASE_ADMITTED),
            held: metrics::gauge!(LEASE_UNITS_HELD),
        }
    }

    /// Following every subject from its first request.
    #[cfg(test)]
    pub fn without_door(mut self) -> Leases {
        self.door = None;
        self
    }

    /// Spends `evaluation` from its lease, or says how much to ask the
    /// store for. A lease that cannot pay (spent short of the cost,
    /// ended, or of other numbers) goes to `returns` with what is left.
    pub fn before(
        &self,
        evaluation: &Evaluation<'_>,
        now: Instant,
        returns: &mut Vec<Return>,
        may_wait: bool,
    ) -> Before {
        let policy = evaluation.policy;
        let Some(terms) = leased(policy) else {
            return Before::Ask { extra: 0 };
        };
        let key = SubjectKey::new(policy, evaluation.subject);
        let mut shard = self.shards.lock(&key);
        let entry = match shard.get_mut(&key) {
            Some(entry) if entry.numbers == policy.numbers() => entry,
            _ => {
                if let Some(old) = shard.remove(&key) {
                    self.give_up(old.held, &key, returns);
                }
                // Followed from its second request within a `ttl`: that
                // one counts, beside this.
                let ttl_ms = u32::try_from(terms.ttl.as_millis()).unwrap_or(u32::MAX);
                let door = self.door.as_ref();
                if door.is_some_and(|d| !d.seen_lately(evaluation.subject, now, ttl_ms)) {
                    return Before::Ask { extra: 0 };
                }
                if shard.len() >= self.per_shard && !make_room(&mut shard, now) {
                    return Before::Ask { extra: 0 };
                }
                // Under the shard's lock: an upkeep that found the book
                // empty before this either sees the entry or cleared the
                // flag this reads.
                if !self.followed.load(Ordering::Acquire) {
                    self.followed.store(true, Ordering::Release);
                    self.wake.rouse();
                }
                shard.entry(key.clone()).or_insert(Entry {
                    numbers: policy.numbers(),
                    since: now,
                    ttl: terms.ttl,
                    // The request seen at the door.
                    seen: u32::from(door.is_some()),
                    before: 0,
                    left_in_store: None,
                    asking: None,
                    in_flight: 0,
                    returning: 0,
                    answered: None,
                    held: None,
                })
            }
        };
        entry.ttl = terms.ttl;
        entry.count(now);
        if let Some(held) = &mut entry.held {
            if held.until > now && held.left >= evaluation.cost {
                held.left -= evaluation.cost;
                // Not the units of an ask on its way: it was sent after
                // this lease's grant, whose answer counts them as the
                // store's still.
                let decision = held.decision(now, entry.returning);
                let spend = Spend {
                    generation: held.generation,
                };
                let top_up = entry.top_up(evaluation, terms, now);
                drop(shard);
                self.held.decrement(f64::from(evaluation.cost));
                return Before::Spent(decision, top_up, spend);
            }
        }
        let asking = entry.asking.is_some_and(|since| now < since + terms.ttl);
        let lasting = entry.held.as_ref().is_some_and(|h| h.until > now);
        if asking && lasting && may_wait {
            let answered = entry.answered.get_or_insert_with(|| watch::channel(()).0);
            return Before::Wait(answered.subscribe());
        }
        let held = entry.held.take();
        let extra = if asking {
            0
        } else {
            extra(
                terms,
                entry.seen.max(entry.before),
                evaluation.cost,
                entry.left_in_store,
                policy.max_cost(),
            )
        };
        if extra > 0 {
            entry.asking = Some(now);
            entry.in_flight = extra;
        }
        entry.returning += self.give_up(held, &key, returns);
        Before::Ask { extra }
    }

    /// The store's answer to `top`, asked under `id` at `sent_at`: its
    /// units join the lease held (which then lasts from this grant), or
    /// become one. A fixed window's top-up counted in another window than
    /// the lease's goes back: its units could be spent in the wrong one.
    pub fn topped(
        &self,
        top: &TopUp,
        id: EvaluationId,
        sent_at: Instant,
        outcome: Outcome,
        returns: &mut Vec<Return>,
    ) {
        let policy = &top.policy;
        let key = SubjectKey::new(policy, &top.subject);
        let mut shard = self.shards.lock(&key);
        let back = Return {
            policy: Arc::clone(policy),
            subject: top.subject,
            id,
            units: top.units,
        };
        let Some(entry) = shard.get_mut(&key) else {
            if let Outcome::Allowed(_) = outcome {
                returns.push(back);
            }
            return;
        };
        entry.done_asking();
        let decision = match outcome {
            Outcome::Allowed(decision) => decision,
            Outcome::Denied(decision) => {
                entry.left_in_store = Some(decision.remaining);
                return;
            }
            Outcome::Unavailable(_) | Outcome::Indeterminate | Outcome::Incompatible(_) => return,
        };
        entry.left_in_store = Some(decision.remaining);
        let Some(terms) = policy.lease else {
            returns.push(back);
            return;
        };
        let lasts = policy
            .lease_window_left(decision.reset_after)
            .map_or(terms.ttl, |left| terms.ttl.min(left));
        let window_ends = sent_at + decision.reset_after;
        let joins = match &entry.held {
            None => true,
            Some(_) if entry.numbers != policy.numbers() => false,
            Some(held) => match policy.algorithm() {
                // The same window if it ends when the lease's does, give
                // or take the time a call takes (a window is 1 ms at least).
                Algorithm::FixedWindow | Algorithm::SlidingCounter => {
                    let ours = held.sent_at + held.granted.reset_after;
                    let apart = if ours > window_ends {
                        ours - window_ends
                    } else {
                        window_ends - ours
                    };
                    apart < decision.reset_after.min(held.granted.reset_after) / 2
                        || apart < Duration::from_micros(500)
                }
                _ => true,
            },
        };
        if !joins {
            entry.returning += back.units;
            returns.push(back);
            return;
        }
        let left = entry.held.as_ref().map_or(0, |h| h.left) + top.units;
        // Joined, a lease stays the one its spent units came from.
        let generation = match &entry.held {
            Some(held) => held.generation,
            None => self.generation(),
        };
        entry.held = Some(Held {
            policy: Arc::clone(policy),
            id,
            generation,
            left,
            size: top.units,
            until: sent_at + lasts,
            sent_at,
            granted: decision,
        });
        self.granted.increment(1);
        self.held.increment(f64::from(top.units));
    }

    /// `back` reached the store (or was given up on): its units no longer
    /// count as on their way.
    pub fn returned(&self, back: &Return) {
        let key = SubjectKey::new(&back.policy, &back.subject);
        if let Some(entry) = self.shards.lock(&key).get_mut(&key) {
            entry.returning = entry.returning.saturating_sub(back.units);
        }
    }

    /// A request admitted from leases (every one of its limits spent from
    /// one), counted once.
    pub fn admitted(&self) {
        self.admitted.increment(1);
    }

    /// `evaluation` asked for no lease after all, or its answer granted
    /// none: another request may ask.
    pub fn asked(&self, evaluation: &Evaluation<'_>) {
        let key = SubjectKey::new(evaluation.policy, evaluation.subject);
        if let Some(entry) = self.shards.lock(&key).get_mut(&key) {
            entry.done_asking();
        }
    }

    /// Gives `cost` back to the lease `evaluation` was spent from (`spend`
    /// says which; the request having been refused by another of its
    /// limits), if it is still held. Not to another lease: a lease that
    /// ended gave back what was left of it without this unit, which the
    /// store counts as charged in its grant's window; spent from the next
    /// lease, perhaps in the next window, it would be one admission that
    /// window never counted. Dropped instead, it is one unit held back
    /// until its window ends: an early refusal at most.
    pub fn unspend(&self, evaluation: &Evaluation<'_>, spend: Spend) {
        let key = SubjectKey::new(evaluation.policy, evaluation.subject);
        let mut shard = self.shards.lock(&key);
        let held = shard.get_mut(&key).and_then(|e| e.held.as_mut());
        if let Some(held) = held.filter(|h| h.generation == spend.generation) {
            held.left += evaluation.cost;
            self.held.increment(f64::from(evaluation.cost));
        }
    }

    /// The store's answer to `evaluation` asked with `extra` more units,
    /// sent at `sent_at`: a lease of `extra` when admitted, and the answer
    /// for the request itself (its `remaining` counts the lease as the
    /// subject's, not spent). A denial is returned as it came: the caller
    /// asks again without `extra` when `extra` was the reason.
    pub fn after(
        &self,
        evaluation: &Evaluation<'_>,
        extra: u32,
        sent_at: Instant,
        outcome: Outcome,
        returns: &mut Vec<Return>,
    ) -> Outcome {
        let policy = evaluation.policy;
        let Some(terms) = leased(policy) else {
            return outcome;
        };
        let key = SubjectKey::new(policy, evaluation.subject);
        let mut shard = self.shards.lock(&key);
        let Some(entry) = shard.get_mut(&key) else {
            // No longer followed (made room for others): a lease charged
            // all the same goes straight back.
            if let (Outcome::Allowed(_), true) = (outcome, extra > 0) {
                returns.push(Return {
                    policy: Arc::new(policy.clone()),
                    subject: *evaluation.subject,
                    id: evaluation.id,
                    units: extra,
                });
            }
            return outcome;
        };
        if extra > 0 {
            entry.done_asking();
        }
        let decision = match outcome {
            Outcome::Allowed(decision) | Outcome::Denied(decision) => decision,
            Outcome::Unavailable(_) | Outcome::Indeterminate | Outcome::Incompatible(_) => {
                return outcome
            }
        };
        entry.left_in_store = Some(decision.remaining);
        if !decision.allowed || extra == 0 {
            // Redis does not count as the subject's what this sidecar
            // holds for it, nor units on their way: the answer does.
            let held = entry
                .held
                .as_ref()
                .filter(|h| h.until > sent_at)
                .map_or(0, |h| h.left);
            let more = held + entry.in_flight + entry.returning;
            return match outcome {
                Outcome::Allowed(d) => Outcome::Allowed(with_more(policy, d, more)),
                Outcome::Denied(d) => Outcome::Denied(Decision {
                    remaining: d.remaining + u64::from(more),
                    ..d
                }),
                other => other,
            };
        }
        // A window's units end with it: they are counted in it.
        let lasts = policy
            .lease_window_left(decision.reset_after)
            .map_or(terms.ttl, |left| terms.ttl.min(left));
        let held = Held {
            policy: Arc::new(policy.clone()),
            id: evaluation.id,
            generation: self.generation(),
            left: extra,
            size: extra,
            until: sent_at + lasts,
            sent_at,
            granted: decision,
        };
        let old = entry.held.replace(held);
        self.granted.increment(1);
        self.held.increment(f64::from(extra));
        entry.returning += self.give_up(old, &key, returns);
        let more = entry.in_flight + entry.returning;
        let answer = entry.held.as_ref().map(|h| h.decision(sent_at, more));
        Outcome::Allowed(answer.unwrap_or(decision))
    }

    /// Every lease ended by `now`, and the followed subjects gone quiet.
    pub fn ended(&self, now: Instant) -> Vec<Return> {
        let mut returns = Vec::new();
        for mut shard in self.shards.each() {
            let mut ended = Vec::new();
            shard.retain(|key, entry| {
                if entry.held.as_ref().is_some_and(|h| h.until <= now) {
                    let held = entry.held.take();
                    entry.returning += held.as_ref().map_or(0, |h| h.left);
                    ended.push((key.clone(), held));
                }
                entry.held.is_some() || !entry.quiet(now)
            });
            for (key, held) in ended {
                self.give_up(held, &key, &mut returns);
            }
        }
        returns
    }

    /// Whether the upkeep may rest: no subject is followed, so no lease
    /// can end. Clears [`Leases::followed`] first, then looks at every
    /// shard under its lock: a subject followed meanwhile is either seen
    /// here or sets the flag again and wakes the upkeep.
    pub fn rest(&self) -> bool {
        self.followed.store(false, Ordering::Release);
        if self.shards.each().all(|shard| shard.is_empty()) {
            return true;
        }
        self.followed.store(true, Ordering::Release);
        false
    }

    /// What wakes the resting upkeep.
    pub fn waker(&self) -> Arc<Notify> {
        self.wake.listener()
    }

    /// Every lease held, ended or not (a sidecar stopping).
    pub fn drain(&self) -> Vec<Return> {
        let mut returns = Vec::new();
        for mut shard in self.shards.each() {
            for (key, entry) in shard.iter_mut() {
                let held = entry.held.take();
                entry.returning += self.give_up(held, key, &mut returns);
            }
        }
        returns
    }

    /// Units held in leases now.
    pub fn held(&self) -> u64 {
        self.shards
            .each()
            .map(|s| {
                s.values()
                    .filter_map(|e| e.held.as_ref())
                    .map(|h| u64::from(h.left))
                    .sum::<u64>()
            })
            .sum()
    }

    /// The lease held for `evaluation`'s policy and subject, if it could
    /// pay for it at `now`: what it would answer, spending nothing, the
    /// units it holds and how long it lasts (for `POST /explain`).
    pub fn peek(&self, evaluation: &Evaluation<'_>, now: Instant) -> Option<HeldView> {
        leased(evaluation.policy)?;
        let key = SubjectKey::new(evaluation.policy, evaluation.subject);
        let shard = self.shards.lock(&key);
        let entry = shard.get(&key)?;
        let held = entry.held.as_ref()?;
        let pays = entry.numbers == evaluation.policy.numbers()
            && held.until > now
            && held.left >= evaluation.cost;
        pays.then(|| {
            let after = Held {
                left: held.left - evaluation.cost,
                ..held.clone()
            };
            HeldView {
                answer: after.decision(now, entry.returning),
                units: held.left,
                lasts: held.until.saturating_duration_since(now),
            }
        })
    }

    /// A number no lease had before.
    fn generation(&self) -> u64 {
        self.generations.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Hands what is left of `held` to `returns`; the units handed.
    fn give_up(&self, held: Option<Held>, key: &SubjectKey, returns: &mut Vec<Return>) -> u32 {
        let Some(held) = held else { return 0 };
        if held.left == 0 {
            return 0;
        }
        let units = held.left;
        self.held.decrement(f64::from(held.left));
        returns.push(Return {
            policy: held.policy,
            subject: key.subject,
            id: held.id,
            units: held.left,
        });
        units
    }
}

/// The policy's lease terms, when its requests may be leased: never for a
/// shadow policy (it only counts, and a denial of the larger charge would
/// be reported for a request that fits).
fn leased(policy: &Policy) -> Option<LeaseTerms> {
    if policy.shadow {
        return None;
    }
    policy.lease
}

#[cfg(test)]
mod tests;
