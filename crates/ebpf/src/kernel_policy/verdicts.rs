//! The compiled verdicts: for each pair of identities a connection of this
//! node's pods may meet, what the engine decides on every port that
//! matters (see the parent module's doc).

use super::identities::{v4, Class, Classes, Group, Prefix};
use super::{Compiled, MAX_RANGE_PORTS};
use crate::abi::{PolicyKey, PolicyValue, IPPROTO_TCP, POLICY_F_ALL_PORTS, PROTO_OTHER};
use slipstream_core::engine;
use slipstream_core::engine::Connection;
use slipstream_core::policy::network::{Direction, L4Protocol, PortSpec};
use slipstream_core::policy::LayerVerdict;
use slipstream_core::{MeshState, MeshWorkload};
use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};

/// The ports `w`'s network policies single out in one direction (named
/// ports resolved against `named_at`, the destination's address); None
/// when a range is too wide to expand.
fn net_ports(state: &MeshState, w: &MeshWorkload, dir: Direction, named_at: IpAddr, ports: &mut BTreeSet<u16>) -> Option<()> {
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
                        if let Some(n) = p.named_ports.get(&named_at).and_then(|m| m.get(name)) {
                            ports.insert(*n);
                        }
                    }
                }
            }
        }
    }
    Some(())
}

/// The ports a meshed destination's authorization policies single out.
fn authz_ports(state: &MeshState, dst: &MeshWorkload, ports: &mut BTreeSet<u16>) {
    if dst.meshed() {
        for a in state.policies_for(dst) {
            for m in a.rules.iter().flat_map(|r| &r.clauses).flat_map(|c| &c.matches) {
                ports.extend(m.destination_ports.iter().chain(&m.not_destination_ports));
            }
        }
    }
}

/// The ports any policy governing `src -> dst` singles out; None when a
/// range is too wide to expand.
fn significant_ports(state: &MeshState, src: &MeshWorkload, dst: &MeshWorkload) -> Option<BTreeSet<u16>> {
    let mut ports = BTreeSet::new();
    net_ports(state, src, Direction::Egress, dst.address(), &mut ports)?;
    net_ports(state, dst, Direction::Ingress, dst.address(), &mut ports)?;
    authz_ports(state, dst, &mut ports);
    ports.remove(&0);
    Some(ports)
}

/// The trust domain of the mesh's workloads (the first one's; one mesh,
/// one trust domain).
fn state_trust_domain(state: &MeshState) -> String {
    state
        .workloads()
        .next()
        .map(|w| w.identity().trust_domain().to_string())
        .unwrap_or_else(|| slipstream_core::DEFAULT_TRUST_DOMAIN.to_string())
}

/// Whether any policy has a say between the two: if none does, every port
/// is allowed and nothing needs writing.
fn governed(state: &MeshState, src: &MeshWorkload, dst: &MeshWorkload) -> bool {
    !state.net_policies_for(&src.uid).is_empty()
        || !state.net_policies_for(&dst.uid).is_empty()
        || (dst.meshed() && !state.policies_for(dst).is_empty())
}

/// The explanations the entries' `rule` numbers refer to, each written
/// once, numbered from 1 in the order they were first needed.
#[derive(Default)]
struct Rules {
    list: Vec<String>,
    index: BTreeMap<String, u32>,
}

