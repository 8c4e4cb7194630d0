//! The index: cluster objects in, the workload API's resources out. Pure
//! and synchronous (no I/O, no clock), so every case is a test that
//! applies objects and reads resources.
//!
//! Each event is validated first ([`crate::translate`]); an invalid object
//! is refused with an error and changes nothing. A valid one is stored and
//! only the resources it can affect are recomputed:
//!
//! | event | recomputed |
//! |---|---|
//! | Pod | its workload (and its converted PeerAuthentication policy) |
//! | Service | the service; the pods of its namespace its old or new selector matches (and, without selector, those its EndpointSlices name) |
//! | EndpointSlice | the pods its old or new endpoints name |
//! | Namespace | the pods of that namespace, if its labels changed |
//! | AuthorizationPolicy | the policy; the pods its old or new selector matches (every namespace's, for the root namespace) |
//! | PeerAuthentication | the pods it can apply to: selected ones, its namespace's, or every pod for the mesh-wide one |
//! | Gateway (a waypoint) | every service and pod: their waypoint binding may change (waypoints are few and change rarely) |
//! | HTTPRoute | the routes of the services its old or new version names as parents |
//!
//! A recomputed resource whose bytes did not change is not reported, so
//! one pod change is one upserted resource. Pods are kept per namespace
//! with an index of their labels, and services and policies with an index
//! of their selectors, so no event scans every pod of the cluster (but the
//! mesh-wide ones, which do apply to every pod).

use crate::objects::{Kind, ObjectError, ObjectRef};
use crate::resources::{Changes, ResourceKey, Resources, Versioned};
use crate::source::ObjectEvent;
use crate::translate::authorization::PolicyInput;
use crate::translate::network_policy::{NetPolicyInput, PodView};
use crate::translate::peer_authentication::{self, PeerAuthnInput};
use crate::translate::virtual_service as vs;
use crate::translate::waypoint::{self as wp, Binding, GatewayInput, Traffic, Waypoint};
use crate::translate::{self, selector_matches, Input, Labels, NamespaceInput, PodInput, ServiceInput, SliceInput};
use slipstream_api::convert::{authorization_any, to_any};
use slipstream_api::netpol::net_policy_any;
use slipstream_api::{workload as wl, TypeUrl};
use slipstream_core::policy::Authorization;
use slipstream_core::{GatewayAddress, MeshConfig, NetworkAddress, Port, Service, TunnelProtocol, Workload, WorkloadStatus};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

/// What the index needs to know of the mesh it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexSettings {
    /// Workload uids are `<cluster_id>//Pod/<namespace>/<name>`, and
    /// workloads carry it as `cluster_id`.
    pub cluster_id: String,
    pub trust_domain: String,
    /// Service hostnames are `<name>.<namespace>.svc.<domain_suffix>`.
    pub domain_suffix: String,
    /// Policies here apply mesh-wide.
    pub root_namespace: String,
    /// On Kubernetes, what the gateway controller deploys for a waypoint:
    /// a pod labelled with a waypoint Gateway's name is that waypoint's
    /// only if its spec is the rendered template (`gateway::genuine`).
    /// None where the cluster's own controller guarantees it (the local
    /// cluster, whose agent refuses those labels in anything a user
    /// applies).
    pub waypoint_template: Option<crate::gateway::render::DeploySettings>,
}

impl Default for IndexSettings {
    fn default() -> Self {
        IndexSettings {
            cluster_id: "Kubernetes".into(),
            trust_domain: slipstream_core::DEFAULT_TRUST_DOMAIN.into(),
            domain_suffix: crate::translate::DEFAULT_DOMAIN_SUFFIX.into(),
            root_namespace: slipstream_core::ROOT_NAMESPACE.into(),
            waypoint_template: None,
        }
    }
}

pub struct Index {
    settings: IndexSettings,
    namespaces: HashMap<String, Ns>,
    /// NetworkPolicies and CiliumNetworkPolicies by resource name
    /// (`Kind/namespace/name`). Their selectors can reach any pod of any
    /// namespace, so a change of a pod's labels, addresses, service
    /// account or named ports, or of a namespace's labels, resolves them
    /// all again (a resource whose bytes did not change is not pushed).
    net_policies: BTreeMap<String, NetPolicyInput>,
    /// The root namespace's `istio` ConfigMap's settings, once it exists.
    mesh: Option<slipstream_core::mesh::MeshSettings>,
    /// The JWKS the control plane fetched for RequestAuthentications
    /// (`crate::jwks`), by what was fetched; absent until the first fetch
    /// succeeds (the rule then refuses every token: fail closed).
    jwks: BTreeMap<crate::translate::request_authentication::Fetch, String>,
    resources: Resources,
}

/// Everything of one namespace, with the lookups events need.
#[derive(Default)]
struct Ns {
    /// None until the Namespace object is seen (objects may come first).
    namespace: Option<NamespaceInput>,
    pods: HashMap<String, PodInput>,
    pods_by_label: HashMap<(String, String), HashSet<String>>,
    pods_by_ip: HashMap<IpAddr, BTreeSet<String>>,
    services: BTreeMap<String, ServiceInput>,
    services_by_selector: SelectorIndex,
    selectorless: BTreeSet<String>,
    slices: HashMap<String, SliceInput>,
    slices_by_service: HashMap<String, BTreeSet<String>>,
    policies: BTreeMap<String, PolicyInput>,
    policies_by_selector: SelectorIndex,
    peer_authns: BTreeMap<String, PeerAuthnInput>,
    service_accounts: BTreeSet<String>,
    /// Gateways of class `istio-waypoint`, by name.
    waypoints: BTreeMap<String, (wp::TrafficType, wp::AllowedNamespaces)>,
    /// Other Gateways (kept so the namespace is not forgotten).
    other_gateways: BTreeSet<String>,
    http_routes: BTreeMap<String, crate::translate::http_route::HttpRouteInput>,
    virtual_services: BTreeMap<String, vs::VirtualServiceInput>,
    destination_rules: BTreeMap<String, vs::DestinationRuleInput>,
    rate_limits: BTreeMap<String, crate::translate::rate_limit::RateLimitInput>,
    request_authns: BTreeMap<String, crate::translate::request_authentication::RequestAuthnInput>,
}

/// Where a GRPCRoute is kept among the HTTPRoutes (a `/` is in no name).
fn grpc_key(name: &str) -> String {
    format!("grpc/{name}")
}

/// Objects with a label selector, filed under one pair of it: the
/// candidates for a set of labels are the objects filed under one of its
/// pairs, then checked in full.
#[derive(Default)]
struct SelectorIndex(HashMap<(String, String), BTreeSet<String>>);

impl SelectorIndex {
    fn key(selector: &Labels) -> Option<(String, String)> {
        selector.iter().next().map(|(k, v)| (k.clone(), v.clone()))
    }
    fn insert(&mut self, name: &str, selector: Option<&Labels>) {
        if let Some(k) = selector.and_then(Self::key) {
            self.0.entry(k).or_default().insert(name.to_string());
        }
    }
    fn remove(&mut self, name: &str, selector: Option<&Labels>) {
        if let Some(k) = selector.and_then(Self::key) {
            if let Some(set) = self.0.get_mut(&k) {
                set.remove(name);
                if set.is_empty() {
                    self.0.remove(&k);
                }
            }
        }
    }
    fn candidates<'a>(&'a self, labels: &'a Labels) -> impl Iterator<Item = &'a String> + 'a {
        labels.iter().filter_map(|(k, v)| self.0.get(&(k.clone(), v.clone()))).flatten()
    }
}

impl Ns {
    fn labels(&self) -> Labels {
        self.namespace.as_ref().map(|n| n.labels.clone()).unwrap_or_default()
    }

    fn is_empty(&self) -> bool {
        self.namespace.is_none()
            && self.pods.is_empty()
            && self.services.is_empty()
            && self.slices.is_empty()
            && self.policies.is_empty()
            && self.peer_authns.is_empty()
            && self.service_accounts.is_empty()
            && self.waypoints.is_empty()
            && self.other_gateways.is_empty()
            && self.http_routes.is_empty()
            && self.virtual_services.is_empty()
            && self.destination_rules.is_empty()
            && self.rate_limits.is_empty()
            && self.request_authns.is_empty()
    }

    fn add_pod(&mut self, p: PodInput) {
        for kv in &p.labels {
            self.pods_by_label.entry((kv.0.clone(), kv.1.clone())).or_default().insert(p.name.clone());
        }
        for ip in &p.ips {
            self.pods_by_ip.entry(*ip).or_default().insert(p.name.clone());
        }
        self.pods.insert(p.name.clone(), p);
    }

