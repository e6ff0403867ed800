//! The lockout behind an untrusted proxy, made impossible to miss.
//!
//! With `identity.trusted_proxies` empty, `X-Forwarded-For` is ignored and
//! a request's client is its TCP peer. Behind an ingress controller (or a
//! service mesh's proxy in the same pod) that peer is the proxy for every
//! client, so a per-IP limit is one limit for all of them: the first busy
//! minute locks everyone out. A proxy sits at a private or loopback
//! address and sends `X-Forwarded-For`; a client on the internet that
//! sends one is spoofing, and ignoring it is right. So each request from a
//! private or loopback peer that carries the header while nothing is
//! trusted is counted (`sluice_forwarded_for_ignored_total`), and a WARN
//! names the peer: the first at once, then at most one a minute with how
//! many were ignored in between.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::HeaderMap;
use metrics::Counter;
use tokio::time::Instant;

use super::headers::holds;
use crate::subject::resolve::X_FORWARDED_FOR;
use crate::telemetry;

const WARN_EVERY: Duration = Duration::from_secs(60);

pub struct UntrustedForwarder {
    ignored: Counter,
    /// Milliseconds after `start` of the last WARN, plus one (0: none yet).
    warned_at: AtomicU64,
    /// Ignored since the last WARN.
    unwarned: AtomicU64,
    start: Instant,
}

impl UntrustedForwarder {
    pub fn new() -> UntrustedForwarder {
        UntrustedForwarder {
            ignored: metrics::counter!(telemetry::FORWARDED_FOR_IGNORED),
            warned_at: AtomicU64::new(0),
            unwarned: AtomicU64::new(0),
            start: Instant::now(),
        }
    }

    /// A request from `peer`, judged with no trusted proxy.
    pub fn observe(&self, peer: IpAddr, headers: &HeaderMap) {
        if !looks_like_a_proxy(peer) || !holds(headers, &X_FORWARDED_FOR) {
            return;
        }
        self.ignored.increment(1);
        let now = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let last = self.warned_at.load(Ordering::Relaxed);
        let due = last == 0 || now.saturating_sub(last - 1) >= WARN_EVERY.as_millis() as u64;
        let won = due
            && self
                .warned_at
                .compare_exchange(last, now + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok();
        if !won {
            self.unwarned.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let since_last = self.unwarned.swap(0, Ordering::Relaxed);
        tracing::warn!(
            %peer,
            ignored_since_last_warning = since_last,
            "X-Forwarded-For from {peer} is ignored because identity.trusted_proxies is empty: every client behind that proxy has its address and shares one client_ip limit; list the proxy's addresses in identity.trusted_proxies"
        );
    }
}

/// A loopback or private address (RFC 1918, RFC 6598's shared space that
/// some clusters use for pods, IPv6 unique-local and link-local): where a
/// proxy in front of sluice sits.
fn looks_like_a_proxy(peer: IpAddr) -> bool {
    match peer {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => looks_like_a_proxy(IpAddr::V4(v4)),
            None => {
                let first = v6.segments()[0];
                v6.is_loopback() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proxies_sit_at_private_and_loopback_addresses() {
        for proxy in [
            "10.1.2.3",
            "172.16.0.9",
            "192.168.1.1",
            "100.64.0.1",
            "127.0.0.6",
            "169.254.1.1",
            "fd00::1",
            "fe80::1",
            "::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(looks_like_a_proxy(proxy.parse().unwrap()), "{proxy}");
        }
        for client in [
            "203.0.113.9",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "2001:db8::1",
        ] {
            assert!(!looks_like_a_proxy(client.parse().unwrap()), "{client}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_warning_comes_at_once_then_once_a_minute() {
        let forwarder = UntrustedForwarder::new();
        let mut headers = HeaderMap::new();
        headers.insert("x-forwarded-for", "203.0.113.9".parse().unwrap());
        let proxy: IpAddr = "10.0.0.7".parse().unwrap();
        let warned = |f: &UntrustedForwarder| f.warned_at.load(Ordering::Relaxed);

        forwarder.observe(proxy, &HeaderMap::new());
        forwarder.observe("203.0.113.1".parse().unwrap(), &headers);
        assert_eq!(
            warned(&forwarder),
            0,
            "no header, or a public peer: nothing"
        );

        forwarder.observe(proxy, &headers);
        let first = warned(&forwarder);
        assert_ne!(first, 0);
        tokio::time::advance(Duration::from_secs(30)).await;
        forwarder.observe(proxy, &headers);
        forwarder.observe(proxy, &headers);
        assert_eq!(warned(&forwarder), first);
        assert_eq!(forwarder.unwarned.load(Ordering::Relaxed), 2);
        tokio::time::advance(Duration::from_secs(30)).await;
        forwarder.observe(proxy, &headers);
        assert!(warned(&forwarder) > first);
        assert_eq!(forwarder.unwarned.load(Ordering::Relaxed), 0);
    }
}
