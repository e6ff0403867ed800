//! How the scripts run (`store.scripts`): as Redis Functions (`FCALL` of a
//! library loaded with `FUNCTION LOAD`), or as cached scripts (`EVALSHA` of
//! a script loaded with `SCRIPT LOAD`), for the Redis-compatible stores that
//! have no Functions or a user not allowed them.
//!
//! `functions` and `eval` are fixed from the start. `auto` is settled by
//! the first load at start: the probe's library goes in with `FUNCTION
//! LOAD`, and an unknown command or a permission error there means no
//! Functions for this sidecar. A store that later answers `FCALL` or
//! `FUNCTION LOAD` so (a failover to a node without Functions) moves an
//! `auto` sidecar to cached scripts as it reloads the script it was about
//! to run. Never back: cached scripts work wherever Functions do, given
//! the commands.
//!
//! Plain `EVAL` is never sent: least-privilege users are denied it, and
//! it would send the whole script with every decision.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

use redis::RedisError;

use crate::config::Scripts;
use crate::sync::lock;

use super::connect::Conn;
use super::Inner;

/// The way one command runs its script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `FCALL` of a library loaded with `FUNCTION LOAD REPLACE`.
    Functions,
    /// `EVALSHA` of a script loaded with `SCRIPT LOAD`.
    Eval,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Functions => "functions",
            Mode::Eval => "eval",
        }
    }
}

const UNSETTLED: u8 = 0;
const FUNCTIONS: u8 = 1;
const EVAL: u8 = 2;

/// The setting, and the mode in use once known.
pub struct Modes {
    setting: Scripts,
    settled: AtomicU8,
    /// Why the store cannot be ready as configured, when that is known
    /// (`functions` on a store without them): readiness says so.
    refused: Mutex<Option<String>>,
}

impl Modes {
    pub fn new(setting: Scripts) -> Modes {
        let settled = match setting {
            Scripts::Auto => UNSETTLED,
            Scripts::Functions => FUNCTIONS,
            Scripts::Eval => EVAL,
        };
        Modes {
            setting,
            settled: AtomicU8::new(settled),
            refused: Mutex::new(None),
        }
    }

    pub fn setting(&self) -> Scripts {
        self.setting
    }

    /// The mode in use; `None` while `auto` has not been settled.
    pub fn settled(&self) -> Option<Mode> {
        match self.settled.load(Ordering::Acquire) {
            FUNCTIONS => Some(Mode::Functions),
            EVAL => Some(Mode::Eval),
            _ => None,
        }
    }

    /// The mode a command is built in now: Functions until `auto` is
    /// settled (a request before readiness meets function not found and
    /// settles it on the way, see `call`).
    pub fn current(&self) -> Mode {
        self.settled().unwrap_or(Mode::Functions)
    }

    fn settle(&self, mode: Mode) {
        let value = match mode {
            Mode::Functions => FUNCTIONS,
            Mode::Eval => EVAL,
        };
        self.settled.store(value, Ordering::Release);
    }

    /// Under `auto`, moves to cached scripts after `error` said this store
    /// has no Functions for this user; whether it did.
    pub fn fall_back(&self, error: &RedisError) -> bool {
        if self.setting != Scripts::Auto || !functions_absent(error) {
            return false;
        }
        if self.settled() != Some(Mode::Eval) {
            tracing::info!(
                error = %error,
                "redis: Redis Functions are not available here; running the scripts with EVALSHA (store.scripts: auto)"
            );
        }
        self.settle(Mode::Eval);
        true
    }

    pub fn refused(&self) -> Option<String> {
        lock(&self.refused).clone()
    }

    /// Notes how the last attempt at loading the scripts ended: under
    /// `functions`, a store without them is what readiness says.
    pub fn loaded(&self, result: Result<(), &RedisError>) {
        let why = match result {
            Err(e) if self.setting == Scripts::Functions && functions_absent(e) => Some(format!(
                "Redis Functions are not available to sluice here (FUNCTION LOAD: {e}); \
                 store.scripts is functions: set it to auto or eval"
            )),
            _ => None,
        };
        *lock(&self.refused) = why;
    }
}

