//! Every response sluice answers itself is built here, and only here.
//!
//! Bodies are RFC 9457 problem details with `type: "about:blank"`: the
//! status says what happened, `title` is its standard phrase, and the
//! extension members `route`, `policy` and `retry_after` say where. A
//! problem-type URI would promise a page to resolve to, which a sidecar
//! cannot keep.
//!
//! Rate-limit fields follow draft-ietf-httpapi-ratelimit-headers-11:
//! `RateLimit-Policy: "api";q=100;w=60` lists every band of every limit of
//! the route, in order, and `RateLimit: "api";r=3;t=2` describes the
//! binding one. A one-band policy names its member after the policy; with
//! several bands the members are `"<policy>-<i>"`, `i` being the band's
//! index in the configuration (`bands[i]`). A concurrency limit is
//! `"<policy>";q=<limit>;qu="concurrent-requests"` (no window: it counts
//! requests in flight, not a rate), and never has a `RateLimit` member.
//!
//! Draft -11 (§4.1) reads `r` as the quota available now and `t` as the
//! effective window, "the number of seconds within which the client can use
//! no more than the available quota": not when the quota is full again.
//! So `t` is when the binding band's available quota next grows (see
//! [`Effective`]); on a denial, the `Retry-After` beside it (-11 §6: it
//! "SHOULD NOT reference a point in time earlier than the end of the
//! effective window"). All times are whole seconds rounded up, so a client
//! that waits as told is never early.
//!
//! A route may answer its refusals its own way (`responses.refused`,
//! `responses.unavailable`: [`crate::route::Answers`]): its status, its
//! body read from a file when the configuration loaded, fields of its own.
//! A policy with `headers: off` is never announced: its answers carry no
//! `RateLimit-Policy`, `RateLimit` or `Retry-After`, its default body no
//! retry time nor quota, and no other answer of the route lists it.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CACHE_CONTROL, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};
use serde::Serialize;

use crate::limit::{Bands, Decision, Incompatible, LimitPolicy, Policy};
use crate::route::Route;
use crate::sync::Latest;

use super::body::{self, Body};

pub static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
pub static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// What the answers of one limit of a route share, built once when the
/// configuration loads. Under a flood the 429 is the hot path: naming the
/// route and policy, escaping them into JSON and listing the bands would
/// otherwise be redone for every request, to produce the same bytes.
#[derive(Debug)]
pub struct Prepared {
    /// `RateLimit-Policy`: every announced limit of the route, the same on
    /// every response of the route; `None` when none is.
    policy_field: Option<HeaderValue>,
    /// The limit's policy does not say `headers: off`.
    announce: bool,
    /// What every `RateLimit` value of the limit opens with: `"<name>";r=`,
    /// or `"<name>-` when it has more than one band (members are named
    /// `<policy>-<i>`), so a value is put together from four parts or six.
    opening: Box<[u8]>,
    /// More than one band.
    several_bands: bool,
    /// Per band, how an admitted request's `t` follows from the decision;
    /// empty for a concurrency policy.
    effective: Box<[Effective]>,
    /// 429 for a rate policy; for a concurrency policy, the 503 of a
    /// request over its limit (or the route's `refused`).
    denied: Answer,
    /// The 503 when the store cannot decide (or the route's
    /// `unavailable`).
    unavailable: Answer,
    /// The last 429 rendered: a subject refused under a flood (or every
    /// subject of a fixed window) is told the same seconds many times a
    /// second, and rendering them anew (the body, `Retry-After`,
    /// `RateLimit`: three allocations and the digits) was about 1,400 of
    /// the 23,000 instructions a refusal costs (callgrind).
    refused: Latest<Told, Rendered>,
}

/// What a refusal's rendered parts depend on: the seconds to wait, what is
/// left, the binding band.
type Told = (u64, u64, usize);

/// A 429's parts that change with the decision, rendered once for a
/// [`Told`]: its body and every field. A kept refusal's fields are
/// cloned whole (two allocations, a reference count a value), cheaper
/// than a hash and a probe for each of them again.
#[derive(Clone)]
struct Rendered {
    body: Bytes,
    fields: HeaderMap,
}

