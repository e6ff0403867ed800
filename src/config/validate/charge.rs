//! What a limit charges and when (`cost`, `charge`), and a route's
//! `tiers`: the parts of a limit that read the request's or the
//! response's headers.

use std::sync::Arc;

use http::HeaderName;
use serde_yaml::Value;

use super::check::{self, Checker};
use super::policy::{Found, Policies};
use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, OneOr, Scalar, ScalarList};
use crate::limit::LimitPolicy;
use crate::route::{Charge, OnResponse, ResponseCost, TierBy, Tiers};

/// `cost` and `charge` of a limit at `path` charging `policies` (one, or
/// one per tier; empty when none could be resolved, whose errors already
/// stand): the units checked or charged before forwarding, and when the
/// limit is charged.
pub fn cost_and_charge(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    cost: Option<raw::Cost>,
    charge: Option<raw::Charge>,
    policies: &[&LimitPolicy],
) -> Option<(u32, Charge)> {
    let cost_at = path.key("cost");
    let concurrency = policies.iter().find_map(|p| match p {
        LimitPolicy::Concurrency(c) => Some(c.name.clone()),
        LimitPolicy::Rate(_) => None,
    });
    if let Some(name) = &concurrency {
        let mut ok = true;
        if cost.is_some() {
            cx.error(
                &cost_at,
                At::Key,
                format!("`cost` does not apply to concurrency policy `{name}`: a request in flight is one request"),
            );
            ok = false;
        }
        if charge.is_some() {
            cx.error(
                &path.key("charge"),
                At::Key,
                format!("`charge` does not apply to concurrency policy `{name}`: its place is held while the request is in flight"),
            );
            ok = false;
        }
        return ok.then_some((1, Charge::Request));
    }
    // The smallest maximum cost of the policies charged: a cost must fit
    // every tier's.
    let max_cost = policies
        .iter()
        .filter_map(|p| p.as_rate())
        .map(|p| (p.max_cost(), &p.name))
        .min_by_key(|(max, _)| *max);
    let (fixed, from_header) = match cost {
        None => (Some(1), None),
        Some(OneOr::One(s)) => {
            let fixed = cx.value(&cost_at, &s, check::number_u32(1));
            (fixed.and_then(|c| fits(cx, &cost_at, c, max_cost)), None)
        }
        Some(OneOr::Table(table)) => match response_cost(cx, &cost_at, table, max_cost) {
            Some(from) => (Some(1), Some(Some(from))),
            None => (None, Some(None)),
        },
    };
    let on = charge_on(cx, path, charge, from_header.is_some())?;
    let fixed = fixed?;
    let charge = match (on, from_header) {
        (None, None) => Charge::Request,
        // A cost from the response is charged on response (`charge_on`
        // says so when `charge` is left out).
        (statuses, from_header) => Charge::Response(Arc::new(OnResponse {
            statuses: statuses.flatten(),
            from_header: from_header.flatten(),
        })),
    };
    Some((fixed, charge))
}

/// `cost` within the maximum of the policy that has the smallest.
fn fits(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    cost: u32,
    max_cost: Option<(u32, &Arc<str>)>,
) -> Option<u32> {
    match max_cost {
        Some((max, name)) if cost > max => {
            cx.error(
                path,
                At::Value,
                format!(
                    "cost {cost} is above the maximum {max} of policy `{name}` (its smallest band)"
                ),
            );
            None
        }
        _ => Some(cost),
    }
}

