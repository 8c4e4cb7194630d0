//! How the cluster's pods reach their node proxy (the CNI's choice): the
//! eBPF datapath when the kernel can run it, nftables capture otherwise.
//! `--datapath auto` (the default) tries eBPF and says in the log why it
//! fell back; `ebpf` fails instead of falling back; `nftables` never tries.

use super::flows::{self, FlowLog};
use crate::names::Paths;

pub use slipstream_cni::datapath::{pod_key, Capture, Mode};

/// Chooses the datapath of the local cluster (one bpffs directory for all
/// its nodes, hooks at the cgroup2 root, no probe source) before any
/// node proxy starts.
fn choose(mode: Mode, paths: &Paths) -> anyhow::Result<Capture> {
    Capture::choose(mode, &slipstream_cni::datapath::Placement::local(paths.bpf_dir.clone()))
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

impl Datapath {
    /// Chooses the datapath (`Capture::choose`) and starts reading its
    /// flow events.
    pub fn start(mode: Mode, paths: &Paths) -> anyhow::Result<Datapath> {
        let capture = choose(mode, paths)?;
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
        if let Capture::Ebpf(slipstream_cni::datapath::Ebpf { dp, .. }) = &mut self.capture {
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
