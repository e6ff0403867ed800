//! `refused` and `unavailable` under `responses:` (and a route's own
//! `responses:`): the answer an app's clients expect in place of sluice's
//! problem+json. The body is read here, when the configuration loads or
//! reloads, so that no request ever waits on a file.

use std::io::Read as _;
use std::path::PathBuf;
use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use serde_yaml::Value;

use crate::config::locate::{At, KeyPath};
use crate::config::raw;
use crate::config::validate::check::Checker;
use crate::route::{Answers, CustomAnswer, CustomBody};

/// The largest `body_file` read: a refusal is a short page or document,
/// and every route keeps its own copy of the bytes in memory.
pub const MAX_BODY_BYTES: u64 = 64 * 1024;

/// The most `headers` one answer may add.
const MAX_HEADERS: usize = 32;

/// Which answer: what its status may be.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Refused,
    Unavailable,
}

impl Kind {
    fn allows(self, status: u16) -> bool {
        match self {
            // Any client error; 200 for a client that must not learn it
            // was refused (a bot shown a page).
            Kind::Refused => status == 200 || (400..=499).contains(&status),
            // Any server error; 429 for clients that retry on it alone.
            Kind::Unavailable => status == 429 || (500..=599).contains(&status),
        }
    }

    fn allowed(self) -> &'static str {
        match self {
            Kind::Refused => "a client error (400 to 499) or 200",
            Kind::Unavailable => "a server error (500 to 599) or 429",
        }
    }
}

/// `refused` and `unavailable` of the `responses:` at `path`.
pub fn answers(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    refused: Option<raw::Answer>,
    unavailable: Option<raw::Answer>,
) -> Option<Answers> {
    let refused = one(cx, &path.key("refused"), refused, Kind::Refused);
    let unavailable = one(cx, &path.key("unavailable"), unavailable, Kind::Unavailable);
    Some(Answers {
        refused: refused?,
        unavailable: unavailable?,
    })
}

fn one(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<raw::Answer>,
    kind: Kind,
) -> Option<Option<Arc<CustomAnswer>>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    let status = match &raw.status {
        None => Some(None),
        Some(s) => cx
            .value(&path.key("status"), s, |s| status(s, kind))
            .map(Some),
    };
    let body = match (&raw.body_file, &raw.content_type) {
        (None, None) => Some(None),
        (Some(_), None) => {
            cx.error(
                path,
                At::Key,
                "`body_file` needs `content_type`: the type of what the file holds, e.g. `text/html; charset=utf-8`",
            );
            None
        }
        (None, Some(_)) => {
            cx.error(
                &path.key("content_type"),
                At::Key,
                "`content_type` goes with `body_file`; without one, the body is sluice's own `application/problem+json`",
            );
            None
        }
        (Some(file), Some(content_type)) => {
            let content_type = cx.value(&path.key("content_type"), content_type, |s| {
                let s = s.trim();
                if s.is_empty() {
                    return Err("must not be empty".to_owned());
                }
                HeaderValue::from_str(s)
                    .map_err(|_| format!("`{s}` cannot be a header's value: printable ASCII only"))
            });
            let file = PathBuf::from(file.0.trim());
            let bytes = match read_body(&file) {
                Ok(bytes) => Some(bytes),
                Err(message) => {
                    cx.error(&path.key("body_file"), At::Value, message);
                    None
                }
            };
            match (content_type, bytes) {
                (Some(content_type), Some(bytes)) => Some(Some(CustomBody {
                    content_type,
                    bytes,
                    file,
                })),
                _ => None,
            }
        }
    };
    let headers = headers(cx, &path.key("headers"), raw.headers);
    Some(Some(Arc::new(CustomAnswer {
        status: status?,
        body: body?,
        headers: headers?,
    })))
}

fn status(s: &str, kind: Kind) -> Result<StatusCode, String> {
    let n: u16 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}` is not a status; write e.g. `429`"))?;
    if !kind.allows(n) {
        return Err(format!(
            "{n} cannot be this answer's status: {}",
            kind.allowed()
        ));
    }
    StatusCode::from_u16(n).map_err(|_| format!("`{s}` is not a status"))
}

/// The file's bytes, at most [`MAX_BODY_BYTES`].
fn read_body(file: &std::path::Path) -> Result<Bytes, String> {
    let shown = file.display();
    if file.as_os_str().is_empty() {
        return Err("expected the path of the body's file".to_owned());
    }
    let opened = std::fs::File::open(file).map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    let mut bytes = Vec::new();
    // One byte over the bound says the file is too large, whatever its
    // metadata claims (a pipe or a device has none to trust).
    opened
        .take(MAX_BODY_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read `{shown}`: {e}"))?;
    if bytes.len() as u64 > MAX_BODY_BYTES {
        return Err(format!(
            "`{shown}` is larger than {} KiB, the most a refusal's body may be",
            MAX_BODY_BYTES / 1024
        ));
    }
    Ok(Bytes::from(bytes))
}

/// Fields sluice frames or governs itself, which an answer may not set.
fn forbidden(name: &HeaderName) -> Option<&'static str> {
    match name.as_str() {
        "content-length" | "transfer-encoding" | "connection" | "keep-alive"
        | "proxy-connection" | "te" | "trailer" | "upgrade" => Some(
            "is a framing or hop-by-hop field, which sluice sets itself",
        ),
        "content-type" => Some("is set by `content_type`, beside `body_file`"),
        "ratelimit" | "ratelimit-policy" | "retry-after" => Some(
            "is sent by sluice for the limit that answered; turn it off with the policy's `headers: off`",
        ),
        _ => None,
    }
}

fn headers(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<serde_yaml::Mapping>,
) -> Option<Box<[(HeaderName, HeaderValue)]>> {
    let Some(map) = raw else {
        return Some(Box::default());
    };
    if map.len() > MAX_HEADERS {
        cx.error(
            path,
            At::Value,
            format!("at most {MAX_HEADERS} headers, not {}", map.len()),
        );
        return None;
    }
    let mut out: Vec<(HeaderName, HeaderValue)> = Vec::with_capacity(map.len());
    let mut ok = true;
    for (key, value) in map {
        let Some(name_text) = text(&key) else {
            cx.error(path, At::Key, "a header's name is text");
            ok = false;
            continue;
        };
        let at = path.key(&name_text);
        let name = match HeaderName::from_bytes(name_text.trim().as_bytes()) {
            Ok(name) => name,
            Err(_) => {
                cx.error(&at, At::Key, format!("`{name_text}` is not a header name"));
                ok = false;
                continue;
            }
        };
        if let Some(why) = forbidden(&name) {
            cx.error(&at, At::Key, format!("`{name}` {why}"));
            ok = false;
            continue;
        }
        if out.iter().any(|(n, _)| *n == name) {
            cx.error(&at, At::Key, format!("`{name}` is written twice"));
            ok = false;
            continue;
        }
        let value = text(&value).and_then(|v| HeaderValue::from_str(v.trim()).ok());
        match value {
            Some(value) => out.push((name, value)),
            None => {
                cx.error(
                    &at,
                    At::Value,
                    "expected a header's value: printable ASCII text",
                );
                ok = false;
            }
        }
    }
    ok.then(|| out.into())
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}
