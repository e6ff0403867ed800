//! The one body type every response carries, and what bounds a body that
//! arrives too slowly, which hyper does not: the idle timeout, for the
//! client's request body and the upstream's response body alike (a body
//! trickled at 1 byte/s is never cut otherwise), and the request body's
//! minimum rate (a byte just inside every idle timeout is never cut by
//! that).

use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::config::MinUploadRate;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A boxed body: a streamed upstream body or a synthetic one.
pub type Body = BoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A body with nothing in it.
pub fn empty() -> Body {
    http_body_util::Empty::new()
        .map_err(|never| match never {})
        .boxed()
}

/// Boxes any body whose error converts into [`BoxError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + Sync + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed()
}

/// The client went quiet in the middle of its request body.
#[derive(Debug, thiserror::Error)]
#[error("no request body data for {0:?}")]
pub struct BodyIdleTimeout(pub Duration);

/// The client's request body averaged under `server.min_upload_rate`
/// (bytes a second) once its grace was over.
#[derive(Debug, thiserror::Error)]
#[error("the request body arrived slower than {0} bytes/s")]
pub struct BodyTooSlow(pub u32);

/// Why sluice cut a client's request body short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// `server.body_idle_timeout`: nothing came for that long.
    Idle,
    /// `server.min_upload_rate`: it came, but too slowly.
    TooSlow,
}

impl Cut {
    pub const ALL: [Cut; 2] = [Cut::Idle, Cut::TooSlow];

    /// The cut `error` or one of its sources stands for, if any: hyper
    /// wraps a body's error in its own.
    pub fn of(error: &(dyn StdError + 'static)) -> Option<Cut> {
        let mut current = Some(error);
        while let Some(e) = current {
            if e.is::<BodyIdleTimeout>() {
                return Some(Cut::Idle);
            }
            if e.is::<BodyTooSlow>() {
                return Some(Cut::TooSlow);
            }
            current = e.source();
        }
        None
    }

    /// The key that made the cut: a bounded metric label.
    pub fn label(self) -> &'static str {
        match self {
            Cut::Idle => "body_idle_timeout",
            Cut::TooSlow => "min_upload_rate",
        }
    }
}

/// The upstream went quiet in the middle of its response body.
#[derive(Debug, thiserror::Error)]
#[error("no response body data from the upstream for {0:?}")]
pub struct UpstreamBodyIdle(pub Duration);

/// Whose body an [`IdleTimeout`] watches: it decides the errors it gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The client's request body: its errors are the client's
    /// ([`ClientBodyError`], [`BodyIdleTimeout`]).
    Request,
    /// The upstream's response body: its errors pass through, silence is
    /// [`UpstreamBodyIdle`].
    Response,
}

