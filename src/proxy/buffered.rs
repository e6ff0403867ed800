//! Request bodies received whole before their request takes a place in
//! flight (`server.request_buffering`), as nginx's request buffering does.
//!
//! A concurrency limit counts requests in flight to the app, and a request
//! streaming its body holds its place for as long as the client takes to
//! send it: three uploads just above `server.min_upload_rate` held every
//! place of a limit of 3 for as long as they lasted, and 77 kbit/s took an
//! app with 40 places offline. So a request that matched a concurrency
//! limit and whose body fits `max_body` is received whole first, under the
//! same idle timeout and rate floor as a streamed body; only then does it
//! take its place and go to the app, at the speed of the pod's network. A
//! body cut or broken while it arrives is answered as it would be on its
//! way to the app (408, 400), and takes no place: the app never sees it.
//!
//! Only such requests: buffering delays the app's first byte until the
//! last one has arrived, and holds memory, for nothing where no place is
//! held (a route with rate limits only never makes anybody wait for one).
//!
//! A body larger than `max_body`, or one arriving while the bodies held
//! already fill `total`, streams as before, what was read of it sent
//! first. Such a request may hold only a share of each concurrency limit's
//! places while its body is still arriving, a quarter of the limit (at
//! least one), counted per limit and subject as the places are; beyond
//! that share it is answered as over the limit (503). Once its body has
//! arrived whole it is an ordinary request. So slow large uploads can hold
//! at most a quarter of the app's places, and never all of them, while a
//! large upload at network speed still works; cutting large uploads at a
//! deadline instead would have refused legitimate slow ones.
//!
//! The bytes held are charged to one process-wide budget, released when
//! the body is dropped (sent to the app, or the request refused). It is
//! not `server::heads::Budget`: that one charges a connection, its client
//! address and the process, from the listener; bodies are held by
//! requests, once the request has been routed, and `total` alone bounds
//! the memory (a client address gains nothing from filling it but making
//! bodies stream, which the share bounds).

use std::collections::VecDeque;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request};
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use metrics::{Counter, Gauge};
use smallvec::SmallVec;

use crate::config::{Live, RequestBuffering};
use crate::limit::{Concurrency, LimitPolicy};
use crate::store::in_flight::{InFlight, Permit};
use crate::telemetry;

use super::body::{BoxError, IdleTimeout};
use super::discard::discard;
use super::metrics::BodyCuts;
use super::service::Check;
use super::upstream::UpstreamError;

/// Why a body that could have been buffered streams instead: the metric's
/// `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Streamed {
    /// Larger than `max_body` (declared so, or read past it).
    MaxBody,
    /// The bodies already held fill `total`.
    Total,
}

impl Streamed {
    const ALL: [Streamed; 2] = [Streamed::MaxBody, Streamed::Total];

    fn label(self) -> &'static str {
        match self {
            Streamed::MaxBody => "max_body",
            Streamed::Total => "total",
        }
    }
}

/// The process's buffered bodies, and the streaming share of each
/// concurrency limit; owned by the proxy, outliving reloads as the
/// requests it counts do.
pub struct Buffering {
    held: AtomicUsize,
    held_gauge: Gauge,
    streamed: [Counter; Streamed::ALL.len()],
    /// Places of requests still streaming their bodies, per limit and
    /// subject, each limit at a quarter of its own.
    streaming: Arc<InFlight>,
    cuts: BodyCuts,
}

/// A request's body on its way to the app.
pub enum Inbound {
    /// As it arrives: nothing to hold a place for, nothing in it, or
    /// buffering switched off.
    Arriving(Incoming),
    /// Received whole before the request took its place.
    Whole(Whole),
    /// Too large to hold: what was read, then the rest as it arrives.
    /// Boxed: the rarest kind, and the largest (every request's `Inbound`
    /// is moved several times on its way to the app).
    Streaming(Box<Streaming>),
}

