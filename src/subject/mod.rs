//! Who is asking: resolution from the request, then a pseudonym.

pub mod basic;
pub mod pseudonym;
pub mod resolve;

pub use pseudonym::{Pseudonym, PseudonymKey, DISPLAY_MAX};
pub use resolve::{client_ip, global, relied_on, resolve, Resolved, UnreadableForwardedFor};
