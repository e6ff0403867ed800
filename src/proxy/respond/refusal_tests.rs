//! A limit's refusals as the route writes them (`responses.refused`,
//! `unavailable`) and as a policy with `headers: off` gives them.

use std::num::NonZeroU32;
use std::sync::Arc;

use http_body_util::BodyExt;

use super::tests::{denied, json, policy, route_of, window};
use super::*;
use crate::limit::{Bands, Concurrency};

#[tokio::test]
async fn an_unannounced_policy_is_in_no_field_and_its_body_tells_no_time() {
    let quota = policy(
        "quota",
        Bands::FixedWindow(vec![window(100, Duration::from_secs(60))]),
    );
    let abuse = policy(
        "ab\"use",
        Bands::FixedWindow(vec![window(3, Duration::from_secs(60))]),
    )
    .with_headers(false);
    let r = route_of(
        "login",
        vec![
            LimitPolicy::Rate(Arc::new(quota)),
            LimitPolicy::Rate(Arc::new(abuse)),
        ],
    );
    let (announced, silent) = (Prepared::new(&r, 0), Prepared::new(&r, 1));
    let decision = denied(0, 0, Duration::from_secs(30), Duration::from_secs(30));

    // The announced limit's 429 lists itself only.
    let response = too_many_requests(&announced, &decision);
    assert_eq!(
        response.headers()["ratelimit-policy"],
        r#""quota";q=100;w=60"#
    );

    let response = too_many_requests(&silent, &decision);
    for name in ["ratelimit", "ratelimit-policy", "retry-after"] {
        assert!(!response.headers().contains_key(name), "{name}");
    }
    let body = json(response).await;
    assert_eq!(body.get("retry_after"), None, "{body}");
    assert_eq!(body["policy"], "ab\"use");
    assert_eq!(body["status"], 429);
    assert_eq!(
        body["detail"],
        "route \"login\" is limited by policy \"ab\"use\""
    );

    let mut headers = HeaderMap::new();
    add_ratelimit_headers(&mut headers, &silent, &decision);
    assert!(headers.is_empty(), "{headers:?}");
    let response = unavailable(&silent, Duration::from_secs(1));
    assert!(!response.headers().contains_key("retry-after"));
    assert!(!response.headers().contains_key("ratelimit-policy"));
}

#[tokio::test]
async fn a_custom_answer_keeps_the_fields_and_sends_its_bytes() {
    use crate::route::{Answers, CustomAnswer, CustomBody};
    let api = policy(
        "api",
        Bands::FixedWindow(vec![window(5, Duration::from_secs(60))]),
    );
    let mut r = route_of("api", vec![LimitPolicy::Rate(Arc::new(api))]);
    r.answers = Answers {
        refused: Some(Arc::new(CustomAnswer {
            status: Some(StatusCode::FORBIDDEN),
            body: Some(CustomBody {
                content_type: HeaderValue::from_static("text/html"),
                bytes: Bytes::from_static(b"<p>no</p>"),
                file: "/etc/403.html".into(),
            }),
            headers: vec![(
                HeaderName::from_static("cache-control"),
                HeaderValue::from_static("private"),
            )]
            .into(),
        })),
        unavailable: None,
    };
    let prepared = Prepared::new(&r, 0);
    let decision = denied(0, 0, Duration::from_secs(7), Duration::from_secs(7));
    // The second answer is the kept one: the same in whole.
    for _ in 0..2 {
        let response = too_many_requests(&prepared, &decision);
        assert_eq!(response.status(), StatusCode::FORBIDDEN);
        let h = response.headers();
        assert_eq!(h["content-type"], "text/html");
        assert_eq!(h.get_all("cache-control").iter().count(), 1);
        assert_eq!(h["cache-control"], "private");
        assert_eq!(h["retry-after"], "7");
        assert_eq!(h["ratelimit-policy"], r#""api";q=5;w=60"#);
        assert_eq!(h["ratelimit"], r#""api";r=0;t=7"#);
        assert_eq!(h.len(), 5, "{h:?}");
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"<p>no</p>");
    }

    // `unavailable` not written: sluice's own.
    let response = unavailable(&prepared, Duration::from_secs(1));
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        response.headers()["content-type"],
        "application/problem+json"
    );
}

#[tokio::test]
async fn a_concurrency_refusal_takes_the_routes_refused_body_and_keeps_its_503() {
    use crate::route::{Answers, CustomAnswer, CustomBody};
    let in_flight = Concurrency {
        name: "in_flight".into(),
        limit: NonZeroU32::new(4).unwrap(),
        retry_after: Duration::from_secs(2),
        announce: true,
    };
    let mut r = route_of(
        "upload",
        vec![LimitPolicy::Concurrency(Arc::new(in_flight))],
    );
    r.answers = Answers {
        refused: Some(Arc::new(CustomAnswer {
            status: None,
            body: Some(CustomBody {
                content_type: HeaderValue::from_static("text/plain"),
                bytes: Bytes::from_static(b"busy"),
                file: "/etc/busy.txt".into(),
            }),
            headers: Box::default(),
        })),
        unavailable: None,
    };
    let response = over_concurrency(&Prepared::new(&r, 0), Duration::from_secs(2));
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let h = response.headers();
    assert_eq!(h["content-type"], "text/plain");
    assert_eq!(h["retry-after"], "2");
    assert_eq!(
        h["ratelimit-policy"],
        r#""in_flight";q=4;qu="concurrent-requests""#
    );
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"busy");
}

/// The last 429 rendered is kept for the next of the same seconds,
/// remaining and band; any other is rendered anew, and a kept one is never
/// told for another.
#[tokio::test]
async fn a_kept_refusal_is_only_given_for_the_same_seconds_remaining_and_band() {
    let export = policy(
        "export",
        Bands::FixedWindow(vec![
            window(10, Duration::from_secs(1)),
            window(1000, Duration::from_secs(3600)),
        ]),
    );
    let r = route_of("export", vec![LimitPolicy::Rate(Arc::new(export))]);
    let prepared = Prepared::new(&r, 0);
    let told = |band, remaining, secs| {
        let decision = denied(
            band,
            remaining,
            Duration::from_secs(secs),
            Duration::from_secs(secs),
        );
        let response = too_many_requests(&prepared, &decision);
        let headers = response.headers().clone();
        (headers, response)
    };
    for (band, remaining, secs) in [
        (0, 0, 5),
        (0, 0, 5),
        (0, 0, 7),
        (0, 2, 7),
        (1, 2, 7),
        (0, 0, 5),
    ] {
        let (headers, response) = told(band, remaining, secs);
        assert_eq!(headers["retry-after"], secs.to_string().as_str());
        assert_eq!(
            headers["ratelimit"],
            format!("\"export-{band}\";r={remaining};t={secs}").as_str()
        );
        let body = json(response).await;
        assert_eq!(body["retry_after"], secs, "{body}");
        assert_eq!(
            body["detail"],
            format!("route \"export\" is limited by policy \"export\"; retry after {secs} s")
        );
    }
}
