//! Giving back what a limit charged, on Redis Cluster (and without
//! Functions), when a later limit of the same request refused it. There a
//! route's limits live in different slots and are decided one call each,
//! in order (docs/LIMITS.md, "Several limits on one route"), so a request
//! a later limit refuses has already been charged to the earlier ones. Each refund is one call of the policy's refund
//! script (`lua/refund.lua`) on the charged key's node, with the charge's
//! own evaluation id: the script gives back only what that evaluation's
//! record says it took, once, so the call may be sent again without giving
//! back twice. Not atomic: between the charge and its refund another
//! request may find the limit spent (docs/LIMITS.md, "Several limits on one
//! route").

use redis::{RedisError, Value};
use tokio::time::{timeout_at, Instant};

use crate::store::Evaluation;

use super::mode::Mode;
use super::pool::Stage;
use super::scripts::{self, Script};
use super::Inner;

/// How one refund ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refund {
    /// The charge was given back.
    Refunded,
    /// There was nothing to give back: the evaluation's record says it
    /// charged nothing (or has been refunded), or is gone.
    Unneeded,
    /// Not known to be given back (no answer in time, the breaker open, an
    /// error): the charge may stand until the limit's window passes.
    Failed,
}

impl Inner {
    /// Gives back what each of `charged` took, all calls at once, within one
    /// `store.budget` from now. Counted in `sluice_refunds_total`.
    pub(super) async fn refund(&self, charged: &[&Evaluation<'_>]) {
        let deadline = Instant::now() + self.budget;
        let calls = charged.iter().map(|e| self.refund_one(e, deadline));
        for result in futures_util::future::join_all(calls).await {
            self.count_refund(result);
        }
    }

    /// Counts one refund in `sluice_refunds_total`.
    pub(super) fn count_refund(&self, result: Refund) {
        match result {
            Refund::Refunded => self.stats.refunded.count(),
            Refund::Unneeded => self.stats.refund_unneeded.count(),
            Refund::Failed => self.stats.refund_failed.count(),
        }
    }

    pub(super) async fn refund_one(
        &self,
        evaluation: &Evaluation<'_>,
        deadline: Instant,
    ) -> Refund {
        // A refund asks nothing of the breaker and tells it nothing: it is
        // not a decision, and must not hold the probe real requests bring.
        if !self.breaker.admits(Instant::now()) {
            return Refund::Failed;
        }
        let (script, _) = self.scripts.refund(evaluation.policy);
        let mode = self.modes.current();
        let packed = scripts::refund_call(&script, mode, self.scripts.common(), evaluation);
        let key = packed.args().nth(3).unwrap_or_default().to_vec();
        // Through the lane's connection as any command: a refund is rare.
        let cmd = packed.to_cmd();
        // A refund is safe to send twice: a second try after an ambiguous
        // first gives back nothing the first already did.
        for _ in 0..2 {
            match timeout_at(deadline, self.refund_exchange(&script, mode, &cmd, &key)).await {
                Ok(Ok(value)) => return read(&value),
                Ok(Err(e)) if e.code().is_some() => {
                    tracing::debug!(error = %e, "redis: refund refused");
                    return Refund::Failed;
                }
                Ok(Err(e)) => tracing::debug!(error = %e, "redis: refund got no reply"),
                Err(_) => return Refund::Failed,
            }
        }
        Refund::Failed
    }

    /// One try: `FCALL` (`EVALSHA`), and once more after loading the
    /// script where the node does not have it (function not found,
    /// NOSCRIPT).
    async fn refund_exchange(
        &self,
        script: &Script,
        mode: Mode,
        cmd: &redis::Cmd,
        key: &[u8],
    ) -> Result<Value, RedisError> {
        let mut stage = Stage::Waiting;
        let checkout = self.lanes.acquire(&mut stage).await?;
        let mut conn = checkout.conn.clone();
        match cmd.query_async::<Value>(&mut conn).await {
            Err(e) if super::call::function_missing(&e) => {
                self.stats.noscript.count();
                self.load(script, mode, &mut conn, key).await?;
                cmd.query_async::<Value>(&mut conn).await
            }
            Err(e) => {
                if e.code().is_none() {
                    self.lanes.retire(&checkout);
                }
                Err(e)
            }
            answered => answered,
        }
    }
}

/// The refund script's reply: `{1, given_back}` (`lua/README.md`).
fn read(value: &Value) -> Refund {
    match value {
        Value::Array(items) => match items.as_slice() {
            [Value::Int(1), Value::Int(1)] => Refund::Refunded,
            [Value::Int(1), Value::Int(0)] => Refund::Unneeded,
            _ => Refund::Failed,
        },
        _ => Refund::Failed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_versioned_reply_and_nothing_else() {
        let reply = |items: Vec<Value>| Value::Array(items);
        assert_eq!(
            read(&reply(vec![Value::Int(1), Value::Int(1)])),
            Refund::Refunded
        );
        assert_eq!(
            read(&reply(vec![Value::Int(1), Value::Int(0)])),
            Refund::Unneeded
        );
        assert_eq!(
            read(&reply(vec![Value::Int(2), Value::Int(1)])),
            Refund::Failed
        );
        assert_eq!(read(&reply(vec![Value::Int(1)])), Refund::Failed);
        assert_eq!(read(&Value::Int(1)), Refund::Failed);
    }
}
