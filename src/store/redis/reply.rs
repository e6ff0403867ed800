//! Decoding a script's reply (the contract in `lua/README.md`):
//!
//! `{version, outcome, remaining, reset_after_us, retry_after_us, band,
//! replayed, skew_us}`, all integers; outcome 0 denied, 1 allowed,
//! 2 clock unsafe. Or, for a decision that wrote its record and saw no
//! clock skew (most admissions), the text it wrote: the record,
//! `outcome:remaining:reset_after_us:retry_after_us:band:at_us`, alone or
//! last in a compact state, after the state's last `|`; replayed and skew
//! are then 0. The script of several limits answers one group of integers
//! per limit it evaluated, one after the other. Anything else is refused
//! as malformed, never guessed at.

use std::time::Duration;

use redis::Value;
use smallvec::SmallVec;

use super::wire::{frame_len, parse_int, short_int, Frame, Held};
use crate::limit::{Decision, Micros};

pub const VERSION: i64 = 1;
const FIELDS: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Decided {
        decision: Decision,
        /// The id had already been applied: this is the recorded decision.
        replayed: bool,
        /// How far the key's last write was ahead of Redis `TIME` (a clock
        /// step back absorbed as no time passing); 0 normally.
        skew: Micros,
    },
    /// The key's last write is ahead of Redis `TIME` by more than allowed.
    ClockUnsafe { skew: Micros },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed(pub &'static str);

/// How to read one limit's part of a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub bands: usize,
    pub approximate: bool,
    /// A shadow limit's denial does not stop the others.
    pub shadow: bool,
}

impl Reply {
    /// Whether it stops the limits after it (see `Outcome::blocks`).
    fn blocks(&self, shadow: bool) -> bool {
        match self {
            Reply::Decided { decision, .. } => !decision.allowed && !shadow,
            Reply::ClockUnsafe { .. } => true,
        }
    }
}

/// A script's reply as the connection gave it: the bytes on the wire
/// (sluice's own connection, read here in place) or redis-rs's `Value`
/// (the cluster client's, and redis-rs's node connection).
pub enum Answer {
    Frame(Frame),
    Value(Value),
}

/// A reply's elements: an integer, or `None` for anything else.
type Fields = SmallVec<[Option<i64>; FIELDS]>;

pub fn decode(value: &Value, bands: usize, approximate: bool) -> Result<Reply, Malformed> {
    if let Value::BulkString(text) = value {
        return decode_text(text, bands, approximate);
    }
    decode_fields(&value_fields(value)?, bands, approximate)
}

/// [`decode`], from the reply's bytes.
pub fn decode_frame(frame: &[u8], bands: usize, approximate: bool) -> Result<Reply, Malformed> {
    if let Some(text) = bulk(frame)? {
        return decode_text(text, bands, approximate);
    }
    decode_fields(&frame_fields(frame)?, bands, approximate)
}

/// The replies of `limits` (one, or several in one call) in `answer`.
pub fn decode_answer(answer: &Answer, limits: &[Shape]) -> Result<SmallVec<[Reply; 2]>, Malformed> {
    // A record's text answers one limit alone.
    let text = match answer {
        Answer::Frame(frame) => match frame.held() {
            Held::Bytes(bytes) => bulk(bytes)?,
            Held::Ints(_) => None,
        },
        Answer::Value(Value::BulkString(text)) => Some(&text[..]),
        Answer::Value(_) => None,
    };
    if let Some(text) = text {
        let [one] = limits else {
            return Err(Malformed("not an array"));
        };
        return Ok(smallvec::smallvec![decode_text(
            text,
            one.bands,
            one.approximate
        )?]);
    }
    let fields = match answer {
        // Read as the connection framed it: not read again.
        Answer::Frame(frame) => match frame.held() {
            Held::Ints(ints) => ints.iter().copied().map(Some).collect(),
            Held::Bytes(bytes) => frame_fields(bytes)?,
        },
        Answer::Value(value) => value_fields(value)?,
    };
    match limits {
        [one] => Ok(smallvec::smallvec![decode_fields(
            &fields,
            one.bands,
            one.approximate
        )?]),
        several => decode_groups(&fields, several),
    }
}

fn value_fields(value: &Value) -> Result<Fields, Malformed> {
    let Value::Array(items) = value else {
        return Err(Malformed("not an array"));
    };
    Ok(items
        .iter()
        .map(|item| match item {
            Value::Int(n) => Some(*n),
            _ => None,
        })
        .collect())
}