    fn remove_pod(&mut self, name: &str) -> Option<PodInput> {
        let p = self.pods.remove(name)?;
        for kv in &p.labels {
            let k = (kv.0.clone(), kv.1.clone());
            if let Some(set) = self.pods_by_label.get_mut(&k) {
                set.remove(name);
                if set.is_empty() {
                    self.pods_by_label.remove(&k);
                }
            }
        }
        for ip in &p.ips {
            if let Some(set) = self.pods_by_ip.get_mut(ip) {
                set.remove(name);
                if set.is_empty() {
                    self.pods_by_ip.remove(ip);
                }
            }
        }
        Some(p)
    }

    /// The pods `selector` matches, from the shortest posting list of its
    /// pairs.
    fn pods_matching(&self, selector: &Labels, out: &mut BTreeSet<String>) {
        if selector.is_empty() {
            out.extend(self.pods.keys().cloned());
            return;
        }
        let lists: Option<Vec<&HashSet<String>>> = selector.iter().map(|(k, v)| self.pods_by_label.get(&(k.clone(), v.clone()))).collect();
        let Some(shortest) = lists.and_then(|l| l.into_iter().min_by_key(|s| s.len())) else { return };
        out.extend(shortest.iter().filter(|n| self.pods.get(*n).is_some_and(|p| selector_matches(selector, &p.labels))).cloned());
    }

    /// The pods an EndpointSlice names (by target or address).
    fn pods_in_slice(&self, s: &SliceInput, out: &mut BTreeSet<String>) {
        for e in &s.endpoints {
            out.extend(e.pod.iter().filter(|p| self.pods.contains_key(*p)).cloned());
            for ip in &e.addresses {
                out.extend(self.pods_by_ip.get(ip).into_iter().flatten().cloned());
            }
        }
    }

    fn add_slice(&mut self, name: &str, s: SliceInput) {
        if let Some(svc) = &s.service {
            self.slices_by_service.entry(svc.clone()).or_default().insert(name.to_string());
        }
        self.slices.insert(name.to_string(), s);
    }

    fn remove_slice(&mut self, name: &str) -> Option<SliceInput> {
        let s = self.slices.remove(name)?;
        if let Some(svc) = &s.service {
            if let Some(set) = self.slices_by_service.get_mut(svc) {
                set.remove(name);
                if set.is_empty() {
                    self.slices_by_service.remove(svc);
                }
            }
        }
        Some(s)
    }
}

impl Index {
    pub fn new(settings: IndexSettings) -> Self {
        Index {
            settings,
            namespaces: HashMap::new(),
            net_policies: BTreeMap::new(),
            mesh: None,
            jwks: BTreeMap::new(),
            resources: Resources::new(),
        }
    }

    pub fn settings(&self) -> &IndexSettings {
        &self.settings
    }

    /// Every resource now: cloning it is O(1).
    pub fn resources(&self) -> &Resources {
        &self.resources
    }

    /// Applies one event; an invalid object is refused and changes nothing.
    pub fn apply(&mut self, event: ObjectEvent) -> Result<Changes, ObjectError> {
        let mut batch = Batch::default();
        match event {
            ObjectEvent::Upsert(o) => {
                let r = o.object_ref();
                let input = translate::input_with_root(&o, &self.settings.root_namespace, &self.settings.domain_suffix)?;
                self.upsert(&r, input, &mut batch);
            }
            ObjectEvent::Delete(r) => self.delete(&r, &mut batch),
        }
        Ok(self.flush(batch))
    }

    fn ns(&mut self, name: &str) -> &mut Ns {
        self.namespaces.entry(name.to_string()).or_default()
    }

    fn upsert(&mut self, r: &ObjectRef, input: Input, batch: &mut Batch) {
        let (ns_name, name) = (r.namespace.as_str(), r.name.as_str());
        match input {
            Input::Namespace(n) => {
                let ns = self.ns(name);
                let changed = ns.namespace.as_ref().is_none_or(|old| old.labels != n.labels);
                ns.namespace = Some(n);
                if changed {
                    batch.pods.extend(ns.pods.keys().map(|p| (name.to_string(), p.clone())));
                    // Their waypoint may be the namespace's.
                    batch.services.extend(ns.services.keys().map(|s| (name.to_string(), s.clone())));
                    batch.net_all = true;
                    // A waypoint's listener may select namespaces by label.
                    batch.all_bindings |= self.namespaces.values().any(|n| !n.waypoints.is_empty());
                }
            }
            Input::ServiceAccount => {
                self.ns(ns_name).service_accounts.insert(name.to_string());
            }
            Input::Pod(p) => {
                let ns = self.ns(ns_name);
                let old = ns.remove_pod(name);
                batch.net_all |= old.as_ref().is_none_or(|o| net_view_changed(o, &p));
                ns.add_pod(p);
                batch.pods.insert((ns_name.to_string(), name.to_string()));
            }
            Input::Service(s) => self.set_service(ns_name, name, Some(s), batch),
            Input::EndpointSlice(s) => {
                let ns = self.ns(ns_name);
                let mut affected = BTreeSet::new();
                if let Some(old) = ns.remove_slice(name) {
                    ns.pods_in_slice(&old, &mut affected);
                }
                ns.pods_in_slice(&s, &mut affected);
                ns.add_slice(name, s);
                batch.pods.extend(affected.into_iter().map(|p| (ns_name.to_string(), p)));
            }
            Input::AuthorizationPolicy(p) => self.set_policy(ns_name, name, Some(*p), batch),
            Input::PeerAuthentication(p) => self.set_peer_authn(ns_name, name, Some(p), batch),
            Input::NetworkPolicy(p) => {
                let key = net_key(r);
                self.net_policies.insert(key.clone(), p);
                batch.net_policies.insert(key);
            }
            Input::Gateway(g) => {
                let ns = self.ns(ns_name);
                let was = ns.waypoints.remove(name);
                ns.other_gateways.remove(name);
                let now = match g {
                    GatewayInput::Waypoint { takes, allowed } => Some((takes, allowed)),
                    GatewayInput::Other => {
                        ns.other_gateways.insert(name.to_string());
                        None
                    }
                };
                // Only a change of what binding reads recomputes every
                // binding: a Gateway written again unchanged (its status,
                // on Kubernetes) costs nothing.
                batch.all_bindings |= was != now;
                if was != now {
                    batch.routes.insert((ns_name.to_string(), name.to_string()));
                }
                if let Some(w) = now {
                    ns.waypoints.insert(name.to_string(), w);
                }
            }
            Input::HttpRoute(h) => self.set_http_route(ns_name, name, Some(*h), batch),
            // Kept with the HTTPRoutes, under a name of its own kind.
            Input::GrpcRoute(h) => self.set_http_route(ns_name, &grpc_key(name), Some(*h), batch),
            // Either may change any service's routes (a VirtualService
            // names hosts anywhere; a DestinationRule's subsets are read
            // by every route naming them): all are compiled again, and
            // only those whose bytes change are pushed.
            Input::VirtualService(v) => {
                let ns = self.ns(ns_name);
                batch.all_routes |= ns.virtual_services.insert(name.to_string(), *v.clone()).as_ref() != Some(&*v);
            }
            Input::DestinationRule(d) => {
                let ns = self.ns(ns_name);
                batch.all_routes |= ns.destination_rules.insert(name.to_string(), *d.clone()).as_ref() != Some(&*d);
            }
            Input::RateLimit(l) => {
                let ns = self.ns(ns_name);
                batch.all_routes |= ns.rate_limits.insert(name.to_string(), *l.clone()).as_ref() != Some(&*l);
            }
            Input::RequestAuthentication(a) => {
                let ns = self.ns(ns_name);
                let changed = ns.request_authns.get(name) != Some(&*a);
                if changed {
                    if let Some(why) = &a.inert {
                        tracing::warn!(object = %r, "has no effect: {why}");
                    }
                }
                ns.request_authns.insert(name.to_string(), *a);
                batch.all_routes |= changed;
            }
            Input::MeshConfig(m) => {
                batch.mesh |= self.mesh != Some(m);
                self.mesh = Some(m);
            }
            Input::Opaque => {}
        }
    }

