//! Connections open per client address.
//!
//! `server.max_connections` is one pool for everyone: a single client that
//! opens connections and sends nothing (or trickles a head in under
//! `header_read_timeout`, then reconnects) refuses everyone else. So each
//! address may hold at most `server.max_connections_per_ip` of them. An
//! IPv6 client owns a whole /64 and may pick any address in it, so IPv6
//! peers are counted per /64. The peer is the TCP peer (behind a proxy,
//! the proxy, whose own connections carry many clients), or the client a
//! trusted peer's PROXY protocol header names, once it is read; until
//! then such a connection is counted under the TCP peer in a table of its
//! own, so a trusted host that connects and says nothing is bounded too.

use crate::sync;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

/// The connections each address holds, bounded by `limit`.
pub struct PerPeer {
    limit: usize,
    open: Mutex<HashMap<IpAddr, Peer>>,
}

/// One address's connections, and the request-head bytes they hold
/// (`heads`).
struct Peer {
    connections: usize,
    heads: Arc<AtomicUsize>,
}

/// One connection's place; given back when dropped, however the
/// connection ends.
pub struct Held {
    table: Arc<PerPeer>,
    peer: IpAddr,
    heads: Arc<AtomicUsize>,
}

impl PerPeer {
    pub fn new(limit: usize) -> Arc<PerPeer> {
        Arc::new(PerPeer {
            limit,
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for a connection from `peer`, or `None` when that address
    /// holds `limit` already.
    pub fn try_hold(self: &Arc<Self>, peer: IpAddr) -> Option<Held> {
        let peer = group(peer);
        let mut open = self.lock();
        let entry = open.entry(peer).or_insert_with(|| Peer {
            connections: 0,
            heads: Arc::default(),
        });
        if entry.connections >= self.limit {
            return None;
        }
        entry.connections += 1;
        Some(Held {
            table: self.clone(),
            peer,
            heads: entry.heads.clone(),
        })
    }

    /// Addresses holding a connection (for tests).
    #[cfg(test)]
    fn peers(&self) -> usize {
        self.lock().len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Peer>> {
        // Counts are whole at every step: a panic elsewhere leaves them
        // consistent.
        sync::lock(&self.open)
    }
}

impl Held {
    /// Request-head bytes held by every connection of this address
    /// (`heads`, the budget's per-client share).
    pub fn heads(&self) -> &AtomicUsize {
        &self.heads
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut open = self.table.lock();
        if let Some(entry) = open.get_mut(&self.peer) {
            entry.connections -= 1;
            let count = entry.connections;
            // Gone with its last connection: the table holds only
            // addresses with connections open, never more entries than
            // `max_connections`.
            if count == 0 {
                open.remove(&self.peer);
            }
        }
    }
}

/// IPv4 (and IPv4-mapped IPv6) as the address; other IPv6 per /64.
fn group(peer: IpAddr) -> IpAddr {
    match peer {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & (u128::MAX << 64))),
        },
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn each_address_holds_at_most_the_limit_and_gets_places_back() {
        let table = PerPeer::new(2);
        let a1 = table.try_hold(ip("10.0.0.1")).expect("first");
        let a2 = table.try_hold(ip("10.0.0.1")).expect("second");
        assert!(table.try_hold(ip("10.0.0.1")).is_none());
        // Another address is not affected.
        let b = table.try_hold(ip("10.0.0.2")).expect("another address");
        drop(a1);
        let a3 = table
            .try_hold(ip("::ffff:10.0.0.1"))
            .expect("a place came back");
        assert!(table.try_hold(ip("10.0.0.1")).is_none());
        drop((a2, a3, b));
        assert_eq!(
            table.peers(),
            0,
            "addresses leave with their last connection"
        );
    }

    #[test]
    fn an_ipv6_client_is_its_slash_64() {
        let table = PerPeer::new(1);
        let _held = table.try_hold(ip("2001:db8:1:2::1")).expect("first");
        assert!(table.try_hold(ip("2001:db8:1:2:ffff::9")).is_none());
        assert!(table.try_hold(ip("2001:db8:1:3::1")).is_some());
    }
}
