//! What a route asks of a request beyond its method and path: the host it
//! names, headers, query parameters (`match: { hosts, headers, query }`),
//! all of them together.
//!
//! Checked only on the routes the path index gives (see [`super::index`]),
//! after the path matched: a table of many routes sharing hosts still
//! costs a request the routes of its path only.
//!
//! A header or query parameter a route reads is refused when sent with two
//! values before any route is chosen ([`Ambiguous`]): the app reads one of
//! them, and sluice cannot know which; matching as if it held either (or
//! neither) would let a client choose the looser route.

use http::header::{HeaderMap, HeaderName, CONNECTION};

use super::query;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Conditions {
    /// Empty: any host. Otherwise one must match.
    pub hosts: Vec<HostPattern>,
    /// Every one must hold.
    pub headers: Vec<(HeaderName, Wanted)>,
    /// Every one must hold; names in the form [`query::fold_written`]
    /// gives.
    pub query: Vec<(Box<[u8]>, Wanted)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// `api.example.com`: ASCII lower-case, without a trailing dot.
    Exact(Box<str>),
    /// `*.example.com`, kept as `.example.com`: one or more labels below
    /// it, never `example.com` itself.
    Below(Box<str>),
}

/// What a header or parameter must hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wanted {
    /// Exactly these bytes (a parameter's decoded): case-sensitive.
    Value(Box<[u8]>),
    /// `{ present: true }`: sent, with any value, empty included.
    Present,
}

/// What the conditions read of a request. `Facts::default()` has nothing:
/// no route with conditions matches it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Facts<'a> {
    /// `:authority`, or `Host`, as sent (a port and a trailing dot are
    /// taken off here).
    pub host: Option<&'a str>,
    pub headers: Option<&'a HeaderMap>,
    /// The raw query, without `?`.
    pub query: Option<&'a str>,
}

/// A header or parameter a route reads, sent with more than one value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ambiguous {
    Header(HeaderName),
    Query,
}

/// Which condition a request failed, for explanations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unmet {
    Host,
    Header(HeaderName),
    Query(String),
}

impl Conditions {
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.headers.is_empty() && self.query.is_empty()
    }

    pub fn admit(&self, facts: &Facts) -> bool {
        self.unmet(facts).is_none()
    }

    /// The first condition `facts` fails, `None` when all hold.
    pub fn unmet(&self, facts: &Facts) -> Option<Unmet> {
        if !self.hosts.is_empty() {
            let matched = facts
                .host
                .map(host_name)
                .is_some_and(|host| self.hosts.iter().any(|p| p.matches(host)));
            if !matched {
                return Some(Unmet::Host);
            }
        }
        for (name, wanted) in &self.headers {
            // Sent once at most: a second copy is refused before routing.
            // One `Connection` names is removed before forwarding: the app
            // never sees it, so neither does the match.
            let value = facts
                .headers
                .filter(|h| !named_by_connection(h, name))
                .and_then(|h| h.get(name));
            let holds = match (wanted, value) {
                (_, None) => false,
                (Wanted::Present, Some(_)) => true,
                (Wanted::Value(want), Some(value)) => value.as_bytes() == &**want,
            };
            if !holds {
                return Some(Unmet::Header(name.clone()));
            }
        }
        for (name, wanted) in &self.query {
            let value = facts
                .query
                .and_then(|q| query::value_of(q, name).ok().flatten());
            let holds = match (wanted, value) {
                (_, None) => false,
                (Wanted::Present, Some(_)) => true,
                (Wanted::Value(want), Some(raw)) => query::decoded(raw).eq(want.iter().copied()),
            };
            if !holds {
                return Some(Unmet::Query(String::from_utf8_lossy(name).into_owned()));
            }
        }
        None
    }
}

/// Whether `Connection` names `name` (RFC 9110 §7.6.1: sluice removes it).
fn named_by_connection(headers: &HeaderMap, name: &HeaderName) -> bool {
    headers
        .get_all(CONNECTION)
        .iter()
        .flat_map(|v| v.as_bytes().split(|b| *b == b','))
        .any(|token| {
            token
                .trim_ascii()
                .eq_ignore_ascii_case(name.as_str().as_bytes())
        })
}

impl HostPattern {
    /// `host` as [`host_name`] gives it.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.as_bytes();
        match self {
            HostPattern::Exact(want) => host.eq_ignore_ascii_case(want.as_bytes()),
            HostPattern::Below(suffix) => {
                let suffix = suffix.as_bytes();
                host.len() > suffix.len()
                    && host[host.len() - suffix.len()..].eq_ignore_ascii_case(suffix)
            }
        }
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostPattern::Exact(host) => f.write_str(host),
            HostPattern::Below(suffix) => write!(f, "*{suffix}"),
        }
    }
}

