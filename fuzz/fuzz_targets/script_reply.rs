//! The script reply decoder: any `redis::Value` tree → a reply only when it
//! has exactly the shape `lua/README.md` documents, checked against an
//! independent reading of that contract; the same tree written as RESP2
//! and read in place from its bytes (sluice's own connection) decodes the
//! same, and is framed at its exact length; and any bytes at all are read
//! without a panic.
#![no_main]

use std::time::Duration;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use redis::Value;
use sluice::fuzzing::{decode_reply, decode_reply_frame, resp_frame_len, Reply};

/// A reply as a script could send it: most inputs become an eight-integer
/// array of small numbers or a record's text (the interesting regions),
/// the rest any tree.
fn reply(u: &mut Unstructured<'_>) -> arbitrary::Result<Value> {
    if u.ratio(1, 4)? {
        return Ok(Value::BulkString(record(u)?));
    }
    if u.ratio(2, 3)? {
        let len = if u.ratio(7, 8)? {
            8
        } else {
            u.int_in_range(0..=10)?
        };
        let fields = (0..len)
            .map(|_| {
                Ok(match u.int_in_range(0..=9)? {
                    0 => Value::Int(i64::arbitrary(u)?),
                    1 => value(u, 2)?,
                    _ => Value::Int(u.int_in_range(-1..=3)?),
                })
            })
            .collect::<arbitrary::Result<Vec<_>>>()?;
        Ok(Value::Array(fields))
    } else {
        value(u, 4)
    }
}

/// A record's text as a script could answer it: mostly six small numbers
/// joined by `:`, perhaps after a state's numbers and tail; now and then a
/// field of any bytes, or another count of fields.
fn record(u: &mut Unstructured<'_>) -> arbitrary::Result<Vec<u8>> {
    let mut out = Vec::new();
    if u.ratio(1, 2)? {
        out.extend_from_slice(b"1733622222123456:1733622180000000:3|1733622222323456|0|abcdef01|");
    }
    let fields = if u.ratio(7, 8)? {
        6
    } else {
        u.int_in_range(0..=8)?
    };
    for f in 0..fields {
        if f > 0 {
            out.push(b':');
        }
        match u.int_in_range(0..=9)? {
            0 => out.extend(Vec::<u8>::arbitrary(u)?),
            1 => out.extend(u64::arbitrary(u)?.to_string().bytes()),
            _ => out.extend(u.int_in_range(0..=3u8)?.to_string().bytes()),
        }
    }
    Ok(out)
}

fn value(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<Value> {
    let kinds = if depth == 0 { 9 } else { 13 };
    Ok(match u.int_in_range(0..=kinds)? {
        0 => Value::Nil,
        1 => Value::Int(i64::arbitrary(u)?),
        2 => Value::BulkString(Vec::arbitrary(u)?),
        3 => Value::SimpleString(String::arbitrary(u)?),
        4 => Value::Okay,
        5 => Value::Double(f64::arbitrary(u)?),
        6 => Value::Boolean(bool::arbitrary(u)?),
        7 => Value::BigNumber(Vec::arbitrary(u)?),
        8 | 9 => Value::Int(u.int_in_range(-1..=3)?),
        10 => Value::Array(values(u, depth)?),
        11 => Value::Set(values(u, depth)?),
        12 => Value::Map(
            values(u, depth)?
                .chunks_exact(2)
                .map(|kv| (kv[0].clone(), kv[1].clone()))
                .collect(),
        ),
        _ => Value::Attribute {
            data: Box::new(value(u, depth - 1)?),
            attributes: Vec::new(),
        },
    })
}

fn values(u: &mut Unstructured<'_>, depth: u32) -> arbitrary::Result<Vec<Value>> {
    let len = u.int_in_range(0..=9)?;
    (0..len).map(|_| value(u, depth - 1)).collect()
}

/// `lua/README.md`, read again: an array of exactly eight non-negative
/// integers `{version=1, outcome, remaining, reset_after_us,
/// retry_after_us, band, replayed, skew_us}`; or a string whose last
/// `|`-separated part (the whole, without one) is six whole numbers
/// `outcome:remaining:reset_after_us:retry_after_us:band:at_us`, outcome
/// 0 or 1, read as the array `{1, those five, 0, 0}`.
fn expected(value: &Value, bands: usize) -> Option<Reply> {
    let fields: Vec<u64> = match value {
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::Int(n) if *n >= 0 => Some(*n as u64),
                _ => None,
            })
            .collect::<Option<_>>()?,
        Value::BulkString(text) => {
            let record = text.rsplit(|&b| b == b'|').next()?;
            let numbers: Vec<u64> = record
                .split(|&b| b == b':')
                .map(|n| {
                    let n = std::str::from_utf8(n).ok()?;
                    n.bytes()
                        .all(|d| d.is_ascii_digit())
                        .then(|| n.parse().ok())?
                })
                .collect::<Option<_>>()?;
            let [outcome, remaining, reset, retry, band, _at] =
                <[u64; 6]>::try_from(numbers).ok()?;
            if outcome > 1 {
                return None;
            }
            vec![1, outcome, remaining, reset, retry, band, 0, 0]
        }
        _ => return None,
    };
    let [version, outcome, remaining, reset_after, retry_after, band, replayed, skew] =
        <[u64; 8]>::try_from(fields).ok()?;
    if version != 1 || replayed > 1 {
        return None;
    }
    if outcome == 2 {
        return Some(Reply::ClockUnsafe { skew });
    }
    let allowed = match outcome {
        0 => false,
        1 => true,
        _ => return None,
    };
    // A denial says when to retry; an admission's retry_after is its
    // delay (0 without one).
    if band >= bands as u64 || (!allowed && retry_after == 0) {
        return None;
    }
    Some(Reply::Decided {
        decision: sluice::limit::Decision {
            allowed,
            band: band as usize,
            remaining,
            reset_after: Duration::from_micros(reset_after),
            retry_after: Duration::from_micros(retry_after),
            approximate: false,
        },
        replayed: replayed == 1,
        skew,
    })
}

