//! Who is asking: the client IP behind trusted proxies, a header, a
//! verified token's claim, or several of them together.
//!
//! `X-Forwarded-For` is believed only from a trusted peer, and then only up
//! to the right-most address that is not itself trusted: everything left of
//! it was written by the client and proves nothing (the bypass of Traefik #7067).

use std::borrow::Cow;
use std::net::{IpAddr, Ipv6Addr};

use http::header::{HeaderMap, AUTHORIZATION};
use http::HeaderName;
use ipnet::IpNet;

use crate::config::Identity;
use crate::route::SubjectSource;

use super::basic::{self, Basic};
use super::jwt::{ClaimValue, Token};
use super::{Pseudonym, PseudonymKey};

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// How a request's subject was found (a bounded label: never the value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolved {
    ClientIp,
    Header,
    /// `global`: the route's one bucket, whoever asks.
    Global,
    /// No source was present: the route's one shared bucket.
    Unresolved,
    /// `Authorization: Basic` whose credential decodes to nothing, or to
    /// different bytes in different app servers: the route's one shared
    /// bucket for such credentials ([`super::basic`]).
    Undecodable,
    /// A claim of a verified bearer token.
    Jwt,
    /// `{ all: [...] }`: every part present.
    All,
}

/// Behind trusted proxies only, an `X-Forwarded-For` entry that is no
/// address, reached before the client was found. Guessing (the nearest
/// trusted hop, the next entry) would count someone else; the request is
/// refused instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnreadableForwardedFor;

/// The client address as sluice believes it: the peer, or behind trusted
/// proxies the right-most untrusted `X-Forwarded-For` entry. What the
/// client wrote left of that is its claim, not read.
pub fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
) -> Result<IpAddr, UnreadableForwardedFor> {
    let peer = canonical(peer);
    if !is_trusted(peer, trusted) {
        return Ok(peer);
    }
    // Multiple X-Forwarded-For fields are one list in order (RFC 9110 §5.3).
    let mut last_trusted = peer;
    let fields: Vec<&[u8]> = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .map(|v| v.as_bytes())
        .collect();
    for field in fields.iter().rev() {
        for entry in field.rsplit(|b| *b == b',') {
            // A list may hold empty members (RFC 9110 §5.6.1).
            if entry.trim_ascii().is_empty() {
                continue;
            }
            let ip = parse_entry(entry).ok_or(UnreadableForwardedFor)?;
            if !is_trusted(ip, trusted) {
                return Ok(ip);
            }
            last_trusted = ip;
        }
    }
    Ok(last_trusted)
}

/// A request as its subjects are read from it: the peer (or the client a
/// trusted PROXY header names), its headers, and its bearer token,
/// verified at most once.
pub struct Asking<'a> {
    pub peer: IpAddr,
    pub headers: &'a HeaderMap,
    pub identity: &'a Identity,
    pub token: Token<'a>,
}

impl<'a> Asking<'a> {
    pub fn new(peer: IpAddr, headers: &'a HeaderMap, identity: &'a Identity) -> Asking<'a> {
        Asking {
            peer,
            headers,
            identity,
            token: Token::new(identity.jwt.as_deref(), headers),
        }
    }
}

/// Resolves `sources` in order (first present wins) and returns the
/// pseudonym. An unresolvable subject gets the route's one shared bucket,
/// never an unlimited pass; a header whose value is empty (or blank) is
/// absent, and so is a claim of a token that does not check out. A header
/// sent twice never gets here (refused before routing).
pub fn resolve(
    sources: &[SubjectSource],
    route: &str,
    asking: &Asking<'_>,
    key: &PseudonymKey,
) -> Result<(Pseudonym, Resolved), UnreadableForwardedFor> {
    for source in sources {
        match source {
            SubjectSource::Global => return Ok((global(route, key), Resolved::Global)),
            SubjectSource::All(parts) => {
                if let Some(found) = combined(parts, route, asking, key)? {
                    return Ok(found);
                }
            }
            one => {
                if let Some(part) = part(one, asking)? {
                    return Ok((
                        key.pseudonym(part.kind, part.value.as_slice(), route),
                        part.resolved,
                    ));
                }
            }
        }
    }
    Ok((
        key.pseudonym("unresolved", b"", route),
        Resolved::Unresolved,
    ))
}

