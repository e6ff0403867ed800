//! What makes the store ready and keeps readiness true to Redis: the
//! start-up task that connects and loads every library, and the breaker's
//! own probe while no request brings one.

use std::num::NonZeroU32;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use tokio::time::Instant;

use crate::limit::{Bands, Policy, WindowBand};
use crate::store::{Evaluation, EvaluationId};
use crate::subject::{Pseudonym, PseudonymKey};

use super::mode::Mode;
use super::{Inner, PREPARE_TIMEOUT};

const PREPARE_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// A fixed window far above anything it is charged, on a key of its own
/// under the store's prefix: evaluating it proves Redis runs the scripts
/// and takes writes, and consumes nothing anyone else counts.
pub(super) struct Probe {
    pub(super) policy: Policy,
    pub(super) subject: Pseudonym,
}

impl Probe {
    pub(super) fn new() -> Probe {
        let band = WindowBand {
            limit: NonZeroU32::new(1_000_000).expect("non-zero"),
            window: Duration::from_secs(1),
        };
        Probe {
            policy: Policy::new("sluice-probe", "1", Bands::FixedWindow(vec![band]), false),
            subject: PseudonymKey::new(b"sluice-probe", 1).pseudonym("probe", b"", "probe"),
        }
    }
}

/// While the breaker waits for its probe and no request brings one (a pod
/// whose readiness failed gets no traffic), sends the probe itself, so the
/// store recovers, and readiness with it, within a cool-down of Redis
/// deciding again.
/// Rests while the breaker is closed (nothing to probe for), until it
/// opens.
pub(super) async fn probe(inner: Weak<Inner>, cooldown: Duration) {
    let Some(left_closed) = inner.upgrade().map(|store| store.breaker.left_closed()) else {
        return;
    };
    let every = (cooldown / 4).clamp(Duration::from_millis(10), Duration::from_millis(250));
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(store) = inner.upgrade() else {
            return;
        };
        let prepared = store.prepared.load(Ordering::Acquire);
        if prepared && store.breaker.closed() {
            // Not holding the store meanwhile: its drop wakes this too. An
            // opening since `closed` was read left a permit.
            drop(store);
            left_closed.notified().await;
            tick.reset();
            continue;
        }
        let now = Instant::now();
        if !prepared || !store.breaker.wants_probe(now) {
            continue;
        }
        store.stats.probes.count();
        let evaluation = Evaluation {
            policy: &store.probe.policy,
            subject: &store.probe.subject,
            cost: 1,
            deadline: now + store.budget,
            id: EvaluationId::fresh(),
            settle_within: None,
        };
        let outcome = store.evaluate(&evaluation).await;
        tracing::debug!(?outcome, "redis: breaker probe");
    }
}

/// Connects and loads every script, retrying with backoff until it works
/// or the store is dropped. Readiness waits for it.
pub(super) async fn prepare(inner: Weak<Inner>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(store) = inner.upgrade() else {
            return;
        };
        match tokio::time::timeout(PREPARE_TIMEOUT, store.load_all()).await {
            Ok(Ok(())) => {
                store.prepared.store(true, Ordering::Release);
                let mode = store.modes.current();
                tracing::info!(
                    scripts = mode.name(),
                    setting = store.modes.setting().name(),
                    "redis: connected, scripts loaded"
                );
                if mode == Mode::Functions {
                    store.prune_in_time().await;
                }
                return;
            }
            Ok(Err(e)) => match store.modes.refused() {
                Some(why) => tracing::error!("redis: not ready: {why}"),
                None => tracing::warn!(error = %e, "redis: not ready yet"),
            },
            Err(_) => tracing::warn!("redis: not ready yet: timed out"),
        }
        drop(store);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(PREPARE_BACKOFF_MAX);
    }
}

impl Inner {
    /// Deletes the libraries no sidecar uses any more (`libraries`), only
    /// once the ones this sidecar needs are in.
    async fn prune_in_time(&self) {
        match tokio::time::timeout(PREPARE_TIMEOUT, self.prune()).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(deleted = n, "redis: unused libraries deleted"),
            Ok(Err(e)) => tracing::warn!(
                error = %e,
                "redis: unused libraries not deleted (the user needs +function|list +function|delete)"
            ),
            Err(_) => tracing::warn!("redis: unused libraries not deleted: timed out"),
        }
    }
}
