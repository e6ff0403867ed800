//! A Redis Cluster's slot map: which primary serves each hash slot, the
//! connection held to each, and the redirects a node answers with when a
//! slot is served elsewhere.

use std::sync::Arc;

use redis::Value;
use tokio::time::Instant;

use super::super::wire::{Frame, Held, Wire};
use super::Addr;

/// Hash slots in a cluster.
pub(super) const SLOTS: usize = 16384;
/// A slot no node serves (in the map as read).
pub(super) const NO_NODE: u16 = u16::MAX;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part
/// between the first `{` and the next `}`, when not empty) or of the key.
pub fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS as u16
}

/// A redirect a node answered with.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Redirect {
    Moved { slot: u16, addr: Option<Addr> },
    Ask { slot: u16, addr: Option<Addr> },
}

impl Redirect {
    /// `-MOVED <slot> <host>:<port>` or `-ASK …`; the address `None`
    /// when the node did not know its own host (`:<port>`, the node
    /// answering).
    pub(super) fn of(frame: &Frame) -> Option<Redirect> {
        let Held::Bytes(bytes) = frame.held() else {
            return None;
        };
        let line = bytes.strip_prefix(b"-")?.strip_suffix(b"\r\n")?;
        let line = std::str::from_utf8(line).ok()?;
        let mut words = line.split(' ');
        let kind = words.next()?;
        let slot: u16 = words.next()?.parse().ok()?;
        if usize::from(slot) >= SLOTS {
            return None;
        }
        let (host, port) = words.next()?.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let addr = (!host.is_empty()).then(|| Addr {
            host: host.to_owned(),
            port,
        });
        match kind {
            "MOVED" => Some(Redirect::Moved { slot, addr }),
            "ASK" => Some(Redirect::Ask { slot, addr }),
            _ => None,
        }
    }
}

/// Which primary serves each slot, and each primary's connection.
pub(super) struct Map {
    /// Per slot, the index of its node in `nodes` ([`NO_NODE`]: none).
    pub(super) slots: Box<[u16]>,
    pub(super) nodes: Vec<Node>,
    /// A node was unreachable or a slot moved: read the map again.
    pub(super) stale: bool,
    /// When the map was last read (or a read was tried).
    pub(super) read: Instant,
}

pub(super) struct Node {
    pub(super) addr: Addr,
    /// The map as read says it serves slots (one learnt from a redirect
    /// alone serves those it was named for).
    pub(super) serves: bool,
    pub(super) wire: Option<Wire>,
    /// Held by the request opening `wire`.
    pub(super) opening: Arc<tokio::sync::Mutex<()>>,
    /// When opening it last failed.
    pub(super) failed: Option<Instant>,
}

impl Map {
    /// The map in a `CLUSTER SLOTS` reply (RESP2): per range, its first
    /// and last slot and its primary's host and port (replicas after it
    /// are not used). A primary whose host is empty is the node that
    /// answered (`asked`).
    pub(super) fn parse(reply: &Value, asked: &Addr) -> Option<Map> {
        let Value::Array(ranges) = reply else {
            return None;
        };
        let mut map = Map {
            slots: vec![NO_NODE; SLOTS].into_boxed_slice(),
            nodes: Vec::new(),
            stale: false,
            read: Instant::now(),
        };
        for range in ranges {
            let Value::Array(fields) = range else {
                return None;
            };
            let [Value::Int(first), Value::Int(last), Value::Array(primary), ..] = &fields[..]
            else {
                return None;
            };
            let [host, Value::Int(port), ..] = &primary[..] else {
                return None;
            };
            let host = match host {
                Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok()?,
                Value::SimpleString(text) => text.clone(),
                _ => return None,
            };
            let addr = Addr {
                host: if host.is_empty() || host == "?" {
                    asked.host.clone()
                } else {
                    host
                },
                port: u16::try_from(*port).ok()?,
            };
            let (first, last) = (usize::try_from(*first).ok()?, usize::try_from(*last).ok()?);
            if first > last || last >= SLOTS {
                return None;
            }
            let index = map.index_of(&addr);
            map.nodes[usize::from(index)].serves = true;
            map.slots[first..=last].fill(index);
        }
        Some(map)
    }

    /// `addr`'s index, added (serving nothing yet) when new.
    pub(super) fn index_of(&mut self, addr: &Addr) -> u16 {
        if let Some(i) = self.nodes.iter().position(|n| &n.addr == addr) {
            return i as u16;
        }
        self.nodes.push(Node {
            addr: addr.clone(),
            serves: false,
            wire: None,
            opening: Arc::default(),
            failed: None,
        });
        (self.nodes.len() - 1) as u16
    }

    /// A node for a command of no key: one connected already if any.
    pub(super) fn any(&self) -> u16 {
        let connected = self
            .nodes
            .iter()
            .position(|n| n.serves && n.wire.as_ref().is_some_and(|w| !w.is_closed()));
        let serving = self.nodes.iter().position(|n| n.serves);
        connected.or(serving).map_or(NO_NODE, |i| i as u16)
    }

    /// Takes `fresh`'s slots and nodes, keeping the connections (and
    /// what opening them met) of nodes still in it.
    pub(super) fn replace(&mut self, mut fresh: Map) {
        for node in &mut fresh.nodes {
            if let Some(old) = self.nodes.iter_mut().find(|old| old.addr == node.addr) {
                node.opening = old.opening.clone();
                node.failed = old.failed;
                if node.wire.is_none() {
                    node.wire = old.wire.take();
                }
            }
        }
        fresh.read = self.read;
        *self = fresh;
    }
}
