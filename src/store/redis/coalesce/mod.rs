//! Coalesced decisions (`store.coalesce: on`): Redis pays a cost per call
//! (the function's entry, parsing its arguments, the reply) that is most
//! of what a decision costs it, so decisions that arrive together go out
//! as one call that decides each of them, in order (`lua/batch.lua`).
//!
//! Per queue (one per lane), at most [`IN_FLIGHT`] calls in flight. A
//! decision that finds a turn free is sent at once, alone, as its own
//! call (no wait at low load): it *leads*. Decisions that arrive while
//! every turn is taken queue up; when a call ends, a task takes up to
//! [`MAX_BATCH`] of them and sends them together, one call per policy
//! (and, on Redis Cluster, per slot: never CROSSSLOT), and so on while
//! any wait. A decision waits for the call in flight before it, and at
//! most [`MAX_WAIT`]: past it, what waits is sent at once, beside that
//! call.
//!
//! Each member keeps its own deadline: one whose deadline passed while it
//! waited is `AdmissionRejected` and not sent; one whose request went away
//! is not sent. A batch runs through the same call path as a single
//! decision ([`Inner::decide`]): its deadline is its earliest member's, a
//! failure is classified for every member as a single call's would be
//! (not sent: Unavailable; sent without a confirmed reply: Indeterminate,
//! retried once with the same evaluation ids as a re-send, each the first
//! send admitted replaying its record),
//! and each member reports the call's health to the breaker through its
//! own permit.
//!
//! Only with Redis Functions settled: cached scripts (`EVALSHA`) have no
//! batch function, and under `auto` nothing is batched until the store
//! said which it has.

mod command;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use futures_util::future::join_all;
use smallvec::SmallVec;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::limit::{Outcome, Unavailable};
use crate::store::breaker::Health;
use crate::store::Evaluation;
use crate::sync;

use super::call::Request;
use super::mode::Mode;
use super::reply::Shape;
use super::scripts::Script;
use super::shards;
use super::Inner;

use command::Part;
pub(super) use command::{decode_batch, Each};

/// The most evaluations one call decides. Redis runs a call to its end
/// before any other command: 64 decisions keep one call under a few
/// hundred microseconds of Redis's time.
pub const MAX_BATCH: usize = 64;

/// Calls of one queue in flight at once. With one, decisions wait for it
/// rather than pipeline behind it: at 8 connections a sidecar decided a
/// quarter fewer requests a second than without coalescing. With two, one
/// call's round trip overlaps the other's, and what arrives meanwhile
/// still goes out together.
pub const IN_FLIGHT: usize = 2;

/// The longest a queued decision waits for the call in flight before it:
/// a call of a healthy Redis ends well within it (a round trip and the
/// scripts' time), so batches form on the call's end; a slower one lets
/// the queue go out anyway, with the rest of its budget.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_millis(2);

/// What a queued member gets back: its outcome and what its call said of
/// Redis, for its own breaker permit.
type Answer = (Outcome, Health);

/// No answer came: the task sending it went away with the runtime;
/// whether it was sent is not known.
const NO_ANSWER: Answer = (Outcome::Indeterminate, Health::Unknown);

pub(super) struct Coalescer {
    on: bool,
    queues: Box<[Queue]>,
    next: AtomicUsize,
    /// The store, for the task that sends what queued (set once the store
    /// is in its `Arc`).
    home: OnceLock<Weak<Inner>>,
}

struct Queue {
    state: Mutex<Waiting>,
}

#[derive(Default)]
struct Waiting {
    /// Calls of this queue in flight (leaders', or sending tasks'), at
    /// most [`IN_FLIGHT`]: decisions arriving while all are taken wait
    /// in `members`.
    in_flight: usize,
    members: Vec<Member>,
}

struct Member {
    script: Arc<Script>,
    /// The state key's slot on a cluster; `None` elsewhere.
    slot: Option<u16>,
    part: Part,
    shape: Shape,
    deadline: Instant,
    tx: oneshot::Sender<Answer>,
}

