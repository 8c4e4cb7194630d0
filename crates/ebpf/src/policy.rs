//! What the kernel may decide, compiled from the same engine and the same
//! snapshot as the node proxy: for each pod of this node (the source, whose
//! connect() the hook sees) and each known workload (the destination), the
//! verdict of [`engine::connection`] on every port a policy singles out,
//! and on one port none does (standing for all the others).
//!
//! A service address gets an entry for a declared port when every ready
//! endpoint of that port is denied to the source.
//!
//! Only what the engine decides is written, so the kernel never denies
//! what the proxy would allow: no entry means "no say" and the connection
//! goes on to the proxy (or, outside the mesh, to the destination). Pairs
//! whose policies name port ranges wider than [`MAX_RANGE_PORTS`] are left
//! to the proxy and the nftables path (an honest gap, counted in
//! [`Compiled::skipped_pairs`]). Pure: snapshot in, entries out.

use crate::abi::{PolicyKey, PolicyValue, POLICY_ALLOW, POLICY_DENY};
use slipstream_core::policy::engine;
use slipstream_core::policy::network::{Direction, L4Protocol, PortSpec};
use slipstream_core::{MeshState, MeshWorkload};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// Port ranges (`endPort`) up to this many ports are expanded port by port.
pub const MAX_RANGE_PORTS: u32 = 1024;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Compiled {
    pub entries: BTreeMap<PolicyKey, PolicyValue>,
    /// What each entry's `rule` refers to (index + 1): the explanation of
    /// the deciding layer, as `policy check` words it.
    pub rules: Vec<String>,
    /// Source and destination pairs left to user space.
    pub skipped_pairs: usize,
}

fn v4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(_) => None,
    }
}

/// The ports any policy governing `src -> dst` singles out; None when a
/// range is too wide to expand.
fn significant_ports(state: &MeshState, src: &MeshWorkload, dst: &MeshWorkload) -> Option<BTreeSet<u16>> {
    let mut ports = BTreeSet::new();
    let ends = [(src, Direction::Egress), (dst, Direction::Ingress)];
    for (w, dir) in ends {
        for p in state.net_policies_for(&w.uid) {
            let (allow, deny) = match dir {
                Direction::Egress => (&p.egress, &p.egress_deny),
                Direction::Ingress => (&p.ingress, &p.ingress_deny),
            };
            for rule in allow.iter().chain(deny.iter()) {
                for port in rule.ports.iter().flatten() {
                    match &port.port {
                        PortSpec::All => {}
                        PortSpec::Range { port, end } => {
                            if u32::from(*end).saturating_sub(u32::from(*port)) >= MAX_RANGE_PORTS {
                                return None;
                            }
                            ports.extend(*port..=*end);
                        }
                        PortSpec::Named(name) => {
                            if let Some(n) = p.named_ports.get(&dst.address()).and_then(|m| m.get(name)) {
                                ports.insert(*n);
                            }
                        }
                    }
                }
            }
        }
    }
    if dst.meshed() {
        for a in state.policies_for(dst) {
            for m in a.rules.iter().flat_map(|r| &r.clauses).flat_map(|c| &c.matches) {
                ports.extend(m.destination_ports.iter().chain(&m.not_destination_ports));
            }
        }
    }
    ports.remove(&0);
    Some(ports)
}

/// Whether any policy has a say between the two: if none does, every port
/// is allowed and nothing needs writing.
fn governed(state: &MeshState, src: &MeshWorkload, dst: &MeshWorkload) -> bool {
    !state.net_policies_for(&src.uid).is_empty()
        || !state.net_policies_for(&dst.uid).is_empty()
        || (dst.meshed() && !state.policies_for(dst).is_empty())
}

struct Rules {
    list: Vec<String>,
    index: BTreeMap<String, u32>,
}

impl Rules {
    fn id(&mut self, v: &engine::Verdict) -> u32 {
        let Some(d) = v.denial() else { return 0 };
        let text = d.explain();
        if let Some(i) = self.index.get(&text) {
            return *i;
        }
        self.list.push(text.clone());
        let i = self.list.len() as u32;
        self.index.insert(text, i);
        i
    }
}

/// Compiles the kernel's part of policy for the pods of `node`.
pub fn compile(state: &MeshState, node: &str) -> Compiled {
    let mut out = Compiled::default();
    let mut rules = Rules { list: Vec::new(), index: BTreeMap::new() };
    let all: Vec<&Arc<MeshWorkload>> = state.workloads().filter(|w| v4(w.address()).is_some()).collect();
    for src in all.iter().filter(|w| w.node == node) {
        let src_ip = v4(src.address()).expect("filtered");
        for dst in &all {
            if dst.uid == src.uid || !governed(state, src, dst) {
                continue;
            }
            let dst_ip = v4(dst.address()).expect("filtered");
            let Some(ports) = significant_ports(state, src, dst) else {
                out.skipped_pairs += 1;
                continue;
            };
            let other_port = (1..=u16::MAX).find(|p| !ports.contains(p)).unwrap_or(1);
            let decide = |port: u16| engine::connection(state, src, dst, L4Protocol::Tcp, port);
            let other = decide(other_port);
            if !other.allowed {
                let rule = rules.id(&other);
                out.entries.insert(PolicyKey::tcp(src_ip, dst_ip, 0), PolicyValue { verdict: POLICY_DENY, pad: [0; 3], rule });
            }
            for p in ports {
                let v = decide(p);
                if v.allowed == other.allowed {
                    continue;
                }
                let (verdict, rule) = if v.allowed { (POLICY_ALLOW, 0) } else { (POLICY_DENY, rules.id(&v)) };
                out.entries.insert(PolicyKey::tcp(src_ip, dst_ip, p), PolicyValue { verdict, pad: [0; 3], rule });
            }
        }
    }
    // A service address: refused at connect() when every ready endpoint
    // of that port would refuse (the proxy, whichever it picks, would
    // too). No endpoint: the proxy's answer, not the kernel's.
    for src in all.iter().filter(|w| w.node == node) {
        let src_ip = v4(src.address()).expect("filtered");
        for svc in state.services() {
            for vip in svc.addresses.iter().filter_map(|a| v4(a.address)) {
                for port in &svc.ports {
                    let eps = state.endpoints(svc, port.service_port);
                    let verdicts: Vec<engine::Verdict> =
                        eps.iter().map(|e| engine::connection(state, src, &e.workload, L4Protocol::Tcp, e.target_port)).collect();
                    if verdicts.is_empty() || verdicts.iter().any(|v| v.allowed) {
                        continue;
                    }
                    let rule = rules.id(&verdicts[0]);
                    out.entries
                        .insert(PolicyKey::tcp(src_ip, vip, port.service_port), PolicyValue { verdict: POLICY_DENY, pad: [0; 3], rule });
                }
            }
        }
    }
    out.rules = rules.list;
    out
}
