//! How many subjects the memory store may hold, from the memory sluice
//! really has.
//!
//! A container's memory limit is its cgroup's (`memory.max` on cgroup v2,
//! `memory.limit_in_bytes` on v1). A store sized beyond it gets sluice
//! killed by the kernel at the worst moment, and the restart hands every
//! client a fresh bucket; a store that refuses new subjects at its bound
//! keeps every existing one exact. So when `store.max_entries` is not
//! written, it is derived from the tightest limit on sluice's cgroup and
//! its ancestors, leaving room for connections and buffers.

use std::path::{Path, PathBuf};

/// Without a memory limit (or `max_entries` written), the bound is this.
pub const DEFAULT_MAX_ENTRIES: usize = 1_000_000;

/// What one subject costs, rounded up from the 307 bytes of RSS measured
/// with a million subjects (`bench/cardinality.py`: the map entry, its key,
/// the algorithm's state, the map's spare capacity and the allocator's
/// overhead), so a bound never overshoots.
pub const BYTES_PER_ENTRY: u64 = 320;

/// Left for everything but the store: the runtime, buffers and state of
/// about 1,000 connections (measured at 43–61 MB RSS in `bench/`).
pub const RESERVE_BYTES: u64 = 48 << 20;

/// A bound that still lets a small instance work at all.
pub const MIN_ENTRIES: usize = 1024;

/// A cgroup "limit" at or above this is the kernel's "no limit" (v1 writes
/// `PAGE_COUNTER_MAX` pages: 9223372036854771712 bytes).
const UNLIMITED: u64 = 1 << 60;

/// Where the bound came from, for the log line at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// `store.max_entries` as written.
    Configured(usize),
    /// Derived from this many bytes of cgroup memory limit.
    FromMemoryLimit { limit: u64, entries: usize },
    /// No limit found: the default.
    Default(usize),
}

impl Bound {
    pub fn entries(self) -> usize {
        match self {
            Bound::Configured(n) | Bound::Default(n) => n,
            Bound::FromMemoryLimit { entries, .. } => entries,
        }
    }

    /// The bound for a store configured with `max_entries` (if written),
    /// reading this process's cgroups otherwise.
    pub fn resolve(max_entries: Option<usize>) -> Bound {
        if let Some(n) = max_entries {
            return Bound::Configured(n);
        }
        let limit = std::fs::read_to_string("/proc/self/mountinfo")
            .ok()
            .zip(std::fs::read_to_string("/proc/self/cgroup").ok())
            .and_then(|(mounts, cgroups)| memory_limit(&mounts, &cgroups, read_limit));
        match limit {
            Some(limit) => Bound::FromMemoryLimit {
                limit,
                entries: entries_for(limit),
            },
            None => Bound::Default(DEFAULT_MAX_ENTRIES),
        }
    }
}

/// Subjects that fit in `limit` bytes beside the reserve; never above the
/// default (a large limit is no reason to track more than without one), and
/// never below [`MIN_ENTRIES`].
pub fn entries_for(limit: u64) -> usize {
    let room = limit.saturating_sub(RESERVE_BYTES) / BYTES_PER_ENTRY;
    usize::try_from(room)
        .unwrap_or(usize::MAX)
        .clamp(MIN_ENTRIES, DEFAULT_MAX_ENTRIES)
}

