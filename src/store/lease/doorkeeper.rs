//! Subjects seen once lately, by fingerprint: the book follows a subject
//! only from its second request within a lease's `ttl`, so a flood of
//! one-request subjects (every client address once) costs a slot each in
//! a table of fixed size, never an entry of the book (about 200 bytes, and
//! a map insert, each). A cold subject is decided one call per request
//! either way; what the book is for starts at the second request.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use crate::subject::Pseudonym;

/// Slots: 32 KiB. Two subjects in one slot push each other out, and each
/// then needs one more request to be followed: a subject hot enough to
/// lease comes back within a `ttl` many times over.
const SLOTS: usize = 4096;

pub struct Doorkeeper {
    /// A fingerprint of the subject (high 32 bits) and when it was seen,
    /// in milliseconds since `start` (low 32 bits, wrapping: a span is
    /// read with `wrapping_sub`, and a lease's `ttl` is far below 49 days).
    slots: Box<[AtomicU64]>,
    start: Instant,
}

impl Default for Doorkeeper {
    fn default() -> Doorkeeper {
        Doorkeeper {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            start: Instant::now(),
        }
    }
}

impl Doorkeeper {
    /// Whether `subject` was seen within `within_ms` before `now`; it is
    /// remembered as seen at `now` if not. A slot is read and written
    /// without a lock: two requests racing on one slot at worst forget a
    /// sighting, which costs a subject one more request before it is
    /// followed, never a wrong admission (the book only ever decides how
    /// much to ask the store for).
    pub fn seen_lately(&self, subject: &Pseudonym, now: Instant, within_ms: u32) -> bool {
        let digest = subject.digest();
        // The digest is a keyed hash already: its bytes spread evenly.
        let word = |at: usize| {
            let mut bytes = [0u8; 4];
            bytes.copy_from_slice(&digest[at..at + 4]);
            u32::from_le_bytes(bytes)
        };
        let slot = &self.slots[word(8) as usize % SLOTS];
        let fingerprint = word(12);
        let at = now.saturating_duration_since(self.start).as_millis() as u32;
        let was = slot.load(Ordering::Relaxed);
        let (was_print, was_at) = ((was >> 32) as u32, was as u32);
        if was != 0 && was_print == fingerprint && at.wrapping_sub(was_at) < within_ms {
            return true;
        }
        slot.store(
            (u64::from(fingerprint) << 32) | u64::from(at),
            Ordering::Relaxed,
        );
        false
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn subject(name: &str) -> Pseudonym {
        crate::subject::PseudonymKey::new(b"k", 1).pseudonym("ip", name.as_bytes(), "r")
    }

    #[tokio::test(start_paused = true)]
    async fn a_subject_is_let_in_at_its_second_request_within_the_span() {
        let door = Doorkeeper::default();
        let (a, b) = (subject("a"), subject("b"));
        let t0 = Instant::now() + Duration::from_millis(5);
        assert!(!door.seen_lately(&a, t0, 250));
        assert!(!door.seen_lately(&b, t0, 250));
        assert!(door.seen_lately(&a, t0 + Duration::from_millis(100), 250));
        // Too late: seen afresh, then let in at the next.
        let late = t0 + Duration::from_millis(400);
        assert!(!door.seen_lately(&b, late, 250));
        assert!(door.seen_lately(&b, late + Duration::from_millis(1), 250));
    }

    #[tokio::test(start_paused = true)]
    async fn a_flood_of_one_request_subjects_lets_none_in() {
        let door = Doorkeeper::default();
        let now = Instant::now() + Duration::from_millis(5);
        let let_in = (0..100_000)
            .filter(|i| door.seen_lately(&subject(&format!("flood-{i}")), now, 250))
            .count();
        assert_eq!(let_in, 0);
    }
}
