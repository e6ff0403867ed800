//! The Redis store: every replica of an app shares one limit.
//!
//! One evaluation is one `FCALL` of the policy's function, in a Redis
//! Functions library made from its algorithm's script (`lua/`), single-key
//! per subject, deciding with Redis `TIME`. A request with several rate
//! limits is one `FCALL` too, of a library made of theirs (`lua/several.lua`) over all their keys, all or nothing; on
//! Redis Cluster, whose keys then sit in different slots, the limits are
//! evaluated one call each, in order ([`RedisStore::evaluate_all`]).
//! Around every call:
//!
//! - one deadline (`evaluation.deadline`) covers the lane wait, connecting,
//!   the `FCALL`, the reload of a library the node does not have
//!   (function not found) and the second `FCALL`;
//! - failures are classified by how far the command got: not sent
//!   (Unavailable), sent without a confirmed reply (Indeterminate);
//! - an Indeterminate attempt is retried once, with the same evaluation id,
//!   while the deadline allows: the script returns the admission it
//!   recorded for that id instead of charging twice (a denial leaves no
//!   record: it charged nothing, and its retry is decided afresh). A
//!   call's first send says so, and the script skips the look for a record
//!   a fresh id cannot have; every re-send looks (`Inner::first_sends`:
//!   never through redis-rs's cluster client, which re-sends by itself);
//! - a [`Breaker`] answers at once while Redis keeps failing;
//! - every command a connection sends is counted by command and result,
//!   with its round trip's time (`counted`), as Redis counts what it
//!   receives.
//!
//! Decisions that arrive while a call is in flight go out together, as one
//! call of the policy's batch function ([`coalesce`], `store.coalesce`).
//!
//! Libraries are loaded with `FUNCTION LOAD REPLACE` (on every primary by a
//! background task at start, and again on the node that answered function
//! not found). Where the store has no Functions (`store.scripts`, see
//! [`mode`]) the same scripts run with `EVALSHA` after `SCRIPT LOAD`, and
//! a request's limits go one call each unless their keys share a slot.
//! sluice never sends `EVAL`.

mod call;
mod coalesce;
mod connect;
mod counted;
mod evaluate;
pub mod inspect;
mod leased;
mod libraries;
mod load;
mod mode;
mod packed;
mod pool;
mod readiness;
mod refund;
pub(crate) mod reply;
pub use leased::{Befores, Leased};
mod scripts;
mod shards;
mod stats;
mod touch;
pub(crate) mod wire;

pub use stats::{RedisStats, Stat};

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use smallvec::SmallVec;

use crate::config;
use crate::limit::{Decision, Outcome, Policy};
use crate::route::Route;

use super::breaker::{Breaker, Thresholds};
use super::deny_cache::DenyCache;
use super::lag::{self, Lag};
use super::lease::{Before, Leases};
use super::{Evaluation, Outcomes, Source};
use mode::Modes;
use pool::Lanes;
use readiness::Probe;
use scripts::{Common, Scripts};

/// How long the start-up task gives one attempt at connecting and loading
/// the scripts (a TLS handshake over a real network included).
const PREPARE_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    // Never quotes the URL: it carries the password.
    #[error("store.redis.url is not a valid redis:// or rediss:// URL")]
    Url,
    #[error("store.redis.ca_file is set but store.redis.url is not rediss://")]
    CaFileWithoutTls,
    #[error("store.redis.ca_file {}: {reason}", path.display())]
    CaFile { path: PathBuf, reason: String },
    #[error("store nodes mix redis:// and rediss://")]
    MixedTls,
    #[error("store.redis: TLS settings: {0}")]
    Tls(String),
    #[error("the Redis store must be created inside a Tokio runtime")]
    NoRuntime,
}

pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    /// What the prober evaluates: a limit nobody reaches, on a key of its own.
    probe: Probe,
    /// The probe's deadline: `store.budget` as it was at start.
    budget: Duration,
    lanes: Lanes,
    scripts: Scripts,
    breaker: Breaker,
    /// Redis answered and every script is loaded (readiness).
    prepared: AtomicBool,
    /// `store.scripts`, and the mode in use once known.
    modes: Modes,
    /// Redis Cluster, whose keys of several limits are in different slots
    /// (CROSSSLOT).
    cluster: bool,
    /// The connection re-sends a command by itself (redis-rs's cluster
    /// client): no send is a first ([`Inner::first_sends`]).
    resends: bool,
    stats: RedisStats,
    /// The leases this sidecar holds, and the subjects it follows for them.
    leases: Leases,
    /// The time this process lost to its own event loop: given back to
    /// calls, never counted against Redis.
    lag: Arc<Lag>,
    /// Denied subjects' keys waiting for a `TOUCH`.
    touches: touch::Touches,
    /// Decisions waiting for the call in flight, sent together after it
    /// (`store.coalesce`).
    coalescer: coalesce::Coalescer,
}

