//! An index over a route table, so finding a route does not scan every one.
//!
//! Exact paths and path prefixes are looked up by the hash of the path and
//! of each of its segment-boundary prefixes; templates, `/` prefixes and
//! routes matching any path are kept in a list checked on every request.
//! Every candidate an index lookup gives is checked with the same `matches`
//! a scan would run, and the lowest index wins, so the answer is always the
//! first route in file order that matches: the index only skips routes
//! that cannot match. A hash collision only adds a candidate that fails the
//! check.
//!
//! Keys are hashed with the process's random SipHash keys: the paths
//! looked up are the client's, and an unkeyed hash would let a client
//! aim every lookup at the largest bucket.

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use super::{PathMatch, Route};

/// Below this many routes a scan costs less than hashing the path.
pub const SCAN_BELOW: usize = 8;

#[derive(Debug)]
pub struct Index {
    keys: RandomState,
    /// Route indices by the hash of their exact path, ascending.
    exact: HashMap<u64, Vec<u32>>,
    /// By the hash of their prefix (never `/`), ascending.
    prefix: HashMap<u64, Vec<u32>>,
    /// The same for `case_sensitive: false` routes, keyed by the ASCII
    /// lower-case form.
    exact_folded: HashMap<u64, Vec<u32>>,
    prefix_folded: HashMap<u64, Vec<u32>>,
    /// Checked on every request, ascending.
    always: Vec<u32>,
}

impl Index {
    pub fn new(routes: &[Route]) -> Index {
        let mut index = Index {
            keys: RandomState::new(),
            exact: HashMap::new(),
            prefix: HashMap::new(),
            exact_folded: HashMap::new(),
            prefix_folded: HashMap::new(),
            always: Vec::new(),
        };
        for (i, route) in routes.iter().enumerate() {
            // A configuration has far fewer than 2^32 routes.
            let i = i as u32;
            let folded = !route.matcher.case_sensitive;
            match &route.matcher.path {
                // `/login.json` hashes as no prefix of `/login`: checked
                // on every request.
                _ if route.matcher.format_suffix => index.always.push(i),
                PathMatch::Exact(p) => {
                    let key = index.hash(p.as_bytes(), folded);
                    let map = if folded {
                        &mut index.exact_folded
                    } else {
                        &mut index.exact
                    };
                    map.entry(key).or_default().push(i);
                }
                PathMatch::Prefix(p) if p != "/" => {
                    let key = index.hash(p.as_bytes(), folded);
                    let map = if folded {
                        &mut index.prefix_folded
                    } else {
                        &mut index.prefix
                    };
                    map.entry(key).or_default().push(i);
                }
                PathMatch::Prefix(_) | PathMatch::Any | PathMatch::Template(_) => {
                    index.always.push(i)
                }
            }
        }
        index
    }

    /// The lowest index `accept` takes among the routes that could match
    /// `path`, or `None`.
    pub fn first(&self, path: &str, accept: impl Fn(usize) -> bool) -> Option<usize> {
        let mut best: Option<u32> = None;
        let mut offer = |candidates: Option<&Vec<u32>>| {
            for &i in candidates.into_iter().flatten() {
                if best.is_some_and(|b| i >= b) {
                    // Ascending: nothing further in this list can win.
                    break;
                }
                if accept(i as usize) {
                    best = Some(i);
                    break;
                }
            }
        };
        offer(Some(&self.always));
        for folded in [false, true] {
            let (exact, prefix) = if folded {
                (&self.exact_folded, &self.prefix_folded)
            } else {
                (&self.exact, &self.prefix)
            };
            if exact.is_empty() && prefix.is_empty() {
                continue;
            }
            // `/a/b/` is exact `/a/b` too (one trailing slash), and a prefix
            // `p` matches `p` and `p/...`: every prefix ending before a `/`,
            // and the whole path.
            let bytes = path.as_bytes();
            let mut hasher = self.keys.build_hasher();
            let mut hashed = 0;
            for at in (1..bytes.len()).filter(|&at| bytes[at] == b'/') {
                write(&mut hasher, &bytes[hashed..at], folded);
                hashed = at;
                let key = hasher.finish();
                offer(prefix.get(&key));
                if at == bytes.len() - 1 {
                    offer(exact.get(&key));
                }
            }
            write(&mut hasher, &bytes[hashed..], folded);
            let key = hasher.finish();
            offer(prefix.get(&key));
            offer(exact.get(&key));
        }
        best.map(|b| b as usize)
    }

