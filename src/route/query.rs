//! A query string read the way the apps behind sluice read it: what a
//! parameter is called and what it holds once decoded. Both the method
//! overrides (`_method`) and routes matching on `query` read it so: the
//! spelling an app accepts and sluice does not is a way around a limit.
//!
//! - `&` and `;` both separate parameters (Rack before 3, old Werkzeug);
//! - names and values are percent-decoded, `+` is a space
//!   (`?%76ersion=2` is `version`, `?q=a+b` is `a b`);
//! - PHP drops leading spaces from a name and turns `.` and spaces into
//!   `_` (`?.method=DELETE` is `$_GET['_method']`): names are compared in
//!   that form, so `a.b` and `a_b` are one name to sluice (matching more
//!   spellings than one app routes can only over-limit);
//! - route conditions compare names in any ASCII case, as ASP.NET reads
//!   them (`?Version=2` is `version` there); `_method` only as written;
//! - a parameter without `=` is present with an empty value (`?debug`).

/// The raw `(name, value)` of each non-empty parameter of `query`, in
/// order, neither decoded.
pub fn params(query: &str) -> impl Iterator<Item = (&[u8], &[u8])> {
    query
        .split(['&', ';'])
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            (name.as_bytes(), value.as_bytes())
        })
}

/// `raw` as `application/x-www-form-urlencoded` decodes it: `+` is a
/// space, `%XX` the byte it names, and an escape that names none (`%zz`,
/// a lone `%`) is left as written, as PHP and Rack leave it.
pub fn decoded(raw: &[u8]) -> impl Iterator<Item = u8> + Clone + '_ {
    let mut at = 0;
    std::iter::from_fn(move || {
        let b = *raw.get(at)?;
        at += 1;
        match b {
            b'+' => Some(b' '),
            b'%' => {
                let hex = |i: usize| raw.get(i).and_then(|d| (*d as char).to_digit(16));
                match (hex(at), hex(at + 1)) {
                    (Some(hi), Some(lo)) => {
                        at += 2;
                        // Two hex digits: at most 0xFF.
                        Some((hi * 16 + lo) as u8)
                    }
                    _ => Some(b'%'),
                }
            }
            b => Some(b),
        }
    })
}

/// A name already decoded, in the form names are compared in: leading
/// spaces dropped, `.` and spaces made `_`, as PHP does.
pub fn folded_name(name: impl Iterator<Item = u8>) -> impl Iterator<Item = u8> {
    name.skip_while(|b| *b == b' ')
        .map(|b| if matches!(b, b'.' | b' ') { b'_' } else { b })
}

/// Whether the raw parameter name `raw` is `name` (given in folded form)
/// once decoded and folded.
pub fn name_is(raw: &[u8], name: &[u8]) -> bool {
    folded_name(decoded(raw)).eq(name.iter().copied())
}

/// The form a route's parameter name is compared in (written decoded):
/// PHP's, and ASCII lower-case, as ASP.NET reads names in any case
/// (matching more spellings than one app reads can only over-limit).
pub fn fold_written(name: &str) -> Box<[u8]> {
    folded_name(name.bytes())
        .map(|b| b.to_ascii_lowercase())
        .collect()
}

/// Whether the raw parameter name `raw` is `name` (given as
/// [`fold_written`] gives it) once decoded and folded, in any case.
pub fn route_name_is(raw: &[u8], name: &[u8]) -> bool {
    folded_name(decoded(raw))
        .map(|b| b.to_ascii_lowercase())
        .eq(name.iter().copied())
}

/// A parameter sent with two values that differ once decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TwoValues;

/// The decoded value of the parameter `name` ([`fold_written`]'s form),
/// in any spelling, when the query
/// holds it; `Err(TwoValues)` when it holds it more than once with values that
/// differ once decoded (frameworks disagree on which one they take: PHP
/// and Express's `qs` the last or a list, Rails the last, Flask and
/// Django's `GET[...]` the first, Go the first).
pub fn value_of<'q>(query: &'q str, name: &[u8]) -> Result<Option<&'q [u8]>, TwoValues> {
    let mut found: Option<&[u8]> = None;
    for (raw_name, raw_value) in params(query) {
        if !route_name_is(raw_name, name) {
            continue;
        }
        match found {
            None => found = Some(raw_value),
            Some(first) if decoded(first).eq(decoded(raw_value)) => {}
            Some(_) => return Err(TwoValues),
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(query: &str, name: &str) -> Result<Option<Vec<u8>>, TwoValues> {
        value_of(query, &fold_written(name)).map(|v| v.map(|v| decoded(v).collect()))
    }

    #[test]
    fn names_and_values_are_read_decoded() {
        for query in [
            "version=2",
            "%76ersion=2",
            "versio%6E=%32",
            "a=1;version=2",
            "x=%zz&version=2&version=%32",
        ] {
            assert_eq!(value(query, "version"), Ok(Some(b"2".to_vec())), "{query}");
        }
        assert_eq!(value("q=a+b%20c", "q"), Ok(Some(b"a b c".to_vec())));
        assert_eq!(value("debug", "debug"), Ok(Some(Vec::new())));
        assert_eq!(value("debug=", "debug"), Ok(Some(Vec::new())));
        assert_eq!(
            value("api.version=3", "api_version"),
            Ok(Some(b"3".to_vec()))
        );
        assert_eq!(
            value("+api_version=3", "api.version"),
            Ok(Some(b"3".to_vec()))
        );
        for query in ["", "versions=2", "xversion=2", "&&", "v%65rsio=2"] {
            assert_eq!(value(query, "version"), Ok(None), "{query}");
        }
    }

    #[test]
    fn a_name_given_two_values_is_ambiguous() {
        for query in [
            "version=2&version=1",
            "version=2&%76ersion=1",
            "version=2;version",
            "api.version=1&api_version=2",
            "version=1&Version=2",
        ] {
            let name = if query.starts_with("api") {
                "api_version"
            } else {
                "version"
            };
            assert_eq!(value(query, name), Err(TwoValues), "{query}");
        }
    }
}
