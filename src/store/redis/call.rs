//! One evaluation's round trips: a lane's connection, `FCALL` (or
//! `EVALSHA`), the reload of a script the node does not have, the single
//! retry of an ambiguous attempt, and the classification of every failure
//! by how far the command got.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;

use redis::{ErrorKind, RedisError, ServerErrorKind};
use smallvec::SmallVec;
use tokio::time::{timeout_at, Instant};

use crate::limit::{Incompatible, Outcome, Unavailable};
use crate::store::breaker::{Cause, Health};
use crate::store::lag;
use crate::store::Outcomes;

use super::coalesce;
use super::connect::Conn;
use super::mode::Mode;
use super::packed::Packed;
use super::pool::{Checkout, Stage};
use super::reply::{self, Answer, Reply, Shape};
use super::scripts::{self, Script};
use super::Inner;

/// Times a call past its deadline yields to the tasks ready before it
/// (its connection's reader among them) and looks for its reply again.
const LAST_LOOKS: usize = 2;

/// One evaluation's command and how to read its reply.
pub(super) struct Request<'a> {
    pub script: &'a Script,
    /// How `cmd` runs the script: `FCALL` or `EVALSHA`.
    pub mode: Mode,
    pub cmd: Packed,
    /// One per limit the command evaluates: one for a policy's own
    /// script, several for the script of several limits.
    pub limits: SmallVec<[Shape; 2]>,
    pub deadline: Instant,
    /// Several evaluations of one policy, each decided as its own call
    /// (`coalesce`): one reply, or error, per evaluation.
    pub batch: bool,
}

impl<'a> Request<'a> {
    /// The decisions the command carries, as failures are counted (each
    /// member of a batch failed as a call of its own would have).
    pub fn members(&self) -> u64 {
        if self.batch {
            self.limits.len() as u64
        } else {
            1
        }
    }

    /// The same request going again: its command as [`scripts::resent`]
    /// makes it, which looks for what the earlier send may have applied.
    fn resent(&self) -> Request<'a> {
        Request {
            script: self.script,
            mode: self.mode,
            cmd: scripts::resent(&self.cmd),
            limits: self.limits.clone(),
            deadline: self.deadline,
            batch: self.batch,
        }
    }

    /// The state key (`FCALL name numkeys KEY ...`, `EVALSHA` alike): where
    /// the script runs.
    fn key(&self) -> &[u8] {
        self.cmd.args().nth(3).unwrap_or_default()
    }
}

/// How one attempt ended.
enum Attempt {
    /// Redis answered; the outcomes follow from the reply.
    Answered(Outcomes),
    /// Nothing was applied: the script never ran.
    NotApplied(Unavailable, Health),
    /// Sent, then no confirmed reply: the script may have run. What it
    /// says of Redis: a failure, unless this sidecar was starved meanwhile.
    Ambiguous(Health),
}

/// How far one attempt got, read when its deadline cuts it short.
struct Progress {
    stage: Stage,
    loading: bool,
    sent: Option<Checkout>,
}

impl Inner {
    /// The outcomes of the request's limits; a failure is the first
    /// limit's outcome alone (it stands for the whole command).
    pub(super) async fn decide(&self, request: &Request<'_>) -> (Outcomes, Health) {
        let whole = |outcome| Outcomes::at(0, outcome);
        match self.attempt(request).await {
            Attempt::Answered(outcomes) => return (outcomes, Health::Answered),
            Attempt::NotApplied(unavailable, health) => {
                return (whole(Outcome::Unavailable(unavailable)), health)
            }
            Attempt::Ambiguous(health) if self.passed(request.deadline) => {
                return (whole(Outcome::Indeterminate), health)
            }
            Attempt::Ambiguous(_) => {}
        }
        // Boxed, and awaited past the match: rare, and its future (with the
        // first attempt's, were it awaited in its arm) would otherwise size
        // every decision's.
        Box::pin(self.retry(request)).await
    }

