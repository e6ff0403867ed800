//! tokio sleeps kept armed for reuse, and hyper's HTTP/1 timer built on
//! them.
//!
//! A new tokio `Sleep` takes the time driver's lock twice: to enter the
//! timer wheel when it is first polled, and to leave it when it is dropped
//! unfired. A keep-alive HTTP/1 request arms two that are nearly always
//! dropped long before they fire: hyper's header-read timeout for the next
//! head, and `upstream.timeout`. A sleep that stays in the wheel and is
//! moved to a later deadline costs no lock: tokio notes the new deadline
//! and files the entry again only when the old one comes round. So a sleep
//! that is done with goes back, armed, to its [`Spares`], and the next one
//! asked for takes it and moves it on. Each `Spares` serves one timeout, so
//! a deadline taken from it is never earlier than the spares' own.
//!
//! A spare left long enough fires at its old deadline and wakes the task
//! that last polled it: one spurious poll. It also keeps that task's
//! allocation until then, so the list is bounded ([`MAX_SPARES`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::sync;
use tokio::time::{Instant, Sleep};

/// Most spares one list keeps; a sleep dropped beyond this is dropped.
const MAX_SPARES: usize = 256;

/// Sleeps done with, still armed, for the next one asked for.
#[derive(Debug, Clone, Default)]
pub struct Spares(Arc<Mutex<Vec<Pin<Box<Sleep>>>>>);

impl Spares {
    pub fn new() -> Spares {
        Spares::default()
    }

    /// A sleep until `deadline`: a spare moved on, or a new one.
    pub fn sleep_until(&self, deadline: Instant) -> Reused {
        let spare = sync::lock(&self.0).pop();
        let sleep = match spare {
            Some(mut sleep) => {
                sleep.as_mut().reset(deadline);
                sleep
            }
            None => Box::pin(tokio::time::sleep_until(deadline)),
        };
        Reused {
            sleep: Some(sleep),
            spares: self.clone(),
        }
    }
}

/// A sleep that goes back to its [`Spares`] when dropped.
#[derive(Debug)]
pub struct Reused {
    /// `None` only while being dropped.
    sleep: Option<Pin<Box<Sleep>>>,
    spares: Spares,
}

impl Reused {
    pub fn reset(&mut self, deadline: Instant) {
        if let Some(sleep) = &mut self.sleep {
            sleep.as_mut().reset(deadline);
        }
    }
}

impl Future for Reused {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.sleep {
            Some(sleep) => sleep.as_mut().poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl Drop for Reused {
    fn drop(&mut self) {
        let Some(sleep) = self.sleep.take() else {
            return;
        };
        if sleep.is_elapsed() {
            // Out of the wheel already: nothing to save.
            return;
        }
        let mut spares = sync::lock(&self.spares.0);
        if spares.len() < MAX_SPARES {
            spares.push(sleep);
        }
    }
}

impl hyper::rt::Sleep for Reused {}

/// hyper's timer for HTTP/1 connections: as hyper-util's `TokioTimer`,
/// with the header-read sleeps taken from one list of spares.
#[derive(Debug, Clone, Default)]
pub struct HyperTimer {
    spares: Spares,
}

impl HyperTimer {
    pub fn new() -> HyperTimer {
        HyperTimer::default()
    }
}

// hyper's timer speaks std's instants; each is turned into tokio's at once.
#[allow(clippy::disallowed_types)]
impl hyper::rt::Timer for HyperTimer {
    fn sleep(&self, duration: Duration) -> Pin<Box<dyn hyper::rt::Sleep>> {
        self.sleep_until((Instant::now() + duration).into_std())
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(self.spares.sleep_until(deadline.into()))
    }

    fn reset(&self, sleep: &mut Pin<Box<dyn hyper::rt::Sleep>>, new_deadline: std::time::Instant) {
        match sleep.as_mut().downcast_mut_pin::<Reused>() {
            Some(mut reused) => reused.reset(new_deadline.into()),
            None => *sleep = self.sleep_until(new_deadline),
        }
    }

    fn now(&self) -> std::time::Instant {
        Instant::now().into_std()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn poll_once(sleep: &mut Reused) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *sleep).poll(cx))).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_spare_moved_on_sleeps_until_its_new_deadline() {
        let spares = Spares::new();
        let start = Instant::now();
        let mut first = spares.sleep_until(start + Duration::from_secs(5));
        // Armed, then given back unfired.
        assert!(poll_once(&mut first).await.is_pending());
        drop(first);
        assert_eq!(sync::lock(&spares.0).len(), 1);

        tokio::time::advance(Duration::from_secs(1)).await;
        let second = spares.sleep_until(Instant::now() + Duration::from_secs(5));
        assert!(sync::lock(&spares.0).is_empty());
        second.await;
        assert_eq!(start.elapsed(), Duration::from_secs(6));
    }

    #[tokio::test(start_paused = true)]
    async fn a_spare_moved_earlier_still_fires_on_time() {
        let spares = Spares::new();
        let start = Instant::now();
        let mut first = spares.sleep_until(start + Duration::from_secs(60));
        assert!(poll_once(&mut first).await.is_pending());
        drop(first);
        spares.sleep_until(start + Duration::from_secs(2)).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }
}
