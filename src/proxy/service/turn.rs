//! Waiting for a turn (`delay` on a GCRA policy): a request past the
//! burst whose turn comes within `max_wait` was admitted by the store with
//! that turn taken, and is held here until it comes, rather than refused.
//!
//! The turn is taken in the store, so every sidecar sharing it agrees on
//! whose turn is when: the waits are exact across sidecars, not guessed
//! locally. What the wait holds, and gives back:
//!
//! - a place in the limit's queue in this sidecar (`max_queued`); a request
//!   that finds the queue full is refused (429) and its turn given back;
//! - no in-flight place: concurrency places taken before the store was
//!   asked go back for the wait, and are taken again after it (a request
//!   that then finds none gives its turn back and is refused as any other);
//! - a client that goes away while it waits gives its turn back too, so
//!   the next request can have it.
//!
//! Giving back is the refund every reservation uses: on Redis the
//! evaluation's record says what it took, and it lives long enough for
//! that (`settle_within`).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::limit::{Micros, Policy};
use crate::store::{Evaluation, EvaluationId, Store};
use crate::subject::Pseudonym;

use super::Check;

/// What one admitted rate limit took, to give back.
pub(super) struct Owed {
    policy: Arc<Policy>,
    subject: Pseudonym,
    units: u32,
    id: EvaluationId,
    at: Micros,
}

impl Owed {
    pub fn new(evaluation: &Evaluation<'_>, policy: &Arc<Policy>, at: Micros) -> Owed {
        Owed {
            policy: policy.clone(),
            subject: *evaluation.subject,
            units: evaluation.cost,
            id: evaluation.id,
            at,
        }
    }
}

/// A request admitted on the condition that it waits.
pub(super) struct Turn<'a, 'r> {
    pub wait: Duration,
    /// The limit whose turn is the latest: its queue holds the request.
    pub check: &'a Check<'r>,
    /// Every rate limit the request was admitted by.
    pub owed: SmallVec<[Owed; 2]>,
}

/// Gives back every turn of `owed`, in a task of its own (a request that
/// goes away cannot wait for it).
pub(super) fn give_back(store: &Arc<Store>, owed: SmallVec<[Owed; 2]>, budget: Duration) {
    if owed.is_empty() {
        return;
    }
    let store = store.clone();
    tokio::spawn(async move {
        for o in owed {
            let evaluation = Evaluation {
                policy: &o.policy,
                subject: &o.subject,
                cost: o.units,
                deadline: Instant::now() + budget,
                id: o.id,
                settle_within: None,
            };
            store.refund_reserved(&evaluation, o.at, o.units).await;
        }
    });
}

/// A place in a limit's queue, given back when dropped.
pub(super) struct Queued<'r> {
    waiting: &'r AtomicU32,
}

impl<'r> Queued<'r> {
    /// A place among `max` in `waiting`, if one is free.
    pub fn take(waiting: &'r AtomicU32, max: u32) -> Option<Queued<'r>> {
        waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Queued { waiting })
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.waiting.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Gives the turns back if dropped before [`Unclaimed::claim`]: the client
/// went away while its request waited.
pub(super) struct Unclaimed {
    store: Arc<Store>,
    owed: Option<SmallVec<[Owed; 2]>>,
    budget: Duration,
}

impl Unclaimed {
    pub fn new(store: &Arc<Store>, owed: SmallVec<[Owed; 2]>, budget: Duration) -> Unclaimed {
        Unclaimed {
            store: store.clone(),
            owed: Some(owed),
            budget,
        }
    }

    /// The turns, now the request has had its wait.
    pub fn claim(mut self) -> SmallVec<[Owed; 2]> {
        self.owed.take().unwrap_or_default()
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        if let Some(owed) = self.owed.take() {
            give_back(&self.store, owed, self.budget);
        }
    }
}