impl Prepared {
    /// The answers of `route.limits[limit]`, for a request of its own
    /// tier (of any, for a limit every request counts against).
    pub fn new(route: &Route, limit: usize) -> Prepared {
        Prepared::for_tier(route, limit, route.limits[limit].tier.unwrap_or(0))
    }

    /// The answers of `route.limits[limit]` to a request of tier `tier`:
    /// `RateLimit-Policy` lists the limits that apply to it.
    pub fn for_tier(route: &Route, limit: usize, tier: u8) -> Prepared {
        let policy = &route.limits[limit].policy;
        let (route_name, name) = (&*route.name, &**policy.name());
        let refused = route.answers.refused.as_deref();
        let denied = match policy {
            LimitPolicy::Rate(_) => Answer::new(
                refused,
                StatusCode::TOO_MANY_REQUESTS,
                Detail {
                    told: &format!(
                        "route \"{route_name}\" is limited by policy \"{name}\"; retry after "
                    ),
                    untold: &format!("route \"{route_name}\" is limited by policy \"{name}\""),
                },
                route_name,
                name,
            ),
            LimitPolicy::Concurrency(c) => Answer::new(
                refused,
                StatusCode::SERVICE_UNAVAILABLE,
                Detail {
                    told: &format!(
                        "route \"{route_name}\" has {} requests in flight under policy \"{name}\"; retry after ",
                        c.limit
                    ),
                    untold: &format!(
                        "route \"{route_name}\" has too many requests in flight under policy \"{name}\""
                    ),
                },
                route_name,
                name,
            ),
        };
        let policy_value = route_policy_value(route, tier);
        let several_bands = match policy {
            LimitPolicy::Rate(p) => p.bands().len() > 1,
            LimitPolicy::Concurrency(_) => false,
        };
        Prepared {
            // Built from printable ASCII only (see `push_band_name`).
            policy_field: (!policy_value.is_empty()).then(|| {
                HeaderValue::from_str(&policy_value).unwrap_or_else(|_| HeaderValue::from_static(""))
            }),
            announce: policy.announced(),
            opening: opening(name, several_bands),
            several_bands,
            effective: match policy {
                LimitPolicy::Rate(p) => Effective::of(p.bands()),
                LimitPolicy::Concurrency(_) => Box::default(),
            },
            denied,
            unavailable: Answer::new(
                route.answers.unavailable.as_deref(),
                StatusCode::SERVICE_UNAVAILABLE,
                Detail {
                    told: &format!(
                        "the rate limit of route \"{route_name}\" could not be checked; retry after "
                    ),
                    untold: &format!(
                        "the rate limit of route \"{route_name}\" could not be checked"
                    ),
                },
                route_name,
                name,
            ),
            refused: Latest::new(),
        }
    }

    /// `"<name>";r=<remaining>;t=<seconds>` for the binding band: `r` is
    /// what the band has left now, `t` its effective window. On a denial
    /// `t` is exactly the `Retry-After` beside it (a client reading either
    /// waits the same); on an admitted request, when the band's available
    /// quota next grows. A token bucket refills long before it is full, and
    /// a `t` saying when it is full had clients spread their tokens over
    /// five times the time they had to.
    fn limit_value(&self, decision: &Decision) -> Option<HeaderValue> {
        let seconds = if decision.allowed {
            let effective = self.effective.get(decision.band).copied();
            effective
                .unwrap_or(Effective::Reset)
                .seconds(decision.reset_after)
        } else {
            retry_after_secs(decision.retry_after)
        };
        let mut remaining = itoa::Buffer::new();
        let mut reset = itoa::Buffer::new();
        let remaining = remaining.format(sf_integer(decision.remaining)).as_bytes();
        let reset = reset.format(sf_integer(seconds)).as_bytes();
        let value = if self.several_bands {
            let mut band = itoa::Buffer::new();
            let band = band.format(decision.band).as_bytes();
            concat(&[&self.opening, band, b"\";r=", remaining, b";t=", reset])
        } else {
            concat(&[&self.opening, remaining, b";t=", reset])
        };
        HeaderValue::from_maybe_shared(value).ok()
    }
}

