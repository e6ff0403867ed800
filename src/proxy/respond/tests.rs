use std::num::NonZeroU32;
use std::sync::Arc;

use http_body_util::BodyExt;

use super::*;
use crate::limit::algorithm::{evaluate, State};
use crate::limit::{Bands, BucketBand, Concurrency, GcraBand, WindowBand};
use crate::route::{Limit, Match, SubjectSource};

pub(super) fn window(limit: u32, window: Duration) -> WindowBand {
    WindowBand {
        limit: NonZeroU32::new(limit).unwrap(),
        window,
    }
}

pub(super) fn policy(name: &str, bands: Bands) -> Policy {
    Policy::new(name, "r1", bands, false)
}

/// Route `name` limited by each of `policies`, per client.
pub(super) fn route_of(name: &str, policies: Vec<LimitPolicy>) -> Route {
    Route {
        name: Arc::from(name),
        matcher: Match::default(),
        limits: policies
            .into_iter()
            .map(|policy| Limit {
                policy,
                subject: vec![SubjectSource::ClientIp],
                cost: 1,
                charge: Default::default(),
                tier: None,
            })
            .collect(),
        upgrades: Arc::from(Vec::new()),
        tiers: None,
        answers: Default::default(),
        addresses: Default::default(),
    }
}

/// The answers of route `route` limited by `policy` alone.
fn answers(route: &str, policy: &Policy) -> Prepared {
    let r = route_of(route, vec![LimitPolicy::Rate(Arc::new(policy.clone()))]);
    Prepared::new(&r, 0)
}

fn value(policy: &Policy) -> String {
    let mut out = String::new();
    policy_value(&mut out, policy);
    out
}

pub(super) fn denied(band: usize, remaining: u64, reset: Duration, retry: Duration) -> Decision {
    Decision {
        allowed: false,
        band,
        remaining,
        reset_after: reset,
        retry_after: retry,
        approximate: false,
    }
}

