//! `routes:` and `default:`: matchers, and each route's limits (policy,
//! subject, cost), written as `policy` + `subject` or as a `limits:` list.

use std::collections::HashMap;
use std::sync::Arc;

use http::Method;
use ipnet::IpNet;
use serde_yaml::Value;

use super::addresses;
use super::charge;
use super::check::{self, Checker};
use super::policy::{route_policy, Policies};
use super::upgrades::{default_upgrades, upgrades};
use crate::config::keys;
use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, Scalar, ScalarList};
use crate::config::Underscores;
use crate::limit::LimitPolicy;
use crate::path::{self, PathRules};
use crate::route::{Limit, Match, PathMatch, Route, Segment, Tiers};

/// What the sections routes depend on let a request carry: headers
/// spelled with `_`, and verified tokens (`identity.jwt`).
#[derive(Debug, Clone, Copy)]
pub struct Reads {
    pub underscores: Underscores,
    pub jwt: bool,
}

/// The name `check` and metrics give the route for requests no route matched.
pub const DEFAULT_ROUTE: &str = "default";

pub fn routes(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    value: Option<Value>,
    policies: &Policies,
    rules: &PathRules,
    reads: Reads,
) -> Vec<Route> {
    let items = match value {
        None | Some(Value::Null) => return Vec::new(),
        Some(Value::Sequence(items)) => items,
        Some(_) => {
            cx.error(path, At::Value, "expected a list of routes");
            return Vec::new();
        }
    };
    let mut names: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at = path.index(i);
        let Some(raw) = cx.shape::<raw::Route>(&at, Some(item)) else {
            continue;
        };
        let name = cx.required(&at.key("name"), raw.name.as_ref(), check::name);
        if let Some(name) = &name {
            if name == DEFAULT_ROUTE {
                cx.error(
                    &at.key("name"),
                    At::Value,
                    "`default` is reserved for the top-level `default:` route",
                );
            } else if let Some(first) = names.get(name) {
                cx.error(
                    &at.key("name"),
                    At::Value,
                    format!(
                        "route name `{name}` is already used by {}",
                        path.index(*first)
                    ),
                );
            } else {
                names.insert(name.clone(), i);
            }
        }
        let matcher = match raw.matcher {
            None => Some(Match::default()),
            Some(m) => matcher(cx, &at.key("match"), m, rules),
        };
        let upgrades = upgrades(cx, &at.key("upgrades"), raw.upgrades);
        let deny = addresses::list(cx, &at.key("deny"), raw.deny);
        let exempt = addresses::list(cx, &at.key("exempt"), raw.exempt);
        let written = Written {
            policy: raw.policy,
            tiers: raw.tiers,
            subject: raw.subject,
            cost: raw.cost,
            charge: raw.charge,
            limits: raw.limits,
        };
        let limits = limits(cx, &at, written, policies, reads);
        if let (Some(name), Some(matcher), Some((limits, tiers, own)), Some(upgrades)) =
            (name, matcher, limits, upgrades)
        {
            let (Some(deny), Some(exempt)) = (deny, exempt) else {
                continue;
            };
            let addresses = addresses::gather(cx, &at, deny, exempt, &limits, own);
            out.push(Route {
                name: Arc::from(name.as_str()),
                matcher,
                limits,
                upgrades,
                tiers,
                addresses,
            });
        }
    }
    out
}

/// `default:` absent: requests no route matched are forwarded unlimited.
pub fn default_route(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    value: Option<Value>,
    policies: &Policies,
    reads: Reads,
) -> Option<Route> {
    let raw = match value {
        None | Some(Value::Null) => {
            return Some(Route {
                name: Arc::from(DEFAULT_ROUTE),
                matcher: Match::default(),
                limits: Vec::new(),
                upgrades: default_upgrades(),
                tiers: None,
                addresses: Default::default(),
            })
        }
        Some(v) => cx.shape::<raw::DefaultRoute>(path, Some(v))?,
    };
    let written = Written {
        policy: raw.policy,
        tiers: raw.tiers,
        subject: raw.subject,
        cost: None,
        charge: None,
        limits: raw.limits,
    };
    let limits = limits(cx, path, written, policies, reads);
    let upgrades = upgrades(cx, &path.key("upgrades"), raw.upgrades);
    let deny = addresses::list(cx, &path.key("deny"), raw.deny);
    let exempt = addresses::list(cx, &path.key("exempt"), raw.exempt);
    let (limits, tiers, own) = limits?;
    let addresses = addresses::gather(cx, path, deny?, exempt?, &limits, own);
    Some(Route {
        name: Arc::from(DEFAULT_ROUTE),
        matcher: Match::default(),
        limits,
        upgrades: upgrades?,
        tiers,
        addresses,
    })
}

