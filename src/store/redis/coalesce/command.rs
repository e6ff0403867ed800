//! A queued evaluation's command, alone or in a batch, and the batch's
//! reply (`lua/batch.lua`; the contract in `lua/README.md`, "Several
//! evaluations in one call").

use redis::Value;
use smallvec::SmallVec;

use crate::store::Evaluation;

use super::super::mode::Mode;
use super::super::packed::{Packed, Packer};
use super::super::reply::{self, Answer, Malformed, Reply, Shape};
use super::super::scripts::{self, Common, Script, StateKey};
use super::super::wire::{frame_len, parse_int, Held};

/// What one evaluation puts in a command, rendered when it is queued: the
/// request's own borrowed evaluation does not outlive its wait.
pub struct Part {
    state: StateKey,
    id: [u8; 32],
    cost: u32,
    /// A reservation's record life, ms.
    life: Option<u64>,
}

impl Part {
    pub fn of(common: &Common, evaluation: &Evaluation<'_>) -> Part {
        Part {
            state: scripts::state_key(common, evaluation),
            id: scripts::hex_id(evaluation.id.0),
            cost: evaluation.cost,
            life: evaluation.settle_within.map(scripts::record_life),
        }
    }

    /// The state key: where the call runs (its slot on a cluster).
    pub fn key(&self) -> &[u8] {
        &self.state
    }

    /// Its two keys: the state, then the record `<state>:e:<id>`.
    fn push_keys(&self, cmd: &mut Packer) {
        scripts::push_state_and_record(cmd, &self.state, &self.id);
    }
}

/// The evaluation's own call, what [`scripts::call`] makes of it:
/// `FCALL name 2 state record first id [cost [life]]`.
pub fn single(script: &Script, mode: Mode, part: &Part, first: bool) -> Packed {
    scripts::decision(
        script,
        mode,
        &part.state,
        &part.id,
        first,
        part.cost,
        part.life,
    )
}

/// `FCALL <name>_batch 2n state_1 record_1 … state_n record_n first id_1
/// cost_1 life_1 … id_n cost_n life_n`, a life being `''` for none, `first`
/// every member's (a batch is sent, and re-sent, whole). `None` for a
/// script without a batch function.
pub fn batch(script: &Script, parts: &[&Part], first: bool) -> Option<Packed> {
    let name = script.batch.as_deref()?;
    let mut cmd = Packer::with_capacity(64 + 384 * parts.len());
    cmd.arg(b"FCALL")
        .arg(name.as_bytes())
        .int(2 * parts.len() as u64);
    for part in parts {
        part.push_keys(&mut cmd);
    }
    cmd.arg(scripts::attempt(first));
    for part in parts {
        cmd.arg(&part.id).int(u64::from(part.cost));
        match part.life {
            Some(life) => cmd.int(life),
            None => cmd.arg(b""),
        };
    }
    Some(cmd.finish())
}

/// One evaluation's part of a batch's reply: its decision, or the error
/// its evaluation raised (the script failing, as a call of its own would
/// have: `ERR sluice: …`).
pub type Each = Result<Reply, String>;

/// The batch's reply: one element per evaluation, in order, each a
/// policy's own reply or an error reply.
pub fn decode_batch(answer: &Answer, shapes: &[Shape]) -> Result<SmallVec<[Each; 8]>, Malformed> {
    let out: SmallVec<[Each; 8]> = match answer {
        Answer::Frame(frame) => {
            // A batch's reply is an array of arrays: never integers alone.
            let Held::Bytes(bytes) = frame.held() else {
                return Err(Malformed("not an array of replies"));
            };
            let elements = frame_elements(bytes)?;
            if elements.len() != shapes.len() {
                return Err(Malformed("wrong number of replies in a batch"));
            }
            elements
                .iter()
                .zip(shapes)
                .map(|(element, shape)| match element.split_first() {
                    Some((b'-', message)) => Ok(Err(text(message))),
                    _ => reply::decode_frame(element, shape.bands, shape.approximate).map(Ok),
                })
                .collect::<Result<_, _>>()?
        }
        Answer::Value(Value::Array(items)) => {
            if items.len() != shapes.len() {
                return Err(Malformed("wrong number of replies in a batch"));
            }
            items
                .iter()
                .zip(shapes)
                .map(|(item, shape)| match item {
                    Value::ServerError(e) => Ok(Err(format!("{e:?}"))),
                    value => reply::decode(value, shape.bands, shape.approximate).map(Ok),
                })
                .collect::<Result<_, _>>()?
        }
        Answer::Value(_) => return Err(Malformed("not an array")),
    };
    Ok(out)
}

/// An error reply's text, without its `\r\n`.
fn text(message: &[u8]) -> String {
    let end = message.len().saturating_sub(2);
    String::from_utf8_lossy(&message[..end]).into_owned()
}

