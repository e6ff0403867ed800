//! The Lua scripts (one per algorithm, `lua/`) and the one command that
//! runs them: `EVALSHA` with the keys and arguments `lua/README.md` states.

use std::io::Write;
use std::time::Duration;

use redis::{Cmd, RedisWrite};

use crate::limit::{micros, Algorithm, Bands, Policy};
use crate::subject::Pseudonym;

use crate::store::Evaluation;

/// One embedded script and its SHA-1, computed here so sluice never needs
/// `EVAL` (which a least-privilege Redis user may not run).
pub struct Script {
    pub algorithm: Algorithm,
    /// The algorithm's file with `lua/common.lua` spliced in.
    pub source: String,
    pub sha: String,
}

/// Where an algorithm's script takes the shared part (`lua/common.lua`).
const COMMON_AT: &str = "-- @common (lua/common.lua is spliced in here)\n";
const COMMON: &str = include_str!("../../../lua/common.lua");

impl Script {
    fn new(algorithm: Algorithm, file: &'static str) -> Script {
        // Every embedded file has the marker once (a unit test checks); a
        // file without it would be sent as is and fail its own tests.
        let source = file.replacen(COMMON_AT, COMMON, 1);
        Script {
            algorithm,
            sha: redis::Script::new(&source).get_hash().to_owned(),
            source,
        }
    }

    pub fn load_command(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(&self.source);
        cmd
    }
}

pub struct Scripts([Script; 5]);

pub const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingCounter,
    Algorithm::SlidingLog,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
];

impl Scripts {
    pub fn new() -> Scripts {
        Scripts(ALGORITHMS.map(|a| Script::new(a, source(a))))
    }

    pub fn get(&self, algorithm: Algorithm) -> &Script {
        // ALGORITHMS lists every variant once, in this order.
        &self.0[index(algorithm)]
    }

    pub fn all(&self) -> &[Script] {
        &self.0
    }
}

fn index(algorithm: Algorithm) -> usize {
    match algorithm {
        Algorithm::FixedWindow => 0,
        Algorithm::SlidingCounter => 1,
        Algorithm::SlidingLog => 2,
        Algorithm::TokenBucket => 3,
        Algorithm::Gcra => 4,
    }
}

pub fn source(algorithm: Algorithm) -> &'static str {
    match algorithm {
        Algorithm::FixedWindow => include_str!("../../../lua/fixed_window.lua"),
        Algorithm::SlidingCounter => include_str!("../../../lua/sliding_counter.lua"),
        Algorithm::SlidingLog => include_str!("../../../lua/sliding_log.lua"),
        Algorithm::TokenBucket => include_str!("../../../lua/token_bucket.lua"),
        Algorithm::Gcra => include_str!("../../../lua/gcra.lua"),
    }
}

/// The per-store arguments every script takes besides the policy's bands.
#[derive(Debug, Clone)]
pub struct Common {
    pub key_prefix: String,
    pub ttl_grace: Duration,
    pub max_clock_regression: Duration,
    pub dedupe_window: Duration,
    pub dedupe_max: u32,
}

/// The state key of one (policy, revision, subject): a hash, or the
/// sliding log's sorted set. The braces are a Redis Cluster hash tag
/// around the per-subject part, so the state and every evaluation's
/// record (`<state>:e:<id>`, see `lua/common.lua`) share one slot.
fn write_state_key(
    out: &mut impl Write,
    prefix: &str,
    policy: &Policy,
    subject: &Pseudonym,
) -> std::io::Result<()> {
    write!(
        out,
        "{prefix}:{{{}:{}:{subject}}}",
        policy.name, policy.revision
    )
}

/// Bytes reserved up front for one command: the fixed words, the SHA-1, the
/// id and the integers fit; the keys are added on top. Growing the buffer
/// as arguments arrive cost more than formatting them.
const CMD_BYTES: usize = 192;

