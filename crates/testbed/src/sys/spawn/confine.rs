//! How a pod's process is confined, decided from its container's
//! `securityContext` (pure: `confinement`), and the pure facts the pre-exec
//! steps (`spawn`) work from: which mounts to make read-only, the devices
//! and links of a minimal /dev, the private directories.

use rustix::mount::MountFlags;

/// How a pod's process is confined, decided from its container's
/// `securityContext` by `confinement`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Confinement {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    /// The capability set (bit n is capability n): the bounding set, and for
    /// uid 0 what the process holds after exec. None keeps every capability
    /// (`privileged: true`).
    pub caps: Option<u64>,
    /// Raised in the ambient set, so that a non-root process keeps the
    /// capabilities its container adds across exec.
    pub ambient: u64,
    pub no_new_privs: bool,
    /// Every mount of the machine read-only (the root, /etc, /usr, /sys,
    /// the cgroup file systems...), the cluster's state (keys, sockets),
    /// pinned BPF objects and `masked_files` hidden, /proc/sys (with runc's
    /// other /proc entries) read-only; private tmpfs at /tmp, /var/tmp
    /// (1777) and /run (empty: no D-Bus, systemd or Docker sockets, no
    /// /run/netns); a minimal /dev. False only for privileged containers
    /// (the host's view).
    pub hide_host: bool,
    /// With `hide_host`: the private /tmp, /var/tmp and /run are read-only
    /// too. Without it (privileged): "/" is remounted read-only.
    pub read_only_root: bool,
}

/// containerd's default capabilities less CAP_NET_RAW (which also allows
/// SO_MARK, the node proxy's capture bypass, since Linux 5.17) and less
/// CAP_MKNOD: runtimes keep MKNOD because a device cgroup forbids opening
/// the nodes made with it; we have no device cgroup program, so a root pod
/// could make and open a node for the machine's disk.
pub const DEFAULT_CAPS: &[caps::Capability] = {
    use caps::Capability::*;
    &[
        CAP_CHOWN,
        CAP_DAC_OVERRIDE,
        CAP_FSETID,
        CAP_FOWNER,
        CAP_SETGID,
        CAP_SETUID,
        CAP_SETFCAP,
        CAP_SETPCAP,
        CAP_NET_BIND_SERVICE,
        CAP_SYS_CHROOT,
        CAP_KILL,
        CAP_AUDIT_WRITE,
    ]
};

fn mask<'a>(names: impl IntoIterator<Item = &'a String>) -> u64 {
    names.into_iter().filter_map(|n| n.parse::<caps::Capability>().ok()).fold(0, |m, c| m | c.bitmask())
}

/// The confinement of a container with settings `sec` (pure). As Kubernetes
/// with containerd: `drop: [ALL]` empties the default set, `add` adds
/// (`ALL`: every capability), named drops remove. Unlike Kubernetes (whose
/// non-root containers lose every capability at exec until KEP-2763), a
/// non-root container keeps what it adds, as ambient capabilities. The
/// process may not gain privileges (no_new_privs) when
/// allowPrivilegeEscalation is false, or, when unset, if it runs as non-root
/// without added capabilities.
pub fn confinement(sec: &slipstream_k8s::ContainerSecurity) -> Confinement {
    let all = caps::all().iter().fold(0u64, |m, c| m | c.bitmask());
    let has_all = |v: &[String]| v.iter().any(|n| n == "ALL");
    let base = Confinement {
        uid: sec.uid,
        gid: sec.gid,
        groups: sec.supplemental_groups.clone(),
        caps: None,
        ambient: 0,
        no_new_privs: false,
        hide_host: false,
        read_only_root: sec.read_only_root_filesystem,
    };
    if sec.privileged {
        return base;
    }
    let mut set = if has_all(&sec.drop) { 0 } else { DEFAULT_CAPS.iter().fold(0, |m, c| m | c.bitmask()) };
    let added = if has_all(&sec.add) { all } else { mask(&sec.add) };
    set |= added;
    set &= !mask(&sec.drop);
    let ambient = if sec.uid != 0 { added & set } else { 0 };
    let no_new_privs = match sec.allow_privilege_escalation {
        Some(allow) => !allow,
        None => sec.uid != 0 && ambient == 0,
    };
    Confinement { caps: Some(set), ambient, no_new_privs, hide_host: true, ..base }
}

/// MS_* flags of a mount's options as /proc/mounts shows them.
fn mount_flags(options: &str) -> MountFlags {
    options.split(',').fold(MountFlags::empty(), |f, o| {
        f | match o {
            "ro" => MountFlags::RDONLY,
            "nosuid" => MountFlags::NOSUID,
            "nodev" => MountFlags::NODEV,
            "noexec" => MountFlags::NOEXEC,
            "noatime" => MountFlags::NOATIME,
            "nodiratime" => MountFlags::NODIRATIME,
            "relatime" => MountFlags::RELATIME,
            _ => MountFlags::empty(),
        }
    })
}