    /// The one retry of an attempt that may have run.
    async fn retry(&self, request: &Request<'_>) -> (Outcomes, Health) {
        let whole = |outcome| Outcomes::at(0, outcome);
        // Safe to repeat: the same evaluation id makes the script return
        // what it admitted the first time, if it ran (a denial charged
        // nothing, and is decided again). Sent as a re-send, so the script
        // looks for that record.
        self.stats.retries.count();
        match self.attempt(&request.resent()).await {
            Attempt::Answered(outcomes) if outcomes.list.iter().all(decided) => {
                (outcomes, Health::Answered)
            }
            // A batch's evaluations stand each alone: those the retry
            // decided are decided.
            Attempt::Answered(mut outcomes)
                if request.batch && outcomes.list.len() == request.limits.len() =>
            {
                for outcome in &mut outcomes.list {
                    if !decided(outcome) {
                        *outcome = Outcome::Indeterminate;
                    }
                }
                (outcomes, Health::Answered)
            }
            // Whatever the retry says, the first attempt may have been
            // charged.
            Attempt::Answered(_) => (whole(Outcome::Indeterminate), Health::Answered),
            Attempt::NotApplied(_, health) => (whole(Outcome::Indeterminate), health),
            Attempt::Ambiguous(health) => (whole(Outcome::Indeterminate), health),
        }
    }

    async fn attempt(&self, request: &Request<'_>) -> Attempt {
        // The time this sidecar loses is measured while the call is made.
        let _watch = self.lag.watch();
        let mut progress = Progress {
            stage: Stage::Waiting,
            loading: false,
            sent: None,
        };
        {
            let mut exchange = pin!(self.exchange(request, &mut progress));
            // Given back only once passed: nothing on the path of a call
            // in time.
            let mut deadline = request.deadline;
            loop {
                if let Ok(attempt) = timeout_at(deadline, exchange.as_mut()).await {
                    return attempt;
                }
                // The time this sidecar lost meanwhile is given back: the
                // reply may be in the socket, waiting for a thread.
                let later = self.deadline(request.deadline).0;
                if later <= deadline {
                    break;
                }
                deadline = later;
            }
            // A last look before giving up: a reply that came in while
            // every thread was busy waits for its connection's reader, and
            // yielding polls the socket and lets the reader run first.
            // Looked at by one poll, not a zero timeout: tokio rounds a
            // timer up to its next millisecond, so each look would hold
            // the request up to a millisecond past its budget.
            for _ in 0..LAST_LOOKS {
                tokio::task::yield_now().await;
                let look = std::future::poll_fn(|cx| Poll::Ready(exchange.as_mut().poll(cx)));
                if let Poll::Ready(attempt) = look.await {
                    return attempt;
                }
            }
        }
        // Given back all it lost, the call had its whole budget of running
        // time: Redis did not answer in it. Given back less (more was lost
        // than `lag::GIVEN_BACK`), nothing is known of Redis.
        let starved = !self.deadline(request.deadline).1;
        let blame = |cause| {
            if starved {
                self.stats.starved.count_n(request.members());
                Health::Unknown
            } else {
                Health::Failed(cause)
            }
        };
        // Dropping the future does not take back a command already written:
        // classify by how far it got.
        if let Some(checkout) = &progress.sent {
            self.stats.timeouts.count_n(request.members());
            // A connection that stopped answering may be dead without an
            // error (a partition): the lane reconnects on next use. Not
            // when this sidecar did not read it: reconnecting would only
            // add work to a starved process.
            if !starved {
                self.lanes.retire(checkout);
            }
            return Attempt::Ambiguous(blame(Cause::Timeout));
        }
        if progress.loading || progress.stage == Stage::Connecting {
            self.stats.unreachable.count_n(request.members());
            return Attempt::NotApplied(Unavailable::BeforeSend, blame(Cause::Unreachable));
        }
        self.stats.budget_spent.count_n(request.members());
        Attempt::NotApplied(Unavailable::AdmissionRejected, Health::Unknown)
    }

