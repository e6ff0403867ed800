//! The HTTP side of a request, after the listener and before the upstream.
//!
//! - `service`: [`Proxy::handle`], validate → route → subjects → every
//!   limit of the request together (places in flight, then the rate
//!   limits) → forward or answer, the request counted once. Its `plan`
//!   is the pure rule that turns the stores' outcomes into a judgement
//!   (one exhaustive match on each outcome), which `POST /explain` calls
//!   too.
//! - `headers`: request validation and hop-by-hop / `X-Forwarded-*` rewriting.
//! - `overrides`: the methods a request may run as (method-override headers,
//!   `_method`), each matched.
//! - `upstream`: everything between sluice and the app (the exchange, the
//!   pooled connections, the response head limits, the upstream timer,
//!   upgrades) and the one map of upstream failures.
//! - `respond`: every synthetic response (200 to `OPTIONS *`, 400, 408,
//!   429, 501, 502, 503, 504).
//! - `runtime`: what one request runs under (live configuration, route
//!   table, per-route metric handles and prepared answers), swapped whole
//!   on reload.
//! - `body`: the boxed body type, the request-body idle timeout, and the
//!   wrapper that holds a request's places in flight until its response
//!   body is done.
//! - `discard`: the rest of a refused request's body, read and thrown
//!   away, so a client that writes before it reads gets its answer.
//! - `buffered`: request bodies received whole before their request takes
//!   a place in flight (`server.request_buffering`), and the share of a
//!   concurrency limit left to requests still streaming theirs.
//! - `fallback`: `on_failure: local`, deciding alone while the store
//!   cannot, each quota divided by `store.local_share`.
//! - `verdict`: what became of a request, the hook metrics attach to.
//! - `metrics`: the proxy's metric handles (per route, verdict-indexed).
//! - `log_budget`: how many decisions a route may log a second.
//! - `untrusted_forwarder`: the WARN and the count when a proxy's
//!   `X-Forwarded-For` is ignored because nothing is trusted.

mod body;
mod buffered;
mod discard;
pub mod explain;
pub mod fallback;
pub(crate) mod headers;
mod holding;
mod log_budget;
pub(crate) mod metrics;
pub(crate) mod overrides;
pub mod respond;
mod runtime;
mod service;
mod underscores;
mod untrusted_forwarder;
mod upstream;
mod verdict;

use std::net::SocketAddr;

use http::HeaderValue;

pub use body::{Body, BodyIdleTimeout, BoxError};
pub use runtime::{Runtime, SharedRuntime};
pub use service::{refuse_unframed_body, Proxy};
pub use upstream::Upstream;
pub use verdict::{Failure, Verdict};

/// The connection a request arrived on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub local: SocketAddr,
    /// Whether the client spoke TLS to sluice (`X-Forwarded-Proto`).
    pub tls: bool,
    /// The peer's address as `X-Forwarded-For` gives it: written once for
    /// the connection instead of for each of its requests.
    pub peer_value: HeaderValue,
}

impl ConnInfo {
    pub fn new(peer: SocketAddr, local: SocketAddr, tls: bool) -> ConnInfo {
        ConnInfo {
            peer,
            local,
            tls,
            peer_value: headers::peer_value(peer.ip()),
        }
    }
}
