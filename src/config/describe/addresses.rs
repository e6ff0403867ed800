//! The client addresses each route denies or exempts, as `sluice check`
//! lists them under the route table.

use std::fmt::Write as _;

use ipnet::IpNet;

use crate::config::Config;

/// One line per route that denies and one per limit that exempts; empty
/// when no route does either.
pub fn address_notes(config: &Config) -> String {
    let mut out = String::new();
    let routes = config
        .live
        .routes
        .iter()
        .chain(std::iter::once(&config.live.default));
    for route in routes {
        let addresses = &route.addresses;
        if !addresses.deny.is_empty() {
            let _ = writeln!(
                out,
                "  {}: deny {} (403, before any limit)",
                route.name,
                join(&addresses.deny)
            );
        }
        for (i, limit) in route.limits.iter().enumerate() {
            let exempt = addresses.exempt_from(i);
            if !exempt.is_empty() {
                let _ = writeln!(
                    out,
                    "  {}: exempt {} from policy {}",
                    route.name,
                    join(exempt),
                    limit.policy.name()
                );
            }
        }
    }
    if out.is_empty() {
        return out;
    }
    format!("Client addresses (as `client_ip` resolves them, behind trusted proxies and PROXY headers):\n{out}")
}

fn join(networks: &[IpNet]) -> String {
    let names: Vec<String> = networks.iter().map(ToString::to_string).collect();
    names.join(", ")
}
