//! The methods a request may be executed as.
//!
//! Many frameworks let a request name another method than its request
//! line: the `X-HTTP-Method-Override`, `X-HTTP-Method` and
//! `X-Method-Override` headers (Google APIs, ASP.NET, Express's
//! method-override, Rack), and a `_method` parameter (Symfony, Laravel,
//! Spring's `HiddenHttpMethodFilter`, Express's method-override with a
//! query getter). sluice cannot know whether the app honours them, so a
//! request is matched as every method it names as well as the one on the
//! wire, and is limited by each route that matches. Overrides in a form
//! body are not read (sluice never buffers bodies).
//!
//! Each is read the way the frameworks read it, or the spelling they
//! accept and sluice does not is a bypass:
//!
//! - the query as [`crate::route::query`] reads it: names and values
//!   percent-decoded, `+` a space (`?%5Fmethod=DELETE`,
//!   `?_method=%44ELETE`), names in PHP's form (`?.method=DELETE` is
//!   `$_GET['_method']`), `&` and `;` both separators;
//! - behind CGI-style servers a header name with `_` is the name with `-`
//!   (`X_HTTP_Method_Override`): read so when such headers are let
//!   through (`server.headers_with_underscores: allow`; otherwise they
//!   are refused before this runs, see [`super::underscores`]).

use http::header::{HeaderMap, HeaderName};
use http::Method;

use super::headers::Invalid;
use crate::route::query::{decoded, name_is, params};

pub static OVERRIDE_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// The wire method, then each distinct method an override names.
pub const MAX_METHODS: usize = 1 + 3 + 1;

/// A method name longer than this is no method any framework routes.
const METHOD_MAX: usize = 32;

/// At most [`MAX_METHODS`] methods, the wire method first; no allocation.
#[derive(Debug, Clone)]
pub struct Methods {
    methods: [Option<Method>; MAX_METHODS],
}

impl Methods {
    pub fn iter(&self) -> impl Iterator<Item = &Method> {
        self.methods.iter().flatten()
    }

    fn push(&mut self, method: Method) {
        if self.iter().any(|m| *m == method) {
            return;
        }
        if let Some(slot) = self.methods.iter_mut().find(|m| m.is_none()) {
            *slot = Some(method);
        }
    }
}

/// The methods `method` with `headers` and `query` may run as. An override
/// header sent twice (in any spelling) or naming no method is refused: the
/// app might read either copy. A `_method` parameter that names no method
/// is not an override to any framework, and is passed over.
/// `underscored`: header names with `_` reach the app, and are read as the
/// names with `-` they stand for.
pub fn methods(
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
    underscored: bool,
) -> Result<Methods, Invalid> {
    let mut out = Methods {
        methods: Default::default(),
    };
    out.push(method.clone());
    // Most requests carry none: one pass over the names present is
    // cheaper than a hash lookup per override header, and a name that
    // does not open with `x-` (most of a browser's) is none of them.
    let any_header = headers
        .keys()
        .any(|name| name.as_str().starts_with("x-") && OVERRIDE_HEADERS.iter().any(|o| o == name));
    let any_query = query.is_some_and(may_override);
    if !any_header && !any_query && !underscored {
        return Ok(out);
    }
    for name in &OVERRIDE_HEADERS {
        let dashed = headers.get_all(name).iter();
        let folded = headers
            .iter()
            .filter(|_| underscored)
            .filter(|(other, _)| other.as_str().contains('_') && folds_to(other, name))
            .map(|(_, value)| value);
        let mut values = dashed.chain(folded);
        let Some(value) = values.next() else {
            continue;
        };
        if values.next().is_some() {
            return Err(Invalid::MethodOverride);
        }
        let value = value.as_bytes().trim_ascii();
        if value.is_empty() {
            continue;
        }
        out.push(parse(value).ok_or(Invalid::MethodOverride)?);
    }
    if let Some(query) = query.filter(|_| any_query) {
        let mut named = params(query)
            .filter_map(|(name, value)| name_is(name, b"_method").then_some(value))
            .filter_map(|value| {
                let mut buf = [0u8; METHOD_MAX];
                let mut len = 0;
                for b in decoded(value) {
                    *buf.get_mut(len)? = b;
                    len += 1;
                }
                parse(&buf[..len])
            });
        if let Some(first) = named.next() {
            // Frameworks disagree on which of several they take.
            if named.any(|other| other != first) {
                return Err(Invalid::MethodOverride);
            }
            out.push(first);
        }
    }
    Ok(out)
}

/// Whether `name` (a header name, lower-case) is `target` as a CGI-style
/// server reads it: `_` stands for `-`.
pub fn folds_to(name: &HeaderName, target: &HeaderName) -> bool {
    let (name, target) = (name.as_str().as_bytes(), target.as_str().as_bytes());
    name.len() == target.len()
        && name
            .iter()
            .zip(target)
            .all(|(&n, &t)| n == t || (n == b'_' && t == b'-'))
}

/// A query that could hold a `_method` parameter in any spelling: one
/// that says `method`, or one with an escape (`%6Dethod`). Most queries
/// say neither, and are not parsed.
fn may_override(query: &str) -> bool {
    query.contains("method") || query.contains('%')
}

