//! Connections: a few multiplexed connections shared by every request.
//!
//! Checking out a connection exclusively per request halves throughput:
//! each request then pays its own write and read syscalls. A multiplexed
//! connection lets concurrent requests' commands coalesce into one write.
//! So connections are not lent to one request each: each *lane* holds one
//! connection, and every request picks a lane round-robin and sends on a
//! clone of it. A lane whose connection failed, or whose node said it
//! cannot take writes any more, drops it; the next request on the lane
//! connects afresh through the [`Connector`], which resolves the address
//! (or asks the Sentinels, or the cluster) again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::connect::{Conn, Connector};
use super::counted::Calls;
use super::RedisSetupError;
use crate::config;
use crate::sync;

pub struct Lanes {
    connector: Connector,
    /// What every connection sends, counted (`counted`).
    calls: Arc<Calls>,
    lanes: Box<[Lane]>,
    next: AtomicUsize,
}

struct Lane {
    current: Mutex<Option<Arc<Held>>>,
    /// Only one request per lane connects at a time; the others wait for it
    /// (under their own deadline) instead of opening connections of their own.
    filling: tokio::sync::Mutex<()>,
}

/// A connection a lane holds. Requests send on clones of `conn`.
pub struct Held {
    conn: Conn,
}

/// One request's use of a lane's connection.
pub struct Checkout {
    lane: usize,
    held: Arc<Held>,
    pub conn: Conn,
}

/// Where acquiring a connection stood, read after a deadline cut it short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Waiting for another request to finish connecting this lane.
    Waiting,
    /// Opening a connection (TCP, TLS, AUTH, a Sentinel or cluster lookup):
    /// nothing of ours sent yet.
    Connecting,
}

impl Lanes {
    pub fn new(redis: &config::RedisStore, budget: Duration) -> Result<Lanes, RedisSetupError> {
        // `pool_size` caps the connections; more lanes than cores only split
        // the coalescing (measured on 2 cores at 8 concurrent requests: one
        // lane 29k evaluations/s, four 17k, sixteen 20k).
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let lanes = redis.pool_size.clamp(1, cores);
        Ok(Lanes {
            connector: Connector::new(redis, budget)?,
            calls: Calls::new(),
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
    pub async fn acquire(&self, stage: &mut Stage) -> Result<Checkout, redis::RedisError> {
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
        // Boxed: connecting is rare, and its futures (TLS, the Sentinels,
        // the cluster's discovery) would otherwise make every decision's
        // future as large.
        let held = Arc::new(Held {
            conn: Box::pin(self.connector.connect(&self.calls)).await?,
        });
        *lane.lock() = Some(held.clone());
        Ok(Checkout::new(index, held))
    }

    /// Drops a connection that failed, unless its lane already replaced it.
    /// Requests still sending on it get their own answer or error; the next
    /// request on the lane connects afresh.
    pub fn retire(&self, checkout: &Checkout) {
        let lane = &self.lanes[checkout.lane];
        let mut current = lane.lock();
        if current
            .as_ref()
            .is_some_and(|held| Arc::ptr_eq(held, &checkout.held))
        {
            *current = None;
        }
    }

    /// Whether the connections re-send a command by themselves
    /// ([`Connector::resends_by_itself`]).
    pub fn resends_by_itself(&self) -> bool {
        self.connector.resends_by_itself()
    }

    /// How many lanes there are.
    pub fn len(&self) -> usize {
        self.lanes.len()
    }

    /// Connections currently held by lanes (a cluster lane's counts once,
    /// whatever the number of nodes behind it).
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
        sync::lock(&self.current)
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
