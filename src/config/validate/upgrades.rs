//! `upgrades:`: the `Upgrade` protocols a route passes on.

use std::sync::Arc;

use crate::config::locate::KeyPath;
use crate::config::raw::ScalarList;
use crate::config::DEFAULT_UPGRADES;

use super::check::Checker;
use super::matcher::list;

pub(super) fn default_upgrades() -> Arc<[Box<str>]> {
    DEFAULT_UPGRADES.iter().map(|p| Box::from(*p)).collect()
}

/// `upgrades: [websocket, ...]`: the `Upgrade` protocols a route passes,
/// by name (any version); `[]` passes none. `h2c` never passes: an h2c
/// tunnel would carry requests sluice never sees.
pub(super) fn upgrades(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<ScalarList>,
) -> Option<Arc<[Box<str>]>> {
    let Some(raw) = raw else {
        return Some(default_upgrades());
    };
    let mut out: Vec<Box<str>> = Vec::new();
    let mut ok = true;
    for (p, s) in &list(path, raw) {
        match cx.value(p, s, upgrade_protocol) {
            Some(name) if !out.contains(&name) => out.push(name),
            Some(_) => {}
            None => ok = false,
        }
    }
    ok.then(|| out.into())
}

fn upgrade_protocol(s: &str) -> Result<Box<str>, String> {
    let name = s.trim().to_ascii_lowercase();
    let token = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        return Err(format!(
            "`{s}` is not a protocol name; write it without a version, e.g. websocket"
        ));
    }
    if name == "h2c" {
        return Err(
            "h2c is never passed: the tunnel would carry HTTP/2 requests sluice never limits"
                .to_owned(),
        );
    }
    Ok(name.into_boxed_str())
}
