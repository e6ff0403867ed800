//! A route's `match.hosts`, `match.headers` and `match.query`: the
//! conditions beyond method and path ([`crate::route::Conditions`]).

use http::header::{HeaderName, HeaderValue};
use serde_yaml::{Mapping, Value};

use super::check::Checker;
use crate::config::locate::{At, KeyPath};
use crate::config::raw::ScalarList;
use crate::route::{query, HostPattern, Route, Wanted};

/// Headers that never reach the app as sent, or that have a key of their
/// own: a route matching on them would match what the app never sees.
const NOT_MATCHED: [(&str, &str); 11] = [
    ("host", "match the host with `hosts`"),
    ("connection", "a hop-by-hop header never reaches the app"),
    ("keep-alive", "a hop-by-hop header never reaches the app"),
    (
        "proxy-connection",
        "a hop-by-hop header never reaches the app",
    ),
    ("te", "a hop-by-hop header never reaches the app"),
    (
        "transfer-encoding",
        "a hop-by-hop header never reaches the app",
    ),
    ("upgrade", "a hop-by-hop header never reaches the app"),
    (
        "proxy-authenticate",
        "a hop-by-hop header never reaches the app",
    ),
    (
        "proxy-authorization",
        "a hop-by-hop header never reaches the app",
    ),
    ("trailer", "a hop-by-hop header never reaches the app"),
    (
        "http2-settings",
        "a hop-by-hop header never reaches the app",
    ),
];

/// The headers naming the client's address or the original request
/// (`X-Forwarded-*`, `Forwarded`, `X-Real-IP`, ...), which sluice rewrites
/// before forwarding when no trusted proxy sent them.
fn is_address_claim(name: &HeaderName) -> bool {
    use crate::proxy::headers::{is_claim, X_FORWARDED_HOST, X_FORWARDED_PROTO};
    use crate::subject::resolve::X_FORWARDED_FOR;
    is_claim(name) || [&X_FORWARDED_FOR, &X_FORWARDED_HOST, &X_FORWARDED_PROTO].contains(&name)
}

