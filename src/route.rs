//! The compiled route table: the first route in file order whose methods and
//! path match wins; `default` takes the rest.
//!
//! Matching allocates nothing: paths are compared segment by segment against
//! the matchers compiled once by `config::validate`. A table of more than a
//! few routes also holds an [`index::Index`], so a request checks only the
//! routes that could match its path.

mod index;

use std::sync::Arc;

use http::{HeaderName, Method};

use crate::config::{Live, PathMatch, Route, Segment, SubjectSource};
use crate::limit::Policy;
use crate::proxy::respond::Prepared;
use crate::telemetry::RouteMetrics;

#[derive(Debug)]
pub struct RouteTable {
    routes: Vec<Entry>,
    default: Entry,
    /// `None` for a table small enough to scan.
    index: Option<index::Index>,
    /// Every header a subject is read from, in any route: a request
    /// carrying one of them twice is refused before routing.
    identity_headers: Vec<HeaderName>,
}

/// A route, the metric handles counted under its name, and what its own
/// answers need, all built when the configuration loads.
#[derive(Debug)]
pub struct Entry {
    pub route: Route,
    pub metrics: RouteMetrics,
    /// `None` exactly when the route says `policy: none`.
    pub limited: Option<Limited>,
}

/// A limited route's policy and its prepared responses.
#[derive(Debug)]
pub struct Limited {
    pub policy: Arc<Policy>,
    pub responses: Prepared,
}

impl Entry {
    fn new(route: &Route) -> Entry {
        let policy = route.policy.as_ref().map(|p| &*p.name);
        Entry {
            metrics: RouteMetrics::new(&route.name, policy),
            limited: route.policy.as_ref().map(|policy| Limited {
                responses: Prepared::new(route, policy),
                policy: policy.clone(),
            }),
            route: route.clone(),
        }
    }
}

impl RouteTable {
    pub fn new(live: &Live) -> RouteTable {
        RouteTable::from_routes(&live.routes, &live.default)
    }

    fn from_routes(routes: &[Route], default: &Route) -> RouteTable {
        let mut identity_headers: Vec<HeaderName> = Vec::new();
        for route in routes.iter().chain(std::iter::once(default)) {
            for source in &route.subject {
                if let SubjectSource::Header(name) = source {
                    if !identity_headers.contains(name) {
                        identity_headers.push(name.clone());
                    }
                }
            }
        }
        RouteTable {
            index: (routes.len() >= index::SCAN_BELOW).then(|| index::Index::new(routes)),
            routes: routes.iter().map(Entry::new).collect(),
            default: Entry::new(default),
            identity_headers,
        }
    }

    pub fn identity_headers(&self) -> &[HeaderName] {
        &self.identity_headers
    }

    /// `path` is the request path without the query, in its matching form
    /// ([`crate::path::normalize`]).
    pub fn find(&self, method: &Method, path: &str) -> &Entry {
        let matching = |i: usize| matches(&self.routes[i].route, method, path);
        let found = match &self.index {
            Some(index) => index.first(path, matching),
            None => (0..self.routes.len()).find(|&i| matching(i)),
        };
        found.map_or(&self.default, |i| &self.routes[i])
    }
}

