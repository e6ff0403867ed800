//! The compiled route table: the first route in file order whose methods and
//! path match wins; `default` takes the rest.
//!
//! Matching allocates nothing: paths are compared segment by segment against
//! the matchers compiled once by `config::validate`.

use std::sync::Arc;

use http::Method;

use crate::config::{Config, PathMatch, Route, Segment};
use crate::limit::Policy;
use crate::proxy::respond::Prepared;
use crate::telemetry::RouteMetrics;

#[derive(Debug)]
pub struct RouteTable {
    routes: Vec<Entry>,
    default: Entry,
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
    pub fn new(config: &Config) -> RouteTable {
        RouteTable::from_routes(&config.routes, &config.default)
    }

    fn from_routes(routes: &[Route], default: &Route) -> RouteTable {
        RouteTable {
            routes: routes.iter().map(Entry::new).collect(),
            default: Entry::new(default),
        }
    }

    /// `path` is the request path without the query.
    pub fn find(&self, method: &Method, path: &str) -> &Entry {
        self.routes
            .iter()
            .find(|entry| matches(&entry.route, method, path))
            .unwrap_or(&self.default)
    }
}

fn matches(route: &Route, method: &Method, path: &str) -> bool {
    let m = &route.matcher;
    if !m.methods.is_empty() && !m.methods.contains(method) {
        return false;
    }
    match &m.path {
        PathMatch::Any => true,
        PathMatch::Exact(p) => path == p,
        PathMatch::Prefix(p) => prefix_matches(p, path),
        PathMatch::Template(segments) => template_matches(segments, path),
    }
}

/// Segment-aware: `/api` matches `/api`, `/api/` and `/api/x`, never `/apix`.
fn prefix_matches(prefix: &str, path: &str) -> bool {
    if prefix == "/" {
        return path.starts_with('/');
    }
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// `/users/{id}` matches `/users/42` but not `/users`, `/users/` or
/// `/users/42/x`: a parameter is exactly one non-empty segment.
fn template_matches(segments: &[Segment], path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    let mut parts = rest.split('/');
    for segment in segments {
        match (segment, parts.next()) {
            (Segment::Literal(lit), Some(part)) if part == lit => {}
            (Segment::Param(_), Some(part)) if !part.is_empty() => {}
            _ => return false,
        }
    }
    parts.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Match, SubjectSource};

    fn route(name: &str, methods: &[Method], path: PathMatch) -> Route {
        Route {
            name: Arc::from(name),
            matcher: Match {
                methods: methods.to_vec(),
                path,
            },
            subject: vec![SubjectSource::ClientIp],
            policy: None,
            cost: 1,
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
        assert_eq!(&*t.find(&Method::POST, "/login/").route.name, "default");
    }

    #[test]
    fn templates_capture_exactly_one_segment() {
        let segments = vec![lit("users"), Segment::Param("id".into()), lit("posts")];
        let t = table(vec![route("posts", &[], PathMatch::Template(segments))]);
        assert_eq!(
            &*t.find(&Method::GET, "/users/42/posts").route.name,
            "posts"
        );
        for path in [
            "/users//posts",
            "/users/42",
            "/users/42/posts/1",
            "/users/4/2/posts",
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
