//! The configuration as text: YAML with the comments that say what was
//! mapped how, and what was not. Every value that came from a manifest is
//! written as a JSON string (JSON is YAML) or a number, and every comment
//! on one line, so no manifest can change the file's structure.

use std::fmt::Write as _;

use super::annotations::{self, one_line, Limits};
use super::names::Names;
use super::read::{Backend, Ingress};

/// How a route matches, and how nginx ranks it against the others.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Matcher {
    Exact(String),
    Prefix(String),
    Any,
}

impl Matcher {
    /// nginx's order: exact locations, then the longest prefix; the
    /// default backend last.
    fn rank(&self) -> (u8, std::cmp::Reverse<usize>) {
        match self {
            Matcher::Exact(p) => (0, std::cmp::Reverse(p.len())),
            Matcher::Prefix(p) => (1, std::cmp::Reverse(p.len())),
            Matcher::Any => (2, std::cmp::Reverse(0)),
        }
    }

    /// The route's `match`, with the rule's host when it names one.
    fn yaml(&self, host: Option<&str>) -> Option<String> {
        let mut keys = Vec::new();
        if let Some(host) = host {
            keys.push(format!("hosts: [{}]", quoted(host)));
        }
        match self {
            Matcher::Exact(p) => keys.push(format!("path: {}", quoted(p))),
            Matcher::Prefix(p) => keys.push(format!("path_prefix: {}", quoted(p))),
            Matcher::Any => {}
        }
        (!keys.is_empty()).then(|| format!("{{ {} }}", keys.join(", ")))
    }
}

/// One route to write.
struct Route {
    /// The rule's host, lower-case; `None` for a rule without one.
    host: Option<String>,
    matcher: Matcher,
    comments: Vec<String>,
    name: String,
    policies: Vec<String>,
    exempt: Vec<String>,
}

pub fn configuration(files: &[&str], ingresses: &[Ingress], skipped: &[String]) -> String {
    let mut out = String::new();
    header(&mut out, files, skipped);
    let mut names = Names::default();
    let mut policies = String::new();
    let mut routes: Vec<Route> = Vec::new();
    for ingress in ingresses {
        let limits = annotations::read(ingress);
        let base = names_base(ingress);
        let _ = writeln!(
            policies,
            "  # Ingress {} ({})",
            ingress.id(),
            ingress.origin
        );
        for (annotation, why) in &limits.not_carried {
            let _ = writeln!(
                policies,
                "  # sluice import: not carried over: {annotation}: {}",
                one_line(why)
            );
        }
        let own = write_policies(&mut policies, &mut names, &base, &limits);
        let exempt: Vec<String> = limits.whitelist.iter().map(ToString::to_string).collect();
        for (i, (host, matcher, mut comments)) in paths(ingress).into_iter().enumerate() {
            comments.insert(0, format!("Ingress {}", ingress.id()));
            routes.push(Route {
                name: names.unique(&format!("{base}-{i}")),
                host,
                matcher,
                comments,
                policies: own.clone(),
                exempt: exempt.clone(),
            });
        }
    }
    out.push_str("policies:");
    if policies.lines().all(|l| l.trim_start().starts_with('#')) {
        out.push_str(" {}\n");
        out.push_str(&policies);
    } else {
        out.push('\n');
        out.push_str(&policies);
    }
    // nginx picks the server by host first (an exact name, then a
    // wildcard, then the default server), then the location by path;
    // sluice takes the first route that matches, so that order is the
    // file's. Stable: among equals, the order of the files.
    routes.sort_by_key(|r| (host_rank(r.host.as_deref()), r.matcher.rank()));
    write_routes(&mut out, &routes);
    out
}

