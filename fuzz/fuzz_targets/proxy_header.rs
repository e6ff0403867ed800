//! The PROXY protocol header parser: any bytes → a verdict, never a panic,
//! and a verdict that more bytes cannot change.
//!
//! - A header's length is within the bytes read and within `MAX_HEADER`.
//! - Undecided (`Incomplete`) only below `MAX_HEADER` bytes: the
//!   listener's buffer never has to grow past it.
//! - Every prefix of the input is undecided or already says what the whole
//!   input says (the listener reads in pieces of any size); a header read
//!   from a prefix is the same header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::fuzzing::{parse_proxy_header, Parsed, MAX_HEADER};

fuzz_target!(|bytes: &[u8]| {
    let bytes = &bytes[..bytes.len().min(MAX_HEADER + 64)];
    let whole = parse_proxy_header(bytes);
    match whole {
        Parsed::Header { len, .. } => assert!(len <= bytes.len() && len <= MAX_HEADER),
        Parsed::Incomplete => assert!(bytes.len() < MAX_HEADER, "undecided at {}", bytes.len()),
        Parsed::Absent | Parsed::Invalid(_) => {}
    }
    for end in 0..bytes.len() {
        let part = parse_proxy_header(&bytes[..end]);
        match part {
            Parsed::Incomplete => {}
            Parsed::Header { len, .. } => {
                // The header ended within the prefix: the same header.
                assert_eq!(part, whole, "prefix of {end} bytes");
                assert!(len <= end);
            }
            decided => assert_eq!(decided, whole, "prefix of {end} bytes"),
        }
    }
});