impl Rules {
    fn id_of(&mut self, denial: Option<&LayerVerdict>) -> u32 {
        let Some(d) = denial else { return 0 };
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

/// A pair of identities of one node's numbering, for one protocol.
#[derive(Clone, Copy)]
struct Pair {
    proto: u8,
    node: u16,
    src: u32,
    dst: u32,
    /// The source is a workload whose identity the decision used: only
    /// then may a deny of every port stand for HBONE, whose source
    /// identity the kernel cannot see (a world source may be a pod the
    /// destination's node does not know yet, with a certificate the proxy
    /// would accept).
    source_known: bool,
}

/// What the compile writes: the entries, the rules they name, and the
/// pairs left to user space.
pub(super) struct Sink {
    out: Compiled,
    rules: Rules,
}

impl Sink {
    /// Writes into `out` (its identities already there).
    pub(super) fn new(out: Compiled) -> Self {
        Sink { out, rules: Rules::default() }
    }

    /// What was compiled, with the rules the entries name.
    pub(super) fn finish(mut self) -> Compiled {
        self.out.rules = self.rules.list;
        self.out
    }

    /// Writes a pair's entries from `decide` (allowed, and the denying
    /// layer when denied): the port none of `ports` is stands for the
    /// others; a port's own entry only where it differs.
    fn emit(&mut self, pair: Pair, mut ports: BTreeSet<u16>, decide: impl Fn(u16) -> (bool, Option<LayerVerdict>)) {
        let Pair { proto, node, src, dst, source_known } = pair;
        ports.remove(&0);
        let other_port = (1..=u16::MAX).find(|p| !ports.contains(p)).unwrap_or(1);
        let (other_ok, other_denial) = decide(other_port);
        let mut any_allowed = other_ok;
        for p in ports {
            let (ok, denial) = decide(p);
            any_allowed |= ok;
            if ok == other_ok {
                continue;
            }
            let value = if ok { PolicyValue::allow() } else { PolicyValue::deny(self.rules.id_of(denial.as_ref()), 0) };
            self.out.entries.insert(PolicyKey::new(proto, node, src, dst, p), value);
        }
        if !other_ok {
            let flags = if any_allowed || proto != IPPROTO_TCP || !source_known { 0 } else { POLICY_F_ALL_PORTS };
            self.out
                .entries
                .insert(PolicyKey::new(proto, node, src, dst, 0), PolicyValue::deny(self.rules.id_of(other_denial.as_ref()), flags));
        }
    }

    /// Counts a pair left to user space and keeps the local members of its
    /// ends in the nftables table (see [`Compiled::left_to_nftables`]).
    fn leave(&mut self, node: &str, ends: &[&Group]) {
        self.out.skipped_pairs += 1;
        for g in ends {
            self.out.left_to_nftables.extend(g.members.iter().filter(|w| w.node == node).filter_map(|w| v4(w.address())));
        }
    }

    /// A deny at a service address's port, for a source class.
    fn deny(&mut self, key: PolicyKey, denial: Option<&LayerVerdict>) {
        let rule = self.rules.id_of(denial);
        self.out.entries.insert(key, PolicyValue::deny(rule, 0));
    }
}

/// What every stage of the compile reads: the snapshot, this node (its
/// name, and its index in the maps), its classes.
pub(super) struct Scope<'a> {
    pub(super) state: &'a MeshState,
    pub(super) node: &'a str,
    pub(super) node_index: u16,
    pub(super) classes: &'a Classes<'a>,
}

impl Scope<'_> {
    fn world_id(&self, p: Prefix) -> u32 {
        self.classes.numbers[&Class::World(p)]
    }

    fn service_id(&self, vip: Ipv4Addr) -> u32 {
        self.classes.numbers[&Class::Service(vip)]
    }

    /// The classes with a member on this node.
    fn local_groups(&self) -> impl Iterator<Item = &Group<'_>> {
        self.classes.groups.iter().filter(|g| g.local)
    }
}

/// Every verdict of the snapshot, in the order the rules are numbered:
/// TCP between classes, TCP with the world, what is not TCP, TCP to
/// service addresses.
pub(super) fn write(scope: &Scope, out: Compiled) -> Compiled {
    let mut sink = Sink::new(out);
    tcp_between_classes(scope, &mut sink);
    tcp_with_the_world(scope, &mut sink);
    for proto in [Datagrams::UDP, Datagrams::SCTP, Datagrams::OTHER] {
        proto.write(scope, &mut sink);
    }
    tcp_to_services(scope, &mut sink);
    sink.finish()
}

