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
//! Following the framing never guesses: whatever it cannot follow exactly
//! (an upgrade or `CONNECT`, an HTTP/2 preface, a head too large, a chunk
//! it cannot read) turns the watch off for the rest of the connection, and
//! hyper's own checks are what remains. It can only ever refuse a head it
//! has read whole, from its first byte.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Put behind a spoiled head so the parser refuses it at once.
const SETTLE: &[u8] = b"\r\n\r\n";

/// A head this long is hyper's to refuse (431); the watch stops there.
const MAX_HEAD: usize = 64 * 1024;

#[derive(Debug)]
pub struct Framing {
    state: State,
    /// The head read so far, when it spans reads.
    head: Vec<u8>,
    /// Requests refused so far on this connection (0 or 1: hyper closes).
    refused: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before a request head (empty lines between requests are skipped,
    /// as httparse skips them).
    Idle,
    /// Inside a head; its bytes so far are in `head`.
    Head,
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

/// What a whole head says about the request.
#[derive(Debug, PartialEq, Eq)]
enum Head {
    /// Refused: hyper must not take it.
    Refuse(Refusal),
    /// Followed by a body of this framing.
    Length(u64),
    Chunked,
    /// No body.
    Empty,
    /// Cannot be followed (an upgrade, `CONNECT`, not HTTP/1).
    Unfollowable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    ContentLengthAndTransferEncoding,
    BareLineFeed,
}

impl Default for Framing {
    fn default() -> Self {
        Framing::new()
    }
}

impl Framing {
    pub fn new() -> Framing {
        Framing {
            state: State::Idle,
            head: Vec::new(),
            refused: 0,
        }
    }

    pub fn refused(&self) -> u32 {
        self.refused
    }

    /// Follows `bytes`, just read and not yet handed to hyper; spoils the
    /// last byte of a head that must be refused.
    pub fn inspect(&mut self, bytes: &mut [u8]) {
        let mut at = 0;
        while at < bytes.len() {
            at = match self.state {
                State::Off => return,
                State::Idle => match bytes[at] {
                    b'\r' | b'\n' => at + 1,
                    _ => {
                        self.state = State::Head;
                        self.head.clear();
                        at
                    }
                },
                State::Head => self.head_bytes(bytes, at),
                State::Body(left) => {
                    let take = left.min((bytes.len() - at) as u64);
                    self.state = match left - take {
                        0 => State::Idle,
                        n => State::Body(n),
                    };
                    at + take as usize
                }
                State::Chunked(chunk) => self.chunk_bytes(chunk, bytes, at),
            };
        }
    }

    /// Reads head bytes from `bytes[at..]`; returns where the head ended
    /// (or the end of `bytes`).
    fn head_bytes(&mut self, bytes: &mut [u8], at: usize) -> usize {
        // Where the end could be: a blank line, `\n\n` or `\n\r\n`, may
        // straddle the previous read.
        let before = self.head.len();
        let rest = &bytes[at..];
        let scan_from = before.saturating_sub(2);
        let end = {
            let tail = &self.head[scan_from..];
            find_end(tail, rest)
        };
        match end {
            None => {
                if before + rest.len() > MAX_HEAD {
                    self.off();
                } else {
                    self.head.extend_from_slice(rest);
                }
                bytes.len()
            }
            Some(used) => {
                // `used` bytes of `rest` complete the head.
                let last = at + used - 1;
                let verdict = if before == 0 {
                    read_head(&rest[..used])
                } else {
                    self.head.extend_from_slice(&rest[..used]);
                    read_head(&self.head)
                };
                self.head.clear();
                self.state = match verdict {
                    Head::Refuse(_) => {
                        // NULs over the part of the head in this read: where
                        // httparse wants a method, a header name or value,
                        // it refuses them, and hyper answers 400 and closes.
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
        }
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

    fn off(&mut self) {
        self.state = State::Off;
        self.head = Vec::new();
    }

    fn off_at(&mut self, bytes: &[u8]) -> usize {
        self.off();
        bytes.len()
    }
}

/// Where the head ends in `rest`, given the head's last bytes `tail` before
/// it: the count of bytes of `rest` through the blank line's LF.
fn find_end(tail: &[u8], rest: &[u8]) -> Option<usize> {
    // The byte `back` places before `rest[i]`, looking into `tail` when
    // `rest` does not reach back that far.
    let before = |i: usize, back: usize| -> Option<u8> {
        match i.checked_sub(back) {
            Some(j) => Some(rest[j]),
            None => tail.len().checked_sub(back - i).map(|j| tail[j]),
        }
    };
    let mut from = 0;
    while let Some(found) = rest[from..].iter().position(|&b| b == b'\n') {
        let i = from + found;
        let blank = match before(i, 1) {
            Some(b'\n') => true,
            Some(b'\r') => before(i, 2) == Some(b'\n'),
            _ => false,
        };
        if blank {
            return Some(i + 1);
        }
        from = i + 1;
    }
    None
}

/// Reads a whole head (request line through the blank line).
fn read_head(head: &[u8]) -> Head {
    // Every line, without its LF; the last is the blank line.
    let body = head.strip_suffix(b"\n").unwrap_or(head);
    let mut length: Option<u64> = None;
    let mut chunked = false;
    let mut transfer_encoding = false;
    let mut content_length = false;
    let mut unfollowable = false;
    for (n, line) in body.split(|&b| b == b'\n').enumerate() {
        let Some(line) = line.strip_suffix(b"\r") else {
            return Head::Refuse(Refusal::BareLineFeed);
        };
        if n == 0 {
            let mut parts = line.split(|&b| b == b' ');
            let method = parts.next().unwrap_or_default();
            let version = parts.nth(1).unwrap_or_default();
            if method == b"CONNECT" || !version.starts_with(b"HTTP/1.") {
                unfollowable = true;
            }
            continue;
        }
        // Only three names matter; most lines are passed over at their
        // first byte.
        if !matches!(line.first(), Some(b'c' | b'C' | b't' | b'T' | b'u' | b'U')) {
            continue;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name.eq_ignore_ascii_case(b"content-length") {
            content_length = true;
            let parsed = std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.parse::<u64>().ok());
            match (parsed, length) {
                (Some(v), None) => length = Some(v),
                (Some(v), Some(prev)) if v == prev => {}
                // Different or unreadable lengths: hyper refuses those.
                _ => unfollowable = true,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            transfer_encoding = true;
            chunked = value
                .rsplit(|&b| b == b',')
                .next()
                .is_some_and(|last| trim(last).eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"upgrade") {
            unfollowable = true;
        }
    }
    if content_length && transfer_encoding {
        return Head::Refuse(Refusal::ContentLengthAndTransferEncoding);
    }
    if unfollowable {
        return Head::Unfollowable;
    }
    match (transfer_encoding, chunked, length) {
        (true, true, _) => Head::Chunked,
        // A coding other than a final `chunked`: hyper refuses it.
        (true, false, _) => Head::Unfollowable,
        (false, _, Some(n)) => Head::Length(n),
        (false, _, None) => Head::Empty,
    }
}

fn trim(bytes: &[u8]) -> &[u8] {
    let start = bytes
        .iter()
        .position(|b| !matches!(b, b' ' | b'\t'))
        .unwrap_or(bytes.len());
    let end = bytes
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &bytes[start..end.max(start)]
}

pin_project! {
    /// A client stream whose HTTP/1 request framing is watched as it is
    /// read ([`Framing`]).
    pub struct Watched<S> {
        #[pin]
        inner: S,
        framing: Framing,
    }
}

impl<S> Watched<S> {
    pub fn new(inner: S) -> Watched<S> {
        Watched {
            inner,
            framing: Framing::new(),
        }
    }
}

impl<S: AsyncRead> AsyncRead for Watched<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.inner.poll_read(cx, buf);
        if polled.is_ready() {
            let refused = this.framing.refused();
            this.framing.inspect(&mut buf.filled_mut()[before..]);
            if this.framing.refused() > refused {
                // httparse waits for more before it calls a line bad when
                // the NULs end the buffer; a line break behind them makes
                // it decide now. Without room for it (a head ending just at
                // the end of a small read), hyper waits for the rest until
                // `header_read_timeout` and closes: refused all the same.
                if buf.remaining() >= SETTLE.len() {
                    buf.put_slice(SETTLE);
                }
                crate::proxy::metrics::request_refused("framing");
                tracing::debug!(
                    "request framing refused: Content-Length with Transfer-Encoding, or a bare LF"
                );
            }
        }
        polled
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
