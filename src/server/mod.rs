//! Listeners (TCP, TLS through rustls) and the accept-and-drain loop.
//!
//! - `listener`: [`serve`], accept until shutdown, then drain with a grace.
//! - [`accept`]: back-off and throttled logging when `accept` fails, for
//!   both listeners.
//! - [`tls`]: the rustls acceptor built from the configured PEM files.
//! - `beside`: a connection polled on every wake-up, its drain and idle
//!   watchers only when they woke it.
//! - `send_timeout`: the connection wrapper that cuts a client that stops
//!   reading.
//! - [`heads`]: the memory budget for request heads, per connection,
//!   per client address and in all.
//! - `stream_watchdog`: the same for one HTTP/2 stream, which flow control
//!   stops before any socket write blocks.
//! - [`proxy_protocol`]: the PROXY protocol header, parsed; `proxied`
//!   reads it from a trusted peer and hands on the bytes after it.

pub mod accept;
mod beside;
pub(crate) mod framing;
pub mod heads;
mod listener;
mod per_peer;
mod proxied;
pub mod proxy_protocol;
mod send_timeout;
mod served;
mod stream_watchdog;
pub mod tls;
mod trim;

use std::time::Duration;

use crate::config;

pub use listener::serve;

/// How connections are served. Fixed at start: a reload does not change
/// the listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// From accept (TLS handshake included) to the end of the first request
    /// head, and for each later HTTP/1.1 request head; an idle keep-alive
    /// connection is closed after it too.
    pub header_read_timeout: Duration,
    /// Largest request head: the HTTP/1.1 read buffer (at least hyper's
    /// 8 KiB minimum) and the HTTP/2 header list.
    pub max_header_bytes: usize,
    /// How long in-flight requests and upgraded connections may run on
    /// after shutdown begins.
    pub shutdown_grace: Duration,
    /// With no request in flight for this long, a connection is closed
    /// gracefully (HTTP/2: GOAWAY, then close).
    pub idle_timeout: Duration,
    /// A write blocked on the client for this long fails the connection.
    pub send_timeout: Duration,
    pub max_connections: usize,
    /// Of those, at most this many from one client address (an IPv6
    /// /64; a /56 holds four times as many); trusted peers are not
    /// counted, the clients their PROXY protocol headers name are.
    pub max_connections_per_ip: usize,
    pub http2: config::Http2,
    /// The memory budget for request heads.
    pub request_heads: config::RequestHeads,
    /// Read from `identity.trusted_proxies` only.
    pub proxy_protocol: config::ProxyProtocol,
}

impl From<&config::ServerBoot> for Settings {
    fn from(server: &config::ServerBoot) -> Settings {
        Settings {
            header_read_timeout: server.header_read_timeout,
            max_header_bytes: server.max_header_bytes,
            shutdown_grace: server.shutdown_grace,
            idle_timeout: server.idle_timeout,
            send_timeout: server.send_timeout,
            max_connections: server.max_connections,
            max_connections_per_ip: server.max_connections_per_ip,
            http2: server.http2,
            request_heads: server.request_heads,
            proxy_protocol: server.proxy_protocol,
        }
    }
}