/// TCP between two classes, one of them with a member on this node.
fn tcp_between_classes(scope: &Scope, sink: &mut Sink) {
    let Scope { state, node, node_index, classes } = *scope;
    let groups = &classes.groups;
    // Waypoints' own identities (a pod running as a waypoint Gateway's
    // service account, in its namespace, is that waypoint, as the node
    // proxy resolves it): their tunnels carry the identity the kernel
    // cannot see (they are not captured, so the map would read them as
    // plaintext); the destination's node proxy decides them.
    let waypoint_ids: BTreeSet<String> = state
        .services()
        .filter_map(|s| s.waypoint.clone())
        .chain(state.workloads().filter_map(|w| w.waypoint.clone()))
        .map(|g| format!("spiffe://{}/ns/{}/sa/{}", state_trust_domain(state), g.namespace, g.hostname.split('.').next().unwrap_or("")))
        .collect();
    for s in groups {
        for d in groups {
            if !(s.local || d.local) {
                continue;
            }
            let src = s.members[0];
            if !src.meshed() && waypoint_ids.contains(&src.identity().to_string()) {
                continue;
            }
            // A workload and itself never meet in the map (a pod's own
            // address stays inside the pod); another member stands in.
            let Some(dst) = d.members.iter().find(|w| w.uid != src.uid) else { continue };
            if !governed(state, src, dst) {
                continue;
            }
            // A pod bound to a waypoint (for workload traffic) is reached
            // through it: a connect() to its address goes to the waypoint,
            // whose tunnel its node proxy decides. The pair is left to
            // user space rather than denied at the source.
            if dst.waypoint.is_some() && dst.meshed() {
                continue;
            }
            let Some(ports) = significant_ports(state, src, dst) else {
                sink.leave(node, &[s, d]);
                continue;
            };
            let pair = Pair { proto: IPPROTO_TCP, node: node_index, src: s.id, dst: d.id, source_known: true };
            sink.emit(pair, ports, |port| {
                let v = engine::connection(state, src, dst, L4Protocol::Tcp, port);
                (v.allowed, v.denial().cloned())
            });
        }
    }
}

/// TCP with the world, as destination of this node's pods (their egress,
/// at connect()) and as source towards them (their ingress, at tc).
fn tcp_with_the_world(scope: &Scope, sink: &mut Sink) {
    let Scope { state, node, node_index, classes } = *scope;
    for g in scope.local_groups() {
        let w = g.members[0];
        let egress = !state.net_policies_for(&w.uid).is_empty();
        let ingress = egress || (w.meshed() && !state.policies_for(w).is_empty());
        for (p, rep) in &classes.worlds {
            let world_id = scope.world_id(*p);
            let conn = |src_ip: Ipv4Addr, dst_ip: Ipv4Addr, port: u16| Connection {
                protocol: L4Protocol::Tcp,
                src_ip: IpAddr::V4(src_ip),
                peer: None,
                dst_ip: IpAddr::V4(dst_ip),
                dst_port: port,
            };
            let addr = v4(w.address()).expect("filtered");
            if egress {
                let mut ports = BTreeSet::new();
                if net_ports(state, w, Direction::Egress, IpAddr::V4(*rep), &mut ports).is_some() {
                    let pair = Pair { proto: IPPROTO_TCP, node: node_index, src: g.id, dst: world_id, source_known: true };
                    sink.emit(pair, ports, |port| {
                        let v = engine::network(state, w, Direction::Egress, &conn(addr, *rep, port));
                        (v.allowed, (!v.allowed).then_some(v))
                    });
                } else {
                    sink.leave(node, &[g]);
                }
            }
            if ingress {
                let mut ports = BTreeSet::new();
                if net_ports(state, w, Direction::Ingress, w.address(), &mut ports).is_some() {
                    authz_ports(state, w, &mut ports);
                    let pair = Pair { proto: IPPROTO_TCP, node: node_index, src: world_id, dst: g.id, source_known: false };
                    sink.emit(pair, ports, |port| {
                        let v = engine::ingress(state, w, &conn(*rep, addr, port));
                        (v.allowed(), v.denial().cloned())
                    });
                } else {
                    sink.leave(node, &[g]);
                }
            }
        }
    }
}

