//! Redis as it runs in production, on loopback: a Redis Cluster of three
//! primaries with a replica each, a primary and replica watched by three
//! Sentinels, and a TCP relay that stands for a stable address (a DNS name,
//! a cloud primary endpoint, a virtual IP) in front of whichever node is
//! primary. Every process is a real `redis-server` on free ports, killed on
//! drop.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::redis::{Builder, RedisServer, TlsFiles};

/// A cluster forms (slots assigned, replicas synced) well within this.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

fn redis_cli() -> String {
    std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".to_owned())
}

fn connection(url: &str, tls: Option<&TlsFiles>) -> redis::Connection {
    let client = match tls {
        None => redis::Client::open(url).expect("client"),
        Some(tls) => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(std::fs::read(&tls.ca).expect("read CA")),
            },
        )
        .expect("TLS client"),
    };
    client
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect to a redis node")
}

/// `ROLE`'s first element: `master`, `slave` or `sentinel`.
fn role(conn: &mut redis::Connection) -> Option<String> {
    let value: redis::Value = redis::cmd("ROLE").query(conn).ok()?;
    match value {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::BulkString(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        },
        _ => None,
    }
}

fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ok() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Three primaries and three replicas, slots spread by `redis-cli --cluster
/// create --cluster-replicas 1`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    tls: Option<TlsFiles>,
    /// The user `redis-cli` and the helpers connect as, when `default` is off.
    admin: Option<(String, String)>,
}

#[derive(Default)]
pub struct ClusterBuilder {
    lines: Vec<String>,
    tls: Option<TlsFiles>,
    admin: Option<(String, String)>,
}

impl ClusterBuilder {
    /// A `redis.conf` line for every node (an ACL user, say).
    pub fn config(mut self, line: &str) -> ClusterBuilder {
        self.lines.push(line.to_owned());
        self
    }

    pub fn tls(mut self, files: TlsFiles) -> ClusterBuilder {
        self.tls = Some(files);
        self
    }

    pub fn admin(mut self, user: &str, password: &str) -> ClusterBuilder {
        self.admin = Some((user.to_owned(), password.to_owned()));
        self
    }

