//! What both listeners do when `accept` fails.
//!
//! An error about one queued connection (reset before it was taken) is
//! passed over. Any other error is about the listener itself, most often
//! file descriptors running out: retrying at once would spin a core and
//! write a log line per attempt (measured before this existed: on the admin
//! port, 3 million lines in 7 s). So the loop pauses, and the error is
//! logged at most once a second, with how many were not.

use std::io;
use std::time::Duration;

use tokio::time::Instant;

/// Pause after a listener error: long enough not to spin, short enough
/// that service resumes as soon as descriptors are free again.
pub const BACKOFF: Duration = Duration::from_millis(100);

const LOG_EVERY: Duration = Duration::from_secs(1);

/// One listener's accept errors.
pub struct AcceptErrors {
    listener: &'static str,
    logged_at: Option<Instant>,
    unlogged: u64,
}

impl AcceptErrors {
    pub fn new(listener: &'static str) -> AcceptErrors {
        AcceptErrors {
            listener,
            logged_at: None,
            unlogged: 0,
        }
    }

    /// Handles one failed `accept`: nothing for a per-connection error,
    /// otherwise a throttled log line and the back-off.
    pub async fn failed(&mut self, error: &io::Error) {
        if is_per_connection(error) {
            return;
        }
        if self.should_log(Instant::now()) {
            tracing::warn!(
                listener = self.listener,
                %error,
                repeated = self.unlogged,
                "accept failed; pausing"
            );
            self.unlogged = 0;
        } else {
            self.unlogged += 1;
        }
        tokio::time::sleep(BACKOFF).await;
    }

    fn should_log(&mut self, now: Instant) -> bool {
        match self.logged_at {
            Some(at) if now.duration_since(at) < LOG_EVERY => false,
            _ => {
                self.logged_at = Some(now);
                true
            }
        }
    }
}

/// Errors about one connection that died while queued, not the listener.
pub fn is_per_connection(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_repeating_error_is_logged_once_a_second_and_always_paused_on() {
        let mut errors = AcceptErrors::new("test");
        let start = Instant::now();
        let mut logged = 0;
        for _ in 0..50 {
            if errors.should_log(Instant::now()) {
                logged += 1;
            }
            tokio::time::sleep(BACKOFF).await;
        }
        // 50 attempts over 5 s: one line a second.
        assert_eq!(Instant::now().duration_since(start), Duration::from_secs(5));
        assert_eq!(logged, 5);

        let emfile = io::Error::from_raw_os_error(24);
        let before = Instant::now();
        errors.failed(&emfile).await;
        assert_eq!(Instant::now().duration_since(before), BACKOFF);
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        let before = Instant::now();
        errors.failed(&reset).await;
        assert_eq!(
            Instant::now(),
            before,
            "a dead queued connection is no reason to pause"
        );
    }
}
