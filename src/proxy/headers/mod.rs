//! The request's headers: what refuses a request before any decision
//! (`checks`) and what a forwarding proxy rewrites on the way to the app
//! and back (`rewrite`). The names both read, and the reading of a
//! comma-separated list, are here.

mod checks;
mod fields;
mod rewrite;

use http::header::{
    HeaderMap, HeaderName, CONNECTION, PROXY_AUTHENTICATE, PROXY_AUTHORIZATION, TE, TRAILER,
    TRANSFER_ENCODING, UPGRADE,
};

pub use checks::*;
pub use fields::{RequestFields, ResponseFields};
pub use rewrite::*;

pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
static KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
static PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");
/// Rewrite targets some frameworks (IIS URL Rewrite, Symfony, Zend) route
/// by instead of the request line: a path sluice never matched.
static X_ORIGINAL_URL: HeaderName = HeaderName::from_static("x-original-url");
static X_REWRITE_URL: HeaderName = HeaderName::from_static("x-rewrite-url");
pub static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// Every field besides `X-Forwarded-For`, `X-Real-IP` and `Forwarded` that
/// an app framework, library or common idiom reads a client address (or
/// the port or path prefix it used) from. From a client that is no trusted
/// proxy they are its own claim and are removed (see [`prepare_request`]),
/// as nginx hardening does: the app then falls back to what sluice sets.
/// docs/SECURITY.md lists the same table; a test holds them equal. Names
/// spelled with `_` are covered by `server.headers_with_underscores`.
pub static REMOVED_CLAIMS: [HeaderName; 15] = [
    HeaderName::from_static("true-client-ip"),
    HeaderName::from_static("cf-connecting-ip"),
    HeaderName::from_static("client-ip"),
    HeaderName::from_static("x-client-ip"),
    HeaderName::from_static("x-cluster-client-ip"),
    HeaderName::from_static("fastly-client-ip"),
    HeaderName::from_static("forwarded-for"),
    HeaderName::from_static("x-forwarded"),
    HeaderName::from_static("x-original-forwarded-for"),
    HeaderName::from_static("x-proxyuser-ip"),
    HeaderName::from_static("proxy-client-ip"),
    HeaderName::from_static("wl-proxy-client-ip"),
    HeaderName::from_static("x-originating-ip"),
    HeaderName::from_static("x-forwarded-port"),
    HeaderName::from_static("x-forwarded-prefix"),
];

/// Whether `name` claims a client address: `X-Real-IP`, `Forwarded` or
/// one of [`REMOVED_CLAIMS`]. `X-Forwarded-For` is rewritten apart.
pub fn is_claim(name: &HeaderName) -> bool {
    is_claim_text(name.as_str())
}

/// [`is_claim`] of a name's text, for a caller that has it already (a
/// standard name's text is a table look-up of its own).
pub(super) fn is_claim_text(text: &str) -> bool {
    // The first byte tells most names of a claim's length apart without a
    // `memcmp` call (`sec-fetch-mode` from `true-client-ip`).
    let first = text.as_bytes().first();
    claims_of_length(text.len())
        .iter()
        .any(|claim| claim.as_bytes().first() == first && *claim == text)
}

/// The names [`is_claim`] knows, by their length: a field of another
/// length (most of a request's) is told apart without a comparison, the
/// rest with one to four, as text. A test holds them to
/// [`REMOVED_CLAIMS`], `X-Real-IP` and `Forwarded`.
fn claims_of_length(len: usize) -> &'static [&'static str] {
    match len {
        9 => &["x-real-ip", "forwarded", "client-ip"],
        11 => &["x-client-ip", "x-forwarded"],
        13 => &["forwarded-for"],
        14 => &["true-client-ip", "x-proxyuser-ip"],
        15 => &["proxy-client-ip"],
        16 => &[
            "cf-connecting-ip",
            "fastly-client-ip",
            "x-originating-ip",
            "x-forwarded-port",
        ],
        18 => &["wl-proxy-client-ip", "x-forwarded-prefix"],
        19 => &["x-cluster-client-ip"],
        24 => &["x-original-forwarded-for"],
        _ => &[],
    }
}

/// Where `Transfer-Encoding` is in [`HOP_BY_HOP`].
const TRANSFER_ENCODING_AT: usize = 7;
/// Where `Upgrade` is in [`HOP_BY_HOP`].
const UPGRADE_AT: usize = 8;

/// RFC 9110 §7.6.1, plus the pre-standard `Keep-Alive` and
/// `Proxy-Connection` that clients still send, and `HTTP2-Settings`, which
/// only means something on an h2c upgrade (RFC 7540 §3.2.1; removed
/// everywhere, as Envoy does). A static: asked once a field name, the list
/// is not built again each time.
pub(super) static HOP_BY_HOP: [&HeaderName; 10] = [
    &CONNECTION,
    &KEEP_ALIVE,
    &PROXY_CONNECTION,
    &PROXY_AUTHENTICATE,
    &PROXY_AUTHORIZATION,
    &TE,
    &TRAILER,
    &TRANSFER_ENCODING,
    &UPGRADE,
    &HTTP2_SETTINGS,
];

/// Fields a map may hold for [`holds`] to compare names one by one.
const COMPARED_UP_TO: usize = 8;

/// Whether `headers` holds a field named `name`. A field map hashes a
/// name that is not one of the standard ones byte by byte before its
/// probe (about 180 instructions for `X-Forwarded-For`); most requests
/// carry a handful of fields, whose names are compared for less (a
/// standard name differs from a custom one at its first word).
pub fn holds(headers: &HeaderMap, name: &HeaderName) -> bool {
    if headers.keys_len() <= COMPARED_UP_TO {
        headers.keys().any(|held| held == name)
    } else {
        headers.contains_key(name)
    }
}

pub(super) fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &[u8]> {
    headers
        .get_all(CONNECTION)
        .iter()
        .flat_map(|v| list(v.as_bytes()))
}

/// The members of a comma-separated field value, trimmed, empties skipped
/// (RFC 9110 §5.6.1).
pub(super) fn list(value: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    value
        .split(|b| *b == b',')
        .map(|m| m.trim_ascii())
        .filter(|m| !m.is_empty())
}

#[cfg(test)]
mod tests;
