//! sluice's own connection to one Redis node (standalone, or the primary
//! the Sentinels name): RESP2 over TCP or TLS, multiplexed, with no
//! command or reply types of its own.
//!
//! A decision is one `FCALL` whose reply is eight integers. Through
//! redis-rs's multiplexed connection it paid for a command packed twice
//! (into the `Cmd`, then into the connection's buffer), a channel to the
//! connection's task and a `Value` tree for the reply. Here a request
//! packs its command once, straight into the connection's output buffer,
//! and gets back the reply ([`Frame`]): a decision's as its integers, read
//! as the task framed it, any other as its bytes, which the caller reads in
//! place (`reply::decode_answer`). Every other command (`FUNCTION LOAD`, the
//! lease of a library, `PING`) goes through the same connection as a
//! redis-rs [`ConnectionLike`], its reply parsed by redis-rs.
//!
//! One task per connection owns the socket. A request appends its command
//! to the shared output buffer and queues a one-shot for its reply, in the
//! same critical section, so replies, which Redis sends in order, match
//! the queue; the first request to find the task idle wakes it. Requests
//! that arrive while the task is busy coalesce into its next write, as
//! they did in redis-rs's connection. The task writes, reads, cuts whole
//! replies off the input ([`frame_scan`]) and hands each to the oldest
//! waiting request. A read or write error, the peer closing, or a reply
//! that breaks the framing ends the connection: every waiting request gets
//! an I/O error (sent without a confirmed reply: the caller classes it as
//! such), and so does any request after it, until the lane reconnects.
//!
//! On a Redis Cluster each primary gets one of these connections
//! ([`super::shards`]), which routes each command to its slot's node and
//! follows the redirects.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use redis::aio::ConnectionLike;
use redis::{Cmd, RedisError, RedisFuture, RedisResult, Value};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::oneshot;

use crate::sync;

use super::packed::Packed;

mod frame;
mod open;
#[cfg(test)]
mod tests;

use frame::MAX_FRAME;
pub use frame::{frame_len, frame_scan, parse_int, short_int, Ints};
pub use open::{handshake, open};

/// One reply: an array of integers alone (a decision's reply) as its
/// integers, read as the reply was framed ([`frame_scan`]), so never read
/// again; any other as its bytes (a short one inline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame(Repr);

/// A [`Frame`], as it is held.
pub enum Held<'a> {
    /// An array of integers alone: the integers.
    Ints(&'a [i64]),
    /// Any other reply: its bytes.
    Bytes(&'a [u8]),
}

// Moved inline only below 128 bytes (`frame::Ints`).
const _: () = assert!(std::mem::size_of::<Frame>() < 128);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    Ints(Ints),
    Bytes(SmallVec<[u8; 64]>),
}

impl Frame {
    /// The reply at the start of `bytes`, `len` bytes long, `flat` (an
    /// array of integers alone, now in `ints`) or not.
    fn cut(bytes: &[u8], len: usize, flat: bool, ints: &mut Ints) -> Frame {
        Frame(if flat {
            Repr::Ints(std::mem::take(ints))
        } else {
            Repr::Bytes(SmallVec::from_slice(&bytes[..len]))
        })
    }

    /// The reply whose bytes are `bytes`, whole, as the connection reads
    /// one.
    #[cfg(test)]
    pub fn from_slice(bytes: &[u8]) -> Frame {
        let mut ints = Ints::new();
        match frame_scan(bytes, &mut ints) {
            Ok(Some((len, flat))) if len == bytes.len() => Frame::cut(bytes, len, flat, &mut ints),
            _ => Frame(Repr::Bytes(SmallVec::from_slice(bytes))),
        }
    }

    /// How it is held: its integers, or its bytes.
    pub fn held(&self) -> Held<'_> {
        match &self.0 {
            Repr::Ints(ints) => Held::Ints(ints),
            Repr::Bytes(bytes) => Held::Bytes(bytes),
        }
    }

    /// Whether it is an error reply.
    pub fn is_error(&self) -> bool {
        matches!(self.held(), Held::Bytes([b'-', ..]))
    }

    /// The reply as redis-rs's `Value`, an error reply as its
    /// `RedisError`.
    pub fn value(&self) -> RedisResult<Value> {
        match &self.0 {
            Repr::Ints(ints) => Ok(Value::Array(ints.iter().map(|&n| Value::Int(n)).collect())),
            Repr::Bytes(bytes) => into_value(bytes),
        }
    }
}

