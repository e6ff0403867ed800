//! The HTTP/1 framing watch (`server::framing`): any bytes, cut into reads
//! anywhere, give the same verdict as the same bytes read whole, never a
//! panic.
//!
//! - Requests refused, and the bytes of a head still arriving (what the
//!   memory budget is charged), do not depend on where reads end.
//! - The bytes handed on are the input's, except those of a refused head
//!   (NULs), and only within it.
//! - A head still arriving is never longer than the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice::fuzzing::Framing;

const MAX_HEAD: usize = 4096;

fuzz_target!(|input: (Vec<u8>, Vec<u8>)| {
    let (cuts, bytes) = input;
    let mut whole = Framing::new(MAX_HEAD);
    let mut read = bytes.clone();
    whole.inspect(&mut read);

    let mut pieces = Framing::new(MAX_HEAD);
    let mut cut = bytes.clone();
    let mut at = 0;
    for &step in cuts.iter().chain(std::iter::repeat(&255)) {
        if at >= cut.len() {
            break;
        }
        let end = (at + usize::from(step).max(1)).min(cut.len());
        pieces.inspect(&mut cut[at..end]);
        at = end;
    }
    assert_eq!(whole.refused(), pieces.refused());
    assert_eq!(whole.partial_head(), pieces.partial_head());
    assert!(whole.partial_head() <= bytes.len());
    for (out, (given, original)) in read.iter().zip(cut.iter().zip(&bytes)) {
        // Spoiled bytes are NULs; any other byte is handed on as it was.
        assert!(*out == *original || *out == 0);
        assert!(*given == *original || *given == 0);
    }
    if whole.refused() == 0 {
        assert_eq!(read, bytes);
        assert_eq!(cut, bytes);
    }
});
