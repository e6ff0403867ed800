//! The error collector every validation step writes to, and the parsers that
//! turn one scalar into one typed value.
//!
//! Parsers are plain functions returning `Result<T, String>`; the collector
//! places their messages at a key path, so every step reports and moves on.

use std::num::NonZeroU32;
use std::path::Path;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_yaml::Value;

use crate::config::keys::Key;
use crate::config::locate::{At, KeyPath, Locations};
use crate::config::raw::Scalar;
use crate::config::ConfigError;

pub struct Checker<'a> {
    file: &'a Path,
    locations: &'a Locations,
    errors: Vec<ConfigError>,
    /// Values whose `${NAME}` could not be substituted: any further error
    /// about them would only repeat the first one.
    poisoned: Vec<KeyPath>,
}

impl<'a> Checker<'a> {
    pub fn new(file: &'a Path, locations: &'a Locations) -> Checker<'a> {
        Checker {
            file,
            locations,
            errors: Vec::new(),
            poisoned: Vec::new(),
        }
    }

    pub fn file(&self) -> &Path {
        self.file
    }

    pub fn error(&mut self, path: &KeyPath, at: At, message: impl Into<String>) {
        if self.poisoned.iter().any(|p| path.starts_with(p)) {
            return;
        }
        let pos = self.locations.find(path, at);
        self.errors.push(ConfigError {
            file: self.file.to_path_buf(),
            line: pos.line,
            column: pos.column,
            key: path.to_string(),
            message: message.into(),
        });
    }

    /// Reports an error at `path` and keeps quiet about it from now on.
    pub fn poison(&mut self, path: &KeyPath, message: impl Into<String>) {
        self.error(path, At::Value, message);
        self.poisoned.push(path.clone());
    }

    pub fn missing(&mut self, path: &KeyPath) {
        self.error(path, At::Key, "required key is missing");
    }

    pub fn has_errors(&self) -> bool {
        !self.errors.is_empty()
    }

    /// The errors in file order (those without a position first).
    pub fn into_errors(mut self) -> Vec<ConfigError> {
        self.errors.sort_by_key(|e| (e.line, e.column));
        self.errors.dedup();
        self.errors
    }

    /// Deserializes one section (or one policy, one route) of the raw tree.
    /// Absent or empty (`server:` with nothing under it) is all defaults.
    pub fn shape<T: DeserializeOwned + Default>(
        &mut self,
        path: &KeyPath,
        value: Option<Value>,
    ) -> Option<T> {
        let value = match value {
            None | Some(Value::Null) => return Some(T::default()),
            Some(v) => v,
        };
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(t) => Some(t),
            Err(e) => {
                let mut at_path = path.clone();
                for segment in e.path() {
                    at_path = match segment {
                        serde_path_to_error::Segment::Seq { index } => at_path.index(*index),
                        serde_path_to_error::Segment::Map { key } => at_path.key(key),
                        serde_path_to_error::Segment::Enum { variant } => at_path.key(variant),
                        serde_path_to_error::Segment::Unknown => at_path,
                    };
                }
                let message = e.inner().to_string();
                match message.strip_prefix("unknown field") {
                    Some(rest) => self.error(&at_path, At::Key, format!("unknown key{rest}")),
                    None => self.error(&at_path, At::Value, message),
                }
                None
            }
        }
    }

    /// `v` parsed by `parse`, or `default` when absent.
    pub fn optional<T>(
        &mut self,
        path: &KeyPath,
        v: Option<&Scalar>,
        default: T,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        match v {
            None => Some(default),
            Some(s) => self.value(path, s, parse),
        }
    }

    /// `v`, the value of `key` in the section at `section`, parsed by
    /// `parse`; when absent, the key's default from the table, parsed by
    /// the same `parse`.
    pub fn defaulted<T>(
        &mut self,
        section: &KeyPath,
        key: &Key,
        v: Option<&Scalar>,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        let path = section.key(key.name());
        debug_assert!(
            key.is_at(&path.to_string()),
            "the table's key {} is the one read at {path}",
            key.path
        );
        match v {
            Some(s) => self.value(&path, s, parse),
            None => match parse(key.value()) {
                Ok(t) => Some(t),
                Err(message) => {
                    let message = format!("the default `{}` does not load: {message}", key.value());
                    self.error(&path, At::Key, message);
                    None
                }
            },
        }
    }

    /// `v` parsed by `parse`; an error when absent.
    pub fn required<T>(
        &mut self,
        path: &KeyPath,
        v: Option<&Scalar>,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        match v {
            None => {
                self.missing(path);
                None
            }
            Some(s) => self.value(path, s, parse),
        }
    }

    /// `s` parsed by `parse`, its error placed at `path`.
    pub fn value<T>(
        &mut self,
        path: &KeyPath,
        s: &Scalar,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Option<T> {
        match parse(&s.0) {
            Ok(t) => Some(t),
            Err(message) => {
                self.error(path, At::Value, message);
                None
            }
        }
    }
}