/// `{ all: [...] }`: present when every part is; the pseudonym of the
/// parts' kinds and values together, each length-framed so no two
/// combinations read alike.
fn combined(
    parts: &[SubjectSource],
    route: &str,
    asking: &Asking<'_>,
    key: &PseudonymKey,
) -> Result<Option<(Pseudonym, Resolved)>, UnreadableForwardedFor> {
    let mut framed = Vec::with_capacity(64 * parts.len());
    let mut undecodable = false;
    for source in parts {
        let Some(part) = part(source, asking)? else {
            return Ok(None);
        };
        undecodable |= part.resolved == Resolved::Undecodable;
        for bytes in [part.kind.as_bytes(), part.value.as_slice()] {
            framed.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
            framed.extend_from_slice(bytes);
        }
    }
    let resolved = if undecodable {
        Resolved::Undecodable
    } else {
        Resolved::All
    };
    Ok(Some((key.pseudonym("all", &framed, route), resolved)))
}

/// One source's kind and value, when the request carries it.
struct Part<'a> {
    kind: &'a str,
    value: Value<'a>,
    resolved: Resolved,
}

/// A part's value without an allocation for the common cases.
enum Value<'a> {
    V4([u8; 4]),
    V6([u8; 16]),
    Borrowed(&'a [u8]),
    Owned(Vec<u8>),
}

impl Value<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Value::V4(b) => b,
            Value::V6(b) => b,
            Value::Borrowed(b) => b,
            Value::Owned(b) => b,
        }
    }
}

fn part<'a>(
    source: &'a SubjectSource,
    asking: &'a Asking<'_>,
) -> Result<Option<Part<'a>>, UnreadableForwardedFor> {
    Ok(match source {
        SubjectSource::ClientIp => {
            let ip = client_ip(
                asking.peer,
                asking.headers,
                &asking.identity.trusted_proxies,
            )?;
            Some(match group(ip, asking.identity.ipv6_prefix) {
                IpAddr::V4(v4) => Part {
                    kind: "ip",
                    value: Value::V4(v4.octets()),
                    resolved: Resolved::ClientIp,
                },
                IpAddr::V6(v6) => Part {
                    kind: "ip6",
                    value: Value::V6(v6.octets()),
                    resolved: Resolved::ClientIp,
                },
            })
        }
        SubjectSource::Header(name) => {
            let value = asking
                .headers
                .get(name)
                .map(|v| v.as_bytes())
                .unwrap_or_default()
                .trim_ascii();
            if value.is_empty() {
                None
            } else if *name == AUTHORIZATION {
                Some(match authorization(value) {
                    Some(Cow::Borrowed(value)) => Part {
                        kind: name.as_str(),
                        value: Value::Borrowed(value),
                        resolved: Resolved::Header,
                    },
                    Some(Cow::Owned(value)) => Part {
                        kind: name.as_str(),
                        value: Value::Owned(value),
                        resolved: Resolved::Header,
                    },
                    None => Part {
                        kind: UNDECODABLE,
                        value: Value::Borrowed(b""),
                        resolved: Resolved::Undecodable,
                    },
                })
            } else {
                Some(Part {
                    kind: name.as_str(),
                    value: Value::Borrowed(value),
                    resolved: Resolved::Header,
                })
            }
        }
        SubjectSource::Jwt { claim, kind } => asking.token.claim(claim).map(|value| Part {
            kind,
            value: match value {
                ClaimValue::Text(s) => Value::Borrowed(s.as_bytes()),
                ClaimValue::Owned(s) => Value::Owned(s.into_bytes()),
            },
            resolved: Resolved::Jwt,
        }),
        // Validation keeps these out of a combination.
        SubjectSource::Global | SubjectSource::All(_) => None,
    })
}

