//! The snapshot the data path decides with: one immutable `MeshState`,
//! published by the [`MeshIndex`](crate::index::MeshIndex) after every
//! change and read without a lock. Every map inside is persistent (`imbl`):
//! cloning a snapshot is O(1) and a change copies only the path it touches.
//!
//! What is in a snapshot has been validated on the way in: a `MeshWorkload`
//! always has an address and a parsed identity, a `MeshService` its SANs as
//! `SpiffeId`s. Nothing here re-checks them.
//!
//! Lookups by address, endpoints of a service and the policies of a
//! workload all go through secondary indexes, never a scan of every
//! resource; see `index.rs` for how they are kept.

use crate::policy::{network::NetPolicy, Authorization, Scope};
use crate::spiffe::SpiffeId;
use crate::workload::*;
use imbl::{HashMap, OrdMap, OrdSet};
use std::net::IpAddr;
use std::ops::Deref;
use std::sync::Arc;

/// Moved to `abi`; still named here for its users.
pub use crate::abi::hbone_addr;

/// A workload as the data path uses it: the resource as received, plus what
/// is computed from it once, when it enters the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshWorkload {
    workload: Workload,
    identity: SpiffeId,
    address: IpAddr,
    labels: WorkloadLabels,
}

/// The telemetry label values of a workload, shared by every connection
/// to or from it: labelling a connection clones pointers, not strings. The
/// values are the fields as received; an empty one stays empty (the
/// telemetry layer decides how to show it).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WorkloadLabels {
    /// `workload.name` (the pod's name).
    pub name: Arc<str>,
    pub workload_name: Arc<str>,
    pub namespace: Arc<str>,
    /// The full identity, `spiffe://<td>/ns/<ns>/sa/<sa>`.
    pub principal: Arc<str>,
    /// `canonical_name`.
    pub app: Arc<str>,
    /// `canonical_revision`.
    pub version: Arc<str>,
    /// `cluster_id`.
    pub cluster: Arc<str>,
}

impl MeshWorkload {
    /// Only the index builds these, after validating `workload`: it has an
    /// address and `identity` is its identity.
    pub(crate) fn new(workload: Workload, identity: SpiffeId) -> Self {
        let address = workload.addresses[0];
        let labels = WorkloadLabels {
            name: workload.name.as_str().into(),
            workload_name: workload.workload_name.as_str().into(),
            namespace: workload.namespace.as_str().into(),
            principal: identity.to_string().into(),
            app: workload.canonical_name.as_str().into(),
            version: workload.canonical_revision.as_str().into(),
            cluster: workload.cluster_id.as_str().into(),
        };
        MeshWorkload { workload, identity, address, labels }
    }

    /// The resource as received.
    pub fn workload(&self) -> &Workload {
        &self.workload
    }

    /// Its identity, with the workload API's defaults applied (empty trust
    /// domain = `cluster.local`, empty service account = `default`).
    pub fn identity(&self) -> &SpiffeId {
        &self.identity
    }

    /// Its first address, the one the data path connects to.
    pub fn address(&self) -> IpAddr {
        self.address
    }

    pub fn labels(&self) -> &WorkloadLabels {
        &self.labels
    }
}

impl Deref for MeshWorkload {
    type Target = Workload;
    fn deref(&self) -> &Workload {
        &self.workload
    }
}

/// A service as the data path uses it: the resource as received, its
/// resource name and its SANs parsed once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshService {
    service: Service,
    key: Arc<str>,
    name: Arc<str>,
    namespace: Arc<str>,
    hostname: Arc<str>,
    sans: Vec<SpiffeId>,
}

impl MeshService {
    /// Only the index builds these, after validating `service`: `sans` are
    /// its `subject_alt_names`, parsed.
    pub(crate) fn new(service: Service, sans: Vec<SpiffeId>) -> Self {
        MeshService {
            key: service.key().into(),
            name: service.name.as_str().into(),
            namespace: service.namespace.as_str().into(),
            hostname: service.hostname.as_str().into(),
            service,
            sans,
        }
    }

    /// The resource as received.
    pub fn service(&self) -> &Service {
        &self.service
    }

    /// The identities its endpoints may present besides their own
    /// (`subject_alt_names`).
    pub fn sans(&self) -> &[SpiffeId] {
        &self.sans
    }

    /// Its resource name, `namespace/hostname`.
    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    pub fn namespace(&self) -> &Arc<str> {
        &self.namespace
    }

    pub fn hostname(&self) -> &Arc<str> {
        &self.hostname
    }

    pub(crate) fn key_arc(&self) -> &Arc<str> {
        &self.key
    }
}

impl Deref for MeshService {
    type Target = Service;
    fn deref(&self) -> &Service {
        &self.service
    }
}

