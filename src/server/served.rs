//! A request's course on its connection: counted in flight while it is
//! handled ([`Activity`], which the connection's idle timer and drain
//! read), and the future hyper polls for it ([`Served`]), which finishes
//! the proxy's response for the connection it goes out on.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http::header::{HeaderValue, CONNECTION};
use http::{Response, StatusCode};
use pin_project_lite::pin_project;
use tokio::time::Instant;

use crate::proxy::Body;
use crate::sync;

use super::heads;
use super::stream_watchdog;

/// A connection's requests in flight, and when it last had none.
pub(super) struct Activity {
    in_flight: AtomicUsize,
    idle_since: Mutex<Instant>,
    /// Its requests are HTTP/2 streams.
    pub http2: AtomicBool,
}

impl Activity {
    pub fn new() -> Activity {
        Activity {
            in_flight: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            http2: AtomicBool::new(false),
        }
    }

    pub fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    /// When the connection will have been idle for `timeout`, or `None`
    /// while a request is in flight.
    pub fn idle_until(&self, timeout: Duration) -> Option<Instant> {
        if self.in_flight.load(Ordering::SeqCst) > 0 {
            return None;
        }
        let since = *sync::lock(&self.idle_since);
        Some(since + timeout)
    }
}

/// One request in flight; dropped when its handling ends, however it ends.
pub(super) struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            *sync::lock(&self.0.idle_since) = Instant::now();
        }
    }
}

pin_project! {
    /// The future of one request, as hyper holds it: answered before the
    /// proxy saw it, or the proxy's `handling` and what its response
    /// needs on the way out.
    ///
    /// Written out rather than an `async` block around `handling`: a block
    /// keeps room for what it captured (the request, before the proxy
    /// takes it) beside the future it awaits, and hyper moves the whole
    /// future into its slot for each request. Built around the proxy's
    /// future where that is made, nothing is held twice.
    #[project = Projected]
    pub(super) enum Served<F> {
        Answered { response: Option<Response<Body>> },
        Proxied {
            #[pin]
            handling: F,
            finish: Option<Finish>,
        },
    }
}

impl<F> Served<F> {
    /// A request answered before the proxy saw it.
    pub fn answered(response: Response<Body>) -> Served<F> {
        Served::Answered {
            response: Some(response),
        }
    }

    /// A request the proxy is `handling`.
    pub fn proxied(handling: F, finish: Finish) -> Served<F> {
        Served::Proxied {
            handling,
            finish: Some(finish),
        }
    }
}

/// What a proxied response needs on the way out, and what its request
/// holds until then.
pub(super) struct Finish {
    pub in_flight: InFlight,
    /// An HTTP/2 stream's header list, charged to the connection.
    pub charge: Option<heads::Charge>,
    /// The request began once the connection was winding down: an HTTP/1
    /// response says `Connection: close`.
    pub closing: bool,
}

impl Finish {
    fn response(self, response: Response<Body>) -> Response<Body> {
        let Finish {
            in_flight,
            charge,
            closing,
        } = self;
        match stream_watchdog::current() {
            // HTTP/2: the stream's watchdog watches the body, and the
            // stream is in flight until the body ends, so the connection
            // is idle only once every response has been handed to h2 whole.
            Some(handed) => {
                in_flight.0.http2.store(true, Ordering::Relaxed);
                let held = (in_flight, charge);
                response.map(|body| stream_watchdog::watched(body, handed, held))
            }
            // HTTP/1: the connection's own writes block on a client that
            // stops reading (`SendTimeout`).
            None => {
                drop((in_flight, charge));
                let mut response = response;
                if closing && response.status() != StatusCode::SWITCHING_PROTOCOLS {
                    response
                        .headers_mut()
                        .insert(CONNECTION, HeaderValue::from_static("close"));
                }
                response
            }
        }
    }
}

impl<F: Future<Output = Response<Body>>> Future for Served<F> {
    type Output = Result<Response<Body>, Infallible>;

    /// Polled once more after it ended, it stays pending: hyper never
    /// does that, and a panic would take the connection's task with it.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            Projected::Answered { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
            Projected::Proxied { handling, finish } => {
                let response = ready!(handling.poll(cx));
                match finish.take() {
                    Some(finish) => Poll::Ready(Ok(finish.response(response))),
                    None => Poll::Pending,
                }
            }
        }
    }
}
