//! The part of a configuration a running process changes on reload: what
//! each request is judged and forwarded by.
//!
//! A request loads the [`Live`] part in effect once (through
//! [`crate::proxy::Runtime`]) and keeps it to the end; a reload swaps it
//! whole.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use ipnet::IpNet;

use super::Secret;
use crate::limit::Policy;
use crate::path::PathRules;
use crate::route::Route;

/// Everything a reload applies.
#[derive(Debug, Clone)]
pub struct Live {
    pub server: ServerLive,
    pub upstream: UpstreamLive,
    pub store: StoreLive,
    pub identity: Identity,
    pub responses: Responses,
    /// The rate policies, which stores evaluate, in file order.
    /// Concurrency policies are reached through the routes that name them:
    /// no store ever sees one.
    pub policies: Vec<Arc<Policy>>,
    /// In file order: the first matching route wins.
    pub routes: Vec<Route>,
    /// For requests no route matched (named `default` in output).
    pub default: Route,
}

/// `server.paths`, `server.body_idle_timeout`, `server.min_upload_rate`
/// and `server.request_buffering`: read per request.
#[derive(Debug, Clone)]
pub struct ServerLive {
    /// Longest silence allowed between two pieces of a request body.
    pub body_idle_timeout: Duration,
    /// The slowest a request body may arrive; `None` when switched off.
    pub min_upload_rate: Option<MinUploadRate>,
    /// Which request bodies are received whole before they take a place.
    pub request_buffering: RequestBuffering,
    /// How request paths are normalized before matching and forwarding.
    pub paths: PathRules,
    /// What is done with request headers whose names contain `_`.
    pub underscores: Underscores,
    /// `POST /explain` answers only when this is set, and only to a
    /// request bearing it (`Authorization: Bearer <token>`).
    pub explain_token: Option<Secret>,
}

/// `server.min_upload_rate`: a request body must average at least
/// `bytes_per_second` over the time sluice waits on the client for it,
/// once that time passes `grace` (Kestrel's `MinRequestBodyDataRate`).
/// A client trickling a body holds its in-flight place and an upstream
/// connection; the idle timeout alone lets one byte in each interval do
/// that for as long as the body lasts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinUploadRate {
    pub bytes_per_second: NonZeroU32,
    pub grace: Duration,
}

/// `server.request_buffering`: a request that matched a concurrency limit
/// and whose body is at most `max_body` bytes is received whole before it
/// takes a place in flight, so a slow upload holds no place while it
/// arrives; `total` bounds the bytes so held by every request together.
/// `max_body` 0 switches buffering off (`proxy::buffered`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestBuffering {
    pub max_body: usize,
    pub total: usize,
}

impl RequestBuffering {
    pub fn is_on(self) -> bool {
        self.max_body > 0
    }
}

/// `server.headers_with_underscores`: CGI-style servers (Puma, gunicorn
/// before 22, PHP's CGI and FastCGI, wsgiref) read `X_API_Key` as
/// `X-API-Key`, so such a name can stand in for a header sluice reads
/// another way (nginx's `underscores_in_headers off`, Envoy's
/// `headers_with_underscores_action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Underscores {
    /// Removed before forwarding; a request where one would read as an
    /// identity, override or forwarding header gets 400.
    Drop,
    /// Any such header: 400.
    Reject,
    /// Forwarded as sent (unsafe behind CGI-style servers); one that would
    /// read as an identity or forwarding header still gets 400, and one
    /// that reads as a method override is matched as one.
    Allow,
}

/// Where requests go and how long their answer may take: read per request
/// (the connect timeout belongs to the pooled client, see
/// [`super::UpstreamBoot`]).
#[derive(Debug, Clone)]
pub struct UpstreamLive {
    /// `http://host:port` with an optional base path (no query).
    pub url: Uri,
    /// Until the upstream's response head arrives; beyond it, 504.
    pub timeout: Duration,
}

/// How a decision is bounded and what happens when none is made.
#[derive(Debug, Clone)]
pub struct StoreLive {
    /// The whole decision: pool wait, connect, round trips.
    pub budget: Duration,
    pub on_failure: OnFailure,
    /// How many sidecars share the store's limits: under `local`, each
    /// enforces every quota divided by this.
    pub local_share: NonZeroU32,
    pub failure_retry_after: Duration,
}

/// Re-exported: policies (`limit`) carry their own failure mode.
pub use crate::limit::OnFailure;

#[derive(Debug, Clone)]
pub struct Identity {
    pub trusted_proxies: Vec<IpNet>,
    /// One IPv6 client owns this prefix length.
    pub ipv6_prefix: u8,
    /// None: the memory store generates a random key at start.
    pub pseudonym_key: Option<Secret>,
    pub pseudonym_key_version: u32,
    /// `identity.jwt`: what verifies bearer tokens, and the file its keys
    /// came from (watched with the configuration).
    pub jwt: Option<Arc<crate::subject::jwt::Verifier>>,
    pub jwt_keys_file: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone)]
pub struct Responses {
    /// Send `RateLimit` / `RateLimit-Policy` on forwarded responses too.
    pub ratelimit_headers_on_allowed: bool,
    /// `refused` and `unavailable`: every route's, unless it writes its
    /// own (already merged into each [`Route::answers`]).
    pub answers: crate::route::Answers,
}
