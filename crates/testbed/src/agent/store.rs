//! The objects the cluster holds, and the checks that need the whole
//! cluster. `plan_apply` and `plan_delete` return a new store or every
//! error, and change nothing themselves: a rejected apply changes nothing.

use crate::plan;
use slipstream_k8s::{Object, ObjectKey};
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

/// The pod-template annotation `kubectl rollout restart` sets.
pub const RESTARTED_AT: &str = "kubectl.kubernetes.io/restartedAt";

/// Namespaces every cluster has, as in Kubernetes.
pub const BUILTIN_NAMESPACES: &[&str] = &["default", "kube-system", "istio-system"];

#[derive(Debug, Clone, Default)]
pub struct Store {
    /// Insertion order matters for placement and display; keep a sequence.
    objects: BTreeMap<ObjectKey, (u64, Object)>,
    next_seq: u64,
}

/// What the checks need to know about the running cluster.
pub struct ClusterFacts<'a> {
    pub nodes: &'a [String],
    /// Allocated VIPs and their service (namespace, name).
    pub vips: &'a BTreeMap<(String, String), Ipv4Addr>,
}

impl Store {
    pub fn new() -> Self {
        let mut s = Store::default();
        for ns in BUILTIN_NAMESPACES {
            let o: Object =
                serde_json::from_value(serde_json::json!({"Namespace": {"metadata": {"name": ns}}})).expect("builtin namespace");
            s.insert(o);
        }
        s
    }

    fn insert(&mut self, o: Object) {
        let key = o.key();
        let seq = self.objects.get(&key).map(|(s, _)| *s).unwrap_or_else(|| {
            self.next_seq += 1;
            self.next_seq
        });
        self.objects.insert(key, (seq, o));
    }

    /// Objects in the order they were first applied.
    pub fn objects(&self) -> Vec<&Object> {
        let mut v: Vec<&(u64, Object)> = self.objects.values().collect();
        v.sort_by_key(|(s, _)| *s);
        v.into_iter().map(|(_, o)| o).collect()
    }

    pub fn get(&self, key: &ObjectKey) -> Option<&Object> {
        self.objects.get(key).map(|(_, o)| o)
    }

    pub fn has_namespace(&self, ns: &str) -> bool {
        self.get(&key("Namespace", "", ns)).is_some()
    }

    fn has_service_account(&self, ns: &str, sa: &str) -> bool {
        // Every namespace has `default`, as the Kubernetes controller creates it.
        sa == "default" || self.get(&key("ServiceAccount", ns, sa)).is_some()
    }

    /// The store after applying `objects`, and one line per object, or every
    /// error found.
    pub fn plan_apply(&self, objects: Vec<Object>, facts: &ClusterFacts) -> Result<(Store, Vec<String>), Vec<String>> {
        let mut next = self.clone();
        let mut lines = Vec::new();
        let mut errors = Vec::new();
        let applied: BTreeSet<ObjectKey> = objects.iter().map(|o| o.key()).collect();
        // Namespaces first, so one file can create a namespace and its contents.
        let (nss, rest): (Vec<Object>, Vec<Object>) = objects.into_iter().partition(|o| matches!(o, Object::Namespace(_)));
        for o in nss.into_iter().chain(rest) {
            let key = o.key();
            let verb = match self.get(&key) {
                None => "created",
                Some(old) if *old == o => "unchanged",
                Some(_) => "configured",
            };
            if let Some(e) = check_immutable(self.get(&key), &o, facts) {
                errors.push(format!("{key}: {e}"));
            }
            for field in slipstream_k8s::expand::reserved_labels(&o) {
                errors.push(format!(
                    "{key}: {field}: this label is set only by the waypoint controller on what it makes for a waypoint Gateway \
                     (its pods get the waypoint's credentials), and cannot be applied"
                ));
            }
            lines.push(format!("{} {verb}", resource_name(&o)));
            next.insert(o);
        }
        errors.extend(next.sync_waypoints(&mut lines));
        errors.extend(next.check_references(facts));
        errors.extend(next.check_capacity(&applied, facts.nodes.len()));
        if errors.is_empty() {
            Ok((next, lines))
        } else {
            Err(errors)
        }
    }