/// Frameworks upper-case an override before using it.
fn parse(value: &[u8]) -> Option<Method> {
    if value.is_empty() || !value.iter().all(|b| b.is_ascii_alphabetic() || *b == b'-') {
        return None;
    }
    Method::from_bytes(&value.to_ascii_uppercase()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (name, value) in pairs {
            h.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        h
    }

    fn names(pairs: &[(&str, &str)], query: Option<&str>) -> Result<Vec<String>, Invalid> {
        methods(&Method::GET, &headers(pairs), query, false)
            .map(|m| m.iter().map(|m| m.as_str().to_owned()).collect())
    }

    #[test]
    fn the_wire_method_comes_first_then_each_override() {
        assert_eq!(names(&[], None), Ok(vec!["GET".to_owned()]));
        assert_eq!(
            names(&[("x-http-method-override", "post")], None),
            Ok(vec!["GET".to_owned(), "POST".to_owned()])
        );
        assert_eq!(
            names(
                &[
                    ("x-http-method", "DELETE"),
                    ("x-method-override", "PUT"),
                    ("x-http-method-override", "GET")
                ],
                Some("a=1&_method=patch")
            ),
            Ok(vec![
                "GET".to_owned(),
                "DELETE".to_owned(),
                "PUT".to_owned(),
                "PATCH".to_owned()
            ])
        );
        // Empty values name nothing; `x_method` is another parameter.
        assert_eq!(
            names(&[("x-http-method", " ")], Some("x_method=POST")),
            Ok(vec!["GET".to_owned()])
        );
        assert_eq!(
            names(&[], Some("_method=DELETE&_method=delete")),
            Ok(vec!["GET".to_owned(), "DELETE".to_owned()])
        );
    }

    #[test]
    fn ambiguous_overrides_are_refused() {
        for (pairs, query) in [
            (
                &[
                    ("x-http-method-override", "POST"),
                    ("x-http-method-override", "PUT"),
                ][..],
                None,
            ),
            (&[("x-http-method", "PO ST")][..], None),
            (&[("x-method-override", "POST, PUT")][..], None),
            (&[][..], Some("_method=POST&_method=PUT")),
        ] {
            assert_eq!(
                names(pairs, query),
                Err(Invalid::MethodOverride),
                "{pairs:?} {query:?}"
            );
        }
    }

    #[test]
    fn query_overrides_are_read_as_frameworks_decode_them() {
        let get_delete = Ok(vec!["GET".to_owned(), "DELETE".to_owned()]);
        for query in [
            "%5Fmethod=DELETE",
            "%5fmethod=delete",
            "_method=%44ELETE",
            "_%6Dethod=DELETE",
            // PHP: `.` and spaces in a name are `_`, leading spaces dropped.
            ".method=DELETE",
            "++_method=DELETE",
            "%20_method=DELETE",
            "%2Emethod=DELETE",
            // `;` separates parameters to Rack before 3.
            "a=1;_method=DELETE",
            "x=%zz&_method=DELETE",
        ] {
            assert_eq!(names(&[], Some(query)), get_delete, "{query}");
        }
        for query in [
            "_method2=DELETE",
            "a_method=DELETE",
            "_method",
            "_method=%zzDELETE",
            "_method=DEL%00ETE",
            "q=%25",
            "m.ethod=DELETE",
            // A leading space is dropped, not made `_`.
            "+method=DELETE",
        ] {
            assert_eq!(
                names(&[], Some(query)),
                Ok(vec!["GET".to_owned()]),
                "{query}"
            );
        }
        assert_eq!(
            names(&[], Some("_method=DELETE&%5Fmethod=PUT")),
            Err(Invalid::MethodOverride)
        );
    }

    #[test]
    fn underscored_override_headers_count_only_when_they_reach_the_app() {
        let pairs = [("x_http_method_override", "DELETE")];
        assert_eq!(
            methods(&Method::GET, &headers(&pairs), None, true)
                .map(|m| m.iter().map(|m| m.as_str().to_owned()).collect::<Vec<_>>()),
            Ok(vec!["GET".to_owned(), "DELETE".to_owned()])
        );
        assert_eq!(names(&pairs, None), Ok(vec!["GET".to_owned()]));
        // Both spellings: the app reads one of them, sluice cannot know which.
        let both = [("x-http-method", "PUT"), ("x_http_method", "DELETE")];
        assert!(matches!(
            methods(&Method::GET, &headers(&both), None, true),
            Err(Invalid::MethodOverride)
        ));
    }

    #[test]
    fn folding_maps_underscores_to_dashes_only() {
        let target = HeaderName::from_static("x-api-key");
        for (name, folds) in [
            ("x_api_key", true),
            ("x-api_key", true),
            ("x-api-key", true),
            ("x_api_keys", false),
            ("x-api-kez", false),
        ] {
            assert_eq!(
                folds_to(&HeaderName::from_bytes(name.as_bytes()).unwrap(), &target),
                folds,
                "{name}"
            );
        }
    }
}
