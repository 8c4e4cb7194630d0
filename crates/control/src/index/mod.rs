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
//!
//! The state is kept in views, each owning its objects and lookups:
//! [`workloads`] (namespaces, pods), [`services`] (Services,
//! EndpointSlices), [`policies`] (authorization, peer and request
//! authentication, network policies), [`routes`] (HTTPRoutes,
//! VirtualServices, DestinationRules, rate limits) and [`waypoints`]
//! (waypoint Gateways, their pods, bindings). `Index` only composes them:
//! it files each event with its view and notes in a [`batch::Batch`] what
//! to compute again; [`derive`] and [`compile`] read the views to make the
//! resources.

mod batch;
mod by_namespace;
mod compile;
mod derive;
mod policies;
mod routes;
mod selector;
mod services;
#[cfg(test)]
mod testing;
mod waypoints;
mod workloads;

use crate::objects::{Kind, ObjectError, ObjectRef};
use crate::resources::{Changes, Resources};
use crate::source::ObjectEvent;
use crate::translate::authorization::PolicyInput;
use crate::translate::http_route::HttpRouteInput;
use crate::translate::peer_authentication::PeerAuthnInput;
use crate::translate::request_authentication::Fetch;
use crate::translate::{self, Input, Labels, PodInput, ServiceInput};
use batch::Batch;
use derive::Views;
use policies::Policies;
use routes::{grpc_key, Routes};
use services::Services;
use slipstream_api::TypeUrl;
use slipstream_core::MeshConfig;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use waypoints::Waypoints;
use workloads::Workloads;

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

impl IndexSettings {
    /// A service's hostname: `<name>.<namespace>.svc.<domain_suffix>`.
    pub(crate) fn hostname(&self, name: &str, ns: &str) -> String {
        format!("{name}.{ns}.svc.{}", self.domain_suffix)
    }

    /// A pod's workload uid: `<cluster_id>//Pod/<namespace>/<name>`.
    pub(crate) fn workload_uid(&self, ns: &str, name: &str) -> String {
        format!("{}//Pod/{ns}/{name}", self.cluster_id)
    }
}

/// Cluster objects in, the workload API's resources out (see the module).
pub struct Index {
    settings: IndexSettings,
    workloads: Workloads,
    services: Services,
    policies: Policies,
    routes: Routes,
    waypoints: Waypoints,
    /// The root namespace's `istio` ConfigMap's settings, once it exists.
    mesh: Option<slipstream_core::mesh::MeshSettings>,
    resources: Resources,
}

