//! The pod-enrolment decision, shared by the node agent on Kubernetes and
//! the local cluster's agent: whether a pod belongs in the mesh (its
//! labels and its namespace's, as Istio ambient reads them), and the next
//! step that takes a running pod there or out without restarting it.
//!
//! The order is the point: a pod enters through the node proxy first (its
//! listeners are open before any of its connections is captured) and
//! leaves through its capture first (no connection is captured towards a
//! listener that is gone). [`next_step`] is pure; each agent applies it
//! with its own I/O.

use std::collections::BTreeMap;

/// The label Istio users already put on namespaces (and pods).
pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";

/// Meshed when the pod says `ambient`, or its namespace does and the pod
/// does not opt out with `none`.
pub fn is_meshed(namespace_labels: &BTreeMap<String, String>, pod_labels: &BTreeMap<String, String>) -> bool {
    match pod_labels.get(DATAPLANE_MODE).map(String::as_str) {
        Some("none") => false,
        Some("ambient") => true,
        _ => namespace_labels.get(DATAPLANE_MODE).map(String::as_str) == Some("ambient"),
    }
}

/// The label that keeps a pod (or every pod of a namespace) on nftables
/// capture on a node running the eBPF datapath: no program on it (to
/// compare the two side by side, as `slipstream bench` does, or to keep a
/// workload on the older path). Read when the pod is enrolled.
pub const DATAPATH_LABEL: &str = "slipstream.io/datapath";

/// Whether a meshed pod stays on nftables capture (pod label first).
pub fn wants_nftables(namespace_labels: &BTreeMap<String, String>, pod_labels: &BTreeMap<String, String>) -> bool {
    pod_labels.get(DATAPATH_LABEL).or_else(|| namespace_labels.get(DATAPATH_LABEL)).map(String::as_str) == Some("nftables")
}

/// A pod's uid in the workload API (the control plane names pods so).
pub fn workload_uid(cluster_id: &str, namespace: &str, name: &str) -> String {
    format!("{cluster_id}//Pod/{namespace}/{name}")
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

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn mesh_membership() {
        let amb = labels(&[(DATAPLANE_MODE, "ambient")]);
        let none = labels(&[(DATAPLANE_MODE, "none")]);
        assert!(is_meshed(&amb, &labels(&[])));
        assert!(!is_meshed(&amb, &none), "pods opt out with none");
        assert!(is_meshed(&labels(&[]), &amb), "pods opt in themselves");
        assert!(!is_meshed(&labels(&[]), &labels(&[])));
        let nft = labels(&[(DATAPATH_LABEL, "nftables")]);
        let ebpf = labels(&[(DATAPATH_LABEL, "ebpf")]);
        assert!(wants_nftables(&nft, &labels(&[])) && wants_nftables(&labels(&[]), &nft));
        assert!(!wants_nftables(&nft, &ebpf), "the pod's label first");
        assert!(!wants_nftables(&labels(&[]), &labels(&[])));
        assert_eq!(workload_uid("Kubernetes", "bookinfo", "ratings-v1-x"), "Kubernetes//Pod/bookinfo/ratings-v1-x");
    }
}