    async fn exchange(&self, request: &Request<'_>, progress: &mut Progress) -> Attempt {
        let checkout = match self.lanes.acquire(&mut progress.stage).await {
            Ok(checkout) => checkout,
            Err(e) => {
                self.stats.unreachable.count_n(request.members());
                tracing::debug!(error = %e, "redis: connecting failed");
                return Attempt::NotApplied(
                    Unavailable::BeforeSend,
                    Health::Failed(Cause::Unreachable),
                );
            }
        };
        if let Some(not_sent) = self.past_deadline(request) {
            return not_sent;
        }
        let mut conn = checkout.conn.clone();
        progress.sent = Some(checkout);
        // Matched where it is made: a named reply would keep its room in
        // this future across the reload below.
        let error = match conn.evaluate(&request.cmd).await {
            Ok(value) => return self.answer(request, &value),
            Err(e) if function_missing(&e) => e,
            // `FCALL` unknown or not permitted under `auto`: it did not
            // run either; the script goes in as a cached one.
            Err(e) if request.mode == Mode::Functions && self.modes.fall_back(&e) => e,
            Err(e) => return self.failed_after_send(request, e, progress),
        };

        // Function not found (NOSCRIPT for a cached script): it did not
        // run, nothing was charged. The node does not have the script (a
        // new, restarted or emptied node, FUNCTION FLUSH or DELETE, SCRIPT
        // FLUSH, a library another sidecar's start removed as unused):
        // load it there and try once more, with the same evaluation id, as
        // a re-send (like every one: rare, and not worth a proof that
        // nothing before it ran).
        // Boxed: rare, and its futures would otherwise make every
        // decision's as large.
        Box::pin(self.reload_and_retry(request, progress, conn, error)).await
    }

    async fn reload_and_retry(
        &self,
        request: &Request<'_>,
        progress: &mut Progress,
        mut conn: Conn,
        error: RedisError,
    ) -> Attempt {
        self.stats.noscript.count();
        tracing::debug!(error = %error, "redis: script missing, loading it again");
        let checkout = progress.sent.take();
        progress.loading = true;
        // `auto` may have moved to cached scripts since the command was
        // built (this call's own `FCALL` or `FUNCTION LOAD` found no
        // Functions, or another call did).
        let mut mode = request.mode;
        let again = scripts::resent(&request.cmd);
        let mut evalsha = None;
        let mut loaded = Ok(());
        for _ in 0..2 {
            if mode == Mode::Functions && self.modes.current() == Mode::Eval {
                if request.batch {
                    // Cached scripts have no batch function: nothing ran,
                    // and the members' next calls go one by one.
                    return Attempt::NotApplied(Unavailable::BeforeSend, Health::Unknown);
                }
                mode = Mode::Eval;
                evalsha = Some(scripts::as_evalsha(request.script, &again));
            }
            loaded = self
                .load(request.script, mode, &mut conn, request.key())
                .await;
            match &loaded {
                Err(e) if mode == Mode::Functions && self.modes.fall_back(e) => {}
                _ => break,
            }
        }
        if let Err(e) = loaded {
            if let Some(checkout) = &checkout {
                if broken_connection(&e) {
                    self.lanes.retire(checkout);
                }
            }
            // `FUNCTION LOAD` may write too: a full Redis refuses it, and
            // answered doing so (see `failed_after_send`).
            if e.code() == Some("OOM") {
                self.stats.out_of_memory.count_n(request.members());
                return Attempt::NotApplied(Unavailable::Refused, Health::Answered);
            }
            self.stats.unreachable.count_n(request.members());
            return Attempt::NotApplied(
                Unavailable::BeforeSend,
                Health::Failed(Cause::Unreachable),
            );
        }
        progress.loading = false;
        if let Some(not_sent) = self.past_deadline(request) {
            return not_sent;
        }
        progress.sent = checkout;
        match conn.evaluate(evalsha.as_ref().unwrap_or(&again)).await {
            Ok(value) => self.answer(request, &value),
            // Removed again between the load and the call: still nothing ran.
            Err(e) if function_missing(&e) => {
                self.stats.noscript.count();
                Attempt::NotApplied(Unavailable::BeforeSend, Health::Failed(Cause::Unreachable))
            }
            Err(e) => self.failed_after_send(request, e, progress),
        }
    }

    /// `deadline` moved later by the time this sidecar lost to its own
    /// event loop since the request arrived (`deadline - store.budget`,
    /// the budget as it was at start), and whether all of it was given
    /// back (at most [`lag::GIVEN_BACK`] is).
    pub(super) fn deadline(&self, deadline: Instant) -> (Instant, bool) {
        let now = Instant::now();
        let arrival = deadline.checked_sub(self.budget).unwrap_or(deadline);
        let lost = self.lag.lost_since(arrival, now);
        (
            deadline + lost.min(lag::GIVEN_BACK),
            lost <= lag::GIVEN_BACK,
        )
    }

