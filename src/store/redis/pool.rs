//! Connections: a few multiplexed connections shared by every request.
//!
//! Checking out a connection exclusively per request halves throughput:
//! each request then pays its own write and read syscalls. A multiplexed
//! connection lets concurrent requests' commands coalesce into one write.
//! So the pool's objects are not lent to one request each: each *lane*
//! holds one pooled connection, and every request picks a lane round-robin
//! and sends on a clone of its connection.
//!
//! deadpool-redis still owns the connections: it creates them (at most
//! `pool_size`, and no more than one per core), and a lane whose connection
//! failed takes it out of the pool and checks out a fresh one on next use.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use deadpool_redis::redis::aio::MultiplexedConnection;
use deadpool_redis::{Manager, Pool, PoolError, Runtime};
use redis::{ConnectionAddr, IntoConnectionInfo, RedisError, TlsCertificates};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::RedisSetupError;
use crate::config;

pub struct Lanes {
    pool: Pool,
    lanes: Box<[Lane]>,
    next: AtomicUsize,
}

struct Lane {
    current: Mutex<Option<Arc<Held>>>,
    /// Only one request per lane connects at a time; the others wait for it
    /// (under their own deadline) instead of opening connections of their own.
    filling: tokio::sync::Mutex<()>,
}

/// A pooled connection a lane holds. Requests send on clones of `conn`.
pub struct Held {
    conn: MultiplexedConnection,
    object: Mutex<Option<deadpool_redis::Connection>>,
}

/// One request's use of a lane's connection.
pub struct Checkout {
    lane: usize,
    held: Arc<Held>,
    pub conn: MultiplexedConnection,
}

/// Where acquiring a connection stood, read after a deadline cut it short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for another request to finish connecting this lane.
    Waiting,
    /// Opening a connection (TCP, TLS, AUTH): nothing of ours sent yet.
    Connecting,
}

pub enum AcquireError {
    /// The pool had no connection to give (its bound reached).
    Exhausted,
    /// Connecting failed: refused, unreachable, TLS or authentication.
    Connect(RedisError),
}

impl Lanes {
    pub fn new(redis: &config::RedisStore) -> Result<Lanes, RedisSetupError> {
        // `pool_size` caps the connections; more lanes than cores only split
        // the coalescing (measured on 2 cores at 8 concurrent requests: one
        // lane 29k evaluations/s, four 17k, sixteen 20k).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let lanes = redis.pool_size.clamp(1, cores);
        let manager = Manager::new(connection_info(redis)?).map_err(|_| RedisSetupError::Url)?;
        let pool = Pool::builder(manager)
            .max_size(lanes)
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| RedisSetupError::Pool(e.to_string()))?;
        Ok(Lanes {
            pool,
            lanes: (0..lanes)
                .map(|_| Lane {
                    current: Mutex::new(None),
                    filling: tokio::sync::Mutex::new(()),
                })
                .collect(),
            next: AtomicUsize::new(0),
        })
    }

    /// A connection to send on: the next lane's, connecting it first if it
    /// has none. `stage` tells the caller where a deadline interrupted.
    pub async fn acquire(&self, stage: &mut Stage) -> Result<Checkout, AcquireError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
        let lane = &self.lanes[index];
        if let Some(held) = lane.get() {
            return Ok(Checkout::new(index, held));
        }
        *stage = Stage::Waiting;
        let _filling = lane.filling.lock().await;
        if let Some(held) = lane.get() {
            return Ok(Checkout::new(index, held));
        }
        *stage = Stage::Connecting;
        let object = self.pool.get().await.map_err(|e| match e {
            PoolError::Backend(e) => AcquireError::Connect(e),
            PoolError::Timeout(_)
            | PoolError::Closed
            | PoolError::NoRuntimeSpecified
            | PoolError::PostCreateHook(_) => AcquireError::Exhausted,
        })?;
        let held = Arc::new(Held {
            conn: (*object).clone(),
            object: Mutex::new(Some(object)),
        });
        *lane.lock() = Some(held.clone());
        Ok(Checkout::new(index, held))
    }

    /// Drops a connection that failed, unless its lane already replaced it.
    /// Requests still waiting on it get their own error; the next request on
    /// the lane connects afresh.
    pub fn retire(&self, checkout: &Checkout) {
        let lane = &self.lanes[checkout.lane];
        let mut current = lane.lock();
        if current
            .as_ref()
            .is_some_and(|held| Arc::ptr_eq(held, &checkout.held))
        {
            *current = None;
            drop(current);
            checkout.held.detach();
        }
    }

    /// Connections currently held by lanes.
    pub fn connected(&self) -> usize {
        self.lanes.iter().filter(|l| l.get().is_some()).count()
    }
}

impl Lane {
    fn get(&self) -> Option<Arc<Held>> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<Held>>> {
        // Holds only an Option<Arc>, replaced whole: never half-written.
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Held {
    /// Takes the connection out of the pool for good, freeing its slot at
    /// once (requests still holding clones finish or fail on their own).
    fn detach(&self) {
        let object = self.object.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(object) = object {
            drop(deadpool_redis::Connection::take(object));
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // A lane's connection is never returned to the pool for reuse: it is
        // either in a lane or broken.
        self.detach();
    }
}

impl Checkout {
    fn new(lane: usize, held: Arc<Held>) -> Checkout {
        Checkout {
            lane,
            conn: held.conn.clone(),
            held,
        }
    }
}

/// The URL (credentials included) and, for `rediss://` with a private CA,
/// that CA as the only trust root.
fn connection_info(redis: &config::RedisStore) -> Result<redis::ConnectionInfo, RedisSetupError> {
    // The error text is not passed on: it may quote the URL, password and all.
    let info = redis
        .url
        .expose()
        .into_connection_info()
        .map_err(|_| RedisSetupError::Url)?;
    let tls = matches!(info.addr, ConnectionAddr::TcpTls { .. });
    if tls {
        // redis-rs builds its rustls config from the process default
        // provider; install one unless the server's TLS already did.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let Some(ca_file) = &redis.ca_file else {
        return Ok(info);
    };
    if !tls {
        return Err(RedisSetupError::CaFileWithoutTls);
    }
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
    let client = redis::Client::build_with_tls(
        info,
        TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        },
    )
    .map_err(|e| RedisSetupError::CaFile {
        path: ca_file.clone(),
        reason: e.to_string(),
    })?;
    Ok(client.get_connection_info().clone())
}
