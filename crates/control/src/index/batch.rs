//! The work of one event: what it affects, widened to everything that
//! depends on it, computed from the views, then compared with the
//! resources held so that only those whose bytes changed are reported.

use super::compile;
use super::derive::Views;
use crate::resources::{Changes, ResourceKey, Resources, Versioned};
use crate::translate::peer_authentication;
use slipstream_api::convert::authorization_any;
use slipstream_api::TypeUrl;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// What to compute again, `(namespace, name)` each.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) pods: BTreeSet<(String, String)>,
    /// Services whose resource to compute again.
    pub(super) services: BTreeSet<(String, String)>,
    /// A waypoint came, went or changed: every binding again.
    pub(super) all_bindings: bool,
    /// Services whose routes to compile again.
    pub(super) routes: BTreeSet<(String, String)>,
    /// A policy on a waypoint Gateway changed: every service's routes.
    pub(super) all_routes: bool,
    /// Network policies to resolve again (by resource name).
    pub(super) net_policies: BTreeSet<String>,
    /// Every network policy: a pod or namespace they may select changed.
    pub(super) net_all: bool,
    /// AuthorizationPolicies whose resource to compute.
    pub(super) policies: BTreeSet<(String, String)>,
    /// The mesh's settings changed.
    pub(super) mesh: bool,
}

/// Resources to set (Some) or remove (None); a later one for the same key
/// wins.
type Set = BTreeMap<ResourceKey, Option<Versioned>>;

impl Batch {
    /// Every resource the batch affects, as the views now say.
    pub(super) fn compute(mut self, v: &Views) -> Set {
        let mut out = Set::new();
        out.extend(v.policies.resolve_net(self.net_keys(v), v.workloads, v.settings));
        self.widen(v);
        self.policy_resources(v, &mut out);
        self.service_resources(v, &mut out);
        self.route_resources(v, &mut out);
        self.pod_resources(v, &mut out);
        if self.mesh {
            let key = ResourceKey::new(TypeUrl::Mesh, slipstream_api::MESH_RESOURCE);
            out.insert(key, v.mesh.map(|m| Versioned::new(slipstream_api::mesh::mesh_any(m))));
        }
        out
    }

    /// The network policies to resolve again (or all of them).
    fn net_keys(&mut self, v: &Views) -> Vec<String> {
        let named = std::mem::take(&mut self.net_policies);
        if self.net_all {
            v.policies.net_keys().cloned().chain(named).collect()
        } else {
            named.into_iter().collect()
        }
    }

    /// Adds what depends on what the event touched: bindings, routes and
    /// policies.
    fn widen(&mut self, v: &Views) {
        if self.all_bindings {
            self.pods.extend(v.workloads.all_pods().map(|(n, p)| (n.clone(), p.name.clone())));
            self.services.extend(v.services.all());
        }
        if self.all_bindings || self.all_routes {
            self.routes.extend(v.services.all());
        } else if !self.pods.is_empty() && (v.routes.any_subsets() || v.policies.any_selected_l7_rules()) {
            // A pod's labels decide which subsets it is in: the routes of
            // its namespace's services, compiled again.
            let touched: BTreeSet<&String> = self.pods.iter().map(|(n, _)| n).collect();
            let more: Vec<(String, String)> =
                touched.into_iter().flat_map(|n| v.services.names(n).map(move |s| (n.clone(), s.clone()))).collect();
            self.routes.extend(more);
        }
        // Every policy lets the waypoints through (`policy_resource`): all
        // of them again when the waypoints may have changed.
        if self.all_bindings {
            self.policies.extend(v.policies.all_authorizations());
        }
        // Each waypoint that takes workload traffic has routes of its own:
        // the policies it enforces on requests addressed to a pod bound to
        // it (`compile::waypoint_own_policies`), computed again whenever a
        // pod, a service, a policy or a binding changed (waypoints are
        // few; one whose bytes did not change is not pushed).
        if self.all_bindings || self.all_routes || !self.pods.is_empty() || !self.services.is_empty() || !self.policies.is_empty() {
            self.routes.extend(v.waypoints.taking_workloads());
        }
    }