/// A whole number in `min..=max`.
pub fn number(min: u64, max: u64) -> impl Fn(&str) -> Result<u64, String> {
    move |s| {
        let n: i128 = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a whole number"))?;
        if n < i128::from(min) {
            Err(format!("must be at least {min}, not {n}"))
        } else if n > i128::from(max) {
            Err(format!("must be at most {max}, not {n}"))
        } else {
            // In range of a u64 by the checks above.
            Ok(n as u64)
        }
    }
}

/// A whole number from 1 to `u32::MAX`: a limit, a capacity, a burst.
pub fn positive(s: &str) -> Result<NonZeroU32, String> {
    let n = number_u32(1)(s)?;
    NonZeroU32::new(n).ok_or_else(|| "must be at least 1".to_owned())
}

/// A whole number in `min..=u32::MAX`.
pub fn number_u32(min: u32) -> impl Fn(&str) -> Result<u32, String> {
    move |s| {
        let n = number(u64::from(min), u64::from(u32::MAX))(s)?;
        u32::try_from(n).map_err(|_| format!("must be at most {}, not {n}", u32::MAX))
    }
}

/// A whole percentage from 1 to 100, written with its sign: `50%`.
pub fn percent(s: &str) -> Result<u8, String> {
    let Some(n) = s.trim().strip_suffix('%') else {
        return Err(format!("`{s}` is not a percentage; write e.g. `50%`"));
    };
    let n = number(1, 100)(n.trim_end()).map_err(|e| format!("`{s}`: {e}"))?;
    // At most 100 by the check above.
    Ok(n as u8)
}

/// `on` or `off`, as `true` and `false`.
pub fn on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, not `{s}`")),
    }
}

pub fn boolean(s: &str) -> Result<bool, String> {
    match s {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("expected true or false, not `{s}`")),
    }
}

/// `250ms`, `10s`, `1m`, `1h` (humantime); zero allowed.
pub fn duration(s: &str) -> Result<Duration, String> {
    if !s.is_empty() && s.trim().chars().all(|c| c.is_ascii_digit()) && s.trim() != "0" {
        return Err(format!(
            "`{s}` has no unit; write a duration such as `{s}s` or `{s}ms`"
        ));
    }
    humantime::parse_duration(s.trim())
        .map_err(|_| format!("`{s}` is not a duration; write e.g. `250ms`, `10s`, `1m`, `1h`"))
}

/// A duration longer than zero.
pub fn positive_duration(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d.is_zero() {
        return Err("must be longer than 0".to_owned());
    }
    Ok(d)
}

/// The longest policy window or period: keeps every timestamp plus window
/// far inside what Lua's doubles represent exactly.
pub const MAX_WINDOW: Duration = Duration::from_secs(365 * 24 * 3600);

/// A policy window or period: at least 1ms, whole milliseconds, at most
/// [`MAX_WINDOW`] (the stores keep time in whole milliseconds or finer).
pub fn window(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < Duration::from_millis(1) {
        return Err(format!("`{s}` is shorter than the minimum of 1ms"));
    }
    if d.subsec_nanos() % 1_000_000 != 0 {
        return Err(format!("`{s}` is not a whole number of milliseconds"));
    }
    if d > MAX_WINDOW {
        return Err(format!("`{s}` is longer than the maximum of 365d"));
    }
    Ok(d)
}

/// Non-empty text.
pub fn text(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".to_owned());
    }
    Ok(s.to_owned())
}

/// Names of policies and routes, explicit revisions, the key prefix: they
/// end up in store keys, metric labels and headers, so only a safe set of
/// characters, and never `{`/`}` (which would change Redis Cluster slots).
pub fn name(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if s.len() > 64 {
        return Err(format!("`{s}` is longer than 64 characters"));
    }
    if let Some(bad) = s
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        return Err(format!(
            "`{s}` contains `{bad}`; use letters, digits, `_`, `-` and `.`"
        ));
    }
    Ok(s.to_owned())
}