/// The effective window of an admitted request: how long the available
/// quota `r` stays the most the client can use, from the binding band's
/// `reset_after` (until it is back to full) and its parameters. Only
/// `remaining`, `reset_after` and `retry_after` come from the store, for
/// the memory store and Redis alike, so the window is derived here rather
/// than asked of every script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effective {
    /// `reset_after` itself. A fixed window's count falls to zero at once
    /// when the window ends: exact. A sliding log frees each unit as it
    /// leaves the window, the oldest first, and its reply says only when
    /// the newest leaves (a whole window after an admission): an upper
    /// bound, so a client told it spreads its quota over longer than it
    /// needs to, and is never denied for it.
    Reset,
    /// Until the next step of `every` within `reset_after`:
    /// `((reset_after - 1) mod every) + 1`, and `every` when nothing is
    /// held. A token bucket adds tokens once per `refill_every` and
    /// `reset_after` counts whole periods, so this is exactly the next
    /// refill. A GCRA band frees one unit per emission interval as its
    /// theoretical arrival time comes closer, and `reset_after` is that
    /// time: this is exactly when the next unit frees. A sliding counter's
    /// `reset_after` is the end of the window after the current one (when
    /// this window's count has faded), so this is the end of the current
    /// window: until then only the previous window's share fades, and when
    /// that share is already nothing, the quota stays `r` exactly until
    /// then.
    NextStep(Duration),
}

impl Effective {
    /// Per band of `bands`, in order. An exhaustive `match`: a new
    /// algorithm does not compile until it says what its `t` is.
    fn of(bands: &Bands) -> Box<[Effective]> {
        match bands {
            Bands::FixedWindow(b) | Bands::SlidingLog(b) => vec![Effective::Reset; b.len()].into(),
            Bands::SlidingCounter(b) => b.iter().map(|w| Effective::NextStep(w.window)).collect(),
            Bands::TokenBucket(b) => b
                .iter()
                .map(|band| Effective::NextStep(band.refill_every))
                .collect(),
            Bands::Gcra(b) => b
                .iter()
                .map(|band| Effective::NextStep(Duration::from_micros(band.emission_interval_us())))
                .collect(),
        }
    }

    /// Whole seconds, rounded up like every time sluice announces.
    fn seconds(self, reset_after: Duration) -> u64 {
        match self {
            Effective::Reset => ceil_secs(reset_after),
            Effective::NextStep(every) => {
                // In nanoseconds and u128: exact for any `Duration`, and a
                // band's step is at least a microsecond (validated), the
                // floor only keeps `%` from panicking.
                let every = every.as_nanos().max(1);
                let reset = reset_after.as_nanos();
                let next = match reset.checked_sub(1) {
                    Some(before) => before % every + 1,
                    None => every,
                };
                let secs = next.div_ceil(1_000_000_000);
                u64::try_from(secs).unwrap_or(u64::MAX)
            }
        }
    }
}

fn json_string(s: &str) -> String {
    // Serializing a string cannot fail.
    serde_json::to_string(s).unwrap_or_default()
}

/// [`Prepared::opening`] of policy `name`.
fn opening(name: &str, several_bands: bool) -> Box<[u8]> {
    let closing = if several_bands { "-" } else { "\";r=" };
    format!("\"{}{closing}", sf_string_inner(name))
        .into_bytes()
        .into()
}

/// One allocation of exactly the joined length: a `Bytes` made from a full
/// `Vec` takes it over without allocating again.
fn concat(parts: &[&[u8]]) -> Bytes {
    let mut out = Vec::with_capacity(parts.iter().map(|p| p.len()).sum());
    for part in parts {
        out.extend_from_slice(part);
    }
    Bytes::from(out)
}

