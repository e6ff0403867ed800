//! sluice's own connection to a Redis Cluster: one [`Wire`] to each
//! primary, opened on first use, and the slot map a node answered
//! `CLUSTER SLOTS` with.
//!
//! A decision is one `FCALL` to the primary of its key's slot. Through
//! redis-rs's cluster client it went through two tasks of that client (its
//! router, then the node's connection) and came back as a `Value` tree:
//! about 22,000 instructions a decision more than on one node (callgrind,
//! `bench/profile.py --only cluster`). Here it is packed once into that
//! node's connection, as on a standalone node.
//!
//! - `MOVED <slot> <host:port>`: the slot is served elsewhere now (a
//!   resharding, a failover); the map learns it, asks the cluster for the
//!   whole map again soon, and the command goes to the new node.
//! - `ASK <slot> <host:port>`: the key is being moved; the command goes
//!   to that node once, right after `ASKING`.
//!
//! A node that answered either did not run the command, so following them
//! never charges twice, and every send of a decision is a first send (the
//! script need not look for a record a fresh id cannot have). At most
//! [`REDIRECTS`] are followed; the last is the caller's error (refused,
//! nothing ran). A node that cannot be reached fails the command unsent
//! (`ClusterConnectionNotFound`) and has the map read again, at most once
//! every [`REFRESH_EVERY`]; a connection lost with commands on it fails
//! them as on one node (sent, no reply), and the lane connects afresh,
//! reading the map from any node it has heard of.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisConnectionInfo, RedisError, RedisFuture};
use redis::{RedisResult, Value};
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

use super::connect::CONNECT_TIMEOUT;
use super::packed::Packed;
use super::wire::{self, Frame, Wire};
use crate::sync;

mod slots;
#[cfg(test)]
mod tests;

pub use slots::slot_of;
use slots::{Map, Redirect};

/// Redirects one command follows.
pub const REDIRECTS: usize = 3;
/// The shortest time between two reads of the slot map by one connection.
pub const REFRESH_EVERY: Duration = Duration::from_millis(100);

/// A node's address, as the cluster names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addr {
    pub host: String,
    pub port: u16,
}

/// What every connection of a store opens nodes with, and every node it
/// heard of (the configured ones first), shared by its lanes: a lane that
/// connects afresh reads the map from any of them.
pub struct Opener {
    settings: RedisConnectionInfo,
    tls: Option<TlsConnector>,
    known: Mutex<Vec<Addr>>,
}

impl Opener {
    pub fn new(
        seeds: Vec<Addr>,
        settings: RedisConnectionInfo,
        tls: Option<TlsConnector>,
    ) -> Opener {
        Opener {
            settings,
            tls,
            known: Mutex::new(seeds),
        }
    }

    async fn open(&self, addr: &Addr) -> RedisResult<Wire> {
        let opened = wire::handshake(&addr.host, addr.port, self.tls.as_ref(), &self.settings);
        match tokio::time::timeout(CONNECT_TIMEOUT, opened).await {
            Ok(opened) => opened,
            Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
        }
    }

    /// A new connection: the map read from the first node that answers.
    pub async fn connect(self: &Arc<Opener>) -> RedisResult<Shards> {
        let map = self.read_map().await?;
        Ok(Shards {
            inner: Arc::new(Inner {
                opener: self.clone(),
                map: Mutex::new(map),
            }),
        })
    }

    /// The map, from whichever node heard of answers first: all are
    /// asked at once, so that a node gone silent (a partition, a host
    /// down) holds up nothing while another answers. The node's
    /// connection is kept for it.
    async fn read_map(&self) -> RedisResult<Map> {
        let candidates = sync::lock(&self.known).clone();
        if candidates.is_empty() {
            return Err(unreachable("no cluster node is known"));
        }
        let asked = candidates
            .iter()
            .map(|addr| Box::pin(self.read_map_at(addr)));
        let (map, _) = futures_util::future::select_ok(asked).await?;
        self.heard_of(&map);
        Ok(map)
    }