impl Inbound {
    /// The request was refused: what is yet to arrive of its body is read
    /// and thrown away ([`discard`]); what was read, and the places it
    /// held while streaming, are given up now.
    pub fn discard(self, headers: &HeaderMap, live: &Live) {
        match self {
            Inbound::Arriving(incoming) => discard(headers, incoming, live),
            Inbound::Streaming(streaming) => discard(headers, streaming.rest, live),
            Inbound::Whole(_) => {}
        }
    }
}

/// A request ended while its body was being received.
pub enum Stopped<'a, 'r> {
    /// The body was cut or broken: answered as when that happens on the
    /// way to the app (408, 400).
    Body(UpstreamError),
    /// Every place `check`'s limit leaves to streaming bodies is taken.
    Streaming {
        check: &'a Check<'r>,
        retry_after: Duration,
    },
}

/// How receiving a body ended.
enum Read {
    Whole(Whole),
    /// Went past what may be held: the bytes read, in order.
    Over {
        read: VecDeque<Bytes>,
        charge: Option<Charge>,
        why: Streamed,
    },
}

impl Buffering {
    pub fn new() -> Arc<Buffering> {
        Arc::new(Buffering {
            held: AtomicUsize::new(0),
            held_gauge: metrics::gauge!(telemetry::REQUEST_BODY_BYTES_BUFFERED),
            streamed: Streamed::ALL.map(|why| {
                metrics::counter!(telemetry::REQUEST_BODIES_STREAMED, "reason" => why.label())
            }),
            streaming: InFlight::new(),
            cuts: BodyCuts::new(),
        })
    }

    /// Whether anything of the request's body is to be received before it
    /// takes its places ([`Buffering::receive`]). Nothing is when no
    /// concurrency limit holds one, buffering is off, or there is no body:
    /// most requests, which go on from here as they arrive, without
    /// `receive`'s future (its room would be moved and polled for
    /// nothing). Asked of the request where it lies: a request moved in
    /// and back out is copied twice.
    #[inline]
    pub fn receives_first(request: &Request<Incoming>, checks: &[Check<'_>], live: &Live) -> bool {
        let holds_places = || {
            checks
                .iter()
                .any(|check| matches!(check.limit().policy, LimitPolicy::Concurrency(_)))
        };
        let rules = live.server.request_buffering;
        rules.is_on() && !request.body().is_end_stream() && holds_places()
    }

    /// The request with its body received whole when it fits, or why it
    /// ends here. Runs after routing, before the request takes its places,
    /// for a request [`Buffering::receives_first`] said so of.
    pub async fn receive<'a, 'r>(
        self: &Arc<Self>,
        request: Request<Incoming>,
        checks: &'a [Check<'r>],
        live: &Live,
    ) -> Result<Request<Inbound>, Stopped<'a, 'r>> {
        let rules = live.server.request_buffering;
        let (parts, incoming) = request.into_parts();
        let body = IdleTimeout::new(incoming, live.server.body_idle_timeout)
            .with_floor(live.server.min_upload_rate);
        let mut body = Box::pin(body);
        let declared = body.size_hint().exact();
        let read = match declared {
            Some(len) if len > rules.max_body as u64 => Read::Over {
                read: VecDeque::new(),
                charge: None,
                why: Streamed::MaxBody,
            },
            _ => match self.read(&mut body, declared, rules).await {
                Ok(read) => read,
                Err(error) => return Err(Stopped::Body(self.broken(&error))),
            },
        };
        let (read, charge, why) = match read {
            Read::Whole(whole) => return Ok(Request::from_parts(parts, Inbound::Whole(whole))),
            Read::Over { read, charge, why } => (read, charge, why),
        };
        let places = match self.streaming_places(checks) {
            Ok(places) => places,
            Err(stopped) => {
                discard(&parts.headers, body, live);
                return Err(stopped);
            }
        };
        self.streamed[why as usize].increment(1);
        let streaming = Streaming {
            read,
            charge,
            rest: body,
            places,
        };
        Ok(Request::from_parts(
            parts,
            Inbound::Streaming(Box::new(streaming)),
        ))
    }

