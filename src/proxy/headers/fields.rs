//! A message's fields read once, before it is rewritten: which hop-by-hop
//! names it holds and what else the rewrite would look up. Reading every
//! name once costs less than a lookup (a hash and a probe) for each name
//! the rewrite cares about, and most messages carry none of them.

use http::header::{HeaderMap, HeaderValue, HOST};
use http::Uri;

use super::rewrite::{hop_by_hop_at, Addressed};
use super::*;
use crate::subject::resolve::X_FORWARDED_FOR;

/// A request's fields as [`prepare_request`] needs them.
pub struct RequestFields {
    /// Bit `i` for the `i`th of [`HOP_BY_HOP`].
    pub(super) present: u16,
    /// The first `Host` value.
    host: Option<HeaderValue>,
    /// `X-Original-URL` or `X-Rewrite-URL`.
    pub(super) rewrite_urls: bool,
    pub(super) forwarded_for: bool,
    /// A field that claims a client address ([`is_claim`]).
    pub(super) claims: bool,
}

impl RequestFields {
    pub fn of(headers: &HeaderMap) -> RequestFields {
        let mut fields = RequestFields {
            present: 0,
            host: None,
            rewrite_urls: false,
            forwarded_for: false,
            claims: false,
        };
        for (name, value) in headers {
            let text = name.as_str();
            if let Some(i) = hop_by_hop_at(name, text) {
                fields.present |= 1 << i;
            } else if name == HOST {
                // A second `Host` never gets here (`checks`: 400).
                if fields.host.is_none() {
                    fields.host = Some(value.clone());
                }
            } else if name == X_ORIGINAL_URL || name == X_REWRITE_URL {
                fields.rewrite_urls = true;
            } else if name == X_FORWARDED_FOR {
                fields.forwarded_for = true;
            } else if is_claim_text(text) {
                fields.claims = true;
            }
        }
        fields
    }

    /// Whether the request has an `Upgrade` field: without one it asks
    /// for no upgrade ([`allowed_upgrade`] need not be asked).
    pub fn offers_upgrade(&self) -> bool {
        self.present & 1 << UPGRADE_AT != 0
    }

    /// The host the client addressed: the URI authority (HTTP/2
    /// `:authority`, or an HTTP/1.1 absolute-form target, which RFC 9112
    /// §3.2.2 says overrides `Host`), else the `Host` field.
    pub fn addressed(&mut self, uri: &Uri) -> Option<Addressed> {
        match uri.authority() {
            Some(authority) => {
                HeaderValue::from_str(authority.as_str())
                    .ok()
                    .map(|host| Addressed {
                        host,
                        in_host_field: false,
                    })
            }
            None => self.host.take().map(|host| Addressed {
                host,
                in_host_field: true,
            }),
        }
    }
}

/// A response head's fields as [`prepare_response`] and the upstream's
/// head check need them.
pub struct ResponseFields {
    /// Bit `i` for the `i`th of [`HOP_BY_HOP`].
    pub(super) present: u16,
    bytes: usize,
}

impl ResponseFields {
    pub fn of(headers: &HeaderMap) -> ResponseFields {
        let mut fields = ResponseFields {
            present: 0,
            bytes: 0,
        };
        for (name, value) in headers {
            let text = name.as_str();
            fields.bytes += text.len() + value.len() + 4;
            if let Some(i) = hop_by_hop_at(name, text) {
                fields.present |= 1 << i;
            }
        }
        fields
    }

    /// The fields' size as written: each name, `: `, its value and CRLF.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the head has a `Transfer-Encoding` field.
    pub fn transfer_encoding(&self) -> bool {
        self.present & 1 << TRANSFER_ENCODING_AT != 0
    }
}