/// A decision's turn: send now (it leads; the guard frees the queue), or
/// wait for the batch it was queued into.
pub(super) enum Turn<'a> {
    Lead(Lead<'a>),
    Queued(Queued),
}

/// A queued decision's wait for its answer.
pub(super) struct Queued {
    queue: usize,
    answer: oneshot::Receiver<Answer>,
}

/// The queue's one call in flight, a leader's; when it ends (or the
/// request goes away), whatever queued meanwhile is sent.
pub(super) struct Lead<'a> {
    coalescer: &'a Coalescer,
    queue: usize,
}

impl Drop for Lead<'_> {
    fn drop(&mut self) {
        self.coalescer.release(self.queue);
    }
}

impl Coalescer {
    pub fn new(on: bool, queues: usize) -> Coalescer {
        Coalescer {
            on,
            queues: (0..queues.max(1))
                .map(|_| Queue {
                    state: Mutex::new(Waiting::default()),
                })
                .collect(),
            next: AtomicUsize::new(0),
            home: OnceLock::new(),
        }
    }

    pub fn set_home(&self, home: Weak<Inner>) {
        let _ = self.home.set(home);
    }

    /// Whether decisions coalesce now: configured so, on Functions.
    pub fn applies(&self, mode: Option<Mode>) -> bool {
        self.on && mode == Some(Mode::Functions)
    }

    /// Takes `evaluation`'s turn on the next queue.
    pub fn join(
        &self,
        inner: &Inner,
        script: &Arc<Script>,
        shape: Shape,
        evaluation: &Evaluation<'_>,
    ) -> Turn<'_> {
        let queue = self.next.fetch_add(1, Ordering::Relaxed) % self.queues.len();
        let mut waiting = self.queues[queue].lock();
        if waiting.in_flight < IN_FLIGHT {
            waiting.in_flight += 1;
            return Turn::Lead(Lead {
                coalescer: self,
                queue,
            });
        }
        let part = Part::of(inner.scripts.common(), evaluation);
        let slot = inner.cluster.then(|| shards::slot_of(part.key()));
        let (tx, rx) = oneshot::channel();
        waiting.members.push(Member {
            script: script.clone(),
            slot,
            part,
            shape,
            deadline: evaluation.deadline,
            tx,
        });
        Turn::Queued(Queued { queue, answer: rx })
    }

    /// The answer of a queued decision. Its queue is sent when the call in
    /// flight ends, or after [`MAX_WAIT`] if that call takes longer (a
    /// slow Redis must not eat the queued decisions' budgets): then what
    /// waits goes out at once, a second call in flight.
    pub async fn wait(&self, queued: Queued) -> Answer {
        let Queued { queue, answer } = queued;
        let mut answer = std::pin::pin!(answer);
        if let Ok(answered) = tokio::time::timeout(MAX_WAIT, answer.as_mut()).await {
            return answered.unwrap_or(NO_ANSWER);
        }
        self.flush(queue);
        answer.await.unwrap_or(NO_ANSWER)
    }

    /// Sends what `queue` holds now, beside the call in flight.
    fn flush(&self, queue: usize) {
        let members: Vec<Member> = {
            let mut waiting = self.queues[queue].lock();
            let n = waiting.members.len().min(MAX_BATCH);
            waiting.members.drain(..n).collect()
        };
        if members.is_empty() {
            // Taken already: its call is on its way.
            return;
        }
        let home = self.home.get().and_then(Weak::upgrade);
        if let (Some(inner), Ok(runtime)) = (home, tokio::runtime::Handle::try_current()) {
            runtime.spawn(async move { inner.send_members(members).await });
        }
    }

    /// The queue's call ended: idle again, or a task sends what waits.
    fn release(&self, queue: usize) {
        let mut waiting = self.queues[queue].lock();
        if waiting.members.is_empty() {
            waiting.in_flight -= 1;
            return;
        }
        let home = self.home.get().and_then(Weak::upgrade);
        match (home, tokio::runtime::Handle::try_current()) {
            (Some(inner), Ok(runtime)) => {
                // The task takes this call's turn.
                drop(waiting);
                runtime.spawn(drive(inner, queue));
            }
            // The store or the runtime is going away: the members' wait
            // ends with no answer (Indeterminate, as for a dropped call).
            _ => {
                waiting.in_flight -= 1;
                waiting.members.clear();
            }
        }
    }
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, Waiting> {
        // Holds a flag and a list, each changed whole.
        sync::lock(&self.state)
    }
}

