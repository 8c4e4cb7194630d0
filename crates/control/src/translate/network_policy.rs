//! Kubernetes NetworkPolicy and CiliumNetworkPolicy to what the index keeps
//! of them ([`NetPolicyInput`]: selectors still as labels), and, given the
//! pods and namespaces, to the resolved resource node proxies get
//! ([`NetPolicy`]: selected workloads and peer addresses). The semantics,
//! with their sources, are in docs/authorization.md.
//!
//! Refused at apply, naming the field: Cilium's L7 rules (`toPorts.rules`),
//! TLS interception, FQDN, service, group, node and ICMP peers,
//! `fromRequires`, `specs`, entities other than `all`, `world` and
//! `cluster`; Kubernetes peers that set `ipBlock` with a selector, or
//! nothing.

use super::Labels;
use crate::objects::{ObjectError, ObjectRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use slipstream_core::policy::network::{L4Protocol, NetKind, NetPeer, NetPolicy, NetPort, NetRule, PortSpec};
use slipstream_core::policy::Cidr;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

mod cilium;
mod kubernetes;

pub use cilium::cilium_network_policy;
pub use kubernetes::network_policy;

/// A label selector (`matchLabels` and `matchExpressions`, ANDed).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Selector {
    pub labels: Labels,
    pub exprs: Vec<Expr>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expr {
    pub key: String,
    pub op: Op,
    pub values: BTreeSet<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl Selector {
    /// Matches the labels `get` reads.
    pub fn matches<'a>(&self, get: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.labels.iter().all(|(k, v)| get(k) == Some(v.as_str()))
            && self.exprs.iter().all(|e| match (e.op, get(&e.key)) {
                (Op::In, Some(v)) => e.values.contains(v),
                (Op::In, None) => false,
                (Op::NotIn, v) => v.is_none_or(|v| !e.values.contains(v)),
                (Op::Exists, v) => v.is_some(),
                (Op::DoesNotExist, v) => v.is_none(),
            })
    }

    fn keys(&self) -> impl Iterator<Item = &str> {
        self.labels.keys().map(String::as_str).chain(self.exprs.iter().map(|e| e.key.as_str()))
    }
}

/// Whom a peer entry selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerInput {
    /// Kubernetes: pods matching `pods` in the namespaces `namespaces`
    /// selects by their labels (None: the policy's own namespace).
    Pods {
        namespaces: Option<Selector>,
        pods: Selector,
    },
    /// Cilium: endpoints whose labels, extended with the `io.kubernetes.pod.
    /// namespace`, `io.cilium.k8s.namespace.labels.*` and `io.cilium.k8s.
    /// policy.serviceaccount` labels, match; in the policy's namespace only
    /// unless the selector names the namespace label.
    Endpoints {
        selector: Selector,
        any_namespace: bool,
    },
    Block {
        cidr: Cidr,
        except: Vec<Cidr>,
    },
    /// Every pod of the cluster (Cilium's `cluster` entity).
    AllPods,
    /// Every address that is not a pod's (Cilium's `world`).
    World,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleInput {
    pub path: String,
    /// None: every peer.
    pub peers: Option<Vec<PeerInput>>,
    /// None: every port.
    pub ports: Option<Vec<NetPort>>,
}

/// What the index keeps of one network policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetPolicyInput {
    pub kind: NetKind,
    pub namespace: String,
    pub name: String,
    /// The pods of its namespace it applies to (Cilium: matched against
    /// the extended labels, see [`PeerInput::Endpoints`]).
    pub subject: Selector,
    pub isolates_ingress: bool,
    pub isolates_egress: bool,
    pub ingress: Vec<RuleInput>,
    pub egress: Vec<RuleInput>,
    pub ingress_deny: Vec<RuleInput>,
    pub egress_deny: Vec<RuleInput>,
}

// ---- selectors ----

fn selector(s: &LabelSelector, field: &str, r: &ObjectRef, cilium: bool) -> Result<Selector, ObjectError> {
    let key = |k: &str| if cilium { cilium_key(k) } else { k.to_string() };
    let mut out = Selector { labels: s.match_labels.iter().flatten().map(|(k, v)| (key(k), v.clone())).collect(), exprs: Vec::new() };
    for (i, e) in s.match_expressions.iter().flatten().enumerate() {
        let f = format!("{field}.matchExpressions[{i}]");
        let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
        let op = match e.operator.as_str() {
            "In" => Op::In,
            "NotIn" => Op::NotIn,
            "Exists" => Op::Exists,
            "DoesNotExist" => Op::DoesNotExist,
            other => {
                return Err(ObjectError::new(r, format!("{f}.operator"), format!("{other:?} is not In, NotIn, Exists or DoesNotExist")))
            }
        };
        match op {
            Op::In | Op::NotIn if values.is_empty() => return Err(ObjectError::new(r, format!("{f}.values"), "required for In and NotIn")),
            Op::Exists | Op::DoesNotExist if !values.is_empty() => {
                return Err(ObjectError::new(r, format!("{f}.values"), "must be empty for Exists and DoesNotExist"))
            }
            _ => {}
        }
        out.exprs.push(Expr { key: key(&e.key), op, values });
    }
    if cilium {
        if let Some(k) = out.keys().find(|k| k.starts_with("reserved:")) {
            return Err(ObjectError::new(
                r,
                field,
                format!("label {k:?}: reserved labels are not supported (use fromEntities/toEntities)"),
            ));
        }
    }
    Ok(out)
}

