//! A connection's future beside the things that may end it early (the
//! drain signal, the idle timer), where only the connection is polled on
//! every wake-up.
//!
//! `tokio::select!` polls every branch each time the task wakes, and a
//! keep-alive HTTP/1 connection wakes several times per request (the
//! client's bytes, the upstream's answer, the write): the idle `Sleep` and
//! the drain `watch` were polled each time, about 540 instructions a
//! request, to learn nothing. [`Beside`] polls the watchers only when one
//! of them woke the task (through a waker of their own), and once at the
//! start so that they register.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;
use pin_project_lite::pin_project;

/// Which of the two ended first.
pub enum First<A, B> {
    Main(A),
    Side(B),
}

/// Polls `main` on every wake-up, `side` only when it asked to be.
pub fn beside<M: Future, S: Future>(main: M, side: S) -> Beside<M, S> {
    let flag = Arc::new(SideWake {
        // Polled on the first poll, so that it registers.
        woken: AtomicBool::new(true),
        task: AtomicWaker::new(),
    });
    Beside {
        main,
        side,
        waker: Waker::from(flag.clone()),
        flag,
    }
}

pin_project! {
    pub struct Beside<M, S> {
        #[pin]
        main: M,
        #[pin]
        side: S,
        flag: Arc<SideWake>,
        // `flag` as a waker, handed to `side`.
        waker: Waker,
    }
}

/// Set by `side`'s wake-ups; passes them on to the task.
struct SideWake {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Wake for SideWake {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        self.task.wake();
    }
}

impl<M: Future, S: Future> Future for Beside<M, S> {
    type Output = First<M::Output, S::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.main.poll(cx) {
            return Poll::Ready(First::Main(out));
        }
        // Before the flag is read: a wake-up after this reaches the task.
        this.flag.task.register(cx.waker());
        if this.flag.woken.swap(false, Ordering::SeqCst) {
            let mut side_cx = Context::from_waker(this.waker);
            if let Poll::Ready(out) = this.side.poll(&mut side_cx) {
                return Poll::Ready(First::Side(out));
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn the_side_ends_it_when_it_fires_first() {
        let start = tokio::time::Instant::now();
        let out = beside(
            tokio::time::sleep(Duration::from_secs(10)),
            tokio::time::sleep(Duration::from_secs(3)),
        )
        .await;
        assert!(matches!(out, First::Side(())));
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn the_main_future_wins_when_it_is_done_first() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u8>();
        let main = async { rx.await.unwrap() };
        let side = tokio::time::sleep(Duration::from_secs(3));
        let sender = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            tx.send(7).unwrap();
        };
        let (out, ()) = tokio::join!(beside(main, side), sender);
        assert!(matches!(out, First::Main(7)));
    }
}
