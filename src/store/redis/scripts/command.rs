//! The commands that run a script: a decision's (one evaluation, several
//! limits), a refund's, and the same decision sent again; and the keys
//! they name (`lua/README.md`, "KEYS" and "ARGV").

use std::time::Duration;

use smallvec::SmallVec;

use crate::limit::Policy;
use crate::store::Evaluation;
use crate::subject::{Pseudonym, DISPLAY_MAX};

use super::super::mode::Mode;
use super::super::packed::{Packed, Packer};
use super::{ceil_ms, Common, Script};

/// The state key of `evaluation`, as its command carries it.
pub fn state_key(common: &Common, evaluation: &Evaluation<'_>) -> StateKey {
    render_state_key(&common.key_prefix, evaluation.policy, evaluation.subject)
}

/// A state key, on the stack unless the prefix and policy name are long:
/// one is rendered for every evaluation, and a heap buffer's allocation
/// and free cost more than writing it.
pub type StateKey = SmallVec<[u8; STATE_KEY_INLINE]>;

/// The longest state key kept on the stack.
const STATE_KEY_INLINE: usize = 160;

/// The state key of one (policy, revision, subject):
/// `{prefix}:{<policy>:<revision>:<mark>:<pseudonym>}`, the mark naming
/// the format of the state kept there (a string of numbers; none for the
/// sliding log's sorted set, whose key has no mark). The braces are a
/// Redis Cluster hash tag around the per-subject part, so the state and
/// every evaluation's record (`<state>:e:<id>`, see `lua/common.lua`)
/// share one slot.
fn render_state_key(prefix: &str, policy: &Policy, subject: &Pseudonym) -> StateKey {
    let mut pseudonym = [0u8; DISPLAY_MAX];
    let len = subject.encode(&mut pseudonym);
    let mark = policy.algorithm().state_mark().as_bytes();
    let parts: [&[u8]; 10] = [
        prefix.as_bytes(),
        b":{",
        policy.name.as_bytes(),
        b":",
        policy.revision.as_bytes(),
        b":",
        mark,
        if mark.is_empty() { b"" } else { b":" },
        &pseudonym[..len],
        b"}",
    ];
    let total: usize = parts.iter().map(|part| part.len()).sum();
    if total > STATE_KEY_INLINE {
        let mut key = StateKey::with_capacity(total);
        for part in parts {
            key.extend_from_slice(part);
        }
        return key;
    }
    // Copied part by part into a plain array: `SmallVec::extend_from_slice`
    // is an insertion, and cost about 75 instructions a part.
    let mut buf = [0u8; STATE_KEY_INLINE];
    let mut at = 0;
    for part in parts {
        buf[at..at + part.len()].copy_from_slice(part);
        at += part.len();
    }
    StateKey::from_buf_and_len(buf, total)
}

/// Bytes reserved up front for one command: the fixed words, the SHA-1, the
/// id, the integers and every argument's length line fit; the keys are
/// added on top. Growing the buffer as arguments arrive cost more than
/// formatting them.
const CMD_BYTES: usize = 192;

/// `FCALL name 2 state record first id [cost [life]]` (or `EVALSHA sha 2
/// …`), the record being `<state>:e:<id>`: both keys declared, under one
/// hash tag; a cost of 1 not sent unless a life follows it. `first`: this is the call's first send, so the script need
/// not look for the record (`lua/README.md`, "ARGV"); every re-send goes
/// as [`resent`] makes it.
pub fn call(
    script: &Script,
    mode: Mode,
    common: &Common,
    evaluation: &Evaluation<'_>,
    first: bool,
) -> Packed {
    decision(
        script,
        mode,
        &state_key(common, evaluation),
        &hex_id(evaluation.id.0),
        first,
        evaluation.cost,
        evaluation.settle_within.map(record_life),
    )
}

/// [`call`] of an evaluation rendered already: its state key, its id, its
/// cost and its record's life, ms (a queued evaluation's, `coalesce`).
pub fn decision(
    script: &Script,
    mode: Mode,
    state: &[u8],
    id: &[u8; 32],
    first: bool,
    cost: u32,
    life: Option<u64>,
) -> Packed {
    // The keys twice, with their length lines, beside the rest.
    let mut cmd = Packer::with_capacity(CMD_BYTES + 2 * (state.len() + 48));
    script.call_words(mode, &mut cmd);
    cmd.arg(b"2");
    push_state_and_record(&mut cmd, state, id);
    cmd.arg(attempt(first)).arg(id);
    // A cost of 1 (most requests') is the script's when none is sent, but
    // before a record life: Redis makes each argument an element of a
    // table for the call, about 1,600 instructions an argument.
    if cost != 1 || life.is_some() {
        cmd.int(u64::from(cost));
    }
    if let Some(life) = life {
        cmd.int(life);
    }
    cmd.finish()
}

/// A decision's first argument as it is first sent (`lua/README.md`,
/// "ARGV"): `1` on a first send, the script then looking for no record;
/// `2` where no send is ever marked first (Redis Cluster, several limits
/// in one call), the script then looking for one on every send.
pub(in crate::store::redis) fn attempt(first: bool) -> &'static [u8] {
    if first {
        b"1"
    } else {
        b"2"
    }
}

