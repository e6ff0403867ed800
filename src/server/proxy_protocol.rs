//! The PROXY protocol header (HAProxy's `proxy-protocol.txt`, versions 1
//! and 2): what an L4 load balancer (AWS NLB, HAProxy, many others) puts
//! before a connection's first byte to say whose connection it carries.
//!
//! [`parse`] reads the start of a connection and says whether the bytes so
//! far are a header, are not one, or need more. It never reads past the
//! header and never needs more than [`MAX_HEADER`] bytes to decide, so the
//! listener's buffer is bounded whatever a peer sends. Which peers may send
//! a header, and what happens to a connection whose header is refused, is
//! the listener's (`listener`): only `identity.trusted_proxies` are read.
//!
//! The two versions cannot be taken for HTTP, or for each other: version 1
//! begins `PROXY ` (no HTTP method is spelled so, and nothing follows it
//! but a protocol name), version 2 with a 12-byte signature holding a NUL
//! and `QUIT`. So a trusted peer that sends no header (an ingress
//! controller beside the load balancer) is told apart from one that does
//! by the first byte that differs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Version 1's opening: `PROXY` and a space.
const V1_PREFIX: &[u8] = b"PROXY ";
/// A version 1 header is at most 107 bytes, CRLF included (spec §2.1).
pub const MAX_V1: usize = 107;
/// Version 2's signature (spec §2.2).
const V2_SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Signature, version and command, family and protocol, length.
const V2_FIXED: usize = 16;
/// The largest version 2 header accepted: the addresses and room for the
/// TLVs load balancers add (AWS's VPC endpoint, Azure's link id, GCP's
/// connection id, a TLS summary), far below the 64 KiB the length field
/// allows, so a peer cannot make a connection hold a large buffer.
pub const MAX_HEADER: usize = 4096;

/// What the bytes a connection began with are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A prefix of a header (or of a signature): read more.
    Incomplete,
    /// Not a header: the bytes are the client's own, for HTTP.
    Absent,
    /// A whole header of `len` bytes. `source` is the client it carries;
    /// `None` for a header that carries no address (version 1's `UNKNOWN`,
    /// version 2's `LOCAL` command, an unspecified or Unix family), where
    /// the connection's own peer stands.
    Header {
        version: Version,
        len: usize,
        source: Option<SocketAddr>,
    },
    /// A header that breaks the format: the connection is closed.
    Invalid(Invalid),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// Why a header is refused; the `reason` label of
/// `sluice_proxy_protocol_rejected_total` (with `version`, a header of a
/// version `server.proxy_protocol` does not list, and `timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("malformed PROXY protocol header")]
    Malformed,
    #[error("PROXY protocol header longer than {MAX_HEADER} bytes")]
    TooLong,
}

/// Reads the start of a connection. `bytes` is everything received so
/// far; more bytes can only turn [`Parsed::Incomplete`] into something
/// else.
pub fn parse(bytes: &[u8]) -> Parsed {
    match bytes.first() {
        None => Parsed::Incomplete,
        Some(b'P') => v1(bytes),
        Some(b'\r') => v2(bytes),
        Some(_) => Parsed::Absent,
    }
}

fn v1(bytes: &[u8]) -> Parsed {
    let opening = bytes.len().min(V1_PREFIX.len());
    if bytes[..opening] != V1_PREFIX[..opening] {
        return Parsed::Absent;
    }
    // Only the first MAX_V1 bytes can hold the header, and only they are
    // looked at: what a header is cannot depend on what follows it.
    let window = &bytes[..bytes.len().min(MAX_V1)];
    let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
        // A CR may yet be followed by its LF; any other byte that is not
        // printable ASCII cannot become a header by waiting.
        let settled = window.strip_suffix(b"\r").unwrap_or(window);
        return if !settled.iter().all(|&b| printable(b)) {
            Parsed::Invalid(Invalid::Malformed)
        } else if window.len() == MAX_V1 {
            Parsed::Invalid(Invalid::TooLong)
        } else {
            Parsed::Incomplete
        };
    };
    let line = &window[V1_PREFIX.len()..end];
    if !line.iter().all(|&b| printable(b)) {
        return Parsed::Invalid(Invalid::Malformed);
    }
    match v1_line(line) {
        Some(source) => Parsed::Header {
            version: Version::V1,
            len: end + 2,
            source,
        },
        None => Parsed::Invalid(Invalid::Malformed),
    }
}

