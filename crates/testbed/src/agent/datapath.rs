//! How the cluster's pods reach their node proxy (the CNI's choice): the
//! eBPF datapath when the kernel can run it, nftables capture otherwise.
//! `--datapath auto` (the default) tries eBPF and says in the log why it
//! fell back; `ebpf` fails instead of falling back; `nftables` never tries.

use super::node::Node;
use crate::names::Paths;
use serde::Serialize;
use slipstream_ebpf::{Datapath, PodAttach};
use std::net::Ipv4Addr;

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

/// The datapath that runs.
pub enum Capture {
    Ebpf(Datapath),
    /// With the reason when eBPF was wanted but could not run.
    Nftables {
        fallback: Option<String>,
    },
}

impl Capture {
    /// Chooses and, for eBPF, loads the programs (pinning the shared maps
    /// the node proxies open): before any node proxy starts.
    pub fn choose(mode: Mode, paths: &Paths) -> anyhow::Result<Capture> {
        if mode == Mode::Nftables {
            tracing::info!("datapath: nftables capture (--datapath nftables)");
            return Ok(Capture::Nftables { fallback: None });
        }
        match Datapath::load(&paths.bpf_dir).and_then(|mut dp| dp.attach_socket_hooks().map(|_| dp)) {
            Ok(dp) => {
                tracing::info!(dir = %paths.bpf_dir.display(), "datapath: eBPF (socket hooks at the cgroup2 root: capture, policy and balancing at connect(), UDP policy at sendmsg(); tc ingress on every pod: policy at the destination, inbound capture of meshed pods)");
                Ok(Capture::Ebpf(dp))
            }
            Err(e) if mode == Mode::Auto => {
                let _ = slipstream_ebpf::remove_all(&paths.bpf_dir);
                let why = format!("the kernel cannot run the eBPF datapath: {e}");
                tracing::warn!("datapath: nftables capture, because {why}");
                Ok(Capture::Nftables { fallback: Some(why) })
            }
            Err(e) => {
                let _ = slipstream_ebpf::remove_all(&paths.bpf_dir);
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

    /// Puts a new pod's sandbox on the datapath, before its first process.
    /// `nftables`: a pod that asked to stay on the nftables path
    /// (`slipstream.io/datapath: nftables`): on the eBPF datapath it gets
    /// no program at all (nftables capture if meshed; its policy is the
    /// proxy's and, outside the mesh, the nftables forward path's).
    pub fn enrol(&mut self, key: &str, netns: &str, ip: Ipv4Addr, node: &Node, meshed: bool, nftables: bool) -> Result<(), String> {
        match self {
            Capture::Nftables { .. } => {
                if meshed {
                    crate::sys::capture::enable(netns).map_err(|e| format!("capture: {e}"))?;
                }
                Ok(())
            }
            Capture::Ebpf(_) if nftables => {
                if meshed {
                    crate::sys::capture::enable(netns).map_err(|e| format!("capture: {e}"))?;
                }
                Ok(())
            }
            Capture::Ebpf(dp) => {
                if meshed {
                    crate::sys::capture::enable_ebpf_support(netns).map_err(|e| format!("capture: {e}"))?;
                }
                let netns_path = crate::names::netns_path(netns);
                let p = PodAttach { key, netns: &netns_path, ip, node: node.index as u16, meshed };
                dp.enrol(&p).map_err(|e| format!("eBPF datapath: {e}"))
            }
        }
    }

    /// Switches a running pod's capture on or off (ambient enrolment of a
    /// pod that already runs, without restarting it). Its connections open
    /// at that moment keep their path; new ones take the new one.
    pub fn set_meshed(&mut self, key: &str, netns: &str, ip: Ipv4Addr, node: &Node, meshed: bool, nftables: bool) -> Result<(), String> {
        match self {
            Capture::Ebpf(_) if !nftables => self.enrol(key, netns, ip, node, meshed, nftables),
            _ if meshed => crate::sys::capture::enable(netns).map_err(|e| format!("capture: {e}")),
            _ => crate::sys::capture::disable(netns).map_err(|e| format!("capture: {e}")),
        }
    }

    /// Takes a deleted pod off the datapath.
    pub fn withdraw(&mut self, key: &str, ip: Ipv4Addr) {
        if let Capture::Ebpf(dp) = self {
            if let Err(e) = dp.withdraw(key, ip) {
                tracing::warn!(pod = key, "eBPF datapath: {e}");
            }
        }
    }
}

/// The key of a pod on the datapath: the name of its links' directory.
/// bpffs refuses names with a dot; namespaces have none and neither
/// namespaces nor pod names can hold `_`, so this is unique.
pub fn pod_key(namespace: &str, name: &str) -> String {
    format!("{namespace}_{}", name.replace('.', "_"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn pod_keys_have_no_dot_and_stay_unique() {
        assert_eq!(super::pod_key("default", "web-0"), "default_web-0");
        assert_eq!(super::pod_key("prod", "a.b"), "prod_a_b");
        assert_ne!(super::pod_key("a", "b-c"), super::pod_key("a-b", "c"));
    }
}
