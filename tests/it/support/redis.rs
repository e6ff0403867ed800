//! A real `redis-server` for tests: started on a free loopback port with no
//! persistence, killed on drop, restartable on the same port (empty, with
//! no scripts loaded: what a failover or restart looks like).
//!
//! A missing `redis-server` binary fails the test: the Redis store is only
//! ever tested against the real thing, never skipped.
#![allow(dead_code)]

use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// `REDIS_SERVER` overrides where the binary is looked up.
fn binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

const START_TIMEOUT: Duration = Duration::from_secs(10);

/// PEM files for a TLS listener, and the CA clients should trust.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

#[derive(Default, Clone)]
pub struct Builder {
    config: Vec<String>,
    tls: Option<TlsFiles>,
    admin: Option<(String, String)>,
    host: Option<String>,
    wrapper: Vec<String>,
}

impl Builder {
    /// A line of `redis.conf` (e.g. `user app on >pw ~app:* +get`).
    pub fn config(mut self, line: &str) -> Builder {
        self.config.push(line.to_owned());
        self
    }

    /// Serve TLS only (`tls-port`; the plain port is closed).
    pub fn tls(mut self, files: TlsFiles) -> Builder {
        self.tls = Some(files);
        self
    }

    /// The user the helper itself connects as (when `default` is off).
    pub fn admin(mut self, user: &str, password: &str) -> Builder {
        self.admin = Some((user.to_owned(), password.to_owned()));
        self
    }

    /// Listen on `host` instead of 127.0.0.1 (an address in another
    /// network namespace, say).
    pub fn host(mut self, host: &str) -> Builder {
        self.host = Some(host.to_owned());
        self
    }

    /// Run `redis-server` under `command` (e.g. `ip netns exec NAME`),
    /// which must exec it in place so that the child is the server itself.
    pub fn wrapped(mut self, command: &[&str]) -> Builder {
        self.wrapper = command.iter().map(|s| (*s).to_owned()).collect();
        self
    }

    pub fn start(self) -> RedisServer {
        let mut server = self.server(0);
        // A free port can be taken between probing and binding: retry.
        for _ in 0..5 {
            server.port = super::free_port();
            if server.spawn() {
                return server;
            }
        }
        panic!("redis-server did not start; see {}", server.log().display());
    }

    /// On a port whose cluster bus (port + 10000) is free too, below 55536
    /// (a cluster node listens on both).
    pub fn start_with_bus(self) -> RedisServer {
        for _ in 0..20 {
            let port = port_with_bus();
            let mut server = self.clone().server(port);
            if server.spawn() {
                return server;
            }
        }
        panic!("no redis-server with a free bus port could start");
    }

    /// On a port chosen by the caller (e.g. one a store already points at).
    pub fn start_on(self, port: u16) -> RedisServer {
        let mut server = self.server(port);
        assert!(
            server.spawn(),
            "redis-server did not start on {port}; see {}",
            server.log().display()
        );
        server
    }

    fn server(self, port: u16) -> RedisServer {
        RedisServer {
            port,
            dir: tempfile::tempdir().expect("temp dir"),
            config: self.config,
            tls: self.tls,
            admin: self.admin,
            host: self.host.unwrap_or_else(|| "127.0.0.1".to_owned()),
            wrapper: self.wrapper,
            child: None,
        }
    }
}

