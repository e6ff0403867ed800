//! The one list of algorithms. Every type and match that has to name all
//! five is generated from it, so adding an algorithm is one line here.
//!
//! Enums rather than trait objects: the step runs under a memory store's
//! shard lock on every request, and a `match` on a known variant inlines
//! where a `dyn` call and a downcast of the state would not. A macro
//! rather than hand-written matches: the same five arms were once written
//! out in eight places.

use std::num::NonZeroU32;
use std::time::Duration;

use super::{
    fixed_window, gcra, parse, profile, sliding_counter, sliding_log, token_bucket, BandProfile,
    BandSpec, Params, Spec,
};
use crate::limit::{Decision, Micros};

macro_rules! register {
    ($($variant:ident => $spec:ty,)*) => {
        /// The algorithms. Derived from [`Bands`], never stored beside it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Algorithm {
            $($variant,)*
        }

        impl Algorithm {
            /// Every algorithm, in the order error messages list them.
            pub const ALL: &'static [Algorithm] = &[$(Algorithm::$variant,)*];

            /// The name used in YAML, `check` output and the revision.
            pub fn name(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => <$spec as Spec>::NAME,)*
                }
            }

            /// The keys one band takes ([`Spec::PARAMETERS`]).
            pub fn parameters(self) -> &'static [&'static str] {
                match self {
                    $(Algorithm::$variant => <$spec as Spec>::PARAMETERS,)*
                }
            }

            /// The parameters whose change starts its counts afresh
            /// ([`Spec::RESET_BY`]).
            pub fn reset_by(self) -> &'static [&'static str] {
                match self {
                    $(Algorithm::$variant => <$spec as Spec>::RESET_BY,)*
                }
            }

            /// Every algorithm but the sliding counter admits exactly its
            /// limit.
            pub fn is_exact(self) -> bool {
                match self {
                    $(Algorithm::$variant => <$spec as Spec>::EXACT,)*
                }
            }

            /// Its Lua script, before the policy's numbers and
            /// `lua/common.lua` are spliced in.
            pub fn lua(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => <$spec as Spec>::LUA,)*
                }
            }

            /// Its part of the refund script, spliced into
            /// `lua/refund.lua`.
            pub fn refund_lua(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => <$spec as Spec>::REFUND_LUA,)*
                }
            }

            /// What its state key carries before the pseudonym
            /// ([`Spec::STATE_MARK`]).
            pub fn state_mark(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => <$spec as Spec>::STATE_MARK,)*
                }
            }

            /// How many numbers a band keeps in its compact state
            /// ([`Spec::STATE_NUMBERS`]).
            pub fn state_numbers(self) -> usize {
                match self {
                    $(Algorithm::$variant => <$spec as Spec>::STATE_NUMBERS,)*
                }
            }

            /// The bands of a policy of this algorithm, each validated
            /// from its parameters as written (errors reported there).
            pub fn bands(self, params: &mut dyn Params) -> Option<Bands> {
                match self {
                    $(Algorithm::$variant => parse::<$spec>(params).map(Bands::$variant),)*
                }
            }
        }

        /// Every band of a policy shares its algorithm; all must pass, and
        /// a request denied by any band consumes nothing of any band. Never
        /// empty (validated).
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum Bands {
            $($variant(Vec<<$spec as Spec>::Band>),)*
        }

        impl Bands {
            pub fn algorithm(&self) -> Algorithm {
                match self {
                    $(Bands::$variant(_) => Algorithm::$variant,)*
                }
            }

            pub fn len(&self) -> usize {
                match self {
                    $(Bands::$variant(b) => b.len(),)*
                }
            }

            /// Every band as one of `share` sidecars enforces it alone
            /// (see [`BandSpec::shared`]).
            pub fn shared(&self, share: NonZeroU32) -> Bands {
                match self {
                    $(Bands::$variant(b) => Bands::$variant(
                        b.iter().map(|band| band.shared(share)).collect(),
                    ),)*
                }
            }

            /// What sluice derives from each band, in order. Allocates:
            /// [`crate::limit::Policy`] keeps what requests need.
            pub fn profiles(&self) -> Vec<BandProfile> {
                match self {
                    $(Bands::$variant(b) => b.iter().map(profile::<$spec>).collect(),)*
                }
            }
        }

        /// One entry per band, except the sliding log, whose one log serves
        /// every band (an entry counts in each band whose window still
        /// covers it).
        #[derive(Debug, Clone, PartialEq, Eq)]
        enum PerAlgorithm {
            $($variant(<$spec as Spec>::State),)*
        }

        impl State {
            /// A subject never seen before (see [`Spec::fresh`]).
            pub fn new(bands: &Bands) -> State {
                State(match bands {
                    $(Bands::$variant(b) => PerAlgorithm::$variant(<$spec as Spec>::fresh(b)),)*
                })
            }
        }

        /// Checks every band; charges all of them only if all admit `cost`.
        ///
        /// `cost` is expected within `1..=max_cost` (validated before a
        /// store is asked); a larger cost is denied without panicking, but
        /// its `retry_after` then promises nothing.
        pub fn evaluate(bands: &Bands, state: &mut State, now: Micros, cost: u32) -> Decision {
            match (bands, &mut state.0) {
                $((Bands::$variant(b), PerAlgorithm::$variant(s)) => {
                    <$spec as Spec>::evaluate(b, s, now, cost)
                })*
                // A state written under another algorithm. Cannot happen
                // through a store (the policy revision is part of the key),
                // but if it did, the only meaningful reading is a subject
                // never seen. Recurses once at most: `State::new` always
                // matches its bands.
                _ => {
                    *state = State::new(bands);
                    evaluate(bands, state, now, cost)
                }
            }
        }

        /// Gives back `cost` units admitted at `at` ([`Spec::refund`]).
        pub fn refund(bands: &Bands, state: &mut State, at: Micros, cost: u32) {
            match (bands, &mut state.0) {
                $((Bands::$variant(b), PerAlgorithm::$variant(s)) => {
                    <$spec as Spec>::refund(b, s, at, cost)
                })*
                // A state of another algorithm holds nothing of this one.
                _ => {}
            }
        }
    };
}

