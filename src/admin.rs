//! The admin listener: `/healthz`, `/readyz`, `/metrics`, and `POST
//! /explain` (`proxy::explain`). Its own port, never the traffic port.
//!
//! `/metrics` and the probes say nothing about any one client. `POST
//! /explain` does: submit an API key or an address and read whether it is
//! active. It is off unless `server.explain.token` is set, and then
//! answers only a request bearing that token, so reaching the admin port
//! (which scrapers and probes must) is not enough.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Method, Request, Response, StatusCode};
use http_body_util::LengthLimitError;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use crate::config::OnFailure;
use crate::proxy::fallback::Fallback;
use crate::proxy::{explain, SharedRuntime};
use crate::server::accept::AcceptErrors;
use crate::store::Store;

/// What `/readyz` looks at.
pub struct Health {
    runtime: SharedRuntime,
    store: Arc<Store>,
    /// The proxy's local fallback, which `POST /explain` reads.
    fallback: Arc<Fallback>,
    shutting_down: AtomicBool,
}

impl Health {
    pub fn new(runtime: SharedRuntime, store: Arc<Store>, fallback: Arc<Fallback>) -> Health {
        Health {
            fallback,
            runtime,
            store,
            shutting_down: AtomicBool::new(false),
        }
    }

    /// Readiness fails from here on, before listeners stop accepting, so
    /// the endpoints controller stops sending traffic first.
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
    }

    /// `Ok` when ready (with a note when ready although the store is
    /// not answering), else the reason.
    pub fn readiness(&self) -> Result<Option<&'static str>, String> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err("shutting down".to_owned());
        }
        // A runtime always holds a validated configuration.
        let runtime = self.runtime.load();
        if !self.store.ready() {
            // Under `store.on_failure: local` this sidecar still decides
            // every request; failing readiness would take every replica
            // out of its Service at once in an outage, the very moment
            // the fallback exists for.
            if runtime.live.store.on_failure == OnFailure::Local {
                return Ok(Some("store not answering: deciding locally"));
            }
            return Err(match self.store.scripts().1 {
                Some(why) => format!("store not ready: {why}"),
                None => "store not answering".to_owned(),
            });
        }
        Ok(None)
    }
}

