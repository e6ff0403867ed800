//! `server.send_timeout` for each HTTP/2 stream.
//!
//! On HTTP/1 a client that stops reading blocks sluice's socket writes,
//! and [`super::send_timeout`] cuts it. On HTTP/2, flow control stops a
//! stream before its bytes reach the socket: a client that grants a stream
//! no window (or stops granting it) leaves hyper holding the stream's next
//! chunk and never polling its body again, and no write ever blocks. The
//! stream, and the upstream connection behind it, would be held for as
//! long as the client likes.
//!
//! Like Envoy's `stream_idle_timeout`, each stream gets a watchdog. hyper
//! runs every HTTP/2 stream as its own task through the server's executor;
//! [`StreamExecutor`] wraps each in a [`Watchdog`] and makes the stream's
//! [`Handed`] clock reachable, through a task-local, from the code that
//! builds its response. The response body ([`watched`]) notes when it
//! hands hyper a chunk and clears the note when hyper comes back for the
//! next. Once hyper has held a chunk for `send_timeout`, the watchdog drops
//! the stream's task: h2 resets the stream (`RST_STREAM` with `CANCEL`) and
//! the upstream body is dropped with it. Only time spent waiting on the
//! client counts: while sluice waits for the upstream's next chunk, no
//! chunk is held and the clock does not run.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use pin_project_lite::pin_project;
use tokio::task::futures::TaskLocalFuture;
use tokio::time::{Instant, Sleep};

use crate::proxy::Body;

tokio::task_local! {
    static STREAM: Arc<Handed>;
}

/// Spawns hyper's HTTP/2 stream tasks, each under a [`Watchdog`].
#[derive(Debug, Clone, Copy)]
pub struct StreamExecutor {
    pub send_timeout: Duration,
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        let handed = Arc::new(Handed::new());
        tokio::spawn(Watchdog {
            stream: STREAM.scope(handed.clone(), stream),
            handed,
            sleep: tokio::time::sleep(self.send_timeout),
            timeout: self.send_timeout,
        });
    }
}

/// When the stream's response body last handed hyper a chunk that hyper
/// has not come back from.
#[derive(Debug)]
pub struct Handed {
    base: Instant,
    /// Nanoseconds after `base`, plus one; 0 while no chunk is held. The
    /// body and the watchdog run in the one task, so relaxed is enough.
    at: AtomicU64,
}

impl Handed {
    fn new() -> Handed {
        Handed {
            base: Instant::now(),
            at: AtomicU64::new(0),
        }
    }

    fn hand(&self) {
        let nanos = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX - 1);
        self.at.store(nanos + 1, Ordering::Relaxed);
    }

    fn taken(&self) {
        self.at.store(0, Ordering::Relaxed);
    }

    fn since(&self) -> Option<Instant> {
        match self.at.load(Ordering::Relaxed) {
            0 => None,
            at => Some(self.base + Duration::from_nanos(at - 1)),
        }
    }
}

/// The clock of the HTTP/2 stream being served, or `None` outside one
/// (HTTP/1, whose connection task calls the service itself).
pub fn current() -> Option<Arc<Handed>> {
    STREAM.try_with(Arc::clone).ok()
}

/// `body`, reporting to the stream's `handed` clock. `guard` is dropped
/// when the body ends or is dropped: the stream counts as in flight until
/// then.
pub fn watched<G>(body: Body, handed: Arc<Handed>, guard: G) -> Body
where
    G: Send + Sync + 'static,
{
    Watched {
        inner: body,
        handed,
        held: None,
        _guard: guard,
    }
    .boxed()
}

pin_project! {
    struct Watched<G> {
        #[pin]
        inner: Body,
        handed: Arc<Handed>,
        // A body error, held for `ERROR_HOLD` (see `poll_frame`).
        held: Option<(crate::proxy::BoxError, Pin<Box<Sleep>>)>,
        _guard: G,
    }
}

/// How long a failed response body's error waits before hyper hears of it.
/// hyper resets the stream on the error, and h2 then drops every frame of
/// the stream it has not written yet, the response head included: without
/// the wait, a body that breaks at once (an upstream gone right after its
/// head) would reach the client as a bare reset instead of a head and a
/// truncated body. The stream's frames are written by the connection's
/// task, not this one, so no single poll can tell they are out.
const ERROR_HOLD: Duration = Duration::from_millis(20);

