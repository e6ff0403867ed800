//! Request validation. hyper accepts several things a proxy must refuse:
//! a request with no `Host` or two (hyper #3777), transfer-codings other
//! than plain `chunked`, and a `Connection` header that names a header
//! identity relies on, which would make any proxy in front drop it
//! (CVE-2025-48865, CVE-2025-64484).

use http::header::{HeaderMap, HeaderName, CONNECTION, HOST, TRANSFER_ENCODING};
use http::{Method, Uri, Version};

use crate::path::PathError;
use crate::route::SubjectSource;
use crate::subject::relied_on;
use crate::subject::resolve::X_FORWARDED_FOR;

use super::{connection_tokens, list};

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
    /// HTTP/1 `Transfer-Encoding` whose last coding is not `chunked`, or on
    /// HTTP/1.0: where the body ends cannot be known (400 and close, RFC
    /// 9112 §6.3). hyper refuses such a head before any check runs; the
    /// framing watch hands it over as a stand-in answered so
    /// (`server::framing`).
    UnframedBody,
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
    /// A header a route matches on (`match.headers`), sent more than
    /// once: the app may read another copy than the one sluice routed by.
    DuplicateRouteHeader(HeaderName),
    /// A query parameter a route matches on (`match.query`), sent twice
    /// with different values (once decoded): apps disagree on which one
    /// they read.
    DuplicateRouteParameter,
    /// Behind a trusted proxy, an `X-Forwarded-For` entry that is no
    /// address where sluice must find the client.
    ForwardedFor,
    /// A method-override header sent twice, or naming no method.
    MethodOverride,
    /// A request-target of `*` (HTTP/1) or a `:path` of `*` (HTTP/2)
    /// with another method than OPTIONS (RFC 9112 §3.2.4, RFC 9113
    /// §8.3.1), the wire method or one it is overridden to.
    AsteriskForm,
    /// A header name with `_`, under `server.headers_with_underscores:
    /// reject`.
    UnderscoreHeader,
    /// A header name with `_` that CGI-style servers read as this header,
    /// one sluice reads or writes.
    UnderscoreStandsFor(HeaderName),
}

impl Invalid {
    /// One of each kind (the header named is only an example), so that
    /// every label of `sluice_requests_refused_total` is registered at
    /// start: the match makes a new kind impossible to leave out.
    pub fn kinds() -> Vec<Invalid> {
        let header = || HOST;
        let mut all = Vec::new();
        for kind in [
            Invalid::MissingHost,
            Invalid::DuplicateHost,
            Invalid::HostMismatch,
            Invalid::TransferCoding,
            Invalid::UnframedBody,
            Invalid::ConnectionNamesIdentity(header()),
            Invalid::Connect,
            Invalid::BadHost,
            Invalid::RequestTarget,
            Invalid::MethodCase,
            Invalid::Path(PathError::AboveRoot),
            Invalid::DuplicateIdentity(header()),
            Invalid::DuplicateRouteHeader(header()),
            Invalid::DuplicateRouteParameter,
            Invalid::ForwardedFor,
            Invalid::MethodOverride,
            Invalid::AsteriskForm,
            Invalid::UnderscoreHeader,
            Invalid::UnderscoreStandsFor(header()),
        ] {
            match kind {
                Invalid::Path(_) => all.extend(PathError::ALL.map(Invalid::Path)),
                Invalid::MissingHost
                | Invalid::DuplicateHost
                | Invalid::HostMismatch
                | Invalid::TransferCoding
                | Invalid::UnframedBody
                | Invalid::ConnectionNamesIdentity(_)
                | Invalid::Connect
                | Invalid::BadHost
                | Invalid::RequestTarget
                | Invalid::MethodCase
                | Invalid::DuplicateIdentity(_)
                | Invalid::DuplicateRouteHeader(_)
                | Invalid::DuplicateRouteParameter
                | Invalid::ForwardedFor
                | Invalid::MethodOverride
                | Invalid::AsteriskForm
                | Invalid::UnderscoreHeader
                | Invalid::UnderscoreStandsFor(_) => all.push(kind),
            }
        }
        all
    }

