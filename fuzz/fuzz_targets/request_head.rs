//! The request-head checks: any method, target and headers → a verdict,
//! never a panic, and what is accepted holds up.
//!
//! - `check_head`: an accepted `Host` (and an absolute-form authority) is
//!   a valid RFC 3986 `host [":" port]` with a port of at most 65535; an
//!   accepted request has at most one `Host`, a lower-case-free method that
//!   is not CONNECT, and at most one transfer-coding, `chunked`; a target
//!   of `*` is accepted only with OPTIONS. An HTTP/2 input is also checked
//!   as hyper hands an HTTP/2 request over: the target as `:path` beside a
//!   scheme and an `:authority`, where `:path: *` looks like absolute form.
//! - `check_connection` / `check_identity_headers`: a refusal names a
//!   header that really is relied on; an acceptance means none is.
//! - `client_ip`: the right-most untrusted `X-Forwarded-For` entry behind
//!   trusted peers, the peer otherwise (checked against a second reading).
//! - `methods`: the wire method comes first and every override names a
//!   method of letters and `-`.
//! - `credentials`: an `Authorization` value read twice reads the same.
//! - `path::normalize`: the forwarded form is absolute, has no dot segment
//!   (nor `//` when slashes are merged), and normalizes to itself.
#![no_main]

use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use arbitrary::Arbitrary;
use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, HOST, TRANSFER_ENCODING};
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Uri, Version};
use ipnet::IpNet;
use libfuzzer_sys::fuzz_target;
use sluice::fuzzing::{
    check_connection, check_head, check_identity_headers, credentials, methods, Invalid,
};
use sluice::path::{normalize, EscapedSlashes, PathParameters, PathRules};
use sluice::route::SubjectSource;
use sluice::subject::client_ip;

/// Names the checks read, most of the time; any name otherwise.
const NAMES: [&str; 10] = [
    "host",
    "transfer-encoding",
    "connection",
    "x-forwarded-for",
    "x-api-key",
    "x-user",
    "upgrade",
    "content-length",
    "te",
    "keep-alive",
];

#[derive(Arbitrary, Debug)]
enum Name {
    Known(u8),
    Other(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum MethodText {
    Known(u8),
    Other(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Input {
    method: MethodText,
    version: u8,
    target: Vec<u8>,
    headers: Vec<(Name, Vec<u8>)>,
    /// Header names (as `Name`) a route reads its subject from; `None`
    /// stands for `client_ip`.
    subject: Vec<Option<Name>>,
    peer: ([u8; 16], bool),
    trusted: Vec<([u8; 16], bool, u8)>,
    path: String,
    rules: (bool, u8, u8),
}

fn name(n: &Name) -> Option<HeaderName> {
    match n {
        Name::Known(i) => Some(HeaderName::from_static(NAMES[*i as usize % NAMES.len()])),
        Name::Other(bytes) => HeaderName::from_bytes(bytes).ok(),
    }
}

fn ip((bytes, v4): &([u8; 16], bool)) -> IpAddr {
    if *v4 {
        IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]])
    } else {
        IpAddr::from(*bytes)
    }
}

fn method(m: &MethodText) -> Option<Method> {
    const KNOWN: [&str; 6] = ["GET", "POST", "CONNECT", "get", "OPTIONS", "PATCH"];
    match m {
        MethodText::Known(i) => {
            Method::from_bytes(KNOWN[*i as usize % KNOWN.len()].as_bytes()).ok()
        }
        MethodText::Other(bytes) => Method::from_bytes(bytes).ok(),
    }
}

/// RFC 3986 §3.2.2-3 (`IP-literal` as IPv6 only, `IPv4address` being a
/// `reg-name` too), never empty (RFC 9110 §4.2.1), port ≤ 65535.
fn valid_authority(value: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(value) else {
        return false;
    };
    let (host_ok, port) = if let Some(rest) = text.strip_prefix('[') {
        let Some((literal, after)) = rest.split_once(']') else {
            return false;
        };
        let port = match after {
            "" => None,
            _ => match after.strip_prefix(':') {
                Some(p) => Some(p),
                None => return false,
            },
        };
        (literal.parse::<Ipv6Addr>().is_ok(), port)
    } else {
        let (host, port) = match text.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (text, None),
        };
        (!host.is_empty() && reg_name(host.as_bytes()), port)
    };
    let port_ok = port.is_none_or(|p| {
        p.bytes().all(|b| b.is_ascii_digit())
            && (p.is_empty() || p.parse::<u32>().is_ok_and(|n| n <= 65_535))
    });
    host_ok && port_ok
}