    fn set_http_route(&mut self, ns_name: &str, name: &str, new: Option<crate::translate::http_route::HttpRouteInput>, batch: &mut Batch) {
        let ns = self.ns(ns_name);
        let old = ns.http_routes.remove(name);
        for r in old.iter().chain(new.iter()) {
            batch.routes.extend(r.parents.iter().map(|p| (p.namespace.clone(), p.name.clone())));
        }
        if let Some(h) = new {
            ns.http_routes.insert(name.to_string(), h);
        }
    }

    fn delete(&mut self, r: &ObjectRef, batch: &mut Batch) {
        let (ns_name, name) = (r.namespace.as_str(), r.name.as_str());
        match r.kind {
            Kind::Namespace => {
                if let Some(ns) = self.namespaces.get_mut(name) {
                    let had_labels = ns.namespace.take().is_some_and(|n| !n.labels.is_empty());
                    if had_labels {
                        batch.pods.extend(ns.pods.keys().map(|p| (name.to_string(), p.clone())));
                        batch.net_all = true;
                    }
                }
            }
            Kind::ServiceAccount => {
                if let Some(ns) = self.namespaces.get_mut(ns_name) {
                    ns.service_accounts.remove(name);
                }
            }
            Kind::Pod => {
                if let Some(ns) = self.namespaces.get_mut(ns_name) {
                    if ns.remove_pod(name).is_some() {
                        batch.pods.insert((ns_name.to_string(), name.to_string()));
                        batch.net_all = true;
                    }
                }
            }
            Kind::Service => self.set_service(ns_name, name, None, batch),
            Kind::EndpointSlice => {
                if let Some(ns) = self.namespaces.get_mut(ns_name) {
                    if let Some(old) = ns.remove_slice(name) {
                        let mut affected = BTreeSet::new();
                        ns.pods_in_slice(&old, &mut affected);
                        batch.pods.extend(affected.into_iter().map(|p| (ns_name.to_string(), p)));
                    }
                }
            }
            Kind::AuthorizationPolicy => self.set_policy(ns_name, name, None, batch),
            Kind::PeerAuthentication => self.set_peer_authn(ns_name, name, None, batch),
            Kind::NetworkPolicy | Kind::CiliumNetworkPolicy => {
                let key = net_key(r);
                if self.net_policies.remove(&key).is_some() {
                    batch.net_policies.insert(key);
                }
            }
            Kind::HTTPRoute => self.set_http_route(ns_name, name, None, batch),
            Kind::GRPCRoute => self.set_http_route(ns_name, &grpc_key(name), None, batch),
            Kind::VirtualService => {
                if let Some(ns) = self.namespaces.get_mut(ns_name) {
                    batch.all_routes |= ns.virtual_services.remove(name).is_some();
                }
            }
            Kind::DestinationRule => {
                if let Some(ns) = self.namespaces.get_mut(ns_name) {
                    batch.all_routes |= ns.destination_rules.remove(name).is_some();
                }
            }
            Kind::LocalRateLimitPolicy => {
                if let Some(ns) = self.namespaces.get_mut(ns_name) {
                    batch.all_routes |= ns.rate_limits.remove(name).is_some();
                }
            }
            Kind::RequestAuthentication => {
                if let Some(ns) = self.namespaces.get_mut(ns_name) {
                    batch.all_routes |= ns.request_authns.remove(name).is_some();
                }
            }
            Kind::ConfigMap => {
                if crate::translate::mesh_config::is_mesh_config(r, &self.settings.root_namespace) {
                    batch.mesh |= self.mesh.take().is_some();
                }
            }
            Kind::Gateway => {
                if let Some(ns) = self.namespaces.get_mut(ns_name) {
                    ns.other_gateways.remove(name);
                    if ns.waypoints.remove(name).is_some() {
                        batch.all_bindings = true;
                        // Its own routes go with it.
                        batch.routes.insert((ns_name.to_string(), name.to_string()));
                    }
                }
            }
        }
        if self.namespaces.get(ns_name).is_some_and(Ns::is_empty) {
            self.namespaces.remove(ns_name);
        }
        if r.kind == Kind::Namespace && self.namespaces.get(name).is_some_and(Ns::is_empty) {
            self.namespaces.remove(name);
        }
    }

    fn set_service(&mut self, ns_name: &str, name: &str, new: Option<ServiceInput>, batch: &mut Batch) {
        let ns = self.ns(ns_name);
        let mut affected = BTreeSet::new();
        if let Some(old) = ns.services.remove(name) {
            ns.services_by_selector.remove(name, old.selector.as_ref());
            ns.selectorless.remove(name);
            match &old.selector {
                Some(sel) => ns.pods_matching(sel, &mut affected),
                None => slice_pods(ns, name, &mut affected),
            }
        }
        if let Some(s) = new {
            match &s.selector {
                Some(sel) => ns.pods_matching(sel, &mut affected),
                None => {
                    ns.selectorless.insert(name.to_string());
                    slice_pods(ns, name, &mut affected);
                }
            }
            ns.services_by_selector.insert(name, s.selector.as_ref());
            ns.services.insert(name.to_string(), s);
        }
        batch.pods.extend(affected.into_iter().map(|p| (ns_name.to_string(), p)));
        batch.services.insert((ns_name.to_string(), name.to_string()));
        batch.routes.insert((ns_name.to_string(), name.to_string()));
    }

    fn set_policy(&mut self, ns_name: &str, name: &str, new: Option<PolicyInput>, batch: &mut Batch) {
        // Computed at the flush: it lets every waypoint through.
        batch.policies.insert((ns_name.to_string(), name.to_string()));
        let root = ns_name == self.settings.root_namespace;
        let any_waypoint = self.namespaces.values().any(|n| !n.waypoints.is_empty());
        let ns = self.ns(ns_name);
        let old = ns.policies.remove(name);
        // A selector-bound policy may be enforced by a waypoint too, and any
        // policy decides whether a waypoint may take its namespace's at L7
        // (`waypoint_can_decide`): the routes of the namespace's services
        // (every namespace's, for the root's), when there are waypoints.
        if any_waypoint {
            if root {
                batch.all_routes = true;
            } else {
                batch.routes.extend(ns.services.keys().map(|s| (ns_name.to_string(), s.clone())));
            }
        }
        // A waypoint's policy: the routes resource of what it targets.
        for l7 in old.iter().chain(new.iter()).filter_map(|p| p.l7.as_ref()) {
            batch.routes.extend(l7.services.iter().map(|s| (ns_name.to_string(), s.clone())));
            batch.all_routes |= !l7.gateways.is_empty();
        }
        let mut selectors: Vec<Labels> = Vec::new();
        if let Some(old) = &old {
            ns.policies_by_selector.remove(name, old.selector.as_ref());
            selectors.extend(old.selector.clone());
        }
        if let Some(p) = new {
            selectors.extend(p.selector.clone());
            ns.policies_by_selector.insert(name, p.selector.as_ref());
            ns.policies.insert(name.to_string(), p);
        }
        if selectors.is_empty() {
            return;
        }
        // A selector in the root namespace selects in every namespace.
        let scope: Vec<String> =
            if ns_name == self.settings.root_namespace { self.namespaces.keys().cloned().collect() } else { vec![ns_name.to_string()] };
        for n in scope {
            let Some(ns) = self.namespaces.get(&n) else { continue };
            let mut affected = BTreeSet::new();
            for sel in &selectors {
                ns.pods_matching(sel, &mut affected);
            }
            batch.pods.extend(affected.into_iter().map(|p| (n.clone(), p)));
        }
    }

    fn set_peer_authn(&mut self, ns_name: &str, name: &str, new: Option<PeerAuthnInput>, batch: &mut Batch) {
        let root = ns_name == self.settings.root_namespace;
        let ns = self.ns(ns_name);
        let old = ns.peer_authns.remove(name);
        let versions: Vec<&PeerAuthnInput> = old.iter().chain(new.iter()).collect();
        let mesh_wide = root && versions.iter().any(|p| p.is_wide());
        let ns_wide = versions.iter().any(|p| p.is_wide());
        let mut affected = BTreeSet::new();
        if !mesh_wide {
            if ns_wide {
                affected.extend(ns.pods.keys().cloned());
            } else {
                for sel in versions.iter().filter_map(|p| p.selector()) {
                    ns.pods_matching(sel, &mut affected);
                }
            }
        }
        if let Some(p) = new {
            ns.peer_authns.insert(name.to_string(), p);
        }
        if mesh_wide {
            for (n, ns) in &self.namespaces {
                batch.pods.extend(ns.pods.keys().map(|p| (n.clone(), p.clone())));
            }
        } else {
            batch.pods.extend(affected.into_iter().map(|p| (ns_name.to_string(), p)));
        }
    }

