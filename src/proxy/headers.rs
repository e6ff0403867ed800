//! Request validation and the header rewriting of a forwarding proxy.
//!
//! hyper accepts several things a proxy must refuse: a
//! request with no `Host` or two (hyper #3777), transfer-codings other than
//! plain `chunked`, and a `Connection` header that names a header identity
//! relies on, which would make any proxy in front drop it (CVE-2025-48865,
//! CVE-2025-64484).

use std::io::Write as _;
use std::net::IpAddr;

use http::header::{
    HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, COOKIE, FORWARDED, HOST,
    PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use http::{Method, Uri, Version};

use crate::path::PathError;
use crate::route::SubjectSource;
use crate::subject::relied_on;
use crate::subject::resolve::X_FORWARDED_FOR;

pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");
/// Rewrite targets some frameworks (IIS URL Rewrite, Symfony, Zend) route
/// by instead of the request line: a path sluice never matched.
static X_ORIGINAL_URL: HeaderName = HeaderName::from_static("x-original-url");
static X_REWRITE_URL: HeaderName = HeaderName::from_static("x-rewrite-url");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
static TRUE_CLIENT_IP: HeaderName = HeaderName::from_static("true-client-ip");
static CF_CONNECTING_IP: HeaderName = HeaderName::from_static("cf-connecting-ip");

/// Fields that claim a client address, which many apps log or believe
/// (nginx's `real_ip_header`, Akamai, Cloudflare). From a client that is
/// no trusted proxy they are its own claim: see [`prepare_request`].
pub static CLAIMS: [HeaderName; 3] = [
    HeaderName::from_static("x-real-ip"),
    HeaderName::from_static("true-client-ip"),
    HeaderName::from_static("cf-connecting-ip"),
];

/// RFC 9110 §7.6.1, plus the pre-standard `Keep-Alive` and
/// `Proxy-Connection` that clients still send, and `HTTP2-Settings`, which
/// only means something on an h2c upgrade (RFC 7540 §3.2.1; removed
/// everywhere, as Envoy does).
fn hop_by_hop() -> [&'static HeaderName; 10] {
    [
        &CONNECTION,
        &KEEP_ALIVE,
        &PROXY_CONNECTION,
        &PROXY_AUTHENTICATE,
        &PROXY_AUTHORIZATION,
        &TE,
        &TRAILER,
        &TRANSFER_ENCODING,
        &UPGRADE,
        &HTTP2_SETTINGS,
    ]
}

/// Why a request is refused before any decision. Each maps to one response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalid {
    /// HTTP/1.1 without `Host`, or HTTP/2 with neither `:authority` nor `Host`.
    MissingHost,
    DuplicateHost,
    /// HTTP/2 whose `Host` names another authority than `:authority`
    /// (RFC 9113 §8.3.1).
    HostMismatch,
    /// A transfer-coding other than exactly one `chunked` (answered 501: RFC
    /// 9112 §6.1 asks for 501 on a coding the server does not implement).
    TransferCoding,
    /// `Connection` names a header the subject relies on, or
    /// `X-Forwarded-For`.
    ConnectionNamesIdentity(HeaderName),
    /// `CONNECT` asks for a tunnel to anywhere; a reverse proxy in front of
    /// one application has none to offer (501, RFC 9110 §9.1).
    Connect,
    /// A `Host` that is no `host[:port]` (RFC 9110 §7.2): empty, with
    /// spaces, a path, user info, an unclosed IPv6 bracket, a port above
    /// 65535.
    BadHost,
    /// A request-target in authority form (`app:80`, only for CONNECT) or
    /// otherwise neither origin form (`/path`), absolute form
    /// (`http://host/path`) nor `*`.
    RequestTarget,
    /// A method with lower-case letters: methods are case-sensitive (RFC
    /// 9110 §9.1), yet many apps upper-case them (nginx refuses them too).
    MethodCase,
    /// A path that cannot be normalized safely.
    Path(PathError),
    /// A header a route's subject is read from, sent more than once: the
    /// app may read another copy than the one sluice counted.
    DuplicateIdentity(HeaderName),
    /// Behind a trusted proxy, an `X-Forwarded-For` entry that is no
    /// address where sluice must find the client.
    ForwardedFor,
    /// A method-override header sent twice, or naming no method.
    MethodOverride,
    /// A request-target of `*` with another method than OPTIONS (RFC
    /// 9112 §3.2.4).
    AsteriskForm,
    /// A header name with `_`, under `server.headers_with_underscores:
    /// reject`.
    UnderscoreHeader,
    /// A header name with `_` that CGI-style servers read as this header,
    /// one sluice reads or writes.
    UnderscoreStandsFor(HeaderName),
}

