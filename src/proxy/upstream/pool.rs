//! The upstream's connections: HTTP/1.1, kept alive, the most recently
//! used taken first.
//!
//! A sidecar has one upstream, so the idle connections are one list, not a
//! map keyed by host as in a general-purpose client (whose key is hashed
//! twice a request). A connection goes back on the list only once its
//! response body has been read to the end; one whose response sluice
//! refused, whose body broke or was left unread, or that switched protocols
//! is never used again (dropping its handle closes it).
//!
//! A request that met a reused connection the app had just closed (an app
//! closing idle keep-alive connections races every proxy that reuses them)
//! is sent again, once, on a new connection, when sending it again cannot
//! repeat its effect on the app: it was never written, or it is idempotent
//! (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) with no body and the connection
//! failed before any byte of an answer came back. This is nginx's retry of
//! a cached keep-alive connection; anything else is a 502, as before.

use std::collections::VecDeque;
use std::error::Error as StdError;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;

use http::uri::Authority;
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use tower_service::Service as _;

use super::interim::{Informational, Watched};
use crate::proxy::body::Body;
use crate::proxy::metrics::BodyCuts;
use crate::sync;
use crate::telemetry;
use resend::{met_a_closed_connection, replayable, HeadCopy};

/// How long an idle connection to the upstream is kept.
const POOL_IDLE: Duration = Duration::from_secs(90);
/// How often connections idle for longer are closed.
const REAP_EVERY: Duration = Duration::from_secs(30);
/// At most this many idle connections are kept (nginx's `keepalive`
/// caches a set number too): past it the longest idle is closed. A flood
/// of held requests opens a connection each, and each keeps the buffers
/// its request head grew (up to `max_header_bytes`) for as long as it is
/// kept: unbounded, those would stay for [`POOL_IDLE`] after the flood.
/// Steady traffic needs about as many as it has requests in flight.
const MAX_IDLE: usize = 64;

/// Pushes `item` at the back of `list`, and takes the front off when
/// `list` is then longer than `max`.
fn push_bounded<T>(list: &mut VecDeque<T>, item: T, max: usize) -> Option<T> {
    list.push_back(item);
    if list.len() > max {
        list.pop_front()
    } else {
        None
    }
}

/// The connections to the upstream.
pub(super) struct Pool {
    connector: HttpConnector,
    builder: http1::Builder,
    idle: Mutex<VecDeque<Idle>>,
    resends: metrics::Counter,
    cuts: BodyCuts,
}

struct Idle {
    authority: Authority,
    conn: Conn,
    since: Instant,
}

/// One connection to the upstream: hyper's handle, and the count of the
/// `1xx` responses to the exchange it carries (its task reads it).
struct Conn {
    sender: SendRequest<Body>,
    informational: Arc<Informational>,
}

/// A connection carrying one exchange: back to the pool when its response
/// body has been read whole ([`Lease::release`]), closed when dropped.
pub(super) struct Lease {
    pool: Arc<Pool>,
    authority: Authority,
    conn: Conn,
}

/// Why no response head came back.
#[derive(Debug)]
pub(super) enum Failure {
    /// No connection could be made.
    Connect(Box<dyn StdError + Send + Sync>),
    /// The connection failed, or the request body did, before a response
    /// head arrived.
    Exchange(hyper::Error),
    /// The app sent more `1xx` responses than sluice takes, and no final
    /// head before them: the connection was ended.
    InformationalFlood,
}

