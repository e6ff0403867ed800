//! What the memory store keeps for one subject under one policy, and what
//! forgetting it would cost: the order a full store evicts in.
//!
//! Forgetting an entry hands its subject a full quota again, so what it
//! costs is what the subject has used of its own limit, and the most
//! costly to forget is an entry that refuses its subject (or has nothing
//! left to admit, which is the same thing one request later): erasing it
//! is exactly what a flood of new subjects would be after. Units are not
//! compared across policies: 5 units of a limit of 5 are a spent subject,
//! 50 of 1,000 are a twentieth of one.

use std::cmp::Reverse;

use crate::limit::algorithm::{self, State};
use crate::limit::{micros, Decision, Micros, Policy};

/// A share of a limit, in millionths.
const WHOLE: u64 = 1_000_000;

#[derive(Clone)]
pub(super) struct Entry {
    pub(super) state: State,
    pub(super) expires_at: Micros,
    /// The share of its own limit the subject had used after its last
    /// admitted request, in millionths of the binding band's quota (the
    /// band with the fewest units left).
    used: u32,
    /// While the entry refuses its subject, or has nothing left to admit:
    /// when that ends (the wait for one more unit, or for the refused
    /// cost). 0 when neither.
    refusing_until: Micros,
    /// How long before `refusing_until` the refusal began, in whole
    /// milliseconds (saturated past 49 days): a `u32` beside `used` keeps
    /// an entry at 64 bytes, the size the store's bound per subject was
    /// measured with.
    refusal_ms: u32,
}

/// What forgetting an entry costs; the least goes first. The order of
/// the variants is the order of eviction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Cost {
    /// Expired: indistinguishable from a subject never seen.
    Nothing,
    /// Admitting: the share of its limit used (millionths), then the
    /// oldest of equals (the soonest to expire).
    Used { share: u32, expires_at: Micros },
    /// Refusing, or nothing left: the refusal that ends soonest goes, and
    /// of refusals ending together (every fixed window of a policy ends at
    /// the same edge) the one that began last: the subject refused longest
    /// is kept.
    Refusing {
        until: Micros,
        since: Reverse<Micros>,
    },
}

impl Entry {
    pub(super) fn fresh(policy: &Policy) -> Entry {
        Entry {
            state: State::new(policy.bands()),
            expires_at: 0,
            used: 0,
            refusing_until: 0,
            refusal_ms: 0,
        }
    }

    pub(super) fn cost_to_forget(&self, now: Micros) -> Cost {
        if self.expires_at <= now {
            Cost::Nothing
        } else if self.refusing_until <= now {
            Cost::Used {
                share: self.used,
                expires_at: self.expires_at,
            }
        } else {
            Cost::Refusing {
                until: self.refusing_until,
                since: Reverse(self.refusing_since()),
            }
        }
    }

    /// The step admitted `decision` (the state already charged): the entry
    /// lives for `horizon` more, and if nothing is left it counts as
    /// refusing until one more unit would pass.
    pub(super) fn admitted(
        &mut self,
        policy: &Policy,
        decision: &Decision,
        now: Micros,
        horizon: Micros,
    ) {
        self.expires_at = now + horizon;
        self.used = used_share(policy, decision);
        if decision.remaining > 0 {
            self.refusing_until = 0;
            return;
        }
        // Nothing left: when will one unit pass? Read from a copy of the
        // state, as a peek would; only an entry just spent pays for it.
        let mut probe = self.state.clone();
        let next = algorithm::evaluate(policy.bands(), &mut probe, now, 1);
        if next.allowed {
            self.refusing_until = 0;
        } else {
            self.refuse_until(now, now.saturating_add(micros(next.retry_after)));
        }
    }

    /// The step refused `decision` (the state unchanged).
    pub(super) fn refused(&mut self, decision: &Decision, now: Micros) {
        self.refuse_until(now, now.saturating_add(micros(decision.retry_after)));
        if self.expires_at == 0 {
            // A fresh subject denied outright (cost above what is left
            // cannot happen for a fresh one, but keep the map tidy).
            self.expires_at = now;
        }
    }

    fn refuse_until(&mut self, now: Micros, until: Micros) {
        let since = if self.refusing_until <= now {
            now
        } else {
            self.refusing_since()
        };
        self.refusing_until = until;
        let ms = until.saturating_sub(since) / 1_000;
        self.refusal_ms = u32::try_from(ms).unwrap_or(u32::MAX);
    }

    /// When the current refusal began, to the millisecond (a little later
    /// than it did, never earlier).
    fn refusing_since(&self) -> Micros {
        self.refusing_until
            .saturating_sub(u64::from(self.refusal_ms) * 1_000)
    }
}

