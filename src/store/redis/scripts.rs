//! The Lua scripts (one per algorithm, `lua/`), compiled once per policy
//! into a Redis Functions library, and the one command that runs them:
//! `FCALL` with the keys and the arguments `lua/README.md` states. A
//! request with several rate limits runs one library made of theirs
//! (`lua/several.lua`), compiled once per list of policies, over all their
//! keys.
//!
//! A library defines its helpers (`lua/common.lua`, `lua/state.lua`) at its
//! top level, which Redis runs once, when the library loads; only the
//! policy's own function runs on every call. A policy's numbers (its bands,
//! its TTL) and the store's (the clock bound, the de-duplication window) are
//! written into the policy's library as Lua literals: converting them from
//! arguments on every call was the largest part of a script's cost. Each
//! distinct set of bands gets its own library, named after the SHA-1 of its
//! code, made the first time the policy is seen.
//!
//! Each library also has its cached-script form, for `store.scripts: eval`
//! (`mode`): the same code without the `#!lua` line, ending in a call of
//! its function instead of its registration, run with `EVALSHA`. The
//! helpers are then made anew on every call, which costs Redis more per
//! decision; the keys and arguments are the same.

use std::fmt::Write as _;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use redis::{Cmd, RedisWrite};
use smallvec::SmallVec;

use crate::limit::{micros, Algorithm, Bands, Policy};
use crate::subject::{Pseudonym, DISPLAY_MAX};

use super::mode::Mode;
use crate::store::Evaluation;
use crate::sync::Memo;

/// One policy's library, and the name of it and of its one function.
pub struct Script {
    /// `None` for the library of several limits.
    pub algorithm: Option<Algorithm>,
    /// The library's code: `lua/common.lua`, `lua/state.lua`, the policy's
    /// numbers, the algorithm's file and the function's registration.
    pub source: String,
    /// `sluice_<SHA-1>`, the SHA-1 being that of the code with this name
    /// left out (it cannot hash itself): two sidecars compiling the same
    /// policy with the same settings name the same library.
    pub name: String,
    /// The same code as one script for `EVALSHA` (`store.scripts: eval`):
    /// no `#!lua` line (stores without Functions may not read one), and
    /// instead of the registration, a call of the function with the
    /// script's `KEYS` and `ARGV`.
    pub eval: String,
    /// The SHA-1 of [`Script::eval`]: what `SCRIPT LOAD` answers and
    /// `EVALSHA` names.
    pub sha: String,
    /// A policy's library only: its second function,
    /// `sluice_<SHA-1>_batch`, which decides several evaluations in one
    /// call (`lua/batch.lua`). Functions only: cached scripts have none.
    pub batch: Option<String>,
}

/// Every library's name starts so; nothing else sluice loads does.
pub const LIBRARY_PREFIX: &str = "sluice_";
/// Where the library's name goes in its code before it is known.
const NAME_AT: &str = "@LIBRARY@";
const COMMON: &str = include_str!("../../../lua/common.lua");
const STATE: &str = include_str!("../../../lua/state.lua");
/// Lua's limit on one pattern's captures.
const MAX_CAPTURES: usize = 32;
/// Several limits in one call, and where it takes each limit's function.
const SEVERAL: &str = include_str!("../../../lua/several.lua");
const LIMITS_AT: &str =
    "-- @limits (sluice puts each limit's decide in here, in the route's order)\n";

/// Refunds (`lua/refund.lua`), and where they take the algorithm's part.
const REFUND: &str = include_str!("../../../lua/refund.lua");
const UNDO_AT: &str =
    "  -- @undo (the algorithm's part, lua/refund/<algorithm>.lua, is spliced in here)\n";

/// Several evaluations of one policy in one call (`lua/batch.lua`): in
/// every policy's library, after its `decide`.
const BATCH: &str = include_str!("../../../lua/batch.lua");
/// What the batch function's name adds to its library's.
pub const BATCH_SUFFIX: &str = "_batch";

/// The stand-in for `redis` of the read-only libraries (`lua/peek.lua`).
const PEEK: &str = include_str!("../../../lua/peek.lua");
/// What every algorithm's file defines: the policy's function.
#[cfg(test)]
const DECIDE: &str = "local function decide(redis, KEYS, ARGV)\n";