fn printable(b: u8) -> bool {
    (b' '..=b'~').contains(&b)
}

/// `TCP4 <src> <dst> <sport> <dport>`, `TCP6 …`, or `UNKNOWN` with
/// anything after it; single spaces, nothing else.
fn v1_line(line: &[u8]) -> Option<Option<SocketAddr>> {
    let line = std::str::from_utf8(line).ok()?;
    if line == "UNKNOWN" || line.starts_with("UNKNOWN ") {
        return Some(None);
    }
    let mut fields = line.split(' ');
    let family = fields.next()?;
    let (source, destination, source_port, destination_port) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    if fields.next().is_some() {
        return None;
    }
    let address = |text: &str| -> Option<IpAddr> {
        match family {
            "TCP4" => text.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
            "TCP6" => text.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
            _ => None,
        }
    };
    let ip = address(source)?;
    address(destination)?;
    let port = v1_port(source_port)?;
    v1_port(destination_port)?;
    Some(Some(SocketAddr::new(ip, port)))
}

/// A decimal port, 0 to 65535, no sign and no leading zero.
fn v1_port(text: &str) -> Option<u16> {
    let digits = !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit());
    if !digits || (text.len() > 1 && text.starts_with('0')) {
        return None;
    }
    text.parse().ok()
}