/// `value` as Redis writes it in RESP2; `None` for what RESP2 cannot say
/// (RESP3 types, a simple string holding CR or LF).
fn resp2(value: &Value, out: &mut Vec<u8>) -> Option<()> {
    match value {
        Value::Nil => out.extend_from_slice(b"$-1\r\n"),
        Value::Int(n) => out.extend_from_slice(format!(":{n}\r\n").as_bytes()),
        Value::BulkString(bytes) => {
            out.extend_from_slice(format!("${}\r\n", bytes.len()).as_bytes());
            out.extend_from_slice(bytes);
            out.extend_from_slice(b"\r\n");
        }
        Value::SimpleString(s) if !s.contains(['\r', '\n']) => {
            out.extend_from_slice(format!("+{s}\r\n").as_bytes())
        }
        Value::Okay => out.extend_from_slice(b"+OK\r\n"),
        Value::Array(items) => {
            out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
            for item in items {
                resp2(item, out)?;
            }
        }
        _ => return None,
    }
    Some(())
}

fuzz_target!(|data: &[u8]| {
    if let Some((&0xff, raw)) = data.split_first() {
        // Any bytes: framed or refused, decoded or refused, never a panic;
        // a frame is never longer than its input, and a decoded reply is
        // a whole frame.
        let framed = resp_frame_len(raw);
        if let Ok(Some(n)) = framed {
            assert!(n <= raw.len());
        }
        if decode_reply_frame(raw, 2, false).is_ok() {
            assert_eq!(framed.ok().flatten(), Some(raw.len()), "{raw:?}");
        }
        return;
    }
    let mut u = Unstructured::new(data);
    let (Ok(bands), Ok(value)) = (u.int_in_range(0..=4usize), reply(&mut u)) else {
        return;
    };
    let decoded = decode_reply(&value, bands, false);
    match (&decoded, expected(&value, bands)) {
        (Ok(got), Some(want)) => assert_eq!(*got, want, "{value:?}"),
        (Err(_), None) => {}
        (got, want) => panic!("decoded {got:?}, the contract says {want:?}, for {value:?}"),
    }
    let mut bytes = Vec::new();
    if resp2(&value, &mut bytes).is_some() {
        assert_eq!(
            resp_frame_len(&bytes).ok().flatten(),
            Some(bytes.len()),
            "{value:?}"
        );
        let in_place = decode_reply_frame(&bytes, bands, false);
        assert_eq!(in_place, decoded, "{value:?} as {bytes:?}");
    }
});