/// What a route (or `default:`) writes about its limits: `policy` (or
/// `tiers`), `subject`, `cost` and `charge` for one, or `limits:` for
/// several.
struct Written {
    policy: Option<Scalar>,
    tiers: Option<raw::Tiers>,
    subject: Option<raw::Subjects>,
    cost: Option<raw::Cost>,
    charge: Option<raw::Charge>,
    limits: Option<Vec<raw::Limit>>,
}

/// A route's limits, its tiers when one of them is chosen by header, and
/// (parallel to the limits) the networks each `limits` item exempts.
type Limits = (Vec<Limit>, Option<Arc<Tiers>>, Vec<Vec<IpNet>>);

/// The route's limits; `path` is the route. `policy: none` is no limit at
/// all, `policy` + `subject` a list of one, `tiers` one limit per tier.
fn limits(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    written: Written,
    policies: &Policies,
    reads: Reads,
) -> Option<Limits> {
    let Some(list) = written.limits else {
        let one = raw::Limit {
            policy: written.policy,
            tiers: written.tiers,
            subject: written.subject,
            cost: written.cost,
            charge: written.charge,
            exempt: None,
        };
        let (limits, tiers) = entry(cx, path, one, policies, reads, false)?;
        let own = vec![Vec::new(); limits.len()];
        return Some((limits, tiers.map(Arc::new), own));
    };
    let beside = [
        ("policy", written.policy.is_some()),
        ("tiers", written.tiers.is_some()),
        ("subject", written.subject.is_some()),
        ("cost", written.cost.is_some()),
        ("charge", written.charge.is_some()),
    ];
    let mut ok = true;
    for (key, present) in beside {
        if present {
            ok = false;
            cx.error(
                &path.key(key),
                At::Key,
                format!("`{key}` is written beside `limits`; give it in each limit instead"),
            );
        }
    }
    let at = path.key("limits");
    if list.is_empty() {
        cx.error(
            &at,
            At::Value,
            "needs at least one limit; write `policy: none` for a route without limits",
        );
        return None;
    }
    let mut out: Vec<Limit> = Vec::with_capacity(list.len());
    let mut own: Vec<Vec<IpNet>> = Vec::with_capacity(list.len());
    let mut route_tiers: Option<(usize, Tiers)> = None;
    // Where each policy was first named, so a repeat can point at it.
    let mut named: HashMap<Arc<str>, usize> = HashMap::new();
    for (i, mut raw) in list.into_iter().enumerate() {
        let item = at.index(i);
        let exempt = addresses::list(cx, &item.key("exempt"), raw.exempt.take());
        let tiered = raw.tiers.is_some();
        let key = if tiered { "tiers" } else { "policy" };
        // Named as written, so a repeat is found even beside an error.
        for name in written_names(&raw) {
            if let Some(first) = named.get(name.as_str()) {
                cx.error(
                    &item.key(key),
                    At::Value,
                    format!(
                        "policy `{name}` is already {}; a route names each policy once (its RateLimit fields and metrics tell limits apart by policy)",
                        at.index(*first)
                    ),
                );
                ok = false;
            } else {
                named.insert(name.into(), i);
            }
        }
        let (Some((limits, tiers)), Some(exempt)) =
            (entry(cx, &item, raw, policies, reads, true), exempt)
        else {
            ok = false;
            continue;
        };
        own.extend(std::iter::repeat_n(exempt, limits.len()));
        if let Some(tiers) = tiers {
            if let Some((first, _)) = &route_tiers {
                cx.error(
                    &item.key("tiers"),
                    At::Key,
                    format!(
                        "a route chooses its tier once, and {} has `tiers` already; give the other limits one policy each",
                        at.index(*first)
                    ),
                );
                ok = false;
            } else {
                route_tiers = Some((i, tiers));
            }
        }
        out.extend(limits);
    }
    ok.then(|| (out, route_tiers.map(|(_, t)| Arc::new(t)), own))
}

/// The policies a `limits` item names: its `policy`, or each of its
/// tiers' (`none` is no policy).
fn written_names(raw: &raw::Limit) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut add = |name: String| {
        if name != "none" && !names.contains(&name) {
            names.push(name);
        }
    };
    if let Some(policy) = &raw.policy {
        add(policy.0.clone());
    }
    if let Some(tiers) = &raw.tiers {
        for value in tiers.policies.iter().flat_map(|m| m.values()) {
            if let serde_yaml::Value::String(name) = value {
                add(name.clone());
            }
        }
        if let Some(default) = &tiers.default {
            add(default.0.clone());
        }
    }
    names
}

/// Each limit's policy with its tier, and the tiers.
type Chosen = (Vec<(Option<u8>, LimitPolicy)>, Option<Tiers>);

