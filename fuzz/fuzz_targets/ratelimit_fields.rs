//! `RateLimit-Policy` and `RateLimit` for any policy name, bands and
//! decision: both parse as RFC 8941 lists (with the `sfv` crate, strictly),
//! and say what they were built from.
#![no_main]

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use arbitrary::Arbitrary;
use http::header::HeaderMap;
use libfuzzer_sys::fuzz_target;
use sfv::{BareItem, Integer, ListEntry, Parser, Version};
use sluice::limit::{
    Algorithm, Bands, BucketBand, Decision, GcraBand, LimitPolicy, Policy, WindowBand,
};
use sluice::proxy::respond::{add_ratelimit_headers, Prepared, RATELIMIT, RATELIMIT_POLICY};
use sluice::route::{Limit, Match, Route, SubjectSource};

#[derive(Arbitrary, Debug)]
struct Input {
    name: String,
    algorithm: u8,
    /// Limit and window (nanoseconds, at least a millisecond) per band.
    bands: Vec<(NonZeroU32, u64)>,
    band: usize,
    remaining: u64,
    reset_after: (u64, u32),
    retry_after: (u64, u32),
    allowed: bool,
}

fn bands(input: &Input) -> Option<Bands> {
    let list: Vec<(NonZeroU32, Duration)> = input
        .bands
        .iter()
        .take(8)
        .map(|(limit, nanos)| (*limit, Duration::from_nanos((*nanos).max(1_000_000))))
        .collect();
    if list.is_empty() {
        return None;
    }
    let windows = || {
        list.iter()
            .map(|&(limit, window)| WindowBand { limit, window })
            .collect()
    };
    // Every registered algorithm; the match fails to compile until a new
    // one can be built here.
    let algorithm = Algorithm::ALL[usize::from(input.algorithm) % Algorithm::ALL.len()];
    Some(match algorithm {
        Algorithm::FixedWindow => Bands::FixedWindow(windows()),
        Algorithm::SlidingCounter => Bands::SlidingCounter(windows()),
        Algorithm::SlidingLog => Bands::SlidingLog(windows()),
        Algorithm::TokenBucket => Bands::TokenBucket(
            list.iter()
                .map(|&(limit, window)| BucketBand {
                    capacity: limit,
                    refill_tokens: limit,
                    refill_every: window,
                    max_wait_us: 0,
                })
                .collect(),
        ),
        Algorithm::Gcra => Bands::Gcra(
            list.iter()
                .map(|&(limit, window)| GcraBand {
                    limit,
                    window,
                    burst: limit,
                    max_wait_us: 0,
                })
                .collect(),
        ),
    })
}

/// The member name the draft asks for: the policy's name as an sf-string
/// (anything outside printable ASCII replaced), `-<i>` with several bands.
fn member(name: &str, band: usize, bands: usize) -> String {
    let printable: String = name
        .chars()
        .map(|c| if (' '..='~').contains(&c) { c } else { '_' })
        .collect();
    if bands > 1 {
        format!("{printable}-{band}")
    } else {
        printable
    }
}

/// `value` as an RFC 8941 list of `expected.len()` string items named as
/// expected, each with exactly the integer parameters `params`.
fn check_list(field: &str, value: &[u8], expected: &[(String, Vec<(&str, u64)>)]) {
    let list: sfv::List = Parser::new(value)
        .with_version(Version::Rfc8941)
        .parse()
        .unwrap_or_else(|e| {
            panic!(
                "{field}: {:?} is no RFC 8941 list: {e}",
                String::from_utf8_lossy(value)
            )
        });
    assert_eq!(list.len(), expected.len(), "{field}: {list:?}");
    for (entry, (name, params)) in list.iter().zip(expected) {
        let ListEntry::Item(item) = entry else {
            panic!("{field}: an inner list {entry:?}");
        };
        let BareItem::String(s) = &item.bare_item else {
            panic!("{field}: not a string {item:?}");
        };
        assert_eq!(s.as_str(), name, "{field}");
        let got: Vec<(&str, Option<Integer>)> = item
            .params
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_integer()))
            .collect();
        let want: Vec<(&str, Option<Integer>)> = params
            .iter()
            .map(|(k, v)| (*k, Integer::try_from(sf_integer(*v)).ok()))
            .collect();
        assert_eq!(got, want, "{field}: {:?}", String::from_utf8_lossy(value));
    }
}