const READ_CHUNK: usize = 16 << 10;

/// A connection; clones share it. The connection's task ends when the
/// last clone is dropped.
#[derive(Clone)]
pub struct Wire {
    handle: Arc<Handle>,
    /// The database `SELECT`ed, for [`ConnectionLike::get_db`].
    db: i64,
}

struct Handle {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Writes the task has made, for the tests of how commands coalesce.
    #[cfg(test)]
    writes: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct State {
    /// Packed commands not yet taken by the task.
    out: Vec<u8>,
    /// One per command sent or to be sent, oldest first.
    waiting: VecDeque<oneshot::Sender<Result<Frame, io::ErrorKind>>>,
    /// The task's waker while it has nothing to write.
    task: Option<Waker>,
    /// Why the connection ended; nothing more is sent on it.
    closed: Option<io::ErrorKind>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the state whole (appends, pops,
        // swaps of whole values).
        sync::lock(&self.state)
    }
}

/// The socket: plain or TLS.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl Wire {
    /// Starts the connection's task on `stream`, already connected (and
    /// through its TLS handshake); nothing has been sent on it.
    pub fn start(stream: Stream) -> Wire {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            #[cfg(test)]
            writes: Default::default(),
        });
        tokio::spawn(Driver::new(shared.clone(), stream));
        Wire {
            handle: Arc::new(Handle { shared }),
            db: 0,
        }
    }

    /// Sends `cmd` and waits for its reply, as bytes. An error reply is a
    /// frame like any other (it starts with `-`): see [`into_value`].
    pub fn call<'a>(&'a self, cmd: &'a Cmd) -> impl Future<Output = RedisResult<Frame>> + 'a {
        self.one(move |out| cmd.write_packed_command(out))
    }

    /// [`Wire::call`] of a command packed already: one copy of its bytes
    /// into the connection's buffer.
    pub fn call_packed<'a>(
        &'a self,
        cmd: &'a Packed,
    ) -> impl Future<Output = RedisResult<Frame>> + 'a {
        self.one(move |out| out.extend_from_slice(cmd.bytes()))
    }

    /// Sends the one command `pack` writes and waits for its reply.
    pub async fn one(&self, pack: impl FnOnce(&mut Vec<u8>)) -> RedisResult<Frame> {
        let mut replies = self.send(pack, 1)?;
        match replies.pop() {
            Some(reply) => received(reply.await),
            None => Err(lost(io::ErrorKind::Other)),
        }
    }

    /// `ASKING`, then the one command `pack` writes, in one write: the
    /// reply of the command (a Cluster node serves a slot being imported
    /// only to a command right after `ASKING`).
    pub async fn asking(&self, pack: impl FnOnce(&mut Vec<u8>)) -> RedisResult<Frame> {
        let replies = self.send(
            |out| {
                out.extend_from_slice(b"*1\r\n$6\r\nASKING\r\n");
                pack(out);
            },
            2,
        )?;
        let mut last = Err(lost(io::ErrorKind::Other));
        for reply in replies {
            last = received(reply.await);
        }
        last
    }

    /// Whether the connection has ended: every command on it fails.
    pub fn is_closed(&self) -> bool {
        self.handle.shared.lock().closed.is_some()
    }

    /// Queues what `pack` writes, which must be `replies` commands, and
    /// returns the receivers of their replies.
    fn send(
        &self,
        pack: impl FnOnce(&mut Vec<u8>),
        replies: usize,
    ) -> RedisResult<SmallVec<[Receiver; 1]>> {
        let mut receivers = SmallVec::new();
        let wake = {
            let mut state = self.handle.shared.lock();
            if let Some(kind) = state.closed {
                return Err(lost(kind));
            }
            pack(&mut state.out);
            for _ in 0..replies {
                let (tx, rx) = oneshot::channel();
                state.waiting.push_back(tx);
                receivers.push(rx);
            }
            state.task.take()
        };
        if let Some(task) = wake {
            task.wake();
        }
        Ok(receivers)
    }
}

