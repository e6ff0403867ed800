//! The part of a configuration fixed when the process starts: listeners,
//! TLS, workers, the server's connection bounds, the store and its
//! connection, the upstream client's connect timeout.
//!
//! Each of these is built into something long-lived at start (a bound
//! socket, a runtime, a pooled client, compiled Redis scripts), so a reload
//! cannot apply a change to them. [`Boot::changes`] names what a reload
//! would have changed, for the warning; the boot part in effect stays.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::Secret;

/// Everything only a restart can change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Boot {
    pub server: ServerBoot,
    pub upstream: UpstreamBoot,
    pub store: StoreBoot,
}

/// `server.*` except `paths`, `body_idle_timeout` and `min_upload_rate`:
/// the listeners and the bounds every connection is served with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerBoot {
    pub listen: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub tls: Option<Tls>,
    /// After SIGTERM, how long sluice keeps accepting and serving (readiness
    /// already failing) before it drains: the time endpoints take to drop
    /// the pod.
    pub shutdown_delay: Duration,
    pub shutdown_grace: Duration,
    /// Time allowed to read a request's headers (slowloris bound).
    pub header_read_timeout: Duration,
    /// Largest request head accepted (HTTP/1.1 buffer, HTTP/2 header list).
    pub max_header_bytes: usize,
    /// Tokio worker threads; 0 = one per core.
    pub workers: usize,
    /// A connection with no request in flight for this long is closed
    /// (HTTP/2: GOAWAY; hyper has no idle timeout of its own there).
    pub idle_timeout: Duration,
    /// A write to a client blocked for this long (the client reads
    /// nothing) closes the connection (nginx's `send_timeout`).
    pub send_timeout: Duration,
    /// Traffic connections open at once; beyond it new ones are closed at
    /// once (the admin port does not count).
    pub max_connections: usize,
    /// Of those, at most this many from one client address (an IPv6
    /// /64; a /56 holds four times as many); trusted peers are not
    /// counted, the clients their PROXY protocol headers name are.
    pub max_connections_per_ip: usize,
    pub http2: Http2,
    /// The memory budget for request heads.
    pub request_heads: RequestHeads,
    /// The PROXY protocol versions read from `identity.trusted_proxies`.
    pub proxy_protocol: ProxyProtocol,
}

/// `server.proxy_protocol`: which versions of the PROXY protocol header a
/// trusted peer may put before its connection's first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyProtocol {
    pub v1: bool,
    pub v2: bool,
}

impl ProxyProtocol {
    /// Whether any header is read at all.
    pub fn any(self) -> bool {
        self.v1 || self.v2
    }
}

/// `server.request_heads`: bytes of request heads (HTTP/1 heads still
/// arriving, HTTP/2 header lists of open streams) held at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeads {
    pub per_connection: usize,
    pub per_client: usize,
    pub total: usize,
}

/// HTTP/2 limits, set explicitly rather than left to hyper's defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Http2 {
    /// Streams a client may have open on one connection.
    pub max_concurrent_streams: u32,
    /// Streams reset by the client before sluice accepted them, held at once
    /// (the rapid-reset bound, CVE-2023-44487).
    pub max_pending_accept_reset_streams: usize,
    /// Streams sluice itself reset because of the client's protocol errors,
    /// before the connection is closed.
    pub max_local_error_reset_streams: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `upstream.connect_timeout`: it belongs to the pooled client built at
/// start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamBoot {
    pub connect_timeout: Duration,
}

/// The store and everything compiled into it at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreBoot {
    pub kind: StoreKind,
    /// Added to every key's policy horizon for its TTL (the memory store
    /// holds it; the Redis scripts are generated with it).
    pub ttl_grace: Duration,
    /// `store.scripts`: how the Redis scripts are run (the memory store
    /// has none; its validation refuses the key there).
    pub scripts: Scripts,
}

/// `store.scripts`: Redis Functions (`FCALL`), cached scripts
/// (`EVALSHA`), or whichever the store has, found at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scripts {
    /// Functions where `FUNCTION LOAD` works, cached scripts where it is
    /// an unknown command or not permitted.
    #[default]
    Auto,
    Functions,
    Eval,
}

