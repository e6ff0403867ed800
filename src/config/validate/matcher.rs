//! A route's `match`: methods, the path (exact, template or prefix) and
//! the conditions beyond them ([`super::conditions`]).

use http::Method;

use super::check::{self, Checker};
use crate::config::keys;
use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, Scalar, ScalarList};
use crate::path::{self, PathRules};
use crate::route::{Conditions, Match, PathMatch, Segment};

pub(super) fn matcher(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Match,
    rules: &PathRules,
) -> Option<Match> {
    let methods = methods(cx, &path.key("methods"), raw.methods);
    let exact = raw
        .path
        .as_ref()
        .and_then(|s| cx.value(&path.key("path"), s, |s| exact_path(s, rules)));
    let prefix = raw
        .path_prefix
        .as_ref()
        .and_then(|s| cx.value(&path.key("path_prefix"), s, |s| prefix_path(s, rules)));
    let case_sensitive = cx.defaulted(
        path,
        &keys::ROUTE_MATCH_CASE_SENSITIVE,
        raw.case_sensitive.as_ref(),
        check::boolean,
    );
    let format_suffix = cx.defaulted(
        path,
        &keys::ROUTE_MATCH_FORMAT_SUFFIX,
        raw.format_suffix.as_ref(),
        check::boolean,
    );
    if raw.path.is_none() && raw.path_prefix.is_none() && format_suffix == Some(true) {
        cx.error(
            &path.key("format_suffix"),
            At::Key,
            "needs `path` or `path_prefix`: a format extends the path's last segment",
        );
    }
    let path_match = match (&raw.path, &raw.path_prefix) {
        (None, None) => Some(PathMatch::Any),
        (Some(_), None) => exact,
        (None, Some(_)) => prefix,
        (Some(_), Some(_)) => {
            cx.error(
                &path.key("path_prefix"),
                At::Key,
                "`path` and `path_prefix` exclude each other; write one",
            );
            None
        }
    };
    let hosts = super::conditions::hosts(cx, &path.key("hosts"), raw.hosts);
    let headers = super::conditions::headers(cx, &path.key("headers"), raw.headers);
    let query = super::conditions::query(cx, &path.key("query"), raw.query);
    Some(Match {
        methods: methods?,
        path: path_match?,
        case_sensitive: case_sensitive?,
        format_suffix: format_suffix?,
        conditions: Conditions {
            hosts: hosts?,
            headers: headers?,
            query: query?,
        },
    })
}

pub(super) fn list(path: &KeyPath, raw: ScalarList) -> Vec<(KeyPath, Scalar)> {
    match raw {
        ScalarList::One(s) => vec![(path.clone(), s)],
        ScalarList::Many(v) => v
            .into_iter()
            .enumerate()
            .map(|(i, s)| (path.index(i), s))
            .collect(),
    }
}