impl Inner {
    /// The pool (nothing connected yet), the scripts and the breaker.
    fn new(
        redis: &config::RedisStore,
        scripts: config::Scripts,
        ttl_grace: Duration,
        budget: Duration,
    ) -> Result<Inner, RedisSetupError> {
        let lanes = Lanes::new(redis, budget)?;
        let resends = lanes.resends_by_itself();
        Ok(Inner {
            probe: Probe::new(),
            budget,
            coalescer: coalesce::Coalescer::new(redis.coalesce, lanes.len()),
            lanes,
            scripts: Scripts::new(Common {
                key_prefix: redis.key_prefix.clone(),
                ttl_grace,
                max_clock_regression: redis.max_clock_regression,
                dedupe_window: redis.dedupe_window,
            }),
            breaker: Breaker::new(Thresholds {
                window: redis.breaker_window,
                min_calls: redis.breaker_min_calls,
                min_failures: redis.breaker_failures,
                failure_rate: redis.breaker_failure_rate,
                cooldown: redis.breaker_cooldown,
            }),
            prepared: AtomicBool::new(false),
            modes: Modes::new(scripts),
            cluster: matches!(redis.topology, config::Topology::Cluster { .. }),
            resends,
            stats: RedisStats::new(),
            leases: Leases::default(),
            lag: Arc::new(Lag::new(Instant::now())),
            touches: touch::Touches::default(),
        })
    }
}

impl RedisStore {
    /// Builds the pool and starts connecting in the background: Redis need
    /// not be up yet. [`RedisStore::ready`] turns true once Redis answered
    /// and every script is loaded.
    /// `policies`' scripts are made now and loaded with the connection;
    /// a policy first seen later gets its script on first use
    /// ([`RedisStore::learn`] loads a reloaded configuration's ahead).
    ///
    /// `ttl_grace` is compiled into the scripts; `budget` (the one in
    /// effect at start) bounds the store's own probe and the cluster
    /// client's waits, while each request brings its deadline.
    pub fn connect(
        redis: &config::RedisStore,
        ttl_grace: Duration,
        budget: Duration,
        policies: &[Arc<Policy>],
    ) -> Result<RedisStore, RedisSetupError> {
        let scripts = config::Scripts::default();
        RedisStore::connect_running(redis, scripts, ttl_grace, budget, policies)
    }

