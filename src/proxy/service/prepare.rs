//! The routing half of a request, before any store is asked: the head
//! checks, the identity headers, the methods it may run as, the path
//! normalized and routed, and every limit's subject resolved.

use super::*;
use crate::route::{host_name, Ambiguous, Facts};
use http::header::HOST;

/// What the routing half found for a request: the routes it matched, the
/// URI to forward when normalization changed the path, and every limit of
/// those routes with the subject it counts, in the order they are checked.
pub(in crate::proxy) struct Routed<'r> {
    pub matched: Matched<'r>,
    pub rewritten: Option<Uri>,
    pub checks: SmallVec<[Check<'r>; 2]>,
    /// Header names with `_` are to be removed before forwarding.
    pub drop_underscored: bool,
    /// The methods the request was matched as, the wire method first.
    pub methods: Methods,
    /// The limits the client address is exempt from: each route it
    /// matched, and the index of the limit in `route.limits`. Skipped,
    /// they are in no check.
    pub exempted: SmallVec<[(Entry<'r>, usize); 1]>,
}

/// Where a request that passed every check goes.
// Made once a request and matched at once, as `Routed` alone was: boxing
// it would allocate on every request to spare a move.
#[allow(clippy::large_enum_variant)]
pub(in crate::proxy) enum Destination<'r> {
    /// To the routes it matched, and on to the app if they let it through.
    Routes(Routed<'r>),
    /// `OPTIONS *` that no route asks for: sluice, the server the client
    /// reached, answers it ([`respond::server_options`]).
    Sluice,
    /// The client address is in the `deny` networks of this route (one
    /// the request matched): 403, before any limit is looked at.
    Denied(Entry<'r>),
}

/// Everything a request goes through before a store is asked: the head
/// checks, the identity headers, the methods it may run as, the path
/// normalized and routed, and every limit's subject resolved. The proxy
/// and `POST /explain` both call it, so an explanation follows the very
/// rules a request is judged by.
pub(in crate::proxy) fn prepare<'r>(
    runtime: &'r Runtime,
    method: &Method,
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
    peer: IpAddr,
) -> Result<Destination<'r>, Invalid> {
    let head = headers::check_head(method, version, uri, headers)?;
    let live = &*runtime.live;
    let identity = runtime.routes.identity_headers();
    // `X_Plan` reaches a CGI-style app as the tier header it folds to.
    let read = runtime.routes.read_headers();
    let underscored = underscores::check(headers, live.server.underscores, read)?;
    headers::check_identity_headers(headers, identity)?;
    runtime
        .routes
        .check_conditions(headers, uri.query())
        .map_err(|ambiguous| match ambiguous {
            Ambiguous::Header(name) => Invalid::DuplicateRouteHeader(name),
            Ambiguous::Query => Invalid::DuplicateRouteParameter,
        })?;
    let facts = facts(runtime, uri, headers)?;
    let fold = underscored && live.server.underscores == Underscores::Allow;
    let methods = overrides::methods(method, headers, uri.query(), fold)?;
    if headers::is_asterisk(uri) {
        // The head check saw the wire method only: an app honouring an
        // override would run `OPTIONS *` as `DELETE *`, that is `/*`.
        if methods.iter().any(|m| *m != Method::OPTIONS) {
            return Err(Invalid::AsteriskForm);
        }
        if !asterisk_routed(runtime, &facts) {
            return Ok(Destination::Sluice);
        }
    }
    let (matched, rewritten) = route(runtime, &methods, uri, &facts, live)?;

    // The client address, as `client_ip` subjects read it, resolved only
    // for routes that deny or exempt by it. An `X-Forwarded-For` from a
    // trusted proxy that cannot be read is refused as it is for
    // `client_ip`: guessing could let a denied client through.
    let client = if matched.iter().any(|e| !e.route.addresses.is_empty()) {
        let trusted = &live.identity.trusted_proxies;
        let ip = subject::client_ip(peer, headers, trusted)
            .map_err(|UnreadableForwardedFor| Invalid::ForwardedFor)?;
        if let Some(entry) = matched.iter().find(|e| e.route.addresses.denies(ip)) {
            return Ok(Destination::Denied(entry));
        }
        Some(ip)
    } else {
        None
    };
    let mut exempted = SmallVec::new();

    // Every subject is resolved before anything is charged, so a
    // request refused for one route consumes nothing of another.
    let mut checks: SmallVec<[Check<'r>; 2]> = SmallVec::new();
    let asking = subject::Asking::new(peer, headers, &live.identity);
    for (route_at, entry) in matched.iter().enumerate() {
        let route = entry.route;
        if head.connection {
            headers::check_connection(headers, route.subject_sources())?;
        }
        let tier = route
            .tiers
            .as_ref()
            .map_or(0, |tiers| tiers.choose(headers, peer, &asking.token));
        let first = checks.len();
        let mut undecodable = false;
        for (i, (limit, state)) in route.limits.iter().zip(entry.limits).enumerate() {
            if !limit.applies(tier) {
                continue;
            }
            if client.is_some_and(|ip| route.addresses.exempts(i, ip)) {
                exempted.push((entry, i));
                continue;
            }
            // Limits of one route counting the same subject share its
            // pseudonym: one HMAC, not one per limit.
            let known = match state.fixed_subject {
                Some(global) => Some((global, Resolved::Global)),
                None => checks[first..]
                    .iter()
                    .find(|c| c.limit().subject == limit.subject)
                    .map(|c| (c.subject, c.resolved)),
            };
            let (subject, resolved) = match known {
                Some(known) => known,
                None => subject::resolve(&limit.subject, &route.name, &asking, &runtime.key)
                    .map_err(|UnreadableForwardedFor| Invalid::ForwardedFor)?,
            };
            undecodable |= resolved == Resolved::Undecodable;
            checks.push(Check {
                entry,
                route_at,
                limit: i,
                subject,
                resolved,
                tier,
            });
        }
        // Once per request and route, however many of its limits read it.
        if undecodable {
            entry.metrics.undecodable();
        }
    }
    // Once per request, however many limits and routes read the token.
    if let Some(reason) = asking.token.rejected() {
        runtime.jwt_rejected(reason);
    }
    Ok(Destination::Routes(Routed {
        matched,
        rewritten,
        checks,
        drop_underscored: underscored && live.server.underscores == Underscores::Drop,
        methods,
        exempted,
    }))
}

/// Whether `OPTIONS *` goes to the app: only when the route it matches
/// names `*` as its path. A route for any path (the default, a route
/// without `path`) was written for the app's resources, and `*` is none:
/// forwarded under it, `OPTIONS *` would reach an app that may read it as
/// `/*` while counting against a route that never meant it.
fn asterisk_routed(runtime: &Runtime, facts: &Facts) -> bool {
    let route = runtime.routes.route_for(&Method::OPTIONS, "*", facts);
    matches!(&route.matcher.path, PathMatch::Exact(path) if path == "*")
}

/// The routes a request matched: one per distinct route its methods
/// found, the wire method's first. Nothing is allocated.
///
/// Kept as places in the route table, each made an [`Entry`] when read: a
/// request's routes are moved from routing into the request's future, and
/// five entries are 240 bytes where five places are 40.
pub(in crate::proxy) struct Matched<'r> {
    runtime: &'r Runtime,
    at: [usize; MAX_METHODS],
    len: usize,
}

impl<'r> Matched<'r> {
    pub(in crate::proxy) fn iter(&self) -> impl Iterator<Item = Entry<'r>> + '_ {
        let runtime = self.runtime;
        self.at[..self.len].iter().map(move |&at| runtime.entry(at))
    }

    /// The wire method's route: its metrics count the upstream's answer,
    /// and it says which upgrades pass.
    pub(in crate::proxy) fn primary(&self) -> Entry<'r> {
        self.iter()
            .next()
            .expect("the wire method always finds a route (the default at worst)")
    }
}