impl Script {
    /// The library `policy` runs with on a store configured as `common`.
    pub fn for_policy(policy: &Policy, common: &Common) -> Script {
        Script::compile(policy, common, false)
    }

    /// `policy`'s library made read-only: it decides exactly as
    /// [`Script::for_policy`]'s does and writes nothing. A library of its
    /// own, so the one requests run is the same, byte for byte, whether
    /// or not anyone asks for an explanation.
    pub fn peek_for_policy(policy: &Policy, common: &Common) -> Script {
        Script::compile(policy, common, true)
    }

    fn compile(policy: &Policy, common: &Common, peek: bool) -> Script {
        let mut code = header();
        if peek {
            code.push_str(PEEK);
        }
        code.push_str(&decide(policy, common));
        // `redis` in the callback is looked up when it runs: the library's
        // load sees a `redis` that only registers.
        let (server, flags) = if peek {
            // Redis then refuses any write the function would still
            // attempt, and lets it run on a replica (FCALL_RO) or when out
            // of memory.
            ("READ_ONLY", ", flags = {'no-writes'}")
        } else {
            ("redis", "")
        };
        let mut register = format!(
            "redis.register_function{{function_name = '{NAME_AT}', \
             callback = function(keys, args) return decide({server}, keys, args) end{flags}}}\n"
        );
        if !peek {
            register.push_str(BATCH);
            // Writing into a String cannot fail.
            let _ = writeln!(
                register,
                "redis.register_function{{function_name = '{NAME_AT}{BATCH_SUFFIX}', callback = batch}}"
            );
        }
        let call = format!("return decide({server}, KEYS, ARGV)\n");
        let mut script = Script::named(Some(policy.algorithm()), code, &register, &call);
        if !peek {
            script.batch = Some(format!("{}{BATCH_SUFFIX}", script.name));
        }
        script
    }

    /// The library that evaluates `policies` together (`lua/several.lua`):
    /// each policy's own `decide`, numbers and all, in a block of its own,
    /// and whether the policy is shadow (its denial blocks nothing).
    pub fn for_limits(policies: &[&Policy], common: &Common) -> Script {
        let mut limits = String::new();
        for (i, policy) in policies.iter().enumerate() {
            let n = i + 1;
            limits.push_str("do\n");
            limits.push_str(&decide(policy, common));
            // Writing into a String cannot fail.
            let _ = writeln!(
                limits,
                "LIMITS[{n}], SHADOW[{n}] = decide, {}\nend",
                policy.shadow
            );
        }
        let mut code = header();
        code.push_str(&SEVERAL.replacen(LIMITS_AT, &limits, 1));
        let register =
            format!("redis.register_function{{function_name = '{NAME_AT}', callback = several}}\n");
        Script::named(None, code, &register, "return several(KEYS, ARGV)\n")
    }

    /// The library that gives back what one admitted evaluation of `policy`
    /// charged (`lua/refund.lua` with the algorithm's part): KEYS, ARGV
    /// and the command are an evaluation's own ([`call`]).
    pub fn refund_for_policy(policy: &Policy, common: &Common) -> Script {
        let algorithm = policy.algorithm();
        let mut code = header();
        code.push_str(&literals(policy, common));
        code.push_str(&REFUND.replacen(UNDO_AT, algorithm.refund_lua(), 1));
        let register =
            format!("redis.register_function{{function_name = '{NAME_AT}', callback = refund}}\n");
        Script::named(
            Some(algorithm),
            code,
            &register,
            "return refund(KEYS, ARGV)\n",
        )
    }

    /// Ends `code` (the `#!lua` line, the helpers, the function) with
    /// `register` for the library, or with `call` for the cached script;
    /// names the library after the SHA-1 of its code, and writes the name
    /// in.
    fn named(algorithm: Option<Algorithm>, mut code: String, register: &str, call: &str) -> Script {
        // Everything after the `#!lua name=` line is Lua either way.
        let body = code.find('\n').map_or(0, |i| i + 1);
        let mut eval = String::with_capacity(code.len() - body + call.len());
        eval.push_str(&code[body..]);
        eval.push_str(call);
        code.push_str(register);
        let name = format!("{LIBRARY_PREFIX}{}", redis::Script::new(&code).get_hash());
        Script {
            algorithm,
            source: code.replace(NAME_AT, &name),
            name,
            sha: redis::Script::new(&eval).get_hash().to_owned(),
            eval,
            batch: None,
        }
    }

