//! The route table `sluice check` prints: what each route matches, who it
//! counts, under which limits, and what each limit does when the store
//! cannot decide. A route with several limits takes one line per limit,
//! the route's own columns written on the first only.

mod addresses;

use std::num::NonZeroU32;

use super::{Config, OnFailure, StoreLive};
use crate::limit::{Bands, LimitPolicy};
use crate::route::{
    Conditions, Limit, PathMatch, Route, Segment, SubjectSource, TierBy, Tiers, Wanted,
};

pub use addresses::address_notes;

const COLUMNS: usize = 11;

const HEADER: [&str; COLUMNS] = [
    "ROUTE",
    "METHODS",
    "PATH",
    "SUBJECT",
    "POLICY",
    "LIMITS",
    "COST",
    "SHADOW",
    "ON_FAILURE",
    "REVISION",
    "UPGRADES",
];

pub fn route_table(config: &Config) -> String {
    let store = &config.live.store;
    let rows: Vec<[String; COLUMNS]> = std::iter::once(HEADER.map(str::to_owned))
        .chain(
            config
                .live
                .routes
                .iter()
                .chain(std::iter::once(&config.live.default))
                .flat_map(|route| rows(route, store)),
        )
        .collect();
    let mut widths = [0usize; COLUMNS];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            line.push_str(cell);
            if i + 1 < row.len() {
                line.extend(std::iter::repeat_n(' ', w - cell.chars().count()));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// For each policy that counts, which changes of it start its subjects'
/// counts afresh on a reload (a new revision) and which keep them. A
/// limit raised mid-incident should not forget who was over it; the
/// operator reads before the change which it will be.
pub fn count_notes(config: &Config) -> String {
    let mut out = String::from(
        "Counts survive a reload that changes a policy's other numbers; these start them afresh:\n",
    );
    let policies = &config.live.policies;
    let width = policies.iter().map(|p| p.name.len()).max().unwrap_or(0);
    for policy in policies {
        let algorithm = policy.algorithm();
        let resets = if *policy.revision != *super::validate::derived_revision(policy.bands()) {
            "a change of its written `revision` only".to_owned()
        } else {
            let mut keys: Vec<String> = algorithm
                .reset_by()
                .iter()
                .map(|k| format!("`{k}`"))
                .collect();
            keys.push("the algorithm".to_owned());
            keys.push("the number or order of bands".to_owned());
            keys.join(", ")
        };
        out += &format!(
            "  {name:width$}  {algorithm:15}  {resets}\n",
            name = policy.name,
            algorithm = algorithm.name(),
        );
    }
    out
}

/// What `sluice check` warns of: a route whose tiers name no
/// `trusted_from`, and so never believe their header; verified tokens
/// checked for no audience or no issuer. Empty when none.
pub fn tier_warnings(config: &Config) -> String {
    let mut out = String::new();
    if let Some(jwt) = &config.live.identity.jwt {
        if !jwt.checks_audience() {
            out += "warning: identity.jwt without `audiences`: a token the issuer made for any other service counts here too\n";
        }
        if !jwt.checks_issuer() {
            out += "warning: identity.jwt without `issuer`: a token any holder of these keys signed counts\n";
        }
    }
    for route in config
        .live
        .routes
        .iter()
        .chain(std::iter::once(&config.live.default))
    {
        if let Some(TierBy::Header { name, trusted_from }) = route.tiers.as_ref().map(|t| &t.by) {
            if trusted_from.is_empty() {
                out += &format!(
                    "warning: route `{}`: tiers by `{}` without `trusted_from`: the header is never believed, every request gets the default tier `{}`\n",
                    route.name,
                    name,
                    route.tiers.as_ref().map_or("", |t| &*t.names[usize::from(t.default)]),
                );
            }
        }
    }
    out
}

fn rows(route: &Route, store: &StoreLive) -> Vec<[String; COLUMNS]> {
    let methods = if route.matcher.methods.is_empty() {
        "*".to_owned()
    } else {
        let names: Vec<&str> = route.matcher.methods.iter().map(|m| m.as_str()).collect();
        names.join(",")
    };
    let mut path = path(&route.matcher.path);
    if route.matcher.format_suffix {
        path.push_str("(.format)");
    }
    // Any case is the default: the exception is the one marked.
    if route.matcher.case_sensitive {
        path.push_str(" (exact case)");
    }
    if !route.matcher.conditions.is_empty() {
        path.push(' ');
        path.push_str(&conditions(&route.matcher.conditions));
    }
    let upgrades = if route.upgrades.is_empty() {
        "-".to_owned()
    } else {
        route.upgrades.join(",")
    };
    let unlimited = [
        "-".to_owned(),
        "none".to_owned(),
        "unlimited".to_owned(),
        "-".to_owned(),
        "-".to_owned(),
        "-".to_owned(),
        "-".to_owned(),
    ];
    let mut limits: Vec<[String; 7]> = route.limits.iter().map(|l| limit(l, store)).collect();
    if let Some(tiers) = &route.tiers {
        // `p_pro (x-plan: pro,enterprise)`; the default tier says so.
        for (l, row) in route.limits.iter().zip(&mut limits) {
            if let Some(tier) = l.tier {
                row[1] = format!("{} ({})", row[1], tier_values(tiers, tier));
            }
        }
        for (tier, name) in tiers.names.iter().enumerate() {
            if &**name == "none" {
                let mut row = unlimited.clone();
                row[1] = format!("none ({})", tier_values(tiers, tier as u8));
                limits.push(row);
            }
        }
    }
    if limits.is_empty() {
        limits.push(unlimited);
    }
    limits
        .into_iter()
        .enumerate()
        .map(
            |(i, [subject, policy, limits, cost, shadow, failure, revision])| {
                let own = |cell: &String| if i == 0 { cell.clone() } else { String::new() };
                [
                    own(&route.name.to_string()),
                    own(&methods),
                    own(&path),
                    subject,
                    policy,
                    limits,
                    cost,
                    shadow,
                    failure,
                    revision,
                    own(&upgrades),
                ]
            },
        )
        .collect()
}

/// `[host api.example.com|*.example.com; x-tenant: gold; x-key present;
/// ?version=2]`: the conditions beyond the path, all of which must hold.
fn conditions(c: &Conditions) -> String {
    let wanted = |w: &Wanted, sep: &str| match w {
        Wanted::Value(v) => format!("{sep}{}", String::from_utf8_lossy(v)),
        Wanted::Present => " present".to_owned(),
    };
    let mut parts: Vec<String> = Vec::new();
    if !c.hosts.is_empty() {
        let hosts: Vec<String> = c.hosts.iter().map(ToString::to_string).collect();
        parts.push(format!("host {}", hosts.join("|")));
    }
    for (name, w) in &c.headers {
        parts.push(format!("{name}{}", wanted(w, ": ")));
    }
    for (name, w) in &c.query {
        parts.push(format!(
            "?{}{}",
            String::from_utf8_lossy(name),
            wanted(w, "=")
        ));
    }
    format!("[{}]", parts.join("; "))
}

/// SUBJECT, POLICY, LIMITS, COST, SHADOW, ON_FAILURE and REVISION of one
/// limit.
fn limit(limit: &Limit, store: &StoreLive) -> [String; 7] {
    let subject: Vec<String> = limit.subject.iter().map(subject).collect();
    let (limits, shadow, failure, revision) = match &limit.policy {
        LimitPolicy::Rate(p) => (
            match p.lease {
                // `50000 (+5000/1s) leased 250ms ≤10%`
                // `50000 (+5000/1s) leased 250ms ≤10% (auto)`
                Some(lease) => format!(
                    "{} leased {} ≤{}%{}",
                    limits(p.bands()),
                    humantime::format_duration(lease.ttl),
                    lease.max_share,
                    if lease.auto { " (auto)" } else { "" }
                ),
                None => limits(p.bands()),
            },
            if p.shadow { "yes" } else { "no" }.to_owned(),
            on_failure(
                p.failure_mode(store.on_failure),
                p.bands(),
                store.local_share,
            ),
            p.revision.to_string(),
        ),
        // Counted in this process: there is no store to fail.
        LimitPolicy::Concurrency(c) => (
            format!("concurrency {} in flight", c.limit),
            "no".to_owned(),
            "-".to_owned(),
            "-".to_owned(),
        ),
    };
    [
        subject.join(","),
        limit.policy.name().to_string(),
        limits,
        cost(limit),
        shadow,
        failure,
        revision,
    ]
}

/// `2`; charged on response: `1 on 401,403`, `x-tokens-used ≤4000 on response`.
fn cost(limit: &Limit) -> String {
    let Some(on) = limit.on_response() else {
        return limit.cost.to_string();
    };
    let units = match &on.from_header {
        None => limit.cost.to_string(),
        Some(from) => format!("{} ≤{} (else {})", from.header, from.max, from.default),
    };
    match &on.statuses {
        None => format!("{units} on response"),
        Some(statuses) => {
            let statuses: Vec<String> = statuses.iter().map(u16::to_string).collect();
            format!("{units} on {}", statuses.join(","))
        }
    }
}

/// `x-plan: pro,enterprise`, and `default` for the default tier.
fn tier_values(tiers: &Tiers, tier: u8) -> String {
    let mut values: Vec<&str> = tiers
        .values
        .iter()
        .filter(|(_, t)| *t == tier)
        .map(|(v, _)| &**v)
        .collect();
    if tiers.default == tier {
        values.push("default");
    }
    let by = match &tiers.by {
        TierBy::Header { name, .. } => name.to_string(),
        TierBy::Claim(claim) => format!("jwt:{claim}"),
    };
    format!("{by}: {}", values.join(","))
}

/// `deny`, `allow`, or `local ÷3: 10/1m`: the quota this sidecar enforces
/// alone, each band divided by `local_share` as the fallback divides it.
fn on_failure(mode: OnFailure, bands: &Bands, share: NonZeroU32) -> String {
    match mode {
        OnFailure::Deny | OnFailure::Allow => mode.name().to_owned(),
        OnFailure::Local => format!("local ÷{share}: {}", band_list(&bands.shared(share))),
    }
}

fn path(p: &PathMatch) -> String {
    match p {
        PathMatch::Any => "any".to_owned(),
        PathMatch::Exact(s) => format!("exact {s}"),
        PathMatch::Prefix(s) => format!("prefix {s}"),
        PathMatch::Template(segments) => {
            let parts: Vec<String> = segments
                .iter()
                .map(|s| match s {
                    Segment::Literal(l) => l.clone(),
                    Segment::Param(p) => format!("{{{p}}}"),
                })
                .collect();
            format!("template /{}", parts.join("/"))
        }
    }
}

fn subject(s: &SubjectSource) -> String {
    s.to_string()
}

/// `fixed-window 10/1s + 1000/1h`, `token-bucket 5 (+1/10s)`,
/// `gcra 60/1m burst 10`: each band as its algorithm describes it.
fn limits(bands: &Bands) -> String {
    format!("{} {}", bands.algorithm().name(), band_list(bands))
}

/// Each band as its algorithm describes it, joined by ` + `.
fn band_list(bands: &Bands) -> String {
    let each: Vec<String> = bands
        .profiles()
        .into_iter()
        .map(|b| b.description)
        .collect();
    each.join(" + ")
}

/// What `sluice check` says of the answers in place of sluice's own: per
/// route, its `refused` and `unavailable` (the global ones included, as
/// merged), and the policies never announced (`headers: off`). Empty when
/// there are none.
pub fn answer_notes(config: &Config) -> String {
    let routes: Vec<&Route> = config
        .live
        .routes
        .iter()
        .chain(std::iter::once(&config.live.default))
        .collect();
    let mut out = String::new();
    let custom: Vec<&&Route> = routes
        .iter()
        .filter(|r| r.answers.refused.is_some() || r.answers.unavailable.is_some())
        .collect();
    if !custom.is_empty() {
        out += "Answered in place of sluice's own problem+json:\n";
        let width = custom.iter().map(|r| r.name.len()).max().unwrap_or(0);
        for route in custom {
            let mut parts = Vec::new();
            if let Some(answer) = &route.answers.refused {
                parts.push(format!(
                    "refused {}",
                    answer_text(answer, "429 (a concurrency limit: 503)")
                ));
            }
            if let Some(answer) = &route.answers.unavailable {
                parts.push(format!("unavailable {}", answer_text(answer, "503")));
            }
            out += &format!("  {:width$}  {}\n", route.name, parts.join("; "));
        }
    }
    let mut silent: Vec<&str> = Vec::new();
    for limit in routes.iter().flat_map(|r| &r.limits) {
        let name = &**limit.policy.name();
        if !limit.policy.announced() && !silent.contains(&name) {
            silent.push(name);
        }
    }
    if !silent.is_empty() {
        out += &format!(
            "Never announced (headers: off: no RateLimit, RateLimit-Policy or Retry-After): {}\n",
            silent.join(", ")
        );
    }
    out
}

/// `403 text/html from /etc/429.html (1234 bytes), +2 fields`.
fn answer_text(answer: &crate::route::CustomAnswer, usual: &str) -> String {
    let status = answer
        .status
        .map_or_else(|| usual.to_owned(), |s| s.as_u16().to_string());
    let mut out = match &answer.body {
        Some(body) => format!(
            "{status} {} from {} ({} bytes)",
            body.content_type.to_str().unwrap_or("?"),
            body.file.display(),
            body.bytes.len()
        ),
        None => format!("{status} problem+json"),
    };
    if !answer.headers.is_empty() {
        let names: Vec<&str> = answer.headers.iter().map(|(n, _)| n.as_str()).collect();
        out += &format!(", with {}", names.join(", "));
    }
    out
}
