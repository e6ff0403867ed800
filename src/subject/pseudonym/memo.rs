//! Pseudonyms remembered: the HMAC of who is asking is the costliest step
//! of a decision a sidecar makes without a store call (about 5,000
//! instructions of a refusal's 28,000), and a client asks again and again
//! under the same identity. A table of fixed size remembers the latest
//! pseudonym per slot, keyed by the exact framed input of the HMAC (kind,
//! identity and route, length-framed): a hit compares those bytes, so two
//! inputs can never share a pseudonym through the table, whatever they
//! hash to. A miss costs a hash and a copy; a flood of one-request
//! subjects only ever misses. The table belongs to one key: a new key (a
//! reload that changes it) starts an empty one.

use std::sync::Mutex;

use crate::sync;

/// Slots: 1,024 of about 140 bytes.
const SLOTS: usize = 1024;
/// Framed inputs up to this long are remembered; longer ones (a long
/// header value) are hashed every time.
pub const REMEMBERED: usize = 96;

#[derive(Clone, Copy)]
struct Slot {
    len: u8,
    input: [u8; REMEMBERED],
    digest: [u8; 32],
}

pub struct Memo {
    slots: Box<[Mutex<Option<Slot>>]>,
    seed: u64,
}

impl Default for Memo {
    fn default() -> Memo {
        Memo {
            slots: (0..SLOTS).map(|_| Mutex::new(None)).collect(),
            seed: rand::random(),
        }
    }
}

impl Memo {
    /// The digest remembered for exactly `input`, if any.
    pub fn get(&self, input: &[u8]) -> Option<[u8; 32]> {
        if input.len() > REMEMBERED {
            return None;
        }
        let slot = sync::lock(&self.slots[self.index(input)]);
        let found = slot.as_ref()?;
        (&found.input[..usize::from(found.len)] == input).then_some(found.digest)
    }

    /// Remembers `digest` for `input` (when short enough), in place of
    /// whatever its slot held.
    pub fn put(&self, input: &[u8], digest: [u8; 32]) {
        if input.len() > REMEMBERED {
            return;
        }
        let mut slot = Slot {
            // At most REMEMBERED (96): fits.
            len: input.len() as u8,
            input: [0; REMEMBERED],
            digest,
        };
        slot.input[..input.len()].copy_from_slice(input);
        *sync::lock(&self.slots[self.index(input)]) = Some(slot);
    }

    /// The slot of `input`: a multiply-rotate over its words, seeded per
    /// table. It only spreads inputs over slots; a hit is decided by the
    /// bytes, so a collision (chosen or not) costs a miss, never a wrong
    /// pseudonym.
    fn index(&self, input: &[u8]) -> usize {
        const K: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut h = self.seed ^ (input.len() as u64).wrapping_mul(K);
        let mut chunks = input.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            h = (h ^ u64::from_le_bytes(word))
                .wrapping_mul(K)
                .rotate_left(29);
        }
        let mut tail = [0u8; 8];
        tail[..chunks.remainder().len()].copy_from_slice(chunks.remainder());
        h = (h ^ u64::from_le_bytes(tail)).wrapping_mul(K);
        ((h >> 32) as usize) % SLOTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_input_is_answered() {
        let memo = Memo::default();
        memo.put(b"ip|192.0.2.1|login", [7; 32]);
        assert_eq!(memo.get(b"ip|192.0.2.1|login"), Some([7; 32]));
        assert_eq!(memo.get(b"ip|192.0.2.1|logi"), None);
        assert_eq!(memo.get(b"ip|192.0.2.10|login"), None);
        // A slot holds its latest: every input is answered by its own.
        for i in 0..5000u32 {
            memo.put(&i.to_be_bytes(), [i as u8; 32]);
        }
        for i in 0..5000u32 {
            if let Some(d) = memo.get(&i.to_be_bytes()) {
                assert_eq!(d, [i as u8; 32]);
            }
        }
        let long = [1u8; REMEMBERED + 1];
        memo.put(&long, [9; 32]);
        assert_eq!(memo.get(&long), None);
    }
}
