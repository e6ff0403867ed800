//! What a route matches: methods and a path, compared against a request
//! path in its matching form ([`crate::path::normalize`]).
//!
//! Built by `config::validate`; matching allocates nothing: paths are
//! compared segment by segment against literals stored in matching form.

use http::Method;

#[derive(Debug, Clone)]
pub struct Match {
    /// Empty: any method. `GET` also matches `HEAD`.
    pub methods: Vec<Method>,
    /// Compared with the request path in its matching form (see
    /// [`crate::path`]); literals are stored in that form.
    pub path: PathMatch,
    /// `false`: ASCII letters compare regardless of case.
    pub case_sensitive: bool,
}

impl Default for Match {
    fn default() -> Self {
        Match {
            methods: Vec::new(),
            path: PathMatch::Any,
            case_sensitive: true,
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
    /// `path` is the request path without the query, in its matching form.
    pub fn matches(&self, method: &Method, path: &str) -> bool {
        if !self.methods.is_empty() && !method_matches(&self.methods, method) {
            return false;
        }
        let eq = if self.case_sensitive {
            eq_exact
        } else {
            eq_ignore_case
        };
        match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => exact_matches(p, path, eq),
            PathMatch::Prefix(p) => prefix_matches(p, path, eq),
            PathMatch::Template(segments) => template_matches(segments, path, eq),
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

/// For `case_sensitive: false`. Byte-wise: escapes are upper-cased by
/// normalization, and letters outside ASCII compare as written.
fn eq_ignore_case(a: &str, b: &str) -> bool {
    a.as_bytes().eq_ignore_ascii_case(b.as_bytes())
}

/// `path` without `prefix`, when it starts with it; `None` otherwise.
fn strip<'p>(path: &'p str, prefix: &str, eq: fn(&str, &str) -> bool) -> Option<&'p str> {
    let head = path.get(..prefix.len())?;
    eq(head, prefix).then(|| &path[prefix.len()..])
}

/// `/login` matches `/login` and `/login/`.
fn exact_matches(exact: &str, path: &str, eq: fn(&str, &str) -> bool) -> bool {
    match strip(path, exact, eq) {
        Some(rest) => rest.is_empty() || (rest == "/" && exact != "/"),
        None => false,
    }
}

/// Segment-aware: `/api` matches `/api`, `/api/` and `/api/x`, never `/apix`.
fn prefix_matches(prefix: &str, path: &str, eq: fn(&str, &str) -> bool) -> bool {
    if prefix == "/" {
        return path.starts_with('/');
    }
    match strip(path, prefix, eq) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// `/users/{id}` matches `/users/42` and `/users/42/` but not `/users`,
/// `/users/` or `/users/42/x`: a parameter is exactly one non-empty segment.
fn template_matches(segments: &[Segment], path: &str, eq: fn(&str, &str) -> bool) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let mut parts = rest.split('/');
    for segment in segments {
        match (segment, parts.next()) {
            (Segment::Literal(lit), Some(part)) if eq(part, lit) => {}
            (Segment::Param(_), Some(part)) if !part.is_empty() => {}
            _ => return false,
        }
    }
    parts.next().is_none()
}
