//! Identities: the classes of workloads policy cannot tell apart, and this
//! node's numbering of them (see the parent module's doc).

use super::Compiled;
use crate::abi::IpcacheKey;
use slipstream_core::policy::network::NetPeer;
use slipstream_core::{MeshState, MeshWorkload};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

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

/// A class of addresses: what gets one identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Class {
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
    pub(super) fn number(&mut self, classes: &BTreeMap<Class, Vec<Ipv4Addr>>) -> HashMap<Class, u32> {
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

/// The IPv4 address, if `ip` is one.
pub(super) fn v4(ip: IpAddr) -> Option<Ipv4Addr> {
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

/// One class of workloads: its identity, members, and whether one of them
/// runs on this node.
pub(super) struct Group<'a> {
    pub(super) id: u32,
    pub(super) members: Vec<&'a Arc<MeshWorkload>>,
    pub(super) local: bool,
}

/// A snapshot's classes, numbered in this node's numbering.
pub(super) struct Classes<'a> {
    /// The workload classes.
    pub(super) groups: Vec<Group<'a>>,
    /// The world's classes: each prefix with an address that stands for
    /// it (its longest match, and no address of the cluster).
    pub(super) worlds: Vec<(Prefix, Ipv4Addr)>,
    /// Every class's identity.
    pub(super) numbers: HashMap<Class, u32>,
}

/// Groups the snapshot's addresses into classes (workloads, service
/// addresses, the world's prefixes), numbers them with `ids`, and writes
/// the address-to-identity maps of `out` (`ipcache`, `world`, `local`,
/// `classes`).
pub(super) fn classify<'a>(state: &'a MeshState, node: &str, node_index: u16, ids: &mut Identities, out: &mut Compiled) -> Classes<'a> {
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
    Classes { groups, worlds, numbers }
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
