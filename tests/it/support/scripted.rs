//! `Scripted`: an upstream that answers every request with bytes a test
//! wrote, however broken, over raw TCP. It counts the connections it
//! accepted and notes which connection each request came on, so a test can
//! tell whether sluice reused a connection after a broken answer.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// What the upstream does with each request.
#[derive(Debug, Clone)]
pub enum Answer {
    /// Writes these bytes and waits for the next request on the connection.
    KeepOpen(Vec<u8>),
    /// Writes these bytes and closes the connection.
    Close(Vec<u8>),
    /// Writes these bytes for a connection's first request; reads the head
    /// of any later one and closes the connection without a byte, as an
    /// app closing an idle connection just as a request arrives on it.
    FirstOnly(Vec<u8>),
    /// Writes the first bytes for a connection's first request; to any
    /// later one, the second bytes, then closes the connection.
    FirstThenClose(Vec<u8>, Vec<u8>),
    /// Writes these bytes, then closes the connection if no other request
    /// starts on it within the duration (an app's keep-alive timeout).
    IdleClose(Vec<u8>, std::time::Duration),
    /// A `200` with `Content-Length: len`, then `len` bytes written as fast
    /// as the peer takes them, each write counted in [`Scripted::written`].
    Large(u64),
}

#[derive(Default)]
struct State {
    connections: AtomicUsize,
    /// The connection (1-based, in accept order) of each request head read.
    requests: Mutex<Vec<usize>>,
    written: AtomicU64,
    /// Connections whose write failed: the peer (sluice) closed them.
    broken: AtomicUsize,
    answer: Mutex<Option<Answer>>,
}

impl State {
    fn requests(&self) -> MutexGuard<'_, Vec<usize>> {
        self.requests.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn answer(&self) -> Answer {
        let answer = self.answer.lock().unwrap_or_else(|e| e.into_inner());
        answer.clone().expect("an answer is set before any request")
    }
}

/// A raw HTTP/1.1 "server" on `127.0.0.1:0`; stopped on drop.
pub struct Scripted {
    addr: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl Scripted {
    pub async fn start(answer: Answer) -> Scripted {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the scripted upstream on 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let state = Arc::new(State::default());
        *state.answer.lock().expect("fresh lock") = Some(answer);
        let accept = tokio::spawn(accept_loop(listener, state.clone()));
        Scripted {
            addr,
            state,
            accept,
        }
    }

    /// `http://127.0.0.1:PORT`, for `upstream.url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A sidecar configuration in front of this upstream: one route over
    /// every path, with a limit no test reaches.
    pub fn sidecar_config(&self) -> String {
        format!(
            "version: 1
server:
  listen: 127.0.0.1:0
  admin: 127.0.0.1:0
upstream:
  url: {}
  timeout: 5s
policies:
  lots: {{ algorithm: sliding-log, limit: 100000, window: 1h }}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, subject: client_ip, policy: lots }}
",
            self.url()
        )
    }

    /// The answer to every request from now on.
    pub fn set_answer(&self, answer: Answer) {
        *self.state.answer.lock().unwrap_or_else(|e| e.into_inner()) = Some(answer);
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// For each request head read so far, the connection it came on.
    pub fn requests(&self) -> Vec<usize> {
        self.state.requests().clone()
    }

    /// Body bytes of [`Answer::Large`] written so far, on all connections.
    pub fn written(&self) -> u64 {
        self.state.written.load(Ordering::SeqCst)
    }

    /// Connections on which a write of [`Answer::Large`] failed because
    /// sluice closed them.
    pub fn broken(&self) -> usize {
        self.state.broken.load(Ordering::SeqCst)
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let id = state.connections.fetch_add(1, Ordering::SeqCst) + 1;
        tokio::spawn(serve(stream, id, state.clone()));
    }
}

async fn serve(mut stream: TcpStream, id: usize, state: Arc<State>) {
    let mut buf = Vec::new();
    let mut idle_close = None;
    for nth in 1.. {
        // Requests are heads only (GETs): read up to the blank line.
        let head = read_head(&mut stream, &mut buf);
        let end = match idle_close {
            Some(after) => match tokio::time::timeout(after, head).await {
                Ok(end) => end,
                Err(_) => return,
            },
            None => head.await,
        };
        let Some(end) = end else {
            return;
        };
        buf.drain(..end);
        state.requests().push(id);
        match state.answer() {
            Answer::FirstOnly(bytes) if nth == 1 => {
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Answer::FirstOnly(_) => return,
            Answer::FirstThenClose(bytes, _) if nth == 1 => {
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Answer::FirstThenClose(_, bytes) => {
                let _ = stream.write_all(&bytes).await;
                let _ = stream.shutdown().await;
                return;
            }
            Answer::IdleClose(bytes, after) => {
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
                idle_close = Some(after);
            }
            Answer::KeepOpen(bytes) => {
                if stream.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Answer::Close(bytes) => {
                let _ = stream.write_all(&bytes).await;
                let _ = stream.shutdown().await;
                return;
            }
            Answer::Large(len) => {
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {len}\r\n\r\n");
                if stream.write_all(head.as_bytes()).await.is_err() {
                    return;
                }
                let chunk = vec![b'x'; 64 * 1024];
                let mut left = len;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        state.broken.fetch_add(1, Ordering::SeqCst);
                        return;
                    }
                    state.written.fetch_add(n as u64, Ordering::SeqCst);
                    left -= n as u64;
                }
            }
        }
    }
}

/// Reads until `buf` holds a whole request head; the index just past it,
/// or `None` when the peer closed first.
async fn read_head(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<usize> {
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Some(at + 4);
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}
