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
//! object store, so a node agent on Kubernetes (issue 39: a CNI plugin and
//! its DaemonSet) can run it unchanged, fed from the CNI's ADD and DEL
//! calls and the node proxy's report of the pods it serves.
//! [`next_step`] is the decision, pure; [`reconcile`] applies it.

use super::datapath::Capture;
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

/// Where a running pod stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct State {
    /// The node proxy carries it (told through pods.json).
    pub meshed: bool,
    /// Its capture is on.
    pub captured: bool,
}

/// What to do next for one running pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Its labels now mesh it: the node proxy first (it serves the pod).
    Admit,
    /// The node proxy serves it: switch its capture on.
    Capture,
    /// Its labels take it out: capture off, then the node proxy lets it go.
    Release,
    /// Not captured yet and no longer wanted: the node proxy lets it go.
    Forget,
}

/// The next step for a pod whose labels `want` it meshed (or not), while
/// its node proxy does (or does not) `serve` it. None: nothing to do.
pub fn next_step(state: State, want: bool, served: bool) -> Option<Step> {
    match (want, state.meshed, state.captured) {
        (true, false, _) => Some(Step::Admit),
        (true, true, false) if served => Some(Step::Capture),
        (false, _, true) => Some(Step::Release),
        (false, true, false) => Some(Step::Forget),
        _ => None,
    }
}

/// Puts a new pod's sandbox on the datapath, before its first process
/// runs: a meshed app never sends a byte outside the mesh, and on the eBPF
/// datapath every pod's connect() meets policy.
pub fn add(capture: &mut Capture, pod: &PodRef, meshed: bool) -> Result<(), String> {
    capture.enrol(&pod.key, &pod.netns, pod.ip, pod.node, meshed, pod.nftables)
}

/// Takes a pod off the datapath (its processes are gone).
pub fn release(capture: &mut Capture, pod: &PodRef) {
    capture.withdraw(&pod.key, pod.ip);
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
        Step::Capture => match capture.set_meshed(&pod.key, &pod.netns, pod.ip, pod.node, true, pod.nftables) {
            Ok(()) => {
                state.captured = true;
                tracing::info!(pod = %pod.name, "enrolled in the mesh without a restart: its new connections are captured");
            }
            Err(e) => tracing::warn!(pod = %pod.name, "enrolling in the mesh: {e} (retried)"),
        },
        Step::Release => match capture.set_meshed(&pod.key, &pod.netns, pod.ip, pod.node, false, pod.nftables) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_proxy_first_then_capture_and_capture_off_first() {
        let s = |meshed, captured| State { meshed, captured };
        // (state, want, served, step)
        let table = [
            (s(false, false), true, false, Some(Step::Admit)),
            (s(false, false), true, true, Some(Step::Admit)),
            (s(true, false), true, false, None),
            (s(true, false), true, true, Some(Step::Capture)),
            (s(true, true), true, true, None),
            (s(true, true), false, true, Some(Step::Release)),
            (s(true, true), false, false, Some(Step::Release)),
            (s(true, false), false, true, Some(Step::Forget)),
            (s(false, false), false, true, None),
        ];
        for (state, want, served, step) in table {
            assert_eq!(next_step(state, want, served), step, "{state:?} want={want} served={served}");
        }
    }
}