/// The elements of a RESP2 array of integers, read in place; an element
/// of another type is `None`, skipped by its framing.
fn frame_fields(frame: &[u8]) -> Result<Fields, Malformed> {
    let broken = Malformed("not a whole reply");
    let Some((b'*', rest)) = frame.split_first() else {
        return Err(Malformed("not an array"));
    };
    let (count, mut rest) = line(rest).ok_or(broken.clone())?;
    let count = parse_int(count)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or(Malformed("not an array"))?;
    let mut fields = Fields::new();
    for _ in 0..count {
        if let Some((b':', after)) = rest.split_first() {
            if let Some((n, used)) = short_int(after) {
                fields.push(Some(n));
                rest = &after[used..];
                continue;
            }
            let (digits, after) = line(after).ok_or(broken.clone())?;
            fields.push(Some(parse_int(digits).ok_or(broken.clone())?));
            rest = after;
            continue;
        }
        let len = match frame_len(rest) {
            Ok(Some(len)) => len,
            _ => return Err(broken),
        };
        fields.push(None);
        rest = &rest[len..];
    }
    if !rest.is_empty() {
        return Err(broken);
    }
    Ok(fields)
}

/// The text of a RESP2 bulk string `frame` (framed whole: its length
/// checked), or `None` when `frame` is anything else (the null string
/// included: refused as redis-rs's `Nil` is, as not an array).
fn bulk(frame: &[u8]) -> Result<Option<&[u8]>, Malformed> {
    let Some((b'$', rest)) = frame.split_first() else {
        return Ok(None);
    };
    let broken = Malformed("not a whole reply");
    let (len, rest) = line(rest).ok_or(broken.clone())?;
    let Some(len) = parse_int(len).and_then(|n| usize::try_from(n).ok()) else {
        return Ok(None);
    };
    match (rest.get(..len), rest.get(len..)) {
        (Some(text), Some(b"\r\n")) => Ok(Some(text)),
        _ => Err(broken),
    }
}

/// A decision answered as the text of its record (the module's opening):
/// six whole numbers joined by `:`, after the last `|` if there is one.
/// Read in one pass, a digit at a time.
fn decode_text(text: &[u8], bands: usize, approximate: bool) -> Result<Reply, Malformed> {
    let record = match memchr::memrchr(b'|', text) {
        Some(bar) => &text[bar + 1..],
        None => text,
    };
    let not_six = Malformed("a record is not six whole numbers");
    let mut fields = [0u64; 6];
    let (mut field, mut digits, mut n) = (0, 0, 0u64);
    for &b in record {
        if b == b':' {
            if digits == 0 || field == 5 {
                return Err(not_six);
            }
            fields[field] = n;
            (field, digits, n) = (field + 1, 0, 0);
            continue;
        }
        if !b.is_ascii_digit() {
            return Err(not_six);
        }
        n = n
            .checked_mul(10)
            .and_then(|n| n.checked_add(u64::from(b - b'0')))
            .ok_or(not_six.clone())?;
        digits += 1;
    }
    if digits == 0 || field != 5 {
        return Err(not_six);
    }
    fields[5] = n;
    let [outcome, remaining, reset_after, retry_after, band, _at] = fields;
    if outcome > 1 {
        // A clock found unsafe writes nothing, so records nothing.
        return Err(Malformed("unknown outcome"));
    }
    decided(
        [outcome, remaining, reset_after, retry_after, band, 0, 0],
        bands,
        approximate,
    )
}

/// The line at the start of `input`, and what follows its `\r\n`.
fn line(input: &[u8]) -> Option<(&[u8], &[u8])> {
    let cr = input.iter().position(|&b| b == b'\r')?;
    match input.get(cr + 1) {
        Some(b'\n') => Some((&input[..cr], &input[cr + 2..])),
        _ => None,
    }
}

/// The reply of the script of several limits (`lua/several.lua`): one
/// group of fields per limit, in order, up to and including the first
/// that blocks, and no further.
#[cfg(test)]
pub fn decode_several(value: &Value, limits: &[Shape]) -> Result<SmallVec<[Reply; 2]>, Malformed> {
    decode_groups(&value_fields(value)?, limits)
}

fn decode_groups(
    items: &[Option<i64>],
    limits: &[Shape],
) -> Result<SmallVec<[Reply; 2]>, Malformed> {
    if items.is_empty() || items.len() % FIELDS != 0 || items.len() / FIELDS > limits.len() {
        return Err(Malformed("wrong number of fields"));
    }
    let mut out = SmallVec::new();
    let groups = items.len() / FIELDS;
    for (i, (group, shape)) in items.chunks(FIELDS).zip(limits).enumerate() {
        let reply = decode_fields(group, shape.bands, shape.approximate)?;
        let (blocks, last) = (reply.blocks(shape.shadow), i + 1 == groups);
        // Only the last group may block, and a reply that stops before
        // the last limit must have stopped on one that did.
        let consistent = if last {
            blocks || groups == limits.len()
        } else {
            !blocks
        };
        if !consistent {
            return Err(Malformed(
                "a limit blocked, yet the reply goes on or stops early",
            ));
        }
        out.push(reply);
    }
    Ok(out)
}

