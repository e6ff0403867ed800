//! Which configuration serves: a revision number and a content hash,
//! exported as `sluice_config_revision` and `sluice_config_info`.
//!
//! Here rather than in telemetry: the hash is of a [`Config`], and it
//! moves exactly when a configuration is swapped in, at start or on reload.

use std::sync::Mutex;

use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::sync;
use crate::telemetry::{CONFIG_INFO, CONFIG_RELOADS, CONFIG_REVISION};

/// The hash labelling the info gauge now at 1.
static SERVING: Mutex<Option<String>> = Mutex::new(None);

/// Records that `config` now serves: bumps the revision and moves the info
/// gauge to its hash.
pub fn loaded(config: &Config) {
    // Both results there at 0 from the first configuration on: a
    // dashboard's `increase()` then shows the first failed reload.
    for result in RESULTS {
        metrics::counter!(CONFIG_RELOADS, "result" => result).increment(0);
    }
    let hash = digest(config);
    let mut serving = sync::lock(&SERVING);
    if let Some(old) = serving.replace(hash.clone()) {
        metrics::gauge!(CONFIG_INFO, "hash" => old).set(0.0);
    }
    metrics::gauge!(CONFIG_INFO, "hash" => hash).set(1.0);
    metrics::gauge!(CONFIG_REVISION).increment(1.0);
}

/// The results a reload is counted under.
pub const RESULTS: [&str; 2] = ["success", "failure"];

/// Counts a reload attempt by `result` (`success`, `failure`). A reload is
/// rare: the registry lookup costs nothing that matters.
pub fn counted(result: &'static str) {
    metrics::counter!(CONFIG_RELOADS, "result" => result).increment(1);
}

/// Twelve hex digits of the SHA-256 of the validated configuration (its
/// `Debug`, secrets redacted): the same file gives the same hash, and a
/// label shows no secret.
fn digest(config: &Config) -> String {
    let digest = Sha256::digest(format!("{config:?}").as_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}
