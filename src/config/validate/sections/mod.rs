//! The plain sections, a file each: server, upstream, store, identity,
//! responses.

mod answers;
mod identity;
mod responses;
mod server;
mod store;
mod upstream;

use std::path::PathBuf;

use crate::config::locate::KeyPath;
use crate::config::raw::{Scalar, ScalarList};
use crate::config::validate::check;

pub use answers::answers;
pub use identity::{identity, networks};
pub use responses::responses;
pub use server::server;
pub use store::{on_failure, store, store_kind, Kind};
pub use upstream::upstream;

/// A list's items with their paths; one value stands for a list of one.
fn list_items(path: &KeyPath, raw: Option<ScalarList>) -> Vec<(KeyPath, Scalar)> {
    match raw {
        None => Vec::new(),
        Some(ScalarList::One(s)) => vec![(path.clone(), s)],
        Some(ScalarList::Many(v)) => v
            .into_iter()
            .enumerate()
            .map(|(i, s)| (path.index(i), s))
            .collect(),
    }
}

/// A file name, as written.
pub(super) fn file_path(s: &str) -> Result<PathBuf, String> {
    check::text(s).map(PathBuf::from)
}