/// `EVALSHA sha 2 state record id cost ttl_ms max_regression_us
/// dedupe_window_ms dedupe_max bands <per band...>`, the record being
/// `<state>:e:<id>`.
pub fn evalsha(script: &Script, common: &Common, evaluation: &Evaluation<'_>) -> Cmd {
    let policy = evaluation.policy;
    let bands = &policy.bands;
    let per_band = match bands {
        Bands::FixedWindow(_) | Bands::SlidingCounter(_) | Bands::SlidingLog(_) => 2,
        Bands::TokenBucket(_) | Bands::Gcra(_) => 3,
    };
    // The key's length without the subject, which displays in under 64.
    let key_bytes = common.key_prefix.len() + policy.name.len() + policy.revision.len() + 64;
    let mut cmd = Cmd::with_capacity(
        12 + per_band * bands.len(),
        CMD_BYTES + 2 * key_bytes + 24 * per_band * bands.len(),
    );
    cmd.arg("EVALSHA").arg(script.sha.as_str()).arg(2u8);
    let id = hex_id(evaluation.id.0);
    // Writing into the command's own buffer cannot fail.
    let _ = write_state_key(
        &mut cmd.writer_for_next_arg(),
        &common.key_prefix,
        policy,
        evaluation.subject,
    );
    {
        let mut arg = cmd.writer_for_next_arg();
        let _ = write_state_key(&mut arg, &common.key_prefix, policy, evaluation.subject);
        let _ = arg.write_all(b":e:");
        let _ = arg.write_all(&id);
    }
    cmd.arg(&id[..])
        .arg(evaluation.cost)
        .arg(ceil_ms(bands.horizon() + common.ttl_grace))
        .arg(micros(common.max_clock_regression))
        .arg(ceil_ms(common.dedupe_window))
        .arg(common.dedupe_max)
        .arg(bands.len());
    match bands {
        Bands::FixedWindow(b) | Bands::SlidingCounter(b) | Bands::SlidingLog(b) => {
            for band in b {
                cmd.arg(band.limit.get()).arg(micros(band.window));
            }
        }
        Bands::TokenBucket(b) => {
            for band in b {
                cmd.arg(band.capacity.get())
                    .arg(band.refill_tokens.get())
                    .arg(micros(band.refill_every));
            }
        }
        Bands::Gcra(b) => {
            for band in b {
                cmd.arg(band.limit.get())
                    .arg(micros(band.window))
                    .arg(band.burst.get());
            }
        }
    }
    cmd
}

/// The evaluation id as 32 lowercase hex digits, zero-padded: what
/// `EvaluationId`'s `Display` gives, without the formatting machinery.
fn hex_id(id: u128) -> [u8; 32] {
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
mod tests {
    use super::*;
    use crate::store::EvaluationId;

    #[test]
    fn every_script_starts_with_a_shebang_and_carries_the_common_part() {
        for algorithm in ALGORITHMS {
            let file = source(algorithm);
            assert_eq!(file.matches(COMMON_AT).count(), 1, "{}", algorithm.name());
        }
        for script in Scripts::new().all() {
            let name = script.algorithm.name();
            assert!(script.source.starts_with("#!lua\n"), "{name}");
            assert!(script.source.contains(COMMON), "{name}");
            assert!(!script.source.contains(COMMON_AT), "{name}");
            assert!(!script.source.contains("EVAL"), "scripts never nest EVAL");
        }
    }

    #[test]
    fn scripts_are_distinct_and_indexed_by_algorithm() {
        let scripts = Scripts::new();
        for a in ALGORITHMS {
            assert_eq!(scripts.get(a).algorithm, a);
            assert_eq!(scripts.get(a).sha.len(), 40);
        }
        let mut shas: Vec<_> = scripts.all().iter().map(|s| &s.sha).collect();
        shas.dedup();
        assert_eq!(shas.len(), 5);
    }

    fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                _ => "<cursor>".to_owned(),
            })
            .collect()
    }

    #[test]
    fn every_script_takes_its_state_and_the_evaluation_record_in_one_slot() {
        use std::num::NonZeroU32;

        use crate::limit::WindowBand;
        use crate::subject::PseudonymKey;

        let band = WindowBand {
            limit: NonZeroU32::new(5).expect("non-zero"),
            window: Duration::from_secs(1),
        };
        let subject = PseudonymKey::new(b"k", 1).pseudonym("client_ip", b"192.0.2.1", "api");
        let common = Common {
            key_prefix: "sl".to_owned(),
            ttl_grace: Duration::from_secs(1),
            max_clock_regression: Duration::from_millis(250),
            dedupe_window: Duration::from_secs(5),
            dedupe_max: 256,
        };
        let scripts = Scripts::new();
        for bands in [
            Bands::FixedWindow(vec![band]),
            Bands::SlidingLog(vec![band]),
        ] {
            let policy = Policy {
                name: "p".into(),
                revision: "r".into(),
                bands,
                shadow: false,
            };
            let evaluation = Evaluation {
                policy: &policy,
                subject: &subject,
                cost: 2,
                deadline: tokio::time::Instant::now(),
                id: EvaluationId(0xab),
            };
            let script = scripts.get(policy.algorithm());
            let sent = args(&evalsha(script, &common, &evaluation));
            let state = format!("sl:{{p:r:{subject}}}");
            let mut expected = vec!["EVALSHA".to_owned(), script.sha.clone(), "2".to_owned()];
            expected.push(state.clone());
            expected.push(format!("{state}:e:{:032x}", 0xab));
            expected.extend(
                [
                    &format!("{:032x}", 0xab),
                    "2",
                    "2000",
                    "250000",
                    "5000",
                    "256",
                    "1",
                    "5",
                    "1000000",
                ]
                .map(str::to_owned),
            );
            assert_eq!(sent, expected);
        }
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

    #[test]
    fn ceil_ms_never_shortens() {
        assert_eq!(ceil_ms(Duration::from_micros(1)), 1);
        assert_eq!(ceil_ms(Duration::from_micros(1001)), 2);
        assert_eq!(ceil_ms(Duration::from_millis(5)), 5);
        assert_eq!(ceil_ms(Duration::ZERO), 1);
    }
}