/// One limit as written at `path` (a route's own keys, or an item of its
/// `limits`, `in_list`): the limits it stands for: none for `policy:
/// none`, one per tier's policy for `tiers`.
fn entry(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Limit,
    policies: &Policies,
    reads: Reads,
    in_list: bool,
) -> Option<(Vec<Limit>, Option<Tiers>)> {
    let policy_at = path.key("policy");
    // Each limit's policy with its tier; `None` when not resolved.
    let chosen: Option<Chosen> = match (&raw.policy, raw.tiers) {
        (Some(_), Some(_)) => {
            cx.error(
                &path.key("tiers"),
                At::Key,
                "`policy` and `tiers` exclude each other: write one",
            );
            None
        }
        (None, Some(tiers)) => charge::tiers(cx, &path.key("tiers"), tiers, policies, reads.jwt)
            .map(|(tiers, by_tier)| {
                let limits = by_tier
                    .into_iter()
                    .enumerate()
                    .filter_map(|(t, p)| Some((Some(t as u8), p?)))
                    .collect();
                (limits, Some(tiers))
            }),
        (None, None) if in_list => {
            cx.error(
                &policy_at,
                At::Key,
                "required key is missing (name a policy)",
            );
            None
        }
        (Some(s), None) if in_list && s.0 == "none" => {
            cx.error(
                &policy_at,
                At::Value,
                "`none` is not a limit; leave the entry out (or write `policy: none` on the route)",
            );
            None
        }
        (p, None) => route_policy(cx, &policy_at, p.as_ref(), policies)
            .map(|p| (p.into_iter().map(|p| (None, p)).collect(), None)),
    };
    let subject = super::subject::subjects(cx, &path.key("subject"), raw.subject, reads);
    let charged: Vec<&LimitPolicy> = chosen
        .iter()
        .flat_map(|(limits, _)| limits.iter().map(|(_, p)| p))
        .collect();
    let cost = charge::cost_and_charge(cx, path, raw.cost, raw.charge, &charged);
    let (chosen, tiers) = chosen?;
    let (subject, (cost, charge)) = (subject?, cost?);
    let limits = chosen
        .into_iter()
        .map(|(tier, policy)| Limit {
            policy,
            subject: subject.clone(),
            cost,
            charge: charge.clone(),
            tier,
        })
        .collect();
    Some((limits, tiers))
}

fn matcher(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Match,
    rules: &PathRules,
) -> Option<Match> {
    let methods = methods(cx, &path.key("methods"), raw.methods);
    let exact = raw
        .path
        .as_ref()
        .and_then(|s| cx.value(&path.key("path"), s, |s| exact_path(s, rules)));
    let prefix = raw
        .path_prefix
        .as_ref()
        .and_then(|s| cx.value(&path.key("path_prefix"), s, |s| prefix_path(s, rules)));
    let case_sensitive = cx.defaulted(
        path,
        &keys::ROUTE_MATCH_CASE_SENSITIVE,
        raw.case_sensitive.as_ref(),
        check::boolean,
    );
    let format_suffix = cx.defaulted(
        path,
        &keys::ROUTE_MATCH_FORMAT_SUFFIX,
        raw.format_suffix.as_ref(),
        check::boolean,
    );
    if raw.path.is_none() && raw.path_prefix.is_none() && format_suffix == Some(true) {
        cx.error(
            &path.key("format_suffix"),
            At::Key,
            "needs `path` or `path_prefix`: a format extends the path's last segment",
        );
    }
    let path_match = match (&raw.path, &raw.path_prefix) {
        (None, None) => Some(PathMatch::Any),
        (Some(_), None) => exact,
        (None, Some(_)) => prefix,
        (Some(_), Some(_)) => {
            cx.error(
                &path.key("path_prefix"),
                At::Key,
                "`path` and `path_prefix` exclude each other; write one",
            );
            None
        }
    };
    Some(Match {
        methods: methods?,
        path: path_match?,
        case_sensitive: case_sensitive?,
        format_suffix: format_suffix?,
    })
}

pub(super) fn list(path: &KeyPath, raw: ScalarList) -> Vec<(KeyPath, Scalar)> {
    match raw {
        ScalarList::One(s) => vec![(path.clone(), s)],
        ScalarList::Many(v) => v
            .into_iter()
            .enumerate()
            .map(|(i, s)| (path.index(i), s))
            .collect(),
    }
}

fn methods(cx: &mut Checker<'_>, path: &KeyPath, raw: Option<ScalarList>) -> Option<Vec<Method>> {
    let Some(raw) = raw else {
        return Some(Vec::new());
    };
    let items = list(path, raw);
    if items.is_empty() {
        cx.error(
            path,
            At::Value,
            "an empty list matches nothing; leave `methods` out to match any method",
        );
        return None;
    }
    let mut out: Vec<Method> = Vec::with_capacity(items.len());
    let mut ok = true;
    for (p, s) in &items {
        match cx.value(p, s, method) {
            Some(m) if !out.contains(&m) => out.push(m),
            Some(_) => {}
            None => ok = false,
        }
    }
    ok.then_some(out)
}

