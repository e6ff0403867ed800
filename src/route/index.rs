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
                conditions: match rng.below(6) {
                    0 => crate::route::Conditions {
                        hosts: vec![crate::route::HostPattern::Exact("a.example".into())],
                        ..Default::default()
                    },
                    1 => crate::route::Conditions {
                        headers: vec![(
                            http::HeaderName::from_static("x-t"),
                            crate::route::Wanted::Value(b"g"[..].into()),
                        )],
                        ..Default::default()
                    },
                    _ => Default::default(),
                },
            },
            limits: Vec::new(),
            upgrades: Arc::from(Vec::new()),
            tiers: None,
            answers: Default::default(),
            addresses: Default::default(),
        }
    }

    /// The index gives the route a scan in file order gives, for random
    /// tables over a small vocabulary (so routes overlap, shadow each other
    /// and differ only in letter case, some with a host or header
    /// condition) and random requests.
    #[test]
    fn the_index_finds_what_a_scan_finds() {
        let mut rng = Rng(0x5eed);
        let default = Route {
            name: Arc::from("default"),
            ..route(&mut rng, 0)
        };
        let mut indexed_tables = 0;
        let mut tenant = http::HeaderMap::new();
        tenant.insert("x-t", http::HeaderValue::from_static("g"));
        let none = http::HeaderMap::new();
        for _ in 0..300 {
            let routes: Vec<Route> = (0..1 + rng.below(40)).map(|n| route(&mut rng, n)).collect();
            let table = RouteTable::new(&routes, &default);
            indexed_tables += usize::from(table.index.is_some());
            for _ in 0..200 {
                let path = path(&mut rng, 4);
                let method = rng.pick(&[Method::GET, Method::POST, Method::HEAD]).clone();
                let host = *rng.pick(&[None, Some("a.example"), Some("b.example")]);
                let headers = if rng.below(2) == 0 { &tenant } else { &none };
                let facts = crate::route::Facts {
                    host,
                    headers: Some(headers),
                    query: None,
                };
                let scan = routes
                    .iter()
                    .find(|r| r.matcher.admits(&method, &path, &facts))
                    .map_or("default", |r| &*r.name);
                assert_eq!(
                    &*table.route_for(&method, &path, &facts).name,
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

    /// 1,000 routes on one host, each its own path: a request's host,
    /// headers and query are checked on the routes of its path only, not
    /// on the 1,000.
    #[test]
    fn conditions_are_checked_only_on_the_routes_the_path_index_gives() {
        use crate::route::{Conditions, Facts, HostPattern, Wanted};
        let conditions = Conditions {
            hosts: vec![HostPattern::Below(".example.com".into())],
            headers: vec![(
                http::HeaderName::from_static("x-tenant"),
                Wanted::Value(b"gold"[..].into()),
            )],
            query: vec![(b"version"[..].into(), Wanted::Present)],
        };
        let routes: Vec<Route> = (0..1000)
            .map(|n| Route {
                name: Arc::from(format!("r{n}")),
                matcher: Match {
                    // Half exact paths, half prefixes.
                    path: if n % 2 == 0 {
                        PathMatch::Exact(format!("/r{n}"))
                    } else {
                        PathMatch::Prefix(format!("/p{n}"))
                    },
                    conditions: conditions.clone(),
                    ..Match::default()
                },
                limits: Vec::new(),
                upgrades: Arc::from(Vec::new()),
                tiers: None,
                answers: Default::default(),
                addresses: Default::default(),
            })
            .collect();
        let index = Index::new(&routes);
        let mut headers = http::HeaderMap::new();
        headers.insert("x-tenant", http::HeaderValue::from_static("gold"));
        let facts = Facts {
            host: Some("eu.example.com:443"),
            headers: Some(&headers),
            query: Some("version=2"),
        };
        let checks = std::cell::Cell::new(0);
        let find = |path: &str, facts: &Facts| {
            checks.set(0);
            let found = index.first(path, |i| {
                checks.set(checks.get() + 1);
                routes[i].matcher.admits(&Method::GET, path, facts)
            });
            (found, checks.get())
        };
        assert_eq!(find("/r500", &facts), (Some(500), 1));
        assert_eq!(find("/p999/x/y", &facts), (Some(999), 1));
        // Conditions unmet: the one candidate is checked, and no other.
        let elsewhere = Facts {
            host: Some("example.org"),
            ..facts
        };
        assert_eq!(find("/r500", &elsewhere), (None, 1));
        assert_eq!(find("/nowhere", &facts), (None, 0));
    }

    /// The workload `bench/route_conditions.sh` counts instructions of
    /// under callgrind: `SLUICE_BENCH_ROUTES` routes (1,000 unless set),
    /// each a path of its own with a host, a header and a query condition,
    /// and 10,000 lookups spread over them, half meeting the conditions.
    /// Not a test: it asserts nothing about time.
    #[test]
    #[ignore = "a workload for bench/route_conditions.sh"]
    fn lookup_workload() {
        use crate::route::{Conditions, Facts, HostPattern, RouteTable, Wanted};
        let n: usize = std::env::var("SLUICE_BENCH_ROUTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1000);
        let conditions = Conditions {
            hosts: vec![
                HostPattern::Exact("api.example.com".into()),
                HostPattern::Below(".example.com".into()),
            ],
            headers: vec![(
                http::HeaderName::from_static("x-tenant"),
                Wanted::Value(b"gold"[..].into()),
            )],
            query: vec![(b"version"[..].into(), Wanted::Value(b"2"[..].into()))],
        };
        let routes: Vec<Route> = (0..n)
            .map(|i| Route {
                name: Arc::from(format!("r{i}")),
                matcher: Match {
                    path: PathMatch::Prefix(format!("/api/r{i}")),
                    conditions: conditions.clone(),
                    ..Match::default()
                },
                limits: Vec::new(),
                upgrades: Arc::from(Vec::new()),
                tiers: None,
                answers: Default::default(),
                addresses: Default::default(),
            })
            .collect();
        let default = Route {
            name: Arc::from("default"),
            ..routes[0].clone()
        };
        let table = RouteTable::new(&routes, &default);
        let mut gold = http::HeaderMap::new();
        gold.insert("x-tenant", http::HeaderValue::from_static("gold"));
        let paths: Vec<String> = (0..n).map(|i| format!("/api/r{i}/items/7")).collect();
        let mut matched = 0;
        for k in 0..10_000 {
            let facts = Facts {
                host: Some(if k % 2 == 0 {
                    "eu.example.com:443"
                } else {
                    "other.org"
                }),
                headers: Some(&gold),
                query: Some("page=3&version=2"),
            };
            let at = table.find(&Method::GET, &paths[k % n], &facts);
            matched += usize::from(at < n);
        }
        assert_eq!(matched, 5_000);
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
