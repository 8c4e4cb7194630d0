//! The pod-enrolment controller (the CNI's part): puts a pod's network
//! namespace on the datapath when its sandbox is made, switches its capture
//! on or off while it runs (Istio ambient's enrolment without a restart),
//! and takes it off when the pod goes.
//!
//! Its inputs are plain data: the pod's identity and address ([`PodRef`]:
//! its datapath key, its network namespace, its IP, the index of the node
//! whose proxy serves it), whether its labels want it in the mesh, whether
//! the node proxy already serves it, and the datapath handle
//! ([`Capture`]). It reads nothing of the local cluster's API server or
//! object store. [`next_step`] is the decision, pure, and the product's
//! (`slipstream_cni::enrol`, which the node agent on Kubernetes applies);
//! [`reconcile`] applies it here.

use super::datapath::Capture;
use slipstream_cni::datapath::Pod;
use std::net::Ipv4Addr;

/// One pod as the enrolment controller sees it.
#[derive(Debug, Clone)]
pub struct PodRef {
    /// `namespace/name`, for log lines.
    pub name: String,
    /// Its name on the datapath (`datapath::pod_key`).
    pub key: String,
    /// Its network namespace's name (under /run/netns).
    pub netns: String,
    pub ip: Ipv4Addr,
    /// The 1-based index of its node: whose node proxy serves it.
    pub node: u16,
    /// It stays on nftables capture even on the eBPF datapath
    /// (`slipstream.io/datapath: nftables`).
    pub nftables: bool,
}

/// Runs `f` with the pod as the datapath takes it (its namespace by path).
fn on_datapath<T>(pod: &PodRef, meshed: bool, f: impl FnOnce(&Pod<'_>) -> T) -> T {
    let netns = crate::names::netns_path(&pod.netns);
    f(&Pod { key: &pod.key, netns: &netns, ip: pod.ip, node: pod.node, meshed })
}

pub use slipstream_cni::enrol::{next_step, State, Step};

/// Puts a new pod's sandbox on the datapath, before its first process
/// runs: a meshed app never sends a byte outside the mesh, and on the eBPF
/// datapath every pod's connect() meets policy.
pub fn add(capture: &mut Capture, pod: &PodRef, meshed: bool) -> Result<(), String> {
    // The local cluster's kubelet probes are not rewritten.
    on_datapath(pod, meshed, |p| capture.enrol(p, pod.nftables, None))
}

/// Takes a pod off the datapath (its processes are gone).
pub fn release(capture: &mut Capture, pod: &PodRef) {
    if let Err(e) = capture.withdraw(&pod.key, pod.ip) {
        tracing::warn!(pod = %pod.name, "{e}");
    }
}

/// Takes one step towards what the pod's labels want; a failed step is
/// logged and retried at the next call.
pub fn reconcile(capture: &mut Capture, pod: &PodRef, state: &mut State, want: bool, served: bool) {
    let Some(step) = next_step(*state, want, served) else { return };
    match step {
        Step::Admit => {
            tracing::info!(pod = %pod.name, "enrolling in the mesh (its labels now say ambient): the node proxy first, then capture");
            state.meshed = true;
        }
        Step::Capture => match on_datapath(pod, true, |p| capture.set_meshed(p, pod.nftables, None)) {
            Ok(()) => {
                state.captured = true;
                tracing::info!(pod = %pod.name, "enrolled in the mesh without a restart: its new connections are captured");
            }
            Err(e) => tracing::warn!(pod = %pod.name, "enrolling in the mesh: {e} (retried)"),
        },
        Step::Release => match on_datapath(pod, false, |p| capture.set_meshed(p, pod.nftables, None)) {
            Ok(()) => {
                state.captured = false;
                state.meshed = false;
                tracing::info!(pod = %pod.name, "left the mesh without a restart: capture off, the node proxy lets it go");
            }
            Err(e) => tracing::warn!(pod = %pod.name, "leaving the mesh: {e} (retried)"),
        },
        Step::Forget => state.meshed = false,
    }
}
