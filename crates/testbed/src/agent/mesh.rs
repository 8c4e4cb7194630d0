//! What the node proxies are told: the cluster's workloads and services in
//! the shape of the ambient workload API, and each node's pod registrations.
//! Pure over the agent's state; `Agent::sync_mesh` writes the results.

use super::pods::{Node, PodRuntime};
use super::services::Vips;
use super::store::{services, Store};
use crate::plan;
use slipstream_core::{
    MeshConfig, NetworkAddress, NodePods, PodRegistration, Port, Service, TunnelProtocol, Workload, WorkloadStatus, WorkloadType,
};
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
        let mut authorization_policies = Vec::new();
        if p.meshed {
            if let Some(pol) = peer_authentication::for_pod(store, &p.inst.namespace, &p.inst.name, &p.inst.labels) {
                authorization_policies.push(pol.key());
                cfg.policies.push(pol);
            }
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
            authorization_policies,
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

/// PeerAuthentication, resolved per workload as Istio does (workload
/// selector over namespace over mesh-wide in the root namespace; UNSET
/// inherits; port-level settings override for their port), and converted
/// the way istiod hands it to ztunnel: a DENY policy on connections without
/// a peer identity, scoped to the workload.
pub mod peer_authentication {
    use super::*;
    use slipstream_core::policy::{Action, Authorization, Clause, Match, Rule, Scope, StringMatch};
    use slipstream_core::ROOT_NAMESPACE;
    use slipstream_k8s::istio::{peer_authentication as parse, MtlsMode, PeerAuthenticationSpec};

    pub fn policy_name(pod: &str) -> String {
        format!("istio_converted_strict_{pod}")
    }

    fn specs(store: &Store) -> Vec<(String, PeerAuthenticationSpec)> {
        store
            .objects()
            .into_iter()
            .filter_map(|o| match o {
                Object::Kept(k) if k.kind == "PeerAuthentication" => parse(k).ok().map(|s| (k.metadata.namespace.clone(), s)),
                _ => None,
            })
            .collect()
    }

    /// The converted policy for one pod, if its effective mode makes
    /// plaintext refused on any port.
    pub fn for_pod(store: &Store, ns: &str, name: &str, labels: &Labels) -> Option<Authorization> {
        let all = specs(store);
        let selected = all.iter().find(|(n, s)| {
            n == ns && s.selector.as_ref().is_some_and(|sel| !sel.match_labels.is_empty() && selector_matches(&sel.match_labels, labels))
        });
        let namespace = all.iter().find(|(n, s)| n == ns && s.selector.is_none());
        let mesh = all.iter().find(|(n, s)| n == ROOT_NAMESPACE && s.selector.is_none());
        let inherit = |m: MtlsMode, parent: MtlsMode| if m == MtlsMode::Unset { parent } else { m };
        let mesh_mode = inherit(mesh.map(|(_, s)| s.mode()).unwrap_or(MtlsMode::Unset), MtlsMode::Permissive);
        let ns_mode = inherit(namespace.map(|(_, s)| s.mode()).unwrap_or(MtlsMode::Unset), mesh_mode);
        let base = inherit(selected.map(|(_, s)| s.mode()).unwrap_or(MtlsMode::Unset), ns_mode);
        let ports: Vec<(u16, MtlsMode)> =
            selected.map(|(_, s)| s.port_modes()).unwrap_or_default().into_iter().map(|(p, m)| (p, inherit(m, base))).collect();
        let mut m = Match { not_principals: vec![StringMatch::Presence], ..Default::default() };
        if base == MtlsMode::Strict {
            m.not_destination_ports = ports.iter().filter(|(_, md)| *md != MtlsMode::Strict).map(|(p, _)| *p).collect();
        } else {
            m.destination_ports = ports.iter().filter(|(_, md)| *md == MtlsMode::Strict).map(|(p, _)| *p).collect();
            if m.destination_ports.is_empty() {
                return None;
            }
        }
        Some(Authorization {
            name: policy_name(name),
            namespace: ns.to_string(),
            scope: Scope::WorkloadSelector,
            action: Action::Deny,
            rules: vec![Rule { clauses: vec![Clause { matches: vec![m] }] }],
            dry_run: false,
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::agent::store::ClusterFacts;
        use slipstream_k8s::{load_str, Source};

        fn store(y: &str) -> Store {
            let objs = load_str(y, &Source("t".into())).unwrap().into_iter().map(|l| l.object).collect();
            let nodes = vec!["node1".to_string()];
            let vips = Default::default();
            Store::new().plan_apply(objs, &ClusterFacts { nodes: &nodes, vips: &vips }).unwrap().0
        }

        fn pa(ns: &str, name: &str, spec: &str) -> String {
            format!("---\napiVersion: security.istio.io/v1\nkind: PeerAuthentication\nmetadata: {{name: {name}, namespace: {ns}}}\nspec: {spec}\n")
        }

        const NS: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n";

        fn app() -> Labels {
            [("app".to_string(), "echo".to_string())].into()
        }

        #[test]
        fn permissive_by_default_strict_by_namespace_or_mesh() {
            assert!(for_pod(&store(NS), "demo", "p", &app()).is_none());
            let p = for_pod(&store(&format!("{NS}{}", pa("demo", "default", "{mtls: {mode: STRICT}}"))), "demo", "p", &app()).unwrap();
            assert_eq!(p.key(), "demo/istio_converted_strict_p");
            assert_eq!(p.rules[0].clauses[0].matches[0].not_principals, vec![StringMatch::Presence]);
            assert!(
                for_pod(&store(&format!("{NS}{}", pa("istio-system", "default", "{mtls: {mode: STRICT}}"))), "demo", "p", &app()).is_some()
            );
        }

        #[test]
        fn workload_overrides_namespace_and_ports_override_workload() {
            let y = format!(
                "{NS}{}{}",
                pa("demo", "default", "{mtls: {mode: STRICT}}"),
                pa(
                    "demo",
                    "echo",
                    "{selector: {matchLabels: {app: echo}}, mtls: {mode: PERMISSIVE}, portLevelMtls: {9000: {mode: STRICT}}}"
                )
            );
            let s = store(&y);
            let p = for_pod(&s, "demo", "p", &app()).unwrap();
            assert_eq!(p.rules[0].clauses[0].matches[0].destination_ports, vec![9000], "only port 9000 is strict");
            // Another workload of the namespace keeps the namespace's STRICT.
            let other: Labels = [("app".to_string(), "web".to_string())].into();
            assert!(for_pod(&s, "demo", "q", &other).unwrap().rules[0].clauses[0].matches[0].destination_ports.is_empty());
            // Namespace STRICT with a PERMISSIVE port exception.
            let y = format!(
                "{NS}{}",
                pa(
                    "demo",
                    "echo",
                    "{selector: {matchLabels: {app: echo}}, mtls: {mode: STRICT}, portLevelMtls: {8080: {mode: PERMISSIVE}}}"
                )
            );
            let p = for_pod(&store(&y), "demo", "p", &app()).unwrap();
            assert_eq!(p.rules[0].clauses[0].matches[0].not_destination_ports, vec![8080]);
        }
    }
}
