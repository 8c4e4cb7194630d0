//! What the kernel may decide, compiled from the same engine and the same
//! snapshot as the node proxy.
//!
//! **Identities.** Workloads are grouped by what policy can tell apart
//! about them ([`Signature`]): their SPIFFE identity (trust domain,
//! namespace, service account), whether they are meshed, the network
//! policies and authorization policies that select them (their labels, as
//! the control plane resolved the selectors), the peer lists and address
//! blocks their address falls in, and their named ports. The engine reads
//! nothing else of a workload, so two workloads of one class get the same
//! verdict on every port, as source and as destination. Each class gets a
//! numeric identity in this node's numbering ([`Identities`]: stable while
//! the class lives, never reused, kept across a restart of the node proxy
//! through what the map holds); each service address gets one of its own.
//! The kernel maps an address to its identity (`ss_ipcache_v1`), and
//! decisions are between identities (`ss_policy_v2`): one entry per pair
//! of classes instead of per pair of pods.
//!
//! **Decisions.** For each pair of classes with a member on this node at
//! either end (the source's connect() and the destination's tc ingress
//! both look here), the verdict of [`engine::connection`] on every port a
//! governing policy singles out, and on one port none does (standing for
//! all the others; flagged [`POLICY_F_ALL_PORTS`] when no port of the pair
//! is allowed). A service address gets an entry for a declared port when
//! every ready endpoint of that port is denied to the source class.
//!
//! Only what the engine decides is written, so the kernel never denies
//! what the proxy would allow: no entry means "no say" and the connection
//! goes on to the proxy (or, outside the mesh, to the destination). Pairs
//! whose policies name port ranges wider than [`MAX_RANGE_PORTS`] are left
//! to the proxy and the nftables path (an honest gap, counted in
//! [`Compiled::skipped_pairs`]). Pure: snapshot in, entries out.

use crate::abi::{IpcacheKey, PolicyKey, PolicyValue, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, POLICY_F_ALL_PORTS, PROTO_OTHER};
use slipstream_core::engine;
use slipstream_core::engine::Connection;
use slipstream_core::policy::network::{Direction, L4Protocol, NetPeer, PortSpec};
use slipstream_core::{MeshState, MeshWorkload};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// Port ranges (`endPort`) up to this many ports are expanded port by port.
pub const MAX_RANGE_PORTS: u32 = 1024;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// Every known IPv4 workload and service address, to its identity.
    pub ipcache: BTreeMap<IpcacheKey, u32>,
    pub entries: BTreeMap<PolicyKey, PolicyValue>,
    /// What each entry's `rule` refers to (index + 1): the explanation of
    /// the deciding layer, as `policy check` words it.
    pub rules: Vec<String>,
    /// Pairs of classes left to user space.
    pub skipped_pairs: usize,
    /// This node's pods with a pair (or a service) the map cannot decide
    /// exactly (a port range too wide to expand; a UDP or SCTP service
    /// some endpoints of which their egress allows and some not): the node
    /// proxy keeps them in the nftables table, which decides the rest.
    pub left_to_nftables: BTreeSet<Ipv4Addr>,
    /// How many workload classes (identities) the snapshot has.
    pub classes: usize,
    /// The ipcache keys of this node's own pods.
    pub local: BTreeSet<IpcacheKey>,
    /// Addresses outside the cluster: prefix (longest match wins) to
    /// identity, in this node's numbering (`ss_world_v1`).
    pub world: BTreeMap<(u16, Prefix), u32>,
}

/// What policy can tell apart about a workload; equal signatures, equal
/// verdicts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Signature {
    identity: String,
    meshed: bool,
    net_policies: Vec<String>,
    authorizations: Vec<String>,
    /// The address predicates (peer lists, blocks, policies' CIDRs) that
    /// hold for the workload's address, by stable name.
    addresses: Vec<Arc<str>>,
    /// Named ports of the address, per network policy that resolves them.
    named_ports: Vec<(String, Vec<(String, u16)>)>,
    /// Bound to a waypoint for its own address (workload traffic): no
    /// pair ends at it in the map.
    waypoint: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Class {
    Workload(Signature),
    /// A service address: which sources it refuses depends on its
    /// endpoints, so it is a class of its own.
    Service(Ipv4Addr),
    /// The addresses outside the cluster whose longest match among the
    /// address blocks policies name is this prefix: policy cannot tell
    /// them apart.
    World(Prefix),
}

