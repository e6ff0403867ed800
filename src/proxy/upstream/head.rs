//! What sluice refuses in an upstream's response that hyper's client lets
//! through (the client side of Content-Length +
//! Transfer-Encoding is not fixed in hyper). Each is answered 502 and the
//! upstream connection is poisoned, never reused: where the refused
//! response ends, and so where the next one starts, is in doubt.
//!
//! hyper already refuses, and closes the connection on: two different
//! `Content-Length`s, a status line that is not HTTP, more than 100 header
//! fields (hyper's default, and Envoy's; tested with 150 in
//! `tests/it/broken_upstream.rs`), a head that does not fit its read buffer, and
//! (once the head is sent) a body shorter than its length or a malformed
//! chunk.

use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http::HeaderMap;

use crate::proxy::headers::ResponseFields;

/// Largest upstream response head, counted as its fields' `name: value\r\n`
/// lines. 64 KiB, the request-head default, is near Envoy's 60 KiB
/// `max_response_headers_kb` (nginx's `proxy_buffer_size` is one memory
/// page, which real apps outgrow). hyper's client bounds a head only by its
/// read buffer (about 400 KiB by default) and only checks it while the
/// head is incomplete, so one read can carry a head up to twice the buffer
/// past it: the buffer is set to this size to bound memory, and the exact
/// limit is checked on the parsed head.
pub(super) const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Most `1xx` responses before the final one. An app sends one
/// `100 Continue` and perhaps a few `103 Early Hints`; hyper's client skips
/// any number of them, so an endless stream would hold the request until
/// `upstream.timeout`.
pub(super) const MAX_INFORMATIONAL: usize = 16;

/// Why an upstream response head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(super) enum Refused {
    #[error("the upstream response has both Content-Length and Transfer-Encoding")]
    LengthAndCoding,
    #[error("the upstream response has a transfer-coding other than a plain chunked")]
    TransferCoding,
    #[error("the upstream sent more than {MAX_INFORMATIONAL} 1xx responses")]
    InformationalFlood,
    #[error("the upstream response head is larger than {MAX_HEAD_BYTES} bytes")]
    HeadTooLarge,
}

/// A final response head sluice will pass on: within [`MAX_HEAD_BYTES`]
/// and framed soundly ([`check_framing`]).
/// `fields`: what one pass over `headers` found (its size, whether it has
/// a `Transfer-Encoding`: most heads have none, and need no lookup of it).
pub(super) fn check(headers: &HeaderMap, fields: &ResponseFields) -> Result<(), Refused> {
    if fields.bytes() > MAX_HEAD_BYTES {
        return Err(Refused::HeadTooLarge);
    }
    if !fields.transfer_encoding() {
        return Ok(());
    }
    check_framing(headers)
}

/// The framing of a final response head, as RFC 9112 §6.3 reads it for a
/// proxy: a `Transfer-Encoding` must be exactly one `chunked` and come
/// alone. `gzip, chunked` would reach the client without the coding that
/// makes sense of it (sluice removes the hop-by-hop field), and with a
/// `Content-Length` beside it the two disagree on where the body ends.
fn check_framing(headers: &HeaderMap) -> Result<(), Refused> {
    let mut codings = headers.get_all(TRANSFER_ENCODING).iter();
    match (codings.next(), codings.next()) {
        (None, _) => Ok(()),
        (Some(_), _) if headers.contains_key(CONTENT_LENGTH) => Err(Refused::LengthAndCoding),
        (Some(coding), None) if coding.as_bytes().eq_ignore_ascii_case(b"chunked") => Ok(()),
        (Some(_), _) => Err(Refused::TransferCoding),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn head(fields: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in fields {
            headers.append(*name, HeaderValue::from_static(value));
        }
        headers
    }

    /// [`check`], with the fields read as the forward reads them.
    fn checked(headers: &HeaderMap) -> Result<(), Refused> {
        check(headers, &ResponseFields::of(headers))
    }

    #[test]
    fn a_head_over_the_limit_is_refused() {
        let mut headers = HeaderMap::new();
        let value = HeaderValue::from_str(&"a".repeat(MAX_HEAD_BYTES - 9)).unwrap();
        headers.insert("x-big", value);
        // `x-big: ` + value + CRLF is exactly the limit.
        assert_eq!(checked(&headers), Ok(()));
        headers.insert("x", HeaderValue::from_static(""));
        assert_eq!(checked(&headers), Err(Refused::HeadTooLarge));
    }

    #[test]
    fn only_a_lone_plain_chunked_passes() {
        assert_eq!(checked(&head(&[])), Ok(()));
        assert_eq!(checked(&head(&[("content-length", "5")])), Ok(()));
        assert_eq!(checked(&head(&[("transfer-encoding", "chunked")])), Ok(()));
        assert_eq!(checked(&head(&[("transfer-encoding", "Chunked")])), Ok(()));
        assert_eq!(
            checked(&head(&[
                ("transfer-encoding", "chunked"),
                ("content-length", "5")
            ])),
            Err(Refused::LengthAndCoding)
        );
        for coding in ["gzip", "gzip, chunked", "chunked, chunked", "chunked;x=1"] {
            assert_eq!(
                checked(&head(&[("transfer-encoding", coding)])),
                Err(Refused::TransferCoding),
                "{coding}"
            );
        }
        assert_eq!(
            checked(&head(&[
                ("transfer-encoding", "chunked"),
                ("transfer-encoding", "chunked")
            ])),
            Err(Refused::TransferCoding)
        );
    }
}