    /// `FUNCTION LOAD REPLACE`: the library may be there already (another
    /// sidecar loaded it, or this one before a restart); replacing it with
    /// the same code changes nothing for anyone calling it. Or `SCRIPT
    /// LOAD`, which caches the script under its SHA-1.
    pub fn load_command(&self, mode: Mode) -> Cmd {
        match mode {
            Mode::Functions => {
                let mut cmd = redis::cmd("FUNCTION");
                cmd.arg("LOAD").arg("REPLACE").arg(&self.source);
                cmd
            }
            Mode::Eval => {
                let mut cmd = redis::cmd("SCRIPT");
                cmd.arg("LOAD").arg(&self.eval);
                cmd
            }
        }
    }

    /// What a load of it in `mode` answers: the library's name, or the
    /// script's SHA-1.
    pub fn loaded_as(&self, mode: Mode) -> &str {
        match mode {
            Mode::Functions => &self.name,
            Mode::Eval => &self.sha,
        }
    }

    /// The command's first two words in `mode`: `FCALL <library>` or
    /// `EVALSHA <sha>` (the function and the library share the name).
    pub(super) fn call_words(&self, mode: Mode, cmd: &mut Cmd) {
        match mode {
            Mode::Functions => cmd.arg("FCALL").arg(self.name.as_str()),
            Mode::Eval => cmd.arg("EVALSHA").arg(self.sha.as_str()),
        };
    }
}

/// What every library starts with: its name, then the helpers, defined
/// once, when the library loads.
fn header() -> String {
    let mut code = String::with_capacity(COMMON.len() + STATE.len() + 4096);
    let _ = writeln!(code, "#!lua name={NAME_AT}");
    code.push_str(COMMON);
    code.push_str(STATE);
    code
}

/// `policy`'s numbers and its algorithm's `decide`.
fn decide(policy: &Policy, common: &Common) -> String {
    let mut out = literals(policy, common);
    out.push_str(policy.algorithm().lua());
    out
}

/// The `P_` locals `lua/common.lua` reads, as Lua literals. Integers are
/// written with `%d`-exact digits (every one is below 2^53, checked when
/// the configuration loaded); the TTL and window also as strings, passed
/// to Redis as they are.
fn literals(policy: &Policy, common: &Common) -> String {
    let bands = policy.bands();
    let ttl = ceil_ms(policy.horizon() + common.ttl_grace);
    let mut out = String::with_capacity(256);
    // Writing into a String cannot fail.
    let _ = writeln!(out, "local P_TTL_MS, P_TTL_TEXT = {ttl}, '{ttl}'");
    let _ = writeln!(
        out,
        "local P_MAX_REGRESSION_US = {}",
        micros(common.max_clock_regression)
    );
    let _ = writeln!(
        out,
        "local P_DEDUPE_WINDOW_TEXT = '{}'",
        ceil_ms(common.dedupe_window)
    );
    let _ = writeln!(out, "local P_BANDS = {}", bands.len());
    let args: Vec<u64> = bands
        .profiles()
        .into_iter()
        .flat_map(|band| band.lua_args)
        .collect();
    let list: Vec<String> = args.iter().map(u64::to_string).collect();
    let _ = writeln!(out, "local P_BAND_ARGS = {{{}}}", list.join(", "));
    let per_band = policy.algorithm().state_numbers();
    if per_band > 0 {
        // The compact state's pattern (one capture per number; `false`
        // past Lua's limit, read by the general path) and format.
        let n = 1 + bands.len() * per_band;
        let pattern = if n <= MAX_CAPTURES {
            format!("'^(%d+){}$'", ":(%d+)".repeat(n - 1))
        } else {
            "false".to_owned()
        };
        let _ = writeln!(
            out,
            "local P_STATE_PATTERN, P_STATE_FORMAT = {pattern}, '%d{}'",
            ":%d".repeat(n - 1)
        );
    }
    out
}

/// What the script of several limits depends on: each limit's bands (its
/// algorithm and numbers) and whether it is shadow, in order.
type LimitsKey = Vec<(Bands, bool)>;

fn limits_key(policies: &[&Policy]) -> LimitsKey {
    policies
        .iter()
        .map(|p| (p.bands().clone(), p.shadow))
        .collect()
}