/// The client's own request body broke (an invalid chunk, a body shorter
/// than its `Content-Length`, the client gone): the client's fault, never
/// the app's (answered 400, not 502).
#[derive(Debug, thiserror::Error)]
#[error("the request body was malformed or cut short: {0}")]
pub struct ClientBodyError(#[source] pub BoxError);

/// A request body held to `server.min_upload_rate`, as Kestrel holds one
/// to `MinRequestBodyDataRate`: the bytes it has brought, over the time
/// sluice has waited on the client for them, must not fall below the rate
/// once that time is past the grace. Only waiting counts, as for the idle
/// timeout: an upstream that takes its time reading is not the client
/// being slow. Averaged over the whole body, so a burst early on pays
/// for a pause later, and a client holds a place only for as long as the
/// bytes it sent pay for.
#[derive(Debug)]
struct Floor {
    rate: MinUploadRate,
    bytes: u64,
    /// Over the waits before the current one.
    waited: Duration,
    /// The current wait ends at the floor, before the idle timeout.
    binding: bool,
}

impl Floor {
    fn new(rate: MinUploadRate) -> Floor {
        Floor {
            rate,
            bytes: 0,
            waited: Duration::ZERO,
            binding: false,
        }
    }

    /// The waiting the body may have had in all: the grace, or the time
    /// its bytes would take at the rate if longer. Bytes only grow, so
    /// each wait's deadline is no earlier than the last one's: the sleep is
    /// only ever moved later, which tokio does most cheaply (`sleeps`).
    fn allowance(&self) -> Duration {
        let rate = u64::from(self.rate.bytes_per_second.get());
        let earned = Duration::from_secs(self.bytes / rate)
            + Duration::from_nanos((self.bytes % rate) * 1_000_000_000 / rate);
        earned.max(self.rate.grace)
    }
}

pin_project! {
    /// Fails the body when no frame arrives within `timeout` of being asked
    /// for, and a request body with a [`Floor`] when it arrives too slowly.
    /// The clock starts when a poll finds nothing ready, not when the
    /// previous frame arrived: time spent deciding, connecting upstream or
    /// waiting for a slow upstream to read is not the client's silence.
    /// One sleep serves both bounds: each wait is armed for whichever
    /// comes first.
    pub struct IdleTimeout<B> {
        #[pin]
        inner: B,
        // Made the first time the body has to wait: most bodies never
        // do (a response that came whole with its head).
        #[pin]
        sleep: Option<Sleep>,
        timeout: Duration,
        // When the current wait for the inner body began; `None` while
        // it is not being waited for.
        waiting: Option<Instant>,
        side: Side,
        floor: Option<Floor>,
        // An upstream body's error, held for one poll (see `poll_frame`).
        held: Option<BoxError>,
    }
}

impl<B> IdleTimeout<B> {
    /// For a client's request body.
    pub fn new(inner: B, timeout: Duration) -> IdleTimeout<B> {
        IdleTimeout::on(Side::Request, inner, timeout)
    }

    /// For an upstream's response body. The clock runs only while sluice
    /// waits for the upstream: a client reading slowly is not polled for
    /// more, so its slowness never counts here.
    pub fn response(inner: B, timeout: Duration) -> IdleTimeout<B> {
        IdleTimeout::on(Side::Response, inner, timeout)
    }

    fn on(side: Side, inner: B, timeout: Duration) -> IdleTimeout<B> {
        IdleTimeout {
            inner,
            sleep: None,
            timeout,
            waiting: None,
            side,
            floor: None,
            held: None,
        }
    }

    /// Holds a request body to `rate` as well (`None`: no floor).
    pub fn with_floor(mut self, rate: Option<MinUploadRate>) -> IdleTimeout<B> {
        self.floor = rate.map(Floor::new);
        self
    }
}

impl<B> http_body::Body for IdleTimeout<B>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        if let Some(error) = this.held.take() {
            return Poll::Ready(Some(Err(error)));
        }
        match this.inner.poll_frame(cx) {
            // hyper drops a connection at once when a response body fails,
            // with whatever it had buffered of the head and the frames
            // before: the client would see nothing at all, not a clean
            // truncation. One `Pending` first lets it flush them.
            Poll::Ready(Some(Err(error))) if *this.side == Side::Response => {
                *this.held = Some(error.into());
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Poll::Ready(frame) => {
                let since = this.waiting.take();
                if let Some(floor) = this.floor.as_mut() {
                    if let Some(since) = since {
                        floor.waited += since.elapsed();
                    }
                    if let Some(data) = frame.as_ref().and_then(|f| f.as_ref().ok()?.data_ref()) {
                        floor.bytes += data.remaining() as u64;
                    }
                }
                let side = *this.side;
                Poll::Ready(frame.map(|f| {
                    f.map_err(|e| match side {
                        Side::Request => ClientBodyError(e.into()).into(),
                        Side::Response => e.into(),
                    })
                }))
            }
            Poll::Pending => {
                if this.waiting.is_none() {
                    let now = Instant::now();
                    *this.waiting = Some(now);
                    let mut deadline = now + *this.timeout;
                    if let Some(floor) = this.floor.as_mut() {
                        let left = floor.allowance().saturating_sub(floor.waited);
                        let slow_at = now.checked_add(left).unwrap_or(deadline);
                        floor.binding = slow_at < deadline;
                        deadline = deadline.min(slow_at);
                    }
                    match this.sleep.as_mut().as_pin_mut() {
                        Some(sleep) => sleep.reset(deadline),
                        None => this.sleep.set(Some(tokio::time::sleep_until(deadline))),
                    }
                }
                let sleep = this.sleep.as_pin_mut().expect("set when the wait began");
                match sleep.poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(match (this.side, &*this.floor) {
                        (_, Some(floor)) if floor.binding => {
                            BodyTooSlow(floor.rate.bytes_per_second.get()).into()
                        }
                        (Side::Request, _) => BodyIdleTimeout(*this.timeout).into(),
                        (Side::Response, _) => UpstreamBodyIdle(*this.timeout).into(),
                    }))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::StreamBody;
    use tokio::sync::mpsc;

    type Chunk = Result<Frame<Bytes>, BoxError>;

    fn channel_body() -> (
        mpsc::Sender<Chunk>,
        impl http_body::Body<Data = Bytes, Error = BoxError>,
    ) {
        let (tx, rx) = mpsc::channel::<Chunk>(4);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        (tx, StreamBody::new(stream))
    }

    fn is_idle_timeout(err: &BoxError) -> bool {
        err.downcast_ref::<BodyIdleTimeout>().is_some()
    }

    #[tokio::test(start_paused = true)]
    async fn frames_in_time_pass_and_silence_fails() {
        let (tx, inner) = channel_body();
        let mut body = std::pin::pin!(IdleTimeout::new(inner, Duration::from_secs(5)));

        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(4)).await;
            tx.send(Ok(Frame::data(Bytes::from_static(b"x"))))
                .await
                .unwrap();
            let frame = body.frame().await.unwrap().unwrap();
            assert_eq!(frame.into_data().unwrap(), "x");
        }
        // 12 s in total, never 5 s of silence: still alive. Now go quiet.
        let started = Instant::now();
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(is_idle_timeout(&err), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn time_not_polled_is_not_silence() {
        let (tx, inner) = channel_body();
        let mut body = std::pin::pin!(IdleTimeout::new(inner, Duration::from_secs(5)));
        // Deciding and connecting took longer than the timeout.
        tokio::time::sleep(Duration::from_secs(30)).await;
        tx.send(Ok(Frame::data(Bytes::from_static(b"first"))))
            .await
            .unwrap();
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "first"
        );
        // A slow upstream did not read for a while (backpressure).
        tokio::time::sleep(Duration::from_secs(30)).await;
        let send = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send(Ok(Frame::data(Bytes::from_static(b"late"))))
                .await
                .unwrap();
        };
        let (frame, ()) = tokio::join!(body.frame(), send);
        assert_eq!(frame.unwrap().unwrap().into_data().unwrap(), "late");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_response_body_is_the_upstream_s_fault() {
        let (tx, inner) = channel_body();
        let mut body = std::pin::pin!(IdleTimeout::response(inner, Duration::from_secs(5)));
        tx.send(Err("reset".into())).await.unwrap();
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.downcast_ref::<ClientBodyError>().is_none(), "{err}");
        let err = body.frame().await.unwrap().unwrap_err();
        assert!(err.downcast_ref::<UpstreamBodyIdle>().is_some(), "{err}");
    }

    fn floor(bytes_per_second: u32, grace: Duration) -> Option<MinUploadRate> {
        Some(MinUploadRate {
            bytes_per_second: std::num::NonZeroU32::new(bytes_per_second).unwrap(),
            grace,
        })
    }

    fn is_too_slow(err: &BoxError) -> bool {
        err.downcast_ref::<BodyTooSlow>().is_some()
    }

    /// Reads `body` to its end or error, as hyper would: every frame as
    /// soon as it is ready. The data bytes it got and how it ended.
    async fn drain<B>(body: Pin<&mut B>) -> (usize, Option<BoxError>)
    where
        B: http_body::Body<Data = Bytes, Error = BoxError>,
    {
        let mut body = body;
        let mut got = 0;
        loop {
            match body.frame().await {
                None => return (got, None),
                Some(Ok(frame)) => got += frame.into_data().map_or(0, |d| d.len()),
                Some(Err(err)) => return (got, Some(err)),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_under_the_floor_is_cut_once_the_grace_is_over() {
        let (tx, inner) = channel_body();
        let body = IdleTimeout::new(inner, Duration::from_secs(5))
            .with_floor(floor(1000, Duration::from_secs(1)));
        let mut body = std::pin::pin!(body);
        let started = Instant::now();
        // A byte every 400 ms, well inside the idle timeout, is 2.5 B/s.
        let writer = async {
            loop {
                tokio::time::sleep(Duration::from_millis(400)).await;
                if tx
                    .send(Ok(Frame::data(Bytes::from_static(b"x"))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        };
        let (got, err) = tokio::select! {
            ended = drain(body.as_mut()) => ended,
            () = writer => unreachable!("the writer stops only when the body is gone"),
        };
        let err = err.expect("cut");
        assert!(is_too_slow(&err), "{err}");
        assert_eq!(got, 2);
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_above_the_floor_is_not_cut() {
        let (tx, inner) = channel_body();
        let body = IdleTimeout::new(inner, Duration::from_secs(5))
            .with_floor(floor(1000, Duration::from_secs(1)));
        let mut body = std::pin::pin!(body);
        // 1200 B/s for 10 s, in pieces half a second apart.
        let writer = async {
            for _ in 0..20 {
                tx.send(Ok(Frame::data(Bytes::from(vec![b'x'; 600]))))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            drop(tx);
        };
        let drained = async {
            let ended = drain(body.as_mut()).await;
            assert!(ended.1.is_none(), "{:?}", ended.1);
            ended
        };
        let ((got, _), ()) = tokio::join!(drained, writer);
        assert_eq!(got, 12_000);
    }

    #[tokio::test(start_paused = true)]
    async fn bytes_sent_early_pay_for_waiting_later() {
        let (tx, inner) = channel_body();
        let body = IdleTimeout::new(inner, Duration::from_secs(30))
            .with_floor(floor(1000, Duration::from_secs(1)));
        let mut body = std::pin::pin!(body);
        tx.send(Ok(Frame::data(Bytes::from(vec![b'x'; 5000]))))
            .await
            .unwrap();
        let started = Instant::now();
        let (got, err) = drain(body.as_mut()).await;
        assert_eq!(got, 5000);
        assert!(is_too_slow(&err.expect("cut")));
        // 5000 bytes at 1000 B/s: 5 s of waiting, then nothing more.
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn only_time_waiting_on_the_client_counts_against_the_floor() {
        let (tx, inner) = channel_body();
        let body = IdleTimeout::new(inner, Duration::from_secs(5))
            .with_floor(floor(1000, Duration::from_secs(1)));
        let mut body = std::pin::pin!(body);
        let started = Instant::now();
        let mut ended = started;
        let mut got = 0;
        let err = loop {
            // Each byte takes the client 300 ms; then the upstream takes
            // 5 s before it asks for the next (backpressure).
            let send = async {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"x")))).await;
            };
            let frame = async {
                let frame = body.frame().await;
                ended = Instant::now();
                frame
            };
            let (frame, ()) = tokio::join!(frame, send);
            match frame.unwrap() {
                Ok(_) => got += 1,
                Err(err) => break err,
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        };
        assert!(is_too_slow(&err), "{err}");
        // Three waits of 300 ms, then the fourth passes the 1 s grace
        // 100 ms in: the upstream's 15 s did not count.
        assert_eq!(got, 3);
        assert_eq!(ended - started, Duration::from_millis(3 * 5300 + 100));
    }

    #[tokio::test(start_paused = true)]
    async fn silence_before_the_floor_is_reached_is_the_idle_timeout() {
        let (tx, inner) = channel_body();
        let body = IdleTimeout::new(inner, Duration::from_secs(5))
            .with_floor(floor(1, Duration::from_secs(60)));
        let mut body = std::pin::pin!(body);
        let started = Instant::now();
        let (_, err) = drain(body.as_mut()).await;
        let err = err.expect("cut");
        assert!(is_idle_timeout(&err), "{err}");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        drop(tx);
    }

    #[tokio::test(start_paused = true)]
    async fn end_of_body_is_passed_through() {
        let (tx, inner) = channel_body();
        let mut body = std::pin::pin!(IdleTimeout::new(inner, Duration::from_secs(5)));
        drop(tx);
        assert!(body.frame().await.is_none());
    }
}
