//! The accept-and-drain loop (after hyper-util's `server_graceful` example).
//!
//! Every connection is served by hyper-util's auto builder: HTTP/1.1 with
//! upgrades, and HTTP/2 (over TLS by ALPN, or in clear text with prior
//! knowledge). hyper applies its header-read timeout only with a timer set
//! (without one it is silently off), and the auto builder's
//! protocol sniffing has no timeout at all, so the first request head is
//! also bounded here, from accept. hyper has no HTTP/2 idle timeout either
//! (hyper #1628): each connection counts its requests in flight and closes
//! itself gracefully after `idle_timeout` with none (an HTTP/2 stream is in
//! flight until its response body has been handed to h2 whole; a client
//! that stops granting window is `stream_watchdog`'s). The same graceful
//! close serves the drain at shutdown, so each connection gets the drain
//! signal itself rather than through hyper-util's watcher.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper::Version;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::config;
use crate::proxy::{respond, ConnInfo, Proxy};
use crate::sleeps::HyperTimer;
use crate::telemetry;

use super::accept::AcceptErrors;
use super::beside::{beside, First};
use super::framing::{StandIns, Watched};
use super::heads;
use super::per_peer::{self, Held, PerPeer};
use super::proxied::{self, Prefixed};
use super::send_timeout::SendTimeout;
use super::served::{Activity, Finish, Served};
use super::stream_watchdog::StreamExecutor;
use super::trim::{self, Trim};
use super::Settings;

/// hyper refuses a smaller HTTP/1.1 buffer.
const MIN_H1_BUFFER: usize = 8 * 1024;

/// Accepts on `listener` until `shutdown` resolves; then stops accepting
/// (the listener is closed, so new connections are refused), asks every
/// connection to finish gracefully, and waits up to `shutdown_grace` for
/// in-flight requests and upgraded connections before cutting the rest.
///
/// While `winding_down` is set (the shutdown delay, before `shutdown`
/// resolves) everything is served as usual, but every HTTP/1 response says
/// `Connection: close`: a client with a kept-alive connection opens its
/// next one afresh, by then most likely to another pod, instead of meeting
/// the drain's close with a request already on the wire.
pub fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    settings: Settings,
    proxy: Arc<Proxy>,
    winding_down: Arc<AtomicBool>,
    shutdown: impl Future<Output = ()>,
) -> impl Future<Output = ()> {
    // Set up now rather than when the future first runs: the metric
    // handles are registered before the admin listener (started after
    // this) can be scraped, so every series is there from the start.
    let builder = Arc::new(builder(&settings));
    let (drain, draining) = watch::channel(false);
    let mut connections = JoinSet::new();
    let mut accept_errors = AcceptErrors::new("traffic");
    let refused = metrics::counter!(telemetry::CONNECTIONS_REFUSED, "limit" => "max_connections");
    let refused_per_peer = Arc::new(per_peer::Refusals::new());
    let per_peer = PerPeer::new(per_peer::Limits::of_pool(
        settings.max_connections,
        settings.max_connections_per_ip,
    ));
    let proxy_headers = Arc::new(proxied::Counters::new());
    // A trusted balancer's connections while their PROXY protocol header
    // is awaited, per balancer address. It sends the header as it
    // connects, so they wait only between accept and the first read, yet
    // a burst of new clients through one balancer can put hundreds there
    // at once: they may take a quarter of the pool (or the per-address
    // share, if larger), so a trusted host that connects and says nothing
    // (the trusted list is often a whole cluster's range) still cannot
    // take it all.
    let pending_header = PerPeer::new(per_peer::Limits::of_pool(
        settings.max_connections,
        settings
            .max_connections_per_ip
            .max(settings.max_connections / 4),
    ));
    let mut trim = Trim::default();
    let mut heads_check = tokio::time::interval(Duration::from_secs(1));
    heads_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let heads = heads::Budget::new(settings.request_heads);

    async move {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = tokio::time::sleep_until(trim.due().unwrap_or_else(Instant::now)), if trim.due().is_some() => {
                    if trim.fire(Instant::now()) {
                        trim::release_freed_memory();
                    }
                }
                _ = heads_check.tick() => {
                    let now = Instant::now();
                    let held = trim.held(heads.high_since(), heads.held(), now);
                    if held || trim.refusals(heads.refusals(), connections.len(), now) {
                        trim::release_freed_memory();
                    }
                }
                Some(joined) = connections.join_next(), if !connections.is_empty() => {
                    if trim.open(connections.len(), Instant::now()) {
                        trim::release_freed_memory();
                    }
                    if let Err(error) = joined {
                        if error.is_panic() {
                            tracing::error!(%error, "connection task panicked");
                        }
                    }
                }
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) if connections.len() >= settings.max_connections => {
                        // Closed at once: the ones open keep being served.
                        refused.increment(1);
                        drop(stream);
                    }
                    Ok((stream, peer)) => {
                        // A trusted peer's connections carry many clients:
                        // with the PROXY protocol each is counted as the
                        // client its header names, once that is read (until
                        // then among the balancer's connections still sending
                        // their header); without it (`X-Forwarded-For`) the
                        // connection is shared and counted under no address.
                        let trusted = proxy.trusts(peer.ip());
                        let reads_header = trusted && settings.proxy_protocol.any();
                        let held = if reads_header {
                            pending_header.try_hold(peer.ip())
                        } else if trusted {
                            Ok(Held::uncounted())
                        } else {
                            per_peer.try_hold(peer.ip())
                        };
                        let held = match held {
                            Ok(held) => held,
                            Err(bound) => {
                                refused_per_peer.count(bound);
                                drop(stream);
                                continue;
                            }
                        };
                        let proxied = reads_header.then(|| Proxied {
                            versions: settings.proxy_protocol,
                            per_peer: per_peer.clone(),
                            refused: refused_per_peer.clone(),
                            counters: proxy_headers.clone(),
                        });
                        let connection = Connection {
                            peer,
                            proxied,
                            tls: tls.clone(),
                            builder: builder.clone(),
                            proxy: proxy.clone(),
                            winding_down: winding_down.clone(),
                            // Taken before the task starts, so a shutdown that
                            // begins meanwhile still reaches this connection.
                            draining: draining.clone(),
                            first_head_by: Instant::now() + settings.header_read_timeout,
                            idle_timeout: settings.idle_timeout,
                            send_timeout: settings.send_timeout,
                            max_header_bytes: settings.max_header_bytes,
                            heads: heads.clone(),
                        };
                        connections.spawn(connection.run(stream, held));
                        if trim.open(connections.len(), Instant::now()) {
                            trim::release_freed_memory();
                        }
                    }
                    Err(error) => accept_errors.failed(&error).await,
                },
            }
        }

        drop(listener);
        let deadline = Instant::now() + settings.shutdown_grace;
        tracing::debug!(open = connections.len(), "stopped accepting; draining");
        drain.send_replace(true);
        let drained = tokio::time::timeout_at(deadline, async {
            while connections.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        proxy.drain_tunnels(deadline).await;
        if !drained {
            tracing::warn!(
                open = connections.len(),
                "shutdown grace expired; closing the connections still open"
            );
        }
        connections.shutdown().await;
    }
}