pub struct RedisServer {
    port: u16,
    dir: TempDir,
    config: Vec<String>,
    tls: Option<TlsFiles>,
    admin: Option<(String, String)>,
    host: String,
    wrapper: Vec<String>,
    child: Option<Child>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        Builder::default().start()
    }

    pub fn builder() -> Builder {
        Builder::default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:port` (or `rediss://`), without credentials.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://{}:{}", self.host, self.port)
    }

    /// The same URL with a user and password.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        self.url()
            .replacen("://", &format!("://{user}:{password}@"), 1)
    }

    /// A plain (blocking) client as the admin user, for inspecting keys.
    pub fn client(&self) -> redis::Client {
        let url = match &self.admin {
            Some((user, password)) => self.url_as(user, password),
            None => self.url(),
        };
        match &self.tls {
            None => redis::Client::open(url).expect("client"),
            Some(tls) => redis::Client::build_with_tls(
                url,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(std::fs::read(&tls.ca).expect("read CA")),
                },
            )
            .expect("TLS client"),
        }
    }

    pub fn connection(&self) -> redis::Connection {
        self.client()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("connect to redis-server")
    }

    /// Stops the server at once (SIGKILL): no clean shutdown, connections
    /// reset, like a crash.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A fresh, empty server on the same port (no keys, no scripts).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + START_TIMEOUT;
        // The port may linger briefly after the kill.
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not restart on port {}; see {}",
                self.port,
                self.log().display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn log(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Starts the process and waits until it answers PING. False if it
    /// exited (the port was taken).
    fn spawn(&mut self) -> bool {
        let conf = self.write_config();
        let mut command = match self.wrapper.split_first() {
            None => Command::new(binary()),
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(binary());
                command
            }
        };
        let child = command
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) => panic!(
                "cannot run `{}` ({e}): the Redis store tests need redis-server installed",
                binary()
            ),
        };
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    self.child = None;
                    return false;
                }
            }
            if self.pings() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        false
    }

    /// The process is running (not killed, not exited).
    pub fn alive(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Pauses the process (SIGSTOP) or resumes it (SIGCONT).
    /// Sends `signal` to the server; for `STOP`, returns once the kernel
    /// shows it stopped (a signal is delivered a moment after `kill`
    /// returns, and a server still running then would answer).
    pub fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let _ = Command::new("kill")
                .arg(format!("-{signal}"))
                .arg(child.id().to_string())
                .status();
            if signal == "STOP" {
                let stat = format!("/proc/{}/stat", child.id());
                let stopped = || {
                    std::fs::read_to_string(&stat).is_ok_and(|s| {
                        // The state follows the parenthesised command name.
                        s.rsplit_once(") ")
                            .is_some_and(|(_, rest)| rest.starts_with('T'))
                    })
                };
                let by = Instant::now() + Duration::from_secs(2);
                while !stopped() {
                    assert!(Instant::now() < by, "redis-server did not stop");
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
    }

    fn pings(&self) -> bool {
        let Ok(mut conn) = self
            .client()
            .get_connection_with_timeout(Duration::from_millis(500))
        else {
            return false;
        };
        redis::cmd("PING")
            .query::<String>(&mut conn)
            .is_ok_and(|p| p == "PONG")
    }

    fn write_config(&self) -> PathBuf {
        let path = self.dir.path().join("redis.conf");
        let mut conf = String::new();
        let dir = self.dir.path().display();
        conf.push_str(&format!(
            "bind {}\nsave \"\"\nappendonly no\ndir {dir}\nlogfile {}\n",
            self.host,
            self.log().display()
        ));
        match &self.tls {
            None => conf.push_str(&format!("port {}\n", self.port)),
            Some(tls) => conf.push_str(&format!(
                "port 0\ntls-port {}\ntls-cert-file {}\ntls-key-file {}\n\
                 tls-ca-cert-file {}\ntls-auth-clients no\n",
                self.port,
                tls.cert.display(),
                tls.key.display(),
                tls.ca.display()
            )),
        }
        for line in &self.config {
            conf.push_str(line);
            conf.push('\n');
        }
        let mut file = std::fs::File::create(&path).expect("write redis.conf");
        file.write_all(conf.as_bytes()).expect("write redis.conf");
        path
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A loopback port below 55536 that is free, and so is port + 10000.
pub fn port_with_bus() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Spread over a range the kernel does not hand out for outgoing
    // connections (32768-60999 here), walked from a per-process start.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let start = 20_000 + (std::process::id() % 1000) as u16 * 20;
    for _ in 0..2000 {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % 12_000;
        let port = 20_000 + (start - 20_000 + offset) % 12_000;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10_000) {
            return port;
        }
    }
    panic!("no free port pair for a cluster node");
}

/// A CA and a server certificate for 127.0.0.1 / localhost, written as PEM
/// files into `dir`.
pub fn tls_files(dir: &Path) -> TlsFiles {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};

    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "sluice test CA");
    let ca = ca_params.self_signed(&ca_key).expect("CA cert");

    let server_key = KeyPair::generate().expect("server key");
    let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    params
        .subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let cert = params
        .signed_by(&server_key, &ca, &ca_key)
        .expect("server cert");

    let files = TlsFiles {
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        ca: dir.join("ca.pem"),
    };
    std::fs::write(&files.cert, cert.pem()).expect("write cert");
    std::fs::write(&files.key, server_key.serialize_pem()).expect("write key");
    std::fs::write(&files.ca, ca.pem()).expect("write CA");
    files
}

/// The names of the function libraries `conn`'s server has, those matching
/// `pattern` (a `FUNCTION LIST LIBRARYNAME` glob) when given.
pub fn function_libraries(conn: &mut redis::Connection, pattern: Option<&str>) -> Vec<String> {
    let mut list = redis::cmd("FUNCTION");
    list.arg("LIST");
    if let Some(pattern) = pattern {
        list.arg("LIBRARYNAME").arg(pattern);
    }
    let listed: Vec<Vec<redis::Value>> = list.query(conn).expect("FUNCTION LIST");
    listed
        .iter()
        .filter_map(|fields| match fields.get(1) {
            Some(redis::Value::BulkString(name)) => String::from_utf8(name.clone()).ok(),
            _ => None,
        })
        .collect()
}