pub(super) async fn json(response: Response<Body>) -> serde_json::Value {
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
    let response = too_many_requests(&answers("api-route", &api), &decision);

    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let h = response.headers();
    assert_eq!(h["retry-after"], "2");
    assert_eq!(h["ratelimit-policy"], r#""api";q=100;w=60"#);
    // `t` agrees with `Retry-After`, not with when the window is full again.
    assert_eq!(h["ratelimit"], r#""api";r=0;t=2"#);
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
    let response = too_many_requests(&answers("export", &export), &decision);
    let h = response.headers();
    assert_eq!(
        h["ratelimit-policy"],
        r#""export-0";q=10;w=1, "export-1";q=1000;w=3600"#
    );
    // Never `Retry-After: 0`, nor a `t` that disagrees with it.
    assert_eq!(h["ratelimit"], r#""export-1";r=3;t=1"#);
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
            max_wait_us: 0,
        }]),
    );
    // Three periods of 1.5 s refill 5 tokens: 4.5 s, announced as 5.
    assert_eq!(value(&login), r#""login";q=5;w=5"#);
    let fast = policy(
        "fast",
        Bands::FixedWindow(vec![window(3, Duration::from_millis(250))]),
    );
    assert_eq!(value(&fast), r#""fast";q=3;w=1"#);
}

#[test]
fn seconds_round_up_without_overflowing() {
    assert_eq!(ceil_secs(Duration::from_millis(1)), 1);
    assert_eq!(ceil_secs(Duration::from_secs(2)), 2);
    // Found by the `ratelimit_fields` fuzz target: an overflow panic.
    assert_eq!(ceil_secs(Duration::MAX), u64::MAX);
    let max = policy("max", Bands::FixedWindow(vec![window(1, Duration::MAX)]));
    assert_eq!(value(&max), r#""max";q=1;w=999999999999999"#);
}

#[test]
fn integers_stay_within_fifteen_digits() {
    let long = policy(
        "long",
        Bands::FixedWindow(vec![window(1, Duration::from_secs(u64::MAX / 2))]),
    );
    assert_eq!(value(&long), r#""long";q=1;w=999999999999999"#);
    let prepared = answers("r", &long);
    let mut headers = HeaderMap::new();
    let d = Decision {
        allowed: true,
        ..denied(
            0,
            3_834_876_866_653_073_456,
            Duration::from_secs(10_u64.pow(15)),
            Duration::ZERO,
        )
    };
    add_ratelimit_headers(&mut headers, &prepared, &d);
    assert_eq!(
        headers["ratelimit"],
        r#""long";r=999999999999999;t=999999999999999"#
    );
}

#[test]
fn names_are_valid_structured_field_strings() {
    let odd = policy(
        "a\"b\\c\u{e9}",
        Bands::FixedWindow(vec![window(1, Duration::from_secs(1))]),
    );
    assert_eq!(value(&odd), r#""a\"b\\c_";q=1;w=1"#);
}

#[tokio::test]
async fn unavailable_has_retry_after_and_policy_but_no_decision() {
    let api = policy(
        "api",
        Bands::FixedWindow(vec![window(100, Duration::from_secs(60))]),
    );
    let response = unavailable(&answers("api", &api), Duration::from_millis(200));
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
        (broken_upstream_response(), 502),
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

#[tokio::test]
async fn options_asterisk_is_answered_with_allow_and_no_body() {
    let response = server_options();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers();
    assert_eq!(headers["allow"], SERVER_ALLOW);
    assert_eq!(headers["content-length"], "0");
    // Every method listed is one sluice passes on: CONNECT is refused.
    for method in SERVER_ALLOW.split(", ") {
        let method = http::Method::from_bytes(method.as_bytes()).unwrap();
        assert_ne!(method, http::Method::CONNECT);
    }
    assert!(SERVER_ALLOW.split(", ").any(|m| m == "OPTIONS"));
    assert!(bytes(response).await.is_empty());
}

async fn bytes(response: Response<Body>) -> Bytes {
    response.into_body().collect().await.unwrap().to_bytes()
}

/// What [`problem`] serializes for a limited route: the reference the
/// prepared templates must match byte for byte.
fn serialized(status: StatusCode, detail: &str, route: &str, policy: &str, secs: u64) -> Vec<u8> {
    serde_json::to_vec(&Problem {
        kind: "about:blank",
        title: status.canonical_reason().unwrap(),
        status: status.as_u16(),
        detail,
        route: Some(route),
        policy: Some(policy),
        retry_after: Some(secs),
    })
    .unwrap()
}

#[tokio::test]
async fn prepared_bodies_are_what_serde_would_write() {
    // Quotes, backslashes, control characters, non-ASCII and a slash: every
    // kind of character JSON escapes, or does not.
    for (route_name, policy_name) in [
        ("api", "api"),
        ("a\"b\\c", "tab\there/\u{1}\u{e9}\u{1f600}"),
        ("", "\n"),
    ] {
        let p = policy(
            policy_name,
            Bands::FixedWindow(vec![window(1, Duration::from_secs(60))]),
        );
        let prepared = answers(route_name, &p);
        for secs in [1u64, 9, 10, 3600, u64::MAX / 1_000_000_000] {
            let d = denied(0, 0, Duration::from_secs(secs), Duration::from_secs(secs));
            let body = bytes(too_many_requests(&prepared, &d)).await;
            let detail = format!(
                "route \"{route_name}\" is limited by policy \"{policy_name}\"; retry after {secs} s"
            );
            let want = serialized(
                StatusCode::TOO_MANY_REQUESTS,
                &detail,
                route_name,
                policy_name,
                secs,
            );
            assert_eq!(body, want, "{route_name:?} {policy_name:?} {secs}");

            let body = bytes(unavailable(&prepared, Duration::from_secs(secs))).await;
            let detail = format!(
                "the rate limit of route \"{route_name}\" could not be checked; retry after {secs} s"
            );
            let want = serialized(
                StatusCode::SERVICE_UNAVAILABLE,
                &detail,
                route_name,
                policy_name,
                secs,
            );
            assert_eq!(body, want, "{route_name:?} {policy_name:?} {secs}");
        }
    }
}

#[test]
fn ratelimit_fields_name_the_binding_band() {
    let one = policy(
        "a\"b\u{e9}",
        Bands::FixedWindow(vec![window(5, Duration::from_secs(10))]),
    );
    let prepared = answers("r", &one);
    let mut headers = HeaderMap::new();
    let d = denied(
        0,
        0,
        Duration::from_millis(9_001),
        Duration::from_millis(9_001),
    );
    add_ratelimit_headers(&mut headers, &prepared, &d);
    assert_eq!(headers["ratelimit-policy"], r#""a\"b_";q=5;w=10"#);
    assert_eq!(headers["ratelimit"], r#""a\"b_";r=0;t=10"#);

    let two = policy(
        "x",
        Bands::FixedWindow(vec![
            window(5, Duration::from_secs(1)),
            window(50, Duration::from_secs(60)),
        ]),
    );
    let prepared = answers("r", &two);
    let mut headers = HeaderMap::new();
    let allowed = Decision {
        allowed: true,
        ..denied(1, u64::MAX, Duration::ZERO, Duration::ZERO)
    };
    add_ratelimit_headers(&mut headers, &prepared, &allowed);
    // RFC 8941 Integers have at most 15 digits; beyond, the field would
    // not parse at all (found by the `ratelimit_fields` fuzz target).
    assert_eq!(headers["ratelimit"], r#""x-1";r=999999999999999;t=0"#);
    // Appended, never replacing the upstream's own fields.
    add_ratelimit_headers(&mut headers, &prepared, &allowed);
    assert_eq!(headers.get_all("ratelimit").iter().count(), 2);
}

#[tokio::test]
async fn every_limit_of_a_route_is_in_ratelimit_policy_and_concurrency_says_so() {
    let login = policy(
        "login",
        Bands::FixedWindow(vec![window(5, Duration::from_secs(60))]),
    );
    let cap = policy(
        "cap",
        Bands::FixedWindow(vec![
            window(10, Duration::from_secs(1)),
            window(100, Duration::from_secs(60)),
        ]),
    );
    let in_flight = Concurrency {
        name: "in_flight".into(),
        limit: NonZeroU32::new(40).unwrap(),
        retry_after: Duration::from_millis(1500),
        announce: true,
    };
    let r = route_of(
        "signup",
        vec![
            LimitPolicy::Rate(Arc::new(login)),
            LimitPolicy::Rate(Arc::new(cap)),
            LimitPolicy::Concurrency(Arc::new(in_flight)),
        ],
    );
    let all = r#""login";q=5;w=60, "cap-0";q=10;w=1, "cap-1";q=100;w=60, "in_flight";q=40;qu="concurrent-requests""#;

    // The 429 of the second limit names it, and lists every limit.
    let second = Prepared::new(&r, 1);
    let response = too_many_requests(
        &second,
        &denied(1, 0, Duration::from_secs(30), Duration::from_secs(30)),
    );
    assert_eq!(response.headers()["ratelimit-policy"], all);
    assert_eq!(response.headers()["ratelimit"], r#""cap-1";r=0;t=30"#);
    let body = json(response).await;
    assert_eq!(body["policy"], "cap");
    assert_eq!(body["route"], "signup");

    let third = Prepared::new(&r, 2);
    let response = over_concurrency(&third, Duration::from_millis(1500));
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "2");
    assert_eq!(response.headers()["ratelimit-policy"], all);
    assert!(response.headers().get("ratelimit").is_none());
    let body = json(response).await;
    assert_eq!(body["policy"], "in_flight");
    assert_eq!(body["retry_after"], 2);
    assert_eq!(
        body["detail"],
        "route \"signup\" has 40 requests in flight under policy \"in_flight\"; retry after 2 s"
    );
}

/// One subject's requests at the given times (seconds since the epoch,
/// fractions allowed), each of cost 1, through the algorithm's own step;
/// for each, the `RateLimit` value it is answered with and, for a denial,
/// its `Retry-After`.
fn answered(policy: &Policy, at: &[f64]) -> Vec<(String, Option<String>)> {
    let prepared = answers("r", policy);
    let mut state = State::new(policy.bands());
    at.iter()
        .map(|secs| {
            let now = (secs * 1_000_000.0).round() as u64;
            let decision = evaluate(policy.bands(), &mut state, now, 1);
            let headers = if decision.allowed {
                let mut headers = HeaderMap::new();
                add_ratelimit_headers(&mut headers, &prepared, &decision);
                headers
            } else {
                too_many_requests(&prepared, &decision).headers().clone()
            };
            let field = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
            (field("ratelimit").unwrap(), field("retry-after"))
        })
        .collect()
}

fn admitted(value: &str) -> (String, Option<String>) {
    (value.to_owned(), None)
}

fn refused(value: &str, retry_after: &str) -> (String, Option<String>) {
    (value.to_owned(), Some(retry_after.to_owned()))
}

/// A multiple of every window used below: aligned windows start here.
const EPOCH: f64 = 1_800_000_000.0;

#[test]
fn fixed_window_t_is_the_end_of_the_window() {
    let p = policy(
        "fw",
        Bands::FixedWindow(vec![window(3, Duration::from_secs(60))]),
    );
    // The count falls to zero when the window ends: until then `r` is all
    // there is, and after a denial the window's end is when the next fits.
    assert_eq!(
        answered(
            &p,
            &[EPOCH + 10.0, EPOCH + 20.0, EPOCH + 30.5, EPOCH + 40.0]
        ),
        [
            admitted(r#""fw";r=2;t=50"#),
            admitted(r#""fw";r=1;t=40"#),
            admitted(r#""fw";r=0;t=30"#),
            refused(r#""fw";r=0;t=20"#, "20"),
        ]
    );
}

#[test]
fn token_bucket_t_is_the_next_refill_not_the_full_bucket() {
    let p = policy(
        "tb",
        Bands::TokenBucket(vec![BucketBand {
            capacity: NonZeroU32::new(5).unwrap(),
            refill_tokens: NonZeroU32::new(1).unwrap(),
            refill_every: Duration::from_secs(10),
            max_wait_us: 0,
        }]),
    );
    let answers = answered(
        &p,
        &[
            EPOCH,
            EPOCH + 1.0,
            EPOCH + 2.0,
            EPOCH + 3.0,
            EPOCH + 4.0,
            EPOCH + 5.0,
        ],
    );
    // Five tokens spent in five seconds: the bucket is full again 50 s
    // after the first, but a token comes back every 10 s from the first,
    // so `t` counts down to that refill whatever `r` is.
    assert_eq!(
        answers,
        [
            admitted(r#""tb";r=4;t=10"#),
            admitted(r#""tb";r=3;t=9"#),
            admitted(r#""tb";r=2;t=8"#),
            admitted(r#""tb";r=1;t=7"#),
            admitted(r#""tb";r=0;t=6"#),
            // The next token is the one this request waits for.
            refused(r#""tb";r=0;t=5"#, "5"),
        ]
    );
}

#[test]
fn token_bucket_t_after_a_partial_refill_is_the_period_under_way() {
    let p = policy(
        "tb",
        Bands::TokenBucket(vec![BucketBand {
            capacity: NonZeroU32::new(10).unwrap(),
            refill_tokens: NonZeroU32::new(2).unwrap(),
            refill_every: Duration::from_secs(30),
            max_wait_us: 0,
        }]),
    );
    // Ten spent at once; 35 s later one period has refilled two, and the
    // next period ends 25 s later (the bucket is full only 120 s later).
    let mut times = vec![EPOCH; 10];
    times.push(EPOCH + 35.0);
    let answers = answered(&p, &times);
    assert_eq!(answers[9], admitted(r#""tb";r=0;t=30"#));
    assert_eq!(answers[10], admitted(r#""tb";r=1;t=25"#));
}

#[test]
fn gcra_t_is_when_the_next_unit_frees() {
    // One unit per 10 s, up to 5 at once.
    let p = policy(
        "gc",
        Bands::Gcra(vec![GcraBand {
            limit: NonZeroU32::new(6).unwrap(),
            window: Duration::from_secs(60),
            burst: NonZeroU32::new(5).unwrap(),
            max_wait_us: 0,
        }]),
    );
    let answers = answered(
        &p,
        &[
            EPOCH,
            EPOCH + 1.0,
            EPOCH + 2.0,
            EPOCH + 3.0,
            EPOCH + 4.0,
            EPOCH + 5.0,
            EPOCH + 25.0,
        ],
    );
    // The debt after n units is 10n s less the time since; one unit frees
    // each time it passes a multiple of 10 s: `t` is never more than the
    // emission interval, though the band is full again only after the debt.
    assert_eq!(
        answers,
        [
            admitted(r#""gc";r=4;t=10"#),
            admitted(r#""gc";r=3;t=9"#),
            admitted(r#""gc";r=2;t=8"#),
            admitted(r#""gc";r=1;t=7"#),
            admitted(r#""gc";r=0;t=6"#),
            refused(r#""gc";r=0;t=5"#, "5"),
            // 25 s in: 25 s of the 50 s debt are left, 35 s with this
            // unit: room for one more, and another in 5 s.
            admitted(r#""gc";r=1;t=5"#),
        ]
    );
}

#[test]
fn gcra_t_rounds_a_short_interval_up_to_a_second() {
    // 10 a second: a unit frees every 100 ms, announced as 1 s.
    let p = policy(
        "fast",
        Bands::Gcra(vec![GcraBand {
            limit: NonZeroU32::new(10).unwrap(),
            window: Duration::from_secs(1),
            burst: NonZeroU32::new(10).unwrap(),
            max_wait_us: 0,
        }]),
    );
    let answers = answered(&p, &[EPOCH, EPOCH]);
    assert_eq!(answers[1], admitted(r#""fast";r=8;t=1"#));
}

#[test]
fn sliding_counter_t_is_the_end_of_the_current_window() {
    let p = policy(
        "sc",
        Bands::SlidingCounter(vec![window(4, Duration::from_secs(60))]),
    );
    let answers = answered(
        &p,
        &[
            EPOCH + 15.0,
            EPOCH + 20.0,
            EPOCH + 25.0,
            EPOCH + 30.0,
            EPOCH + 35.0,
            EPOCH + 75.0,
        ],
    );
    assert_eq!(
        answers,
        [
            // No previous window: `r` stays exactly what it is until this
            // window ends (45 s), not until its count has faded (105 s).
            admitted(r#""sc";r=3;t=45"#),
            admitted(r#""sc";r=2;t=40"#),
            admitted(r#""sc";r=1;t=35"#),
            admitted(r#""sc";r=0;t=30"#),
            // The count of 4 must weigh 3 at most: as soon as it starts
            // fading, a millisecond into the next window.
            refused(r#""sc";r=0;t=26"#, "26"),
            // 15 s into the next window: 4 × 45/60 = 3 estimated, plus this.
            admitted(r#""sc";r=0;t=45"#),
        ]
    );
}

#[test]
fn sliding_log_t_is_the_window_an_admitted_unit_stays_counted() {
    let p = policy(
        "sl",
        Bands::SlidingLog(vec![window(3, Duration::from_secs(60))]),
    );
    let answers = answered(
        &p,
        &[
            EPOCH,
            EPOCH + 10.0,
            EPOCH + 20.0,
            EPOCH + 30.0,
            EPOCH + 61.0,
        ],
    );
    assert_eq!(
        answers,
        [
            // The reply says when the newest unit leaves, a whole window
            // after it was admitted: an upper bound on when `r` grows.
            admitted(r#""sl";r=2;t=60"#),
            admitted(r#""sl";r=1;t=60"#),
            admitted(r#""sl";r=0;t=60"#),
            // The oldest unit leaves 60 s after it came: exact.
            refused(r#""sl";r=0;t=30"#, "30"),
            // The first unit has left: one place, and the window again.
            admitted(r#""sl";r=0;t=60"#),
        ]
    );
}

#[test]
fn several_bands_take_the_binding_bands_window() {
    // A bucket of 3 refilling one every 10 s under an hourly cap of 100:
    // the bucket binds (least left), and its refill is the window.
    let p = policy(
        "mix",
        Bands::TokenBucket(vec![
            BucketBand {
                capacity: NonZeroU32::new(3).unwrap(),
                refill_tokens: NonZeroU32::new(1).unwrap(),
                refill_every: Duration::from_secs(10),
                max_wait_us: 0,
            },
            BucketBand {
                capacity: NonZeroU32::new(100).unwrap(),
                refill_tokens: NonZeroU32::new(100).unwrap(),
                refill_every: Duration::from_secs(3600),
                max_wait_us: 0,
            },
        ]),
    );
    let answers = answered(&p, &[EPOCH, EPOCH + 4.0]);
    assert_eq!(answers[1], admitted(r#""mix-0";r=1;t=6"#));
}

#[test]
fn effective_windows_never_overflow_and_hold_nothing_as_one_step() {
    let step = Effective::NextStep(Duration::from_secs(10));
    assert_eq!(step.seconds(Duration::ZERO), 10);
    assert_eq!(step.seconds(Duration::from_nanos(1)), 1);
    assert_eq!(step.seconds(Duration::from_secs(20)), 10);
    assert_eq!(step.seconds(Duration::from_millis(20_001)), 1);
    assert!((1..=10).contains(&step.seconds(Duration::MAX)));
    let huge = Effective::NextStep(Duration::MAX);
    assert_eq!(huge.seconds(Duration::MAX), u64::MAX);
    assert_eq!(huge.seconds(Duration::ZERO), u64::MAX);
    assert_eq!(Effective::Reset.seconds(Duration::MAX), u64::MAX);
}

#[test]
fn local_fallback_denials_keep_retry_after_as_t() {
    // The shared quota's own numbers: its `t` is its `Retry-After`.
    let p = policy(
        "login",
        Bands::TokenBucket(vec![BucketBand {
            capacity: NonZeroU32::new(10).unwrap(),
            refill_tokens: NonZeroU32::new(1).unwrap(),
            refill_every: Duration::from_secs(6),
            max_wait_us: 0,
        }]),
    );
    let shared = p.shared(NonZeroU32::new(2).unwrap());
    let response = too_many_requests_local(
        &answers("r", &p),
        &policy_field(&shared),
        &denied(0, 0, Duration::from_secs(30), Duration::from_millis(4_200)),
    );
    let h = response.headers();
    assert_eq!(h["ratelimit-policy"], r#""login";q=5;w=60"#);
    assert_eq!(h["ratelimit"], r#""login";r=0;t=5"#);
    assert_eq!(h["retry-after"], "5");
}