fn v2(bytes: &[u8]) -> Parsed {
    let signed = bytes.len().min(V2_SIGNATURE.len());
    if bytes[..signed] != V2_SIGNATURE[..signed] {
        return Parsed::Absent;
    }
    if bytes.len() < V2_FIXED {
        return Parsed::Incomplete;
    }
    let (version, command) = (bytes[12] >> 4, bytes[12] & 0x0F);
    let (family, protocol) = (bytes[13] >> 4, bytes[13] & 0x0F);
    let body = usize::from(u16::from_be_bytes([bytes[14], bytes[15]]));
    let len = V2_FIXED + body;
    // LOCAL discards the address block, family byte included (any value);
    // PROXY names one of the listed family and protocol pairs.
    let listed = matches!(bytes[13], 0x00 | 0x11 | 0x12 | 0x21 | 0x22 | 0x31 | 0x32);
    if version != 2 || command > 1 || (command == 1 && !listed) {
        return Parsed::Invalid(Invalid::Malformed);
    }
    if len > MAX_HEADER {
        return Parsed::Invalid(Invalid::TooLong);
    }
    if bytes.len() < len {
        return Parsed::Incomplete;
    }
    let addresses = &bytes[V2_FIXED..len];
    let header = |source| Parsed::Header {
        version: Version::V2,
        len,
        source,
    };
    // LOCAL: the balancer's own connection (a health check); the address
    // block, if any, is skipped.
    if command == 0 {
        return header(None);
    }
    // A datagram is no connection to serve.
    if protocol == 2 {
        return Parsed::Invalid(Invalid::Malformed);
    }
    match family {
        // AF_INET: source, destination, source port, destination port.
        1 => match addresses.get(..12) {
            Some(a) => {
                let ip = Ipv4Addr::new(a[0], a[1], a[2], a[3]);
                let port = u16::from_be_bytes([a[8], a[9]]);
                header(Some(SocketAddr::new(IpAddr::V4(ip), port)))
            }
            None => Parsed::Invalid(Invalid::Malformed),
        },
        // AF_INET6.
        2 => match addresses.get(..36) {
            Some(a) => {
                let mut ip = [0; 16];
                ip.copy_from_slice(&a[..16]);
                let port = u16::from_be_bytes([a[32], a[33]]);
                header(Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)))
            }
            None => Parsed::Invalid(Invalid::Malformed),
        },
        // AF_UNSPEC, AF_UNIX: no address sluice could use.
        _ => header(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(bytes: &[u8]) -> (Version, usize, Option<SocketAddr>) {
        match parse(bytes) {
            Parsed::Header {
                version,
                len,
                source,
            } => (version, len, source),
            other => panic!("{bytes:?}: {other:?}"),
        }
    }

    fn v2_header(command: u8, family: u8, addresses: &[u8]) -> Vec<u8> {
        let mut bytes = V2_SIGNATURE.to_vec();
        bytes.push(0x20 | command);
        bytes.push(family);
        bytes.extend_from_slice(&u16::try_from(addresses.len()).unwrap().to_be_bytes());
        bytes.extend_from_slice(addresses);
        bytes
    }

    #[test]
    fn version_one_carries_the_client_and_ends_at_its_crlf() {
        let line = b"PROXY TCP4 203.0.113.7 10.0.0.5 51234 8080\r\nGET / HTTP/1.1\r\n";
        let (version, len, source) = header(line);
        assert_eq!(version, Version::V1);
        assert_eq!(&line[len..len + 3], b"GET");
        assert_eq!(source, Some("203.0.113.7:51234".parse().unwrap()));

        let six = b"PROXY TCP6 2001:db8::1 2001:db8::2 443 8080\r\n";
        assert_eq!(header(six).2, Some("[2001:db8::1]:443".parse().unwrap()));
        assert_eq!(header(b"PROXY UNKNOWN\r\n").2, None);
        assert_eq!(header(b"PROXY UNKNOWN ffff::1 ffff::2 1 2\r\n").2, None);
    }

    #[test]
    fn version_one_is_read_to_the_byte_and_nothing_else_passes() {
        let line = b"PROXY TCP4 203.0.113.7 10.0.0.5 51234 8080\r\n";
        for end in 0..line.len() {
            assert_eq!(parse(&line[..end]), Parsed::Incomplete, "{end}");
        }
        for bad in [
            &b"PROXY TCP4 203.0.113.7 10.0.0.5 51234\r\n"[..],
            b"PROXY TCP4 203.0.113.7 10.0.0.5 51234 8080 9\r\n",
            b"PROXY TCP4 2001:db8::1 10.0.0.5 1 2\r\n",
            b"PROXY TCP6 203.0.113.7 2001:db8::2 1 2\r\n",
            b"PROXY TCP4 203.0.113.7  10.0.0.5 1 2\r\n",
            b"PROXY TCP4 203.0.113.7 10.0.0.5 65536 2\r\n",
            b"PROXY TCP4 203.0.113.7 10.0.0.5 01 2\r\n",
            b"PROXY TCP4 203.0.113.7 10.0.0.5 +1 2\r\n",
            b"PROXY UDP4 203.0.113.7 10.0.0.5 1 2\r\n",
            b"PROXY TCP4 203.0.113.7 10.0.0.5 1 2\n",
            b"PROXY \x00",
        ] {
            assert!(
                matches!(parse(bad), Parsed::Invalid(_)),
                "{:?}: {:?}",
                String::from_utf8_lossy(bad),
                parse(bad)
            );
        }
        let long = [b"PROXY UNKNOWN ".as_slice(), &[b'a'; 100]].concat();
        assert_eq!(parse(&long), Parsed::Invalid(Invalid::TooLong));
    }

    #[test]
    fn http_is_told_apart_at_the_first_byte_that_differs() {
        for plain in [
            &b"GET / HTTP/1.1\r\n"[..],
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            b"POST",
            b"PROXZ",
            b"PUT /",
            b"\r\nGET",
            b"\x16\x03\x01",
        ] {
            assert_eq!(parse(plain), Parsed::Absent, "{plain:?}");
        }
        assert_eq!(parse(b"P"), Parsed::Incomplete);
        assert_eq!(parse(b"PROXY"), Parsed::Incomplete);
        assert_eq!(parse(b"\r\n\r\n\0\r\nQU"), Parsed::Incomplete);
    }

    #[test]
    fn version_two_carries_ipv4_and_ipv6_clients_past_its_tlvs() {
        let mut inet = vec![198, 51, 100, 9, 10, 0, 0, 5, 0xC8, 0x01, 0x1F, 0x90];
        // A TLV (AWS's VPC endpoint id) after the addresses.
        inet.extend_from_slice(&[0xEA, 0x00, 0x04, 0x01, b'v', b'p', b'c']);
        let mut bytes = v2_header(1, 0x11, &inet);
        let len = bytes.len();
        bytes.extend_from_slice(b"GET / HTTP/1.1\r\n");
        assert_eq!(
            header(&bytes),
            (
                Version::V2,
                len,
                Some("198.51.100.9:51201".parse().unwrap())
            )
        );
        for end in 0..len {
            assert_eq!(parse(&bytes[..end]), Parsed::Incomplete, "{end}");
        }

        let mut inet6 = Vec::new();
        inet6.extend_from_slice(&"2001:db8::7".parse::<Ipv6Addr>().unwrap().octets());
        inet6.extend_from_slice(&"2001:db8::1".parse::<Ipv6Addr>().unwrap().octets());
        inet6.extend_from_slice(&[0x01, 0xBB, 0x1F, 0x90]);
        assert_eq!(
            header(&v2_header(1, 0x21, &inet6)).2,
            Some("[2001:db8::7]:443".parse().unwrap())
        );
    }

    #[test]
    fn version_two_without_an_address_keeps_the_peer() {
        // LOCAL, with or without an address block, whatever its family
        // byte says: a health check.
        assert_eq!(header(&v2_header(0, 0x00, &[])).2, None);
        assert_eq!(header(&v2_header(0, 0x11, &[1; 12])).2, None);
        assert_eq!(header(&v2_header(0, 0x45, &[])).2, None);
        // UNSPEC and UNIX families.
        assert_eq!(header(&v2_header(1, 0x00, &[])).2, None);
        assert_eq!(header(&v2_header(1, 0x31, &[0; 216])).2, None);
    }

    #[test]
    fn version_two_refuses_what_breaks_the_format() {
        // Too short for its family's addresses.
        assert!(matches!(
            parse(&v2_header(1, 0x11, &[1; 11])),
            Parsed::Invalid(Invalid::Malformed)
        ));
        assert!(matches!(
            parse(&v2_header(1, 0x21, &[1; 35])),
            Parsed::Invalid(Invalid::Malformed)
        ));
        // Datagrams, unknown commands, families, pairs and versions.
        for (byte, value) in [
            (13, 0x12),
            (12, 0x22),
            (13, 0x41),
            (13, 0x10),
            (13, 0x01),
            (13, 0x30),
            (12, 0x11),
        ] {
            let mut bytes = v2_header(1, 0x11, &[1; 12]);
            bytes[byte] = value;
            assert_eq!(
                parse(&bytes),
                Parsed::Invalid(Invalid::Malformed),
                "byte {byte} = {value:#x}"
            );
        }
        // A length beyond the bound is refused from the fixed part alone,
        // before any of it is read.
        let mut big = v2_header(1, 0x11, &[]);
        big[14..16].copy_from_slice(&u16::try_from(MAX_HEADER).unwrap().to_be_bytes());
        assert_eq!(parse(&big), Parsed::Invalid(Invalid::TooLong));
        let mut largest = v2_header(1, 0x11, &vec![0; MAX_HEADER - V2_FIXED]);
        assert!(matches!(parse(&largest), Parsed::Header { .. }));
        largest.truncate(V2_FIXED);
        assert_eq!(parse(&largest), Parsed::Incomplete);
    }
}