/// An IPv4 prefix, the address in host order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Prefix {
    pub net: u32,
    pub len: u8,
}

impl Prefix {
    /// The prefix of length `len` that holds `a`.
    pub fn of(a: Ipv4Addr, len: u8) -> Prefix {
        let len = len.min(32);
        let mask = if len == 0 { 0 } else { u32::MAX << (32 - len) };
        Prefix { net: u32::from(a) & mask, len }
    }

    fn contains(&self, ip: u32) -> bool {
        self.len == 0 || (ip ^ self.net) >> (32 - u32::from(self.len)) == 0
    }

    fn covers(&self, o: &Prefix) -> bool {
        o.len >= self.len && self.contains(o.net)
    }

    fn halves(&self) -> [Prefix; 2] {
        let len = self.len + 1;
        [Prefix { net: self.net, len }, Prefix { net: self.net | (1 << (32 - u32::from(len))), len }]
    }

    pub fn address(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.net)
    }
}

/// Every IPv4 prefix some policy's address test names (blocks, their
/// exceptions, policy CIDRs, peer addresses), and the whole space.
fn world_prefixes(state: &MeshState) -> BTreeSet<Prefix> {
    let mut out = BTreeSet::from([Prefix { net: 0, len: 0 }]);
    let mut cidr = |c: &slipstream_core::policy::Cidr| {
        if let IpAddr::V4(a) = c.address {
            out.insert(Prefix::of(a, c.length));
        }
    };
    for p in state.net_policies() {
        for rule in p.ingress.iter().chain(&p.egress).chain(&p.ingress_deny).chain(&p.egress_deny) {
            for peer in rule.peers.iter().flatten() {
                match peer {
                    NetPeer::Block { cidr: c, except } => {
                        cidr(c);
                        except.iter().for_each(&mut cidr);
                    }
                    NetPeer::Addresses(list) => {
                        for a in list {
                            cidr(&slipstream_core::policy::Cidr { address: *a, length: 32 });
                        }
                    }
                }
            }
        }
    }
    for a in state.policies() {
        for m in a.rules.iter().flat_map(|r| &r.clauses).flat_map(|c| &c.matches) {
            for c in m.source_ips.iter().chain(&m.not_source_ips).chain(&m.destination_ips).chain(&m.not_destination_ips) {
                cidr(c);
            }
        }
    }
    out
}

/// An address of `p` that is in none of `inner` (the longer prefixes and
/// the cluster's own addresses, as /32): one whose longest match is `p`.
/// None when `inner` covers `p` whole.
fn uncovered(p: Prefix, inner: &[Prefix]) -> Option<u32> {
    if inner.iter().any(|q| q.covers(&p)) {
        return None;
    }
    let inside: Vec<Prefix> = inner.iter().filter(|q| p.covers(q)).copied().collect();
    if inside.is_empty() {
        return Some(p.net);
    }
    if p.len >= 32 {
        return None;
    }
    p.halves().into_iter().find_map(|h| uncovered(h, &inside))
}

/// The numbering of one node: class to identity, kept from one compile to
/// the next. Identities are never reused (a class that goes away takes its
/// number with it), so a number in the kernel's maps never changes meaning.
#[derive(Debug, Default)]
pub struct Identities {
    ids: HashMap<Class, u32>,
    next: u32,
    /// What a previous run left in the ipcache (address to identity) and
    /// the world map (prefix to identity): taken by the first compile, so
    /// a restart renumbers nothing.
    prior: Option<HashMap<Ipv4Addr, u32>>,
    prior_world: HashMap<Prefix, u32>,
}