register! {
    FixedWindow => fixed_window::FixedWindow,
    SlidingCounter => sliding_counter::SlidingCounter,
    SlidingLog => sliding_log::SlidingLog,
    TokenBucket => token_bucket::TokenBucket,
    Gcra => gcra::Gcra,
}

impl Bands {
    /// The bands with a policy's `delay.max_wait` (microseconds): GCRA,
    /// whose state is a time a turn can be taken ahead in, and the token
    /// bucket, whose refill stamp can be moved ahead; `None` for the
    /// window algorithms, whose counts cannot be charged to a later window.
    pub fn delayed(self, max_wait_us: u64) -> Option<Bands> {
        match self {
            Bands::Gcra(bands) => Some(Bands::Gcra(
                bands
                    .into_iter()
                    .map(|band| gcra::GcraBand {
                        max_wait_us,
                        ..band
                    })
                    .collect(),
            )),
            Bands::TokenBucket(bands) => Some(Bands::TokenBucket(
                bands
                    .into_iter()
                    .map(|band| token_bucket::BucketBand {
                        max_wait_us,
                        ..band
                    })
                    .collect(),
            )),
            _ => None,
        }
    }
}

/// The state of one subject under one policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State(PerAlgorithm);

impl Algorithm {
    /// The algorithm YAML names `name`.
    pub fn from_name(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.iter().copied().find(|a| a.name() == name)
    }
}

/// Folds over every band's profile, so they allocate: [`Policy::new`]
/// calls them once, and requests read the policy's copy.
///
/// [`Policy::new`]: crate::limit::Policy::new
impl Bands {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(quota, window)` of each band, for `RateLimit-Policy` (`q`, `w`)
    /// and `sluice check`. A bucket's window is the time to refill it whole.
    pub fn quotas(&self) -> Vec<(u32, Duration)> {
        self.profiles()
            .iter()
            .map(|b| (b.quota, b.window))
            .collect()
    }

    /// The largest cost a single request could ever be admitted with.
    pub fn max_cost(&self) -> u32 {
        self.profiles()
            .iter()
            .map(|b| b.max_cost)
            .min()
            .unwrap_or(0)
    }

    /// How long a subject's state matters after its last admitted request:
    /// past this, dropping the state is indistinguishable from keeping it.
    /// Stores set their TTL to this plus a grace.
    pub fn horizon(&self) -> Duration {
        self.profiles()
            .iter()
            .map(|b| b.horizon)
            .max()
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_is_found_by_its_own_name_only() {
        for &a in Algorithm::ALL {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
        }
        let mut names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Algorithm::ALL.len(), "names are unique");
        assert_eq!(Algorithm::from_name("leaky-bucket"), None);
    }
}