    /// Recomputes the pods of `batch`, then applies its resources,
    /// reporting only those whose bytes changed.
    fn flush(&mut self, mut batch: Batch) -> Changes {
        self.resolve_net_policies(&mut batch);
        if batch.all_bindings {
            for (n, ns) in &self.namespaces {
                batch.pods.extend(ns.pods.keys().map(|p| (n.clone(), p.clone())));
                batch.services.extend(ns.services.keys().map(|s| (n.clone(), s.clone())));
            }
        }
        if batch.all_bindings || batch.all_routes {
            for (n, ns) in &self.namespaces {
                batch.routes.extend(ns.services.keys().map(|s| (n.clone(), s.clone())));
            }
        } else if !batch.pods.is_empty()
            && self.namespaces.values().any(|n| {
                n.destination_rules.values().any(|d| !d.subsets.is_empty())
                    || n.policies.values().any(|p| p.selected_l7.as_ref().is_some_and(|(_, r)| !r.is_empty()))
            })
        {
            // A pod's labels decide which subsets it is in: the routes of
            // its namespace's services, compiled again.
            let touched: BTreeSet<&String> = batch.pods.iter().map(|(n, _)| n).collect();
            let mut more = Vec::new();
            for n in touched {
                if let Some(ns) = self.namespaces.get(n) {
                    more.extend(ns.services.keys().map(|s| (n.clone(), s.clone())));
                }
            }
            batch.routes.extend(more);
        }
        let waypoints = self.waypoints();
        // Every policy lets the waypoints through (`policy_resource`): all
        // of them again when the waypoints may have changed.
        if batch.all_bindings {
            for (n, ns) in &self.namespaces {
                batch.policies.extend(ns.policies.keys().map(|name| (n.clone(), name.clone())));
            }
        }
        // Each waypoint that takes workload traffic has routes of its own:
        // the policies it enforces on requests addressed to a pod bound to
        // it (`waypoint_own_policies`), computed again whenever a pod, a
        // service, a policy or a binding changed (waypoints are few; one
        // whose bytes did not change is not pushed).
        if batch.all_bindings || batch.all_routes || !batch.pods.is_empty() || !batch.services.is_empty() || !batch.policies.is_empty() {
            for (n, ns) in &self.namespaces {
                let own = ns.waypoints.iter().filter(|(_, (takes, _))| takes.takes(Traffic::Workload));
                batch.routes.extend(own.map(|(gw, _)| (n.clone(), gw.clone())));
            }
        }
        for (ns_name, name) in std::mem::take(&mut batch.policies) {
            let key = ResourceKey::new(TypeUrl::Authorization, &format!("{ns_name}/{name}"));
            let resource = self
                .namespaces
                .get(&ns_name)
                .and_then(|ns| ns.policies.get(&name))
                .and_then(|p| self.policy_resource(p, &waypoints))
                .map(|a| Versioned::new(authorization_any(&a)));
            batch.set(key, resource);
        }
        for (ns_name, name) in std::mem::take(&mut batch.services) {
            let hostname = self.hostname(&name, &ns_name);
            let key = ResourceKey::new(TypeUrl::Address, &format!("{ns_name}/{hostname}"));
            let resource = self
                .namespaces
                .get(&ns_name)
                .and_then(|ns| Some((ns, ns.services.get(&name)?)))
                .map(|(ns, s)| self.service_resource(ns, s, &hostname, &waypoints));
            batch.set(key, resource);
        }
        for (ns_name, name) in std::mem::take(&mut batch.routes) {
            let hostname = self.hostname(&name, &ns_name);
            let key = ResourceKey::new(TypeUrl::Route, &format!("{ns_name}/{hostname}"));
            let resource =
                self.service_routes(&ns_name, &name, &hostname, &waypoints).map(|r| Versioned::new(slipstream_api::routes::routes_any(&r)));
            batch.set(key, resource);
        }
        for (ns, pod) in std::mem::take(&mut batch.pods) {
            let uid = self.workload_uid(&ns, &pod);
            let policy_key = ResourceKey::new(TypeUrl::Authorization, &format!("{ns}/{}", peer_authentication::policy_name(&pod)));
            let (workload, policy) = match self.namespaces.get(&ns).and_then(|n| n.pods.get(&pod).map(|p| (n, p))) {
                Some((n, p)) => self.pod_resources(n, p, &waypoints),
                None => (None, None),
            };
            batch.set(ResourceKey::new(TypeUrl::Address, &uid), workload);
            batch.set(policy_key, policy.map(|a| Versioned::new(authorization_any(&a))));
        }
        if batch.mesh {
            let key = ResourceKey::new(TypeUrl::Mesh, slipstream_api::MESH_RESOURCE);
            batch.set(key, self.mesh.map(|m| Versioned::new(slipstream_api::mesh::mesh_any(&m))));
        }
        let mut changes = Changes::default();
        for (key, new) in batch.resources {
            match new {
                Some(v) => {
                    if self.resources.get(&key).is_none_or(|old| old.body != v.body) {
                        self.resources.insert(key.clone(), Arc::new(v));
                        changes.upserted.push(key);
                    }
                }
                None => {
                    if self.resources.remove(&key).is_some() {
                        changes.removed.push(key);
                    }
                }
            }
        }
        changes
    }

    /// Resolves the network policies the batch names (or all of them)
    /// against the pods now held.
    fn resolve_net_policies(&self, batch: &mut Batch) {
        let keys: Vec<String> = if batch.net_all {
            self.net_policies.keys().cloned().chain(std::mem::take(&mut batch.net_policies)).collect()
        } else {
            std::mem::take(&mut batch.net_policies).into_iter().collect()
        };
        if keys.is_empty() {
            return;
        }
        let empty = Labels::new();
        let mut views = Vec::new();
        for (ns_name, ns) in &self.namespaces {
            let ns_labels = ns.namespace.as_ref().map(|n| &n.labels).unwrap_or(&empty);
            for p in ns.pods.values() {
                if p.ips.is_empty() || p.terminal || p.host_network {
                    continue;
                }
                views.push(PodView {
                    uid: self.workload_uid(ns_name, &p.name),
                    namespace: ns_name,
                    namespace_labels: ns_labels,
                    service_account: &p.service_account,
                    labels: &p.labels,
                    ips: &p.ips,
                    named_ports: p.container_ports.iter().filter_map(|c| Some((c.name.as_deref()?, c.port))).collect(),
                });
            }
        }
        views.sort_by(|a, b| a.uid.cmp(&b.uid));
        for key in keys {
            let rk = ResourceKey::new(TypeUrl::NetworkPolicy, &key);
            let v = self.net_policies.get(&key).map(|p| Versioned::new(net_policy_any(&p.resolve(&views))));
            batch.set(rk, v);
        }
    }

    pub fn hostname(&self, name: &str, ns: &str) -> String {
        format!("{name}.{ns}.svc.{}", self.settings.domain_suffix)
    }

    /// The VirtualService for the service of key `service` (namespace
    /// `service_ns`): one in the service's own namespace first, else any;
    /// among several, the oldest, then by `namespace/name` (Istio merges
    /// none for the mesh and takes the oldest).
    fn virtual_service_for(&self, service: &str, service_ns: &str) -> Option<&vs::VirtualServiceInput> {
        self.namespaces
            .values()
            .flat_map(|n| n.virtual_services.values())
            .filter(|v| v.hosts.iter().any(|h| h == service) && !v.rules.is_empty())
            .min_by(|a, b| {
                (a.namespace != service_ns, &a.creation, &a.namespace, &a.name).cmp(&(
                    b.namespace != service_ns,
                    &b.creation,
                    &b.namespace,
                    &b.name,
                ))
            })
    }

    /// Whether a waypoint can evaluate every selector-bound and
    /// namespace-wide policy of `ns_name` (and of the root namespace) at
    /// L7: one it cannot (an attribute such as `destination.ip`) keeps
    /// their L7 versions from it, so that it never decides with a partial
    /// set; it then decides them all with the node proxies' engine.
    fn waypoint_can_decide(&self, ns_name: &str) -> bool {
        [ns_name, self.settings.root_namespace.as_str()]
            .iter()
            .filter_map(|n| self.namespaces.get(*n))
            .flat_map(|ns| ns.policies.values())
            .filter(|p| p.policy.is_some())
            .all(|p| p.selected_l7.is_some())
    }