/// The kind of the undecodable `Basic` bucket: no header name holds a
/// `:`, so it is no header's pseudonym.
const UNDECODABLE: &str = "authorization:undecodable";

/// The `Authorization` value counted: [`credentials`], and for the `Basic`
/// scheme `Basic ` then the decoded `user:password` bytes, however the
/// base64 was spelled. `None`: a `Basic` credential that is
/// [`Basic::Undecodable`].
fn authorization(value: &[u8]) -> Option<Cow<'_, [u8]>> {
    let value = credentials(value);
    let encoded = match value.strip_prefix(b"Basic") {
        Some(b"") => b"".as_slice(),
        Some(rest) => match rest.strip_prefix(b" ") {
            Some(encoded) => encoded,
            // Another scheme that starts with `Basic`.
            None => return Some(value),
        },
        None => return Some(value),
    };
    match basic::decode(encoded) {
        Basic::Decoded(decoded) => {
            let mut out = Vec::with_capacity(6 + decoded.len());
            out.extend_from_slice(b"Basic ");
            out.extend_from_slice(&decoded);
            Some(Cow::Owned(out))
        }
        Basic::Undecodable => None,
    }
}

/// An `Authorization` value as every app reads it: the scheme is
/// case-insensitive (RFC 9110 §11.1) and apps split it from the
/// credential on any run of spaces or tabs, so `Bearer  tok`, `bearer tok`
/// and `BEARER\ttok` are one credential. The scheme is written with its
/// first letter upper-case and the rest lower-case (`Bearer`, `Basic`:
/// the spelling most clients send keeps its pseudonym), then one space,
/// then the credential as sent. `value` is already trimmed.
pub fn credentials(value: &[u8]) -> Cow<'_, [u8]> {
    let blank = |b: &u8| *b == b' ' || *b == b'\t';
    let scheme_end = value.iter().position(blank).unwrap_or(value.len());
    let (scheme, rest) = value.split_at(scheme_end);
    let start = rest.iter().position(|b| !blank(b)).unwrap_or(rest.len());
    let credential = &rest[start..];
    let canonical_scheme = scheme.iter().enumerate().all(|(i, b)| {
        if i == 0 {
            !b.is_ascii_lowercase()
        } else {
            !b.is_ascii_uppercase()
        }
    });
    let one_space = rest.len() == credential.len() + 1 && rest.first() == Some(&b' ');
    if canonical_scheme && (credential.is_empty() || one_space) {
        return Cow::Borrowed(value);
    }
    let mut out = Vec::with_capacity(scheme.len() + 1 + credential.len());
    for (i, b) in scheme.iter().enumerate() {
        out.push(if i == 0 {
            b.to_ascii_uppercase()
        } else {
            b.to_ascii_lowercase()
        });
    }
    if !credential.is_empty() {
        out.push(b' ');
        out.extend_from_slice(credential);
    }
    Cow::Owned(out)
}

/// The pseudonym of `subject: global` on `route`: the same for every
/// request, and derived from the route's name (its own kind, so it can be
/// neither a client's nor the unresolved bucket), so two routes' global
/// buckets never share state. It needs nothing from the request: the
/// proxy computes it once per configuration.
pub fn global(route: &str, key: &PseudonymKey) -> Pseudonym {
    key.pseudonym("global", b"", route)
}

/// The headers a route's subject relies on: a request whose `Connection`
/// header names one of them is refused, since a proxy in front would have
/// dropped it (CVE-2025-48865).
pub fn relied_on<'s>(
    sources: impl IntoIterator<Item = &'s SubjectSource>,
) -> impl Iterator<Item = &'s HeaderName> {
    sources.into_iter().flat_map(|s| {
        let forwarded = s
            .parts()
            .contains(&SubjectSource::ClientIp)
            .then_some(&X_FORWARDED_FOR);
        forwarded.into_iter().chain(s.headers())
    })
}

