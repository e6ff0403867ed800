//! The memory budget for what clients make sluice hold: request heads.
//!
//! A client decides how many bytes of request head sluice holds for it:
//! an HTTP/1 head sent all but its last line sits in hyper's buffer until
//! `header_read_timeout`, and every open HTTP/2 stream holds its decoded
//! header list for as long as its exchange runs. The per-connection bounds
//! of hyper and h2 alone multiply out to far more than a pod has (64 KiB
//! lists × 128 streams × every connection one address may open), and an
//! out-of-memory kill is an outage that also wipes every memory-store
//! count. So those bytes are charged, before sluice goes on holding them,
//! to three budgets at once: the connection's (`per_connection`), its
//! client address's (`per_client`; an IPv6 client owns a /64, as for
//! connection counts), and the process's (`total`). An HTTP/2 stream is
//! charged [`STREAM_COST`] on top of its header list, for the state it
//! holds whatever its headers, so open streams count in the client's
//! budget too.
//!
//! Past a budget the head is refused, never the process killed: an HTTP/2
//! stream is answered 503 at once (its list dropped with it), an HTTP/1
//! connection sending a head is answered 503 and closed. Each refusal is
//! counted in `sluice_head_budget_refused_total{reason}` and logged at
//! WARN at most once every [`WARN_EVERY`].

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::sync;
use crate::telemetry;

use super::per_peer::Held;

/// What one HTTP/2 stream is charged beyond its header list: h2's stream
/// state, the request's task and its exchange with the app, an upstream
/// connection of its own among them. Measured at about 24 KB of RSS a
/// held stream with a 150-byte list (and 61 KB with a 30 KB one), so with
/// the list's own bytes every held stream costs about 1.5 times what it is
/// charged (docs/OPERATIONS.md, "Memory").
pub const STREAM_COST: usize = 16 * 1024;

/// At most one WARN this often, however many heads are refused.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// Which budget a head would have gone past.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Over {
    Connection,
    Client,
    Total,
}

impl Over {
    /// The metric's `reason` label.
    pub fn label(self) -> &'static str {
        match self {
            Over::Connection => "connection",
            Over::Client => "client",
            Over::Total => "total",
        }
    }
}

/// The bounds, in bytes of request head (HTTP/2: the header list's size
/// as RFC 9113 §6.5.2 counts it, plus [`STREAM_COST`] a stream), as
/// `server.request_heads` sets them.
pub type Limits = crate::config::RequestHeads;

/// The process's budget: what every connection holds in all.
pub struct Budget {
    limits: Limits,
    held: AtomicUsize,
    /// The most held at once since [`Budget::high_since`] last read it: a
    /// flood on a fast path holds its heads for a moment only, between two
    /// readings of `held`.
    high: AtomicUsize,
    held_gauge: metrics::Gauge,
    refused: [metrics::Counter; 3],
    refusals: AtomicUsize,
    last_warning: Mutex<Option<Instant>>,
}

impl Budget {
    pub fn new(limits: Limits) -> Arc<Budget> {
        let refused = [Over::Connection, Over::Client, Over::Total].map(
            |over| metrics::counter!(telemetry::HEAD_BUDGET_REFUSED, "reason" => over.label()),
        );
        Arc::new(Budget {
            limits,
            held: AtomicUsize::new(0),
            high: AtomicUsize::new(0),
            held_gauge: metrics::gauge!(telemetry::HEAD_BYTES_HELD),
            refused,
            refusals: AtomicUsize::new(0),
            last_warning: Mutex::new(None),
        })
    }

    /// Bytes held now, by every connection.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// The most bytes held at once since the last call (at least what is
    /// held now).
    pub fn high_since(&self) -> usize {
        let held = self.held();
        self.high.swap(held, Ordering::Relaxed).max(held)
    }