    /// The resource node proxies get for a policy: as written, with every
    /// waypoint let through (docs/waypoint.md, "Policy"). A waypoint
    /// decides each request or connection it forwards by the destination's
    /// own policies, with the original client (its L7 versions where the
    /// control plane gave them, `selected_policies_for`, else the node
    /// proxies' engine on these very resources), so the destination's node
    /// proxy, which sees the waypoint's identity, must not decide its
    /// identity rules again on the waypoint: an ALLOW gains a rule "from a
    /// waypoint", each DENY rule a clause "not from a waypoint". Nothing
    /// that bypasses the waypoint gains by it: a direct caller is not a
    /// waypoint, and a rule that needs L7 keeps its L4 fail-safe meaning.
    fn policy_resource(&self, p: &PolicyInput, waypoints: &[Waypoint]) -> Option<Authorization> {
        use slipstream_core::policy::{Action, Clause, Match, Rule, StringMatch};
        let mut a = p.policy.clone()?;
        if waypoints.is_empty() {
            return Some(a);
        }
        let principals: Vec<StringMatch> = waypoints
            .iter()
            .map(|w| StringMatch::Exact(format!("{}/ns/{}/sa/{}", self.settings.trust_domain, w.namespace, w.name)))
            .collect();
        match a.action {
            Action::Allow => a.rules.push(Rule { clauses: vec![Clause { matches: vec![Match { principals, ..Default::default() }] }] }),
            Action::Deny => {
                for rule in &mut a.rules {
                    rule.clauses.push(Clause { matches: vec![Match { not_principals: principals.clone(), ..Default::default() }] });
                }
            }
        }
        Some(a)
    }

    /// The selector-bound and namespace-wide policies a waypoint enforces
    /// on requests to `svc`'s pods, each restricted to the pods it selects:
    /// all of them (its namespace's and the root's) as soon as one of its
    /// namespace's needs L7 for one of those pods, so that the waypoint
    /// decides as the pods' own policies would, with the original client.
    fn selected_policies_at_waypoint(&self, ns: &Ns, ns_name: &str, svc: &ServiceInput) -> Vec<slipstream_core::policy::l7::L7Policy> {
        let Some(sel) = &svc.selector else { return Vec::new() };
        let pods: Vec<&PodInput> = ns.pods.values().filter(|p| selector_matches(sel, &p.labels)).collect();
        self.selected_policies_for(ns, ns_name, &pods)
    }

    /// The selector-bound and namespace-wide policies of `pods` (of
    /// namespace `ns_name`) that a waypoint in front of them enforces:
    /// all of them as soon as one needs L7 for one of those pods.
    fn selected_policies_for(&self, ns: &Ns, ns_name: &str, pods: &[&PodInput]) -> Vec<slipstream_core::policy::l7::L7Policy> {
        let selects = |p: &PolicyInput, pod: &PodInput| p.selector.as_ref().is_none_or(|s| selector_matches(s, &pod.labels));
        // A namespace (or root) policy the waypoint cannot evaluate (an
        // attribute such as `destination.ip`) keeps them all out: the
        // waypoint then decides by the node proxies' engine, on every
        // policy, at L4 (`Shared::authorize_endpoint`).
        let needs = ns_name != self.settings.root_namespace
            && self.waypoint_can_decide(ns_name)
            && ns
                .policies
                .values()
                .any(|p| p.selected_l7.as_ref().is_some_and(|(_, r)| !r.is_empty()) && pods.iter().any(|pod| selects(p, pod)));
        if !needs {
            return Vec::new();
        }
        let root = self.namespaces.get(&self.settings.root_namespace).filter(|_| ns_name != self.settings.root_namespace);
        let mut out = Vec::new();
        for p in ns.policies.values().chain(root.into_iter().flat_map(|r| r.policies.values())) {
            let Some((l7, _)) = &p.selected_l7 else { continue };
            let mut uids: Vec<String> =
                pods.iter().filter(|pod| selects(p, pod)).map(|pod| self.workload_uid(ns_name, &pod.name)).collect();
            if uids.is_empty() {
                continue;
            }
            uids.sort();
            out.push(slipstream_core::policy::l7::L7Policy { workloads: Some(uids), ..l7.clone() });
        }
        out
    }

    /// The routes resource of the service `ns_name/name` (or of a
    /// waypoint's own name: see `waypoint_own_policies`), None when it has
    /// nothing for a waypoint.
    fn service_routes(
        &self,
        ns_name: &str,
        name: &str,
        hostname: &str,
        waypoints: &[Waypoint],
    ) -> Option<slipstream_core::route::ServiceRoutes> {
        let own = self.waypoint_own_policies(ns_name, name, waypoints);
        let Some((ns, svc)) = self.namespaces.get(ns_name).and_then(|ns| Some((ns, ns.services.get(name)?))) else {
            // A waypoint whose Service is not there (yet): its own routes.
            let jwt_rules = self.jwt_rules_for(ns_name, None, Some((ns_name, name)));
            return (!own.is_empty() || !jwt_rules.is_empty()).then(|| slipstream_core::route::ServiceRoutes {
                service: format!("{ns_name}/{hostname}"),
                policies: own,
                jwt_rules,
                ..Default::default()
            });
        };
        let routes: Vec<&crate::translate::http_route::HttpRouteInput> = ns.http_routes.values().collect();
        let mut compiled = crate::translate::http_route::compile(&routes, ns_name, name, hostname, &self.settings.domain_suffix);
        let service_key = format!("{ns_name}/{hostname}");
        // HTTPRoutes first (Gateway API is what the waypoint is
        // for); without them, the oldest VirtualService naming
        // the service.
        if compiled.rules.is_empty() {
            if let Some(v) = self.virtual_service_for(&service_key, ns_name) {
                compiled.rules = vs::compile(v, &|svc: &str, subset: &str| self.subset(svc, subset));
                compiled.source = "VirtualService".into();
            }
        }
        if let Some(d) = self.destination_rule_for(&service_key) {
            compiled.traffic = vs::TrafficInput::merged(d.traffic.as_ref(), None);
        }
        compiled.limits = self.rate_limits_for(ns_name, name, &compiled.rules);
        // The waypoint's policies on this service: those naming it,
        // and those naming the waypoint it is bound to.
        let gateway = self
            .waypoint_of(Traffic::Service, ns, ns_name, &svc.labels, waypoints)
            .filter(|g| g.hbone_mtls_port != 0)
            .map(|g| (g.namespace.clone(), g.hostname.split('.').next().unwrap_or("").to_string()));
        let mut policies = Vec::new();
        for l7 in ns.policies.values().filter_map(|p| p.l7.as_ref()) {
            if l7.services.contains(&name.to_string()) {
                policies.push(l7.policy.clone());
            }
        }
        if let Some((gw_ns, gw)) = &gateway {
            if let Some(gns) = self.namespaces.get(gw_ns) {
                for l7 in gns.policies.values().filter_map(|p| p.l7.as_ref()) {
                    if l7.gateways.contains(gw) && !policies.contains(&l7.policy) {
                        policies.push(l7.policy.clone());
                    }
                }
            }
        }
        if gateway.is_some() {
            policies.extend(self.selected_policies_at_waypoint(ns, ns_name, svc));
        }
        policies.extend(own);
        compiled.policies = policies;
        // RequestAuthentications: those naming the service, those naming
        // the waypoint it is bound to, and (for a waypoint's own name: the
        // requests addressed to its pods) those naming that waypoint.
        let mut jwt_rules = self.jwt_rules_for(ns_name, Some(name), gateway.as_ref().map(|(n, g)| (n.as_str(), g.as_str())));
        if ns.waypoints.contains_key(name) && gateway.as_ref().is_none_or(|(n, g)| n != ns_name || g != name) {
            jwt_rules.extend(self.jwt_rules_for(ns_name, None, Some((ns_name, name))));
        }
        compiled.jwt_rules = jwt_rules;
        (!compiled.rules.is_empty()
            || !compiled.policies.is_empty()
            || compiled.traffic != Default::default()
            || !compiled.limits.is_empty()
            || !compiled.jwt_rules.is_empty())
        .then_some(compiled)
    }