type Receiver = oneshot::Receiver<Result<Frame, io::ErrorKind>>;

/// What a command's receiver got: its reply, or why there is none.
fn received(
    answer: Result<Result<Frame, io::ErrorKind>, oneshot::error::RecvError>,
) -> RedisResult<Frame> {
    match answer {
        Ok(Ok(frame)) => Ok(frame),
        Ok(Err(kind)) => Err(lost(kind)),
        // The task ended without answering (the runtime shutting down).
        Err(_) => Err(lost(io::ErrorKind::BrokenPipe)),
    }
}

/// A command sent without a confirmed reply, or not sent because the
/// connection had ended: an I/O error, which carries no Redis error code.
fn lost(kind: io::ErrorKind) -> RedisError {
    RedisError::from(io::Error::new(kind, "redis connection lost"))
}

/// A reply as redis-rs's `Value`, an error reply as its `RedisError`.
pub fn into_value(frame: &[u8]) -> RedisResult<Value> {
    redis::parse_redis_value(frame)?.extract_error()
}

impl Drop for Handle {
    fn drop(&mut self) {
        let task = {
            let mut state = self.shared.lock();
            state.closed.get_or_insert(io::ErrorKind::NotConnected);
            state.task.take()
        };
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl ConnectionLike for Wire {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.call(cmd).await?.value() })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let packed = pipeline.get_packed_pipeline();
            let receivers = self.send(|out| out.extend_from_slice(&packed), offset + count)?;
            let mut values = Vec::with_capacity(count);
            let mut first_error = None;
            for (i, reply) in receivers.into_iter().enumerate() {
                let value = received(reply.await)?.value();
                match value {
                    Ok(value) if i >= offset => values.push(value),
                    Ok(_) => {}
                    Err(e) => {
                        first_error.get_or_insert(e);
                    }
                }
            }
            match first_error {
                Some(e) => Err(e),
                None => Ok(values),
            }
        })
    }

    fn get_db(&self) -> i64 {
        self.db
    }
}

/// The connection's task: owns the socket, writes what requests queued,
/// reads and hands out replies.
struct Driver {
    shared: Arc<Shared>,
    stream: Stream,
    /// Being written, from `written` on.
    writing: Vec<u8>,
    written: usize,
    flush: bool,
    /// The task put off taking what requests queued once, to take more
    /// with it (`Taken::Later`); the next time it takes it all.
    put_off: bool,
    read: Vec<u8>,
    /// `read[start..end]` is received and not yet handed out.
    start: usize,
    end: usize,
}

impl Driver {
    fn new(shared: Arc<Shared>, stream: Stream) -> Driver {
        Driver {
            shared,
            stream,
            writing: Vec::new(),
            written: 0,
            flush: false,
            put_off: false,
            read: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
        }
    }

    /// Takes what requests queued, and leaves the task's waker for the
    /// next one, in one critical section: a request that comes after finds
    /// the waker. `Err` once the connection was closed.
    ///
    /// Output found with nothing being written is put off once
    /// (`Taken::Later`), unless `put_off` says it was already: the request
    /// that queued it woke this task, which the runtime then runs before
    /// any other task ready on that worker, so each request's command went
    /// out in a write of its own while the requests behind it, ready to
    /// queue theirs, waited. The task yields instead, behind them, and
    /// takes theirs with it: one write, and one Redis read, for all of
    /// them. What that costs a command is one turn of the worker's queue.
    fn take_output(&mut self, waker: &Waker) -> Result<Taken, io::ErrorKind> {
        let mut state = self.shared.lock();
        if let Some(kind) = state.closed {
            return Err(kind);
        }
        let mut taken = Taken::Now;
        if self.written == self.writing.len() {
            if !self.put_off && !state.out.is_empty() {
                taken = Taken::Later;
            } else {
                self.writing.clear();
                self.written = 0;
                std::mem::swap(&mut self.writing, &mut state.out);
            }
        }
        if !state.task.as_ref().is_some_and(|w| w.will_wake(waker)) {
            state.task = Some(waker.clone());
        }
        Ok(taken)
    }

