use std::num::NonZeroU32;
use std::sync::Arc;

use http_body_util::BodyExt;

use super::*;
use crate::config::{Match, SubjectSource};
use crate::limit::{Bands, BucketBand, WindowBand};

fn window(limit: u32, window: Duration) -> WindowBand {
    WindowBand {
        limit: NonZeroU32::new(limit).unwrap(),
        window,
    }
}

fn policy(name: &str, bands: Bands) -> Policy {
    Policy {
        name: Arc::from(name),
        revision: Arc::from("r1"),
        bands,
        shadow: false,
    }
}

fn route(name: &str) -> Route {
    Route {
        name: Arc::from(name),
        matcher: Match::default(),
        subject: vec![SubjectSource::ClientIp],
        policy: None,
        cost: 1,
    }
}

fn denied(band: usize, remaining: u64, reset: Duration, retry: Duration) -> Decision {
    Decision {
        allowed: false,
        band,
        remaining,
        reset_after: reset,
        retry_after: retry,
        approximate: false,
    }
}

async fn json(response: Response<Body>) -> serde_json::Value {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn too_many_requests_carries_fields_and_problem_body() {
    let api = policy(
        "api",
        Bands::SlidingCounter(vec![window(100, Duration::from_secs(60))]),
    );
    let decision = denied(
        0,
        0,
        Duration::from_millis(16_200),
        Duration::from_millis(1_500),
    );
    let response = too_many_requests(&route("api-route"), &api, &decision);

    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = response.headers();
    assert_eq!(h["retry-after"], "2");
    assert_eq!(h["ratelimit-policy"], r#""api";q=100;w=60"#);
    assert_eq!(h["ratelimit"], r#""api";r=0;t=17"#);
    assert_eq!(h["content-type"], "application/problem+json");
    assert_eq!(h["cache-control"], "no-store");

    let body = json(response).await;
    assert_eq!(body["type"], "about:blank");
    assert_eq!(body["title"], "Too Many Requests");
    assert_eq!(body["status"], 429);
    assert_eq!(body["route"], "api-route");
    assert_eq!(body["policy"], "api");
    assert_eq!(body["retry_after"], 2);
    assert!(body["detail"].as_str().unwrap().contains("api-route"));
}

#[tokio::test]
async fn several_bands_are_listed_and_the_binding_one_is_named() {
    let export = policy(
        "export",
        Bands::FixedWindow(vec![
            window(10, Duration::from_secs(1)),
            window(1000, Duration::from_secs(3600)),
        ]),
    );
    let decision = denied(1, 3, Duration::from_secs(1800), Duration::ZERO);
    let response = too_many_requests(&route("export"), &export, &decision);
    let h = response.headers();
    assert_eq!(
        h["ratelimit-policy"],
        r#""export-0";q=10;w=1, "export-1";q=1000;w=3600"#
    );
    assert_eq!(h["ratelimit"], r#""export-1";r=3;t=1800"#);
    // Never `Retry-After: 0`.
    assert_eq!(h["retry-after"], "1");
}

#[test]
fn bucket_windows_and_short_windows_round_up() {
    let login = policy(
        "login",
        Bands::TokenBucket(vec![BucketBand {
            capacity: NonZeroU32::new(5).unwrap(),
            refill_tokens: NonZeroU32::new(2).unwrap(),
            refill_every: Duration::from_millis(1500),
        }]),
    );
    // Three periods of 1.5 s refill 5 tokens: 4.5 s, announced as 5.
    assert_eq!(policy_value(&login), r#""login";q=5;w=5"#);
    let fast = policy(
        "fast",
        Bands::FixedWindow(vec![window(3, Duration::from_millis(250))]),
    );
    assert_eq!(policy_value(&fast), r#""fast";q=3;w=1"#);
}

#[test]
fn names_are_valid_structured_field_strings() {
    let odd = policy(
        "a\"b\\c\u{e9}",
        Bands::FixedWindow(vec![window(1, Duration::from_secs(1))]),
    );
    assert_eq!(policy_value(&odd), r#""a\"b\\c_";q=1;w=1"#);
}

#[tokio::test]
async fn unavailable_has_retry_after_and_policy_but_no_decision() {
    let api = policy(
        "api",
        Bands::FixedWindow(vec![window(100, Duration::from_secs(60))]),
    );
    let response = unavailable(&route("api"), &api, Duration::from_millis(200));
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let h = response.headers();
    assert_eq!(h["retry-after"], "1");
    assert_eq!(h["ratelimit-policy"], r#""api";q=100;w=60"#);
    assert!(!h.contains_key("ratelimit"));
    let body = json(response).await;
    assert_eq!(body["status"], 503);
    assert_eq!(body["title"], "Service Unavailable");
    assert_eq!(body["retry_after"], 1);
    assert_eq!(body["policy"], "api");
}

#[tokio::test]
async fn gateway_errors_are_problems_without_route() {
    for (response, status) in [
        (bad_gateway(), 502),
        (gateway_timeout(), 504),
        (bad_request("the request has no Host"), 400),
        (not_implemented("chunked only"), 501),
    ] {
        assert_eq!(response.status().as_u16(), status);
        assert_eq!(response.headers()["cache-control"], "no-store");
        assert!(!response.headers().contains_key("retry-after"));
        let body = json(response).await;
        assert_eq!(body["status"], status);
        assert!(body.get("route").is_none());
        assert!(body.get("policy").is_none());
    }
}
