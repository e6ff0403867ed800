//! A connection from a trusted load balancer: its PROXY protocol header
//! read (bounded in size and in time), and the bytes that came with it
//! handed on to HTTP or TLS as if never read.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use metrics::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::config::ProxyProtocol;
use crate::telemetry;

use super::proxy_protocol::{self, Invalid, Parsed, Version, MAX_HEADER};

/// Why a connection's header was refused: the `reason` label of
/// `sluice_proxy_protocol_rejected_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    Malformed,
    TooLong,
    /// A version `server.proxy_protocol` does not list.
    Version,
    /// No decision by the first request head's deadline.
    Timeout,
}

impl Rejected {
    const REASONS: [&'static str; 4] = ["malformed", "too_long", "version", "timeout"];

    fn index(self) -> usize {
        match self {
            Rejected::Malformed => 0,
            Rejected::TooLong => 1,
            Rejected::Version => 2,
            Rejected::Timeout => 3,
        }
    }
}

impl From<Invalid> for Rejected {
    fn from(invalid: Invalid) -> Rejected {
        match invalid {
            Invalid::Malformed => Rejected::Malformed,
            Invalid::TooLong => Rejected::TooLong,
        }
    }
}

/// The listener's counters of headers read and refused.
pub struct Counters {
    read: [Counter; 2],
    rejected: [Counter; Rejected::REASONS.len()],
}

impl Counters {
    pub fn new() -> Counters {
        Counters {
            read: ["v1", "v2"]
                .map(|v| metrics::counter!(telemetry::PROXY_PROTOCOL_HEADERS, "version" => v)),
            rejected: Rejected::REASONS.map(
                |reason| metrics::counter!(telemetry::PROXY_PROTOCOL_REJECTED, "reason" => reason),
            ),
        }
    }

    pub fn rejected(&self, rejected: Rejected) {
        self.rejected[rejected.index()].increment(1);
    }
}

/// What a trusted peer's connection began with.
#[derive(Debug)]
pub struct Opening {
    /// The client the header carries; `None` without a header, or with
    /// one that carries no address (the peer stands).
    pub source: Option<SocketAddr>,
    /// What was read after the header (or all of it, with none).
    pub rest: Vec<u8>,
}

/// Reads the start of `stream` until it is known to hold a header of a
/// listed version (read whole), no header, or a refused one; by
/// `deadline`. `Ok(None)`: the peer closed before that was known.
pub async fn read_opening(
    stream: &mut TcpStream,
    versions: ProxyProtocol,
    deadline: Instant,
    counters: &Counters,
) -> Result<Option<Opening>, Rejected> {
    let mut bytes = Vec::with_capacity(256);
    let read = tokio::time::timeout_at(deadline, async {
        loop {
            match proxy_protocol::parse(&bytes) {
                Parsed::Incomplete => {}
                Parsed::Absent => return Ok(Some(None)),
                Parsed::Header {
                    version,
                    len,
                    source,
                } => return Ok(Some(Some((version, len, source)))),
                Parsed::Invalid(invalid) => return Err(Rejected::from(invalid)),
            }
            // `parse` decides within MAX_HEADER bytes: the buffer is never
            // full while it is undecided.
            let room = MAX_HEADER - bytes.len();
            match (&mut *stream).take(room as u64).read_buf(&mut bytes).await {
                Ok(0) | Err(_) => return Ok(None),
                Ok(_) => {}
            }
        }
    })
    .await
    .unwrap_or(Err(Rejected::Timeout))?;
    let Some(found) = read else {
        return Ok(None);
    };
    let Some((version, len, source)) = found else {
        return Ok(Some(Opening {
            source: None,
            rest: bytes,
        }));
    };
    let listed = match version {
        Version::V1 => versions.v1,
        Version::V2 => versions.v2,
    };
    if !listed {
        return Err(Rejected::Version);
    }
    counters.read[usize::from(version == Version::V2)].increment(1);
    bytes.drain(..len);
    Ok(Some(Opening {
        source,
        rest: bytes,
    }))
}

pin_project_lite::pin_project! {
    /// A stream whose first bytes were read already: they are read again
    /// first, then the stream's own.
    pub struct Prefixed<S> {
        prefix: Vec<u8>,
        at: usize,
        #[pin]
        inner: S,
    }
}

impl<S> Prefixed<S> {
    pub fn new(inner: S, prefix: Vec<u8>) -> Prefixed<S> {
        Prefixed {
            prefix,
            at: 0,
            inner,
        }
    }
}

impl<S: AsyncRead> AsyncRead for Prefixed<S> {
    // Inlined: on every read of every connection, the prefix is empty.
    #[inline]
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        if *this.at < this.prefix.len() {
            let left = &this.prefix[*this.at..];
            let n = left.len().min(buf.remaining());
            buf.put_slice(&left[..n]);
            *this.at += n;
            if *this.at == this.prefix.len() {
                *this.prefix = Vec::new();
                *this.at = 0;
            }
            return Poll::Ready(Ok(()));
        }
        this.inner.poll_read(cx, buf)
    }
}

impl<S: AsyncWrite> AsyncWrite for Prefixed<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;

    use super::*;

    #[tokio::test]
    async fn the_prefix_is_read_first_in_pieces_then_the_stream() {
        let inner: &[u8] = b" world";
        let mut stream = Prefixed::new(inner, b"hello".to_vec());
        let mut small = [0; 3];
        let n = stream.read(&mut small).await.unwrap();
        assert_eq!(&small[..n], b"hel");
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"lo world");
    }
}
