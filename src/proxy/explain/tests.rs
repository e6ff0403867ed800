use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::*;
use crate::config::{Config, Live};
use crate::store::memory::MemoryStore;
use crate::store::{Evaluation, EvaluationId};
use crate::subject::PseudonymKey;

/// `/shadow` under a shadow limit of 1, `/open` unlimited, the rest by
/// `x-api-key` under a limit of 2; no pseudonym key unless `key`.
fn runtime(key: bool) -> Runtime {
    Runtime::new(Arc::new(live(key)), PseudonymKey::new(b"explain-tests", 1))
}

/// The configuration of [`runtime`].
fn live(key: bool) -> Live {
    let identity = if key {
        "identity: { pseudonym_key: \"0123456789abcdef0123456789abcdef\" }\n"
    } else {
        ""
    };
    let yaml = format!(
        "version: 1
server: {{ listen: 127.0.0.1:0 }}
upstream: {{ url: http://127.0.0.1:9 }}
store: {{ kind: memory, on_failure: allow }}
{identity}policies:
  two: {{ algorithm: fixed-window, limit: 2, window: 1m }}
  watch: {{ algorithm: fixed-window, limit: 1, window: 1m, shadow: true }}
routes:
  - {{ name: shadow, match: {{ path_prefix: /shadow }}, subject: client_ip, policy: watch }}
  - {{ name: open, match: {{ path_prefix: /open }}, subject: client_ip, policy: none }}
  - {{ name: keyed, match: {{ path_prefix: / }}, subject: \"header:x-api-key\", policy: two }}
"
    );
    match Config::parse(Path::new("explain.yaml"), &yaml) {
        Ok(config) => config.live,
        Err(errors) => panic!("{errors}"),
    }
}

fn described(body: Value) -> Described {
    Described::parse(body.to_string().as_bytes()).expect("a valid description")
}

fn run(runtime: &Runtime, source: Source<'_>, body: Value) -> Value {
    let d = described(body);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(explain(runtime, source, &d))
}

fn store() -> Store {
    Store::Memory(MemoryStore::new(100, Duration::ZERO))
}

#[test]
fn a_shadow_limit_over_its_quota_still_forwards() {
    let (runtime, store) = (runtime(true), store());
    let body = json!({"method": "GET", "path": "/shadow", "peer": "192.0.2.1"});
    let fresh = run(
        &runtime,
        Source::Store(&store, &Fallback::for_sidecar()),
        body.clone(),
    );
    assert_eq!(fresh["routes"][0]["limits"][0]["shadow"], true);
    assert_eq!(fresh["answer"]["outcome"], "allowed", "{fresh}");
    // Spend the one unit through the store, as a request would.
    let route = &runtime.routes.routes()[0];
    let subject = runtime.key.pseudonym("ip", &[192, 0, 2, 1], &route.name);
    let policy = route.limits[0].policy.as_rate().expect("a rate limit");
    let evaluation = Evaluation {
        policy,
        subject: &subject,
        cost: 1,
        deadline: Instant::now() + Duration::from_secs(1),
        id: EvaluationId(1),
        settle_within: None,
    };
    let Store::Memory(memory) = &store else {
        unreachable!("built as memory");
    };
    assert!(matches!(memory.evaluate(&evaluation), Outcome::Allowed(_)));
    let over = run(
        &runtime,
        Source::Store(&store, &Fallback::for_sidecar()),
        body,
    );
    assert_eq!(over["answer"]["status"], 200, "{over}");
    assert_eq!(over["answer"]["outcome"], "shadow_denied", "{over}");
    assert_eq!(over["answer"]["forwarded"], true);
    assert_eq!(over["routes"][0]["limits"][0]["state"]["remaining"], 0);
}

#[test]
fn an_unlimited_route_has_no_limit_and_is_forwarded() {
    let (runtime, store) = (runtime(true), store());
    let out = run(
        &runtime,
        Source::Store(&store, &Fallback::for_sidecar()),
        json!({"method": "POST", "path": "/open/x"}),
    );
    assert_eq!(out["routes"][0]["route"], "open");
    assert_eq!(out["routes"][0]["limits"], json!([]));
    assert_eq!(out["answer"]["outcome"], "unlimited", "{out}");
    assert_eq!(out["answer"]["status"], 200);
}

#[test]
fn a_full_memory_store_is_explained_by_on_failure() {
    let runtime = runtime(true);
    let store = Store::Memory(MemoryStore::new(0, Duration::ZERO));
    let out = run(
        &runtime,
        Source::Store(&store, &Fallback::for_sidecar()),
        json!({"method": "GET", "path": "/x", "headers": {"x-api-key": "k"}}),
    );
    let limit = &out["routes"][0]["limits"][0];
    assert_eq!(limit["state"]["store"], "unavailable", "{out}");
    assert_eq!(limit["state"]["kind"], "memory");
    assert_eq!(out["answer"]["outcome"], "unavailable");
    // on_failure: allow.
    assert_eq!(out["answer"]["status"], 200);
    assert_eq!(out["answer"]["forwarded"], true);
    assert!(out["answer"]["why"]
        .as_str()
        .is_some_and(|w| w.contains("on_failure is allow")));
}

#[test]
fn offline_without_a_pseudonym_key_shows_no_pseudonym() {
    let keyless = runtime(false);
    let body = json!({"method": "GET", "path": "/x", "headers": {"x-api-key": "k"}});
    let out = run(&keyless, Source::Offline, body.clone());
    let subject = &out["routes"][0]["limits"][0]["subject"];
    assert_eq!(subject["pseudonym"], Value::Null, "{out}");
    assert!(subject["pseudonym_note"].is_string());
    assert!(out["routes"][0]["limits"][0].get("state").is_none());
    let keyed = run(&runtime(true), Source::Offline, body);
    assert!(keyed["routes"][0]["limits"][0]["subject"]["pseudonym"].is_string());
}

#[test]
fn the_explanation_quotes_no_identity() {
    let (runtime, store) = (runtime(true), store());
    for body in [
        json!({"method": "GET", "path": "/x", "peer": "198.51.100.23",
               "headers": {"x-api-key": "key-4711", "x-forwarded-for": "203.0.113.9"}}),
        json!({"method": "GET", "path": "/shadow", "peer": "198.51.100.23",
               "headers": {"x-api-key": "key-4711"}}),
        json!({"method": "GET", "path": "/x", "peer": "198.51.100.23",
               "headers": {"x-api-key": ["key-4711", "key-4711"]}}),
    ] {
        for source in [
            Source::Store(&store, &Fallback::for_sidecar()),
            Source::Offline,
        ] {
            let text = run(&runtime, source, body.clone()).to_string();
            for raw in ["198.51.100.23", "key-4711", "203.0.113.9"] {
                assert!(!text.contains(raw), "{raw} in {text}");
            }
        }
    }
}

/// A description of `method *` as it reaches the proxy: HTTP/1's asterisk
/// form, or HTTP/2's `:path: *` beside `:authority`, which hyper hands over
/// with a scheme and an authority.
fn asterisk(method: &str, http2: bool, headers: Value) -> Described {
    let mut described = described(json!({"method": method, "path": "*", "headers": headers}));
    if http2 {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(http::uri::Scheme::HTTP);
        parts.authority = Some(http::uri::Authority::from_static("localhost"));
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("*"));
        described.uri = http::Uri::from_parts(parts).expect("an HTTP/2 URI");
    }
    described
}

fn run_described(runtime: &Runtime, source: Source<'_>, described: &Described) -> Value {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
        .block_on(explain(runtime, source, described))
}

#[test]
fn an_asterisk_target_is_explained_as_the_wire_answers_it_on_either_protocol() {
    // The catch-all `keyed` route (`path_prefix: /`) is no route for `*`.
    let (runtime, store) = (runtime(true), store());
    let fallback = Fallback::for_sidecar();
    for http2 in [false, true] {
        for source in [Source::Store(&store, &fallback), Source::Offline] {
            for method in ["GET", "POST", "DELETE"] {
                let out = run_described(&runtime, source, &asterisk(method, http2, json!({})));
                assert_eq!(out["refused"]["label"], "asterisk_form", "{out}");
                assert_eq!(out["answer"]["status"], 400, "{out}");
                assert_eq!(out["answer"]["forwarded"], false);
            }
            let out = run_described(&runtime, source, &asterisk("OPTIONS", http2, json!({})));
            assert_eq!(out["answer"]["status"], 200, "{out}");
            assert_eq!(out["answer"]["outcome"], "answered", "{out}");
            assert_eq!(out["answer"]["forwarded"], false);
            assert_eq!(out["answer"]["allow"], respond::SERVER_ALLOW);
            assert!(out.get("routes").is_none(), "{out}");
            assert!(out.get("refused").is_none(), "{out}");
            // Overridden to another method, it is that method's `*`.
            let overridden = asterisk(
                "OPTIONS",
                http2,
                json!({"X-HTTP-Method-Override": "DELETE"}),
            );
            let out = run_described(&runtime, source, &overridden);
            assert_eq!(out["refused"]["label"], "asterisk_form", "{out}");
        }
    }
}

#[test]
fn options_asterisk_goes_to_a_route_whose_path_is_the_asterisk() {
    // Validation refuses `path: "*"` (paths start with `/`): the route
    // table is given one directly, in the form a route's exact path takes.
    let mut live = live(true);
    live.routes[1].matcher.path = crate::route::PathMatch::Exact("*".to_owned());
    let runtime = Runtime::new(Arc::new(live), PseudonymKey::new(b"explain-tests", 1));
    let store = store();
    for http2 in [false, true] {
        let out = run_described(
            &runtime,
            Source::Store(&store, &Fallback::for_sidecar()),
            &asterisk("OPTIONS", http2, json!({})),
        );
        assert_eq!(out["routes"][0]["route"], "open", "{out}");
        assert_eq!(out["answer"]["outcome"], "unlimited", "{out}");
        assert_eq!(out["answer"]["forwarded"], true);
        // Still OPTIONS alone: the route's path does not make `GET *` one.
        let out = run_described(
            &runtime,
            Source::Offline,
            &asterisk("GET", http2, json!({})),
        );
        assert_eq!(out["refused"]["label"], "asterisk_form", "{out}");
    }
}