/// The tightest memory limit on this process's cgroup and its ancestors,
/// on whichever hierarchy is mounted (v2 preferred), or `None` when there
/// is none. `mounts` is `/proc/self/mountinfo`, `cgroups` is
/// `/proc/self/cgroup`; `read` reads one limit file (`None` if absent).
fn memory_limit(
    mounts: &str,
    cgroups: &str,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<u64> {
    let hierarchies = [
        // (how /proc/self/cgroup names the hierarchy, its limit file)
        (Hierarchy::V2, "memory.max"),
        (Hierarchy::V1Memory, "memory.limit_in_bytes"),
    ];
    hierarchies.into_iter().find_map(|(hierarchy, file)| {
        let (root, mount_point) = mount_of(mounts, hierarchy)?;
        let path = cgroup_of(cgroups, hierarchy)?;
        // The mount shows the hierarchy from `root` down (a container's
        // cgroup namespace shows its own cgroup as `/`).
        let relative = path.strip_prefix(root).unwrap_or(path);
        let mut dir = mount_point.join(relative.trim_start_matches('/'));
        let mut tightest: Option<u64> = None;
        loop {
            let limit = read(&dir.join(file))
                .and_then(|text| text.trim().parse::<u64>().ok())
                .filter(|&n| n < UNLIMITED);
            tightest = match (tightest, limit) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            if dir == mount_point || !dir.pop() {
                break;
            }
        }
        tightest
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hierarchy {
    V2,
    V1Memory,
}

/// `(root, mount point)` of the hierarchy's mount in `mountinfo`.
fn mount_of(mounts: &str, hierarchy: Hierarchy) -> Option<(&str, PathBuf)> {
    mounts.lines().find_map(|line| {
        // id parent major:minor root mount-point options [optional...] - type source super-options
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        let fs_type = right.next()?;
        let super_options = right.nth(1).unwrap_or("");
        let wanted = match hierarchy {
            Hierarchy::V2 => fs_type == "cgroup2",
            Hierarchy::V1Memory => {
                fs_type == "cgroup" && super_options.split(',').any(|o| o == "memory")
            }
        };
        (wanted && fields.len() >= 5).then(|| (fields[3], PathBuf::from(fields[4])))
    })
}

/// This process's path in the hierarchy, from `/proc/self/cgroup`
/// (`0::/path` on v2, `N:memory:/path` on v1).
fn cgroup_of(cgroups: &str, hierarchy: Hierarchy) -> Option<&str> {
    cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = match hierarchy {
            Hierarchy::V2 => controllers.is_empty(),
            Hierarchy::V1Memory => controllers.split(',').any(|c| c == "memory"),
        };
        wanted.then_some(path)
    })
}

fn read_limit(path: &Path) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const V1_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const V1_CGROUPS: &str = "4:memory:/pods/p1/c1\n1:cpu:/\n0::/\n";

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = entries
            .iter()
            .map(|(p, t)| (PathBuf::from(p), t.to_string()))
            .collect();
        move |path| map.get(path).cloned()
    }

    #[test]
    fn the_tightest_limit_on_the_path_up_wins() {
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/pods/p1/c1/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "/sys/fs/cgroup/memory/pods/p1/memory.limit_in_bytes",
                "134217728\n",
            ),
            (
                "/sys/fs/cgroup/memory/pods/memory.limit_in_bytes",
                "1073741824\n",
            ),
            (
                "/sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        // v2 is mounted but this process sits at its root with no limit
        // file, so the v1 memory hierarchy decides.
        assert_eq!(memory_limit(V1_MOUNTS, V1_CGROUPS, read), Some(128 << 20));
    }

    #[test]
    fn unlimited_everywhere_is_no_limit() {
        let read = files(&[
            (
                "/sys/fs/cgroup/memory/pods/p1/c1/memory.limit_in_bytes",
                "9223372036854771712",
            ),
            ("/sys/fs/cgroup/unified/memory.max", "max\n"),
        ]);
        assert_eq!(memory_limit(V1_MOUNTS, V1_CGROUPS, read), None);
    }

    #[test]
    fn cgroup_v2_in_a_container_namespace() {
        // The container sees its own cgroup as `/`, mounted at /sys/fs/cgroup.
        let mounts = "29 23 0:26 / /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw\n";
        let read = files(&[("/sys/fs/cgroup/memory.max", "268435456\n")]);
        assert_eq!(memory_limit(mounts, "0::/\n", read), Some(256 << 20));
        // Without a namespace: the full path below the root.
        let read = files(&[
            ("/sys/fs/cgroup/kubepods/pod1/memory.max", "max"),
            ("/sys/fs/cgroup/kubepods/memory.max", "536870912"),
        ]);
        assert_eq!(
            memory_limit(mounts, "0::/kubepods/pod1\n", read),
            Some(512 << 20)
        );
    }

    #[test]
    fn a_mount_rooted_below_the_hierarchy_root_is_followed() {
        let mounts = "35 31 0:32 /pods /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let read = files(&[("/sys/fs/cgroup/memory/p1/memory.limit_in_bytes", "67108864")]);
        assert_eq!(
            memory_limit(mounts, "4:memory:/pods/p1\n", read),
            Some(64 << 20)
        );
    }

    #[test]
    fn entries_leave_the_reserve_and_stay_within_the_default() {
        // The chart's 128Mi: (128 - 48) MiB / 320 bytes.
        assert_eq!(entries_for(128 << 20), 262_144);
        assert_eq!(entries_for(64 << 20), 52_428);
        assert_eq!(entries_for(16 << 20), MIN_ENTRIES);
        assert_eq!(entries_for(64 << 30), DEFAULT_MAX_ENTRIES);
        assert_eq!(Bound::resolve(Some(7)), Bound::Configured(7));
    }
}
