//! Request framing that hyper accepts and an application behind sluice
//! may read differently: refused below hyper's parser, before any of it is
//! routed, charged or forwarded.
//!
//! hyper takes a request carrying both `Content-Length` and
//! `Transfer-Encoding` (it drops the length, closes after the response),
//! and a head whose lines end in a bare LF. Both are classic smuggling
//! vectors: the app, or a proxy between sluice and the app, may frame the
//! same bytes another way. Envoy and nginx refuse them with 400; so does
//! sluice. Neither is visible once hyper has parsed the head (it removes
//! the `Content-Length` it ignored), so the bytes are watched as they are
//! read: [`Framing`] follows each HTTP/1 request head and body, and when a
//! head is one of these it spoils the part of it not yet handed to hyper,
//! so hyper answers its own 400 and closes the connection, having routed
//! nothing.
//!
//! A head whose body cannot be framed at all (`Transfer-Encoding` whose
//! last coding is not `chunked`, or on HTTP/1.0) hyper refuses with a
//! bare 400. sluice answers it with a problem body like its other
//! refusals: when the whole head is in the read that ends it, it is handed
//! to hyper as [`STAND_IN`], a head hyper takes, marked in [`StandIns`]
//! for the service to answer 400 and close instead of serving it. A head
//! that began in an earlier read is already partly hyper's, and is spoiled
//! like the others.
//!
//! Following the framing never guesses: whatever it cannot follow exactly
//! (an upgrade or `CONNECT`, an HTTP/2 preface, a head too large, a chunk
//! it cannot read) turns the watch off for the rest of the connection, and
//! hyper's own checks are what remains. It can only ever refuse a head it
//! has read whole, from its first byte.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use std::sync::Arc;

use head::{Head, HeadReader, Refusal};

use super::heads;

mod head;

/// Put behind a spoiled head so the parser refuses it at once.
const SETTLE: &[u8] = b"\r\n\r\n";

/// What hyper reads in place of a head with a body that cannot be framed:
/// a request it takes, with no body, shorter than any head it replaces
/// (one with a `Transfer-Encoding` line). It is never served: the service
/// answers it from [`StandIns`].
pub const STAND_IN: &[u8] = b"GET / HTTP/1.1\r\n\r\n";

/// Which HTTP/1 request of a connection (counted from 1, in the order
/// hyper hands them to the service) is a [`STAND_IN`]; at most one, since
/// the watch stops there.
#[derive(Debug, Default)]
pub struct StandIns(AtomicU64);

impl StandIns {
    fn mark(&self, request: u64) {
        self.0.store(request, Ordering::Release);
    }

    /// Whether the connection's `request`th HTTP/1 request stands in for a
    /// head with a body that cannot be framed, to be refused.
    pub fn is(&self, request: u64) -> bool {
        request != 0 && self.0.load(Ordering::Acquire) == request
    }
}

#[derive(Debug)]
pub struct Framing {
    state: State,
    /// A head longer is hyper's to refuse (431); the watch stops there.
    max_head: usize,
    /// Requests refused so far on this connection (0 or 1: hyper closes).
    refused: u32,
    /// Heads read whole so far: hyper's requests, in order.
    heads: u64,
    /// The head replaced by [`STAND_IN`], counted as `heads` counts, and
    /// where the read that held it now ends, until taken.
    stand_in: Option<(u64, usize)>,
}

#[derive(Debug, Clone)]
enum State {
    /// Before a request head (empty lines between requests are skipped,
    /// as httparse skips them).
    Idle,
    /// Inside a head.
    Head(HeadReader),
    /// `n` bytes of a `Content-Length` body left.
    Body(u64),
    Chunked(Chunk),
    /// Not watched any more.
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Reading a chunk-size line: its value so far, whether the hex digits
    /// ended (an extension or whitespace follows), whether any were read.
    Size {
        value: u64,
        ended: bool,
        digits: bool,
    },
    /// `n` bytes of chunk data left, then its CRLF.
    Data(u64),
    /// After chunk data: `\r\n` expected (`cr`: the CR was read).
    DataEnd { cr: bool },
    /// After the last chunk: trailer lines until an empty one
    /// (`empty`: nothing but an optional CR on this line so far).
    Trailer { empty: bool },
}

impl Framing {
    pub fn new(max_head: usize) -> Framing {
        Framing {
            state: State::Idle,
            max_head,
            refused: 0,
            heads: 0,
            stand_in: None,
        }
    }

    /// The head just replaced by [`STAND_IN`] (its number among the
    /// heads) and how many bytes of the read hyper may now have: what
    /// followed the head is not handed over.
    pub fn take_stand_in(&mut self) -> Option<(u64, usize)> {
        self.stand_in.take()
    }

    pub fn refused(&self) -> u32 {
        self.refused
    }

    /// Bytes of a request head read so far and not yet ended: what hyper
    /// holds for a head still arriving. 0 between heads, and once the
    /// watch is off.
    pub fn partial_head(&self) -> usize {
        match &self.state {
            State::Head(reader) => reader.len(),
            _ => 0,
        }
    }

