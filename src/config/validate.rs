//! From text to [`Config`]: every error in the file, or a config that cannot
//! be wrong.
//!
//! Steps: positions of every key (`locate`), the YAML value tree
//! (serde_yaml), `${NAME}` substitution (`env`), then each section, each
//! policy and each route deserialized on its own (`raw`) and checked, so one
//! mistake never hides another in a different place.

mod addresses;
mod charge;
pub(crate) mod check;
mod conditions;
mod matcher;
mod policy;
pub(crate) use policy::derived_revision;
mod route;
mod sections;
mod subject;
mod upgrades;

use std::collections::HashMap;
use std::path::Path;

use serde_yaml::Value;

use self::check::Checker;
use super::env::{self, key_text, Lookup};
use super::locate::{At, KeyPath, Locations};
use super::raw::{self, SECTIONS};
use super::{
    Boot, Config, ConfigError, ConfigErrors, Live, OnFailure, StoreBoot, StoreKind, StoreLive,
    Underscores,
};
use crate::limit::LimitPolicy;

/// Reads `${NAME}` from the process environment.
pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigErrors> {
    parse_with_env(path, text, &|name| std::env::var(name))
}

/// As [`parse`], with variables looked up by `lookup`.
pub fn parse_with_env(path: &Path, text: &str, lookup: Lookup<'_>) -> Result<Config, ConfigErrors> {
    let locations = match Locations::build(text) {
        Ok(l) => l,
        Err(syntax) => {
            return Err(ConfigErrors(
                syntax
                    .into_iter()
                    .map(|e| ConfigError {
                        file: path.to_path_buf(),
                        line: e.pos.line,
                        column: e.pos.column,
                        key: e.path.to_string(),
                        message: e.message,
                    })
                    .collect(),
            ))
        }
    };
    let mut root: Value = match serde_yaml::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
            return Err(ConfigErrors::single(ConfigError {
                file: path.to_path_buf(),
                line,
                column,
                key: String::new(),
                message: e.to_string(),
            }));
        }
    };
    let mut cx = Checker::new(path, &locations);
    for (at, e) in env::substitute_tree(&mut root, &KeyPath::root(), lookup) {
        cx.poison(&at, e.message());
    }
    let config = build(&mut cx, root);
    match config {
        Some(config) if !cx.has_errors() => Ok(config),
        _ => {
            let mut errors = cx.into_errors();
            if errors.is_empty() {
                // Every failing step reports before giving up; this only
                // guards against a step that forgot to.
                errors.push(ConfigError {
                    file: path.to_path_buf(),
                    line: 1,
                    column: 1,
                    key: String::new(),
                    message: "the configuration is invalid".to_owned(),
                });
            }
            Err(ConfigErrors(errors))
        }
    }
}

