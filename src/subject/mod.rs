//! Who is asking: resolution from the request, then a pseudonym.

pub mod pseudonym;
mod resolve;

pub use pseudonym::{Pseudonym, PseudonymKey};
pub use resolve::{resolve, Resolved};
