use std::num::NonZeroU32;

use super::*;
use crate::limit::{BucketBand, GcraBand, WindowBand};

pub(super) fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("non-zero")
}

pub(super) fn common() -> Common {
    Common {
        key_prefix: "sl".to_owned(),
        ttl_grace: Duration::from_secs(1),
        max_clock_regression: Duration::from_millis(250),
        dedupe_window: Duration::from_secs(5),
    }
}

pub(super) fn window(limit: u32, secs: u64) -> WindowBand {
    WindowBand {
        limit: nz(limit),
        window: Duration::from_secs(secs),
    }
}

/// One policy per algorithm, each revision distinct.
pub(super) fn policies() -> Vec<Policy> {
    let bands = [
        Bands::FixedWindow(vec![window(5, 1), window(100, 60)]),
        Bands::SlidingCounter(vec![window(5, 1)]),
        Bands::SlidingLog(vec![window(5, 1)]),
        Bands::TokenBucket(vec![BucketBand {
            capacity: nz(5),
            refill_tokens: nz(1),
            refill_every: Duration::from_secs(2),
            max_wait_us: 0,
        }]),
        Bands::Gcra(vec![GcraBand {
            limit: nz(60),
            window: Duration::from_secs(60),
            burst: nz(10),
            max_wait_us: 0,
        }]),
    ];
    bands
        .into_iter()
        .enumerate()
        .map(|(i, bands)| Policy::new(format!("p{i}"), format!("r{i}"), bands, false))
        .collect()
}

#[test]
fn every_library_is_named_after_its_code_and_defines_its_helpers_once() {
    for &algorithm in Algorithm::ALL {
        let file = algorithm.lua();
        assert!(!file.starts_with("#!"), "{}", algorithm.name());
        assert_eq!(file.matches(DECIDE).count(), 1, "{}", algorithm.name());
        // A compact state's function reads it once, with as many
        // numbers per band as Rust compiles its pattern for.
        let per_band = algorithm.state_numbers();
        let (reads, declared) = if per_band > 0 {
            (1, format!("\n  local per_band = {per_band}\n"))
        } else {
            (0, "\n  local per_band".to_owned())
        };
        assert_eq!(
            file.matches("read_state(").count(),
            reads,
            "{}",
            algorithm.name()
        );
        assert_eq!(
            file.contains(&declared),
            per_band > 0,
            "{}",
            algorithm.name()
        );
    }
    for policy in policies() {
        let script = Script::for_policy(&policy, &common());
        let name = script.algorithm.map_or("several", |a| a.name());
        assert!(script.name.starts_with(LIBRARY_PREFIX), "{name}");
        assert_eq!(script.name.len(), LIBRARY_PREFIX.len() + 40, "{name}");
        assert!(
            script
                .source
                .starts_with(&format!("#!lua name={}\n", script.name)),
            "{name}"
        );
        assert!(script.source.contains(&format!(
            "redis.register_function{{function_name = '{}', callback = \
             function(keys, args) return decide(redis, keys, args) end}}",
            script.name
        )));
        // The helpers are the library's, once, outside any function.
        assert_eq!(script.source.matches(COMMON).count(), 1, "{name}");
        assert_eq!(script.source.matches(STATE).count(), 1, "{name}");
        assert!(script.source.find(COMMON) < script.source.find(DECIDE));
        assert!(!script.source.contains(NAME_AT), "{name}");
        assert!(!script.source.contains("EVAL"), "libraries never nest EVAL");
        // The name is the SHA-1 of the code with the name left out.
        let unnamed = script.source.replace(&script.name, NAME_AT);
        assert_eq!(
            script.name,
            format!(
                "{LIBRARY_PREFIX}{}",
                redis::Script::new(&unnamed).get_hash()
            )
        );
    }
}

#[test]
fn every_refund_library_carries_the_policy_and_its_algorithm_part() {
    assert_eq!(REFUND.matches(UNDO_AT).count(), 1);
    for policy in policies() {
        let script = Script::refund_for_policy(&policy, &common());
        let name = policy.algorithm().name();
        assert!(script.source.starts_with("#!lua name=sluice_"), "{name}");
        assert!(
            script.source.contains(policy.algorithm().refund_lua()),
            "{name}"
        );
        assert!(script.source.contains("local P_BAND_ARGS = {"), "{name}");
        assert!(script.source.contains(COMMON), "{name}");
        assert!(script.source.ends_with(&format!(
            "redis.register_function{{function_name = '{}', callback = refund}}\n",
            script.name
        )));
        assert!(!script.source.contains(UNDO_AT), "{name}: a marker left");
        assert_ne!(script.name, Script::for_policy(&policy, &common()).name);
    }
}