/// Cilium's label sources: `k8s:app` and `any:app` are the pod label `app`.
fn cilium_key(k: &str) -> String {
    k.strip_prefix("k8s:").or_else(|| k.strip_prefix("any:")).unwrap_or(k).to_string()
}

pub const CILIUM_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
pub const CILIUM_NAMESPACE_LABELS_PREFIX: &str = "io.cilium.k8s.namespace.labels.";
pub const CILIUM_SERVICE_ACCOUNT_LABEL: &str = "io.cilium.k8s.policy.serviceaccount";

/// A pod as Cilium's selectors see it.
pub struct EndpointView<'a> {
    pub namespace: &'a str,
    pub namespace_labels: &'a Labels,
    pub service_account: &'a str,
    pub labels: &'a Labels,
}

impl<'a> EndpointView<'a> {
    pub fn get(&self, key: &str) -> Option<&'a str> {
        if key == CILIUM_NAMESPACE_LABEL {
            return Some(self.namespace);
        }
        if key == CILIUM_SERVICE_ACCOUNT_LABEL {
            return Some(self.service_account);
        }
        if let Some(k) = key.strip_prefix(CILIUM_NAMESPACE_LABELS_PREFIX) {
            return self.namespace_labels.get(k).map(String::as_str);
        }
        self.labels.get(key).map(String::as_str)
    }
}

// ---- ports and blocks ----

fn protocol(p: Option<&str>, field: &str, r: &ObjectRef, cilium: bool) -> Result<L4Protocol, ObjectError> {
    Ok(match p.unwrap_or(if cilium { "ANY" } else { "TCP" }) {
        "TCP" => L4Protocol::Tcp,
        "UDP" => L4Protocol::Udp,
        "SCTP" => L4Protocol::Sctp,
        "ANY" if cilium => L4Protocol::Any,
        other => {
            return Err(ObjectError::new(
                r,
                field,
                format!("{other:?} is not a protocol (TCP, UDP, SCTP{})", if cilium { ", ANY" } else { "" }),
            ))
        }
    })
}

fn port_spec(port: Option<&str>, end_port: Option<i32>, field: &str, r: &ObjectRef) -> Result<PortSpec, ObjectError> {
    let Some(p) = port.filter(|p| !p.is_empty()) else {
        if end_port.is_some() {
            return Err(ObjectError::new(r, format!("{field}.endPort"), "needs a numeric port"));
        }
        return Ok(PortSpec::All);
    };
    if let Ok(n) = p.parse::<i64>() {
        // Cilium's port "0" means every port.
        if n == 0 && end_port.is_none() {
            return Ok(PortSpec::All);
        }
        let port = u16::try_from(n)
            .ok()
            .filter(|n| *n > 0)
            .ok_or_else(|| ObjectError::new(r, format!("{field}.port"), format!("{n} is not a port (1-65535)")))?;
        let end = match end_port {
            None => port,
            Some(e) => u16::try_from(e)
                .ok()
                .filter(|e| *e >= port)
                .ok_or_else(|| ObjectError::new(r, format!("{field}.endPort"), format!("{e} must be a port at least {port}")))?,
        };
        return Ok(PortSpec::Range { port, end });
    }
    if end_port.is_some() {
        return Err(ObjectError::new(r, format!("{field}.endPort"), "cannot be used with a named port"));
    }
    Ok(PortSpec::Named(p.to_string()))
}

fn parse_cidr(s: &str, field: &str, r: &ObjectRef) -> Result<Cidr, ObjectError> {
    let bad = || ObjectError::new(r, field, format!("{s:?} is not an address block (address/length)"));
    let (a, l) = s.split_once('/').ok_or_else(bad)?;
    let address: IpAddr = a.parse().map_err(|_| bad())?;
    let length: u8 = l.parse().map_err(|_| bad())?;
    if length > if address.is_ipv4() { 32 } else { 128 } {
        return Err(bad());
    }
    Ok(Cidr { address, length })
}

fn block(cidr: &str, except: &[String], field: &str, r: &ObjectRef) -> Result<PeerInput, ObjectError> {
    let c = parse_cidr(cidr, &format!("{field}.cidr"), r)?;
    let mut ex = Vec::new();
    for (i, e) in except.iter().enumerate() {
        let f = format!("{field}.except[{i}]");
        let e = parse_cidr(e, &f, r)?;
        if e.address.is_ipv4() != c.address.is_ipv4() || e.length < c.length || !c.contains(e.address) {
            return Err(ObjectError::new(r, f, format!("must lie inside {cidr}")));
        }
        ex.push(e);
    }
    Ok(PeerInput::Block { cidr: c, except: ex })
}

// ---- resolution ----

