//! `Authorization: Basic` as the app decodes it.
//!
//! App servers decode the base64 leniently, each its own way: Werkzeug
//! (`base64.b64decode`), Rack (`unpack1("m")`), PHP (`base64_decode`) and
//! Node (`Buffer.from(s, "base64")`, under Express's basic-auth) all skip
//! characters outside the alphabet and tolerate missing or extra `=`.
//! Counting the spelling would let one password be sent in as many
//! spellings as there are places to put a junk character, so the
//! credential is counted by the bytes it decodes to.
//!
//! Where the servers agree, sluice reads what they read: characters
//! outside `A-Z a-z 0-9 + /` are skipped, trailing `=` are ignored however
//! many, missing padding is supplied, a last lone character (6 bits, no
//! byte) is dropped, and unused low bits of the last character are
//! ignored. Where they disagree, no single reading is safe: a `=` followed
//! by more data (Node stops at it, Python skips it) and the
//! URL-safe `-` and `_` (Node reads them as `+` and `/`, the others skip
//! them) would each let a client pick, per request, a spelling its app
//! reads as one credential and sluice as another. Such a credential, and
//! one that decodes to nothing, is [`Basic::Undecodable`]: one bucket
//! shared by every such request of the route, never a bucket per spelling.

use base64::alphabet;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;

/// What a `Basic` credential counts as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Basic {
    /// The decoded `user:password` bytes.
    Decoded(Vec<u8>),
    /// Nothing, or a spelling the app servers read differently.
    Undecodable,
}

/// Padding is stripped before decoding, and the trailing bits of the last
/// character are ignored as every app server ignores them.
const LENIENT: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_allow_trailing_bits(true)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone),
);

/// Decodes the credential of a `Basic` authorization (what follows the
/// scheme and its blanks).
pub fn decode(credential: &[u8]) -> Basic {
    let mut data = Vec::with_capacity(credential.len());
    let mut padded = false;
    for &b in credential {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'+' | b'/' => {
                if padded {
                    return Basic::Undecodable;
                }
                data.push(b);
            }
            b'=' => padded = true,
            b'-' | b'_' => return Basic::Undecodable,
            _ => {}
        }
    }
    if data.len() % 4 == 1 {
        data.pop();
    }
    match LENIENT.decode(&data) {
        Ok(decoded) if !decoded.is_empty() => Basic::Decoded(decoded),
        // Filtered, unpadded and of a decodable length, the input cannot
        // fail; were it to, it would be the shared bucket, not a pass.
        Ok(_) | Err(_) => Basic::Undecodable,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(s: &str) -> Basic {
        Basic::Decoded(s.as_bytes().to_vec())
    }

    #[test]
    fn every_spelling_the_apps_agree_on_is_one_credential() {
        for sent in [
            "YWxpY2U6czNjcmV0",
            "YWxpY2U6czNjcmV0==",
            "YWxpY2U6czNjcmV0=",
            "YWxpY2U6czNjcmV0====*",
            "YWxp*Y2U6czNjcmV0",
            "YWxp Y2U6\tczNj.cmV0",
            "*YWxpY2U6czNjcmV0!",
            // A last lone character carries no byte.
            "YWxpY2U6czNjcmV0M",
            "YWxpY2U6czNjcmV0M==",
        ] {
            assert_eq!(decode(sent.as_bytes()), decoded("alice:s3cret"), "{sent:?}");
        }
        for sent in [
            "YWxpY2U6czNjcmV0MQ==",
            "YWxpY2U6czNjcmV0MQ",
            "YWxpY2U6czNjcmV0MQ=",
            "YWxpY2U6czNjcmV0MQ===",
            // Unused low bits of the last character are ignored.
            "YWxpY2U6czNjcmV0MR==",
            "YWxp\u{7f}Y2U6czNjcmV0MQ",
        ] {
            assert_eq!(
                decode(sent.as_bytes()),
                decoded("alice:s3cret1"),
                "{sent:?}"
            );
        }
        assert_eq!(decode(&[b'Y', 0xff, b'Q', b'=']), decoded("a"));
    }

    #[test]
    fn what_decodes_to_nothing_or_to_a_different_app_reading_is_shared() {
        for sent in [
            "",
            "*",
            "!!!",
            "a",
            "====",
            // The apps disagree about data after padding.
            "YQ==YQ==",
            "YWxpY2U6czNjcmV0=x",
            "Y=Q==",
            "=YWxpY2U6czNjcmV0",
            // And about the URL-safe alphabet.
            "YWxp-Y2U6czNjcmV0",
            "YWxp_Y2U6czNjcmV0",
        ] {
            assert_eq!(decode(sent.as_bytes()), Basic::Undecodable, "{sent:?}");
        }
    }

    #[test]
    fn the_credential_is_case_sensitive() {
        assert_ne!(decode(b"YWxpY2U6czNjcmV0"), decode(b"ywxpy2u6czNjcmV0"));
    }
}