    /// The JWT rules of the RequestAuthentications that target the Service
    /// `ns_name/service` or the waypoint Gateway `gateway` (namespace,
    /// name), each with its JWKS (inline, or as fetched: empty until then).
    fn jwt_rules_for(&self, ns_name: &str, service: Option<&str>, gateway: Option<(&str, &str)>) -> Vec<slipstream_core::route::JwtRule> {
        use crate::translate::request_authentication::{KeySource, Target};
        let mut out = Vec::new();
        let mut add = |n: &str, pick: &dyn Fn(&Target) -> bool| {
            let Some(ns) = self.namespaces.get(n) else { return };
            for a in ns.request_authns.values().filter(|a| a.targets.iter().any(pick)) {
                for r in &a.rules {
                    let mut rule = r.rule.clone();
                    if r.keys != KeySource::Inline {
                        rule.jwks = r.keys.fetch().and_then(|f| self.jwks.get(&f)).cloned().unwrap_or_default();
                    }
                    out.push(rule);
                }
            }
        };
        if let Some(svc) = service {
            add(ns_name, &|t| matches!(t, Target::Service(s) if s == svc));
        }
        if let Some((gw_ns, gw)) = gateway {
            add(gw_ns, &|t| matches!(t, Target::Gateway(g) if g == gw));
        }
        // As Istio: ordered by issuer (stable: then by policy).
        out.sort_by(|a, b| (&a.issuer, &a.policy).cmp(&(&b.issuer, &b.policy)));
        out
    }

    /// What the control plane must fetch for the RequestAuthentications
    /// that apply somewhere (their `jwksUri`), each with the address to
    /// fetch it from: its Service's cluster address and port, or why there
    /// is none.
    pub fn jwks_fetches(&self) -> BTreeMap<crate::translate::request_authentication::Fetch, Result<std::net::SocketAddr, String>> {
        self.namespaces
            .values()
            .flat_map(|ns| ns.request_authns.values())
            .filter(|a| a.inert.is_none())
            .flat_map(|a| a.rules.iter().filter_map(|r| r.keys.fetch()))
            .map(|f| {
                let svc = self.namespaces.get(&f.namespace).and_then(|ns| ns.services.get(&f.service));
                let addr = match svc {
                    None => Err(format!("no Service {}/{}", f.namespace, f.service)),
                    Some(s) if !s.ports.iter().any(|p| p.port == f.port) => {
                        Err(format!("Service {}/{} has no port {}", f.namespace, f.service, f.port))
                    }
                    Some(s) => match s.addresses.first() {
                        Some(ip) => Ok(std::net::SocketAddr::new(*ip, f.port)),
                        None => Err(format!("Service {}/{} has no cluster address (headless)", f.namespace, f.service)),
                    },
                };
                (f, addr)
            })
            .collect()
    }

    /// A fetch's result: the JWKS (Some), or none to be had (None: the
    /// rules that need it refuse every token). The routes it changes.
    pub fn set_jwks(&mut self, fetch: &crate::translate::request_authentication::Fetch, jwks: Option<String>) -> Changes {
        let changed = match jwks {
            Some(j) => self.jwks.insert(fetch.clone(), j.clone()).as_ref() != Some(&j),
            None => self.jwks.remove(fetch).is_some(),
        };
        let wanted = self.jwks_fetches();
        self.jwks.retain(|f, _| wanted.contains_key(f));
        let batch = Batch { all_routes: changed, ..Default::default() };
        self.flush(batch)
    }

    /// What waypoint `ns_name/gw` enforces on requests addressed to a pod
    /// bound to it (`istio.io/waypoint-for: workload` or `all`): the
    /// policies targeting its Gateway (as Istio), the policies targeting
    /// each Service bound to it that selects the pod (stricter than Istio,
    /// which applies them only to requests addressed to the Service: no
    /// pod under a Service's L7 policy is reachable through the waypoint
    /// without it; restricted to those pods, `L7Policy.pods`), and the
    /// pods' own selector-bound and namespace-wide policies (as in front
    /// of a Service: `selected_policies_for`). Empty for anything that is
    /// not a waypoint taking workload traffic.
    fn waypoint_own_policies(&self, ns_name: &str, gw: &str, waypoints: &[Waypoint]) -> Vec<slipstream_core::policy::l7::L7Policy> {
        use slipstream_core::policy::l7::L7Policy;
        let Some(gns) = self.namespaces.get(ns_name) else { return Vec::new() };
        if !gns.waypoints.get(gw).is_some_and(|(takes, _)| takes.takes(Traffic::Workload)) {
            return Vec::new();
        }
        let hostname = self.hostname(gw, ns_name);
        let is_me = |g: &GatewayAddress| g.hbone_mtls_port != 0 && g.namespace == ns_name && g.hostname == hostname;
        let mut out: Vec<L7Policy> = gns
            .policies
            .values()
            .filter_map(|p| p.l7.as_ref())
            .filter(|l7| l7.gateways.iter().any(|g| g == gw))
            .map(|l7| l7.policy.clone())
            .collect();
        for (n, ns) in &self.namespaces {
            let ns_labels = ns.labels();
            let bound: Vec<&PodInput> = ns
                .pods
                .values()
                .filter(|p| !p.host_network && translate::is_meshed(&ns_labels, &p.labels))
                .filter(|p| self.waypoint_of(Traffic::Workload, ns, n, &p.labels, waypoints).is_some_and(|g| is_me(&g)))
                .collect();
            if bound.is_empty() {
                continue;
            }
            let mut by_policy: BTreeMap<&str, (L7Policy, BTreeSet<String>)> = BTreeMap::new();
            for s in ns.services.values() {
                let Some(sel) = &s.selector else { continue };
                if !self.waypoint_of(Traffic::Service, ns, n, &s.labels, waypoints).is_some_and(|g| is_me(&g)) {
                    continue;
                }
                let uids: Vec<String> =
                    bound.iter().filter(|p| selector_matches(sel, &p.labels)).map(|p| self.workload_uid(n, &p.name)).collect();
                if uids.is_empty() {
                    continue;
                }
                for (pname, p) in &ns.policies {
                    let Some(l7) = p.l7.as_ref().filter(|l7| l7.services.contains(&s.name)) else { continue };
                    by_policy.entry(pname).or_insert_with(|| (l7.policy.clone(), BTreeSet::new())).1.extend(uids.iter().cloned());
                }
            }
            out.extend(by_policy.into_values().map(|(p, uids)| L7Policy { pods: Some(uids.into_iter().collect()), ..p }));
            out.extend(self.selected_policies_for(ns, n, &bound));
        }
        out
    }

    /// The LocalRateLimitPolicies that reach the service `ns/name`: those
    /// naming it, and those naming a route one of its `rules` came from.
    fn rate_limits_for(&self, ns: &str, name: &str, rules: &[slipstream_core::route::RouteRule]) -> Vec<slipstream_core::route::RateLimit> {
        use crate::translate::rate_limit::Target;
        use slipstream_core::route::{LimitScope, RateLimit};
        let mut out = Vec::new();
        for n in self.namespaces.values() {
            for p in n.rate_limits.values() {
                let whole = p.namespace == ns && p.targets.iter().any(|t| matches!(t, Target::Service(s) if s == name));
                let scope = if whole {
                    LimitScope::Service
                } else {
                    let (routes, exact) = p.rule_scope();
                    let reaches = rules.iter().any(|r| exact.contains(&r.name) || routes.iter().any(|x| r.name.starts_with(x.as_str())));
                    if !reaches {
                        continue;
                    }
                    LimitScope::Rules { routes, rules: exact }
                };
                out.push(RateLimit {
                    policy: format!("{}/{}", p.namespace, p.name),
                    requests: p.requests,
                    interval: p.interval,
                    burst: p.burst,
                    scope,
                });
            }
        }
        out
    }

    /// The DestinationRule for the service of key `service`: by name
    /// before a wildcard, the service's namespace first, then the oldest.
    fn destination_rule_for(&self, service: &str) -> Option<&vs::DestinationRuleInput> {
        let service_ns = service.split_once('/').map_or("", |(n, _)| n);
        self.namespaces.values().flat_map(|n| n.destination_rules.values()).filter(|d| d.applies(service) > 0).min_by(|a, b| {
            (std::cmp::Reverse(a.applies(service)), a.namespace != service_ns, &a.creation, &a.namespace, &a.name).cmp(&(
                std::cmp::Reverse(b.applies(service)),
                b.namespace != service_ns,
                &b.creation,
                &b.namespace,
                &b.name,
            ))
        })
    }

