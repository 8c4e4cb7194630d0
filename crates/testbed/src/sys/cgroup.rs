//! cgroup v2: one cgroup per pod and per mesh process, so that stopping a
//! pod kills all its processes and nothing escapes cleanup.

use std::path::{Path, PathBuf};

use crate::sys::signals::Signal;
use std::time::{Duration, Instant};

/// The cgroup2 mount point, read from /proc/mounts (hybrid layouts put it at
/// /sys/fs/cgroup/unified; pure v2 at /sys/fs/cgroup).
pub fn cgroup2_mount() -> Result<PathBuf, String> {
    let mounts = std::fs::read_to_string("/proc/mounts").map_err(|e| format!("cannot read /proc/mounts: {e}"))?;
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && f[2] == "cgroup2").then(|| PathBuf::from(f[1]))
        })
        .next()
        .ok_or_else(|| "no cgroup2 file system is mounted (Slipstream needs cgroup v2; see /proc/mounts)".to_string())
}

pub fn create(path: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(path)
}

/// Kills every process in the cgroup subtree and waits until it is empty.
/// Uses `cgroup.kill` (Linux 5.14+) and falls back to signalling each pid.
pub fn kill_tree(path: &Path, timeout: Duration) -> Result<(), String> {
    if !path.exists() {
        return Ok(());
    }
    let deadline = Instant::now() + timeout;
    let has_kill = path.join("cgroup.kill").exists();
    loop {
        if has_kill {
            let _ = std::fs::write(path.join("cgroup.kill"), "1");
        } else {
            for pid in pids_recursive(path) {
                let _ = crate::sys::signals::kill(pid, Signal::KILL);
            }
        }
        if pids_recursive(path).is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("processes in {} survived SIGKILL: {:?}", path.display(), pids_recursive(path)));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `sig` to every process of the subtree (graceful stop).
pub fn signal_tree(path: &Path, sig: Signal) {
    for pid in pids_recursive(path) {
        let _ = crate::sys::signals::kill(pid, sig);
    }
}

pub fn pids_recursive(path: &Path) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(s) = std::fs::read_to_string(path.join("cgroup.procs")) {
        out.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(path) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.extend(pids_recursive(&e.path()));
            }
        }
    }
    out
}

/// Removes the subtree (cgroups must be empty; children first).
pub fn remove_tree(path: &Path) -> Result<(), String> {
    if !path.exists() {
        return Ok(());
    }
    if let Ok(rd) = std::fs::read_dir(path) {
        for e in rd.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                remove_tree(&e.path())?;
            }
        }
    }
    std::fs::remove_dir(path).map_err(|e| format!("cannot remove cgroup {}: {e}", path.display()))
}

/// [`remove_tree`], retried while the kernel still holds a cgroup busy:
/// after SIGKILL a task leaves `cgroup.procs` at once but keeps its cgroup
/// populated until it has finished exiting, which can take seconds when
/// its exit waits on the kernel (releasing BPF links and network devices
/// under a busy rtnl lock while other namespaces are being torn down).
pub fn remove_tree_patiently(path: &Path, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        match remove_tree(path) {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= deadline => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Total CPU time (user+system) consumed by the cgroup, from `cpu.stat`
/// (present on every cgroup2 directory).
pub fn cpu_usage(path: &Path) -> Option<Duration> {
    let s = std::fs::read_to_string(path.join("cpu.stat")).ok()?;
    s.lines().find_map(|l| l.strip_prefix("usage_usec ")).and_then(|v| v.trim().parse::<u64>().ok()).map(Duration::from_micros)
}
