//! `${NAME}` in scalar values, replaced from the environment.
//!
//! Substitution runs on parsed values, so comments and keys are never
//! touched and a substituted value can never change the YAML structure.
//! `$${` writes a literal `${`; any other `$` is kept as is.

use std::env::VarError;

use serde_yaml::Value;

use super::locate::KeyPath;

/// Looks a variable up; `std::env::var` in production, a map in tests.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Result<String, VarError>;

/// Why one scalar could not be substituted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvError {
    Unset(String),
    NotUnicode(String),
    /// `${` without a closing `}`.
    Unterminated,
    /// `${}` or a name with characters other than letters, digits and `_`.
    BadName(String),
}

impl EnvError {
    pub fn message(&self) -> String {
        match self {
            EnvError::Unset(name) => format!("environment variable `{name}` is not set"),
            EnvError::NotUnicode(name) => {
                format!("environment variable `{name}` is not valid UTF-8")
            }
            EnvError::Unterminated => {
                "`${` is not closed by `}` (write `$${` for a literal `${`)".to_owned()
            }
            EnvError::BadName(name) => format!(
                "`${{{name}}}` is not a variable name (letters, digits and `_`, not starting with a digit)"
            ),
        }
    }
}

/// Replaces every `${NAME}` in `text`. Returns the first problem found.
pub fn substitute(text: &str, lookup: Lookup<'_>) -> Result<String, EnvError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        if let Some(tail) = after.strip_prefix("${") {
            out.push_str("${");
            rest = tail;
        } else if let Some(tail) = after.strip_prefix('{') {
            let close = tail.find('}').ok_or(EnvError::Unterminated)?;
            let name = &tail[..close];
            if !is_name(name) {
                return Err(EnvError::BadName(name.to_owned()));
            }
            match lookup(name) {
                Ok(value) => out.push_str(&value),
                Err(VarError::NotPresent) => return Err(EnvError::Unset(name.to_owned())),
                Err(VarError::NotUnicode(_)) => return Err(EnvError::NotUnicode(name.to_owned())),
            }
            rest = &tail[close + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    Ok(out)
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Substitutes every string scalar under `value` (not mapping keys),
/// returning each failure with its path. A failed scalar keeps its text.
pub fn substitute_tree(
    value: &mut Value,
    path: &KeyPath,
    lookup: Lookup<'_>,
) -> Vec<(KeyPath, EnvError)> {
    let mut failures = Vec::new();
    walk(value, path, lookup, &mut failures);
    failures
}

fn walk(value: &mut Value, path: &KeyPath, lookup: Lookup<'_>, out: &mut Vec<(KeyPath, EnvError)>) {
    match value {
        Value::String(s) => {
            if s.contains('$') {
                match substitute(s, lookup) {
                    Ok(done) => *s = done,
                    Err(e) => out.push((path.clone(), e)),
                }
            }
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                walk(item, &path.index(i), lookup, out);
            }
        }
        Value::Mapping(map) => {
            for (k, v) in map.iter_mut() {
                walk(v, &path.key(&key_text(k)), lookup, out);
            }
        }
        Value::Tagged(tagged) => walk(&mut tagged.value, path, lookup, out),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// What `sluice check --allow-unset` puts where a variable is unset: a
/// Redis URL for a whole `url` or `nodes` value, and otherwise a word
/// long enough for a pseudonym key and plain enough for a password inside
/// a URL.
pub const PLACEHOLDER_URL: &str = "redis://unset.placeholder.invalid:6379";
pub const PLACEHOLDER_WORD: &str = "unset-variable-placeholder-value";

/// For every variable under `value` that `lookup` does not know, the
/// placeholder to check the configuration with (see [`PLACEHOLDER_URL`]),
/// in the order first used. A variable used both as a whole URL and inside
/// another value gets the URL.
pub fn placeholders(value: &Value, path: &KeyPath, lookup: Lookup<'_>) -> Vec<(String, String)> {
    let mut found: Vec<(String, String)> = Vec::new();
    collect_unset(value, path, lookup, &mut found);
    found
}

fn collect_unset(
    value: &Value,
    path: &KeyPath,
    lookup: Lookup<'_>,
    found: &mut Vec<(String, String)>,
) {
    match value {
        Value::String(s) if s.contains('$') => {
            let text = path.to_string();
            let url_key = text.ends_with("url") || text.contains("nodes");
            let unset = std::cell::RefCell::new(Vec::new());
            let _ = substitute(s, &|name| match lookup(name) {
                Err(VarError::NotPresent) => {
                    unset.borrow_mut().push(name.to_owned());
                    Ok(String::new())
                }
                other => other,
            });
            for name in unset.into_inner() {
                let whole = *s == format!("${{{name}}}");
                let placeholder = if whole && url_key {
                    PLACEHOLDER_URL
                } else {
                    PLACEHOLDER_WORD
                };
                match found.iter_mut().find(|(n, _)| *n == name) {
                    Some((_, p)) if placeholder == PLACEHOLDER_URL => *p = placeholder.to_owned(),
                    Some(_) => {}
                    None => found.push((name, placeholder.to_owned())),
                }
            }
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter().enumerate() {
                collect_unset(item, &path.index(i), lookup, found);
            }
        }
        Value::Mapping(map) => {
            for (k, v) in map {
                collect_unset(v, &path.key(&key_text(k)), lookup, found);
            }
        }
        Value::Tagged(tagged) => collect_unset(&tagged.value, path, lookup, found),
        Value::String(_) | Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// A mapping key as it reads in a key path.
pub fn key_text(key: &Value) -> String {
    match key {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "~".to_owned(),
        Value::Sequence(_) | Value::Mapping(_) | Value::Tagged(_) => "?".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Result<String, VarError> {
        match name {
            "HOST" => Ok("redis.local".to_owned()),
            "EMPTY" => Ok(String::new()),
            _ => Err(VarError::NotPresent),
        }
    }

    #[test]
    fn replaces_every_variable() {
        assert_eq!(
            substitute("redis://${HOST}:6379/${EMPTY}0", &env).as_deref(),
            Ok("redis://redis.local:6379/0")
        );
    }

    #[test]
    fn dollar_dollar_brace_is_a_literal() {
        assert_eq!(substitute("a$${HOST}b", &env).as_deref(), Ok("a${HOST}b"));
        assert_eq!(substitute("cost $5 $", &env).as_deref(), Ok("cost $5 $"));
    }

    #[test]
    fn unset_and_malformed_variables_are_errors() {
        assert_eq!(
            substitute("${NOPE}", &env),
            Err(EnvError::Unset("NOPE".into()))
        );
        assert_eq!(substitute("${HOST", &env), Err(EnvError::Unterminated));
        assert_eq!(
            substitute("${}", &env),
            Err(EnvError::BadName(String::new()))
        );
        assert_eq!(
            substitute("${1A}", &env),
            Err(EnvError::BadName("1A".into()))
        );
    }

    #[test]
    fn trees_substitute_values_not_keys() {
        let mut v: Value =
            serde_yaml::from_str("${HOST}: ${HOST}\nlist: [a, '${MISSING}']\n").expect("yaml");
        let failures = substitute_tree(&mut v, &KeyPath::root(), &env);
        assert_eq!(v["${HOST}"], Value::String("redis.local".into()));
        assert_eq!(failures.len(), 1);
        assert_eq!(failures[0].0.to_string(), "list[1]");
        assert_eq!(failures[0].1, EnvError::Unset("MISSING".into()));
    }
}