/// Methods are matched upper-case, as every standard method is written.
fn method(s: &str) -> Result<Method, String> {
    let upper = s.to_ascii_uppercase();
    if upper.is_empty() || !upper.bytes().all(|b| b.is_ascii_alphabetic() || b == b'-') {
        return Err(format!("`{s}` is not an HTTP method"));
    }
    Method::from_bytes(upper.as_bytes()).map_err(|_| format!("`{s}` is not an HTTP method"))
}

fn check_path(s: &str) -> Result<(), String> {
    if !s.starts_with('/') {
        return Err(format!("`{s}` must start with `/`"));
    }
    if let Some(bad) = s
        .chars()
        .find(|c| matches!(c, '?' | '#') || c.is_whitespace())
    {
        return Err(format!(
            "`{s}` contains `{bad}`; a path has no query, fragment or spaces"
        ));
    }
    if s.contains(';') {
        return Err(format!(
            "`{s}` contains `;`; path parameters are left out of matching (server.paths.path_parameters)"
        ));
    }
    // Glob and regex syntax would be taken literally, and the route would
    // never match: requests would fall to `default` without a word.
    if let Some(bad) = s.chars().find(|c| matches!(c, '*' | '[' | ']')) {
        return Err(format!(
            "`{s}` contains `{bad}`, which is matched literally: paths are not globs or patterns; write `path_prefix: /api` for everything under /api, or a template such as `/users/{{id}}` for one segment (a path that really holds `{bad}` is written percent-encoded: {})",
            match bad {
                '*' => "`%2A`",
                '[' => "`%5B`",
                _ => "`%5D`",
            }
        ));
    }
    Ok(())
}

/// `s` in the form request paths are matched in, so `/log%69n` in the file
/// means `/login`; without its trailing slash (a route matches with or
/// without one), except the root.
fn normal_path(s: &str, rules: &PathRules) -> Result<String, String> {
    let normal = path::normalize(s, rules).map_err(|e| format!("`{s}`: {e}"))?;
    let matching = normal.matching.trim_end_matches('/');
    Ok(if matching.is_empty() { "/" } else { matching }.to_owned())
}

/// `/login` (exact) or `/users/{id}` (a template).
fn exact_path(s: &str, rules: &PathRules) -> Result<PathMatch, String> {
    // `OPTIONS *` (the server, not a resource) goes to the app only under
    // a route written for it: sluice answers it otherwise.
    if s == "*" {
        return Ok(PathMatch::Exact(s.to_owned()));
    }
    check_path(s)?;
    if !s.contains(['{', '}']) {
        return Ok(PathMatch::Exact(normal_path(s, rules)?));
    }
    let mut segments = Vec::new();
    let mut params: Vec<&str> = Vec::new();
    let body = s[1..].strip_suffix('/').unwrap_or(&s[1..]);
    for part in body.split('/') {
        match part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
            Some(name) => {
                let valid =
                    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !valid {
                    return Err(format!(
                        "`{{{name}}}` in `{s}`: a parameter name is letters, digits and `_`"
                    ));
                }
                if params.contains(&name) {
                    return Err(format!("`{{{name}}}` appears twice in `{s}`"));
                }
                params.push(name);
                segments.push(Segment::Param(name.to_owned()));
            }
            None if part.contains(['{', '}']) => {
                return Err(format!(
                    "`{part}` in `{s}`: a `{{name}}` parameter must be a whole segment"
                ))
            }
            None => {
                // A template is matched segment by segment: each literal
                // must stay one segment once normalized.
                let not_one = format!("`{s}`: `{part}` is not a path segment a template can match");
                if matches!(part, "" | "." | "..") {
                    return Err(not_one);
                }
                let segment = format!("/{part}");
                let normal = path::normalize(&segment, rules).map_err(|e| format!("`{s}`: {e}"))?;
                let literal = &normal.matching[1..];
                if literal.is_empty() || literal.contains('/') {
                    return Err(not_one);
                }
                segments.push(Segment::Literal(literal.to_owned()));
            }
        }
    }
    Ok(PathMatch::Template(segments))
}

/// Segment-aware prefix, kept without its trailing slash (`/` stays `/`).
fn prefix_path(s: &str, rules: &PathRules) -> Result<PathMatch, String> {
    check_path(s)?;
    if s.contains(['{', '}']) {
        return Err(format!(
            "`{s}`: `{{name}}` parameters work in `path`, not in `path_prefix`"
        ));
    }
    Ok(PathMatch::Prefix(normal_path(s, rules)?))
}