    /// Follows `bytes`, just read and not yet handed to hyper; spoils the
    /// last byte of a head that must be refused, or replaces it with
    /// [`STAND_IN`] ([`Framing::take_stand_in`] then says how much of
    /// `bytes` is left).
    pub fn inspect(&mut self, bytes: &mut [u8]) {
        let mut at = 0;
        while at < bytes.len() {
            at = match &mut self.state {
                State::Off => return,
                State::Idle => match bytes[at] {
                    b'\r' | b'\n' => at + 1,
                    _ => {
                        self.state = State::Head(HeadReader::new());
                        at
                    }
                },
                State::Head(_) => self.head_bytes(bytes, at),
                State::Body(left) => {
                    let take = (*left).min((bytes.len() - at) as u64);
                    self.state = match *left - take {
                        0 => State::Idle,
                        n => State::Body(n),
                    };
                    at + take as usize
                }
                State::Chunked(chunk) => {
                    let chunk = *chunk;
                    self.chunk_bytes(chunk, bytes, at)
                }
            };
        }
    }

    /// Reads head bytes from `bytes[at..]`; returns where the head ended
    /// (or the end of `bytes`).
    fn head_bytes(&mut self, bytes: &mut [u8], at: usize) -> usize {
        let State::Head(reader) = &mut self.state else {
            return at;
        };
        let Some((used, verdict)) = reader.read(&bytes[at..]) else {
            if reader.len() > self.max_head {
                self.state = State::Off;
            }
            return bytes.len();
        };
        if reader.len() > self.max_head {
            // Ended, but past hyper's bound: hyper refuses it (431), and
            // the verdict must not depend on whether the bound was passed
            // within a read or at the end of one.
            self.state = State::Off;
            return bytes.len();
        }
        // `used` bytes from `at` complete the head.
        let last = at + used - 1;
        self.heads += 1;
        let whole_here = reader.len() == used;
        self.state = match verdict {
            Head::Refuse(Refusal::UnframedBody) if whole_here && used >= STAND_IN.len() => {
                bytes[at..at + STAND_IN.len()].copy_from_slice(STAND_IN);
                self.stand_in = Some((self.heads, at + STAND_IN.len()));
                self.state = State::Off;
                return bytes.len();
            }
            Head::Refuse(_) => {
                // NULs over the part of the head in this read: where
                // httparse wants a method, a header name or value, it
                // refuses them, and hyper answers 400 and closes.
                bytes[at..=last].fill(0);
                self.refused += 1;
                State::Off
            }
            Head::Length(0) | Head::Empty => State::Idle,
            Head::Length(n) => State::Body(n),
            Head::Chunked => State::Chunked(Chunk::Size {
                value: 0,
                ended: false,
                digits: false,
            }),
            Head::Unfollowable => State::Off,
        };
        last + 1
    }

    fn chunk_bytes(&mut self, chunk: Chunk, bytes: &[u8], at: usize) -> usize {
        let byte = bytes[at];
        let next = match chunk {
            Chunk::Size {
                value,
                ended,
                digits,
            } => match byte {
                b'\n' if !digits => return self.off_at(bytes),
                b'\n' if value == 0 => Chunk::Trailer { empty: true },
                b'\n' => Chunk::Data(value),
                _ if ended => chunk,
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    let digit = u64::from((byte as char).to_digit(16).unwrap_or(0));
                    match value.checked_mul(16).and_then(|v| v.checked_add(digit)) {
                        Some(value) => Chunk::Size {
                            value,
                            ended,
                            digits: true,
                        },
                        None => return self.off_at(bytes),
                    }
                }
                // `;ext`, whitespace, the CR before the LF.
                _ => Chunk::Size {
                    value,
                    ended: true,
                    digits,
                },
            },
            Chunk::Data(left) => {
                let take = left.min((bytes.len() - at) as u64);
                self.state = State::Chunked(match left - take {
                    0 => Chunk::DataEnd { cr: false },
                    n => Chunk::Data(n),
                });
                return at + take as usize;
            }
            Chunk::DataEnd { cr } => match byte {
                b'\r' if !cr => Chunk::DataEnd { cr: true },
                b'\n' => Chunk::Size {
                    value: 0,
                    ended: false,
                    digits: false,
                },
                _ => return self.off_at(bytes),
            },
            Chunk::Trailer { empty } => match byte {
                b'\n' if empty => {
                    self.state = State::Idle;
                    return at + 1;
                }
                b'\n' => Chunk::Trailer { empty: true },
                b'\r' => Chunk::Trailer { empty },
                _ => Chunk::Trailer { empty: false },
            },
        };
        self.state = State::Chunked(next);
        at + 1
    }

    fn off_at(&mut self, bytes: &[u8]) -> usize {
        self.state = State::Off;
        bytes.len()
    }
}

/// The connection's first read is the protocol sniff's, of 24 bytes (an
/// HTTP/2 preface or not); it reads this much instead, the rest held for
/// hyper's next read, which follows at once. So a first head arriving in
/// one piece is seen whole in one read, as later heads are in hyper's
/// buffer of this size: one in which the watch may stand in for it.
const LOOKAHEAD: usize = 8 * 1024;

