//! Configuration errors: each one names the file, the position and the key
//! path, so a user can jump straight to the mistake.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in a configuration file.
///
/// Displayed as `FILE:LINE:COL: KEY.PATH: message`; without a key path (a
/// YAML syntax error) as `FILE:LINE:COL: message`; without a position (the
/// file could not be read) as `FILE: message`. Messages never contain secret
/// values (store URLs, pseudonym keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the error has no position.
    pub line: usize,
    /// 1-based, in characters; 0 when the error has no position.
    pub column: usize,
    /// Like `routes[1].policy`; empty for the document as a whole.
    pub key: String,
    pub message: String,
}

impl ConfigError {
    /// The file could not be read at all.
    pub fn io(path: &Path, e: &std::io::Error) -> Self {
        ConfigError {
            file: path.to_path_buf(),
            line: 0,
            column: 0,
            key: String::new(),
            message: format!("cannot read the configuration: {e}"),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:", self.file.display())?;
        if self.line > 0 {
            write!(f, "{}:{}:", self.line, self.column)?;
        }
        if !self.key.is_empty() {
            write!(f, " {}:", self.key)?;
        }
        write!(f, " {}", self.message)
    }
}

impl std::error::Error for ConfigError {}

/// Every problem found in one file, in file order. Never empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl ConfigErrors {
    pub fn single(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }

    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// One error per line, no trailing newline.
impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
