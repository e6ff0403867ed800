//! The body of `POST /explain` (and the file of `sluice check --explain`):
//! a request described in JSON, parsed into the types the proxy judges.
//!
//! ```json
//! {"method": "GET", "path": "/login?next=/", "headers": {"X-API-Key": "k"}, "peer": "10.0.0.7"}
//! ```
//!
//! Anything the HTTP layer could not have received at all (a method that is
//! no token, a header value with a newline, a path that is no request
//! target, a peer that is no address) makes the description itself wrong:
//! an error naming the field. Anything it could receive is explained, the
//! refusals included: a lower-case method or a duplicated identity header
//! is what sluice would answer 400 to, and the explanation says so.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use http::header::{HeaderMap, HeaderName, HeaderValue, HOST};
use http::{Method, Uri};
use serde::Deserialize;

/// Bodies above this are refused (413) before they are parsed.
pub const MAX_BODY: usize = 64 * 1024;

/// Where a request described without `peer` comes from: the loopback
/// address, as from a process beside the app in the same pod.
pub const DEFAULT_PEER: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// Given when a description has no `Host`: HTTP/1.1 requires one, and an
/// operator asking about a path should not have to invent it. sluice
/// routes by method and path only, so which host it is changes nothing.
const DEFAULT_HOST: &str = "localhost";

/// A request as `POST /explain` describes it.
#[derive(Debug, Clone)]
pub struct Described {
    pub method: Method,
    /// The request-target as sent: path and query, or an absolute URL.
    pub uri: Uri,
    pub headers: HeaderMap,
    pub peer: IpAddr,
    /// Whether `peer` was given or is [`DEFAULT_PEER`].
    pub peer_given: bool,
}

/// Why a description could not be read. Never quotes a header value or
/// the peer: either may be someone's identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadDescription(pub String);

/// A header given once, or several times in order.
#[derive(Deserialize)]
#[serde(untagged)]
enum Values {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    method: String,
    path: String,
    #[serde(default)]
    headers: BTreeMap<String, Values>,
    #[serde(default)]
    peer: Option<String>,
}

impl Described {
    pub fn parse(body: &[u8]) -> Result<Described, BadDescription> {
        let raw: Raw = serde_json::from_slice(body).map_err(|e| {
            // serde_json's messages name the field and the position, and
            // quote no value of a string field.
            BadDescription(format!("the body is not an explain request: {e}"))
        })?;
        let method = Method::from_bytes(raw.method.as_bytes())
            .map_err(|_| BadDescription("`method` is not an HTTP method token".to_owned()))?;
        if raw.path.is_empty() {
            return Err(BadDescription("`path` is empty".to_owned()));
        }
        let uri = Uri::try_from(raw.path.as_str()).map_err(|_| {
            BadDescription("`path` is not a request-target (a path, or an absolute URL)".to_owned())
        })?;
        let mut headers = HeaderMap::new();
        for (name, values) in raw.headers {
            let header = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| BadDescription(format!("`headers`: {name:?} is not a header name")))?;
            let values = match values {
                Values::One(value) => vec![value],
                Values::Many(values) => values,
            };
            for value in values {
                let value = HeaderValue::from_str(&value).map_err(|_| {
                    BadDescription(format!(
                        "`headers.{name}` holds a value no HTTP request can carry"
                    ))
                })?;
                headers.append(header.clone(), value);
            }
        }
        if !headers.contains_key(HOST) {
            let host = uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
                .unwrap_or(HeaderValue::from_static(DEFAULT_HOST));
            headers.insert(HOST, host);
        }
        let (peer, peer_given) = match raw.peer {
            None => (DEFAULT_PEER, false),
            Some(peer) => (parse_peer(&peer)?, true),
        };
        Ok(Described {
            method,
            uri,
            headers,
            peer,
            peer_given,
        })
    }
}