    /// Reads `body` to its end, or until it goes past `max_body` or the
    /// budget; errors are the body's (cut, broken). The buffer grows by
    /// doubling as bytes arrive, each growth charged before it is made: a
    /// body is charged at most twice what it has brought, never what it
    /// merely announced.
    async fn read(
        self: &Arc<Self>,
        body: &mut Pin<Box<IdleTimeout<Incoming>>>,
        declared: Option<u64>,
        rules: RequestBuffering,
    ) -> Result<Read, BoxError> {
        // No more than this can arrive and still be held.
        let most = declared.map_or(rules.max_body, |len| {
            usize::try_from(len).map_or(rules.max_body, |len| len.min(rules.max_body))
        });
        let mut buffer: Vec<u8> = Vec::new();
        let mut charge = Charge {
            budget: self.clone(),
            bytes: 0,
        };
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            let frame = match frame?.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    trailers = frame.into_trailers().ok().map(Box::new).or(trailers);
                    continue;
                }
            };
            let needed = buffer.len() + frame.len();
            let why = if needed > rules.max_body {
                Some(Streamed::MaxBody)
            } else if needed > buffer.capacity() {
                let grown = needed.max((2 * buffer.capacity()).min(most));
                if charge.grow(grown - buffer.capacity(), rules.total) {
                    buffer.reserve_exact(grown - buffer.len());
                    None
                } else {
                    Some(Streamed::Total)
                }
            } else {
                None
            };
            if let Some(why) = why {
                let read = [Bytes::from(buffer), frame]
                    .into_iter()
                    .filter(|b| !b.is_empty())
                    .collect();
                return Ok(Read::Over {
                    read,
                    charge: Some(charge),
                    why,
                });
            }
            buffer.extend_from_slice(&frame);
        }
        Ok(Read::Whole(Whole {
            data: Some(Bytes::from(buffer)).filter(|d| !d.is_empty()),
            trailers,
            _charge: charge,
        }))
    }

    /// What became of a body that broke while it was received, counted as
    /// a cut body is on its way to the app.
    fn broken(&self, error: &BoxError) -> UpstreamError {
        match self.cuts.count(error.as_ref()) {
            Some(cut) => {
                tracing::debug!(reason = cut.label(), "request body cut before forwarding");
                UpstreamError::BodyCut(cut)
            }
            None => {
                tracing::debug!(%error, "request body broken before forwarding");
                UpstreamError::BodyBroken
            }
        }
    }

    /// A streaming place of every concurrency limit among `checks`, or the
    /// check of the first whose share is taken.
    fn streaming_places<'a, 'r>(
        &self,
        checks: &'a [Check<'r>],
    ) -> Result<SmallVec<[Permit; 1]>, Stopped<'a, 'r>> {
        let mut places = SmallVec::new();
        for check in checks {
            if let LimitPolicy::Concurrency(policy) = &check.limit().policy {
                let share = Concurrency {
                    name: policy.name.clone(),
                    limit: streaming_share(policy.limit),
                    retry_after: policy.retry_after,
                    announce: policy.announce,
                };
                let noop = Gauge::noop();
                match self.streaming.try_acquire(&share, &check.subject, &noop) {
                    Some(place) => places.push(place),
                    None => {
                        return Err(Stopped::Streaming {
                            check,
                            retry_after: policy.retry_after,
                        })
                    }
                }
            }
        }
        Ok(places)
    }

    fn show(&self) {
        #[allow(clippy::cast_precision_loss)] // exact below 2^53 bytes
        self.held_gauge
            .set(self.held.load(Ordering::Relaxed) as f64);
    }
}

/// The places of a concurrency limit of `limit` that requests still
/// streaming their bodies may hold at once: a quarter, at least one.
pub fn streaming_share(limit: NonZeroU32) -> NonZeroU32 {
    NonZeroU32::new(limit.get() / 4).unwrap_or(NonZeroU32::MIN)
}

/// Bytes of body held, given back when dropped.
struct Charge {
    budget: Arc<Buffering>,
    bytes: usize,
}

impl Charge {
    /// Charges `more` bytes on top, unless the process would then hold
    /// more than `total`.
    fn grow(&mut self, more: usize, total: usize) -> bool {
        let before = self.budget.held.fetch_add(more, Ordering::Relaxed);
        if before + more > total {
            self.budget.held.fetch_sub(more, Ordering::Relaxed);
            return false;
        }
        self.bytes += more;
        self.budget.show();
        true
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.held.fetch_sub(self.bytes, Ordering::Relaxed);
            self.budget.show();
        }
    }
}