    pub fn plan_delete(&self, keys: &[ObjectKey], ignore_not_found: bool) -> Result<(Store, Vec<String>), Vec<String>> {
        let mut next = self.clone();
        let mut lines = Vec::new();
        let mut errors = Vec::new();
        for k in keys {
            if k.kind == "Namespace" && BUILTIN_NAMESPACES.contains(&k.name.as_str()) {
                errors.push(format!("{k}: a built-in namespace cannot be deleted"));
                continue;
            }
            match next.objects.remove(k) {
                Some((_, o)) => {
                    lines.push(format!("{} deleted", resource_name(&o)));
                    if k.kind == "Namespace" {
                        // Deleting a namespace deletes everything in it.
                        let inside: Vec<ObjectKey> = next.objects.keys().filter(|x| x.namespace == k.name).cloned().collect();
                        for x in inside {
                            if let Some((_, o)) = next.objects.remove(&x) {
                                lines.push(format!("{} deleted (namespace {} deleted)", resource_name(&o), k.name));
                            }
                        }
                    }
                }
                // Already removed with its namespace earlier in this same request.
                None if ignore_not_found || keys_deleted_by_namespace(keys, k) => {}
                None => errors.push(format!("{k}: not found")),
            }
        }
        errors.extend(next.sync_waypoints(&mut lines));
        if errors.is_empty() {
            Ok((next, lines))
        } else {
            Err(errors)
        }
    }

    /// Whether the Deployment `namespace/name` is one the agent made for a
    /// waypoint Gateway: only its pods get a waypoint's credentials. Users
    /// cannot apply an object that says so (`plan_apply` refuses the
    /// reserved labels), so what a pod template says decides nothing.
    pub fn made_for_waypoint(&self, namespace: &str, deployment: &str) -> bool {
        self.get(&key("Deployment", namespace, deployment)).is_some_and(slipstream_k8s::expand::is_waypoint_made)
    }