impl Index {
    pub fn new(settings: IndexSettings) -> Self {
        Index {
            settings,
            workloads: Workloads::default(),
            services: Services::default(),
            policies: Policies::default(),
            routes: Routes::default(),
            waypoints: Waypoints::default(),
            mesh: None,
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

    /// The views, read-only, for computing resources.
    fn views(&self) -> Views<'_> {
        Views {
            settings: &self.settings,
            workloads: &self.workloads,
            services: &self.services,
            policies: &self.policies,
            routes: &self.routes,
            waypoints: &self.waypoints,
            mesh: self.mesh.as_ref(),
            list: self.waypoints.list(),
        }
    }

    /// Computes what `batch` names again and applies it, reporting only
    /// the resources whose bytes changed.
    fn flush(&mut self, batch: Batch) -> Changes {
        let set = batch.compute(&self.views());
        batch::commit(&mut self.resources, set)
    }

    /// Files a valid object with its view; notes in `batch` what it
    /// affects.
    fn upsert(&mut self, r: &ObjectRef, input: Input, batch: &mut Batch) {
        let (ns_name, name) = (r.namespace.as_str(), r.name.as_str());
        match input {
            Input::Namespace(n) => {
                if self.workloads.set_namespace(name, n) {
                    batch.pods.extend(self.workloads.pods(name).map(|p| (name.to_string(), p.name.clone())));
                    // Their waypoint may be the namespace's.
                    batch.services.extend(self.services.names(name).map(|s| (name.to_string(), s.clone())));
                    batch.net_all = true;
                    // A waypoint's listener may select namespaces by label.
                    batch.all_bindings |= self.waypoints.any();
                }
            }
            Input::ServiceAccount => self.workloads.add_service_account(ns_name, name),
            Input::Pod(p) => {
                batch.net_all |= self.workloads.pod(ns_name, name).is_none_or(|o| net_view_changed(o, &p));
                self.workloads.upsert_pod(p);
                batch.pods.insert((ns_name.to_string(), name.to_string()));
            }
            Input::Service(s) => self.set_service(ns_name, name, Some(s), batch),
            Input::EndpointSlice(s) => {
                let mut affected = BTreeSet::new();
                self.workloads.pods_in_slice(ns_name, &s, &mut affected);
                if let Some(old) = self.services.set_slice(ns_name, name, Some(s)) {
                    self.workloads.pods_in_slice(ns_name, &old, &mut affected);
                }
                batch.pods.extend(affected.into_iter().map(|p| (ns_name.to_string(), p)));
            }
            Input::AuthorizationPolicy(p) => self.set_policy(ns_name, name, Some(*p), batch),
            Input::PeerAuthentication(p) => self.set_peer_authn(ns_name, name, Some(p), batch),
            Input::NetworkPolicy(p) => {
                let key = net_key(r);
                self.policies.set_net(&key, Some(p));
                batch.net_policies.insert(key);
            }
            Input::Gateway(g) => {
                // Only a change of what binding reads recomputes every
                // binding: a Gateway written again unchanged (its status,
                // on Kubernetes) costs nothing.
                if self.waypoints.set(ns_name, name, g) {
                    batch.all_bindings = true;
                    batch.routes.insert((ns_name.to_string(), name.to_string()));
                }
            }
            Input::HttpRoute(h) => self.set_http_route(ns_name, name, Some(*h), batch),
            // Kept with the HTTPRoutes, under a name of its own kind.
            Input::GrpcRoute(h) => self.set_http_route(ns_name, &grpc_key(name), Some(*h), batch),
            // Either may change any service's routes (a VirtualService
            // names hosts anywhere; a DestinationRule's subsets are read
            // by every route naming them): all are compiled again, and
            // only those whose bytes change are pushed.
            Input::VirtualService(v) => batch.all_routes |= self.routes.set_virtual_service(ns_name, name, Some(*v)),
            Input::DestinationRule(d) => batch.all_routes |= self.routes.set_destination_rule(ns_name, name, Some(*d)),
            Input::RateLimit(l) => batch.all_routes |= self.routes.set_rate_limit(ns_name, name, Some(*l)),
            Input::RequestAuthentication(a) => {
                let inert = a.inert.clone();
                let changed = self.policies.set_request_authn(ns_name, name, *a);
                if let Some(why) = inert.filter(|_| changed) {
                    tracing::warn!(object = %r, "has no effect: {why}");
                }
                batch.all_routes |= changed;
            }
            Input::MeshConfig(m) => {
                batch.mesh |= self.mesh != Some(m);
                self.mesh = Some(m);
            }
            Input::Opaque => {}
        }
    }

    /// Takes an object out of its view; notes in `batch` what it affected.
    fn delete(&mut self, r: &ObjectRef, batch: &mut Batch) {
        let (ns_name, name) = (r.namespace.as_str(), r.name.as_str());
        match r.kind {
            Kind::Namespace => {
                if self.workloads.remove_namespace(name) {
                    batch.pods.extend(self.workloads.pods(name).map(|p| (name.to_string(), p.name.clone())));
                    batch.net_all = true;
                }
            }
            Kind::ServiceAccount => self.workloads.remove_service_account(ns_name, name),
            Kind::Pod => {
                if self.workloads.remove_pod(ns_name, name).is_some() {
                    batch.pods.insert((ns_name.to_string(), name.to_string()));
                    batch.net_all = true;
                }
            }
            Kind::Service => self.set_service(ns_name, name, None, batch),
            Kind::EndpointSlice => {
                if let Some(old) = self.services.set_slice(ns_name, name, None) {
                    let mut affected = BTreeSet::new();
                    self.workloads.pods_in_slice(ns_name, &old, &mut affected);
                    batch.pods.extend(affected.into_iter().map(|p| (ns_name.to_string(), p)));
                }
            }
            Kind::AuthorizationPolicy => self.set_policy(ns_name, name, None, batch),
            Kind::PeerAuthentication => self.set_peer_authn(ns_name, name, None, batch),
            Kind::NetworkPolicy | Kind::CiliumNetworkPolicy => {
                let key = net_key(r);
                if self.policies.set_net(&key, None) {
                    batch.net_policies.insert(key);
                }
            }
            Kind::HTTPRoute => self.set_http_route(ns_name, name, None, batch),
            Kind::GRPCRoute => self.set_http_route(ns_name, &grpc_key(name), None, batch),
            Kind::VirtualService => batch.all_routes |= self.routes.set_virtual_service(ns_name, name, None),
            Kind::DestinationRule => batch.all_routes |= self.routes.set_destination_rule(ns_name, name, None),
            Kind::LocalRateLimitPolicy => batch.all_routes |= self.routes.set_rate_limit(ns_name, name, None),
            Kind::RequestAuthentication => batch.all_routes |= self.policies.remove_request_authn(ns_name, name),
            Kind::ConfigMap => {
                if crate::translate::mesh_config::is_mesh_config(r, &self.settings.root_namespace) {
                    batch.mesh |= self.mesh.take().is_some();
                }
            }
            Kind::Gateway => {
                if self.waypoints.remove(ns_name, name) {
                    batch.all_bindings = true;
                    // Its own routes go with it.
                    batch.routes.insert((ns_name.to_string(), name.to_string()));
                }
            }
        }
    }

    /// The pods a service's selector matches, or (without one) those its
    /// EndpointSlices name.
    fn service_pods(&self, ns_name: &str, name: &str, selector: Option<&Labels>, out: &mut BTreeSet<String>) {
        match selector {
            Some(sel) => self.workloads.pods_matching(ns_name, sel, out),
            None => {
                for s in self.services.slices_of(ns_name, name) {
                    self.workloads.pods_in_slice(ns_name, s, out);
                }
            }
        }
    }

    fn set_service(&mut self, ns_name: &str, name: &str, new: Option<ServiceInput>, batch: &mut Batch) {
        let mut affected = BTreeSet::new();
        if let Some(s) = &new {
            self.service_pods(ns_name, name, s.selector.as_ref(), &mut affected);
        }
        if let Some(old) = self.services.set(ns_name, name, new) {
            self.service_pods(ns_name, name, old.selector.as_ref(), &mut affected);
        }
        batch.pods.extend(affected.into_iter().map(|p| (ns_name.to_string(), p)));
        batch.services.insert((ns_name.to_string(), name.to_string()));
        batch.routes.insert((ns_name.to_string(), name.to_string()));
    }

    fn set_policy(&mut self, ns_name: &str, name: &str, new: Option<PolicyInput>, batch: &mut Batch) {
        // Computed at the flush: it lets every waypoint through.
        batch.policies.insert((ns_name.to_string(), name.to_string()));
        let root = ns_name == self.settings.root_namespace;
        // A selector-bound policy may be enforced by a waypoint too, and any
        // policy decides whether a waypoint may take its namespace's at L7
        // (`waypoint_can_decide`): the routes of the namespace's services
        // (every namespace's, for the root's), when there are waypoints.
        if self.waypoints.any() {
            if root {
                batch.all_routes = true;
            } else {
                batch.routes.extend(self.services.names(ns_name).map(|s| (ns_name.to_string(), s.clone())));
            }
        }
        let mut selectors: Vec<Labels> = Vec::new();
        let mut touched = |p: &PolicyInput, batch: &mut Batch| {
            // A waypoint's policy: the routes resource of what it targets.
            if let Some(l7) = &p.l7 {
                batch.routes.extend(l7.services.iter().map(|s| (ns_name.to_string(), s.clone())));
                batch.all_routes |= !l7.gateways.is_empty();
            }
            selectors.extend(p.selector.clone());
        };
        if let Some(p) = &new {
            touched(p, batch);
        }
        if let Some(p) = self.policies.set_authorization(ns_name, name, new) {
            touched(&p, batch);
        }
        if selectors.is_empty() {
            return;
        }
        // A selector in the root namespace selects in every namespace.
        let scope: Vec<String> = if root { self.workloads.namespaces().cloned().collect() } else { vec![ns_name.to_string()] };
        for n in scope {
            let mut affected = BTreeSet::new();
            for sel in &selectors {
                self.workloads.pods_matching(&n, sel, &mut affected);
            }
            batch.pods.extend(affected.into_iter().map(|p| (n.clone(), p)));
        }
    }

    fn set_peer_authn(&mut self, ns_name: &str, name: &str, new: Option<PeerAuthnInput>, batch: &mut Batch) {
        let root = ns_name == self.settings.root_namespace;
        let old = self.policies.set_peer_authn(ns_name, name, new);
        let versions: Vec<&PeerAuthnInput> = old.iter().chain(self.policies.peer_authns(ns_name).get(name)).collect();
        let ns_wide = versions.iter().any(|p| p.is_wide());
        if root && ns_wide {
            batch.pods.extend(self.workloads.all_pods().map(|(n, p)| (n.clone(), p.name.clone())));
        } else if ns_wide {
            batch.pods.extend(self.workloads.pods(ns_name).map(|p| (ns_name.to_string(), p.name.clone())));
        } else {
            let mut affected = BTreeSet::new();
            for sel in versions.iter().filter_map(|p| p.selector()) {
                self.workloads.pods_matching(ns_name, sel, &mut affected);
            }
            batch.pods.extend(affected.into_iter().map(|p| (ns_name.to_string(), p)));
        }
    }

    fn set_http_route(&mut self, ns_name: &str, key: &str, new: Option<HttpRouteInput>, batch: &mut Batch) {
        for r in new.iter() {
            batch.routes.extend(r.parents.iter().map(|p| (p.namespace.clone(), p.name.clone())));
        }
        for r in self.routes.set_http_route(ns_name, key, new).iter() {
            batch.routes.extend(r.parents.iter().map(|p| (p.namespace.clone(), p.name.clone())));
        }
    }

    pub fn hostname(&self, name: &str, ns: &str) -> String {
        self.settings.hostname(name, ns)
    }

    pub fn workload_uid(&self, ns: &str, name: &str) -> String {
        self.settings.workload_uid(ns, name)
    }

    /// What the control plane must fetch for the RequestAuthentications
    /// that apply somewhere (their `jwksUri`), each with the address to
    /// fetch it from: its Service's cluster address and port, or why there
    /// is none.
    pub fn jwks_fetches(&self) -> BTreeMap<Fetch, Result<SocketAddr, String>> {
        self.policies
            .fetches()
            .map(|f| {
                let addr = match self.services.get(&f.namespace, &f.service) {
                    None => Err(format!("no Service {}/{}", f.namespace, f.service)),
                    Some(s) if !s.ports.iter().any(|p| p.port == f.port) => {
                        Err(format!("Service {}/{} has no port {}", f.namespace, f.service, f.port))
                    }
                    Some(s) => match s.addresses.first() {
                        Some(ip) => Ok(SocketAddr::new(*ip, f.port)),
                        None => Err(format!("Service {}/{} has no cluster address (headless)", f.namespace, f.service)),
                    },
                };
                (f, addr)
            })
            .collect()
    }

    /// A fetch's result: the JWKS (Some), or none to be had (None: the
    /// rules that need it refuse every token). The routes it changes.
    pub fn set_jwks(&mut self, fetch: &Fetch, jwks: Option<String>) -> Changes {
        let changed = self.policies.set_jwks(fetch, jwks);
        let wanted = self.jwks_fetches();
        self.policies.retain_jwks(|f| wanted.contains_key(f));
        let batch = Batch { all_routes: changed, ..Default::default() };
        self.flush(batch)
    }

    /// The pods of the waypoints, `(namespace, pod, service account)`
    /// (`Waypoints::not_waypoint_pod`). The CA lets their tokens (and no
    /// other workload's) obtain their own identity on Kubernetes, and the
    /// xDS server their configuration; an account that merely shares a
    /// Gateway's name, or a pod that copies a waypoint's labels, owner and
    /// account but runs anything else, gains nothing.
    pub fn waypoint_pods(&self) -> BTreeSet<(String, String, String)> {
        self.waypoints.pods(&self.workloads, &self.settings)
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

#[cfg(test)]
mod tests;