fn parse_entry(entry: &[u8]) -> Option<IpAddr> {
    let s = std::str::from_utf8(entry).ok()?.trim();
    // Accept `1.2.3.4`, `::1`, `[::1]`, `1.2.3.4:5678` and `[::1]:5678`.
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(canonical(ip));
    }
    if let Ok(sock) = s.parse::<std::net::SocketAddr>() {
        return Some(canonical(sock.ip()));
    }
    let inner = s.strip_prefix('[')?.strip_suffix(']')?;
    inner.parse::<IpAddr>().ok().map(canonical)
}

/// IPv4-mapped IPv6 addresses are the IPv4 client they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Whether `peer` is one of the trusted proxies (IPv4-mapped addresses as
/// the IPv4 address they carry).
pub fn trusted_peer(peer: IpAddr, trusted: &[IpNet]) -> bool {
    !trusted.is_empty() && is_trusted(canonical(peer), trusted)
}

fn is_trusted(ip: IpAddr, trusted: &[IpNet]) -> bool {
    trusted.iter().any(|net| net.contains(&ip))
}

/// One IPv6 client owns a whole prefix (a /64 by default): it can pick any
/// address inside it, so counting addresses would count nothing.
fn group(ip: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let mask = match ipv6_prefix {
                0 => 0,
                p if p >= 128 => u128::MAX,
                p => u128::MAX << (128 - u32::from(p)),
            };
            IpAddr::V6(Ipv6Addr::from(bits & mask))
        }
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn xff(values: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(&X_FORWARDED_FOR, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn untrusted_peer_is_the_client_whatever_xff_says() {
        let h = xff(&["6.6.6.6"]);
        assert_eq!(
            client_ip(ip("1.2.3.4"), &h, &nets(&["10.0.0.0/8"])),
            Ok(ip("1.2.3.4"))
        );
        // Not believed, so not read: junk from an untrusted peer is its own.
        assert_eq!(
            client_ip(ip("1.2.3.4"), &xff(&["junk"]), &nets(&["10.0.0.0/8"])),
            Ok(ip("1.2.3.4"))
        );
    }

    #[test]
    fn trusted_chain_resolves_to_rightmost_untrusted() {
        let trusted = nets(&["10.0.0.0/8", "192.168.1.1/32"]);
        let h = xff(&["6.6.6.6, 203.0.113.7", "192.168.1.1, 10.1.1.1"]);
        assert_eq!(
            client_ip(ip("10.0.0.2"), &h, &trusted),
            Ok(ip("203.0.113.7"))
        );
        // Empty list members are skipped; junk left of the client is its claim.
        let h = xff(&["junk, 203.0.113.7,, ", "10.1.1.1"]);
        assert_eq!(
            client_ip(ip("10.0.0.2"), &h, &trusted),
            Ok(ip("203.0.113.7"))
        );
    }

    #[test]
    fn junk_where_the_client_must_be_found_is_refused() {
        let trusted = nets(&["10.0.0.0/8"]);
        for chain in ["garbage, 10.3.3.3", "unknown", "10.1.1.1, 1.2.3.4.5"] {
            assert_eq!(
                client_ip(ip("10.0.0.2"), &xff(&[chain]), &trusted),
                Err(UnreadableForwardedFor),
                "{chain}"
            );
        }
    }

    #[test]
    fn all_trusted_chain_stops_at_the_leftmost_trusted_hop() {
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(
            client_ip(ip("10.0.0.2"), &xff(&["10.9.9.9"]), &trusted),
            Ok(ip("10.9.9.9"))
        );
        assert_eq!(
            client_ip(ip("10.0.0.2"), &xff(&[]), &trusted),
            Ok(ip("10.0.0.2"))
        );
    }

    #[test]
    fn entries_with_ports_and_brackets_parse() {
        let trusted = nets(&["10.0.0.0/8"]);
        assert_eq!(
            client_ip(ip("10.0.0.2"), &xff(&["[2001:db8::1]:443"]), &trusted),
            Ok(ip("2001:db8::1"))
        );
        assert_eq!(
            client_ip(ip("10.0.0.2"), &xff(&["198.51.100.2:80"]), &trusted),
            Ok(ip("198.51.100.2"))
        );
        assert_eq!(
            client_ip(ip("::ffff:10.0.0.2"), &xff(&["198.51.100.9"]), &trusted),
            Ok(ip("198.51.100.9"))
        );
    }

    /// Every case here reads no `X-Forwarded-For`, so none can fail.
    fn resolve(
        sources: &[SubjectSource],
        route: &str,
        peer: IpAddr,
        headers: &HeaderMap,
        identity: &Identity,
        key: &PseudonymKey,
    ) -> (Pseudonym, Resolved) {
        let asking = Asking::new(peer, headers, identity);
        super::resolve(sources, route, &asking, key).expect("no X-Forwarded-For")
    }

    fn identity(prefix: u8) -> Identity {
        Identity {
            trusted_proxies: vec![],
            ipv6_prefix: prefix,
            pseudonym_key: None,
            pseudonym_key_version: 1,
            jwt: None,
            jwt_keys_file: None,
        }
    }

    #[test]
    fn ipv6_clients_are_grouped_by_prefix() {
        let key = PseudonymKey::new(b"k", 1);
        let h = HeaderMap::new();
        let src = [SubjectSource::ClientIp];
        let a = resolve(&src, "r", ip("2001:db8:1:2::1"), &h, &identity(64), &key).0;
        let b = resolve(
            &src,
            "r",
            ip("2001:db8:1:2:ffff::9"),
            &h,
            &identity(64),
            &key,
        )
        .0;
        let c = resolve(&src, "r", ip("2001:db8:1:3::1"), &h, &identity(64), &key).0;
        assert_eq!(a, b);
        assert_ne!(a, c);
        let d = resolve(&src, "r", ip("2001:db8:1:2::2"), &h, &identity(128), &key).0;
        let e = resolve(&src, "r", ip("2001:db8:1:2::1"), &h, &identity(128), &key).0;
        assert_ne!(d, e);
    }

    #[test]
    fn global_is_one_bucket_per_route_apart_from_every_client() {
        let key = PseudonymKey::new(b"k", 1);
        let src = [SubjectSource::Global];
        let mut h = HeaderMap::new();
        let (a, r) = resolve(&src, "signup", ip("1.1.1.1"), &h, &identity(64), &key);
        assert_eq!(r, Resolved::Global);
        h.insert("x-api-key", HeaderValue::from_static("k1"));
        let (b, _) = resolve(&src, "signup", ip("2.2.2.2"), &h, &identity(64), &key);
        assert_eq!(a, b, "whoever asks");
        assert_eq!(a, global("signup", &key));
        let (other, _) = resolve(&src, "login", ip("1.1.1.1"), &h, &identity(64), &key);
        assert_ne!(a, other, "another route's global bucket");
        let unresolved = [SubjectSource::Header(HeaderName::from_static("x-absent"))];
        let (none, _) = resolve(
            &unresolved,
            "signup",
            ip("1.1.1.1"),
            &h,
            &identity(64),
            &key,
        );
        assert_ne!(a, none, "not the unresolved bucket");
    }

    #[test]
    fn header_falls_back_and_absence_is_one_shared_bucket() {
        let key = PseudonymKey::new(b"k", 1);
        let name = HeaderName::from_static("x-api-key");
        let src = [SubjectSource::Header(name.clone())];
        let mut h = HeaderMap::new();
        let (none1, r) = resolve(&src, "api", ip("1.1.1.1"), &h, &identity(64), &key);
        assert_eq!(r, Resolved::Unresolved);
        let (none2, _) = resolve(&src, "api", ip("2.2.2.2"), &h, &identity(64), &key);
        assert_eq!(none1, none2, "absent subjects share one bucket per route");
        h.insert(&name, HeaderValue::from_static("  "));
        assert_eq!(
            resolve(&src, "api", ip("1.1.1.1"), &h, &identity(64), &key).1,
            Resolved::Unresolved
        );
        h.insert(&name, HeaderValue::from_static("k1"));
        let (k1, r) = resolve(&src, "api", ip("1.1.1.1"), &h, &identity(64), &key);
        assert_eq!(r, Resolved::Header);
        assert_ne!(k1, none1);

        let fallback = [SubjectSource::Header(name.clone()), SubjectSource::ClientIp];
        h.remove(&name);
        assert_eq!(
            resolve(&fallback, "api", ip("1.1.1.1"), &h, &identity(64), &key).1,
            Resolved::ClientIp
        );
    }

    #[test]
    fn authorization_reads_as_apps_read_it() {
        for (sent, read) in [
            ("Bearer tok", "Bearer tok"),
            ("Bearer     tok", "Bearer tok"),
            ("bearer tok", "Bearer tok"),
            ("BEARER\ttok", "Bearer tok"),
            ("Bearer \t tok", "Bearer tok"),
            ("bAsIc dXNlcjpwdw==", "Basic dXNlcjpwdw=="),
            // The credential is case-sensitive and kept as sent.
            ("Bearer TOK", "Bearer TOK"),
            ("Negotiate", "Negotiate"),
            ("negotiate", "Negotiate"),
            ("Digest a=1,  b=2", "Digest a=1,  b=2"),
        ] {
            assert_eq!(&*credentials(sent.as_bytes()), read.as_bytes(), "{sent:?}");
        }
        assert!(matches!(credentials(b"Bearer tok"), Cow::Borrowed(_)));
    }

    fn by_authorization(value: &[u8]) -> (Pseudonym, Resolved) {
        let key = PseudonymKey::new(b"k", 1);
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_bytes(value).unwrap());
        let src = [SubjectSource::Header(AUTHORIZATION)];
        resolve(&src, "login", ip("1.1.1.1"), &h, &identity(64), &key)
    }

    #[test]
    fn basic_credentials_count_by_what_they_decode_to() {
        let one = by_authorization(b"Basic YWxpY2U6czNjcmV0");
        assert_eq!(one.1, Resolved::Header);
        for sent in [
            "Basic YWxpY2U6czNjcmV0==",
            "Basic YWxp*Y2U6czNjcmV0",
            "basic  YWxpY2U6czNjcmV0",
            "BASIC\tYWxpY2U6czNjcmV0=",
        ] {
            assert_eq!(by_authorization(sent.as_bytes()), one, "{sent:?}");
        }
        // `alice:s3cret1` needs padding: sent without it, the same.
        assert_eq!(
            by_authorization(b"Basic YWxpY2U6czNjcmV0MQ"),
            by_authorization(b"Basic YWxpY2U6czNjcmV0MQ==")
        );
        assert_ne!(by_authorization(b"Basic YWxpY2U6czNjcmV0MQ"), one);
        // Another scheme carrying the same characters is another credential.
        assert_ne!(by_authorization(b"Bearer YWxpY2U6czNjcmV0"), one);
        assert_ne!(by_authorization(b"Basicx YWxpY2U6czNjcmV0"), one);
    }

    #[test]
    fn undecodable_basic_credentials_share_one_bucket() {
        let shared = by_authorization(b"Basic !!!");
        assert_eq!(shared.1, Resolved::Undecodable);
        for sent in [
            "Basic",
            "basic ====",
            "Basic YQ==YQ==",
            "Basic YWxp-Y2U6czNjcmV0",
        ] {
            assert_eq!(by_authorization(sent.as_bytes()), shared, "{sent:?}");
        }
        let key = PseudonymKey::new(b"k", 1);
        assert_ne!(shared.0, key.pseudonym("unresolved", b"", "login"));
    }
}
