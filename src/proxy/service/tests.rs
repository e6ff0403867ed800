use std::path::Path;
use std::time::Duration;

use http::StatusCode;

use super::*;
use crate::config::Config;
use crate::limit::{Incompatible, Unavailable};

fn config(on_failure: &str, headers_on_allowed: bool, shadow: bool) -> Live {
    config_with(
        &format!("{{ kind: memory, on_failure: {on_failure}, failure_retry_after: 2500ms }}"),
        "",
        headers_on_allowed,
        shadow,
    )
}

/// `store` is the store section's flow mapping; `policy_extra` more keys of
/// the one policy (`, on_failure: local`).
fn config_with(store: &str, policy_extra: &str, headers_on_allowed: bool, shadow: bool) -> Live {
    let yaml = format!(
        "version: 1
server: {{ listen: 127.0.0.1:0 }}
upstream: {{ url: http://127.0.0.1:9 }}
store: {store}
identity: {{ pseudonym_key: k0123456789abcdef }}
responses: {{ ratelimit_headers_on_allowed: {headers_on_allowed} }}
policies:
  api: {{ algorithm: fixed-window, limit: 10, window: 1m, shadow: {shadow}{policy_extra} }}
routes:
  - {{ name: api, match: {{ path_prefix: / }}, subject: client_ip, policy: api }}
"
    );
    match Config::parse(Path::new("decide.yaml"), &yaml) {
        Ok(config) => config.live,
        Err(errors) => panic!("{errors}"),
    }
}

fn decision(allowed: bool) -> Decision {
    Decision {
        allowed,
        band: 0,
        remaining: if allowed { 4 } else { 0 },
        reset_after: Duration::from_secs(30),
        retry_after: if allowed {
            Duration::ZERO
        } else {
            Duration::from_secs(7)
        },
        approximate: false,
    }
}

/// The verdict, and the status answered (`None`: forwarded, with whether
/// `RateLimit` fields are to be added).
fn run(config: &Live, outcome: Outcome) -> (Verdict, Result<bool, Response<Body>>) {
    run_with(config, outcome, &Fallback::new(100, Duration::ZERO))
}

fn run_with(
    config: &Live,
    outcome: Outcome,
    fallback: &Fallback,
) -> (Verdict, Result<bool, Response<Body>>) {
    let route = &config.routes[0];
    let policy = route.limits[0]
        .policy
        .as_rate()
        .expect("the route has a rate policy");
    let responses = respond::Prepared::new(route, 0);
    let subject = crate::subject::PseudonymKey::new(b"k", 1).pseudonym("ip", b"10.0.0.1", "api");
    let evaluation = Evaluation {
        policy,
        subject: &subject,
        cost: 1,
        deadline: Instant::now(),
        id: EvaluationId(0),
    };
    let local = Local {
        fallback,
        evaluation: &evaluation,
        charge: true,
    };
    let (verdict, action) = decide(outcome, route, policy, &responses, config, &local);
    let action = match action {
        Action::Forward { ratelimit } => Ok(ratelimit.is_some()),
        Action::Respond(response) => Err(response),
    };
    (verdict, action)
}

#[test]
fn allowed_is_forwarded_with_fields_when_configured() {
    let (verdict, action) = run(
        &config("deny", true, false),
        Outcome::Allowed(decision(true)),
    );
    assert_eq!(verdict, Verdict::Allowed);
    assert!(matches!(action, Ok(true)));

    let (_, action) = run(
        &config("deny", false, false),
        Outcome::Allowed(decision(true)),
    );
    assert!(matches!(action, Ok(false)));

    // A shadow policy never shows itself to clients.
    let (_, action) = run(
        &config("deny", true, true),
        Outcome::Allowed(decision(true)),
    );
    assert!(matches!(action, Ok(false)));
}

#[test]
fn denied_is_429_unless_shadow() {
    let (verdict, action) = run(
        &config("deny", true, false),
        Outcome::Denied(decision(false)),
    );
    assert_eq!(verdict, Verdict::Denied);
    let response = action.expect_err("answered by sluice");
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "7");

    let (verdict, action) = run(
        &config("deny", true, true),
        Outcome::Denied(decision(false)),
    );
    assert_eq!(verdict, Verdict::ShadowDenied);
    assert!(matches!(action, Ok(false)));
}

#[test]
fn no_decision_follows_on_failure() {
    let failures = [
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
    ];
    for (outcome, failure) in failures {
        let (verdict, action) = run(&config("deny", true, false), outcome);
        assert_eq!(verdict, Verdict::FailedClosed(failure));
        let response = action.expect_err("fail closed answers 503");
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        // 2.5 s rounded up.
        assert_eq!(response.headers()["retry-after"], "3");

        let (verdict, action) = run(&config("allow", true, false), outcome);
        assert_eq!(verdict, Verdict::FailedOpen(failure));
        assert!(verdict.forwarded_without_decision());
        assert!(matches!(action, Ok(false)));
    }
}

#[test]
fn incompatible_is_503_even_when_failing_open() {
    let outcome = Outcome::Incompatible(Incompatible::CostAboveMaximum);
    let (verdict, action) = run(&config("allow", true, false), outcome);
    assert_eq!(
        verdict,
        Verdict::Incompatible(Incompatible::CostAboveMaximum)
    );
    let response = action.expect_err("never forwarded");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

const REDIS_LOCAL: &str = "{ kind: redis, url: redis://127.0.0.1:9, on_failure: local, local_share: 3, failure_retry_after: 2500ms }";

#[test]
fn local_decides_each_failure_alone_within_its_share() {
    let config = config_with(REDIS_LOCAL, "", true, false);
    let fallback = Fallback::new(100, Duration::ZERO);
    let outcomes = [
        Outcome::Unavailable(Unavailable::BeforeSend),
        Outcome::Unavailable(Unavailable::AdmissionRejected),
        Outcome::Indeterminate,
    ];
    // limit 10, share 3: 3 admitted, the rest 429 with the local figures.
    let mut verdicts = Vec::new();
    for i in 0..5 {
        let (verdict, action) = run_with(&config, outcomes[i % 3], &fallback);
        assert!(!verdict.forwarded_without_decision());
        match action {
            Ok(ratelimit) => assert!(!ratelimit, "no RateLimit fields on a local admission"),
            Err(response) => {
                assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
                assert_eq!(response.headers()["ratelimit-policy"], "\"api\";q=3;w=60");
                assert!(response.headers().contains_key("retry-after"));
            }
        }
        verdicts.push(verdict);
    }
    use Verdict::{LocalAllowed as A, LocalDenied as D};
    assert_eq!(verdicts, [A, A, A, D, D]);
    assert!(fallback.active());
}

#[test]
fn a_policy_overrides_the_stores_on_failure() {
    // The store fails closed; the policy decides locally.
    let store = "{ kind: redis, url: redis://127.0.0.1:9, on_failure: deny }";
    let config = config_with(store, ", on_failure: local", false, false);
    let (verdict, _) = run(&config, Outcome::Indeterminate);
    assert_eq!(verdict, Verdict::LocalAllowed);

    // The store decides locally; the policy fails open.
    let config = config_with(REDIS_LOCAL, ", on_failure: allow", false, false);
    let (verdict, _) = run(&config, Outcome::Indeterminate);
    assert_eq!(verdict, Verdict::FailedOpen(Failure::Indeterminate));

    // ... or closed.
    let config = config_with(REDIS_LOCAL, ", on_failure: deny", false, false);
    let (verdict, action) = run(&config, Outcome::Indeterminate);
    assert_eq!(verdict, Verdict::FailedClosed(Failure::Indeterminate));
    let response = action.expect_err("503");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[test]
fn a_shadow_policy_over_its_local_share_is_forwarded() {
    let config = config_with(REDIS_LOCAL, "", true, true);
    let fallback = Fallback::new(100, Duration::ZERO);
    let verdicts: Vec<Verdict> = (0..4)
        .map(|_| run_with(&config, Outcome::Indeterminate, &fallback).0)
        .collect();
    assert_eq!(verdicts[3], Verdict::LocalShadowDenied);
    assert!(verdicts.iter().all(|v| v.forwarded()));
}

#[test]
fn a_full_local_store_fails_closed() {
    let config = config_with(REDIS_LOCAL, "", true, false);
    // No room for even one subject.
    let fallback = Fallback::new(0, Duration::ZERO);
    let (verdict, action) = run_with(&config, Outcome::Indeterminate, &fallback);
    assert_eq!(verdict, Verdict::FailedClosed(Failure::Indeterminate));
    assert_eq!(
        action.expect_err("503").status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}
