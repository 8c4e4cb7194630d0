//! How the cluster's pods reach their node proxy (the CNI's choice): the
//! eBPF datapath when the kernel can run it, nftables capture otherwise.
//! `--datapath auto` (the default) tries eBPF and says in the log why it
//! fell back; `ebpf` fails instead of falling back; `nftables` never tries.

use super::flows::{self, FlowLog};
use crate::names::Paths;
use serde::Serialize;
use slipstream_ebpf::PodAttach;
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
    Ebpf(slipstream_ebpf::Datapath),
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
        match slipstream_ebpf::Datapath::load(&paths.bpf_dir).and_then(|mut dp| dp.attach_socket_hooks().map(|_| dp)) {
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
    pub fn enrol(&mut self, key: &str, netns: &str, ip: Ipv4Addr, node: u16, meshed: bool, nftables: bool) -> Result<(), String> {
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
                let p = PodAttach { key, netns: &netns_path, ip, node, meshed };
                dp.enrol(&p).map_err(|e| format!("eBPF datapath: {e}"))
            }
        }
    }

    /// Switches a running pod's capture on or off (ambient enrolment of a
    /// pod that already runs, without restarting it). Its connections open
    /// at that moment keep their path; new ones take the new one.
    pub fn set_meshed(&mut self, key: &str, netns: &str, ip: Ipv4Addr, node: u16, meshed: bool, nftables: bool) -> Result<(), String> {
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

/// The datapath controller: the capture in use and, on eBPF, the flow
/// events its programs report. Started before any node proxy (they open
/// its pinned maps); [`Datapath::remove`] takes every program, link and map
/// of the cluster away with their pins.
#[derive(Default)]
pub struct Datapath {
    pub capture: Capture,
    /// The datapath's flow events, named (empty with nftables).
    pub flows: FlowLog,
}

impl Default for Capture {
    fn default() -> Self {
        Capture::Nftables { fallback: None }
    }
}

impl Datapath {
    /// Chooses the datapath (`Capture::choose`) and starts reading its
    /// flow events.
    pub fn start(mode: Mode, paths: &Paths) -> anyhow::Result<Datapath> {
        let capture = Capture::choose(mode, paths)?;
        let mut flows = FlowLog::default();
        if capture.is_ebpf() {
            match FlowLog::start(&paths.bpf_dir) {
                Ok(f) => flows = f,
                Err(e) => tracing::warn!("flow events will not be recorded (`slipstream observe` shows none): {e}"),
            }
        }
        Ok(Datapath { capture, flows })
    }

    /// The same services as the nftables rules, for the eBPF datapath's
    /// connect-time balancer (pods outside the mesh go to its choice;
    /// meshed pods' node proxies get it with the address dialed).
    pub fn set_services(&mut self, rules: &[crate::plan::ServiceRule]) {
        if let Capture::Ebpf(dp) = &mut self.capture {
            let lb: Vec<_> = rules
                .iter()
                .filter(|r| r.protocol == slipstream_k8s::Protocol::TCP)
                .map(|r| slipstream_ebpf::ServiceLb { vip: r.vip, port: r.port, endpoints: r.endpoints.clone() })
                .collect();
            if let Err(e) = dp.set_services(&lb) {
                tracing::error!("connect-time load balancing not updated (nftables DNAT still serves): {e}");
            }
        }
    }

    /// Records the flow events read since the last call, naming their ends
    /// from `names` (asked for only when there are events).
    pub fn drain_flows(&mut self, names: impl FnOnce() -> (Vec<flows::PodName>, Vec<String>)) {
        let events = self.flows.take();
        if events.is_empty() {
            return;
        }
        let (pods, nodes) = names();
        self.flows.record(events, &pods, &nodes);
    }

    /// What `status` shows of it.
    pub fn status(&self) -> crate::status::DatapathStatus {
        crate::status::DatapathStatus { mode: self.capture.name().into(), fallback: self.capture.fallback().map(str::to_string) }
    }

    /// Removes every program, link and map of the cluster with its pins.
    pub fn remove(paths: &Paths) {
        if let Err(e) = slipstream_ebpf::remove_all(&paths.bpf_dir) {
            tracing::warn!("cannot remove {}: {e}", paths.bpf_dir.display());
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
