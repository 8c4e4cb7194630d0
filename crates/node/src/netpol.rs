//! Network policies of the pods outside the mesh, in the node's kernel
//! path: an nftables table in the node's network namespace (where every
//! pod's traffic is forwarded, as on a Kubernetes node), rebuilt from the
//! mesh snapshot whenever it changes. Meshed pods are decided by the proxy
//! itself (with identities); this covers the pods it never sees, so that
//! NetworkPolicy and CiliumNetworkPolicy hold for them too. On a node
//! running the eBPF datapath, the pods the CNI put on it are the programs'
//! (every protocol, both ends, docs/datapath.md) and get no chain here;
//! only pods kept on nftables (`slipstream.io/datapath: nftables`) do.
//!
//! The planner is pure ([`plan`]: snapshot and node in, nft script out);
//! [`Kernel::apply`] runs `nft -f -` only when the script changed.
//!
//! Semantics, per pod of this node outside the mesh, as the policy engine
//! decides ([`slipstream_core::policy::network`]): its egress chain sees
//! packets it sends, its ingress chain packets sent to it; deny rules
//! refuse, allow rules return (on to the other end's chain), an isolated
//! direction refuses what no rule allowed (TCP with a reset, so a client
//! fails at once instead of at its connect timeout). Replies of an accepted connection pass
//! (conntrack), as Kubernetes' connection-oriented semantics say; a policy
//! change applies to new connections of these pods (the proxy, not the
//! kernel path, closes open meshed ones).

use slipstream_core::policy::network::{L4Protocol, NetPeer, NetPolicy, NetPort, NetRule, PortSpec};
use slipstream_core::policy::Cidr;
use slipstream_core::{MeshState, MeshWorkload};
use std::collections::BTreeSet;
use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

pub const TABLE: &str = slipstream_core::abi::NETPOL_TABLE;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Ingress,
    Egress,
}

/// The nft script that makes the node's table match the snapshot: the
/// table is replaced whole, in one transaction. Pods whose address is in
/// `on_datapath` are the eBPF programs' (every protocol, both ends) and
/// get no chain.
pub fn plan(state: &MeshState, node: &str, on_datapath: &BTreeSet<Ipv4Addr>) -> String {
    let mut pods: Vec<&Arc<MeshWorkload>> = state
        .workloads()
        .filter(|w| w.node == node && !w.meshed())
        .filter(|w| !w.addresses.iter().all(|a| matches!(a, IpAddr::V4(v4) if on_datapath.contains(v4))))
        .collect();
    pods.sort_by(|a, b| a.uid.cmp(&b.uid));
    let mut chains = String::new();
    let mut jumps = String::new();
    for (i, w) in pods.iter().enumerate() {
        let policies = state.net_policies_for(&w.uid);
        if policies.is_empty() {
            continue;
        }
        let ps: Vec<&NetPolicy> = policies.iter().map(|p| p.as_ref()).collect();
        for (dir, name, field) in [(Dir::Egress, format!("eg{i}"), "saddr"), (Dir::Ingress, format!("in{i}"), "daddr")] {
            let Some(body) = chain(&ps, dir, w) else { continue };
            let _ = writeln!(
                chains,
                "  chain {name} {{\n    # {} {}\n{body}  }}",
                if dir == Dir::Egress { "egress of" } else { "ingress of" },
                w.uid
            );
            for a in &w.addresses {
                let _ = writeln!(jumps, "    {} {field} {a} jump {name}", family(*a));
            }
        }
    }
    let mut s = String::new();
    let _ = writeln!(s, "table inet {TABLE} {{}}\ndelete table inet {TABLE}\ntable inet {TABLE} {{");
    s.push_str(&chains);
    let _ = writeln!(s, "  chain forward {{\n    type filter hook forward priority filter; policy accept;");
    if !jumps.is_empty() {
        s.push_str("    ct state established,related accept\n");
        // Egress first, as the packet meets the source's rules first.
        let (eg, ing): (Vec<&str>, Vec<&str>) = jumps.lines().partition(|l| l.contains(" jump eg"));
        for l in eg.into_iter().chain(ing) {
            let _ = writeln!(s, "{l}");
        }
    }
    s.push_str("  }\n}\n");
    s
}

fn family(a: IpAddr) -> &'static str {
    if a.is_ipv4() {
        "ip"
    } else {
        "ip6"
    }
}

