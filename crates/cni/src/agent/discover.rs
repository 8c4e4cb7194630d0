//! The network namespace of a pod that runs already (it existed before the
//! agent, or the agent restarted and lost the CNI's word for it): one of
//! the pod's processes is found by its cgroup (the kubelet puts every
//! container of a pod under `pod<uid>`), and its namespace is matched, by
//! device and inode, with the runtime's file for it under the netns
//! directory, the path the node proxy opens. Needs the host's /proc
//! (`hostPID`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Whether a /proc/PID/cgroup text puts the process in pod `uid`'s cgroup
/// (cgroupfs driver: `pod<uid>`; systemd: `pod<uid with _>.slice`).
pub fn in_pod_cgroup(cgroup: &str, uid: &str) -> bool {
    let (dashed, underscored) = (format!("pod{uid}"), format!("pod{}", uid.replace('-', "_")));
    cgroup.lines().any(|l| {
        l.split('/').any(|part| {
            part == dashed || part.starts_with(&format!("{underscored}.slice")) || part.ends_with(&format!("-{underscored}.slice"))
        })
    })
}

/// The runtime's file of pod `uid`'s network namespace, if found.
pub fn pod_netns(proc_dir: &Path, netns_dir: &Path, uid: &str) -> Option<PathBuf> {
    let pid = std::fs::read_dir(proc_dir).ok()?.flatten().find_map(|e| {
        let name = e.file_name().into_string().ok()?;
        name.parse::<u32>().ok()?;
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).ok()?;
        in_pod_cgroup(&cgroup, uid).then_some(e.path())
    })?;
    let ns = std::fs::metadata(pid.join("ns/net")).ok()?;
    std::fs::read_dir(netns_dir)
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.dev() == ns.dev() && m.ino() == ns.ino()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn pods_are_found_by_their_cgroup() {
        let uid = "0b8e2c7e-1f0a-4b61-9d7a-3c1c5e6f7a8b";
        let cgroupfs = format!("0::/kh-worker-1/kubepods/besteffort/pod{uid}/4f1c\n");
        assert!(super::in_pod_cgroup(&cgroupfs, uid));
        let systemd = "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0b8e2c7e_1f0a_4b61_9d7a_3c1c5e6f7a8b.slice/cri-containerd-4f1c.scope\n";
        assert!(super::in_pod_cgroup(systemd, uid));
        assert!(!super::in_pod_cgroup(&cgroupfs, "0b8e2c7e-1f0a-4b61-9d7a-3c1c5e6f7a8c"), "another pod");
        assert!(!super::in_pod_cgroup(&format!("0::/kubepods/pod{uid}x/1\n"), uid), "a prefix is not a match");
    }

    #[test]
    fn a_pod_with_no_process_is_not_found_and_nothing_fails() {
        assert_eq!(super::pod_netns(std::path::Path::new("/proc"), std::path::Path::new("/nonexistent"), "no-such-uid"), None);
    }
}