/// Normalizes the path and finds the route of each method the request may
/// run as; the URI to forward when normalization changed the path.
fn route<'r>(
    runtime: &'r Runtime,
    methods: &Methods,
    uri: &Uri,
    facts: &Facts,
    live: &Live,
) -> Result<(Matched<'r>, Option<Uri>), Invalid> {
    let normal = path::normalize(uri.path(), &live.server.paths).map_err(Invalid::Path)?;
    let mut matched = Matched {
        runtime,
        at: [0; MAX_METHODS],
        len: 0,
    };
    // At most `MAX_METHODS` methods, so as many routes.
    for method in methods.iter() {
        let at = runtime.routes.find(method, &normal.matching, facts);
        if !matched.at[..matched.len].contains(&at) {
            matched.at[matched.len] = at;
            matched.len += 1;
        }
    }
    let rewritten = if normal.unchanged() {
        None
    } else {
        Some(with_path(uri, &normal.forward))
    };
    Ok((matched, rewritten))
}

/// What route conditions read of a request.
pub(in crate::proxy) fn facts<'h>(
    runtime: &Runtime,
    uri: &'h Uri,
    headers: &'h HeaderMap,
) -> Result<Facts<'h>, Invalid> {
    Ok(Facts {
        host: request_host(uri, headers, runtime.routes.reads_host())?,
        headers: Some(headers),
        query: uri.query(),
    })
}

/// The host routes match on, when one does: `:authority` (HTTP/2) or the
/// authority of an absolute-form target, else `Host`. An HTTP/1 request
/// naming one host in its target and another in `Host` is refused: RFC
/// 9112 has the target win, yet many apps read `Host`, and a route chosen
/// by one while the app reads the other is a way around a limit. (HTTP/2
/// requests were held to the same by [`headers::check_head`].)
fn request_host<'h>(
    uri: &'h Uri,
    headers: &'h HeaderMap,
    reads_host: bool,
) -> Result<Option<&'h str>, Invalid> {
    if !reads_host {
        return Ok(None);
    }
    let authority = uri.authority().map(|a| a.as_str());
    // Checked to be `host[:port]`, ASCII, by the head check.
    let host = headers.get(HOST).and_then(|h| h.to_str().ok());
    match (authority, host) {
        (Some(a), Some(h))
            if !host_name(a)
                .as_bytes()
                .eq_ignore_ascii_case(host_name(h).as_bytes()) =>
        {
            Err(Invalid::HostMismatch)
        }
        (Some(a), _) => Ok(Some(a)),
        (None, h) => Ok(h),
    }
}

/// `uri` with its path replaced and its query kept as sent.
fn with_path(uri: &Uri, path: &str) -> Uri {
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path.to_owned(),
    };
    let mut parts = uri.clone().into_parts();
    // A normalized path holds only characters a URI path may: this parses.
    parts.path_and_query = PathAndQuery::try_from(path_and_query).ok();
    Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}
