//! Pseudonyms: versioned HMAC-SHA256 of who is asking.
//!
//! Raw identities (IP addresses, API keys) stop here: stores, logs and
//! metrics only ever see a [`Pseudonym`]. The input is length-framed so
//! `("ab", "c")` and `("a", "bc")` can never collide, and includes the route
//! so one identity's pseudonyms on two routes are unlinkable.

use std::fmt;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The key and its version. Rotating the key bumps the version, which is
/// part of every pseudonym, so old and new counters never mix.
#[derive(Clone)]
pub struct PseudonymKey {
    mac: HmacSha256,
    version: u32,
}

impl PseudonymKey {
    pub fn new(secret: &[u8], version: u32) -> PseudonymKey {
        // HMAC accepts keys of any length; the error case cannot happen.
        let mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
        PseudonymKey { mac, version }
    }

    /// A fresh random key, for the memory store when none is configured
    /// (pseudonyms then change on every restart, as the counters do).
    pub fn random() -> PseudonymKey {
        let secret: [u8; 32] = rand::random();
        PseudonymKey::new(&secret, 0)
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// `kind` names the subject source (`ip`, `header:x-api-key`,
    /// `unresolved`), `identity` the raw value, `route` the route name.
    pub fn pseudonym(&self, kind: &str, identity: &[u8], route: &str) -> Pseudonym {
        let mut mac = self.mac.clone();
        for part in [kind.as_bytes(), identity, route.as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        Pseudonym {
            digest: mac.finalize().into_bytes().into(),
            version: self.version,
        }
    }
}

impl fmt::Debug for PseudonymKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PseudonymKey")
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

/// Who is asking, as the stores see it. Displays as `v<version>:<digest>`
/// (base64url, no padding).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pseudonym {
    digest: [u8; 32],
    version: u32,
}

/// Bytes the longest [`Pseudonym`] displays in: `v`, a `u32`, `:` and 43
/// base64 digits.
pub const DISPLAY_MAX: usize = 1 + 10 + 1 + 43;

impl Pseudonym {
    /// The `Display` form, written into `out` without allocating (a store
    /// key is built from it on every evaluation); returns its length.
    pub fn encode(&self, out: &mut [u8; DISPLAY_MAX]) -> usize {
        out[0] = b'v';
        let mut version = itoa::Buffer::new();
        let version = version.format(self.version).as_bytes();
        let mut at = 1 + version.len();
        out[1..at].copy_from_slice(version);
        out[at] = b':';
        at += 1;
        // 32 bytes are 43 digits unpadded, and 43 bytes are left whatever
        // the version: the slice is never too short.
        at + base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode_slice(self.digest, &mut out[at..])
            .unwrap_or(0)
    }

    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }

    pub fn version(&self) -> u32 {
        self.version
    }
}

impl fmt::Display for Pseudonym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = [0u8; DISPLAY_MAX];
        let len = self.encode(&mut out);
        // Only ASCII is ever written.
        f.write_str(std::str::from_utf8(&out[..len]).unwrap_or_default())
    }
}

impl fmt::Debug for Pseudonym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pseudonym({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_keeps_parts_apart() {
        let key = PseudonymKey::new(b"k", 1);
        assert_ne!(
            key.pseudonym("ab", b"c", "r"),
            key.pseudonym("a", b"bc", "r")
        );
        assert_ne!(
            key.pseudonym("ip", b"1.2.3.4", "a"),
            key.pseudonym("ip", b"1.2.3.4", "b")
        );
        assert_eq!(
            key.pseudonym("ip", b"1.2.3.4", "a"),
            key.pseudonym("ip", b"1.2.3.4", "a")
        );
    }

    #[test]
    fn version_and_key_change_the_pseudonym() {
        let p1 = PseudonymKey::new(b"k", 1).pseudonym("ip", b"x", "r");
        let p2 = PseudonymKey::new(b"k", 2).pseudonym("ip", b"x", "r");
        let p3 = PseudonymKey::new(b"other", 1).pseudonym("ip", b"x", "r");
        assert_ne!(p1.digest(), p3.digest());
        assert!(p1.to_string().starts_with("v1:"));
        assert!(p2.to_string().starts_with("v2:"));
        assert_eq!(p1.to_string().len(), "v1:".len() + 43);
        let widest = PseudonymKey::new(b"k", u32::MAX).pseudonym("ip", b"x", "r");
        assert_eq!(widest.to_string().len(), DISPLAY_MAX);
        let digest = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(widest.digest());
        assert_eq!(widest.to_string(), format!("v{}:{digest}", u32::MAX));
    }

    #[test]
    fn display_never_contains_the_identity() {
        let p = PseudonymKey::new(b"k", 1).pseudonym("header:x-api-key", b"secret-key-123", "api");
        assert!(!format!("{p} {p:?}").contains("secret-key-123"));
    }
}
