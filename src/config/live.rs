//! The part of a configuration a running process changes on reload: what
//! each request is judged and forwarded by.
//!
//! A request loads the [`Live`] part in effect once (through
//! [`crate::runtime::Runtime`]) and keeps it to the end; a reload swaps it
//! whole.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, Uri};
use ipnet::IpNet;

use super::Secret;
use crate::limit::Policy;
use crate::path::PathRules;

/// Everything a reload applies.
#[derive(Debug, Clone)]
pub struct Live {
    pub server: ServerLive,
    pub upstream: UpstreamLive,
    pub store: StoreLive,
    pub identity: Identity,
    pub responses: Responses,
    /// In file order (`check` prints them in that order).
    pub policies: Vec<Arc<Policy>>,
    /// In file order: the first matching route wins.
    pub routes: Vec<Route>,
    /// For requests no route matched (named `default` in output).
    pub default: Route,
}

/// `server.paths` and `server.body_idle_timeout`: read per request.
#[derive(Debug, Clone)]
pub struct ServerLive {
    /// Longest silence allowed between two pieces of a request body.
    pub body_idle_timeout: Duration,
    /// How request paths are normalized before matching and forwarding.
    pub paths: PathRules,
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
    pub failure_retry_after: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// 503 with `Retry-After: failure_retry_after` (the default).
    Deny,
    /// Forward without a decision (counted).
    Allow,
}

#[derive(Debug, Clone)]
pub struct Identity {
    pub trusted_proxies: Vec<IpNet>,
    /// One IPv6 client owns this prefix length.
    pub ipv6_prefix: u8,
    /// None: the memory store generates a random key at start.
    pub pseudonym_key: Option<Secret>,
    pub pseudonym_key_version: u32,
}

#[derive(Debug, Clone)]
pub struct Responses {
    /// Send `RateLimit` / `RateLimit-Policy` on forwarded responses too.
    pub ratelimit_headers_on_allowed: bool,
}

#[derive(Debug, Clone)]
pub struct Route {
    pub name: Arc<str>,
    pub matcher: Match,
    /// Tried in order; the first present wins. Never empty.
    pub subject: Vec<SubjectSource>,
    /// `None` for `policy: none`: forwarded without limiting.
    pub policy: Option<Arc<Policy>>,
    /// Units charged per request; 1..=policy max cost.
    pub cost: u32,
    /// `Upgrade` protocols passed through (lower-case names, without a
    /// version); `websocket` unless the route says otherwise, never `h2c`.
    pub upgrades: Arc<[Box<str>]>,
}

#[derive(Debug, Clone)]
pub struct Match {
    /// Empty: any method. `GET` also matches `HEAD`.
    pub methods: Vec<Method>,
    /// Compared with the request path in its matching form (see
    /// [`crate::path`]); literals are stored in that form.
    pub path: PathMatch,
    /// `false`: ASCII letters compare regardless of case.
    pub case_sensitive: bool,
}

impl Default for Match {
    fn default() -> Self {
        Match {
            methods: Vec::new(),
            path: PathMatch::Any,
            case_sensitive: true,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub enum PathMatch {
    #[default]
    Any,
    /// Also matches the path with one trailing slash. Stored without one
    /// (except the root `/`).
    Exact(String),
    /// Segment-aware: `/api` matches `/api` and `/api/x`, never `/apix`.
    /// Stored without a trailing slash (except the root `/`).
    Prefix(String),
    /// `/users/{id}`: segments, each literal or a `{name}` capturing one
    /// non-empty segment; one trailing slash is allowed.
    Template(Vec<Segment>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Literal(String),
    Param(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubjectSource {
    /// The peer, or behind trusted proxies the right-most untrusted
    /// `X-Forwarded-For` address.
    ClientIp,
    Header(HeaderName),
}
