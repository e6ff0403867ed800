//! `policies:`: algorithm, bands, shadow and revision of each named policy;
//! `limit` and `retry_after` of a concurrency policy.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use serde_yaml::Value;
use sha2::{Digest, Sha256};

use super::check::{self, Checker};
use crate::config::env::key_text;
use crate::config::keys;
use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, Params, Scalar};
use crate::limit::{Algorithm, Bands, Concurrency, DelayTerms, LeaseTerms, LimitPolicy, Policy};

/// The name of the one algorithm that is not a rate: requests in flight.
const CONCURRENCY: &str = "concurrency";

/// Every policy the file names, valid or not.
#[derive(Debug, Default)]
pub struct Policies {
    /// The valid ones, in file order.
    pub valid: Vec<LimitPolicy>,
    /// Every name under `policies:`, in file order.
    pub declared: Vec<String>,
}

pub enum Found<'p> {
    Valid(&'p LimitPolicy),
    /// Declared but invalid: already reported, nothing more to say.
    Invalid,
    Unknown,
}

impl Policies {
    pub fn find(&self, name: &str) -> Found<'_> {
        if let Some(p) = self.valid.iter().find(|p| &**p.name() == name) {
            Found::Valid(p)
        } else if self.declared.iter().any(|d| d == name) {
            Found::Invalid
        } else {
            Found::Unknown
        }
    }

    /// The rate policies, which stores evaluate, in file order.
    pub fn rates(&self) -> Vec<Arc<Policy>> {
        self.valid
            .iter()
            .filter_map(LimitPolicy::as_rate)
            .cloned()
            .collect()
    }

    /// For an error message: what a route may name instead.
    pub fn known(&self) -> String {
        if self.declared.is_empty() {
            "no policies are defined; `none` forwards without limiting".to_owned()
        } else {
            format!("defined: {}, or `none`", self.declared.join(", "))
        }
    }
}

/// `lease: auto` (the default) leases a policy that can be leased, on a
/// Redis store, for this `ttl`: at most half `store.dedupe_window`. `None`
/// on the memory store (or a store section already reported broken).
#[derive(Debug, Clone, Copy)]
pub struct AutoLease(pub Option<Duration>);

pub fn policies(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    value: Option<Value>,
    auto: AutoLease,
) -> Policies {
    let mut out = Policies::default();
    let entries = match value {
        None | Some(Value::Null) => return out,
        Some(Value::Mapping(m)) => m,
        Some(_) => {
            cx.error(
                path,
                At::Value,
                "expected a mapping of policy names to policies",
            );
            return out;
        }
    };
    for (key, value) in entries {
        let name = key_text(&key);
        let at = path.key(&name);
        let mut valid_name = true;
        if let Err(message) = check::name(&name) {
            cx.error(&at, At::Key, message);
            valid_name = false;
        } else if name == "none" {
            cx.error(
                &at,
                At::Key,
                "`none` is reserved: `policy: none` means no limit",
            );
            valid_name = false;
        }
        out.declared.push(name.clone());
        let Some(raw) = cx.shape::<raw::Policy>(&at, Some(value)) else {
            continue;
        };
        let is_concurrency = raw.algorithm.as_ref().is_some_and(|a| a.0 == CONCURRENCY);
        let policy = if is_concurrency {
            concurrency(cx, &at, &name, raw).map(|c| LimitPolicy::Concurrency(Arc::new(c)))
        } else {
            policy(cx, &at, &name, raw, auto).map(|p| LimitPolicy::Rate(Arc::new(p)))
        };
        if let Some(policy) = policy {
            if valid_name {
                out.valid.push(policy);
            }
        }
    }
    out
}

fn algorithm(s: &str) -> Result<Algorithm, String> {
    Algorithm::from_name(s).ok_or_else(|| {
        let mut names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        names.push(CONCURRENCY);
        format!(
            "unknown algorithm `{s}`; expected one of {}",
            names.join(", ")
        )
    })
}

