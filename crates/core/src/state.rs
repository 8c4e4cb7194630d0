//! The index the data path decides with: lookups by address, endpoints of a
//! service, weighted endpoint choice. Built from a `MeshConfig` snapshot.

use crate::policy::{Authorization, Scope};
use crate::workload::*;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

#[derive(Debug, Default, Clone)]
pub struct MeshState {
    workloads: HashMap<String, Arc<Workload>>,
    by_ip: HashMap<IpAddr, String>,
    services: HashMap<String, Arc<Service>>,
    by_vip: HashMap<IpAddr, String>,
    policies: HashMap<String, Arc<Authorization>>,
}

/// What an address names.
#[derive(Debug, Clone)]
pub enum Destination {
    Workload(Arc<Workload>),
    Service(Arc<Service>),
    Unknown,
}

impl MeshState {
    pub fn new(cfg: &MeshConfig) -> Self {
        let mut s = MeshState::default();
        for w in &cfg.workloads {
            let w = Arc::new(w.clone());
            for a in &w.addresses {
                s.by_ip.insert(*a, w.uid.clone());
            }
            s.workloads.insert(w.uid.clone(), w);
        }
        for p in &cfg.policies {
            s.policies.insert(p.key(), Arc::new(p.clone()));
        }
        for svc in &cfg.services {
            let svc = Arc::new(svc.clone());
            for a in &svc.addresses {
                s.by_vip.insert(a.address, svc.key());
            }
            s.services.insert(svc.key(), svc);
        }
        s
    }

    pub fn workload(&self, uid: &str) -> Option<Arc<Workload>> {
        self.workloads.get(uid).cloned()
    }

    pub fn workload_by_ip(&self, ip: IpAddr) -> Option<Arc<Workload>> {
        self.by_ip.get(&ip).and_then(|u| self.workloads.get(u)).cloned()
    }

    pub fn service(&self, key: &str) -> Option<Arc<Service>> {
        self.services.get(key).cloned()
    }

    pub fn workloads(&self) -> impl Iterator<Item = &Arc<Workload>> {
        self.workloads.values()
    }

    pub fn services(&self) -> impl Iterator<Item = &Arc<Service>> {
        self.services.values()
    }

    pub fn destination(&self, ip: IpAddr) -> Destination {
        if let Some(k) = self.by_vip.get(&ip) {
            if let Some(s) = self.services.get(k) {
                return Destination::Service(s.clone());
            }
        }
        match self.workload_by_ip(ip) {
            Some(w) => Destination::Workload(w),
            None => Destination::Unknown,
        }
    }

    /// The policies that apply to a workload: GLOBAL ones of the root
    /// namespace, NAMESPACE ones of its namespace, and the WORKLOAD_SELECTOR
    /// ones it lists.
    pub fn policies_for(&self, w: &Workload) -> Vec<Arc<Authorization>> {
        let mut v: Vec<Arc<Authorization>> = self
            .policies
            .values()
            .filter(|p| match p.scope {
                Scope::Global => p.namespace == ROOT_NAMESPACE,
                Scope::Namespace => p.namespace == w.namespace,
                Scope::WorkloadSelector => w.authorization_policies.iter().any(|k| *k == p.key()),
            })
            .cloned()
            .collect();
        v.sort_by_key(|p| p.key());
        v
    }

    /// Healthy endpoints of a service port: (workload, target port).
    pub fn endpoints(&self, svc: &Service, service_port: u16) -> Vec<(Arc<Workload>, u16)> {
        let key = svc.key();
        let mut v: Vec<(Arc<Workload>, u16)> = self
            .workloads
            .values()
            .filter(|w| w.status == WorkloadStatus::Healthy)
            .filter_map(|w| {
                let ports = w.services.get(&key)?;
                let target = ports
                    .iter()
                    .find(|p| p.service_port == service_port)
                    .map(|p| p.target_port)
                    .or_else(|| svc.ports.iter().find(|p| p.service_port == service_port).map(|p| p.target_port))?;
                (target != 0).then(|| (w.clone(), target))
            })
            .collect();
        // Stable order, so that a given random draw always picks the same one.
        v.sort_by(|a, b| a.0.uid.cmp(&b.0.uid));
        v
    }