impl Invalid {
    /// A short, bounded reason for the response body and logs.
    /// A short, bounded label for `sluice_requests_refused_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Invalid::MissingHost => "missing_host",
            Invalid::DuplicateHost => "duplicate_host",
            Invalid::HostMismatch => "host_mismatch",
            Invalid::TransferCoding => "transfer_coding",
            Invalid::ConnectionNamesIdentity(_) => "connection_names_identity",
            Invalid::Connect => "connect",
            Invalid::MethodCase => "method_case",
            Invalid::BadHost => "bad_host",
            Invalid::RequestTarget => "request_target",
            Invalid::Path(error) => error.label(),
            Invalid::DuplicateIdentity(_) => "duplicate_identity",
            Invalid::ForwardedFor => "forwarded_for",
            Invalid::MethodOverride => "method_override",
            Invalid::AsteriskForm => "asterisk_form",
            Invalid::UnderscoreHeader => "underscore_header",
            Invalid::UnderscoreStandsFor(_) => "underscore_stands_for",
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            Invalid::MissingHost => "the request has no Host",
            Invalid::DuplicateHost => "the request has more than one Host",
            Invalid::HostMismatch => "Host and :authority name different hosts",
            Invalid::TransferCoding => "only the chunked transfer-coding is accepted",
            Invalid::ConnectionNamesIdentity(_) => {
                "Connection names a header that identifies the client"
            }
            Invalid::Connect => "CONNECT is not supported",
            Invalid::MethodCase => "the method has lower-case letters",
            Invalid::BadHost => "Host is not a valid host[:port]",
            Invalid::RequestTarget => "the request-target is neither a path nor an absolute URL",
            Invalid::Path(error) => error.reason(),
            Invalid::DuplicateIdentity(_) => {
                "a header that identifies the client is sent more than once"
            }
            Invalid::ForwardedFor => "X-Forwarded-For holds an entry that is not an address",
            Invalid::MethodOverride => "a method-override header is sent twice or names no method",
            Invalid::AsteriskForm => "a request-target of * is for OPTIONS only",
            Invalid::UnderscoreHeader => "header names with an underscore are refused",
            Invalid::UnderscoreStandsFor(_) => {
                "a header name with an underscore stands for a header that identifies the client or the method"
            }
        }
    }
}

/// The rules that hold before the route is known: method, `Host` and
/// framing.
pub fn check_head(
    method: &Method,
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<(), Invalid> {
    if method == Method::CONNECT {
        return Err(Invalid::Connect);
    }
    if method.as_str().bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(Invalid::MethodCase);
    }
    let mut hosts = headers.get_all(HOST).iter();
    let host = hosts.next();
    if hosts.next().is_some() {
        return Err(Invalid::DuplicateHost);
    }
    if let Some(host) = host {
        if !valid_host(host.as_bytes()) {
            return Err(Invalid::BadHost);
        }
    }
    // Origin form, absolute form (with a valid host) or `*`; authority
    // form is CONNECT's alone, refused above.
    let origin = uri.scheme().is_none() && uri.authority().is_none();
    let absolute = uri.scheme().is_some()
        && uri
            .authority()
            .is_some_and(|a| valid_host(a.as_str().as_bytes()));
    if !(origin || absolute) {
        return Err(Invalid::RequestTarget);
    }
    // `*` names the server, not a resource: only OPTIONS may ask it. Any
    // other method would reach a catch-all route of the app as `/*`
    // (Werkzeug) while no sluice route matched it.
    if origin && uri.path() == "*" && method != Method::OPTIONS {
        return Err(Invalid::AsteriskForm);
    }
    match version {
        Version::HTTP_09 | Version::HTTP_10 => {}
        Version::HTTP_11 => {
            if host.is_none() {
                return Err(Invalid::MissingHost);
            }
        }
        // HTTP/2 and later carry the authority as a pseudo-header.
        _ => match (uri.authority(), host) {
            (None, None) => return Err(Invalid::MissingHost),
            (Some(authority), Some(host))
                if !authority
                    .as_str()
                    .as_bytes()
                    .eq_ignore_ascii_case(host.as_bytes()) =>
            {
                return Err(Invalid::HostMismatch)
            }
            _ => {}
        },
    }
    check_transfer_coding(headers)
}