fn policy(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    name: &str,
    raw: raw::Policy,
    auto: AutoLease,
) -> Option<Policy> {
    let algorithm = cx.required(&path.key("algorithm"), raw.algorithm.as_ref(), algorithm);
    let shadow = cx.defaulted(
        path,
        &keys::POLICY_SHADOW,
        raw.shadow.as_ref(),
        check::boolean,
    );
    let revision = match &raw.revision {
        None => Some(None),
        Some(s) => cx.value(&path.key("revision"), s, check::name).map(Some),
    };
    if raw.retry_after.is_some() {
        cx.error(
            &path.key("retry_after"),
            At::Key,
            "`retry_after` is a parameter of concurrency only; a rate policy's 429 says when its quota returns",
        );
    }
    let on_failure = match &raw.on_failure {
        None => Some(None),
        Some(s) => cx
            .value(&path.key("on_failure"), s, super::sections::on_failure)
            .map(Some),
    };
    let lease = lease(cx, path, raw.lease.clone());
    let near_limit = cx.defaulted(
        path,
        &keys::POLICY_NEAR_LIMIT,
        raw.near_limit.as_ref(),
        check::percent,
    );
    let flat = raw.flat();
    let bands = match (&raw.bands, algorithm) {
        (_, None) => None,
        (None, Some(a)) => a.bands(&mut Written::new(cx, &[(path.clone(), &flat)])),
        (Some(list), Some(a)) => {
            let bands_path = path.key("bands");
            for (key, _) in flat.written() {
                cx.error(
                    &path.key(key),
                    At::Key,
                    format!("`{key}` is written beside `bands`; move it into each band"),
                );
            }
            if list.is_empty() {
                cx.error(&bands_path, At::Value, "needs at least one band");
            }
            let list: Vec<(KeyPath, &Params)> = list
                .iter()
                .enumerate()
                .map(|(i, params)| (bands_path.index(i), params))
                .collect();
            a.bands(&mut Written::new(cx, &list))
        }
    };
    let bands = bands?;
    let revision = match revision? {
        Some(explicit) => explicit,
        None => derived_revision(&bands),
    };
    let headers = cx.defaulted(
        path,
        &keys::POLICY_HEADERS,
        raw.headers.as_ref(),
        check::on_off,
    );
    let policy = Policy::new(name, revision, bands, shadow?)
        .with_on_failure(on_failure?)
        .with_near_limit(near_limit?)
        .with_headers(headers?);
    let lease = match lease? {
        Lease::Written(terms) => {
            if let Some(why) = policy.lease_refused() {
                cx.error(&path.key("lease"), At::Key, why);
                return None;
            }
            Some(terms)
        }
        Lease::Off => None,
        // Only where a lease can be exact and nothing excludes it; a
        // `delay` takes its turn in the store, request by request.
        Lease::Auto => match auto.0 {
            Some(longest)
                if policy.lease_refused().is_none() && !policy.shadow && raw.delay.is_none() =>
            {
                // The written terms' defaults, from the one table of keys.
                let at = path.key("lease");
                let ttl =
                    cx.defaulted(&at, &keys::POLICY_LEASE_TTL, None, check::positive_duration)?;
                let max_share =
                    cx.defaulted(&at, &keys::POLICY_LEASE_MAX_SHARE, None, check::percent)?;
                // A quota whose share never reaches one unit is never
                // granted a lease (a login's 5 tries): it stays unleased,
                // and its denials are remembered as long as they hold.
                let whole = u64::from(policy.max_cost()) * u64::from(max_share) / 100;
                (whole >= 1).then_some(LeaseTerms {
                    ttl: ttl.min(longest),
                    max_share,
                    auto: true,
                })
            }
            _ => None,
        },
    };
    let policy = policy.with_lease(lease);
    let Some(raw_delay) = raw.delay else {
        return Some(policy);
    };
    let at = path.key("delay");
    let terms = delay(cx, &at, raw_delay)?;
    if policy.lease.is_some() {
        cx.error(
            &at,
            At::Key,
            "`delay` and `lease` exclude each other: a turn is taken in the store, request by request",
        );
        return None;
    }
    if policy.shadow {
        cx.error(
            &at,
            At::Key,
            "a shadow policy never holds a request back: `delay` would only slow it",
        );
        return None;
    }
    let algorithm = policy.algorithm().name();
    match policy.with_delay(terms) {
        Some(policy) => Some(policy),
        None => {
            cx.error(
                &at,
                At::Key,
                format!("`delay` is for gcra and token-bucket, whose state can take a turn ahead; not for {algorithm}, whose count cannot be charged to a later window"),
            );
            None
        }
    }
}