/// Every policy's script this store has seen, by its bands (which name the
/// algorithm): all a script depends on besides the store's own settings.
/// Not by revision: a revision written in the file may be shared by
/// policies whose bands differ (to keep counters across a change), and
/// each must still run its own numbers.
pub struct Scripts {
    common: Common,
    /// Looked up on every evaluation, so by the digest of the bands the
    /// policy keeps ([`Policy::numbers`]): hashing the bands themselves
    /// cost more than the rest of building the command. The entry keeps
    /// the bands, to tell two that share a digest apart.
    by_bands: Memo<u64, Arc<Made>>,
    /// The scripts of several limits, by each limit's bands and shadow.
    by_limits: Memo<LimitsKey, Arc<Script>>,
    /// The read-only scripts of `POST /explain`, made and loaded on first
    /// use only: most sidecars never explain anything.
    peeks: Memo<Bands, Arc<Script>>,
    /// The refund scripts, made for the policies of routes with several
    /// limits on Redis Cluster only.
    refunds: Memo<Bands, Arc<Script>>,
}

impl Scripts {
    pub fn new(common: Common) -> Scripts {
        Scripts {
            common,
            by_bands: Memo::new(),
            by_limits: Memo::new(),
            peeks: Memo::new(),
            refunds: Memo::new(),
        }
    }

    /// `policy`'s refund script, made on first use; `true` when this call
    /// made it.
    pub fn refund(&self, policy: &Policy) -> (Arc<Script>, bool) {
        self.refunds.get_or_make(policy.bands(), || {
            Arc::new(Script::refund_for_policy(policy, &self.common))
        })
    }

    /// `policy`'s read-only script, made on first use; `true` when this
    /// call made it (so it is not loaded yet).
    pub fn peek(&self, policy: &Policy) -> (Arc<Script>, bool) {
        self.peeks.get_or_make(policy.bands(), || {
            Arc::new(Script::peek_for_policy(policy, &self.common))
        })
    }

    /// The script of `policies` together, made on first use. Looked up by
    /// a list built per call: a multi-limit request allocates that much.
    pub fn several(&self, policies: &[&Policy]) -> Arc<Script> {
        let key = limits_key(policies);
        let (script, _) = self.by_limits.get_or_make(&key, || {
            Arc::new(Script::for_limits(policies, &self.common))
        });
        script
    }

    pub fn common(&self) -> &Common {
        &self.common
    }

    /// `policy`'s script, made on first use.
    pub fn get(&self, policy: &Policy) -> Arc<Script> {
        let (made, _) = self.by_bands.get_or_make(&policy.numbers(), || {
            Arc::new(Made {
                bands: policy.bands().clone(),
                script: Arc::new(Script::for_policy(policy, &self.common)),
            })
        });
        if made.bands == *policy.bands() {
            return made.script.clone();
        }
        // Two sets of bands with one 64-bit digest: never cached, the
        // first call of this one's library loads it on function not found.
        Arc::new(Script::for_policy(policy, &self.common))
    }

    pub fn has_several(&self, policies: &[&Policy]) -> bool {
        self.by_limits.contains(&limits_key(policies))
    }

    pub fn has(&self, policy: &Policy) -> bool {
        self.by_bands.contains(&policy.numbers())
    }

    /// Every library made so far, the read-only ones included (to hold
    /// their leases).
    pub fn every(&self) -> Vec<Arc<Script>> {
        let mut every = self.all();
        every.extend(self.peeks.values());
        every
    }

    /// The names of [`Scripts::every`].
    pub fn names(&self) -> std::collections::HashSet<String> {
        self.every().iter().map(|s| s.name.clone()).collect()
    }

    /// Every script made so far (to load them all).
    pub fn all(&self) -> Vec<Arc<Script>> {
        let mut all: Vec<Arc<Script>> = self
            .by_bands
            .values()
            .into_iter()
            .map(|made| made.script.clone())
            .collect();
        all.extend(self.by_limits.values());
        all.extend(self.refunds.values());
        all
    }
}

/// A policy's script, and the bands it was made for.
struct Made {
    bands: Bands,
    script: Arc<Script>,
}

