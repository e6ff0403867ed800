//! The route table `sluice check` prints: what each route matches, who it
//! counts, and under which limits.

use super::Config;
use crate::limit::Bands;
use crate::route::{PathMatch, Route, Segment, SubjectSource};

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
                .map(row),
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

fn row(route: &Route) -> [String; 10] {
    let methods = if route.matcher.methods.is_empty() {
        "*".to_owned()
    } else {
        let names: Vec<&str> = route.matcher.methods.iter().map(|m| m.as_str()).collect();
        names.join(",")
    };
    let subject: Vec<String> = route.subject.iter().map(subject).collect();
    let (policy, limits, cost, shadow, revision) = match &route.policy {
        None => (
            "none".to_owned(),
            "unlimited".to_owned(),
            "-".to_owned(),
            "-".to_owned(),
            "-".to_owned(),
        ),
        Some(p) => (
            p.name.to_string(),
            limits(p.bands()),
            route.cost.to_string(),
            if p.shadow { "yes" } else { "no" }.to_owned(),
            p.revision.to_string(),
        ),
    };
    [
        route.name.to_string(),
        methods,
        if route.matcher.case_sensitive {
            path(&route.matcher.path)
        } else {
            format!("{} (any case)", path(&route.matcher.path))
        },
        subject.join(","),
        policy,
        limits,
        cost,
        shadow,
        revision,
        if route.upgrades.is_empty() {
            "-".to_owned()
        } else {
            route.upgrades.join(",")
        },
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