/// `delay: { max_wait, max_queued }`.
fn delay(cx: &mut Checker<'_>, at: &KeyPath, raw: raw::Delay) -> Option<DelayTerms> {
    let max_wait = cx.required(&at.key("max_wait"), raw.max_wait.as_ref(), |s| {
        let d = check::positive_duration(s)?;
        if d > std::time::Duration::from_secs(60) {
            return Err("at most 1m: a longer wait holds the client past most timeouts".to_owned());
        }
        Ok(d)
    });
    let max_queued = cx.defaulted(
        at,
        &keys::POLICY_DELAY_MAX_QUEUED,
        raw.max_queued.as_ref(),
        check::number_u32(1),
    );
    Some(DelayTerms {
        max_wait: max_wait?,
        max_queued: max_queued?,
    })
}

/// What `lease:` says, before the policy it is in is known.
enum Lease {
    /// `auto`, or absent: leased where it can be (see [`AutoLease`]).
    Auto,
    Off,
    /// `on` (every term its default) or `{ ttl, max_share }`: leased, or
    /// an error where it cannot be.
    Written(LeaseTerms),
}

/// `lease:` `auto` (or absent), `off`, `on`, or `{ ttl, max_share }`.
fn lease(cx: &mut Checker<'_>, path: &KeyPath, value: Option<Value>) -> Option<Lease> {
    let at = path.key("lease");
    let raw = match value {
        None | Some(Value::Null) => return Some(Lease::Auto),
        Some(Value::String(word)) if word == "auto" => return Some(Lease::Auto),
        Some(Value::String(word)) if word == "off" => return Some(Lease::Off),
        Some(Value::String(word)) if word == "on" => raw::Lease::default(),
        Some(Value::Bool(_)) | Some(Value::String(_)) => {
            cx.error(
                &at,
                At::Value,
                "expected `auto`, `on`, `off` or `{ ttl, max_share }`",
            );
            return None;
        }
        Some(v) => cx.shape::<raw::Lease>(&at, Some(v))?,
    };
    let ttl = cx.defaulted(
        &at,
        &keys::POLICY_LEASE_TTL,
        raw.ttl.as_ref(),
        check::positive_duration,
    );
    let max_share = cx.defaulted(
        &at,
        &keys::POLICY_LEASE_MAX_SHARE,
        raw.max_share.as_ref(),
        check::percent,
    );
    Some(Lease::Written(LeaseTerms {
        ttl: ttl?,
        max_share: max_share?,
        auto: false,
    }))
}

/// `algorithm: concurrency`: `limit` and an optional `retry_after`, nothing
/// else (no bands, no window: it counts requests in flight, not a rate).
fn concurrency(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    name: &str,
    raw: raw::Policy,
) -> Option<Concurrency> {
    let foreign = [
        ("window", raw.window.is_some()),
        ("capacity", raw.capacity.is_some()),
        ("refill_tokens", raw.refill_tokens.is_some()),
        ("refill_every", raw.refill_every.is_some()),
        ("burst", raw.burst.is_some()),
        ("bands", raw.bands.is_some()),
        ("shadow", raw.shadow.is_some()),
        ("revision", raw.revision.is_some()),
        ("on_failure", raw.on_failure.is_some()),
        ("lease", raw.lease.is_some()),
        ("near_limit", raw.near_limit.is_some()),
        ("delay", raw.delay.is_some()),
    ];
    let mut ok = true;
    for (key, written) in foreign {
        if written {
            ok = false;
            cx.error(
                &path.key(key),
                At::Key,
                format!("`{key}` is not a parameter of concurrency; it takes limit, retry_after, headers"),
            );
        }
    }
    let limit = cx.required(&path.key("limit"), raw.limit.as_ref(), check::positive);
    let retry_after = cx.defaulted(
        path,
        &keys::POLICY_RETRY_AFTER,
        raw.retry_after.as_ref(),
        check::positive_duration,
    );
    let headers = cx.defaulted(
        path,
        &keys::POLICY_HEADERS,
        raw.headers.as_ref(),
        check::on_off,
    );
    let concurrency = Concurrency {
        name: name.into(),
        limit: limit?,
        retry_after: retry_after?,
        announce: headers?,
    };
    ok.then_some(concurrency)
}