    /// [`RedisStore::connect`], the scripts run as `scripts` says
    /// (`store.scripts`).
    pub fn connect_running(
        redis: &config::RedisStore,
        scripts: config::Scripts,
        ttl_grace: Duration,
        budget: Duration,
        policies: &[Arc<Policy>],
    ) -> Result<RedisStore, RedisSetupError> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| RedisSetupError::NoRuntime)?;
        let inner = Arc::new(Inner::new(redis, scripts, ttl_grace, budget)?);
        inner.coalescer.set_home(Arc::downgrade(&inner));
        for policy in policies {
            inner.scripts.get(policy);
            if policy.lease.is_some() {
                // What is left of a lease goes back through it.
                inner.scripts.refund(policy);
            }
        }
        runtime.spawn(readiness::prepare(Arc::downgrade(&inner)));
        runtime.spawn(readiness::probe(
            Arc::downgrade(&inner),
            redis.breaker_cooldown,
        ));
        runtime.spawn(libraries::renew(Arc::downgrade(&inner)));
        runtime.spawn(leased::upkeep(Arc::downgrade(&inner)));
        runtime.spawn(lag::monitor(Arc::downgrade(&inner.lag)));
        runtime.spawn(touch::flush(Arc::downgrade(&inner)));
        Ok(RedisStore { inner })
    }

    pub async fn evaluate(&self, evaluation: &Evaluation<'_>) -> Outcome {
        self.inner.evaluate(evaluation).await
    }

    /// Keeps `evaluation`'s key in Redis's sight while the over-limit
    /// cache answers for it (`touch`): queued, sent within a tenth of a
    /// second, never waited for.
    pub fn touch(&self, evaluation: &Evaluation<'_>) {
        self.inner.touch(evaluation);
    }

    /// Every rate limit of one request (see [`super::Store::evaluate_all`]),
    /// behind `cache`, the over-limit cache. On standalone and Sentinel: one
    /// call, all or nothing. On Cluster: one call per limit, in order,
    /// stopping at the first that blocks; the limits before it stay
    /// charged (not atomic: docs/LIMITS.md, "Several limits on one route").
    pub async fn evaluate_all(
        &self,
        evaluations: &[Evaluation<'_>],
        cache: Option<&DenyCache>,
    ) -> Outcomes {
        match self.from_leases(evaluations) {
            Leased::Paid(outcomes) => outcomes,
            Leased::Ask(befores) => {
                let asked = Asked {
                    befores: Some(&befores),
                    remembers_none: None,
                };
                self.decide_all(evaluations, cache, asked).await
            }
            Leased::None => self.decide_all(evaluations, cache, Asked::default()).await,
        }
    }

    /// [`RedisStore::evaluate_all`] once [`RedisStore::from_leases`] has
    /// found the request not paid by leases (`asked`: what the lease book
    /// said of each limit, when one is leased; whether the over-limit
    /// cache was asked already).
    pub async fn decide_all(
        &self,
        evaluations: &[Evaluation<'_>],
        cache: Option<&DenyCache>,
        asked: Asked<'_>,
    ) -> Outcomes {
        let Asked {
            befores,
            remembers_none,
        } = asked;
        if let [one] = evaluations {
            match befores {
                // A subject the lease book follows but holds no lease of,
                // the most common: asked as any other, the book told after.
                Some([Before::Ask { extra: 0 }]) => {
                    let (outcome, source) = super::evaluate_shared(self, cache, one).await;
                    self.settle(one, 0, Instant::now(), outcome);
                    let mut outcomes = Outcomes::at(0, outcome);
                    outcomes.source = source;
                    return outcomes;
                }
                // Boxed: a lease asked for or waited on is once a lease's
                // life, and this future, larger than a plain call's, would
                // otherwise size every Redis decision's.
                Some([before]) => {
                    return Box::pin(self.evaluate_leased(one, cache, before)).await;
                }
                _ => {}
            }
            let (outcome, source) = match (cache, remembers_none) {
                (Some(cache), Some(asked)) => {
                    let outcome = super::evaluate_remembering(self, cache, one, asked).await;
                    (outcome, Source::Store)
                }
                _ => super::evaluate_shared(self, cache, one).await,
            };
            let mut outcomes = Outcomes::at(0, outcome);
            outcomes.source = source;
            return outcomes;
        }
        // Taken before the store is asked, so a remembered denial can only
        // end early, never late.
        let asked = remembers_none.unwrap_or_else(Instant::now);
        if let (Some(cache), None) = (cache, remembers_none) {
            if let Some(outcomes) = self.remembered(evaluations, cache, befores, asked) {
                return outcomes;
            }
        }
        if let Some(befores) = befores {
            let one_call = !self.in_order(evaluations);
            // Boxed: several limits of which some are leased are few, and
            // this future, the largest of a decision's, would otherwise
            // size every Redis decision's.
            let leased = Box::pin(self.evaluate_all_leased(evaluations, one_call, befores));
            if let Some(outcomes) = leased.await {
                if let Some(cache) = cache {
                    remember(cache, evaluations, &outcomes, asked);
                }
                return outcomes;
            }
        }
        if self.in_order(evaluations) {
            // Boxed: a call for each limit in turn, with the outcomes so far
            // beside it, would otherwise size every Redis decision's.
            return Box::pin(self.evaluate_in_order(evaluations, cache)).await;
        }
        let outcomes = self.inner.evaluate_several(evaluations).await;
        if let Some(cache) = cache {
            remember(cache, evaluations, &outcomes, asked);
        }
        outcomes
    }

    /// Each limit in its own call, in order, up to the first that blocks
    /// (Redis Cluster, and cached scripts).
    async fn evaluate_in_order(
        &self,
        evaluations: &[Evaluation<'_>],
        cache: Option<&DenyCache>,
    ) -> Outcomes {
        let mut outcomes = Outcomes::empty();
        outcomes.source = Source::DenyCache;
        for evaluation in evaluations {
            let (outcome, source) = super::evaluate_shared(self, cache, evaluation).await;
            outcomes.list.push(outcome);
            if source == Source::Store {
                outcomes.source = Source::Store;
            }
            if outcome.blocks(evaluation.policy.shadow) {
                break;
            }
        }
        outcomes
    }

    /// The outcomes of `evaluations` when the over-limit cache remembers
    /// one of them denied at `asked`: answered without asking Redis. A
    /// shadow limit's denial ends the decision only when it is the
    /// request's one limit: among others it refuses nothing, and they are
    /// still to be asked. `befores`: what the lease book said of each,
    /// undone then.
    pub fn remembered(
        &self,
        evaluations: &[Evaluation<'_>],
        cache: &DenyCache,
        befores: Option<&[Before]>,
        asked: Instant,
    ) -> Option<Outcomes> {
        let alone = evaluations.len() == 1;
        for (i, e) in evaluations.iter().enumerate() {
            if e.policy.shadow && !alone {
                continue;
            }
            if let Some(decision) = self.remembered_denial(e, cache, asked) {
                if let Some(befores) = befores {
                    self.not_asked(evaluations, befores);
                }
                let mut outcomes = Outcomes::at(i, Outcome::Denied(decision));
                outcomes.source = Source::DenyCache;
                return Some(outcomes);
            }
        }
        None
    }

    /// The denial of `evaluation` the over-limit cache remembers at
    /// `asked`, if any; its key touched when Redis is to see it in use.
    pub fn remembered_denial(
        &self,
        evaluation: &Evaluation<'_>,
        cache: &DenyCache,
        asked: Instant,
    ) -> Option<Decision> {
        let Evaluation {
            policy,
            subject,
            cost,
            ..
        } = *evaluation;
        let hit = cache.check(policy, subject, cost, asked)?;
        if hit.touch {
            self.inner.touch(evaluation);
        }
        Some(hit.decision)
    }

    /// Whether `evaluations` are decided one call each, in order: on Redis
    /// Cluster, unless every key is in one slot (a script may only touch
    /// keys of one slot; CROSSSLOT otherwise).
    fn in_order(&self, evaluations: &[Evaluation<'_>]) -> bool {
        if self.inner.one_call() {
            return false;
        }
        let common = self.inner.scripts.common();
        let mut slots = evaluations
            .iter()
            .map(|e| shards::slot_of(&scripts::state_key(common, e)));
        let first = slots.next();
        !slots.all(|slot| Some(slot) == first)
    }

    /// Gives back what `evaluations` were charged, the request having been
    /// refused (docs/LIMITS.md, "Several limits on one route"): every limit the
    /// store admitted, and every limit whose call got no confirmed reply
    /// (Indeterminate: its record says whether it ran). Only limits decided
    /// one call each, in order, can have been charged for a request that
    /// was refused: elsewhere this does nothing.
    pub async fn give_back(&self, evaluations: &[Evaluation<'_>], outcomes: &Outcomes) {
        if outcomes.source == Source::Lease {
            // Every limit allowed by a lease of this sidecar's, and
            // nothing of the store's refused it. Its units stay spent:
            // which lease each came from is not known here, and a unit
            // given to another lease could be spent in a window that
            // never counted it (`Leases::unspend`). At most one early
            // refusal per limit, until the lease ends.
            return;
        }
        if !self.in_order(evaluations) {
            return;
        }
        let charged: SmallVec<[&Evaluation<'_>; 2]> = outcomes
            .iter()
            .filter(|(_, outcome)| matches!(outcome, Outcome::Allowed(_) | Outcome::Indeterminate))
            .filter_map(|(i, _)| evaluations.get(i))
            .collect();
        if !charged.is_empty() {
            self.inner.refund(&charged).await;
        }
    }

    /// Gives back `units` of what `evaluation` reserved (a limit charged on
    /// response, settled), by its record; whether they were given back.
    pub async fn refund_reserved(&self, evaluation: &Evaluation<'_>, units: u32) -> bool {
        let refund = Evaluation {
            cost: units,
            settle_within: None,
            deadline: Instant::now() + self.inner.budget,
            ..*evaluation
        };
        let result = self.inner.refund_one(&refund, refund.deadline).await;
        self.inner.count_refund(result);
        result == refund::Refund::Refunded
    }

    /// Makes the scripts of every route's several limits, and loads those
    /// not seen before in the background, as [`RedisStore::learn`] does
    /// for policies.
    pub fn learn_routes<'r>(&self, routes: impl IntoIterator<Item = &'r Route>) {
        let mut new = false;
        // The limits one request charges together: those of its tier,
        // without the ones charged on response (read alone first).
        let sets = routes.into_iter().flat_map(|route| {
            let tiers = route.tiers.as_ref().map_or(1, |t| t.count());
            (0..tiers).map(move |tier| {
                route
                    .limits
                    .iter()
                    .filter(|l| l.applies(tier) && l.on_response().is_none())
                    .filter_map(|l| l.policy.as_rate().map(|p| &**p))
                    .collect::<Vec<&Policy>>()
            })
        });
        for policies in sets {
            if policies.len() < 2 {
                continue;
            }
            // Under `auto` both, until the store says which is needed.
            if self.inner.may_call_once() {
                new |= !self.inner.scripts.has_several(&policies);
                self.inner.scripts.several(&policies);
            }
            if !self.inner.one_call() {
                // In order: what is refunded is charged by an earlier limit.
                for policy in &policies[..policies.len() - 1] {
                    new |= self.inner.scripts.refund(policy).1;
                }
            }
        }
        if new {
            self.load_in_background();
        }
    }

    fn load_in_background(&self) {
        let inner = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            if let Some(store) = inner.upgrade() {
                let loaded = tokio::time::timeout(PREPARE_TIMEOUT, store.load_all()).await;
                if !matches!(loaded, Ok(Ok(()))) {
                    tracing::debug!("redis: new scripts load on first use");
                }
            }
        });
    }

    /// What `evaluation` would be answered now, charging nothing: the
    /// policy's read-only script (see `scripts`), run like any other.
    pub async fn peek(&self, evaluation: &Evaluation<'_>) -> Outcome {
        self.inner.peek(evaluation).await
    }

    /// Makes the scripts of `policies` (a configuration just loaded) and
    /// loads those not seen before, in the background: their first
    /// requests then need no reload round.
    pub fn learn(&self, policies: &[Arc<Policy>]) {
        let mut new = false;
        for policy in policies {
            if !self.inner.scripts.has(policy) {
                self.inner.scripts.get(policy);
                new = true;
            }
            if policy.lease.is_some() {
                new |= self.inner.scripts.refund(policy).1;
            }
        }
        if new {
            self.load_in_background();
        }
    }

    /// Redis answered, the scripts are loaded, and the breaker is closed:
    /// the last decisions reached Redis. While decisions fail, and while
    /// the breaker waits for or runs its probe, this is false.
    pub fn ready(&self) -> bool {
        self.inner.prepared.load(Ordering::Acquire) && self.inner.breaker.closed()
    }

    /// How the scripts run (`functions`, `eval`), once the store said.
    pub fn scripts_mode(&self) -> Option<&'static str> {
        self.inner.modes.settled().map(|mode| mode.name())
    }

    /// Why the store cannot become ready as configured, when known
    /// (`store.scripts: functions` on a store without them).
    pub fn refused(&self) -> Option<String> {
        self.inner.modes.refused()
    }
}

/// How far a decision went before the Redis call ([`RedisStore::decide_all`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Asked<'b> {
    /// What the lease book said of each limit, when one is leased.
    pub befores: Option<&'b [Before]>,
    /// When the over-limit cache was found to remember no denial of any
    /// limit, if it was asked already.
    pub remembers_none: Option<Instant>,
}

/// Remembers the denials among `outcomes` of a request that arrived at
/// `asked`.
fn remember(
    cache: &DenyCache,
    evaluations: &[Evaluation<'_>],
    outcomes: &Outcomes,
    asked: Instant,
) {
    for (i, outcome) in outcomes.iter() {
        if let (Outcome::Denied(decision), Some(e)) = (outcome, evaluations.get(i)) {
            let reserved = e.settle_within.is_some();
            cache.remember_denial(e.policy, e.subject, e.cost, asked, &decision, reserved);
        }
    }
}

impl RedisStore {
    pub fn stats(&self) -> &RedisStats {
        &self.inner.stats
    }

    /// Whether the breaker is currently refusing requests.
    pub fn breaker_open(&self) -> bool {
        !self.inner.breaker.admits(Instant::now())
    }

    /// How many times the breaker has opened.
    pub fn breaker_opened_total(&self) -> u64 {
        self.inner.breaker.opened_total()
    }

    /// Brings the breaker's metrics up to date (when `/metrics` is
    /// scraped); every other counter is counted as it happens.
    pub fn publish_metrics(&self) {
        let stats = &self.inner.stats;
        stats.publish_breaker(self.breaker_open(), self.breaker_opened_total());
    }

    /// Connections currently open: at most one per lane, and there are
    /// `pool_size` lanes or one per core, whichever is fewer.
    pub fn connections(&self) -> usize {
        self.inner.lanes.connected()
    }
}