/// `decision`'s binding band: the share of its quota used, in millionths.
fn used_share(policy: &Policy, decision: &Decision) -> u32 {
    let quota = policy
        .quotas()
        .get(decision.band)
        .map_or(0, |&(quota, _)| u64::from(quota));
    if quota == 0 {
        return 0;
    }
    let used = quota.saturating_sub(decision.remaining);
    // At most WHOLE: fits.
    u32::try_from(used * WHOLE / quota).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;
    use std::time::Duration;

    use super::*;
    use crate::limit::{Bands, BucketBand, WindowBand};

    const SECOND: Micros = 1_000_000;

    fn window(limit: u32, seconds: u64) -> Policy {
        Policy::new(
            "p",
            "r",
            Bands::FixedWindow(vec![WindowBand {
                limit: NonZeroU32::new(limit).unwrap(),
                window: Duration::from_secs(seconds),
            }]),
            false,
        )
    }

    /// `policy`'s entry after `n` requests of `cost` at `now`.
    fn after(policy: &Policy, n: u32, cost: u32, now: Micros) -> Entry {
        let mut entry = Entry::fresh(policy);
        for _ in 0..n {
            let decision = algorithm::evaluate(policy.bands(), &mut entry.state, now, cost);
            if decision.allowed {
                entry.admitted(policy, &decision, now, micros(policy.horizon()));
            } else {
                entry.refused(&decision, now);
            }
        }
        entry
    }

    #[test]
    fn an_entry_stays_within_the_size_its_bound_was_measured_with() {
        // `memory_bound::BYTES_PER_ENTRY` was measured with 64-byte entries.
        assert!(std::mem::size_of::<Entry>() <= 64);
    }

    #[test]
    fn entries_rank_by_the_share_of_their_own_limit_used() {
        let now = 3_600 * SECOND;
        // 5 of 10 used costs more to forget than 50 of 1,000.
        let half = after(&window(10, 60), 5, 1, now);
        let twentieth = after(&window(1_000, 60), 1, 50, now);
        assert!(twentieth.cost_to_forget(now) < half.cost_to_forget(now));
        assert_eq!(
            half.cost_to_forget(now),
            Cost::Used {
                share: 500_000,
                expires_at: now + 60 * SECOND
            }
        );
        // Of equal shares, the oldest goes first.
        let older = after(&window(10, 60), 5, 1, now - SECOND);
        assert!(older.cost_to_forget(now) < half.cost_to_forget(now));
        // Expired costs nothing.
        assert_eq!(half.cost_to_forget(now + 61 * SECOND), Cost::Nothing);
    }

    #[test]
    fn an_entry_with_nothing_left_counts_as_refusing_until_one_unit_passes() {
        let now = 3_600 * SECOND + 10 * SECOND;
        // Spent, never refused: refusing until the window's edge.
        let spent = after(&window(5, 60), 5, 1, now);
        assert_eq!(
            spent.cost_to_forget(now),
            Cost::Refusing {
                until: 3_660 * SECOND,
                since: Reverse(now)
            }
        );
        // Above any admitting entry, however many units that one holds.
        let heavy = after(&window(100, 3_600), 1, 50, now);
        assert!(heavy.cost_to_forget(now) < spent.cost_to_forget(now));
        // A bucket with nothing left refuses until one token is back.
        let bucket = Policy::new(
            "b",
            "r",
            Bands::TokenBucket(vec![BucketBand {
                capacity: NonZeroU32::new(2).unwrap(),
                refill_tokens: NonZeroU32::new(1).unwrap(),
                refill_every: Duration::from_secs(10),
                max_wait_us: 0,
            }]),
            false,
        );
        let empty = after(&bucket, 2, 1, now);
        assert!(matches!(
            empty.cost_to_forget(now),
            Cost::Refusing { until, .. } if until == now + 10 * SECOND
        ));
        // One unit left is not refusing.
        assert!(matches!(
            after(&window(5, 60), 4, 1, now).cost_to_forget(now),
            Cost::Used { .. }
        ));
        // Past its edge the refusal is over, and the share stays.
        assert!(matches!(
            spent.cost_to_forget(3_660 * SECOND),
            Cost::Used {
                share: 1_000_000,
                ..
            }
        ));
    }

    #[test]
    fn of_refusals_ending_together_the_one_refusing_longest_is_kept() {
        let edge = 3_660 * SECOND;
        let p = window(1, 60);
        let long = after(&p, 2, 1, 3_600 * SECOND + SECOND);
        let recent = after(&p, 1, 1, 3_600 * SECOND + 30 * SECOND);
        let now = 3_600 * SECOND + 40 * SECOND;
        // Both until the edge; the one refusing since later goes first.
        assert!(
            matches!(recent.cost_to_forget(now), Cost::Refusing { until, .. } if until == edge)
        );
        assert!(recent.cost_to_forget(now) < long.cost_to_forget(now));
        // A refusal ending sooner goes before either.
        let short = after(&window(1, 50), 1, 1, 3_600 * SECOND + 5 * SECOND);
        assert!(short.cost_to_forget(now) < recent.cost_to_forget(now));
        // Refused again, it is still refusing since it began.
        let mut again = long.clone();
        let decision = algorithm::evaluate(p.bands(), &mut again.state, now, 1);
        again.refused(&decision, now);
        assert_eq!(again.cost_to_forget(now), long.cost_to_forget(now));
    }
}
