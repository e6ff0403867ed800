//! Which entry a full shard gives up for a newcomer: the one that costs
//! least to forget ([`Cost`]) of a few sampled at random, in O(1).

use crate::limit::Micros;

use super::entry::Cost;
use super::Map;

/// Entries a full store looks at to choose what to evict. Five is Redis's
/// `maxmemory-samples` default: with a store that is mostly a flood of
/// one-request subjects, a frequent subject is among the five and still
/// loses to one of them.
const SAMPLES: usize = 5;

/// The position in `map` of the sampled entry that costs least to forget,
/// for a newcomer whose key hashes to `seed`; `None` when there is nothing
/// to evict (an empty shard, or only the request's own keys, `protect`).
/// The sample's positions come from the newcomer's hash (its keyed spread:
/// a client cannot aim them).
pub(super) fn victim(map: &Map, seed: u64, now: Micros, protect: &[u64]) -> Option<usize> {
    let len = map.len();
    let mut victim: Option<(usize, Cost)> = None;
    let mut state = seed;
    for i in 0..SAMPLES.min(len) {
        // A shard no larger than the sample is looked at whole.
        let at = if len <= SAMPLES {
            i
        } else {
            state = splitmix(state);
            // `len` fits in u64 and the remainder is below it.
            (state % len as u64) as usize
        };
        let Some((key, entry)) = map.get_index(at) else {
            continue;
        };
        if protect.contains(&key.hash) {
            continue;
        }
        let cost = entry.cost_to_forget(now);
        if victim.is_none_or(|(_, best)| cost < best) {
            victim = Some((at, cost));
        }
    }
    victim.map(|(at, _)| at)
}

/// One step of SplitMix64: spreads consecutive states over all 64 bits.
fn splitmix(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