/// The per-store arguments every script takes besides the policy's bands.
#[derive(Debug, Clone)]
pub struct Common {
    pub key_prefix: String,
    pub ttl_grace: Duration,
    pub max_clock_regression: Duration,
    pub dedupe_window: Duration,
}

/// The state key of `evaluation`, as its command carries it.
pub fn state_key(common: &Common, evaluation: &Evaluation<'_>) -> StateKey {
    let mut key = StateKey::new();
    write_state_key(
        &mut key,
        &common.key_prefix,
        evaluation.policy,
        evaluation.subject,
    );
    key
}

/// A state key, on the stack unless the prefix and policy name are long:
/// one is rendered for every evaluation, and a heap buffer's allocation
/// and free cost more than writing it.
pub type StateKey = SmallVec<[u8; 160]>;

/// The state key of one (policy, revision, subject):
/// `{prefix}:{<policy>:<revision>:<mark>:<pseudonym>}`, the mark naming
/// the format of the state kept there (a string of numbers; none for the
/// sliding log's sorted set, whose key has no mark). The braces are a
/// Redis Cluster hash tag around the per-subject part, so the state and
/// every evaluation's record (`<state>:e:<id>`, see `lua/common.lua`)
/// share one slot.
fn write_state_key(out: &mut StateKey, prefix: &str, policy: &Policy, subject: &Pseudonym) {
    let mut pseudonym = [0u8; DISPLAY_MAX];
    let len = subject.encode(&mut pseudonym);
    let mark = policy.algorithm().state_mark();
    for part in [
        prefix.as_bytes(),
        b":{",
        policy.name.as_bytes(),
        b":",
        policy.revision.as_bytes(),
        b":",
    ] {
        out.extend_from_slice(part);
    }
    if !mark.is_empty() {
        out.extend_from_slice(mark.as_bytes());
        out.push(b':');
    }
    out.extend_from_slice(&pseudonym[..len]);
    out.push(b'}');
}

/// Bytes reserved up front for one command: the fixed words, the SHA-1, the
/// id and the integers fit; the keys are added on top. Growing the buffer
/// as arguments arrive cost more than formatting them.
const CMD_BYTES: usize = 192;

/// `FCALL name 2 state record first id cost [life]` (or `EVALSHA sha 2
/// …`), the record being `<state>:e:<id>`: both keys declared, under one
/// hash tag. `first`: this is the call's first send, so the script need
/// not look for the record (`lua/README.md`, "ARGV"); every re-send goes
/// as [`resent`] makes it.
pub fn call(
    script: &Script,
    mode: Mode,
    common: &Common,
    evaluation: &Evaluation<'_>,
    first: bool,
) -> Cmd {
    let policy = evaluation.policy;
    // The key's length without the subject, which displays in under 64,
    // and its mark.
    let key_bytes = common.key_prefix.len() + policy.name.len() + policy.revision.len() + 72;
    let mut cmd = Cmd::with_capacity(8, CMD_BYTES + 2 * key_bytes);
    script.call_words(mode, &mut cmd);
    cmd.arg(2u8);
    let id = hex_id(evaluation.id.0);
    push_keys(&mut cmd, common, evaluation, &id);
    cmd.arg(attempt(first)).arg(&id[..]).arg(evaluation.cost);
    if let Some(within) = evaluation.settle_within {
        cmd.arg(record_life(within));
    }
    cmd
}

/// A decision's first argument: `1` on its first send, `0` on a re-send
/// (`lua/README.md`, "ARGV").
pub(super) fn attempt(first: bool) -> &'static [u8] {
    if first {
        b"1"
    } else {
        b"0"
    }
}

/// `cmd` (a decision: one evaluation, several limits or a batch, `FCALL` or
/// `EVALSHA`) as it goes again: the same keys and arguments, evaluation ids
/// included, its first argument saying `0`, so the script looks for the
/// records of what the earlier send may have applied.
pub fn resent(cmd: &Cmd) -> Cmd {
    let mut out = Cmd::new();
    // `FCALL name numkeys keys… ARGV[1] …`: ARGV[1] follows the keys.
    let mut flag = None;
    for (i, arg) in cmd.args_iter().enumerate() {
        let redis::Arg::Simple(bytes) = arg else {
            continue;
        };
        if i == 2 {
            flag = std::str::from_utf8(bytes)
                .ok()
                .and_then(|n| n.parse::<usize>().ok())
                .map(|keys| 3 + keys);
        }
        if Some(i) == flag {
            out.arg(attempt(false));
        } else {
            out.arg(bytes);
        }
    }
    out
}

