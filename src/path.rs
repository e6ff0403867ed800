//! One request path as the application will read it.
//!
//! Every way of writing a path that an app resolves to the same resource
//! must meet the same limit, or the difference is a bypass (Envoy
//! CVE-2019-9901; nginx normalizes before matching a location for the same
//! reason). [`normalize`] turns a raw path into two forms:
//!
//! - `forward`: what goes upstream. Escapes of unreserved characters are
//!   decoded, the remaining escapes upper-cased, bytes that may not appear
//!   in a path percent-encoded, dot segments removed (RFC 3986 §5.2.4) and,
//!   by default, repeated slashes merged. Every step is one RFC 3986 §6.2.2
//!   says keeps the path's meaning, except merging slashes, which every
//!   common server does and which [`PathRules::merge_slashes`] turns off.
//! - `matching`: what routes are compared with. The forwarded form with
//!   path parameters (`;jsessionid=...`) left out and escapes of the
//!   remaining `pchar` characters (`!$&'()*+,=:@`) decoded, since most
//!   frameworks decode those before routing.
//!
//! What cannot be normalized without guessing how the app reads it is
//! refused ([`PathError`], answered 400): `..` above the root, an encoded
//! slash or backslash (unless configured), an encoded control byte, an
//! invalid escape, a raw backslash, parameters on a dot segment or on an
//! empty one.
//!
//! The common path (unreserved characters and single slashes) is returned
//! borrowed: nothing is allocated.

use std::borrow::Cow;

/// The `server.paths` settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathRules {
    /// `//` becomes `/` (nginx `merge_slashes on`, its default).
    pub merge_slashes: bool,
    pub escaped_slashes: EscapedSlashes,
    pub path_parameters: PathParameters,
}

impl Default for PathRules {
    fn default() -> Self {
        PathRules {
            merge_slashes: true,
            escaped_slashes: EscapedSlashes::Reject,
            path_parameters: PathParameters::Ignore,
        }
    }
}

/// What is done with `%2F` and `%5C` (Envoy's
/// `path_with_escaped_slashes_action`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EscapedSlashes {
    /// 400: apps disagree on whether `a%2Fb` is one segment or two.
    Reject,
    /// Kept encoded, matched and forwarded as `%2F` / `%5C`: one segment.
    Keep,
    /// Decoded to `/` before anything else: a segment separator.
    Decode,
}

/// What is done with `;params` at the end of a segment (RFC 3986 §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathParameters {
    /// Left out of matching, forwarded (Tomcat reads `;jsessionid`).
    Ignore,
    /// Left out of matching and of the forwarded path.
    Strip,
    /// 400.
    Reject,
}

/// Why a path cannot be normalized safely. Each is a 400.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathError {
    AboveRoot,
    EncodedSlash,
    Backslash,
    EncodedControl,
    BadEscape,
    /// Any parameter, under `path_parameters: reject`.
    Parameters,
    /// Parameters on a `.`, `..` or empty segment: `..;x` is `..` to
    /// Tomcat and a plain name to others.
    AmbiguousParameters,
    NotAbsolute,
}

impl PathError {
    /// Every path error, for the metric series registered at start.
    pub const ALL: [PathError; 8] = [
        PathError::AboveRoot,
        PathError::EncodedSlash,
        PathError::Backslash,
        PathError::EncodedControl,
        PathError::BadEscape,
        PathError::Parameters,
        PathError::AmbiguousParameters,
        PathError::NotAbsolute,
    ];

    /// A bounded label for `sluice_requests_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            PathError::AboveRoot => "path_above_root",
            PathError::EncodedSlash => "path_encoded_slash",
            PathError::Backslash => "path_backslash",
            PathError::EncodedControl => "path_encoded_control",
            PathError::BadEscape => "path_bad_escape",
            PathError::Parameters => "path_parameters",
            PathError::AmbiguousParameters => "path_ambiguous_parameters",
            PathError::NotAbsolute => "path_not_absolute",
        }
    }

    /// What the 400 body and the configuration errors say.
    pub fn reason(self) -> &'static str {
        match self {
            PathError::AboveRoot => "the path climbs above the root with `..`",
            PathError::EncodedSlash => "the path contains an encoded slash or backslash (%2F, %5C)",
            PathError::Backslash => "the path contains a backslash",
            PathError::EncodedControl => "the path contains a control character",
            PathError::BadEscape => "the path contains an invalid percent-escape",
            PathError::Parameters => "the path has parameters (`;`), which are refused here",
            PathError::AmbiguousParameters => {
                "the path has parameters on a `.`, `..` or empty segment"
            }
            PathError::NotAbsolute => "the path does not start with `/`",
        }
    }
}