pin_project! {
    /// A client stream whose HTTP/1 request framing is watched as it is
    /// read ([`Framing`]), and whose partial request heads are charged to
    /// the memory budget for heads as they arrive.
    #[project = WatchedProj]
    pub struct Watched<S> {
        #[pin]
        inner: S,
        framing: Framing,
        // Read ahead of the first read, watched already, not yet handed
        // over.
        pending: Vec<u8>,
        // The first read is done.
        started: bool,
        stand_ins: Arc<StandIns>,
        budget: Arc<heads::Connection>,
        // The partial head's bytes, charged.
        charged: Option<heads::Charge>,
        // Refused for the budget: every read from now on is the end.
        over: bool,
    }
}

impl<S> Watched<S> {
    /// `max_head`: `server.max_header_bytes`, hyper's own bound;
    /// `stand_ins`: shared with the connection's service.
    pub fn new(
        inner: S,
        max_head: usize,
        budget: Arc<heads::Connection>,
        stand_ins: Arc<StandIns>,
    ) -> Watched<S> {
        Watched {
            inner,
            framing: Framing::new(max_head),
            pending: Vec::new(),
            started: false,
            stand_ins,
            budget,
            charged: None,
            over: false,
        }
    }
}

impl<S: AsyncRead + AsyncWrite> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let mut this = self.project();
        if *this.over {
            return Poll::Ready(Ok(()));
        }
        if !this.pending.is_empty() {
            let n = this.pending.len().min(buf.remaining());
            buf.put_slice(&this.pending[..n]);
            this.pending.drain(..n);
            if this.pending.is_empty() {
                *this.pending = Vec::new();
            }
            return Poll::Ready(Ok(()));
        }
        if *this.started || buf.remaining() >= LOOKAHEAD {
            return read_watched(&mut this, cx, buf);
        }
        let mut room = [0u8; LOOKAHEAD];
        let mut ahead = ReadBuf::new(&mut room);
        let polled = read_watched(&mut this, cx, &mut ahead);
        if let Poll::Ready(Ok(())) = polled {
            *this.started = true;
            let read = ahead.filled();
            let n = read.len().min(buf.remaining());
            buf.put_slice(&read[..n]);
            this.pending.extend_from_slice(&read[n..]);
        }
        polled
    }
}

/// Reads into `buf`, following and charging what was read.
fn read_watched<S: AsyncRead + AsyncWrite>(
    this: &mut WatchedProj<'_, S>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    let before = buf.filled().len();
    let polled = this.inner.as_mut().poll_read(cx, buf);
    if polled.is_ready() {
        let refused = this.framing.refused();
        this.framing.inspect(&mut buf.filled_mut()[before..]);
        if let Some((request, kept)) = this.framing.take_stand_in() {
            // Marked before hyper reads it, so the service finds it.
            this.stand_ins.mark(request);
            buf.set_filled(before + kept);
            tracing::debug!(
                "request framing refused: a transfer-coding that leaves the body's end unknown"
            );
        }
        if this.framing.refused() > refused {
            // httparse waits for more before it calls a line bad when
            // the NULs end the buffer; a line break behind them makes
            // it decide now. Without room for it (a head ending just at
            // the end of a small read), hyper waits for the rest until
            // `header_read_timeout` and closes: refused all the same.
            if buf.remaining() >= SETTLE.len() {
                buf.put_slice(SETTLE);
            }
            crate::proxy::metrics::request_refused(crate::proxy::metrics::REFUSED_FRAMING);
            tracing::debug!(
                "request framing refused: Content-Length with Transfer-Encoding, or a bare LF"
            );
        }
        if let Err(over) = charge(this.charged, this.budget, this.framing.partial_head()) {
            // What hyper was about to get is withheld, and it reads
            // the end of the stream: it closes without answering, so
            // the answer is written here, once, as far as the socket
            // takes it at once.
            buf.set_filled(before);
            *this.over = true;
            *this.charged = None;
            let answer = crate::proxy::respond::over_head_budget_http1(over);
            if let Poll::Ready(Ok(_)) = this.inner.as_mut().poll_write(cx, answer) {
                let _ = this.inner.as_mut().poll_flush(cx);
            }
            return Poll::Ready(Ok(()));
        }
    }
    polled
}

/// Brings the charge for a partial head to `partial` bytes (none once the
/// head has ended).
fn charge(
    charged: &mut Option<heads::Charge>,
    budget: &Arc<heads::Connection>,
    partial: usize,
) -> Result<(), heads::Over> {
    let held = charged.as_ref().map_or(0, heads::Charge::bytes);
    if partial == held {
        return Ok(());
    }
    match charged {
        Some(charge) if partial > held => charge.grow(partial - held),
        _ => {
            // Ended, or ended and another begun in the same read.
            *charged = None;
            if partial > 0 {
                *charged = Some(budget.charge(partial)?);
            }
            Ok(())
        }
    }
}

impl<S: AsyncWrite> AsyncWrite for Watched<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.project().inner.poll_write(cx, buf)
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

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