/// RFC 8941 §3.3.1: at most 15 digits; larger numbers are announced as
/// the largest.
fn sf_integer(n: u64) -> u64 {
    n.min(999_999_999_999_999)
}

fn ceil_secs(d: Duration) -> u64 {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// An admitted request's `t`, draft-11's effective window: when the
/// binding band's available quota next grows. A fixed window's or a sliding
/// log's `reset_after`; for the others, the part of `reset_after` up to its
/// next refill period (token bucket), emission interval (GCRA) or window
/// end (sliding counter), the whole step when nothing is held.
fn effective_secs(bands: &Bands, band: usize, reset_after: Duration) -> u64 {
    let step = match bands {
        Bands::FixedWindow(_) | Bands::SlidingLog(_) => return ceil_secs(reset_after),
        Bands::SlidingCounter(b) => b[band].window,
        Bands::TokenBucket(b) => b[band].refill_every,
        Bands::Gcra(b) => Duration::from_micros(b[band].emission_interval_us()),
    };
    let (step, reset) = (step.as_nanos(), reset_after.as_nanos());
    let next = if reset == 0 {
        step
    } else {
        (reset - 1) % step + 1
    };
    u64::try_from(next.div_ceil(1_000_000_000)).unwrap_or(u64::MAX)
}

fuzz_target!(|input: Input| {
    let Some(bands) = bands(&input) else {
        return;
    };
    let count = bands.len();
    let policy = Arc::new(Policy::new(input.name.as_str(), "r1", bands, false));
    let route = Route {
        name: "fuzz".into(),
        matcher: Match::default(),
        limits: vec![Limit {
            policy: LimitPolicy::Rate(policy.clone()),
            subject: vec![SubjectSource::ClientIp],
            cost: 1,
            charge: Default::default(),
            tier: None,
        }],
        upgrades: Arc::from(Vec::<Box<str>>::new()),
        tiers: None,
        answers: Default::default(),
        addresses: Default::default(),
    };
    let duration = |(secs, nanos): (u64, u32)| Duration::new(secs, nanos % 1_000_000_000);
    let decision = Decision {
        allowed: input.allowed,
        band: input.band % count,
        remaining: input.remaining,
        reset_after: duration(input.reset_after),
        retry_after: duration(input.retry_after),
        approximate: false,
    };
    let prepared = Prepared::new(&route, 0);
    let mut headers = HeaderMap::new();
    add_ratelimit_headers(&mut headers, &prepared, &decision);

    let policy_field = headers
        .get(&RATELIMIT_POLICY)
        .expect("RateLimit-Policy is always sent");
    let expected: Vec<_> = policy
        .quotas()
        .iter()
        .enumerate()
        .map(|(i, (quota, window))| {
            let w = ceil_secs(*window).max(1);
            (
                member(&input.name, i, count),
                vec![("q", u64::from(*quota)), ("w", w)],
            )
        })
        .collect();
    check_list("RateLimit-Policy", policy_field.as_bytes(), &expected);

    let limit_field = headers.get(&RATELIMIT).expect("RateLimit is always sent");
    let expected = [(
        member(&input.name, decision.band, count),
        vec![
            ("r", decision.remaining),
            // A denial's `t` is its `Retry-After` (at least 1).
            (
                "t",
                if decision.allowed {
                    effective_secs(policy.bands(), decision.band, decision.reset_after)
                } else {
                    ceil_secs(decision.retry_after).max(1)
                },
            ),
        ],
    )];
    check_list("RateLimit", limit_field.as_bytes(), &expected);
});