    pub fn start(self) -> RedisCluster {
        let mut builder = RedisServer::builder()
            .config("cluster-enabled yes")
            .config("cluster-config-file nodes.conf")
            // Failure detection and failover within a couple of seconds.
            .config("cluster-node-timeout 1000")
            .config("cluster-replica-validity-factor 0")
            .config("appendonly no");
        if let Some(tls) = &self.tls {
            builder = builder
                .tls(tls.clone())
                .config("tls-cluster yes")
                .config("tls-replication yes");
        }
        if let Some((user, password)) = &self.admin {
            builder = builder
                .admin(user, password)
                .config(&format!("masteruser {user}"))
                .config(&format!("masterauth {password}"));
        }
        for line in &self.lines {
            builder = builder.config(line);
        }
        let nodes: Vec<RedisServer> = (0..6).map(|_| builder.clone().start_with_bus()).collect();
        let cluster = RedisCluster {
            nodes,
            tls: self.tls,
            admin: self.admin,
        };
        cluster.create();
        cluster
    }
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        ClusterBuilder::default().start()
    }

    pub fn builder() -> ClusterBuilder {
        ClusterBuilder::default()
    }

    fn cli(&self) -> Command {
        let mut cmd = Command::new(redis_cli());
        if let Some(tls) = &self.tls {
            cmd.arg("--tls").arg("--cacert").arg(&tls.ca);
        }
        if let Some((user, password)) = &self.admin {
            cmd.arg("--user").arg(user).arg("--pass").arg(password);
            cmd.arg("--no-auth-warning");
        }
        cmd
    }

    fn create(&self) {
        let mut cmd = self.cli();
        cmd.arg("--cluster").arg("create");
        for node in &self.nodes {
            cmd.arg(format!("127.0.0.1:{}", node.port()));
        }
        cmd.args(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli ({e}): install redis-tools"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_formed();
    }

    /// Every live node says `cluster_state:ok`, sees all 16384 slots, and
    /// every replica is in sync with its primary.
    pub fn wait_formed(&self) {
        wait_for("the cluster to form", FORM_TIMEOUT, || {
            self.nodes.iter().all(|node| {
                let Ok(mut conn) = node
                    .client()
                    .get_connection_with_timeout(Duration::from_millis(500))
                else {
                    return true; // killed on purpose
                };
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut conn)
                    .unwrap_or_default();
                let synced = match role(&mut conn).as_deref() {
                    Some("slave") => {
                        let repl: String = redis::cmd("INFO")
                            .arg("replication")
                            .query(&mut conn)
                            .unwrap_or_default();
                        repl.contains("master_link_status:up")
                    }
                    Some("master") => true,
                    _ => false,
                };
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_ok:16384")
                    && synced
            })
        });
    }

    /// Seed URLs for `store.nodes` (every node; one would do).
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    pub fn urls_as(&self, user: &str, password: &str) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.url_as(user, password))
            .collect()
    }

    /// `[url, url, ...]` for a YAML flow list.
    pub fn yaml_list(urls: &[String]) -> String {
        format!("[{}]", urls.join(", "))
    }

    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .expect("a node of this cluster")
    }

    pub fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .expect("a node of this cluster")
    }

    pub fn connection(&self, port: u16) -> redis::Connection {
        self.node(port).connection()
    }

    /// Ports of the nodes that are primaries now.
    pub fn primaries(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| {
                n.client()
                    .get_connection_with_timeout(Duration::from_millis(500))
                    .ok()
                    .and_then(|mut c| role(&mut c))
                    .as_deref()
                    == Some("master")
            })
            .map(RedisServer::port)
            .collect()
    }

    /// The replica of the primary on `primary`.
    pub fn replica_of(&self, primary: u16) -> u16 {
        let mut conn = self.connection(primary);
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut conn)
            .expect("INFO replication");
        // slave0:ip=127.0.0.1,port=NNNN,state=online,...
        info.lines()
            .find_map(|line| {
                let rest = line.strip_prefix("slave0:")?;
                rest.split(',')
                    .find_map(|kv| kv.strip_prefix("port="))?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("{primary} has no replica:\n{info}"))
    }

    /// The primary that serves `key` now.
    pub fn primary_for(&self, key: &str) -> u16 {
        let mut conn = self.connection(self.primaries()[0]);
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut conn)
            .expect("CLUSTER KEYSLOT");
        let slots: Vec<(u16, u16, (String, u16))> = {
            let raw: redis::Value = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query(&mut conn)
                .expect("CLUSTER SLOTS");
            parse_slots(&raw)
        };
        slots
            .into_iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, (_, port))| port)
            .expect("every slot is served")
    }

    /// `CLUSTER FAILOVER` on a replica: it takes over from its primary
    /// with no write lost; returns when it says it is primary.
    pub fn failover(&self, replica: u16) {
        let mut conn = self.connection(replica);
        let _: () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut conn)
            .expect("CLUSTER FAILOVER");
        wait_for("the replica to take over", FORM_TIMEOUT, || {
            role(&mut conn).as_deref() == Some("master")
        });
    }

    /// Keys on a node, all of them (for the TTL and privacy checks).
    pub fn keys(&self, port: u16) -> Vec<String> {
        let mut conn = self.connection(port);
        redis::cmd("KEYS")
            .arg("*")
            .query(&mut conn)
            .unwrap_or_default()
    }

    pub fn log(&self, port: u16) -> PathBuf {
        self.node(port).log()
    }

    /// Runs `redis-cli --cluster ARGS...` against this cluster.
    pub fn cli_cluster(&self, args: &[&str]) -> std::process::Output {
        let mut cmd = self.cli();
        cmd.arg("--cluster").args(args);
        cmd.stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster")
    }

    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }
}