    /// Every node of `map` among those heard of.
    fn heard_of(&self, map: &Map) {
        let mut known = sync::lock(&self.known);
        for node in &map.nodes {
            if !known.contains(&node.addr) {
                known.push(node.addr.clone());
            }
        }
    }

    async fn read_map_at(&self, addr: &Addr) -> RedisResult<Map> {
        let wire = self.open(addr).await?;
        let slots = wire
            .call(redis::cmd("CLUSTER").arg("SLOTS"))
            .await?
            .value()?;
        let mut map = Map::parse(&slots, addr).ok_or_else(unreadable)?;
        if let Some(node) = map.nodes.iter_mut().find(|n| &n.addr == addr) {
            node.wire = Some(wire);
        }
        Ok(map)
    }
}

/// A connection to every primary of a cluster; clones share it.
#[derive(Clone)]
pub struct Shards {
    inner: Arc<Inner>,
}

struct Inner {
    opener: Arc<Opener>,
    map: Mutex<Map>,
}

/// Which node a command goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
enum To {
    Slot(u16),
    Node(Addr),
    /// Any node: the command touches no key.
    Any,
    /// Every primary, each of which must succeed (a library's load).
    Primaries,
}

impl Shards {
    /// A decision's `FCALL` (or `EVALSHA`), to its key's node.
    pub async fn call_packed(&self, cmd: &Packed) -> RedisResult<Frame> {
        let (name, args) = cmd.name();
        let to = route(name, args);
        self.call_to(to, &|out: &mut Vec<u8>| out.extend_from_slice(cmd.bytes()))
            .await
    }

    /// `cmd` to the node serving `key`.
    pub async fn call_for_key(&self, cmd: &Cmd, key: &[u8]) -> RedisResult<Frame> {
        let to = To::Slot(slot_of(key));
        self.call_to(to, &|out: &mut Vec<u8>| cmd.write_packed_command(out))
            .await
    }

    /// `cmd` on every primary, each whatever the others answered: the
    /// last reply once all succeeded, or the first error (a library's
    /// removal goes to every node, one that lacks it answering an error).
    pub async fn call_primaries(&self, cmd: &Cmd) -> RedisResult<Value> {
        let addrs: Vec<Addr> = {
            let map = sync::lock(&self.inner.map);
            map.nodes
                .iter()
                .filter(|n| n.serves)
                .map(|n| n.addr.clone())
                .collect()
        };
        let mut last = Ok(Value::Nil);
        for addr in addrs {
            let reply = match self.wire(&To::Node(addr)).await {
                Ok(wire) => wire.call(cmd).await.and_then(|frame| frame.value()),
                Err(e) => Err(e),
            };
            if last.is_ok() {
                last = reply;
            }
        }
        last
    }

    /// `cmd` where its name and key say ([`route`]).
    pub async fn call(&self, cmd: &Cmd) -> RedisResult<Value> {
        match route_cmd(cmd) {
            To::Primaries => self.call_primaries(cmd).await,
            to => self
                .call_to(to, &|out: &mut Vec<u8>| cmd.write_packed_command(out))
                .await?
                .value(),
        }
    }

    /// Sends what `pack` writes to `to`, following redirects.
    async fn call_to(
        &self,
        mut to: To,
        pack: &(dyn Fn(&mut Vec<u8>) + Sync),
    ) -> RedisResult<Frame> {
        let mut asking = false;
        let mut redirects = 0;
        loop {
            let wire = self.wire(&to).await?;
            let frame = if asking {
                wire.asking(pack).await?
            } else {
                wire.one(pack).await?
            };
            let Some(redirect) = Redirect::of(&frame) else {
                return Ok(frame);
            };
            if redirects == REDIRECTS {
                return Ok(frame);
            }
            redirects += 1;
            let from = match &to {
                To::Node(addr) => Some(addr.clone()),
                _ => None,
            };
            match redirect {
                Redirect::Moved { slot, addr } => {
                    let addr = addr.unwrap_or_else(|| from.unwrap_or_else(|| self.addr_of(slot)));
                    self.learn(slot, addr);
                    to = To::Slot(slot);
                    asking = false;
                }
                Redirect::Ask { slot, addr } => {
                    to = To::Node(addr.unwrap_or_else(|| self.addr_of(slot)));
                    asking = true;
                }
            }
        }
    }