/// A policy's library without its batch function: the library of its
/// single calls as it was before it had one.
fn without_batch(script: &Script) -> String {
    let register = format!(
        "redis.register_function{{function_name = '{}{BATCH_SUFFIX}', callback = batch}}\n",
        script.name
    );
    script
        .source
        .replacen(BATCH, "", 1)
        .replacen(&register, "", 1)
}

#[test]
fn a_policy_library_registers_its_batch_function_after_its_own() {
    for policy in policies() {
        let script = Script::for_policy(&policy, &common());
        let batch = script.batch.clone().expect("a batch function");
        assert_eq!(batch, format!("{}_batch", script.name));
        assert!(script.source.ends_with(&format!(
            "redis.register_function{{function_name = '{batch}', callback = batch}}\n"
        )));
        assert_eq!(script.source.matches(BATCH).count(), 1);
        assert!(!script.eval.contains(BATCH), "cached scripts have no batch");
        assert!(Script::refund_for_policy(&policy, &common())
            .batch
            .is_none());
    }
    let policies = policies();
    let several = Script::for_limits(&[&policies[0], &policies[1]], &common());
    assert!(several.batch.is_none() && !several.source.contains(BATCH));
}

#[test]
fn the_read_only_library_is_the_same_function_writing_nothing() {
    for policy in policies() {
        let script = Script::for_policy(&policy, &common());
        let peek = Script::peek_for_policy(&policy, &common());
        let name = script.algorithm.map_or("several", |a| a.name());
        assert!(!script.source.contains(PEEK), "{name}: requests run it");
        assert_ne!(peek.name, script.name, "{name}");
        assert!(peek.source.ends_with(&format!(
            "redis.register_function{{function_name = '{}', callback = \
             function(keys, args) return decide(READ_ONLY, keys, args) end, \
             flags = {{'no-writes'}}}}\n",
            peek.name
        )));
        // Take the read-only part out again and it is the request's
        // library: the algorithm itself is not touched.
        let back = peek
            .source
            .replace(&peek.name, &script.name)
            .replacen(PEEK, "", 1)
            .replacen(
                "decide(READ_ONLY, keys, args) end, flags = {'no-writes'}}",
                "decide(redis, keys, args) end}",
                1,
            );
        assert_eq!(back, without_batch(&script), "{name}");
        assert!(
            peek.batch.is_none() && !peek.source.contains(BATCH),
            "{name}"
        );
    }
    let scripts = Scripts::new(common());
    let policy = &policies()[0];
    let (peek, made) = scripts.peek(policy);
    assert!(made);
    let (again, made) = scripts.peek(policy);
    assert!(Arc::ptr_eq(&peek, &again) && !made);
    // Never loaded with the request libraries, but leased.
    assert!(scripts.all().is_empty());
    assert!(scripts.names().contains(&peek.name));
    assert!(!scripts.has(policy));
}