impl std::fmt::Display for PathError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason())
    }
}

impl std::error::Error for PathError {}

/// A path in its two normal forms (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NormalPath<'a> {
    pub forward: Cow<'a, str>,
    pub matching: Cow<'a, str>,
}

impl NormalPath<'_> {
    /// Whether the path goes upstream as the client wrote it.
    pub fn unchanged(&self) -> bool {
        matches!(self.forward, Cow::Borrowed(_))
    }
}

/// Normalizes `raw`, a request path without its query. `*` (the target of
/// `OPTIONS *`) is returned as it is.
pub fn normalize<'a>(raw: &'a str, rules: &PathRules) -> Result<NormalPath<'a>, PathError> {
    if raw == "*" || is_normal(raw.as_bytes(), rules) {
        return Ok(NormalPath {
            forward: Cow::Borrowed(raw),
            matching: Cow::Borrowed(raw),
        });
    }
    if raw.is_empty() {
        return Ok(NormalPath {
            forward: Cow::Borrowed("/"),
            matching: Cow::Borrowed("/"),
        });
    }
    if !raw.starts_with('/') {
        return Err(PathError::NotAbsolute);
    }
    let decoded;
    let raw = if rules.escaped_slashes == EscapedSlashes::Decode {
        decoded = decode_slashes(raw);
        &decoded
    } else {
        raw
    };
    let (forward, matching) = rebuild(raw.as_bytes(), rules)?;
    Ok(NormalPath {
        forward: Cow::Owned(forward),
        matching: Cow::Owned(matching),
    })
}

/// True when `normalize` would return `path` unchanged in both forms: it
/// starts with `/`, every byte is unreserved, a sub-delimiter other than
/// `;`, `:`, `@` or `/`, and no segment is empty (but the last), `.` or `..`.
fn is_normal(path: &[u8], rules: &PathRules) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    let mut segment_start = 1;
    for (i, &b) in path.iter().enumerate().skip(1) {
        if b == b'/' {
            let segment = &path[segment_start..i];
            if is_dot(segment) || (segment.is_empty() && rules.merge_slashes) {
                return false;
            }
            segment_start = i + 1;
        } else if !(is_unreserved(b) || (is_plain_pchar(b) && b != b';')) {
            return false;
        }
    }
    !is_dot(&path[segment_start..])
}

fn is_dot(segment: &[u8]) -> bool {
    segment == b"." || segment == b".."
}

/// RFC 3986 §2.3.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The sub-delimiters and `:` `@`: `pchar` besides unreserved characters
/// and escapes (RFC 3986 §3.3).
fn is_plain_pchar(b: u8) -> bool {
    matches!(
        b,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'=' | b':' | b'@'
    )
}

/// `%2F` and `%5C` (any case) replaced by `/`.
fn decode_slashes(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let escape = rest.as_bytes().get(i + 1..i + 3);
        if matches!(escape, Some(e) if e.eq_ignore_ascii_case(b"2f") || e.eq_ignore_ascii_case(b"5c"))
        {
            out.push('/');
            rest = &rest[i + 3..];
        } else {
            out.push('%');
            rest = &rest[i + 1..];
        }
    }
    out.push_str(rest);
    out
}

/// Where one output segment starts in each form, so `..` can take it back.
#[derive(Clone, Copy)]
struct Mark {
    forward: usize,
    matching: usize,
}

