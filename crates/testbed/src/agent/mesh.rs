//! What the node proxies are told: the cluster's workloads and services in
//! the shape of the ambient workload API, and each node's pod registrations.
//! Pure over the agent's state; `Agent::sync_mesh` writes the results.

use super::pods::{Node, PodRuntime};
use super::services::Vips;
use super::store::{services, Store};
use crate::plan;
use slipstream_core::{MeshConfig, NetworkAddress, NodePods, PodRegistration, Port, Service, TunnelProtocol, Workload, WorkloadStatus, WorkloadType};
use slipstream_k8s::expand::selector_matches;
use slipstream_k8s::{IntOrString, Labels, Object, ObjectKey};

/// The label Istio users already put on namespaces (and pods).
pub const DATAPLANE_MODE: &str = "istio.io/dataplane-mode";

/// Meshed when the pod says `ambient`, or its namespace does and the pod
/// does not opt out with `none`.
pub fn is_meshed(namespace_labels: &Labels, pod_labels: &Labels) -> bool {
    match pod_labels.get(DATAPLANE_MODE).map(String::as_str) {
        Some("none") => false,
        Some("ambient") => true,
        _ => namespace_labels.get(DATAPLANE_MODE).map(String::as_str) == Some("ambient"),
    }
}

pub fn namespace_labels(store: &Store, ns: &str) -> Labels {
    let key = ObjectKey { kind: "Namespace".into(), namespace: String::new(), name: ns.into() };
    store.get(&key).map(|o: &Object| o.metadata().labels.clone()).unwrap_or_default()
}

pub fn hostname(name: &str, ns: &str) -> String {
    format!("{name}.{ns}.svc.{}", plan::CLUSTER_DOMAIN)
}

pub fn workload_uid(cluster: &str, ns: &str, name: &str) -> String {
    format!("{cluster}//Pod/{ns}/{name}")
}

/// Istio's canonical service name and revision, from the usual labels.
fn canonical(labels: &Labels, fallback: &str) -> (String, String) {
    let get = |keys: &[&str]| keys.iter().find_map(|k| labels.get(*k).cloned());
    (
        get(&["service.istio.io/canonical-name", "app.kubernetes.io/name", "app"]).unwrap_or_else(|| fallback.to_string()),
        get(&["service.istio.io/canonical-revision", "app.kubernetes.io/version", "version"]).unwrap_or_else(|| "latest".into()),
    )
}

pub fn mesh_config(cluster: &str, store: &Store, pods: &[&PodRuntime], nodes: &[Node], vips: &Vips) -> MeshConfig {
    let svcs = services(store);
    let mut cfg = MeshConfig::default();
    for s in &svcs {
        let vip = vips.get(&(s.metadata.namespace.clone(), s.metadata.name.clone()));
        cfg.services.push(Service {
            name: s.metadata.name.clone(),
            namespace: s.metadata.namespace.clone(),
            hostname: hostname(&s.metadata.name, &s.metadata.namespace),
            addresses: vip.map(|v| NetworkAddress { network: String::new(), address: (*v).into() }).into_iter().collect(),
            ports: s
                .spec
                .ports
                .iter()
                .map(|p| Port {
                    service_port: p.port as u16,
                    target_port: match p.target() {
                        IntOrString::Int(t) => t as u16,
                        // Named: resolved per workload in `Workload.services`.
                        IntOrString::Str(_) => 0,
                    },
                })
                .collect(),
            subject_alt_names: Vec::new(),
        });
    }
    for p in pods {
        if p.sandbox_error.is_some() {
            continue;
        }
        let (canonical_name, canonical_revision) = canonical(&p.inst.labels, p.inst.owner.as_deref().unwrap_or(&p.inst.name));
        let mut services_map = std::collections::BTreeMap::new();
        for s in &svcs {
            let Some(sel) = &s.spec.selector else { continue };
            if s.metadata.namespace != p.inst.namespace || !selector_matches(sel, &p.inst.labels) {
                continue;
            }
            let ports: Vec<Port> = s
                .spec
                .ports
                .iter()
                .filter_map(|sp| Some(Port { service_port: sp.port as u16, target_port: plan::resolve_target_port(sp, &p.inst.spec)? }))
                .collect();
            services_map.insert(format!("{}/{}", s.metadata.namespace, hostname(&s.metadata.name, &s.metadata.namespace)), ports);
        }
        cfg.workloads.push(Workload {
            uid: workload_uid(cluster, &p.inst.namespace, &p.inst.name),
            name: p.inst.name.clone(),
            namespace: p.inst.namespace.clone(),
            addresses: vec![p.ip.into()],
            tunnel_protocol: if p.meshed { TunnelProtocol::Hbone } else { TunnelProtocol::None },
            service_account: p.inst.spec.service_account().to_string(),
            node: nodes.iter().find(|n| n.index == p.node).map(|n| n.name.clone()).unwrap_or_default(),
            canonical_name,
            canonical_revision,
            workload_type: if p.inst.owner.is_some() { WorkloadType::Deployment } else { WorkloadType::Pod },
            workload_name: p.inst.owner.clone().unwrap_or_else(|| p.inst.name.clone()),
            services: services_map,
            status: if p.ready() { WorkloadStatus::Healthy } else { WorkloadStatus::Unhealthy },
            cluster_id: cluster.to_string(),
            capacity: 1,
            ..Default::default()
        });
    }
    cfg.workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
    cfg
}

/// The meshed pods of one node and their network namespaces.
pub fn node_pods(cluster: &str, node: usize, pods: &[&PodRuntime]) -> NodePods {
    let mut v: Vec<PodRegistration> = pods
        .iter()
        .filter(|p| p.node == node && p.meshed && p.sandbox_error.is_none())
        .map(|p| PodRegistration {
            uid: workload_uid(cluster, &p.inst.namespace, &p.inst.name),
            netns: crate::names::netns_path(&p.netns).display().to_string(),
        })
        .collect();
    v.sort_by(|a, b| a.uid.cmp(&b.uid));
    NodePods { pods: v }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(kv: &[(&str, &str)]) -> Labels {
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
    }

    #[test]
    fn canonical_names() {
        assert_eq!(canonical(&labels(&[("app", "echo"), ("version", "v2")]), "x"), ("echo".into(), "v2".into()));
        assert_eq!(canonical(&labels(&[]), "web"), ("web".into(), "latest".into()));
    }
}