/// A pod as resolution needs it.
pub struct PodView<'a> {
    pub uid: String,
    pub namespace: &'a str,
    pub namespace_labels: &'a Labels,
    pub service_account: &'a str,
    pub labels: &'a Labels,
    pub ips: &'a [IpAddr],
    /// Named TCP/UDP/SCTP container ports.
    pub named_ports: Vec<(&'a str, u16)>,
}

impl PodView<'_> {
    fn endpoint(&self) -> EndpointView<'_> {
        EndpointView {
            namespace: self.namespace,
            namespace_labels: self.namespace_labels,
            service_account: self.service_account,
            labels: self.labels,
        }
    }
}

impl NetPolicyInput {
    fn selects(&self, p: &PodView) -> bool {
        if p.namespace != self.namespace {
            return false;
        }
        match self.kind {
            NetKind::NetworkPolicy => self.subject.matches(|k| p.labels.get(k).map(String::as_str)),
            NetKind::CiliumNetworkPolicy => self.subject.matches(|k| p.endpoint().get(k)),
        }
    }

    fn peer_matches(&self, peer: &PeerInput, p: &PodView) -> bool {
        match peer {
            PeerInput::Pods { namespaces, pods } => {
                let ns_ok = match namespaces {
                    None => p.namespace == self.namespace,
                    Some(s) => s.matches(|k| p.namespace_labels.get(k).map(String::as_str)),
                };
                ns_ok && pods.matches(|k| p.labels.get(k).map(String::as_str))
            }
            PeerInput::Endpoints { selector, any_namespace } => {
                (*any_namespace || p.namespace == self.namespace) && selector.matches(|k| p.endpoint().get(k))
            }
            PeerInput::AllPods => true,
            PeerInput::Block { .. } | PeerInput::World => false,
        }
    }

    /// The resource, given every pod of the cluster (with an address, not
    /// on the host network).
    pub fn resolve(&self, pods: &[PodView]) -> NetPolicy {
        let selected: Vec<String> = pods.iter().filter(|p| self.selects(p)).map(|p| p.uid.clone()).collect();
        let all_pod_ips: Vec<IpAddr> = {
            let mut v: Vec<IpAddr> = pods.iter().flat_map(|p| p.ips.iter().copied()).collect();
            v.sort();
            v.dedup();
            v
        };
        let mut names = BTreeSet::new();
        let resolve_rules = |rules: &[RuleInput], names: &mut BTreeSet<String>| -> Vec<NetRule> {
            rules
                .iter()
                .map(|ri| {
                    for p in ri.ports.iter().flatten() {
                        if let PortSpec::Named(n) = &p.port {
                            names.insert(n.clone());
                        }
                    }
                    NetRule {
                        path: ri.path.clone(),
                        ports: ri.ports.clone(),
                        peers: ri.peers.as_ref().map(|ps| self.resolve_peers(ps, pods, &all_pod_ips)),
                    }
                })
                .collect()
        };
        let ingress = resolve_rules(&self.ingress, &mut names);
        let egress = resolve_rules(&self.egress, &mut names);
        let ingress_deny = resolve_rules(&self.ingress_deny, &mut names);
        let egress_deny = resolve_rules(&self.egress_deny, &mut names);
        let mut named_ports: BTreeMap<IpAddr, BTreeMap<String, u16>> = BTreeMap::new();
        if !names.is_empty() {
            for p in pods {
                for (n, port) in &p.named_ports {
                    if names.contains(*n) {
                        for ip in p.ips {
                            named_ports.entry(*ip).or_default().insert(n.to_string(), *port);
                        }
                    }
                }
            }
        }
        NetPolicy {
            kind: self.kind,
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            selected,
            isolates_ingress: self.isolates_ingress,
            isolates_egress: self.isolates_egress,
            ingress,
            egress,
            ingress_deny,
            egress_deny,
            named_ports,
        }
    }

    fn resolve_peers(&self, peers: &[PeerInput], pods: &[PodView], all_pod_ips: &[IpAddr]) -> Vec<NetPeer> {
        let mut out = Vec::new();
        let mut addrs = BTreeSet::new();
        for peer in peers {
            match peer {
                PeerInput::Block { cidr, except } => out.push(NetPeer::Block { cidr: *cidr, except: except.clone() }),
                PeerInput::World => {
                    for any in [IpAddr::from([0u8; 4]), IpAddr::from([0u8; 16])] {
                        let except = all_pod_ips
                            .iter()
                            .filter(|ip| ip.is_ipv4() == any.is_ipv4())
                            .map(|ip| Cidr { address: *ip, length: if ip.is_ipv4() { 32 } else { 128 } })
                            .collect();
                        out.push(NetPeer::Block { cidr: Cidr { address: any, length: 0 }, except });
                    }
                }
                _ => {
                    for p in pods.iter().filter(|p| self.peer_matches(peer, p)) {
                        addrs.extend(p.ips.iter().copied());
                    }
                }
            }
        }
        if !addrs.is_empty() {
            out.insert(0, NetPeer::Addresses(addrs.into_iter().collect()));
        }
        out
    }
}

#[cfg(test)]
mod tests;