fn matches(route: &Route, method: &Method, path: &str) -> bool {
    let m = &route.matcher;
    if !m.methods.is_empty() && !method_matches(&m.methods, method) {
        return false;
    }
    let eq = if m.case_sensitive {
        eq_exact
    } else {
        eq_ignore_case
    };
    match &m.path {
        PathMatch::Any => true,
        PathMatch::Exact(p) => exact_matches(p, path, eq),
        PathMatch::Prefix(p) => prefix_matches(p, path, eq),
        PathMatch::Template(segments) => template_matches(segments, path, eq),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Match;

    fn route(name: &str, methods: &[Method], path: PathMatch) -> Route {
        Route {
            name: Arc::from(name),
            matcher: Match {
                methods: methods.to_vec(),
                path,
                case_sensitive: true,
            },
            subject: vec![SubjectSource::ClientIp],
            policy: None,
            cost: 1,
            upgrades: Arc::from(Vec::new()),
        }
    }

    fn table(routes: Vec<Route>) -> RouteTable {
        RouteTable::from_routes(&routes, &route("default", &[], PathMatch::Any))
    }

    fn lit(s: &str) -> Segment {
        Segment::Literal(s.to_owned())
    }

    #[test]
    fn prefix_is_segment_aware() {
        let t = table(vec![route("api", &[], PathMatch::Prefix("/api".into()))]);
        for (path, want) in [
            ("/api", "api"),
            ("/api/", "api"),
            ("/api/v1/x", "api"),
            ("/apix", "default"),
            ("/ap", "default"),
            ("/", "default"),
        ] {
            assert_eq!(&*t.find(&Method::GET, path).route.name, want, "{path}");
        }
    }

    #[test]
    fn root_prefix_matches_everything() {
        let t = table(vec![route("all", &[], PathMatch::Prefix("/".into()))]);
        assert_eq!(&*t.find(&Method::GET, "/anything/at/all").route.name, "all");
    }

    #[test]
    fn methods_and_exact_paths() {
        let t = table(vec![route(
            "login",
            &[Method::POST],
            PathMatch::Exact("/login".into()),
        )]);
        assert_eq!(&*t.find(&Method::POST, "/login").route.name, "login");
        assert_eq!(&*t.find(&Method::GET, "/login").route.name, "default");
        // One trailing slash is the same resource to most apps.
        assert_eq!(&*t.find(&Method::POST, "/login/").route.name, "login");
        assert_eq!(&*t.find(&Method::POST, "/login/x").route.name, "default");
        assert_eq!(&*t.find(&Method::POST, "/loginx").route.name, "default");
        let root = table(vec![route("root", &[], PathMatch::Exact("/".into()))]);
        assert_eq!(&*root.find(&Method::GET, "/").route.name, "root");
        assert_eq!(&*root.find(&Method::GET, "//").route.name, "default");
    }

    #[test]
    fn a_get_route_also_limits_head() {
        let t = table(vec![
            route("get", &[Method::GET], PathMatch::Exact("/get".into())),
            route("head", &[Method::HEAD], PathMatch::Exact("/head".into())),
        ]);
        assert_eq!(&*t.find(&Method::HEAD, "/get").route.name, "get");
        assert_eq!(&*t.find(&Method::HEAD, "/head").route.name, "head");
        assert_eq!(&*t.find(&Method::GET, "/head").route.name, "default");
    }

    #[test]
    fn case_insensitive_routes_match_any_letter_case() {
        let mut login = route("login", &[], PathMatch::Exact("/Login".into()));
        login.matcher.case_sensitive = false;
        let mut api = route("api", &[], PathMatch::Prefix("/api".into()));
        api.matcher.case_sensitive = false;
        let mut user = route(
            "user",
            &[],
            PathMatch::Template(vec![lit("users"), Segment::Param("id".into())]),
        );
        user.matcher.case_sensitive = false;
        let sensitive = route("exact", &[], PathMatch::Exact("/Exact".into()));
        let t = table(vec![login, api, user, sensitive]);
        for (path, want) in [
            ("/login", "login"),
            ("/LOGIN/", "login"),
            ("/API/v1", "api"),
            ("/Users/7", "user"),
            ("/Exact", "exact"),
            ("/exact", "default"),
            ("/apix", "default"),
        ] {
            assert_eq!(&*t.find(&Method::GET, path).route.name, want, "{path}");
        }
    }

    #[test]
    fn templates_capture_exactly_one_segment() {
        let segments = vec![lit("users"), Segment::Param("id".into()), lit("posts")];
        let t = table(vec![route("posts", &[], PathMatch::Template(segments))]);
        assert_eq!(
            &*t.find(&Method::GET, "/users/42/posts").route.name,
            "posts"
        );
        assert_eq!(
            &*t.find(&Method::GET, "/users/42/posts/").route.name,
            "posts"
        );
        for path in [
            "/users//posts",
            "/users/42",
            "/users/42/posts/1",
            "/users/4/2/posts",
            "/users/42/posts//",
        ] {
            assert_eq!(&*t.find(&Method::GET, path).route.name, "default", "{path}");
        }
    }

    #[test]
    fn first_match_in_file_order_wins() {
        let t = table(vec![
            route("specific", &[], PathMatch::Exact("/api/login".into())),
            route("api", &[], PathMatch::Prefix("/api".into())),
            route("never", &[], PathMatch::Exact("/api/login".into())),
        ]);
        assert_eq!(&*t.find(&Method::GET, "/api/login").route.name, "specific");
        assert_eq!(&*t.find(&Method::GET, "/api/other").route.name, "api");
    }
}
