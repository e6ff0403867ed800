//! `charge`, a `cost` read from the response, `tiers` and `near_limit`:
//! parsed into what the proxy acts on, and refused at their keys where
//! they could not work.

use std::path::Path;

use super::*;
use crate::limit::LimitPolicy;
use crate::route::{Charge, Route};

const BASE: &str = "\
version: 1
server:
  listen: 127.0.0.1:8080
upstream:
  url: http://127.0.0.1:3000
identity:
  trusted_proxies: [10.0.0.0/8]
policies:
  logins: { algorithm: fixed-window, limit: 5, window: 1h }
  tokens: { algorithm: fixed-window, limit: 1000, window: 1m }
  small: { algorithm: token-bucket, capacity: 10, refill_every: 1s }
  free: { algorithm: token-bucket, capacity: 5, refill_every: 1s }
  pro: { algorithm: token-bucket, capacity: 50, refill_every: 1s, near_limit: 95% }
  in_flight: { algorithm: concurrency, limit: 4 }
";

fn parse(text: &str) -> Result<Config, ConfigErrors> {
    Config::parse(Path::new("test.yaml"), text)
}

fn route(routes: &str) -> Route {
    match parse(&format!("{BASE}routes:\n{routes}")) {
        Ok(config) => config.live.routes[0].clone(),
        Err(e) => panic!("should parse:\n{e}"),
    }
}

