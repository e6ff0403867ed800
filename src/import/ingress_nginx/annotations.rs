//! The limit annotations of one Ingress, read as ingress-nginx reads
//! them, and the annotations sluice cannot take, each with the reason.

use std::net::IpAddr;

use ipnet::IpNet;

use super::read::{text, Ingress, ANNOTATION_PREFIX};

/// ingress-nginx's `limit-burst-multiplier` when it is not written (or
/// not a whole number).
pub const DEFAULT_BURST_MULTIPLIER: u64 = 5;

/// The largest `limit` or `burst` a sluice policy takes.
const MAX: u64 = u32::MAX as u64;

/// The annotations this importer carries over, by their short name.
pub const CARRIED: [&str; 6] = [
    "limit-rps",
    "limit-rpm",
    "limit-burst-multiplier",
    "limit-connections",
    "limit-allowlist",
    "limit-whitelist",
];

/// Said of a value ingress-nginx refuses: it then applied none of the
/// Ingress's limit annotations, where this import carries over those
/// that read, as their author meant.
const REFUSED: &str = "ingress-nginx refused it and then enforced none of this Ingress's limits; the others are carried over here";

/// An Ingress's limits, as ingress-nginx would enforce them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Requests a second per client address.
    pub rps: Option<u64>,
    /// Requests a minute per client address.
    pub rpm: Option<u64>,
    /// `limit-burst-multiplier`, or its default.
    pub multiplier: u64,
    /// Connections at once per client address.
    pub connections: Option<u64>,
    /// `limit-allowlist` (or its older name `limit-whitelist`): exempt
    /// from every limit of the Ingress.
    pub whitelist: Vec<IpNet>,
    /// Full annotation names, each with why it was not carried over.
    pub not_carried: Vec<(String, String)>,
}

impl Limits {
    /// Whether the Ingress limits anything.
    pub fn any(&self) -> bool {
        self.rps.is_some() || self.rpm.is_some() || self.connections.is_some()
    }

    /// nginx's `burst` for `rate`: `rate × multiplier`.
    pub fn nginx_burst(&self, rate: u64) -> u64 {
        rate.saturating_mul(self.multiplier)
    }

    /// The GCRA `burst` that admits what nginx admits at once:
    /// `limit_req … burst=B nodelay` lets the request it serves and `B`
    /// more through together.
    pub fn gcra_burst(&self, rate: u64) -> u64 {
        self.nginx_burst(rate).saturating_add(1).min(MAX)
    }
}

pub fn read(ingress: &Ingress) -> Limits {
    let mut limits = Limits {
        multiplier: DEFAULT_BURST_MULTIPLIER,
        ..Limits::default()
    };
    let full = |name: &str| format!("{ANNOTATION_PREFIX}{name}");
    let rate = |name: &str, limits: &mut Limits| -> Option<u64> {
        let written = ingress.annotation(name)?;
        match whole(&written) {
            // 0 is ingress-nginx's "no limit".
            Some(0) => None,
            Some(n) if n <= MAX => Some(n),
            Some(_) => {
                limits.not_carried.push((
                    full(name),
                    format!("`{written}` is above the largest limit sluice takes ({MAX})"),
                ));
                None
            }
            None => {
                limits.not_carried.push((
                    full(name),
                    format!("`{written}` is not a whole number: {REFUSED}"),
                ));
                None
            }
        }
    };
    limits.rps = rate("limit-rps", &mut limits);
    limits.rpm = rate("limit-rpm", &mut limits);
    limits.connections = rate("limit-connections", &mut limits);
    if let Some(written) = ingress.annotation("limit-burst-multiplier") {
        match whole(&written) {
            // 0 is nginx's `burst=0`: one request at a time.
            Some(n) => limits.multiplier = n,
            None => limits.not_carried.push((
                full("limit-burst-multiplier"),
                format!("`{written}` is not a whole number: ingress-nginx used its default, {DEFAULT_BURST_MULTIPLIER}, and so does this import"),
            )),
        }
    }
    // ingress-nginx reads `limit-allowlist`, and `limit-whitelist` as its
    // older name when the new one is not written.
    let allowlist = ["limit-allowlist", "limit-whitelist"]
        .into_iter()
        .find_map(|name| Some((name, ingress.annotation(name)?)));
    if let Some((name, written)) = allowlist {
        for entry in written.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            match network(entry) {
                Some(net) if !limits.whitelist.contains(&net) => limits.whitelist.push(net),
                Some(_) => {}
                None => limits.not_carried.push((
                    full(name),
                    format!("`{entry}` is neither an address nor a CIDR: {REFUSED}"),
                )),
            }
        }
        if !limits.any() && !limits.whitelist.is_empty() {
            limits.whitelist.clear();
            limits.not_carried.push((
                full(name),
                "the Ingress sets no limit to exempt from".to_owned(),
            ));
        }
        if name == "limit-allowlist" && ingress.annotation("limit-whitelist").is_some() {
            limits.not_carried.push((
                full("limit-whitelist"),
                "ingress-nginx read `limit-allowlist` in its place".to_owned(),
            ));
        }
    }
    for (name, value) in &ingress.metadata.annotations {
        let Some(short) = name.strip_prefix(ANNOTATION_PREFIX) else {
            continue;
        };
        if CARRIED.contains(&short) {
            continue;
        }
        let why = match short {
            "limit-rate" | "limit-rate-after" => {
                "a bandwidth limit per connection: sluice limits requests, not bytes".to_owned()
            }
            s if s.starts_with("global-rate-limit") => {
                "ingress-nginx's memcached-backed global limit: its key and window are not mapped; write a policy on `store.kind: redis` for it by hand".to_owned()
            }
            "whitelist-source-range" | "denylist-source-range" | "allowlist-source-range" => {
                let value = text(value).unwrap_or_default();
                format!("an access rule, not a limit (value `{}`); a route's `deny` refuses addresses, but an allow list is not mapped", one_line(&value))
            }
            _ => "not a rate limit: outside what sluice does".to_owned(),
        };
        limits.not_carried.push((name.clone(), why));
    }
    limits
}

/// Digits only, surrounding spaces allowed.
fn whole(s: &str) -> Option<u64> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// An address (one host) or a CIDR; host bits set are cleared, as nginx's
/// `geo` module reads `10.0.0.1/8`.
fn network(s: &str) -> Option<IpNet> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(IpNet::from(ip));
    }
    s.parse::<IpNet>().ok().map(|net| net.trunc())
}

/// `s` on one line, at most 300 characters, for a comment.
pub fn one_line(s: &str) -> String {
    let flat: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.chars().count() > 300 {
        let cut: String = flat.chars().take(297).collect();
        format!("{cut}...")
    } else {
        flat
    }
}