impl Identities {
    pub fn new() -> Self {
        Identities { ids: HashMap::new(), next: 1, prior: None, prior_world: HashMap::new() }
    }

    /// Starts from what a previous run of the node proxy wrote: its
    /// addresses and world prefixes with their numbers, and the highest
    /// number any of its decisions still names (new numbers go above it,
    /// so none meets a stale decision).
    pub fn adopt(
        addresses: impl IntoIterator<Item = (Ipv4Addr, u32)>,
        world: impl IntoIterator<Item = (Prefix, u32)>,
        highest_in_use: u32,
    ) -> Self {
        let prior: HashMap<Ipv4Addr, u32> = addresses.into_iter().filter(|(_, id)| *id != 0).collect();
        let prior_world: HashMap<Prefix, u32> = world.into_iter().filter(|(_, id)| *id != 0).collect();
        let next = prior.values().chain(prior_world.values()).copied().chain([highest_in_use]).max().unwrap_or(0).saturating_add(1);
        Identities { ids: HashMap::new(), next, prior: Some(prior), prior_world }
    }

    /// Numbers this snapshot's classes (with their members' addresses);
    /// forgets the classes it no longer has.
    fn number(&mut self, classes: &BTreeMap<Class, Vec<Ipv4Addr>>) -> HashMap<Class, u32> {
        let prior = self.prior.take().unwrap_or_default();
        let prior_world = std::mem::take(&mut self.prior_world);
        // An old number is adopted only by a class holding every address
        // it was given to, or it would keep its decisions for members
        // that left the class.
        let holders: HashMap<u32, usize> = prior.values().fold(HashMap::new(), |mut m, id| {
            *m.entry(*id).or_default() += 1;
            m
        });
        let mut taken: BTreeSet<u32> = BTreeSet::new();
        let mut out = HashMap::with_capacity(classes.len());
        // Known classes keep their number first, then adopted numbers.
        for c in classes.keys() {
            if let Some(id) = self.ids.get(c) {
                taken.insert(*id);
                out.insert(c.clone(), *id);
            }
        }
        for (c, addrs) in classes {
            if out.contains_key(c) {
                continue;
            }
            let mut olds = addrs.iter().map(|a| prior.get(a).copied());
            let first = match c {
                Class::World(p) => prior_world.get(p).copied(),
                _ => olds.next().flatten(),
            };
            let whole = |id: &u32| match c {
                // Every address that held the number is a member now.
                Class::Workload(_) | Class::Service(_) => holders.get(id).copied().unwrap_or(0) == addrs.len(),
                Class::World(_) => true,
            };
            if let Some(id) = first.filter(|id| olds.all(|o| o == Some(*id)) && !taken.contains(id) && whole(id)) {
                taken.insert(id);
                out.insert(c.clone(), id);
            }
        }
        for c in classes.keys() {
            if !out.contains_key(c) {
                let id = self.next;
                self.next = self.next.checked_add(1).expect("2^32 identities");
                out.insert(c.clone(), id);
            }
        }
        self.ids = out.clone();
        out
    }
}

fn v4(ip: IpAddr) -> Option<Ipv4Addr> {
    match ip {
        IpAddr::V4(a) => Some(a),
        IpAddr::V6(_) => None,
    }
}

/// Every address test some policy makes, named stably (policy, rule, item)
/// so that a class keeps its signature while unrelated policies change.
struct Predicates {
    tests: Vec<(Arc<str>, AddressTest)>,
}

type AddressTest = Box<dyn Fn(IpAddr) -> bool>;

