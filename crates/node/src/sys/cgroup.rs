//! The memory limit of this process's cgroup, from the files the kernel
//! shows (cgroup v2 `memory.max`, or v1 `memory.limit_in_bytes` on a
//! hybrid layout): mounts found in /proc/mounts, the cgroup in
//! /proc/self/cgroup, never an assumed path. What the node proxy's buffer
//! budget is derived from (docs/node-proxy.md, "Memory").

use std::path::{Path, PathBuf};

/// A limit at or above this is no limit (v1 writes "no limit" as a
/// huge page-aligned number).
const UNLIMITED: u64 = 1 << 60;

/// Where this process's memory limit file is, from the text of
/// /proc/mounts and /proc/self/cgroup: v2 (`0::/path` under a cgroup2
/// mount) first, then v1's memory controller.
pub fn limit_file(mounts: &str, cgroup: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mount_of = |fstype: &str, option: Option<&str>| {
        mounts.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let ok = f.len() >= 4 && f[2] == fstype && option.is_none_or(|o| f[3].split(',').any(|x| x == o));
            ok.then(|| PathBuf::from(f[1]))
        })
    };
    for line in cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let rel = path.trim_start_matches('/');
        if controllers.is_empty() {
            if let Some(m) = mount_of("cgroup2", None) {
                out.insert(0, m.join(rel).join("memory.max"));
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            if let Some(m) = mount_of("cgroup", Some("memory")) {
                out.push(m.join(rel).join("memory.limit_in_bytes"));
            }
        }
    }
    out
}

/// The limit a file states: None for `max` or a v1 "no limit".
pub fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|n| *n < UNLIMITED)
}

/// This process's memory limit, if its cgroup has one.
pub fn memory_limit() -> Option<u64> {
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    limit_file(&mounts, &cgroup).iter().find_map(|p: &PathBuf| parse_limit(&std::fs::read_to_string(Path::new(p)).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_file_of_v2_and_of_a_hybrid_layout() {
        let hybrid = "tmpfs /sys/fs/cgroup tmpfs rw 0 0\ncgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n";
        let cg = "12:memory:/slipstream/node1\n0::/slipstream/node1\n";
        assert_eq!(
            limit_file(hybrid, cg),
            [
                PathBuf::from("/sys/fs/cgroup/unified/slipstream/node1/memory.max"),
                PathBuf::from("/sys/fs/cgroup/memory/slipstream/node1/memory.limit_in_bytes")
            ]
        );
        let v2 = "cgroup2 /sys/fs/cgroup cgroup2 rw,nsdelegate 0 0\n";
        assert_eq!(limit_file(v2, "0::/kubepods/pod1/c1\n"), [PathBuf::from("/sys/fs/cgroup/kubepods/pod1/c1/memory.max")]);
        assert!(limit_file("", "0::/\n").is_empty(), "no mount: no file");
    }

    #[test]
    fn limits_as_the_kernel_writes_them() {
        assert_eq!(parse_limit("268435456\n"), Some(256 << 20));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None, "v1's no limit");
        assert_eq!(parse_limit("garbage"), None);
    }
}
