//! Counting an upstream's interim (`1xx`) responses as their bytes
//! arrive.
//!
//! hyper's client skips any number of `1xx` heads before the final one
//! and reports each only through a callback carried by the request, which
//! costs every request an extensions map and two more allocations (about
//! 900 instructions, `docs/BENCHMARKS.md`). The connection's socket is
//! read through [`Watched`] instead: it reads the status line of each
//! head as its bytes come in, counts a `1xx` head, skips its fields to the
//! empty line that ends it, and stops at the first final head, reading
//! nothing more until the connection's next exchange. A usual response
//! costs a look at its first twelve bytes.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use super::head::MAX_INFORMATIONAL;

/// Counts the `1xx` responses to the exchange an upstream connection
/// carries. One per connection, made with it and shared with its
/// [`Watched`] socket, which counts on the connection's own task; that
/// task ends the connection once there were too many (`pool`'s `run`),
/// which fails an exchange still waiting for its final head.
#[derive(Debug, Default)]
pub(super) struct Informational {
    seen: AtomicUsize,
    /// Bumped as each exchange begins: the socket reads a head anew.
    exchange: AtomicUsize,
}

impl Informational {
    /// Counts the `1xx` responses of the exchange this connection carries
    /// next, from `before` (those a first attempt of the same request had:
    /// one count for both). Called before the request is handed to the
    /// connection, once the exchange before it has ended.
    pub(super) fn watch(&self, before: usize) {
        self.seen.store(before, Ordering::Relaxed);
        self.exchange.fetch_add(1, Ordering::Release);
    }

    /// The `1xx` responses counted for the exchange.
    pub(super) fn seen(&self) -> usize {
        self.seen.load(Ordering::Relaxed)
    }

    /// Whether more than [`MAX_INFORMATIONAL`] arrived. hyper may parse a
    /// whole flood and the final head in one read, so this is asked again
    /// once the head is in.
    pub(super) fn flooded(&self) -> bool {
        self.seen() > MAX_INFORMATIONAL
    }
}

/// An upstream connection's socket, its reads watched for `1xx` heads.
pub(super) struct Watched {
    stream: TcpStream,
    informational: Arc<Informational>,
    /// The exchange the scan belongs to.
    exchange: usize,
    scan: HeadScan,
}

impl Watched {
    pub(super) fn new(stream: TcpStream, informational: Arc<Informational>) -> Watched {
        let exchange = informational.exchange.load(Ordering::Acquire);
        Watched {
            stream,
            informational,
            exchange,
            scan: HeadScan::new(),
        }
    }

    fn observe(&mut self, read: &[u8]) {
        let exchange = self.informational.exchange.load(Ordering::Acquire);
        if exchange != self.exchange {
            self.exchange = exchange;
            self.scan = HeadScan::new();
        }
        if self.scan.done() {
            return;
        }
        let interim = self.scan.feed(read);
        if interim > 0 {
            self.informational
                .seen
                .fetch_add(interim, Ordering::Relaxed);
        }
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            this.observe(&buf.filled()[before..]);
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Where a response's heads stand, read a byte at a time as they arrive
/// (a head may come in pieces, several in one read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HeadScan {
    /// In a head's status line, `HTTP/1.x NNN`: `at` of its first twelve
    /// bytes read, `status` its digits so far. Empty lines before it are
    /// skipped, as hyper's parser does.
    Status { at: u8, status: u16 },
    /// Past the status line of a `1xx` head, looking for the empty line
    /// that ends it: `fresh` at the start of a line, `cr` once that line
    /// began with `\r`.
    Fields { fresh: bool, cr: bool },
    /// A final head began (or bytes that are no head, which hyper
    /// refuses): nothing more to count in this exchange.
    Done,
}

/// `HTTP/1.` then a digit: the bytes before the status code.
const VERSION: &[u8; 8] = b"HTTP/1.?";

impl HeadScan {
    fn new() -> HeadScan {
        HeadScan::Status { at: 0, status: 0 }
    }

    fn done(&self) -> bool {
        *self == HeadScan::Done
    }