fn builder(settings: &Settings) -> Builder<StreamExecutor> {
    let mut builder = Builder::new(StreamExecutor {
        send_timeout: settings.send_timeout,
    });
    builder
        .http1()
        // The header-read timeout's sleeps reused, one per request saved
        // from the timer wheel's lock (`sleeps`).
        .timer(HyperTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .keep_alive(true)
        .max_buf_size(settings.max_header_bytes.max(MIN_H1_BUFFER));
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX))
        .max_concurrent_streams(settings.http2.max_concurrent_streams)
        .max_pending_accept_reset_streams(settings.http2.max_pending_accept_reset_streams)
        .max_local_error_reset_streams(settings.http2.max_local_error_reset_streams);
    builder
}

/// One accepted connection, before its protocol is known.
struct Connection {
    /// The TCP peer; with a PROXY protocol header, the client it carries.
    peer: SocketAddr,
    /// Set for a trusted peer when `server.proxy_protocol` lists a version.
    proxied: Option<Proxied>,
    tls: Option<TlsAcceptor>,
    builder: Arc<Builder<StreamExecutor>>,
    proxy: Arc<Proxy>,
    /// Set during the shutdown delay.
    winding_down: Arc<AtomicBool>,
    /// Turns true when the server starts draining.
    draining: watch::Receiver<bool>,
    /// The TLS handshake and the first request head must be done by then.
    first_head_by: Instant,
    idle_timeout: Duration,
    send_timeout: Duration,
    max_header_bytes: usize,
    heads: Arc<heads::Budget>,
}

/// What a connection from a trusted peer needs to read its PROXY protocol
/// header and to count its client.
struct Proxied {
    versions: config::ProxyProtocol,
    per_peer: Arc<PerPeer>,
    refused: Arc<per_peer::Refusals>,
    counters: Arc<proxied::Counters>,
}

