//! Connections open per client address.
//!
//! `server.max_connections` is one pool for everyone: a single client that
//! opens connections and sends nothing (or trickles a head in under
//! `header_read_timeout`, then reconnects) refuses everyone else. So each
//! address may hold at most `server.max_connections_per_ip` of them, few
//! enough that a handful of addresses cannot fill the pool.
//!
//! An IPv6 client owns a whole /64 and may pick any address in it, so IPv6
//! peers are counted per /64. A home customer is usually given a /56 (256
//! /64s), so one such customer could otherwise take 256 shares: each /56
//! is also bounded as a whole, by [`Limits::per_56`].
//!
//! The peer counted is the TCP peer, or the client a trusted peer's PROXY
//! protocol header names, once it is read; until then such a connection
//! is counted under the TCP peer in a table of its own, so a trusted host
//! that connects and says nothing is bounded too. A trusted peer's
//! connection that names no client (it forwards `X-Forwarded-For`) carries
//! many clients and is not counted per address at all
//! ([`Held::uncounted`]).

use crate::sync;
use crate::telemetry;
use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

/// How many connections one address, and one IPv6 /56, may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// One IPv4 address, one IPv6 /64.
    pub per_address: usize,
    /// Every /64 of one IPv6 /56 together.
    pub per_56: usize,
}

impl Limits {
    /// A /56 may hold this many times a /64's share: a household's few
    /// devices on a handful of its /64s get what they need, while one
    /// customer spreading over all 256 of them gets four shares, not 256.
    pub const PER_56_SHARES: usize = 4;

    /// The limits of a pool of `pool` connections in which one address may
    /// hold `per_address`: a /56 holds [`Self::PER_56_SHARES`] times that,
    /// at most the pool.
    pub fn of_pool(pool: usize, per_address: usize) -> Limits {
        Limits {
            per_address,
            per_56: per_address
                .saturating_mul(Self::PER_56_SHARES)
                .min(pool)
                .max(per_address),
        }
    }
}

/// Which bound refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Its address (IPv6: its /64) holds `per_address` already.
    Address,
    /// Its IPv6 /56 holds `per_56` already.
    Prefix56,
}

impl Refused {
    /// The `limit` label of `sluice_connections_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refused::Address => "max_connections_per_ip",
            Refused::Prefix56 => "max_connections_per_ipv6_56",
        }
    }
}

/// `sluice_connections_refused_total` for each bound of the table.
pub struct Refusals {
    address: metrics::Counter,
    prefix_56: metrics::Counter,
}

impl Refusals {
    pub fn new() -> Refusals {
        let counter = |refused: Refused| metrics::counter!(telemetry::CONNECTIONS_REFUSED, "limit" => refused.label());
        Refusals {
            address: counter(Refused::Address),
            prefix_56: counter(Refused::Prefix56),
        }
    }

    pub fn count(&self, refused: Refused) {
        match refused {
            Refused::Address => self.address.increment(1),
            Refused::Prefix56 => self.prefix_56.increment(1),
        }
    }
}

/// The connections each address holds, bounded by `limits`.
pub struct PerPeer {
    limits: Limits,
    open: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    /// By IPv4 address or IPv6 /64.
    addresses: HashMap<IpAddr, Peer>,
    /// Connections of each IPv6 /56 (its first 56 bits).
    prefixes: HashMap<u64, usize>,
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
    /// The table and the address it counts under; `None` when uncounted.
    place: Option<(Arc<PerPeer>, IpAddr)>,
    heads: Arc<AtomicUsize>,
}

impl PerPeer {
    pub fn new(limits: Limits) -> Arc<PerPeer> {
        Arc::new(PerPeer {
            limits,
            open: Mutex::new(Table::default()),
        })
    }

    /// A place for a connection from `peer`, or which bound refuses it.
    pub fn try_hold(self: &Arc<Self>, peer: IpAddr) -> Result<Held, Refused> {
        let address = group(peer);
        let prefix = prefix_56(address);
        let mut open = self.lock();
        let connections = open.addresses.get(&address).map_or(0, |p| p.connections);
        if connections >= self.limits.per_address {
            return Err(Refused::Address);
        }
        if let Some(prefix) = prefix {
            if open.prefixes.get(&prefix).copied().unwrap_or(0) >= self.limits.per_56 {
                return Err(Refused::Prefix56);
            }
            *open.prefixes.entry(prefix).or_insert(0) += 1;
        }
        let entry = open.addresses.entry(address).or_insert_with(|| Peer {
            connections: 0,
            heads: Arc::default(),
        });
        entry.connections += 1;
        Ok(Held {
            heads: entry.heads.clone(),
            place: Some((self.clone(), address)),
        })
    }

    /// Addresses and /56s holding a connection (for tests).
    #[cfg(test)]
    fn entries(&self) -> (usize, usize) {
        let open = self.lock();
        (open.addresses.len(), open.prefixes.len())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        // Counts are whole at every step: a panic elsewhere leaves them
        // consistent.
        sync::lock(&self.open)
    }
}

impl Held {
    /// A place counted under no address: a trusted peer's connection that
    /// carries many clients. Its request heads are a client of their own
    /// in the budget, bounded by `per_connection` and `total`.
    pub fn uncounted() -> Held {
        Held {
            place: None,
            heads: Arc::default(),
        }
    }

    /// Request-head bytes held by every connection of this address
    /// (`heads`, the budget's per-client share).
    pub fn heads(&self) -> &AtomicUsize {
        &self.heads
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some((table, address)) = &self.place else {
            return;
        };
        let mut open = table.lock();
        // Each goes with its last connection: the table holds only
        // addresses with connections open, never more entries than
        // `max_connections`.
        if let Some(entry) = open.addresses.get_mut(address) {
            entry.connections -= 1;
            if entry.connections == 0 {
                open.addresses.remove(address);
            }
        }
        if let Some(prefix) = prefix_56(*address) {
            if let Some(count) = open.prefixes.get_mut(&prefix) {
                *count -= 1;
                if *count == 0 {
                    open.prefixes.remove(&prefix);
                }
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

/// The /56 of a grouped IPv6 address (its first 56 bits); none for IPv4.
fn prefix_56(address: IpAddr) -> Option<u64> {
    match address {
        IpAddr::V6(v6) => u64::try_from(u128::from(v6) >> 72).ok(),
        IpAddr::V4(_) => None,
    }
}

#[cfg(test)]
mod tests;
