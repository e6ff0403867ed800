//! Opening a connection for each topology, with every timeout set here.
//!
//! - standalone: one node, or a stable endpoint in front of the current
//!   primary (a DNS name, a cloud primary endpoint, a virtual IP). Each new
//!   connection resolves the address again.
//! - sentinel: each new connection asks the Sentinels for the primary of
//!   `master` and checks its role before using it.
//! - cluster: sluice's own connection to every primary ([`Shards`]):
//!   slot routing, `MOVED` / `ASK`, the slot map read again after a
//!   redirect or an unreachable node; a lane whose connection failed
//!   reads it afresh from any node it heard of. redis-rs's cluster client
//!   where sluice's connection does not speak the nodes' address or
//!   protocol (TLS without hostname checks, RESP3).
//!
//! Timeouts are set explicitly (redis 1.x has defaults of its own that
//! would decide how failures are classed): connecting is bounded by
//! [`CONNECT_TIMEOUT`]; replies are not timed here, since every evaluation
//! runs under its own deadline (arrival + `store.budget`), which also
//! bounds whatever the cluster client retries by itself.

use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, Slot,
    SlotAddr,
};
use redis::io::tcp::TcpSettings;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, IntoConnectionInfo,
    RedisFuture, RedisResult, TlsCertificates, TlsMode, Value,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use std::sync::Arc;

use tokio_rustls::TlsConnector;

use super::counted::{Calls, Counted};
use super::packed::Packed;
use super::reply::Answer;
use super::shards::{Addr, Opener, Shards};
use super::wire::{self, Wire};
use super::RedisSetupError;
use crate::config::{self, Topology};

/// The longest a connection attempt may take outside a request's deadline
/// (the start-up task); a request's own deadline cuts it shorter.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How many times redis-rs's cluster client may re-send one command (a
/// `MOVED` or `ASK` redirect, `TRYAGAIN`, a reconnect), all inside the
/// deadline. Each re-send carries the same evaluation id and arguments, so
/// a script that already ran replays its admission instead of charging
/// twice; and so no call through it says it is a first send
/// (`Inner::first_sends`), which would skip that look.
const CLUSTER_RETRIES: u32 = 3;

/// A connection of any topology; clones share it.
#[derive(Clone)]
pub enum Conn {
    /// sluice's own, to a standalone node or the Sentinels' primary.
    Wire(Counted<Wire>),
    /// redis-rs's, to a node [`Wire`] does not speak to (a Unix socket,
    /// TLS without hostname checks, RESP3).
    Node(Counted<MultiplexedConnection>),
    /// sluice's own, to every primary of a cluster.
    Shards(Counted<Shards>),
    /// redis-rs's, to a cluster whose nodes [`Wire`] does not speak to.
    Cluster(Counted<ClusterConnection>),
}

impl Conn {
    /// `FUNCTION LOAD` on the node that serves `key` (on a standalone node
    /// or a Sentinel's primary: that node), so a node that answered
    /// function not found gets the library without waiting on every other
    /// node.
    pub async fn load_script(&mut self, load: Cmd, key: &[u8]) -> RedisResult<Value> {
        match self {
            Conn::Wire(conn) => load.query_async(conn).await,
            Conn::Node(conn) => load.query_async(conn).await,
            Conn::Shards(conn) => conn.call_for_key(&load, key).await?.value(),
            Conn::Cluster(conn) => {
                let route = Route::with_slot(Slot::for_key(key), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                conn.route_command(load, routing).await?.extract_error()
            }
        }
    }
}

impl Conn {
    /// `FUNCTION LOAD` or `SCRIPT LOAD` on every primary, answering once
    /// all succeeded. On a cluster, named explicitly: redis-rs would send
    /// `SCRIPT LOAD` to the replicas too, and one replica down would then
    /// keep a starting sidecar from loading anything (a replica promoted
    /// later answers NOSCRIPT and gets the script then).
    pub async fn load_everywhere(&mut self, load: Cmd) -> RedisResult<Value> {
        match self {
            Conn::Wire(conn) => load.query_async(conn).await,
            Conn::Node(conn) => load.query_async(conn).await,
            Conn::Shards(conn) => conn.call_primaries(&load).await,
            Conn::Cluster(conn) => {
                let routing = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                conn.route_command(load, routing).await?.extract_error()
            }
        }
    }