fn rebuild(raw: &[u8], rules: &PathRules) -> Result<(String, String), PathError> {
    let mut forward = String::with_capacity(raw.len() + 8);
    let mut matching = String::with_capacity(raw.len() + 8);
    let mut marks: Vec<Mark> = Vec::new();
    let mut name = String::new();
    let mut name_matching = String::new();
    let mut params = String::new();
    // The leading `/` is the root, not the end of a segment.
    let segments: Vec<&[u8]> = raw[1..].split(|b| *b == b'/').collect();
    let last = segments.len() - 1;
    let mut trailing_slash = false;

    for (i, segment) in segments.iter().enumerate() {
        let (raw_name, raw_params) = match segment.iter().position(|b| *b == b';') {
            Some(p) => (&segment[..p], Some(&segment[p..])),
            None => (*segment, None),
        };
        name.clear();
        name_matching.clear();
        params.clear();
        decode_into(raw_name, rules, &mut name, Some(&mut name_matching))?;
        if let Some(raw_params) = raw_params {
            if rules.path_parameters == PathParameters::Reject {
                return Err(PathError::Parameters);
            }
            decode_into(raw_params, rules, &mut params, None)?;
        }
        let dot = is_dot(name.as_bytes());
        if raw_params.is_some() && (dot || name.is_empty()) {
            // `..;x` is `..` to Tomcat and a plain name to others; `/;x/`
            // is an empty segment to some and a named one to none.
            return Err(PathError::AmbiguousParameters);
        }
        let is_last = i == last;
        if name == "." {
            trailing_slash = is_last;
            continue;
        }
        if name == ".." {
            let mark = marks.pop().ok_or(PathError::AboveRoot)?;
            forward.truncate(mark.forward);
            matching.truncate(mark.matching);
            trailing_slash = is_last;
            continue;
        }
        if name.is_empty() {
            if is_last {
                trailing_slash = true;
                continue;
            }
            if rules.merge_slashes {
                continue;
            }
        }
        marks.push(Mark {
            forward: forward.len(),
            matching: matching.len(),
        });
        forward.push('/');
        forward.push_str(&name);
        if rules.path_parameters == PathParameters::Ignore {
            forward.push_str(&params);
        }
        matching.push('/');
        matching.push_str(&name_matching);
        trailing_slash = false;
    }
    if trailing_slash || forward.is_empty() {
        forward.push('/');
        matching.push('/');
    }
    Ok((forward, matching))
}

const HEX: &[u8; 16] = b"0123456789ABCDEF";

fn push_escape(out: &mut String, b: u8) {
    out.push('%');
    out.push(char::from(HEX[usize::from(b >> 4)]));
    out.push(char::from(HEX[usize::from(b & 0xF)]));
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Appends `raw` in forwarded form to `forward` and, when given, in
/// matching form to `matching`.
fn decode_into(
    raw: &[u8],
    rules: &PathRules,
    forward: &mut String,
    mut matching: Option<&mut String>,
) -> Result<(), PathError> {
    let mut i = 0;
    while i < raw.len() {
        let b = raw[i];
        if b == b'%' {
            let (Some(hi), Some(lo)) = (
                raw.get(i + 1).copied().and_then(hex),
                raw.get(i + 2).copied().and_then(hex),
            ) else {
                return Err(PathError::BadEscape);
            };
            i += 3;
            let value = hi << 4 | lo;
            if value < 0x20 || value == 0x7F {
                return Err(PathError::EncodedControl);
            }
            if value == b'/' || value == b'\\' {
                // Decode mode replaced these before; Keep leaves them be.
                if rules.escaped_slashes == EscapedSlashes::Reject {
                    return Err(PathError::EncodedSlash);
                }
                push_escape(forward, value);
                if let Some(m) = matching.as_deref_mut() {
                    push_escape(m, value);
                }
                continue;
            }
            if is_unreserved(value) {
                forward.push(char::from(value));
            } else {
                push_escape(forward, value);
            }
            if let Some(m) = matching.as_deref_mut() {
                // `%3B` stays escaped: decoded, it would read as a parameter.
                if is_unreserved(value) || (is_plain_pchar(value) && value != b';') {
                    m.push(char::from(value));
                } else {
                    push_escape(m, value);
                }
            }
            continue;
        }
        i += 1;
        if b == b'\\' {
            return Err(PathError::Backslash);
        }
        if b < 0x20 || b == 0x7F {
            return Err(PathError::EncodedControl);
        }
        if is_unreserved(b) || is_plain_pchar(b) {
            forward.push(char::from(b));
            if let Some(m) = matching.as_deref_mut() {
                m.push(char::from(b));
            }
        } else {
            // Not allowed in a path (`"`, `{`, non-ASCII...): the escaped
            // form is what an app decodes it to anyway.
            push_escape(forward, b);
            if let Some(m) = matching.as_deref_mut() {
                push_escape(m, b);
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