    fn hash(&self, bytes: &[u8], folded: bool) -> u64 {
        let mut hasher = self.keys.build_hasher();
        write(&mut hasher, bytes, folded);
        hasher.finish()
    }
}

/// Feeds `bytes` (ASCII lower-cased when `folded`) to the hasher. SipHash
/// is a byte stream: feeding a path in pieces gives the hash of the whole.
fn write(hasher: &mut impl Hasher, bytes: &[u8], folded: bool) {
    if !folded {
        hasher.write(bytes);
        return;
    }
    let mut buf = [0u8; 64];
    for chunk in bytes.chunks(buf.len()) {
        let lower = &mut buf[..chunk.len()];
        lower.copy_from_slice(chunk);
        lower.make_ascii_lowercase();
        hasher.write(lower);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use http::Method;

    use super::*;
    use crate::route::{Match, RouteTable, Segment};

    /// SplitMix64: a seeded, reproducible stream for the property below.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
            &items[self.below(items.len())]
        }
    }

    const WORDS: [&str; 8] = ["a", "b", "A", "api", "Api", "v1", "a.json", "api.x"];

    fn path(rng: &mut Rng, max_segments: usize) -> String {
        let mut out = String::new();
        for _ in 0..rng.below(max_segments + 1) {
            out.push('/');
            if rng.below(12) > 0 {
                out.push_str(rng.pick::<&str>(&WORDS));
            }
        }
        if out.is_empty() || rng.below(4) == 0 {
            out.push('/');
        }
        out
    }

    fn route(rng: &mut Rng, n: usize) -> Route {
        let p = path(rng, 3);
        let trimmed = p.trim_end_matches('/');
        let trimmed = if trimmed.is_empty() { "/" } else { trimmed };
        let path = match rng.below(5) {
            0 | 1 => PathMatch::Exact(trimmed.to_owned()),
            2 | 3 => PathMatch::Prefix(trimmed.to_owned()),
            _ if rng.below(3) == 0 => PathMatch::Any,
            _ => PathMatch::Template(
                (0..1 + rng.below(3))
                    .map(|_| match rng.below(2) {
                        0 => Segment::Param("p".into()),
                        _ => Segment::Literal(rng.pick::<&str>(&WORDS).to_string()),
                    })
                    .collect(),
            ),
        };
        let methods = match rng.below(3) {
            0 => vec![],
            1 => vec![Method::GET],
            _ => vec![Method::POST],
        };
        Route {
            name: Arc::from(format!("r{n}")),
            matcher: Match {
                methods,
                path,
                case_sensitive: rng.below(3) > 0,
                format_suffix: rng.below(4) == 0,
            },
            limits: Vec::new(),
            upgrades: Arc::from(Vec::new()),
            tiers: None,
            addresses: Default::default(),
        }
    }

    /// The index gives the route a scan in file order gives, for random
    /// tables over a small vocabulary (so routes overlap, shadow each other
    /// and differ only in letter case) and random paths.
    #[test]
    fn the_index_finds_what_a_scan_finds() {
        let mut rng = Rng(0x5eed);
        let default = Route {
            name: Arc::from("default"),
            ..route(&mut rng, 0)
        };
        let mut indexed_tables = 0;
        for _ in 0..300 {
            let routes: Vec<Route> = (0..1 + rng.below(40)).map(|n| route(&mut rng, n)).collect();
            let table = RouteTable::new(&routes, &default);
            indexed_tables += usize::from(table.index.is_some());
            for _ in 0..200 {
                let path = path(&mut rng, 4);
                let method = rng.pick(&[Method::GET, Method::POST, Method::HEAD]).clone();
                let scan = routes
                    .iter()
                    .find(|r| r.matcher.matches(&method, &path))
                    .map_or("default", |r| &*r.name);
                assert_eq!(
                    &*table.route(&method, &path).name,
                    scan,
                    "{method} {path} in {routes:#?}"
                );
            }
        }
        assert!(
            indexed_tables > 200,
            "most tables are large enough to index"
        );
    }

    #[test]
    fn a_path_hashed_in_pieces_hashes_as_a_whole() {
        let index = Index::new(&[]);
        let mut pieces = index.keys.build_hasher();
        write(&mut pieces, b"/api", true);
        write(&mut pieces, b"/V1", true);
        assert_eq!(pieces.finish(), index.hash(b"/API/v1", true));
        let long = "/Seg".repeat(40);
        assert_eq!(
            index.hash(long.as_bytes(), true),
            index.hash(long.to_ascii_lowercase().as_bytes(), false)
        );
    }
}