/// 429: the subject is over the policy's limit.
pub fn too_many_requests(prepared: &Prepared, decision: &Decision) -> Response<Body> {
    let retry_after = retry_after_secs(decision.retry_after);
    let announce = prepared.announce;
    let render = || {
        let told = announce.then_some(retry_after);
        let mut fields = prepared.denied.fields(told.map(HeaderValue::from));
        add_policy_field(&mut fields, prepared);
        if let Some(value) = announce.then(|| prepared.limit_value(decision)).flatten() {
            fields.append(&RATELIMIT, value);
        }
        Rendered {
            body: prepared.denied.body(told),
            fields,
        }
    };
    // A denial's parts depend on nothing else (`limit_value`); an
    // admission told to wait (`delay`) is rendered as it comes.
    let rendered = if decision.allowed {
        render()
    } else {
        let told = (retry_after, decision.remaining, decision.band);
        prepared.refused.get_or_make(told, render)
    };
    prepared
        .denied
        .respond_with_fields(rendered.body, rendered.fields)
}

/// 503: the request is over a concurrency limit (`prepared` is that
/// limit's).
pub fn over_concurrency(prepared: &Prepared, retry_after: Duration) -> Response<Body> {
    let retry_after = retry_after_secs(retry_after);
    let mut response = prepared.denied.respond(retry_after, prepared.announce);
    add_policy_field(response.headers_mut(), prepared);
    response
}

/// 429 decided by this sidecar alone (`on_failure: local`): the same
/// answer, but `RateLimit-Policy` announces the quotas it enforces alone
/// (`local_field`), which are what `RateLimit` and `Retry-After` count.
pub fn too_many_requests_local(
    prepared: &Prepared,
    local_field: &HeaderValue,
    decision: &Decision,
) -> Response<Body> {
    let retry_after = retry_after_secs(decision.retry_after);
    let mut response = prepared.denied.respond(retry_after, prepared.announce);
    if prepared.announce {
        let headers = response.headers_mut();
        headers.append(&RATELIMIT_POLICY, local_field.clone());
        if let Some(value) = prepared.limit_value(decision) {
            headers.append(&RATELIMIT, value);
        }
    }
    response
}

/// 503: the store could not decide in time and `on_failure` is `deny`.
pub fn unavailable(prepared: &Prepared, retry_after: Duration) -> Response<Body> {
    let retry_after = retry_after_secs(retry_after);
    let mut response = prepared.unavailable.respond(retry_after, prepared.announce);
    add_policy_field(response.headers_mut(), prepared);
    response
}