    /// Whether `deadline` has passed, once given back what this sidecar
    /// lost; the lost time is only looked up for a deadline passed.
    pub(super) fn passed(&self, deadline: Instant) -> bool {
        let now = Instant::now();
        now >= deadline && now >= self.deadline(deadline).0
    }

    /// Sending after the deadline would only add load for an answer nobody
    /// waits for.
    fn past_deadline(&self, request: &Request<'_>) -> Option<Attempt> {
        if !self.passed(request.deadline) {
            return None;
        }
        self.stats.budget_spent.count_n(request.members());
        Some(Attempt::NotApplied(
            Unavailable::AdmissionRejected,
            Health::Unknown,
        ))
    }

    fn answer(&self, request: &Request<'_>, answer: &Answer) -> Attempt {
        if request.batch {
            return self.answer_batch(request, answer);
        }
        let replies: SmallVec<[Reply; 2]> = match reply::decode_answer(answer, &request.limits) {
            Ok(replies) => replies,
            Err(malformed) => {
                self.stats.malformed.count_n(request.members());
                if self.stats.may_warn() {
                    tracing::warn!(
                        reason = malformed.0,
                        algorithm = request.script.algorithm.map_or("several", |a| a.name()),
                        "redis: malformed script reply"
                    );
                }
                let outcome = Outcome::Incompatible(Incompatible::MalformedReply);
                return Attempt::Answered(Outcomes::at(0, outcome));
            }
        };
        let list = replies.iter().map(|reply| self.outcome(reply)).collect();
        let mut outcomes = Outcomes::empty();
        outcomes.list = list;
        Attempt::Answered(outcomes)
    }

    /// A batch's reply: each evaluation's outcome, as its own call's
    /// reply would have made it.
    fn answer_batch(&self, request: &Request<'_>, answer: &Answer) -> Attempt {
        let each = match coalesce::decode_batch(answer, &request.limits) {
            Ok(each) => each,
            Err(malformed) => {
                self.stats.malformed.count_n(request.members());
                if self.stats.may_warn() {
                    tracing::warn!(reason = malformed.0, "redis: malformed batch reply");
                }
                let outcome = Outcome::Incompatible(Incompatible::MalformedReply);
                return Attempt::Answered(Outcomes::at(0, outcome));
            }
        };
        let mut outcomes = Outcomes::empty();
        outcomes.list = each
            .iter()
            .map(|one: &coalesce::Each| match one {
                Ok(reply) => self.outcome(reply),
                Err(error) => {
                    self.stats.script_errors.count();
                    if self.stats.may_warn() {
                        tracing::warn!(error = %error, "redis: script failed");
                    }
                    Outcome::Incompatible(Incompatible::MalformedReply)
                }
            })
            .collect();
        Attempt::Answered(outcomes)
    }

    /// One limit's decoded reply, counted.
    fn outcome(&self, reply: &Reply) -> Outcome {
        match *reply {
            Reply::Decided {
                decision,
                replayed,
                skew,
            } => {
                if replayed {
                    self.stats.dedupe_hits.count();
                }
                if skew > 0 {
                    self.stats.clock_steps_absorbed.count();
                }
                Outcome::from_decision(decision)
            }
            Reply::ClockUnsafe { skew } => {
                self.stats.clock_unsafe.count();
                if self.stats.may_warn() {
                    tracing::warn!(
                        behind_us = skew,
                        "redis: clock went back past store.redis.max_clock_regression"
                    );
                }
                Outcome::Unavailable(Unavailable::ClockUnsafe)
            }
        }
    }

