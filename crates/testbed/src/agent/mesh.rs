//! Mesh membership and each node's pod registrations (the CNI role: what
//! the node proxy is told of its own pods). The mesh itself (workloads,
//! services, policies) is the control plane's, from the objects the agent
//! writes (`agent::api_server`). Pure over the agent's state.

use super::pods::PodRuntime;
use super::store::Store;
use crate::plan;
use slipstream_core::{NodePods, PodRegistration};
use slipstream_k8s::{Labels, Object, ObjectKey};

pub use slipstream_cni::enrol::{is_meshed, workload_uid, DATAPLANE_MODE};

/// Shared with the node agent on Kubernetes.
pub use slipstream_cni::enrol::{wants_nftables, DATAPATH_LABEL};

pub fn namespace_labels(store: &Store, ns: &str) -> Labels {
    let key = ObjectKey { kind: "Namespace".into(), namespace: String::new(), name: ns.into() };
    store.get(&key).map(|o: &Object| o.metadata().labels.clone()).unwrap_or_default()
}

pub fn hostname(name: &str, ns: &str) -> String {
    format!("{name}.{ns}.svc.{}", plan::CLUSTER_DOMAIN)
}

/// The meshed pods of one node and their network namespaces.
pub fn node_pods(cluster: &str, node: usize, pods: &[&PodRuntime]) -> NodePods {
    let mut v: Vec<PodRegistration> = pods
        .iter()
        .filter(|p| p.node == node && p.meshed && p.sandbox_error.is_none())
        .map(|p| PodRegistration {
            uid: workload_uid(cluster, &p.inst.namespace, &p.inst.name),
            netns: crate::names::netns_path(&p.netns).display().to_string(),
            ip: None,
        })
        .collect();
    v.sort_by(|a, b| a.uid.cmp(&b.uid));
    NodePods { pods: v }
}
