//! `on_failure: local` and `store.local_share`: parsed, defaulted, and
//! refused where they could not work.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use super::*;

const REDIS: &str = "\
version: 1
server:
  listen: 127.0.0.1:8080
upstream:
  url: http://127.0.0.1:3000
identity:
  pseudonym_key: \"0123456789abcdef0123456789abcdef\"
store:
  kind: redis
  url: redis://127.0.0.1:6379
";

const POLICIES: &str = "\
policies:
  api: { algorithm: fixed-window, limit: 30, window: 1m }
  login: { algorithm: token-bucket, capacity: 5, refill_every: 10s, on_failure: local }
default: { policy: api, subject: client_ip }
";

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse(Path::new("test.yaml"), text)
}

fn errors(text: &str) -> Vec<String> {
    match parse(text) {
        Ok(_) => panic!("should be refused:\n{text}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

fn policy_on_failure(c: &Config, name: &str) -> Option<OnFailure> {
    c.live
        .policies
        .iter()
        .find(|p| &*p.name == name)
        .and_then(|p| p.on_failure)
}

#[test]
fn local_share_defaults_to_one_and_policies_override_the_store() {
    let c =
        parse(&format!("{REDIS}  on_failure: allow\n{POLICIES}")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.live.store.on_failure, OnFailure::Allow);
    assert_eq!(c.live.store.local_share, NonZeroU32::MIN);
    assert_eq!(policy_on_failure(&c, "api"), None);
    assert_eq!(policy_on_failure(&c, "login"), Some(OnFailure::Local));

    let c = parse(&format!(
        "{REDIS}  on_failure: local\n  local_share: 3\n{POLICIES}"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.live.store.on_failure, OnFailure::Local);
    assert_eq!(c.live.store.local_share.get(), 3);
}

#[test]
fn on_failure_changes_no_revision() {
    let revision = |extra: &str| {
        let text = format!(
            "{REDIS}policies:\n  api: {{ algorithm: fixed-window, limit: 30, window: 1m{extra} }}\n\
             default: {{ policy: api, subject: client_ip }}\n"
        );
        let c = parse(&text).unwrap_or_else(|e| panic!("{e}"));
        c.live.policies[0].revision.to_string()
    };
    assert_eq!(revision(""), revision(", on_failure: deny"));
}

#[test]
fn bad_values_are_named() {
    let e = errors(&format!("{REDIS}  on_failure: fallback\n{POLICIES}"));
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(
        e[0].starts_with("test.yaml:11:15: store.on_failure: "),
        "{}",
        e[0]
    );
    assert!(e[0].contains("expected deny, allow or local"), "{}", e[0]);

    let e = errors(&format!(
        "{REDIS}  on_failure: local\n  local_share: 0\n{POLICIES}"
    ));
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(
        e[0].starts_with("test.yaml:12:16: store.local_share: "),
        "{}",
        e[0]
    );

    let text = format!(
        "{REDIS}policies:\n  api: {{ algorithm: gcra, limit: 3, window: 1s, on_failure: maybe }}\n"
    );
    let e = errors(&text);
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(e[0].contains("policies.api.on_failure: "), "{}", e[0]);
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/config")
        .join(name)
}

fn fixture_errors(name: &str) -> Vec<String> {
    let path = fixture(name);
    let text = std::fs::read_to_string(&path).expect("fixture is readable");
    match Config::parse(&path, &text) {
        Ok(_) => panic!("{name} should be refused"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn local_needs_a_shared_store() {
    let e = fixture_errors("local_on_memory.yaml");
    assert_eq!(e.len(), 1, "{e:#?}");
    let at = format!(
        "{}:8:15: store.on_failure: ",
        fixture("local_on_memory.yaml").display()
    );
    assert!(e[0].starts_with(&at), "{} !~ {at}", e[0]);
    assert!(e[0].contains("only to `kind: redis`"), "{}", e[0]);

    // On a policy too, at the policy's key.
    let text = "version: 1
server: { listen: 127.0.0.1:8080 }
upstream: { url: http://127.0.0.1:3000 }
policies:
  api: { algorithm: fixed-window, limit: 3, window: 1s, on_failure: local }
default: { policy: api, subject: client_ip }
";
    let e = errors(text);
    assert_eq!(e.len(), 1, "{e:#?}");
    assert!(
        e[0].starts_with("test.yaml:5:69: policies.api.on_failure: "),
        "{}",
        e[0]
    );
}

#[test]
fn local_share_without_local_is_refused() {
    let e = fixture_errors("local_share_unused.yaml");
    assert_eq!(e.len(), 1, "{e:#?}");
    let at = format!(
        "{}:10:3: store.local_share: ",
        fixture("local_share_unused.yaml").display()
    );
    assert!(e[0].starts_with(&at), "{} !~ {at}", e[0]);
    assert!(e[0].contains("only with `on_failure: local`"), "{}", e[0]);

    // A policy using `local` is enough.
    parse(&format!("{REDIS}  local_share: 3\n{POLICIES}")).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn the_route_table_shows_each_limits_failure_policy_and_local_quota() {
    let c = parse(&format!(
        "{REDIS}  on_failure: allow\n  local_share: 2\n{POLICIES}routes:\n  - {{ name: login, policy: login }}\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let table = c.route_table();
    let row = |name: &str| {
        table
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name} in:\n{table}"))
            .to_owned()
    };
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|h| h.contains(" ON_FAILURE ")),
        "{table}"
    );
    // Its own `local`, capacity and refill divided by 2.
    assert!(row("login").contains(" local ÷2: 2 (+1/20s) "), "{table}");
    // The store's `allow`.
    assert!(row("default").contains(" allow "), "{table}");
}
