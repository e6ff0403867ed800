//! `server`: the listeners, the connection bounds, paths and explain.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::time::Duration;

use crate::path::{EscapedSlashes, PathParameters, PathRules};

use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, ScalarList};
use crate::config::validate::check::{self, Checker};
use crate::config::{
    Http2, MinUploadRate, ProxyProtocol, RequestBuffering, RequestHeads, Secret, ServerBoot,
    ServerLive, Tls, Underscores,
};

use super::*;
use crate::config::keys;

pub fn server(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Server,
) -> Option<(ServerBoot, ServerLive)> {
    let listen = cx.required(&path.key("listen"), raw.listen.as_ref(), socket_addr);
    let admin = match &raw.admin {
        None => Some(None),
        Some(s) => cx.value(&path.key("admin"), s, socket_addr).map(Some),
    };
    if let (Some(listen), Some(Some(admin))) = (listen, admin) {
        if listen == admin && listen.port() != 0 {
            cx.error(&path.key("admin"), At::Value, "must differ from `listen`");
        }
    }
    let tls = match raw.tls {
        None => Some(None),
        Some(tls) => {
            let p = path.key("tls");
            let cert = cx.required(&p.key("cert"), tls.cert.as_ref(), file_path);
            let key = cx.required(&p.key("key"), tls.key.as_ref(), file_path);
            match (cert, key) {
                (Some(cert), Some(key)) => Some(Some(Tls { cert, key })),
                _ => None,
            }
        }
    };
    let shutdown_delay = cx.defaulted(
        path,
        &keys::SERVER_SHUTDOWN_DELAY,
        raw.shutdown_delay.as_ref(),
        check::duration,
    );
    let shutdown_grace = cx.defaulted(
        path,
        &keys::SERVER_SHUTDOWN_GRACE,
        raw.shutdown_grace.as_ref(),
        check::duration,
    );
    let header_read_timeout = cx.defaulted(
        path,
        &keys::SERVER_HEADER_READ_TIMEOUT,
        raw.header_read_timeout.as_ref(),
        check::positive_duration,
    );
    let body_idle_timeout = cx.defaulted(
        path,
        &keys::SERVER_BODY_IDLE_TIMEOUT,
        raw.body_idle_timeout.as_ref(),
        check::positive_duration,
    );
    let min_upload_rate = min_upload_rate(
        cx,
        &path.key("min_upload_rate"),
        raw.min_upload_rate.as_ref(),
    );
    // hyper refuses an HTTP/1 read buffer below 8 KiB.
    let max_header_bytes = cx.defaulted(
        path,
        &keys::SERVER_MAX_HEADER_BYTES,
        raw.max_header_bytes.as_ref(),
        check::number(8_192, 16 * 1024 * 1024),
    );
    let workers = cx.defaulted(
        path,
        &keys::SERVER_WORKERS,
        raw.workers.as_ref(),
        check::number(0, 1024),
    );
    // nginx closes idle keep-alive connections after 75 s, HTTP/2 ones
    // included; a sidecar's clients are close by.
    let idle_timeout = cx.defaulted(
        path,
        &keys::SERVER_IDLE_TIMEOUT,
        raw.idle_timeout.as_ref(),
        check::positive_duration,
    );
    // nginx's send_timeout default.
    let send_timeout = cx.defaulted(
        path,
        &keys::SERVER_SEND_TIMEOUT,
        raw.send_timeout.as_ref(),
        check::positive_duration,
    );
    // nginx's worker_connections default; a sidecar fronts one app.
    let max_connections = cx.defaulted(
        path,
        &keys::SERVER_MAX_CONNECTIONS,
        raw.max_connections.as_ref(),
        check::number(1, 1_000_000),
    );
    // 256 by default, at most an eighth of the pool: with the default pool
    // of 10,000 it takes 40 addresses to fill it (four hold a tenth of
    // it), while an office behind one NAT (some 40 browsers at HTTP/1's
    // six connections each) is still served. Trusted peers are not counted
    // per address (their clients are), so it need not be raised behind an
    // ingress.
    let per_ip_default = max_connections.map_or(1, |n| (n / 8).clamp(1, 256));
    let ceiling = max_connections.unwrap_or(1_000_000);
    let max_connections_per_ip = cx.optional(
        &path.key("max_connections_per_ip"),
        raw.max_connections_per_ip.as_ref(),
        per_ip_default,
        |s| {
            check::number(1, 1_000_000)(s).and_then(|n| {
                if n > ceiling {
                    Err(format!("{n} is above max_connections ({ceiling})"))
                } else {
                    Ok(n)
                }
            })
        },
    );
    let http2 = http2(cx, &path.key("http2"), raw.http2.unwrap_or_default());
    let request_heads = request_heads(
        cx,
        &path.key("request_heads"),
        raw.request_heads.unwrap_or_default(),
        max_header_bytes,
    );
    let request_buffering = request_buffering(
        cx,
        &path.key("request_buffering"),
        raw.request_buffering.unwrap_or_default(),
    );
    let proxy_protocol = proxy_protocol(cx, &path.key("proxy_protocol"), raw.proxy_protocol);
    let paths = match raw.paths {
        None => Some(PathRules::default()),
        Some(raw) => paths(cx, &path.key("paths"), raw),
    };
    let underscores = cx.defaulted(
        path,
        &keys::SERVER_HEADERS_WITH_UNDERSCORES,
        raw.headers_with_underscores.as_ref(),
        |s| match s {
            "drop" => Ok(Underscores::Drop),
            "reject" => Ok(Underscores::Reject),
            "allow" => Ok(Underscores::Allow),
            _ => Err(format!(
                "unknown value `{s}`; expected drop, reject or allow"
            )),
        },
    );
    let explain_token = match raw.explain {
        None => Some(None),
        Some(explain) => cx
            .required(
                &path.key("explain").key("token"),
                explain.token.as_ref(),
                explain_token,
            )
            .map(Some),
    };
    let boot = ServerBoot {
        listen: listen?,
        admin: admin?,
        tls: tls?,
        shutdown_delay: shutdown_delay?,
        shutdown_grace: shutdown_grace?,
        header_read_timeout: header_read_timeout?,
        max_header_bytes: usize::try_from(max_header_bytes?).ok()?,
        workers: usize::try_from(workers?).ok()?,
        idle_timeout: idle_timeout?,
        send_timeout: send_timeout?,
        max_connections: usize::try_from(max_connections?).ok()?,
        max_connections_per_ip: usize::try_from(max_connections_per_ip?).ok()?,
        http2: http2?,
        request_heads: request_heads?,
        proxy_protocol: proxy_protocol?,
    };
    let live = ServerLive {
        body_idle_timeout: body_idle_timeout?,
        min_upload_rate: min_upload_rate?,
        request_buffering: request_buffering?,
        paths: paths?,
        underscores: underscores?,
        explain_token: explain_token?,
    };
    Some((boot, live))
}

