//! Where a subject's entry goes in the sidecar's own books (the memory
//! store, the over-limit cache, the leases, the requests in flight): its
//! shard and its bucket, from the pseudonym alone.
//!
//! A pseudonym is an HMAC-SHA256 digest under the pseudonym key: its bytes
//! are already uniform, and no client can choose them without that key.
//! Hashing them again with SipHash cost about 270 instructions a decision;
//! [`spread`] folds the digest with two multiplications under keys drawn
//! once per process, so that even a client who knew the pseudonym key
//! could not aim its subjects at one shard or one bucket.

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::LazyLock;

/// Drawn at start; never leaves the process.
static KEYS: LazyLock<[u64; 4]> = LazyLock::new(rand::random);

/// A subject's place: 64 bits of its digest, folded under [`KEYS`]. The
/// few keys of one subject (a route's several limits, a policy after a
/// reload) share it and are told apart by `Eq`.
pub fn spread(digest: &[u8; 32]) -> u64 {
    let keys = &*KEYS;
    let word = |i: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[i * 8..i * 8 + 8]);
        u64::from_le_bytes(bytes) ^ keys[i]
    };
    fold(word(0), word(1)) ^ fold(word(2), word(3))
}

/// The two halves of the full product, folded together (the step of
/// foldhash and wyhash).
fn fold(a: u64, b: u64) -> u64 {
    let product = u128::from(a) * u128::from(b);
    (product as u64) ^ ((product >> 64) as u64)
}

/// Which of `shards` a place falls in: bits 32 and up. A map inside a
/// shard indexes by the low bits and tags by the top seven, so the shard
/// must come from neither, or every key of a shard would crowd the same
/// buckets.
pub fn shard_of(place: u64, shards: usize) -> usize {
    ((place >> 32) as usize) % shards
}

/// Hands a key's [`spread`], written with `write_u64`, to a map as its
/// hash, unchanged.
#[derive(Default)]
pub struct Precomputed(u64);

pub type BuildPrecomputed = BuildHasherDefault<Precomputed>;

impl Hasher for Precomputed {
    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is ever called (the keys' `Hash`); this keeps
        // the hasher correct for anything else all the same (FxHash step).
        for byte in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(*byte)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_that_differ_in_any_word_spread_apart_and_over_every_shard() {
        let base = [7u8; 32];
        let mut seen = std::collections::HashSet::new();
        let mut shards = [0usize; 16];
        for word in 0..4 {
            for n in 0..256u32 {
                let mut digest = base;
                digest[word * 8..word * 8 + 4].copy_from_slice(&n.to_le_bytes());
                let place = spread(&digest);
                seen.insert(place);
                shards[shard_of(place, 16)] += 1;
            }
        }
        // 1,024 digests (none of them `base`), 1,024 places.
        assert_eq!(seen.len(), 4 * 256);
        assert!(shards.iter().all(|&n| n > 20), "{shards:?}");
        assert_eq!(spread(&base), spread(&base));
    }
}