/// One endpoint of a service port: a healthy member workload and the port
/// to reach it on (never 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub workload: Arc<MeshWorkload>,
    pub target_port: u16,
}

/// What an address names.
#[derive(Debug, Clone)]
pub enum Destination {
    Workload(Arc<MeshWorkload>),
    Service(Arc<MeshService>),
    Unknown,
}

/// The resources claiming one address (or hostname), oldest claim first:
/// the owner is the last. See `index.rs` for the rule.
pub(crate) type Claims = Vec<Arc<str>>;

/// An immutable view of the mesh. Cheap to clone; built only by
/// [`MeshIndex`](crate::index::MeshIndex).
#[derive(Debug, Clone, Default)]
pub struct MeshState {
    /// By uid.
    pub(crate) workloads: OrdMap<Arc<str>, Arc<MeshWorkload>>,
    /// Address -> uids of the workloads listing it.
    pub(crate) by_address: HashMap<IpAddr, Claims>,
    /// By `namespace/hostname`.
    pub(crate) services: OrdMap<Arc<str>, Arc<MeshService>>,
    /// VIP -> keys of the services listing it.
    pub(crate) by_vip: HashMap<IpAddr, Claims>,
    /// Hostname -> keys of the services (of any namespace) with it.
    pub(crate) by_hostname: HashMap<Arc<str>, Claims>,
    /// Service key -> uids of the workloads naming it in their `services`,
    /// whether or not the service itself is known (yet).
    pub(crate) members: HashMap<Arc<str>, OrdSet<Arc<str>>>,
    /// By `namespace/name`.
    pub(crate) policies: OrdMap<Arc<str>, Arc<Authorization>>,
    /// Namespace -> keys of its policies.
    pub(crate) policies_by_namespace: HashMap<Arc<str>, OrdSet<Arc<str>>>,
    /// Network policies by `Kind/namespace/name`.
    pub(crate) net_policies: OrdMap<Arc<str>, Arc<NetPolicy>>,
    /// Workload uid -> keys of the network policies selecting it.
    pub(crate) net_by_workload: HashMap<Arc<str>, OrdSet<Arc<str>>>,
}

impl MeshState {
    pub fn workload(&self, uid: &str) -> Option<Arc<MeshWorkload>> {
        self.workloads.get(uid).cloned()
    }

    /// The workload an address belongs to (the owner of its claim).
    pub fn workload_by_ip(&self, ip: IpAddr) -> Option<Arc<MeshWorkload>> {
        let uid = self.by_address.get(&ip)?.last()?;
        self.workloads.get(uid).cloned()
    }

    /// A service by its resource name, `namespace/hostname`.
    pub fn service(&self, key: &str) -> Option<Arc<MeshService>> {
        self.services.get(key).cloned()
    }

    /// A service by hostname alone, in any namespace (an HBONE request names
    /// the service it was sent to by hostname only). Should services of two
    /// namespaces share a hostname, the newest claim answers (`index.rs`).
    pub fn service_by_hostname(&self, hostname: &str) -> Option<Arc<MeshService>> {
        let key = self.by_hostname.get(hostname)?.last()?;
        self.services.get(key).cloned()
    }

    pub fn policy(&self, key: &str) -> Option<Arc<Authorization>> {
        self.policies.get(key).cloned()
    }

    /// What an address names: a service VIP first, then a workload address.
    pub fn destination(&self, ip: IpAddr) -> Destination {
        if let Some(s) = self.by_vip.get(&ip).and_then(|c| c.last()).and_then(|k| self.services.get(k)) {
            return Destination::Service(s.clone());
        }
        match self.workload_by_ip(ip) {
            Some(w) => Destination::Workload(w),
            None => Destination::Unknown,
        }
    }

    /// The policies that apply to a workload, sorted by key: GLOBAL ones of
    /// the root namespace, NAMESPACE ones of its namespace, and the
    /// WORKLOAD_SELECTOR ones it lists in `authorization_policies`. Reads the
    /// two namespaces' policies and the listed keys only.
    pub fn policies_for(&self, w: &MeshWorkload) -> Vec<Arc<Authorization>> {
        let mut found: Vec<(&str, &Arc<Authorization>)> = Vec::with_capacity(w.authorization_policies.len());
        for (namespace, scope) in [(ROOT_NAMESPACE, Scope::Global), (w.namespace.as_str(), Scope::Namespace)] {
            for key in self.policies_by_namespace.get(namespace).into_iter().flatten() {
                if let Some(p) = self.policies.get(key).filter(|p| p.scope == scope) {
                    found.push((key, p));
                }
            }
        }
        for key in &w.authorization_policies {
            if let Some(p) = self.policies.get(key.as_str()).filter(|p| p.scope == Scope::WorkloadSelector) {
                found.push((key, p));
            }
        }
        found.sort_unstable_by_key(|(k, _)| *k);
        found.dedup_by_key(|(k, _)| *k);
        found.into_iter().map(|(_, p)| p.clone()).collect()
    }

