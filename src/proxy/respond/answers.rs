//! The answers that concern no limit: what the client sent cannot be
//! served as it is (400, 501, 408), the app could not answer (502, 504),
//! the request asks about sluice itself (`OPTIONS *`), or its head would
//! go past the memory budget for request heads (503).

use std::sync::OnceLock;

use http::header::{HeaderValue, ALLOW, CONTENT_LENGTH};
use http::{Response, StatusCode};

use crate::server::heads;

use super::body::{self, Body, Cut};
use super::{problem, problem_json, problem_response, Problem};

/// The methods `OPTIONS *` announces in `Allow`: those in general use
/// that sluice passes to the app. CONNECT is refused (501); TRACE and
/// extension methods (WebDAV's, say) still pass, but whether the app
/// serves them is the app's to say, and TRACE is best not advertised.
pub const SERVER_ALLOW: &str = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS";

/// 200 to `OPTIONS *`: the request asks about the server, not a resource,
/// and sluice is the server the client reached. Answered here rather than
/// forwarded, since the app might read `*` as `/*` and no route of a
/// path-based table matches it. No body (RFC 9110 §9.3.7), and
/// `Content-Length: 0` said outright so that no client waits for one.
pub fn server_options() -> Response<Body> {
    let mut response = Response::new(body::empty());
    let headers = response.headers_mut();
    headers.insert(ALLOW, HeaderValue::from_static(SERVER_ALLOW));
    headers.insert(CONTENT_LENGTH, HeaderValue::from_static("0"));
    response
}

/// 403: the client address is in the `deny` networks of route `route`.
/// Nothing of the request was looked at past its route, and nothing is
/// forwarded; the body names the route (the operator's word), never the
/// address.
pub fn forbidden(route: &str) -> Response<Body> {
    let status = StatusCode::FORBIDDEN;
    let detail = format!("route \"{route}\" does not accept requests from this client address");
    let problem = Problem {
        kind: "about:blank",
        title: "Forbidden",
        status: status.as_u16(),
        detail: &detail,
        route: Some(route),
        policy: None,
        retry_after: None,
    };
    // Serializing a struct of strings and integers cannot fail.
    let json = serde_json::to_vec(&problem).unwrap_or_default();
    problem_response(status, json.into(), None)
}

pub fn bad_request(reason: &str) -> Response<Body> {
    problem(StatusCode::BAD_REQUEST, reason, None, None)
}

/// 501: a transfer-coding sluice does not implement (RFC 9112 §6.1).
pub fn not_implemented(reason: &str) -> Response<Body> {
    problem(StatusCode::NOT_IMPLEMENTED, reason, None, None)
}

/// A refusal after which the connection's framing cannot be trusted: the
/// request's end is unknown, so nothing after it on the connection is
/// read (RFC 9112 §6.1, §6.3). HTTP/2 drops the field: its framing is the
/// stream's own.
pub fn closing(mut response: Response<Body>) -> Response<Body> {
    response
        .headers_mut()
        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// 400: the client's request body broke part way (an invalid chunk, fewer
/// bytes than its `Content-Length`). The client's fault, not the app's.
pub fn broken_request_body() -> Response<Body> {
    closing(problem(
        StatusCode::BAD_REQUEST,
        "the request body was malformed or cut short",
        None,
        None,
    ))
}

/// 408: the client stopped sending its request body, or sent it too
/// slowly.
pub fn request_timeout(cut: Cut) -> Response<Body> {
    let detail = match cut {
        Cut::Idle => "the request body stalled",
        Cut::TooSlow => "the request body arrived too slowly",
    };
    let mut response = problem(StatusCode::REQUEST_TIMEOUT, detail, None, None);
    // The connection's framing is in an unknown state after a cut body.
    response
        .headers_mut()
        .insert(http::header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// 502: the upstream could not be reached.
pub fn bad_gateway() -> Response<Body> {
    problem(
        StatusCode::BAD_GATEWAY,
        "the upstream could not be reached",
        None,
        None,
    )
}

/// 502: the upstream answered something sluice will not pass on (a
/// malformed or ambiguous response head, a 1xx flood) or went away before
/// its response head was complete.
pub fn broken_upstream_response() -> Response<Body> {
    problem(
        StatusCode::BAD_GATEWAY,
        "the upstream's response was malformed or cut short",
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

/// 503: an HTTP/2 stream whose header list would take its connection,
/// its client or the process past the memory budget for request heads.
/// Retried in a second, the budget has most likely room again.
pub fn over_head_budget(over: heads::Over) -> Response<Body> {
    problem(
        StatusCode::SERVICE_UNAVAILABLE,
        over_head_budget_detail(over),
        None,
        Some(1),
    )
}

/// The same answer for an HTTP/1 head still arriving, written to the
/// socket under hyper (which never finishes reading that head), whole and
/// closing the connection.
pub fn over_head_budget_http1(over: heads::Over) -> &'static [u8] {
    static ANSWERS: OnceLock<[Vec<u8>; 3]> = OnceLock::new();
    let answers = ANSWERS.get_or_init(|| {
        [
            heads::Over::Connection,
            heads::Over::Client,
            heads::Over::Total,
        ]
        .map(|over| {
            let json = problem_json(
                StatusCode::SERVICE_UNAVAILABLE,
                over_head_budget_detail(over),
                None,
                Some(1),
            );
            let mut answer = format!(
                "HTTP/1.1 503 Service Unavailable\r\n\
                 content-type: application/problem+json\r\n\
                 cache-control: no-store\r\n\
                 retry-after: 1\r\n\
                 connection: close\r\n\
                 content-length: {}\r\n\r\n",
                json.len()
            )
            .into_bytes();
            answer.extend_from_slice(&json);
            answer
        })
    });
    &answers[over as usize]
}

fn over_head_budget_detail(over: heads::Over) -> &'static str {
    match over {
        heads::Over::Connection => {
            "this connection holds as many request heads as sluice allows one connection"
        }
        heads::Over::Client => {
            "this client address holds as many request heads as sluice allows one client"
        }
        heads::Over::Total => "sluice holds as many request heads as its memory budget allows",
    }
}
