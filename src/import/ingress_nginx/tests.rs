//! The mapping, Ingress by Ingress: what each annotation becomes, what is
//! said of what is not carried over, and that every output loads.

use std::path::Path;

use super::*;
use crate::config::Config;
use crate::limit::LimitPolicy;
use crate::route::PathMatch;

fn ingress(annotations: &str, paths: &str) -> String {
    format!(
        "apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: app
  namespace: ns
  annotations:
{annotations}spec:
  rules:
    - host: app.example
      http:
        paths:
{paths}"
    )
}

fn path(path: &str, kind: &str) -> String {
    format!(
        "          - path: {path}
            pathType: {kind}
            backend: {{ service: {{ name: app, port: {{ number: 80 }} }} }}
"
    )
}

fn annotation(name: &str, value: &str) -> String {
    format!("    nginx.ingress.kubernetes.io/{name}: \"{value}\"\n")
}

fn imported(text: &str) -> String {
    import(&[("app.yaml".to_owned(), text.to_owned())]).expect("imports")
}

/// The import, loaded as sluice loads a file: it must pass.
fn loaded(text: &str) -> (String, Config) {
    let out = imported(text);
    match Config::parse(Path::new("imported.yaml"), &out) {
        Ok(config) => (out, config),
        Err(errors) => panic!("{errors}\n{out}"),
    }
}

fn gcra(config: &Config, name: &str) -> (u64, std::time::Duration, u64) {
    let policy = config
        .live
        .policies
        .iter()
        .find(|p| &*p.name == name)
        .unwrap_or_else(|| panic!("no policy {name}"));
    let quotas = policy.quotas();
    let (limit, window) = quotas[0];
    (u64::from(limit), window, imported_policy_line(config, name))
}

