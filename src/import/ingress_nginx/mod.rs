//! `sluice import ingress-nginx FILE…`: Ingress manifests
//! (`networking.k8s.io/v1`) in, a sluice configuration (YAML, with
//! comments) out.
//!
//! The mapping, per Ingress:
//!
//! - `limit-rps` / `limit-rpm`: a GCRA policy of that rate per client
//!   address. ingress-nginx writes `limit_req … burst=B nodelay` with
//!   `B = rate × limit-burst-multiplier` (default 5); nginx then admits
//!   `B + 1` requests at once (the request served and `B` beyond it), and
//!   a GCRA `burst` counts every request admitted at once: `burst: B + 1`.
//! - `limit-connections`: a concurrency policy. ingress-nginx counted
//!   connections per client address in each controller replica; sluice
//!   counts requests in flight per client address in each sidecar.
//! - `limit-allowlist` (or its older name `limit-whitelist`): the
//!   route's `exempt` (ingress-nginx exempted those addresses from every
//!   limit of the Ingress).
//! - one route per path of each rule: `Exact` → `path`, `Prefix` →
//!   `path_prefix`, `ImplementationSpecific` → `path_prefix` (with a
//!   comment); the default backend → a route for any path, last.
//!   Routes are ordered as nginx picks locations: exact paths first, then
//!   the longest prefix first, since sluice takes the first route that
//!   matches.
//! - hosts: `match.hosts` of each rule's routes, ordered as nginx picks
//!   servers (a named host, a wildcard, then any host).
//! - every other `nginx.ingress.kubernetes.io/` annotation: a
//!   `# sluice import: not carried over: …` comment.

mod annotations;
mod names;
mod read;
mod write;

#[cfg(test)]
mod tests;

pub use read::{LoadError, ANNOTATION_PREFIX};

/// The configuration for the Ingresses in `files` (each a name for
/// messages and its text), or the first file that cannot be read as
/// Kubernetes objects.
pub fn import(files: &[(String, String)]) -> Result<String, LoadError> {
    let mut ingresses = Vec::new();
    let mut skipped = Vec::new();
    for (name, text) in files {
        let found = read::load(name, text)?;
        ingresses.extend(found.ingresses);
        skipped.extend(found.skipped);
    }
    let names: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
    Ok(write::configuration(&names, &ingresses, &skipped))
}
