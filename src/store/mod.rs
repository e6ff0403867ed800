//! Where limiter state lives. One `evaluate` per request, ending in exactly
//! one [`Outcome`], whatever the store.

pub mod breaker;
pub mod deny_cache;
pub mod memory;
pub mod memory_bound;
pub mod redis;

use std::fmt;

use tokio::time::Instant;

use crate::limit::{Outcome, Policy};
use crate::subject::Pseudonym;

/// A server-generated id per request. An ambiguous store call may be retried
/// with the same id; the Redis scripts return the recorded decision instead
/// of charging twice.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct EvaluationId(pub u128);

impl EvaluationId {
    pub fn random() -> EvaluationId {
        EvaluationId(rand::random())
    }
}

impl fmt::Display for EvaluationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for EvaluationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EvaluationId({self})")
    }
}

/// One request's question to a store.
#[derive(Debug, Clone, Copy)]
pub struct Evaluation<'a> {
    pub policy: &'a Policy,
    pub subject: &'a Pseudonym,
    /// 1..=policy max cost (validated with the route).
    pub cost: u32,
    /// arrival + `store.budget`: the whole decision happens before it.
    pub deadline: Instant,
    pub id: EvaluationId,
}

/// The configured store. An enum rather than a trait object: two variants,
/// async methods, no boxing on the hot path.
pub enum Store {
    Memory(memory::MemoryStore),
    /// Redis, with this sidecar's local over-limit cache in front (`None`
    /// when `deny_cache_entries: 0`). The memory store needs no such cache:
    /// asking it costs what asking the cache would.
    Redis(redis::RedisStore, Option<deny_cache::DenyCache>),
}

/// Who gave an outcome: the store, or this sidecar's over-limit cache in
/// front of it. A remembered denial says nothing about whether the store
/// decides right now, which the local fallback needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Store,
    DenyCache,
}

impl Store {
    pub async fn evaluate(&self, evaluation: &Evaluation<'_>) -> Outcome {
        self.evaluate_sourced(evaluation).await.0
    }

    /// [`Store::evaluate`], saying where the outcome came from.
    pub async fn evaluate_sourced(&self, evaluation: &Evaluation<'_>) -> (Outcome, Source) {
        match self {
            // Decides at once; no future to hold.
            Store::Memory(store) => (store.evaluate(evaluation), Source::Store),
            // Boxed: a Redis round trip is a large future (several KB), and
            // held inline it would make every connection's in-flight request
            // future that large, memory-store requests included.
            Store::Redis(store, cache) => {
                Box::pin(evaluate_shared(store, cache.as_ref(), evaluation)).await
            }
        }
    }

    /// What `evaluation` would be answered now, charging nothing and
    /// writing nothing (for `POST /explain`). The local over-limit cache
    /// is not consulted: it only repeats a denial the store would give.
    pub async fn peek(&self, evaluation: &Evaluation<'_>) -> Outcome {
        match self {
            Store::Memory(store) => store.peek(evaluation),
            Store::Redis(store, _) => Box::pin(store.peek(evaluation)).await,
        }
    }

    /// The `store` label of metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Memory(_) => "memory",
            Store::Redis(..) => "redis",
        }
    }

    /// Brings the metrics read from the store's state up to date; called
    /// when `/metrics` is scraped, so the request path only counts.
    pub fn publish_metrics(&self) {
        match self {
            Store::Memory(_) => {}
            Store::Redis(store, _) => store.publish_metrics(),
        }
    }

    /// Whether the store can currently make decisions (for `/readyz`).
    pub fn ready(&self) -> bool {
        match self {
            Store::Memory(_) => true,
            Store::Redis(store, _) => store.ready(),
        }
    }
}

/// Redis behind the local over-limit cache.
async fn evaluate_shared(
    store: &redis::RedisStore,
    cache: Option<&deny_cache::DenyCache>,
    evaluation: &Evaluation<'_>,
) -> (Outcome, Source) {
    let Some(cache) = cache else {
        return (store.evaluate(evaluation).await, Source::Store);
    };
    let Evaluation {
        policy,
        subject,
        cost,
        ..
    } = *evaluation;
    // Taken before the store is asked, so a remembered denial can only end
    // early, never late.
    let asked = Instant::now();
    if let Some(decision) = cache.check(policy, subject, cost, asked) {
        return (Outcome::Denied(decision), Source::DenyCache);
    }
    let outcome = store.evaluate(evaluation).await;
    if let Outcome::Denied(decision) = &outcome {
        cache.remember(policy, subject, cost, asked, decision);
    }
    (outcome, Source::Store)
}
