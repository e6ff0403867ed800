//! Request header names with `_`.
//!
//! CGI-style servers (Puma, gunicorn before 22, wsgiref, PHP behind CGI
//! and FastCGI) pass headers to the app as `HTTP_*` variables, where `-`
//! and `_` are the same character: `X_API_Key: victim` reaches the app as
//! `X-API-Key`, while sluice counted the `X-API-Key: fresh` beside it.
//! nginx drops such names by default (`underscores_in_headers off`); Envoy
//! offers `headers_with_underscores_action`. `server.headers_with_underscores`
//! chooses ([`Underscores`]); under every choice, a name that would stand
//! for a header sluice reads or writes is refused, not guessed at.

use http::header::{HeaderMap, HeaderName};
use smallvec::SmallVec;

use crate::config::Underscores;
use crate::subject::resolve::X_FORWARDED_FOR;

use super::headers::{Invalid, REMOVED_CLAIMS, X_FORWARDED_HOST, X_FORWARDED_PROTO, X_REAL_IP};
use super::overrides::{folds_to, OVERRIDE_HEADERS};

/// Whether `name` contains `_`.
fn underscored(name: &HeaderName) -> bool {
    has_byte(name.as_str().as_bytes(), b'_')
}

/// Whether `bytes` holds `byte`, eight bytes at a time: every name of
/// every request is looked at, a browser sends a dozen of ten to twenty
/// bytes, and a byte at a time (what `contains` does below sixteen) cost
/// four instructions a byte.
fn has_byte(bytes: &[u8], byte: u8) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGHS: u64 = u64::from_ne_bytes([0x80; 8]);
    let pattern = ONES * u64::from(byte);
    // Exact for "some byte is zero": a borrow can only run past a byte
    // that is zero itself, so no word without one is taken for one.
    let any_zero = |word: u64| word.wrapping_sub(ONES) & !word & HIGHS != 0;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let mut word = [0; 8];
        word.copy_from_slice(chunk);
        if any_zero(u64::from_ne_bytes(word) ^ pattern) {
            return true;
        }
    }
    // The last bytes, padded with one that is not `byte`.
    let rest = chunks.remainder();
    let mut word = [!byte; 8];
    word[..rest.len()].copy_from_slice(rest);
    any_zero(u64::from_ne_bytes(word) ^ pattern)
}

/// Refuses what `mode` refuses; `Ok(true)` when the request carries a
/// header name with `_` that may go on (to be removed under `drop`).
/// `read`: the headers routes read, subjects and tiers.
pub fn check(headers: &HeaderMap, mode: Underscores, read: &[HeaderName]) -> Result<bool, Invalid> {
    let mut any = false;
    for name in headers.keys().filter(|name| underscored(name)) {
        any = true;
        if mode == Underscores::Reject {
            return Err(Invalid::UnderscoreHeader);
        }
        let forwarding = [&X_FORWARDED_FOR, &X_FORWARDED_HOST, &X_FORWARDED_PROTO];
        // Under `allow` an override spelled with `_` reaches the app, and
        // is matched as the override it is there (`overrides::methods`).
        let overrides = OVERRIDE_HEADERS
            .iter()
            .filter(|_| mode == Underscores::Drop);
        let stands_for = read
            .iter()
            .chain(forwarding)
            .chain([&X_REAL_IP])
            .chain(REMOVED_CLAIMS.iter())
            .chain(overrides)
            .find(|target| folds_to(name, target));
        if let Some(target) = stands_for {
            return Err(Invalid::UnderscoreStandsFor(target.clone()));
        }
    }
    Ok(any)
}

/// Removes every header whose name contains `_` (`drop`).
pub fn remove(headers: &mut HeaderMap) {
    let names: SmallVec<[HeaderName; 4]> = headers
        .keys()
        .filter(|name| underscored(name))
        .cloned()
        .collect();
    for name in names {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(names: &[&str]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for name in names {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("v"),
            );
        }
        h
    }

    fn key() -> Vec<HeaderName> {
        vec![HeaderName::from_static("x-api-key")]
    }

    #[test]
    fn a_byte_is_found_wherever_it_is_and_only_where_it_is() {
        // Every length across two words and their remainder, the byte at
        // each place and nowhere, beside the bytes a borrow could confuse
        // with it (one above and one below).
        for len in 0..=24 {
            for filler in [b'a', b'^', b'`', 0x00, 0xff, 0x80] {
                let mut bytes = vec![filler; len];
                assert!(!has_byte(&bytes, b'_'), "{len} bytes of {filler:#x}");
                for at in 0..len {
                    bytes[at] = b'_';
                    assert!(has_byte(&bytes, b'_'), "{len} bytes, `_` at {at}");
                    bytes[at] = filler;
                }
            }
        }
        for (name, underscored_) in [
            ("x-api-key", false),
            ("x_api_key", true),
            ("accept-language_", true),
        ] {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            assert_eq!(underscored(&name), underscored_, "{name}");
        }
    }

    #[test]
    fn each_mode_refuses_what_it_says() {
        let plain = headers(&["x-api-key", "accept"]);
        let other = headers(&["x_trace", "accept"]);
        let identity = headers(&["x-api-key", "X_API_Key"]);
        let override_ = headers(&["X_HTTP_Method_Override"]);
        let forwarded = headers(&["x_forwarded_for"]);
        let claim = headers(&["x_real_ip"]);
        let stands = |name: &str| {
            Err(Invalid::UnderscoreStandsFor(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
            ))
        };

        assert_eq!(check(&plain, Underscores::Drop, &key()), Ok(false));
        assert_eq!(check(&other, Underscores::Drop, &key()), Ok(true));
        assert_eq!(
            check(&identity, Underscores::Drop, &key()),
            stands("x-api-key")
        );
        assert_eq!(
            check(&override_, Underscores::Drop, &key()),
            stands("x-http-method-override")
        );
        assert_eq!(
            check(&forwarded, Underscores::Drop, &key()),
            stands("x-forwarded-for")
        );
        assert_eq!(
            check(&claim, Underscores::Drop, &key()),
            stands("x-real-ip")
        );
        // A CGI-style server hands `Client_IP` to the app as `Client-IP`.
        for mode in [Underscores::Drop, Underscores::Allow] {
            assert_eq!(
                check(&headers(&["Client_IP"]), mode, &key()),
                stands("client-ip")
            );
            assert_eq!(
                check(&headers(&["x_forwarded_prefix"]), mode, &key()),
                stands("x-forwarded-prefix")
            );
        }

        assert_eq!(check(&plain, Underscores::Reject, &key()), Ok(false));
        assert_eq!(
            check(&other, Underscores::Reject, &key()),
            Err(Invalid::UnderscoreHeader)
        );

        assert_eq!(check(&other, Underscores::Allow, &key()), Ok(true));
        assert_eq!(
            check(&identity, Underscores::Allow, &key()),
            stands("x-api-key")
        );
        assert_eq!(check(&override_, Underscores::Allow, &key()), Ok(true));
        assert_eq!(
            check(&forwarded, Underscores::Allow, &key()),
            stands("x-forwarded-for")
        );
    }

    #[test]
    fn remove_takes_every_underscored_name_and_nothing_else() {
        let mut h = headers(&["x_a", "x-b", "x_c", "x_a"]);
        remove(&mut h);
        let left: Vec<&str> = h.keys().map(|n| n.as_str()).collect();
        assert_eq!(left, ["x-b"]);
    }
}
