//! `match.hosts`, `match.headers` and `match.query`: parsed into the
//! conditions routes check, and refused at their keys where they could
//! never match as written.

use std::path::Path;

use http::HeaderName;

use super::*;
use crate::route::{query, Conditions, HostPattern, Route, Wanted};

const BASE: &str = "\
version: 1
server:
  listen: 127.0.0.1:8080
upstream:
  url: http://127.0.0.1:3000
policies:
  p: { algorithm: fixed-window, limit: 5, window: 1h }
routes:
";

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse(Path::new("test.yaml"), text)
}

fn route(matcher: &str) -> Route {
    let text = format!("{BASE}  - {{ name: r, policy: p, match: {matcher} }}\n");
    match parse(&text) {
        Ok(config) => config.live.routes[0].clone(),
        Err(e) => panic!("should parse:\n{e}"),
    }
}

/// Every error of a route matching `matcher`, as printed (file, line,
/// key, message).
fn errors(matcher: &str) -> Vec<String> {
    let text = format!("{BASE}  - {{ name: r, policy: p, match: {matcher} }}\n");
    match parse(&text) {
        Ok(_) => panic!("should be refused: {matcher}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn hosts_headers_and_query_are_read_beside_the_path() {
    let r = route(
        r#"{ path_prefix: /api, hosts: [API.example.com, "*.example.com"], headers: { X-Tenant: gold, X-Key: { present: true } }, query: { version: 2, debug: { present: true } } }"#,
    );
    assert_eq!(
        r.matcher.conditions,
        Conditions {
            hosts: vec![
                HostPattern::Exact("api.example.com".into()),
                HostPattern::Below(".example.com".into()),
            ],
            headers: vec![
                (
                    HeaderName::from_static("x-tenant"),
                    Wanted::Value(b"gold"[..].into())
                ),
                (HeaderName::from_static("x-key"), Wanted::Present),
            ],
            query: vec![
                (
                    query::fold_written("version"),
                    Wanted::Value(b"2"[..].into())
                ),
                (query::fold_written("debug"), Wanted::Present),
            ],
        }
    );
    // One host may be written alone.
    let r = route("{ hosts: api.example.com }");
    assert_eq!(
        r.matcher.conditions.hosts,
        vec![HostPattern::Exact("api.example.com".into())]
    );
    assert!(route("{ path: /x }").matcher.conditions.is_empty());
}

#[test]
fn conditions_that_could_never_match_are_refused_at_their_keys() {
    for (matcher, key, says) in [
        (
            r#"{ hosts: ["*"] }"#,
            "routes[0].match.hosts[0]",
            "`*` stands only",
        ),
        (
            "{ hosts: [a.*.com] }",
            "routes[0].match.hosts[0]",
            "`*` stands only",
        ),
        (
            "{ hosts: [api.example.com:8080] }",
            "routes[0].match.hosts[0]",
            "without the port",
        ),
        ("{ hosts: [] }", "routes[0].match.hosts", "matches nothing"),
        (
            r#"{ hosts: ["a b"] }"#,
            "routes[0].match.hosts[0]",
            "is not a host name",
        ),
        (
            r#"{ headers: { "": gold } }"#,
            "routes[0].match.headers",
            "not a valid header name",
        ),
        (
            r#"{ headers: { "X Tenant": gold } }"#,
            "routes[0].match.headers.X Tenant",
            "not a valid header name",
        ),
        (
            "{ headers: { Host: a.com } }",
            "routes[0].match.headers.Host",
            "`hosts`",
        ),
        (
            "{ headers: { X-Forwarded-Proto: https } }",
            "routes[0].match.headers.X-Forwarded-Proto",
            "trusted proxy",
        ),
        (
            "{ headers: { X-Real-IP: 10.0.0.1 } }",
            "routes[0].match.headers.X-Real-IP",
            "trusted proxy",
        ),
        (
            "{ headers: { Connection: close } }",
            "routes[0].match.headers.Connection",
            "hop-by-hop",
        ),
        (
            "{ headers: { X-Tenant: gold, x-tenant: silver } }",
            "routes[0].match.headers.x-tenant",
            "written twice",
        ),
        (
            r#"{ headers: { X-Tenant: " gold" } }"#,
            "routes[0].match.headers.X-Tenant",
            "spaces around",
        ),
        (
            "{ headers: { X-Tenant: { present: false } } }",
            "routes[0].match.headers.X-Tenant.present",
            "only `present: true`",
        ),
        (
            "{ headers: { X-Tenant: [a, b] } }",
            "routes[0].match.headers.X-Tenant",
            "`{ present: true }`",
        ),
        (
            "{ query: { a.b: 1, a_b: 2 } }",
            "routes[0].match.query.a_b",
            "written twice",
        ),
        (
            r#"{ query: { " ": 1 } }"#,
            "routes[0].match.query",
            "cannot be empty",
        ),
        (
            "{ query: { v: { exists: true } } }",
            "routes[0].match.query.v",
            "`{ present: true }`",
        ),
    ] {
        let errors = errors(matcher);
        assert_eq!(errors.len(), 1, "{matcher}: {errors:#?}");
        assert!(
            errors[0].contains("test.yaml:") && errors[0].contains(key) && errors[0].contains(says),
            "{matcher}: {errors:#?}"
        );
    }
}

#[test]
fn a_route_matching_on_a_tier_header_is_refused() {
    let text = format!(
        "{BASE}  - {{ name: plans, tiers: {{ header: X-Plan, trusted_from: [10.0.0.0/8], policies: {{ pro: p }}, default: p }} }}
  - {{ name: r, policy: p, match: {{ headers: {{ X-Plan: pro }} }} }}\n"
    );
    let errors: Vec<String> = match parse(&text) {
        Ok(_) => panic!("should be refused"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    };
    assert_eq!(errors.len(), 1, "{errors:#?}");
    assert!(
        errors[0].contains("routes[1].match.headers") && errors[0].contains("tiers"),
        "{errors:#?}"
    );
}
