//! The methods a request may be executed as.
//!
//! Many frameworks let a request name another method than its request
//! line: the `X-HTTP-Method-Override`, `X-HTTP-Method` and
//! `X-Method-Override` headers (Google APIs, ASP.NET, Express's
//! method-override, Symfony), and a `_method` query parameter (Symfony,
//! Laravel). sluice cannot know whether the app honours them, so a request
//! is matched as every method it names as well as the one on the wire, and
//! is limited by each route that matches. Overrides in a form body are not
//! read (sluice never buffers bodies).

use http::header::{HeaderMap, HeaderName};
use http::Method;

use super::headers::Invalid;

static OVERRIDE_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-http-method-override"),
    HeaderName::from_static("x-http-method"),
    HeaderName::from_static("x-method-override"),
];

/// The wire method, then each distinct method an override names.
pub const MAX_METHODS: usize = 1 + 3 + 1;

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
/// header sent twice or naming no method is refused: the app might read
/// either copy. A `_method` parameter that names no method is not an
/// override to any framework, and is passed over.
pub fn methods(
    method: &Method,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Methods, Invalid> {
    let mut out = Methods {
        methods: Default::default(),
    };
    out.push(method.clone());
    // Most requests carry none: one pass over the names present is
    // cheaper than a hash lookup per override header.
    let any_header = headers
        .keys()
        .any(|name| OVERRIDE_HEADERS.iter().any(|o| o == name));
    let any_query = query.is_some_and(|q| q.contains("_method="));
    if !any_header && !any_query {
        return Ok(out);
    }
    for name in OVERRIDE_HEADERS.iter().filter(|_| any_header) {
        let mut values = headers.get_all(name).iter();
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
    if let Some(query) = query {
        if query.contains("_method=") {
            let mut named = query
                .split('&')
                .filter_map(|pair| pair.strip_prefix("_method="))
                .filter_map(|value| parse(value.as_bytes()));
            if let Some(first) = named.next() {
                // Frameworks disagree on which of several they take.
                if named.any(|other| other != first) {
                    return Err(Invalid::MethodOverride);
                }
                out.push(first);
            }
        }
    }
    Ok(out)
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
        methods(&Method::GET, &headers(pairs), query)
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
}
