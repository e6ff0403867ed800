//! `policies:`: algorithm, bands, shadow and revision of each named policy.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use serde_yaml::Value;
use sha2::{Digest, Sha256};

use super::check::{self, Checker};
use crate::config::env::key_text;
use crate::config::locate::{At, KeyPath};
use crate::config::raw::{self, Params};
use crate::limit::{Algorithm, Bands, BucketBand, GcraBand, Policy, WindowBand};

/// Every policy the file names, valid or not.
#[derive(Debug, Default)]
pub struct Policies {
    /// The valid ones, in file order.
    pub valid: Vec<Arc<Policy>>,
    /// Every name under `policies:`, in file order.
    pub declared: Vec<String>,
}

pub enum Found<'p> {
    Valid(&'p Arc<Policy>),
    /// Declared but invalid: already reported, nothing more to say.
    Invalid,
    Unknown,
}

impl Policies {
    pub fn find(&self, name: &str) -> Found<'_> {
        if let Some(p) = self.valid.iter().find(|p| &*p.name == name) {
            Found::Valid(p)
        } else if self.declared.iter().any(|d| d == name) {
            Found::Invalid
        } else {
            Found::Unknown
        }
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

pub fn policies(cx: &mut Checker<'_>, path: &KeyPath, value: Option<Value>) -> Policies {
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
        if let Some(policy) = policy(cx, &at, &name, raw) {
            if valid_name {
                out.valid.push(Arc::new(policy));
            }
        }
    }
    out
}

fn algorithm(s: &str) -> Result<Algorithm, String> {
    ALGORITHMS
        .into_iter()
        .find(|a| a.name() == s)
        .ok_or_else(|| {
            let names: Vec<&str> = ALGORITHMS.iter().map(|a| a.name()).collect();
            format!(
                "unknown algorithm `{s}`; expected one of {}",
                names.join(", ")
            )
        })
}

const ALGORITHMS: [Algorithm; 5] = [
    Algorithm::FixedWindow,
    Algorithm::SlidingCounter,
    Algorithm::SlidingLog,
    Algorithm::TokenBucket,
    Algorithm::Gcra,
];

/// The parameters each algorithm takes, in the order the docs list them.
fn parameters(a: Algorithm) -> &'static [&'static str] {
    match a {
        Algorithm::FixedWindow | Algorithm::SlidingCounter | Algorithm::SlidingLog => {
            &["limit", "window"]
        }
        Algorithm::TokenBucket => &["capacity", "refill_tokens", "refill_every"],
        Algorithm::Gcra => &["limit", "window", "burst"],
    }
}

fn policy(cx: &mut Checker<'_>, path: &KeyPath, name: &str, raw: raw::Policy) -> Option<Policy> {
    let algorithm = cx.required(&path.key("algorithm"), raw.algorithm.as_ref(), algorithm);
    let shadow = cx.optional(
        &path.key("shadow"),
        raw.shadow.as_ref(),
        false,
        check::boolean,
    );
    let revision = match &raw.revision {
        None => Some(None),
        Some(s) => cx.value(&path.key("revision"), s, check::name).map(Some),
    };
    let flat = raw.flat();
    let bands = match (&raw.bands, algorithm) {
        (_, None) => None,
        (None, Some(a)) => band(cx, path, a, &flat).map(|b| vec![b]),
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
            let mut out = Vec::with_capacity(list.len());
            for (i, params) in list.iter().enumerate() {
                if let Some(b) = band(cx, &bands_path.index(i), a, params) {
                    out.push(b);
                }
            }
            (out.len() == list.len() && !out.is_empty()).then_some(out)
        }
    };
    let bands = collect(algorithm?, bands?)?;
    let revision = match revision? {
        Some(explicit) => explicit,
        None => derived_revision(&bands),
    };
    Some(Policy::new(name, revision, bands, shadow?))
}

enum Band {
    Window(WindowBand),
    Bucket(BucketBand),
    Gcra(GcraBand),
}