/// `*( unreserved / pct-encoded / sub-delims )`.
fn reg_name(host: &[u8]) -> bool {
    let mut i = 0;
    while i < host.len() {
        let b = host[i];
        if b == b'%' {
            let escape = host.get(i + 1..i + 3);
            if !escape.is_some_and(|e| e.iter().all(u8::is_ascii_hexdigit)) {
                return false;
            }
            i += 3;
            continue;
        }
        if !(b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=".contains(&b)) {
            return false;
        }
        i += 1;
    }
    true
}

fn members(headers: &HeaderMap, name: HeaderName) -> Vec<Vec<u8>> {
    headers
        .get_all(name)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .map(|m| m.trim_ascii().to_vec())
        .filter(|m| !m.is_empty())
        .collect()
}

/// A second reading of `client_ip`'s rule, to compare with.
fn believed(peer: IpAddr, headers: &HeaderMap, trusted: &[IpNet]) -> Option<IpAddr> {
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    let is_trusted = |ip: IpAddr| trusted.iter().any(|n| n.contains(&ip));
    let mut client = canonical(peer);
    if !is_trusted(client) {
        return Some(client);
    }
    let mut entries = members(headers, HeaderName::from_static("x-forwarded-for"));
    entries.reverse();
    for entry in entries {
        let text = std::str::from_utf8(&entry).ok()?.trim();
        let parsed = text
            .parse::<IpAddr>()
            .ok()
            .or_else(|| text.parse::<SocketAddr>().ok().map(|s| s.ip()))
            .or_else(|| text.strip_prefix('[')?.strip_suffix(']')?.parse().ok())?;
        client = canonical(parsed);
        if !is_trusted(client) {
            break;
        }
    }
    Some(client)
}

/// The URI hyper gives an HTTP/2 request whose `:path` is `target`: h2
/// keeps `:scheme` beside an `:authority` (here the `Host` value when it is
/// one, as a client sending both would have them agree), so the path,
/// `*` included, arrives with a scheme and an authority. `None` for a
/// `:path` h2 itself refuses.
fn http2_uri(target: &[u8], headers: &HeaderMap) -> Option<Uri> {
    if target.is_empty() {
        return None;
    }
    let authority = headers
        .get(HOST)
        .and_then(|h| Authority::try_from(h.as_bytes()).ok())
        .unwrap_or(Authority::from_static("app.test"));
    let mut parts = http::uri::Parts::default();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = Some(authority);
    parts.path_and_query = Some(PathAndQuery::try_from(target).ok()?);
    Uri::from_parts(parts).ok()
}

/// What an accepted head must hold.
fn accepted(method: &Method, version: Version, uri: &Uri, headers: &HeaderMap) {
    assert_ne!(method, Method::CONNECT);
    assert!(!method.as_str().bytes().any(|b| b.is_ascii_lowercase()));
    let hosts: Vec<_> = headers.get_all(HOST).iter().collect();
    assert!(hosts.len() <= 1);
    if let Some(host) = hosts.first() {
        assert!(valid_authority(host.as_bytes()), "accepted Host {host:?}");
    }
    if let Some(authority) = uri.authority() {
        assert!(uri.scheme().is_some(), "authority-form {uri}");
        assert!(
            valid_authority(authority.as_str().as_bytes()),
            "accepted {uri}"
        );
    }
    if version == Version::HTTP_11 {
        assert_eq!(hosts.len(), 1);
    }
    // In any form: hyper hands `:path: *` over with a scheme and an
    // authority.
    if uri.path() == "*" {
        assert_eq!(
            method,
            Method::OPTIONS,
            "accepted {method} {uri} ({version:?})"
        );
    }
    if headers.contains_key(TRANSFER_ENCODING) {
        let codings = members(headers, TRANSFER_ENCODING);
        assert!(
            codings.len() == 1 && codings[0].eq_ignore_ascii_case(b"chunked"),
            "accepted {codings:?}"
        );
    }
}

fn check_path(raw: &str, rules: &PathRules) {
    let Ok(normal) = normalize(raw, rules) else {
        return;
    };
    let forward = &*normal.forward;
    if forward == "*" {
        return;
    }
    assert!(forward.starts_with('/'), "{raw:?} → {forward:?}");
    for dot in ["/./", "/../"] {
        assert!(!forward.contains(dot), "{raw:?} → {forward:?}");
    }
    assert!(
        !(forward.ends_with("/.") || forward.ends_with("/..")),
        "{raw:?} → {forward:?}"
    );
    if rules.merge_slashes {
        assert!(!forward.contains("//"), "{raw:?} → {forward:?}");
        assert!(
            !normal.matching.contains("//"),
            "{raw:?} → {:?}",
            normal.matching
        );
    }
    // What the app receives means what sluice matched: normalizing it
    // again changes nothing.
    let again =
        normalize(forward, rules).unwrap_or_else(|e| panic!("{raw:?} → {forward:?} → {e:?}"));
    assert_eq!(again.forward, forward, "{raw:?}");
    assert_eq!(again.matching, normal.matching, "{raw:?}");
}

