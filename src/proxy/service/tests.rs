use std::path::Path;
use std::time::Duration;

use http::StatusCode;

use super::*;
use crate::config::Config;
use crate::limit::{Incompatible, Unavailable};

fn config(on_failure: &str, headers_on_allowed: bool, shadow: bool) -> Live {
    let yaml = format!(
        "version: 1
server: {{ listen: 127.0.0.1:0 }}
upstream: {{ url: http://127.0.0.1:9 }}
store: {{ kind: memory, on_failure: {on_failure}, failure_retry_after: 2500ms }}
responses: {{ ratelimit_headers_on_allowed: {headers_on_allowed} }}
policies:
  api: {{ algorithm: fixed-window, limit: 10, window: 1m, shadow: {shadow} }}
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
    let route = &config.routes[0];
    let policy = route.limits[0]
        .policy
        .as_rate()
        .expect("the route has a rate policy");
    let responses = respond::Prepared::new(route, 0);
    let (verdict, action) = decide(outcome, route, policy, &responses, config);
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