impl<G> http_body::Body for Watched<G> {
    type Data = Bytes;
    type Error = crate::proxy::BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.project();
        // Asked again: whatever was handed before has been taken.
        this.handed.taken();
        if let Some((_, hold)) = this.held {
            ready!(hold.as_mut().poll(cx));
            let (error, _) = this.held.take().expect("held above");
            return Poll::Ready(Some(Err(error)));
        }
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Err(error))) => {
                let mut hold = Box::pin(tokio::time::sleep(ERROR_HOLD));
                // Registers the wake-up; a new sleep is never ready.
                let _ = hold.as_mut().poll(cx);
                *this.held = Some((error, hold));
                Poll::Pending
            }
            polled => {
                if let Poll::Ready(Some(Ok(frame))) = &polled {
                    if frame.is_data() {
                        this.handed.hand();
                    }
                }
                polled
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

pin_project! {
    /// One HTTP/2 stream's task, ended when hyper has held a chunk of its
    /// response for `timeout`.
    pub struct Watchdog<F> {
        #[pin]
        stream: TaskLocalFuture<Arc<Handed>, F>,
        handed: Arc<Handed>,
        #[pin]
        sleep: Sleep,
        timeout: Duration,
    }
}

impl<F: Future<Output = ()>> Future for Watchdog<F> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if this.stream.poll(cx).is_ready() {
            return Poll::Ready(());
        }
        let Some(since) = this.handed.since() else {
            // Waiting on the upstream or the service: not the client.
            return Poll::Pending;
        };
        let deadline = since + *this.timeout;
        if this.sleep.deadline() != deadline {
            this.sleep.as_mut().reset(deadline);
        }
        match this.sleep.poll(cx) {
            Poll::Ready(()) => {
                tracing::debug!(
                    timeout = ?this.timeout,
                    "an HTTP/2 stream's client took no data; resetting the stream"
                );
                // Ending the task drops the stream: h2 resets it.
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn handed_clock_runs_only_while_a_chunk_is_held() {
        let handed = Handed::new();
        assert_eq!(handed.since(), None);
        tokio::time::advance(Duration::from_secs(3)).await;
        let before = Instant::now();
        handed.hand();
        let since = handed.since().expect("a chunk is held");
        assert!(since >= before && since <= Instant::now());
        handed.taken();
        assert_eq!(handed.since(), None);
    }

    enum Step {
        Hand,
        Take,
    }

    /// A stream task that hands and takes chunks when told, through the
    /// clock [`current`] finds, as a response body would.
    fn stream(
        timeout: Duration,
    ) -> (
        tokio::sync::mpsc::UnboundedSender<Step>,
        tokio::task::JoinHandle<()>,
    ) {
        let (steps, mut told) = tokio::sync::mpsc::unbounded_channel();
        let handed = Arc::new(Handed::new());
        let watchdog = Watchdog {
            stream: STREAM.scope(handed.clone(), async move {
                while let Some(step) = told.recv().await {
                    let handed = current().expect("inside a stream task");
                    match step {
                        Step::Hand => handed.hand(),
                        Step::Take => handed.taken(),
                    }
                }
            }),
            handed,
            sleep: tokio::time::sleep(timeout),
            timeout,
        };
        (steps, tokio::spawn(watchdog))
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_holding_a_chunk_ends_at_the_timeout_and_one_taking_data_does_not() {
        let (steps, task) = stream(Duration::from_secs(2));

        // Nothing held: the watchdog waits however long the stream does.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!task.is_finished());

        // A chunk held for less than the timeout, then taken.
        steps.send(Step::Hand).unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        steps.send(Step::Take).unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!task.is_finished(), "cut though the client took the chunk");

        // Held past the timeout: the task ends without the stream ending,
        // and the stream is dropped.
        steps.send(Step::Hand).unwrap();
        tokio::time::sleep(Duration::from_millis(2100)).await;
        task.await.expect("the watchdog ends the task");
        assert!(steps.send(Step::Take).is_err(), "the stream was dropped");
    }

    #[test]
    fn outside_a_stream_task_there_is_no_clock() {
        assert!(current().is_none());
    }
}