/// `server.proxy_protocol`: `v1`, `v2`, or a list of them.
fn proxy_protocol(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<ScalarList>,
) -> Option<ProxyProtocol> {
    let items = list_items(path, raw);
    let mut versions = ProxyProtocol::default();
    let mut ok = true;
    for (p, s) in &items {
        let version = cx.value(p, s, |s| match s {
            "v1" => Ok(1),
            "v2" => Ok(2),
            _ => Err(format!("unknown version `{s}`; expected v1 or v2")),
        });
        let seen = match version {
            Some(1) => std::mem::replace(&mut versions.v1, true),
            Some(_) => std::mem::replace(&mut versions.v2, true),
            None => {
                ok = false;
                continue;
            }
        };
        if seen {
            cx.error(p, At::Value, "is listed twice");
            ok = false;
        }
    }
    ok.then_some(versions)
}

/// Kestrel's `MinRequestBodyDataRate` default: 240 bytes a second, far
/// below any working network, after 5 s.
const MIN_UPLOAD_RATE: MinUploadRate = MinUploadRate {
    bytes_per_second: NonZeroU32::new(240).expect("not zero"),
    grace: Duration::from_secs(5),
};

/// `server.min_upload_rate`: `off` (or `0`), a rate in bytes a second
/// with the default grace, or `{ bytes_per_second, grace }`, each
/// defaulted. A grace under a second would judge a body by its first
/// moments, before TCP has opened its window (Kestrel refuses one too).
fn min_upload_rate(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<&raw::MinUploadRate>,
) -> Option<Option<MinUploadRate>> {
    let rate = |s: &str| {
        if s.trim() == "off" {
            return Ok(None);
        }
        let n = check::number_u32(0)(s)
            .map_err(|e| format!("{e}; write `off` or a number of bytes per second"))?;
        Ok(NonZeroU32::new(n))
    };
    match raw {
        None => Some(Some(MIN_UPLOAD_RATE)),
        Some(raw::MinUploadRate::One(s)) => cx.value(path, s, rate).map(|bytes_per_second| {
            bytes_per_second.map(|bytes_per_second| MinUploadRate {
                bytes_per_second,
                ..MIN_UPLOAD_RATE
            })
        }),
        Some(raw::MinUploadRate::Table(table)) => {
            let bytes_per_second = cx.optional(
                &path.key("bytes_per_second"),
                table.bytes_per_second.as_ref(),
                Some(MIN_UPLOAD_RATE.bytes_per_second),
                rate,
            );
            let grace = cx.optional(
                &path.key("grace"),
                table.grace.as_ref(),
                MIN_UPLOAD_RATE.grace,
                |s| {
                    let d = check::duration(s)?;
                    if d < Duration::from_secs(1) {
                        return Err(format!("`{s}` is shorter than the minimum of 1s"));
                    }
                    Ok(d)
                },
            );
            let (bytes_per_second, grace) = (bytes_per_second?, grace?);
            Some(bytes_per_second.map(|bytes_per_second| MinUploadRate {
                bytes_per_second,
                grace,
            }))
        }
    }
}

