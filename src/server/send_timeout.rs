//! `server.send_timeout`: a client that stops reading is cut.
//!
//! hyper's backpressure keeps such a client from making sluice buffer a
//! whole response (it stops reading the upstream once its own bounded
//! buffers and the sockets' are full), but nothing in hyper ever gives up
//! on it: the connection, and the upstream connection behind it, would be
//! held for as long as the client likes. Like nginx's `send_timeout`, a
//! write that cannot make progress for the timeout fails the connection.
//! Only time spent blocked on the client counts: a response that is slow
//! to come from the upstream is never the client's fault.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

pin_project! {
    /// A stream whose writes fail after `timeout` blocked on the peer.
    pub struct SendTimeout<S> {
        #[pin]
        inner: S,
        // Boxed so the stream is `Unpin` when `S` is, as the TLS acceptor
        // wants: one allocation per connection.
        sleep: Pin<Box<Sleep>>,
        timeout: Duration,
        blocked: bool,
    }
}

impl<S> SendTimeout<S> {
    pub fn new(inner: S, timeout: Duration) -> SendTimeout<S> {
        SendTimeout {
            inner,
            sleep: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            blocked: false,
        }
    }
}

impl<S> SendTimeout<S> {
    /// What became of a write-side poll: progress clears the clock, a
    /// block starts it (once), and a block past the timeout is an error.
    fn watch<T>(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        let this = self.project();
        if polled.is_ready() {
            *this.blocked = false;
            return polled;
        }
        if !*this.blocked {
            *this.blocked = true;
            this.sleep.as_mut().reset(Instant::now() + *this.timeout);
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client read nothing for {:?}", this.timeout),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead> AsyncRead for SendTimeout<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

impl<S: AsyncWrite> AsyncWrite for SendTimeout<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = self.as_mut().project().inner.poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = self.as_mut().project().inner.poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = self.as_mut().project().inner.poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = self.as_mut().project().inner.poll_shutdown(cx);
        self.watch(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_reads_nothing_fails_the_write_after_the_timeout() {
        // A 64-byte pipe whose other end never reads.
        let (near, _far) = tokio::io::duplex(64);
        let mut stream = std::pin::pin!(SendTimeout::new(near, Duration::from_secs(5)));
        let started = Instant::now();
        let err = stream.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_not_cut() {
        use tokio::io::AsyncReadExt;
        let (near, mut far) = tokio::io::duplex(64);
        let mut stream = std::pin::pin!(SendTimeout::new(near, Duration::from_secs(5)));
        let reader = async {
            let mut buf = [0u8; 64];
            let mut total = 0;
            while total < 1024 {
                // 4 s between reads: under the timeout every time.
                tokio::time::sleep(Duration::from_secs(4)).await;
                total += far.read(&mut buf).await.unwrap();
            }
        };
        let (written, ()) = tokio::join!(stream.write_all(&[0u8; 1024]), reader);
        written.expect("a reader that keeps up is never cut");
    }
}