    /// A short, bounded reason for the response body and logs.
    /// A short, bounded label for `sluice_requests_refused_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Invalid::MissingHost => "missing_host",
            Invalid::DuplicateHost => "duplicate_host",
            Invalid::HostMismatch => "host_mismatch",
            Invalid::TransferCoding => "transfer_coding",
            Invalid::UnframedBody => "unframed_body",
            Invalid::ConnectionNamesIdentity(_) => "connection_names_identity",
            Invalid::Connect => "connect",
            Invalid::MethodCase => "method_case",
            Invalid::BadHost => "bad_host",
            Invalid::RequestTarget => "request_target",
            Invalid::Path(error) => error.label(),
            Invalid::DuplicateIdentity(_) => "duplicate_identity",
            Invalid::DuplicateRouteHeader(_) => "duplicate_route_header",
            Invalid::DuplicateRouteParameter => "duplicate_route_parameter",
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
            Invalid::UnframedBody => {
                "Transfer-Encoding does not end in chunked (or comes with HTTP/1.0): where the body ends is unknown"
            }
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
            Invalid::DuplicateRouteHeader(_) => {
                "a header that routes are chosen by is sent more than once"
            }
            Invalid::DuplicateRouteParameter => {
                "a query parameter that routes are chosen by is sent with two values"
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

/// What [`check_head`] found of a head it let through that later checks
/// ask about.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    /// The head has a `Connection` field ([`check_connection`] has
    /// nothing to read without one).
    pub connection: bool,
}

/// The rules that hold before the route is known: method, `Host` and
/// framing.
pub fn check_head(
    method: &Method,
    version: Version,
    uri: &Uri,
    headers: &HeaderMap,
) -> Result<Head, Invalid> {
    if method == Method::CONNECT {
        return Err(Invalid::Connect);
    }
    if method.as_str().bytes().any(|b| b.is_ascii_lowercase()) {
        return Err(Invalid::MethodCase);
    }
    // One pass over the fields, where a lookup of each name (a hash and a
    // probe) cost more: most heads carry a few fields.
    let mut host = None;
    let mut second_host = false;
    let mut coded = false;
    let mut connection = false;
    for (name, value) in headers {
        if name == HOST {
            second_host |= host.is_some();
            host.get_or_insert(value);
        } else if name == TRANSFER_ENCODING {
            coded = true;
        } else if name == CONNECTION {
            connection = true;
        }
    }
    if second_host {
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
    // (Werkzeug) while no sluice route matched it. Not only in origin
    // form: hyper gives an HTTP/2 request with `:authority` a scheme and
    // an authority, so `:path: *` arrives looking like absolute form.
    if is_asterisk(uri) && method != Method::OPTIONS {
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
    if coded {
        check_transfer_coding(version, headers)?;
    }
    Ok(Head { connection })
}

/// Whether the request-target is `*`: HTTP/1's asterisk form, or an
/// HTTP/2 `:path` of `*` with or without `:authority`. No other target has
/// the path `*` (every other path starts with `/`), whatever its form.
pub fn is_asterisk(uri: &Uri) -> bool {
    uri.path() == "*"
}

/// The bytes of a reg-name but `%`: unreserved and sub-delimiters (RFC
/// 3986 §3.2.2). A table, because every request's `Host` is read byte by
/// byte: a lookup is a few instructions a byte where a chain of
/// comparisons was about twenty.
pub(super) static REG_NAME: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric()
            || matches!(
                c,
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
            );
        b += 1;
    }
    table
};

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
    // Most hosts are reg-name characters alone: one table look a byte
    // settles them, before the walk that minds `%`.
    let host_ok = !host.is_empty()
        && (host.iter().all(|&b| REG_NAME[usize::from(b)])
            || host.iter().enumerate().all(|(i, &b)| {
                REG_NAME[usize::from(b)]
                // Only as `pct-encoded`, `%` and two hex digits: the two
                // digits are then checked as reg-name characters. A bare
                // `%` is no host an app can parse back.
                || (b == b'%'
                    && host
                        .get(i + 1..i + 3)
                        .is_some_and(|e| e.iter().all(u8::is_ascii_hexdigit)))
            }));
    let port_ok = match port {
        None => true,
        // An empty port is allowed by the grammar (`host:`).
        Some([]) => true,
        Some(digits) => {
            digits.len() <= 5
                && digits.iter().all(u8::is_ascii_digit)
                && digits
                    .iter()
                    .fold(0u32, |port, d| port * 10 + u32::from(d - b'0'))
                    <= 65_535
        }
    };
    host_ok && port_ok
}

/// The framing of a head with a `Transfer-Encoding`. hyper refuses the
/// heads [`Invalid::UnframedBody`] stands for before this runs (the
/// framing watch answers them); they are told apart here too so that an
/// explained request gets the answer a real one does.
fn check_transfer_coding(version: Version, headers: &HeaderMap) -> Result<(), Invalid> {
    if matches!(version, Version::HTTP_09 | Version::HTTP_10) {
        return Err(Invalid::UnframedBody);
    }
    // Present, so exactly one `chunked`; an empty field is no framing at all.
    // hyper reads the last field's last coding: a final `chunked` frames the
    // body, whatever came before it.
    let last_field = headers.get_all(TRANSFER_ENCODING).iter().next_back();
    let framed = last_field
        .and_then(|v| list(v.as_bytes()).next_back())
        .is_some_and(|coding| coding.eq_ignore_ascii_case(b"chunked"));
    if !framed {
        return Err(Invalid::UnframedBody);
    }
    let mut codings = headers
        .get_all(TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| list(v.as_bytes()));
    match (codings.next(), codings.next()) {
        (Some(_), None) => Ok(()),
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