/// The `burst` the policy's `RateLimit-Policy` cannot show: read from the
/// route table `sluice check` prints.
fn imported_policy_line(config: &Config, name: &str) -> u64 {
    let table = config.route_table();
    let line = table
        .lines()
        .find(|l| l.contains(&format!(" {name} ")))
        .unwrap_or_else(|| panic!("{name} not in\n{table}"));
    let burst = line.split(" burst ").nth(1).expect("a burst");
    burst.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn rps_is_a_gcra_policy_that_admits_what_nginx_admits_at_once() {
    let text = ingress(&annotation("limit-rps", "10"), &path("/api", "Prefix"));
    let (_, config) = loaded(&text);
    // burst=50 nodelay: the request served and 50 more.
    let (limit, window, burst) = gcra(&config, "ns.app-rps");
    assert_eq!((limit, window.as_secs(), burst), (10, 1, 51));
}

#[test]
fn rpm_takes_the_burst_multiplier() {
    let annotations = annotation("limit-rpm", "6") + &annotation("limit-burst-multiplier", "1");
    let (_, config) = loaded(&ingress(&annotations, &path("/api", "Prefix")));
    let (limit, window, burst) = gcra(&config, "ns.app-rpm");
    assert_eq!((limit, window.as_secs(), burst), (6, 60, 7));
}

#[test]
fn both_rates_apply_together_with_connections_in_flight() {
    let annotations = annotation("limit-rps", "5")
        + &annotation("limit-rpm", "100")
        + &annotation("limit-connections", "3");
    let (_, config) = loaded(&ingress(&annotations, &path("/api", "Prefix")));
    let route = &config.live.routes[0];
    let names: Vec<&str> = route.limits.iter().map(|l| &**l.policy.name()).collect();
    assert_eq!(names, ["ns.app-rps", "ns.app-rpm", "ns.app-connections"]);
    match &route.limits[2].policy {
        LimitPolicy::Concurrency(c) => assert_eq!(c.limit.get(), 3),
        LimitPolicy::Rate(_) => panic!("connections are a concurrency limit"),
    }
    assert!(route
        .subject_sources()
        .all(|s| *s == crate::route::SubjectSource::ClientIp));
}

#[test]
fn the_whitelist_exempts_from_every_limit_of_the_ingress() {
    let annotations = annotation("limit-rps", "5")
        + &annotation("limit-connections", "3")
        + &annotation("limit-whitelist", "10.0.0.0/8, 192.0.2.7,bogus");
    let (out, config) = loaded(&ingress(&annotations, &path("/api", "Prefix")));
    let route = &config.live.routes[0];
    for limit in 0..2 {
        let exempt: Vec<String> = route
            .addresses
            .exempt_from(limit)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(exempt, ["10.0.0.0/8", "192.0.2.7/32"]);
    }
    assert!(out.contains(
        "# sluice import: not carried over: nginx.ingress.kubernetes.io/limit-whitelist: `bogus` is neither an address nor a CIDR"
    ));
}

#[test]
fn the_allowlist_is_read_under_its_new_name_first() {
    let annotations = annotation("limit-rps", "5")
        + &annotation("limit-allowlist", "192.0.2.0/24")
        + &annotation("limit-whitelist", "10.0.0.0/8");
    let (out, config) = loaded(&ingress(&annotations, &path("/api", "Prefix")));
    let exempt: Vec<String> = config.live.routes[0]
        .addresses
        .exempt_from(0)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(exempt, ["192.0.2.0/24"]);
    assert!(out.contains(
        "# sluice import: not carried over: nginx.ingress.kubernetes.io/limit-whitelist: ingress-nginx read `limit-allowlist` in its place"
    ));
}

#[test]
fn a_multiplier_of_zero_is_nginxs_burst_of_zero() {
    let annotations = annotation("limit-rps", "3") + &annotation("limit-burst-multiplier", "0");
    let (_, config) = loaded(&ingress(&annotations, &path("/api", "Prefix")));
    let (limit, _, burst) = gcra(&config, "ns.app-rps");
    assert_eq!((limit, burst), (3, 1));
    let annotations = annotation("limit-rps", "3") + &annotation("limit-burst-multiplier", "x");
    let (out, config) = loaded(&ingress(&annotations, &path("/api", "Prefix")));
    assert_eq!(gcra(&config, "ns.app-rps").2, 16);
    assert!(out.contains("limit-burst-multiplier: `x` is not a whole number"));
}

#[test]
fn every_annotation_not_carried_over_is_named() {
    let annotations = annotation("limit-rps", "5")
        + &annotation("limit-rate", "100")
        + &annotation("limit-rate-after", "1024")
        + &annotation("global-rate-limit", "100")
        + &annotation("global-rate-limit-window", "1m")
        + &annotation("rewrite-target", "/")
        + "    kubernetes.io/ingress.class: nginx\n";
    let (out, _) = loaded(&ingress(&annotations, &path("/api", "Prefix")));
    for name in [
        "limit-rate",
        "limit-rate-after",
        "global-rate-limit",
        "global-rate-limit-window",
        "rewrite-target",
    ] {
        let said =
            format!("# sluice import: not carried over: nginx.ingress.kubernetes.io/{name}:");
        assert!(out.contains(&said), "{said} missing:\n{out}");
    }
    assert!(!out.contains("not carried over: nginx.ingress.kubernetes.io/limit-rps"));
    assert!(!out.contains("ingress.class"), "{out}");
}

#[test]
fn path_types_and_nginx_order() {
    let paths = path("/", "Prefix")
        + &path("/api", "Prefix")
        + &path("/api/v1", "ImplementationSpecific")
        + &path("/api/health", "Exact");
    let (out, config) = loaded(&ingress(&annotation("limit-rps", "5"), &paths));
    let matched: Vec<String> = config
        .live
        .routes
        .iter()
        .map(|r| format!("{:?}", r.matcher.path))
        .collect();
    let want = [
        PathMatch::Exact("/api/health".into()),
        PathMatch::Prefix("/api/v1".into()),
        PathMatch::Prefix("/api".into()),
        PathMatch::Prefix("/".into()),
    ]
    .map(|p| format!("{p:?}"));
    assert_eq!(matched, want);
    assert!(out.contains("# pathType ImplementationSpecific: read as a prefix"));
    assert!(out.contains("# host app.example"), "{out}");
    assert!(config
        .live
        .routes
        .iter()
        .all(|r| format!("{:?}", r.matcher).contains("app.example")));
}

#[test]
fn a_regular_expression_path_is_left_out_with_a_comment() {
    let annotations = annotation("limit-rps", "5") + &annotation("use-regex", "true");
    let paths = path("/assets(/|$)(.*)", "ImplementationSpecific") + &path("/api", "Prefix");
    let (out, config) = loaded(&ingress(&annotations, &paths));
    assert_eq!(config.live.routes.len(), 1);
    assert!(out.contains(
        "# sluice import: not carried over: path \"/assets(/|$)(.*)\" (ImplementationSpecific): a regular expression"
    ));
}

#[test]
fn an_ingress_without_limits_keeps_its_paths_unlimited_and_ranked() {
    let limited = ingress(&annotation("limit-rps", "5"), &path("/api", "Prefix"));
    let open = ingress("    {}\n", &path("/api/public", "Prefix"))
        .replace("name: app", "name: open")
        .replace("  annotations:\n    {}\n", "");
    let (_, config) = loaded(&format!("{limited}---\n{open}"));
    let routes = &config.live.routes;
    assert_eq!(&*routes[0].name, "ns.open-0");
    assert!(routes[0].limits.is_empty());
    assert_eq!(&*routes[1].name, "ns.app-0");
}

#[test]
fn the_default_backend_is_a_route_for_any_path_last() {
    let text = ingress(&annotation("limit-rps", "5"), &path("/api", "Prefix")).replace(
        "spec:\n",
        "spec:\n  defaultBackend: { service: { name: app, port: { number: 80 } } }\n",
    );
    let (_, config) = loaded(&text);
    let routes = &config.live.routes;
    assert_eq!(routes.len(), 2);
    assert!(matches!(routes[1].matcher.path, PathMatch::Any));
    assert_eq!(routes[1].limits.len(), 1);
}

#[test]
fn what_a_manifest_holds_cannot_change_the_files_structure() {
    let text = ingress(&annotation("limit-rps", "5"), &path("\"/a\\\"b\"", "Exact"))
        .replace("host: app.example", "host: \"evil\\npolicies: {}\"");
    let (out, config) = loaded(&text);
    assert_eq!(config.live.routes.len(), 1, "{out}");
    assert!(!out.contains("\npolicies: {}"), "{out}");
}

#[test]
fn every_fixture_imports_into_a_configuration_that_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ingress-nginx");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        files.push((path.display().to_string(), text));
    }
    files.sort();
    assert!(files.len() >= 3);
    let out = import(&files).expect("imports");
    if let Err(errors) = Config::parse(Path::new("imported.yaml"), &out) {
        panic!("{errors}\n{out}");
    }
}