/// The elements of a RESP2 array, each a whole reply of its own.
fn frame_elements(frame: &[u8]) -> Result<SmallVec<[&[u8]; 8]>, Malformed> {
    let broken = Malformed("not a whole reply");
    let Some((b'*', rest)) = frame.split_first() else {
        return Err(Malformed("not an array"));
    };
    let cr = rest
        .iter()
        .position(|&b| b == b'\r')
        .ok_or(broken.clone())?;
    let count = parse_int(&rest[..cr])
        .and_then(|n| usize::try_from(n).ok())
        .ok_or(Malformed("not an array"))?;
    let mut rest = rest.get(cr + 2..).ok_or(broken.clone())?;
    let mut out = SmallVec::new();
    for _ in 0..count {
        let len = match frame_len(rest) {
            Ok(Some(len)) => len,
            _ => return Err(broken),
        };
        out.push(&rest[..len]);
        rest = &rest[len..];
    }
    if !rest.is_empty() {
        return Err(broken);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::redis::scripts::call_tests::args;
    use crate::store::redis::wire::Frame;

    fn shape() -> Shape {
        Shape {
            bands: 1,
            approximate: false,
            shadow: false,
        }
    }

    #[test]
    fn a_batch_reply_is_read_per_evaluation_errors_included() {
        // An admission answered with its record's text, an error, a
        // replayed decision, and an admission answered as a table.
        let frame: &[u8] = b"*4\r\n$21\r\n1:8:1000:0:0:17336222\r\n\
-ERR sluice: corrupt state\r\n*8\r\n:1\r\n:0\r\n:0\r\n:1000\r\n:1000\r\n:0\r\n:1\r\n:0\r\n\
*8\r\n:1\r\n:1\r\n:9\r\n:1000\r\n:0\r\n:0\r\n:0\r\n:0\r\n";
        let answer = Answer::Frame(Frame::from_slice(frame));
        let each = decode_batch(&answer, &[shape(); 4]).expect("well formed");
        assert_eq!(each.len(), 4);
        let remaining = |each: &Each| match each {
            Ok(Reply::Decided {
                decision,
                replayed: false,
                ..
            }) if decision.allowed => Some(decision.remaining),
            _ => None,
        };
        assert_eq!(remaining(&each[0]), Some(8));
        assert_eq!(each[1], Err("ERR sluice: corrupt state".to_owned()));
        assert!(matches!(each[2], Ok(Reply::Decided { replayed: true, .. })));
        assert_eq!(remaining(&each[3]), Some(9));
        // One reply too few, or trailing bytes: the whole batch is malformed.
        assert!(decode_batch(&answer, &[shape(); 3]).is_err());
        let mut longer = frame.to_vec();
        longer.extend_from_slice(b":1\r\n");
        assert!(decode_batch(&Answer::Frame(Frame::from_slice(&longer)), &[shape(); 4]).is_err());
    }

    /// One attempt for the whole batch, after the keys; a re-send says 0
    /// there and changes nothing else. A member alone is its own call.
    #[test]
    fn a_batch_says_once_whether_it_is_a_first_attempt() {
        use crate::limit::{Bands, Policy, WindowBand};
        use crate::store::EvaluationId;
        use crate::subject::PseudonymKey;
        use std::num::NonZeroU32;
        use std::time::Duration;

        let common = Common {
            key_prefix: "sl".to_owned(),
            ttl_grace: Duration::from_secs(1),
            max_clock_regression: Duration::from_secs(1),
            dedupe_window: Duration::from_secs(1),
        };
        let band = WindowBand {
            limit: NonZeroU32::new(5).expect("non-zero"),
            window: Duration::from_secs(1),
        };
        let policy = Policy::new("p", "r", Bands::FixedWindow(vec![band]), false);
        let script = Script::for_policy(&policy, &common);
        let subjects: Vec<_> = ["a", "b"]
            .iter()
            .map(|s| PseudonymKey::new(b"k", 1).pseudonym("ip", s.as_bytes(), "api"))
            .collect();
        let parts: Vec<Part> = subjects
            .iter()
            .enumerate()
            .map(|(i, subject)| {
                Part::of(
                    &common,
                    &Evaluation {
                        policy: &policy,
                        subject,
                        cost: 1,
                        deadline: tokio::time::Instant::now(),
                        id: EvaluationId(i as u128 + 1),
                        settle_within: (i == 1).then_some(Duration::from_millis(2500)),
                    },
                )
            })
            .collect();
        let refs: Vec<&Part> = parts.iter().collect();
        let cmd = batch(&script, &refs, true).expect("a batch function");
        let first = args(&cmd);
        assert_eq!(first.len(), 3 + 4 + 1 + 6, "{first:?}");
        assert_eq!(first[7], "1");
        assert_eq!(
            first[8..],
            [
                format!("{:032x}", 1),
                "1".to_owned(),
                String::new(),
                format!("{:032x}", 2),
                "1".to_owned(),
                "2500".to_owned(),
            ]
        );
        let again = args(&scripts::resent(&cmd));
        let differ: Vec<usize> = (0..first.len()).filter(|&i| first[i] != again[i]).collect();
        assert_eq!((differ, again[7].as_str()), (vec![7], "0"));
        assert_eq!(args(&batch(&script, &refs, false).expect("batch"))[7], "2");
        // Sent alone: a cost of 1 with no record life is left out.
        let alone = args(&single(&script, Mode::Functions, &parts[0], true));
        assert_eq!(alone[5..], ["1".to_owned(), format!("{:032x}", 1)]);
    }

    #[test]
    fn a_batch_reply_from_redis_rs_is_read_alike() {
        let ints = |v: [i64; 8]| Value::Array(v.iter().map(|n| Value::Int(*n)).collect());
        let value = Value::Array(vec![
            ints([1, 1, 9, 1000, 0, 0, 0, 0]),
            ints([1, 0, 0, 1000, 1000, 0, 0, 0]),
            Value::BulkString(b"1:7:1000:0:0:17336222".to_vec()),
        ]);
        let each = decode_batch(&Answer::Value(value), &[shape(); 3]).expect("read");
        assert!(matches!(each[1], Ok(Reply::Decided { decision, .. }) if !decision.allowed));
        assert!(matches!(each[2], Ok(Reply::Decided { decision, .. }) if decision.remaining == 7));
        assert!(decode_batch(&Answer::Value(Value::Nil), &[shape()]).is_err());
    }
}