    /// `kubectl label` / `kubectl annotate` of one object: each change sets
    /// (`Some`) or removes (`None`) a key. Changing a key that has another
    /// value needs `overwrite`, as kubectl says. The lines say what changed
    /// (`namespace/bookinfo labeled`), or `not labeled`.
    pub fn plan_label(
        &self,
        k: &ObjectKey,
        changes: &[(String, Option<String>)],
        overwrite: bool,
        annotate: bool,
        facts: &ClusterFacts,
    ) -> Result<(Store, Vec<String>), Vec<String>> {
        let what = if annotate { "annotation" } else { "label" };
        let Some(old) = self.get(k) else {
            return Err(vec![format!("{} \"{}\" not found{}", plural_kind(&k.kind), k.name, in_namespace(&k.namespace))]);
        };
        if slipstream_k8s::expand::is_waypoint_made(old) {
            return Err(vec![format!("{k}: made for a waypoint Gateway; label or annotate the Gateway instead")]);
        }
        let mut o = old.clone();
        let mut errors = Vec::new();
        let mut notes = Vec::new();
        {
            let m = o.metadata_mut();
            let map = if annotate { &mut m.annotations } else { &mut m.labels };
            for (key, value) in changes {
                if !annotate {
                    if let Err(e) = slipstream_k8s::names::check_label_key(key) {
                        errors.push(format!("{key}: {e}"));
                        continue;
                    }
                }
                match value {
                    Some(v) => {
                        if !annotate {
                            if let Err(e) = slipstream_k8s::names::check_label_value(v) {
                                errors.push(format!("{key}={v}: {e}"));
                                continue;
                            }
                        }
                        match map.get(key) {
                            Some(cur) if cur != v && !overwrite => {
                                errors.push(format!("'{key}' already has a value ({cur}), and --overwrite is false"))
                            }
                            _ => {
                                map.insert(key.clone(), v.clone());
                            }
                        }
                    }
                    None => {
                        if map.remove(key).is_none() {
                            notes.push(format!("{what} \"{key}\" not found."));
                        }
                    }
                }
            }
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        let verb = if annotate { "annotated" } else { "labeled" };
        let name = kubectl_name(&o);
        if o == *old {
            notes.push(format!("{name} not {verb}"));
            return Ok((self.clone(), notes));
        }
        let (next, _) = self.plan_apply(vec![o], facts)?;
        notes.push(format!("{name} {verb}"));
        Ok((next, notes))
    }

    /// `kubectl rollout restart`: a Deployment's pod template gets
    /// `kubectl.kubernetes.io/restartedAt` (as kubectl sets it), so its pods
    /// are replaced one rollout at a time (the agent keeps the old ones
    /// until the new ones are ready).
    pub fn plan_restart(&self, namespace: &str, name: &str, at: &str) -> Result<(Store, Vec<String>), Vec<String>> {
        let k = key("Deployment", namespace, name);
        let Some(Object::Deployment(d)) = self.get(&k) else {
            return Err(vec![format!("deployments.apps \"{name}\" not found in namespace {namespace}")]);
        };
        let mut d = d.clone();
        d.spec.template.metadata.annotations.insert(RESTARTED_AT.into(), at.into());
        let mut next = self.clone();
        // kubectl's line.
        let line = format!("deployment.apps/{name} restarted");
        next.insert(Object::Deployment(d));
        Ok((next, vec![line]))
    }

    /// The Gateway controller's part: every waypoint Gateway has the
    /// objects `expand::waypoint_objects` makes for it, and objects made
    /// for a Gateway that is gone are deleted. A made object whose name is
    /// taken by one the user applied is an error naming both.
    fn sync_waypoints(&mut self, lines: &mut Vec<String>) -> Vec<String> {
        let mut errors = Vec::new();
        let mut wanted: BTreeMap<ObjectKey, (String, Object)> = BTreeMap::new();
        for o in self.objects() {
            let Object::Kept(k) = o else { continue };
            let Some(made) = slipstream_k8s::expand::waypoint_objects(k) else { continue };
            for m in made {
                wanted.insert(m.key(), (format!("{}/{}", k.metadata.namespace, k.metadata.name), m));
            }
        }
        let stale: Vec<ObjectKey> = self
            .objects
            .iter()
            .filter(|(k, (_, o))| slipstream_k8s::expand::is_waypoint_made(o) && !wanted.contains_key(k))
            .map(|(k, _)| k.clone())
            .collect();
        for k in stale {
            if let Some((_, o)) = self.objects.remove(&k) {
                lines.push(format!("{} deleted (its waypoint Gateway is gone)", resource_name(&o)));
            }
        }
        for (k, (gw, mut o)) in wanted {
            // A made Deployment keeps its `rollout restart` (as Istio's
            // controller leaves the template annotation it does not own).
            if let (Some(Object::Deployment(old)), Object::Deployment(new)) = (self.get(&k), &mut o) {
                if let Some(at) = old.spec.template.metadata.annotations.get(RESTARTED_AT) {
                    new.spec.template.metadata.annotations.insert(RESTARTED_AT.into(), at.clone());
                }
            }
            match self.get(&k) {
                Some(old) if !slipstream_k8s::expand::is_waypoint_made(old) => {
                    errors.push(format!("Gateway {gw}: would make {k}, which exists and was not made for a waypoint"))
                }
                Some(old) if *old == o => {}
                Some(_) => {
                    lines.push(format!("{} configured (for waypoint {gw})", resource_name(&o)));
                    self.insert(o);
                }
                None => {
                    lines.push(format!("{} created (for waypoint {gw})", resource_name(&o)));
                    self.insert(o);
                }
            }
        }
        errors
    }

    /// Cross-object rules of the whole store.
    fn check_references(&self, facts: &ClusterFacts) -> Vec<String> {
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
    fn check_capacity(&self, applied: &BTreeSet<ObjectKey>, nodes: usize) -> Vec<String> {
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

    pub fn kept_objects(&self) -> Vec<String> {
        self.objects()
            .into_iter()
            .filter(|o| matches!(o, Object::Kept(k) if !slipstream_k8s::is_enforced(&k.kind)))
            .map(|o| o.key().to_string())
            .collect()
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn keys_deleted_by_namespace(keys: &[ObjectKey], k: &ObjectKey) -> bool {
    keys.iter().any(|x| x.kind == "Namespace" && x.name == k.namespace)
}

/// Fields Kubernetes does not let an update change.
fn check_immutable(old: Option<&Object>, new: &Object, facts: &ClusterFacts) -> Option<String> {
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

fn key(kind: &str, ns: &str, name: &str) -> ObjectKey {
    ObjectKey { kind: kind.into(), namespace: ns.into(), name: name.into() }
}

/// kubectl's plural of a kind in its messages (`namespaces "x" not found`).
pub fn plural_kind(kind: &str) -> String {
    match kind {
        "Deployment" => "deployments.apps".into(),
        k if k.ends_with("Policy") => format!("{}ies", k[..k.len() - 1].to_lowercase()),
        k => format!("{}s", k.to_lowercase()),
    }
}

fn in_namespace(ns: &str) -> String {
    if ns.is_empty() {
        String::new()
    } else {
        format!(" in namespace {ns}")
    }
}

/// kubectl's `TYPE/NAME` without the namespace: `namespace/bookinfo`,
/// `deployment.apps/web`, `gateway.gateway.networking.k8s.io/waypoint`.
pub fn kubectl_name(o: &Object) -> String {
    let full = resource_name(o);
    full.split(" (").next().unwrap_or(&full).to_string()
}

/// kubectl's way of naming an object in output: `deployment.apps/echo`.
pub fn resource_name(o: &Object) -> String {
    let kind = match o {
        Object::Deployment(_) => "deployment.apps".to_string(),
        Object::Kept(k) => {
            let group = k.api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
            if group.is_empty() {
                k.kind.to_lowercase()
            } else {
                format!("{}.{group}", k.kind.to_lowercase())
            }
        }
        other => other.kind().to_lowercase(),
    };
    let m = o.metadata();
    if o.is_cluster_scoped() {
        format!("{kind}/{}", m.name)
    } else {
        format!("{kind}/{} ({})", m.name, m.namespace)
    }
}

/// Services of the store: namespace, name, object.
pub fn services(store: &Store) -> Vec<&slipstream_k8s::Service> {
    store.objects().into_iter().filter_map(|o| if let Object::Service(s) = o { Some(s) } else { None }).collect()
}

pub fn namespaces_used(store: &Store) -> BTreeSet<String> {
    store.objects().into_iter().map(|o| o.metadata().namespace.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_k8s::{load_str, Source};

    fn objs(y: &str) -> Vec<Object> {
        load_str(y, &Source("t".into())).unwrap().into_iter().map(|l| l.object).collect()
    }

    const NODES: &[&str] = &["node1", "node2"];

    fn facts<'a>(nodes: &'a [String], vips: &'a BTreeMap<(String, String), Ipv4Addr>) -> ClusterFacts<'a> {
        ClusterFacts { nodes, vips }
    }

    const APP: &str = "apiVersion: v1\nkind: Namespace\nmetadata: {name: demo}\n---\napiVersion: v1\nkind: ServiceAccount\nmetadata: {name: web, namespace: demo}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: demo}\nspec: {serviceAccountName: web, nodeName: node2, containers: [{name: c, command: [sleep, infinity]}]}\n";

    #[test]
    fn namespace_in_the_same_apply_counts_and_lines_say_what_changed() {
        let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
        let vips = BTreeMap::new();
        let (s, lines) = Store::new().plan_apply(objs(APP), &facts(&nodes, &vips)).unwrap();
        assert_eq!(lines, vec!["namespace/demo created", "serviceaccount/web (demo) created", "pod/web (demo) created"]);
        let (_, lines) = s.plan_apply(objs(APP), &facts(&nodes, &vips)).unwrap();
        assert!(lines.iter().all(|l| l.ends_with("unchanged")), "{lines:?}");
    }

    #[test]
    fn missing_references_reject_the_whole_apply() {
        let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
        let vips = BTreeMap::new();
        let y = APP.replace("name: demo}\n---", "name: demo2}\n---").replace("nodeName: node2", "nodeName: node7");
        let errs = Store::new().plan_apply(objs(&y), &facts(&nodes, &vips)).unwrap_err();
        let all = errs.join("\n");
        assert!(all.contains("ServiceAccount demo/web: metadata.namespace: namespace \"demo\" does not exist"), "{all}");
        assert!(all.contains("Pod demo/web: metadata.namespace"), "{all}");
        let y = APP.replace("serviceAccountName: web", "serviceAccountName: nobody").replace("nodeName: node2", "nodeName: node7");
        let all = Store::new().plan_apply(objs(&y), &facts(&nodes, &vips)).unwrap_err().join("\n");
        assert!(
            all.contains("Pod demo/web: spec.serviceAccountName: service account \"nobody\" does not exist in namespace \"demo\""),
            "{all}"
        );
        assert!(all.contains("Pod demo/web: spec.nodeName: node \"node7\" does not exist (the cluster has node1, node2)"), "{all}");
    }

    #[test]
    fn cluster_ip_rules() {
        let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
        let mut vips = BTreeMap::new();
        vips.insert(("default".to_string(), "a".to_string()), Ipv4Addr::new(10, 96, 0, 10));
        let svc = |name: &str, ip: &str| {
            format!("apiVersion: v1\nkind: Service\nmetadata: {{name: {name}}}\nspec: {{clusterIP: {ip}, ports: [{{port: 80}}]}}\n")
        };
        let e = Store::new().plan_apply(objs(&svc("b", "10.96.0.10")), &facts(&nodes, &vips)).unwrap_err();
        assert!(e[0].contains("Service default/b: spec.clusterIP: 10.96.0.10 is already allocated to service default/a"), "{e:?}");
        let e = Store::new().plan_apply(objs(&svc("b", "10.1.0.10")), &facts(&nodes, &vips)).unwrap_err();
        assert!(e[0].contains("outside the service range"), "{e:?}");
        let (s, _) = Store::new().plan_apply(objs(&svc("a", "10.96.0.10")), &facts(&nodes, &vips)).unwrap();
        let e = s.plan_apply(objs(&svc("a", "10.96.0.99")), &facts(&nodes, &vips)).unwrap_err();
        assert!(e[0].contains("spec.clusterIP: is immutable (currently 10.96.0.10)"), "{e:?}");
    }

    fn deployment(name: &str, replicas: usize, node: Option<&str>) -> String {
        let pin = node.map(|n| format!("nodeName: {n}, ")).unwrap_or_default();
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}}}\nspec:\n  replicas: {replicas}\n  selector: {{matchLabels: {{app: {name}}}}}\n  template:\n    metadata: {{labels: {{app: {name}}}}}\n    spec: {{{pin}containers: [{{name: c, command: [sleep, infinity]}}]}}\n"
        )
    }

    fn pod(name: &str, node: Option<&str>) -> String {
        let pin = node.map(|n| format!("nodeName: {n}, ")).unwrap_or_default();
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec: {{{pin}containers: [{{name: c, command: [sleep, infinity]}}]}}\n"
        )
    }

    #[test]
    fn capacity_is_refused_naming_the_object_and_field() {
        let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
        let vips = BTreeMap::new();
        // The store holds 3 pods already (one Deployment of 2, one Pod).
        let base = format!("{}---\n{}", deployment("old", 2, None), pod("solo", None));
        let (s, _) = Store::new().plan_apply(objs(&base), &facts(&nodes, &vips)).unwrap();
        // (manifest, the errors wanted; empty = accepted)
        let cases: Vec<(String, Vec<&str>)> = vec![
            (deployment("web", 217, None), vec![]),
            (
                deployment("web", 10000, None),
                vec!["Deployment default/web: spec.replicas: 10000 pods would exceed the cluster's capacity (2 nodes x 110 pods = 220, 3 already placed)"],
            ),
            (
                format!("{}---\n{}", deployment("a", 200, None), deployment("b", 20, None)),
                vec![
                    "Deployment default/a: spec.replicas: 200 pods would exceed the cluster's capacity (2 nodes x 110 pods = 220, 3 already placed, 20 more in this apply)",
                    "Deployment default/b: spec.replicas: 20 pods would exceed the cluster's capacity (2 nodes x 110 pods = 220, 3 already placed, 200 more in this apply)",
                ],
            ),
            // Changing an existing object counts its new size only.
            (deployment("old", 219, None), vec![]),
            (deployment("old", 110, Some("node1")), vec![]),
            (
                deployment("old", 111, Some("node1")),
                vec!["Deployment default/old: spec.template.spec.nodeName: 111 pods pinned to node \"node1\" would exceed its capacity (110 pods, 0 pinned there by other objects)"],
            ),
            (
                format!("{}---\n{}", deployment("web", 110, Some("node2")), pod("p", Some("node2"))),
                vec!["Deployment default/web: spec.template.spec.nodeName: 110 pods pinned to node \"node2\" would exceed its capacity (110 pods, 1 pinned there by other objects)",
                    "Pod default/p: spec.nodeName: 1 pod pinned to node \"node2\" would exceed its capacity (110 pods, 110 pinned there by other objects)"],
            ),
        ];
        for (y, want) in cases {
            match s.plan_apply(objs(&y), &facts(&nodes, &vips)) {
                Ok(_) => assert!(want.is_empty(), "accepted, wanted {want:?} for\n{y}"),
                Err(e) => assert_eq!(e, want, "for\n{y}"),
            }
        }
        // One node: 110 in all.
        let one = vec!["node1".to_string()];
        let e = Store::new().plan_apply(objs(&deployment("web", 111, None)), &facts(&one, &vips)).unwrap_err();
        assert_eq!(e, vec!["Deployment default/web: spec.replicas: 111 pods would exceed the cluster's capacity (1 node x 110 pods = 110, 0 already placed)"]);
    }

    #[test]
    fn label_and_annotate_as_kubectl_does() {
        let nodes = vec!["node1".to_string()];
        let vips = BTreeMap::new();
        let store = Store::new();
        let ns = key("Namespace", "", "default");
        let set = |k: &str, v: Option<&str>| vec![(k.to_string(), v.map(String::from))];
        let (s1, lines) =
            store.plan_label(&ns, &set("istio.io/dataplane-mode", Some("ambient")), false, false, &facts(&nodes, &vips)).unwrap();
        assert_eq!(lines, ["namespace/default labeled"]);
        assert_eq!(s1.get(&ns).unwrap().metadata().labels["istio.io/dataplane-mode"], "ambient");
        // Another value needs --overwrite; the same value changes nothing.
        let e = s1.plan_label(&ns, &set("istio.io/dataplane-mode", Some("none")), false, false, &facts(&nodes, &vips)).unwrap_err();
        assert_eq!(e, ["'istio.io/dataplane-mode' already has a value (ambient), and --overwrite is false"]);
        let (_, lines) = s1.plan_label(&ns, &set("istio.io/dataplane-mode", Some("ambient")), false, false, &facts(&nodes, &vips)).unwrap();
        assert_eq!(lines, ["namespace/default not labeled"]);
        let (s2, _) = s1.plan_label(&ns, &set("istio.io/dataplane-mode", Some("none")), true, false, &facts(&nodes, &vips)).unwrap();
        assert_eq!(s2.get(&ns).unwrap().metadata().labels["istio.io/dataplane-mode"], "none");
        // key- removes; a missing key is said, not an error.
        let (s3, lines) = s2.plan_label(&ns, &set("istio.io/dataplane-mode", None), false, false, &facts(&nodes, &vips)).unwrap();
        assert!(s3.get(&ns).unwrap().metadata().labels.is_empty());
        assert_eq!(lines, ["namespace/default labeled"]);
        let (_, lines) = s3.plan_label(&ns, &set("nothing", None), false, false, &facts(&nodes, &vips)).unwrap();
        assert_eq!(lines, ["label \"nothing\" not found.", "namespace/default not labeled"]);
        // Annotations take any value; labels are checked.
        let (s4, lines) = s3.plan_label(&ns, &set("note", Some("a value with spaces")), false, true, &facts(&nodes, &vips)).unwrap();
        assert_eq!(
            (lines[0].as_str(), s4.get(&ns).unwrap().metadata().annotations["note"].as_str()),
            ("namespace/default annotated", "a value with spaces")
        );
        assert!(s3.plan_label(&ns, &set("bad", Some("a value with spaces")), false, false, &facts(&nodes, &vips)).is_err());
        // Unknown objects are named as kubectl names them.
        let e =
            store.plan_label(&key("Service", "default", "nope"), &set("a", Some("b")), false, false, &facts(&nodes, &vips)).unwrap_err();
        assert_eq!(e, ["services \"nope\" not found in namespace default"]);
    }

    #[test]
    fn deleting_a_namespace_cascades_and_builtins_stay() {
        let nodes: Vec<String> = NODES.iter().map(|s| s.to_string()).collect();
        let vips = BTreeMap::new();
        let (s, _) = Store::new().plan_apply(objs(APP), &facts(&nodes, &vips)).unwrap();
        let (s2, lines) = s.plan_delete(&[key("Namespace", "", "demo")], false).unwrap();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(s2.get(&key("Pod", "demo", "web")).is_none());
        // A file that deletes a namespace and what is inside it (the usual
        // `delete -f` of the file that created them) is not "not found".
        let (_, lines) = s.plan_delete(&[key("Namespace", "", "demo"), key("Pod", "demo", "web")], false).unwrap();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(s.plan_delete(&[key("Namespace", "", "default")], false).is_err());
        let e = s.plan_delete(&[key("Pod", "demo", "nope")], false).unwrap_err();
        assert_eq!(e, vec!["Pod demo/nope: not found"]);
        assert!(s.plan_delete(&[key("Pod", "demo", "nope")], true).is_ok());
    }
}
