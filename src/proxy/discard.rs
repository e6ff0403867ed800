//! The body of a refused request, read and thrown away.
//!
//! An HTTP/1 client that writes its whole request before it reads
//! (Python's `http.client` and `requests`, most upload code) sees nothing
//! of an answer sent while it is still writing if sluice stops reading:
//! hyper then closes the connection, the client's next write finds it
//! reset, and it reports a broken pipe instead of the 429 and its
//! `Retry-After`. So the rest of a refused request's body is read here, in
//! the background, while the answer goes out: the client finishes, reads
//! its answer, and the connection stays open for its next request (what
//! nginx does with a body it discards).
//!
//! On HTTP/2 a stream whose body is left unread is ended by a reset
//! (`NO_ERROR`) after the answer, which RFC 9113 §8.1 allows, but some
//! clients in wide use (curl 7.88, Debian 12's) then drop the answer they
//! had and report an error: the body is read there too, and the stream
//! ends as any other.
//!
//! Bounded as a forwarded body is (`server.body_idle_timeout`,
//! `server.min_upload_rate`), and in all by [`LINGER`]: past that the
//! body is dropped (an HTTP/1 connection closes after the answer, an
//! HTTP/2 stream is reset). Not done for a client that asked to be told
//! before it sends (`Expect: 100-continue`): it sends nothing unless told
//! to.

use std::time::Duration;

use http::{header, HeaderMap};
use http_body_util::BodyExt as _;
use tokio::time::Instant;

use crate::config::Live;

use super::body::{BoxError, IdleTimeout};

/// The longest a refused request's body is read for.
pub const LINGER: Duration = Duration::from_secs(30);

/// Reads what is left of `body` in the background, within the bounds
/// above, when it is worth reading.
pub fn discard<B>(headers: &HeaderMap, body: B, live: &Live)
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    if body.is_end_stream() || expects_continue(headers) {
        return;
    }
    let body = IdleTimeout::new(body, live.server.body_idle_timeout)
        .with_floor(live.server.min_upload_rate);
    tokio::spawn(async move {
        let until = Instant::now() + LINGER;
        let mut body = std::pin::pin!(body);
        // Any error (cut, too slow, the client gone) ends it.
        while let Ok(Some(Ok(_))) = tokio::time::timeout_at(until, body.frame()).await {}
    });
}

fn expects_continue(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::EXPECT)
        .iter()
        .any(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}
