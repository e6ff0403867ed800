//! `routes:` and `default:`: each route's name, matcher ([`super::matcher`])
//! and limits (policy, subject, cost), written as `policy` + `subject` or
//! as a `limits:` list.

use std::collections::HashMap;
use std::sync::Arc;

use ipnet::IpNet;
use serde_yaml::Value;

use super::addresses;
use super::charge;
use super::check::{self, Checker};
use super::policy::{route_policy, Policies};
use super::upgrades::{default_upgrades, upgrades};
use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, Scalar};
use crate::config::Underscores;
use crate::limit::LimitPolicy;
use crate::path::PathRules;
use crate::route::{Answers, Limit, Match, Route, Tiers};

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
            Some(m) => super::matcher::matcher(cx, &at.key("match"), m, rules),
        };
        let upgrades = upgrades(cx, &at.key("upgrades"), raw.upgrades);
        let answers = own_answers(cx, &at.key("responses"), raw.responses);
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
        if let (
            Some(name),
            Some(matcher),
            Some((limits, tiers, own)),
            Some(upgrades),
            Some(answers),
        ) = (name, matcher, limits, upgrades, answers)
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
                answers,
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
                answers: Answers::default(),
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
    let answers = own_answers(cx, &path.key("responses"), raw.responses);
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
        answers: answers?,
        addresses,
    })
}

/// A route's own `responses:` (`refused`, `unavailable`); the global ones
/// fill in what it leaves out once every section is read.
fn own_answers(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<raw::RouteResponses>,
) -> Option<Answers> {
    match raw {
        None => Some(Answers::default()),
        Some(raw) => super::sections::answers(cx, path, raw.refused, raw.unavailable),
    }
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
