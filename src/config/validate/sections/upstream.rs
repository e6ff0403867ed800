//! `upstream`: the app's URL and its timeouts.

use crate::config::keys;

use http::Uri;

use crate::config::locate::KeyPath;
use crate::config::raw::{self};
use crate::config::validate::check::{self, Checker};
use crate::config::{UpstreamBoot, UpstreamLive};

pub fn upstream(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Upstream,
) -> Option<(UpstreamBoot, UpstreamLive)> {
    let url = cx.required(&path.key("url"), raw.url.as_ref(), upstream_url);
    let connect_timeout = cx.defaulted(
        path,
        &keys::UPSTREAM_CONNECT_TIMEOUT,
        raw.connect_timeout.as_ref(),
        check::positive_duration,
    );
    let timeout = cx.defaulted(
        path,
        &keys::UPSTREAM_TIMEOUT,
        raw.timeout.as_ref(),
        check::positive_duration,
    );
    let boot = UpstreamBoot {
        connect_timeout: connect_timeout?,
    };
    let live = UpstreamLive {
        url: url?,
        timeout: timeout?,
    };
    Some((boot, live))
}

/// `http://host[:port][/base]`, normalised to an explicit port and a base
/// path without a trailing slash (`/` when there is none), so the forwarder
/// only ever appends the request path.
pub fn upstream_url(s: &str) -> Result<Uri, String> {
    let uri: Uri = s
        .parse()
        .map_err(|_| format!("`{s}` is not a URL; write http://host:port"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(format!(
                "scheme `{other}` is not supported; the upstream is spoken to in plain http://"
            ))
        }
        None => return Err(format!("`{s}` has no scheme; write http://{s}")),
    }
    let authority = uri
        .authority()
        .ok_or_else(|| format!("`{s}` has no host"))?;
    if authority.as_str().contains('@') {
        return Err("must not contain credentials (user@)".to_owned());
    }
    if authority.host().is_empty() {
        return Err(format!("`{s}` has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("`{s}` must not have a query (`?...`)"));
    }
    let port = authority.port_u16().unwrap_or(80);
    let base = uri.path().trim_end_matches('/');
    let base = if base.is_empty() { "/" } else { base };
    format!("http://{}:{port}{base}", authority.host())
        .parse()
        .map_err(|_| format!("`{s}` is not a URL; write http://host:port"))
}
