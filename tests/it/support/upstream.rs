//! `Upstream`: the application behind sluice, in process. It records every
//! request it receives so a test can assert what sluice forwarded, and can
//! be told to answer slowly, with a large body, with the request body echoed,
//! or with extra response headers. A request that asks for a WebSocket
//! upgrade is answered 101 and the upgraded stream is echoed back. It also
//! counts the requests it is handling at once, and the most it ever was.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// One request as the upstream received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: Method,
    /// Path and query, as on the request line.
    pub path: String,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Recorded {
    /// The header's value as text; `None` when absent or not text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// Every value of the header, in order.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.headers
            .get_all(name)
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
            .collect()
    }
}

#[derive(Debug, Clone, Default)]
struct Behaviour {
    delay: Duration,
    body_len: Option<usize>,
    echo_body: bool,
    extra_headers: Vec<(HeaderName, HeaderValue)>,
    any_upgrade: bool,
    /// Works out the whole delay even when sluice goes away, as most app
    /// servers do (they notice a closed socket only when they write).
    oblivious: bool,
}

#[derive(Default)]
struct State {
    /// Request heads seen, counted before the body is read so that a
    /// request sluice started to forward counts even if it never finished.
    heads: AtomicUsize,
    /// Requests being handled now (head received, response not yet
    /// returned), and the most there ever were at once.
    in_flight: AtomicUsize,
    peak: AtomicUsize,
    recorded: Mutex<Vec<Recorded>>,
    behaviour: Mutex<Behaviour>,
}

impl State {
    fn recorded(&self) -> MutexGuard<'_, Vec<Recorded>> {
        // A panicking handler cannot leave the list half-written (push is
        // the only mutation), so a poisoned lock still holds good data.
        self.recorded.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn behaviour(&self) -> MutexGuard<'_, Behaviour> {
        self.behaviour.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An HTTP/1.1 server on `127.0.0.1:0`; stopped on drop.
pub struct Upstream {
    addr: SocketAddr,
    state: Arc<State>,
    accept: JoinHandle<()>,
}

impl Upstream {
    /// Binds and starts serving on the current tokio runtime.
    pub async fn start() -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream on 127.0.0.1:0");
        let addr = listener.local_addr().expect("upstream local address");
        let state = Arc::new(State::default());
        let accept = tokio::spawn(accept_loop(listener, state.clone()));
        Upstream {
            addr,
            state,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`, for `upstream.url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Request heads received so far.
    pub fn count(&self) -> usize {
        self.state.heads.load(Ordering::SeqCst)
    }

    /// The most requests it was handling at any one time.
    pub fn peak_in_flight(&self) -> usize {
        self.state.peak.load(Ordering::SeqCst)
    }

    /// Requests it is handling now.
    pub fn in_flight(&self) -> usize {
        self.state.in_flight.load(Ordering::SeqCst)
    }

    /// Every request received in full, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.recorded().clone()
    }

    /// The latest request received in full.
    pub fn last(&self) -> Option<Recorded> {
        self.state.recorded().last().cloned()
    }

    /// Waits this long before answering each request.
    pub fn set_delay(&self, delay: Duration) {
        self.state.behaviour().delay = delay;
    }

    /// Answers with a body of `len` bytes of [`super::pattern`].
    pub fn respond_with_body_of(&self, len: usize) {
        self.state.behaviour().body_len = Some(len);
    }

    /// Answers with the request body.
    pub fn echo_body(&self) {
        self.state.behaviour().echo_body = true;
    }

    /// Answers 101 to every upgrade asked for (h2c, anything), switching to
    /// the first protocol offered, as an app that trusts its proxy would.
    pub fn answer_any_upgrade(&self) {
        self.state.behaviour().any_upgrade = true;
    }

    /// Makes every request take its whole delay, counted in flight, even
    /// when sluice drops the exchange: an app that does not notice a
    /// closed socket (Werkzeug, gunicorn's sync workers, Puma).
    pub fn work_through_hang_ups(&self) {
        self.state.behaviour().oblivious = true;
    }