/// `host [ ":" port ]` as RFC 9110 §7.2 allows it: a reg-name of
/// unreserved, sub-delimiter and percent characters, an IPv4 address, or an
/// IPv6 literal in brackets; a port of at most 65535. Never empty, never
/// user info.
fn valid_host(value: &[u8]) -> bool {
    let (host, port) = match value.strip_prefix(b"[") {
        Some(rest) => {
            let Some(end) = rest.iter().position(|b| *b == b']') else {
                return false;
            };
            let literal = &rest[..end];
            let valid_literal = std::str::from_utf8(literal)
                .ok()
                .is_some_and(|s| s.parse::<std::net::Ipv6Addr>().is_ok());
            if !valid_literal {
                return false;
            }
            match &rest[end + 1..] {
                [] => (&b"v6"[..], None),
                [b':', port @ ..] => (&b"v6"[..], Some(port)),
                _ => return false,
            }
        }
        None => match value.iter().rposition(|b| *b == b':') {
            Some(i) => (&value[..i], Some(&value[i + 1..])),
            None => (value, None),
        },
    };
    let host_ok = !host.is_empty()
        && host.iter().enumerate().all(|(i, &b)| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b'-' | b'.'
                        | b'_'
                        | b'~'
                        | b'!'
                        | b'$'
                        | b'&'
                        | b'\''
                        | b'('
                        | b')'
                        | b'*'
                        | b'+'
                        | b','
                        | b';'
                        | b'='
                )
                // Only as `pct-encoded`, `%` and two hex digits: the two
                // digits are then checked as alphanumerics. A bare `%` is
                // no host an app can parse back.
                || (b == b'%'
                    && host
                        .get(i + 1..i + 3)
                        .is_some_and(|e| e.iter().all(u8::is_ascii_hexdigit)))
        });
    let port_ok = match port {
        None => true,
        // An empty port is allowed by the grammar (`host:`).
        Some([]) => true,
        Some(digits) => {
            digits.len() <= 5
                && digits.iter().all(u8::is_ascii_digit)
                && std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| d.parse::<u32>().ok())
                    .is_some_and(|p| p <= 65_535)
        }
    };
    host_ok && port_ok
}

/// HTTP/2 may split `Cookie` into one field per pair (RFC 9113 §8.2.3); an
/// HTTP/1.1 app expects one line, the pairs joined with `; `.
pub fn join_cookies(headers: &mut HeaderMap) {
    let mut values = headers.get_all(COOKIE).iter();
    let (Some(_), Some(_)) = (values.next(), values.next()) else {
        return;
    };
    let joined: Vec<&[u8]> = headers
        .get_all(COOKIE)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    if let Ok(value) = HeaderValue::from_bytes(&joined.join(&b"; "[..])) {
        headers.insert(COOKIE, value);
    }
}

fn check_transfer_coding(headers: &HeaderMap) -> Result<(), Invalid> {
    if !headers.contains_key(TRANSFER_ENCODING) {
        return Ok(());
    }
    // Present, so exactly one `chunked`; an empty field is no framing at all.
    let mut codings = headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| list(v.as_bytes()));
    match (codings.next(), codings.next()) {
        (Some(coding), None) if coding.eq_ignore_ascii_case(b"chunked") => Ok(()),
        _ => Err(Invalid::TransferCoding),
    }
}

