//! Forwarding a decided request to the upstream, and its response back.
//!
//! Bodies stream both ways, but for a request body received whole before
//! the request was admitted (`proxy::buffered`); the request body is cut when
//! the client goes quiet for `server.body_idle_timeout` or sends it slower
//! than `server.min_upload_rate`, and
//! `upstream.timeout` counts only the upstream's turns (`upstream_timer`). Requests to the
//! upstream are always HTTP/1.1, whatever the client spoke. The upstream's
//! address and timeout are read from the runtime of each request, so a
//! reload retargets new requests; the connect timeout belongs to the pooled
//! client and takes a restart to change.

use std::error::Error as StdError;
use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;

use http::uri::{Parts, PathAndQuery};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body::Body as _;
use hyper::client::conn::http1;
use hyper_util::client::legacy::connect::HttpConnector;

use crate::config::{self, Live};
use crate::sleeps::Spares;
use crate::subject;

use super::head::{self as upstream_head, Refused};
use super::pool::{self, Failure, Pool, Returning};
use super::timer::UpstreamTimer;
use super::upgrade::Tunnels;
use crate::proxy::body::{self, Body, ClientBodyError, Cut, IdleTimeout};
use crate::proxy::buffered::Inbound;
use crate::proxy::headers::{self, Forwarded};
use crate::proxy::respond;
use crate::proxy::ConnInfo;

/// The pooled HTTP/1.1 client to the upstream.
#[derive(Clone)]
pub struct Upstream {
    pool: Arc<Pool>,
    /// `upstream.timeout`'s sleeps, reused (`sleeps`).
    timers: Spares,
    /// Connections switched to another protocol, run until drained.
    tunnels: Arc<Tunnels>,
}

impl Upstream {
    pub fn new(config: &config::UpstreamBoot) -> Upstream {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.set_nodelay(true);
        let mut builder = http1::Builder::new();
        // The header-field limit is hyper's default of 100, left unset:
        // set explicitly, hyper fills a 100-entry array on every response
        // head (about 1k instructions a request) for the same limit.
        builder.max_buf_size(upstream_head::MAX_HEAD_BYTES);
        Upstream {
            pool: Pool::start(connector, builder),
            timers: Spares::new(),
            tunnels: Arc::new(Tunnels::new()),
        }
    }

    /// Lets upgraded connections run until `deadline`, then cuts them.
    pub async fn drain_tunnels(&self, deadline: Instant) {
        self.tunnels.drain(deadline).await;
    }
}

impl std::fmt::Debug for Upstream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Upstream").finish_non_exhaustive()
    }
}

/// Every way a forwarded request ends without the app's answer reaching
/// the client. Each kind owns the response sluice gives instead and the
/// `kind` label of `sluice_upstream_errors_total`, so sluice's own 502s
/// and 504s are never counted as the app's answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    /// The upstream URL's base and the request's path make no URI.
    Target,
    /// No connection to the app (refused, or `upstream.connect_timeout`).
    Unreachable,
    /// The app took longer than `upstream.timeout` for its turn.
    Timeout,
    /// The exchange broke before a response head came whole.
    Broken,
    /// A response head sluice does not pass on (`upstream_head`).
    Refused,
    /// The app switched protocols unasked, or to one the route does not
    /// allow.
    Upgrade,
    /// The client's request body stalled or came too slowly (408).
    BodyCut(Cut),
    /// The client's request body was malformed or cut short (400).
    BodyBroken,
}

impl UpstreamError {
    pub const KINDS: [&'static str; 9] = [
        "target",
        "unreachable",
        "timeout",
        "broken",
        "refused",
        "upgrade",
        "body_idle",
        "body_too_slow",
        "body_broken",
    ];

    /// Its place in [`UpstreamError::KINDS`]: its `kind` label.
    pub fn index(self) -> usize {
        match self {
            UpstreamError::Target => 0,
            UpstreamError::Unreachable => 1,
            UpstreamError::Timeout => 2,
            UpstreamError::Broken => 3,
            UpstreamError::Refused => 4,
            UpstreamError::Upgrade => 5,
            UpstreamError::BodyCut(Cut::Idle) => 6,
            UpstreamError::BodyCut(Cut::TooSlow) => 7,
            UpstreamError::BodyBroken => 8,
        }
    }