/// `server.http2`: nginx's `http2_max_concurrent_streams` (128) and h2's
/// own reset bounds (20 pending, 1024 local), written down so they are
/// known and can be changed.
fn http2(cx: &mut Checker<'_>, path: &KeyPath, raw: raw::Http2) -> Option<Http2> {
    let streams = cx.defaulted(
        path,
        &keys::SERVER_HTTP2_MAX_CONCURRENT_STREAMS,
        raw.max_concurrent_streams.as_ref(),
        check::number(1, u64::from(u32::MAX)),
    );
    let pending = cx.defaulted(
        path,
        &keys::SERVER_HTTP2_MAX_PENDING_ACCEPT_RESET_STREAMS,
        raw.max_pending_accept_reset_streams.as_ref(),
        check::number(1, 1_000_000),
    );
    let local = cx.defaulted(
        path,
        &keys::SERVER_HTTP2_MAX_LOCAL_ERROR_RESET_STREAMS,
        raw.max_local_error_reset_streams.as_ref(),
        check::number(1, 1_000_000),
    );
    Some(Http2 {
        max_concurrent_streams: u32::try_from(streams?).ok()?,
        max_pending_accept_reset_streams: usize::try_from(pending?).ok()?,
        max_local_error_reset_streams: usize::try_from(local?).ok()?,
    })
}

/// `server.request_heads`: each bound at least the one inside it (a head
/// of `max_header_bytes` fits a connection's, a connection's fits a
/// client's, a client's the total), so none of them can refuse what
/// another one allows. The defaults, and how they fit a pod's memory
/// limit, are worked out in docs/OPERATIONS.md ("Memory").
fn request_heads(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::RequestHeads,
    max_header_bytes: Option<u64>,
) -> Option<RequestHeads> {
    const MAX: u64 = 1 << 40;
    let at_least = |floor: Option<u64>, what: &'static str| {
        move |s: &str| {
            check::number(1, MAX)(s).and_then(|n| match floor {
                Some(floor) if n < floor => Err(format!("{n} is below {what} ({floor})")),
                _ => Ok(n),
            })
        }
    };
    let per_connection = cx.defaulted(
        path,
        &keys::SERVER_REQUEST_HEADS_PER_CONNECTION,
        raw.per_connection.as_ref(),
        at_least(max_header_bytes, "server.max_header_bytes"),
    );
    let total = cx.defaulted(
        path,
        &keys::SERVER_REQUEST_HEADS_TOTAL,
        raw.total.as_ref(),
        check::number(1, MAX),
    );
    let per_client_default = total.map_or(1, |t| (t / 4).max(1));
    let per_client = cx.optional(
        &path.key("per_client"),
        raw.per_client.as_ref(),
        per_client_default.max(per_connection.unwrap_or(0)),
        at_least(per_connection, "per_connection"),
    );
    let (per_client, total) = (per_client?, total?);
    if total < per_client {
        cx.error(
            &path.key("total"),
            At::Key,
            format!("{total} is below per_client ({per_client})"),
        );
        return None;
    }
    Some(RequestHeads {
        per_connection: usize::try_from(per_connection?).ok()?,
        per_client: usize::try_from(per_client).ok()?,
        total: usize::try_from(total).ok()?,
    })
}

