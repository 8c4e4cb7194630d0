//! The network-policy layer: Kubernetes NetworkPolicy and Cilium's
//! CiliumNetworkPolicy, as the control plane resolves them (label
//! selectors already turned into workload uids and addresses, so deciding
//! needs no labels and no other object).
//!
//! Semantics (docs/authorization.md has the sources):
//!
//! - a pod selected by at least one policy that isolates a direction is
//!   isolated in that direction; it is then allowed only what the union of
//!   the allow rules of every policy selecting it allows (order does not
//!   matter, policies only add);
//! - Cilium's deny rules (`ingressDeny`, `egressDeny`) win over every allow
//!   rule of any policy;
//! - a rule matches when its peer and its port both match: no peer list
//!   means every peer, an empty one none; no port list means every port.

use super::{Cidr, LayerVerdict, PolicyKind, PolicyRule, Reason};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Connections the workload accepts (decided at the destination).
    Ingress,
    /// Connections the workload opens (decided at the source).
    Egress,
}

/// The network-policy kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum NetKind {
    #[default]
    NetworkPolicy,
    CiliumNetworkPolicy,
}

impl NetKind {
    pub fn policy_kind(self) -> PolicyKind {
        match self {
            NetKind::NetworkPolicy => PolicyKind::NetworkPolicy,
            NetKind::CiliumNetworkPolicy => PolicyKind::CiliumNetworkPolicy,
        }
    }
}

/// One NetworkPolicy or CiliumNetworkPolicy, resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct NetPolicy {
    pub kind: NetKind,
    pub namespace: String,
    pub name: String,
    /// The workloads (uids) it selects.
    pub selected: Vec<String>,
    /// The policy puts the pods it selects in default deny for ingress
    /// (NetworkPolicy: `policyTypes` has `Ingress`; Cilium: it has ingress
    /// or ingressDeny rules, unless `enableDefaultDeny.ingress` is false).
    pub isolates_ingress: bool,
    pub isolates_egress: bool,
    /// Allow rules: what they match is allowed when the pod is isolated
    /// (by this policy or another).
    pub ingress: Vec<NetRule>,
    pub egress: Vec<NetRule>,
    /// Cilium's `ingressDeny` and `egressDeny`: a match denies, whatever
    /// any policy allows.
    pub ingress_deny: Vec<NetRule>,
    pub egress_deny: Vec<NetRule>,
    /// The named container ports of the pods a rule's named port can refer
    /// to, by pod address: a named port matches a connection when the
    /// destination pod defines that name for the destination port.
    pub named_ports: BTreeMap<IpAddr, BTreeMap<String, u16>>,
}

impl NetPolicy {
    /// Resource name: `<Kind>/<namespace>/<name>` (a NetworkPolicy and a
    /// CiliumNetworkPolicy may share a name).
    pub fn key(&self) -> String {
        format!("{}/{}/{}", self.kind.policy_kind().as_str(), self.namespace, self.name)
    }

    /// (isolates, allow rules, deny rules) of one direction.
    fn rules(&self, d: Direction) -> (bool, &[NetRule], &[NetRule]) {
        match d {
            Direction::Ingress => (self.isolates_ingress, &self.ingress, &self.ingress_deny),
            Direction::Egress => (self.isolates_egress, &self.egress, &self.egress_deny),
        }
    }
}

/// One rule: from (or to) these peers, on these ports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(default)]
pub struct NetRule {
    /// None: any peer. `Some(vec![])`: no peer (the rule matches nothing).
    pub peers: Option<Vec<NetPeer>>,
    /// None: any port.
    pub ports: Option<Vec<NetPort>>,
    /// Where the rule sits in the manifest (`spec.ingress[1]`), for the
    /// explanation.
    pub path: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetPeer {
    /// Pods' addresses (selectors resolved by the control plane), sorted.
    Addresses(Vec<IpAddr>),
    /// An address block, less its exceptions.
    Block { cidr: Cidr, except: Vec<Cidr> },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "UPPERCASE")]
pub enum L4Protocol {
    #[default]
    Tcp,
    Udp,
    Sctp,
    /// Cilium's `ANY`.
    Any,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PortSpec {
    /// Every port of the protocol (a port entry with only a protocol).
    All,
    /// `port` to `end` inclusive (`end == port` without `endPort`).
    Range { port: u16, end: u16 },
    /// A container port name of the destination pod.
    Named(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetPort {
    pub protocol: L4Protocol,
    pub port: PortSpec,
}

/// A connection as the network layer sees it.
#[derive(Debug, Clone, Copy)]
pub struct Flow {
    pub protocol: L4Protocol,
    /// The other end: the source for ingress, the destination for egress.
    pub peer_ip: IpAddr,
    pub destination_ip: IpAddr,
    pub destination_port: u16,
}

impl NetPeer {
    pub fn matches(&self, ip: IpAddr) -> bool {
        match self {
            NetPeer::Addresses(a) => a.binary_search(&ip).is_ok(),
            NetPeer::Block { cidr, except } => cidr.contains(ip) && !except.iter().any(|e| e.contains(ip)),
        }
    }
}

impl NetPort {
    fn matches(&self, f: &Flow, named: &BTreeMap<IpAddr, BTreeMap<String, u16>>) -> bool {
        if self.protocol != L4Protocol::Any && self.protocol != f.protocol {
            return false;
        }
        match &self.port {
            PortSpec::All => true,
            PortSpec::Range { port, end } => (*port..=*end).contains(&f.destination_port),
            PortSpec::Named(n) => named.get(&f.destination_ip).and_then(|m| m.get(n)) == Some(&f.destination_port),
        }
    }
}

impl NetRule {
    pub fn matches(&self, f: &Flow, named: &BTreeMap<IpAddr, BTreeMap<String, u16>>) -> bool {
        let peer = self.peers.as_ref().is_none_or(|ps| ps.iter().any(|p| p.matches(f.peer_ip)));
        peer && self.ports.as_ref().is_none_or(|ps| ps.iter().any(|p| p.matches(f, named)))
    }
}

/// Decides one direction of a flow for the workload the policies select.
/// `policies` are those that select it; when several rules could decide,
/// the answer names the first in the order given (`MeshState::
/// net_policies_for` gives them by key, `Kind/namespace/name`).
pub fn evaluate<'p>(policies: impl IntoIterator<Item = &'p NetPolicy>, direction: Direction, f: &Flow) -> LayerVerdict {
    let ps: Vec<&NetPolicy> = policies.into_iter().collect();
    let rule_ref = |p: &NetPolicy, r: &NetRule| PolicyRule::new(p.kind.policy_kind(), &p.namespace, &p.name, Some(r.path.clone()));
    for p in &ps {
        let (_, _, deny) = p.rules(direction);
        if let Some(r) = deny.iter().find(|r| r.matches(f, &p.named_ports)) {
            return LayerVerdict::decided(false, Reason::DenyRule, rule_ref(p, r));
        }
    }
    let isolates = |p: &&&NetPolicy| p.rules(direction).0;
    if !ps.iter().any(|p| isolates(&p)) {
        return LayerVerdict::no_policy();
    }
    for p in &ps {
        let (_, allow, _) = p.rules(direction);
        if let Some(r) = allow.iter().find(|r| r.matches(f, &p.named_ports)) {
            return LayerVerdict::decided(true, Reason::AllowRule, rule_ref(p, r));
        }
    }
    let total = ps.iter().filter(isolates).count();
    LayerVerdict::no_allow_matched(
        total,
        ps.iter().filter(isolates).map(|p| PolicyRule::new(p.kind.policy_kind(), &p.namespace, &p.name, None)),
    )
}
