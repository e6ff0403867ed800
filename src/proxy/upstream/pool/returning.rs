//! The upstream's response body, which gives its connection back to the
//! pool once read to the end, and never gives back a connection whose body
//! broke.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body as _, Frame, SizeHint};
use hyper::body::Incoming;
use pin_project_lite::pin_project;

use super::Lease;

pin_project! {
    /// The upstream's response body; gives its connection back to the pool
    /// once read to the end.
    pub(in crate::proxy::upstream) struct Returning {
        #[pin]
        inner: Incoming,
        lease: Option<Lease>,
    }
}

impl Returning {
    /// `inner`, whose connection goes back as soon as it is done: now, for
    /// a response with no body.
    pub(in crate::proxy::upstream) fn new(inner: Incoming, lease: Lease) -> Returning {
        if inner.is_end_stream() {
            lease.release();
            return Returning { inner, lease: None };
        }
        Returning {
            inner,
            lease: Some(lease),
        }
    }
}

impl http_body::Body for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let mut this = self.project();
        let frame = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        match &frame {
            // The last frame is handed over with the connection already
            // back: the reader may stop at `is_end_stream` without asking
            // for the end.
            Some(Ok(_)) if this.inner.is_end_stream() => release(this.lease),
            None => release(this.lease),
            // A broken body leaves the connection to close.
            Some(Err(_)) => drop(this.lease.take()),
            Some(Ok(_)) => {}
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

fn release(lease: &mut Option<Lease>) {
    if let Some(lease) = lease.take() {
        lease.release();
    }
}

// `Returning` must be `Sync` for the boxed body; hyper's `Incoming` and
// `SendRequest` are.
const _: fn() = || {
    fn sync<T: Send + Sync>() {}
    sync::<Returning>();
};