impl Predicates {
    fn of(state: &MeshState) -> Self {
        let mut tests: Vec<(Arc<str>, AddressTest)> = Vec::new();
        for p in state.net_policies() {
            let key = p.key();
            for (dir, rules) in [("in", &p.ingress), ("out", &p.egress), ("in-deny", &p.ingress_deny), ("out-deny", &p.egress_deny)] {
                for (ri, rule) in rules.iter().enumerate() {
                    for (pi, peer) in rule.peers.iter().flatten().enumerate() {
                        let peer = peer.clone();
                        tests.push((format!("{key}/{dir}/{ri}/{pi}").into(), Box::new(move |ip| peer.matches(ip))));
                    }
                }
            }
        }
        for a in state.policies() {
            for (ri, r) in a.rules.iter().enumerate() {
                for (ci, c) in r.clauses.iter().enumerate() {
                    for (mi, m) in c.matches.iter().enumerate() {
                        let fields = [
                            ("src", &m.source_ips),
                            ("not-src", &m.not_source_ips),
                            ("dst", &m.destination_ips),
                            ("not-dst", &m.not_destination_ips),
                        ];
                        for (f, cidrs) in fields {
                            for (i, cidr) in cidrs.iter().enumerate() {
                                let cidr = *cidr;
                                let name = format!("authz/{}/{}/{ri}/{ci}/{mi}/{f}/{i}", a.namespace, a.name);
                                tests.push((name.into(), Box::new(move |ip| cidr.contains(ip))));
                            }
                        }
                    }
                }
            }
        }
        Predicates { tests }
    }
}

fn signature(state: &MeshState, preds: &Predicates, w: &MeshWorkload) -> Signature {
    let addr = w.address();
    let mut net_policies: Vec<String> = state.net_policies_for(&w.uid).iter().map(|p| p.key()).collect();
    net_policies.sort();
    let authorizations = state.policies_for(w).iter().map(|a| format!("{}/{}", a.namespace, a.name)).collect();
    let mut addresses: Vec<Arc<str>> = preds.tests.iter().filter(|(_, t)| t(addr)).map(|(n, _)| n.clone()).collect();
    addresses.sort();
    let named_ports = state
        .net_policies()
        .filter_map(|p| p.named_ports.get(&addr).map(|m| (p.key(), m.iter().map(|(k, v)| (k.clone(), *v)).collect())))
        .collect();
    Signature {
        identity: w.identity().to_string(),
        meshed: w.meshed(),
        net_policies,
        authorizations,
        addresses,
        named_ports,
        waypoint: w.waypoint.is_some(),
    }
}

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

/// Whether any policy has a say between the two: if none does, every port
/// is allowed and nothing needs writing.
/// The trust domain of the mesh's workloads (the first one's; one mesh,
/// one trust domain).
fn state_trust_domain(state: &MeshState) -> String {
    state
        .workloads()
        .next()
        .map(|w| w.identity().trust_domain().to_string())
        .unwrap_or_else(|| slipstream_core::DEFAULT_TRUST_DOMAIN.to_string())
}

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
    fn id_of(&mut self, denial: Option<&slipstream_core::policy::LayerVerdict>) -> u32 {
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

/// Writes a pair's entries from `decide` (allowed, and the denying layer
/// when denied): the port none of `ports` is stands for the others; a
/// port's own entry only where it differs.
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

fn emit(
    out: &mut Compiled,
    rules: &mut Rules,
    pair: Pair,
    mut ports: BTreeSet<u16>,
    decide: impl Fn(u16) -> (bool, Option<slipstream_core::policy::LayerVerdict>),
) {
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
        let value = if ok { PolicyValue::allow() } else { PolicyValue::deny(rules.id_of(denial.as_ref()), 0) };
        out.entries.insert(PolicyKey::new(proto, node, src, dst, p), value);
    }
    if !other_ok {
        let flags = if any_allowed || proto != IPPROTO_TCP || !source_known { 0 } else { POLICY_F_ALL_PORTS };
        out.entries.insert(PolicyKey::new(proto, node, src, dst, 0), PolicyValue::deny(rules.id_of(other_denial.as_ref()), flags));
    }
}

