//! Faults between sluice and Redis that a test switches on and off: a
//! network namespace whose link can be made to drop every packet (a
//! blackhole), and a relay that holds back every reply for a set time.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::redis::{Builder, RedisServer};

fn run(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .status()
        .is_ok_and(|s| s.success())
}

fn must(program: &str, args: &[&str]) {
    assert!(
        run(program, args),
        "`{program} {}` failed (the blackhole test needs root, `ip` and `tc`)",
        args.join(" ")
    );
}

/// A network namespace of this test's own, joined to the host's by a veth
/// pair on a /30 of its own. Processes started in it (Redis) are reached at
/// [`Netns::inner_addr`] through the veth, so dropping the veth's packets
/// cuts them off without touching loopback or any other test's ports.
///
/// Deleted on drop, panics included: the namespace, and with it both ends
/// of the veth. Drop whatever runs inside it first (declare it after).
pub struct Netns {
    name: String,
    host_if: String,
    inner_if: String,
    inner_addr: String,
}

impl Netns {
    pub fn create() -> Netns {
        static NEXT: AtomicU16 = AtomicU16::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // Names and addresses unique to this process (nextest runs every
        // test in its own) and to this namespace within it: interface names
        // stay within the kernel's 15 bytes, the /30 within 10.64.0.0/10.
        let tag = format!("{}{n}", pid % 100_000);
        let (a, b, c) = (64 + (pid >> 14) % 64, (pid >> 6) % 256, (pid % 64) * 4);
        let ns = Netns {
            name: format!("sluice-f{tag}"),
            host_if: format!("sfh{tag}"),
            inner_if: format!("sfi{tag}"),
            inner_addr: format!("10.{a}.{b}.{}", c + 2),
        };
        // A namespace left by a killed run of the same pid: start clean.
        let _ = Command::new("ip").args(["netns", "del", &ns.name]).status();
        let _ = Command::new("ip")
            .args(["link", "del", &ns.host_if])
            .status();
        must("ip", &["netns", "add", &ns.name]);
        must(
            "ip",
            &[
                "link",
                "add",
                &ns.host_if,
                "type",
                "veth",
                "peer",
                "name",
                &ns.inner_if,
            ],
        );
        must("ip", &["link", "set", &ns.inner_if, "netns", &ns.name]);
        let host_addr = format!("10.{a}.{b}.{}/30", c + 1);
        must("ip", &["addr", "add", &host_addr, "dev", &ns.host_if]);
        must("ip", &["link", "set", &ns.host_if, "up"]);
        let inner = format!("{}/30", ns.inner_addr);
        must(
            "ip",
            &["-n", &ns.name, "addr", "add", &inner, "dev", &ns.inner_if],
        );
        must("ip", &["-n", &ns.name, "link", "set", &ns.inner_if, "up"]);
        must("ip", &["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    /// The address processes inside listen on.
    pub fn inner_addr(&self) -> &str {
        &self.inner_addr
    }

    /// A Redis inside the namespace, listening on [`Netns::inner_addr`]
    /// (protected mode off: its clients come from outside loopback).
    pub fn redis(&self) -> RedisServer {
        self.redis_builder().start()
    }

    pub fn redis_builder(&self) -> Builder {
        RedisServer::builder()
            .host(&self.inner_addr)
            .config("protected-mode no")
            .wrapped(&["ip", "netns", "exec", &self.name])
    }

    /// While on, every packet either end of the veth sends is dropped (a
    /// `pfifo` queue of length 0 on both ends): connections stay open and
    /// silent, new ones get no SYN-ACK, nothing reaches Redis, no reply
    /// comes back.
    pub fn blackhole(&self, on: bool) {
        let inside = ["netns", "exec", self.name.as_str(), "tc"];
        if on {
            must(
                "tc",
                &[
                    "qdisc",
                    "replace",
                    "dev",
                    &self.host_if,
                    "root",
                    "pfifo",
                    "limit",
                    "0",
                ],
            );
            let mut args = inside.to_vec();
            args.extend([
                "qdisc",
                "replace",
                "dev",
                &self.inner_if,
                "root",
                "pfifo",
                "limit",
                "0",
            ]);
            must("ip", &args);
        } else {
            must("tc", &["qdisc", "del", "dev", &self.host_if, "root"]);
            let mut args = inside.to_vec();
            args.extend(["qdisc", "del", "dev", &self.inner_if, "root"]);
            must("ip", &args);
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
        // Deleting the namespace destroys its end of the veth and so the
        // pair; this covers a namespace something still ran in.
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .status();
    }
}

/// A TCP relay to a Redis on loopback that delivers every reply
/// [`DelayRelay::set_delay`] after it read it, in order (a slow link, or a
/// slow Redis): what sluice sends goes straight through.
pub struct DelayRelay {
    addr: SocketAddr,
    delay_us: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl DelayRelay {
    pub async fn start(target: u16) -> DelayRelay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay address");
        let delay_us = Arc::new(AtomicU64::new(0));
        let delay = delay_us.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                let delay = delay.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    let _ = server.set_nodelay(true);
                    let _ = client.set_nodelay(true);
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    tokio::join!(
                        forward(client_read, server_write),
                        delayed(server_read, client_write, delay),
                    );
                });
            }
        });
        DelayRelay {
            addr,
            delay_us,
            accept,
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Replies read from now on are delivered this much later.
    pub fn set_delay(&self, delay: Duration) {
        let us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.delay_us.store(us, Ordering::SeqCst);
    }
}

impl Drop for DelayRelay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn forward(mut from: OwnedReadHalf, mut to: OwnedWriteHalf) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// Replies read and not yet delivered, each with when it is due.
type Pending = VecDeque<(Instant, Vec<u8>)>;

/// Reads as fast as Redis writes, stamping each chunk with when it is due;
/// a writer delivers the chunks in order, each no earlier than its time.
/// A chunk is never delivered before one read ahead of it, whatever the
/// delays: the byte stream is the one Redis wrote, only later.
async fn delayed(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay_us: Arc<AtomicU64>) {
    let queue: Arc<Mutex<Pending>> = Arc::default();
    let ready = Arc::new(Notify::new());
    let (q, r) = (queue.clone(), ready.clone());
    let writer = tokio::spawn(async move {
        loop {
            let next = q.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            let Some((due, chunk)) = next else {
                r.notified().await;
                continue;
            };
            tokio::time::sleep_until(due).await;
            if chunk.is_empty() || to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        let due = Instant::now() + Duration::from_micros(delay_us.load(Ordering::SeqCst));
        // An empty chunk marks the end: the writer stops after the rest.
        queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back((due, buf[..n].to_vec()));
        ready.notify_one();
        if n == 0 {
            break;
        }
    }
    let _ = writer.await;
}
