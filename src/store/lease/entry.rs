//! One subject of one policy in the book: how often it came, what the
//! store last said was left, the ask under way and the lease held; and how
//! large a block to ask for.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::held::Held;
use super::TopUp;
use crate::limit::LeaseTerms;
use crate::store::shards::Map;
use crate::store::Evaluation;

pub(super) struct Entry {
    /// The policy's numbers when the entry was made: a reload that changes
    /// them keeps the revision (and the counts) but not this entry.
    pub(super) numbers: u64,
    /// The period under way started at `since` and lasts one `ttl`; `seen`
    /// requests came in it, `before` in the one before.
    pub(super) since: Instant,
    pub(super) ttl: Duration,
    pub(super) seen: u32,
    pub(super) before: u32,
    /// What the store said was left at its last answer.
    pub(super) left_in_store: Option<u64>,
    /// A request is asking the store for a lease since then: the others
    /// meanwhile ask for none (no herd of grants, each soon given back).
    pub(super) asking: Option<Instant>,
    /// Units of that ask (a grant's extra, or a top-up), and units of
    /// leases on their way back to the store: the subject's, though Redis
    /// does not count them so yet. An answer from Redis adds them; the
    /// answer from a lease adds only those on their way back (its grant's
    /// answer came before the ask, and counts its units as left there).
    pub(super) in_flight: u32,
    pub(super) returning: u32,
    /// Told when that ask is answered, to the requests that found the
    /// lease spent and wait for it (made on first use).
    pub(super) answered: Option<watch::Sender<()>>,
    pub(super) held: Option<Held>,
}

impl Entry {
    /// One more request at `now`, in periods of the lease's `ttl`.
    pub(super) fn count(&mut self, now: Instant) {
        let ttl = self.ttl;
        let elapsed = now.saturating_duration_since(self.since);
        if elapsed >= ttl {
            self.before = if elapsed < ttl * 2 { self.seen } else { 0 };
            self.seen = 0;
            self.since = now;
        }
        self.seen = self.seen.saturating_add(1);
    }

    /// The ask under way is answered: another request may ask, and the
    /// ones waiting for it look again.
    pub(super) fn done_asking(&mut self) {
        self.asking = None;
        self.in_flight = 0;
        if let Some(answered) = &self.answered {
            answered.send_replace(());
        }
    }

    /// A top-up of the lease held, after a request spent from it (see
    /// [`Before::Spent`]).
    pub(super) fn top_up(
        &mut self,
        evaluation: &Evaluation<'_>,
        terms: LeaseTerms,
        now: Instant,
    ) -> Option<Box<TopUp>> {
        let held = self.held.as_ref()?;
        let asking = self.asking.is_some_and(|since| now < since + terms.ttl);
        if asking || held.left.saturating_mul(2) >= held.size {
            return None;
        }
        // A block as a grant would take, beside the request's own cost.
        let units = extra(
            terms,
            self.seen.max(self.before),
            evaluation.cost,
            self.left_in_store,
            evaluation.policy.max_cost(),
        );
        if units == 0 {
            return None;
        }
        self.asking = Some(now);
        self.in_flight = units;
        Some(Box::new(TopUp {
            policy: Arc::clone(&held.policy),
            subject: *evaluation.subject,
            units,
        }))
    }

    /// No request for two periods, as far as `count` looks back: nothing
    /// here is worth keeping.
    pub(super) fn quiet(&self, now: Instant) -> bool {
        now.saturating_duration_since(self.since) >= self.ttl * 2
    }
}

/// Drops the subjects of `shard` gone quiet and holding nothing; whether
/// there is room now.
pub(super) fn make_room(shard: &mut Map<Entry>, now: Instant) -> bool {
    let before = shard.len();
    shard.retain(|_, e| e.held.is_some() || !e.quiet(now));
    shard.len() < before
}

/// How many units to ask for beyond a request's `cost`: what this sidecar
/// would spend in one `ttl` at the subject's rate here (`rate` requests of
/// about this cost), never more than `max_share` of what the store last
/// said was left (so near the limit every request is decided by the store,
/// exact to the last unit), never past the policy's largest cost, and
/// nothing for a subject seen once in a period.
pub fn extra(
    terms: LeaseTerms,
    rate: u32,
    cost: u32,
    left_in_store: Option<u64>,
    max_cost: u32,
) -> u32 {
    if rate < 2 {
        return 0;
    }
    let Some(left) = left_in_store else { return 0 };
    let want = u64::from(rate) * u64::from(cost);
    let share = left * u64::from(terms.max_share) / 100;
    let room = u64::from(max_cost.saturating_sub(cost));
    // At most `room`, itself a u32.
    want.min(share).min(room) as u32
}
