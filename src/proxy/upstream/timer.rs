//! `upstream.timeout`: how long the upstream may keep a request waiting,
//! counting only the time it is the upstream's turn.
//!
//! While the request body is uploading, the turn passes back and forth:
//! when hyper asks for the next piece and the client has not sent it, the
//! client is the slow one and `server.body_idle_timeout` and
//! `server.min_upload_rate` bound it; once a piece has been handed over,
//! the upstream has until `upstream.timeout` to take the next (nginx's
//! `proxy_send_timeout`, between two writes) or, after the last, to send
//! its response head (`proxy_read_timeout`). So a
//! slow but steady upload to an app that reads the whole body first is
//! never a 504, and an app that stalls is one `upstream.timeout` after the
//! last byte it was given.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::sleeps::{Reused, Spares};

/// Whose turn it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Turn {
    /// hyper asked for the next piece of the body; the client owes it.
    Client,
    /// The upstream has had everything sent so far since this instant.
    Upstream(Instant),
}

/// Resolves once the upstream has had `timeout` of its own turn.
#[derive(Debug)]
pub(super) struct UpstreamTimer {
    /// `None` for a body already complete: nothing to follow (and no
    /// channel allocated for most requests).
    turn: Option<watch::Receiver<Turn>>,
    started: Instant,
    timeout: Duration,
    /// For a complete body, the one sleep it needs, taken from the
    /// upstream's spares (`sleeps`): most requests take no timer lock.
    sleep: Option<Reused>,
}

impl UpstreamTimer {
    /// For a request whose body is already complete: the upstream's turn
    /// from `started` (now, as the caller read the clock) on.
    pub(super) fn starting(started: Instant, timeout: Duration, spares: &Spares) -> UpstreamTimer {
        UpstreamTimer {
            turn: None,
            started,
            timeout,
            sleep: Some(spares.sleep_until(started + timeout)),
        }
    }

    /// For a streamed body: the timer follows `body` as hyper reads it.
    pub(super) fn tracking<B>(body: B, timeout: Duration) -> (Tracked<B>, UpstreamTimer) {
        let started = Instant::now();
        let (tx, turn) = watch::channel(Turn::Upstream(started));
        let tracked = Tracked {
            inner: body,
            turn: tx,
            client_turn: false,
        };
        let timer = UpstreamTimer {
            turn: Some(turn),
            started,
            timeout,
            sleep: None,
        };
        (tracked, timer)
    }

    /// Resolves when the upstream has gone `timeout` without taking a piece
    /// of the body it was offered, or without answering after the last.
    /// Sleeps until the deadline then looks again, so a fast upload does
    /// not wake this for every piece.
    pub(super) async fn expired(&mut self) {
        let Some(turn) = &mut self.turn else {
            return match &mut self.sleep {
                Some(sleep) => sleep.await,
                None => tokio::time::sleep_until(self.started + self.timeout).await,
            };
        };
        loop {
            let now = *turn.borrow_and_update();
            match now {
                Turn::Upstream(since) => {
                    tokio::time::sleep_until(since + self.timeout).await;
                    if *turn.borrow() == now {
                        return;
                    }
                }
                Turn::Client => {
                    if turn.changed().await.is_err() {
                        // The body was dropped on the client's turn: the
                        // exchange is ending by itself; this is a backstop.
                        tokio::time::sleep(self.timeout).await;
                        return;
                    }
                }
            }
        }
    }
}

pin_project! {
    /// A request body that tells its [`UpstreamTimer`] whose turn it is.
    pub(super) struct Tracked<B> {
        #[pin]
        inner: B,
        turn: watch::Sender<Turn>,
        client_turn: bool,
    }
}

impl<B: http_body::Body> http_body::Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        if polled.is_pending() {
            if !*this.client_turn {
                *this.client_turn = true;
                this.turn.send_replace(Turn::Client);
            }
        } else {
            // A piece or the end was handed over: the upstream's turn.
            *this.client_turn = false;
            this.turn.send_replace(Turn::Upstream(Instant::now()));
        }
        polled
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
    use bytes::Bytes;
    use http_body_util::{BodyExt, StreamBody};
    use tokio::sync::mpsc;

    type Chunk = Result<Frame<Bytes>, std::convert::Infallible>;

    fn channel_body() -> (
        mpsc::Sender<Chunk>,
        impl http_body::Body<Data = Bytes, Error = std::convert::Infallible>,
    ) {
        let (tx, rx) = mpsc::channel::<Chunk>(1);
        let stream = futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        (tx, StreamBody::new(stream))
    }

    fn piece() -> Chunk {
        Ok(Frame::data(Bytes::from_static(b"x")))
    }

    #[tokio::test(start_paused = true)]
    async fn a_complete_body_gives_the_upstream_the_whole_timeout() {
        let started = Instant::now();
        UpstreamTimer::starting(Instant::now(), Duration::from_secs(3), &Spares::new())
            .expired()
            .await;
        assert_eq!(started.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn the_client_s_turns_do_not_count_and_the_end_starts_the_last_turn() {
        let (tx, inner) = channel_body();
        let (body, mut timer) = UpstreamTimer::tracking(inner, Duration::from_secs(3));
        let mut body = std::pin::pin!(body);
        let reader = async {
            // hyper reads every piece as soon as it comes.
            while body.frame().await.is_some() {}
            Instant::now()
        };
        let writer = async {
            // A client slower than the timeout between pieces, 10 s in all.
            for _ in 0..5 {
                tokio::time::sleep(Duration::from_secs(2)).await;
                tx.send(piece()).await.unwrap();
            }
            tokio::time::sleep(Duration::from_secs(4)).await;
            drop(tx);
        };
        let timer_ran = async {
            timer.expired().await;
            Instant::now()
        };
        let (ended, (), expired) = tokio::join!(reader, writer, timer_ran);
        assert_eq!(expired - ended, Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn an_upstream_that_stops_taking_the_body_runs_out_of_time() {
        let (tx, inner) = channel_body();
        let (body, mut timer) = UpstreamTimer::tracking(inner, Duration::from_secs(3));
        let mut body = std::pin::pin!(body);
        tx.send(piece()).await.unwrap();
        assert!(body.frame().await.is_some());
        let took = Instant::now();
        // More is ready, but the upstream does not ask for it.
        tx.send(piece()).await.unwrap();
        timer.expired().await;
        assert_eq!(took.elapsed(), Duration::from_secs(3));
    }
}
