//! The exchange with the app of a request that holds or owes something:
//! concurrency places, or a charge made on the response. It runs in a
//! task of its own, so that a client who hangs up takes neither with it.
//!
//! hyper drops a request's future when its client goes away (an HTTP/1
//! connection closed, an HTTP/2 stream reset). Were the exchange part of
//! that future, it would go too, while the app, which seldom notices a
//! closed socket, keeps working: the place would be free for another
//! request and the response never charged. So the exchange is spawned:
//! it runs on, bounded by `upstream.timeout` as any exchange is; the
//! response is charged when its head arrives; the places are held by the
//! response body until it ends, read to its end when nobody else will
//! ([`Holding`]). The request's future only waits for the response.
//!
//! A request that neither holds nor owes anything is forwarded in its own
//! future, as before: nothing is left to keep when its client goes.

use std::sync::Arc;

use crate::proxy::buffered::Inbound;
use http::{Request, Response};
use smallvec::SmallVec;
use tokio::sync::oneshot;

use crate::proxy::body::Body;
use crate::proxy::holding::Holding;
use crate::proxy::runtime::Runtime;
use crate::proxy::upstream::UpstreamError;
use crate::proxy::ConnInfo;
use crate::store::in_flight::Permit;
use crate::subject::{Pseudonym, Resolved};

use super::on_response::{self, Due, Reservation, Settlement};
use super::{Answered, Check, Proxy};

/// The units each limit charged on response was charged: its index among
/// the request's checks, and the units.
pub(super) type Charges = SmallVec<[(usize, u32); 1]>;

/// What a forwarded request holds until its exchange is done.
pub(super) struct Held {
    /// Its concurrency places, held until the response body ends.
    pub permits: SmallVec<[Permit; 1]>,
    /// What the limits charged on response reserved, settled when the
    /// response head arrives.
    pub reservations: SmallVec<[(usize, Reservation); 1]>,
}

/// A [`Check`] without its borrow of the runtime, to take into a task
/// that owns the runtime.
#[derive(Clone, Copy)]
struct Detached {
    /// Its index among the request's checks.
    index: usize,
    reserved: Option<Reservation>,
    route: usize,
    route_at: usize,
    limit: usize,
    subject: Pseudonym,
    resolved: Resolved,
    tier: u8,
}

impl Detached {
    fn of(index: usize, check: &Check<'_>, reserved: Option<Reservation>) -> Detached {
        Detached {
            index,
            reserved,
            route: check.entry.at,
            route_at: check.route_at,
            limit: check.limit,
            subject: check.subject,
            resolved: check.resolved,
            tier: check.tier,
        }
    }

    fn attach<'r>(&self, runtime: &'r Runtime) -> Check<'r> {
        Check {
            entry: runtime.entry(self.route),
            route_at: self.route_at,
            limit: self.limit,
            subject: self.subject,
            resolved: self.resolved,
            tier: self.tier,
        }
    }
}

/// What a request holds or owes that its exchange must keep when the
/// client goes, if anything. Taken and given back whole, never lent: a
/// local once lent keeps its room in the request's future to the end of
/// its scope.
pub(super) fn needed(checks: &[Check<'_>], held: Held) -> Option<Held> {
    let owes = checks.iter().any(|c| c.limit().on_response().is_some());
    (owes || !held.permits.is_empty()).then_some(held)
}

/// Forwards `request` to the app through the request's primary route
/// (`route`, its number in `runtime`), in a task of its own; the response
/// once its head is in, and what the limits charged on response were
/// charged. What the request `held` is kept until the exchange is done.
pub(super) async fn run(
    proxy: Arc<Proxy>,
    runtime: Arc<Runtime>,
    request: Request<Inbound>,
    conn: ConnInfo,
    route: usize,
    checks: &[Check<'_>],
    held: Held,
) -> (Response<Body>, Charges) {
    let Held {
        permits,
        reservations,
    } = held;
    let owed: SmallVec<[Detached; 1]> = checks
        .iter()
        .enumerate()
        .filter(|(_, check)| check.limit().on_response().is_some())
        .map(|(i, check)| {
            let reserved = reservations.iter().find(|(at, _)| *at == i);
            Detached::of(i, check, reserved.map(|&(_, r)| r))
        })
        .collect();
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let live = &*runtime.live;
        let (response, answered) = proxy
            .forward(
                request,
                &conn,
                live,
                runtime.entry(route),
                |response, answered| (response, answered),
            )
            .await;
        let mut charges = Charges::new();
        for owed in &owed {
            let check = owed.attach(&runtime);
            let due = match answered {
                Answered::App => {
                    on_response::due(&check, response.status().as_u16(), response.headers())
                }
                Answered::TimedOut => on_response::due_timed_out(&check),
                Answered::Sluice => None,
            };
            charges.push((owed.index, due.as_ref().map_or(0, Due::units)));
            if let Some(settlement) = Settlement::of(&check, owed.reserved, due) {
                on_response::settle(&proxy.store, settlement, live.store.budget);
            }
        }
        let response = if permits.is_empty() {
            response
        } else {
            let drain_for = live.upstream.timeout;
            response.map(|body| Body::new(Holding::new(body, permits, drain_for)))
        };
        // When the client has gone, the response is dropped here, and its
        // body, read to the end, gives the places back.
        let _ = tx.send((response, charges));
    });
    match rx.await {
        Ok(answer) => answer,
        // Only a panic in the task ends it without an answer.
        Err(_) => (UpstreamError::Broken.response(), Charges::new()),
    }
}
