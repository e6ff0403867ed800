//! stub
use super::{Config, ConfigError, ConfigErrors};
use std::path::Path;
pub fn parse(path: &Path, _text: &str) -> Result<Config, ConfigErrors> {
    Err(ConfigErrors::single(ConfigError {
        message: format!("{}: not implemented", path.display()),
    }))
}
