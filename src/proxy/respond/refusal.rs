//! The refusals of one limit, built once when the configuration loads:
//! sluice's problem+json (a template whose one variable is the seconds to
//! wait), or the route's own answer (`responses.refused`,
//! `responses.unavailable`: its status, the bytes of its `body_file`, its
//! fields).

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use http::{Response, StatusCode};

use crate::route::CustomAnswer;

use super::body::{self, Body};
use super::{concat, json_string, problem_fields};

/// A problem body whose one variable is the retry-after seconds, which
/// close `detail` and fill `retry_after`: `head`, seconds, `mid`, seconds,
/// `}`. Byte for byte what [`problem`] serializes (tested).
#[derive(Debug)]
pub(super) struct Template {
    head: Box<str>,
    mid: Box<str>,
    /// The whole body for a policy that is not announced: `untold` as
    /// the detail, no `retry_after`.
    untold: Bytes,
}

/// A refusal's `detail`: `told` is followed by the seconds to wait,
/// `untold` says nothing of time or quota (`headers: off`).
pub(super) struct Detail<'a> {
    pub told: &'a str,
    pub untold: &'a str,
}

impl Template {
    fn new(status: StatusCode, detail: Detail<'_>, route: &str, policy: &str) -> Template {
        let title = json_string(status.canonical_reason().unwrap_or("Error"));
        // JSON escapes character by character, so the escaped detail is the
        // escaped text before the seconds, the digits, then the rest.
        let told = json_string(detail.told);
        let detail_open = told.strip_suffix('"').unwrap_or(&told);
        let (route, policy) = (json_string(route), json_string(policy));
        Template {
            head: format!(
                r#"{{"type":"about:blank","title":{title},"status":{},"detail":{detail_open}"#,
                status.as_u16()
            )
            .into(),
            mid: format!(r#" s","route":{route},"policy":{policy},"retry_after":"#).into(),
            untold: Bytes::from(format!(
                r#"{{"type":"about:blank","title":{title},"status":{},"detail":{},"route":{route},"policy":{policy}}}"#,
                status.as_u16(),
                json_string(detail.untold)
            )),
        }
    }

    pub fn render(&self, retry_after: u64) -> Bytes {
        let mut seconds = itoa::Buffer::new();
        let seconds = seconds.format(retry_after).as_bytes();
        concat(&[
            self.head.as_bytes(),
            seconds,
            self.mid.as_bytes(),
            seconds,
            b"}",
        ])
    }
}

/// One refusal of a limit, built once: its status, its body (sluice's
/// problem+json, or the route's file) and the route's own fields.
#[derive(Debug)]
pub(super) struct Answer {
    /// The route wrote it (rather than keeping sluice's own).
    pub custom: bool,
    pub status: StatusCode,
    body: AnswerBody,
    headers: Box<[(HeaderName, HeaderValue)]>,
}

#[derive(Debug)]
enum AnswerBody {
    Problem(Template),
    File {
        content_type: HeaderValue,
        bytes: Bytes,
    },
}

impl Answer {
    /// `custom` (the route's, if it writes one) over sluice's own answer
    /// with status `status`.
    pub fn new(
        custom: Option<&CustomAnswer>,
        status: StatusCode,
        detail: Detail<'_>,
        route: &str,
        policy: &str,
    ) -> Answer {
        let status = custom.and_then(|c| c.status).unwrap_or(status);
        let body = match custom.and_then(|c| c.body.as_ref()) {
            Some(file) => AnswerBody::File {
                content_type: file.content_type.clone(),
                bytes: file.bytes.clone(),
            },
            None => AnswerBody::Problem(Template::new(status, detail, route, policy)),
        };
        Answer {
            custom: custom.is_some(),
            status,
            body,
            headers: custom.map(|c| c.headers.clone()).unwrap_or_default(),
        }
    }

    /// The response, `Retry-After` included when `announce`; without the
    /// rate-limit fields, which the caller adds.
    pub fn respond(&self, retry_after: u64, announce: bool) -> Response<Body> {
        let told = announce.then_some(retry_after);
        self.respond_with(self.body(told), told.map(HeaderValue::from))
    }

    /// The body telling `told` seconds (none when the limit is not
    /// announced).
    pub fn body(&self, told: Option<u64>) -> Bytes {
        match &self.body {
            AnswerBody::Problem(template) => match told {
                Some(secs) => template.render(secs),
                None => template.untold.clone(),
            },
            AnswerBody::File { bytes, .. } => bytes.clone(),
        }
    }

    /// The response with `body` (from [`Answer::body`]) and `Retry-After`
    /// when given; without the rate-limit fields, which the caller adds.
    pub fn respond_with(&self, body: Bytes, retry_after: Option<HeaderValue>) -> Response<Body> {
        self.respond_with_fields(body, self.fields(retry_after))
    }

    /// The response with `body` and `fields` (from [`Answer::fields`]).
    pub fn respond_with_fields(&self, body: Bytes, fields: HeaderMap) -> Response<Body> {
        let mut response = Response::new(body::full(body));
        *response.status_mut() = self.status;
        *response.headers_mut() = fields;
        response
    }

    /// The response's fields, `Retry-After` when given; without the
    /// rate-limit fields, which the caller adds.
    pub fn fields(&self, retry_after: Option<HeaderValue>) -> HeaderMap {
        let mut fields = problem_fields(retry_after);
        if let AnswerBody::File { content_type, .. } = &self.body {
            fields.insert(CONTENT_TYPE, content_type.clone());
        }
        // Set, not appended: a route's `Cache-Control` replaces `no-store`.
        for (name, value) in &*self.headers {
            fields.insert(name.clone(), value.clone());
        }
        fields
    }
}
