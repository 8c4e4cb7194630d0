//! The objects the cluster holds, and the checks that need the whole
//! cluster. `plan_apply` and `plan_delete` return a new store or every
//! error, and change nothing themselves: a rejected apply changes nothing.

mod checks;

use checks::check_immutable;
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
mod tests;
