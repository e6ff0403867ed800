//! Who is asking: resolution from the request, then a pseudonym.

pub mod basic;
pub mod jwt;
pub mod pseudonym;
pub mod resolve;

pub use pseudonym::{Pseudonym, PseudonymKey, DISPLAY_MAX};
pub use resolve::{
    client_ip, global, relied_on, resolve, Asking, Resolved, UnreadableForwardedFor,
};