impl Scripts {
    pub fn name(self) -> &'static str {
        match self {
            Scripts::Auto => "auto",
            Scripts::Functions => "functions",
            Scripts::Eval => "eval",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreKind {
    Memory(MemoryStore),
    // Boxed: a Redis store's settings are large and configurations are
    // cloned on every reload.
    Redis(Box<RedisStore>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryStore {
    /// Most subjects tracked at once; beyond it new subjects are refused
    /// (AdmissionRejected), never handed a fresh bucket by eviction.
    /// `None`: derived at start from the memory limit
    /// (`store::memory_bound`).
    pub max_entries: Option<usize>,
}

/// Where the Redis store's primary is, and how it is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topology {
    /// One node, or a stable endpoint in front of the current primary.
    /// `redis://` or `rediss://`, credentials included; redacted in Debug.
    Standalone { url: Secret },
    /// Redis Cluster: seed nodes (the rest are discovered), credentials and
    /// TLS in their URLs.
    Cluster { nodes: Vec<Secret> },
    /// The primary the Sentinels name `master`. The nodes' URLs carry the
    /// Sentinels' credentials; `username`/`password` are the primary's.
    Sentinel {
        master: String,
        nodes: Vec<Secret>,
        username: Option<String>,
        password: Option<Secret>,
    },
}

impl Topology {
    pub fn name(&self) -> &'static str {
        match self {
            Topology::Standalone { .. } => "standalone",
            Topology::Cluster { .. } => "cluster",
            Topology::Sentinel { .. } => "sentinel",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisStore {
    pub topology: Topology,
    pub pool_size: usize,
    /// PEM file of extra roots for `rediss://` with a private CA.
    pub ca_file: Option<PathBuf>,
    pub key_prefix: String,
    pub max_clock_regression: Duration,
    pub dedupe_window: Duration,
    pub dedupe_max: u32,
    /// Failures within `breaker_window` below which the breaker never
    /// opens, whatever the rate.
    pub breaker_failures: u32,
    /// How far back the breaker counts calls and failures.
    pub breaker_window: Duration,
    /// Calls within `breaker_window` below which the breaker never opens.
    pub breaker_min_calls: u32,
    /// The share of the window's calls that failed, in percent (1 to 100),
    /// from which the breaker opens.
    pub breaker_failure_rate: u8,
    pub breaker_cooldown: Duration,
    /// Subjects remembered as denied-until-T on this sidecar, answered
    /// without a store call until T; 0 turns the cache off.
    pub deny_cache_entries: usize,
    /// `store.coalesce`: decisions that arrive while a call is in flight
    /// go together in the next one.
    pub coalesce: bool,
}

impl Boot {
    /// The YAML key path of every value that differs from `self` in
    /// `next`; empty exactly when the two are equal. Secrets are compared
    /// but only their keys are named.
    ///
    /// Every field is destructured, so a field added to the boot part does
    /// not build until it is named here.
    pub fn changes(&self, next: &Boot) -> Vec<&'static str> {
        let mut changes = Vec::new();
        if self == next {
            return changes;
        }
        let Boot {
            server,
            upstream,
            store,
        } = self;
        server.changes(&next.server, &mut changes);
        let UpstreamBoot { connect_timeout } = upstream;
        if *connect_timeout != next.upstream.connect_timeout {
            changes.push("upstream.connect_timeout");
        }
        store.changes(&next.store, &mut changes);
        // Unreachable while every field above is compared; kept so a
        // difference can never go unreported.
        if changes.is_empty() {
            changes.push("(a setting fixed at start)");
        }
        changes
    }
}

/// Pushes `key` when `old` and `new` differ.
fn differ<T: PartialEq>(old: &T, new: &T, key: &'static str, changes: &mut Vec<&'static str>) {
    if old != new {
        changes.push(key);
    }
}

impl ServerBoot {
    fn changes(&self, next: &ServerBoot, changes: &mut Vec<&'static str>) {
        let ServerBoot {
            listen,
            admin,
            tls,
            shutdown_delay,
            shutdown_grace,
            header_read_timeout,
            max_header_bytes,
            workers,
            idle_timeout,
            send_timeout,
            max_connections,
            max_connections_per_ip,
            http2,
            request_heads,
            proxy_protocol,
        } = self;
        differ(listen, &next.listen, "server.listen", changes);
        differ(admin, &next.admin, "server.admin", changes);
        differ(tls, &next.tls, "server.tls", changes);
        differ(
            shutdown_delay,
            &next.shutdown_delay,
            "server.shutdown_delay",
            changes,
        );
        differ(
            shutdown_grace,
            &next.shutdown_grace,
            "server.shutdown_grace",
            changes,
        );
        differ(
            header_read_timeout,
            &next.header_read_timeout,
            "server.header_read_timeout",
            changes,
        );
        differ(
            max_header_bytes,
            &next.max_header_bytes,
            "server.max_header_bytes",
            changes,
        );
        differ(workers, &next.workers, "server.workers", changes);
        differ(
            idle_timeout,
            &next.idle_timeout,
            "server.idle_timeout",
            changes,
        );
        differ(
            send_timeout,
            &next.send_timeout,
            "server.send_timeout",
            changes,
        );
        differ(
            max_connections,
            &next.max_connections,
            "server.max_connections",
            changes,
        );
        differ(
            max_connections_per_ip,
            &next.max_connections_per_ip,
            "server.max_connections_per_ip",
            changes,
        );
        differ(http2, &next.http2, "server.http2", changes);
        differ(
            request_heads,
            &next.request_heads,
            "server.request_heads",
            changes,
        );
        differ(
            proxy_protocol,
            &next.proxy_protocol,
            "server.proxy_protocol",
            changes,
        );
    }
}

impl StoreBoot {
    fn changes(&self, next: &StoreBoot, changes: &mut Vec<&'static str>) {
        let StoreBoot {
            kind,
            ttl_grace,
            scripts,
        } = self;
        match (kind, &next.kind) {
            (StoreKind::Memory(old), StoreKind::Memory(new)) => {
                let MemoryStore { max_entries } = old;
                differ(max_entries, &new.max_entries, "store.max_entries", changes);
            }
            (StoreKind::Redis(old), StoreKind::Redis(new)) => old.changes(new, changes),
            _ => changes.push("store.kind"),
        }
        differ(ttl_grace, &next.ttl_grace, "store.ttl_grace", changes);
        differ(scripts, &next.scripts, "store.scripts", changes);
    }
}

impl RedisStore {
    fn changes(&self, next: &RedisStore, changes: &mut Vec<&'static str>) {
        let RedisStore {
            topology,
            pool_size,
            ca_file,
            key_prefix,
            max_clock_regression,
            dedupe_window,
            dedupe_max,
            breaker_failures,
            breaker_window,
            breaker_min_calls,
            breaker_failure_rate,
            breaker_cooldown,
            deny_cache_entries,
            coalesce,
        } = self;
        differ(coalesce, &next.coalesce, "store.coalesce", changes);
        topology.changes(&next.topology, changes);
        differ(pool_size, &next.pool_size, "store.pool_size", changes);
        differ(ca_file, &next.ca_file, "store.ca_file", changes);
        differ(key_prefix, &next.key_prefix, "store.key_prefix", changes);
        differ(
            max_clock_regression,
            &next.max_clock_regression,
            "store.max_clock_regression",
            changes,
        );
        differ(
            dedupe_window,
            &next.dedupe_window,
            "store.dedupe_window",
            changes,
        );
        differ(dedupe_max, &next.dedupe_max, "store.dedupe_max", changes);
        differ(
            breaker_failures,
            &next.breaker_failures,
            "store.breaker_failures",
            changes,
        );
        differ(
            breaker_window,
            &next.breaker_window,
            "store.breaker_window",
            changes,
        );
        differ(
            breaker_min_calls,
            &next.breaker_min_calls,
            "store.breaker_min_calls",
            changes,
        );
        differ(
            breaker_failure_rate,
            &next.breaker_failure_rate,
            "store.breaker_failure_rate",
            changes,
        );
        differ(
            breaker_cooldown,
            &next.breaker_cooldown,
            "store.breaker_cooldown",
            changes,
        );
        differ(
            deny_cache_entries,
            &next.deny_cache_entries,
            "store.deny_cache_entries",
            changes,
        );
    }
}

impl Topology {
    fn changes(&self, next: &Topology, changes: &mut Vec<&'static str>) {
        match (self, next) {
            (Topology::Standalone { url }, Topology::Standalone { url: new }) => {
                differ(url, new, "store.url", changes);
            }
            (Topology::Cluster { nodes }, Topology::Cluster { nodes: new }) => {
                differ(nodes, new, "store.nodes", changes);
            }
            (
                Topology::Sentinel {
                    master,
                    nodes,
                    username,
                    password,
                },
                Topology::Sentinel {
                    master: new_master,
                    nodes: new_nodes,
                    username: new_username,
                    password: new_password,
                },
            ) => {
                differ(master, new_master, "store.sentinel.master", changes);
                differ(nodes, new_nodes, "store.sentinel.nodes", changes);
                differ(username, new_username, "store.sentinel.username", changes);
                differ(password, new_password, "store.sentinel.password", changes);
            }
            _ => changes.push("store.topology"),
        }
    }
}

#[cfg(test)]
mod tests;