/// Refuses a request that carries one of `names` (the headers routes read
/// subjects from) more than once.
pub fn check_identity_headers(headers: &HeaderMap, names: &[HeaderName]) -> Result<(), Invalid> {
    for name in names {
        let mut values = headers.get_all(name).iter();
        if values.next().is_some() && values.next().is_some() {
            return Err(Invalid::DuplicateIdentity(name.clone()));
        }
    }
    Ok(())
}

/// Refuses a `Connection` that names `X-Forwarded-For` or any header the
/// route's subjects (every limit's) are read from.
pub fn check_connection<'s, I>(headers: &HeaderMap, subject: I) -> Result<(), Invalid>
where
    I: IntoIterator<Item = &'s SubjectSource> + Clone,
{
    for token in connection_tokens(headers) {
        let Ok(name) = HeaderName::from_bytes(token) else {
            continue;
        };
        if name == X_FORWARDED_FOR || relied_on(subject.clone()).any(|h| *h == name) {
            return Err(Invalid::ConnectionNamesIdentity(name));
        }
    }
    Ok(())
}

/// The host the client addressed: the URI authority (HTTP/2 `:authority`,
/// or an HTTP/1.1 absolute-form target, which RFC 9112 §3.2.2 says
/// overrides `Host`), else the `Host` header.
pub fn original_host(uri: &Uri, headers: &HeaderMap) -> Option<HeaderValue> {
    match uri.authority() {
        Some(authority) => HeaderValue::from_str(authority.as_str()).ok(),
        None => headers.get(HOST).cloned(),
    }
}

/// An HTTP/1.1 upgrade (WebSocket and the like): `Connection: upgrade` and
/// an `Upgrade` header. HTTP/2 has no such mechanism.
pub fn is_upgrade(version: Version, headers: &HeaderMap) -> bool {
    version == Version::HTTP_11
        && headers.contains_key(UPGRADE)
        && connection_tokens(headers).any(|t| t.eq_ignore_ascii_case(b"upgrade"))
}

/// The `Upgrade` value to forward: the protocols the client offers that
/// `allowed` names (by name, any version), or `None` when it asks for no
/// upgrade or for none of those. The request then goes as a plain one.
pub fn allowed_upgrade(
    version: Version,
    headers: &HeaderMap,
    allowed: &[Box<str>],
) -> Option<HeaderValue> {
    if !is_upgrade(version, headers) {
        return None;
    }
    let mut kept: Vec<u8> = Vec::new();
    for offer in headers
        .get_all(UPGRADE)
        .iter()
        .flat_map(|v| list(v.as_bytes()))
    {
        if upgrade_allowed(offer, allowed) {
            if !kept.is_empty() {
                kept.extend_from_slice(b", ");
            }
            kept.extend_from_slice(offer);
        }
    }
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&kept).ok()
}

/// Whether `protocol` (`name` or `name/version`) is one `allowed` names.
pub fn upgrade_allowed(protocol: &[u8], allowed: &[Box<str>]) -> bool {
    let name = protocol
        .split(|b| *b == b'/')
        .next()
        .unwrap_or_default()
        .trim_ascii();
    allowed
        .iter()
        .any(|a| a.as_bytes().eq_ignore_ascii_case(name))
}

/// What the client's connection looked like, for the `X-Forwarded-*` fields.
#[derive(Debug, Clone, Copy)]
pub struct Forwarded {
    pub peer: IpAddr,
    pub tls: bool,
    /// The peer is one of `identity.trusted_proxies`.
    pub trusted: bool,
}

