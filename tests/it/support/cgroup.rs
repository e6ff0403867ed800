//! Real cgroups for one test: a memory one (and what a process in it
//! holds), and a CPU one that starves a process of CPU time.

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
    launcher_into(&cgroup.procs())
}

/// A shell launcher that writes its own pid to `procs` (a cgroup's
/// `cgroup.procs`), then runs the command in place.
pub fn launcher_into(procs: &str) -> Vec<String> {
    let enter = format!("echo $$ > '{procs}' && exec \"$@\"");
    vec!["sh".into(), "-c".into(), enter, "sh".into()]
}

/// A CPU cgroup made for one test, removed on drop: a bandwidth quota
/// (cgroup v1 `cpu.cfs_quota_us`, v2 `cpu.max`) throttles what runs in
/// it, as a pod's CPU limit does.
pub struct CpuCgroup {
    dir: PathBuf,
    v2: bool,
}

impl CpuCgroup {
    /// Without a quota yet (see [`CpuCgroup::limit`]). Panics when none
    /// can be made: the starvation is the condition under test.
    pub fn new() -> CpuCgroup {
        let name = format!("sluice-test-cpu-{}-{}", std::process::id(), nanos());
        let candidates = [
            (Path::new("/sys/fs/cgroup/cpu"), "cpu", false),
            (Path::new("/sys/fs/cgroup"), "", true),
            (Path::new("/sys/fs/cgroup/unified"), "", true),
        ];
        let mut tried = Vec::new();
        for (root, controller, v2) in candidates {
            let Some(own) = own_cgroup(controller) else {
                tried.push(format!("no `{controller}` line in /proc/self/cgroup"));
                continue;
            };
            let parent = root.join(own.trim_start_matches('/'));
            let file = if v2 { "cpu.max" } else { "cpu.cfs_quota_us" };
            if !parent.join("cgroup.procs").exists() {
                tried.push(format!("{}: not a cgroup directory", parent.display()));
                continue;
            }
            let dir = parent.join(&name);
            if let Err(e) = std::fs::create_dir(&dir) {
                tried.push(format!("{}: {e}", dir.display()));
                continue;
            }
            if dir.join(file).exists() {
                return CpuCgroup { dir, v2 };
            }
            tried.push(format!("{}: no {file}", dir.display()));
            let _ = std::fs::remove_dir(&dir);
        }
        panic!("no CPU cgroup could be made here: {tried:?}");
    }

    pub fn procs(&self) -> String {
        self.dir.join("cgroup.procs").display().to_string()
    }

    /// At most `quota` of CPU time in every `period`, all threads together.
    pub fn limit(&self, quota: Duration, period: Duration) {
        let (quota, period) = (quota.as_micros(), period.as_micros());
        let written = if self.v2 {
            std::fs::write(self.dir.join("cpu.max"), format!("{quota} {period}"))
        } else {
            std::fs::write(self.dir.join("cpu.cfs_period_us"), period.to_string())
                .and_then(|()| std::fs::write(self.dir.join("cpu.cfs_quota_us"), quota.to_string()))
        };
        written.unwrap_or_else(|e| panic!("{}: setting the quota: {e}", self.dir.display()));
    }

    /// Periods in which the quota ran out and the processes waited
    /// (`nr_throttled` of `cpu.stat`).
    pub fn throttled(&self) -> u64 {
        std::fs::read_to_string(self.dir.join("cpu.stat"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| {
                        l.strip_prefix("nr_throttled ")
                            .map(|n| n.trim().parse().ok())
                    })
                    .flatten()
            })
            .unwrap_or(0)
    }
}

impl Drop for CpuCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
