//! Pseudonyms: versioned HMAC-SHA256 of who is asking.
//!
//! Raw identities (IP addresses, API keys) stop here: stores, logs and
//! metrics only ever see a [`Pseudonym`]. The input is length-framed so
//! `("ab", "c")` and `("a", "bc")` can never collide, and includes the route
//! so one identity's pseudonyms on two routes are unlinkable.

use std::fmt;

use std::sync::Arc;

use base64::Engine as _;
use ring::hmac;

mod memo;

use memo::Memo;

/// The key and its version. Rotating the key bumps the version, which is
/// part of every pseudonym, so old and new counters never mix.
#[derive(Clone)]
pub struct PseudonymKey {
    // ring's HMAC-SHA256 rather than the `hmac`/`sha2` crates': the same
    // digest, in about three quarters of the instructions (its SHA-256
    // block function is assembly, with SHA-NI where the CPU has it), and
    // paid by every request with a subject.
    key: hmac::Key,
    version: u32,
    /// This key's pseudonyms of late (see [`memo`]).
    memo: Arc<Memo>,
}

/// Framed input up to this long is hashed from one stack buffer in a
/// single call; longer (a long header value) goes through a context.
const FRAMED_INLINE: usize = 192;

impl PseudonymKey {
    pub fn new(secret: &[u8], version: u32) -> PseudonymKey {
        PseudonymKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            version,
            memo: Arc::default(),
        }
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
        let parts = [kind.as_bytes(), identity, route.as_bytes()];
        let framed: usize = parts.iter().map(|p| 8 + p.len()).sum();
        let digest = if framed <= FRAMED_INLINE {
            let mut input = [0u8; FRAMED_INLINE];
            let mut at = 0;
            for part in parts {
                input[at..at + 8].copy_from_slice(&(part.len() as u64).to_be_bytes());
                at += 8;
                input[at..at + part.len()].copy_from_slice(part);
                at += part.len();
            }
            let input = &input[..at];
            match self.memo.get(input) {
                Some(digest) => digest,
                None => {
                    let digest = digest(hmac::sign(&self.key, input));
                    self.memo.put(input, digest);
                    digest
                }
            }
        } else {
            let mut mac = hmac::Context::with_key(&self.key);
            for part in parts {
                mac.update(&(part.len() as u64).to_be_bytes());
                mac.update(part);
            }
            digest(mac.sign())
        };
        Pseudonym {
            digest,
            version: self.version,
        }
    }
}

fn digest(tag: hmac::Tag) -> [u8; 32] {
    let mut digest = [0u8; 32];
    // HMAC-SHA256 tags are 32 bytes.
    digest.copy_from_slice(tag.as_ref());
    digest
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
    fn a_remembered_pseudonym_is_the_one_computed() {
        let key = PseudonymKey::new(b"k", 1);
        let fresh = || PseudonymKey::new(b"k", 1);
        for (kind, identity) in [
            ("ip", &b"192.0.2.1"[..]),
            ("header:x-api-key", b"k1"),
            ("ip", b"192.0.2.10"),
        ] {
            let first = key.pseudonym(kind, identity, "r");
            let again = key.pseudonym(kind, identity, "r");
            assert_eq!(first, again);
            assert_eq!(again, fresh().pseudonym(kind, identity, "r"));
        }
        assert_ne!(
            key.pseudonym("ip", b"192.0.2.1", "r"),
            key.pseudonym("ip", b"192.0.2.10", "r")
        );
        // Another key's table is its own.
        let other = PseudonymKey::new(b"other", 1);
        assert_ne!(
            other.pseudonym("ip", b"192.0.2.1", "r"),
            key.pseudonym("ip", b"192.0.2.1", "r")
        );
    }

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

    /// Standard HMAC-SHA256 of the length-framed input, short (one stack
    /// buffer) and long (a context): the digests counters are keyed by.
    #[test]
    fn digest_is_hmac_sha256_of_the_framed_input() {
        let hex = |p: Pseudonym| {
            p.digest()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect::<String>()
        };
        let key = PseudonymKey::new(b"k", 1);
        assert_eq!(
            hex(key.pseudonym("ip", b"1.2.3.4", "a")),
            "11e9df41d09dc8dedf3c36e312ba30c3b31370720367ceef2a75d125ac7566b9"
        );
        assert_eq!(
            hex(key.pseudonym("header:x-api-key", &[b'x'; 300], "api")),
            "9fcc7eda36f358af09355ff9dee416a3cf8dc429e72e6eb6126ad699a2a786b1"
        );
    }

    #[test]
    fn display_never_contains_the_identity() {
        let p = PseudonymKey::new(b"k", 1).pseudonym("header:x-api-key", b"secret-key-123", "api");
        assert!(!format!("{p} {p:?}").contains("secret-key-123"));
    }
}