/// Rewrites a request's headers for the upstream: hop-by-hop removed,
/// `Host` kept as the client addressed it, `X-Forwarded-*` set, rewrite
/// targets removed, address claims of an untrusted client replaced
/// ([`rewrite_claims`]). `upgrade`: the `Upgrade` value to pass on (see
/// [`allowed_upgrade`]); without it no upgrade reaches the upstream.
pub fn prepare_request(
    headers: &mut HeaderMap,
    host: Option<HeaderValue>,
    forwarded: Forwarded,
    upgrade: Option<HeaderValue>,
) {
    let upgrade_values = upgrade.map(|value| vec![value]);
    // One pass over the names present instead of a lookup (a hash and a
    // probe) for each field below: most requests carry none of them.
    let mut rewrite_urls = false;
    let mut forwarded_for = false;
    let mut claims = false;
    for name in headers.keys() {
        if name == X_ORIGINAL_URL || name == X_REWRITE_URL {
            rewrite_urls = true;
        } else if name == X_FORWARDED_FOR {
            forwarded_for = true;
        } else if name == FORWARDED || CLAIMS.iter().any(|c| c == name) {
            claims = true;
        }
    }
    strip_hop_by_hop(headers);
    if rewrite_urls {
        headers.remove(&X_ORIGINAL_URL);
        headers.remove(&X_REWRITE_URL);
    }

    // Set after stripping, so a `Connection: host` cannot remove it.
    // `insert` replaces every earlier value.
    match host {
        Some(host) => {
            headers.insert(&X_FORWARDED_HOST, host.clone());
            headers.insert(HOST, host);
        }
        None => {
            headers.remove(HOST);
            headers.remove(&X_FORWARDED_HOST);
        }
    }
    if claims {
        rewrite_claims(headers, forwarded);
    }
    append_forwarded_for(headers, forwarded.peer, forwarded_for);
    let proto = if forwarded.tls { "https" } else { "http" };
    headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(proto));

    if let Some(values) = upgrade_values {
        restore_upgrade(headers, values);
    }
}

/// Rewrites an upstream response's headers for the client. `upgraded`: a
/// 101 answering an upgrade the client asked for, which keeps its
/// `Connection: upgrade` and `Upgrade`.
pub fn prepare_response(headers: &mut HeaderMap, upgraded: bool) {
    // Framing came from Transfer-Encoding, which wins over Content-Length
    // (RFC 9112 §6.3). Passing the stale length on would let the client
    // misread where this response ends (hyper's client does not drop it).
    if headers.contains_key(TRANSFER_ENCODING) {
        headers.remove(CONTENT_LENGTH);
    }
    let upgrade_values = upgraded.then(|| take_all(headers, &UPGRADE));
    strip_hop_by_hop(headers);
    if let Some(values) = upgrade_values {
        restore_upgrade(headers, values);
    }
}

/// Removes the hop-by-hop fields and every field the `Connection` header
/// names (RFC 9110 §7.6.1).
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names present is cheaper than a removal (a hash
    // and a probe) per hop-by-hop name, and most messages carry one or none.
    let mut present = 0u16;
    for name in headers.keys() {
        if let Some(i) = hop_by_hop().iter().position(|h| *h == name) {
            present |= 1 << i;
        }
    }
    if present == 0 {
        return;
    }
    // `Connection` is the first hop-by-hop name.
    if present & 1 != 0 {
        // Values are reference-counted: holding them costs no copy, and
        // frees the map to change while their tokens are read.
        for value in take_all(headers, &CONNECTION) {
            for token in list(value.as_bytes()) {
                // Looked up by `&str`, a token needs no `HeaderName` of its
                // own; one that is no valid name matches nothing.
                if let Ok(token) = std::str::from_utf8(token) {
                    headers.remove(token);
                }
            }
        }
    }
    for (i, name) in hop_by_hop().into_iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
}

/// Address claims: from a trusted proxy they are passed on as it wrote
/// them, and `Forwarded` gets this hop's element appended (RFC 7239 §4).
/// From anyone else they are the client's own word: `X-Real-IP` is
/// overwritten with the peer's address (what nginx's `proxy_set_header
/// X-Real-IP $remote_addr` sends), and `True-Client-IP`,
/// `CF-Connecting-IP` and `Forwarded` are removed. Only requests that
/// carry one pay for this.
fn rewrite_claims(headers: &mut HeaderMap, forwarded: Forwarded) {
    let mut text = [0u8; IP_TEXT_MAX];
    let peer = ip_text(forwarded.peer.to_canonical(), &mut text);
    if forwarded.trusted {
        if headers.contains_key(FORWARDED) {
            let mut joined = Vec::new();
            for value in headers.get_all(FORWARDED) {
                joined.extend_from_slice(value.as_bytes());
                joined.extend_from_slice(b", ");
            }
            // RFC 7239 §6: an IPv6 node is bracketed and quoted.
            if forwarded.peer.to_canonical().is_ipv6() {
                joined.extend_from_slice(b"for=\"[");
                joined.extend_from_slice(peer);
                joined.extend_from_slice(b"]\"");
            } else {
                joined.extend_from_slice(b"for=");
                joined.extend_from_slice(peer);
            }
            if let Ok(value) = HeaderValue::from_bytes(&joined) {
                headers.insert(FORWARDED, value);
            }
        }
        return;
    }
    if headers.contains_key(&X_REAL_IP) {
        if let Ok(value) = HeaderValue::from_bytes(peer) {
            headers.insert(&X_REAL_IP, value);
        }
    }
    headers.remove(&TRUE_CLIENT_IP);
    headers.remove(&CF_CONNECTING_IP);
    headers.remove(FORWARDED);
}