fuzz_target!(|input: Input| {
    let mut headers = HeaderMap::new();
    for (n, value) in &input.headers {
        if let (Some(n), Ok(v)) = (name(n), HeaderValue::from_bytes(value)) {
            headers.append(n, v);
        }
    }
    let version = match input.version % 4 {
        0 => Version::HTTP_10,
        1 => Version::HTTP_11,
        2 => Version::HTTP_2,
        _ => Version::HTTP_09,
    };
    let uri = Uri::try_from(input.target.as_slice()).unwrap_or_else(|_| Uri::from_static("/"));

    if let Some(method) = method(&input.method) {
        if check_head(&method, version, &uri, &headers).is_ok() {
            accepted(&method, version, &uri, &headers);
        }
        if version == Version::HTTP_2 {
            if let Some(uri) = http2_uri(&input.target, &headers) {
                if check_head(&method, version, &uri, &headers).is_ok() {
                    accepted(&method, version, &uri, &headers);
                }
            }
        }
    }

    if let Some(method) = method(&input.method) {
        for fold in [false, true] {
            if let Ok(found) = methods(&method, &headers, uri.query(), fold) {
                let mut found = found.iter();
                assert_eq!(found.next(), Some(&method));
                for other in found {
                    assert!(
                        other
                            .as_str()
                            .bytes()
                            .all(|b| b.is_ascii_uppercase() || b == b'-'),
                        "override {other}"
                    );
                }
            }
        }
    }
    for value in headers.values() {
        let value = value.as_bytes().trim_ascii();
        let once = credentials(value);
        assert_eq!(*credentials(&once), *once, "{value:?}");
    }

    let subject: Vec<SubjectSource> = input
        .subject
        .iter()
        .filter_map(|s| match s {
            None => Some(SubjectSource::ClientIp),
            Some(n) => name(n).map(SubjectSource::Header),
        })
        .collect();
    // Only client_ip and header sources are built above.
    let relied: Vec<HeaderName> = subject
        .iter()
        .filter_map(|s| match s {
            SubjectSource::ClientIp => Some(HeaderName::from_static("x-forwarded-for")),
            SubjectSource::Header(n) => Some(n.clone()),
            SubjectSource::Jwt { .. } => Some(http::header::AUTHORIZATION),
            // Reads nothing from the request.
            SubjectSource::Global => None,
            SubjectSource::All(parts) => parts.first().and_then(|p| match p {
                SubjectSource::Header(n) => Some(n.clone()),
                _ => None,
            }),
        })
        .collect();
    let named = |n: &HeaderName| *n == "x-forwarded-for" || relied.contains(n);
    match check_connection(&headers, &subject) {
        Ok(()) => {
            for token in members(&headers, CONNECTION) {
                if let Ok(n) = HeaderName::from_bytes(&token) {
                    assert!(!named(&n), "Connection: {n} accepted");
                }
            }
        }
        Err(Invalid::ConnectionNamesIdentity(n)) => assert!(named(&n), "{n} refused"),
        Err(other) => panic!("check_connection answered {other:?}"),
    }
    let duplicated = relied.iter().any(|n| headers.get_all(n).iter().count() > 1);
    assert_eq!(
        check_identity_headers(&headers, &relied).is_err(),
        duplicated
    );

    let trusted: Vec<IpNet> = input
        .trusted
        .iter()
        .filter_map(|(bytes, v4, prefix)| IpNet::new(ip(&(*bytes, *v4)), *prefix).ok())
        .collect();
    let peer = ip(&input.peer);
    assert_eq!(
        client_ip(peer, &headers, &trusted).ok(),
        believed(peer, &headers, &trusted)
    );

    let (merge_slashes, slashes, params) = input.rules;
    let rules = PathRules {
        merge_slashes,
        escaped_slashes: [
            EscapedSlashes::Reject,
            EscapedSlashes::Keep,
            EscapedSlashes::Decode,
        ][slashes as usize % 3],
        path_parameters: [
            PathParameters::Ignore,
            PathParameters::Strip,
            PathParameters::Reject,
        ][params as usize % 3],
    };
    check_path(&input.path, &rules);
});
