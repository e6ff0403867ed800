//! Tokens already verified, by the SHA-256 of their bytes: a client sends
//! the same token with every request until it expires, and checking its
//! signature again would cost more than the rest of the request (an
//! RS256 check, 70 µs; ES256, 160 µs; `bench/results/tokens.md`).
//!
//! Only tokens that checked out are kept, so a flood of forged tokens
//! fills nothing; each is kept until its `exp` (plus the leeway) passes,
//! and the set belongs to one [`super::Verifier`], so a reload with other
//! keys starts it empty. The same bytes always verify the same way under
//! the same keys; only time can change the answer, and `exp` is checked
//! again on every use (`nbf` only becomes truer).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};

use crate::sync::lock;

/// About 1 KB each (the claims, the digest): a few MB at most.
const CAPACITY: usize = 4096;

pub type Claims = Arc<Map<String, Value>>;

#[derive(Default)]
pub struct Verified {
    entries: Mutex<HashMap<[u8; 32], (Claims, u64)>>,
}

/// What a token's bytes are remembered by.
pub fn digest(token: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0u8; 32];
    // SHA-256 digests are 32 bytes.
    out.copy_from_slice(d.as_ref());
    out
}

impl Verified {
    /// The claims of the token of `digest`, verified before and not
    /// expired at `now` (seconds since the epoch) with `leeway`. `Err` for
    /// one that has expired since (and is forgotten).
    pub fn get(&self, digest: &[u8; 32], now: u64, leeway: u64) -> Option<Result<Claims, ()>> {
        let mut entries = lock(&self.entries);
        let (claims, exp) = entries.get(digest)?;
        if now > exp.saturating_add(leeway) {
            entries.remove(digest);
            return Some(Err(()));
        }
        Some(Ok(claims.clone()))
    }

    /// Remembers a token that checked out, whose `exp` is `exp`. A full
    /// set first drops what has expired, then everything: a burst of new
    /// tokens costs their checks again, never memory.
    pub fn put(&self, digest: [u8; 32], claims: Claims, exp: u64, now: u64, leeway: u64) {
        let mut entries = lock(&self.entries);
        if entries.len() >= CAPACITY {
            entries.retain(|_, (_, exp)| now <= exp.saturating_add(leeway));
            if entries.len() >= CAPACITY {
                entries.clear();
            }
        }
        entries.insert(digest, (claims, exp));
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        lock(&self.entries).len()
    }
}
