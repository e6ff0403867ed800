//! The proxy and the accept-and-drain loop in-process, in front of a tiny
//! hyper upstream, on 127.0.0.1 port 0: what needs real sockets but not the
//! binary (streaming, 502/504/408, upgrades, slow clients, graceful
//! shutdown, TLS with ALPN).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use sluice::config::Config;
use sluice::proxy::{Proxy, Runtime, Upstream};
use sluice::server::{self, Settings};
use sluice::store::memory::MemoryStore;
use sluice::store::Store;
use sluice::subject::PseudonymKey;

const FIVE_MB: usize = 5 * 1024 * 1024;

// ---------------------------------------------------------------- upstream

/// A small application: `/echo` streams the request body back, `/drain`
/// reads it whole before answering, `/slow` answers after a second,
/// `/headers` tells what it received, `/ws` switches protocols and echoes.
struct App {
    addr: SocketAddr,
    /// Requests whose head reached the app.
    arrived: Arc<AtomicUsize>,
}

impl App {
    async fn start() -> App {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let arrived = Arc::new(AtomicUsize::new(0));
        let counter = arrived.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let counter = counter.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        counter.fetch_add(1, Ordering::SeqCst);
                        app(request)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        App { addr, arrived }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

type AppBody = http_body_util::combinators::BoxBody<Bytes, hyper::Error>;

fn text(s: impl Into<Bytes>) -> AppBody {
    Full::new(s.into()).map_err(|never| match never {}).boxed()
}

async fn app(mut request: Request<Incoming>) -> Result<Response<AppBody>, Infallible> {
    let response = match request.uri().path() {
        "/echo" => Response::new(request.into_body().boxed()),
        "/drain" => match request.into_body().collect().await {
            Ok(body) => Response::new(text(format!("{}", body.to_bytes().len()))),
            Err(_) => Response::new(text("cut")),
        },
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(1)).await;
            Response::new(text("slow"))
        }
        "/headers" => {
            let h = request.headers();
            let get = |name: &str| {
                h.get(name)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("-")
                    .to_owned()
            };
            let seen = format!(
                "host={} proto={} fhost={} xff={} version={:?}",
                get("host"),
                get("x-forwarded-proto"),
                get("x-forwarded-host"),
                get("x-forwarded-for"),
                request.version()
            );
            Response::new(text(seen))
        }
        "/ws" => {
            let upgrade = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                if let Ok(upgraded) = upgrade.await {
                    let mut io = TokioIo::new(upgraded);
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = io.read(&mut buf).await {
                        if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                }
            });
            Response::builder()
                .status(StatusCode::SWITCHING_PROTOCOLS)
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .body(text(""))
                .unwrap()
        }
        _ => Response::new(text("ok")),
    };
    Ok(response)
}

// ------------------------------------------------------------------ sluice

struct Timeouts {
    header_read: &'static str,
    body_idle: &'static str,
    upstream: &'static str,
    grace: &'static str,
}

const QUICK: Timeouts = Timeouts {
    header_read: "500ms",
    body_idle: "300ms",
    upstream: "500ms",
    grace: "3s",
};

/// sluice served by `server::serve` until `stop` is called.
struct Sluice {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    served: JoinHandle<()>,
}

impl Sluice {
    async fn start(upstream_url: &str, t: &Timeouts) -> Sluice {
        Sluice::start_with_tls(upstream_url, t, None).await
    }