    /// Chooses an endpoint weighted by capacity; `draw` is uniform in
    /// [0, total weight) and comes from the caller (tests pass fixed values).
    pub fn pick(endpoints: &[(Arc<Workload>, u16)], draw: u64) -> Option<&(Arc<Workload>, u16)> {
        let total: u64 = endpoints.iter().map(|(w, _)| w.capacity() as u64).sum();
        if total == 0 {
            return None;
        }
        let mut d = draw % total;
        for e in endpoints {
            let c = e.0.capacity() as u64;
            if d < c {
                return Some(e);
            }
            d -= c;
        }
        endpoints.last()
    }

    pub fn total_weight(endpoints: &[(Arc<Workload>, u16)]) -> u64 {
        endpoints.iter().map(|(w, _)| w.capacity() as u64).sum()
    }
}

/// Moved to `abi`; still named here for its users.
pub use crate::abi::hbone_addr;

#[cfg(test)]
mod tests {
    use super::*;

    fn wl(name: &str, ip: &str, cap: u32, svc: Option<(&str, u16, u16)>, status: WorkloadStatus) -> Workload {
        let mut services = std::collections::BTreeMap::new();
        if let Some((k, sp, tp)) = svc {
            services.insert(k.to_string(), vec![Port { service_port: sp, target_port: tp }]);
        }
        Workload {
            uid: format!("c//Pod/default/{name}"),
            name: name.into(),
            namespace: "default".into(),
            addresses: vec![ip.parse().unwrap()],
            capacity: cap,
            services,
            status,
            ..Default::default()
        }
    }

    fn cfg() -> MeshConfig {
        let key = "default/echo.default.svc.cluster.local";
        MeshConfig {
            workloads: vec![
                wl("a", "10.244.1.2", 1, Some((key, 80, 8080)), WorkloadStatus::Healthy),
                wl("b", "10.244.2.2", 3, Some((key, 80, 8081)), WorkloadStatus::Healthy),
                wl("c", "10.244.2.3", 1, Some((key, 80, 8080)), WorkloadStatus::Unhealthy),
                wl("d", "10.244.2.4", 1, None, WorkloadStatus::Healthy),
            ],
            services: vec![Service {
                name: "echo".into(),
                namespace: "default".into(),
                hostname: "echo.default.svc.cluster.local".into(),
                addresses: vec![NetworkAddress { network: String::new(), address: "10.96.0.10".parse().unwrap() }],
                ports: vec![Port { service_port: 80, target_port: 8080 }],
                subject_alt_names: vec![],
            }],
            policies: vec![],
        }
    }

    #[test]
    fn destinations() {
        let s = MeshState::new(&cfg());
        assert!(matches!(s.destination("10.96.0.10".parse().unwrap()), Destination::Service(_)));
        assert!(matches!(s.destination("10.244.2.4".parse().unwrap()), Destination::Workload(w) if w.name == "d"));
        assert!(matches!(s.destination("8.8.8.8".parse().unwrap()), Destination::Unknown));
    }

    #[test]
    fn endpoints_are_healthy_members_with_their_own_target_port() {
        let s = MeshState::new(&cfg());
        let svc = s.service("default/echo.default.svc.cluster.local").unwrap();
        let eps = s.endpoints(&svc, 80);
        let names: Vec<(&str, u16)> = eps.iter().map(|(w, p)| (w.name.as_str(), *p)).collect();
        assert_eq!(names, vec![("a", 8080), ("b", 8081)]);
        assert!(s.endpoints(&svc, 81).is_empty());
    }

    #[test]
    fn pick_is_weighted_by_capacity() {
        let s = MeshState::new(&cfg());
        let svc = s.service("default/echo.default.svc.cluster.local").unwrap();
        let eps = s.endpoints(&svc, 80);
        assert_eq!(MeshState::total_weight(&eps), 4);
        let picks: Vec<&str> = (0..4).map(|d| MeshState::pick(&eps, d).unwrap().0.name.as_str()).collect();
        assert_eq!(picks, vec!["a", "b", "b", "b"]);
        assert!(MeshState::pick(&[], 0).is_none());
    }

    #[test]
    fn identity_defaults() {
        let w = wl("a", "10.0.0.1", 0, None, WorkloadStatus::Healthy);
        assert_eq!(w.spiffe_id(), "spiffe://cluster.local/ns/default/sa/default");
        assert_eq!(w.capacity(), 1);
    }
}
