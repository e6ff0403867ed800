//! The planner against every combination of outcomes, shadow,
//! `on_failure` and local fallback for one and two limits, and across
//! routes; an independent statement of the rule (`expected`) is the
//! reference.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use tokio::time::Instant;

use super::*;
use crate::config::Config;
use crate::limit::{Incompatible, Unavailable};
use crate::proxy::fallback::Fallback;
use crate::proxy::runtime::Runtime;
use crate::store::EvaluationId;
use crate::subject::{Pseudonym, PseudonymKey, Resolved};

const REDIS: &str = "{ kind: redis, url: redis://127.0.0.1:9, on_failure: local, local_share: 1, failure_retry_after: 2500ms }";

/// A runtime with these policies and routes (YAML lines under
/// `policies:` and `routes:`).
fn runtime(store: &str, headers_on_allowed: bool, policies: &str, routes: &str) -> Runtime {
    let yaml = format!(
        "version: 1
server: {{ listen: 127.0.0.1:0 }}
upstream: {{ url: http://127.0.0.1:9 }}
store: {store}
identity: {{ pseudonym_key: k0123456789abcdef }}
responses: {{ ratelimit_headers_on_allowed: {headers_on_allowed} }}
policies:
{policies}routes:
{routes}"
    );
    match Config::parse(Path::new("plan.yaml"), &yaml) {
        Ok(config) => Runtime::new(Arc::new(config.live), PseudonymKey::new(b"plan-tests", 1)),
        Err(errors) => panic!("{errors}\n{yaml}"),
    }
}

/// One route, `api`, with the policy `one`.
fn single(store: &str, headers_on_allowed: bool, policy: &str) -> Runtime {
    runtime(
        store,
        headers_on_allowed,
        &format!("  one: {{ algorithm: fixed-window, limit: 10, window: 1m{policy} }}\n"),
        "  - { name: api, match: { path_prefix: / }, subject: client_ip, policy: one }\n",
    )
}

fn subject() -> Pseudonym {
    PseudonymKey::new(b"k", 1).pseudonym("ip", b"10.0.0.1", "api")
}

fn decision(allowed: bool, remaining: u64) -> Decision {
    Decision {
        allowed,
        band: 0,
        remaining,
        reset_after: Duration::from_secs(30),
        retry_after: if allowed {
            Duration::ZERO
        } else {
            Duration::from_secs(7)
        },
        approximate: false,
    }
}

/// What became of a request, in plain values.
#[derive(Debug)]
struct Judged {
    /// The route (its position among those matched), the limit, the
    /// verdict and the answer.
    refused: Option<(usize, usize, Verdict, Response<Body>)>,
    /// Per matched route, what it is counted under; when forwarded.
    counted: Vec<(usize, Verdict)>,
    /// The `remaining` of the `RateLimit` fields sent.
    ratelimit: Option<u64>,
}

impl Judged {
    fn status(&self) -> Option<StatusCode> {
        self.refused.as_ref().map(|(.., r)| r.status())
    }

    fn headers(&self) -> &HeaderMap {
        self.refused.as_ref().expect("refused").3.headers()
    }
}

/// Judges a request matching the runtime's routes `routes` (in that
/// order), every limit counting one subject, as the proxy does: the
/// store answered `outcomes`, and `fallback` decides (charging) what is
/// left to it, or only reads it when the request is refused anyway.
fn judge(runtime: &Runtime, routes: &[usize], outcomes: &Outcomes, fallback: &Fallback) -> Judged {
    let subject = subject();
    let entries: Vec<_> = routes.iter().map(|&i| runtime.entry(i)).collect();
    let checks: Vec<Check<'_>> = entries
        .iter()
        .enumerate()
        .flat_map(|(route_at, &entry)| {
            (0..entry.route.limits.len()).map(move |limit| Check {
                entry,
                route_at,
                limit,
                subject,
                resolved: Resolved::ClientIp,
                tier: 0,
            })
        })
        .collect();
    let (limits, evaluations) = asked(&checks, Instant::now(), Duration::from_secs(70));
    let rated = rated(&limits, &evaluations);
    let live = &*runtime.live;
    let plan = plan(&rated, outcomes, live);
    let asked: Vec<_> = plan.locals().collect();
    let judgement = if asked.is_empty() {
        plan.settled()
    } else if plan.refused() {
        let (local, shared) = fallback.peek_all(&asked, live.store.local_share);
        plan.settle(&local, &shared, live)
    } else {
        let (local, shared) = fallback.evaluate_all(&asked, live.store.local_share);
        plan.settle(&local, &shared, live)
    };
    match judgement {
        Judgement::Refused(r) => Judged {
            refused: Some((r.check.route_at, r.check.limit, r.verdict, r.response)),
            counted: Vec::new(),
            ratelimit: None,
        },
        Judgement::Passed(passed) => Judged {
            refused: None,
            counted: entries
                .iter()
                .enumerate()
                .map(|(at, _)| passed.counted(at, &checks))
                .collect(),
            ratelimit: passed.ratelimit.map(|(_, d)| d.remaining),
        },
    }
}

/// One limit's store outcome, judged alone.
fn alone(runtime: &Runtime, outcome: Outcome, fallback: &Fallback) -> Judged {
    judge(runtime, &[0], &Outcomes::at(0, outcome), fallback)
}

fn fresh() -> Fallback {
    Fallback::new(100, Duration::ZERO)
}

#[test]
fn allowed_is_forwarded_with_fields_when_configured() {
    let judged = alone(
        &single("{ kind: memory }", true, ""),
        Outcome::Allowed(decision(true, 4)),
        &fresh(),
    );
    assert!(judged.refused.is_none());
    assert_eq!(judged.counted, [(0, Verdict::Allowed)]);
    assert_eq!(judged.ratelimit, Some(4));

    let runtime = single("{ kind: memory }", false, "");
    let judged = alone(&runtime, Outcome::Allowed(decision(true, 4)), &fresh());
    assert_eq!(judged.ratelimit, None);

    // A shadow policy never shows itself to clients.
    let runtime = single("{ kind: memory }", true, ", shadow: true");
    let judged = alone(&runtime, Outcome::Allowed(decision(true, 4)), &fresh());
    assert_eq!(judged.counted, [(0, Verdict::Allowed)]);
    assert_eq!(judged.ratelimit, None);
}

#[test]
fn denied_is_429_unless_shadow() {
    let runtime = single("{ kind: memory }", true, "");
    let judged = alone(&runtime, Outcome::Denied(decision(false, 0)), &fresh());
    assert_eq!(judged.status(), Some(StatusCode::TOO_MANY_REQUESTS));
    assert!(matches!(judged.refused, Some((0, 0, Verdict::Denied, _))));
    assert_eq!(judged.headers()["retry-after"], "7");

    let runtime = single("{ kind: memory }", true, ", shadow: true");
    let judged = alone(&runtime, Outcome::Denied(decision(false, 0)), &fresh());
    assert!(judged.refused.is_none());
    assert_eq!(judged.counted, [(0, Verdict::ShadowDenied)]);
    assert_eq!(judged.ratelimit, None);
}

fn failures() -> [(Outcome, Failure); 5] {
    [
        (
            Outcome::Unavailable(Unavailable::BeforeSend),
            Failure::Unavailable(Unavailable::BeforeSend),
        ),
        (
            Outcome::Unavailable(Unavailable::AdmissionRejected),
            Failure::Unavailable(Unavailable::AdmissionRejected),
        ),
        (
            Outcome::Unavailable(Unavailable::ClockUnsafe),
            Failure::Unavailable(Unavailable::ClockUnsafe),
        ),
        (
            Outcome::Unavailable(Unavailable::Refused),
            Failure::Unavailable(Unavailable::Refused),
        ),
        (Outcome::Indeterminate, Failure::Indeterminate),
    ]
}

#[test]
fn no_decision_follows_on_failure() {
    let closed = single(
        "{ kind: memory, on_failure: deny, failure_retry_after: 2500ms }",
        true,
        "",
    );
    let open = single("{ kind: memory, on_failure: allow }", true, "");
    for (outcome, failure) in failures() {
        let judged = alone(&closed, outcome, &fresh());
        let Some((0, 0, verdict, response)) = &judged.refused else {
            panic!("fail closed answers: {judged:?}");
        };
        assert_eq!(*verdict, Verdict::FailedClosed(failure));
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        // 2.5 s rounded up.
        assert_eq!(response.headers()["retry-after"], "3");

        let judged = alone(&open, outcome, &fresh());
        assert_eq!(judged.counted, [(0, Verdict::FailedOpen(failure))]);
        assert!(judged.counted[0].1.forwarded_without_decision());
        assert_eq!(judged.ratelimit, None);
    }
}

#[test]
fn incompatible_is_503_even_when_failing_open() {
    let runtime = single("{ kind: memory, on_failure: allow }", true, "");
    let outcome = Outcome::Incompatible(Incompatible::CostAboveMaximum);
    let judged = alone(&runtime, outcome, &fresh());
    let Some((0, 0, verdict, response)) = &judged.refused else {
        panic!("never forwarded: {judged:?}");
    };
    assert_eq!(
        *verdict,
        Verdict::Incompatible(Incompatible::CostAboveMaximum)
    );
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[test]
fn local_decides_each_failure_within_its_share() {
    let store = "{ kind: redis, url: redis://127.0.0.1:9, on_failure: local, local_share: 3, failure_retry_after: 2500ms }";
    let runtime = single(store, true, "");
    let fallback = fresh();
    let outcomes = [
        Outcome::Unavailable(Unavailable::BeforeSend),
        Outcome::Unavailable(Unavailable::AdmissionRejected),
        Outcome::Indeterminate,
    ];
    // limit 10, share 3: 3 admitted, the rest 429 with the local figures.
    let mut verdicts = Vec::new();
    for i in 0..5 {
        let judged = alone(&runtime, outcomes[i % 3], &fallback);
        assert_eq!(
            judged.ratelimit, None,
            "no RateLimit fields on a local admission"
        );
        match &judged.refused {
            None => verdicts.push(judged.counted[0].1),
            Some((_, _, verdict, response)) => {
                assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                assert_eq!(response.headers()["ratelimit-policy"], "\"one\";q=3;w=60");
                assert!(response.headers().contains_key("retry-after"));
                verdicts.push(*verdict);
            }
        }
    }
    assert!(verdicts.iter().all(|v| !v.forwarded_without_decision()));
    use Verdict::{LocalAllowed as A, LocalDenied as D};
    assert_eq!(verdicts, [A, A, A, D, D]);
    assert!(fallback.active());
}

#[test]
fn a_policy_overrides_the_stores_on_failure() {
    // The store fails closed; the policy decides locally.
    let store = "{ kind: redis, url: redis://127.0.0.1:9, on_failure: deny }";
    let runtime = single(store, false, ", on_failure: local");
    let judged = alone(&runtime, Outcome::Indeterminate, &fresh());
    assert_eq!(judged.counted, [(0, Verdict::LocalAllowed)]);

    // The store decides locally; the policy fails open.
    let runtime = single(REDIS, false, ", on_failure: allow");
    let judged = alone(&runtime, Outcome::Indeterminate, &fresh());
    assert_eq!(
        judged.counted,
        [(0, Verdict::FailedOpen(Failure::Indeterminate))]
    );

    // ... or closed.
    let runtime = single(REDIS, false, ", on_failure: deny");
    let judged = alone(&runtime, Outcome::Indeterminate, &fresh());
    assert!(matches!(
        judged.refused,
        Some((0, 0, Verdict::FailedClosed(Failure::Indeterminate), _))
    ));
    assert_eq!(judged.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
}

#[test]
fn a_shadow_policy_over_its_local_share_is_forwarded() {
    let store = "{ kind: redis, url: redis://127.0.0.1:9, on_failure: local, local_share: 3 }";
    let runtime = single(store, true, ", shadow: true");
    let fallback = fresh();
    let verdicts: Vec<Verdict> = (0..4)
        .map(|_| {
            let judged = alone(&runtime, Outcome::Indeterminate, &fallback);
            assert!(judged.refused.is_none(), "{judged:?}");
            judged.counted[0].1
        })
        .collect();
    assert_eq!(verdicts[..3], [Verdict::LocalAllowed; 3]);
    assert_eq!(verdicts[3], Verdict::LocalShadowDenied);
}

#[test]
fn a_full_local_store_fails_closed() {
    let runtime = single(REDIS, true, "");
    // No room for even one subject.
    let judged = alone(
        &runtime,
        Outcome::Indeterminate,
        &Fallback::new(0, Duration::ZERO),
    );
    assert!(matches!(
        judged.refused,
        Some((0, 0, Verdict::FailedClosed(Failure::Indeterminate), _))
    ));
    assert_eq!(judged.status(), Some(StatusCode::SERVICE_UNAVAILABLE));
}

// --- several limits: every combination against the rule stated plainly --

/// The store's answer for one limit, before the run is cut where the
/// store stops.
#[derive(Debug, Clone, Copy)]
enum Answer {
    Allowed(u64),
    Denied,
    Unavailable,
    Indeterminate,
    Incompatible,
}

impl Answer {
    const ALL: [Answer; 6] = [
        Answer::Allowed(4),
        Answer::Allowed(2),
        Answer::Denied,
        Answer::Unavailable,
        Answer::Indeterminate,
        Answer::Incompatible,
    ];

    fn outcome(self) -> Outcome {
        match self {
            Answer::Allowed(remaining) => Outcome::Allowed(decision(true, remaining)),
            Answer::Denied => Outcome::Denied(decision(false, 0)),
            Answer::Unavailable => Outcome::Unavailable(Unavailable::BeforeSend),
            Answer::Indeterminate => Outcome::Indeterminate,
            Answer::Incompatible => Outcome::Incompatible(Incompatible::CostAboveMaximum),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Deny,
    Allow,
    Local,
}

impl Mode {
    fn yaml(self) -> &'static str {
        match self {
            Mode::Deny => "deny",
            Mode::Allow => "allow",
            Mode::Local => "local",
        }
    }
}

/// One limit as a test sets it: shadow, `on_failure`, and whether its
/// local share is already spent.
#[derive(Debug, Clone, Copy)]
struct Limit {
    shadow: bool,
    mode: Mode,
    spent: bool,
}

/// What one limit alone asks: go on (verdict, `RateLimit` remaining
/// shown), or refuse (verdict, status); and whether the local fallback
/// decided it.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Own {
    Pass(Verdict, Option<u64>),
    Refuse(Verdict, StatusCode),
}

fn own(limit: Limit, answer: Answer, headers_on_allowed: bool) -> (Own, bool) {
    let failure = match answer {
        Answer::Allowed(remaining) => {
            let shown = (headers_on_allowed && !limit.shadow).then_some(remaining);
            return (Own::Pass(Verdict::Allowed, shown), false);
        }
        Answer::Denied if limit.shadow => return (Own::Pass(Verdict::ShadowDenied, None), false),
        Answer::Denied => {
            return (
                Own::Refuse(Verdict::Denied, StatusCode::TOO_MANY_REQUESTS),
                false,
            )
        }
        Answer::Incompatible => {
            let verdict = Verdict::Incompatible(Incompatible::CostAboveMaximum);
            return (Own::Refuse(verdict, StatusCode::SERVICE_UNAVAILABLE), false);
        }
        Answer::Unavailable => Failure::Unavailable(Unavailable::BeforeSend),
        Answer::Indeterminate => Failure::Indeterminate,
    };
    let own = match limit.mode {
        Mode::Deny => Own::Refuse(
            Verdict::FailedClosed(failure),
            StatusCode::SERVICE_UNAVAILABLE,
        ),
        Mode::Allow => Own::Pass(Verdict::FailedOpen(failure), None),
        Mode::Local if !limit.spent => Own::Pass(Verdict::LocalAllowed, None),
        Mode::Local if limit.shadow => Own::Pass(Verdict::LocalShadowDenied, None),
        Mode::Local => Own::Refuse(Verdict::LocalDenied, StatusCode::TOO_MANY_REQUESTS),
    };
    (own, limit.mode == Mode::Local)
}

/// Refused (the limit, verdict and status), or else counted as (limit,
/// verdict) with the `RateLimit` remaining sent.
type Expected = (
    Option<(usize, Verdict, StatusCode)>,
    (usize, Verdict),
    Option<u64>,
);

/// The rule, stated plainly: the store's answers as the store gives them
/// (a run cut at the first answer that blocks, the limits after an
/// undecided one following it); the first refusal among the limits the
/// store decided answers, unless a local limit before it refuses first;
/// a request nothing refuses is counted under its earliest verdict that
/// is not Allowed, and carries the fields of the least remaining.
fn expected(limits: &[Limit], answers: &[Answer], headers_on_allowed: bool) -> Expected {
    let mut seen: Vec<(usize, Own, bool)> = Vec::new();
    let mut follow: Option<Answer> = None;
    for (i, (&limit, &answer)) in limits.iter().zip(answers).enumerate() {
        let answer = follow.unwrap_or(answer);
        let (own, local) = own(limit, answer, headers_on_allowed);
        seen.push((i, own, local));
        let blocks = match answer {
            Answer::Allowed(_) => false,
            Answer::Denied => !limit.shadow,
            Answer::Unavailable | Answer::Indeterminate => {
                follow = Some(answer);
                false
            }
            Answer::Incompatible => true,
        };
        if blocks || matches!(own, Own::Refuse(..)) && !local {
            break;
        }
    }
    let first_refusal = seen
        .iter()
        .find(|(_, own, local)| !local && matches!(own, Own::Refuse(..)));
    let local_refusal = seen
        .iter()
        .take_while(|(i, ..)| first_refusal.is_none_or(|(r, ..)| i < r))
        .find(|(_, own, local)| *local && matches!(own, Own::Refuse(..)));
    if let Some(&(i, Own::Refuse(verdict, status), _)) = local_refusal.or(first_refusal) {
        return (Some((i, verdict, status)), (0, Verdict::Allowed), None);
    }
    let counted = seen
        .iter()
        .find_map(|&(i, own, _)| match own {
            Own::Pass(verdict, _) if verdict != Verdict::Allowed => Some((i, verdict)),
            _ => None,
        })
        .unwrap_or((0, Verdict::Allowed));
    let mut ratelimit: Option<u64> = None;
    for (_, own, _) in &seen {
        if let Own::Pass(_, Some(remaining)) = own {
            if ratelimit.is_none_or(|best| *remaining < best) {
                ratelimit = Some(*remaining);
            }
        }
    }
    (None, counted, ratelimit)
}

/// The store's run for `answers`: cut after the first that blocks.
fn run(limits: &[Limit], answers: &[Answer]) -> Outcomes {
    let mut outcomes = Outcomes::empty();
    for (limit, answer) in limits.iter().zip(answers) {
        let outcome = answer.outcome();
        outcomes.list.push(outcome);
        if outcome.blocks(limit.shadow) {
            break;
        }
    }
    outcomes
}

/// A fallback where each limit marked spent has no local quota left.
fn fallback_for(runtime: &Runtime, limits: &[Limit]) -> Fallback {
    let fallback = fresh();
    let subject = subject();
    let live = &*runtime.live;
    for (i, limit) in limits.iter().enumerate() {
        let policy = runtime.live.routes[0].limits[i]
            .policy
            .as_rate()
            .expect("rate policies");
        let evaluation = Evaluation {
            policy,
            subject: &subject,
            cost: 1,
            deadline: Instant::now(),
            id: EvaluationId(0),
            settle_within: None,
        };
        if limit.spent {
            // Charged until it refuses (a refusal charges nothing).
            while let (Outcome::Allowed(_), _) =
                fallback.evaluate(&evaluation, policy, live.store.local_share)
            {}
        }
    }
    fallback
}

fn every_limit() -> Vec<Limit> {
    let mut all = Vec::new();
    for shadow in [false, true] {
        for mode in [Mode::Deny, Mode::Allow, Mode::Local] {
            for spent in [false, true] {
                if spent && mode != Mode::Local {
                    continue;
                }
                all.push(Limit {
                    shadow,
                    mode,
                    spent,
                });
            }
        }
    }
    all
}

fn two_limits(a: Limit, b: Limit, headers_on_allowed: bool) -> Runtime {
    let policy = |name: &str, limit: Limit| {
        format!(
            "  {name}: {{ algorithm: fixed-window, limit: 2, window: 1h, shadow: {}, on_failure: {} }}\n",
            limit.shadow,
            limit.mode.yaml()
        )
    };
    runtime(
        REDIS,
        headers_on_allowed,
        &(policy("a", a) + &policy("b", b)),
        "  - name: api
    match: { path_prefix: / }
    limits:
      - { policy: a, subject: client_ip }
      - { policy: b, subject: client_ip }
",
    )
}

#[test]
fn two_limits_in_every_combination_follow_the_rule() {
    let mut cases = 0;
    for a in every_limit() {
        for b in every_limit() {
            for headers_on_allowed in [false, true] {
                let runtime = two_limits(a, b, headers_on_allowed);
                let limits = [a, b];
                for first in Answer::ALL {
                    for second in Answer::ALL {
                        let answers = [first, second];
                        let case = format!("{limits:?} {answers:?} headers {headers_on_allowed}");
                        let outcomes = run(&limits, &answers);
                        let fallback = fallback_for(&runtime, &limits);
                        let judged = judge(&runtime, &[0], &outcomes, &fallback);
                        let (refused, counted, ratelimit) =
                            expected(&limits, &answers, headers_on_allowed);
                        match (&judged.refused, refused) {
                            (Some((0, limit, verdict, response)), Some((i, v, status))) => {
                                assert_eq!((*limit, *verdict), (i, v), "{case}");
                                assert_eq!(response.status(), status, "{case}");
                            }
                            (None, None) => {
                                assert_eq!(judged.counted, [counted], "{case}");
                                assert_eq!(judged.ratelimit, ratelimit, "{case}");
                            }
                            (got, want) => panic!("{case}: judged {got:?}, expected {want:?}"),
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    assert_eq!(cases, 8 * 8 * 2 * 36);
}

#[test]
fn a_request_a_limit_refuses_charges_no_local_limit_before_it() {
    let open = Limit {
        shadow: false,
        mode: Mode::Local,
        spent: false,
    };
    let closed = Limit {
        mode: Mode::Deny,
        ..open
    };
    let runtime = two_limits(open, closed, false);
    let fallback = fresh();
    // `a` is left to the fallback, `b` fails closed: refused, and `a`'s
    // local quota of 2 is only read, not charged.
    let outcomes = Outcomes::at(0, Outcome::Indeterminate);
    for _ in 0..3 {
        let judged = judge(&runtime, &[0], &outcomes, &fallback);
        assert!(matches!(
            judged.refused,
            Some((0, 1, Verdict::FailedClosed(_), _))
        ));
    }
    let judged = alone(&single(REDIS, false, ""), Outcome::Indeterminate, &fallback);
    assert_eq!(judged.counted, [(0, Verdict::LocalAllowed)]);
    let policy = runtime.live.routes[0].limits[0]
        .policy
        .as_rate()
        .expect("rate");
    let subject = subject();
    let evaluation = Evaluation {
        policy,
        subject: &subject,
        cost: 1,
        deadline: Instant::now(),
        id: EvaluationId(0),
        settle_within: None,
    };
    match fallback
        .peek(&evaluation, policy, runtime.live.store.local_share)
        .0
    {
        Outcome::Allowed(decision) => assert_eq!(decision.remaining, 1, "nothing of `a` charged"),
        other => panic!("{other:?}"),
    }
}

/// Two routes (a request running as two methods): each is counted under
/// its own limit, and a refusal by the second route's limit answers.
#[test]
fn each_matched_route_is_counted_under_its_own_limits() {
    let runtime = runtime(
        "{ kind: memory }",
        true,
        "  read: { algorithm: fixed-window, limit: 5, window: 1m }
  write: { algorithm: fixed-window, limit: 5, window: 1m, shadow: true }
",
        "  - { name: reads, match: { methods: [GET], path_prefix: / }, subject: client_ip, policy: read }
  - { name: writes, match: { methods: [POST], path_prefix: / }, subject: client_ip, policy: write }
  - { name: open, match: { methods: [PUT], path_prefix: / }, policy: none }
",
    );
    let both = |a: Outcome, b: Outcome| Outcomes {
        first: 0,
        list: smallvec::smallvec![a, b],
        source: crate::store::Source::Store,
        at: 0,
    };
    let allowed = Outcome::Allowed(decision(true, 3));
    let denied = Outcome::Denied(decision(false, 0));

    let judged = judge(&runtime, &[0, 1, 2], &both(allowed, denied), &fresh());
    assert_eq!(
        judged.counted,
        [
            (0, Verdict::Allowed),
            (0, Verdict::ShadowDenied),
            (0, Verdict::Unlimited)
        ]
    );
    assert_eq!(judged.ratelimit, Some(3));

    // The first route refuses: the second's limit was never asked.
    let judged = judge(&runtime, &[0, 1], &Outcomes::at(0, denied), &fresh());
    assert!(matches!(judged.refused, Some((0, 0, Verdict::Denied, _))));

    // Swapped: the shadow route lets it through, the other refuses.
    let judged = judge(&runtime, &[1, 0], &both(denied, denied), &fresh());
    assert!(matches!(judged.refused, Some((1, 0, Verdict::Denied, _))));
}

/// The over-limit cache answers for one limit alone: the limits before it
/// were not asked, and the request is refused by that one.
#[test]
fn a_run_that_starts_later_is_refused_by_its_first_answer() {
    let limit = Limit {
        shadow: false,
        mode: Mode::Deny,
        spent: false,
    };
    let runtime = two_limits(limit, limit, true);
    let outcomes = Outcomes::at(1, Outcome::Denied(decision(false, 0)));
    let judged = judge(&runtime, &[0], &outcomes, &fresh());
    assert!(matches!(judged.refused, Some((0, 1, Verdict::Denied, _))));
}

/// A run cut short after an answer that does not block leaves a limit no
/// answer: it is judged as one the store gave no confirmed reply for,
/// never let through unjudged.
#[test]
fn a_limit_left_without_an_answer_is_not_let_through() {
    let limit = Limit {
        shadow: false,
        mode: Mode::Deny,
        spent: false,
    };
    let runtime = two_limits(limit, limit, true);
    let outcomes = Outcomes::at(0, Outcome::Allowed(decision(true, 1)));
    let judged = judge(&runtime, &[0], &outcomes, &fresh());
    assert!(matches!(
        judged.refused,
        Some((0, 1, Verdict::FailedClosed(Failure::Indeterminate), _))
    ));
}
