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
use std::sync::Arc;
use std::time::Duration;

use redis::Cmd;

use crate::limit::{micros, Algorithm, Bands, Policy};

use super::mode::Mode;
use super::packed::Packer;
use crate::sync::{ByDigest, Memo};

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
    /// The command's first two words in each mode, packed once: every
    /// decision starts with them.
    words: Words,
}

/// `FCALL <library>` and `EVALSHA <sha>`, as Redis reads them.
struct Words {
    fcall: Box<[u8]>,
    evalsha: Box<[u8]>,
}

impl Words {
    fn of(name: &str, sha: &str) -> Words {
        let packed = |verb: &[u8], word: &str| {
            let mut cmd = Packer::with_capacity(64);
            cmd.arg(verb).arg(word.as_bytes());
            cmd.finish().args_bytes().into()
        };
        Words {
            fcall: packed(b"FCALL", name),
            evalsha: packed(b"EVALSHA", sha),
        }
    }
}

/// Every library's name starts so; nothing else sluice loads does.
pub const LIBRARY_PREFIX: &str = "sluice_";
/// Where the library's name goes in its code before it is known.
const NAME_AT: &str = "@LIBRARY@";
const COMMON: &str = include_str!("../../../lua/common.lua");
const STATE: &str = include_str!("../../../lua/state.lua");
/// Lua's limit on one pattern's captures.
const MAX_CAPTURES: usize = 32;
/// What follows a compact state's numbers when it holds a first send's
/// record: when the record expires (µs), until when a re-send's record may
/// be found, the record's id, and the record (`lua/state.lua`, `settle`).
/// The record's outcome is always an admission's: written as it is.
const HELD_RECORD_FORMAT: &str = "|%d|%d|%s|1:%d:%d:%d:%d:%d";
/// The same, for a record with nothing resent before it (`resent` 0).
const HELD_FIRST_RECORD_FORMAT: &str = "|%d|0|%s|1:%d:%d:%d:%d:%d";
/// [`HELD_RECORD_FORMAT`] and [`HELD_FIRST_RECORD_FORMAT`] for the
/// admission most are, with no retry and the first band: both written
/// `0`. Each `%d` is a `sprintf` in Redis's Lua, about 1,600 instructions.
const HELD_PLAIN_RECORD_FORMAT: &str = "|%d|%d|%s|1:%d:%d:0:0:%d";
const HELD_FIRST_PLAIN_RECORD_FORMAT: &str = "|%d|0|%s|1:%d:%d:0:0:%d";
/// How many values [`HELD_RECORD_FORMAT`] formats after the state's
/// numbers.
const HELD_RECORD_NUMBERS: usize = 8;

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
        let sha = redis::Script::new(&eval).get_hash().to_owned();
        Script {
            algorithm,
            source: code.replace(NAME_AT, &name),
            words: Words::of(&name, &sha),
            name,
            sha,
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
    pub(super) fn call_words(&self, mode: Mode, cmd: &mut Packer) {
        let words = match mode {
            Mode::Functions => &self.words.fcall,
            Mode::Eval => &self.words.evalsha,
        };
        cmd.packed(words, 2);
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
        // The compact state's pattern (one capture per number, one for
        // where they end and one for a tail's first number; `false` past
        // Lua's limit, read by the general path) and formats: the numbers;
        // the numbers with the record a first send's admission keeps in
        // the state; the numbers with a tail kept; the record with nothing
        // resent before it; and both records again with no retry and the
        // first band (`lua/state.lua`, `settle`).
        let n = 1 + bands.len() * per_band;
        let pattern = if n + 2 <= MAX_CAPTURES {
            format!("'^(%d+){}()|?(%d*)'", ":(%d+)".repeat(n - 1))
        } else {
            "false".to_owned()
        };
        let numbers = format!("%d{}", ":%d".repeat(n - 1));
        let _ = writeln!(
            out,
            "local P_STATE_PATTERN, P_STATE_FORMAT = {pattern}, '{numbers}'"
        );
        let _ = writeln!(
            out,
            "local P_STATE_FORMATS = {{P_STATE_FORMAT, '{numbers}{HELD_RECORD_FORMAT}', '{numbers}%s', \
             '{numbers}{HELD_FIRST_RECORD_FORMAT}', '{numbers}{HELD_FIRST_PLAIN_RECORD_FORMAT}', \
             '{numbers}{HELD_PLAIN_RECORD_FORMAT}'}}"
        );
        // A subject without a state starts from this one: room for every
        // number a first send's admission writes (the state's and its
        // record's, `lua/state.lua`, `settle`), made in one allocation.
        // Grown an element at a time, the table was reallocated five
        // times, about 3.5% of a cold decision's instructions in Redis.
        let _ = writeln!(
            out,
            "local function P_STATE_BLANK() return {{{}}} end",
            vec!["false"; n + HELD_RECORD_NUMBERS].join(", ")
        );
    } else {
        // The sliding log keeps a sorted set: `lua/refund.lua` asks.
        let _ = writeln!(out, "local P_STATE_PATTERN, P_STATE_FORMAT = false, false");
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
    by_bands: Memo<u64, Arc<Made>, ByDigest>,
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

mod command;
pub use command::{
    as_evalsha, call, call_several, decision, push_state_and_record, refund_call, resent,
    state_key, StateKey,
};
pub(super) use command::{attempt, hex_id, record_life};

/// Whole milliseconds, rounded up and at least one: a TTL or window cut
/// short would forget state that still matters.
fn ceil_ms(d: Duration) -> u64 {
    micros(d).div_ceil(1000).max(1)
}

#[cfg(test)]
pub(super) mod call_tests;
#[cfg(test)]
mod tests;
