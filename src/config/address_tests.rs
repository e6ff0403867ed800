//! `deny` and `exempt`: read as networks, merged per limit (the route's
//! with each item's own), refused where they could do nothing or at the
//! entry that is no network.

use std::path::Path;

use super::*;

fn parse(routes: &str) -> Result<Config, ConfigErrors> {
    let text = format!(
        "version: 1
server: {{ listen: 127.0.0.1:8080 }}
upstream: {{ url: http://127.0.0.1:3000 }}
policies:
  a: {{ algorithm: fixed-window, limit: 5, window: 1m }}
  b: {{ algorithm: concurrency, limit: 2 }}
{routes}"
    );
    Config::parse(Path::new("test.yaml"), &text)
}

fn refused(routes: &str, want: &str) {
    match parse(routes) {
        Ok(_) => panic!("should be refused:\n{routes}"),
        Err(e) => {
            let errors: Vec<String> = e.iter().map(|e| e.to_string()).collect();
            assert!(
                errors.iter().any(|e| e.contains(want)),
                "{want} not in {errors:#?}"
            );
        }
    }
}

fn nets(list: &[&str]) -> Vec<ipnet::IpNet> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[test]
fn a_routes_exempt_covers_every_limit_and_an_items_only_its_own() {
    let config = parse(
        "routes:
  - name: r
    exempt: [10.0.0.0/8]
    deny: [203.0.113.0/24, 192.0.2.7]
    limits:
      - { policy: a, exempt: [198.51.100.0/24, 10.0.0.0/8] }
      - { policy: b }
default: { policy: a, exempt: 2001:db8::/32, deny: [192.0.2.0/24] }
",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let route = &config.live.routes[0];
    assert_eq!(
        &*route.addresses.deny,
        &nets(&["203.0.113.0/24", "192.0.2.7/32"])[..]
    );
    assert_eq!(
        route.addresses.exempt_from(0),
        &nets(&["10.0.0.0/8", "198.51.100.0/24"])[..]
    );
    assert_eq!(route.addresses.exempt_from(1), &nets(&["10.0.0.0/8"])[..]);
    let default = &config.live.default;
    assert_eq!(
        default.addresses.exempt_from(0),
        &nets(&["2001:db8::/32"])[..]
    );
    assert_eq!(&*default.addresses.deny, &nets(&["192.0.2.0/24"])[..]);
}

#[test]
fn a_route_without_either_reads_no_address() {
    let config = parse("routes:\n  - { name: r, policy: a }\n").unwrap();
    assert!(config.live.routes[0].addresses.is_empty());
    assert!(config.live.default.addresses.is_empty());
}

#[test]
fn entries_that_are_no_network_are_refused_where_written() {
    refused(
        "routes:\n  - { name: r, policy: a, deny: [10.0.0.1/8] }\n",
        "routes[0].deny[0]: `10.0.0.1/8` has host bits set",
    );
    refused(
        "routes:\n  - { name: r, limits: [{ policy: a, exempt: [office] }] }\n",
        "routes[0].limits[0].exempt[0]: `office` is neither an IP address nor a CIDR",
    );
    refused(
        "routes:\n  - { name: r, policy: a, exempt: { office: 10.0.0.0/8 } }\n",
        "routes[0]",
    );
}

#[test]
fn exempt_from_no_limit_is_refused() {
    refused(
        "routes:\n  - { name: r, policy: none, exempt: [10.0.0.0/8] }\n",
        "routes[0].exempt: the route has no limit to exempt from",
    );
    // Denying on an unlimited route is a rule of its own.
    assert!(parse("routes:\n  - { name: r, policy: none, deny: [10.0.0.0/8] }\n").is_ok());
}
