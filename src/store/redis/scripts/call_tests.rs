//! The commands a decision, several limits, a refund and a cached script
//! are sent as: keys, the attempt, ids and arguments, word by word.

use super::super::packed::Packed;
use super::tests::{common, policies};
use super::*;
use crate::store::{Evaluation, EvaluationId};
use crate::subject::{Pseudonym, PseudonymKey};

/// The state key's mark and its separator, as the scripts' formats
/// name them.
fn mark(policy: &Policy) -> &'static str {
    match policy.algorithm() {
        Algorithm::FixedWindow => "fw2:",
        Algorithm::SlidingCounter => "sc2:",
        Algorithm::TokenBucket => "tb2:",
        Algorithm::Gcra => "gc2:",
        Algorithm::SlidingLog => "",
    }
}

/// A command's words as text, to compare with what is expected.
pub(in crate::store::redis) fn args(cmd: &Packed) -> Vec<String> {
    cmd.args()
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect()
}

#[test]
fn every_call_sends_its_state_its_record_the_attempt_the_id_and_the_cost() {
    let subject = PseudonymKey::new(b"k", 1).pseudonym("client_ip", b"192.0.2.1", "api");
    for policy in policies() {
        let script = Script::for_policy(&policy, &common());
        let evaluation = Evaluation {
            policy: &policy,
            subject: &subject,
            cost: 2,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(0xab),
            settle_within: None,
        };
        let cmd = call(&script, Mode::Functions, &common(), &evaluation, true);
        let sent = args(&cmd);
        let state = format!(
            "sl:{{{}:{}:{}{subject}}}",
            policy.name,
            policy.revision,
            mark(&policy)
        );
        let id = format!("{:032x}", 0xab);
        let mut expected = vec![
            "FCALL".to_owned(),
            script.name.clone(),
            "2".to_owned(),
            state.clone(),
            format!("{state}:e:{id}"),
            "1".to_owned(),
            id,
            "2".to_owned(),
        ];
        assert_eq!(sent, expected);
        // Sent again: the same call saying 0; never known to be first: 2,
        // sent again as it is.
        expected[5] = "0".to_owned();
        assert_eq!(args(&resent(&cmd)), expected);
        let never_first = call(&script, Mode::Functions, &common(), &evaluation, false);
        expected[5] = "2".to_owned();
        assert_eq!(args(&never_first), expected);
        assert_eq!(args(&resent(&never_first)), expected);
        expected[5] = "0".to_owned();
        // A refund: the id and the units, no attempt.
        let refund = Script::refund_for_policy(&policy, &common());
        let mut refunded = expected.clone();
        refunded[1] = refund.name.clone();
        refunded.remove(5);
        assert_eq!(
            args(&refund_call(
                &refund,
                Mode::Functions,
                &common(),
                &evaluation
            )),
            refunded
        );
    }
}

/// A cost of 1 is left out (the script's when none is sent) unless a
/// record life follows it; any other cost is sent.
#[test]
fn a_cost_of_1_is_sent_only_before_a_record_life() {
    let subject = PseudonymKey::new(b"k", 1).pseudonym("client_ip", b"192.0.2.1", "api");
    let policies = policies();
    let script = Script::for_policy(&policies[0], &common());
    let id = format!("{:032x}", 0x5);
    for (cost, within, tail) in [
        (1, None, vec![id.clone()]),
        (3, None, vec![id.clone(), "3".to_owned()]),
        (
            1,
            Some(Duration::from_secs(2)),
            vec![id.clone(), "1".to_owned(), "2000".to_owned()],
        ),
    ] {
        let evaluation = Evaluation {
            policy: &policies[0],
            subject: &subject,
            cost,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(0x5),
            settle_within: within,
        };
        let sent = args(&call(
            &script,
            Mode::Functions,
            &common(),
            &evaluation,
            true,
        ));
        // The keys, the attempt, then the rest.
        assert_eq!(sent[6..], tail[..], "{sent:?}");
    }
}

