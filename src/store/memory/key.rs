//! How the memory store names an entry, and hashes the name once.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use crate::subject::Pseudonym;

/// (policy name, revision, pseudonym): a changed policy never mixes counters.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Key {
    /// Computed once per request from the pseudonym
    /// ([`spread`](crate::store::spread)), and used for both the shard and
    /// the map: hashing the names and the digest twice was a
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
