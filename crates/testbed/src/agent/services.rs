//! Services: VIP allocation, endpoints from ready pods, and what they turn
//! into (nftables rules, hosts entries, status). Pure over the agent's state.

use super::node::Node;
use super::pods::PodRuntime;
use super::store::{services, Store};
use crate::plan::{self, HostsEntry, ServiceRule};
use crate::status::{EndpointPort, EndpointStatus, ServicePortStatus, ServiceStatus};
use slipstream_k8s::expand::selector_matches;
use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

pub type Vips = BTreeMap<(String, String), Ipv4Addr>;

/// Frees VIPs of deleted services and allocates VIPs for new ones
/// (`spec.clusterIP` when given, otherwise the first free address).
pub fn allocate_vips(store: &Store, vips: &mut Vips) {
    let live: BTreeSet<(String, String)> =
        services(store).iter().filter(|s| !s.spec.is_headless()).map(|s| (s.metadata.namespace.clone(), s.metadata.name.clone())).collect();
    vips.retain(|k, _| live.contains(k));
    for s in services(store) {
        let k = (s.metadata.namespace.clone(), s.metadata.name.clone());
        if s.spec.is_headless() || vips.contains_key(&k) {
            continue;
        }
        let used: BTreeSet<Ipv4Addr> = vips.values().copied().collect();
        let want = s.spec.cluster_ip.as_deref().and_then(|i| i.parse::<Ipv4Addr>().ok());
        if let Some(ip) = want.or_else(|| plan::next_vip(&used)) {
            vips.insert(k, ip);
        }
    }
}

pub struct ServiceView {
    pub status: Vec<ServiceStatus>,
    pub rules: Vec<ServiceRule>,
    pub hosts: Vec<HostsEntry>,
}

pub fn view(store: &Store, pods: &[&PodRuntime], nodes: &[Node], vips: &Vips) -> ServiceView {
    let mut out = ServiceView { status: Vec::new(), rules: Vec::new(), hosts: Vec::new() };
    for s in services(store) {
        let ns = &s.metadata.namespace;
        let vip = vips.get(&(ns.clone(), s.metadata.name.clone())).copied();
        let backends: Vec<&&PodRuntime> = match &s.spec.selector {
            Some(sel) => pods.iter().filter(|p| &p.inst.namespace == ns && p.ready() && selector_matches(sel, &p.inst.labels)).collect(),
            None => Vec::new(),
        };
        let endpoints: Vec<EndpointStatus> = backends
            .iter()
            .map(|p| EndpointStatus {
                pod: p.inst.name.clone(),
                ip: p.ip.to_string(),
                node: nodes.iter().find(|n| n.index == p.node).map(|n| n.name.clone()).unwrap_or_default(),
                ports: s
                    .spec
                    .ports
                    .iter()
                    .filter_map(|sp| Some(EndpointPort { port: sp.port as u16, target_port: plan::resolve_target_port(sp, &p.inst.spec)? }))
                    .collect(),
            })
            .collect();
        if let Some(vip) = vip {
            for sp in &s.spec.ports {
                out.rules.push(ServiceRule {
                    vip,
                    port: sp.port as u16,
                    protocol: sp.protocol,
                    endpoints: backends.iter().filter_map(|p| Some((p.ip, plan::resolve_target_port(sp, &p.inst.spec)?))).collect(),
                });
            }
        }
        out.hosts.push(HostsEntry {
            namespace: ns.clone(),
            name: s.metadata.name.clone(),
            addresses: match vip {
                Some(v) => vec![v],
                None => backends.iter().map(|p| p.ip).collect(),
            },
        });
        out.status.push(ServiceStatus {
            namespace: ns.clone(),
            name: s.metadata.name.clone(),
            vip: vip.map(|v| v.to_string()).unwrap_or_else(|| "None".into()),
            ports: s
                .spec
                .ports
                .iter()
                .map(|p| ServicePortStatus {
                    name: p.name.clone().unwrap_or_default(),
                    port: p.port as u16,
                    target_port: p.target().to_string(),
                    protocol: p.protocol.to_string(),
                })
                .collect(),
            endpoints,
        });
    }
    out
}
