//! A route's rules on the client address, as sluice resolved it (the
//! peer, the client a trusted PROXY protocol header names, or behind
//! `identity.trusted_proxies` the right-most untrusted `X-Forwarded-For`
//! entry): `deny` answers 403 before any limit, `exempt` skips limits.
//! Nothing here reads a header the client can set.

use std::net::IpAddr;

use ipnet::IpNet;

/// `deny` and `exempt` of one route. Empty (the default) for a route
/// that writes neither: the request path then never resolves the client
/// address for them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Addresses {
    /// Requests from these networks are answered 403, before anything
    /// else of the route is looked at.
    pub deny: Box<[IpNet]>,
    /// Parallel to the route's limits: the networks whose requests skip
    /// that limit (the route's `exempt` and the limit's own). Empty when
    /// no limit of the route exempts anyone.
    pub exempt: Box<[Box<[IpNet]>]>,
}

impl Addresses {
    /// Whether the route reads the client address at all.
    pub fn is_empty(&self) -> bool {
        self.deny.is_empty() && self.exempt.iter().all(|e| e.is_empty())
    }

    /// Whether requests from `client` are answered 403.
    pub fn denies(&self, client: IpAddr) -> bool {
        within(&self.deny, client)
    }

    /// Whether requests from `client` skip the route's limit `limit`.
    pub fn exempts(&self, limit: usize, client: IpAddr) -> bool {
        self.exempt
            .get(limit)
            .is_some_and(|networks| within(networks, client))
    }

    /// The networks exempt from the route's limit `limit`.
    pub fn exempt_from(&self, limit: usize) -> &[IpNet] {
        self.exempt.get(limit).map_or(&[], |n| n)
    }
}

/// A plain scan: these lists are written by hand and short; an address
/// is compared as the canonical form [`crate::subject::client_ip`] gives
/// (an IPv4-mapped IPv6 peer is its IPv4 address).
fn within(networks: &[IpNet], client: IpAddr) -> bool {
    networks.iter().any(|net| net.contains(&client))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Box<[IpNet]> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    #[test]
    fn deny_and_exempt_match_by_network() {
        let addresses = Addresses {
            deny: nets(&["203.0.113.0/24"]),
            exempt: vec![nets(&["10.0.0.0/8", "2001:db8::/32"]), nets(&[])].into(),
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert!(addresses.denies(ip("203.0.113.9")));
        assert!(!addresses.denies(ip("203.0.114.9")));
        assert!(addresses.exempts(0, ip("10.1.2.3")));
        assert!(addresses.exempts(0, ip("2001:db8::1")));
        assert!(!addresses.exempts(1, ip("10.1.2.3")));
        assert!(!addresses.exempts(2, ip("10.1.2.3")));
        assert!(!addresses.exempts(0, ip("11.1.2.3")));
        assert!(!addresses.is_empty());
        assert!(Addresses::default().is_empty());
    }
}