    /// Adds a header to every response (may be given several times).
    pub fn add_response_header(&self, name: &str, value: &str) {
        let name = HeaderName::from_bytes(name.as_bytes()).expect("a valid header name");
        let value = HeaderValue::from_str(value).expect("a valid header value");
        self.state.behaviour().extra_headers.push((name, value));
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(state.clone(), req));
            // Errors here are the client (sluice) going away mid-request,
            // which some tests cause on purpose (504).
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .with_upgrades()
                .await;
        });
    }
}

/// The protocol to switch to: `websocket` when asked for, or with
/// `any_upgrade` the first protocol offered.
fn wanted_upgrade(req: &Request<Incoming>, any_upgrade: bool) -> Option<String> {
    let tokens = |name: http::header::HeaderName| -> Vec<String> {
        req.headers()
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
            .collect()
    };
    let connection = tokens(http::header::CONNECTION);
    if !connection.iter().any(|t| t.eq_ignore_ascii_case("upgrade")) {
        return None;
    }
    let offered = tokens(http::header::UPGRADE);
    if any_upgrade {
        return offered.into_iter().next();
    }
    offered
        .into_iter()
        .find(|t| t.eq_ignore_ascii_case("websocket"))
}

async fn handle(
    state: Arc<State>,
    mut req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    state.heads.fetch_add(1, Ordering::SeqCst);
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.peak.fetch_max(now, Ordering::SeqCst);
    // Counted down however the handler ends, a cancelled one included
    // (unless the app works through hang-ups: then once its delay is over).
    let in_flight = InFlight(state.clone());
    let behaviour = state.behaviour().clone();
    let method = req.method().clone();
    let path = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |pq| pq.as_str().to_owned());
    let version = req.version();
    let headers = req.headers().clone();

    if let Some(protocol) = wanted_upgrade(&req, behaviour.any_upgrade) {
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = on_upgrade.await {
                echo(TokioIo::new(upgraded)).await;
            }
        });
        state.recorded().push(Recorded {
            method,
            path,
            version,
            headers,
            body: Bytes::new(),
        });
        let response = Response::builder()
            .status(StatusCode::SWITCHING_PROTOCOLS)
            .header(http::header::CONNECTION, "upgrade")
            .header(http::header::UPGRADE, protocol)
            .body(Full::new(Bytes::new()))
            .expect("a valid 101 response");
        return Ok(response);
    }

    let body = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    state.recorded().push(Recorded {
        method,
        path,
        version,
        headers: headers.clone(),
        body: body.clone(),
    });

    if behaviour.oblivious {
        let delay = behaviour.delay;
        let (done, finished) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            drop(in_flight);
            let _ = done.send(());
        });
        let _ = finished.await;
    } else {
        if !behaviour.delay.is_zero() {
            tokio::time::sleep(behaviour.delay).await;
        }
        drop(in_flight);
    }
    let out = if behaviour.echo_body {
        body
    } else if let Some(len) = behaviour.body_len {
        Bytes::from(super::pattern(len))
    } else {
        Bytes::from_static(b"upstream ok")
    };
    let mut response = Response::new(Full::new(out));
    for (name, value) in behaviour.extra_headers {
        response.headers_mut().append(name, value);
    }
    answer_as_asked(&headers, &mut response);
    Ok(response)
}

/// A request may say how it wants to be answered, as an app's outcome
/// would: `x-answer-status: 401` sets the status, and each
/// `x-answer-header: NAME: VALUE` adds a response header.
fn answer_as_asked<B>(request: &http::HeaderMap, response: &mut Response<B>) {
    let asked = |name| {
        request
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    if let Some(status) = asked("x-answer-status").first() {
        if let Ok(status) = StatusCode::from_bytes(status.trim().as_bytes()) {
            *response.status_mut() = status;
        }
    }
    for line in asked("x-answer-header") {
        if let Some((name, value)) = line.split_once(':') {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.trim().as_bytes()),
                HeaderValue::from_str(value.trim()),
            ) {
                response.headers_mut().append(name, value);
            }
        }
    }
}

struct InFlight(Arc<State>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

async fn echo<S>(mut io: S)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if io.write_all(&buf[..n]).await.is_err() || io.flush().await.is_err() {
                    return;
                }
            }
        }
    }
}