/// `FCALL name 2 state record id units` (or `EVALSHA`): a refund of what
/// `evaluation` (its id) charged, `evaluation.cost` being the units to
/// give back (`lua/README.md`, "Refunds").
pub fn refund_call(
    script: &Script,
    mode: Mode,
    common: &Common,
    evaluation: &Evaluation<'_>,
) -> Cmd {
    let mut cmd = Cmd::with_capacity(7, CMD_BYTES + 320);
    script.call_words(mode, &mut cmd);
    cmd.arg(2u8);
    let id = hex_id(evaluation.id.0);
    push_keys(&mut cmd, common, evaluation, &id);
    cmd.arg(&id[..]).arg(evaluation.cost);
    cmd
}

/// The third argument of a reserved evaluation: how long its record lives
/// (`lua/README.md`, "ARGV"), in whole milliseconds, at most a day.
pub(super) fn record_life(within: Duration) -> u64 {
    ceil_ms(within).clamp(1, 86_400_000)
}

/// An evaluation's two keys: its state, then its record,
/// `<state>:e:<id>`. The state key is rendered once; the record's name
/// repeats it.
fn push_keys(cmd: &mut Cmd, common: &Common, evaluation: &Evaluation<'_>, id: &[u8; 32]) {
    let policy = evaluation.policy;
    // The key's length without the subject, which displays in under 64,
    // and its mark.
    let key_bytes = common.key_prefix.len() + policy.name.len() + policy.revision.len() + 72;
    let mut state = StateKey::new();
    state.reserve(key_bytes);
    write_state_key(&mut state, &common.key_prefix, policy, evaluation.subject);
    cmd.arg(&state[..]);
    let mut arg = cmd.writer_for_next_arg();
    // Writing into the command's own buffer cannot fail.
    let _ = arg.write_all(&state);
    let _ = arg.write_all(b":e:");
    let _ = arg.write_all(id);
}

/// `FCALL name 2n state_1 record_1 … state_n record_n first id cost_1 …
/// cost_n [life]`: every limit's two keys, as [`call`] sends them, one id
/// for all.
pub fn call_several(
    script: &Script,
    mode: Mode,
    common: &Common,
    evaluations: &[Evaluation<'_>],
    first: bool,
) -> Cmd {
    let id = evaluations.first().map_or([b'0'; 32], |e| hex_id(e.id.0));
    let mut cmd = Cmd::with_capacity(5 + 3 * evaluations.len(), CMD_BYTES * evaluations.len());
    script.call_words(mode, &mut cmd);
    cmd.arg(2 * evaluations.len());
    for evaluation in evaluations {
        push_keys(&mut cmd, common, evaluation, &id);
    }
    cmd.arg(attempt(first)).arg(&id[..]);
    for evaluation in evaluations {
        cmd.arg(evaluation.cost);
    }
    // One record life for the call: the longest any limit asks.
    if let Some(within) = evaluations.iter().filter_map(|e| e.settle_within).max() {
        cmd.arg(record_life(within));
    }
    cmd
}

/// `cmd` (an `FCALL`) as the same call of the cached script: its keys and
/// arguments, evaluation id included, unchanged.
pub fn as_evalsha(script: &Script, cmd: &Cmd) -> Cmd {
    let mut out = Cmd::new();
    script.call_words(Mode::Eval, &mut out);
    for arg in cmd.args_iter().skip(2) {
        if let redis::Arg::Simple(bytes) = arg {
            out.arg(bytes);
        }
    }
    out
}

/// The evaluation id as 32 lowercase hex digits, zero-padded: what
/// `EvaluationId`'s `Display` gives, without the formatting machinery.
pub(super) fn hex_id(id: u128) -> [u8; 32] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 32];
    for (i, digit) in out.iter_mut().enumerate() {
        let nibble = (id >> (124 - 4 * i)) & 0xf;
        *digit = DIGITS[nibble as usize];
    }
    out
}

/// Whole milliseconds, rounded up and at least one: a TTL or window cut
/// short would forget state that still matters.
fn ceil_ms(d: Duration) -> u64 {
    micros(d).div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests;
