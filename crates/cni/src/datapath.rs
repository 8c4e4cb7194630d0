//! How a node's pods reach their node proxy (the CNI's choice), for the
//! local cluster's agent and the node agent on Kubernetes alike: the eBPF
//! datapath when the kernel can run it, nftables capture otherwise.
//! `auto` tries eBPF and says in the log why it fell back; `ebpf` fails
//! instead of falling back; `nftables` never tries.
//!
//! The decisions of what a pod gets (programs, rules, sysctls) are here;
//! the programs and maps are `slipstream_ebpf`'s, the rules `capture`'s.

use crate::capture;
use serde::Serialize;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Auto,
    Ebpf,
    Nftables,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::Ebpf => "ebpf",
            Mode::Nftables => "nftables",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Mode::Auto),
            "ebpf" => Ok(Mode::Ebpf),
            "nftables" => Ok(Mode::Nftables),
            other => Err(format!("unknown datapath {other:?}: auto, ebpf or nftables")),
        }
    }
}

/// Where the eBPF datapath lives on this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The bpffs directory of its pinned maps and links.
    pub bpf_dir: PathBuf,
    /// The cgroup2 directory its socket hooks attach to (every socket of a
    /// process below it meets them); None: the root of the hierarchy.
    pub cgroup: Option<PathBuf>,
    /// The programs' load-time settings.
    pub options: slipstream_ebpf::Options,
    /// Where `/proc/sys/net` is writable for this process
    /// (`capture::enable_ebpf_support`).
    pub sysctl_net: PathBuf,
}

impl Placement {
    /// The local cluster's: `bpf_dir`, hooks at the cgroup2 root, no probe
    /// source, this process's own /proc/sys/net.
    pub fn local(bpf_dir: PathBuf) -> Placement {
        Placement { bpf_dir, cgroup: None, options: Default::default(), sysctl_net: PathBuf::from(capture::SYSCTL_NET) }
    }
}

/// The eBPF datapath as it runs.
#[derive(Debug)]
pub struct Ebpf {
    pub dp: slipstream_ebpf::Datapath,
    sysctl_net: PathBuf,
}

/// The datapath that runs.
#[derive(Debug)]
pub enum Capture {
    Ebpf(Ebpf),
    /// With the reason when eBPF was wanted but could not run.
    Nftables {
        fallback: Option<String>,
    },
}

impl Default for Capture {
    fn default() -> Self {
        Capture::Nftables { fallback: None }
    }
}

impl Capture {
    /// Chooses and, for eBPF, loads the programs (pinning the shared maps
    /// the node proxies open) and attaches the socket hooks: before any
    /// node proxy starts. A restart finds its pins and keeps them (the
    /// programs replaced in place, `Datapath::load`).
    pub fn choose(mode: Mode, at: &Placement) -> anyhow::Result<Capture> {
        if mode == Mode::Nftables {
            tracing::info!("datapath: nftables capture (--datapath nftables)");
            return Ok(Capture::Nftables { fallback: None });
        }
        // A datapath already pinned here (a restart) is never removed on a
        // failure: its programs keep steering and refusing (failing
        // closed) until a load succeeds. Only what this attempt made is.
        let existed = at.bpf_dir.join("maps").exists();
        let cleanup = || {
            if !existed {
                let _ = slipstream_ebpf::remove_all(&at.bpf_dir);
            }
        };
        let loaded = slipstream_ebpf::Datapath::load_with(&at.bpf_dir, &at.options).and_then(|mut dp| {
            match &at.cgroup {
                Some(c) => dp.attach_socket_hooks_at(c)?,
                None => dp.attach_socket_hooks()?,
            }
            Ok(dp)
        });
        match loaded {
            Ok(dp) => {
                let root = at.cgroup.as_ref().map_or_else(|| "the cgroup2 root".to_string(), |c| format!("cgroup {}", c.display()));
                tracing::info!(dir = %at.bpf_dir.display(), "datapath: eBPF (socket hooks at {root}: capture, policy and balancing at connect(), UDP policy at sendmsg(); tc on every pod on it: policy at the destination, inbound capture of meshed pods)");
                Ok(Capture::Ebpf(Ebpf { dp, sysctl_net: at.sysctl_net.clone() }))
            }
            Err(e) if mode == Mode::Auto => {
                cleanup();
                let why = format!("the kernel cannot run the eBPF datapath: {e}");
                tracing::warn!("datapath: nftables capture, because {why}");
                Ok(Capture::Nftables { fallback: Some(why) })
            }
            Err(e) => {
                cleanup();
                anyhow::bail!("--datapath ebpf: the kernel cannot run the eBPF datapath: {e}")
            }
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Capture::Ebpf(_) => "ebpf",
            Capture::Nftables { .. } => "nftables",
        }
    }

    pub fn fallback(&self) -> Option<&str> {
        match self {
            Capture::Ebpf(_) => None,
            Capture::Nftables { fallback } => fallback.as_deref(),
        }
    }

    pub fn is_ebpf(&self) -> bool {
        matches!(self, Capture::Ebpf(_))
    }