/// `cost: { from_response_header, max, default, reserve }`.
fn response_cost(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::ResponseCost,
    max_cost: Option<(u32, &Arc<str>)>,
) -> Option<ResponseCost> {
    let header = cx.required(
        &path.key("from_response_header"),
        raw.from_response_header.as_ref(),
        header_name,
    );
    let max = match &raw.max {
        None => max_cost.map(|(max, _)| max),
        Some(s) => {
            let max_at = path.key("max");
            cx.value(&max_at, s, check::number_u32(1))
                .and_then(|max| fits(cx, &max_at, max, max_cost))
        }
    };
    let default = match &raw.default {
        None => max,
        Some(s) => {
            let default_at = path.key("default");
            let default = cx.value(&default_at, s, check::number_u32(0));
            match (default, max) {
                (Some(d), Some(m)) if d > m => {
                    cx.error(
                        &default_at,
                        At::Value,
                        format!("default {d} is above `max` {m}: a response is never charged more than `max`"),
                    );
                    None
                }
                (default, _) => default,
            }
        }
    };
    let reserve = match &raw.reserve {
        None => default.map(|d| d.max(1)),
        Some(s) => {
            let reserve_at = path.key("reserve");
            let reserve = cx.value(&reserve_at, s, check::number_u32(1));
            match (reserve, max) {
                (Some(r), Some(m)) if r > m => {
                    cx.error(
                        &reserve_at,
                        At::Value,
                        format!("reserve {r} is above `max` {m}: a response is never charged more than `max`"),
                    );
                    None
                }
                (reserve, _) => reserve,
            }
        }
    };
    Some(ResponseCost {
        header: header?,
        max: max?,
        default: default?,
        reserve: reserve?,
    })
}

/// `charge: { on, statuses }`: `None` when charged before forwarding,
/// else the statuses that charge (`None`: every one).
#[allow(clippy::type_complexity)]
fn charge_on(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<raw::Charge>,
    cost_from_response: bool,
) -> Option<Option<Option<Box<[u16]>>>> {
    let at = path.key("charge");
    let Some(raw) = raw else {
        return Some(cost_from_response.then_some(None));
    };
    let on = match &raw.on {
        None => Some(cost_from_response),
        Some(s) => cx.value(&at.key("on"), s, |s| match s {
            "request" => Ok(false),
            "response" => Ok(true),
            _ => Err(format!("unknown `{s}`; expected `request` or `response`")),
        }),
    }?;
    if !on && cost_from_response {
        cx.error(
            &at.key("on"),
            At::Value,
            "a cost read from the response is charged on `response`",
        );
        return None;
    }
    let statuses = match raw.statuses {
        None => None,
        Some(_) if !on => {
            cx.error(
                &at.key("statuses"),
                At::Key,
                "`statuses` needs `on: response`: a request is charged before any status is known",
            );
            return None;
        }
        Some(list) => Some(statuses(cx, &at.key("statuses"), list)?),
    };
    Some(on.then_some(statuses))
}

fn statuses(cx: &mut Checker<'_>, path: &KeyPath, raw: ScalarList) -> Option<Box<[u16]>> {
    let items: Vec<(KeyPath, Scalar)> = match raw {
        ScalarList::One(s) => vec![(path.clone(), s)],
        ScalarList::Many(v) => v
            .into_iter()
            .enumerate()
            .map(|(i, s)| (path.index(i), s))
            .collect(),
    };
    if items.is_empty() {
        cx.error(
            path,
            At::Value,
            "an empty list charges nothing; leave `statuses` out to charge every response",
        );
        return None;
    }
    let mut out = Vec::with_capacity(items.len());
    let mut ok = true;
    for (at, s) in &items {
        // 1xx are not the answer: the charge waits for the final head.
        match cx.value(at, s, check::number(200, 599)) {
            Some(n) => out.push(n as u16),
            None => ok = false,
        }
    }
    ok.then(|| out.into_boxed_slice())
}

fn header_name(s: &str) -> Result<HeaderName, String> {
    HeaderName::from_bytes(s.trim().as_bytes())
        .map_err(|_| format!("`{s}` is not a valid header name"))
}