/// One band's parameters, checked against `a`; `path` is the policy itself
/// for flat parameters, `bands[i]` otherwise.
fn band(cx: &mut Checker<'_>, path: &KeyPath, a: Algorithm, p: &Params) -> Option<Band> {
    let allowed = parameters(a);
    let mut foreign = false;
    for (key, _) in p.written() {
        if !allowed.contains(&key) {
            foreign = true;
            cx.error(
                &path.key(key),
                At::Key,
                format!(
                    "`{key}` is not a parameter of {}; it takes {}",
                    a.name(),
                    allowed.join(", ")
                ),
            );
        }
    }
    let band = match a {
        Algorithm::FixedWindow | Algorithm::SlidingCounter | Algorithm::SlidingLog => {
            let limit = cx.required(&path.key("limit"), p.limit.as_ref(), positive);
            let window = cx.required(&path.key("window"), p.window.as_ref(), check::window);
            let (limit, window) = (limit?, window?);
            if a == Algorithm::SlidingCounter {
                sliding_counter_exact(cx, &path.key("limit"), limit, window)?;
            }
            Band::Window(WindowBand { limit, window })
        }
        Algorithm::TokenBucket => {
            let capacity = cx.required(&path.key("capacity"), p.capacity.as_ref(), positive);
            let refill_tokens = cx.optional(
                &path.key("refill_tokens"),
                p.refill_tokens.as_ref(),
                NonZeroU32::MIN,
                positive,
            );
            let refill_every = cx.required(
                &path.key("refill_every"),
                p.refill_every.as_ref(),
                check::window,
            );
            let band = BucketBand {
                capacity: capacity?,
                refill_tokens: refill_tokens?,
                refill_every: refill_every?,
            };
            let product = u128::from(band.capacity.get()) * band.refill_every.as_micros();
            exact_in_lua(
                cx,
                &path.key("capacity"),
                product,
                "capacity × refill_every",
            )?;
            Band::Bucket(band)
        }
        Algorithm::Gcra => {
            let limit = cx.required(&path.key("limit"), p.limit.as_ref(), positive);
            let window = cx.required(&path.key("window"), p.window.as_ref(), check::window);
            let limit = limit?;
            let burst = cx.optional(&path.key("burst"), p.burst.as_ref(), limit, positive);
            let band = GcraBand {
                limit,
                window: window?,
                burst: burst?,
            };
            let product = u128::from(band.burst.get()) * u128::from(band.emission_interval_us());
            exact_in_lua(cx, &path.key("burst"), product, "burst × window / limit")?;
            Band::Gcra(band)
        }
    };
    (!foreign).then_some(band)
}

fn positive(s: &str) -> Result<NonZeroU32, String> {
    let n = check::number_u32(1)(s)?;
    NonZeroU32::new(n).ok_or_else(|| "must be at least 1".to_owned())
}

/// The sliding counter weighs `limit × window_ms` products; past 2^53 the
/// doubles Lua computes with are no longer exact.
fn sliding_counter_exact(
    cx: &mut Checker<'_>,
    path: &KeyPath,
    limit: NonZeroU32,
    window: Duration,
) -> Option<()> {
    let product = u128::from(limit.get()) * window.as_millis();
    if product >= 1 << 53 {
        cx.error(
            path,
            At::Value,
            "limit × window in milliseconds must stay below 2^53 for sliding-counter",
        );
        return None;
    }
    Some(())
}

/// The Redis scripts compute in doubles, exact up to 2^53: a band whose
/// time arithmetic could pass it is refused here rather than by the script
/// at run time.
fn exact_in_lua(cx: &mut Checker<'_>, path: &KeyPath, product_us: u128, what: &str) -> Option<()> {
    if product_us >= 1 << 53 {
        cx.error(
            path,
            At::Value,
            format!("{what} in microseconds must stay below 2^53 (about 285 years)"),
        );
        return None;
    }
    Some(())
}

fn collect(a: Algorithm, bands: Vec<Band>) -> Option<Bands> {
    fn each<T>(bands: Vec<Band>, pick: fn(Band) -> Option<T>) -> Option<Vec<T>> {
        bands.into_iter().map(pick).collect()
    }
    let window = |b| match b {
        Band::Window(w) => Some(w),
        _ => None,
    };
    Some(match a {
        Algorithm::FixedWindow => Bands::FixedWindow(each(bands, window)?),
        Algorithm::SlidingCounter => Bands::SlidingCounter(each(bands, window)?),
        Algorithm::SlidingLog => Bands::SlidingLog(each(bands, window)?),
        Algorithm::TokenBucket => Bands::TokenBucket(each(bands, |b| match b {
            Band::Bucket(b) => Some(b),
            _ => None,
        })?),
        Algorithm::Gcra => Bands::Gcra(each(bands, |b| match b {
            Band::Gcra(b) => Some(b),
            _ => None,
        })?),
    })
}

/// A short digest of everything that changes what a counter means: the
/// algorithm and each band's parameters in order (defaults resolved, so
/// writing a default out changes nothing). `shadow` is left out on purpose:
/// turning enforcement on must keep the counters shadow mode built up.
pub fn derived_revision(bands: &Bands) -> String {
    let mut canonical = format!("v1;{}", bands.algorithm().name());
    match bands {
        Bands::FixedWindow(b) | Bands::SlidingCounter(b) | Bands::SlidingLog(b) => {
            for b in b {
                canonical += &format!(";limit={},window_ms={}", b.limit, b.window.as_millis());
            }
        }
        Bands::TokenBucket(b) => {
            for b in b {
                canonical += &format!(
                    ";capacity={},refill_tokens={},refill_every_ms={}",
                    b.capacity,
                    b.refill_tokens,
                    b.refill_every.as_millis()
                );
            }
        }
        Bands::Gcra(b) => {
            for b in b {
                canonical += &format!(
                    ";limit={},window_ms={},burst={}",
                    b.limit,
                    b.window.as_millis(),
                    b.burst
                );
            }
        }
    }
    let digest = Sha256::digest(canonical.as_bytes());
    digest[..6].iter().map(|b| format!("{b:02x}")).collect()
}