/// The top-level keys, unknown ones reported.
fn sections(cx: &mut Checker<'_>, root: Value) -> Option<HashMap<&'static str, Value>> {
    let mut out = HashMap::new();
    let map = match root {
        Value::Mapping(map) => map,
        Value::Null => {
            cx.error(
                &KeyPath::root(),
                At::Value,
                "the file is empty; start with `version: 1`",
            );
            return None;
        }
        _ => {
            cx.error(
                &KeyPath::root(),
                At::Value,
                "expected a mapping of sections (version, server, upstream, ...)",
            );
            return None;
        }
    };
    for (key, value) in map {
        let name = key_text(&key);
        match SECTIONS.iter().find(|s| **s == name) {
            Some(section) => {
                out.insert(*section, value);
            }
            None => cx.error(
                &KeyPath::root().key(&name),
                At::Key,
                format!(
                    "unknown key `{name}`, expected one of {}",
                    SECTIONS.join(", ")
                ),
            ),
        }
    }
    Some(out)
}

fn build(cx: &mut Checker<'_>, root: Value) -> Option<Config> {
    let mut sections = sections(cx, root)?;
    let top = KeyPath::root();

    let version = top.key("version");
    match sections.remove("version") {
        None => cx.error(
            &version,
            At::Key,
            "required key is missing; write `version: 1`",
        ),
        Some(Value::Number(n)) if n.as_u64() == Some(1) => {}
        Some(Value::String(s)) if s == "1" => {}
        Some(other) => cx.error(
            &version,
            At::Value,
            format!(
                "unsupported version {}; this sluice reads `version: 1`",
                serde_yaml::to_string(&other).unwrap_or_default().trim()
            ),
        ),
    }

    let p = top.key("server");
    let server = cx
        .shape::<raw::Server>(&p, sections.remove("server"))
        .and_then(|raw| sections::server(cx, &p, raw));
    let p = top.key("upstream");
    let upstream = cx
        .shape::<raw::Upstream>(&p, sections.remove("upstream"))
        .and_then(|raw| sections::upstream(cx, &p, raw));
    let p = top.key("store");
    let raw_store = cx.shape::<raw::Store>(&p, sections.remove("store"));
    let kind = raw_store
        .as_ref()
        .and_then(|raw| sections::store_kind(cx, &p, raw));
    let share_written = raw_store.as_ref().is_some_and(|r| r.local_share.is_some());
    let store = raw_store.and_then(|raw| sections::store(cx, &p, raw, kind));
    let p = top.key("identity");
    let identity = cx
        .shape::<raw::Identity>(&p, sections.remove("identity"))
        .and_then(|raw| sections::identity(cx, &p, raw, kind));
    let p = top.key("responses");
    let responses = cx
        .shape::<raw::Responses>(&p, sections.remove("responses"))
        .and_then(|raw| sections::responses(cx, &p, raw));

    // `lease: auto` leases on Redis, ending well before a grant's record.
    let auto = policy::AutoLease(match store.as_ref().map(|(boot, _)| &boot.kind) {
        Some(StoreKind::Redis(redis)) => Some(redis.dedupe_window / 2),
        _ => None,
    });
    let policies = policy::policies(cx, &top.key("policies"), sections.remove("policies"), auto);
    // Route paths are normalized as requests will be; a broken `server`
    // section has already been reported, so its defaults stand in.
    let rules = server
        .as_ref()
        .map(|(_, live)| live.paths)
        .unwrap_or_default();
    let reads = route::Reads {
        underscores: server
            .as_ref()
            .map_or(Underscores::Drop, |(_, live)| live.underscores),
        // A broken `identity` section is reported already: `jwt:`
        // subjects are not refused for it too.
        jwt: identity.as_ref().is_none_or(|i| i.jwt.is_some()),
    };
    let mut routes = route::routes(
        cx,
        &top.key("routes"),
        sections.remove("routes"),
        &policies,
        &rules,
        reads,
    );
    let mut default = route::default_route(
        cx,
        &top.key("default"),
        sections.remove("default"),
        &policies,
        reads,
    );
    conditions::not_on_tier_headers(cx, &top.key("routes"), &routes, default.as_ref());
    // A route's own answers replace the global ones, each on its own.
    if let Some(global) = responses.as_ref().map(|r| &r.answers) {
        for route in routes.iter_mut().chain(default.as_mut()) {
            route.answers = route.answers.or(global);
        }
    }

    if let (Some((boot, _)), Some(identity)) = (&server, &identity) {
        if boot.proxy_protocol.any() && identity.trusted_proxies.is_empty() {
            cx.error(
                &top.key("server").key("proxy_protocol"),
                At::Key,
                "a PROXY protocol header is read only from `identity.trusted_proxies`, which is empty; list the load balancer's addresses there",
            );
        }
    }

    local_fallback(
        cx,
        &top,
        kind,
        share_written,
        store.as_ref().map(|(_, live)| live),
        &policies,
    );

    leases(
        cx,
        &top,
        kind,
        store.as_ref().map(|(boot, _)| boot),
        &policies,
    );

    let (server, server_live) = server?;
    let (upstream, upstream_live) = upstream?;
    let (store, store_live) = store?;
    Some(Config {
        source: cx.file().to_path_buf(),
        boot: Boot {
            server,
            upstream,
            store,
        },
        live: Live {
            server: server_live,
            upstream: upstream_live,
            store: store_live,
            identity: identity?,
            responses: responses?,
            policies: policies.rates(),
            routes,
            default: default?,
        },
    })
}

/// `on_failure: local` needs a shared store to fall back from, and
/// `store.local_share` means nothing without it: both mistakes are refused
/// rather than silently ignored, since an operator who writes either
/// believes a fallback is in place.
/// A lease is spent in this sidecar out of a block the shared store
/// charged: there is none on the memory store, which decides here anyway.
/// What is left of it goes back through the grant's record, which lives
/// `store.dedupe_window`: a lease ends well before its record does.
fn leases(
    cx: &mut Checker<'_>,
    top: &KeyPath,
    kind: Option<sections::Kind>,
    store: Option<&StoreBoot>,
    policies: &policy::Policies,
) {
    for p in policies.valid.iter().filter_map(LimitPolicy::as_rate) {
        // `auto` chose terms that fit already.
        let Some(lease) = p.lease.filter(|l| !l.auto) else {
            continue;
        };
        let at = top.key("policies").key(&p.name).key("lease");
        if kind == Some(sections::Kind::Memory) {
            cx.error(
                &at,
                At::Key,
                "`lease` applies only to `kind: redis`: the memory store already decides in this sidecar",
            );
            continue;
        }
        let Some(StoreKind::Redis(redis)) = store.map(|s| &s.kind) else {
            continue;
        };
        if lease.ttl > redis.dedupe_window / 2 {
            cx.error(
                &at.key("ttl"),
                At::Value,
                format!(
                    "at most half `store.dedupe_window` ({}): what is left of a lease goes back through its grant's record, which lives that long",
                    humantime::format_duration(redis.dedupe_window)
                ),
            );
        }
    }
}

fn local_fallback(
    cx: &mut Checker<'_>,
    top: &KeyPath,
    kind: Option<sections::Kind>,
    share_written: bool,
    store: Option<&StoreLive>,
    policies: &policy::Policies,
) {
    let store_path = top.key("store");
    let mut written: Vec<KeyPath> = Vec::new();
    if store.is_some_and(|s| s.on_failure == OnFailure::Local) {
        written.push(store_path.key("on_failure"));
    }
    for p in policies.valid.iter().filter_map(LimitPolicy::as_rate) {
        if p.on_failure == Some(OnFailure::Local) {
            written.push(top.key("policies").key(&p.name).key("on_failure"));
        }
    }
    if kind == Some(sections::Kind::Memory) {
        for path in &written {
            cx.error(
                path,
                At::Value,
                "`local` applies only to `kind: redis`: the memory store already decides in this sidecar",
            );
        }
    }
    // Unknown while the store section or a policy is itself invalid
    // (already reported).
    let all_known = store.is_some() && policies.valid.len() == policies.declared.len();
    if share_written && written.is_empty() && all_known {
        cx.error(
            &store_path.key("local_share"),
            At::Key,
            "`local_share` applies only with `on_failure: local` (on the store or on a policy)",
        );
    }
}
