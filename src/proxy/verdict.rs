//! What became of one request, as counted in `sluice_requests_total`.
//!
//! Counted exactly once per routed request, after the decision and before
//! any byte goes upstream.

use crate::limit::{Incompatible, Unavailable};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// `policy: none`: forwarded without limiting.
    Unlimited,
    Allowed,
    /// Answered 429.
    Denied,
    /// Over the limit under a shadow policy: counted, forwarded.
    ShadowDenied,
    /// No decision; `on_failure: deny` answered 503.
    FailedClosed(Failure),
    /// No decision; `on_failure: allow` forwarded it anyway. The request
    /// sluice lets through without a decision, counted separately.
    FailedOpen(Failure),
    /// Answered 503 whatever `on_failure` says.
    Incompatible(Incompatible),
}

/// Why a store made no decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Unavailable(Unavailable),
    /// Sent, but no confirmed reply.
    Indeterminate,
}

impl Verdict {
    /// The `outcome` label.
    pub fn label(&self) -> &'static str {
        match self {
            Verdict::Unlimited => "unlimited",
            Verdict::Allowed => "allowed",
            Verdict::Denied => "denied",
            Verdict::ShadowDenied => "shadow_denied",
            Verdict::FailedClosed(f) | Verdict::FailedOpen(f) => f.label(),
            Verdict::Incompatible(_) => "incompatible",
        }
    }

    /// Whether the request goes to the upstream.
    pub fn forwarded(&self) -> bool {
        match self {
            Verdict::Unlimited | Verdict::Allowed | Verdict::ShadowDenied => true,
            Verdict::FailedOpen(_) => true,
            Verdict::Denied | Verdict::FailedClosed(_) | Verdict::Incompatible(_) => false,
        }
    }

    /// Forwarded although no store said yes (`on_failure: allow`).
    pub fn forwarded_without_decision(&self) -> bool {
        matches!(self, Verdict::FailedOpen(_))
    }
}

impl Failure {
    pub fn label(&self) -> &'static str {
        match self {
            Failure::Unavailable(_) => "unavailable",
            Failure::Indeterminate => "indeterminate",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failing_open_is_forwarded_without_a_decision() {
        let open = Verdict::FailedOpen(Failure::Indeterminate);
        assert!(open.forwarded());
        assert!(open.forwarded_without_decision());
        assert_eq!(open.label(), "indeterminate");

        let closed = Verdict::FailedClosed(Failure::Unavailable(Unavailable::BeforeSend));
        assert!(!closed.forwarded());
        assert!(!closed.forwarded_without_decision());
        assert_eq!(closed.label(), "unavailable");

        assert!(Verdict::ShadowDenied.forwarded());
        assert!(!Verdict::ShadowDenied.forwarded_without_decision());
        assert!(!Verdict::Denied.forwarded());
    }
}