/// A short digest of everything that changes what a counter means: the
/// algorithm and, band by band in order, the parameters its algorithm says
/// give the state its meaning (`Spec::RESET_BY`; defaults resolved, so
/// writing a default out changes nothing). A limit raised in an incident
/// keeps every subject's count. `shadow` is left out on purpose: turning
/// enforcement on must keep the counters shadow mode built up.
pub fn derived_revision(bands: &Bands) -> String {
    let mut canonical = format!("v2;{}", bands.algorithm().name());
    for band in bands.profiles() {
        canonical += &band.revision;
    }
    let digest = Sha256::digest(canonical.as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}

/// A policy's bands as written, read by its algorithm
/// ([`crate::limit::algorithm::Params`]): every error placed at the key of
/// the band it concerns (the policy's own, for flat parameters).
struct Written<'c, 'a, 'l, 'p> {
    cx: &'c mut Checker<'a>,
    list: &'l [(KeyPath, &'p Params)],
    at: usize,
}

impl<'c, 'a, 'l, 'p> Written<'c, 'a, 'l, 'p> {
    fn new(cx: &'c mut Checker<'a>, list: &'l [(KeyPath, &'p Params)]) -> Self {
        Written { cx, list, at: 0 }
    }

    /// The selected band's path, and the value written for `name`.
    fn read(&self, name: &str) -> (KeyPath, Option<&'p Scalar>) {
        match self.list.get(self.at) {
            Some((path, params)) => {
                let value = params.written().into_iter().find(|(k, _)| *k == name);
                (path.key(name), value.map(|(_, v)| v))
            }
            None => (KeyPath::root().key(name), None),
        }
    }
}

impl crate::limit::algorithm::Params for Written<'_, '_, '_, '_> {
    fn bands(&self) -> usize {
        self.list.len()
    }

    fn select(&mut self, band: usize) {
        self.at = band;
    }

    fn written(&self) -> Vec<&'static str> {
        self.list
            .get(self.at)
            .map(|(_, params)| params.written().into_iter().map(|(k, _)| k).collect())
            .unwrap_or_default()
    }

    fn count(&mut self, name: &'static str, default: Option<NonZeroU32>) -> Option<NonZeroU32> {
        let (path, value) = self.read(name);
        match default {
            Some(default) => self.cx.optional(&path, value, default, check::positive),
            None => self.cx.required(&path, value, check::positive),
        }
    }

    fn window(&mut self, name: &'static str) -> Option<Duration> {
        let (path, value) = self.read(name);
        self.cx.required(&path, value, check::window)
    }

    fn refuse(&mut self, name: &'static str, message: &str) {
        let (path, _) = self.read(name);
        self.cx.error(&path, At::Value, message);
    }

    fn foreign(&mut self, name: &'static str, message: &str) {
        let (path, _) = self.read(name);
        self.cx.error(&path, At::Key, message);
    }
}

/// `Some(None)` for `policy: none`.
pub(super) fn route_policy(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    raw: Option<&Scalar>,
    policies: &Policies,
) -> Option<Option<LimitPolicy>> {
    let Some(s) = raw else {
        cx.error(
            path,
            At::Key,
            "required key is missing (name a policy, or `none` for no limit)",
        );
        return None;
    };
    if s.0 == "none" {
        return Some(None);
    }
    match policies.find(&s.0) {
        Found::Valid(p) => Some(Some(p.clone())),
        Found::Invalid => None,
        Found::Unknown => {
            cx.error(
                path,
                At::Value,
                format!("unknown policy `{}`; {}", s.0, policies.known()),
            );
            None
        }
    }
}
