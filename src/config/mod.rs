//! Configuration: the YAML users write, turned into types that cannot be wrong.
//!
//! `raw` mirrors the YAML with serde (unknown keys rejected), `env` replaces
//! `${NAME}`, `locate` maps key paths to file positions, and `validate` turns
//! the raw tree into [`Config`], collecting every error with its file, line,
//! column and key path before anything listens. `describe` renders the
//! route table `sluice check` prints.
//!
//! A [`Config`] has two parts by lifetime: [`Boot`] (`boot`), what only a
//! restart can change, and [`Live`] (`live`), what a reload applies.

mod boot;
mod describe;
mod env;
mod error;
pub mod keys;
mod live;
pub(crate) mod locate;
pub(crate) mod raw;
pub(crate) mod validate;

pub use boot::{
    Boot, Http2, MemoryStore, ProxyProtocol, RedisStore, RequestHeads, Scripts, ServerBoot,
    StoreBoot, StoreKind, Tls, Topology, UpstreamBoot,
};
pub use error::{ConfigError, ConfigErrors};
pub use live::{
    Identity, Live, MinUploadRate, OnFailure, RequestBuffering, Responses, ServerLive, StoreLive,
    Underscores, UpstreamLive,
};

use std::path::{Path, PathBuf};

/// A whole, valid configuration, in its two lifetimes.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was read from (for logs and reload).
    pub source: PathBuf,
    /// Fixed at start: a reload that changes it is warned about and not
    /// applied.
    pub boot: Boot,
    /// Applied by a reload.
    pub live: Live,
}

/// A secret value from the configuration. Its Debug never shows it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Config {
    /// Reads, substitutes, parses and validates `path`. Every error found is
    /// returned at once, each naming file, line, column and key path.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigErrors::single(ConfigError::io(path, &e)))?;
        Config::parse(path, &text)
    }

    /// As [`Config::load`], with every variable the environment does not
    /// set filled by a placeholder (`sluice check --allow-unset`: CI that
    /// checks a configuration without its secrets). Returns each variable
    /// filled, with its placeholder.
    pub fn load_allowing_unset(
        path: &Path,
    ) -> Result<(Config, Vec<(String, String)>), ConfigErrors> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigErrors::single(ConfigError::io(path, &e)))?;
        let from_process = |name: &str| std::env::var(name);
        // A file that is not YAML fails in the parse below, with its position.
        let filled = serde_yaml::from_str::<serde_yaml::Value>(&text)
            .map(|root| env::placeholders(&root, &locate::KeyPath::root(), &from_process))
            .unwrap_or_default();
        let lookup = |name: &str| match std::env::var(name) {
            Err(std::env::VarError::NotPresent) => filled
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, p)| p.clone())
                .ok_or(std::env::VarError::NotPresent),
            other => other,
        };
        let config = validate::parse_with_env(path, &text, &lookup)?;
        Ok((config, filled))
    }

    /// As [`Config::load`], from text already read (`path` names it in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigErrors> {
        validate::parse(path, text)
    }

    /// As [`Config::parse`], with `${NAME}` looked up by `lookup` instead of
    /// the process environment (tests; embedding).
    pub fn parse_with_env(
        path: &Path,
        text: &str,
        lookup: &dyn Fn(&str) -> Result<String, std::env::VarError>,
    ) -> Result<Config, ConfigErrors> {
        validate::parse_with_env(path, text, lookup)
    }

    /// The table `sluice check` prints: one aligned line per route, the
    /// default last, with its match, subjects, policy, limits, cost, shadow
    /// and revision.
    pub fn route_table(&self) -> String {
        describe::route_table(self)
    }

    /// What `sluice check` prints after the table: the client addresses
    /// each route denies, and exempts from which limit.
    pub fn address_notes(&self) -> String {
        describe::address_notes(self)
    }

    /// What `sluice check` prints after the table: for each counting
    /// policy, which changes start its counts afresh.
    pub fn count_notes(&self) -> String {
        describe::count_notes(self)
    }

    /// What `sluice check` prints of custom refusals and unannounced
    /// policies; empty when there are none.
    pub fn answer_notes(&self) -> String {
        describe::answer_notes(self)
    }

    /// The warnings `sluice check` prints: tiers that believe no one,
    /// tokens checked for no audience or issuer.
    pub fn tier_warnings(&self) -> String {
        describe::tier_warnings(self)
    }
}

#[cfg(test)]
mod address_tests;
#[cfg(test)]
mod answers_tests;
#[cfg(test)]
mod buffering_tests;
#[cfg(test)]
mod conditions_tests;
#[cfg(test)]
mod fallback_tests;
#[cfg(test)]
mod identity_tests;
#[cfg(test)]
mod response_tests;
#[cfg(test)]
mod tests;

/// The `Upgrade` protocols a route passes when it names none.
pub const DEFAULT_UPGRADES: [&str; 1] = ["websocket"];