/// The store has no Functions for this user: `FUNCTION` or `FCALL` is an
/// unknown command (Dragonfly, Garnet, older or trimmed servers), an
/// unknown subcommand, a missing script engine, or not permitted (`NOPERM`
/// naming `fcall` or `function`; a command denied inside a script names
/// that command instead, and is no reason to change how scripts run).
pub fn functions_absent(error: &RedisError) -> bool {
    let detail = error.detail().unwrap_or_default().to_ascii_lowercase();
    match error.code() {
        Some("NOPERM") => detail.contains("'fcall'") || detail.contains("'function"),
        Some("ERR") => {
            detail.starts_with("unknown command")
                || detail.starts_with("unknown subcommand")
                || (detail.contains("engine") && detail.contains("not found"))
        }
        _ => false,
    }
}

impl Inner {
    /// The mode to load the scripts in; under `auto`, first settled by
    /// loading the probe's library with `FUNCTION LOAD`.
    pub(super) async fn settle_mode(&self, conn: &mut Conn) -> Result<Mode, RedisError> {
        if let Some(mode) = self.modes.settled() {
            return Ok(mode);
        }
        let probe = self.scripts.get(&self.probe.policy);
        // The lease first, as for every library. A user that may not write
        // it (another key prefix) is still asked for the load: that is
        // what says whether it has Functions.
        let loaded = match self.lease(&probe, conn).await {
            Ok(()) => self.load_everywhere(&probe, Mode::Functions, conn).await,
            Err(e) if e.code() == Some("NOPERM") => {
                self.load_everywhere(&probe, Mode::Functions, conn).await
            }
            Err(e) => Err(e),
        };
        match loaded {
            Ok(()) => {
                self.modes.settle(Mode::Functions);
                Ok(Mode::Functions)
            }
            Err(e) if self.modes.fall_back(&e) => Ok(Mode::Eval),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::{ErrorKind, RedisError};

    fn error(text: &str) -> RedisError {
        // What a server's error line parses into.
        let frame = format!("-{text}\r\n");
        match redis::parse_redis_value(frame.as_bytes()).and_then(|v| v.extract_error()) {
            Err(e) => e,
            Ok(_) => RedisError::from((ErrorKind::Io, "not an error")),
        }
    }

    #[test]
    fn no_functions_is_told_from_other_errors() {
        for absent in [
            "ERR unknown command 'FUNCTION', with args beginning with: 'LOAD' ",
            "ERR unknown command `FCALL`, with args beginning with: ",
            "ERR unknown subcommand 'LOAD'. Try FUNCTION HELP.",
            "NOPERM User sluice has no permissions to run the 'function|load' command",
            "NOPERM User sluice has no permissions to run the 'fcall' command",
            "ERR Engine 'LUA' not found",
        ] {
            assert!(functions_absent(&error(absent)), "{absent}");
        }
        for other in [
            "ERR Function not found",
            "NOSCRIPT No matching script. Please use EVAL.",
            "NOPERM User sluice has no permissions to run the 'zadd' command",
            "OOM command not allowed when used memory > 'maxmemory'.",
            "ERR sluice: corrupt state",
        ] {
            assert!(!functions_absent(&error(other)), "{other}");
        }
    }

    #[test]
    fn auto_falls_back_once_and_the_fixed_settings_never() {
        let absent = error("ERR unknown command 'FCALL'");
        let auto = Modes::new(Scripts::Auto);
        assert_eq!(auto.settled(), None);
        assert_eq!(auto.current(), Mode::Functions);
        assert!(!auto.fall_back(&error("ERR Function not found")));
        assert!(auto.fall_back(&absent));
        assert_eq!(auto.settled(), Some(Mode::Eval));
        let functions = Modes::new(Scripts::Functions);
        assert!(!functions.fall_back(&absent));
        assert_eq!(functions.current(), Mode::Functions);
        assert_eq!(Modes::new(Scripts::Eval).current(), Mode::Eval);
    }
}