/// `CLUSTER SLOTS` as `(first, last, (host, port of the primary))`.
fn parse_slots(raw: &redis::Value) -> Vec<(u16, u16, (String, u16))> {
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => u16::try_from(*i).ok(),
        _ => None,
    };
    let mut out = Vec::new();
    if let redis::Value::Array(ranges) = raw {
        for range in ranges {
            let redis::Value::Array(items) = range else {
                continue;
            };
            let (Some(lo), Some(hi)) = (items.first().and_then(int), items.get(1).and_then(int))
            else {
                continue;
            };
            if let Some(redis::Value::Array(node)) = items.get(2) {
                let host = match node.first() {
                    Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
                    _ => String::new(),
                };
                if let Some(port) = node.get(1).and_then(int) {
                    out.push((lo, hi, (host, port)));
                }
            }
        }
    }
    out
}

/// A primary, its replica, and three Sentinels watching them under the
/// name [`SentinelSet::MASTER`], with a quorum of two.
pub struct SentinelSet {
    pub primary: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<SentinelProcess>,
}

/// Sentinels, data nodes and replication all over TLS with `files`.
pub fn sentinel_tls_builder(files: &TlsFiles) -> Builder {
    RedisServer::builder()
        .tls(files.clone())
        .config("tls-replication yes")
}

impl SentinelSet {
    pub const MASTER: &'static str = "mymaster";

    pub fn start() -> SentinelSet {
        SentinelSet::start_with(RedisServer::builder())
    }

    /// Both data nodes from `builder` (ACL lines, say).
    pub fn start_with(builder: Builder) -> SentinelSet {
        SentinelSet::start_tls(builder, None)
    }

    /// As [`SentinelSet::start_with`]; with `tls`, the Sentinels serve TLS
    /// only and reach the data nodes over TLS (the builder must serve TLS
    /// too: [`sentinel_tls_builder`]).
    pub fn start_tls(builder: Builder, tls: Option<TlsFiles>) -> SentinelSet {
        let primary = builder.clone().start();
        let replica = builder
            .config(&format!("replicaof 127.0.0.1 {}", primary.port()))
            .start();
        wait_for("the replica to sync", FORM_TIMEOUT, || {
            let mut conn = replica.connection();
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut conn)
                .unwrap_or_default();
            info.contains("master_link_status:up")
        });
        let sentinels = (0..3)
            .map(|_| SentinelProcess::start(primary.port(), tls.clone()))
            .collect();
        let set = SentinelSet {
            primary,
            replica,
            sentinels,
        };
        // Each Sentinel has found the replica and the other Sentinels.
        wait_for("the Sentinels to agree", FORM_TIMEOUT, || {
            set.sentinels.iter().all(|s| {
                let mut conn = s.connection();
                let replicas: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(Self::MASTER)
                    .query(&mut conn)
                    .unwrap_or_default();
                let sentinels: Vec<redis::Value> = redis::cmd("SENTINEL")
                    .arg("SENTINELS")
                    .arg(Self::MASTER)
                    .query(&mut conn)
                    .unwrap_or_default();
                !replicas.is_empty() && sentinels.len() == 2
            })
        });
        set
    }

    /// `redis://127.0.0.1:PORT` of each Sentinel.
    pub fn urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| s.url()).collect()
    }

    /// The primary's port as the Sentinels report it.
    pub fn current_primary(&self) -> u16 {
        let mut conn = self.sentinels[0].connection();
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(Self::MASTER)
            .query(&mut conn)
            .expect("SENTINEL GET-MASTER-ADDR-BY-NAME");
        port
    }

    /// `SENTINEL FAILOVER`: the replica is promoted (no agreement needed);
    /// returns once it takes writes, with the new primary's port.
    pub fn failover(&self) -> u16 {
        let before = self.current_primary();
        let mut conn = self.sentinels[0].connection();
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(Self::MASTER)
            .query(&mut conn)
            .expect("SENTINEL FAILOVER");
        let mut after = before;
        wait_for("the Sentinels to switch primaries", FORM_TIMEOUT, || {
            after = self.current_primary();
            after != before
        });
        let node = if after == self.replica.port() {
            &self.replica
        } else {
            &self.primary
        };
        wait_for("the new primary to take writes", FORM_TIMEOUT, || {
            let mut conn = node.connection();
            role(&mut conn).as_deref() == Some("master")
        });
        after
    }
}