fn methods(cx: &mut Checker<'_>, path: &KeyPath, raw: Option<ScalarList>) -> Option<Vec<Method>> {
    let Some(raw) = raw else {
        return Some(Vec::new());
    };
    let items = list(path, raw);
    if items.is_empty() {
        cx.error(
            path,
            At::Value,
            "an empty list matches nothing; leave `methods` out to match any method",
        );
        return None;
    }
    let mut out: Vec<Method> = Vec::with_capacity(items.len());
    let mut ok = true;
    for (p, s) in &items {
        match cx.value(p, s, method) {
            Some(m) if !out.contains(&m) => out.push(m),
            Some(_) => {}
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// Methods are matched upper-case, as every standard method is written.
fn method(s: &str) -> Result<Method, String> {
    let upper = s.to_ascii_uppercase();
    if upper.is_empty() || !upper.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-') {
        return Err(format!("`{s}` is not an HTTP method"));
    }
    Method::from_bytes(upper.as_bytes()).map_err(|_| format!("`{s}` is not an HTTP method"))
}

fn check_path(s: &str) -> Result<(), String> {
    if !s.starts_with('/') {
        return Err(format!("`{s}` must start with `/`"));
    }
    if let Some(bad) = s
        .chars()
        .find(|c| matches!(c, '?' | '#') || c.is_whitespace())
    {
        return Err(format!(
            "`{s}` contains `{bad}`; a path has no query, fragment or spaces"
        ));
    }
    if s.contains(';') {
        return Err(format!(
            "`{s}` contains `;`; path parameters are left out of matching (server.paths.path_parameters)"
        ));
    }
    // Glob and regex syntax would be taken literally, and the route would
    // never match: requests would fall to `default` without a word.
    if let Some(bad) = s.chars().find(|c| matches!(c, '*' | '[' | ']')) {
        return Err(format!(
            "`{s}` contains `{bad}`, which is matched literally: paths are not globs or patterns; write `path_prefix: /api` for everything under /api, or a template such as `/users/{{id}}` for one segment (a path that really holds `{bad}` is written percent-encoded: {})",
            match bad {
                '*' => "`%2A`",
                '[' => "`%5B`",
                _ => "`%5D`",
            }
        ));
    }
    Ok(())
}

/// `s` in the form request paths are matched in, so `/log%69n` in the file
/// means `/login`; without its trailing slash (a route matches with or
/// without one), except the root.
fn normal_path(s: &str, rules: &PathRules) -> Result<String, String> {
    let normal = path::normalize(s, rules).map_err(|e| format!("`{s}`: {e}"))?;
    let matching = normal.matching.trim_end_matches('/');
    Ok(if matching.is_empty() { "/" } else { matching }.to_owned())
}

/// `/login` (exact) or `/users/{id}` (a template).
fn exact_path(s: &str, rules: &PathRules) -> Result<PathMatch, String> {
    // `OPTIONS *` (the server, not a resource) goes to the app only under
    // a route written for it: sluice answers it otherwise.
    if s == "*" {
        return Ok(PathMatch::Exact(s.to_owned()));
    }
    check_path(s)?;
    if !s.contains(['{', '}']) {
        return Ok(PathMatch::Exact(normal_path(s, rules)?));
    }
    let mut segments = Vec::new();
    let mut params: Vec<&str> = Vec::new();
    let body = s[1..].strip_suffix('/').unwrap_or(&s[1..]);
    for part in body.split('/') {
        match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            Some(name) => {
                let valid =
                    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !valid {
                    return Err(format!(
                        "`{{{name}}}` in `{s}`: a parameter name is letters, digits and `_`"
                    ));
                }
                if params.contains(&name) {
                    return Err(format!("`{{{name}}}` appears twice in `{s}`"));
                }
                params.push(name);
                segments.push(Segment::Param(name.to_owned()));
            }
            None if part.contains(['{', '}']) => {
                return Err(format!(
                    "`{part}` in `{s}`: a `{{name}}` parameter must be a whole segment"
                ))
            }
            None => {
                // A template is matched segment by segment: each literal
                // must stay one segment once normalized.
                let not_one = format!("`{s}`: `{part}` is not a path segment a template can match");
                if matches!(part, "" | "." | "..") {
                    return Err(not_one);
                }
                let segment = format!("/{part}");
                let normal = path::normalize(&segment, rules).map_err(|e| format!("`{s}`: {e}"))?;
                let literal = &normal.matching[1..];
                if literal.is_empty() || literal.contains('/') {
                    return Err(not_one);
                }
                segments.push(Segment::Literal(literal.to_owned()));
            }
        }
    }
    Ok(PathMatch::Template(segments))
}

/// Segment-aware prefix, kept without its trailing slash (`/` stays `/`).
fn prefix_path(s: &str, rules: &PathRules) -> Result<PathMatch, String> {
    check_path(s)?;
    if s.contains(['{', '}']) {
        return Err(format!(
            "`{s}`: `{{name}}` parameters work in `path`, not in `path_prefix`"
        ));
    }
    Ok(PathMatch::Prefix(normal_path(s, rules)?))
}