    /// Heads refused since start.
    pub fn refusals(&self) -> usize {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Sets the gauge to what is held now.
    fn show(&self) {
        #[allow(clippy::cast_precision_loss)] // exact below 2^53 bytes
        self.held_gauge.set(self.held() as f64);
    }

    /// The budget of one connection, whose place among its client's
    /// connections is `place`.
    pub fn connection(self: &Arc<Self>, place: Held) -> Arc<Connection> {
        Arc::new(Connection {
            budget: self.clone(),
            held: AtomicUsize::new(0),
            place,
        })
    }

    /// Counts a refusal; logs it unless one was logged lately.
    fn refused(&self, over: Over) {
        self.refused[over as usize].increment(1);
        self.refusals.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut last = sync::lock(&self.last_warning);
        if last.is_some_and(|at| now < at + WARN_EVERY) {
            return;
        }
        *last = Some(now);
        drop(last);
        tracing::warn!(
            budget = over.label(),
            held = self.held(),
            limits = ?self.limits,
            "request heads refused: over the memory budget for request heads (at most one such line every 10 s)"
        );
    }
}

/// One connection's share of the budget. Charges hold it (an HTTP/2
/// stream may end after its connection's task), and with it the
/// connection's place among its client's, so a client's count never
/// drops while its heads are still held.
pub struct Connection {
    budget: Arc<Budget>,
    held: AtomicUsize,
    place: Held,
}

/// Bytes charged to a connection, its client and the process; given back
/// when dropped.
pub struct Charge {
    connection: Arc<Connection>,
    bytes: usize,
}

impl Connection {
    /// Charges `bytes`, or says which budget they would go past (charging
    /// none of them).
    pub fn charge(self: &Arc<Self>, bytes: usize) -> Result<Charge, Over> {
        self.take(bytes)?;
        Ok(Charge {
            connection: self.clone(),
            bytes,
        })
    }

    fn take(&self, bytes: usize) -> Result<(), Over> {
        let limits = &self.budget.limits;
        let client = self.place.heads();
        let steps: [(&AtomicUsize, usize, Over); 3] = [
            (&self.held, limits.per_connection, Over::Connection),
            (client, limits.per_client, Over::Client),
            (&self.budget.held, limits.total, Over::Total),
        ];
        let mut total = 0;
        for (i, (held, limit, over)) in steps.iter().enumerate() {
            let before = held.fetch_add(bytes, Ordering::Relaxed);
            if before + bytes > *limit {
                for (taken, _, _) in &steps[..=i] {
                    taken.fetch_sub(bytes, Ordering::Relaxed);
                }
                self.budget.refused(*over);
                return Err(*over);
            }
            total = before + bytes;
        }
        self.budget.high.fetch_max(total, Ordering::Relaxed);
        self.budget.show();
        Ok(())
    }

    fn give(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::Relaxed);
        self.place.heads().fetch_sub(bytes, Ordering::Relaxed);
        self.budget.held.fetch_sub(bytes, Ordering::Relaxed);
        self.budget.show();
    }
}

impl Charge {
    /// Charges `more` bytes on top; on refusal the charge is as before.
    pub fn grow(&mut self, more: usize) -> Result<(), Over> {
        self.connection.take(more)?;
        self.bytes += more;
        Ok(())
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.connection.give(self.bytes);
    }
}

/// The size of an HTTP/2 request's header list as RFC 9113 §6.5.2 counts
/// it (each field's name and value, and 32), pseudo-fields included: what
/// h2 compared with `max_header_list_size`.
pub fn header_list_size<B>(request: &http::Request<B>) -> usize {
    const FIELD: usize = 32;
    let uri = request.uri();
    let pseudo = [
        (":method", request.method().as_str().len()),
        (":scheme", uri.scheme_str().map_or(0, str::len)),
        (
            ":authority",
            uri.authority().map_or(0, |a| a.as_str().len()),
        ),
        (
            ":path",
            uri.path_and_query().map_or(0, |p| p.as_str().len()),
        ),
    ]
    .iter()
    .map(|(name, value)| name.len() + value + FIELD)
    .sum::<usize>();
    request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + FIELD)
        .sum::<usize>()
        + pseudo
}

#[cfg(test)]
mod tests;