    async fn start_with_tls(
        upstream_url: &str,
        t: &Timeouts,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Sluice {
        let yaml = format!(
            "version: 1
server:
  listen: 127.0.0.1:0
  header_read_timeout: {}
  body_idle_timeout: {}
  shutdown_grace: {}
upstream:
  url: {upstream_url}
  connect_timeout: 500ms
  timeout: {}
store:
  kind: memory
policies:
  lots: {{ algorithm: fixed-window, limit: 100000, window: 1h }}
routes:
  - {{ name: all, match: {{ path_prefix: / }}, subject: client_ip, policy: lots }}
",
            t.header_read, t.body_idle, t.grace, t.upstream
        );
        let config = match Config::parse(Path::new("smoke.yaml"), &yaml) {
            Ok(config) => config,
            Err(errors) => panic!("{errors}"),
        };
        let settings = Settings::from(&config.boot.server);
        let upstream = Upstream::new(&config.boot.upstream);
        let runtime = Arc::new(ArcSwap::from_pointee(Runtime::new(
            Arc::new(config.live),
            PseudonymKey::random(),
        )));
        let store = Arc::new(Store::Memory(MemoryStore::new(
            10_000,
            Duration::from_secs(1),
        )));
        let fallback = Arc::new(sluice::proxy::fallback::Fallback::for_sidecar());
        let proxy = Arc::new(Proxy::new(runtime, store, fallback, upstream));

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let winding_down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let served = tokio::spawn(server::serve(
            listener,
            tls,
            settings,
            proxy,
            winding_down,
            async {
                let _ = stopped.await;
            },
        ));
        Sluice {
            addr,
            stop: Some(stop),
            served,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Begins shutdown; the handle resolves when `serve` has returned.
    fn stop(&mut self) -> &mut JoinHandle<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        &mut self.served
    }
}

fn client() -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn send(method: &str, url: &str, body: Bytes) -> (StatusCode, Bytes) {
    let request = Request::builder()
        .method(method)
        .uri(url)
        .body(Full::new(body))
        .unwrap();
    let response = client().request(request).await.unwrap();
    let status = response.status();
    (
        status,
        response.into_body().collect().await.unwrap().to_bytes(),
    )
}

/// Deterministic bytes with no short period, so a truncated, reordered or
/// duplicated chunk cannot compare equal.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// Reads until the peer closes (or errors); `None` if it is still open
/// after `within`.
async fn closed_within(stream: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut seen = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    Some(seen)
}

// ------------------------------------------------------------------- tests

#[tokio::test]
async fn five_megabytes_stream_through_both_ways() {
    let app = App::start().await;
    let sluice = Sluice::start(&app.url(), &QUICK).await;
    let sent = Bytes::from(pattern(FIVE_MB));
    let (status, got) = send("POST", &sluice.url("/echo"), sent.clone()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(got.len(), FIVE_MB);
    assert!(got == sent, "the echoed body differs");
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_slow_upstream_is_504() {
    // Bound and dropped: nothing listens there.
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let sluice = Sluice::start(&closed_url, &QUICK).await;
    let (status, body) = send("GET", &sluice.url("/"), Bytes::new()).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(body.starts_with(b"{"), "{body:?}");

    let app = App::start().await;
    let sluice = Sluice::start(&app.url(), &QUICK).await;
    let started = Instant::now();
    let (status, _) = send("GET", &sluice.url("/slow"), Bytes::new()).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert!(started.elapsed() < Duration::from_millis(950));
}

#[tokio::test]
async fn a_stalled_request_body_is_cut_with_408() {
    let app = App::start().await;
    let sluice = Sluice::start(&app.url(), &QUICK).await;
    let mut stream = TcpStream::connect(sluice.addr).await.unwrap();
    stream
        .write_all(b"POST /drain HTTP/1.1\r\nhost: a\r\ncontent-length: 10\r\n\r\nab")
        .await
        .unwrap();
    let seen = closed_within(&mut stream, Duration::from_secs(3))
        .await
        .expect("sluice answered and closed");
    let head = String::from_utf8_lossy(&seen);
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
}

#[tokio::test]
async fn silent_and_slow_clients_are_dropped_after_the_header_read_timeout() {
    let app = App::start().await;
    let sluice = Sluice::start(&app.url(), &QUICK).await;

    let openings: [&[u8]; 3] = [
        b"",
        // A partial HTTP/2 preface: the protocol is still unknown.
        b"PRI * HTTP/2.0\r\n",
        b"GET / HTTP/1.1\r\nhost: a\r\n",
    ];
    for opening in openings {
        let mut stream = TcpStream::connect(sluice.addr).await.unwrap();
        stream.write_all(opening).await.unwrap();
        let started = Instant::now();
        assert!(
            closed_within(&mut stream, Duration::from_secs(3))
                .await
                .is_some(),
            "still open: {:?}",
            String::from_utf8_lossy(opening)
        );
        assert!(started.elapsed() >= Duration::from_millis(400));
    }
    assert_eq!(app.arrived.load(Ordering::SeqCst), 0);

    // After a whole exchange, an idle keep-alive connection goes the same way.
    let mut stream = TcpStream::connect(sluice.addr).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nhost: a\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let started = Instant::now();
    assert!(closed_within(&mut stream, Duration::from_secs(3))
        .await
        .is_some());
    assert!(started.elapsed() >= Duration::from_millis(400));
}

#[tokio::test]
async fn websocket_upgrade_is_tunnelled() {
    let app = App::start().await;
    let sluice = Sluice::start(&app.url(), &QUICK).await;
    let mut stream = TcpStream::connect(sluice.addr).await.unwrap();
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nhost: a\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(stream.read(&mut byte).await.unwrap(), 1, "closed early");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");

    for message in [&b"hello"[..], b"through the tunnel"] {
        stream.write_all(message).await.unwrap();
        let mut back = vec![0u8; message.len()];
        stream.read_exact(&mut back).await.unwrap();
        assert_eq!(back, message);
    }
}

#[tokio::test]
async fn shutdown_refuses_new_connections_and_finishes_in_flight_requests() {
    let app = App::start().await;
    let t = Timeouts {
        upstream: "5s",
        ..QUICK
    };
    let mut sluice = Sluice::start(&app.url(), &t).await;
    let url = sluice.url("/slow");
    let in_flight = tokio::spawn(async move { send("GET", &url, Bytes::new()).await });
    while app.arrived.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let started = Instant::now();
    let addr = sluice.addr;
    tokio::time::timeout(Duration::from_secs(3), sluice.stop())
        .await
        .expect("serve returned within the grace")
        .unwrap();
    // It waited for the in-flight request, not for the whole grace.
    assert!(started.elapsed() < Duration::from_millis(2_500));
    let (status, body) = in_flight.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "slow");
    assert!(TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn shutdown_cuts_upgraded_connections_at_the_grace() {
    let app = App::start().await;
    let t = Timeouts {
        grace: "300ms",
        ..QUICK
    };
    let mut sluice = Sluice::start(&app.url(), &t).await;
    let mut stream = TcpStream::connect(sluice.addr).await.unwrap();
    stream
        .write_all(
            b"GET /ws HTTP/1.1\r\nhost: a\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n",
        )
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 101");

    let started = Instant::now();
    tokio::time::timeout(Duration::from_secs(3), sluice.stop())
        .await
        .expect("serve returned")
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert!(closed_within(&mut stream, Duration::from_secs(2))
        .await
        .is_some());
}

#[tokio::test]
async fn tls_offers_h2_and_forwards_as_https() {
    let app = App::start().await;
    let tls = crate::support::tls::self_signed(&[b"h2", b"http/1.1"]);
    let acceptor = server::tls::acceptor(&sluice::config::Tls {
        cert: tls.cert.path().to_owned(),
        key: tls.key.path().to_owned(),
    })
    .unwrap();
    let sluice = Sluice::start_with_tls(&app.url(), &QUICK, Some(acceptor)).await;

    let tcp = TcpStream::connect(sluice.addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tls.connector.connect(name, tcp).await.unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));

    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = Request::builder()
        .uri("https://localhost/headers")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = response.into_body().collect().await.unwrap().to_bytes();
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.contains("host=localhost "), "{seen}");
    assert!(seen.contains("proto=https "), "{seen}");
    assert!(seen.contains("fhost=localhost "), "{seen}");
    assert!(seen.contains("xff=127.0.0.1 "), "{seen}");
    assert!(seen.contains("version=HTTP/1.1"), "{seen}");
}
