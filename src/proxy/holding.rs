//! What a forwarded request holds (its concurrency places) and how long:
//! until the app's response has ended, whoever stops reading it.
//!
//! A client that hangs up does not end the app's work: most app servers
//! (Werkzeug, gunicorn's sync workers, Puma) never notice a closed socket
//! and answer anyway. Were the places given back when the client went,
//! every hang-up would let one more request into an app already running
//! at its limit (12 requests in progress against a limit of 3, measured
//! before this). So a response body dropped before its end is read to its
//! end by a task of its own, at most `upstream.timeout` more, and only
//! then are the places given back.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt as _;

use super::body::{Body, BoxError};

/// A response body that holds `H` until the body has ended: released as
/// its last frame is read, or, when the body is dropped before that (the
/// client went away), once the rest has been read and thrown away.
pub struct Holding<H: Send + 'static> {
    inner: Option<Body>,
    held: Option<H>,
    /// The longest the rest of an abandoned body is read.
    drain_for: Duration,
}

impl<H: Send + 'static> Holding<H> {
    pub fn new(inner: Body, held: H, drain_for: Duration) -> Holding<H> {
        Holding {
            inner: Some(inner),
            held: Some(held),
            drain_for,
        }
    }
}

// `H` is never pinned: it is only held, then dropped.
impl<H: Send + 'static> Unpin for Holding<H> {}

impl<H: Send + 'static> http_body::Body for Holding<H> {
    type Data = bytes::Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        // `Body` is boxed, hence `Unpin`, and so is `Holding`.
        let this = self.get_mut();
        let Some(inner) = this.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            // Ended (or broken, which ends it too): nothing more comes
            // from the app for this request.
            this.inner = None;
            this.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner
            .as_ref()
            .is_none_or(|inner| inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), |inner| inner.size_hint())
    }
}

impl<H: Send + 'static> Drop for Holding<H> {
    fn drop(&mut self) {
        let (Some(inner), Some(held)) = (self.inner.take(), self.held.take()) else {
            return;
        };
        if inner.is_end_stream() {
            return;
        }
        // Outside a runtime (a test dropping a response) there is no app
        // exchange to wait for either.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let drain_for = self.drain_for;
        runtime.spawn(async move {
            let _ = tokio::time::timeout(drain_for, drain(inner)).await;
            drop(held);
        });
    }
}

/// Reads `body` to its end (or its first error), keeping nothing.
async fn drain(mut body: Body) {
    while let Some(frame) = body.frame().await {
        if frame.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use bytes::Bytes;
    use http_body_util::{BodyExt as _, StreamBody};

    use super::*;

    /// Counts itself down when dropped, like a concurrency place.
    struct Place(Arc<AtomicUsize>);

    impl Drop for Place {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// A body whose frames are sent through the returned channel.
    fn streamed() -> (tokio::sync::mpsc::Sender<Bytes>, Body) {
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            let bytes = rx.recv().await?;
            Some((Ok::<_, BoxError>(Frame::data(bytes)), rx))
        });
        (tx, StreamBody::new(stream).boxed())
    }

    #[tokio::test]
    async fn a_body_read_to_its_end_gives_its_places_back() {
        let held = Arc::new(AtomicUsize::new(1));
        let (tx, body) = streamed();
        let mut holding = Holding::new(body, Place(held.clone()), Duration::from_secs(5));
        tx.send(Bytes::from_static(b"x")).await.unwrap();
        drop(tx);
        while holding.frame().await.is_some() {}
        assert_eq!(held.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn a_body_dropped_early_holds_its_places_until_the_app_is_done() {
        let held = Arc::new(AtomicUsize::new(1));
        let (tx, body) = streamed();
        drop(Holding::new(
            body,
            Place(held.clone()),
            Duration::from_secs(5),
        ));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(held.load(Ordering::SeqCst), 1, "the app has not finished");
        tx.send(Bytes::from_static(b"rest")).await.unwrap();
        drop(tx);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while held.load(Ordering::SeqCst) != 0 {
            assert!(tokio::time::Instant::now() < deadline, "never given back");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn an_app_that_never_ends_is_waited_for_at_most_the_bound() {
        let held = Arc::new(AtomicUsize::new(1));
        let (tx, body) = streamed();
        drop(Holding::new(
            body,
            Place(held.clone()),
            Duration::from_secs(60),
        ));
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert_eq!(held.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(held.load(Ordering::SeqCst), 0);
        drop(tx);
    }
}
