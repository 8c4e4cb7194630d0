//! The checks an apply must pass against the whole cluster: references
//! (namespaces, service accounts, nodes, cluster IPs), capacity, and the
//! fields an update may not change. Pure: they read the planned store.

use super::{key, plural, ClusterFacts, Store};
use crate::plan;
use slipstream_k8s::{Object, ObjectKey};
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

impl Store {
    /// Cross-object rules of the whole store.
    pub(super) fn check_references(&self, facts: &ClusterFacts) -> Vec<String> {
        let mut errors = Vec::new();
        let mut claimed: BTreeMap<Ipv4Addr, String> = BTreeMap::new();
        for o in self.objects() {
            let m = o.metadata();
            let k = o.key();
            if !o.is_cluster_scoped() && !self.has_namespace(&m.namespace) {
                errors.push(format!(
                    "{k}: metadata.namespace: namespace {:?} does not exist (add a Namespace object to the same apply, or apply it first)",
                    m.namespace
                ));
                continue;
            }
            let spec = match o {
                Object::Pod(p) => Some((&p.spec, "spec")),
                Object::Deployment(d) => Some((&d.spec.template.spec, "spec.template.spec")),
                _ => None,
            };
            if let Some((spec, f)) = spec {
                let sa = spec.service_account();
                if !self.has_service_account(&m.namespace, sa) {
                    errors.push(format!(
                        "{k}: {f}.serviceAccountName: service account {:?} does not exist in namespace {:?}",
                        sa, m.namespace
                    ));
                }
                if let Some(n) = &spec.node_name {
                    if !facts.nodes.contains(n) {
                        errors.push(format!("{k}: {f}.nodeName: node {n:?} does not exist (the cluster has {})", facts.nodes.join(", ")));
                    }
                }
            }
            if let Object::Service(s) = o {
                if let Some(ip) = s.spec.cluster_ip.as_deref().filter(|i| !i.is_empty() && *i != "None") {
                    let Ok(ip) = ip.parse::<Ipv4Addr>() else { continue };
                    let me = (m.namespace.clone(), m.name.clone());
                    if !plan::is_service_ip(ip) {
                        errors.push(format!("{k}: spec.clusterIP: {ip} is outside the service range 10.96.0.0/16"));
                    } else if let Some(other) = facts.vips.iter().find(|(svc, v)| **v == ip && **svc != me).map(|(s, _)| s) {
                        errors.push(format!("{k}: spec.clusterIP: {ip} is already allocated to service {}/{}", other.0, other.1));
                    } else if let Some(other) = claimed.insert(ip, k.to_string()) {
                        errors.push(format!("{k}: spec.clusterIP: {ip} is also requested by {other}"));
                    }
                }
            }
        }
        errors
    }

    /// The pods of the whole store fit the cluster: at most
    /// `MAX_PODS_PER_NODE` per node overall, and on each node for pods
    /// pinned to it by `nodeName`. Errors name the objects of this apply
    /// (`applied`) that bring pods.
    pub(super) fn check_capacity(&self, applied: &BTreeSet<ObjectKey>, nodes: usize) -> Vec<String> {
        // Pods per owning object, and per (object, pinned node).
        let mut per_object: BTreeMap<ObjectKey, usize> = BTreeMap::new();
        let mut pinned: BTreeMap<String, BTreeMap<ObjectKey, usize>> = BTreeMap::new();
        for p in slipstream_k8s::desired_pods(self.objects()) {
            let owner = match &p.owner {
                Some(d) => key("Deployment", &p.namespace, d),
                None => key("Pod", &p.namespace, &p.name),
            };
            *per_object.entry(owner.clone()).or_default() += 1;
            if let Some(n) = &p.spec.node_name {
                *pinned.entry(n.clone()).or_default().entry(owner).or_default() += 1;
            }
        }
        let field = |k: &ObjectKey, f: &str| match k.kind.as_str() {
            "Deployment" if f.is_empty() => "spec.replicas: ".to_string(),
            "Deployment" => format!("spec.template.spec.{f}: "),
            _ if f.is_empty() => String::new(),
            _ => format!("spec.{f}: "),
        };
        let mut errors = Vec::new();
        let total: usize = per_object.values().sum();
        let capacity = nodes * plan::MAX_PODS_PER_NODE;
        if total > capacity {
            let mine: usize = per_object.iter().filter(|(k, _)| applied.contains(k)).map(|(_, n)| n).sum();
            for (k, n) in per_object.iter().filter(|(k, _)| applied.contains(k)) {
                let others = mine - n;
                errors.push(format!(
                    "{k}: {}{n} pod{} would exceed the cluster's capacity ({nodes} node{} x {} pods = {capacity}, {} already placed{})",
                    field(k, ""),
                    plural(*n),
                    plural(nodes),
                    plan::MAX_PODS_PER_NODE,
                    total - mine,
                    if others > 0 { format!(", {others} more in this apply") } else { String::new() },
                ));
            }
        }
        for (node, objs) in &pinned {
            let on_node: usize = objs.values().sum();
            if on_node <= plan::MAX_PODS_PER_NODE {
                continue;
            }
            for (k, n) in objs.iter().filter(|(k, _)| applied.contains(k)) {
                errors.push(format!(
                    "{k}: {}{n} pod{} pinned to node {node:?} would exceed its capacity ({} pods, {} pinned there by other objects)",
                    field(k, "nodeName"),
                    plural(*n),
                    plan::MAX_PODS_PER_NODE,
                    on_node - n,
                ));
            }
        }
        errors
    }
}

/// Fields Kubernetes does not let an update change.
pub(super) fn check_immutable(old: Option<&Object>, new: &Object, facts: &ClusterFacts) -> Option<String> {
    match (old, new) {
        (Some(Object::Service(_)), Object::Service(n)) => {
            let cur = facts.vips.get(&(n.metadata.namespace.clone(), n.metadata.name.clone()));
            let want = n.spec.cluster_ip.as_deref().filter(|s| !s.is_empty());
            match (cur, want) {
                (Some(cur), Some(w)) if w != cur.to_string() => Some(format!("spec.clusterIP: is immutable (currently {cur})")),
                (None, Some(w)) if w != "None" => Some("spec.clusterIP: is immutable (the service is headless)".into()),
                (Some(cur), _) if n.spec.is_headless() => Some(format!("spec.clusterIP: is immutable (currently {cur})")),
                _ => None,
            }
        }
        (Some(Object::Deployment(o)), Object::Deployment(n)) if o.spec.selector != n.spec.selector => {
            Some("spec.selector: is immutable".into())
        }
        _ => None,
    }
}