pub fn hosts(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<ScalarList>,
) -> Option<Vec<HostPattern>> {
    let Some(raw) = raw else {
        return Some(Vec::new());
    };
    let items = super::matcher::list(path, raw);
    if items.is_empty() {
        cx.error(
            path,
            At::Value,
            "an empty list matches nothing; leave `hosts` out to match any host",
        );
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (at, s) in &items {
        match cx.value(at, s, host_pattern) {
            Some(p) if !out.contains(&p) => out.push(p),
            Some(_) => {}
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// `api.example.com`, `*.example.com` (one or more labels below
/// `example.com`), an IPv4 address or a bracketed IPv6 literal; no port.
fn host_pattern(s: &str) -> Result<HostPattern, String> {
    let written = s;
    let s = s.trim().to_ascii_lowercase();
    let (below, name) = match s.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, s.as_str()),
    };
    if name.contains('*') {
        return Err(format!(
            "`{written}`: `*` stands only for the labels before a name, as in `*.example.com`"
        ));
    }
    if let Some(literal) = name.strip_prefix('[') {
        let valid = literal
            .strip_suffix(']')
            .is_some_and(|l| l.parse::<std::net::Ipv6Addr>().is_ok());
        return match (valid, below) {
            (true, false) => Ok(HostPattern::Exact(name.into())),
            (true, true) => Err(format!("`{written}`: an address has no names below it")),
            (false, _) => Err(format!(
                "`{written}` is not an IPv6 address in brackets (the port is not matched)"
            )),
        };
    }
    if name.contains(':') {
        return Err(format!(
            "`{written}`: hosts match without the port; leave `:PORT` out"
        ));
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(label_ok) {
        return Err(format!(
            "`{written}` is not a host name (`api.example.com`, `*.example.com`)"
        ));
    }
    Ok(if below {
        HostPattern::Below(format!(".{name}").into())
    } else {
        HostPattern::Exact(name.into())
    })
}

pub fn headers(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<Mapping>,
) -> Option<Vec<(HeaderName, Wanted)>> {
    let Some(map) = raw else {
        return Some(Vec::new());
    };
    let mut out: Vec<(HeaderName, Wanted)> = Vec::with_capacity(map.len());
    let mut ok = true;
    for (key, value) in map {
        let Some(text) = scalar_text(&key) else {
            cx.error(path, At::Key, "a header's name is text");
            ok = false;
            continue;
        };
        let at = path.key(&text);
        let name = match HeaderName::from_bytes(text.trim().as_bytes()) {
            Ok(name) => name,
            Err(_) => {
                cx.error(&at, At::Key, format!("`{text}` is not a valid header name"));
                ok = false;
                continue;
            }
        };
        if let Some((_, why)) = NOT_MATCHED.iter().find(|(n, _)| *n == name.as_str()) {
            cx.error(&at, At::Key, format!("`{text}`: {why}"));
            ok = false;
            continue;
        }
        if is_address_claim(&name) {
            cx.error(
                &at,
                At::Key,
                format!("`{text}`: sluice rewrites or removes this header unless a trusted proxy sent it, so the app would not see what the route matched"),
            );
            ok = false;
            continue;
        }
        if out.iter().any(|(n, _)| *n == name) {
            cx.error(
                &at,
                At::Key,
                format!("`{text}` is written twice (header names match in any case)"),
            );
            ok = false;
            continue;
        }
        match wanted(cx, &at, &value, header_value) {
            Some(w) => out.push((name, w)),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// Refuses a route matching on a header some route's tiers are chosen by:
/// sluice removes it from every request its `trusted_from` did not send,
/// so a client could pick the route by a header the app never sees.
pub fn not_on_tier_headers(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    routes: &[Route],
    default: Option<&Route>,
) {
    let tier_headers: Vec<&HeaderName> = routes
        .iter()
        .chain(default)
        .filter_map(|r| r.tiers.as_ref()?.header())
        .collect();
    for (i, route) in routes.iter().enumerate() {
        for (name, _) in &route.matcher.conditions.headers {
            if tier_headers.contains(&name) {
                cx.error(
                    &path.index(i).key("match").key("headers"),
                    At::Value,
                    format!("`{name}` chooses a route's tiers: sluice removes it from requests no `trusted_from` sent, so the app would not see what the route matched"),
                );
            }
        }
    }
}

/// A header's value as parsers give it: printable, without the spaces
/// around it they take off (a value written with them would never match).
fn header_value(s: &str) -> Result<Box<[u8]>, String> {
    if HeaderValue::from_str(s).is_err() || s.bytes().any(|b| b.is_ascii_control()) {
        return Err(format!("`{s}` cannot be a header's value"));
    }
    if s.trim() != s {
        return Err(format!(
            "`{s}`: spaces around a header's value are not part of it, and would never match"
        ));
    }
    Ok(s.as_bytes().into())
}

pub fn query(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<Mapping>,
) -> Option<Vec<(Box<[u8]>, Wanted)>> {
    let Some(map) = raw else {
        return Some(Vec::new());
    };
    let mut out: Vec<(Box<[u8]>, Wanted)> = Vec::with_capacity(map.len());
    let mut ok = true;
    for (key, value) in map {
        let Some(text) = scalar_text(&key) else {
            cx.error(path, At::Key, "a parameter's name is text");
            ok = false;
            continue;
        };
        let at = path.key(&text);
        let name = query::fold_written(&text);
        if name.is_empty() {
            cx.error(&at, At::Key, "a parameter's name cannot be empty");
            ok = false;
            continue;
        }
        if out.iter().any(|(n, _)| *n == name) {
            cx.error(
                &at,
                At::Key,
                format!("`{text}` is written twice (names match in any case, and `.`, `_` and a space are one character in them)"),
            );
            ok = false;
            continue;
        }
        match wanted(cx, &at, &value, |s| Ok(s.as_bytes().into())) {
            Some(w) => out.push((name, w)),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// A value (`gold`, `2`), or `{ present: true }`.
fn wanted(
    cx: &mut Checker<'_>,
    at: &KeyPath,
    value: &Value,
    parse: impl FnOnce(&str) -> Result<Box<[u8]>, String>,
) -> Option<Wanted> {
    if let Some(text) = scalar_text(value) {
        return match parse(&text) {
            Ok(v) => Some(Wanted::Value(v)),
            Err(message) => {
                cx.error(at, At::Value, message);
                None
            }
        };
    }
    let present = match value {
        Value::Mapping(m) if m.len() == 1 => m.get("present"),
        _ => None,
    };
    match present.and_then(scalar_text).as_deref() {
        Some("true") => Some(Wanted::Present),
        Some(_) => {
            cx.error(
                &at.key("present"),
                At::Value,
                "only `present: true` is matched (leave the condition out to match without it)",
            );
            None
        }
        None => {
            cx.error(
                at,
                At::Value,
                "expected a value to match exactly, or `{ present: true }`",
            );
            None
        }
    }
}

fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns() {
        for (s, want) in [
            (
                "api.example.com",
                HostPattern::Exact("api.example.com".into()),
            ),
            (
                "API.Example.com.",
                HostPattern::Exact("api.example.com".into()),
            ),
            ("*.example.com", HostPattern::Below(".example.com".into())),
            ("10.0.0.1", HostPattern::Exact("10.0.0.1".into())),
            ("[::1]", HostPattern::Exact("[::1]".into())),
            ("localhost", HostPattern::Exact("localhost".into())),
        ] {
            assert_eq!(host_pattern(s), Ok(want), "{s}");
        }
        for s in [
            "*",
            "*.",
            "a.*.com",
            "*example.com",
            "**.example.com",
            "api.example.com:8080",
            "",
            "a..b",
            "a b.com",
            "*.[::1]",
            "[::1",
            "http://a.com",
        ] {
            assert!(host_pattern(s).is_err(), "{s}");
        }
    }
}
