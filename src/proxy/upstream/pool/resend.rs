//! What a request needs to be sent again when the reused connection it
//! met turns out closed: whether it may be, the copy of its head kept
//! for it, and whether the connection was indeed gone.

use std::error::Error as _;
use std::io;

use http::header::{HeaderName, HeaderValue};
use http::{Method, Request, Uri, Version};
use http_body::Body as _;

use crate::proxy::body::{self, Body};

/// Whether `request` may be sent twice: an idempotent method and nothing
/// in its body.
pub(super) fn replayable(request: &Request<Body>) -> bool {
    let method = request.method();
    let idempotent = method == Method::GET
        || method == Method::HEAD
        || method == Method::OPTIONS
        || method == Method::TRACE
        || method == Method::PUT
        || method == Method::DELETE;
    idempotent && request.body().is_end_stream()
}

/// The head of a [`replayable`] request, kept while it is sent on a
/// reused connection: what it is sent again with should hyper not hand
/// it back (it does for a request it never wrote).
///
/// Its fields are kept as their bytes in one buffer, each name and value
/// after its length. A clone of the field map takes two allocations and
/// a reference on every name and value, each given back when the clone is
/// dropped: about 1.4k instructions a request with five fields, 4.2k
/// with a browser's twelve (`docs/BENCHMARKS.md`), paid by every request for a
/// resend that almost none needs. The buffer is one allocation and a copy
/// of the head's bytes; reading it back is left to the rare resend.
pub(super) struct HeadCopy {
    method: Method,
    uri: Uri,
    version: Version,
    fields: Vec<u8>,
}

impl HeadCopy {
    pub(super) fn of(request: &Request<Body>) -> HeadCopy {
        let headers = request.headers();
        // One pass over the fields: the buffer starts at a size most heads
        // fit in (a browser's twelve fields take about 600 bytes here) and
        // grows for a larger one, where sizing it first took a pass of its
        // own, each standard name looked up as text twice.
        let mut fields = Vec::with_capacity(COPY_START);
        for (name, value) in headers {
            for part in [name.as_str().as_bytes(), value.as_bytes()] {
                fields.extend_from_slice(&part.len().to_ne_bytes());
                fields.extend_from_slice(part);
            }
        }
        HeadCopy {
            method: request.method().clone(),
            uri: request.uri().clone(),
            version: request.version(),
            fields,
        }
    }

    /// The request again: the same head, in the same order, with an empty
    /// body and no extensions. `None` if a field cannot be read back,
    /// which a field that was valid when copied never is.
    pub(super) fn request(self) -> Option<Request<Body>> {
        let mut request = Request::new(body::empty());
        *request.method_mut() = self.method;
        *request.uri_mut() = self.uri;
        *request.version_mut() = self.version;
        let headers = request.headers_mut();
        let mut rest = &self.fields[..];
        while !rest.is_empty() {
            let (name, after) = part(rest)?;
            let (value, after) = part(after)?;
            rest = after;
            let name = HeaderName::from_bytes(name).ok()?;
            let value = HeaderValue::from_bytes(value).ok()?;
            headers.append(name, value);
        }
        Some(request)
    }
}

/// What a copy's buffer is allocated with: within glibc's per-thread cache
/// of small blocks (up to 1,032 bytes), taken and given back without a
/// lock.
const COPY_START: usize = 1024;

/// The part at the front of `bytes` (its length, then it), and the rest.
fn part(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = bytes.split_first_chunk()?;
    let len = usize::from_ne_bytes(*len);
    (len <= rest.len()).then(|| rest.split_at(len))
}

/// The connection was gone when the request met it: closed before an
/// answer, or reset.
pub(super) fn met_a_closed_connection(error: &hyper::Error) -> bool {
    if error.is_incomplete_message() {
        return true;
    }
    let mut source = error.source();
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
                    | io::ErrorKind::BrokenPipe
            );
        }
        source = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(request: &Request<Body>) -> Vec<(String, Vec<u8>)> {
        request
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn only_idempotent_requests_without_a_body_are_sent_twice() {
        let request = |method: Method, body: Body| {
            let mut r = Request::new(body);
            *r.method_mut() = method;
            r
        };
        assert!(replayable(&request(Method::GET, body::empty())));
        assert!(replayable(&request(Method::DELETE, body::empty())));
        assert!(!replayable(&request(Method::POST, body::empty())));
        assert!(!replayable(&request(Method::PATCH, body::empty())));
        assert!(!replayable(&request(Method::PUT, body::full("x"))));
    }

    #[test]
    fn a_copied_head_comes_back_as_it_was_sent() {
        let mut request = Request::new(body::empty());
        *request.method_mut() = Method::DELETE;
        *request.uri_mut() = "/a/b?c=d&e".parse().unwrap();
        let headers = request.headers_mut();
        headers.insert("host", HeaderValue::from_static("app.example"));
        headers.append("x-forwarded-for", HeaderValue::from_static("10.0.0.1"));
        headers.append("x-forwarded-for", HeaderValue::from_static("10.0.0.2"));
        headers.append("accept", HeaderValue::from_static(""));
        // A value in obs-text bytes, and a long one.
        headers.append("x-latin", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        let long = "v".repeat(70_000);
        headers.append("x-long", HeaderValue::from_str(&long).unwrap());
        headers.append("cookie", HeaderValue::from_static("a=1"));

        let copy = HeadCopy::of(&request).request().expect("read back");
        assert_eq!(copy.method(), Method::DELETE);
        assert_eq!(copy.uri(), "/a/b?c=d&e");
        assert_eq!(copy.version(), request.version());
        assert_eq!(fields(&copy), fields(&request));
        assert!(copy.body().is_end_stream());
    }

    #[test]
    fn a_head_without_fields_comes_back_without_any() {
        let request = Request::new(body::empty());
        let copy = HeadCopy::of(&request).request().expect("read back");
        assert!(copy.headers().is_empty());
        assert_eq!(copy.method(), Method::GET);
    }

    #[test]
    fn a_cut_copy_is_not_read_back() {
        let mut request = Request::new(body::empty());
        request
            .headers_mut()
            .insert("host", HeaderValue::from_static("app.example"));
        let mut copy = HeadCopy::of(&request);
        copy.fields.pop();
        assert!(copy.request().is_none());
    }
}