/// A decision's first argument as `cmd` goes again: `0` for a call first
/// sent as `1`, which may yet reach Redis after this one (the script
/// then says so in the state); `2` stays `2`.
fn again(flag: &[u8]) -> &[u8] {
    if flag == b"1" {
        b"0"
    } else {
        flag
    }
}

/// `cmd` (a decision: one evaluation, several limits or a batch, `FCALL` or
/// `EVALSHA`) as it goes again: the same keys and arguments, evaluation ids
/// included, its first argument saying it may be a re-send ([`again`]), so
/// the script looks for the records of what the earlier send may have
/// applied.
pub fn resent(cmd: &Packed) -> Packed {
    let mut out = Packer::with_capacity(cmd.bytes().len());
    // `FCALL name numkeys keys… ARGV[1] …`: ARGV[1] follows the keys.
    let mut flag = None;
    for (i, bytes) in cmd.args().enumerate() {
        if i == 2 {
            flag = std::str::from_utf8(bytes)
                .ok()
                .and_then(|n| n.parse::<usize>().ok())
                .map(|keys| 3 + keys);
        }
        if Some(i) == flag {
            out.arg(again(bytes));
        } else {
            out.arg(bytes);
        }
    }
    out.finish()
}

/// `FCALL name 2 state record id units` (or `EVALSHA`): a refund of what
/// `evaluation` (its id) charged, `evaluation.cost` being the units to
/// give back (`lua/README.md`, "Refunds").
pub fn refund_call(
    script: &Script,
    mode: Mode,
    common: &Common,
    evaluation: &Evaluation<'_>,
) -> Packed {
    let mut cmd = Packer::with_capacity(CMD_BYTES + 320);
    script.call_words(mode, &mut cmd);
    cmd.arg(b"2");
    let id = hex_id(evaluation.id.0);
    push_keys(&mut cmd, common, evaluation, &id);
    cmd.arg(&id).int(u64::from(evaluation.cost));
    cmd.finish()
}

/// The third argument of a reserved evaluation: how long its record lives
/// (`lua/README.md`, "ARGV"), in whole milliseconds, at most a day.
pub(in crate::store::redis) fn record_life(within: Duration) -> u64 {
    ceil_ms(within).clamp(1, 86_400_000)
}

/// An evaluation's two keys: its state, then its record,
/// `<state>:e:<id>`. The state key is rendered once; the record's name
/// repeats it.
fn push_keys(cmd: &mut Packer, common: &Common, evaluation: &Evaluation<'_>, id: &[u8; 32]) {
    push_state_and_record(cmd, &state_key(common, evaluation), id);
}

/// The two keys of an evaluation whose state key is `state`: the state,
/// then its record `<state>:e:<id>`, written straight into the command.
pub fn push_state_and_record(cmd: &mut Packer, state: &[u8], id: &[u8]) {
    cmd.arg(state).arg_of(&[state, b":e:", id]);
}

/// `FCALL name 2n state_1 record_1 … state_n record_n 0 id cost_1 …
/// cost_n [life]`: every limit's two keys, as [`call`] sends them, one id
/// for all. Never sent as a first send (`0`, `lua/several.lua`): its writes
/// wait until every limit has decided, so a first send could not claim its
/// record before charging.
pub fn call_several(
    script: &Script,
    mode: Mode,
    common: &Common,
    evaluations: &[Evaluation<'_>],
) -> Packed {
    let id = evaluations.first().map_or([b'0'; 32], |e| hex_id(e.id.0));
    let mut cmd = Packer::with_capacity(2 * CMD_BYTES * evaluations.len());
    script.call_words(mode, &mut cmd);
    cmd.int(2 * evaluations.len() as u64);
    for evaluation in evaluations {
        push_keys(&mut cmd, common, evaluation, &id);
    }
    cmd.arg(attempt(false)).arg(&id);
    for evaluation in evaluations {
        cmd.int(u64::from(evaluation.cost));
    }
    // One record life for the call: the longest any limit asks.
    if let Some(within) = evaluations.iter().filter_map(|e| e.settle_within).max() {
        cmd.int(record_life(within));
    }
    cmd.finish()
}

/// `cmd` (an `FCALL`) as the same call of the cached script: its keys and
/// arguments, evaluation id included, unchanged.
pub fn as_evalsha(script: &Script, cmd: &Packed) -> Packed {
    let mut out = Packer::with_capacity(cmd.bytes().len() + 64);
    script.call_words(Mode::Eval, &mut out);
    for bytes in cmd.args().skip(2) {
        out.arg(bytes);
    }
    out.finish()
}

/// The evaluation id as 32 lowercase hex digits, zero-padded: what
/// `EvaluationId`'s `Display` gives, without the formatting machinery.
pub(in crate::store::redis) fn hex_id(id: u128) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    // A byte, two digits, at a time: a `u128` shifted per digit cost about
    // 150 instructions an id.
    for (pair, byte) in out.chunks_exact_mut(2).zip(id.to_be_bytes()) {
        pair[0] = DIGITS[usize::from(byte >> 4)];
        pair[1] = DIGITS[usize::from(byte & 0xf)];
    }
    out
}
