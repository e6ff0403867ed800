//! Every response sluice answers itself is built here, and only here.
//!
//! Bodies are RFC 9457 problem details with `type: "about:blank"`: the
//! status says what happened, `title` is its standard phrase, and the
//! extension members `route`, `policy` and `retry_after` say where. A
//! problem-type URI would promise a page to resolve to, which a sidecar
//! cannot keep.
//!
//! Rate-limit fields follow draft-ietf-httpapi-ratelimit-headers-10:
//! `RateLimit-Policy: "api";q=100;w=60` lists every band of the policy and
//! `RateLimit: "api";r=0;t=17` describes the binding one. A one-band policy
//! names its member after the policy; with several bands the members are
//! `"<policy>-<i>"`, `i` being the band's index in the configuration
//! (`bands[i]`). All times are whole seconds rounded up, so a client that
//! waits as told is never early.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use serde::Serialize;

use crate::config::Route;
use crate::limit::{Decision, Incompatible, Policy};

use super::body::{self, Body};

pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// 429: the subject is over the policy's limit.
pub fn too_many_requests(route: &Route, policy: &Policy, decision: &Decision) -> Response<Body> {
    let retry_after = retry_after_secs(decision.retry_after);
    let detail = format!(
        "route \"{}\" is limited by policy \"{}\"; retry after {retry_after} s",
        route.name, policy.name
    );
    let mut response = problem(
        StatusCode::TOO_MANY_REQUESTS,
        &detail,
        Some((route, policy)),
        Some(retry_after),
    );
    add_ratelimit_headers(response.headers_mut(), policy, decision);
    response
}

/// 503: the store could not decide in time and `on_failure` is `deny`.
pub fn unavailable(route: &Route, policy: &Policy, retry_after: Duration) -> Response<Body> {
    let retry_after = retry_after_secs(retry_after);
    let detail = format!(
        "the rate limit of route \"{}\" could not be checked; retry after {retry_after} s",
        route.name
    );
    let mut response = problem(
        StatusCode::SERVICE_UNAVAILABLE,
        &detail,
        Some((route, policy)),
        Some(retry_after),
    );
    append(
        response.headers_mut(),
        &RATELIMIT_POLICY,
        policy_value(policy),
    );
    response
}

/// 503: the request and the store cannot be evaluated together (a
/// configuration or store mismatch, whatever `on_failure` says).
pub fn incompatible(
    route: &Route,
    policy: &Policy,
    reason: Incompatible,
    retry_after: Duration,
) -> Response<Body> {
    let retry_after = retry_after_secs(retry_after);
    let why = match reason {
        Incompatible::UnknownPolicy => "the store does not know the policy",
        Incompatible::CostAboveMaximum => "the route's cost exceeds what the policy admits",
        Incompatible::MalformedReply => "the store's reply was not understood",
    };
    let detail = format!(
        "the rate limit of route \"{}\" could not be evaluated: {why}",
        route.name
    );
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        &detail,
        Some((route, policy)),
        Some(retry_after),
    )
}

pub fn bad_request(reason: &str) -> Response<Body> {
    problem(StatusCode::BAD_REQUEST, reason, None, None)
}

/// 501: a transfer-coding sluice does not implement (RFC 9112 §6.1).
pub fn not_implemented(reason: &str) -> Response<Body> {
    problem(StatusCode::NOT_IMPLEMENTED, reason, None, None)
}

/// 408: the client stopped sending its request body.
pub fn request_timeout() -> Response<Body> {
    let mut response = problem(
        StatusCode::REQUEST_TIMEOUT,
        "the request body stalled",
        None,
        None,
    );
    // The connection's framing is in an unknown state after a cut body.
    response
        .headers_mut()
        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// 502: the upstream could not be reached or answered nonsense.
pub fn bad_gateway() -> Response<Body> {
    problem(
        StatusCode::BAD_GATEWAY,
        "the upstream could not be reached",
        None,
        None,
    )
}

/// 504: the upstream's response head did not arrive within `upstream.timeout`.
pub fn gateway_timeout() -> Response<Body> {
    problem(
        StatusCode::GATEWAY_TIMEOUT,
        "the upstream did not answer in time",
        None,
        None,
    )
}

/// Adds `RateLimit-Policy` and `RateLimit` for `decision`. Appended, not
/// set: an upstream's own rate-limit fields describe its own limits.
pub fn add_ratelimit_headers(headers: &mut HeaderMap, policy: &Policy, decision: &Decision) {
    append(headers, &RATELIMIT_POLICY, policy_value(policy));
    append(headers, &RATELIMIT, limit_value(policy, decision));
}

/// `"<name>";q=<quota>;w=<seconds>` per band.
fn policy_value(policy: &Policy) -> String {
    let quotas = policy.bands.quotas();
    let mut out = String::new();
    for (i, (quota, window)) in quotas.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_band_name(&mut out, policy, i, quotas.len());
        // A window under a second still has to be announced as one.
        let _ = write!(out, ";q={quota};w={}", ceil_secs(*window).max(1));
    }
    out
}

/// `"<name>";r=<remaining>;t=<seconds until full>` for the binding band.
fn limit_value(policy: &Policy, decision: &Decision) -> String {
    let mut out = String::new();
    push_band_name(&mut out, policy, decision.band, policy.bands.len());
    let _ = write!(
        out,
        ";r={};t={}",
        decision.remaining,
        ceil_secs(decision.reset_after)
    );
    out
}

/// A structured-field String (RFC 8941 §3.3.3): printable ASCII with `"`
/// and `\` escaped. Anything else cannot be expressed and becomes `_`.
fn push_band_name(out: &mut String, policy: &Policy, band: usize, bands: usize) {
    out.push('"');
    for c in policy.name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    if bands > 1 {
        let _ = write!(out, "-{band}");
    }
    out.push('"');
}

fn append(headers: &mut HeaderMap, name: &HeaderName, value: String) {
    // Built above from printable ASCII only, so this never fails; a header
    // is dropped rather than a response lost if it ever did.
    if let Ok(value) = HeaderValue::from_maybe_shared(Bytes::from(value)) {
        headers.append(name, value);
    }
}

/// Whole seconds, rounded up.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs() + u64::from(d.subsec_nanos() > 0)
}

/// `Retry-After` is at least one second: `0` would invite an immediate
/// retry storm against a limit that is still closed.
fn retry_after_secs(d: Duration) -> u64 {
    ceil_secs(d).max(1)
}

#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'static str,
    status: u16,
    detail: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    route: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    policy: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u64>,
}

fn problem(
    status: StatusCode,
    detail: &str,
    context: Option<(&Route, &Policy)>,
    retry_after: Option<u64>,
) -> Response<Body> {
    let problem = Problem {
        kind: "about:blank",
        title: status.canonical_reason().unwrap_or("Error"),
        status: status.as_u16(),
        detail,
        route: context.map(|(route, _)| &*route.name),
        policy: context.map(|(_, policy)| &*policy.name),
        retry_after,
    };
    // Serializing a struct of strings and integers cannot fail.
    let json = serde_json::to_vec(&problem).unwrap_or_default();
    let mut response = Response::new(body::full(json));
    *response.status_mut() = status;
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(secs) = retry_after {
        headers.insert(RETRY_AFTER, HeaderValue::from(secs));
    }
    response
}

#[cfg(test)]
mod tests;