    /// What the client gets instead of the app's answer.
    pub fn response(self) -> Response<Body> {
        match self {
            UpstreamError::Target | UpstreamError::Unreachable | UpstreamError::Upgrade => {
                respond::bad_gateway()
            }
            UpstreamError::Timeout => respond::gateway_timeout(),
            UpstreamError::Broken | UpstreamError::Refused => respond::broken_upstream_response(),
            UpstreamError::BodyCut(cut) => respond::request_timeout(cut),
            UpstreamError::BodyBroken => respond::broken_request_body(),
        }
    }
}

/// Sends `request` upstream and returns what `done` makes of the
/// upstream's response, its hop-by-hop fields removed, or of why there is
/// none. `sent`: now, as the caller read the clock (the upstream's turn
/// starts there).
///
/// The request is made ready before the future starts, in a function of
/// its own: what that takes apart (the client's request, its parts and
/// body) would otherwise keep room in the future through the whole
/// exchange, and a request's future is moved whole into hyper's slot for
/// each request (docs/BENCHMARKS.md, "The request's future"). `done` runs
/// in the same future: a combinator around it (`map`) would move the whole
/// future once more, about 1.4 KB, for each request.
pub(crate) fn forward<'a, T>(
    upstream: &'a Upstream,
    request: Request<Inbound>,
    sent: Instant,
    conn: &ConnInfo,
    live: &'a Live,
    upgrades: &'a [Box<str>],
    done: impl FnOnce(Result<Response<Body>, UpstreamError>) -> T + 'a,
) -> impl Future<Output = T> + 'a {
    let outbound = outbound(upstream, request, sent, conn, live, upgrades);
    async move {
        let result = 'forward: {
            let Outbound {
                request,
                mut timer,
                client_upgrade,
            } = match outbound {
                Ok(outbound) => outbound,
                Err(error) => break 'forward Err(error),
            };
            let sent = tokio::select! {
                sent = upstream.pool.send(&live.upstream.url, request) => {
                    sent.map_err(|error| failed(&error, &upstream.pool))
                }
                () = timer.expired() => {
                    tracing::debug!(timeout = ?live.upstream.timeout, "upstream timed out");
                    Err(UpstreamError::Timeout)
                }
            };
            let (mut response, lease) = match sent {
                Ok(sent) => sent,
                Err(error) => break 'forward Err(error),
            };
            let fields = headers::ResponseFields::of(response.headers());
            let checked = if lease.flooded() {
                Err(Refused::InformationalFlood)
            } else {
                upstream_head::check(response.headers(), &fields)
            };
            if let Err(refused) = checked {
                break 'forward Err(refuse(refused));
            }

            let upgraded = response.status() == StatusCode::SWITCHING_PROTOCOLS;
            if upgraded {
                let Some(client_upgrade) = client_upgrade else {
                    tracing::debug!("upstream switched protocols unasked");
                    break 'forward Err(UpstreamError::Upgrade);
                };
                let chosen = response.headers().get(http::header::UPGRADE);
                if !chosen.is_some_and(|p| headers::upgrade_allowed(p.as_bytes(), upgrades)) {
                    tracing::debug!("upstream switched to a protocol the route does not allow");
                    break 'forward Err(UpstreamError::Upgrade);
                }
                upstream
                    .tunnels
                    .spawn(client_upgrade, hyper::upgrade::on(&mut response));
            }
            headers::prepare_response(response.headers_mut(), &fields, upgraded);
            // An intermediary answers in its own version (RFC 9110 §6.2): an
            // app that speaks HTTP/1.0 must not cost every client its
            // keep-alive. hyper frames the body for the client's connection (a
            // length, or chunked), whatever framing the app used.
            *response.version_mut() = Version::HTTP_11;
            // A switched connection belongs to the tunnel: its handle is
            // dropped.
            if upgraded {
                drop(lease);
                break 'forward Ok(response.map(body::boxed));
            }
            // A body that stops part way is cut after `upstream.timeout` of
            // silence (nginx's `proxy_read_timeout` between two reads): the
            // client sees it truncated instead of waiting forever. One `map`:
            // each moves the whole head.
            let timeout = live.upstream.timeout;
            Ok(response.map(|incoming| {
                let returning = Returning::new(incoming, lease);
                if returning.is_end_stream() {
                    body::boxed(returning)
                } else {
                    body::boxed(IdleTimeout::response(returning, timeout))
                }
            }))
        };
        done(result)
    }
}

