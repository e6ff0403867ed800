//! Where one RESP2 reply ends in the bytes received, without building it.

use std::io;

use smallvec::SmallVec;

/// The longest reply accepted (a `FUNCTION LIST WITHCODE` of every
/// library is the longest sluice asks for, tens of KB). Anything longer
/// is taken for a broken stream.
pub const MAX_FRAME: usize = 16 << 20;
/// Elements one reply may announce, all nesting levels together.
const MAX_ELEMENTS: usize = 1 << 20;

/// The integers of a reply that is an array of integers alone (a
/// decision's reply), read as the reply is framed. One decision's eight
/// are held inline, and a [`Frame`] stays small enough to be moved without
/// a call to `memcpy` (it is moved from the reader to its caller through
/// a channel); two limits' sixteen take an allocation.
pub type Ints = SmallVec<[i64; 8]>;

/// The most integers a reply's [`Ints`] holds: a decision replies eight a
/// limit, so two limits' replies are read as they are framed. A longer
/// array is kept as bytes and read from them (`reply::frame_fields`).
pub const INTS: usize = 16;

/// The length of the whole RESP2 reply at the start of `input`, `None`
/// while it is incomplete. Counts the elements still due instead of
/// recursing, so nesting costs nothing; a malformed or oversized reply is
/// `InvalidData`.
pub fn frame_len(input: &[u8]) -> Result<Option<usize>, io::Error> {
    Ok(frame_scan(input, &mut Ints::new())?.map(|(len, _)| len))
}

/// [`frame_len`], and whether the reply is an array of at most [`INTS`]
/// integers alone, whose values are then in `ints` (cleared first): a
/// decision's reply is read once, as it is framed, not framed and then
/// read again.
pub fn frame_scan(input: &[u8], ints: &mut Ints) -> Result<Option<(usize, bool)>, io::Error> {
    let bad = || io::Error::from(io::ErrorKind::InvalidData);
    ints.clear();
    if let Some(len) = short_ints(input, ints) {
        return Ok(Some((len, true)));
    }
    ints.clear();
    // Only an array's elements are collected: the reply's own type is
    // read first, below, as any element's.
    let mut flat = input.first() == Some(&b'*');
    let mut at = 0;
    let mut due: usize = 1;
    let mut announced: usize = 0;
    while due > 0 {
        let Some(&kind) = input.get(at) else {
            return Ok(None);
        };
        // The usual element: a short integer, read in one pass (the
        // general path below finds the line's end, then parses it).
        if kind == b':' {
            if let Some((n, used)) = short_int(&input[at + 1..]) {
                at += 1 + used;
                due -= 1;
                flat = flat && collect(ints, n);
                continue;
            }
        }
        let Some(line) = line_end(&input[at + 1..]).ok_or_else(bad)? else {
            if input.len() - at > 64 && kind != b'+' && kind != b'-' {
                // A length line is short; simple strings and errors may not be.
                return Err(bad());
            }
            if input.len() > MAX_FRAME {
                return Err(bad());
            }
            return Ok(None);
        };
        let header = &input[at + 1..at + 1 + line];
        // Anything but integers after the array's own header.
        flat = flat && (at == 0 || kind == b':');
        at += 1 + line + 2;
        due -= 1;
        match kind {
            b'+' | b'-' => {}
            b':' => {
                let n = parse_int(header).ok_or_else(bad)?;
                flat = flat && collect(ints, n);
            }
            b'$' => {
                let len = parse_int(header).ok_or_else(bad)?;
                if len >= 0 {
                    let len = usize::try_from(len).map_err(|_| bad())?;
                    if len > MAX_FRAME {
                        return Err(bad());
                    }
                    if input.len() < at + len + 2 {
                        return Ok(None);
                    }
                    if &input[at + len..at + len + 2] != b"\r\n" {
                        return Err(bad());
                    }
                    at += len + 2;
                } else if len != -1 {
                    return Err(bad());
                }
            }
            b'*' => {
                let count = parse_int(header).ok_or_else(bad)?;
                if count >= 0 {
                    let count = usize::try_from(count).map_err(|_| bad())?;
                    announced = announced.saturating_add(count);
                    if announced > MAX_ELEMENTS {
                        return Err(bad());
                    }
                    due += count;
                } else if count != -1 {
                    return Err(bad());
                } else {
                    // The null array holds no integers.
                    flat = false;
                }
            }
            _ => return Err(bad()),
        }
        if at > MAX_FRAME {
            return Err(bad());
        }
    }
    Ok(Some((at, flat)))
}

