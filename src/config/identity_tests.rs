//! `subject` combinations and `identity.jwt`: parsed into what the proxy
//! resolves, refused at their keys where they could not work.

use std::path::Path;

use super::*;
use crate::route::{Route, SubjectSource, TierBy};

const SECRET: &str = "0123456789abcdef0123456789abcdef";

fn base(identity: &str) -> String {
    format!(
        "version: 1
server: {{ listen: 127.0.0.1:8080 }}
upstream: {{ url: http://127.0.0.1:3000 }}
identity: {identity}
policies:
  api: {{ algorithm: fixed-window, limit: 5, window: 1m }}
  pro: {{ algorithm: fixed-window, limit: 50, window: 1m }}
routes:
"
    )
}

fn jwt() -> String {
    base(&format!(
        "{{ jwt: {{ secret: {SECRET}, issuer: https://auth.example, audiences: [billing] }} }}"
    ))
}

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse(Path::new("test.yaml"), text)
}

fn route(text: String) -> Route {
    match parse(&text) {
        Ok(config) => config.live.routes[0].clone(),
        Err(e) => panic!("should parse:\n{e}\n{text}"),
    }
}

fn refused(text: String, want: &str) {
    match parse(&text) {
        Ok(_) => panic!("should be refused:\n{text}"),
        Err(e) => {
            let errors: Vec<String> = e.iter().map(|e| e.to_string()).collect();
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{want} not in {errors:#?}"
            );
        }
    }
}

fn header(name: &'static str) -> SubjectSource {
    SubjectSource::Header(http::HeaderName::from_static(name))
}

#[test]
fn a_combination_is_one_source_and_may_stand_in_a_list() {
    let r = route(
        base("{}")
            + "  - { name: a, subject: { all: [client_ip, \"header:X-API-Key\"] }, policy: api }\n",
    );
    let pair = SubjectSource::All(vec![SubjectSource::ClientIp, header("x-api-key")].into());
    assert_eq!(r.limits[0].subject, std::slice::from_ref(&pair));
    assert_eq!(pair.to_string(), "{ all: [client_ip, header:x-api-key] }");

    let r = route(
        base("{}")
            + "  - name: a
    subject: [{ all: [header:X-API-Key, client_ip] }, client_ip]
    policy: api
",
    );
    assert_eq!(
        r.limits[0].subject,
        [
            SubjectSource::All(vec![header("x-api-key"), SubjectSource::ClientIp].into()),
            SubjectSource::ClientIp
        ]
    );
}

#[test]
fn combinations_that_add_nothing_are_refused_at_their_items() {
    let at = |subject: &str| {
        base("{}") + &format!("  - {{ name: a, subject: {subject}, policy: api }}\n")
    };
    refused(
        at("{ all: [client_ip] }"),
        "routes[0].subject.all: combines two or more subjects",
    );
    refused(
        at("{ all: [client_ip, global] }"),
        "routes[0].subject.all[1]: `global` is everyone",
    );
    refused(
        at("{ all: [header:X-Key, \"header:x-key\"] }"),
        "routes[0].subject.all[1]: `header:x-key` is already in this combination",
    );
    refused(
        at("{ all: [client_ip, header:X_Key] }"),
        "routes[0].subject.all[1]: header names with `_`",
    );
    refused(
        at("{ any: [client_ip, header:X-Key] }"),
        "routes[0].subject.any: unknown key `any`",
    );
    refused(
        at("[[client_ip, header:X-Key]]"),
        "a list inside a list of subjects",
    );
    refused(
        at("{ all: [client_ip, nobody] }"),
        "routes[0].subject.all[1]: unknown subject `nobody`",
    );
}

#[test]
fn jwt_subjects_and_claim_tiers_need_identity_jwt() {
    let r = route(jwt() + "  - { name: a, subject: [jwt:sub, client_ip], policy: api }\n");
    assert_eq!(
        r.limits[0].subject,
        [SubjectSource::jwt("sub"), SubjectSource::ClientIp]
    );
    let r = route(jwt() + "  - { name: a, subject: jwt:sub, tiers: { claim: plan, policies: { pro: pro }, default: api } }\n");
    assert_eq!(
        r.tiers.as_ref().map(|t| &t.by),
        Some(&TierBy::Claim("plan".into()))
    );
    let r = route(jwt() + "  - { name: a, subject: { all: [jwt:org, client_ip] }, policy: api }\n");
    assert!(r.limits[0].subject[0].reads_token());

    refused(
        base("{}") + "  - { name: a, subject: jwt:sub, policy: api }\n",
        "routes[0].subject: needs `identity.jwt`",
    );
    refused(
        jwt() + "  - { name: a, subject: \"jwt:\", policy: api }\n",
        "`jwt:` names a claim",
    );
    refused(
        jwt() + "  - { name: a, tiers: { claim: plan, trusted_from: [10.0.0.0/8], policies: { pro: pro }, default: api } }\n",
        "routes[0].tiers.trusted_from: a claim is believed for its token's signature",
    );
}

#[test]
fn identity_jwt_is_refused_at_the_key_that_is_wrong() {
    let route = "  - { name: a, subject: jwt:sub, policy: api }\n";
    refused(
        base("{ jwt: { issuer: x } }") + route,
        "identity.jwt: needs `keys_file`",
    );
    refused(
        base(&format!(
            "{{ jwt: {{ secret: {SECRET}, keys_file: /k.json }} }}"
        )) + route,
        "identity.jwt.secret: give `keys_file` or `secret`, not both",
    );
    refused(
        base("{ jwt: { secret: short } }") + route,
        "identity.jwt.secret: must be at least 32 bytes",
    );
    let missing = "/nonexistent/sluice-keys.json";
    refused(
        base(&format!("{{ jwt: {{ keys_file: {missing} }} }}")) + route,
        &format!("identity.jwt.keys_file: cannot read `{missing}`"),
    );
    refused(
        base(&format!("{{ jwt: {{ secret: {SECRET}, leeway: soon }} }}")) + route,
        "identity.jwt.leeway: `soon` is not a duration",
    );
    refused(
        base(&format!(
            "{{ jwt: {{ secret: {SECRET}, audiences: [billing, \"\"] }} }}"
        )) + route,
        "identity.jwt.audiences[1]: must not be empty",
    );
    refused(
        base(&format!(
            "{{ jwt: {{ secret: {SECRET}, audience: billing }} }}"
        )) + route,
        "identity.jwt.audience: unknown key `audience`",
    );
}