    /// Writes as much as the socket takes; whether anything was written.
    fn poll_write(&mut self, cx: &mut Context<'_>) -> Result<bool, io::Error> {
        let mut progressed = false;
        while self.written < self.writing.len() {
            match Pin::new(&mut self.stream).poll_write(cx, &self.writing[self.written..]) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => {
                    #[cfg(test)]
                    self.shared
                        .writes
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.written += n;
                    self.flush = true;
                    progressed = true;
                }
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => return Ok(progressed),
            }
        }
        if self.flush {
            match Pin::new(&mut self.stream).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.flush = false,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => {}
            }
        }
        Ok(progressed)
    }

    /// Reads what arrived and hands out every whole reply; whether
    /// anything was read.
    fn poll_read(&mut self, cx: &mut Context<'_>) -> Result<bool, io::Error> {
        if self.end == self.read.len() {
            if self.start > 0 {
                self.read.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            } else if self.read.len() < MAX_FRAME + READ_CHUNK {
                self.read.resize(self.read.len() * 2, 0);
            } else {
                return Err(io::ErrorKind::InvalidData.into());
            }
        }
        let mut buf = ReadBuf::new(&mut self.read[self.end..]);
        match Pin::new(&mut self.stream).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) => {
                let n = buf.filled().len();
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                self.end += n;
                self.hand_out()?;
                Ok(true)
            }
            Poll::Ready(Err(e)) => Err(e),
            Poll::Pending => Ok(false),
        }
    }

    fn hand_out(&mut self) -> Result<(), io::Error> {
        let mut frames: SmallVec<[Frame; 4]> = SmallVec::new();
        let mut ints = Ints::new();
        while let Some((len, flat)) = frame_scan(&self.read[self.start..self.end], &mut ints)? {
            frames.push(Frame::cut(&self.read[self.start..], len, flat, &mut ints));
            self.start += len;
        }
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
        if frames.is_empty() {
            return Ok(());
        }
        let mut senders: SmallVec<[_; 4]> = SmallVec::new();
        {
            let mut state = self.shared.lock();
            for _ in 0..frames.len() {
                match state.waiting.pop_front() {
                    Some(tx) => senders.push(tx),
                    // A reply nobody asked for: the stream is out of step.
                    None => return Err(io::ErrorKind::InvalidData.into()),
                }
            }
        }
        for (tx, frame) in senders.into_iter().zip(frames) {
            // A request that gave up (its deadline, a client gone) dropped
            // its receiver: the reply is dropped with it.
            let _ = tx.send(Ok(frame));
        }
        Ok(())
    }

    /// Ends the connection: everything waiting, and everything after,
    /// gets `kind`.
    fn close(&mut self, kind: io::ErrorKind) {
        let waiting = {
            let mut state = self.shared.lock();
            state.closed.get_or_insert(kind);
            state.out.clear();
            state.task = None;
            std::mem::take(&mut state.waiting)
        };
        for tx in waiting {
            let _ = tx.send(Err(kind));
        }
    }
}

/// Whether [`Driver::take_output`] took what requests queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Taken {
    /// Taken, or nothing was there to take.
    Now,
    /// Put off: the task yields and takes it, and what comes meanwhile,
    /// when next polled.
    Later,
}

impl Future for Driver {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            let later = match this.take_output(cx.waker()) {
                Ok(taken) => taken == Taken::Later,
                Err(kind) => {
                    this.close(kind);
                    return Poll::Ready(());
                }
            };
            this.put_off = later;
            if later {
                // Polled again once the tasks ready now have run.
                cx.waker().wake_by_ref();
            }
            let wrote = match this.poll_write(cx) {
                Ok(wrote) => wrote,
                Err(e) => {
                    tracing::debug!(error = %e, "redis: write failed, connection closed");
                    this.close(e.kind());
                    return Poll::Ready(());
                }
            };
            let read = match this.poll_read(cx) {
                Ok(read) => read,
                Err(e) => {
                    tracing::debug!(error = %e, "redis: read failed, connection closed");
                    this.close(e.kind());
                    return Poll::Ready(());
                }
            };
            if later || (!wrote && !read) {
                return Poll::Pending;
            }
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