fn header(out: &mut String, files: &[&str], skipped: &[String]) {
    let _ = writeln!(
        out,
        "# Written by `sluice import ingress-nginx` from {}.",
        one_line(&files.join(", "))
    );
    out.push_str(
        "# Check it with `sluice check --config FILE`, and read every comment:\n\
         # - a request over a rate limit gets 429 (ingress-nginx answered 503, its\n\
         #   limit-req-status-code); over limit-connections, 503 with Retry-After.\n\
         # - counts live in each sidecar (the memory store), as ingress-nginx kept\n\
         #   them in each controller replica; `store.kind: redis` shares them\n\
         #   between the app's replicas.\n\
         # - ingress-nginx counted a client once for every path of an Ingress;\n\
         #   here each route counts on its own.\n\
         # - routes match on each rule's host and path, in nginx's order: a\n\
         #   named host first, then a wildcard, then any host.\n",
    );
    for object in skipped {
        let _ = writeln!(
            out,
            "# skipped, not an Ingress this import reads: {}",
            one_line(object)
        );
    }
    out.push_str(
        "version: 1\n\
         server:\n  listen: 0.0.0.0:8080\n  admin: 0.0.0.0:9901\n\
         upstream:\n  # The app beside sluice in the pod: set its port.\n  url: http://127.0.0.1:3000\n\
         identity:\n\
         \x20 # The proxies in front of sluice (the load balancer or ingress that\n\
         \x20 # replaces ingress-nginx): their X-Forwarded-For, or PROXY header,\n\
         \x20 # names the client every limit below counts, as ingress-nginx's\n\
         \x20 # real-IP settings did. Until then the client is the TCP peer.\n\
         \x20 trusted_proxies: []\n",
    );
}

/// The base of an Ingress's policy and route names: `namespace.name`.
fn names_base(ingress: &Ingress) -> String {
    match &ingress.metadata.namespace {
        Some(ns) => format!("{ns}.{}", ingress.metadata.name),
        None => ingress.metadata.name.clone(),
    }
}

/// The Ingress's policies, written into `out`; their names.
fn write_policies(out: &mut String, names: &mut Names, base: &str, limits: &Limits) -> Vec<String> {
    let mut own = Vec::new();
    for (rate, window, annotation) in [
        (limits.rps, "1s", "limit-rps"),
        (limits.rpm, "1m", "limit-rpm"),
    ] {
        let Some(rate) = rate else { continue };
        let name = names.unique(&format!("{base}-{}", &annotation[6..]));
        let _ = writeln!(
            out,
            "  # {annotation} {rate} with limit-burst-multiplier {}: nginx's burst={} nodelay lets {} through at once",
            limits.multiplier,
            limits.nginx_burst(rate),
            limits.gcra_burst(rate),
        );
        let _ = writeln!(
            out,
            "  {name}: {{ algorithm: gcra, limit: {rate}, window: {window}, burst: {} }}",
            limits.gcra_burst(rate)
        );
        own.push(name);
    }
    if let Some(connections) = limits.connections {
        let name = names.unique(&format!("{base}-connections"));
        let _ = writeln!(
            out,
            "  # limit-connections {connections}: ingress-nginx counted connections per client\n  \
             # address in each controller replica; this counts the client's requests in\n  \
             # flight to the app in each sidecar (per pod, not per controller)"
        );
        let _ = writeln!(
            out,
            "  {name}: {{ algorithm: concurrency, limit: {connections} }}"
        );
        own.push(name);
    }
    own
}