fn decode_fields(
    items: &[Option<i64>],
    bands: usize,
    approximate: bool,
) -> Result<Reply, Malformed> {
    if items.len() != FIELDS {
        return Err(Malformed("wrong number of fields"));
    }
    let mut fields = [0u64; FIELDS];
    for (slot, item) in fields.iter_mut().zip(items) {
        *slot = match item {
            Some(n) => u64::try_from(*n).map_err(|_| Malformed("negative field"))?,
            None => return Err(Malformed("field is not an integer")),
        };
    }
    let [version, outcome, remaining, reset_after, retry_after, band, replayed, skew] = fields;
    if version != VERSION as u64 {
        return Err(Malformed("unknown reply version"));
    }
    decided(
        [
            outcome,
            remaining,
            reset_after,
            retry_after,
            band,
            replayed,
            skew,
        ],
        bands,
        approximate,
    )
}

/// A reply's fields after its version, read and checked.
fn decided(fields: [u64; FIELDS - 1], bands: usize, approximate: bool) -> Result<Reply, Malformed> {
    let [outcome, remaining, reset_after, retry_after, band, replayed, skew] = fields;
    let replayed = match replayed {
        0 => false,
        1 => true,
        _ => return Err(Malformed("replayed is not 0 or 1")),
    };
    let allowed = match outcome {
        0 => false,
        1 => true,
        2 => return Ok(Reply::ClockUnsafe { skew }),
        _ => return Err(Malformed("unknown outcome")),
    };
    let band = usize::try_from(band)
        .ok()
        .filter(|b| *b < bands)
        .ok_or(Malformed("band out of range"))?;
    // An admission's retry_after is its delay (gcra with `delay`).
    if !allowed && retry_after == 0 {
        return Err(Malformed("denied without a retry_after"));
    }
    Ok(Reply::Decided {
        decision: Decision {
            allowed,
            band,
            remaining,
            reset_after: Duration::from_micros(reset_after),
            retry_after: Duration::from_micros(retry_after),
            approximate,
        },
        replayed,
        skew,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(fields: &[i64]) -> Value {
        Value::Array(fields.iter().map(|n| Value::Int(*n)).collect())
    }

    #[test]
    fn decodes_allowed_denied_and_clock_unsafe() {
        let allowed = decode(&reply(&[1, 1, 4, 900, 0, 1, 0, 0]), 2, false).unwrap();
        assert_eq!(
            allowed,
            Reply::Decided {
                decision: Decision {
                    allowed: true,
                    band: 1,
                    remaining: 4,
                    reset_after: Duration::from_micros(900),
                    retry_after: Duration::ZERO,
                    approximate: false,
                },
                replayed: false,
                skew: 0,
            }
        );
        let Reply::Decided {
            decision, replayed, ..
        } = decode(&reply(&[1, 0, 0, 900, 700, 0, 1, 3]), 1, true).unwrap()
        else {
            panic!("not decided");
        };
        assert!(!decision.allowed && decision.approximate && replayed);
        assert_eq!(decision.retry_after, Duration::from_micros(700));
        // An admission told to wait for its turn (gcra with a delay).
        let Reply::Decided { decision, .. } =
            decode(&reply(&[1, 1, 0, 1_300_000, 300_000, 0, 0, 0]), 1, false).unwrap()
        else {
            panic!("not decided");
        };
        assert!(decision.allowed);
        assert_eq!(decision.retry_after, Duration::from_millis(300));
        assert_eq!(
            decode(&reply(&[1, 2, 0, 0, 0, 0, 0, 5_000_000]), 1, false).unwrap(),
            Reply::ClockUnsafe { skew: 5_000_000 }
        );
    }

    #[test]
    fn refuses_every_other_shape() {
        let bad: &[(&str, Value)] = &[
            ("version", reply(&[2, 1, 4, 900, 0, 0, 0, 0])),
            ("short", reply(&[1, 1, 4, 900, 0, 0, 0])),
            ("long", reply(&[1, 1, 4, 900, 0, 0, 0, 0, 0])),
            ("outcome", reply(&[1, 3, 4, 900, 0, 0, 0, 0])),
            ("negative", reply(&[1, 1, -4, 900, 0, 0, 0, 0])),
            ("band", reply(&[1, 1, 4, 900, 0, 2, 0, 0])),
            ("replayed", reply(&[1, 1, 4, 900, 0, 0, 2, 0])),
            ("denied-retry", reply(&[1, 0, 0, 900, 0, 0, 0, 0])),
            ("scalar", Value::Int(1)),
            (
                "string field",
                Value::Array(vec![
                    Value::Int(1),
                    Value::BulkString(b"1".to_vec()),
                    Value::Int(0),
                    Value::Int(0),
                    Value::Int(0),
                    Value::Int(0),
                    Value::Int(0),
                    Value::Int(0),
                ]),
            ),
        ];
        for (what, value) in bad {
            assert!(decode(value, 2, false).is_err(), "{what} accepted");
        }
    }

    fn text(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    /// `value` as its bytes come on the wire, a bulk string.
    fn bulk_frame(text: &str) -> Vec<u8> {
        format!("${}\r\n{text}\r\n", text.len()).into_bytes()
    }

    #[test]
    fn decodes_a_record_alone_or_last_in_a_state() {
        // What the same decision answers as eight integers.
        let admitted = decode(&reply(&[1, 1, 4, 900, 0, 1, 0, 0]), 2, false).unwrap();
        for written in [
            "1:4:900:0:1:1733622222123456",
            "1733622222123456:1733622180000000:3|1733622222323456|0|abcdef01|1:4:900:0:1:1733622222123456",
        ] {
            assert_eq!(decode(&text(written), 2, false), Ok(admitted), "{written}");
            assert_eq!(
                decode_frame(&bulk_frame(written), 2, false),
                Ok(admitted),
                "{written}"
            );
            let answer = Answer::Value(text(written));
            let one = Shape {
                bands: 2,
                approximate: false,
                shadow: false,
            };
            assert_eq!(decode_answer(&answer, &[one]).unwrap()[..], [admitted]);
            assert!(
                decode_answer(&answer, &[one, one]).is_err(),
                "a text answers one limit only"
            );
        }
        // A re-send's denial is recorded too.
        let Ok(Reply::Decided { decision, .. }) = decode(&text("0:0:900:700:0:17"), 1, true) else {
            panic!("not decided");
        };
        assert!(!decision.allowed && decision.approximate);
        assert_eq!(decision.retry_after, Duration::from_micros(700));
    }

    #[test]
    fn refuses_every_other_text() {
        for written in [
            "",
            "1:4:900:0:1",
            "1:4:900:0:1:17:0",
            "2:0:0:0:0:17",
            "1:-4:900:0:0:17",
            "1:+4:900:0:0:17",
            "1:4:9x0:0:0:17",
            "1::900:0:0:17",
            "1:4:900:0:2:17",
            "0:0:900:0:0:17",
            "1:4:900:0:0:99999999999999999999",
            "1:4:900:0:0:17|",
            "3:1:0|0|0",
        ] {
            assert!(
                decode(&text(written), 2, false).is_err(),
                "{written:?} accepted"
            );
            assert!(
                decode_frame(&bulk_frame(written), 2, false).is_err(),
                "{written:?} accepted from its frame"
            );
        }
        // A frame whose length does not match its text.
        for frame in [
            &b"$5\r\n1:4:900:0:1:17\r\n"[..],
            b"$-1\r\n",
            b"$40\r\n1:4:900:0:0:17\r\n",
        ] {
            assert!(decode_frame(frame, 2, false).is_err(), "{frame:?} accepted");
        }
    }

    #[test]
    fn several_limits_answer_one_group_each_up_to_the_first_that_blocks() {
        let shape = |shadow| Shape {
            bands: 1,
            approximate: false,
            shadow,
        };
        let allowed = [1, 1, 4, 900, 0, 0, 0, 0];
        let denied = [1, 0, 0, 900, 700, 0, 0, 0];
        let joined = |groups: &[&[i64]]| reply(&groups.concat());
        let limits = [shape(false), shape(true), shape(false)];
        let all = decode_several(&joined(&[&allowed, &denied, &allowed]), &limits).unwrap();
        assert_eq!(all.len(), 3, "a shadow denial blocks nothing");
        let stopped = decode_several(
            &joined(&[&allowed, &denied]),
            &[shape(false), shape(false), shape(false)],
        )
        .unwrap();
        assert_eq!(stopped.len(), 2);
        for (what, value, limits) in [
            ("empty", reply(&[]), &limits[..]),
            ("partial group", reply(&allowed[..5]), &limits[..]),
            (
                "more groups than limits",
                joined(&[&allowed, &allowed]),
                &limits[..1],
            ),
            ("stops without a block", joined(&[&allowed]), &limits[..]),
            (
                "goes on after a block",
                joined(&[&denied, &allowed]),
                &[shape(false), shape(false)][..],
            ),
        ] {
            assert!(decode_several(&value, limits).is_err(), "{what} accepted");
        }
    }
}