/// `server.request_buffering`: `max_body` 0 (off) to 1 GiB, and a `total`
/// that holds at least one body of `max_body`, or it would refuse every
/// body `max_body` lets in.
fn request_buffering(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::RequestBuffering,
) -> Option<RequestBuffering> {
    const MAX: u64 = 1 << 40;
    let max_body = cx.defaulted(
        path,
        &keys::SERVER_REQUEST_BUFFERING_MAX_BODY,
        raw.max_body.as_ref(),
        check::number(0, 1 << 30),
    );
    let total = cx.defaulted(
        path,
        &keys::SERVER_REQUEST_BUFFERING_TOTAL,
        raw.total.as_ref(),
        check::number(0, MAX),
    );
    let (max_body, total) = (max_body?, total?);
    if total < max_body {
        cx.error(
            &path.key("total"),
            At::Key,
            format!("{total} is below max_body ({max_body})"),
        );
        return None;
    }
    Some(RequestBuffering {
        max_body: usize::try_from(max_body).ok()?,
        total: usize::try_from(total).ok()?,
    })
}

/// `server.paths`: each default is the safe choice (see [`crate::path`]).
fn paths(cx: &mut Checker<'_>, path: &KeyPath, raw: raw::Paths) -> Option<PathRules> {
    let merge_slashes = cx.defaulted(
        path,
        &keys::SERVER_PATHS_MERGE_SLASHES,
        raw.merge_slashes.as_ref(),
        check::boolean,
    );
    let escaped_slashes = cx.defaulted(
        path,
        &keys::SERVER_PATHS_ESCAPED_SLASHES,
        raw.escaped_slashes.as_ref(),
        |s| match s {
            "reject" => Ok(EscapedSlashes::Reject),
            "keep" => Ok(EscapedSlashes::Keep),
            "decode" => Ok(EscapedSlashes::Decode),
            _ => Err(format!(
                "unknown value `{s}`; expected reject, keep or decode"
            )),
        },
    );
    let path_parameters = cx.defaulted(
        path,
        &keys::SERVER_PATHS_PATH_PARAMETERS,
        raw.path_parameters.as_ref(),
        |s| match s {
            "ignore" => Ok(PathParameters::Ignore),
            "strip" => Ok(PathParameters::Strip),
            "reject" => Ok(PathParameters::Reject),
            _ => Err(format!(
                "unknown value `{s}`; expected ignore, strip or reject"
            )),
        },
    );
    Some(PathRules {
        merge_slashes: merge_slashes?,
        escaped_slashes: escaped_slashes?,
        path_parameters: path_parameters?,
    })
}

/// Anyone who holds it can read whether a given key or address is active:
/// as long as a pseudonym key, and never printed.
fn explain_token(s: &str) -> Result<Secret, String> {
    if s.len() < 16 {
        return Err(format!(
            "must be at least 16 bytes long (it is {}); generate one with `openssl rand -hex 32`",
            s.len()
        ));
    }
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("may hold only visible ASCII characters (it is sent in a header)".to_owned());
    }
    Ok(Secret(s.to_owned()))
}

fn socket_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("`{s}` is not an address; write IP:PORT such as 0.0.0.0:8080 or [::]:8080")
    })
}
