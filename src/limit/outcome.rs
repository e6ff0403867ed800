//! The typed result of one evaluation, the same for every store.

use std::time::Duration;

/// What a policy said about one request, from whichever band binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Whether every band admitted the request (and was charged).
    pub allowed: bool,
    /// Index of the binding band: the one that denied, or, when allowed,
    /// the band with the least remaining.
    pub band: usize,
    /// Units left in the binding band after this request.
    pub remaining: u64,
    /// Until the binding band's quota is back to full.
    pub reset_after: Duration,
    /// When denied: the earliest wait after which this request could pass.
    /// When allowed: how long the request must wait for its turn before
    /// it is forwarded (a GCRA policy with `delay`); zero otherwise.
    pub retry_after: Duration,
    /// Sliding-counter decisions estimate the previous window's share.
    pub approximate: bool,
}

/// Why a store could not make a decision. Each maps to `on_failure`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unavailable {
    /// Budget spent before sending, pool exhausted, breaker open, or
    /// a memory store with room for nothing (a full one evicts instead:
    /// `store::memory`).
    AdmissionRejected,
    /// The store could not be reached; nothing was sent.
    BeforeSend,
    /// The store received the command and refused to run it (Redis out of
    /// memory, busy, read-only, ...): nothing was applied.
    Refused,
    /// The store's clock went back further than the allowed bound.
    ClockUnsafe,
}

/// Why a request and a store cannot be evaluated together at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Incompatible {
    UnknownPolicy,
    CostAboveMaximum,
    MalformedReply,
}

/// Exactly one per evaluation. Matched exhaustively in one place
/// (`proxy::service`), so a new variant breaks the build, not a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed(Decision),
    Denied(Decision),
    Unavailable(Unavailable),
    /// Sent, but no confirmed reply: it may have consumed budget.
    Indeterminate,
    Incompatible(Incompatible),
}

impl Outcome {
    /// Builds Allowed or Denied from an algorithm's decision.
    pub fn from_decision(decision: Decision) -> Self {
        if decision.allowed {
            Outcome::Allowed(decision)
        } else {
            Outcome::Denied(decision)
        }
    }

    /// Whether it stops the request, and with it the charging of its other
    /// limits: a denial, unless the policy is `shadow` (which never
    /// blocks), or no decision at all.
    pub fn blocks(&self, shadow: bool) -> bool {
        match self {
            Outcome::Allowed(_) => false,
            Outcome::Denied(_) => !shadow,
            Outcome::Unavailable(_) | Outcome::Indeterminate | Outcome::Incompatible(_) => true,
        }
    }

    /// A short, bounded label for logs and metrics.
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Allowed(_) => "allowed",
            Outcome::Denied(_) => "denied",
            Outcome::Unavailable(_) => "unavailable",
            Outcome::Indeterminate => "indeterminate",
            Outcome::Incompatible(_) => "incompatible",
        }
    }
}
