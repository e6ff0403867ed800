//! `subject`: who a limit counts. One source, a list tried in order (the
//! first present counts), or `{ all: [...] }`, the combination of
//! several.

use http::HeaderName;

use super::check::Checker;
use super::route::Reads;
use crate::config::locate::{At, KeyPath};
use crate::config::raw::{Scalar, ScalarList, SubjectItem, Subjects};
use crate::config::Underscores;
use crate::route::SubjectSource;

const KINDS: &str = "client_ip, header:NAME, jwt:CLAIM, global or { all: [...] }";

pub fn subjects(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<Subjects>,
    reads: Reads,
) -> Option<Vec<SubjectSource>> {
    let items: Vec<(KeyPath, SubjectItem)> = match raw {
        None => return Some(vec![SubjectSource::ClientIp]),
        Some(Subjects::One(item)) => vec![(path.clone(), item)],
        Some(Subjects::Many(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, item)| (path.index(i), item))
            .collect(),
    };
    if items.is_empty() {
        cx.error(
            path,
            At::Value,
            format!("needs at least one subject ({KINDS})"),
        );
        return None;
    }
    let several = items.len() > 1;
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (p, item) in &items {
        let source = match item {
            SubjectItem::Source(s) => one(cx, p, s, reads),
            SubjectItem::All(parts) => all(cx, &p.key("all"), parts.clone(), reads),
        };
        match source {
            Some(SubjectSource::Global) if several => {
                cx.error(
                    p,
                    At::Value,
                    "`global` is the route's one bucket, whoever asks: it stands alone, not in a list of subjects",
                );
                ok = false;
            }
            Some(source) => out.push(source),
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// One source at `p`, refused where no request could carry it.
fn one(cx: &mut Checker<'_>, p: &KeyPath, s: &Scalar, reads: Reads) -> Option<SubjectSource> {
    let source = cx.value(p, s, subject)?;
    match &source {
        SubjectSource::Header(name)
            if name.as_str().contains('_') && reads.underscores != Underscores::Allow =>
        {
            let fate = if reads.underscores == Underscores::Drop {
                "removed from every request (`server.headers_with_underscores: drop`, the default)"
            } else {
                "refused (`server.headers_with_underscores: reject`)"
            };
            cx.error(
                p,
                At::Value,
                format!(
                    "header names with `_` are {fate}, so no request would carry `{name}`; write the name with `-`, or set `server.headers_with_underscores: allow`"
                ),
            );
            None
        }
        SubjectSource::Jwt { .. } if !reads.jwt => {
            cx.error(
                p,
                At::Value,
                "needs `identity.jwt`: only the claims of a verified token are read",
            );
            None
        }
        _ => Some(source),
    }
}

/// `{ all: [...] }` at `at`: two or more different sources, none of them
/// `global` (everyone: it would add nothing) or a combination.
fn all(
    cx: &mut Checker<'_>,
    at: &KeyPath,
    raw: Option<ScalarList>,
    reads: Reads,
) -> Option<SubjectSource> {
    let items: Vec<(KeyPath, Scalar)> = match raw {
        None => {
            cx.missing(at);
            return None;
        }
        Some(ScalarList::One(s)) => vec![(at.clone(), s)],
        Some(ScalarList::Many(v)) => v
            .into_iter()
            .enumerate()
            .map(|(i, s)| (at.index(i), s))
            .collect(),
    };
    if items.len() < 2 {
        cx.error(
            at,
            At::Value,
            "combines two or more subjects; one alone is written as itself",
        );
        return None;
    }
    let mut parts: Vec<SubjectSource> = Vec::with_capacity(items.len());
    let mut ok = true;
    for (p, s) in &items {
        match one(cx, p, s, reads) {
            Some(SubjectSource::Global) => {
                cx.error(
                    p,
                    At::Value,
                    "`global` is everyone: combined with another subject it adds nothing",
                );
                ok = false;
            }
            Some(part) if parts.contains(&part) => {
                cx.error(
                    p,
                    At::Value,
                    format!("`{part}` is already in this combination"),
                );
                ok = false;
            }
            Some(part) => parts.push(part),
            None => ok = false,
        }
    }
    ok.then(|| SubjectSource::All(parts.into_boxed_slice()))
}

fn subject(s: &str) -> Result<SubjectSource, String> {
    match s {
        "client_ip" => return Ok(SubjectSource::ClientIp),
        "global" => return Ok(SubjectSource::Global),
        _ => {}
    }
    if let Some(claim) = s.strip_prefix("jwt:") {
        let claim = claim.trim();
        if claim.is_empty() {
            return Err("`jwt:` names a claim: `jwt:sub`".to_owned());
        }
        return Ok(SubjectSource::jwt(claim));
    }
    let Some(name) = s.strip_prefix("header:") else {
        return Err(format!("unknown subject `{s}`; expected {KINDS}"));
    };
    // HeaderName stores names lower-case, as HTTP/2 sends them.
    HeaderName::from_bytes(name.trim().as_bytes())
        .map(SubjectSource::Header)
        .map_err(|_| format!("`{name}` is not a valid header name"))
}
