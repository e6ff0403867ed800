//! The one body type every response carries, and the body idle timeout
//! hyper does not have (PITFALLS: a body trickled at 1 byte/s is never cut
//! otherwise), for the client's request body and the upstream's response
//! body alike.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

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

pin_project! {
    /// A response body that holds what must live exactly as long as the
    /// response (a request's concurrency permits): dropped with the body,
    /// that is once its last frame is written, or as soon as the client
    /// goes away, whichever comes first.
    pub struct Holding<B, H> {
        #[pin]
        inner: B,
        held: H,
    }
}

impl<B, H> Holding<B, H> {
    pub fn new(inner: B, held: H) -> Holding<B, H> {
        Holding { inner, held }
    }
}

impl<B: http_body::Body, H> http_body::Body for Holding<B, H> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The client went quiet in the middle of its request body.
#[derive(Debug, thiserror::Error)]
#[error("no request body data for {0:?}")]
pub struct BodyIdleTimeout(pub Duration);

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

pin_project! {
    /// Fails the body when no frame arrives within `timeout` of being asked
    /// for. The clock starts when a poll finds nothing ready, not when the
    /// previous frame arrived: time spent deciding, connecting upstream or
    /// waiting for a slow upstream to read is not the client's silence.
    pub struct IdleTimeout<B> {
        #[pin]
        inner: B,
        // Made the first time the body has to wait: most bodies never
        // do (a response that came whole with its head).
        #[pin]
        sleep: Option<Sleep>,
        timeout: Duration,
        waiting: bool,
        side: Side,
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
            waiting: false,
            side,
            held: None,
        }
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
                *this.waiting = false;
                let side = *this.side;
                Poll::Ready(frame.map(|f| {
                    f.map_err(|e| match side {
                        Side::Request => ClientBodyError(e.into()).into(),
                        Side::Response => e.into(),
                    })
                }))
            }
            Poll::Pending => {
                if !*this.waiting {
                    *this.waiting = true;
                    let deadline = Instant::now() + *this.timeout;
                    match this.sleep.as_mut().as_pin_mut() {
                        Some(sleep) => sleep.reset(deadline),
                        None => this.sleep.set(Some(tokio::time::sleep_until(deadline))),
                    }
                }
                let sleep = this.sleep.as_pin_mut().expect("set when the wait began");
                match sleep.poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(match this.side {
                        Side::Request => BodyIdleTimeout(*this.timeout).into(),
                        Side::Response => UpstreamBodyIdle(*this.timeout).into(),
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

    #[tokio::test]
    async fn what_a_body_holds_lives_until_the_body_is_done_with() {
        let held = std::sync::Arc::new(());
        let (tx, inner) = channel_body();
        let mut body = Box::pin(Holding::new(inner, held.clone()));
        tx.send(Ok(Frame::data(Bytes::from_static(b"x"))))
            .await
            .unwrap();
        assert_eq!(
            body.frame().await.unwrap().unwrap().into_data().unwrap(),
            "x"
        );
        assert_eq!(
            std::sync::Arc::strong_count(&held),
            2,
            "held while streaming"
        );
        drop(body);
        assert_eq!(
            std::sync::Arc::strong_count(&held),
            1,
            "released with the body"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn end_of_body_is_passed_through() {
        let (tx, inner) = channel_body();
        let mut body = std::pin::pin!(IdleTimeout::new(inner, Duration::from_secs(5)));
        drop(tx);
        assert!(body.frame().await.is_none());
    }
}