    /// Sends an evaluation's `FCALL`. sluice's own connection gives the
    /// reply's bytes, read in place; an error reply is an `Err` on every
    /// connection, as redis-rs makes it.
    pub async fn evaluate(&mut self, cmd: &Packed) -> RedisResult<Answer> {
        match self {
            Conn::Wire(wire) => {
                let frame = wire.call_packed(cmd).await?;
                if frame.is_error() {
                    frame.value()?;
                }
                Ok(Answer::Frame(frame))
            }
            // Boxed: a cluster call's future (routing, redirects) is
            // larger than the rest of this one, and held inline it would
            // make every decision's future that size, on one node too
            // (2,240 bytes instead of 1,952 for an admission on Redis).
            Conn::Shards(shards) => {
                let frame = Box::pin(shards.call_packed(cmd)).await?;
                if frame.is_error() {
                    frame.value()?;
                }
                Ok(Answer::Frame(frame))
            }
            // Boxed: redis-rs's future is large, and held inline it would
            // make the decisions on sluice's own connection as large.
            other => {
                let cmd = cmd.to_cmd();
                Box::pin(async move { cmd.query_async::<Value>(other).await })
                    .await
                    .map(Answer::Value)
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Wire(conn) => conn.req_packed_command(cmd),
            Conn::Node(conn) => conn.req_packed_command(cmd),
            Conn::Shards(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Wire(conn) => conn.req_packed_commands(cmd, offset, count),
            Conn::Node(conn) => conn.req_packed_commands(cmd, offset, count),
            Conn::Shards(conn) => conn.req_packed_commands(cmd, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Wire(conn) => conn.get_db(),
            Conn::Node(conn) => conn.get_db(),
            Conn::Shards(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// How to open a new connection.
pub enum Connector {
    Standalone {
        client: Client,
        config: AsyncConnectionConfig,
        tls: Option<TlsConnector>,
    },
    /// `SentinelClient` keeps a cache of Sentinel connections and needs
    /// `&mut`; connecting is rare (a lane's first use, or after a failure).
    Sentinel {
        client: tokio::sync::Mutex<SentinelClient>,
        config: AsyncConnectionConfig,
        tls: Option<TlsConnector>,
    },
    /// sluice's own connections to the cluster's nodes.
    Shards(Arc<Opener>),
    Cluster {
        client: redis::cluster::ClusterClient,
    },
}

impl Connector {
    /// `budget` is the one in effect at start: the cluster client's own
    /// waits are built with it, and every request's deadline (its live
    /// budget) bounds them anyway.
    pub fn new(redis: &config::RedisStore, budget: Duration) -> Result<Connector, RedisSetupError> {
        let certs = certificates(redis)?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(None);
        match &redis.topology {
            Topology::Standalone { url } => {
                let info = connection_info(url.expose())?.set_tcp_settings(tcp_settings());
                let tls = is_tls(&info);
                check_ca(certs.is_some(), tls)?;
                let connector = tls_connector(redis, certs.as_ref(), tls)?;
                let client = match certs {
                    Some(certs) if tls => Client::build_with_tls(info, certs),
                    _ => Client::open(info),
                }
                .map_err(|_| RedisSetupError::Url)?;
                Ok(Connector::Standalone {
                    client,
                    config,
                    tls: connector,
                })
            }
            Topology::Cluster { nodes } => {
                let (infos, tls) = node_infos(nodes)?;
                check_ca(certs.is_some(), tls)?;
                if let Some(seeds) = infos.iter().map(wire_addr).collect::<Option<Vec<_>>>() {
                    let connector = tls_connector(redis, certs.as_ref(), tls)?;
                    // Every node with the first's credentials, as the
                    // cluster client had them.
                    let settings = infos[0].redis_settings().clone();
                    return Ok(Connector::Shards(Arc::new(Opener::new(
                        seeds, settings, connector,
                    ))));
                }
                let mut builder = ClusterClientBuilder::new(infos)
                    .retries(CLUSTER_RETRIES)
                    // Redirects and TRYAGAIN waits stay short: the whole
                    // decision has `budget`, 25 ms by default.
                    .min_retry_wait(1)
                    .max_retry_wait(budget_ms(budget))
                    .connection_timeout(CONNECT_TIMEOUT)
                    .response_timeout(budget)
                    .overall_response_timeout(None)
                    .tcp_settings(tcp_settings());
                if let Some(certs) = certs {
                    builder = builder.certs(certs);
                }
                let client = builder.build().map_err(|_| RedisSetupError::Url)?;
                Ok(Connector::Cluster { client })
            }
            Topology::Sentinel {
                master,
                nodes,
                username,
                password,
            } => {
                let (infos, tls) = node_infos(nodes)?;
                check_ca(certs.is_some(), tls)?;
                let connector = tls_connector(redis, certs.as_ref(), tls)?;
                // The Sentinels' own credentials come from their URLs (the
                // same on each); the primary's from `username`/`password`.
                let sentinel_auth = infos[0].redis_settings().clone();
                let addrs: Vec<ConnectionAddr> = infos.iter().map(|i| i.addr().clone()).collect();
                let mut builder =
                    SentinelClientBuilder::new(addrs, master, SentinelServerType::Master)
                        .map_err(|_| RedisSetupError::Url)?
                        .set_client_to_redis_tcp_settings(tcp_settings())
                        .set_client_to_sentinel_tcp_settings(tcp_settings());
                if let Some(user) = sentinel_auth.username() {
                    builder = builder.set_client_to_sentinel_username(user);
                }
                if let Some(pass) = sentinel_auth.password() {
                    builder = builder.set_client_to_sentinel_password(pass);
                }
                if let Some(user) = username {
                    builder = builder.set_client_to_redis_username(user);
                }
                if let Some(pass) = password {
                    builder = builder.set_client_to_redis_password(pass.expose());
                }
                if tls {
                    builder = builder
                        .set_client_to_redis_tls_mode(TlsMode::Secure)
                        .set_client_to_sentinel_tls_mode(TlsMode::Secure);
                    if let Some(certs) = certs {
                        builder = builder
                            .set_client_to_redis_certificates(certs.clone())
                            .set_client_to_sentinel_certificates(certs);
                    }
                }
                let client = builder.build().map_err(|_| RedisSetupError::Url)?;
                Ok(Connector::Sentinel {
                    client: tokio::sync::Mutex::new(client),
                    config,
                    tls: connector,
                })
            }
        }
    }

    /// A new connection, its commands counted in `calls`.
    pub async fn connect(&self, calls: &Arc<Calls>) -> RedisResult<Conn> {
        match self {
            Connector::Standalone {
                client,
                config,
                tls,
            } => node(client, config, tls.as_ref(), calls).await,
            Connector::Sentinel {
                client,
                config,
                tls,
            } => {
                // The primary the Sentinels name, its role checked.
                let primary = client.lock().await.async_get_client().await?;
                node(&primary, config, tls.as_ref(), calls).await
            }
            Connector::Shards(opener) => opener
                .connect()
                .await
                .map(|conn| Conn::Shards(Counted::new(conn, calls.clone()))),
            Connector::Cluster { client } => client
                .get_async_connection()
                .await
                .map(|conn| Conn::Cluster(Counted::new(conn, calls.clone()))),
        }
    }
}

impl Connector {
    /// Whether the connection re-sends a command by itself (redis-rs's
    /// cluster client), so that no send can be called a first.
    pub fn resends_by_itself(&self) -> bool {
        matches!(self, Connector::Cluster { .. })
    }
}

/// A cluster node's address, when sluice's own connection speaks to it
/// (RESP2 over TCP, or TLS with its hostname checked), as [`wire::open`]
/// decides for one node.
fn wire_addr(info: &ConnectionInfo) -> Option<Addr> {
    if info.redis_settings().protocol() != redis::ProtocolVersion::RESP2 {
        return None;
    }
    match info.addr() {
        ConnectionAddr::Tcp(host, port)
        | ConnectionAddr::TcpTls {
            host,
            port,
            insecure: false,
            ..
        } => Some(Addr {
            host: host.clone(),
            port: *port,
        }),
        _ => None,
    }
}

/// A connection to the node `client` names: sluice's own where it speaks
/// the node's address and protocol, redis-rs's otherwise.
async fn node(
    client: &Client,
    config: &AsyncConnectionConfig,
    tls: Option<&TlsConnector>,
    calls: &Arc<Calls>,
) -> RedisResult<Conn> {
    let info = client.get_connection_info();
    match tokio::time::timeout(CONNECT_TIMEOUT, wire::open(info, tls)).await {
        Ok(Some(opened)) => opened.map(|conn| Conn::Wire(Counted::new(conn, calls.clone()))),
        Ok(None) => client
            .get_multiplexed_async_connection_with_config(config)
            .await
            .map(|conn| Conn::Node(Counted::new(conn, calls.clone()))),
        Err(_) => Err(std::io::Error::from(std::io::ErrorKind::TimedOut).into()),
    }
}

/// The TLS settings of sluice's own connections: `ca_file` as the only
/// trust root when given, the web PKI's roots otherwise (as redis-rs's
/// connections have them).
fn tls_connector(
    redis: &config::RedisStore,
    certs: Option<&TlsCertificates>,
    tls: bool,
) -> Result<Option<TlsConnector>, RedisSetupError> {
    if !tls {
        return Ok(None);
    }
    let mut roots = rustls::RootCertStore::empty();
    match (certs.and_then(|c| c.root_cert.as_deref()), &redis.ca_file) {
        (Some(pem), Some(path)) => {
            let refused = |reason: String| RedisSetupError::CaFile {
                path: path.clone(),
                reason,
            };
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| refused(e.to_string()))?;
                roots.add(cert).map_err(|e| refused(e.to_string()))?;
            }
        }
        _ => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| RedisSetupError::Tls(e.to_string()))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Some(TlsConnector::from(Arc::new(config))))
}

/// Small writes on a shared multiplexed socket must not wait for ACKs.
fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

fn budget_ms(budget: Duration) -> u64 {
    u64::try_from(budget.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn connection_info(url: &str) -> Result<ConnectionInfo, RedisSetupError> {
    // The error text is not passed on: it may quote the URL, password and all.
    url.into_connection_info().map_err(|_| RedisSetupError::Url)
}

/// Every node's connection settings, and whether they speak TLS (all of
/// them or none: the configuration refuses a mix, and so does this).
fn node_infos(nodes: &[config::Secret]) -> Result<(Vec<ConnectionInfo>, bool), RedisSetupError> {
    let infos = nodes
        .iter()
        .map(|url| connection_info(url.expose()))
        .collect::<Result<Vec<_>, _>>()?;
    let tls = infos.iter().any(is_tls);
    if tls && !infos.iter().all(is_tls) {
        return Err(RedisSetupError::MixedTls);
    }
    Ok((infos, tls))
}

fn is_tls(info: &ConnectionInfo) -> bool {
    matches!(info.addr(), ConnectionAddr::TcpTls { .. })
}

fn check_ca(has_ca: bool, tls: bool) -> Result<(), RedisSetupError> {
    if tls {
        // redis-rs builds its rustls config from the process default
        // provider; install one unless the server's TLS already did.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    if has_ca && !tls {
        return Err(RedisSetupError::CaFileWithoutTls);
    }
    Ok(())
}

/// `ca_file` as the only trust root for `rediss://`, when given.
fn certificates(redis: &config::RedisStore) -> Result<Option<TlsCertificates>, RedisSetupError> {
    let Some(ca_file) = &redis.ca_file else {
        return Ok(None);
    };
    let pem = std::fs::read(ca_file).map_err(|e| RedisSetupError::CaFile {
        path: ca_file.clone(),
        reason: e.to_string(),
    })?;
    // An empty trust store would only fail later, at every handshake.
    if CertificateDer::pem_slice_iter(&pem).next().is_none() {
        return Err(RedisSetupError::CaFile {
            path: ca_file.clone(),
            reason: "no PEM certificate in it".to_owned(),
        });
    }
    Ok(Some(TlsCertificates {
        client_tls: None,
        root_cert: Some(pem),
    }))
}