    /// Puts a pod's sandbox on the datapath (a new pod before its first
    /// process, or a running one). `nftables`: a pod that asked to stay on
    /// the nftables path (`slipstream.io/datapath: nftables`): on the eBPF
    /// datapath it gets no program at all (nftables capture if meshed; its
    /// policy is the proxy's and, outside the mesh, the nftables forward
    /// path's). `probes`: the kubelet probes' source the nftables rules let
    /// through (the programs were told at load).
    pub fn enrol(&mut self, pod: &Pod<'_>, nftables: bool, probes: Option<Ipv4Addr>) -> Result<(), String> {
        match self {
            Capture::Ebpf(e) if !nftables => {
                if pod.meshed {
                    capture::enable_ebpf_support(pod.netns, &e.sysctl_net).map_err(|e| format!("capture: {e}"))?;
                }
                e.dp.enrol(pod).map_err(|e| format!("eBPF datapath: {e}"))
            }
            _ if pod.meshed => capture::enable(pod.netns, probes).map_err(|e| format!("capture: {e}")),
            _ => Ok(()),
        }
    }

    /// Switches a running pod's capture on or off (ambient enrolment of a
    /// pod that already runs, without restarting it). Its connections open
    /// at that moment keep their path; new ones take the new one.
    pub fn set_meshed(&mut self, pod: &Pod<'_>, nftables: bool, probes: Option<Ipv4Addr>) -> Result<(), String> {
        match self {
            Capture::Ebpf(_) if !nftables => self.enrol(pod, nftables, probes),
            _ if pod.meshed => capture::enable(pod.netns, probes).map_err(|e| format!("capture: {e}")),
            _ => capture::disable(pod.netns).map_err(|e| format!("capture: {e}")),
        }
    }

    /// Takes a meshed pod out of the mesh where only meshed pods are on
    /// the datapath (the node agent on Kubernetes): its capture rules go
    /// and, on eBPF, its programs and map entries too and its sysctls are
    /// put back (both, whichever it had: a pod adopted from an earlier
    /// agent may have either). Its reply route stays (a pod that comes
    /// back needs it; an uninstall removes it).
    pub fn release(&mut self, pod: &Pod<'_>) -> Result<(), String> {
        if let Capture::Ebpf(e) = self {
            e.dp.withdraw(pod.key, pod.ip).map_err(|e| format!("eBPF datapath: {e}"))?;
            capture::set_ebpf_sysctls(pod.netns, false, &e.sysctl_net).map_err(|e| format!("capture: {e}"))?;
        }
        capture::disable(pod.netns).map_err(|e| format!("capture: {e}"))
    }

    /// Whether a pod adopted from an earlier agent is still captured: on
    /// eBPF its links are pinned (or, kept on nftables by its label, its
    /// table is there); on nftables its table is there. A pod that is not
    /// (the datapath was removed, or the install switched from eBPF to
    /// nftables) is captured again by [`Capture::set_meshed`].
    pub fn still_captures(&self, key: &str, netns: &Path) -> bool {
        let nft = || capture::is_enabled(netns).unwrap_or(false);
        match self {
            Capture::Ebpf(e) => e.dp.dir().join("links").join(key).is_dir() || nft(),
            Capture::Nftables { .. } => nft(),
        }
    }

    /// Takes only a pod's programs away (its links), leaving the map
    /// entries of its address: another pod holds that address now.
    pub fn withdraw_links(&mut self, key: &str) -> Result<(), String> {
        match self {
            Capture::Ebpf(e) => {
                let links = e.dp.dir().join("links").join(key);
                match std::fs::remove_dir_all(&links) {
                    Err(err) if err.kind() != std::io::ErrorKind::NotFound => Err(format!("removing {}: {err}", links.display())),
                    _ => Ok(()),
                }
            }
            Capture::Nftables { .. } => Ok(()),
        }
    }

    /// Takes a pod off the datapath: its programs and map entries (a
    /// deleted pod, or one leaving the mesh where only meshed pods are on
    /// the datapath). Idempotent; nothing to do on nftables.
    pub fn withdraw(&mut self, key: &str, ip: Ipv4Addr) -> Result<(), String> {
        match self {
            Capture::Ebpf(e) => e.dp.withdraw(key, ip).map_err(|e| format!("eBPF datapath: {e}")),
            Capture::Nftables { .. } => Ok(()),
        }
    }
}

/// A pod as the datapath takes it (its key, namespace, address, node
/// index, membership): the loader's own type. Its node index is 0 where
/// each node has its own maps, as on Kubernetes.
pub use slipstream_ebpf::PodAttach as Pod;

/// The key of a pod on the datapath: the name of its links' directory.
/// bpffs refuses names with a dot; namespaces have none and neither
/// namespaces nor pod names can hold `_`, so this is unique.
pub fn pod_key(namespace: &str, name: &str) -> String {
    format!("{namespace}_{}", name.replace('.', "_"))
}

