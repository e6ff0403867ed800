//! How an algorithm reads its bands' parameters as written: through
//! [`Params`], which the configuration implements over the file, placing
//! each error at the file, line and key it concerns. `limit` knows nothing
//! of files, keys or YAML.

use std::num::NonZeroU32;
use std::time::Duration;

/// A policy's bands as written (one for a policy with flat parameters),
/// read one at a time: [`Params::select`] picks the band the other methods
/// read. Each method reports what it refuses; `None` means it did.
pub trait Params {
    /// How many bands are written.
    fn bands(&self) -> usize;
    /// Reads band `band` from here on.
    fn select(&mut self, band: usize);
    /// The parameters written in the band.
    fn written(&self) -> Vec<&'static str>;
    /// A whole number of at least 1; `default` when absent, or refused
    /// as missing when there is none.
    fn count(&mut self, name: &'static str, default: Option<NonZeroU32>) -> Option<NonZeroU32>;
    /// A duration of at least 1 ms; refused as missing when absent.
    fn window(&mut self, name: &'static str) -> Option<Duration>;
    /// Refuses the value of `name` for `message`.
    fn refuse(&mut self, name: &'static str, message: &str);
    /// Refuses `name` as a parameter the algorithm does not take.
    fn foreign(&mut self, name: &'static str, message: &str);
}
