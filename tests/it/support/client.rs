//! Clients for talking to sluice: one-shot requests over hyper-util's pooled
//! client (HTTP/1.1 or HTTP/2 prior knowledge), bursts at a bounded
//! concurrency, requests released together over pre-opened connections,
//! and raw bytes over a `TcpStream` for requests hyper would never send.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Barrier, Semaphore};
use tokio::task::JoinSet;

/// No single exchange in these tests should take longer.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

pub type Reply = (StatusCode, HeaderMap, Bytes);

pub fn http1_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

pub fn http2_client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// `GET http://addr{path}` with `headers`; the whole body is read.
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Reply {
    request(addr, Method::GET, path, headers, Bytes::new()).await
}

/// One request over a fresh HTTP/1.1 client.
pub async fn request(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Reply {
    send(&http1_client(), build(addr, method, path, headers, body)).await
}

/// One request over a fresh HTTP/2 (prior knowledge) client.
pub async fn request_h2(addr: SocketAddr, method: Method, path: &str, body: Bytes) -> Reply {
    let mut req = build(addr, method, path, &[], body);
    *req.version_mut() = Version::HTTP_2;
    send(&http2_client(), req).await
}

pub fn build(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Request<Full<Bytes>> {
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(body)).expect("a valid request")
}

/// Sends `req` and reads the whole response, within [`REQUEST_DEADLINE`].
pub async fn send(client: &Client<HttpConnector, Full<Bytes>>, req: Request<Full<Bytes>>) -> Reply {
    let what = format!("{} {}", req.method(), req.uri());
    let exchange = async {
        let response = client
            .request(req)
            .await
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        let (parts, body) = response.into_parts();
        let body = body
            .collect()
            .await
            .unwrap_or_else(|e| panic!("{what}: reading the body: {e:?}"))
            .to_bytes();
        (parts.status, parts.headers, body)
    };
    tokio::time::timeout(REQUEST_DEADLINE, exchange)
        .await
        .unwrap_or_else(|_| panic!("{what}: no response within {REQUEST_DEADLINE:?}"))
}

/// `total` GETs of `path`, at most `concurrency` in flight, over one pooled
/// client; the statuses in completion order.
pub async fn burst(
    addr: SocketAddr,
    path: &str,
    total: usize,
    concurrency: usize,
) -> Vec<StatusCode> {
    let client = http1_client();
    let gate = Arc::new(Semaphore::new(concurrency));
    let mut tasks = JoinSet::new();
    for _ in 0..total {
        let client = client.clone();
        let gate = gate.clone();
        let path = path.to_owned();
        tasks.spawn(async move {
            let _permit = gate.acquire_owned().await.expect("semaphore open");
            let req = build(addr, Method::GET, &path, &[], Bytes::new());
            send(&client, req).await.0
        });
    }
    join_all(tasks).await
}

/// Opens `total` HTTP/1.1 connections first, then sends one GET of `path`
/// on each at the same moment (a barrier), so the requests reach sluice as
/// close together as the machine allows.
pub async fn released_together(addr: SocketAddr, path: &str, total: usize) -> Vec<StatusCode> {
    replies_released_together(addr, path, total)
        .await
        .into_iter()
        .map(|(status, _, _)| status)
        .collect()
}

/// As [`released_together`], each whole reply, in completion order.
pub async fn replies_released_together(addr: SocketAddr, path: &str, total: usize) -> Vec<Reply> {
    let barrier = Arc::new(Barrier::new(total));
    let mut tasks = JoinSet::new();
    for _ in 0..total {
        let barrier = barrier.clone();
        let path = path.to_owned();
        tasks.spawn(async move {
            let stream = TcpStream::connect(addr).await.expect("connect to sluice");
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("HTTP/1.1 handshake");
            tokio::spawn(conn);
            // A bare connection sends the target as given and adds no Host:
            // origin form plus Host, as a browser would send it.
            let host = addr.to_string();
            let mut req = build(addr, Method::GET, &path, &[("host", &host)], Bytes::new());
            *req.uri_mut() = path.parse().expect("an origin-form path");
            barrier.wait().await;
            let exchange = async {
                let response = sender.send_request(req).await.expect("send the request");
                let (parts, body) = response.into_parts();
                let body = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                (parts.status, parts.headers, body)
            };
            tokio::time::timeout(REQUEST_DEADLINE, exchange)
                .await
                .expect("a response in time")
        });
    }
    join_all(tasks).await
}

async fn join_all<T: 'static>(mut tasks: JoinSet<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok(v) => out.push(v),
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        }
    }
    out
}

/// How many of `statuses` equal `status`.
pub fn count(statuses: &[StatusCode], status: StatusCode) -> usize {
    statuses.iter().filter(|s| **s == status).count()
}

/// A response read off a raw connection.
#[derive(Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Status line and headers, as sent.
    pub head: String,
}

/// Writes `bytes` on a new connection and reads one response head (and a
/// `Content-Length` body, discarded). For requests hyper's client refuses
/// to produce: no Host, two Hosts, odd transfer-codings.
pub async fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> RawResponse {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect to sluice");
        stream.write_all(bytes).await.expect("write the request");
        let (head, _rest) = read_head(&mut stream).await;
        let status = parse_status(&head);
        RawResponse { status, head }
    };
    tokio::time::timeout(REQUEST_DEADLINE, exchange)
        .await
        .expect("a raw response in time")
}

/// Reads until the end of a response head; returns the head and whatever
/// bytes followed it in the same reads.
pub async fn read_head(stream: &mut TcpStream) -> (String, Vec<u8>) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return (String::from_utf8_lossy(&buf).into_owned(), rest);
        }
        let n = stream.read(&mut chunk).await.expect("read the response");
        assert!(
            n > 0,
            "connection closed before a full response head; got {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The `Content-Length` a response head declares.
pub fn content_length(head: &str) -> Option<usize> {
    head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("content-length")
            .then(|| value.trim().parse().ok())?
    })
}

pub fn parse_status(head: &str) -> u16 {
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response head: {head:?}"))
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A header's value as text; `None` when absent or not text.
pub fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}