    /// The network policies that select a workload (by uid).
    pub fn net_policies_for(&self, uid: &str) -> Vec<Arc<NetPolicy>> {
        self.net_by_workload.get(uid).into_iter().flatten().filter_map(|k| self.net_policies.get(k).cloned()).collect()
    }

    pub fn net_policies(&self) -> impl Iterator<Item = &Arc<NetPolicy>> {
        self.net_policies.values()
    }

    /// The endpoints of a service port: its healthy members, in uid order
    /// (so that a given draw always picks the same one), each with its
    /// target port. The target port is the member's own for that service
    /// port (its `services` entry) if it lists one, else the service's. A
    /// target port of 0 means "not resolved for this workload" (Istio's
    /// meaning: a named target port the workload does not define), so such
    /// a member is no endpoint of that port.
    pub fn endpoints(&self, svc: &MeshService, service_port: u16) -> Vec<Endpoint> {
        let Some(members) = self.members.get(svc.key()) else {
            return Vec::new();
        };
        let service_target = svc.ports.iter().find(|p| p.service_port == service_port).map(|p| p.target_port);
        members
            .iter()
            .filter_map(|uid| {
                let w = self.workloads.get(uid)?;
                if w.status != WorkloadStatus::Healthy {
                    return None;
                }
                let own = w.services.get(svc.key())?.iter().find(|p| p.service_port == service_port).map(|p| p.target_port);
                let target_port = own.or(service_target)?;
                (target_port != 0).then(|| Endpoint { workload: w.clone(), target_port })
            })
            .collect()
    }