#[test]
fn a_file_that_is_not_manifests_is_refused_by_name_and_document() {
    let error =
        import(&[("bad.yaml".to_owned(), "kind: Ingress\nspec: [\n".to_owned())]).unwrap_err();
    assert_eq!(error.origin, "bad.yaml, document 1");
    let error = import(&[(
        "bad.yaml".to_owned(),
        "apiVersion: v1\nkind: ConfigMap\n---\n- 1\n".to_owned(),
    )])
    .unwrap_err();
    assert_eq!(error.origin, "bad.yaml, document 2");
}

#[test]
fn hosts_are_matched_and_named_hosts_come_before_any_host() {
    let named = ingress(&annotation("limit-rps", "5"), &path("/", "Prefix"));
    let any = ingress(&annotation("limit-rps", "9"), &path("/api", "Prefix"))
        .replace("name: app", "name: any")
        .replace("host: app.example", "host: \"*.example\"");
    let bare = ingress(&annotation("limit-rps", "7"), &path("/api/v2", "Prefix"))
        .replace("name: app", "name: bare")
        .replace("    - host: app.example\n      http:", "    - http:");
    let (out, config) = loaded(&format!("{bare}---\n{any}---\n{named}"));
    let order: Vec<String> = config
        .live
        .routes
        .iter()
        .map(|r| format!("{:?} {:?}", r.matcher.conditions, r.matcher.path))
        .collect();
    // nginx: the server by host first, then the longest location.
    assert_eq!(order.len(), 3, "{out}");
    assert!(
        order[0].contains("app.example") && order[0].contains("\"/\""),
        "{order:?}"
    );
    assert!(
        order[1].contains("example") && order[1].contains("/api"),
        "{order:?}"
    );
    assert!(order[2].contains("/api/v2"), "{order:?}");
    assert!(
        out.contains("sluice's wildcard also takes deeper names"),
        "{out}"
    );
}