/// The usual reply, a decision's: an array of at most [`INTS`] short
/// integers alone, whole. Its length, its integers in `ints`; `None` for
/// anything else, complete or not, which the general reading then takes
/// (to the same length and integers, where this takes it).
fn short_ints(input: &[u8], ints: &mut Ints) -> Option<usize> {
    let digit = |d: u8| d.is_ascii_digit().then(|| usize::from(d - b'0'));
    let (count, mut at) = match *input {
        [b'*', d, b'\r', b'\n', ..] => (digit(d)?, 4),
        [b'*', d1, d2, b'\r', b'\n', ..] => (digit(d1)? * 10 + digit(d2)?, 5),
        _ => return None,
    };
    if count > INTS {
        return None;
    }
    for _ in 0..count {
        if input.get(at) != Some(&b':') {
            return None;
        }
        let (n, used) = short_int(input.get(at + 1..)?)?;
        ints.push(n);
        at += 1 + used;
    }
    Some(at)
}

/// Adds `n` to `ints`; `false` once they are full.
fn collect(ints: &mut Ints, n: i64) -> bool {
    if ints.len() == INTS {
        return false;
    }
    ints.push(n);
    true
}

/// Where the `\r\n` ending the line at the start of `input` begins:
/// `Some(None)` while it has not arrived, `None` for a CR without its LF
/// (no line RESP writes holds one).
fn line_end(input: &[u8]) -> Option<Option<usize>> {
    let Some(cr) = input.iter().position(|&b| b == b'\r') else {
        return Some(None);
    };
    match input.get(cr + 1) {
        Some(b'\n') => Some(Some(cr)),
        Some(_) => None,
        None => Some(None),
    }
}

/// An integer line at the start of `input` (after its type byte): `-` or
/// not, 1 to 18 digits, CRLF; its value and its length, CRLF included.
/// `None` for anything else, complete or not: the caller then reads the
/// line the general way, which takes every line this takes, to the same
/// value, and judges the rest. Eighteen digits cannot overflow an `i64`,
/// so no step is checked.
pub fn short_int(input: &[u8]) -> Option<(i64, usize)> {
    let negative = input.first() == Some(&b'-');
    let start = usize::from(negative);
    let mut n: i64 = 0;
    let mut at = start;
    while let Some(&d) = input.get(at) {
        if !d.is_ascii_digit() || at - start == 18 {
            break;
        }
        n = n * 10 + i64::from(d - b'0');
        at += 1;
    }
    // A nineteenth digit is where the CR should be: not taken.
    if at == start || input.get(at..at + 2) != Some(b"\r\n") {
        return None;
    }
    Some((if negative { -n } else { n }, at + 2))
}