impl Connection {
    /// Serves the connection; `held` is its place among its peer's
    /// connections (for a trusted peer's, among those still sending a
    /// header, traded for its client's once the header is read, or for
    /// none when it names no client).
    async fn run(mut self, mut stream: TcpStream, mut held: Held) {
        // Small writes (response heads, WebSocket frames) go out at once.
        let _ = stream.set_nodelay(true);
        let local = match stream.local_addr() {
            Ok(local) => local,
            Err(error) => {
                tracing::debug!(%error, "connection gone before it was served");
                return;
            }
        };
        let mut rest = Vec::new();
        if let Some(proxied) = self.proxied.take() {
            let Some(opening) = self.read_proxy_header(&mut stream, &proxied).await else {
                return;
            };
            rest = opening.rest;
            drop(held);
            // A header that names no client (none at all, LOCAL, UNKNOWN):
            // the balancer's own connection, shared like any trusted
            // peer's.
            held = match opening.source {
                None => Held::uncounted(),
                Some(client) => {
                    self.peer = client;
                    match proxied.per_peer.try_hold(client.ip()) {
                        Ok(client) => client,
                        Err(bound) => {
                            proxied.refused.count(bound);
                            return;
                        }
                    }
                }
            };
        }
        let heads = self.heads.connection(held);
        let info = ConnInfo::new(self.peer, local, self.tls.is_some());
        // Under TLS too: a client that stops reading blocks the TCP writes.
        let stream = SendTimeout::new(Prefixed::new(stream, rest), self.send_timeout);
        match self.tls.clone() {
            None => {
                let stand_ins = Arc::new(StandIns::default());
                let io = Watched::new(
                    stream,
                    self.max_header_bytes,
                    heads.clone(),
                    stand_ins.clone(),
                );
                self.serve(TokioIo::new(io), info, heads, stand_ins).await;
            }
            // Boxed: the TLS state is twice the size of a plain connection's,
            // and every connection task would be that large otherwise.
            Some(acceptor) => Box::pin(self.serve_tls(acceptor, stream, info, heads)).await,
        }
    }

    /// Reads a trusted peer's PROXY protocol header, if it sends one: the
    /// client it carries and the bytes read after it, or `None` when the
    /// connection is closed for it.
    async fn read_proxy_header(
        &self,
        stream: &mut TcpStream,
        proxied: &Proxied,
    ) -> Option<proxied::Opening> {
        let read = proxied::read_opening(
            stream,
            proxied.versions,
            self.first_head_by,
            &proxied.counters,
        );
        match read.await {
            Ok(Some(opening)) => Some(opening),
            Ok(None) => None,
            Err(rejected) => {
                tracing::debug!(peer = %self.peer, reason = ?rejected, "PROXY protocol header refused; connection closed");
                proxied.counters.rejected(rejected);
                None
            }
        }
    }

    async fn serve_tls(
        self,
        acceptor: TlsAcceptor,
        stream: SendTimeout<Prefixed<TcpStream>>,
        info: ConnInfo,
        heads: Arc<heads::Connection>,
    ) {
        match tokio::time::timeout_at(self.first_head_by, acceptor.accept(stream)).await {
            Ok(Ok(stream)) => {
                let stand_ins = Arc::new(StandIns::default());
                let io = Watched::new(
                    stream,
                    self.max_header_bytes,
                    heads.clone(),
                    stand_ins.clone(),
                );
                self.serve(TokioIo::new(io), info, heads, stand_ins).await;
            }
            Ok(Err(error)) => tracing::debug!(%error, "TLS handshake failed"),
            Err(_) => tracing::debug!("TLS handshake timed out"),
        }
    }

