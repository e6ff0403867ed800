//! `identity`: trusted proxies, IPv6 grouping, the pseudonym key.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, ScalarList};
use crate::config::validate::check::{self, Checker};
use crate::config::{Identity, Secret};

use super::*;
use crate::config::keys;

pub fn identity(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Identity,
    kind: Option<Kind>,
) -> Option<Identity> {
    let trusted_proxies = networks(cx, &path.key("trusted_proxies"), raw.trusted_proxies);
    let ipv6_prefix = cx.defaulted(
        path,
        &keys::IDENTITY_IPV6_PREFIX,
        raw.ipv6_prefix.as_ref(),
        check::number(1, 128),
    );
    let pseudonym_key = match &raw.pseudonym_key {
        None => {
            if kind == Some(Kind::Redis) {
                cx.error(
                    &path.key("pseudonym_key"),
                    At::Key,
                    "required with `store.kind: redis`: every replica must derive the same pseudonyms",
                );
                None
            } else {
                Some(None)
            }
        }
        Some(s) => cx
            .value(&path.key("pseudonym_key"), s, pseudonym_key)
            .map(Some),
    };
    let pseudonym_key_version = cx.defaulted(
        path,
        &keys::IDENTITY_PSEUDONYM_KEY_VERSION,
        raw.pseudonym_key_version.as_ref(),
        check::number_u32(1),
    );
    Some(Identity {
        trusted_proxies: trusted_proxies?,
        ipv6_prefix: u8::try_from(ipv6_prefix?).ok()?,
        pseudonym_key: pseudonym_key?,
        pseudonym_key_version: pseudonym_key_version?,
    })
}

/// A secret: never repeated in a message.
fn pseudonym_key(s: &str) -> Result<Secret, String> {
    if s.len() < 16 {
        return Err(format!(
            "must be at least 16 bytes long (it is {})",
            s.len()
        ));
    }
    Ok(Secret(s.to_owned()))
}

/// A list of networks (`identity.trusted_proxies`, a tiers'
/// `trusted_from`), each item's error at its own path.
pub fn networks(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<ScalarList>,
) -> Option<Vec<IpNet>> {
    let items = list_items(path, raw);
    let mut nets = Vec::with_capacity(items.len());
    let mut ok = true;
    for (p, s) in &items {
        match cx.value(p, s, network) {
            Some(net) => nets.push(net),
            None => ok = false,
        }
    }
    ok.then_some(nets)
}

/// A CIDR (`10.0.0.0/8`) or a bare address (one host).
fn network(s: &str) -> Result<IpNet, String> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(IpNet::from(ip));
    }
    let net: IpNet = s
        .parse()
        .map_err(|_| format!("`{s}` is neither an IP address nor a CIDR such as 10.0.0.0/8"))?;
    if net.trunc() != net {
        return Err(format!(
            "`{s}` has host bits set; did you mean {}?",
            net.trunc()
        ));
    }
    Ok(net)
}
