//! The table against what sluice does: its defaults are the ones a file
//! that leaves a key out gets, its restart-only keys are the ones a reload
//! refuses to change, and the chart's `values.yaml` writes the same
//! defaults.

use std::path::Path;

use serde_yaml::Value as Yaml;

use super::*;
use crate::config::Config;

/// Keys only `kind: redis` reads; `local_share` only with `local`.
const REDIS_ONLY: &[&str] = &[
    "store.topology",
    "store.pool_size",
    "store.key_prefix",
    "store.scripts",
    "store.coalesce",
    "store.max_clock_regression",
    "store.dedupe_max",
    "store.breaker_failures",
    "store.breaker_window",
    "store.breaker_min_calls",
    "store.breaker_failure_rate",
    "store.breaker_cooldown",
    "store.deny_cache_entries",
];
const NEEDS_LOCAL: &[&str] = &["store.local_share"];
/// Keys of `identity.jwt`, which needs keys to load.
const NEEDS_JWT: &str = "identity.jwt.";

const REQUIRED: &str = "server: { listen: 127.0.0.1:8080 }
upstream: { url: http://127.0.0.1:3000 }
policies:
  p: { algorithm: fixed-window, limit: 5, window: 1s }
routes:
  - { name: r, match: { path_prefix: /api }, policy: p }
";

fn parse(text: &str) -> Config {
    match Config::parse(Path::new("keys.yaml"), text) {
        Ok(config) => config,
        Err(errors) => panic!("{errors}\n{text}"),
    }
}

/// `base` (YAML) with `path` set to `value` (YAML), sections created as
/// needed.
fn with(base: &Yaml, path: &str, value: &str) -> Yaml {
    let mut doc = base.clone();
    let value: Yaml = serde_yaml::from_str(value).expect("a YAML value");
    let mut at = &mut doc;
    let segments: Vec<&str> = path.split('.').collect();
    for (i, segment) in segments.iter().enumerate() {
        let map = at.as_mapping_mut().expect("a mapping");
        let key = Yaml::from(*segment);
        if i + 1 == segments.len() {
            map.insert(key, value.clone());
            break;
        }
        if !map.contains_key(&key) {
            map.insert(key.clone(), Yaml::Mapping(Default::default()));
        }
        at = map.get_mut(&key).expect("just inserted");
    }
    doc
}

fn text(doc: &Yaml) -> String {
    serde_yaml::to_string(doc).expect("YAML")
}

/// A file of `kind` with only what is required.
fn minimal(store: &str) -> Yaml {
    let mut text = format!("version: 1\n{REQUIRED}store: {store}\n");
    if store.contains("redis") {
        text.push_str("identity: { pseudonym_key: 0123456789abcdef0123 }\n");
    }
    serde_yaml::from_str(&text).expect("YAML")
}

fn applies(key: &Key, store: &str) -> bool {
    (store.contains("redis") || !REDIS_ONLY.contains(&key.path))
        && (store.contains("local") || !NEEDS_LOCAL.contains(&key.path))
        && !key.path.starts_with(NEEDS_JWT)
}

#[test]
fn writing_every_default_changes_nothing() {
    for store in [
        "{ kind: memory, max_entries: 1000 }",
        "{ kind: redis, url: redis://127.0.0.1:6379 }",
        "{ kind: redis, url: redis://127.0.0.1:6379, on_failure: local }",
    ] {
        let bare = minimal(store);
        let mut written = bare.clone();
        let mut count = 0;
        for key in ALL.iter().filter(|k| applies(k, store)) {
            // `kind` and `on_failure` are the store under test.
            if let Absent::Value(value) = key.default {
                let tested = key.path == "store.kind" && store.contains("redis")
                    || key.path == "store.on_failure" && store.contains("local");
                if !tested {
                    written = with(&written, key.path, value);
                    count += 1;
                }
            }
        }
        assert!(count > 25, "{count} keys written");
        let (bare, written) = (parse(&text(&bare)), parse(&text(&written)));
        assert_eq!(
            bare.boot.changes(&written.boot),
            Vec::<&str>::new(),
            "{store}"
        );
        assert_eq!(
            format!("{:?}", bare.live),
            format!("{:?}", written.live),
            "{store}"
        );
    }
}

/// A valid value other than `value`, for a key of `kind`.
fn another(kind: &str, value: &str) -> Option<String> {
    if let Some(number) = value.strip_suffix('%') {
        return Some(format!("{}%", number.parse::<u32>().ok()? + 10));
    }
    if let Ok(n) = value.parse::<u64>() {
        return Some((n + 1).to_string());
    }
    match value {
        "true" => return Some("false".to_owned()),
        "false" => return Some("true".to_owned()),
        _ => {}
    }
    if kind == "duration" {
        return Some("700ms".to_owned());
    }
    if kind == "text" {
        return Some(format!("{value}2"));
    }
    // One of the listed values: `a`, `b`, `c`.
    let choices: Vec<&str> = kind
        .split(", ")
        .filter_map(|c| c.strip_prefix('`')?.strip_suffix('`'))
        .collect();
    let other = choices.into_iter().find(|c| *c != value)?;
    Some(other.to_owned())
}

#[test]
fn a_reload_refuses_exactly_the_restart_only_keys() {
    let store = "{ kind: redis, url: redis://127.0.0.1:6379, on_failure: local }";
    let base = minimal(store);
    let before = parse(&text(&base));
    let mut checked = 0;
    for key in ALL.iter().filter(|k| applies(k, store)) {
        let Absent::Value(value) = key.default else {
            continue;
        };
        // Keys whose other values need more of the file.
        if [
            "store.kind",
            "store.topology",
            "store.on_failure",
            "server.proxy_protocol",
        ]
        .contains(&key.path)
        {
            continue;
        }
        let Some(other) = another(key.kind, value) else {
            continue;
        };
        let after = parse(&text(&with(&base, key.path, &other)));
        let changes = before.boot.changes(&after.boot);
        match key.applied {
            Applied::Restart => assert!(
                changes.iter().any(|c| key.path.starts_with(c)),
                "{} = {other}: {changes:?}",
                key.path
            ),
            Applied::Reload => assert_eq!(changes, Vec::<&str>::new(), "{} = {other}", key.path),
        }
        checked += 1;
    }
    assert!(checked > 30, "{checked} keys changed");
}

/// Every scalar leaf of `value`, by dotted path.
fn leaves(prefix: &str, value: &Yaml, out: &mut Vec<(String, Yaml)>) {
    match value {
        Yaml::Mapping(map) => {
            for (k, v) in map {
                let Some(k) = k.as_str() else { continue };
                let path = if prefix.is_empty() {
                    k.to_owned()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&path, v, out);
            }
        }
        other => out.push((prefix.to_owned(), other.clone())),
    }
}

#[test]
fn the_charts_values_write_the_same_defaults() {
    let values = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/sluice/values.yaml"),
    )
    .expect("the chart's values.yaml");
    let values: Yaml = serde_yaml::from_str(&values).expect("YAML");
    let config = &values["sluice"]["config"];
    let mut found = Vec::new();
    leaves("", config, &mut found);
    let mut compared = 0;
    for (path, value) in found {
        let Some(key) = find(&path) else { continue };
        let Absent::Value(default) = key.default else {
            continue;
        };
        let default: Yaml = serde_yaml::from_str(default).expect("a YAML default");
        assert_eq!(
            value, default,
            "values.yaml sets {path} to {value:?}; its default is {default:?}"
        );
        compared += 1;
    }
    assert!(compared >= 8, "{compared} of the chart's values compared");
}

