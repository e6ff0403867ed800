//! `tiers`: the policy a request counts against follows a header set by
//! a trusted gateway, or a claim of a verified token.

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderName;
use ipnet::IpNet;

use crate::subject::jwt::Token;

/// `tiers: { header | claim, policies: { VALUE: POLICY }, default: POLICY }`:
/// the policy a request counts against follows the value of the header a
/// peer in `trusted_from` sent, or of a verified token's claim. Each
/// distinct policy is one tier; the route's limit for tier `t` is the one
/// whose [`super::Limit::tier`] is `Some(t)` (none for a tier whose policy
/// is `none`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiers {
    pub by: TierBy,
    /// Each value the header or claim may carry and its tier, in file order.
    pub values: Box<[(Box<str>, u8)]>,
    /// The tier of a request without the header or claim, with a value
    /// not listed, a header sent twice or by a peer not trusted, or a
    /// token that does not check out.
    pub default: u8,
    /// Each tier's policy name (`none` for no limit), by tier.
    pub names: Box<[Arc<str>]>,
}

/// What chooses the tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TierBy {
    Header {
        name: HeaderName,
        /// The components that set `name` (an auth gateway). Not
        /// `identity.trusted_proxies`: a forwarding proxy passes a
        /// client's own header through. Empty: the header is never
        /// believed.
        trusted_from: Box<[IpNet]>,
    },
    /// A claim of the request's verified bearer token.
    Claim(Box<str>),
}

impl Tiers {
    /// The tier of a request with `headers` from `peer` (the TCP peer, or
    /// the client a trusted proxy's PROXY protocol header names) carrying
    /// `token`.
    pub fn choose(&self, headers: &http::HeaderMap, peer: IpAddr, token: &Token<'_>) -> u8 {
        match &self.by {
            TierBy::Header { name, .. } => {
                if !self.believes(peer) {
                    return self.default;
                }
                let mut values = headers.get_all(name).iter();
                match (values.next(), values.next()) {
                    (Some(value), None) => self.tier_of(value.as_bytes().trim_ascii()),
                    _ => self.default,
                }
            }
            TierBy::Claim(claim) => match token.claim(claim) {
                Some(value) => self.tier_of(value.as_bytes()),
                None => self.default,
            },
        }
    }

    fn tier_of(&self, value: &[u8]) -> u8 {
        self.values
            .iter()
            .find(|(v, _)| v.as_bytes() == value)
            .map_or(self.default, |&(_, tier)| tier)
    }

    pub fn count(&self) -> u8 {
        self.names.len() as u8
    }

    /// The header that chooses the tier, if a header does.
    pub fn header(&self) -> Option<&HeaderName> {
        match &self.by {
            TierBy::Header { name, .. } => Some(name),
            TierBy::Claim(_) => None,
        }
    }

    /// Whether `peer` is one of `trusted_from`, the components that set
    /// the header. Tiers by claim believe no header.
    pub fn believes(&self, peer: IpAddr) -> bool {
        match &self.by {
            TierBy::Header { trusted_from, .. } => {
                crate::subject::resolve::trusted_peer(peer, trusted_from)
            }
            TierBy::Claim(_) => false,
        }
    }
}
