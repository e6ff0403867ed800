//! Decoding a script's reply (the contract in `lua/README.md`):
//!
//! `{version, outcome, remaining, reset_after_us, retry_after_us, band,
//! replayed, skew_us}`, all integers; outcome 0 denied, 1 allowed,
//! 2 clock unsafe. Anything else is refused as malformed, never guessed at.

use std::time::Duration;

use redis::Value;

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

pub fn decode(value: &Value, bands: usize, approximate: bool) -> Result<Reply, Malformed> {
    let Value::Array(items) = value else {
        return Err(Malformed("not an array"));
    };
    if items.len() != FIELDS {
        return Err(Malformed("wrong number of fields"));
    }
    let mut fields = [0u64; FIELDS];
    for (slot, item) in fields.iter_mut().zip(items) {
        *slot = match item {
            Value::Int(n) => u64::try_from(*n).map_err(|_| Malformed("negative field"))?,
            _ => return Err(Malformed("field is not an integer")),
        };
    }
    let [version, outcome, remaining, reset_after, retry_after, band, replayed, skew] = fields;
    if version != VERSION as u64 {
        return Err(Malformed("unknown reply version"));
    }
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
    if allowed && retry_after != 0 {
        return Err(Malformed("allowed with a retry_after"));
    }
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
            ("allowed+retry", reply(&[1, 1, 4, 900, 5, 0, 0, 0])),
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
}