#[test]
fn every_key_is_listed_once_with_a_meaning() {
    let mut paths: Vec<&str> = ALL.iter().chain(ENTRIES).map(|k| k.path).collect();
    paths.sort_unstable();
    paths.dedup();
    assert_eq!(paths.len(), ALL.len() + ENTRIES.len());
    for key in ALL.iter().chain(ENTRIES) {
        assert!(
            !key.meaning.is_empty() && !key.meaning.contains('\n'),
            "{}",
            key.path
        );
    }
    assert!(markdown().lines().count() == ALL.len() + ENTRIES.len() + 7);
}

#[test]
fn the_configuration_reference_shows_the_table() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/CONFIGURATION.md");
    let doc = std::fs::read_to_string(&path).expect("docs/CONFIGURATION.md");
    let begin = "<!-- generated by `sluice keys --markdown`: begin -->\n";
    let end = "<!-- generated by `sluice keys --markdown`: end -->";
    let start = doc.find(begin).expect("the begin marker") + begin.len();
    let stop = doc.find(end).expect("the end marker");
    assert!(
        doc[start..stop] == markdown(),
        "docs/CONFIGURATION.md's key table is not the table in src/config/keys.rs: \
         replace the lines between its markers with `sluice keys --markdown`"
    );
}

/// Policies of each kind an entry key needs, a route with one limit, a
/// route with several, and `default` written with one limit (`one`) or
/// with a list of them (`several`).
fn entries_base(default: &str, key: &Key) -> Yaml {
    // A lease needs a shared store, and its terms a lease.
    let (store, lease) = match key.path.strip_prefix("policies.NAME.lease") {
        None => ("{ kind: memory, max_entries: 1000 }", ""),
        Some("") => ("{ kind: redis, url: redis://127.0.0.1:6379 }", ""),
        Some(_) => (
            "{ kind: redis, url: redis://127.0.0.1:6379 }",
            ", lease: {}",
        ),
    };
    // A delay's terms need a GCRA policy with a delay: `fw` becomes one.
    let fw = if key.path.starts_with("policies.NAME.delay.") {
        "algorithm: gcra, limit: 5, window: 1s, delay: { max_wait: 500ms }".to_owned()
    } else {
        format!("algorithm: fixed-window, limit: 5, window: 1s{lease}")
    };
    let text = format!(
        "version: 1
server: {{ listen: 127.0.0.1:8080 }}
upstream: {{ url: http://127.0.0.1:3000 }}
store: {store}
identity: {{ pseudonym_key: 0123456789abcdef0123 }}
policies:
  fw: {{ {fw} }}
  tb: {{ algorithm: token-bucket, capacity: 5, refill_every: 1s }}
  c: {{ algorithm: concurrency, limit: 2 }}
routes:
  - {{ name: one, match: {{ path_prefix: /one }}, policy: fw }}
  - {{ name: several, match: {{ path_prefix: /several }}, limits: [{{ policy: fw }}, {{ policy: tb }}] }}
  - {{ name: inflight, match: {{ path_prefix: /inflight }}, policy: c }}
default: {default}
"
    );
    serde_yaml::from_str(&text).expect("YAML")
}

/// `doc` with the entry key `key` set to `value`: `NAME` is the policy the
/// key belongs to, `routes[]` the route with one limit, or the one with
/// several for `routes[].limits[]`, and any other `[]` the first item.
fn with_entry(doc: &Yaml, key: &Key, value: &str) -> Yaml {
    let mut doc = doc.clone();
    let value: Yaml = serde_yaml::from_str(value).expect("a YAML value");
    let policy = match key.name() {
        "refill_tokens" => "tb",
        "retry_after" => "c",
        _ => "fw",
    };
    let route = if key.path.starts_with("routes[].limits[]") {
        1
    } else {
        0
    };
    let segments: Vec<&str> = key.path.split('.').collect();
    let mut at = &mut doc;
    for (i, segment) in segments.iter().enumerate() {
        let (name, index) = match segment.strip_suffix("[]") {
            Some(list) => (list, Some(if list == "routes" { route } else { 0 })),
            None if *segment == "NAME" => (policy, None),
            None => (*segment, None),
        };
        let map = at.as_mapping_mut().expect("a mapping");
        if i + 1 == segments.len() {
            map.insert(Yaml::from(name), value.clone());
            break;
        }
        let key = Yaml::from(name);
        if !map.contains_key(&key) {
            map.insert(key.clone(), Yaml::Mapping(Default::default()));
        }
        at = map.get_mut(&key).expect("just inserted");
        if let Some(index) = index {
            at = &mut at.as_sequence_mut().expect("a list")[index];
        }
    }
    doc
}

#[test]
fn every_entry_default_is_what_leaving_it_out_means() {
    let mut checked = 0;
    for key in ENTRIES {
        assert_eq!(key.applied, Applied::Reload, "{}", key.path);
        let Absent::Value(value) = key.default else {
            continue;
        };
        let default = if key.path.starts_with("default.limits[]") {
            "{ limits: [{ policy: fw }] }"
        } else {
            "{ policy: fw }"
        };
        let base = entries_base(default, key);
        let bare = parse(&text(&base));
        let written = parse(&text(&with_entry(&base, key, value)));
        assert_eq!(
            format!("{:?}", bare.live),
            format!("{:?}", written.live),
            "{} = {value}",
            key.path
        );
        // And another value is a change a reload takes (a lease lasting at
        // most half the default `store.dedupe_window`).
        let other = match key.path {
            "policies.NAME.lease.ttl" => Some("300ms".to_owned()),
            _ => another(key.kind, value),
        };
        if let Some(other) = other {
            let changed = parse(&text(&with_entry(&base, key, &other)));
            assert_ne!(
                format!("{:?}", bare.live),
                format!("{:?}", changed.live),
                "{} = {other}",
                key.path
            );
            assert_eq!(bare.boot.changes(&changed.boot), Vec::<&str>::new());
        }
        checked += 1;
    }
    assert!(checked >= 12, "{checked} entry defaults written");
}

#[test]
fn a_key_is_found_at_its_place_whatever_the_policy_is_called() {
    assert!(POLICY_SHADOW.is_at("policies.login.shadow"));
    assert!(POLICY_SHADOW.is_at("policies.api.v2.shadow"));
    assert!(POLICY_LEASE_TTL.is_at("policies.a.b.lease.ttl"));
    assert!(!POLICY_SHADOW.is_at("policies.shadow"));
    assert!(POLICY_SHADOW.is_at("policies..shadow"));
    assert!(!POLICY_LEASE_TTL.is_at("policies.login.ttl"));
    assert!(ROUTE_MATCH_CASE_SENSITIVE.is_at("routes[3].match.case_sensitive"));
    assert!(!ROUTE_MATCH_CASE_SENSITIVE.is_at("routes.match.case_sensitive"));
    assert!(ROUTE_LIMITS_COST.is_at("routes[0].limits[12].cost"));
}

#[test]
fn a_policy_name_with_dots_loads_with_its_defaults() {
    let text = "version: 1
server: { listen: 127.0.0.1:8080 }
upstream: { url: http://127.0.0.1:3000 }
policies:
  api.v2: { algorithm: fixed-window, limit: 5, window: 1s }
routes:
  - { name: r, match: { path_prefix: /api, case_sensitive: true }, policy: api.v2 }
";
    let config = parse(text);
    assert!(!config.live.policies[0].shadow);
}