    fn policy_resources(&mut self, v: &Views, out: &mut Set) {
        for (ns_name, name) in std::mem::take(&mut self.policies) {
            let key = ResourceKey::new(TypeUrl::Authorization, &format!("{ns_name}/{name}"));
            let resource =
                v.policies.authorization(&ns_name, &name).and_then(|p| v.policy_resource(p)).map(|a| Versioned::new(authorization_any(&a)));
            out.insert(key, resource);
        }
    }

    fn service_resources(&mut self, v: &Views, out: &mut Set) {
        for (ns_name, name) in std::mem::take(&mut self.services) {
            let hostname = v.settings.hostname(&name, &ns_name);
            let key = ResourceKey::new(TypeUrl::Address, &format!("{ns_name}/{hostname}"));
            out.insert(key, v.services.get(&ns_name, &name).map(|s| v.service_resource(s, &hostname)));
        }
    }

    fn route_resources(&mut self, v: &Views, out: &mut Set) {
        for (ns_name, name) in std::mem::take(&mut self.routes) {
            let hostname = v.settings.hostname(&name, &ns_name);
            let key = ResourceKey::new(TypeUrl::Route, &format!("{ns_name}/{hostname}"));
            let resource =
                compile::service_routes(v, &ns_name, &name, &hostname).map(|r| Versioned::new(slipstream_api::routes::routes_any(&r)));
            out.insert(key, resource);
        }
    }

    fn pod_resources(&mut self, v: &Views, out: &mut Set) {
        for (ns, pod) in std::mem::take(&mut self.pods) {
            let uid = v.settings.workload_uid(&ns, &pod);
            let policy_key = ResourceKey::new(TypeUrl::Authorization, &format!("{ns}/{}", peer_authentication::policy_name(&pod)));
            let (workload, policy) = match v.workloads.pod(&ns, &pod) {
                Some(p) => v.pod_resources(p),
                None => (None, None),
            };
            out.insert(ResourceKey::new(TypeUrl::Address, &uid), workload);
            out.insert(policy_key, policy.map(|a| Versioned::new(authorization_any(&a))));
        }
    }
}

/// Applies `set` to `resources`: the keys whose bytes changed are
/// upserted, those set to None and held are removed.
pub(super) fn commit(resources: &mut Resources, set: Set) -> Changes {
    let mut changes = Changes::default();
    for (key, new) in set {
        match new {
            Some(v) => {
                if resources.get(&key).is_none_or(|old| old.body != v.body) {
                    resources.insert(key.clone(), Arc::new(v));
                    changes.upserted.push(key);
                }
            }
            None => {
                if resources.remove(&key).is_some() {
                    changes.removed.push(key);
                }
            }
        }
    }
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> ResourceKey {
        ResourceKey::new(TypeUrl::Address, name)
    }

    fn body(b: &[u8]) -> Option<Versioned> {
        Some(Versioned::new(prost_types::Any { type_url: TypeUrl::Address.to_string(), value: b.to_vec() }))
    }

    /// A key, its new bytes (None: removed), what is reported upserted and removed.
    type Case = (&'static str, Option<&'static [u8]>, &'static [&'static str], &'static [&'static str]);

    #[test]
    fn only_changed_bytes_and_held_removals_are_reported() {
        let mut held = Resources::new();
        commit(&mut held, Set::from([(key("a"), body(b"1")), (key("b"), body(b"2"))]));
        let cases: &[Case] = &[
            ("a", Some(b"1"), &[], &[]),
            ("a", Some(b"9"), &["a"], &[]),
            ("c", None, &[], &[]),
            ("b", None, &[], &["b"]),
            ("b", None, &[], &[]),
        ];
        for (name, new, upserted, removed) in cases {
            let changes = commit(&mut held, Set::from([(key(name), new.and_then(body))]));
            let names = |keys: &[ResourceKey]| keys.iter().map(|k| k.name.to_string()).collect::<Vec<_>>();
            assert_eq!(names(&changes.upserted), *upserted, "{name} {new:?}");
            assert_eq!(names(&changes.removed), *removed, "{name} {new:?}");
        }
    }
}
