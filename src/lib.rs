//! sluice: a rate-limiting reverse proxy that runs beside an application.
//!
//! A request flows through these modules, in order:
//!
//! - [`config`]: the YAML users write, validated into types that cannot be wrong.
//! - [`path`]: one request path as the app will read it (dot segments,
//!   slashes, escapes, parameters), used for matching and forwarded.
//! - [`route`]: routes and their matchers, compiled into a table;
//!   `find(method, path, facts)` (the host, headers and query route
//!   conditions read) → the route's position, which the proxy's
//!   per-route state is indexed by; each route's `deny` and `exempt`
//!   networks (`route::Addresses`).
//! - [`subject`]: who is asking (client IP behind trusted proxies, a header)
//!   and its pseudonym (versioned HMAC; raw identities never reach a store).
//! - [`limit`]: policies, typed outcomes and the pure algorithm steps.
//! - [`store`]: where state lives (embedded memory store; Redis) behind one
//!   `evaluate` that always ends in exactly one [`limit::Outcome`], and
//!   `evaluate_all` for every rate limit of a request at once; the requests
//!   in flight that concurrency policies count, always in this process;
//!   the time the process loses to its own event loop (`store::lag`), which
//!   calls to Redis are given back.
//! - [`proxy`]: the per-request service (route → subject → limit → one
//!   exhaustive match), forwarding, and every synthetic response.
//! - [`server`]: listeners (TCP, TLS) and the accept-and-drain loop.
//! - [`app`]: binds the listeners, reports their addresses, wires the pieces.
//! - [`reload`]: file poll and SIGHUP → a validated swap of the live part.
//! - [`telemetry`]: logging, the metrics recorder and the table of metric
//!   names; each module holds the handles of what it measures.
//! - [`sync`]: locks taken whatever a panic elsewhere left (one rule,
//!   written once) and the made-once map the Redis scripts live in.
//! - [`import`]: `sluice import ingress-nginx`, which writes a
//!   configuration with the limits of Ingress annotations.
//! - [`manifests`]: `sluice check-manifests`, which reads a rendering
//!   (Helm, Kustomize) for workloads meant to run sluice that do not and
//!   Service ports that reach the application around it.
//! - [`sleeps`]: tokio sleeps kept armed for reuse (hyper's HTTP/1 header
//!   timer, `upstream.timeout`), so a request takes no timer-wheel lock.

pub mod admin;
pub mod app;
pub mod config;
pub mod import;
pub mod limit;
pub mod manifests;
pub mod path;
pub mod proxy;
pub mod reload;
pub mod route;
pub mod server;
pub mod sleeps;
pub mod store;
pub mod subject;
pub mod sync;
pub mod telemetry;

/// Internals the fuzz targets (`fuzz/`) drive directly, re-exported so they
/// can stay private to the crate otherwise. Not a stable interface.
#[doc(hidden)]
pub mod fuzzing {
    pub use crate::proxy::headers::{
        check_connection, check_head, check_identity_headers, Invalid,
    };
    pub use crate::proxy::overrides::methods;
    pub use crate::server::framing::Framing;
    pub use crate::server::proxy_protocol::{parse as parse_proxy_header, Parsed, MAX_HEADER};
    pub use crate::store::redis::reply::{
        decode as decode_reply, decode_frame as decode_reply_frame, Malformed, Reply,
    };
    pub use crate::store::redis::wire::frame_len as resp_frame_len;
    pub use crate::subject::resolve::credentials;
}
