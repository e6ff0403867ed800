//! What a route matches: methods and a path, compared against a request
//! path in its matching form ([`crate::path::normalize`]), then the
//! conditions on its host, headers and query ([`super::conditions`]).
//!
//! Built by `config::validate`; matching allocates nothing: paths are
//! compared segment by segment against literals stored in matching form.

use http::Method;

use super::conditions::{Conditions, Facts};

#[derive(Debug, Clone)]
pub struct Match {
    /// Empty: any method. `GET` also matches `HEAD`.
    pub methods: Vec<Method>,
    /// Compared with the request path in its matching form (see
    /// [`crate::path`]); literals are stored in that form.
    pub path: PathMatch,
    /// `false` (the default): ASCII letters compare regardless of case.
    /// Matching more spellings than the app routes can only over-limit;
    /// matching fewer lets `/LOGIN` through unlimited to an app that
    /// routes it to `/login` (Express, Koa, Nest, IIS).
    pub case_sensitive: bool,
    /// The path's last segment may also be followed by `.<format>`
    /// (Rails' `/login(.:format)`, Spring MVC's suffix patterns before
    /// 5.3): `/login` matches `/login.json` too.
    pub format_suffix: bool,
    /// `hosts`, `headers`, `query`: checked once method and path match.
    pub conditions: Conditions,
}

impl Default for Match {
    fn default() -> Self {
        Match {
            methods: Vec::new(),
            path: PathMatch::Any,
            case_sensitive: false,
            format_suffix: false,
            conditions: Conditions::default(),
        }
    }
}

#[derive(Debug, Clone, Default)]
pub enum PathMatch {
    #[default]
    Any,
    /// Also matches the path with one trailing slash. Stored without one
    /// (except the root `/`).
    Exact(String),
    /// Segment-aware: `/api` matches `/api` and `/api/x`, never `/apix`.
    /// Stored without a trailing slash (except the root `/`).
    Prefix(String),
    /// `/users/{id}`: segments, each literal or a `{name}` capturing one
    /// non-empty segment; one trailing slash is allowed.
    Template(Vec<Segment>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Literal(String),
    Param(String),
}

impl Match {
    /// Method, path and every condition.
    pub fn admits(&self, method: &Method, path: &str, facts: &Facts) -> bool {
        self.matches(method, path) && self.conditions.admit(facts)
    }

    /// Method and path only. `path` is the request path without the
    /// query, in its matching form.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        if !self.methods.is_empty() && !method_matches(&self.methods, method) {
            return false;
        }
        let eq = if self.case_sensitive {
            eq_exact
        } else {
            eq_ignore_case
        };
        let suffix = self.format_suffix;
        match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => exact_matches(p, path, eq, suffix),
            PathMatch::Prefix(p) => prefix_matches(p, path, eq, suffix),
            PathMatch::Template(segments) => template_matches(segments, path, eq, suffix),
        }
    }
}

/// Flask, Django, Rails and Express answer `HEAD` with the `GET` handler:
/// a `GET` route limits `HEAD` too.
fn method_matches(methods: &[Method], method: &Method) -> bool {
    methods.contains(method) || (method == Method::HEAD && methods.contains(&Method::GET))
}

fn eq_exact(a: &str, b: &str) -> bool {
    a == b
}

/// For `case_sensitive: false`, the default. Byte-wise: escapes are upper-cased by
/// normalization, and letters outside ASCII compare as written. Most
/// requests spell a path as its route does: compared as bytes first (a
/// `memcmp`), where the case-blind compare lower-cases each byte of both.
fn eq_ignore_case(a: &str, b: &str) -> bool {
    a == b || a.as_bytes().eq_ignore_ascii_case(b.as_bytes())
}

/// `path` without `prefix`, when it starts with it; `None` otherwise.
fn strip<'p>(path: &'p str, prefix: &str, eq: fn(&str, &str) -> bool) -> Option<&'p str> {
    let head = path.get(..prefix.len())?;
    eq(head, prefix).then(|| &path[prefix.len()..])
}

/// `/login` matches `/login` and `/login/`; with `suffix`, `/login.json`
/// and `/login.json/` too.
fn exact_matches(exact: &str, path: &str, eq: fn(&str, &str) -> bool, suffix: bool) -> bool {
    match strip(path, exact, eq) {
        Some(rest) => {
            let rest = if suffix && exact != "/" {
                without_format(rest)
            } else {
                rest
            };
            rest.is_empty() || (rest == "/" && exact != "/")
        }
        None => false,
    }
}

/// What follows a last segment once a `.<format>` is taken off: `rest`
/// itself when it starts with no format. A format is one or more bytes
/// other than `/` (Spring's suffix patterns take any, dots included).
fn without_format(rest: &str) -> &str {
    let Some(format) = rest.strip_prefix('.') else {
        return rest;
    };
    let end = format.find('/').unwrap_or(format.len());
    if end == 0 {
        rest
    } else {
        &format[end..]
    }
}

/// Segment-aware: `/api` matches `/api`, `/api/` and `/api/x`, never
/// `/apix`; with `suffix`, `/api.json` and `/api.json/` too.
fn prefix_matches(prefix: &str, path: &str, eq: fn(&str, &str) -> bool, suffix: bool) -> bool {
    if prefix == "/" {
        return path.starts_with('/');
    }
    match strip(path, prefix, eq) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => true,
        Some(rest) if suffix => {
            let after = without_format(rest);
            after.len() < rest.len() && (after.is_empty() || after == "/")
        }
        _ => false,
    }
}

/// `/users/{id}` matches `/users/42` and `/users/42/` but not `/users`,
/// `/users/` or `/users/42/x`: a parameter is exactly one non-empty segment.
/// With `suffix`, the last segment may carry a `.<format>`.
fn template_matches(
    segments: &[Segment],
    path: &str,
    eq: fn(&str, &str) -> bool,
    suffix: bool,
) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let mut parts = rest.split('/');
    let last = segments.len().saturating_sub(1);
    for (i, segment) in segments.iter().enumerate() {
        match (segment, parts.next()) {
            (Segment::Literal(lit), Some(part)) if eq(part, lit) => {}
            (Segment::Literal(lit), Some(part))
                if suffix
                    && i == last
                    && strip(part, lit, eq).is_some_and(|f| f.len() > 1 && f.starts_with('.')) => {}
            (Segment::Param(_), Some(part)) if !part.is_empty() => {}
            _ => return false,
        }
    }
    parts.next().is_none()
}