/// `tiers: { header, policies: { VALUE: POLICY }, default }` at `path`:
/// the tiers and each tier's policy (`None` for `none`), by tier.
pub fn tiers(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: raw::Tiers,
    policies: &Policies,
    jwt: bool,
) -> Option<(Tiers, Vec<Option<LimitPolicy>>)> {
    let by = match (&raw.header, &raw.claim) {
        (Some(_), Some(_)) => {
            cx.error(
                &path.key("claim"),
                At::Key,
                "`header` and `claim` exclude each other: the tier follows one of them",
            );
            None
        }
        (None, None) => {
            cx.error(
                path,
                At::Key,
                "needs `header` (set by a gateway in `trusted_from`) or `claim` (of a verified token)",
            );
            None
        }
        (Some(header), None) => {
            let name = cx.value(&path.key("header"), header, header_name);
            let trusted_from =
                super::sections::networks(cx, &path.key("trusted_from"), raw.trusted_from);
            match (name, trusted_from) {
                (Some(name), Some(trusted_from)) => Some(TierBy::Header {
                    name,
                    trusted_from: trusted_from.into_boxed_slice(),
                }),
                _ => None,
            }
        }
        (None, Some(claim)) => {
            let at = path.key("claim");
            if raw.trusted_from.is_some() {
                cx.error(
                    &path.key("trusted_from"),
                    At::Key,
                    "a claim is believed for its token's signature, not for who sent it; `trusted_from` goes with `header`",
                );
                None
            } else if !jwt {
                cx.error(
                    &at,
                    At::Key,
                    "needs `identity.jwt`: only the claims of a verified token are read",
                );
                None
            } else {
                cx.value(&at, claim, check::text)
                    .map(|c| TierBy::Claim(c.trim().into()))
            }
        }
    };
    let mut names: Vec<String> = Vec::new();
    let mut tier_of = |name: &str| match names.iter().position(|n| n == name) {
        Some(i) => i,
        None => {
            names.push(name.to_owned());
            names.len() - 1
        }
    };
    let policies_at = path.key("policies");
    let mut values: Vec<(Box<str>, u8)> = Vec::new();
    let mut ok = true;
    match raw.policies {
        None => {
            cx.missing(&policies_at);
            ok = false;
        }
        Some(map) if map.is_empty() => {
            cx.error(
                &policies_at,
                At::Value,
                "needs at least one value; without tiers, write `policy`",
            );
            ok = false;
        }
        Some(map) => {
            for (key, value) in map {
                let Some(text) = scalar_text(&key) else {
                    cx.error(&policies_at, At::Key, "a tier's value is text");
                    ok = false;
                    continue;
                };
                let at = policies_at.key(&text);
                if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic() || b == b' ') {
                    cx.error(
                        &at,
                        At::Key,
                        format!("`{text}` cannot be a header's value: printable ASCII only"),
                    );
                    ok = false;
                    continue;
                }
                let Some(name) = scalar_text(&value) else {
                    cx.error(&at, At::Value, "expected a policy's name, or `none`");
                    ok = false;
                    continue;
                };
                values.push((text.trim().into(), tier_of(&name) as u8));
            }
        }
    }
    let default = cx.required(&path.key("default"), raw.default.as_ref(), check::name);
    let default = default.map(|d| tier_of(&d) as u8);
    if names.len() > usize::from(u8::MAX) {
        cx.error(&policies_at, At::Value, "at most 255 distinct policies");
        return None;
    }
    let mut chosen = Vec::with_capacity(names.len());
    for name in &names {
        if name == "none" {
            chosen.push(None);
            continue;
        }
        match policies.find(name) {
            Found::Valid(p) => chosen.push(Some(p.clone())),
            Found::Invalid => ok = false,
            Found::Unknown => {
                // Placed at the first value naming it, or at `default`.
                let at = values
                    .iter()
                    .position(|&(_, t)| names[usize::from(t)] == *name)
                    .map_or(path.key("default"), |i| policies_at.key(&values[i].0));
                cx.error(
                    &at,
                    At::Value,
                    format!("unknown policy `{name}`; {}", policies.known()),
                );
                ok = false;
            }
        }
    }
    if !ok {
        return None;
    }
    let tiers = Tiers {
        by: by?,
        values: values.into_boxed_slice(),
        default: default?,
        names: names.iter().map(|n| Arc::from(n.as_str())).collect(),
    };
    Some((tiers, chosen))
}

fn scalar_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}
