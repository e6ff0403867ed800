//! stub
use std::path::Path;
#[derive(Debug, Clone)]
pub struct ConfigError {
    pub message: String,
}
impl ConfigError {
    pub fn io(path: &Path, e: &std::io::Error) -> Self {
        ConfigError {
            message: format!("{}: {e}", path.display()),
        }
    }
}
#[derive(Debug, Clone)]
pub struct ConfigErrors(pub Vec<ConfigError>);
impl ConfigErrors {
    pub fn single(e: ConfigError) -> Self {
        ConfigErrors(vec![e])
    }
}
