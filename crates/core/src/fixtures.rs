//! Resources for the tests of `state` and `index`, and a check that every
//! secondary index of a snapshot agrees with its primary maps.

use crate::policy::{Authorization, Scope};
use crate::state::MeshState;
use crate::workload::*;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

pub const ECHO: &str = "default/echo.default.svc.cluster.local";

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A healthy workload `c//Pod/default/<name>` at `addr`.
pub fn wl(name: &str, addr: &str) -> Workload {
    Workload {
        uid: format!("c//Pod/default/{name}"),
        name: name.into(),
        namespace: "default".into(),
        addresses: vec![ip(addr)],
        ..Default::default()
    }
}

pub fn uid(name: &str) -> String {
    format!("c//Pod/default/{name}")
}

/// `w`, member of `service` with one port.
pub fn member(mut w: Workload, service: &str, service_port: u16, target_port: u16) -> Workload {
    w.services.insert(service.into(), vec![Port { service_port, target_port, app_protocol: Default::default() }]);
    w
}

/// `<name>.<namespace>.svc.cluster.local` at `vip`, port 80 -> 8080.
pub fn svc(name: &str, namespace: &str, vip: &str) -> Service {
    Service {
        name: name.into(),
        namespace: namespace.into(),
        hostname: format!("{name}.{namespace}.svc.cluster.local"),
        addresses: vec![NetworkAddress { network: String::new(), address: ip(vip) }],
        ports: vec![Port { service_port: 80, target_port: 8080, app_protocol: Default::default() }],
        subject_alt_names: vec![],
        waypoint: None,
    }
}

pub fn policy(namespace: &str, name: &str, scope: Scope) -> Authorization {
    Authorization { name: name.into(), namespace: namespace.into(), scope, ..Default::default() }
}

impl MeshState {
    /// Recomputes every secondary index from the primary maps and compares:
    /// nothing missing, nothing stale, no empty entry left behind.
    pub fn assert_consistent(&self) {
        let mut addresses: BTreeMap<IpAddr, BTreeSet<String>> = BTreeMap::new();
        let mut members: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (uid, w) in self.workloads.iter() {
            assert_eq!(**uid, *w.uid);
            for a in &w.addresses {
                addresses.entry(*a).or_default().insert(w.uid.clone());
            }
            for k in w.services.keys() {
                members.entry(k.clone()).or_default().insert(w.uid.clone());
            }
        }
        let claims = |m: &imbl::HashMap<IpAddr, crate::state::Claims>| -> BTreeMap<IpAddr, BTreeSet<String>> {
            m.iter()
                .map(|(a, c)| {
                    let set: BTreeSet<String> = c.iter().map(|s| s.to_string()).collect();
                    assert_eq!(set.len(), c.len(), "{a}: a resource claims it twice: {c:?}");
                    (*a, set)
                })
                .collect()
        };
        assert_eq!(claims(&self.by_address), addresses, "address index");
        let got: BTreeMap<String, BTreeSet<String>> =
            self.members.iter().map(|(k, s)| (k.to_string(), s.iter().map(|u| u.to_string()).collect())).collect();
        assert_eq!(got, members, "member index");

        let mut vips: BTreeMap<IpAddr, BTreeSet<String>> = BTreeMap::new();
        let mut hostnames: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (key, s) in self.services.iter() {
            assert_eq!(**key, *s.key());
            for a in &s.addresses {
                vips.entry(a.address).or_default().insert(s.key().to_string());
            }
            hostnames.entry(s.hostname.clone()).or_default().insert(s.key().to_string());
        }
        assert_eq!(claims(&self.by_vip), vips, "VIP index");
        let got: BTreeMap<String, BTreeSet<String>> =
            self.by_hostname.iter().map(|(h, c)| (h.to_string(), c.iter().map(|k| k.to_string()).collect())).collect();
        assert_eq!(got, hostnames, "hostname index");

        let mut by_ns: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (key, p) in self.policies.iter() {
            assert_eq!(**key, p.key());
            by_ns.entry(p.namespace.clone()).or_default().insert(p.key());
        }
        let got: BTreeMap<String, BTreeSet<String>> =
            self.policies_by_namespace.iter().map(|(n, s)| (n.to_string(), s.iter().map(|k| k.to_string()).collect())).collect();
        assert_eq!(got, by_ns, "policy namespace index");
    }
}