    async fn serve<I>(
        self,
        io: I,
        info: ConnInfo,
        heads: Arc<heads::Connection>,
        stand_ins: Arc<StandIns>,
    ) where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        let started = Arc::new(AtomicBool::new(false));
        let first_request = Arc::new(Notify::new());
        let activity = Arc::new(Activity::new());
        let service = {
            let started = started.clone();
            let first_request = first_request.clone();
            let activity = activity.clone();
            let proxy = self.proxy;
            let winding_down = self.winding_down;
            let http1_requests = AtomicU64::new(0);
            // Shared by the connection's requests: a reference each.
            let info = Arc::new(info.clone());
            service_fn(move |request| {
                if !started.swap(true, Ordering::Relaxed) {
                    // Stored as a permit if nobody waits yet.
                    first_request.notify_one();
                }
                // hyper hands HTTP/1 requests over in the order their heads
                // arrived, which is how the framing watch counts them.
                let stand_in = request.version() != Version::HTTP_2
                    && stand_ins.is(http1_requests.fetch_add(1, Ordering::Relaxed) + 1);
                let in_flight = activity.begin();
                // An HTTP/2 stream's header list is held as long as its
                // exchange runs: charged first, refused at once past the
                // budget (an HTTP/1 head was charged while it arrived).
                // This runs as h2 hands the stream over, before its task
                // is spawned: a refused stream's request is dropped here,
                // not held by a task waiting its turn behind a burst of
                // thousands.
                let charge = match request.version() {
                    Version::HTTP_2 => heads
                        .charge(heads::header_list_size(&request) + heads::STREAM_COST)
                        .map(Some),
                    _ => Ok(None),
                };
                let charge = match charge {
                    Ok(charge) => charge,
                    // `request` is dropped as this closure returns.
                    Err(over) => return Served::answered(respond::over_head_budget(over)),
                };
                if stand_in {
                    // Never served: it stands for a head whose body cannot
                    // be framed.
                    return Served::answered(crate::proxy::refuse_unframed_body());
                }
                // Read as the request begins: one that began before the
                // delay ends with the connection still kept alive, and
                // the next one is told to close.
                let closing = winding_down.load(Ordering::Relaxed);
                let finish = Finish {
                    in_flight,
                    charge,
                    closing,
                };
                Served::proxied(proxy.clone().handle(request, info.clone()), finish)
            })
        };
        let conn = self.builder.serve_connection_with_upgrades(io, service);
        let mut conn = std::pin::pin!(conn);
        let mut draining = self.draining;

        tokio::select! {
            result = conn.as_mut() => return finished(result),
            () = tokio::time::sleep_until(self.first_head_by) => {}
            () = first_request.notified() => {}
            _ = draining.wait_for(|d| *d) => {}
        }
        if !started.load(Ordering::Relaxed) {
            // Still sniffing the protocol or reading the first head: a
            // slowloris, a client that connected and said nothing, or a
            // drain that began before it asked anything.
            tracing::debug!(peer = %info.peer, "no request head within header_read_timeout");
            return;
        }
        // Graceful from here: HTTP/1.1 finishes the request in flight and
        // closes; HTTP/2 sends GOAWAY and lets its open streams finish.
        let mut closing = false;
        // Set when an idle HTTP/2 connection is closed: by then h2 holds
        // every response whole, but a client that grants no window can keep
        // the last bytes of one in h2's buffers, and the GOAWAY would wait
        // on that stream for ever. It gets `send_timeout` to take them.
        let mut close_by = None;
        loop {
            if !closing && *draining.borrow() {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
            let idle_at = activity.idle_until(self.idle_timeout);
            let watchers = async {
                if closing && close_by.is_none() {
                    // Nothing left to watch: the connection ends itself.
                    return std::future::pending().await;
                }
                tokio::select! {
                    _ = draining.wait_for(|d| *d), if !closing => Woke::Drain,
                    () = sleep_until_some(idle_at), if !closing => Woke::Idle,
                    () = sleep_until_some(close_by), if close_by.is_some() => Woke::CloseBy,
                }
            };
            // Only the connection is polled on each of its wake-ups.
            let woke = match beside(conn.as_mut(), watchers).await {
                First::Main(result) => return finished(result),
                First::Side(woke) => woke,
            };
            match woke {
                Woke::Drain => {}
                Woke::Idle => {
                    if activity
                        .idle_until(self.idle_timeout)
                        .is_some_and(|at| at <= Instant::now())
                    {
                        tracing::debug!(peer = %info.peer, "idle; closing the connection");
                        closing = true;
                        conn.as_mut().graceful_shutdown();
                        if activity.http2.load(Ordering::Relaxed) {
                            close_by = Some(Instant::now() + self.send_timeout);
                        }
                    }
                }
                Woke::CloseBy => {
                    tracing::debug!(
                        peer = %info.peer,
                        "the client took no data for send_timeout while closing; cut"
                    );
                    return;
                }
            }
        }
    }
}

/// What woke a connection's watchers.
enum Woke {
    /// The server began draining.
    Drain,
    /// The idle timer (or the recheck while a request is in flight).
    Idle,
    /// An idle HTTP/2 connection's `send_timeout` to take its last bytes.
    CloseBy,
}

/// Sleeps until `at`; while a request is in flight (`None`), rechecks each
/// second (a request ending sets a new idle start).
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => tokio::time::sleep(Duration::from_secs(1)).await,
    }
}

fn finished(result: Result<(), Box<dyn std::error::Error + Send + Sync>>) {
    if let Err(error) = result {
        tracing::debug!(%error, "connection ended with an error");
    }
}