/// Sends what `queue` holds, batch after batch, until it is empty.
async fn drive(inner: Arc<Inner>, queue: usize) {
    loop {
        let members: Vec<Member> = {
            let mut waiting = inner.coalescer.queues[queue].lock();
            if waiting.members.is_empty() {
                waiting.in_flight -= 1;
                return;
            }
            let n = waiting.members.len().min(MAX_BATCH);
            waiting.members.drain(..n).collect()
        };
        inner.send_members(members).await;
    }
}

/// Members of one call: one policy's script, one slot.
struct Group {
    script: Arc<Script>,
    slot: Option<u16>,
    members: Vec<Member>,
}

impl Inner {
    /// One call per policy (and slot) for `members`, concurrently.
    async fn send_members(&self, members: Vec<Member>) {
        let mut groups: SmallVec<[Group; 1]> = SmallVec::new();
        for member in members {
            // Its request went away: not sent, as a dropped call is not.
            if member.tx.is_closed() {
                continue;
            }
            if self.passed(member.deadline) {
                self.stats.budget_spent.count();
                let rejected = Outcome::Unavailable(Unavailable::AdmissionRejected);
                let _ = member.tx.send((rejected, Health::Unknown));
                continue;
            }
            match groups
                .iter_mut()
                .find(|g| Arc::ptr_eq(&g.script, &member.script) && g.slot == member.slot)
            {
                Some(group) => group.members.push(member),
                None => groups.push(Group {
                    script: member.script.clone(),
                    slot: member.slot,
                    members: vec![member],
                }),
            }
        }
        join_all(groups.into_iter().map(|group| self.send_group(group))).await;
    }

    async fn send_group(&self, group: Group) {
        let mode = self.modes.current();
        let batch = match (group.members.len(), mode) {
            (1, _) | (_, Mode::Eval) => None,
            (_, Mode::Functions) => {
                let parts: SmallVec<[&Part; 8]> = group.members.iter().map(|m| &m.part).collect();
                command::batch(&group.script, &parts, self.first_sends())
            }
        };
        let Some(cmd) = batch else {
            // Alone, or no batch function here: each its own call.
            let script = &group.script;
            join_all(group.members.into_iter().map(|member| async move {
                let request = Request {
                    script,
                    mode,
                    cmd: command::single(script, mode, &member.part, self.first_sends()),
                    limits: smallvec::smallvec![member.shape],
                    deadline: member.deadline,
                    batch: false,
                };
                let (outcomes, health) = self.decide(&request).await;
                let outcome = outcomes
                    .list
                    .first()
                    .copied()
                    .unwrap_or(Outcome::Indeterminate);
                let _ = member.tx.send((outcome, health));
            }))
            .await;
            return;
        };
        let deadline = group
            .members
            .iter()
            .map(|m| m.deadline)
            .min()
            .unwrap_or_else(Instant::now);
        let request = Request {
            script: &group.script,
            mode,
            cmd,
            limits: group.members.iter().map(|m| m.shape).collect(),
            deadline,
            batch: true,
        };
        self.stats.batches.count();
        self.stats.batched.count_n(group.members.len() as u64);
        let (outcomes, health) = self.decide(&request).await;
        if outcomes.list.len() == group.members.len() {
            for (member, outcome) in group.members.into_iter().zip(outcomes.list) {
                let _ = member.tx.send((outcome, health));
            }
        } else {
            // The call failed whole: its one outcome is every member's.
            let outcome = outcomes
                .list
                .first()
                .copied()
                .unwrap_or(Outcome::Indeterminate);
            for member in group.members {
                let _ = member.tx.send((outcome, health));
            }
        }
    }
}