/// Counts a pair left to user space and keeps the local members of its
/// ends in the nftables table (see [`Compiled::left_to_nftables`]).
fn leave(out: &mut Compiled, node: &str, ends: &[&Group]) {
    out.skipped_pairs += 1;
    for g in ends {
        out.left_to_nftables.extend(g.members.iter().filter(|w| w.node == node).filter_map(|w| v4(w.address())));
    }
}

/// One class of workloads: its identity, members, and whether one of them
/// runs on this node.
struct Group<'a> {
    id: u32,
    members: Vec<&'a Arc<MeshWorkload>>,
    local: bool,
}

/// Compiles the kernel's part of policy for `node` (index `node_index` in
/// the maps), numbering classes with `ids`.
pub fn compile(state: &MeshState, node: &str, node_index: u16, ids: &mut Identities) -> Compiled {
    let mut out = Compiled::default();
    let mut rules = Rules { list: Vec::new(), index: BTreeMap::new() };
    let preds = Predicates::of(state);
    let mut classes: BTreeMap<Class, Vec<&Arc<MeshWorkload>>> = BTreeMap::new();
    for w in state.workloads().filter(|w| v4(w.address()).is_some()) {
        classes.entry(Class::Workload(signature(state, &preds, w))).or_default().push(w);
    }
    let mut vips: BTreeSet<Ipv4Addr> = BTreeSet::new();
    for svc in state.services() {
        vips.extend(svc.addresses.iter().filter_map(|a| v4(a.address)));
    }
    let mut addrs: BTreeMap<Class, Vec<Ipv4Addr>> =
        classes.iter().map(|(c, m)| (c.clone(), m.iter().filter_map(|w| v4(w.address())).collect())).collect();
    addrs.extend(vips.iter().map(|v| (Class::Service(*v), vec![*v])));
    // The world: one class per prefix some address that falls in it (and
    // in no longer prefix, and is no address of the cluster) stands for.
    let prefixes = world_prefixes(state);
    let own: BTreeSet<u32> = addrs.values().flatten().map(|a| u32::from(*a)).collect();
    let mut worlds: Vec<(Prefix, Ipv4Addr)> = Vec::new();
    for p in &prefixes {
        let mut inner: Vec<Prefix> = prefixes.iter().filter(|q| q.len > p.len && p.covers(q)).copied().collect();
        inner.extend(own.iter().filter(|a| p.contains(**a)).map(|a| Prefix { net: *a, len: 32 }));
        if let Some(rep) = uncovered(*p, &inner) {
            worlds.push((*p, Ipv4Addr::from(rep)));
        }
    }
    addrs.extend(worlds.iter().map(|(p, _)| (Class::World(*p), Vec::new())));
    let numbers = ids.number(&addrs);
    for (p, _) in &worlds {
        out.world.insert((node_index, *p), numbers[&Class::World(*p)]);
    }
    for (c, a) in &addrs {
        for ip in a {
            // An address two workloads claim is the newest claim's, as
            // the proxy resolves it.
            let owner = match c {
                Class::Workload(_) => classes[c].iter().find(|w| w.address() == IpAddr::V4(*ip)).map(|w| w.uid.as_str()),
                Class::Service(_) | Class::World(_) => None,
            };
            if owner.is_some() && state.workload_by_ip(IpAddr::V4(*ip)).map(|w| w.uid.clone()).as_deref() != owner {
                continue;
            }
            out.ipcache.insert(IpcacheKey::new(node_index, *ip), numbers[c]);
        }
    }
    out.classes = classes.len();
    out.local =
        state.workloads().filter(|w| w.node == node).filter_map(|w| v4(w.address())).map(|ip| IpcacheKey::new(node_index, ip)).collect();
    let groups: Vec<Group> = classes
        .iter()
        .map(|(c, members)| Group { id: numbers[c], local: members.iter().any(|w| w.node == node), members: members.clone() })
        .collect();

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
    for s in &groups {
        for d in &groups {
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
                leave(&mut out, node, &[s, d]);
                continue;
            };
            let pair = Pair { proto: IPPROTO_TCP, node: node_index, src: s.id, dst: d.id, source_known: true };
            emit(&mut out, &mut rules, pair, ports, |port| {
                let v = engine::connection(state, src, dst, L4Protocol::Tcp, port);
                (v.allowed, v.denial().cloned())
            });
        }
    }
    // The world, as destination of this node's pods (their egress, at
    // connect()) and as source towards them (their ingress, at tc).
    for g in groups.iter().filter(|g| g.local) {
        let w = g.members[0];
        let egress = !state.net_policies_for(&w.uid).is_empty();
        let ingress = egress || (w.meshed() && !state.policies_for(w).is_empty());
        for (p, rep) in &worlds {
            let world_id = numbers[&Class::World(*p)];
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
                    emit(&mut out, &mut rules, pair, ports, |port| {
                        let v = engine::network(state, w, Direction::Egress, &conn(addr, *rep, port));
                        (v.allowed, (!v.allowed).then_some(v))
                    });
                } else {
                    leave(&mut out, node, &[g]);
                }
            }
            if ingress {
                let mut ports = BTreeSet::new();
                if net_ports(state, w, Direction::Ingress, w.address(), &mut ports).is_some() {
                    authz_ports(state, w, &mut ports);
                    let pair = Pair { proto: IPPROTO_TCP, node: node_index, src: world_id, dst: g.id, source_known: false };
                    emit(&mut out, &mut rules, pair, ports, |port| {
                        let v = engine::ingress(state, w, &conn(*rep, addr, port));
                        (v.allowed(), v.denial().cloned())
                    });
                } else {
                    leave(&mut out, node, &[g]);
                }
            }
        }
    }
    // UDP, SCTP and the rest (ICMP...), which the mesh does not capture:
    // the network policies alone (NetworkPolicy and CiliumNetworkPolicy
    // cover them, Istio's authorization does not). A pair with a source of
    // this node holds both ends' verdict (decided at the source's
    // sendmsg()/connect() and tc egress, and again at a local
    // destination's tc ingress); a pair with a source elsewhere, or in the
    // world, holds the local destination's ingress verdict (its tc
    // ingress). What is neither UDP nor SCTP is decided at port 0 by the
    // rules that name no port (`PROTO_OTHER`).
    for (proto, l4) in [(IPPROTO_UDP, L4Protocol::Udp), (IPPROTO_SCTP, L4Protocol::Sctp), (PROTO_OTHER, L4Protocol::Any)] {
        let conn = |src_ip: IpAddr, dst_ip: IpAddr, port: u16| Connection {
            protocol: l4,
            src_ip,
            peer: None,
            dst_ip,
            dst_port: if proto == PROTO_OTHER { 0 } else { port },
        };
        // The ports a pair's policies single out; none for PROTO_OTHER.
        let ports_of = |src: Option<(&MeshWorkload, IpAddr)>, dst: Option<&MeshWorkload>, dst_ip: IpAddr| -> Option<BTreeSet<u16>> {
            let mut ports = BTreeSet::new();
            if proto == PROTO_OTHER {
                return Some(ports);
            }
            if let Some((src, _)) = src {
                net_ports(state, src, Direction::Egress, dst_ip, &mut ports)?;
            }
            if let Some(dst) = dst {
                net_ports(state, dst, Direction::Ingress, dst_ip, &mut ports)?;
            }
            Some(ports)
        };
        for d in &groups {
            for s in &groups {
                let src = s.members[0];
                let Some(dst) = d.members.iter().find(|w| w.uid != src.uid) else { continue };
                let (src_np, dst_np) = (!state.net_policies_for(&src.uid).is_empty(), !state.net_policies_for(&dst.uid).is_empty());
                let needed = if s.local { src_np || dst_np } else { d.local && dst_np };
                if !needed {
                    continue;
                }
                let Some(ports) = ports_of(s.local.then_some((src, src.address())), Some(dst), dst.address()) else {
                    leave(&mut out, node, &[s, d]);
                    continue;
                };
                let pair = Pair { proto, node: node_index, src: s.id, dst: d.id, source_known: true };
                emit(&mut out, &mut rules, pair, ports, |port| {
                    let c = conn(src.address(), dst.address(), port);
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
        for g in groups.iter().filter(|g| g.local) {
            let w = g.members[0];
            if state.net_policies_for(&w.uid).is_empty() {
                continue;
            }
            for (p, rep) in &worlds {
                let world_id = numbers[&Class::World(*p)];
                let world = IpAddr::V4(*rep);
                // Egress, to the world.
                if let Some(ports) = ports_of(Some((w, w.address())), None, world) {
                    let pair = Pair { proto, node: node_index, src: g.id, dst: world_id, source_known: true };
                    emit(&mut out, &mut rules, pair, ports, |port| {
                        let e = engine::network(state, w, Direction::Egress, &conn(w.address(), world, port));
                        (e.allowed, (!e.allowed).then_some(e))
                    });
                } else {
                    leave(&mut out, node, &[g]);
                }
                // Ingress, from the world.
                if let Some(ports) = ports_of(None, Some(w), w.address()) {
                    let pair = Pair { proto, node: node_index, src: world_id, dst: g.id, source_known: false };
                    emit(&mut out, &mut rules, pair, ports, |port| {
                        let i = engine::network(state, w, Direction::Ingress, &conn(world, w.address(), port));
                        (i.allowed, (!i.allowed).then_some(i))
                    });
                } else {
                    leave(&mut out, node, &[g]);
                }
            }
        }
        // A service address (UDP and SCTP): the node's service table
        // chooses the endpoint after the datagram left the pod, so the
        // sender's egress is decided here when it is the same for every
        // ready endpoint (all refused: a deny at the service address);
        // when endpoints differ, the sender stays in the nftables table,
        // which sees the endpoint. The endpoint's ingress holds at its own
        // tc ingress either way.
        if proto == PROTO_OTHER {
            continue;
        }
        for s in groups.iter().filter(|g| g.local) {
            let src = s.members[0];
            if state.net_policies_for(&src.uid).is_empty() {
                continue;
            }
            for svc in state.services() {
                for vip in svc.addresses.iter().filter_map(|a| v4(a.address)) {
                    let vip_id = numbers[&Class::Service(vip)];
                    for port in &svc.ports {
                        let eps = state.endpoints(svc, port.service_port);
                        let verdicts: Vec<slipstream_core::policy::LayerVerdict> = eps
                            .iter()
                            .map(|e| {
                                engine::network(state, src, Direction::Egress, &conn(src.address(), e.workload.address(), e.target_port))
                            })
                            .collect();
                        let denied = verdicts.iter().filter(|v| !v.allowed).count();
                        if denied == 0 {
                            continue;
                        }
                        if denied < verdicts.len() {
                            leave(&mut out, node, &[s]);
                            continue;
                        }
                        let rule = rules.id_of(Some(&verdicts[0]));
                        out.entries.insert(PolicyKey::new(proto, node_index, s.id, vip_id, port.service_port), PolicyValue::deny(rule, 0));
                    }
                }
            }
        }
    }
    // A service address: refused at connect() when every ready endpoint
    // of that port would refuse (the proxy, whichever it picks, would
    // too). No endpoint: the proxy's answer, not the kernel's. Sources of
    // this node only: the check is the connect hook's.
    for s in groups.iter().filter(|g| g.local) {
        let src = s.members[0];
        // A service bound to a waypoint is reached through it, never its
        // endpoints directly: the waypoint decides (and the endpoints'
        // node proxies, on the waypoint's tunnels).
        for svc in state.services().filter(|s| s.waypoint.is_none()) {
            for vip in svc.addresses.iter().filter_map(|a| v4(a.address)) {
                let vip_id = numbers[&Class::Service(vip)];
                for port in &svc.ports {
                    let eps = state.endpoints(svc, port.service_port);
                    let verdicts: Vec<engine::Verdict> =
                        eps.iter().map(|e| engine::connection(state, src, &e.workload, L4Protocol::Tcp, e.target_port)).collect();
                    if verdicts.is_empty() || verdicts.iter().any(|v| v.allowed) {
                        continue;
                    }
                    let rule = rules.id_of(verdicts[0].denial());
                    out.entries.insert(PolicyKey::tcp(node_index, s.id, vip_id, port.service_port), PolicyValue::deny(rule, 0));
                }
            }
        }
    }
    out.rules = rules.list;
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn classes(n: usize, prior: &[(Ipv4Addr, u32)]) -> (Identities, BTreeMap<Class, Vec<Ipv4Addr>>) {
        let ids = Identities::adopt(prior.iter().copied(), [], 0);
        let m = (0..n).map(|i| (Class::Service(Ipv4Addr::new(10, 96, 0, i as u8)), vec![Ipv4Addr::new(10, 96, 0, i as u8)])).collect();
        (ids, m)
    }

    #[test]
    fn numbers_are_kept_never_reused_and_adopted_after_a_restart() {
        let (mut ids, mut m) = classes(3, &[]);
        let first = ids.number(&m);
        let mut got: Vec<u32> = first.values().copied().collect();
        got.sort();
        assert_eq!(got, vec![1, 2, 3]);
        // A class goes, another comes: the new one gets a fresh number.
        let gone = m.keys().next().unwrap().clone();
        m.remove(&gone);
        m.insert(Class::Service(Ipv4Addr::new(10, 96, 0, 9)), vec![Ipv4Addr::new(10, 96, 0, 9)]);
        let second = ids.number(&m);
        for (c, id) in &second {
            if let Some(old) = first.get(c) {
                assert_eq!(old, id, "a class keeps its number");
            } else {
                assert_eq!(*id, 4, "never a number a gone class had");
            }
        }
        // A restart: the map's numbers are taken back, new classes go above.
        let prior: Vec<(Ipv4Addr, u32)> =
            m.iter().map(|(c, a)| (a[0], second[c])).filter(|(a, _)| *a != Ipv4Addr::new(10, 96, 0, 9)).collect();
        let (mut again, _) = classes(0, &prior);
        let third = again.number(&m);
        for (c, id) in &third {
            if m[c][0] == Ipv4Addr::new(10, 96, 0, 9) {
                assert_eq!(*id, 4, "not in the map before: the next number above it");
            } else {
                assert_eq!(second[c], *id, "adopted from the map");
            }
        }
    }

    #[test]
    fn a_class_that_split_while_the_proxy_was_away_adopts_its_old_number_in_neither_half() {
        let (a, b) = (Ipv4Addr::new(10, 96, 1, 1), Ipv4Addr::new(10, 96, 1, 2));
        let mut ids = Identities::adopt([(a, 5), (b, 5)], [], 9);
        let m = BTreeMap::from([(Class::Service(a), vec![a]), (Class::Service(b), vec![b])]);
        let n = ids.number(&m);
        let mut got: Vec<u32> = n.values().copied().collect();
        got.sort();
        assert_eq!(got, vec![10, 11], "5 meant both: neither half keeps it; new numbers go above every number in use");
    }

    #[test]
    fn members_that_disagree_on_their_old_number_get_a_new_one() {
        let a = Ipv4Addr::new(10, 244, 1, 1);
        let b = Ipv4Addr::new(10, 244, 1, 2);
        let mut ids = Identities::adopt([(a, 5), (b, 6)], [], 0);
        let sig = Signature {
            identity: "spiffe://cluster.local/ns/a/sa/x".into(),
            meshed: true,
            net_policies: vec![],
            authorizations: vec![],
            addresses: vec![],
            named_ports: vec![],
            waypoint: false,
        };
        let m = BTreeMap::from([(Class::Workload(sig), vec![a, b])]);
        let n = ids.number(&m);
        assert_eq!(n.values().copied().collect::<Vec<_>>(), vec![7], "two old numbers merged: neither is reused");
    }
}
