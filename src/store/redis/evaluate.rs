//! One decision's command: a policy's own script, several limits' in one
//! call, or the read-only copy `POST /explain` runs, each built in the
//! mode the scripts run in now (`mode`), and whether several limits may
//! go in one call at all.

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::limit::{Incompatible, Outcome, Policy, Unavailable};
use crate::store::{Evaluation, Outcomes};

use super::call::Request;
use super::coalesce::Turn;
use super::mode::Mode;
use super::reply::Shape;
use super::{scripts, Inner, PREPARE_TIMEOUT};

impl Inner {
    /// Several limits go in one call: on every topology but Cluster, whose
    /// keys are then in different slots (CROSSSLOT), and only with
    /// Functions: cached scripts are for stores that refuse a script whose
    /// keys are not in one slot, and under `auto` until it is settled
    /// (Functions until then).
    pub(super) fn one_call(&self) -> bool {
        !self.cluster && self.modes.current() == Mode::Functions
    }

    /// Whether a route's several limits may ever go in one call here: so
    /// their script is made ahead.
    pub(super) fn may_call_once(&self) -> bool {
        !self.cluster && self.modes.settled() != Some(Mode::Eval)
    }

    /// Whether a decision's first send may say so (`lua/README.md`,
    /// "ARGV"), sparing the script the look for a record a fresh id
    /// cannot have (a first send claims its record with `SET … NX`
    /// before charging, so one its own retry overtook still replays it):
    /// only where nothing but sluice re-sends a command, and each of its
    /// re-sends says `0` ([`scripts::resent`]). sluice's own connection
    /// and redis-rs's multiplexed one (standalone, and the primary the
    /// Sentinels name: the Sentinel client only finds it) send a command
    /// once, `FCALL` and `EVALSHA` alike; sluice's own cluster connection
    /// re-sends one only after `MOVED` or `ASK`, which say it did not run
    /// (`shards`). redis-rs's cluster client re-sends one by itself, with
    /// the same arguments, after `TRYAGAIN` or an I/O error too (a reply
    /// lost, the script perhaps run): there no send is marked first.
    /// Several limits in one call are never marked first either
    /// ([`scripts::call_several`]).
    pub(super) fn first_sends(&self) -> bool {
        !self.resends
    }
}

impl Inner {
    pub(super) async fn evaluate(&self, evaluation: &Evaluation<'_>) -> Outcome {
        let inner = self;
        let policy = evaluation.policy;
        if evaluation.cost == 0 || evaluation.cost > policy.max_cost() {
            return Outcome::Incompatible(Incompatible::CostAboveMaximum);
        }
        let now = Instant::now();
        if inner.passed(evaluation.deadline) {
            inner.stats.budget_spent.count();
            return Outcome::Unavailable(Unavailable::AdmissionRejected);
        }
        let Some(permit) = inner.breaker.try_acquire(now) else {
            inner.stats.breaker_rejected.count();
            return Outcome::Unavailable(Unavailable::AdmissionRejected);
        };
        let script = inner.scripts.get(policy);
        let mut lead = None;
        if inner.coalescer.applies(inner.modes.settled()) {
            match inner
                .coalescer
                .join(inner, &script, shape(policy), evaluation)
            {
                Turn::Lead(turn) => lead = Some(turn),
                Turn::Queued(queued) => {
                    let (outcome, health) = inner.coalescer.wait(queued).await;
                    permit.report(health, Instant::now());
                    return outcome;
                }
            }
        }
        let mode = inner.modes.current();
        let request = Request {
            script: &script,
            mode,
            cmd: scripts::call(
                &script,
                mode,
                inner.scripts.common(),
                evaluation,
                inner.first_sends(),
            ),
            limits: smallvec::smallvec![shape(policy)],
            deadline: evaluation.deadline,
            batch: false,
        };
        let (outcomes, health) = inner.decide(&request).await;
        // What queued meanwhile goes out now.
        drop(lead);
        permit.report(health, Instant::now());
        outcomes
            .list
            .first()
            .copied()
            .unwrap_or(Outcome::Indeterminate)
    }

    /// Several limits in one call of the script made of theirs.
    pub(super) async fn evaluate_several(&self, evaluations: &[Evaluation<'_>]) -> Outcomes {
        for (i, e) in evaluations.iter().enumerate() {
            if e.cost == 0 || e.cost > e.policy.max_cost() {
                return Outcomes::at(i, Outcome::Incompatible(Incompatible::CostAboveMaximum));
            }
        }
        // One deadline for the request: every evaluation carries the same.
        let deadline = evaluations
            .iter()
            .map(|e| e.deadline)
            .min()
            .unwrap_or_else(Instant::now);
        let now = Instant::now();
        if self.passed(deadline) {
            self.stats.budget_spent.count();
            return Outcomes::at(0, Outcome::Unavailable(Unavailable::AdmissionRejected));
        }
        let Some(permit) = self.breaker.try_acquire(now) else {
            self.stats.breaker_rejected.count();
            return Outcomes::at(0, Outcome::Unavailable(Unavailable::AdmissionRejected));
        };
        let policies: SmallVec<[&Policy; 2]> = evaluations.iter().map(|e| e.policy).collect();
        let script = self.scripts.several(&policies);
        let mode = self.modes.current();
        let request = Request {
            script: &script,
            mode,
            cmd: scripts::call_several(&script, mode, self.scripts.common(), evaluations),
            limits: policies.iter().map(|p| shape(p)).collect(),
            deadline,
            batch: false,
        };
        let (outcomes, health) = self.decide(&request).await;
        permit.report(health, Instant::now());
        outcomes
    }
}

/// How to read `policy`'s part of a reply.
pub(super) fn shape(policy: &Policy) -> Shape {
    Shape {
        bands: policy.bands().len(),
        approximate: !policy.algorithm().is_exact(),
        shadow: policy.shadow,
    }
}

impl Inner {
    pub(super) async fn peek(&self, evaluation: &Evaluation<'_>) -> Outcome {
        let policy = evaluation.policy;
        if evaluation.cost == 0 || evaluation.cost > policy.max_cost() {
            return Outcome::Incompatible(Incompatible::CostAboveMaximum);
        }
        let now = Instant::now();
        if evaluation.deadline <= now {
            return Outcome::Unavailable(Unavailable::AdmissionRejected);
        }
        // Real requests are refused while the breaker is; but a peek takes
        // no permit and reports nothing: it must neither take the probe
        // real traffic brings nor open the breaker by itself.
        if !self.breaker.admits(now) {
            return Outcome::Unavailable(Unavailable::AdmissionRejected);
        }
        let (script, made) = self.scripts.peek(policy);
        if made {
            // Loaded outside the request's budget: that first load is the
            // explanation's own cost, not something a request would wait
            // for (request scripts are loaded at start). If it fails, the
            // call below reloads it on function not found like any library.
            let loaded = tokio::time::timeout(PREPARE_TIMEOUT, self.load_one(&script)).await;
            if !matches!(loaded, Ok(Ok(()))) {
                tracing::debug!("redis: the read-only script loads on its first call");
            }
        }
        let deadline = Instant::now() + (evaluation.deadline - now);
        let mode = self.modes.current();
        let request = Request {
            script: &script,
            mode,
            cmd: scripts::call(
                &script,
                mode,
                self.scripts.common(),
                evaluation,
                self.first_sends(),
            ),
            limits: smallvec::smallvec![shape(policy)],
            deadline,
            batch: false,
        };
        let (outcomes, _) = self.decide(&request).await;
        outcomes
            .list
            .first()
            .copied()
            .unwrap_or(Outcome::Indeterminate)
    }
}