/// A request made ready for the upstream: what [`forward`] sends, the
/// timer of the upstream's turns, and the client's side of an upgrade the
/// route allows.
struct Outbound {
    request: Request<Body>,
    timer: UpstreamTimer,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
}

/// Makes the client's request the one the upstream gets: its target under
/// the upstream's base, its fields prepared (`headers::prepare_request`),
/// HTTP/1.1, its body under the timeouts that apply to it.
fn outbound(
    upstream: &Upstream,
    mut request: Request<Inbound>,
    sent: Instant,
    conn: &ConnInfo,
    live: &Live,
    upgrades: &[Box<str>],
) -> Result<Outbound, UpstreamError> {
    // An upgrade the route does not allow goes as a plain request: an h2c
    // tunnel would carry requests no route ever sees.
    let mut fields = headers::RequestFields::of(request.headers());
    let upgrade = if fields.offers_upgrade() {
        headers::allowed_upgrade(request.version(), request.headers(), upgrades)
    } else {
        None
    };
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut request));

    let (mut parts, incoming) = request.into_parts();
    let uri = match target(&live.upstream.url, &parts.uri) {
        Ok(uri) => uri,
        Err(error) => {
            tracing::warn!(%error, "cannot build the upstream URI");
            return Err(UpstreamError::Target);
        }
    };
    let host = fields.addressed(&parts.uri);
    let forwarded = Forwarded {
        peer: conn.peer.ip(),
        peer_value: conn.peer_value.clone(),
        tls: conn.tls,
        trusted: subject::resolve::trusted_peer(conn.peer.ip(), &live.identity.trusted_proxies),
    };
    if parts.version == Version::HTTP_2 {
        headers::join_cookies(&mut parts.headers);
    }
    // Without a host of its own, the request has no `Host` once prepared.
    let addressed = host.is_some();
    headers::prepare_request(&mut parts.headers, fields, host, forwarded, upgrade);
    if !addressed {
        if let Some(host) = pool::host_of(&live.upstream.url) {
            parts.headers.insert(http::header::HOST, host);
        }
    }
    parts.uri = uri;
    parts.version = Version::HTTP_11;
    // Server-side extensions (header case maps, HTTP/2 protocol) mean
    // nothing to the client connection.
    parts.extensions.clear();
    // A body already complete (most GETs) can never go quiet: no timer,
    // and the upstream's turn starts now.
    // So can a body received whole.
    let (body, timer) = match incoming {
        Inbound::Arriving(incoming) if incoming.is_end_stream() => {
            let timer = UpstreamTimer::starting(sent, live.upstream.timeout, &upstream.timers);
            (body::boxed(incoming), timer)
        }
        Inbound::Whole(whole) => {
            let timer = UpstreamTimer::starting(sent, live.upstream.timeout, &upstream.timers);
            (body::boxed(whole), timer)
        }
        Inbound::Arriving(incoming) => {
            let idle = IdleTimeout::new(incoming, live.server.body_idle_timeout)
                .with_floor(live.server.min_upload_rate);
            let (tracked, timer) = UpstreamTimer::tracking(idle, live.upstream.timeout);
            (body::boxed(tracked), timer)
        }
        // Already under its idle timeout and floor since it began.
        Inbound::Streaming(streaming) => {
            let (tracked, timer) = UpstreamTimer::tracking(*streaming, live.upstream.timeout);
            (body::boxed(tracked), timer)
        }
    };
    Ok(Outbound {
        request: Request::from_parts(parts, body),
        timer,
        client_upgrade,
    })
}

/// The request-target sent upstream, in origin-form (HTTP/1.1 to a server
/// that is not a proxy): the upstream URL's base path (if any) as a prefix,
/// then the request's path and query. The connection, not the target,
/// goes to the upstream's authority (`pool`).
fn target(base: &Uri, request: &Uri) -> Result<Uri, http::Error> {
    let original = request.path_and_query();
    let base_path = base.path().trim_end_matches('/');
    let path_and_query = match original {
        // `OPTIONS *` addresses the server itself, not a path under the base.
        Some(pq) if base_path.is_empty() || pq.as_str() == "*" => pq.clone(),
        Some(pq) => PathAndQuery::try_from(format!("{base_path}{pq}"))?,
        None if base_path.is_empty() => PathAndQuery::from_static("/"),
        None => PathAndQuery::try_from(format!("{base_path}/"))?,
    };
    let mut parts = Parts::default();
    parts.path_and_query = Some(path_and_query);
    Ok(Uri::from_parts(parts)?)
}