#[test]
fn a_policy_s_numbers_are_compiled_into_its_script() {
    let policies = policies();
    let fixed = Script::for_policy(&policies[0], &common());
    // TTL: horizon 60 s + grace 1 s; both bands, limit then window µs.
    for line in [
        "local P_TTL_MS, P_TTL_TEXT = 61000, '61000'",
        "local P_MAX_REGRESSION_US = 250000",
        "local P_DEDUPE_WINDOW_TEXT = '5000'",
        "local P_BANDS = 2",
        "local P_BAND_ARGS = {5, 1000000, 100, 60000000}",
    ] {
        assert!(fixed.source.contains(line), "{line} not in the script");
    }
    assert!(fixed.source.contains(
        "local P_STATE_PATTERN, P_STATE_FORMAT = '^(%d+):(%d+):(%d+):(%d+):(%d+)()|?(%d*)', \
         '%d:%d:%d:%d:%d'"
    ));
    assert!(fixed.source.contains(
        "local P_STATE_FORMATS = {P_STATE_FORMAT, '%d:%d:%d:%d:%d|%d|%d|%s|1:%d:%d:%d:%d:%d', \
         '%d:%d:%d:%d:%d%s', '%d:%d:%d:%d:%d|%d|0|%s|1:%d:%d:%d:%d:%d', \
         '%d:%d:%d:%d:%d|%d|0|%s|1:%d:%d:0:0:%d', '%d:%d:%d:%d:%d|%d|%d|%s|1:%d:%d:0:0:%d'}"
    ));
    assert!(fixed.source.contains(STATE));
    let gcra = Script::for_policy(&policies[4], &common());
    assert!(gcra
        .source
        .contains("local P_BAND_ARGS = {60, 60000000, 10, 0}"));
    assert!(gcra
        .source
        .contains("local P_STATE_PATTERN, P_STATE_FORMAT = '^(%d+):(%d+)()|?(%d*)', '%d:%d'"));
    let log = Script::for_policy(&policies[2], &common());
    assert!(log
        .source
        .contains("local P_STATE_PATTERN, P_STATE_FORMAT = false, false"));
    assert!(!log.source.contains("local P_STATE_FORMATS"));
    // Past Lua's 32 captures, the general path reads the state.
    let many = Policy::new(
        "many",
        "r",
        Bands::SlidingCounter((1..=11).map(|i| window(i, 1)).collect()),
        false,
    );
    let many = Script::for_policy(&many, &common());
    assert!(many
        .source
        .contains("local P_STATE_PATTERN, P_STATE_FORMAT = false, '%d"));
    // Another store setting is another script.
    let other = Common {
        dedupe_window: Duration::from_secs(1),
        ..common()
    };
    assert_ne!(Script::for_policy(&policies[0], &other).name, fixed.name);
}

#[test]
fn scripts_are_made_once_per_bands_whatever_the_revision() {
    let scripts = Scripts::new(common());
    let policies = policies();
    let first = scripts.get(&policies[0]);
    assert!(Arc::ptr_eq(&first, &scripts.get(&policies[0])));
    assert!(scripts.has(&policies[0]) && !scripts.has(&policies[1]));
    for p in &policies {
        assert_eq!(scripts.get(p).algorithm, Some(p.algorithm()));
    }
    let mut shas: Vec<String> = scripts.all().iter().map(|s| s.name.clone()).collect();
    shas.sort();
    shas.dedup();
    assert_eq!(shas.len(), 5);
    // One revision written for two sets of bands: two scripts.
    let changed = Policy::new(
        policies[0].name.clone(),
        policies[0].revision.clone(),
        Bands::FixedWindow(vec![window(7, 1)]),
        false,
    );
    assert_eq!(changed.revision, policies[0].revision);
    assert_ne!(scripts.get(&changed).name, first.name);
}

#[test]
fn every_cached_script_is_its_library_calling_its_function() {
    let policies = policies();
    let set = [&policies[0], &policies[4]];
    let mut all: Vec<(Script, &str)> = Vec::new();
    for policy in &policies {
        all.push((
            Script::for_policy(policy, &common()),
            "return decide(redis, KEYS, ARGV)\n",
        ));
        all.push((
            Script::peek_for_policy(policy, &common()),
            "return decide(READ_ONLY, KEYS, ARGV)\n",
        ));
        all.push((
            Script::refund_for_policy(policy, &common()),
            "return refund(KEYS, ARGV)\n",
        ));
    }
    all.push((
        Script::for_limits(&set, &common()),
        "return several(KEYS, ARGV)\n",
    ));
    for (script, call) in &all {
        let body = &script.source[script.source.find('\n').expect("a first line") + 1..];
        // The first registration: a policy's library registers its batch
        // function after it, which the cached script has no use for.
        let register = body.find("redis.register_function").expect("registered");
        assert_eq!(script.eval, format!("{}{call}", &body[..register]));
        assert!(!script.eval.starts_with("#!") && !script.eval.contains(NAME_AT));
        assert_eq!(script.sha, redis::Script::new(&script.eval).get_hash());
        assert_eq!(script.loaded_as(Mode::Eval), script.sha);
        assert_eq!(script.loaded_as(Mode::Functions), script.name);
    }
}

#[test]
fn ceil_ms_never_shortens() {
    assert_eq!(ceil_ms(Duration::from_micros(1)), 1);
    assert_eq!(ceil_ms(Duration::from_micros(1001)), 2);
    assert_eq!(ceil_ms(Duration::from_millis(5)), 5);
    assert_eq!(ceil_ms(Duration::ZERO), 1);
}