    /// The connection to `to`'s node, opened if it has none (or its last
    /// ended). `ClusterConnectionNotFound` when the node cannot be reached
    /// or no node serves the slot: nothing was sent.
    ///
    /// One request at a time opens a node's connection; the others wait
    /// for it. A node that could not be opened is not tried again for
    /// [`REFRESH_EVERY`]: its requests fail at once meanwhile, rather than
    /// each trying a host that is down.
    async fn wire(&self, to: &To) -> RedisResult<Wire> {
        let mut refreshed = false;
        loop {
            let refresh = !refreshed && {
                let mut map = sync::lock(&self.inner.map);
                let due = map.stale && map.read.elapsed() >= REFRESH_EVERY;
                if due {
                    map.read = Instant::now();
                }
                due
            };
            if refresh {
                // Boxed, like the open below: rare, and held inline they
                // would make every decision's future (on every topology:
                // the connection is an enum) as large as theirs.
                Box::pin(self.refresh()).await;
                refreshed = true;
                continue;
            }
            let (addr, opening) = {
                let mut map = sync::lock(&self.inner.map);
                let index = match to {
                    To::Slot(slot) => map.slots[usize::from(*slot)],
                    To::Node(addr) => map.index_of(addr),
                    To::Any | To::Primaries => map.any(),
                };
                let Some(node) = map.nodes.get_mut(usize::from(index)) else {
                    map.stale = true;
                    return Err(unreachable("no node serves the slot"));
                };
                if let Some(wire) = node.wire.as_ref().filter(|w| !w.is_closed()) {
                    return Ok(wire.clone());
                }
                if node.failed.is_some_and(|at| at.elapsed() < REFRESH_EVERY) {
                    return Err(unreachable("cluster node unreachable"));
                }
                (node.addr.clone(), node.opening.clone())
            };
            let _opening = opening.lock().await;
            // Opened by the request before this one, or failed there.
            {
                let map = sync::lock(&self.inner.map);
                if let Some(node) = map.nodes.iter().find(|n| n.addr == addr) {
                    if let Some(wire) = node.wire.as_ref().filter(|w| !w.is_closed()) {
                        return Ok(wire.clone());
                    }
                    if node.failed.is_some_and(|at| at.elapsed() < REFRESH_EVERY) {
                        return Err(unreachable("cluster node unreachable"));
                    }
                }
            }
            let opened = Box::pin(self.inner.opener.open(&addr)).await;
            let mut map = sync::lock(&self.inner.map);
            let index = usize::from(map.index_of(&addr));
            let node = &mut map.nodes[index];
            return match opened {
                Ok(wire) => {
                    node.wire = Some(wire.clone());
                    node.failed = None;
                    Ok(wire)
                }
                Err(e) => {
                    node.failed = Some(Instant::now());
                    map.stale = true;
                    tracing::debug!(error = %e, host = %addr.host, port = addr.port, "redis: cluster node unreachable");
                    Err(unreachable("cluster node unreachable"))
                }
            };
        }
    }

