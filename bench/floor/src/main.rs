//! The hyper floor: every request forwarded unchanged to the upstream and
//! its answer returned unchanged, nothing added. What sluice's `/none`
//! costs over this is what sluice itself does per request.
//!
//!     hyper-floor UPSTREAM_URL [LISTEN_ADDR]
//!
//! Prints `listening 127.0.0.1:PORT` once bound (LISTEN_ADDR defaults to
//! 127.0.0.1:0). The settings are sluice's with `server.workers: 1`: a
//! multi-thread runtime with one worker, HTTP/1 and HTTP/2 detected per
//! connection (hyper-util's auto builder), `header_read_timeout` 10 s with
//! tokio's timer, keep-alive, TCP_NODELAY both ways, the upstream client
//! pooled (90 s idle, at most 64 idle connections, 1 s connect timeout).
//!
//! `/blocked` is the refusal floor: a fixed 429 (`Retry-After`, a short
//! body, as nginx `limit_req_status 429` sends), answered without the
//! upstream. What sluice's `/blocked` costs over it is sluice's own refusal:
//! the route, the subject, the decision, the header set, the metrics.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use hyper::http::uri::{Authority, Scheme, Uri};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use tokio::net::TcpListener;

type Upstream = Client<HttpConnector, Incoming>;
type Error = Box<dyn std::error::Error + Send + Sync>;
/// Either body, unboxed: the forwarding path allocates nothing for it.
type Body = Either<Incoming, Full<Bytes>>;

/// nginx's own 429 page is 162 bytes of HTML; this is as long.
const REFUSED: &[u8] = b"{\"status\":429,\"title\":\"Too Many Requests\",\"detail\":\"this client is over its limit; try again after the time in Retry-After\",\"route\":\"blocked\",\"policy\":\"closed\"}";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let upstream: Uri = args
        .next()
        .ok_or("usage: hyper-floor UPSTREAM_URL [LISTEN_ADDR]")?
        .parse()?;
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:0".to_owned());
    let authority = upstream
        .authority()
        .ok_or("the upstream URL has no host")?
        .clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    runtime.block_on(serve(listen, authority))
}

async fn serve(listen: String, authority: Authority) -> Result<(), Box<dyn std::error::Error>> {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_secs(1)));
    connector.set_nodelay(true);
    let client: Upstream = Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(64)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector);
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(10))
        .keep_alive(true)
        .max_buf_size(32 * 1024);
    builder.http2().timer(TokioTimer::new());
    let listener = TcpListener::bind(&listen).await?;
    println!("listening {}", listener.local_addr()?);
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(_) => continue, // out of descriptors, a reset before accept: keep serving
        };
        let _ = stream.set_nodelay(true);
        let (builder, client, authority) = (builder.clone(), client.clone(), authority.clone());
        tokio::spawn(async move {
            let service = service_fn(move |req| forward(client.clone(), authority.clone(), req));
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The request as it came, its target made absolute for the client. An
/// error (no upstream, a target that is not a path) ends the connection:
/// the floor has no error answers to pay for.
async fn forward(
    client: Upstream,
    authority: Authority,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, Error> {
    if req.uri().path() == "/blocked" {
        return Ok(refused());
    }
    let mut parts = std::mem::take(req.uri_mut()).into_parts();
    parts.scheme = Some(Scheme::HTTP);
    parts.authority = Some(authority);
    *req.uri_mut() = Uri::from_parts(parts)?;
    Ok(client.request(req).await?.map(Either::Left))
}

/// The refusal: a status, three fields and a fixed body.
fn refused() -> Response<Body> {
    Response::builder()
        .status(StatusCode::TOO_MANY_REQUESTS)
        .header("content-type", "application/problem+json")
        .header("retry-after", "60")
        .body(Either::Right(Full::new(Bytes::from_static(REFUSED))))
        .expect("a fixed response is well formed")
}
