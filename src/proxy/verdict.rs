//! What became of one request, as counted in `sluice_requests_total`.
//!
//! Counted exactly once per routed request, after the decision and before
//! any byte goes upstream; a request whose client went away while the
//! store decided, when its future is dropped ([`Verdict::ClientClosed`]).

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
    /// No decision from the store; `on_failure: local` admitted it within
    /// this sidecar's share. A decision, so not counted as forwarded
    /// without one.
    LocalAllowed,
    /// As [`Verdict::LocalAllowed`], over the local share: answered 429.
    LocalDenied,
    /// Over the local share under a shadow policy: counted, forwarded.
    LocalShadowDenied,
    /// Over a concurrency limit: answered 503, nothing of any rate limit
    /// charged.
    ConcurrencyDenied,
    /// The client went away while the store was being asked: never
    /// answered, never forwarded. The store may have charged it.
    ClientClosed,
}

/// Why a store made no decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    Unavailable(Unavailable),
    /// Sent, but no confirmed reply.
    Indeterminate,
}

/// The `outcome` label: one variant per value, so a route's request
/// counters are an array indexed by it ([`super::metrics::RouteMetrics`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeLabel {
    Unlimited,
    Allowed,
    Denied,
    ShadowDenied,
    Unavailable,
    Indeterminate,
    Incompatible,
    LocalAllowed,
    LocalDenied,
    LocalShadowDenied,
    ConcurrencyDenied,
    ClientClosed,
}

impl OutcomeLabel {
    /// Every variant, each at the position of its discriminant (checked
    /// below at compile time).
    pub const ALL: [OutcomeLabel; 12] = [
        OutcomeLabel::Unlimited,
        OutcomeLabel::Allowed,
        OutcomeLabel::Denied,
        OutcomeLabel::ShadowDenied,
        OutcomeLabel::Unavailable,
        OutcomeLabel::Indeterminate,
        OutcomeLabel::Incompatible,
        OutcomeLabel::LocalAllowed,
        OutcomeLabel::LocalDenied,
        OutcomeLabel::LocalShadowDenied,
        OutcomeLabel::ConcurrencyDenied,
        OutcomeLabel::ClientClosed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            OutcomeLabel::Unlimited => "unlimited",
            OutcomeLabel::Allowed => "allowed",
            OutcomeLabel::Denied => "denied",
            OutcomeLabel::ShadowDenied => "shadow_denied",
            OutcomeLabel::Unavailable => "unavailable",
            OutcomeLabel::Indeterminate => "indeterminate",
            OutcomeLabel::Incompatible => "incompatible",
            OutcomeLabel::LocalAllowed => "local_allowed",
            OutcomeLabel::LocalDenied => "local_denied",
            OutcomeLabel::LocalShadowDenied => "local_shadow_denied",
            OutcomeLabel::ConcurrencyDenied => "concurrency_denied",
            OutcomeLabel::ClientClosed => "client_closed",
        }
    }
}

// `OutcomeLabel as usize` indexes arrays built from `OutcomeLabel::ALL`.
const _: () = {
    let mut i = 0;
    while i < OutcomeLabel::ALL.len() {
        assert!(OutcomeLabel::ALL[i] as usize == i);
        i += 1;
    }
    assert!(OutcomeLabel::ClientClosed as usize + 1 == OutcomeLabel::ALL.len());
};

impl Verdict {
    /// Under which `outcome` it is counted. No catch-all: a new verdict
    /// is given its label here before sluice builds.
    pub fn outcome(&self) -> OutcomeLabel {
        match self {
            Verdict::Unlimited => OutcomeLabel::Unlimited,
            Verdict::Allowed => OutcomeLabel::Allowed,
            Verdict::Denied => OutcomeLabel::Denied,
            Verdict::ShadowDenied => OutcomeLabel::ShadowDenied,
            Verdict::FailedClosed(f) | Verdict::FailedOpen(f) => f.outcome(),
            Verdict::Incompatible(_) => OutcomeLabel::Incompatible,
            Verdict::LocalAllowed => OutcomeLabel::LocalAllowed,
            Verdict::LocalDenied => OutcomeLabel::LocalDenied,
            Verdict::LocalShadowDenied => OutcomeLabel::LocalShadowDenied,
            Verdict::ConcurrencyDenied => OutcomeLabel::ConcurrencyDenied,
            Verdict::ClientClosed => OutcomeLabel::ClientClosed,
        }
    }

    /// The `outcome` label.
    pub fn label(&self) -> &'static str {
        self.outcome().label()
    }

    /// Whether the request goes to the upstream.
    pub fn forwarded(&self) -> bool {
        match self {
            Verdict::Unlimited | Verdict::Allowed | Verdict::ShadowDenied => true,
            Verdict::FailedOpen(_) | Verdict::LocalAllowed | Verdict::LocalShadowDenied => true,
            Verdict::Denied
            | Verdict::FailedClosed(_)
            | Verdict::Incompatible(_)
            | Verdict::LocalDenied
            | Verdict::ConcurrencyDenied
            | Verdict::ClientClosed => false,
        }
    }

    /// Forwarded although no store said yes (`on_failure: allow`).
    pub fn forwarded_without_decision(&self) -> bool {
        matches!(self, Verdict::FailedOpen(_))
    }
}

impl Failure {
    pub fn outcome(&self) -> OutcomeLabel {
        match self {
            Failure::Unavailable(_) => OutcomeLabel::Unavailable,
            Failure::Indeterminate => OutcomeLabel::Indeterminate,
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

    #[test]
    fn a_local_decision_is_a_decision() {
        assert!(Verdict::LocalAllowed.forwarded());
        assert!(!Verdict::LocalAllowed.forwarded_without_decision());
        assert_eq!(Verdict::LocalAllowed.label(), "local_allowed");
        assert!(!Verdict::LocalDenied.forwarded());
        assert_eq!(Verdict::LocalDenied.label(), "local_denied");
        assert!(Verdict::LocalShadowDenied.forwarded());
        assert!(!Verdict::LocalShadowDenied.forwarded_without_decision());
        assert_eq!(Verdict::LocalShadowDenied.label(), "local_shadow_denied");
    }
}