impl Pool {
    /// The pool, and its task closing connections idle for longer than
    /// [`POOL_IDLE`] (every [`REAP_EVERY`]; it ends with the pool).
    pub(super) fn start(connector: HttpConnector, builder: http1::Builder) -> Arc<Pool> {
        let pool = Arc::new(Pool {
            connector,
            builder,
            idle: Mutex::new(VecDeque::new()),
            resends: metrics::counter!(telemetry::UPSTREAM_RESENDS),
            cuts: BodyCuts::new(),
        });
        let weak = Arc::downgrade(&pool);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(REAP_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let Some(pool) = weak.upgrade() else { return };
                pool.prune(Instant::now());
            }
        });
        pool
    }

    /// Sends `request` (origin-form, `Host` set) to `base`'s authority, on
    /// an idle connection when there is one, and once more on a new one
    /// when that one turns out closed and sending again is safe. Its `1xx`
    /// responses are counted on the connection that carries it, a second
    /// attempt's on from the first's.
    ///
    /// An `async move` block, not an `async fn`: an `async fn` keeps each
    /// argument twice in its future (as passed, and as the local it is
    /// moved to), and this one is a third of a forwarded request's future.
    #[allow(clippy::manual_async_fn)]
    pub(super) fn send<'a>(
        self: &'a Arc<Self>,
        base: &'a Uri,
        mut request: Request<Body>,
    ) -> impl Future<Output = Result<(Response<Incoming>, Lease), Failure>> + 'a {
        async move {
            let Some(authority) = base.authority() else {
                return Err(Failure::Connect("the upstream URL has no authority".into()));
            };
            let mut retried = false;
            let mut informational_before = 0;
            loop {
                // A resend goes on a new connection, leaving the idle ones be.
                let idle = if retried {
                    None
                } else {
                    self.idle_connection(authority).await
                };
                let (mut conn, reused) = match idle {
                    Some(conn) => (conn, true),
                    // Boxed: connecting (the connector's and the handshake's
                    // futures) is most of this future's size, and most
                    // requests find an idle connection.
                    None => (Box::pin(self.connect(base)).await?, false),
                };
                let copy = (reused && replayable(&request)).then(|| HeadCopy::of(&request));
                conn.informational.watch(informational_before);
                match conn.sender.try_send_request(request).await {
                    Ok(response) => {
                        let lease = Lease {
                            pool: Arc::clone(self),
                            authority: authority.clone(),
                            conn,
                        };
                        return Ok((response, lease));
                    }
                    // Ended by its connection for a flood of `1xx`: never sent
                    // again.
                    Err(_) if conn.informational.flooded() => {
                        return Err(Failure::InformationalFlood)
                    }
                    Err(mut error) => {
                        let unsent = error.take_message();
                        let error = error.into_error();
                        let resend = match (unsent, copy) {
                            (Some(unsent), _) if reused => unsent,
                            (None, Some(copy)) if met_a_closed_connection(&error) => {
                                match copy.request() {
                                    Some(copy) => copy,
                                    None => return Err(Failure::Exchange(error)),
                                }
                            }
                            _ => return Err(Failure::Exchange(error)),
                        };
                        tracing::debug!(%error, "a reused upstream connection was closed; sending again on a new one");
                        self.resends.increment(1);
                        request = resend;
                        retried = true;
                        informational_before = conn.informational.seen();
                    }
                }
            }
        }
    }

    /// The most recently used idle connection to `authority` that is still
    /// open, once it can take a request: a connection goes back on the list
    /// as its last body byte is read, a moment before hyper is ready to
    /// write on it again.
    async fn idle_connection(&self, authority: &Authority) -> Option<Conn> {
        loop {
            let idle = self.idle().pop_back()?;
            // Byte equality: `Authority`'s own ignores case, a loop of its
            // own on every request; a case-different spelling only costs a
            // new connection.
            if idle.authority.as_str() != authority.as_str() || idle.conn.sender.is_closed() {
                continue;
            }
            let mut conn = idle.conn;
            if conn.sender.ready().await.is_ok() {
                return Some(conn);
            }
        }
    }

    async fn connect(&self, base: &Uri) -> Result<Conn, Failure> {
        let io = self
            .connector
            .clone()
            .call(base.clone())
            .await
            .map_err(|e| Failure::Connect(e.into()))?;
        // Its `1xx` responses are counted on the socket as they are read.
        let informational = Arc::new(Informational::default());
        let io = TokioIo::new(Watched::new(io.into_inner(), Arc::clone(&informational)));
        let (sender, connection) = self
            .builder
            .handshake::<_, Body>(io)
            .await
            .map_err(Failure::Exchange)?;
        tokio::spawn(run(
            connection,
            self.cuts.clone(),
            Arc::clone(&informational),
        ));
        Ok(Conn {
            sender,
            informational,
        })
    }

    fn put(&self, authority: Authority, conn: Conn) {
        let idle = Idle {
            authority,
            conn,
            since: Instant::now(),
        };
        let closed = push_bounded(&mut self.idle(), idle, MAX_IDLE);
        // Closed outside the lock.
        drop(closed);
    }

    /// Closes the connections idle for longer than [`POOL_IDLE`] (the
    /// oldest are at the front).
    fn prune(&self, now: Instant) {
        let mut idle = self.idle();
        while idle
            .front()
            .is_some_and(|oldest| now.duration_since(oldest.since) > POOL_IDLE)
        {
            idle.pop_front();
        }
    }

    fn idle(&self) -> MutexGuard<'_, VecDeque<Idle>> {
        sync::lock(&self.idle)
    }

    /// Counts the request bodies cut short.
    pub(super) fn cuts(&self) -> &BodyCuts {
        &self.cuts
    }

    /// Idle connections held now.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.idle().len()
    }
}

impl Lease {
    /// The exchange is over and the connection may carry another; hyper
    /// closes it instead if either side asked to (`Connection: close`).
    fn release(self) {
        if !self.conn.sender.is_closed() {
            self.pool.put(self.authority, self.conn);
        }
    }

    /// Whether the app sent more `1xx` responses than sluice takes before
    /// this exchange's final head.
    pub(super) fn flooded(&self) -> bool {
        self.conn.informational.flooded()
    }
}

/// Drives one connection until it closes or is upgraded, or until it has
/// carried more `1xx` responses to one exchange than sluice takes: its
/// socket ([`Watched`]) counts each as this task reads it, so the count is
/// read after each poll, and ending the connection fails an exchange still
/// waiting for its head. A request body cut once the response had begun
/// ends the connection, not the exchange (hyper hands the error to the
/// exchange while it still waits for a head): it is counted here, and
/// only here.
async fn run(
    connection: http1::Connection<TokioIo<Watched>, Body>,
    cuts: BodyCuts,
    informational: Arc<Informational>,
) {
    let mut connection = std::pin::pin!(connection.with_upgrades());
    let ended = std::future::poll_fn(|cx| match connection.as_mut().poll(cx) {
        Poll::Pending if informational.flooded() => Poll::Ready(None),
        poll => poll.map(Some),
    })
    .await;
    let Some(ended) = ended else {
        tracing::debug!("upstream connection ended: a flood of 1xx responses");
        return;
    };
    if let Err(error) = ended {
        match cuts.count(&error) {
            Some(cut) => tracing::debug!(
                reason = cut.label(),
                "request body cut after the response began"
            ),
            None => tracing::debug!(%error, "upstream connection ended"),
        }
    }
}

/// `base`'s authority as a `Host` field, without the default port (what a
/// client sends for the URL), for a request that came without one.
pub(super) fn host_of(base: &Uri) -> Option<HeaderValue> {
    let authority = base.authority()?;
    let text = match authority.port_u16() {
        Some(80) if base.scheme_str() == Some("http") => authority.host(),
        _ => authority.as_str(),
    };
    HeaderValue::from_str(text).ok()
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

mod resend;
mod returning;
#[cfg(test)]
mod tests;

pub(super) use returning::Returning;