    /// Reads the map again (a node was unreachable or moved a slot: at
    /// most once every [`REFRESH_EVERY`]): asked of the nodes this
    /// connection is connected to, all at once, the first answer taken;
    /// of every node heard of, on new connections, when none answers. A
    /// failed read keeps the map.
    async fn refresh(&self) {
        let open: Vec<(Addr, Wire)> = {
            let map = sync::lock(&self.inner.map);
            map.nodes
                .iter()
                .filter_map(|n| Some((n.addr.clone(), n.wire.clone()?)))
                .filter(|(_, wire)| !wire.is_closed())
                .collect()
        };
        let asked = open.iter().map(|(addr, wire)| {
            Box::pin(async move {
                let slots = wire
                    .call(redis::cmd("CLUSTER").arg("SLOTS"))
                    .await?
                    .value()?;
                Map::parse(&slots, addr).ok_or_else(unreadable)
            })
        });
        // `select_ok` of nothing would panic.
        let asked = (!open.is_empty()).then(|| futures_util::future::select_ok(asked));
        let fresh = match asked {
            Some(asked) => match asked.await {
                Ok((fresh, _)) => Ok(fresh),
                Err(_) => self.inner.opener.read_map().await,
            },
            None => self.inner.opener.read_map().await,
        };
        if let Ok(fresh) = fresh {
            self.inner.opener.heard_of(&fresh);
            sync::lock(&self.inner.map).replace(fresh);
        }
    }

    /// The map says `slot` is served at `addr` now, and is read whole
    /// soon (a slot moved seldom moves alone).
    fn learn(&self, slot: u16, addr: Addr) {
        let mut map = sync::lock(&self.inner.map);
        let index = map.index_of(&addr);
        map.slots[usize::from(slot)] = index;
        map.stale = true;
    }

    fn addr_of(&self, slot: u16) -> Addr {
        let map = sync::lock(&self.inner.map);
        let index = usize::from(map.slots[usize::from(slot)]);
        map.nodes.get(index).map_or_else(
            || Addr {
                host: String::new(),
                port: 0,
            },
            |n| n.addr.clone(),
        )
    }
}

impl ConnectionLike for Shards {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.call(cmd))
    }

    /// The whole pipeline to the node of its first command's key (sluice
    /// sends none across slots).
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let to = pipeline.cmd_iter().next().map_or(To::Any, route_cmd);
            let mut wire = self.wire(&to).await?;
            wire.req_packed_commands(pipeline, offset, count).await
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

fn unreadable() -> RedisError {
    RedisError::from((ErrorKind::Parse, "unreadable CLUSTER SLOTS reply"))
}

/// Nothing was sent: no connection to the node that should have it.
fn unreachable(what: &'static str) -> RedisError {
    RedisError::from((ErrorKind::ClusterConnectionNotFound, what))
}

/// [`route`] of a redis-rs command.
fn route_cmd(cmd: &Cmd) -> To {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        redis::Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let name = args.next().unwrap_or_default();
    route(name, args)
}

/// Where a command goes, by its name and arguments: a script's call to
/// its first key's slot, a library's or script's load and removal to
/// every primary, a command of no key to any node, any other to the slot
/// of its first argument.
fn route<'a>(name: &[u8], mut args: impl Iterator<Item = &'a [u8]>) -> To {
    let is = |word: &str| name.eq_ignore_ascii_case(word.as_bytes());
    if [
        "FCALL",
        "FCALL_RO",
        "EVALSHA",
        "EVALSHA_RO",
        "EVAL",
        "EVAL_RO",
    ]
    .iter()
    .any(|w| is(w))
    {
        let _function = args.next();
        let keys = args.next().and_then(wire::parse_int).unwrap_or(0);
        return match args.next() {
            Some(key) if keys > 0 => To::Slot(slot_of(key)),
            _ => To::Any,
        };
    }
    if is("FUNCTION") || is("SCRIPT") {
        let sub = args.next().unwrap_or_default();
        let everywhere = ["LOAD", "DELETE", "FLUSH", "RESTORE"]
            .iter()
            .any(|w| sub.eq_ignore_ascii_case(w.as_bytes()));
        return if everywhere { To::Primaries } else { To::Any };
    }
    if ["PING", "INFO", "CLUSTER", "TIME", "CLIENT", "ECHO"]
        .iter()
        .any(|w| is(w))
    {
        return To::Any;
    }
    args.next().map_or(To::Any, |key| To::Slot(slot_of(key)))
}
