//! The route table `sluice check` prints: what each route matches, who it
//! counts, and under which limits. A route with several limits takes one
//! line per limit, the route's own columns written on the first only.

use super::Config;
use crate::limit::{Bands, LimitPolicy};
use crate::route::{Limit, PathMatch, Route, Segment, SubjectSource};

const HEADER: [&str; 10] = [
    "ROUTE", "METHODS", "PATH", "SUBJECT", "POLICY", "LIMITS", "COST", "SHADOW", "REVISION",
    "UPGRADES",
];

pub fn route_table(config: &Config) -> String {
    let rows: Vec<[String; 10]> = std::iter::once(HEADER.map(str::to_owned))
        .chain(
            config
                .live
                .routes
                .iter()
                .chain(std::iter::once(&config.live.default))
                .flat_map(rows),
        )
        .collect();
    let mut widths = [0usize; 10];
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

fn rows(route: &Route) -> Vec<[String; 10]> {
    let methods = if route.matcher.methods.is_empty() {
        "*".to_owned()
    } else {
        let names: Vec<&str> = route.matcher.methods.iter().map(|m| m.as_str()).collect();
        names.join(",")
    };
    let path = if route.matcher.case_sensitive {
        path(&route.matcher.path)
    } else {
        format!("{} (any case)", path(&route.matcher.path))
    };
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
    ];
    let limits: Vec<[String; 6]> = if route.limits.is_empty() {
        vec![unlimited]
    } else {
        route.limits.iter().map(limit).collect()
    };
    limits
        .into_iter()
        .enumerate()
        .map(|(i, [subject, policy, limits, cost, shadow, revision])| {
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
                revision,
                own(&upgrades),
            ]
        })
        .collect()
}

/// SUBJECT, POLICY, LIMITS, COST, SHADOW and REVISION of one limit.
fn limit(limit: &Limit) -> [String; 6] {
    let subject: Vec<String> = limit.subject.iter().map(subject).collect();
    let (limits, shadow, revision) = match &limit.policy {
        LimitPolicy::Rate(p) => (
            limits(p.bands()),
            if p.shadow { "yes" } else { "no" }.to_owned(),
            p.revision.to_string(),
        ),
        LimitPolicy::Concurrency(c) => (
            format!("concurrency {} in flight", c.limit),
            "no".to_owned(),
            "-".to_owned(),
        ),
    };
    [
        subject.join(","),
        limit.policy.name().to_string(),
        limits,
        limit.cost.to_string(),
        shadow,
        revision,
    ]
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
    match s {
        SubjectSource::ClientIp => "client_ip".to_owned(),
        SubjectSource::Header(name) => format!("header:{name}"),
        SubjectSource::Global => "global".to_owned(),
    }
}

/// `fixed-window 10/1s + 1000/1h`, `token-bucket 5 (+1/10s)`,
/// `gcra 60/1m burst 10`: each band as its algorithm describes it.
fn limits(bands: &Bands) -> String {
    let each: Vec<String> = bands
        .profiles()
        .into_iter()
        .map(|b| b.description)
        .collect();
    format!("{} {}", bands.algorithm().name(), each.join(" + "))
}