/// A RESP integer: optional `-`, then 1 to 19 digits, anywhere in `i64`
/// (accumulated as a negative number, so `i64::MIN` parses too).
pub fn parse_int(digits: &[u8]) -> Option<i64> {
    let (negative, digits) = match digits.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, digits),
    };
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let mut n: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_sub(i64::from(d - b'0'))?;
    }
    if negative {
        Some(n)
    } else {
        n.checked_neg()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_replies_are_cut_at_their_end() {
        let cases: &[&[u8]] = &[
            b"+OK\r\n",
            b"-ERR Function not found\r\n",
            b":-12\r\n",
            b"$5\r\nhello\r\n",
            b"$0\r\n\r\n",
            b"$-1\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*8\r\n:1\r\n:1\r\n:9\r\n:1000\r\n:0\r\n:0\r\n:0\r\n:0\r\n",
            b"*2\r\n*2\r\n$4\r\nname\r\n$2\r\nsl\r\n*1\r\n:3\r\n",
            // A bulk string may hold CR, LF and anything else.
            b"$4\r\n\r\n\r\n\r\n",
        ];
        for case in cases {
            let mut input = case.to_vec();
            input.extend_from_slice(b"+NEXT\r\n");
            assert_eq!(
                frame_len(&input).expect("well formed"),
                Some(case.len()),
                "{:?}",
                String::from_utf8_lossy(case)
            );
            // Every strict prefix is incomplete, never an error.
            for cut in 0..case.len() {
                assert_eq!(
                    frame_len(&case[..cut]).expect("a prefix is not malformed"),
                    None,
                    "{:?} cut at {cut}",
                    String::from_utf8_lossy(case)
                );
            }
        }
    }

    #[test]
    fn an_array_of_integers_alone_is_read_as_it_is_framed() {
        let sixteen = format!("*16\r\n{}", ":7\r\n".repeat(16));
        let seventeen = format!("*17\r\n{}", ":7\r\n".repeat(17));
        // (reply, its integers when it is an array of integers alone)
        let cases: &[(&[u8], Option<&[i64]>)] = &[
            (
                b"*8\r\n:1\r\n:1\r\n:9\r\n:1000\r\n:0\r\n:-3\r\n:0\r\n:0\r\n",
                Some(&[1, 1, 9, 1000, 0, -3, 0, 0]),
            ),
            // Past eighteen digits, the general path reads the integer.
            (
                b"*2\r\n:9223372036854775807\r\n:-9223372036854775808\r\n",
                Some(&[i64::MAX, i64::MIN]),
            ),
            (b"*0\r\n", Some(&[])),
            (sixteen.as_bytes(), Some(&[7; 16])),
            (seventeen.as_bytes(), None),
            (b"*-1\r\n", None),
            (b":5\r\n", None),
            (b"*2\r\n:1\r\n$2\r\nok\r\n", None),
            (b"*2\r\n:1\r\n*1\r\n:2\r\n", None),
            (b"*2\r\n*1\r\n:1\r\n:2\r\n", None),
            (b"*2\r\n:1\r\n-ERR no\r\n", None),
            (b"-ERR no\r\n", None),
        ];
        let mut ints = Ints::new();
        ints.push(99); // left from a reply before: cleared
        for (case, want) in cases {
            let (len, flat) = frame_scan(case, &mut ints)
                .expect("well formed")
                .expect("whole");
            assert_eq!(len, case.len());
            assert_eq!(
                flat.then_some(&ints[..]),
                *want,
                "{:?}",
                String::from_utf8_lossy(case)
            );
            // An incomplete reply is `None`, whatever it collected.
            assert_eq!(
                frame_scan(&case[..len - 1], &mut ints).expect("a prefix"),
                None
            );
        }
    }

    #[test]
    fn malformed_replies_break_the_connection() {
        let cases: &[&[u8]] = &[
            b"!3\r\nerr\r\n",
            b":12a\r\n",
            b":\r\n",
            b"$-2\r\n",
            b"*-5\r\n",
            b"$3\r\nabcd\r\n",
            b"$99999999999\r\n",
            b"*99999999999\r\n",
            b"+O\rK\r\n",
            b":99999999999999999999\r\n",
        ];
        for case in cases {
            assert!(
                frame_len(case).is_err(),
                "{:?} accepted",
                String::from_utf8_lossy(case)
            );
        }
        // A length line that never ends is not waited for forever.
        assert!(frame_len(&[b'$'; 200]).is_err());
        // Nor are elements announced without end.
        let mut nested = Vec::new();
        for _ in 0..3 {
            nested.extend_from_slice(b"*1000000\r\n");
        }
        assert!(frame_len(&nested).is_err());
    }

    #[test]
    fn a_short_integer_line_reads_as_the_general_path_reads_it() {
        for digits in [
            &b"0"[..],
            b"-0",
            b"7",
            b"-12",
            b"1000",
            b"999999999999999999",
            b"-999999999999999999",
        ] {
            let mut line = digits.to_vec();
            line.extend_from_slice(b"\r\n:5\r\n");
            assert_eq!(
                short_int(&line),
                Some((parse_int(digits).expect("an integer"), digits.len() + 2)),
                "{:?}",
                String::from_utf8_lossy(digits)
            );
        }
        // Left to the general path: too long to skip the overflow checks,
        // not an integer, or not ended yet.
        for line in [
            &b"1234567890123456789\r\n"[..],
            b"-\r\n",
            b"\r\n",
            b"+1\r\n",
            b"12a\r\n",
            b"12\r",
            b"12",
            b"12\rx",
            b"",
        ] {
            assert_eq!(short_int(line), None, "{:?}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn integers_parse_as_redis_writes_them() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-1"), Some(-1));
        assert_eq!(parse_int(b"9223372036854775807"), Some(i64::MAX));
        assert_eq!(parse_int(b"9223372036854775808"), None);
        assert_eq!(parse_int(b"-9223372036854775808"), Some(i64::MIN));
        assert_eq!(parse_int(b"-9223372036854775809"), None);
        assert_eq!(parse_int(b"-0"), Some(0));
        assert_eq!(parse_int(b"-"), None);
        assert_eq!(parse_int(b"+1"), None);
        assert_eq!(parse_int(b""), None);
    }
}