/// An upstream response sluice will not pass on; the upstream connection
/// that carried it is never used again (its lease is dropped with the
/// response, never released).
fn refuse(refused: Refused) -> UpstreamError {
    tracing::debug!(error = %refused, "upstream response refused");
    UpstreamError::Refused
}

/// The upstream exchange failed before a response head arrived.
fn failed(failure: &Failure, pool: &Pool) -> UpstreamError {
    let error = match failure {
        Failure::Connect(error) => {
            tracing::debug!(error = %chain(error.as_ref()), "upstream unreachable");
            return UpstreamError::Unreachable;
        }
        Failure::Exchange(error) => error,
        Failure::InformationalFlood => return refuse(Refused::InformationalFlood),
    };
    if let Some(cut) = pool.cuts().count(error) {
        tracing::debug!(reason = cut.label(), "request body cut");
        return UpstreamError::BodyCut(cut);
    }
    if caused_by::<ClientBodyError>(error) {
        tracing::debug!(error = %chain(error), "request body broken");
        return UpstreamError::BodyBroken;
    }
    tracing::debug!(error = %chain(error), "upstream exchange failed");
    UpstreamError::Broken
}

fn caused_by<E: StdError + 'static>(error: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<E>() {
            return true;
        }
        current = e.source();
    }
    false
}

/// `a: b: c` from an error and its sources.
fn chain(error: &(dyn StdError + 'static)) -> String {
    let mut out = error.to_string();
    let mut current = error.source();
    while let Some(e) = current {
        out.push_str(": ");
        out.push_str(&e.to_string());
        current = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn uri(s: &str) -> Uri {
        s.parse().unwrap()
    }

    #[test]
    fn target_keeps_path_and_query_under_the_base() {
        let plain = uri("http://127.0.0.1:3000");
        assert_eq!(target(&plain, &uri("/a/b?x=1&y")).unwrap(), "/a/b?x=1&y");
        assert_eq!(target(&plain, &uri("/")).unwrap(), "/");
        // An HTTP/2 request carries scheme and authority: both left out.
        assert_eq!(
            target(&plain, &uri("https://public.example/p?q")).unwrap(),
            "/p?q"
        );

        let based = uri("http://app:8080/base/");
        assert_eq!(target(&based, &uri("/a?x=1")).unwrap(), "/base/a?x=1");
        assert_eq!(target(&based, &uri("/")).unwrap(), "/base/");
        assert_eq!(target(&based, &uri("*")).unwrap().path(), "*");
    }

    #[test]
    fn every_upstream_error_has_a_label_of_its_own() {
        let all = [
            UpstreamError::Target,
            UpstreamError::Unreachable,
            UpstreamError::Timeout,
            UpstreamError::Broken,
            UpstreamError::Refused,
            UpstreamError::Upgrade,
            UpstreamError::BodyCut(Cut::Idle),
            UpstreamError::BodyCut(Cut::TooSlow),
            UpstreamError::BodyBroken,
        ];
        let mut labels: Vec<_> = all
            .iter()
            .map(|e| UpstreamError::KINDS[e.index()])
            .collect();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), UpstreamError::KINDS.len());
        // Sluice's own answers are never the app's 2xx.
        for error in all {
            let status = error.response().status();
            assert!(
                status.is_client_error() || status.is_server_error(),
                "{error:?}: {status}"
            );
        }
    }

    #[test]
    fn causes_are_found_through_the_chain() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] body::BodyIdleTimeout);
        let e = Outer(body::BodyIdleTimeout(Duration::from_secs(1)));
        assert!(caused_by::<body::BodyIdleTimeout>(&e));
        assert_eq!(Cut::of(&e), Some(Cut::Idle));
        assert_eq!(Cut::of(&body::BodyTooSlow(240)), Some(Cut::TooSlow));
        assert_eq!(Cut::of(&ClientBodyError("short".into())), None);
        assert!(!caused_by::<std::io::Error>(&e));
        assert_eq!(chain(&e), "outer: no request body data for 1s");
    }
}