    /// A subset of a service's DestinationRule: the UIDs of the pods of
    /// the service's namespace whose labels it selects, and its merged
    /// traffic policy. A subset no rule defines selects nothing (the
    /// waypoint answers 503, as Envoy does for a missing cluster).
    fn subset(&self, service: &str, name: &str) -> slipstream_core::route::Subset {
        let mut out = slipstream_core::route::Subset { name: name.to_string(), ..Default::default() };
        let Some(d) = self.destination_rule_for(service) else { return out };
        let Some(s) = d.subsets.iter().find(|s| s.name == name) else { return out };
        let service_ns = service.split_once('/').map_or("", |(n, _)| n);
        if let Some(ns) = self.namespaces.get(service_ns) {
            let mut uids: Vec<String> = ns
                .pods
                .values()
                .filter(|p| crate::translate::selector_matches(&s.labels, &p.labels))
                .map(|p| self.workload_uid(service_ns, &p.name))
                .collect();
            uids.sort();
            out.workloads = uids;
        }
        out.traffic = s.traffic.as_ref().map(|t| vs::TrafficInput::merged(d.traffic.as_ref(), Some(t)));
        out
    }

    pub fn workload_uid(&self, ns: &str, name: &str) -> String {
        format!("{}//Pod/{ns}/{name}", self.settings.cluster_id)
    }

    /// The pods of the waypoints, `(namespace, pod, service account)`
    /// ([`Index::is_waypoint_pod`]). The CA lets their tokens (and no
    /// other workload's) obtain their own identity on Kubernetes, and the
    /// xDS server their configuration; an account that merely shares a
    /// Gateway's name, or a pod that copies a waypoint's labels, owner and
    /// account but runs anything else, gains nothing.
    pub fn waypoint_pods(&self) -> BTreeSet<(String, String, String)> {
        // Through the label index: a few lookups per waypoint, not a scan
        // of the pods (this runs after every batch).
        let mut out = BTreeSet::new();
        for (n, ns) in self.namespaces.iter().filter(|(_, ns)| !ns.waypoints.is_empty()) {
            for gw in ns.waypoints.keys() {
                let Some(names) = ns.pods_by_label.get(&(wp::GATEWAY_NAME_LABEL.to_string(), gw.clone())) else { continue };
                for p in names.iter().filter_map(|name| ns.pods.get(name)) {
                    if self.is_waypoint_pod(ns, p) {
                        out.insert((n.clone(), p.name.clone(), gw.clone()));
                    }
                }
            }
        }
        out
    }

    /// Whether `pod` is a pod of a waypoint of its namespace: labelled
    /// with the Gateway's name, running as the Gateway's account (a
    /// waypoint runs as its Gateway's name) and, on Kubernetes, running
    /// the controller's rendered template (`gateway::genuine`: labels,
    /// owners and accounts are written by whoever creates the pod).
    fn is_waypoint_pod(&self, ns: &Ns, pod: &PodInput) -> bool {
        self.not_waypoint_pod(ns, pod).is_none()
    }

    /// Why `pod` is not a waypoint's pod ([`Index::is_waypoint_pod`]).
    fn not_waypoint_pod(&self, ns: &Ns, pod: &PodInput) -> Option<String> {
        let Some(gw) = pod.labels.get(wp::GATEWAY_NAME_LABEL) else { return Some("it has no gateway-name label".into()) };
        if !ns.waypoints.contains_key(gw) {
            return Some(format!("there is no waypoint Gateway {gw}"));
        }
        if pod.service_account != *gw {
            return Some(format!("it runs as service account {}, not {gw}", pod.service_account));
        }
        let settings = self.settings.waypoint_template.as_ref()?;
        let Some(spec) = pod.waypoint_spec.as_deref() else { return Some("its spec is unknown".into()) };
        // The mesh root in the template is whatever the root was when the
        // pod was made (a rotation rolls the Deployment): public, and
        // only ever used to verify the control plane at the address the
        // pod dials, which is compared.
        let root = crate::gateway::genuine::root_pem(spec).unwrap_or_default();
        let settings = crate::gateway::render::DeploySettings { root_pem: root.to_string(), ..settings.clone() };
        let template = crate::gateway::render::pod_template(gw, &settings);
        crate::gateway::genuine::differs(spec, &template["spec"]).map(|field| format!("its {field} differs from waypoint {gw}'s template"))
    }

    /// Every waypoint, as binding sees it. Always ready: binding fills the
    /// waypoint fields whether or not a pod of it is ready (the node
    /// proxy refuses the traffic until one is), so readiness changes no
    /// resource; it is reported, not published.
    fn waypoints(&self) -> Vec<Waypoint> {
        let mut out = Vec::new();
        for (n, ns) in &self.namespaces {
            for (name, (takes, allowed)) in &ns.waypoints {
                out.push(Waypoint { name: name.clone(), namespace: n.clone(), takes: *takes, allowed: allowed.clone(), ready: true });
            }
        }
        out
    }

    /// The waypoint an object of `ns` with `labels` is bound to: named
    /// whether or not the binding is in force (fail closed: a binding
    /// that was asked for and cannot hold sends the traffic nowhere,
    /// never around the waypoint).
    fn waypoint_of(&self, traffic: Traffic, ns: &Ns, namespace: &str, labels: &Labels, waypoints: &[Waypoint]) -> Option<GatewayAddress> {
        let is_waypoint = labels.contains_key(wp::GATEWAY_NAME_LABEL);
        match wp::bind(traffic, namespace, labels, &ns.labels(), is_waypoint, waypoints) {
            Binding::None => None,
            Binding::Bound { namespace, name, .. } => {
                Some(GatewayAddress { hostname: self.hostname(&name, &namespace), namespace, hbone_mtls_port: wp::HBONE_LISTENER_PORT })
            }
            // Asked for and not in force: named, with no port, so no node
            // proxy can reach it (NO_WAYPOINT) and the waypoint does not
            // serve it (it does not exist yet, its listener does not allow
            // the namespace, or it does not take that kind of traffic).
            Binding::Refused { namespace, name, .. } => {
                Some(GatewayAddress { hostname: self.hostname(&name, &namespace), namespace, hbone_mtls_port: 0 })
            }
        }
    }

