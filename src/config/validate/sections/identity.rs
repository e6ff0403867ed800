//! `identity`: trusted proxies, IPv6 grouping, the pseudonym key.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use ipnet::IpNet;

use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, ScalarList};
use crate::config::validate::check::{self, Checker};
use crate::config::{Identity, Secret};
use crate::subject::jwt::{KeySource, Keys, Verifier};

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
    let jwt = match raw.jwt {
        None => Some(None),
        Some(raw) => jwt(cx, &path.key("jwt"), raw).map(Some),
    };
    let (jwt, jwt_keys_file) = match jwt? {
        Some((verifier, file)) => (Some(Arc::new(verifier)), file),
        None => (None, None),
    };
    Some(Identity {
        trusted_proxies: trusted_proxies?,
        ipv6_prefix: u8::try_from(ipv6_prefix?).ok()?,
        pseudonym_key: pseudonym_key?,
        pseudonym_key_version: pseudonym_key_version?,
        jwt,
        jwt_keys_file,
    })
}

/// `identity.jwt`: exactly one of `keys_file` and `secret`, the keys
/// read now (a reload reads them again), and what a token must say.
fn jwt(cx: &mut Checker<'_>, path: &KeyPath, raw: raw::Jwt) -> Option<(Verifier, Option<PathBuf>)> {
    let source = match (&raw.keys_file, &raw.secret) {
        (Some(file), None) => {
            let file = PathBuf::from(file.0.trim());
            Some((
                KeySource::File(file.clone()),
                path.key("keys_file"),
                Some(file),
            ))
        }
        (None, Some(secret)) => Some((
            KeySource::Secret(Secret(secret.0.clone())),
            path.key("secret"),
            None,
        )),
        (Some(_), Some(_)) => {
            cx.error(
                &path.key("secret"),
                At::Key,
                "give `keys_file` or `secret`, not both: a token is checked against one kind of key",
            );
            None
        }
        (None, None) => {
            cx.error(
                path,
                At::Key,
                "needs `keys_file` (a JWKS or PEM public keys) or `secret` (HS256)",
            );
            None
        }
    };
    let keys = source.and_then(|(source, at, file)| match Keys::load(&source) {
        Ok(keys) => Some((keys, file)),
        Err(message) => {
            cx.error(&at, At::Value, message);
            None
        }
    });
    let issuer = match &raw.issuer {
        None => Some(None),
        Some(s) => cx.value(&path.key("issuer"), s, non_empty).map(Some),
    };
    let audiences_at = path.key("audiences");
    let mut audiences = Vec::new();
    let mut ok = true;
    for (p, s) in list_items(&audiences_at, raw.audiences) {
        match cx.value(&p, &s, non_empty) {
            Some(a) => audiences.push(a),
            None => ok = false,
        }
    }
    let leeway = cx.defaulted(
        path,
        &keys::IDENTITY_JWT_LEEWAY,
        raw.leeway.as_ref(),
        check::duration,
    );
    let (keys, file) = keys?;
    if !ok {
        return None;
    }
    Some((Verifier::new(keys, issuer?, audiences, leeway?), file))
}

fn non_empty(s: &str) -> Result<String, String> {
    let s = s.trim();
    if s.is_empty() {
        return Err("must not be empty".to_owned());
    }
    Ok(s.to_owned())
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
