//! Everything between sluice and the app: the exchange, the connections it
//! runs on, what sluice refuses in the app's answer, the app's time, and
//! the connections that switch protocols.
//!
//! - `forward`: the streaming exchange with the app, and [`UpstreamError`],
//!   every way it ends without the app's answer, each with its response
//!   and its metric label.
//! - `pool`: the app's kept-alive connections, and the one resend of a
//!   request that met a connection the app had just closed.
//! - `head`: what sluice refuses in an upstream response head that hyper's
//!   client lets through, and the client's explicit head limits.
//! - `interim`: the app's `1xx` responses, counted on the connection's
//!   socket as they arrive.
//! - `timer`: `upstream.timeout`, counting the app's turns only, from the
//!   end of the request body.
//! - `upgrade`: WebSocket and other HTTP/1.1 upgrades, tracked for
//!   shutdown.

mod forward;
mod head;
mod interim;
mod pool;
mod timer;
mod upgrade;

pub(crate) use forward::forward;
pub use forward::{Upstream, UpstreamError};