/// The chain body of one pod and direction, or None when no policy
/// selecting it says anything about that direction.
fn chain(ps: &[&NetPolicy], dir: Dir, w: &MeshWorkload) -> Option<String> {
    let isolated = ps.iter().any(|p| if dir == Dir::Egress { p.isolates_egress } else { p.isolates_ingress });
    let denies: Vec<(&NetPolicy, &NetRule)> =
        ps.iter().flat_map(|p| if dir == Dir::Egress { &p.egress_deny } else { &p.ingress_deny }.iter().map(move |r| (*p, r))).collect();
    if !isolated && denies.is_empty() {
        return None;
    }
    let mut out = String::new();
    for (p, r) in &denies {
        for m in matches(p, r, dir, w) {
            refuse(&mut out, &m, &comment(p, r));
        }
    }
    if isolated {
        for p in ps {
            for r in if dir == Dir::Egress { &p.egress } else { &p.ingress } {
                for m in matches(p, r, dir, w) {
                    let _ = writeln!(out, "    {m}return comment \"{}\"", comment(p, r));
                }
            }
        }
        refuse(&mut out, "", &format!("isolated for {}", if dir == Dir::Egress { "egress" } else { "ingress" }));
    }
    Some(out)
}

/// Refuses what `m` matches at once rather than dropping it silently, so
/// a client fails in a round trip instead of waiting for its connect
/// timeout: TCP with a reset, anything else with an ICMP unreachable.
fn refuse(out: &mut String, m: &str, why: &str) {
    let _ = writeln!(out, "    {m}meta l4proto tcp reject with tcp reset comment \"{why}\"");
    let _ = writeln!(out, "    {m}reject comment \"{why}\"");
}

fn comment(p: &NetPolicy, r: &NetRule) -> String {
    format!("{} {}/{} {}", p.kind.policy_kind().as_str(), p.namespace, p.name, r.path).replace('"', "'")
}

/// The nft match expressions (each ending in a space) of one rule: one per
/// peer and port combination; none when it can match nothing.
fn matches(p: &NetPolicy, r: &NetRule, dir: Dir, w: &MeshWorkload) -> Vec<String> {
    let peer_field = if dir == Dir::Egress { "daddr" } else { "saddr" };
    let peers: Vec<String> = match &r.peers {
        None => vec![String::new()],
        Some(ps) => ps.iter().flat_map(|peer| peer_matches(peer, peer_field)).collect(),
    };
    let ports: Vec<String> = match &r.ports {
        None => vec![String::new()],
        Some(ps) => ps.iter().flat_map(|port| port_matches(p, port, dir, w)).collect(),
    };
    let mut out = Vec::new();
    for a in &peers {
        for b in &ports {
            out.push(format!("{a}{b}"));
        }
    }
    out
}

fn cidr(c: &Cidr) -> String {
    format!("{}/{}", c.address, c.length)
}

fn peer_matches(peer: &NetPeer, field: &str) -> Vec<String> {
    match peer {
        NetPeer::Addresses(a) => {
            let mut out = Vec::new();
            for fam in ["ip", "ip6"] {
                let set: Vec<String> = a.iter().filter(|ip| family(**ip) == fam).map(|ip| ip.to_string()).collect();
                if !set.is_empty() {
                    out.push(format!("{fam} {field} {{ {} }} ", set.join(", ")));
                }
            }
            out
        }
        NetPeer::Block { cidr: c, except } => {
            let fam = family(c.address);
            let mut m = format!("{fam} {field} {} ", cidr(c));
            if !except.is_empty() {
                let ex: Vec<String> = except.iter().map(cidr).collect();
                let _ = write!(m, "{fam} {field} != {{ {} }} ", ex.join(", "));
            }
            vec![m]
        }
    }
}

fn proto(p: L4Protocol) -> &'static str {
    match p {
        L4Protocol::Tcp => "meta l4proto tcp ",
        L4Protocol::Udp => "meta l4proto udp ",
        L4Protocol::Sctp => "meta l4proto sctp ",
        L4Protocol::Any => "meta l4proto { tcp, udp, sctp } ",
    }
}

/// A named port is the destination pod's: the pod itself for ingress, for
/// egress every pod of the policy's list that names it (by address).
fn port_matches(p: &NetPolicy, port: &NetPort, dir: Dir, w: &MeshWorkload) -> Vec<String> {
    let pr = proto(port.protocol);
    match &port.port {
        PortSpec::All if port.protocol == L4Protocol::Any => vec![String::new()],
        PortSpec::All => vec![pr.to_string()],
        PortSpec::Range { port: a, end } if a == end => vec![format!("{pr}th dport {a} ")],
        PortSpec::Range { port: a, end } => vec![format!("{pr}th dport {a}-{end} ")],
        PortSpec::Named(name) => match dir {
            Dir::Ingress => w
                .addresses
                .iter()
                .filter_map(|a| p.named_ports.get(a)?.get(name))
                .map(|n| format!("{pr}th dport {n} "))
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
            Dir::Egress => p
                .named_ports
                .iter()
                .filter_map(|(addr, names)| Some((addr, names.get(name)?)))
                .map(|(addr, n)| format!("{} daddr {addr} {pr}th dport {n} ", family(*addr)))
                .collect(),
        },
    }
}