/// 503: the request and the store cannot be evaluated together (a
/// configuration or store mismatch, whatever `on_failure` says). To the
/// client, the limit could not be checked: a route's own `unavailable`
/// answers it too.
pub fn incompatible(
    prepared: &Prepared,
    route: &Route,
    policy: &Policy,
    reason: Incompatible,
    retry_after: Duration,
) -> Response<Body> {
    if prepared.unavailable.custom || !prepared.announce {
        return unavailable(prepared, retry_after);
    }
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

/// Adds `RateLimit-Policy` and `RateLimit` for `decision`. Appended, not
/// set: an upstream's own rate-limit fields describe its own limits.
/// Nothing for a policy with `headers: off`.
pub fn add_ratelimit_headers(headers: &mut HeaderMap, prepared: &Prepared, decision: &Decision) {
    if !prepared.announce {
        return;
    }
    add_policy_field(headers, prepared);
    // Built from printable ASCII only, so this never fails; a header is
    // dropped rather than a response lost if it ever did.
    if let Some(value) = prepared.limit_value(decision) {
        headers.append(&RATELIMIT, value);
    }
}

/// `RateLimit-Policy` on an answer of an announced limit, when the route
/// has one to list.
fn add_policy_field(headers: &mut HeaderMap, prepared: &Prepared) {
    if let (true, Some(field)) = (prepared.announce, &prepared.policy_field) {
        headers.append(&RATELIMIT_POLICY, field.clone());
    }
}

/// `RateLimit-Policy` for `policy` alone (the local fallback's quotas).
pub fn policy_field(policy: &Policy) -> HeaderValue {
    let mut out = String::new();
    policy_value(&mut out, policy);
    // Built from printable ASCII only (see `push_band_name`).
    HeaderValue::from_str(&out).unwrap_or_else(|_| HeaderValue::from_static(""))
}

/// Every announced limit of `route` that applies to a request of tier
/// `tier`, in order, as `RateLimit-Policy` members: one with `headers:
/// off` is left out, so an answer of another limit does not reveal it.
fn route_policy_value(route: &Route, tier: u8) -> String {
    let mut out = String::new();
    let listed = |l: &&crate::route::Limit| l.applies(tier) && l.policy.announced();
    for limit in route.limits.iter().filter(listed) {
        if !out.is_empty() {
            out.push_str(", ");
        }
        match &limit.policy {
            LimitPolicy::Rate(policy) => policy_value(&mut out, policy),
            LimitPolicy::Concurrency(c) => {
                push_band_name(&mut out, &c.name, 0, 1);
                let _ = write!(out, ";q={};qu=\"concurrent-requests\"", c.limit);
            }
        }
    }
    out
}

/// `"<name>";q=<quota>;w=<seconds>` per band.
fn policy_value(out: &mut String, policy: &Policy) {
    let quotas = policy.quotas();
    for (i, (quota, window)) in quotas.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        push_band_name(out, &policy.name, i, quotas.len());
        // A window under a second still has to be announced as one.
        let _ = write!(
            out,
            ";q={quota};w={}",
            sf_integer(ceil_secs(*window).max(1))
        );
    }
}

/// A structured-field String (RFC 8941 §3.3.3): printable ASCII with `"`
/// and `\` escaped. Anything else cannot be expressed and becomes `_`.
fn push_band_name(out: &mut String, name: &str, band: usize, bands: usize) {
    out.push('"');
    out.push_str(&sf_string_inner(name));
    if bands > 1 {
        let _ = write!(out, "-{band}");
    }
    out.push('"');
}

/// The inside of a structured-field String holding `name`.
fn sf_string_inner(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('_'),
        }
    }
    out
}

/// The largest structured-field Integer (RFC 8941 §3.3.1: at most 15
/// digits). A larger number makes the whole field unparseable, so it is
/// announced as this one: a remaining count or a wait this large means
/// "more than a client will ever use" either way. `remaining` comes from
/// the store's reply, which is only known to be a non-negative `i64`.
const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

fn sf_integer(n: u64) -> u64 {
    n.min(SF_INTEGER_MAX)
}

/// Whole seconds, rounded up. Saturating: `Duration::MAX` has a fraction
/// on top of `u64::MAX` seconds.
fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
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
    problem_response(
        status,
        Bytes::from(problem_json(status, detail, context, retry_after)),
        retry_after.map(HeaderValue::from),
    )
}

fn problem_json(
    status: StatusCode,
    detail: &str,
    context: Option<(&Route, &Policy)>,
    retry_after: Option<u64>,
) -> Vec<u8> {
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
    serde_json::to_vec(&problem).unwrap_or_default()
}

fn problem_response(
    status: StatusCode,
    json: Bytes,
    retry_after: Option<HeaderValue>,
) -> Response<Body> {
    let mut response = Response::new(body::full(json));
    *response.status_mut() = status;
    *response.headers_mut() = problem_fields(retry_after);
    response
}

/// A problem answer's fields: its content type, `no-store`, and
/// `Retry-After` when given.
fn problem_fields(retry_after: Option<HeaderValue>) -> HeaderMap {
    let mut fields = HeaderMap::with_capacity(6);
    fields.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    fields.insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    if let Some(value) = retry_after {
        fields.insert(RETRY_AFTER, value);
    }
    fields
}

mod answers;
mod refusal;

pub use answers::*;
use refusal::{Answer, Detail};

#[cfg(test)]
mod refusal_tests;
#[cfg(test)]
mod tests;