/// A DNS name, or `*.` and one: what `match.hosts` takes.
fn host_name(h: &str) -> bool {
    let name = h.strip_prefix("*.").unwrap_or(h);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn host_rank(host: Option<&str>) -> u8 {
    match host {
        Some(h) if h.starts_with("*.") => 1,
        Some(_) => 0,
        None => 2,
    }
}

/// One matcher per path of each rule, with its host and comments; the
/// default backend as a route for any host and path. A path sluice cannot
/// match is left out, said in a comment of the route list.
fn paths(ingress: &Ingress) -> Vec<(Option<String>, Matcher, Vec<String>)> {
    let regex = ingress.annotation("use-regex").as_deref() == Some("true");
    let mut out = Vec::new();
    for rule in &ingress.spec.rules {
        let written = rule
            .host
            .as_deref()
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_ascii_lowercase);
        // A host sluice would refuse is said, and the route matches any.
        let host = written.clone().filter(|h| host_name(h));
        let said = match (&host, &written) {
            (None, Some(h)) => format!(
                "sluice import: not carried over: host {}: not a host name; this route matches any host",
                one_line(h)
            ),
            _ => String::new(),
        };
        let said = match &host {
            _ if !said.is_empty() => said,
            // Kubernetes' `*.example.com` stands for one label; sluice's
            // for one or more.
            Some(h) if h.starts_with("*.") => format!(
                "host {}: sluice's wildcard also takes deeper names (a.b.{})",
                one_line(h),
                one_line(&h[2..])
            ),
            Some(h) => format!("host {}", one_line(h)),
            None => "any host".to_owned(),
        };
        for path in rule.http.iter().flat_map(|h| &h.paths) {
            let mut comments = vec![said.clone(), backend(&path.backend)];
            let written = path.path.clone().unwrap_or_else(|| "/".to_owned());
            let kind = path
                .path_type
                .as_deref()
                .unwrap_or("ImplementationSpecific");
            if let Some(why) = unmatchable(&written, regex) {
                comments.push(format!(
                    "sluice import: not carried over: path {} ({kind}): {why}",
                    quoted(&one_line(&written))
                ));
                out.push((host.clone(), Matcher::Any, comments));
                continue;
            }
            let matcher = match kind {
                "Exact" => Matcher::Exact(written),
                "Prefix" => Matcher::Prefix(written),
                other => {
                    comments.push(format!(
                        "pathType {}: read as a prefix, as ingress-nginx reads a path without use-regex",
                        one_line(other)
                    ));
                    Matcher::Prefix(written)
                }
            };
            out.push((host.clone(), matcher, comments));
        }
    }
    if let Some(default) = &ingress.spec.default_backend {
        out.push((
            None,
            Matcher::Any,
            vec![
                "the Ingress's default backend: any path the rules above do not take".to_owned(),
                backend(default),
            ],
        ));
    }
    out
}

fn backend(backend: &Backend) -> String {
    format!(
        "backend {}: keep this route only in the sidecar of that app",
        one_line(&backend.describe())
    )
}

/// Why sluice cannot match `path` as written, if it cannot.
fn unmatchable(path: &str, regex: bool) -> Option<&'static str> {
    if !path.starts_with('/') {
        return Some("not a path starting with `/`");
    }
    let special = |c: char| "*[](){}^$|?+\\#;".contains(c) || c.is_whitespace();
    if path.chars().any(special) {
        return Some(if regex {
            "a regular expression (use-regex): write the routes it stands for by hand"
        } else {
            "characters a sluice path does not take"
        });
    }
    None
}

fn write_routes(out: &mut String, routes: &[Route]) {
    if routes.is_empty() {
        out.push_str("routes: []\n");
        return;
    }
    out.push_str("routes:\n");
    for (i, route) in routes.iter().enumerate() {
        let skipped = route
            .comments
            .iter()
            .any(|c| c.starts_with("sluice import: not carried over: path"));
        for comment in &route.comments {
            let _ = writeln!(out, "  # {}", one_line_long(comment));
        }
        if skipped {
            continue;
        }
        if let Some(first) = routes[..i].iter().find(|r| {
            r.matcher == route.matcher
                && r.host == route.host
                && !r
                    .comments
                    .iter()
                    .any(|c| c.contains("not carried over: path"))
        }) {
            let _ = writeln!(
                out,
                "  # never reached as written: route {} above matches the same host and paths",
                first.name
            );
        }
        let _ = writeln!(out, "  - name: {}", route.name);
        if let Some(matcher) = route.matcher.yaml(route.host.as_deref()) {
            let _ = writeln!(out, "    match: {matcher}");
        }
        if route.policies.is_empty() {
            out.push_str("    policy: none\n");
            continue;
        }
        if !route.exempt.is_empty() {
            let list: Vec<String> = route.exempt.iter().map(|e| quoted(e)).collect();
            let _ = writeln!(out, "    exempt: [{}]", list.join(", "));
        }
        out.push_str("    limits:\n");
        for policy in &route.policies {
            let _ = writeln!(out, "      - {{ policy: {policy}, subject: client_ip }}");
        }
    }
}

/// A comment line: control characters flattened, length kept.
fn one_line_long(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// `s` as a YAML (JSON) double-quoted string.
fn quoted(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}