/// A re-send changes the first argument after the keys and nothing else,
/// with or without a record life, in either mode. Several limits always
/// say 0.
/// A key that does not fit on the stack (a long prefix) is rendered on
/// the heap, the same bytes; one that just fits stays on the stack.
#[test]
fn a_state_key_reads_the_same_however_long_its_prefix() {
    let subject = PseudonymKey::new(b"k", 1).pseudonym("client_ip", b"192.0.2.1", "api");
    for prefix_len in [1, 60, 100, 200] {
        let mut common = common();
        common.key_prefix = "p".repeat(prefix_len);
        for policy in policies() {
            let evaluation = Evaluation {
                policy: &policy,
                subject: &subject,
                cost: 1,
                deadline: tokio::time::Instant::now(),
                id: EvaluationId(1),
                settle_within: None,
            };
            let key = state_key(&common, &evaluation);
            let expected = format!(
                "{}:{{{}:{}:{}{subject}}}",
                common.key_prefix,
                policy.name,
                policy.revision,
                mark(&policy)
            );
            assert_eq!(String::from_utf8_lossy(&key), expected);
            assert_eq!(key.spilled(), expected.len() > key.inline_size());
        }
    }
}

/// One evaluation of each of `policies`, for `subject`, all with one id.
fn evaluations<'a>(
    policies: &'a [Policy],
    subject: &'a Pseudonym,
    cost: u32,
    id: u128,
    settle_within: Duration,
) -> Vec<Evaluation<'a>> {
    policies
        .iter()
        .map(|policy| Evaluation {
            policy,
            subject,
            cost,
            deadline: tokio::time::Instant::now(),
            id: EvaluationId(id),
            settle_within: Some(settle_within),
        })
        .collect()
}

#[test]
fn a_re_send_is_the_same_call_saying_0() {
    let subject = PseudonymKey::new(b"k", 1).pseudonym("client_ip", b"192.0.2.1", "api");
    let policies = policies();
    let evaluations = evaluations(&policies[..3], &subject, 1, 0x1, Duration::from_secs(3));
    let script = Script::for_policy(&policies[0], &common());
    let several = Script::for_limits(&[&policies[0], &policies[1], &policies[2]], &common());
    for mode in [Mode::Functions, Mode::Eval] {
        let cmd = call(&script, mode, &common(), &evaluations[0], true);
        let (first, again) = (args(&cmd), args(&resent(&cmd)));
        // Two keys, then the attempt.
        assert_eq!((first[5].as_str(), again[5].as_str()), ("1", "0"));
        let differ: Vec<usize> = (0..first.len()).filter(|&i| first[i] != again[i]).collect();
        assert_eq!(differ, [5], "{first:?} {again:?}");
        assert_eq!(first.last(), Some(&"3000".to_owned()));
        // Six keys, then the attempt: 2 from the start, and again.
        let cmd = call_several(&several, mode, &common(), &evaluations);
        assert_eq!(args(&cmd)[9], "2");
        assert_eq!(args(&resent(&cmd)), args(&cmd));
    }
}

#[test]
fn a_cached_script_is_called_with_the_same_keys_and_arguments() {
    let key = PseudonymKey::new(b"0123456789abcdef", 1);
    let subject = key.pseudonym("ip", b"", "192.0.2.1");
    let policies = policies();
    let evaluations = evaluations(&policies[..2], &subject, 3, 7, Duration::from_secs(2));
    let script = Script::for_policy(&policies[0], &common());
    let fcall = call(&script, Mode::Functions, &common(), &evaluations[0], true);
    let evalsha = call(&script, Mode::Eval, &common(), &evaluations[0], true);
    let (f, e) = (args(&fcall), args(&evalsha));
    assert_eq!(e[..2], ["EVALSHA".to_owned(), script.sha.clone()]);
    assert_eq!(f[2..], e[2..]);
    assert_eq!(args(&as_evalsha(&script, &fcall)), e);
    let several = Script::for_limits(&[&policies[0], &policies[1]], &common());
    let f = args(&call_several(
        &several,
        Mode::Functions,
        &common(),
        &evaluations,
    ));
    let e = args(&call_several(&several, Mode::Eval, &common(), &evaluations));
    assert_eq!(e[..2], ["EVALSHA".to_owned(), several.sha.clone()]);
    assert_eq!(f[2..], e[2..]);
    let load: Vec<String> = several
        .load_command(Mode::Eval)
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            _ => "<cursor>".to_owned(),
        })
        .collect();
    assert_eq!(
        load,
        ["SCRIPT".to_owned(), "LOAD".to_owned(), several.eval.clone()]
    );
}