/// A mount point as /proc/mounts writes it: space, tab, newline and
/// backslash as octal escapes (pure).
fn unescape_mount_path(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match (b[i], octal) {
            (b'\\', Some(d)) => {
                out.push(d.iter().fold(0u8, |v, c| v.wrapping_mul(8).wrapping_add(c - b'0')));
                i += 4;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// From /proc/mounts: every mount point with the flags to keep when it is
/// remounted read-only (the per-mount way, for kernels without
/// mount_setattr), in table order (parents first), each once; and the flags
/// of "/". Automount points are left out: resolving one mounts it (pure).
pub fn read_only_mounts(proc_mounts: &str) -> (Vec<(String, MountFlags)>, MountFlags) {
    let mut out: Vec<(String, MountFlags)> = Vec::new();
    let mut root = MountFlags::empty();
    for l in proc_mounts.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 4 || f[2] == "autofs" {
            continue;
        }
        let (target, flags) = (unescape_mount_path(f[1]), mount_flags(f[3]));
        if target == "/" {
            root = flags;
        }
        match out.iter_mut().find(|(t, _)| *t == target) {
            // Mounted over: the one on top is the one a path reaches.
            Some(prev) => prev.1 = flags,
            None => out.push((target, flags)),
        }
    }
    (out, root)
}

/// A confined process's PID namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PidNamespace {
    /// Its own, whose PID 1 is pod-init's reaper: it sees only itself and
    /// its children (a container).
    New,
    /// The one of a running container, named by the host pid of the
    /// container's pod-init (the pid `status` shows): `exec` and exec probes
    /// see the container's processes, as in Kubernetes.
    JoinContainer(i32),
}

/// Device nodes of a confined pod's /dev: (name, major, minor), the set
/// runc makes.
pub const DEVICES: [(&str, u32, u32); 6] =
    [("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9), ("tty", 5, 0)];
/// Symlinks of a confined pod's /dev: (name, target).
pub const DEV_LINKS: [(&str, &str); 5] = [
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("ptmx", "pts/ptmx"),
];

/// Whether a process whose /proc/PID/cgroup reads `proc_cgroup` is in the
/// cgroup directory `dir` (a path under the cgroup2 mount) (pure).
pub fn in_cgroup(proc_cgroup: &str, dir: &std::path::Path) -> bool {
    proc_cgroup.lines().filter_map(|l| l.strip_prefix("0::")).any(|rel| rel.len() > 1 && dir.ends_with(rel.trim_start_matches('/')))
}

/// Private tmpfs of a confined pod: (mount point, options).
pub const PRIVATE_DIRS: [(&str, &str); 3] = [("/tmp", "mode=1777"), ("/var/tmp", "mode=1777"), ("/run", "mode=755")];

/// The private directory `path` lies under, if any (pure).
pub fn under_private_dir(path: &std::path::Path) -> Option<&'static str> {
    PRIVATE_DIRS.iter().map(|(d, _)| *d).find(|d| path.starts_with(d) && path != std::path::Path::new(d))
}

#[cfg(test)]
mod tests {
    use super::*;
    use caps::Capability::*;
    use slipstream_k8s::ContainerSecurity;

    fn bits(c: &[caps::Capability]) -> u64 {
        c.iter().fold(0, |m, c| m | c.bitmask())
    }

    fn sec(uid: u32, add: &[&str], drop: &[&str], ape: Option<bool>) -> ContainerSecurity {
        ContainerSecurity {
            uid,
            gid: uid,
            add: add.iter().map(|s| s.to_string()).collect(),
            drop: drop.iter().map(|s| s.to_string()).collect(),
            allow_privilege_escalation: ape,
            ..Default::default()
        }
    }

    #[test]
    fn confinement_table() {
        let default = bits(DEFAULT_CAPS);
        let all = caps::all().iter().fold(0, |m, c| m | c.bitmask());
        // (settings, caps, ambient, no_new_privs)
        let cases: Vec<(ContainerSecurity, Option<u64>, u64, bool)> = vec![
            // Nothing set: root with containerd's defaults less NET_RAW.
            (sec(0, &[], &[], None), Some(default), 0, false),
            (sec(0, &[], &["ALL"], None), Some(0), 0, false),
            (sec(0, &["CAP_NET_ADMIN"], &[], None), Some(default | CAP_NET_ADMIN.bitmask()), 0, false),
            (sec(0, &["CAP_NET_BIND_SERVICE"], &["ALL"], Some(false)), Some(CAP_NET_BIND_SERVICE.bitmask()), 0, true),
            (sec(0, &[], &["CAP_KILL", "CAP_CHOWN"], None), Some(default & !bits(&[CAP_KILL, CAP_CHOWN])), 0, false),
            (sec(0, &["ALL"], &["CAP_SYS_ADMIN"], None), Some(all & !CAP_SYS_ADMIN.bitmask()), 0, false),
            // Non-root: nothing held; no_new_privs unless escalation is allowed.
            (sec(1000, &[], &[], None), Some(default), 0, true),
            (sec(1000, &[], &["ALL"], Some(true)), Some(0), 0, false),
            // Non-root keeps what it adds, as ambient capabilities.
            (
                sec(1000, &["CAP_NET_BIND_SERVICE"], &["ALL"], None),
                Some(CAP_NET_BIND_SERVICE.bitmask()),
                CAP_NET_BIND_SERVICE.bitmask(),
                false,
            ),
            (sec(1000, &["CAP_NET_ADMIN"], &["CAP_NET_ADMIN"], None), Some(default), 0, true),
        ];
        for (s, caps, ambient, nnp) in cases {
            let c = confinement(&s);
            assert_eq!((c.caps, c.ambient, c.no_new_privs), (caps, ambient, nnp), "{s:?}");
            assert!(c.hide_host && (c.uid, c.gid) == (s.uid, s.gid), "{s:?}");
        }
        assert_eq!(default & (CAP_NET_RAW.bitmask() | CAP_NET_ADMIN.bitmask() | CAP_SYS_ADMIN.bitmask() | CAP_SYS_PTRACE.bitmask()), 0);
        // No MKNOD: without a device cgroup, a node for the disk could be opened.
        assert_eq!(default & CAP_MKNOD.bitmask(), 0);
        assert_eq!(confinement(&sec(0, &["CAP_MKNOD"], &[], None)).caps, Some(default | CAP_MKNOD.bitmask()), "unless added");
        let p = confinement(&ContainerSecurity { privileged: true, read_only_root_filesystem: true, ..Default::default() });
        assert_eq!((p.caps, p.hide_host, p.no_new_privs, p.read_only_root), (None, false, false, true), "privileged: the host's view");
    }

    #[test]
    fn in_cgroup_matches_the_pods_cgroup_only() {
        let dir = std::path::Path::new("/sys/fs/cgroup/slipstream/c1/pods/default.web");
        let cases = [
            ("0::/slipstream/c1/pods/default.web\n", true),
            ("12:cpu:/x\n0::/slipstream/c1/pods/default.web\n", true),
            ("0::/slipstream/c1/pods/default.web2\n", false),
            ("0::/slipstream/c1/pods/other.web\n", false),
            ("0::/\n", false),
            ("", false),
        ];
        for (text, want) in cases {
            assert_eq!(in_cgroup(text, dir), want, "{text:?}");
        }
    }

    #[test]
    fn read_only_mounts_from_proc_mounts() {
        let m = "/dev/vda / ext4 rw,nosuid,relatime 0 0\nsysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0\n\
                 tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0\ncgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0\n\
                 cgroup2 /sys/fs/cgroup/unified cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\nbpf /sys/fs/bpf bpf rw,relatime 0 0\n\
                 proc /proc proc rw,nosuid 0 0\ntmpfs /run tmpfs rw,nosuid,nodev 0 0\n\
                 systemd-1 /proc/sys/fs/binfmt_misc autofs rw,relatime 0 0\n\
                 /dev/vdb /mnt/my\\040disk ext4 ro,noexec 0 0\ntmpfs /run tmpfs rw,nosuid,nodev,noexec 0 0\n";
        let (ro, root) = read_only_mounts(m);
        let targets: Vec<&str> = ro.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(
            targets,
            ["/", "/sys", "/sys/fs/cgroup", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/unified", "/sys/fs/bpf", "/proc", "/run", "/mnt/my disk"],
            "every mount once, escapes decoded, automount points left out"
        );
        assert_eq!(ro[1].1, MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC | MountFlags::RELATIME, "its flags kept");
        assert_eq!(ro[7].1, MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC, "/run mounted twice: the top one's flags");
        assert_eq!(ro[8].1, MountFlags::RDONLY | MountFlags::NOEXEC);
        assert_eq!(root, MountFlags::NOSUID | MountFlags::RELATIME);
    }

    #[test]
    fn binaries_under_private_dirs_are_kept() {
        use std::path::Path;
        for (path, want) in [
            ("/var/tmp/slipstream-target/release/slipstream", Some("/var/tmp")),
            ("/tmp/x/slipstream", Some("/tmp")),
            ("/usr/local/bin/slipstream", None),
            ("/tmpx/slipstream", None),
            ("/run", None),
        ] {
            assert_eq!(under_private_dir(Path::new(path)), want, "{path}");
        }
    }

    #[test]
    fn mount_paths_are_unescaped() {
        for (raw, want) in
            [("/a\\040b", "/a b"), ("/t\\011x\\012", "/t\tx\n"), ("/back\\134slash", "/back\\slash"), ("/x\\9", "/x\\9"), ("/", "/")]
        {
            assert_eq!(unescape_mount_path(raw), want, "{raw}");
        }
    }
}
