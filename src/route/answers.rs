//! What a route answers in place of sluice's own problem+json when one of
//! its limits refuses a request (`refused`) or cannot be checked
//! (`unavailable`): `responses.refused` / `responses.unavailable` at the
//! top of the file, replaced per route by the route's own `responses:`.
//! Read and checked when the configuration loads; [`crate::proxy`] builds
//! the responses from these once per route, so a request never reads a
//! file.

use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};

/// The two answers a route may write; `None` keeps sluice's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answers {
    pub refused: Option<Arc<CustomAnswer>>,
    pub unavailable: Option<Arc<CustomAnswer>>,
}

impl Answers {
    /// The route's own answers, each falling back to `global`'s: a route
    /// that writes `refused` only keeps the global `unavailable`.
    pub fn or(&self, global: &Answers) -> Answers {
        Answers {
            refused: self.refused.clone().or_else(|| global.refused.clone()),
            unavailable: self
                .unavailable
                .clone()
                .or_else(|| global.unavailable.clone()),
        }
    }
}

/// One custom answer, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomAnswer {
    /// `None`: the status sluice answers anyway (429 for a rate limit's
    /// refusal, 503 for a concurrency limit's and for `unavailable`).
    pub status: Option<StatusCode>,
    /// `None`: sluice's problem+json body (with `status`'s title).
    pub body: Option<CustomBody>,
    /// Added to the answer, in the order written; checked not to name a
    /// framing, hop-by-hop or rate-limit field.
    pub headers: Box<[(HeaderName, HeaderValue)]>,
}

/// `body_file` and `content_type`: sent as read, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CustomBody {
    pub content_type: HeaderValue,
    pub bytes: Bytes,
    /// Where it was read from, for `sluice check`.
    pub file: PathBuf,
}
