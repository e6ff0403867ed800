//! Giving the memory of a connection flood back to the system.
//!
//! A flood of half-open connections makes the allocator take memory for
//! each one's buffers and task (about 21 KB a connection). When they
//! close, glibc's malloc keeps the freed pages inside its heaps for reuse:
//! measured (`bench/connflood.py`), 13 floods of 3,000 connections left
//! RSS at 126 MB against 12 MB idle, with 1.3 MB of it in use, and no
//! malloc setting (arena count, trim threshold, top pad) bounded it. One
//! `malloc_trim(0)` gives it all back. A trim holds malloc's locks while
//! it walks the heaps (a few ms, tens right after a large flood), so it
//! runs only when a flood has ended, at most once per [`SPACING`], on a
//! blocking thread. A flood is what clients made sluice hold, by either
//! measure: the open connections, or the bytes of request heads held
//! (HTTP/2 streams held open on a few connections take as much as a
//! connection flood, with no connection count to show it). It has ended
//! when the measure fell to a quarter of a high of at least [`FLOOD`]
//! connections or [`FLOOD_BYTES`] bytes. A flood the budget refused may
//! hold little of it for long (its heads refused at once) and still have
//! grown its connections' buffers: it has ended when, after refusals, a
//! quarter of the connections open then have closed.

use std::time::Duration;

use tokio::time::Instant;

/// Fewer connections than this at their high were no flood worth a trim.
pub const FLOOD: usize = 512;

/// Fewer bytes of request heads than this at their high were no flood
/// worth a trim.
pub const FLOOD_BYTES: usize = 1 << 20;

/// At most one trim this often.
pub const SPACING: Duration = Duration::from_secs(10);

/// When the accept loop should trim.
#[derive(Debug, Default)]
pub struct Trim {
    /// The most connections open since the last trim.
    high: usize,
    /// The most bytes of request heads held since the last trim.
    high_bytes: usize,
    /// Heads refused for the budget, as last read.
    refusals: usize,
    /// The most connections open since heads were last refused (0: none
    /// refused since that flood was trimmed).
    refused_open: usize,
    last: Option<Instant>,
    /// A flood ended within [`SPACING`] of the last trim: trim then.
    pending: bool,
}

impl Trim {
    /// `open` connections are open now (after an accept or a close);
    /// `true` when the freed memory should be given back now.
    pub fn open(&mut self, open: usize, now: Instant) -> bool {
        self.high = self.high.max(open);
        let ended = self.high >= FLOOD && open <= self.high / 4;
        if ended {
            self.high = open;
            self.pending = true;
        }
        self.fire(now)
    }

    /// `held` bytes of request heads are held now, and at most `high` were
    /// since the last reading (read every second); `true` when the freed
    /// memory should be given back now.
    pub fn held(&mut self, high: usize, held: usize, now: Instant) -> bool {
        self.high_bytes = self.high_bytes.max(high).max(held);
        if self.high_bytes >= FLOOD_BYTES && held <= self.high_bytes / 4 {
            self.high_bytes = held;
            self.pending = true;
        }
        self.fire(now)
    }

    /// `refusals` heads have been refused for the budget since start, and
    /// `open` connections are open (read every second); `true` when the
    /// freed memory should be given back now.
    pub fn refusals(&mut self, refusals: usize, open: usize, now: Instant) -> bool {
        if refusals != self.refusals {
            self.refusals = refusals;
            self.refused_open = self.refused_open.max(open).max(1);
        } else if self.refused_open > 0 && open <= self.refused_open * 3 / 4 {
            self.refused_open = 0;
            self.pending = true;
        }
        self.fire(now)
    }

    /// When a trim is waiting for its spacing: the accept loop wakes then
    /// and calls [`Trim::fire`], so the last flood's memory comes back even
    /// if no connection opens or closes after it.
    pub fn due(&self) -> Option<Instant> {
        self.pending
            .then(|| self.last.map_or_else(Instant::now, |last| last + SPACING))
    }

    /// `true` when a pending trim may run now.
    pub fn fire(&mut self, now: Instant) -> bool {
        let spaced = self.last.is_none_or(|last| now >= last + SPACING);
        if self.pending && spaced {
            self.pending = false;
            self.last = Some(now);
            return true;
        }
        false
    }
}

/// Gives the allocator's free pages back, off the async workers.
pub fn release_freed_memory() {
    tokio::task::spawn_blocking(trim_now);
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)] // sluice's one unsafe block (Cargo.toml's lint policy)
fn trim_now() {
    // SAFETY: `malloc_trim` takes no pointer and touches only glibc's own
    // heaps, under their locks; it may be called from any thread at any
    // time.
    unsafe {
        libc::malloc_trim(0);
    }
    tracing::debug!("freed memory given back after a connection flood");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim_now() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_once_a_flood_has_ended_and_not_again_too_soon() {
        let start = Instant::now();
        let mut trim = Trim::default();
        // Steady traffic never trims.
        for open in [10, 200, 50, 400, 5] {
            assert!(!trim.open(open, start));
        }
        // A flood rises, then ends.
        for open in (0..=3_000).step_by(100) {
            assert!(!trim.open(open, start));
        }
        assert!(!trim.open(1_000, start));
        assert!(trim.open(700, start), "down to a quarter of the high");
        assert_eq!(trim.due(), None);
        // The rest of it closing is worth another trim, once spaced; so is
        // a second flood within the spacing, even with no connection event
        // after it.
        assert!(!trim.open(10, start));
        assert!(!trim.open(3_000, start + Duration::from_secs(1)));
        assert!(!trim.open(10, start + Duration::from_secs(2)));
        assert_eq!(trim.due(), Some(start + SPACING));
        assert!(!trim.fire(start + Duration::from_secs(3)));
        assert!(trim.fire(start + SPACING));
        assert_eq!(trim.due(), None);
    }

    #[test]
    fn a_flood_of_held_heads_trims_once_it_has_ended() {
        let start = Instant::now();
        let mut trim = Trim::default();
        // Steady heads never trim.
        for held in [0, 100_000, 900_000, 0] {
            assert!(!trim.held(held, held, start));
        }
        // Streams pile up on a few connections, then go.
        assert!(!trim.held(30 << 20, 30 << 20, start));
        assert!(!trim.held(30 << 20, 10 << 20, start));
        assert!(
            trim.held(10 << 20, 5 << 20, start),
            "down to a quarter of the high"
        );
        // The rest going is worth another trim, once spaced.
        assert!(!trim.held(5 << 20, 0, start));
        assert_eq!(trim.due(), Some(start + SPACING));
        assert!(trim.fire(start + SPACING));
        assert!(
            !trim.held(0, 0, start + SPACING * 2),
            "nothing held, no flood"
        );
        // A flood on a fast path: its heads come and go between readings,
        // and only the high since the last reading shows it.
        assert!(trim.held(8 << 20, 0, start + SPACING * 3));
        assert_eq!(trim.due(), None);
    }

    #[test]
    fn a_refused_flood_trims_once_its_connections_have_gone() {
        let start = Instant::now();
        let mut trim = Trim::default();
        // Nothing refused: connections come and go untrimmed.
        assert!(!trim.refusals(0, 80, start));
        assert!(!trim.refusals(0, 1, start));
        // 80 connections' heads refused, held open, then closed.
        assert!(!trim.refusals(9_000, 81, start));
        assert!(!trim.refusals(10_000, 81, start));
        assert!(!trim.refusals(10_000, 81, start), "still open");
        assert!(trim.refusals(10_000, 1, start), "gone");
        assert!(!trim.refusals(10_000, 0, start + SPACING), "once");
    }
}