/// The cgroup2 directory `subtree` (a path inside the hierarchy, `/` for
/// its root) of the node whose `/sys/fs/cgroup` is at `mount` here (the
/// DaemonSet mounts it at `/host/sys/fs/cgroup`): `mount` itself on a
/// unified host, `mount/unified` on a hybrid one (v1 controllers beside
/// cgroup2). `is_cgroup2` says whether a directory is the root of a
/// cgroup2 file system ([`is_cgroup2`] for the real one).
pub fn node_cgroup(mount: &Path, subtree: &str, is_cgroup2: impl Fn(&Path) -> bool) -> Result<PathBuf, String> {
    let sub = subtree.trim_start_matches('/');
    if sub.split('/').any(|c| c == "..") {
        return Err(format!("the cgroup path {subtree:?} may not climb out of the hierarchy"));
    }
    let root = [mount.to_path_buf(), mount.join("unified")].into_iter().find(|p| is_cgroup2(p)).ok_or_else(|| {
        format!(
            "neither {} nor {}/unified is a cgroup2 hierarchy (is the node's /sys/fs/cgroup mounted there?)",
            mount.display(),
            mount.display()
        )
    })?;
    Ok(if sub.is_empty() { root } else { root.join(sub) })
}

/// A bpffs directory the agent may own whole (uninstall removes it): under
/// `/sys/fs/bpf`, no `..`, and no dot in a name (bpffs refuses them: a
/// `$(NODE_NAME)` with dots, a node named by its FQDN, cannot be used).
pub fn check_bpf_dir(dir: &Path) -> Result<(), String> {
    let rest = dir.strip_prefix("/sys/fs/bpf").map_err(|_| format!("{} is not under /sys/fs/bpf", dir.display()))?;
    if rest.as_os_str().is_empty() {
        return Err("/sys/fs/bpf itself: give a directory of its own (uninstall removes it whole)".into());
    }
    for c in rest.components() {
        let name = c.as_os_str().to_string_lossy();
        if name.contains('.') {
            return Err(format!("{}: bpffs refuses names with a dot ({name:?}; a node name with dots cannot go in it)", dir.display()));
        }
    }
    Ok(())
}

/// Whether `p` is on a cgroup2 file system.
pub fn is_cgroup2(p: &Path) -> bool {
    const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;
    // f_type's width differs by architecture.
    #[allow(clippy::unnecessary_cast)]
    rustix::fs::statfs(p).is_ok_and(|s| s.f_type as i64 == CGROUP2_SUPER_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_keys_have_no_dot_and_stay_unique() {
        assert_eq!(pod_key("default", "web-0"), "default_web-0");
        assert_eq!(pod_key("prod", "a.b"), "prod_a_b");
        assert_ne!(pod_key("a", "b-c"), pod_key("a-b", "c"));
    }

    #[test]
    fn the_nodes_cgroup2_hierarchy_unified_or_hybrid() {
        let mount = Path::new("/host/sys/fs/cgroup");
        let hybrid = |p: &Path| p == Path::new("/host/sys/fs/cgroup/unified");
        let unified = |p: &Path| p == mount;
        assert_eq!(node_cgroup(mount, "/kh-worker1", hybrid).unwrap(), PathBuf::from("/host/sys/fs/cgroup/unified/kh-worker1"));
        assert_eq!(node_cgroup(mount, "/", hybrid).unwrap(), PathBuf::from("/host/sys/fs/cgroup/unified"));
        assert_eq!(node_cgroup(mount, "/", unified).unwrap(), PathBuf::from("/host/sys/fs/cgroup"));
        assert_eq!(node_cgroup(mount, "a/b", unified).unwrap(), PathBuf::from("/host/sys/fs/cgroup/a/b"));
        assert!(node_cgroup(mount, "/", |_| false).unwrap_err().contains("neither /host/sys/fs/cgroup nor"));
        assert!(node_cgroup(mount, "/a/../..", unified).unwrap_err().contains("climb"));
        // The real check: this machine's cgroup2 mount is one, / is not.
        let cg2 = slipstream_ebpf::sys::cgroup2_root().unwrap();
        assert!(is_cgroup2(&cg2) && !is_cgroup2(Path::new("/")));
    }

    #[test]
    fn a_bpf_directory_of_our_own_under_bpffs_without_dots() {
        assert!(check_bpf_dir(Path::new("/sys/fs/bpf/slipstream/kh-worker-1")).is_ok());
        assert!(check_bpf_dir(Path::new("/sys/fs/bpf")).unwrap_err().contains("of its own"));
        assert!(check_bpf_dir(Path::new("/tmp/bpf")).unwrap_err().contains("not under /sys/fs/bpf"));
        assert!(check_bpf_dir(Path::new("/sys/fs/bpf/slipstream/..")).unwrap_err().contains("dot"));
        assert!(check_bpf_dir(Path::new("/sys/fs/bpf/slipstream/ip-10-0-0-1.ec2.internal"))
            .unwrap_err()
            .contains("refuses names with a dot"));
    }

    #[test]
    fn modes_parse_and_name_themselves() {
        for m in [Mode::Auto, Mode::Ebpf, Mode::Nftables] {
            assert_eq!(m.as_str().parse::<Mode>().unwrap(), m);
        }
        assert!("xdp".parse::<Mode>().unwrap_err().contains("auto, ebpf or nftables"));
    }
}
