//! `responses.refused` / `unavailable`, a route's own `responses:`, and a
//! policy's `headers`: read into each route's answers, and refused at
//! their keys where they could not be sent.

use std::path::Path;

use super::*;

const BASE: &str = "\
version: 1
server:
  listen: 127.0.0.1:8080
upstream:
  url: http://127.0.0.1:3000
";

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse(Path::new("test.yaml"), text)
}

fn config(rest: &str) -> Config {
    parse(&format!("{BASE}{rest}")).unwrap_or_else(|e| panic!("should parse:\n{e}"))
}

fn refused(rest: &str, want: &str) {
    let errors: Vec<String> = match parse(&format!("{BASE}{rest}")) {
        Ok(_) => panic!("should be refused:\n{rest}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    };
    assert!(
        errors.iter().any(|e| e.contains(want)),
        "{want} not in {errors:#?}"
    );
}

const ROUTES: &str = "policies:
  one: { algorithm: fixed-window, limit: 1, window: 1m }
  quiet: { algorithm: fixed-window, limit: 1, window: 1m, headers: off }
routes:
  - { name: a, policy: one }
  - { name: b, policy: quiet, responses: { refused: { status: 403 } } }
";

#[test]
fn a_routes_own_answer_replaces_the_global_one_whole_and_the_other_is_inherited() {
    let c = config(&format!(
        "responses:\n  refused: {{ status: 418, headers: {{ X-A: b }} }}\n  unavailable: {{ status: 429 }}\n{ROUTES}"
    ));
    let [a, b] = [&c.live.routes[0], &c.live.routes[1]];
    let status = |r: &crate::route::Route| r.answers.refused.as_ref().and_then(|x| x.status);
    assert_eq!(status(a).map(|s| s.as_u16()), Some(418));
    assert_eq!(a.answers.refused.as_ref().unwrap().headers.len(), 1);
    // b's own: no header of the global one.
    assert_eq!(status(b).map(|s| s.as_u16()), Some(403));
    assert!(b.answers.refused.as_ref().unwrap().headers.is_empty());
    assert_eq!(a.answers.unavailable, b.answers.unavailable);
    assert!(c.live.default.answers.unavailable.is_some());
    // `headers` of the policies.
    let announced: Vec<bool> = c
        .live
        .routes
        .iter()
        .map(|r| r.limits[0].policy.announced())
        .collect();
    assert_eq!(announced, [true, false]);
}

#[test]
fn nothing_written_keeps_sluices_own_answers() {
    let c = config(ROUTES);
    assert_eq!(c.live.routes[0].answers, Default::default());
    assert!(c.live.responses.answers.refused.is_none());
}

#[test]
fn answers_that_could_not_be_sent_are_refused_at_their_keys() {
    let with = |responses: &str| format!("responses:\n{responses}{ROUTES}");
    refused(
        &with("  refused: { content_type: text/html }\n"),
        "responses.refused.content_type: `content_type` goes with `body_file`",
    );
    refused(
        &with("  refused: { body_file: /etc/hosts }\n"),
        "responses.refused: `body_file` needs `content_type`",
    );
    refused(
        &with("  refused: { status: abc }\n"),
        "responses.refused.status: `abc` is not a status",
    );
    refused(
        &with("  refused: { status: 204 }\n"),
        "responses.refused.status: 204 cannot be this answer's status: a client error (400 to 499) or 200",
    );
    refused(
        &with("  unavailable: { status: 404 }\n"),
        "responses.unavailable.status: 404 cannot be this answer's status: a server error (500 to 599) or 429",
    );
    refused(
        &with("  refused: { headers: { X-A: b, x-a: c } }\n"),
        "responses.refused.headers.x-a: `x-a` is written twice",
    );
    refused(
        &with("  refused: { headers: { \"bad name\": b } }\n"),
        "`bad name` is not a header name",
    );
    refused(
        &with("  refused: { headers: { X-A: [1] } }\n"),
        "responses.refused.headers.X-A: expected a header's value",
    );
    for name in [
        "Transfer-Encoding",
        "RateLimit-Policy",
        "Content-Type",
        "Upgrade",
    ] {
        refused(
            &with(&format!("  refused: {{ headers: {{ {name}: x }} }}\n")),
            &format!("responses.refused.headers.{name}: "),
        );
    }
    refused(
        "policies:\n  p: { algorithm: fixed-window, limit: 1, window: 1m, headers: no }\n",
        "policies.p.headers: expected on or off, not `no`",
    );
}
