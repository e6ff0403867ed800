//! Sliding log (exact): every admitted unit is remembered until it leaves
//! the largest window. One log serves every band: a unit counts in band `b`
//! while `now - at < window_b`.
//!
//! The spec keeps one entry per unit (Redis needs a unique member each);
//! here the units admitted at the same microsecond share one entry that
//! records how many they are, which decides identically and keeps a
//! request of cost 100 to one entry. Entries carry a running total of
//! units, so counting a window and finding its k-th oldest unit are binary
//! searches rather than scans of up to `limit` entries.

use std::collections::VecDeque;
use std::time::Duration;

use super::{bind, window, BandVerdict, Params, Spec, WindowBand};
use crate::limit::{micros, Decision, Micros};

pub struct SlidingLog;

impl Spec for SlidingLog {
    const NAME: &'static str = "sliding-log";
    const PARAMETERS: &'static [&'static str] = window::PARAMETERS;
    const RESET_BY: &'static [&'static str] = window::RESET_BY;
    const LUA: &'static str = include_str!("../../../lua/sliding_log.lua");
    const REFUND_LUA: &'static str = include_str!("../../../lua/refund/sliding_log.lua");
    const STATE_MARK: &'static str = "";
    const STATE_NUMBERS: usize = 0;
    type Band = WindowBand;
    type State = Log;

    fn band(params: &mut dyn Params) -> Option<WindowBand> {
        WindowBand::parse(params)
    }

    fn horizon(band: &WindowBand) -> Duration {
        band.window
    }

    fn fresh(_: &[WindowBand]) -> Log {
        Log::default()
    }

    /// Any log fits any bands: it holds times, not per-band counts.
    fn evaluate(bands: &[WindowBand], log: &mut Log, now: Micros, cost: u32) -> Decision {
        let decision = bind(bands.iter().map(|band| check(band, log, now, cost)), false);
        if decision.allowed {
            admit(bands, log, now, cost);
        }
        decision
    }

    fn refund(_bands: &[WindowBand], log: &mut Log, at: Micros, cost: u32) {
        log.take_back(at, u64::from(cost));
    }
}

/// The log of one subject under one policy. The default is a subject never
/// seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Log {
    /// Oldest first; `at` strictly increasing, `through` strictly increasing.
    entries: VecDeque<Entry>,
    /// The running total as of the last entry dropped (0 if none).
    dropped: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    at: Micros,
    /// Units admitted up to and including this entry, since the log began.
    /// A u64 of units cannot wrap in practice (centuries at a billion a
    /// second); it saturates rather than panic.
    through: u64,
}

impl Log {
    /// The time the log last wrote: a clock behind it is treated as this.
    fn newest(&self) -> Option<Micros> {
        self.entries.back().map(|e| e.at)
    }

    fn total(&self) -> u64 {
        self.entries.back().map_or(self.dropped, |e| e.through)
    }

    /// Takes `units` out of the entry written at `at` (or, the clock having
    /// been behind the log then, the first written after it), where the
    /// log still holds it; an entry left with none is removed.
    fn take_back(&mut self, at: Micros, units: u64) {
        let i = self.entries.partition_point(|e| e.at < at);
        let Some(entry) = self.entries.get(i) else {
            return;
        };
        let held = entry.through - self.through_before(i);
        let taken = units.min(held);
        for later in self.entries.iter_mut().skip(i) {
            later.through -= taken;
        }
        if taken == held {
            self.entries.remove(i);
        }
    }

    /// The running total just before entry `index`.
    fn through_before(&self, index: usize) -> u64 {
        match index.checked_sub(1) {
            Some(i) => self.entries.get(i).map_or(self.dropped, |e| e.through),
            None => self.dropped,
        }
    }

    /// Index of the oldest entry still inside a window of `w` at `t`
    /// (`t` is never before an entry).
    fn window_start(&self, t: Micros, w: Micros) -> usize {
        self.entries.partition_point(|e| t - e.at >= w)
    }
}

/// One band's verdict against the shared log. Writing is [`admit`], once
/// every band has admitted.
pub fn check(band: &WindowBand, log: &Log, now: Micros, cost: u32) -> BandVerdict {
    let w = micros(band.window);
    let limit = u64::from(band.limit.get());
    let cost = u64::from(cost);

    let t = log.newest().map_or(now, |newest| newest.max(now));
    let first = log.window_start(t, w);
    let before = log.through_before(first);
    let count = log.total() - before;
    let allowed = count.saturating_add(cost) <= limit;

    if allowed {
        return BandVerdict {
            allowed,
            remaining: limit - count - cost,
            // The units admitted now are the last to leave.
            reset_after: t.saturating_add(w).saturating_sub(now),
            retry_after: 0,
        };
    }
    // Denied with `count + cost > limit >= cost`: the band holds units.
    let leaves_at = |at: Micros| at.saturating_add(w).saturating_sub(now);
    let newest = log.newest().unwrap_or(t);
    // The request fits once the `k` oldest units in the window have left;
    // the k-th oldest leaves last of them. Past the end only for a cost
    // above the limit, which no wait admits: report the log's end.
    let k = count + cost - limit;
    let kth = log
        .entries
        .partition_point(|e| e.through < before.saturating_add(k));
    let kth_at = log.entries.get(kth).map_or(newest, |e| e.at);
    BandVerdict {
        allowed,
        remaining: limit.saturating_sub(count),
        reset_after: if count > 0 { leaves_at(newest) } else { 0 },
        retry_after: leaves_at(kth_at),
    }
}

/// Records `cost` units at `now` (or at the log's newest time, if the clock
/// is behind it, so the log stays ordered), and drops entries no band's
/// window covers any more. Called only when every band admitted.
pub fn admit(bands: &[WindowBand], log: &mut Log, now: Micros, cost: u32) {
    if cost == 0 {
        // Keeps `through` strictly increasing: an entry always holds units.
        return;
    }
    let t = log.newest().map_or(now, |newest| newest.max(now));
    let through = log.total().saturating_add(u64::from(cost));
    match log.entries.back_mut() {
        Some(last) if last.at == t => last.through = through,
        _ => log.entries.push_back(Entry { at: t, through }),
    }

    let widest = bands.iter().map(|b| micros(b.window)).max().unwrap_or(0);
    while let Some(oldest) = log.entries.front() {
        if t - oldest.at < widest {
            break;
        }
        log.dropped = oldest.through;
        log.entries.pop_front();
    }
}
