//! A real memory cgroup for one test, and what a process in it holds.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// A memory cgroup made for one test, removed on drop (after the process
/// in it has gone).
pub struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    /// On cgroup v1's memory hierarchy, or else on cgroup v2 with the
    /// memory controller enabled below the root. Panics when neither can
    /// be made: the bound is the behaviour under test, so a machine where
    /// no limit can be set cannot pass it.
    pub fn new(limit: u64) -> MemoryCgroup {
        let name = format!("sluice-test-{}-{}", std::process::id(), nanos());
        let candidates = [
            (
                Path::new("/sys/fs/cgroup/memory"),
                "memory.limit_in_bytes",
                "memory",
            ),
            (Path::new("/sys/fs/cgroup"), "memory.max", ""),
            (Path::new("/sys/fs/cgroup/unified"), "memory.max", ""),
        ];
        let mut tried = Vec::new();
        for (root, file, controller) in candidates {
            // Below the test's own cgroup, so the limit only ever tightens
            // what the test already runs under.
            let Some(own) = own_cgroup(controller) else {
                tried.push(format!("no `{controller}` line in /proc/self/cgroup"));
                continue;
            };
            let parent = root.join(own.trim_start_matches('/'));
            if !parent.join("cgroup.procs").exists() {
                tried.push(format!("{}: not a cgroup directory", parent.display()));
                continue;
            }
            let dir = parent.join(&name);
            if let Err(e) = std::fs::create_dir(&dir) {
                tried.push(format!("{}: {e}", dir.display()));
                continue;
            }
            match std::fs::write(dir.join(file), limit.to_string()) {
                Ok(()) => return MemoryCgroup { dir },
                Err(e) => {
                    tried.push(format!("{}: {e}", dir.join(file).display()));
                    let _ = std::fs::remove_dir(&dir);
                }
            }
        }
        panic!("no memory cgroup could be made here: {tried:?}");
    }

    pub fn procs(&self) -> String {
        self.dir.join("cgroup.procs").display().to_string()
    }

    /// Times the limit was hit (v1 `memory.failcnt`; v2 `memory.events` max).
    pub fn limit_hits(&self) -> u64 {
        if let Ok(text) = std::fs::read_to_string(self.dir.join("memory.failcnt")) {
            return text.trim().parse().unwrap_or(u64::MAX);
        }
        std::fs::read_to_string(self.dir.join("memory.events"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix("max ").map(|n| n.trim().parse().ok()))
                    .flatten()
            })
            .unwrap_or(u64::MAX)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // The sidecar is dropped (killed and reaped) first; an emptied
        // cgroup can be removed.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// This process's cgroup path on the hierarchy of `controller` (`""`:
/// cgroup v2's single hierarchy).
fn own_cgroup(controller: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let wanted = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        wanted.then(|| path.to_owned())
    })
}

fn nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// VmRSS of `pid`, in bytes (0 once it has gone).
pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// A shell launcher that moves the command it runs into `cgroup` first
/// (for `Sidecar::start_via`).
pub fn launcher(cgroup: &MemoryCgroup) -> Vec<String> {
    let enter = format!("echo $$ > '{}' && exec \"$@\"", cgroup.procs());
    vec!["sh".into(), "-c".into(), enter, "sh".into()]
}