/// A `redis-server --sentinel` on a free port.
pub struct SentinelProcess {
    port: u16,
    dir: TempDir,
    child: Child,
    tls: Option<TlsFiles>,
}

impl SentinelProcess {
    fn start(primary: u16, tls: Option<TlsFiles>) -> SentinelProcess {
        for _ in 0..5 {
            let port = super::free_port();
            let dir = tempfile::tempdir().expect("temp dir");
            let conf = dir.path().join("sentinel.conf");
            let listen = match &tls {
                None => format!("port {port}\n"),
                Some(t) => format!(
                    "port 0\ntls-port {port}\ntls-cert-file {}\ntls-key-file {}\n\
                     tls-ca-cert-file {}\ntls-auth-clients no\ntls-replication yes\n",
                    t.cert.display(),
                    t.key.display(),
                    t.ca.display()
                ),
            };
            std::fs::write(
                &conf,
                format!(
                    "{listen}bind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
                     sentinel resolve-hostnames no\n\
                     sentinel monitor {master} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {master} 1000\n\
                     sentinel failover-timeout {master} 5000\n\
                     sentinel parallel-syncs {master} 1\n",
                    dir = dir.path().display(),
                    master = SentinelSet::MASTER,
                ),
            )
            .expect("write sentinel.conf");
            let child = Command::new(
                std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned()),
            )
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run redis-server --sentinel ({e})"));
            let mut sentinel = SentinelProcess {
                port,
                dir,
                child,
                tls: tls.clone(),
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = sentinel.child.try_wait() {
                    break; // the port was taken: try another
                }
                let pong = sentinel
                    .client()
                    .get_connection_with_timeout(Duration::from_millis(300))
                    .ok()
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c).ok());
                if pong.as_deref() == Some("PONG") {
                    return sentinel;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = sentinel.child.kill();
            eprintln!(
                "sentinel on {port} did not answer:\n{}",
                std::fs::read_to_string(sentinel.log()).unwrap_or_default()
            );
        }
        panic!("no Sentinel could start");
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    fn client(&self) -> redis::Client {
        match &self.tls {
            None => redis::Client::open(self.url()).expect("client"),
            Some(tls) => redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(&tls.ca).expect("read CA")),
                },
            )
            .expect("TLS client"),
        }
    }

    pub fn connection(&self) -> redis::Connection {
        connection(&self.url(), self.tls.as_ref())
    }

    pub fn log(&self) -> PathBuf {
        self.dir.path().join("sentinel.log")
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP relay standing for a stable address in front of the primary:
/// each new connection goes to the port [`Relay::switch`] last named;
/// connections already open stay with the node they reached, as they do
/// behind a DNS name or a cloud primary endpoint.
pub struct Relay {
    addr: SocketAddr,
    target: Arc<AtomicU16>,
    held: Arc<AtomicBool>,
    accept: JoinHandle<()>,
}

impl Relay {
    pub async fn start(target: u16) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay address");
        let target = Arc::new(AtomicU16::new(target));
        let held = Arc::new(AtomicBool::new(false));
        let (to, hold) = (target.clone(), held.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let port = to.load(Ordering::SeqCst);
                let hold = hold.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await else {
                        return;
                    };
                    let _ = server.set_nodelay(true);
                    let _ = client.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        pipe(client_read, server_write, hold.clone()),
                        pipe(server_read, client_write, hold),
                    );
                });
            }
        });
        Relay {
            addr,
            target,
            held,
            accept,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// New connections go to `port` from now on.
    pub fn switch(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
    }

    /// While held, bytes read from either side are dropped, never
    /// delivered: a link that has gone silent (a partition), with both
    /// sockets still open.
    pub fn hold(&self, held: bool) {
        self.held.store(held, Ordering::SeqCst);
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    held: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if held.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