/// A body received whole: its bytes in one piece, and its trailers (boxed:
/// few bodies have any, and every request's `Inbound` is as large as its
/// largest kind).
pub struct Whole {
    data: Option<Bytes>,
    trailers: Option<Box<HeaderMap>>,
    /// Held until the body is dropped: hyper's client drops it once it has
    /// written the last byte to the app, or the exchange ends.
    _charge: Charge,
}

impl http_body::Body for Whole {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(*t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// A body too large to hold: the bytes read before it went past, then the
/// rest as it arrives, still under the idle timeout and rate floor it was
/// read with. Holds its streaming places until its last byte is read.
pub struct Streaming {
    read: VecDeque<Bytes>,
    /// For `read`, given back once it is handed on.
    charge: Option<Charge>,
    rest: Pin<Box<IdleTimeout<Incoming>>>,
    places: SmallVec<[Permit; 1]>,
}

impl http_body::Body for Streaming {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(read) = this.read.pop_front() {
            if this.read.is_empty() {
                this.charge = None;
            }
            return Poll::Ready(Some(Ok(Frame::data(read))));
        }
        let frame = std::task::ready!(this.rest.as_mut().poll_frame(cx));
        let ended = match &frame {
            None | Some(Err(_)) => true,
            Some(Ok(_)) => this.rest.is_end_stream(),
        };
        if ended {
            // Arrived (or broken): no longer a request streaming its body.
            this.places.clear();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.read.is_empty() && self.rest.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let read: u64 = self.read.iter().map(|b| b.len() as u64).sum();
        let rest = self.rest.size_hint();
        let mut hint = SizeHint::new();
        hint.set_lower(rest.lower() + read);
        if let Some(upper) = rest.upper() {
            hint.set_upper(upper + read);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_of_the_places_at_least_one() {
        let share = |n| streaming_share(NonZeroU32::new(n).unwrap()).get();
        assert_eq!(share(1), 1);
        assert_eq!(share(3), 1);
        assert_eq!(share(4), 1);
        assert_eq!(share(40), 10);
        assert_eq!(share(41), 10);
    }

    #[tokio::test]
    async fn a_whole_body_gives_its_bytes_then_its_trailers() {
        use http::HeaderValue;
        use http_body::Body as _;
        use http_body_util::BodyExt;

        let mut trailers = HeaderMap::new();
        trailers.insert("x-checksum", HeaderValue::from_static("abc"));
        let mut whole = Whole {
            data: Some(Bytes::from_static(b"body")),
            trailers: Some(Box::new(trailers.clone())),
            _charge: Charge {
                budget: Buffering::new(),
                bytes: 0,
            },
        };
        assert_eq!(whole.size_hint().exact(), Some(4));
        let data = whole.frame().await.expect("a frame").expect("no error");
        assert_eq!(data.into_data().expect("the bytes"), "body");
        assert!(!whole.is_end_stream(), "the trailers are still to come");
        let last = whole.frame().await.expect("a frame").expect("no error");
        assert_eq!(last.into_trailers().expect("the trailers"), trailers);
        assert!(whole.is_end_stream());
        assert!(whole.frame().await.is_none());
    }

    #[test]
    fn a_charge_past_the_total_is_refused_and_every_charge_given_back() {
        let budget = Buffering::new();
        let mut a = Charge {
            budget: budget.clone(),
            bytes: 0,
        };
        assert!(a.grow(60, 100));
        let mut b = Charge {
            budget: budget.clone(),
            bytes: 0,
        };
        assert!(!b.grow(41, 100), "past the total");
        assert!(b.grow(40, 100));
        assert_eq!(budget.held.load(Ordering::Relaxed), 100);
        drop(a);
        assert_eq!(budget.held.load(Ordering::Relaxed), 40);
        drop(b);
        assert_eq!(budget.held.load(Ordering::Relaxed), 0);
    }
}