    fn service_resource(&self, ns: &Ns, s: &ServiceInput, hostname: &str, waypoints: &[Waypoint]) -> Versioned {
        let svc = Service {
            name: s.name.clone(),
            namespace: s.namespace.clone(),
            hostname: hostname.to_string(),
            addresses: s.addresses.iter().map(|a| NetworkAddress { network: String::new(), address: *a }).collect(),
            ports: s
                .ports
                .iter()
                .map(|p| Port { service_port: p.port, target_port: p.wire_target(), app_protocol: p.app_protocol })
                .collect(),
            subject_alt_names: Vec::new(),
            waypoint: self.waypoint_of(Traffic::Service, ns, &s.namespace, &s.labels, waypoints),
        };
        let msg = wl::Address { r#type: Some(wl::address::Type::Service((&svc).into())) };
        Versioned::new(to_any(TypeUrl::Address, &msg))
    }

    /// A pod's workload (none without an address, or once it has ended)
    /// and its converted PeerAuthentication policy.
    fn pod_resources(&self, ns: &Ns, pod: &PodInput, waypoints: &[Waypoint]) -> (Option<Versioned>, Option<Authorization>) {
        if pod.ips.is_empty() || pod.terminal {
            return (None, None);
        }
        let ns_labels = ns.labels();
        let meshed = !pod.host_network && translate::is_meshed(&ns_labels, &pod.labels);
        let waypoint_pod = match pod.labels.get(wp::GATEWAY_NAME_LABEL).filter(|gw| ns.waypoints.contains_key(*gw)) {
            None => false,
            Some(gw) => match self.not_waypoint_pod(ns, pod) {
                None => true,
                Some(why) => {
                    tracing::warn!(
                        pod = %format!("{}/{}", pod.namespace, pod.name),
                        "a pod labelled as waypoint {gw}'s is not one ({why}): it gets no certificate, no configuration and no traffic for the waypoint"
                    );
                    false
                }
            },
        };
        let mut services = BTreeMap::new();
        let mut selecting: BTreeSet<&String> = ns.services_by_selector.candidates(&pod.labels).collect();
        selecting.extend(ns.selectorless.iter());
        for name in selecting {
            let Some(s) = ns.services.get(name) else { continue };
            // A waypoint's own Service has only the waypoint's pods as
            // endpoints: a pod that only looks like one is no replica.
            if ns.waypoints.contains_key(&s.name) && !waypoint_pod {
                continue;
            }
            let ports = match &s.selector {
                Some(sel) if selector_matches(sel, &pod.labels) => s
                    .ports
                    .iter()
                    .filter_map(|p| Some(Port { service_port: p.port, target_port: p.target_on(pod)?, app_protocol: p.app_protocol }))
                    .collect(),
                Some(_) => continue,
                None => match slice_ports(ns, s, pod) {
                    Some(ports) => ports,
                    None => continue,
                },
            };
            services.insert(format!("{}/{}", s.namespace, self.hostname(&s.name, &s.namespace)), ports);
        }
        let mut policies = BTreeSet::new();
        let mut converted = None;
        if meshed {
            let root = self.namespaces.get(&self.settings.root_namespace);
            let mut add = |from: &Ns, from_name: &str| {
                for name in from.policies_by_selector.candidates(&pod.labels) {
                    let Some(p) = from.policies.get(name) else { continue };
                    if p.policy.is_some() && p.selector.as_ref().is_some_and(|s| selector_matches(s, &pod.labels)) {
                        policies.insert(format!("{from_name}/{name}"));
                    }
                }
            };
            add(ns, &pod.namespace);
            if let Some(root) = root.filter(|_| pod.namespace != self.settings.root_namespace) {
                add(root, &self.settings.root_namespace);
            }
            let empty = BTreeMap::new();
            let root_pas = root.map(|r| &r.peer_authns).unwrap_or(&empty);
            converted = peer_authentication::for_pod(ns.peer_authns.iter(), root_pas.iter(), &pod.namespace, &pod.name, &pod.labels);
            if let Some(c) = &converted {
                policies.insert(c.key());
            }
        }
        let trust_domain =
            if self.settings.trust_domain == slipstream_core::DEFAULT_TRUST_DOMAIN { "" } else { &self.settings.trust_domain };
        let w = Workload {
            uid: self.workload_uid(&pod.namespace, &pod.name),
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            addresses: pod.ips.clone(),
            network: String::new(),
            tunnel_protocol: if meshed { TunnelProtocol::Hbone } else { TunnelProtocol::None },
            trust_domain: trust_domain.to_string(),
            service_account: pod.service_account.clone(),
            node: pod.node.clone(),
            canonical_name: canonical(&pod.labels, &["service.istio.io/canonical-name", "app.kubernetes.io/name", "app"])
                .unwrap_or_else(|| pod.workload_name.clone()),
            canonical_revision: canonical(&pod.labels, &["service.istio.io/canonical-revision", "app.kubernetes.io/version", "version"])
                .unwrap_or_else(|| "latest".into()),
            workload_type: pod.workload_type,
            workload_name: pod.workload_name.clone(),
            services,
            authorization_policies: policies.into_iter().collect(),
            status: if pod.ready && !pod.terminating { WorkloadStatus::Healthy } else { WorkloadStatus::Unhealthy },
            cluster_id: self.settings.cluster_id.clone(),
            capacity: 1,
            // Only a meshed pod's traffic is captured, so only it can be
            // sent through a waypoint.
            waypoint: if meshed { self.waypoint_of(Traffic::Workload, ns, &pod.namespace, &pod.labels, waypoints) } else { None },
        };
        let msg = wl::Address { r#type: Some(wl::address::Type::Workload((&w).into())) };
        let mut v = Versioned::new(to_any(TypeUrl::Address, &msg));
        v.node = Some(w.node.as_str().into()).filter(|n: &Arc<str>| !n.is_empty());
        v.identity = Some(w.spiffe_id().into());
        (Some(v), converted)
    }

    /// Every resource decoded into the mesh model (workloads by uid,
    /// services by key, policies by key): for tests, debugging and
    /// `proxy-config`.
    pub fn mesh_config(&self) -> MeshConfig {
        decode(&self.resources)
    }
}

/// The mesh model of a set of manifests, as node proxies would receive it
/// from this control plane: for offline questions (`slipstream policy check
/// -f`) and tests. Pods count only with an address (`status.podIP`). Every
/// invalid object is reported; none is applied then.
pub fn mesh_from_manifests(text: &str, settings: IndexSettings) -> Result<MeshConfig, Vec<ObjectError>> {
    let objects = crate::translate::parse_manifests(text)?;
    let mut index = Index::new(settings);
    let mut errors = Vec::new();
    for o in objects {
        if let Err(e) = index.apply(ObjectEvent::Upsert(o)) {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(index.mesh_config())
    } else {
        Err(errors)
    }
}

/// Decodes resources into the mesh model; a resource that does not decode
/// (which the index never produces) is skipped.
pub fn decode(resources: &Resources) -> MeshConfig {
    use slipstream_api::convert::{address_from_any, authorization_from_any, AddressResource};
    let mut cfg = MeshConfig::default();
    for (key, v) in resources {
        match key.type_url {
            TypeUrl::Address => match address_from_any(&v.body) {
                Ok(AddressResource::Workload(w)) => cfg.workloads.push(w),
                Ok(AddressResource::Service(s)) => cfg.services.push(s),
                Err(_) => {}
            },
            TypeUrl::Authorization => cfg.policies.extend(authorization_from_any(&v.body).ok()),
            TypeUrl::NetworkPolicy => cfg.net_policies.extend(slipstream_api::netpol::net_policy_from_any(&v.body).ok()),
            // Not part of the mesh model: the waypoints' own.
            TypeUrl::Route | TypeUrl::Mesh => {}
        }
    }
    cfg.workloads.sort_by(|a, b| a.uid.cmp(&b.uid));
    cfg.services.sort_by_key(|s| s.key());
    cfg.policies.sort_by_key(|p| p.key());
    cfg.net_policies.sort_by_key(|p| p.key());
    cfg
}

/// The resource name of a network policy: `Kind/namespace/name`.
fn net_key(r: &ObjectRef) -> String {
    format!("{}/{}/{}", r.kind, r.namespace, r.name)
}

/// Whether a pod changed in what network policies select or resolve.
fn net_view_changed(old: &PodInput, new: &PodInput) -> bool {
    old.labels != new.labels
        || old.ips != new.ips
        || old.service_account != new.service_account
        || old.container_ports != new.container_ports
        || old.host_network != new.host_network
        || old.terminal != new.terminal
}

/// The first of `keys` the labels have.
fn canonical(labels: &Labels, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| labels.get(*k).cloned())
}

/// The pods named by the EndpointSlices of a service.
fn slice_pods(ns: &Ns, service: &str, out: &mut BTreeSet<String>) {
    for slice in ns.slices_by_service.get(service).into_iter().flatten() {
        if let Some(s) = ns.slices.get(slice) {
            ns.pods_in_slice(s, out);
        }
    }
}

/// The ports of a service without selector on one pod, if one of its
/// EndpointSlices names the pod: each service port maps to the slice port
/// of the same name and protocol (a number target port stands when the
/// slice has none).
fn slice_ports(ns: &Ns, s: &ServiceInput, pod: &PodInput) -> Option<Vec<Port>> {
    let names = ns.slices_by_service.get(&s.name)?;
    let slice = names.iter().filter_map(|n| ns.slices.get(n)).find(|sl| {
        sl.endpoints.iter().any(|e| e.pod.as_deref() == Some(pod.name.as_str()) || e.addresses.iter().any(|a| pod.ips.contains(a)))
    })?;
    Some(
        s.ports
            .iter()
            .filter_map(|p| {
                let from_slice = slice.ports.iter().find(|sp| sp.name == p.name && sp.protocol == p.protocol).map(|sp| sp.port);
                let target = from_slice.or(match p.target {
                    translate::TargetPort::Number(n) => Some(n),
                    translate::TargetPort::Named(_) => None,
                })?;
                Some(Port { service_port: p.port, target_port: target, app_protocol: p.app_protocol })
            })
            .collect(),
    )
}

/// The work of one event: pods to recompute, then resources to set.
#[derive(Default)]
struct Batch {
    pods: BTreeSet<(String, String)>,
    /// Services (namespace, name) whose resource to compute again.
    services: BTreeSet<(String, String)>,
    /// A waypoint came, went or changed: every binding again.
    all_bindings: bool,
    /// Services (namespace, name) whose routes to compile again.
    routes: BTreeSet<(String, String)>,
    /// A policy on a waypoint Gateway changed: every service's routes.
    all_routes: bool,
    resources: BTreeMap<ResourceKey, Option<Versioned>>,
    /// Network policies to resolve again (by resource name).
    net_policies: BTreeSet<String>,
    /// Every network policy: a pod or namespace they may select changed.
    net_all: bool,
    /// AuthorizationPolicies (namespace, name) whose resource to compute.
    policies: BTreeSet<(String, String)>,
    /// The mesh's settings changed.
    mesh: bool,
}

impl Batch {
    fn set(&mut self, key: ResourceKey, v: Option<Versioned>) {
        self.resources.insert(key, v);
    }
}

#[cfg(test)]
mod tests;
