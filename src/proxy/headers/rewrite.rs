//! The header rewriting of a forwarding proxy: hop-by-hop fields removed
//! both ways, `Host` kept as the client addressed it, `X-Forwarded-*` and
//! `Forwarded` set, address claims of an untrusted client replaced.

use std::io::Write as _;
use std::net::IpAddr;

use http::header::{
    HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, COOKIE, FORWARDED, HOST,
    UPGRADE,
};
use http::Version;

use crate::subject::resolve::X_FORWARDED_FOR;

use super::*;

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

/// The host the client addressed, and whether the request's `Host`
/// field is where it said so.
#[derive(Debug, Clone)]
pub struct Addressed {
    pub host: HeaderValue,
    pub in_host_field: bool,
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
#[derive(Debug, Clone)]
pub struct Forwarded {
    pub peer: IpAddr,
    /// `peer` as the fields give it ([`peer_value`]).
    pub peer_value: HeaderValue,
    pub tls: bool,
    /// The peer is one of `identity.trusted_proxies`.
    pub trusted: bool,
}

/// `peer` as `X-Forwarded-For` and `X-Real-IP` give it: an IPv4 address
/// mapped into IPv6 as the IPv4 address it is.
pub fn peer_value(peer: IpAddr) -> HeaderValue {
    let mut text = [0u8; IP_TEXT_MAX];
    let text = ip_text(peer.to_canonical(), &mut text);
    // An address's text is valid field text: never the fallback.
    HeaderValue::from_bytes(text).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// Rewrites a request's headers for the upstream: hop-by-hop removed,
/// `Host` kept as the client addressed it, `X-Forwarded-*` set, rewrite
/// targets removed, address claims of an untrusted client replaced
/// ([`rewrite_claims`]). `fields`: what one pass over them found, before
/// anything changed them; `host`: [`RequestFields::addressed`].
/// `upgrade`: the `Upgrade` value to pass on (see [`allowed_upgrade`]);
/// without it no upgrade reaches the upstream.
pub fn prepare_request(
    headers: &mut HeaderMap,
    fields: RequestFields,
    host: Option<Addressed>,
    forwarded: Forwarded,
    upgrade: Option<HeaderValue>,
) {
    let upgrade_values = upgrade.map(|value| vec![value]);
    let named_removed = strip_present(headers, fields.present);
    if fields.rewrite_urls {
        headers.remove(&X_ORIGINAL_URL);
        headers.remove(&X_REWRITE_URL);
    }

    // Set after stripping, so a `Connection: host` cannot remove it.
    // `insert` replaces every earlier value. A `Host` that named the host
    // and is still there is left as it is (an insert is a hash and a
    // probe).
    match host {
        Some(Addressed {
            host,
            in_host_field,
        }) => {
            headers.insert(&X_FORWARDED_HOST, host.clone());
            if !in_host_field || named_removed {
                headers.insert(HOST, host);
            }
        }
        None => {
            headers.remove(HOST);
            headers.remove(&X_FORWARDED_HOST);
        }
    }
    if fields.claims {
        rewrite_claims(headers, &forwarded);
    }
    append_forwarded_for(headers, &forwarded.peer_value, fields.forwarded_for);
    let proto = if forwarded.tls { "https" } else { "http" };
    headers.insert(&X_FORWARDED_PROTO, HeaderValue::from_static(proto));

    if let Some(values) = upgrade_values {
        restore_upgrade(headers, values);
    }
}

/// Rewrites an upstream response's headers for the client. `upgraded`: a
/// 101 answering an upgrade the client asked for, which keeps its
/// `Connection: upgrade` and `Upgrade`.
pub fn prepare_response(headers: &mut HeaderMap, fields: &ResponseFields, upgraded: bool) {
    // Framing came from Transfer-Encoding, which wins over Content-Length
    // (RFC 9112 §6.3). Passing the stale length on would let the client
    // misread where this response ends (hyper's client does not drop it).
    if fields.transfer_encoding() {
        headers.remove(CONTENT_LENGTH);
    }
    let upgrade_values = upgraded.then(|| take_all(headers, &UPGRADE));
    strip_present(headers, fields.present);
    if let Some(values) = upgrade_values {
        restore_upgrade(headers, values);
    }
}

/// Removes the hop-by-hop fields and every field the `Connection` header
/// names (RFC 9110 §7.6.1); whether it named any but hop-by-hop ones.
/// The request's and the response's rewrites find those names in passes
/// of their own ([`RequestFields`], [`ResponseFields`]), and strip them
/// with [`strip_present`].
#[cfg(test)]
pub fn strip_hop_by_hop(headers: &mut HeaderMap) -> bool {
    strip_present(headers, ResponseFields::of(headers).present)
}

/// Removes the hop-by-hop fields `present` marks (bit `i` for the `i`th
/// of [`HOP_BY_HOP`]) and every field the `Connection` header names;
/// whether it named any but hop-by-hop ones.
fn strip_present(headers: &mut HeaderMap, mut present: u16) -> bool {
    if present == 0 {
        return false;
    }
    // `Connection` is the first hop-by-hop name. Most say only
    // `keep-alive` or `close` (every nginx and Node answer): those name no
    // field but `Keep-Alive`, which goes with the others below, so no
    // token needs a removal of its own, and the field goes through the one
    // lookup that found it.
    let mut named = false;
    if present & 1 != 0 {
        let mut values = Vec::new();
        if let http::header::Entry::Occupied(entry) = headers.entry(CONNECTION) {
            named = !entry.iter().all(names_only_hop_by_hop);
            if named {
                // Values are reference-counted: holding them costs no
                // copy, and frees the map to change while their tokens are
                // read. `Connection` itself goes with the others below.
                values.extend(entry.iter().cloned());
            } else {
                drop(entry.remove_entry_mult());
                present &= !1;
            }
        }
        for value in &values {
            for token in list(value.as_bytes()) {
                // Looked up by `&str`, a token needs no `HeaderName` of its
                // own; one that is no valid name matches nothing.
                if let Ok(token) = std::str::from_utf8(token) {
                    headers.remove(token);
                }
            }
        }
    }
    for (i, &name) in HOP_BY_HOP.iter().enumerate() {
        if present & (1 << i) != 0 {
            headers.remove(name);
        }
    }
    named
}

/// The position of `name`, whose text is `text`, in [`HOP_BY_HOP`], if
/// it is one. Told by its length first: most names of a message are of no
/// hop-by-hop length, and the rest are compared with one or two names
/// instead of ten.
pub(super) fn hop_by_hop_at(name: &HeaderName, text: &str) -> Option<usize> {
    let candidates: &[usize] = match text.len() {
        2 => &[5],
        7 => &[6, 8],
        10 => &[0, 1],
        14 => &[9],
        16 => &[2],
        17 => &[7],
        18 => &[3],
        19 => &[4],
        _ => return None,
    };
    // Compared as names: a standard name against another is one byte
    // against another, where their text would be a `memcmp` call.
    candidates.iter().copied().find(|&i| HOP_BY_HOP[i] == name)
}

/// Whether every token of a `Connection` value is `keep-alive` or `close`.
fn names_only_hop_by_hop(value: &HeaderValue) -> bool {
    let value = value.as_bytes();
    // The usual value is one of the two alone, as servers write it (an
    // exact compare is a few instructions, a case-blind one a few a
    // byte), where the list's split and trims cost about two hundred.
    if matches!(value, b"keep-alive" | b"close")
        || value.eq_ignore_ascii_case(b"keep-alive")
        || value.eq_ignore_ascii_case(b"close")
    {
        return true;
    }
    list(value).all(|token| {
        token.eq_ignore_ascii_case(b"keep-alive") || token.eq_ignore_ascii_case(b"close")
    })
}

/// Address claims: from a trusted proxy they are passed on as it wrote
/// them, and `Forwarded` gets this hop's element appended (RFC 7239 §4).
/// From anyone else they are the client's own word: `X-Real-IP` is
/// overwritten with the peer's address (what nginx's `proxy_set_header
/// X-Real-IP $remote_addr` sends), and `Forwarded` and every field of
/// [`REMOVED_CLAIMS`] are removed. Only requests that carry one pay for
/// this.
fn rewrite_claims(headers: &mut HeaderMap, forwarded: &Forwarded) {
    let peer = forwarded.peer_value.as_bytes();
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
        headers.insert(&X_REAL_IP, forwarded.peer_value.clone());
    }
    for name in &REMOVED_CLAIMS {
        headers.remove(name);
    }
    headers.remove(FORWARDED);
}

/// The client's own `X-Forwarded-For` is its claim: forwarded, not
/// believed (the subject resolver decides whom to believe). The peer is
/// appended to it as one list so upstreams reading a single field see it.
/// `present`: the request carried one (false: it has none now; true: it
/// may, and joining none gives the peer alone). `peer`: the peer's
/// [`peer_value`].
fn append_forwarded_for(headers: &mut HeaderMap, peer: &HeaderValue, present: bool) {
    if !present {
        // The usual case: the peer alone, the connection's own value.
        headers.insert(&X_FORWARDED_FOR, peer.clone());
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
    joined.extend_from_slice(peer.as_bytes());
    // Unreachable in practice (both parts were valid header text); the
    // peer alone is still the truth.
    let value = HeaderValue::from_bytes(&joined).unwrap_or_else(|_| peer.clone());
    headers.insert(&X_FORWARDED_FOR, value);
}

/// The longest address text: an IPv6 address ending in dotted IPv4
/// (`ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255`).
pub(super) const IP_TEXT_MAX: usize = 45;

/// `ip` as `Display` writes it, into `buf`. IPv4 digits are written
/// directly: the formatting machinery costs more than the rest of the
/// header work of a request.
pub(super) fn ip_text(ip: IpAddr, buf: &mut [u8; IP_TEXT_MAX]) -> &[u8] {
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