    /// A reply with an error code is Redis refusing the command before
    /// any of the script ran (`Unavailable(Refused)`: nothing was applied,
    /// so `on_failure` applies and there is nothing to retry under the
    /// same evaluation id or to refund), or the script failing
    /// (Incompatible). Only a call without a reply is Indeterminate: it
    /// may have run.
    fn failed_after_send(
        &self,
        request: &Request<'_>,
        error: RedisError,
        progress: &Progress,
    ) -> Attempt {
        // sluice's cluster connection had none to the node of the key's
        // slot, and could not open one: nothing was sent.
        if error.kind() == ErrorKind::ClusterConnectionNotFound {
            self.stats.unreachable.count_n(request.members());
            return Attempt::NotApplied(
                Unavailable::BeforeSend,
                Health::Failed(Cause::Unreachable),
            );
        }
        match error.code() {
            // This node cannot take writes now: a demoted primary keeps its
            // connections (and its address, behind a stable endpoint), so
            // only a new connection finds the new primary. Nothing ran.
            Some("READONLY" | "MASTERDOWN" | "LOADING") => {
                self.stats.refused.count_n(request.members());
                self.stats.reconnects.count();
                if self.stats.may_warn() {
                    tracing::warn!(error = %error, "redis: node cannot take writes, reconnecting");
                }
                if let Some(checkout) = &progress.sent {
                    self.lanes.retire(checkout);
                }
                Attempt::NotApplied(Unavailable::Refused, Health::Failed(Cause::Refused))
            }
            // Redis is at `maxmemory` with nothing its policy lets it evict
            // (always so under `noeviction`): it refuses every command that
            // may write, a function without `no-writes` whole, before
            // running any of it. Counted apart: it is fixed in Redis's
            // memory settings, not in sluice or the network.
            //
            // The request gets the failure answer (`on_failure`), for itself
            // alone: nothing ran, so nothing says the subject is over its
            // limit, and a 429 would tell a client within its limit to back
            // off and be remembered as a denial. But Redis answered, at
            // once, over a working connection: an answer for the breaker,
            // never a failure. One flood that fills Redis must not open the
            // breaker and refuse every subject for a cool-down, the ones
            // whose writes Redis can still take (as keys expire) included.
            Some("OOM") => {
                self.stats.out_of_memory.count_n(request.members());
                if self.stats.may_warn() {
                    tracing::warn!(
                        error = %error,
                        "redis: out of memory (maxmemory reached, nothing to evict), refused the evaluation"
                    );
                }
                Attempt::NotApplied(Unavailable::Refused, Health::Answered)
            }
            // Refused before the script ran: nothing was applied.
            Some(
                "BUSY" | "TRYAGAIN" | "CLUSTERDOWN" | "MOVED" | "ASK" | "MISCONF" | "NOREPLICAS"
                | "NOAUTH",
            ) => {
                self.stats.refused.count_n(request.members());
                if self.stats.may_warn() {
                    tracing::warn!(error = %error, "redis: refused the evaluation");
                }
                Attempt::NotApplied(Unavailable::Refused, Health::Failed(Cause::Refused))
            }
            // The script raised an error (its argument checks run before any
            // write), or Redis refused a command inside it (NOPERM): sluice
            // and this Redis disagree; retrying cannot help.
            Some(_) => {
                self.stats.script_errors.count_n(request.members());
                if self.stats.may_warn() {
                    tracing::warn!(error = %error, "redis: script failed");
                }
                let outcome = Outcome::Incompatible(Incompatible::MalformedReply);
                Attempt::Answered(Outcomes::at(0, outcome))
            }
            None => {
                self.stats.connection_lost.count_n(request.members());
                tracing::debug!(error = %error, "redis: no reply to a sent evaluation");
                if let Some(checkout) = &progress.sent {
                    if broken_connection(&error) {
                        self.lanes.retire(checkout);
                    }
                }
                Attempt::Ambiguous(Health::Failed(Cause::ConnectionLost))
            }
        }
    }
}

/// A decision, rather than no decision at all.
fn decided(outcome: &Outcome) -> bool {
    matches!(outcome, Outcome::Allowed(_) | Outcome::Denied(_))
}

/// The node has no such function, so it did not run. Redis 7 answers
/// `ERR Function not found` (redis-rs: a plain response error, code `ERR`);
/// `NOSCRIPT` is what a script missing from the cache got, kept for a
/// server that would answer so.
pub(super) fn function_missing(error: &RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
        || (error.code() == Some("ERR") && error.detail() == Some("Function not found"))
}

/// Errors after which the connection cannot be trusted with another
/// command: the socket failed, or the reply stream lost its framing.
pub(super) fn broken_connection(error: &RedisError) -> bool {
    error.code().is_none()
}