fn errors(routes: &str) -> Vec<String> {
    match parse(&format!("{BASE}routes:\n{routes}")) {
        Ok(_) => panic!("should be refused:\n{routes}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect(),
    }
}

fn refused(routes: &str, want: &str) {
    let errors = errors(routes);
    assert!(
        errors.iter().any(|e| e.contains(want)),
        "{want} not in {errors:#?}"
    );
}

#[test]
fn a_limit_charged_on_listed_statuses_keeps_its_cost_as_the_check() {
    let route = route(
        "  - name: login
    policy: logins
    cost: 2
    charge: { on: response, statuses: [401, 403] }
",
    );
    let limit = &route.limits[0];
    assert_eq!(limit.cost, 2);
    let on = limit.on_response().expect("charged on response");
    assert_eq!(on.statuses.as_deref(), Some(&[401, 403][..]));
    assert!(on.from_header.is_none());
    // Written as the default: charged before forwarding.
    let route = self::route("  - { name: login, policy: logins, charge: { on: request } }\n");
    assert_eq!(route.limits[0].charge, Charge::Request);
}

#[test]
fn a_cost_from_the_response_is_charged_on_response_within_its_max() {
    let route = route(
        "  - name: llm
    policy: tokens
    cost: { from_response_header: X-Tokens-Used, max: 800 }
",
    );
    let limit = &route.limits[0];
    assert_eq!(limit.cost, 1, "checked for one unit");
    let from = limit.on_response().unwrap().from_header.as_ref().unwrap();
    assert_eq!(from.header.as_str(), "x-tokens-used");
    assert_eq!(
        (from.max, from.default),
        (800, 800),
        "unknown costs are charged `max`"
    );
    let route = self::route(
        "  - name: llm
    policy: small
    cost: { from_response_header: x-cost, default: 3 }
",
    );
    let from = route.limits[0]
        .on_response()
        .unwrap()
        .from_header
        .clone()
        .unwrap();
    assert_eq!(
        (from.max, from.default),
        (10, 3),
        "max defaults to the policy's"
    );
}

#[test]
fn charges_that_could_not_work_are_refused_at_their_keys() {
    refused(
        "  - { name: a, policy: small, cost: { from_response_header: x-cost, max: 11 } }\n",
        "routes[0].cost.max: cost 11 is above the maximum 10 of policy `small`",
    );
    refused(
        "  - { name: a, policy: small, cost: { from_response_header: x-cost, max: 5, default: 6 } }\n",
        "routes[0].cost.default: default 6 is above `max` 5",
    );
    refused(
        "  - { name: a, policy: small, cost: { max: 5 } }\n",
        "routes[0].cost.from_response_header: required key is missing",
    );
    refused(
        "  - { name: a, policy: small, cost: { from_response_header: x-cost }, charge: { on: request } }\n",
        "routes[0].charge.on: a cost read from the response is charged on `response`",
    );
    refused(
        "  - { name: a, policy: small, charge: { statuses: [401] } }\n",
        "routes[0].charge.statuses: `statuses` needs `on: response`",
    );
    refused(
        "  - { name: a, policy: small, charge: { on: response, statuses: [] } }\n",
        "routes[0].charge.statuses: an empty list charges nothing",
    );
    refused(
        "  - { name: a, policy: small, charge: { on: response, statuses: [101] } }\n",
        "routes[0].charge.statuses",
    );
    refused(
        "  - { name: a, policy: small, charge: { on: later } }\n",
        "routes[0].charge.on: unknown `later`",
    );
    refused(
        "  - { name: a, policy: in_flight, charge: { on: response } }\n",
        "routes[0].charge: `charge` does not apply to concurrency policy `in_flight`",
    );
    refused(
        "  - name: a
    limits:
      - { policy: small, charge: { on: response, statuses: [429, 99999] } }
",
        "routes[0].limits[0].charge.statuses[1]",
    );
}

#[test]
fn tiers_give_one_limit_per_distinct_policy_and_a_default() {
    let route = route(
        "  - name: api
    subject: header:x-api-key
    tiers:
      header: X-Plan
      policies: { free: free, trial: free, pro: pro, enterprise: none }
      default: free
",
    );
    let tiers = route.tiers.as_ref().expect("tiers");
    assert_eq!(tiers.header().map(|h| h.as_str()), Some("x-plan"));
    let names: Vec<&str> = tiers.names.iter().map(|n| &**n).collect();
    assert_eq!(names, ["free", "pro", "none"]);
    assert_eq!(tiers.default, 0);
    let limits: Vec<(&str, Option<u8>)> = route
        .limits
        .iter()
        .map(|l| (&**l.policy.name(), l.tier))
        .collect();
    assert_eq!(
        limits,
        [("free", Some(0)), ("pro", Some(1))],
        "no limit for `none`"
    );
    assert!(route.limits.iter().all(|l| l.subject.len() == 1));
    let LimitPolicy::Rate(pro) = &route.limits[1].policy else {
        panic!("a rate policy")
    };
    assert_eq!(pro.near_limit, 95);

    // A tiered limit beside others in `limits`.
    let route = self::route(
        "  - name: api
    limits:
      - { policy: in_flight, subject: global }
      - { tiers: { header: x-plan, policies: { pro: pro }, default: free } }
",
    );
    let tiers: Vec<Option<u8>> = route.limits.iter().map(|l| l.tier).collect();
    assert_eq!(tiers, [None, Some(0), Some(1)]);
}

#[test]
fn tiers_believe_only_their_trusted_from() {
    let route = route(
        "  - name: api
    tiers:
      header: X-Plan
      policies: { pro: pro }
      default: free
      trusted_from: [10.2.0.0/16, \"2001:db8::/32\", 192.0.2.5]
",
    );
    let tiers = route.tiers.as_ref().expect("tiers");
    let mut pro = http::HeaderMap::new();
    pro.insert("x-plan", http::HeaderValue::from_static("pro"));
    let peer = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
    let chosen = |tiers: &crate::route::Tiers, from: &str| {
        let token = crate::subject::jwt::Token::new(None, &pro);
        tiers.names[usize::from(tiers.choose(&pro, peer(from), &token))].to_string()
    };
    assert_eq!(chosen(tiers, "10.2.3.4"), "pro");
    assert_eq!(chosen(tiers, "192.0.2.5"), "pro");
    assert_eq!(
        chosen(tiers, "::ffff:10.2.3.4"),
        "pro",
        "a mapped address is its IPv4 one"
    );
    assert_eq!(chosen(tiers, "2001:db8::7"), "pro");
    assert_eq!(chosen(tiers, "192.0.2.6"), "free");

    // Without `trusted_from`, nobody.
    let route = self::route(
        "  - { name: api, tiers: { header: x-plan, policies: { pro: pro }, default: free } }\n",
    );
    let tiers = route.tiers.as_ref().expect("tiers");
    assert!(!tiers.believes("127.0.0.1".parse().unwrap()));
    assert_eq!(chosen(tiers, "127.0.0.1"), "free");
}

#[test]
fn tiers_that_could_not_work_are_refused_at_their_keys() {
    refused(
        "  - { name: a, policy: free, tiers: { header: x-plan, policies: { pro: pro }, default: free } }\n",
        "routes[0].tiers: `policy` and `tiers` exclude each other",
    );
    refused(
        "  - { name: a, tiers: { header: x-plan, policies: { pro: gold }, default: free } }\n",
        "routes[0].tiers.policies.pro: unknown policy `gold`",
    );
    refused(
        "  - { name: a, tiers: { header: x-plan, policies: { pro: pro }, default: free, trusted_from: [10.0.0.1/8] } }\n",
        "routes[0].tiers.trusted_from[0]: `10.0.0.1/8` has host bits set",
    );
    refused(
        "  - name: a
    limits:
      - { tiers: { header: x-plan, policies: { pro: pro }, default: free, trusted_from: gateway } }
",
        "routes[0].limits[0].tiers.trusted_from: `gateway` is neither an IP address nor a CIDR",
    );
    refused(
        "  - { name: a, tiers: { header: x-plan, policies: { pro: pro } } }\n",
        "routes[0].tiers.default: required key is missing",
    );
    refused(
        "  - { name: a, tiers: { policies: { pro: pro }, default: free } }\n",
        "routes[0].tiers: needs `header` (set by a gateway in `trusted_from`) or `claim` (of a verified token)",
    );
    refused(
        "  - { name: a, tiers: { header: x-plan, claim: plan, policies: { pro: pro }, default: free } }\n",
        "routes[0].tiers.claim: `header` and `claim` exclude each other",
    );
    refused(
        "  - { name: a, tiers: { claim: plan, policies: { pro: pro }, default: free } }\n",
        "routes[0].tiers.claim: needs `identity.jwt`",
    );
    refused(
        "  - { name: a, subject: jwt:sub, policy: pro }\n",
        "routes[0].subject: needs `identity.jwt`",
    );
    refused(
        "  - { name: a, tiers: { header: x-plan, policies: {}, default: free } }\n",
        "routes[0].tiers.policies: needs at least one value",
    );
    refused(
        "  - { name: a, tiers: { header: \"x plan\", policies: { pro: pro }, default: free } }\n",
        "routes[0].tiers.header: `x plan` is not a valid header name",
    );
    refused(
        "  - name: a
    limits:
      - { tiers: { header: x-plan, policies: { pro: pro }, default: free } }
      - { tiers: { header: x-org, policies: { big: logins }, default: tokens } }
",
        "routes[0].limits[1].tiers: a route chooses its tier once, and routes[0].limits[0] has `tiers` already",
    );
    refused(
        "  - name: a
    limits:
      - { policy: pro }
      - { tiers: { header: x-plan, policies: { pro: pro }, default: free } }
",
        "routes[0].limits[1].tiers: policy `pro` is already routes[0].limits[0]",
    );
    refused(
        "  - { name: a, tiers: { header: x-plan, policies: { pro: pro, x: in_flight }, default: free }, cost: 2 }\n",
        "routes[0].cost: `cost` does not apply to concurrency policy `in_flight`",
    );
}

#[test]
fn near_limit_is_a_percentage_of_a_rate_policy() {
    let text =
        |policy: &str| format!("{BASE}  p: {policy}\nroutes:\n  - {{ name: a, policy: p }}\n");
    let errors = |policy: &str| match parse(&text(policy)) {
        Ok(_) => panic!("should be refused: {policy}"),
        Err(e) => e.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
    };
    let got = errors("{ algorithm: fixed-window, limit: 5, window: 1s, near_limit: 80 }");
    assert!(
        got.iter()
            .any(|e| e.contains("policies.p.near_limit: `80` is not a percentage")),
        "{got:#?}"
    );
    let got = errors("{ algorithm: concurrency, limit: 5, near_limit: 80% }");
    assert!(
        got.iter().any(|e| e.contains("policies.p.near_limit")),
        "{got:#?}"
    );
    let config = parse(&text("{ algorithm: fixed-window, limit: 5, window: 1s }")).unwrap();
    let LimitPolicy::Rate(p) = &config.live.routes[0].limits[0].policy else {
        panic!("a rate policy")
    };
    assert_eq!(p.near_limit, 80);
}
