//! `deny:` and `exempt:` of a route (and `exempt:` of one of its
//! `limits`): lists of networks, read as `identity.trusted_proxies` is,
//! gathered into the route's [`Addresses`].

use ipnet::IpNet;

use crate::config::locate::{At, KeyPath};
use crate::config::raw::ScalarList;
use crate::route::{Addresses, Limit};

use super::check::Checker;
use super::sections::networks;

/// One `deny` or `exempt` list; `Some(empty)` when not written.
pub(super) fn list(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<ScalarList>,
) -> Option<Vec<IpNet>> {
    networks(cx, path, raw)
}

/// The route's [`Addresses`]: `deny`, and for each of `limits` the
/// route's `exempt` with its own (`own`, parallel to `limits`). A route
/// whose `exempt` exempts from nothing (it has no limit) is refused: the
/// list was written for a limit that is not there.
pub(super) fn gather(
    cx: &mut Checker<'_>,
    route: &KeyPath,
    deny: Vec<IpNet>,
    exempt: Vec<IpNet>,
    limits: &[Limit],
    own: Vec<Vec<IpNet>>,
) -> Addresses {
    if !exempt.is_empty() && limits.is_empty() {
        cx.error(
            &route.key("exempt"),
            At::Key,
            "the route has no limit to exempt from (`policy: none`); leave `exempt` out",
        );
    }
    let exempt: Box<[Box<[IpNet]>]> = if exempt.is_empty() && own.iter().all(Vec::is_empty) {
        Box::default()
    } else {
        limits
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let mut networks = exempt.clone();
                for net in own.get(i).into_iter().flatten() {
                    if !networks.contains(net) {
                        networks.push(*net);
                    }
                }
                networks.into_boxed_slice()
            })
            .collect()
    };
    Addresses {
        deny: deny.into_boxed_slice(),
        exempt,
    }
}