    /// The waypoint `g` names: its Service and the ready endpoints of its
    /// HBONE port. `Err` says why there is none (for the refusal's log
    /// line): traffic bound to it is then refused, never sent around it.
    pub fn waypoint(&self, g: &GatewayAddress) -> Result<(Arc<MeshService>, Vec<Endpoint>), &'static str> {
        let svc = self.service(&g.service_key()).ok_or("does not exist")?;
        let eps = self.endpoints(&svc, g.hbone_mtls_port);
        if eps.is_empty() {
            return Err("has no ready endpoint");
        }
        Ok((svc, eps))
    }

    /// Chooses an endpoint weighted by capacity; `draw` is uniform in
    /// [0, total weight) and comes from the caller (tests pass fixed values).
    pub fn pick(endpoints: &[Endpoint], draw: u64) -> Option<&Endpoint> {
        let total = Self::total_weight(endpoints);
        if total == 0 {
            return None;
        }
        let mut d = draw % total;
        for e in endpoints {
            let c = e.workload.capacity() as u64;
            if d < c {
                return Some(e);
            }
            d -= c;
        }
        endpoints.last()
    }

    pub fn total_weight(endpoints: &[Endpoint]) -> u64 {
        endpoints.iter().map(|e| e.workload.capacity() as u64).sum()
    }

    /// Every workload, in uid order.
    pub fn workloads(&self) -> impl Iterator<Item = &Arc<MeshWorkload>> {
        self.workloads.values()
    }

    /// Every service, in key order.
    pub fn services(&self) -> impl Iterator<Item = &Arc<MeshService>> {
        self.services.values()
    }

    /// Every policy, in key order.
    pub fn policies(&self) -> impl Iterator<Item = &Arc<Authorization>> {
        self.policies.values()
    }

    /// How many workloads, services and policies it holds.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.workloads.len(), self.services.len(), self.policies.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::*;
    use crate::index::{MeshConfig, ResourceKind};

    fn cfg() -> MeshConfig {
        let mut c = member(wl("c", "10.244.2.3"), ECHO, 80, 8080);
        c.status = WorkloadStatus::Unhealthy;
        let mut b = member(wl("b", "10.244.2.2"), ECHO, 80, 8081);
        b.capacity = 3;
        // Lists the service without a port of its own: the service's
        // target port applies.
        let mut e = wl("e", "10.244.2.5");
        e.services.insert(ECHO.into(), vec![]);
        MeshConfig {
            workloads: vec![
                member(wl("a", "10.244.1.2"), ECHO, 80, 8080),
                b,
                c,
                wl("d", "10.244.2.4"),
                e,
                // Its named target port does not resolve: never an endpoint.
                member(wl("f", "10.244.2.6"), ECHO, 80, 0),
            ],
            services: vec![svc("echo", "default", "10.96.0.10")],
            policies: vec![],
            net_policies: vec![],
        }
    }

    fn state() -> Arc<MeshState> {
        let (s, errors) = MeshState::from_config(&cfg());
        assert_eq!(errors, vec![]);
        s.assert_consistent();
        s
    }

    #[test]
    fn destinations() {
        let s = state();
        assert!(matches!(s.destination(ip("10.96.0.10")), Destination::Service(s) if s.key() == ECHO));
        assert!(matches!(s.destination(ip("10.244.2.4")), Destination::Workload(w) if w.name == "d"));
        assert!(matches!(s.destination(ip("8.8.8.8")), Destination::Unknown));
        assert_eq!(s.service_by_hostname("echo.default.svc.cluster.local").unwrap().key(), ECHO);
        assert!(s.service_by_hostname("echo").is_none());
        assert_eq!(s.counts(), (6, 1, 0));
    }

    #[test]
    fn endpoints_are_healthy_members_with_their_own_target_port() {
        let s = state();
        let svc = s.service(ECHO).unwrap();
        let eps = s.endpoints(&svc, 80);
        let eps: Vec<(&str, u16)> = eps.iter().map(|e| (e.workload.name.as_str(), e.target_port)).collect();
        assert_eq!(eps, vec![("a", 8080), ("b", 8081), ("e", 8080)]);
        assert!(s.endpoints(&svc, 81).is_empty());
    }

    #[test]
    fn pick_is_weighted_by_capacity() {
        let s = state();
        let svc = s.service(ECHO).unwrap();
        let eps = s.endpoints(&svc, 80);
        assert_eq!(MeshState::total_weight(&eps), 5);
        let picks: Vec<&str> = (0..6).map(|d| MeshState::pick(&eps, d).unwrap().workload.name.as_str()).collect();
        assert_eq!(picks, vec!["a", "b", "b", "b", "e", "a"]);
        assert!(MeshState::pick(&[], 0).is_none());
    }

    #[test]
    fn identity_and_labels_are_computed_once_with_the_defaults() {
        let mut w = wl("a", "10.0.0.1");
        w.addresses.push(ip("10.0.0.9"));
        w.workload_name = "app".into();
        w.canonical_name = "echo".into();
        w.canonical_revision = "v1".into();
        w.cluster_id = "Kubernetes".into();
        assert_eq!(w.spiffe_id(), "spiffe://cluster.local/ns/default/sa/default");
        assert_eq!(w.capacity(), 1);
        let (s, _) = MeshState::from_config(&MeshConfig { workloads: vec![w], ..Default::default() });
        let m = s.workload(&uid("a")).unwrap();
        assert_eq!(m.identity().to_string(), "spiffe://cluster.local/ns/default/sa/default");
        assert_eq!(m.address(), ip("10.0.0.1"), "the first address");
        assert_eq!(s.workload_by_ip(ip("10.0.0.9")).unwrap().uid, m.uid, "every address finds it");
        let l = m.labels();
        let got: Vec<&str> = [&l.name, &l.workload_name, &l.namespace, &l.principal, &l.app, &l.version, &l.cluster].map(|v| &**v).to_vec();
        assert_eq!(got, ["a", "app", "default", "spiffe://cluster.local/ns/default/sa/default", "echo", "v1", "Kubernetes"]);
        // The telemetry values are shared, not copied, by every user.
        assert!(Arc::ptr_eq(&m.labels().principal, &s.workload(&uid("a")).unwrap().labels().principal));
    }

    #[test]
    fn service_view() {
        let mut e = svc("echo", "default", "10.96.0.10");
        e.subject_alt_names = vec!["spiffe://cluster.local/ns/default/sa/extra".into()];
        let (s, _) = MeshState::from_config(&MeshConfig { services: vec![e], ..Default::default() });
        let e = s.service(ECHO).unwrap();
        assert_eq!((e.key(), &**e.name(), &**e.namespace(), &**e.hostname()), (ECHO, "echo", "default", "echo.default.svc.cluster.local"));
        assert_eq!(e.sans(), [SpiffeId::new("cluster.local", "default", "extra").unwrap()]);
        assert_eq!(e.ports[0].target_port, 8080, "derefs to the resource");
    }

    #[test]
    fn from_config_returns_the_refusals() {
        let mut bad = wl("x", "10.0.0.1");
        bad.service_account = "a?b".into();
        let (s, errors) = MeshState::from_config(&MeshConfig { workloads: vec![bad, wl("y", "10.0.0.2")], ..Default::default() });
        assert_eq!(s.counts(), (1, 0, 0));
        assert_eq!(errors.len(), 1);
        assert_eq!((errors[0].kind, errors[0].field.as_str()), (ResourceKind::Workload, "service_account"));
    }
}