/// A service address: refused at connect() when every ready endpoint of
/// that port would refuse (the proxy, whichever it picks, would too). No
/// endpoint: the proxy's answer, not the kernel's. Sources of this node
/// only: the check is the connect hook's.
fn tcp_to_services(scope: &Scope, sink: &mut Sink) {
    let Scope { state, node_index, .. } = *scope;
    for s in scope.local_groups() {
        let src = s.members[0];
        // A service bound to a waypoint is reached through it, never its
        // endpoints directly: the waypoint decides (and the endpoints'
        // node proxies, on the waypoint's tunnels).
        for svc in state.services().filter(|s| s.waypoint.is_none()) {
            for vip in svc.addresses.iter().filter_map(|a| v4(a.address)) {
                let vip_id = scope.service_id(vip);
                for port in &svc.ports {
                    let eps = state.endpoints(svc, port.service_port);
                    let verdicts: Vec<engine::Verdict> =
                        eps.iter().map(|e| engine::connection(state, src, &e.workload, L4Protocol::Tcp, e.target_port)).collect();
                    if verdicts.is_empty() || verdicts.iter().any(|v| v.allowed) {
                        continue;
                    }
                    sink.deny(PolicyKey::tcp(node_index, s.id, vip_id, port.service_port), verdicts[0].denial());
                }
            }
        }
    }
}

/// UDP, SCTP and the rest (ICMP...), which the mesh does not capture: the
/// network policies alone (NetworkPolicy and CiliumNetworkPolicy cover
/// them, Istio's authorization does not). A pair with a source of this
/// node holds both ends' verdict (decided at the source's
/// sendmsg()/connect() and tc egress, and again at a local destination's
/// tc ingress); a pair with a source elsewhere, or in the world, holds the
/// local destination's ingress verdict (its tc ingress). What is neither
/// UDP nor SCTP is decided at port 0 by the rules that name no port
/// (`PROTO_OTHER`).
#[derive(Clone, Copy)]
struct Datagrams {
    proto: u8,
    l4: L4Protocol,
}

impl Datagrams {
    const UDP: Datagrams = Datagrams { proto: crate::abi::IPPROTO_UDP, l4: L4Protocol::Udp };
    const SCTP: Datagrams = Datagrams { proto: crate::abi::IPPROTO_SCTP, l4: L4Protocol::Sctp };
    const OTHER: Datagrams = Datagrams { proto: PROTO_OTHER, l4: L4Protocol::Any };

    /// This protocol's verdicts: between classes, with the world, and
    /// (UDP and SCTP) at service addresses.
    fn write(self, scope: &Scope, sink: &mut Sink) {
        self.between_classes(scope, sink);
        self.with_the_world(scope, sink);
        if self.proto != PROTO_OTHER {
            self.to_services(scope, sink);
        }
    }