    /// Reads `bytes` on from where the scan stands; the `1xx` heads whose
    /// status line completed in them. `101 Switching Protocols` is a final
    /// head, as it is to hyper.
    fn feed(&mut self, bytes: &[u8]) -> usize {
        // The usual response: a final head whose status line came whole
        // in the first read, settled without the walk below.
        if *self == HeadScan::new() {
            if let [b'H', b'T', b'T', b'P', b'/', b'1', b'.', minor, b' ', first, ..] = bytes {
                if minor.is_ascii_digit() && *first != b'1' {
                    *self = HeadScan::Done;
                    return 0;
                }
            }
        }
        let mut interim = 0;
        for &b in bytes {
            *self = match *self {
                HeadScan::Done => return interim,
                HeadScan::Status { at: 0, .. } if b == b'\r' || b == b'\n' => *self,
                HeadScan::Status { at, status } if at < 8 => {
                    let expected = VERSION[at as usize];
                    if b == expected || (expected == b'?' && b.is_ascii_digit()) {
                        HeadScan::Status { at: at + 1, status }
                    } else {
                        HeadScan::Done
                    }
                }
                HeadScan::Status { at: 8, status } if b == b' ' => {
                    HeadScan::Status { at: 9, status }
                }
                HeadScan::Status { at, status } if at > 8 && b.is_ascii_digit() => {
                    let status = status * 10 + u16::from(b - b'0');
                    match at {
                        11 if (100..200).contains(&status) && status != 101 => {
                            interim += 1;
                            HeadScan::Fields {
                                fresh: false,
                                cr: false,
                            }
                        }
                        11 => HeadScan::Done,
                        _ => HeadScan::Status { at: at + 1, status },
                    }
                }
                HeadScan::Status { .. } => HeadScan::Done,
                HeadScan::Fields { fresh: true, .. } if b == b'\n' => HeadScan::new(),
                HeadScan::Fields {
                    fresh: true,
                    cr: false,
                } if b == b'\r' => HeadScan::Fields {
                    fresh: true,
                    cr: true,
                },
                HeadScan::Fields { .. } if b == b'\n' => HeadScan::Fields {
                    fresh: true,
                    cr: false,
                },
                HeadScan::Fields { .. } => HeadScan::Fields {
                    fresh: false,
                    cr: false,
                },
            };
        }
        interim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `1xx` heads counted in `bytes`, fed whole, and fed cut at every
    /// place into two reads (each cut must count the same); and whether
    /// the scan ended at a final head.
    fn scan(bytes: &[u8]) -> (usize, bool) {
        let mut whole = HeadScan::new();
        let counted = whole.feed(bytes);
        for cut in 0..=bytes.len() {
            let mut split = HeadScan::new();
            let (a, b) = bytes.split_at(cut);
            let both = split.feed(a) + split.feed(b);
            assert_eq!((both, split), (counted, whole), "cut at {cut}");
        }
        (counted, whole.done())
    }

    #[test]
    fn interim_heads_are_counted_until_the_final_one() {
        let cases: &[(&[u8], (usize, bool))] = &[
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", (0, true)),
            (
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
                (1, true),
            ),
            (
                b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n\
                  HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n",
                (2, true),
            ),
            // Without a reason phrase, and with bare `\n` line ends.
            (
                b"HTTP/1.1 100\r\n\r\nHTTP/1.0 100\n\nHTTP/1.1 200\n\n",
                (2, true),
            ),
            // Empty lines before a status line are skipped, as hyper does.
            (
                b"\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
                (1, true),
            ),
            // A switch of protocols is final: what follows is the tunnel's.
            (
                b"HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 100 x\r\n\r\n",
                (0, true),
            ),
            // 199 is interim; 200 and 099 are not.
            (b"HTTP/1.1 199 x\r\n\r\nHTTP/1.1 099 x\r\n\r\n", (1, true)),
            // A final head's body is never read as a head.
            (
                b"HTTP/1.1 200 OK\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n",
                (0, true),
            ),
            // Bytes that are no head end the scan (hyper refuses them).
            (b"HTTP/2 100\r\n\r\n", (0, true)),
            (b"HTTX/1.1 100\r\n\r\n", (0, true)),
            (b"HTTP/1.1 1a0\r\n\r\n", (0, true)),
            // A head that has not ended: counted once its status is read.
            (b"HTTP/1.1 100 Continue\r\nX-A: b\r\n", (1, false)),
            (b"HTTP/1.1 10", (0, false)),
        ];
        for (bytes, expected) in cases {
            assert_eq!(scan(bytes), *expected, "{}", String::from_utf8_lossy(bytes));
        }
    }

    #[test]
    fn a_flood_is_counted_head_by_head() {
        let head = b"HTTP/1.1 100 Continue\r\nX-Pad: aaaa\r\n\r\n";
        let flood: Vec<u8> = head.repeat(MAX_INFORMATIONAL + 5);
        assert_eq!(scan(&flood), (MAX_INFORMATIONAL + 5, false));
    }

    /// A connection's next exchange scans its heads anew, and counts from
    /// what `watch` was given.
    #[tokio::test]
    async fn each_exchange_is_scanned_anew() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, server) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (mut server, _) = server.unwrap();
        let informational = Arc::new(Informational::default());
        let mut watched = Watched::new(client.unwrap(), Arc::clone(&informational));

        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut read = async |server: &mut TcpStream, bytes: &[u8]| {
            server.write_all(bytes).await.unwrap();
            let mut got = vec![0; bytes.len()];
            watched.read_exact(&mut got).await.unwrap();
        };
        informational.watch(0);
        read(
            &mut server,
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n\r\n",
        )
        .await;
        assert_eq!(informational.seen(), 1);
        // The same exchange's body: not a head.
        read(&mut server, b"HTTP/1.1 100 Continue\r\n\r\n").await;
        assert_eq!(informational.seen(), 1);
        // The next exchange, a resend that had two already.
        informational.watch(2);
        read(&mut server, b"HTTP/1.1 103 Early Hints\r\n\r\n").await;
        assert_eq!(informational.seen(), 3);
        assert!(!informational.flooded());
    }
}
