//! How the memory store names an entry, and hashes the name once.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::subject::Pseudonym;

/// (policy name, revision, pseudonym): a changed policy never mixes counters.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Key {
    /// Computed once per request from the pseudonym, and used for both the
    /// shard and the map: hashing the names and the digest twice was a
    /// visible part of every decision. The pseudonym already names the
    /// route; the few keys that differ only in policy or revision (a
    /// route's several limits on one subject, a policy after a reload)
    /// share a hash and are told apart by `Eq`.
    pub(super) hash: u64,
    pub(super) policy: Arc<str>,
    pub(super) revision: Arc<str>,
    pub(super) subject: Pseudonym,
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// Hands the precomputed [`Key::hash`] to the map unchanged. It was made
/// with a randomly keyed SipHash, so clients cannot aim collisions at it.
#[derive(Default)]
pub(super) struct Precomputed(u64);

impl Hasher for Precomputed {
    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is ever called (see `Key`'s `Hash`); this keeps
        // the hasher correct for anything else all the same (FxHash step).
        for byte in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(*byte)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}