/// `10.0.0.7`, `::1`, or with a port (`10.0.0.7:51234`, `[::1]:51234`),
/// which is read past.
fn parse_peer(peer: &str) -> Result<IpAddr, BadDescription> {
    peer.parse::<IpAddr>()
        .or_else(|_| peer.parse::<SocketAddr>().map(|a| a.ip()))
        .map_err(|_| BadDescription("`peer` is not an IP address".to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<Described, BadDescription> {
        Described::parse(body.as_bytes())
    }

    fn error(body: &str) -> String {
        match parse(body) {
            Ok(d) => panic!("{body} was accepted: {d:?}"),
            Err(BadDescription(message)) => message,
        }
    }

    #[test]
    fn a_full_description_is_read_as_the_proxy_would_receive_it() {
        let d = parse(
            r#"{"method": "POST", "path": "/login?next=/", "peer": "10.0.0.7",
                "headers": {"X-API-Key": "k", "X-Forwarded-For": ["1.2.3.4", "5.6.7.8"]}}"#,
        )
        .unwrap();
        assert_eq!(d.method, Method::POST);
        assert_eq!(d.uri.path(), "/login");
        assert_eq!(d.uri.query(), Some("next=/"));
        assert_eq!(d.peer, "10.0.0.7".parse::<IpAddr>().unwrap());
        assert!(d.peer_given);
        assert_eq!(d.headers.get("x-api-key").unwrap(), "k");
        let xff: Vec<_> = d.headers.get_all("x-forwarded-for").iter().collect();
        assert_eq!(xff, ["1.2.3.4", "5.6.7.8"]);
        assert_eq!(d.headers.get(HOST).unwrap(), DEFAULT_HOST);
    }

    #[test]
    fn headers_and_peer_may_be_left_out() {
        let d = parse(r#"{"method": "GET", "path": "/"}"#).unwrap();
        assert_eq!(d.peer, DEFAULT_PEER);
        assert!(!d.peer_given);
        assert_eq!(d.headers.len(), 1, "only the Host given for it");
        let d = parse(r#"{"method": "GET", "path": "http://app.example:8080/x"}"#).unwrap();
        assert_eq!(d.headers.get(HOST).unwrap(), "app.example:8080");
        let d = parse(r#"{"method":"GET","path":"/","headers":{"Host":"a"},"peer":"[::1]:9"}"#)
            .unwrap();
        assert_eq!(d.headers.get(HOST).unwrap(), "a");
        assert_eq!(d.peer, "::1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn what_a_proxy_would_refuse_is_still_a_description() {
        // Explained as refusals (400), not refused as descriptions.
        let d = parse(r#"{"method": "get", "path": "/a/../../b"}"#).unwrap();
        assert_eq!(d.method.as_str(), "get");
        let d =
            parse(r#"{"method":"GET","path":"/","headers":{"X-Key":"a","x-key":"b"}}"#).unwrap();
        assert_eq!(d.headers.get_all("x-key").iter().count(), 2);
    }

    #[test]
    fn a_malformed_description_names_what_is_wrong() {
        for (body, says) in [
            ("", "not an explain request"),
            ("[]", "not an explain request"),
            (r#"{"path": "/"}"#, "missing field `method`"),
            (r#"{"method": "GET"}"#, "missing field `path`"),
            (
                r#"{"method": "GET", "path": "/", "body": "x"}"#,
                "unknown field `body`",
            ),
            (r#"{"method": 1, "path": "/"}"#, "invalid type"),
            (r#"{"method": "G T", "path": "/"}"#, "`method`"),
            (r#"{"method": "", "path": "/"}"#, "`method`"),
            (r#"{"method": "GET", "path": ""}"#, "`path` is empty"),
            (r#"{"method": "GET", "path": "/a b"}"#, "`path`"),
            (
                r#"{"method":"GET","path":"/","headers":{"a b":"1"}}"#,
                "not a header name",
            ),
            (
                r#"{"method":"GET","path":"/","headers":{"a":1}}"#,
                "not an explain request",
            ),
            (r#"{"method":"GET","path":"/","peer":"nowhere"}"#, "`peer`"),
            (
                r#"{"method":"GET","path":"/","peer":"10.0.0.300"}"#,
                "`peer`",
            ),
        ] {
            let message = error(body);
            assert!(message.contains(says), "{body}: {message}");
        }
    }

    #[test]
    fn errors_never_quote_a_value_that_may_identify_someone() {
        let message = error(r#"{"method":"GET","path":"/","headers":{"x-key":"secret\nkey"}}"#);
        assert!(message.contains("x-key"), "{message}");
        assert!(!message.contains("secret"), "{message}");
        let message = error(r#"{"method":"GET","path":"/","peer":"secret-host"}"#);
        assert!(!message.contains("secret"), "{message}");
    }
}