/// Serves the admin endpoints on `listener` until `shutdown`. HTTP/1.1
/// only (probes and Prometheus speak it), so no protocol sniffing can hold
/// a silent connection open; every request head, the first included, is
/// bounded by `header_read_timeout`, as on the traffic port.
pub async fn serve(
    listener: TcpListener,
    health: Arc<Health>,
    header_read_timeout: Duration,
    shutdown: impl Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut accept_errors = AcceptErrors::new("admin");
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(error) => {
                    accept_errors.failed(&error).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let health = health.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let health = health.clone();
                async move { Ok::<_, Infallible>(respond(&health, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn respond(health: &Health, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() == "/explain" {
        if req.method() != Method::POST {
            let mut response = json(
                StatusCode::METHOD_NOT_ALLOWED,
                r#"{"error":"POST a request description to /explain"}"#.into(),
            );
            response
                .headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
            return response;
        }
        let token = health.runtime.load().live.server.explain_token.clone();
        let Some(token) = token else {
            return error_json(
                StatusCode::NOT_FOUND,
                "POST /explain is off; set server.explain.token to turn it on",
            );
        };
        if !bears(&req, token.expose()) {
            let mut response = error_json(
                StatusCode::UNAUTHORIZED,
                "POST /explain needs Authorization: Bearer and the configured token",
            );
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"sluice explain\""),
            );
            return response;
        }
        return explain(health, req).await;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return json(
            StatusCode::METHOD_NOT_ALLOWED,
            r#"{"error":"method not allowed"}"#.into(),
        );
    }
    match req.uri().path() {
        "/healthz" => json(StatusCode::OK, r#"{"status":"alive"}"#.into()),
        "/readyz" => match (health.readiness(), health.store.scripts().0) {
            (Ok(None), None) => json(StatusCode::OK, r#"{"status":"ready"}"#.into()),
            // Which way the Redis scripts run, once known.
            (Ok(None), Some(scripts)) => json(
                StatusCode::OK,
                serde_json::json!({"status": "ready", "scripts": scripts}).to_string(),
            ),
            (Ok(Some(note)), scripts) => json(
                StatusCode::OK,
                serde_json::json!({"status": "ready", "store": note, "scripts": scripts})
                    .to_string(),
            ),
            (Err(why), _) => json(
                StatusCode::SERVICE_UNAVAILABLE,
                serde_json::json!({"status": "not ready", "reason": why}).to_string(),
            ),
        },
        "/metrics" => {
            health.store.publish_metrics();
            publish_runtime_metrics();
            Response::builder()
                .header(header::CONTENT_TYPE, "text/plain; version=0.0.4")
                .body(Full::new(Bytes::from(crate::telemetry::render_metrics())))
                .unwrap_or_default()
        }
        _ => json(StatusCode::NOT_FOUND, r#"{"error":"not found"}"#.into()),
    }
}

/// `POST /explain`: the body is read whole, up to
/// [`explain::MAX_BODY`] and within [`EXPLAIN_BODY_TIMEOUT`], then
/// explained under the configuration live now. The explanation itself is
/// always 200, whatever it says a request would be answered.
async fn explain(health: &Health, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let limited = Limited::new(req.into_body(), explain::MAX_BODY);
    let body = match tokio::time::timeout(EXPLAIN_BODY_TIMEOUT, limited.collect()).await {
        Ok(Ok(body)) => body.to_bytes(),
        Ok(Err(error)) if error.is::<LengthLimitError>() => {
            return error_json(
                StatusCode::PAYLOAD_TOO_LARGE,
                &format!("the body is over {} bytes", explain::MAX_BODY),
            )
        }
        Ok(Err(_)) => return error_json(StatusCode::BAD_REQUEST, "the body could not be read"),
        Err(_) => {
            return error_json(
                StatusCode::REQUEST_TIMEOUT,
                "the body did not arrive in time",
            )
        }
    };
    let described = match explain::Described::parse(&body) {
        Ok(described) => described,
        Err(bad) => return error_json(StatusCode::BAD_REQUEST, &bad.0),
    };
    let runtime = health.runtime.load_full();
    let explained = explain::explain(
        &runtime,
        explain::Source::Store(&health.store, &health.fallback),
        &described,
    )
    .await;
    json(StatusCode::OK, explained.to_string())
}

/// Whether `req` carries `Authorization: Bearer <token>`, the scheme in any
/// case. Compared in time that depends only on the lengths: an explanation
/// tells whether a key or an address is active, so the token is guarded
/// like one.
fn bears(req: &Request<Incoming>, token: &str) -> bool {
    let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
    let (Some(value), None) = (values.next(), values.next()) else {
        return false;
    };
    let value = crate::subject::resolve::credentials(value.as_bytes().trim_ascii());
    let Some(sent) = value.strip_prefix(b"Bearer ") else {
        return false;
    };
    sent.len() == token.len()
        && sent
            .iter()
            .zip(token.as_bytes())
            .fold(0u8, |differ, (a, b)| differ | (a ^ b))
            == 0
}

/// Long enough for any operator's client on any network; short enough
/// that a body trickled in cannot hold a connection.
const EXPLAIN_BODY_TIMEOUT: Duration = Duration::from_secs(10);

fn error_json(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json(status, serde_json::json!({ "error": message }).to_string())
}

/// The runtime's live task count, read when scraped: the admin listener
/// runs on the same runtime as the traffic it counts. A task that leaks
/// (a connection never closed, a request never finished) shows here.
fn publish_runtime_metrics() {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        metrics::gauge!(crate::telemetry::RUNTIME_ALIVE_TASKS)
            .set(handle.metrics().num_alive_tasks() as f64);
    }
}

fn json(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    response
}
