//! The configuration-derived state one request runs under.
//!
//! A request loads the current [`Runtime`] once and keeps that `Arc` to the
//! end, so a reload swaps what new requests see while in-flight requests
//! finish under the one they started with. It holds only the live part of
//! a configuration: what is fixed at start is built into the listeners,
//! the store and the upstream client instead.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::config::Live;
use crate::route::RouteTable;
use crate::subject::PseudonymKey;

#[derive(Debug)]
pub struct Runtime {
    pub live: Arc<Live>,
    pub routes: RouteTable,
    pub key: PseudonymKey,
}

impl Runtime {
    /// `key` comes from the configuration, or is the random key generated
    /// once at start (kept across reloads so counters do not reset).
    pub fn new(live: Arc<Live>, key: PseudonymKey) -> Runtime {
        Runtime {
            routes: RouteTable::new(&live),
            live,
            key,
        }
    }
}

/// Shared between every connection and the reloader.
pub type SharedRuntime = Arc<ArcSwap<Runtime>>;