/// Applies plans to the node's kernel, skipping unchanged ones.
#[derive(Default)]
pub struct Kernel {
    last: Option<String>,
}

impl Kernel {
    /// Applies `script` if it differs from the last one applied; a failure
    /// is logged and retried at the next change.
    pub fn apply(&mut self, script: String) {
        if self.last.as_deref() == Some(script.as_str()) {
            return;
        }
        match run_nft(&script) {
            Ok(()) => {
                tracing::info!(
                    table = TABLE,
                    rules = script.lines().filter(|l| l.contains(" return ") || l.contains(" reject ")).count(),
                    "network policies of the pods outside the mesh applied to the node's kernel path"
                );
                self.last = Some(script);
            }
            Err(e) => tracing::error!(table = TABLE, "cannot apply the network policies of the pods outside the mesh: {e}"),
        }
    }
}

fn run_nft(script: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("nft")
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child.stdin.take().expect("piped").write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("nft: {}", String::from_utf8_lossy(&out.stderr).trim())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_core::policy::network::NetKind;
    use slipstream_core::{MeshConfig, TunnelProtocol, Workload};

    fn wl(name: &str, ip: &str, node: &str, meshed: bool) -> Workload {
        Workload {
            uid: format!("c//Pod/plain/{name}"),
            name: name.into(),
            namespace: "plain".into(),
            addresses: vec![ip.parse().unwrap()],
            node: node.into(),
            tunnel_protocol: if meshed { TunnelProtocol::Hbone } else { TunnelProtocol::None },
            service_account: "default".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_table_for_the_pods_outside_the_mesh_only() {
        let np = NetPolicy {
            kind: NetKind::NetworkPolicy,
            namespace: "plain".into(),
            name: "p".into(),
            selected: vec!["c//Pod/plain/a".into(), "c//Pod/plain/m".into()],
            isolates_ingress: true,
            ingress: vec![NetRule {
                peers: Some(vec![
                    NetPeer::Addresses(vec!["10.244.2.5".parse().unwrap()]),
                    NetPeer::Block {
                        cidr: Cidr { address: "10.0.0.0".parse().unwrap(), length: 8 },
                        except: vec![Cidr { address: "10.244.1.0".parse().unwrap(), length: 24 }],
                    },
                ]),
                ports: Some(vec![NetPort { protocol: L4Protocol::Tcp, port: PortSpec::Range { port: 8080, end: 8090 } }]),
                path: "spec.ingress[0]".into(),
            }],
            ..Default::default()
        };
        let cfg = MeshConfig {
            workloads: vec![
                wl("a", "10.244.1.7", "node1", false),
                wl("m", "10.244.1.8", "node1", true),
                wl("b", "10.244.2.7", "node2", false),
            ],
            net_policies: vec![np],
            ..Default::default()
        };
        let (state, errs) = MeshState::from_config(&cfg);
        assert!(errs.is_empty(), "{errs:?}");
        let s = plan(&state, "node1", &BTreeSet::new());
        assert!(s.starts_with("table inet slipstream_netpol {}\ndelete table inet slipstream_netpol\n"), "{s}");
        assert!(s.contains("    ip daddr 10.244.1.7 jump in0\n"), "{s}");
        assert!(!s.contains("10.244.1.8 jump"), "a meshed pod is the proxy's: {s}");
        assert!(
            s.contains(
                "ip saddr { 10.244.2.5 } meta l4proto tcp th dport 8080-8090 return comment \"NetworkPolicy plain/p spec.ingress[0]\""
            ),
            "{s}"
        );
        assert!(s.contains("ip saddr 10.0.0.0/8 ip saddr != { 10.244.1.0/24 } meta l4proto tcp th dport 8080-8090 return"), "{s}");
        assert!(
            s.contains(
                "    meta l4proto tcp reject with tcp reset comment \"isolated for ingress\"\n    reject comment \"isolated for ingress\""
            ),
            "{s}"
        );
        assert!(!s.contains("jump eg0"), "egress is not isolated: {s}");
        // No pod of this node with a policy: an empty table.
        let s = plan(&state, "node3", &BTreeSet::new());
        assert!(!s.contains("jump"), "{s}");
    }
}
