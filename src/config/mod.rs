//! Configuration: the YAML users write, turned into types that cannot be wrong.
//!
//! `raw` mirrors the YAML with serde (unknown keys rejected), `env` replaces
//! `${NAME}`, `locate` maps key paths to file positions, and `validate` turns
//! the raw tree into [`Config`], collecting every error with its file, line,
//! column and key path before anything listens. `describe` renders the
//! route table `sluice check` prints.

mod describe;
mod env;
mod error;
mod locate;
mod raw;
mod validate;

pub use error::{ConfigError, ConfigErrors};

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Method, Uri};
use ipnet::IpNet;

use crate::limit::Policy;
use crate::path::PathRules;

/// A whole, valid configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from (for logs and reload).
    pub source: PathBuf,
    pub server: Server,
    pub upstream: Upstream,
    pub store: Store,
    pub identity: Identity,
    pub responses: Responses,
    /// In file order (`check` prints them in that order).
    pub policies: Vec<Arc<Policy>>,
    /// In file order: the first matching route wins.
    pub routes: Vec<Route>,
    /// For requests no route matched (named `default` in output).
    pub default: Route,
}

#[derive(Debug, Clone)]
pub struct Server {
    pub listen: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub tls: Option<Tls>,
    pub shutdown_grace: Duration,
    /// Time allowed to read a request's headers (slowloris bound).
    pub header_read_timeout: Duration,
    /// Longest silence allowed between two pieces of a request body.
    pub body_idle_timeout: Duration,
    /// Largest request head accepted (HTTP/1.1 buffer, HTTP/2 header list).
    pub max_header_bytes: usize,
    /// Tokio worker threads; 0 = one per core.
    pub workers: usize,
    /// How request paths are normalized before matching and forwarding.
    pub paths: PathRules,
    /// A connection with no request in flight for this long is closed
    /// (HTTP/2: GOAWAY; hyper has no idle timeout of its own there).
    pub idle_timeout: Duration,
    /// A write to a client blocked for this long (the client reads
    /// nothing) closes the connection (nginx's `send_timeout`).
    pub send_timeout: Duration,
    /// Traffic connections open at once; beyond it new ones are closed at
    /// once (the admin port does not count).
    pub max_connections: usize,
    pub http2: Http2,
}

/// HTTP/2 limits, set explicitly rather than left to hyper's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2 {
    /// Streams a client may have open on one connection.
    pub max_concurrent_streams: u32,
    /// Streams reset by the client before sluice accepted them, held at once
    /// (the rapid-reset bound, CVE-2023-44487).
    pub max_pending_accept_reset_streams: usize,
    /// Streams sluice itself reset because of the client's protocol errors,
    /// before the connection is closed.
    pub max_local_error_reset_streams: usize,
}

#[derive(Debug, Clone)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Debug, Clone)]
pub struct Upstream {
    /// `http://host:port` with an optional base path (no query).
    pub url: Uri,
    pub connect_timeout: Duration,
    /// The upstream's turns: taking the next piece of the request body, and
    /// its response head after the last (beyond it, 504); then each piece
    /// of its response body (beyond it, the body is cut).
    pub timeout: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnFailure {
    /// 503 with `Retry-After: failure_retry_after` (the default).
    Deny,
    /// Forward without a decision (counted).
    Allow,
}

#[derive(Debug, Clone)]
pub struct Store {
    pub kind: StoreKind,
    /// The whole decision: pool wait, connect, round trips.
    pub budget: Duration,
    pub on_failure: OnFailure,
    pub failure_retry_after: Duration,
    /// Added to every key's policy horizon for its TTL.
    pub ttl_grace: Duration,
}

#[derive(Debug, Clone)]
pub enum StoreKind {
    Memory(MemoryStore),
    // Boxed: a Redis store's settings are large and configurations are
    // cloned on every reload.
    Redis(Box<RedisStore>),
}

#[derive(Debug, Clone)]
pub struct MemoryStore {
    /// Most subjects tracked at once; beyond it new subjects are refused
    /// (AdmissionRejected), never handed a fresh bucket by eviction.
    pub max_entries: usize,
}

/// Where the Redis store's primary is, and how it is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One node, or a stable endpoint in front of the current primary.
    /// `redis://` or `rediss://`, credentials included; redacted in Debug.
    Standalone { url: Secret },
    /// Redis Cluster: seed nodes (the rest are discovered), credentials and
    /// TLS in their URLs.
    Cluster { nodes: Vec<Secret> },
    /// The primary the Sentinels name `master`. The nodes' URLs carry the
    /// Sentinels' credentials; `username`/`password` are the primary's.
    Sentinel {
        master: String,
        nodes: Vec<Secret>,
        username: Option<String>,
        password: Option<Secret>,
    },
}

impl Topology {
    pub fn name(&self) -> &'static str {
        match self {
            Topology::Standalone { .. } => "standalone",
            Topology::Cluster { .. } => "cluster",
            Topology::Sentinel { .. } => "sentinel",
        }
    }
}

#[derive(Debug, Clone)]
pub struct RedisStore {
    pub topology: Topology,
    pub pool_size: usize,
    /// PEM file of extra roots for `rediss://` with a private CA.
    pub ca_file: Option<PathBuf>,
    pub key_prefix: String,
    pub max_clock_regression: Duration,
    pub dedupe_window: Duration,
    pub dedupe_max: u32,
    pub breaker_failures: u32,
    pub breaker_cooldown: Duration,
    /// Subjects remembered as denied-until-T on this sidecar, answered
    /// without a store call until T; 0 turns the cache off.
    pub deny_cache_entries: usize,
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

/// A secret value from the configuration. Its Debug never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
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

impl Config {
    /// Reads, substitutes, parses and validates `path`. Every error found is
    /// returned at once, each naming file, line, column and key path.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigErrors::single(ConfigError::io(path, &e)))?;
        Config::parse(path, &text)
    }

    /// As [`Config::load`], from text already read (`path` names it in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigErrors> {
        validate::parse(path, text)
    }

    /// As [`Config::parse`], with `${NAME}` looked up by `lookup` instead of
    /// the process environment (tests; embedding).
    pub fn parse_with_env(
        path: &Path,
        text: &str,
        lookup: &dyn Fn(&str) -> Result<String, std::env::VarError>,
    ) -> Result<Config, ConfigErrors> {
        validate::parse_with_env(path, text, lookup)
    }

    /// The table `sluice check` prints: one aligned line per route, the
    /// default last, with its match, subjects, policy, limits, cost, shadow
    /// and revision.
    pub fn route_table(&self) -> String {
        describe::route_table(self)
    }
}

#[cfg(test)]
mod tests;

/// The `Upgrade` protocols a route passes when it names none.
pub const DEFAULT_UPGRADES: [&str; 1] = ["websocket"];