    /// A flow of this protocol as the engine reads it (no port for
    /// `PROTO_OTHER`).
    fn conn(self, src_ip: IpAddr, dst_ip: IpAddr, port: u16) -> Connection<'static> {
        Connection { protocol: self.l4, src_ip, peer: None, dst_ip, dst_port: if self.proto == PROTO_OTHER { 0 } else { port } }
    }

    /// The ports a pair's policies single out; none for `PROTO_OTHER`;
    /// None when a range is too wide to expand.
    fn ports_of(
        self,
        state: &MeshState,
        src: Option<(&MeshWorkload, IpAddr)>,
        dst: Option<&MeshWorkload>,
        dst_ip: IpAddr,
    ) -> Option<BTreeSet<u16>> {
        let mut ports = BTreeSet::new();
        if self.proto == PROTO_OTHER {
            return Some(ports);
        }
        if let Some((src, _)) = src {
            net_ports(state, src, Direction::Egress, dst_ip, &mut ports)?;
        }
        if let Some(dst) = dst {
            net_ports(state, dst, Direction::Ingress, dst_ip, &mut ports)?;
        }
        Some(ports)
    }

    fn between_classes(self, scope: &Scope, sink: &mut Sink) {
        let Scope { state, node, node_index, classes } = *scope;
        let proto = self.proto;
        for d in &classes.groups {
            for s in &classes.groups {
                let src = s.members[0];
                let Some(dst) = d.members.iter().find(|w| w.uid != src.uid) else { continue };
                let (src_np, dst_np) = (!state.net_policies_for(&src.uid).is_empty(), !state.net_policies_for(&dst.uid).is_empty());
                let needed = if s.local { src_np || dst_np } else { d.local && dst_np };
                if !needed {
                    continue;
                }
                let Some(ports) = self.ports_of(state, s.local.then_some((src, src.address())), Some(dst), dst.address()) else {
                    sink.leave(node, &[s, d]);
                    continue;
                };
                let pair = Pair { proto, node: node_index, src: s.id, dst: d.id, source_known: true };
                sink.emit(pair, ports, |port| {
                    let c = self.conn(src.address(), dst.address(), port);
                    if s.local {
                        let e = engine::network(state, src, Direction::Egress, &c);
                        if !e.allowed {
                            return (false, Some(e));
                        }
                    }
                    let i = engine::network(state, dst, Direction::Ingress, &c);
                    (i.allowed, (!i.allowed).then_some(i))
                });
            }
        }
    }

    fn with_the_world(self, scope: &Scope, sink: &mut Sink) {
        let Scope { state, node, node_index, classes } = *scope;
        let proto = self.proto;
        for g in scope.local_groups() {
            let w = g.members[0];
            if state.net_policies_for(&w.uid).is_empty() {
                continue;
            }
            for (p, rep) in &classes.worlds {
                let world_id = scope.world_id(*p);
                let world = IpAddr::V4(*rep);
                // Egress, to the world.
                if let Some(ports) = self.ports_of(state, Some((w, w.address())), None, world) {
                    let pair = Pair { proto, node: node_index, src: g.id, dst: world_id, source_known: true };
                    sink.emit(pair, ports, |port| {
                        let e = engine::network(state, w, Direction::Egress, &self.conn(w.address(), world, port));
                        (e.allowed, (!e.allowed).then_some(e))
                    });
                } else {
                    sink.leave(node, &[g]);
                }
                // Ingress, from the world.
                if let Some(ports) = self.ports_of(state, None, Some(w), w.address()) {
                    let pair = Pair { proto, node: node_index, src: world_id, dst: g.id, source_known: false };
                    sink.emit(pair, ports, |port| {
                        let i = engine::network(state, w, Direction::Ingress, &self.conn(world, w.address(), port));
                        (i.allowed, (!i.allowed).then_some(i))
                    });
                } else {
                    sink.leave(node, &[g]);
                }
            }
        }
    }

    /// A service address (UDP and SCTP): the node's service table chooses
    /// the endpoint after the datagram left the pod, so the sender's
    /// egress is decided here when it is the same for every ready endpoint
    /// (all refused: a deny at the service address); when endpoints
    /// differ, the sender stays in the nftables table, which sees the
    /// endpoint. The endpoint's ingress holds at its own tc ingress either
    /// way.
    fn to_services(self, scope: &Scope, sink: &mut Sink) {
        let Scope { state, node, node_index, .. } = *scope;
        for s in scope.local_groups() {
            let src = s.members[0];
            if state.net_policies_for(&src.uid).is_empty() {
                continue;
            }
            for svc in state.services() {
                for vip in svc.addresses.iter().filter_map(|a| v4(a.address)) {
                    let vip_id = scope.service_id(vip);
                    for port in &svc.ports {
                        let eps = state.endpoints(svc, port.service_port);
                        let verdicts: Vec<LayerVerdict> = eps
                            .iter()
                            .map(|e| {
                                engine::network(
                                    state,
                                    src,
                                    Direction::Egress,
                                    &self.conn(src.address(), e.workload.address(), e.target_port),
                                )
                            })
                            .collect();
                        let denied = verdicts.iter().filter(|v| !v.allowed).count();
                        if denied == 0 {
                            continue;
                        }
                        if denied < verdicts.len() {
                            sink.leave(node, &[s]);
                            continue;
                        }
                        sink.deny(PolicyKey::new(self.proto, node_index, s.id, vip_id, port.service_port), Some(&verdicts[0]));
                    }
                }
            }
        }
    }
}