/// The host of an authority (`Host` or `:authority`, already checked to be
/// `host[:port]`): the port taken off, and one trailing dot (`example.com.`
/// is the same name, and Django and nginx read it so). An IPv6 literal
/// keeps its brackets.
pub fn host_name(authority: &str) -> &str {
    let host = match authority.strip_prefix('[') {
        Some(rest) => match rest.find(']') {
            Some(end) => &authority[..end + 2],
            None => authority,
        },
        None => authority
            .rsplit_once(':')
            .map_or(authority, |(host, _port)| host),
    };
    host.strip_suffix('.').unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn exact(h: &str) -> HostPattern {
        HostPattern::Exact(h.into())
    }

    fn below(h: &str) -> HostPattern {
        HostPattern::Below(h.into())
    }

    #[test]
    fn the_host_is_read_without_its_port_or_a_trailing_dot() {
        for (authority, host) in [
            ("api.example.com", "api.example.com"),
            ("api.example.com:8080", "api.example.com"),
            ("api.example.com.", "api.example.com"),
            ("api.example.com.:443", "api.example.com"),
            ("API.Example.COM:", "API.Example.COM"),
            ("[::1]:8080", "[::1]"),
            ("[::1]", "[::1]"),
            ("10.0.0.1:80", "10.0.0.1"),
        ] {
            assert_eq!(host_name(authority), host, "{authority}");
        }
    }

    #[test]
    fn hosts_match_in_any_case_and_wildcards_only_below() {
        let facts = |host| Facts {
            host: Some(host),
            ..Facts::default()
        };
        let api = Conditions {
            hosts: vec![exact("api.example.com"), below(".example.org")],
            ..Conditions::default()
        };
        for host in [
            "api.example.com",
            "API.EXAMPLE.COM:8443",
            "api.example.com.",
            "a.example.org",
            "a.b.Example.ORG",
        ] {
            assert!(api.admit(&facts(host)), "{host}");
        }
        for host in [
            "example.com",
            "xapi.example.com",
            "api.example.com.evil",
            "example.org",
            ".example.org",
            "aexample.org",
        ] {
            assert!(!api.admit(&facts(host)), "{host}");
        }
        assert!(!api.admit(&Facts::default()));
        assert!(Conditions::default().admit(&Facts::default()));
    }

    #[test]
    fn headers_match_exactly_or_by_presence() {
        let tenant = HeaderName::from_static("x-tenant");
        let key = HeaderName::from_static("x-api-key");
        let c = Conditions {
            headers: vec![
                (tenant.clone(), Wanted::Value(b"gold"[..].into())),
                (key.clone(), Wanted::Present),
            ],
            ..Conditions::default()
        };
        let with = |pairs: &[(&HeaderName, &'static str)]| {
            let mut h = HeaderMap::new();
            for (n, v) in pairs {
                h.append((*n).clone(), HeaderValue::from_static(v));
            }
            h
        };
        let check = |h: &HeaderMap| {
            c.unmet(&Facts {
                headers: Some(h),
                ..Facts::default()
            })
        };
        assert_eq!(check(&with(&[(&tenant, "gold"), (&key, "")])), None);
        assert_eq!(check(&with(&[(&tenant, "gold"), (&key, "k")])), None);
        assert_eq!(
            check(&with(&[(&tenant, "Gold"), (&key, "k")])),
            Some(Unmet::Header(tenant.clone()))
        );
        assert_eq!(
            check(&with(&[(&tenant, "gold")])),
            Some(Unmet::Header(key.clone()))
        );
        assert_eq!(check(&with(&[])), Some(Unmet::Header(tenant.clone())));
        // Named by `Connection`, it is removed before the app sees it.
        let connection = http::header::CONNECTION;
        assert_eq!(
            check(&with(&[
                (&tenant, "gold"),
                (&key, "k"),
                (&connection, "keep-alive, X-API-Key")
            ])),
            Some(Unmet::Header(key))
        );
    }

    #[test]
    fn query_parameters_match_as_the_app_decodes_them() {
        let c = Conditions {
            query: vec![
                (
                    query::fold_written("version"),
                    Wanted::Value(b"2"[..].into()),
                ),
                (query::fold_written("debug"), Wanted::Present),
            ],
            ..Conditions::default()
        };
        let check = |q: &'static str| {
            c.admit(&Facts {
                query: Some(q),
                ..Facts::default()
            })
        };
        for q in [
            "version=2&debug",
            "%76ersion=%32&debug=0",
            "debug=&versio%6e=2&version=2",
            "x=1;version=2;debug=1",
        ] {
            assert!(check(q), "{q}");
        }
        for q in [
            "version=2",
            "debug&version=3",
            "debug&version=2&version=3",
            "debug&version=Two",
        ] {
            assert!(!check(q), "{q}");
        }
        assert!(check("debug&Version=2"), "any case, as ASP.NET reads names");
    }
}