/// The client's own `X-Forwarded-For` is its claim: forwarded, not
/// believed (the subject resolver decides whom to believe). The peer is
/// appended to it as one list so upstreams reading a single field see it.
/// `present`: the request carried one (false: it has none now; true: it
/// may, and joining none gives the peer alone).
fn append_forwarded_for(headers: &mut HeaderMap, peer: IpAddr, present: bool) {
    let mut text = [0u8; IP_TEXT_MAX];
    let peer = ip_text(peer.to_canonical(), &mut text);
    if !present {
        // The usual case: the peer alone, one allocation.
        if let Ok(value) = HeaderValue::from_bytes(peer) {
            headers.insert(&X_FORWARDED_FOR, value);
        }
        return;
    }
    let mut joined = Vec::new();
    for member in headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .flat_map(|v| list(v.as_bytes()))
    {
        // Only visible ASCII survives: the joined value must stay valid.
        if member.iter().all(|&b| b.is_ascii_graphic() || b == b' ') {
            joined.extend_from_slice(member);
            joined.extend_from_slice(b", ");
        }
    }
    joined.extend_from_slice(peer);
    match HeaderValue::from_bytes(&joined) {
        Ok(value) => {
            headers.insert(&X_FORWARDED_FOR, value);
        }
        Err(_) => {
            // Unreachable in practice (both parts were valid header text);
            // the peer alone is still the truth.
            if let Ok(value) = HeaderValue::from_bytes(peer) {
                headers.insert(&X_FORWARDED_FOR, value);
            }
        }
    }
}

/// The longest address text: an IPv6 address ending in dotted IPv4
/// (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`).
const IP_TEXT_MAX: usize = 45;

/// `ip` as `Display` writes it, into `buf`. IPv4 digits are written
/// directly: the formatting machinery costs more than the rest of the
/// header work of a request.
fn ip_text(ip: IpAddr, buf: &mut [u8; IP_TEXT_MAX]) -> &[u8] {
    let len = match ip {
        IpAddr::V4(v4) => {
            let mut len = 0;
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    buf[len] = b'.';
                    len += 1;
                }
                let mut digits = itoa::Buffer::new();
                let digits = digits.format(octet).as_bytes();
                buf[len..len + digits.len()].copy_from_slice(digits);
                len += digits.len();
            }
            len
        }
        IpAddr::V6(v6) => {
            let mut cursor = std::io::Cursor::new(&mut buf[..]);
            // At most IP_TEXT_MAX bytes: the write cannot run out of room.
            let _ = write!(cursor, "{v6}");
            usize::try_from(cursor.position()).unwrap_or(0)
        }
    };
    &buf[..len]
}

fn take_all(headers: &HeaderMap, name: &HeaderName) -> Vec<HeaderValue> {
    headers.get_all(name).iter().cloned().collect()
}

fn restore_upgrade(headers: &mut HeaderMap, upgrade: Vec<HeaderValue>) {
    headers.insert(CONNECTION, HeaderValue::from_static("upgrade"));
    for value in upgrade {
        headers.append(UPGRADE, value);
    }
}

pub(super) fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(CONNECTION)
        .iter()
        .flat_map(|v| list(v.as_bytes()))
}

/// The members of a comma-separated field value, trimmed, empties skipped
/// (RFC 9110 §5.6.1).
pub(super) fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(|m| m.trim_ascii())
        .filter(|m| !m.is_empty())
}

#[cfg(test)]
mod tests;