#[test]
fn several_limits_run_each_policy_s_own_script_in_one_call() {
    let policies = policies();
    let mut shadow = policies[2].clone();
    shadow.shadow = true;
    let set = [&policies[0], &shadow, &policies[4]];
    let several = Script::for_limits(&set, &common());
    assert!(several
        .source
        .starts_with(&format!("#!lua name={}\n", several.name)));
    assert!(!several.source.contains(LIMITS_AT));
    assert_eq!(several.source.matches(COMMON).count(), 1);
    for (i, policy) in set.iter().enumerate() {
        // What the policy runs alone: its numbers and its decide.
        let n = i + 1;
        let block = format!(
            "do\n{}LIMITS[{n}], SHADOW[{n}] = decide, {}\nend\n",
            decide(policy, &common()),
            policy.shadow
        );
        assert!(several.source.contains(&block), "limit {n}");
        let alone = Script::for_policy(policy, &common()).source;
        assert!(alone.contains(&decide(policy, &common())), "limit {n}");
    }
    let scripts = Scripts::new(common());
    let made = scripts.several(&set);
    assert_eq!(made.name, several.name);
    assert!(Arc::ptr_eq(&made, &scripts.several(&set)));
    assert!(scripts.has_several(&set) && !scripts.has_several(&set[..2]));
    assert!(scripts.all().iter().any(|s| s.name == several.name));

    let (a, b) = (
        PseudonymKey::new(b"k", 1).pseudonym("ip", b"192.0.2.1", "signup"),
        PseudonymKey::new(b"k", 1).pseudonym("global", b"", "signup"),
    );
    let at = |policy, subject, cost| Evaluation {
        policy,
        subject,
        cost,
        deadline: tokio::time::Instant::now(),
        id: EvaluationId(0xab),
        settle_within: None,
    };
    let evaluations = [at(&policies[0], &a, 1), at(&policies[4], &b, 3)];
    let sent = args(&call_several(
        &several,
        Mode::Functions,
        &common(),
        &evaluations,
    ));
    let id = format!("{:032x}", 0xab);
    let key =
        |p: &Policy, s: &Pseudonym| format!("sl:{{{}:{}:{}{s}}}", p.name, p.revision, mark(p));
    let (ka, kb) = (key(&policies[0], &a), key(&policies[4], &b));
    assert_eq!(
        sent,
        [
            "FCALL".to_owned(),
            several.name.clone(),
            "4".to_owned(),
            ka.clone(),
            format!("{ka}:e:{id}"),
            kb.clone(),
            format!("{kb}:e:{id}"),
            "2".to_owned(),
            id,
            "1".to_owned(),
            "3".to_owned(),
        ]
    );
}

#[test]
fn ids_are_sent_as_evaluation_id_displays_them() {
    for id in [
        0,
        1,
        0xab,
        0x0123_4567_89ab_cdef,
        u128::MAX,
        u128::MAX >> 4,
        1 << 127,
    ] {
        let hex = hex_id(id);
        assert_eq!(
            std::str::from_utf8(&hex),
            Ok(EvaluationId(id).to_string().as_str())
        );
    }
}
