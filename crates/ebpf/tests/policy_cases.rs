//! The kernel may only deny what the node proxy would deny, and should
//! deny what it can: for every semantic case of the policy table
//! (crates/control/tests/data/policy-cases.yaml, answers written from
//! Istio's, Kubernetes' and Cilium's documentation), the policy map that
//! `policy::compile` writes is looked up as the connect hook (in the
//! source's node's numbering) and tc ingress (in the destination's) look
//! it up, and compared with the engine's answer, on the case's ports and on
//! ports no policy names; an HBONE SYN is refused only when the engine
//! refuses every port. Pure: no kernel needed.

use slipstream_control::index::{mesh_from_manifests, IndexSettings};
use slipstream_core::engine;
use slipstream_core::policy::network::Direction;
use slipstream_core::policy::network::L4Protocol;
use slipstream_core::MeshState;
use slipstream_ebpf::abi::{
    IpcacheKey, PolicyKey, PolicyValue, IPPROTO_SCTP, IPPROTO_TCP, IPPROTO_UDP, POLICY_DENY, POLICY_F_ALL_PORTS, PROTO_OTHER,
};
use slipstream_ebpf::kernel_policy::{compile, Identities, Prefix};
use std::collections::BTreeMap;
use std::net::IpAddr;

#[path = "../../control/tests/data/cases.rs"]
#[allow(dead_code)]
mod cases;

/// The maps of every node, merged (keys carry the node).
#[derive(Default)]
struct Maps {
    ipcache: BTreeMap<IpcacheKey, u32>,
    world: BTreeMap<(u16, Prefix), u32>,
    policy: BTreeMap<PolicyKey, PolicyValue>,
}

impl Maps {
    /// What ss_policy_lookup does: both identities in `node`'s numbering,
    /// the port's entry, else the pair's.
    /// ss_identity: the exact address, else the longest world prefix.
    fn identity(&self, node: u16, a: std::net::Ipv4Addr) -> Option<u32> {
        if let Some(id) = self.ipcache.get(&IpcacheKey::new(node, a)) {
            return Some(*id);
        }
        (0..=32u8).rev().find_map(|len| self.world.get(&(node, Prefix::of(a, len))).copied())
    }

    fn lookup(&self, proto: u8, node: u16, src: IpAddr, dst: IpAddr, port: u16) -> Option<&PolicyValue> {
        let (IpAddr::V4(s), IpAddr::V4(d)) = (src, dst) else { return None };
        let sid = self.identity(node, s)?;
        let did = self.identity(node, d)?;
        self.policy.get(&PolicyKey::new(proto, node, sid, did, port)).or_else(|| self.policy.get(&PolicyKey::new(proto, node, sid, did, 0)))
    }

    fn denies(&self, node: u16, src: IpAddr, dst: IpAddr, port: u16) -> bool {
        self.lookup(IPPROTO_TCP, node, src, dst, port).is_some_and(|v| v.verdict == POLICY_DENY)
    }

    fn denies_proto(&self, proto: u8, node: u16, src: IpAddr, dst: IpAddr, port: u16) -> bool {
        self.lookup(proto, node, src, dst, port).is_some_and(|v| v.verdict == POLICY_DENY)
    }

    /// tc ingress on an HBONE SYN.
    fn denies_every_port(&self, node: u16, src: IpAddr, dst: IpAddr) -> bool {
        self.lookup(IPPROTO_TCP, node, src, dst, 0).is_some_and(|v| v.verdict == POLICY_DENY && v.flags & POLICY_F_ALL_PORTS != 0)
    }
}

const NODES: [(&str, u16); 2] = [("node1", 1), ("node2", 2)];

fn node_index(name: &str) -> u16 {
    NODES.iter().find(|(n, _)| *n == name).map(|(_, i)| *i).unwrap_or_else(|| panic!("a case puts a pod on {name}"))
}

#[test]
fn the_kernel_map_agrees_with_the_engine_on_every_case() {
    let cases = cases::load();
    let mut failures = Vec::new();
    let (mut compared, mut kernel_denials) = (0, 0);
    let (mut workloads, mut classes) = (0, 0);
    let (mut udp_compared, mut udp_denials) = (0, 0);
    for case in &cases.cases {
        let cfg = mesh_from_manifests(&format!("{}\n---\n{}", cases::WORLD, case.objects), IndexSettings::default())
            .unwrap_or_else(|e| panic!("{}: {e:?}", case.id));
        let (state, _) = MeshState::from_config(&cfg);
        let mut maps = Maps::default();
        for (node, index) in NODES {
            let c = compile(&state, node, index, &mut Identities::new());
            assert_eq!(c.skipped_pairs, 0, "{}: no case has a port range too wide to compile", case.id);
            for v in c.entries.values() {
                assert!(v.rule == 0 || (v.rule as usize) <= c.rules.len(), "{}: a rule reference points nowhere", case.id);
            }
            assert!(c.classes <= state.workloads().count(), "{}", case.id);
            if index == 1 {
                workloads += state.workloads().count();
                classes += c.classes;
            }
            maps.ipcache.extend(c.ipcache);
            maps.world.extend(c.world);
            maps.policy.extend(c.entries);
        }
        for chk in &case.checks {
            let (to, port) = chk.to.rsplit_once(':').unwrap();
            let port: u16 = port.parse().unwrap();
            let (fns, fname) = chk.from.split_once('/').unwrap();
            let (tns, tname) = to.split_once('/').unwrap();
            let find = |ns: &str, name: &str| state.workloads().find(|w| w.namespace == ns && w.name == name).cloned();
            let (Some(src), Some(dst)) = (find(fns, fname), find(tns, tname)) else { continue };
            // The case's own port, its neighbours and the extremes: the
            // last ones stand for the ports no policy names.
            let (at_src, at_dst) = (node_index(&src.node), node_index(&dst.node));
            let mut every_port_denied = true;
            for p in [port, port.saturating_sub(1).max(1), port.saturating_add(1), 1, 65535] {
                let engine_denies = !engine::connection(&state, &src, &dst, L4Protocol::Tcp, p).allowed;
                every_port_denied &= engine_denies;
                for (point, node) in [("connect", at_src), ("tc ingress", at_dst)] {
                    compared += 1;
                    let kernel = maps.denies(node, src.address(), dst.address(), p);
                    kernel_denials += kernel as usize;
                    if kernel != engine_denies {
                        failures.push(format!(
                            "{}: {} -> {}:{p} at {point}: engine {}, kernel map {}",
                            case.id,
                            chk.from,
                            to,
                            if engine_denies { "denies" } else { "allows" },
                            if kernel { "denies" } else { "has no deny" }
                        ));
                    }
                }
            }
            // HBONE's SYN: refused only if the engine refuses every port
            // (checked on the ports above; the flag says "every port").
            if maps.denies_every_port(at_dst, src.address(), dst.address()) && !every_port_denied {
                failures.push(format!("{}: {} -> {to}: HBONE refused though a port is allowed", case.id, chk.from));
            }
            // UDP, SCTP and the rest: the network policies only. At the
            // source, both ends' verdict exactly; at the destination, its
            // ingress must hold, and nothing the two ends together allow
            // may be denied (a source whose class has a member on the
            // destination's node carries its egress verdict there too).
            for (proto, l4) in [(IPPROTO_UDP, L4Protocol::Udp), (IPPROTO_SCTP, L4Protocol::Sctp), (PROTO_OTHER, L4Protocol::Any)] {
                let ports: &[u16] = if proto == PROTO_OTHER { &[0] } else { &[port, port.saturating_add(1), 53, 65535] };
                for &p in ports {
                    let c = engine::Connection { protocol: l4, src_ip: src.address(), peer: None, dst_ip: dst.address(), dst_port: p };
                    let egress = engine::network(&state, &src, Direction::Egress, &c).allowed;
                    let ingress = engine::network(&state, &dst, Direction::Ingress, &c).allowed;
                    let at_src = maps.denies_proto(proto, at_src, src.address(), dst.address(), p);
                    let at_dst = maps.denies_proto(proto, at_dst, src.address(), dst.address(), p);
                    udp_compared += 2;
                    udp_denials += at_src as usize + at_dst as usize;
                    let what = format!("{}: {} -> {}:{p}/protocol {proto}", case.id, chk.from, to);
                    if at_src == (egress && ingress) {
                        failures.push(format!("{what} at the source: engine egress {egress}, ingress {ingress}, kernel denies {at_src}"));
                    }
                    if (!ingress && !at_dst) || (egress && ingress && at_dst) {
                        failures.push(format!("{what} at tc ingress: engine egress {egress}, ingress {ingress}, kernel denies {at_dst}"));
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{} disagreement(s):\n{}", failures.len(), failures.join("\n"));
    // Identities group pods: replicas, and pods no policy tells apart.
    assert!(classes * 10 < workloads * 9, "{classes} identities for {workloads} workloads");
    eprintln!("{compared} lookups compared, {kernel_denials} kernel denials, {classes} identities for {workloads} workloads");
    assert!(udp_compared > 2000 && udp_denials > 300, "UDP, SCTP, other: {udp_compared} compared, {udp_denials} kernel denials");
    eprintln!("UDP, SCTP and other protocols: {udp_compared} lookups compared, {udp_denials} kernel denials");
    assert!(compared > 400 && kernel_denials > 100, "the table exercises the map: {compared} compared, {kernel_denials} kernel denials");
}

/// Two replicas alike in every way policy sees but their addresses (and,
/// last, their named ports): one identity while no policy tells them
/// apart, two as soon as one does, on either end and in either layer; the
/// kernel agrees with the engine on every pair and port throughout.
// A table of scenarios (each its manifest, in place) and the one check
// they share: apart, the table would be harder to read.
#[allow(clippy::too_many_lines)]
#[test]
fn twins_that_only_an_address_or_a_named_port_tells_apart_get_identities_of_their_own() {
    let twins = |http_b: u16| {
        format!(
            r#"
apiVersion: v1
kind: Pod
metadata: {{name: twin-a, namespace: prod, labels: {{app: twin}}}}
spec: {{serviceAccountName: twin-sa, nodeName: node1, containers: [{{name: c, image: x, ports: [{{name: http, containerPort: 8080}}]}}]}}
status: {{podIP: 10.244.1.40, phase: Running, conditions: [{{type: Ready, status: "True"}}]}}
---
apiVersion: v1
kind: Pod
metadata: {{name: twin-b, namespace: prod, labels: {{app: twin}}}}
spec: {{serviceAccountName: twin-sa, nodeName: node2, containers: [{{name: c, image: x, ports: [{{name: http, containerPort: {http_b}}}]}}]}}
status: {{podIP: 10.244.2.40, phase: Running, conditions: [{{type: Ready, status: "True"}}]}}
"#
        )
    };
    let scenarios: Vec<(&str, String, bool)> = vec![
        ("no policy", twins(8080), false),
        (
            "a NetworkPolicy admits one twin's address block",
            format!(
                "{}---\n{}",
                twins(8080),
                r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: billing-from-a, namespace: prod}
spec:
  podSelector: {matchLabels: {app: billing}}
  policyTypes: [Ingress]
  ingress: [{from: [{ipBlock: {cidr: 10.244.1.40/32}}]}]
"#
            ),
            true,
        ),
        (
            "an AuthorizationPolicy denies the other twin's address",
            format!(
                "{}---\n{}",
                twins(8080),
                r#"
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-b, namespace: prod}
spec:
  selector: {matchLabels: {app: billing}}
  action: DENY
  rules: [{from: [{source: {ipBlocks: [10.244.2.40/32]}}]}]
"#
            ),
            true,
        ),
        (
            "an egress NetworkPolicy reaches one twin only",
            format!(
                "{}---\n{}",
                twins(8080),
                r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: frontend-to-a, namespace: prod}
spec:
  podSelector: {matchLabels: {app: frontend}}
  policyTypes: [Egress]
  egress: [{to: [{ipBlock: {cidr: 10.244.1.40/32}}]}]
"#
            ),
            true,
        ),
        (
            "a named port means 8080 on one twin and 9090 on the other",
            format!(
                "{}---\n{}",
                twins(9090),
                r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: twins-http, namespace: prod}
spec:
  podSelector: {matchLabels: {app: twin}}
  policyTypes: [Ingress]
  ingress: [{ports: [{port: http}]}]
"#
            ),
            true,
        ),
    ];
    for (what, objects, apart) in scenarios {
        let cfg = mesh_from_manifests(&format!("{}\n---\n{objects}", cases::WORLD), IndexSettings::default())
            .unwrap_or_else(|e| panic!("{what}: {e:?}"));
        let (state, _) = MeshState::from_config(&cfg);
        let mut maps = Maps::default();
        for (node, index) in NODES {
            let c = compile(&state, node, index, &mut Identities::new());
            maps.ipcache.extend(c.ipcache);
            maps.world.extend(c.world);
            maps.policy.extend(c.entries);
        }
        let addr = |ip: &str| -> std::net::Ipv4Addr { ip.parse().unwrap() };
        for (node, _) in NODES {
            let index = node_index(node);
            let (a, b) =
                (maps.ipcache[&IpcacheKey::new(index, addr("10.244.1.40"))], maps.ipcache[&IpcacheKey::new(index, addr("10.244.2.40"))]);
            assert_eq!(a != b, apart, "{what}: twins in {node}'s numbering: {a} and {b}");
        }
        // The workloads that own their address (a contested one is the
        // newest claim's, for the proxy as for the kernel).
        let all: Vec<_> =
            state.workloads().filter(|w| state.workload_by_ip(w.address()).is_some_and(|o| o.uid == w.uid)).cloned().collect();
        let mut failures = Vec::new();
        for src in &all {
            for dst in all.iter().filter(|d| d.uid != src.uid) {
                for p in [8080, 9090, 5432, 1, 65535] {
                    let engine_denies = !engine::connection(&state, src, dst, L4Protocol::Tcp, p).allowed;
                    for node in [node_index(&src.node), node_index(&dst.node)] {
                        if maps.denies(node, src.address(), dst.address(), p) != engine_denies {
                            failures.push(format!(
                                "{}/{} -> {}/{}:{p} (node{node}): engine denies {engine_denies}",
                                src.namespace, src.name, dst.namespace, dst.name
                            ));
                        }
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{what}: the kernel disagrees with the engine:\n{}", failures.join("\n"));
    }
}

/// Addresses outside the cluster: the kernel knows them by the longest
/// prefix policies name (ss_world_v1) and decides a pod's egress to them
/// (at connect()) and their ingress to it (at tc) exactly as the engine
/// does, blocks with exceptions, Cilium's deny rules and authorization
/// CIDRs included.
#[test]
fn the_world_outside_the_cluster_gets_the_engines_verdicts_at_both_ends() {
    let policies = r#"
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: frontend-out, namespace: prod}
spec:
  podSelector: {matchLabels: {app: frontend}}
  policyTypes: [Egress]
  egress:
  - to: [{ipBlock: {cidr: 192.0.2.0/24, except: [192.0.2.0/26]}}]
    ports: [{port: 443}]
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: billing-in, namespace: prod}
spec:
  podSelector: {matchLabels: {app: billing}}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: 198.51.100.0/24}}]
    ports: [{port: 8080}]
  - from: [{podSelector: {}}]
---
apiVersion: security.istio.io/v1
kind: AuthorizationPolicy
metadata: {name: no-lab, namespace: prod}
spec:
  selector: {matchLabels: {app: db}}
  action: DENY
  rules: [{from: [{source: {ipBlocks: [203.0.113.0/24]}}]}]
---
apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: web-no-scanner, namespace: dev}
spec:
  endpointSelector: {matchLabels: {app: web}}
  ingressDeny: [{fromCIDR: [198.51.100.66/32]}]
  ingress: [{fromCIDR: [0.0.0.0/0]}]
---
apiVersion: security.istio.io/v1
kind: PeerAuthentication
metadata: {name: default, namespace: prod}
spec: {mtls: {mode: STRICT}}
"#;
    let cfg = mesh_from_manifests(&format!("{}\n---\n{policies}", cases::WORLD), IndexSettings::default()).unwrap();
    let (state, _) = MeshState::from_config(&cfg);
    let mut maps = Maps::default();
    for (node, index) in NODES {
        let c = compile(&state, node, index, &mut Identities::new());
        assert_eq!(c.skipped_pairs, 0);
        maps.ipcache.extend(c.ipcache);
        maps.world.extend(c.world);
        maps.policy.extend(c.entries);
    }
    assert!(maps.world.len() >= 2 * 6, "a world entry per named prefix and node: {:?}", maps.world.keys());
    let outside = ["192.0.2.1", "192.0.2.200", "198.51.100.7", "198.51.100.66", "203.0.113.9", "8.8.8.8", "10.99.0.1", "0.0.0.1"];
    let (mut failures, mut denials) = (Vec::new(), 0);
    for w in state.workloads().filter(|w| state.workload_by_ip(w.address()).is_some_and(|o| o.uid == w.uid)) {
        let node = node_index(&w.node);
        for ext in outside {
            let ext: IpAddr = ext.parse().unwrap();
            for port in [443, 8080, 80, 1, 65535] {
                let out = engine::Connection { protocol: L4Protocol::Tcp, src_ip: w.address(), peer: None, dst_ip: ext, dst_port: port };
                let engine_out = !engine::network(&state, w, Direction::Egress, &out).allowed;
                let inc = engine::Connection { protocol: L4Protocol::Tcp, src_ip: ext, peer: None, dst_ip: w.address(), dst_port: port };
                let engine_in = !engine::ingress(&state, w, &inc).allowed();
                let (k_out, k_in) = (maps.denies(node, w.address(), ext, port), maps.denies(node, ext, w.address(), port));
                denials += k_out as usize + k_in as usize;
                if k_out != engine_out {
                    failures.push(format!("{}/{} -> {ext}:{port}: engine denies {engine_out}", w.namespace, w.name));
                }
                if k_in != engine_in {
                    failures.push(format!("{ext} -> {}/{}:{port}: engine denies {engine_in}", w.namespace, w.name));
                }
            }
            // UDP, SCTP and the rest, both ways: the network policies.
            for (proto, l4) in [(IPPROTO_UDP, L4Protocol::Udp), (IPPROTO_SCTP, L4Protocol::Sctp), (PROTO_OTHER, L4Protocol::Any)] {
                let ports: &[u16] = if proto == PROTO_OTHER { &[0] } else { &[443, 8080, 53, 65535] };
                for &port in ports {
                    let out = engine::Connection { protocol: l4, src_ip: w.address(), peer: None, dst_ip: ext, dst_port: port };
                    let inc = engine::Connection { protocol: l4, src_ip: ext, peer: None, dst_ip: w.address(), dst_port: port };
                    let engine_out = !engine::network(&state, w, Direction::Egress, &out).allowed;
                    let engine_in = !engine::network(&state, w, Direction::Ingress, &inc).allowed;
                    let k_out = maps.denies_proto(proto, node, w.address(), ext, port);
                    let k_in = maps.denies_proto(proto, node, ext, w.address(), port);
                    denials += k_out as usize + k_in as usize;
                    if (k_out, k_in) != (engine_out, engine_in) {
                        failures.push(format!(
                            "{}/{} <-> {ext}:{port}/protocol {proto}: engine denies out {engine_out} in {engine_in}, kernel {k_out} {k_in}",
                            w.namespace, w.name
                        ));
                    }
                }
            }
            // HBONE from an address the node does not know may carry a
            // certificate the proxy accepts (STRICT denies plaintext
            // only): the kernel never refuses it.
            if maps.denies_every_port(node, ext, w.address()) {
                failures.push(format!("{ext} -> {}/{}: HBONE refused for a source without identity", w.namespace, w.name));
            }
        }
    }
    assert!(failures.is_empty(), "the kernel disagrees with the engine:\n{}", failures.join("\n"));
    assert!(denials > 50, "the scenarios exercise the world entries: {denials} kernel denials");
}

/// UDP to a service address: the node's service table picks the endpoint
/// after the datagram left the pod, so the sender's egress is decided at
/// the service address when it is the same for every endpoint (all
/// refused: a deny there; all allowed: nothing), and a sender whose egress
/// allows some endpoints and not others stays in the nftables table,
/// which sees the endpoint.
#[test]
fn udp_to_a_service_is_refused_when_every_endpoint_is_and_left_to_nftables_when_they_differ() {
    let policies = r#"
apiVersion: v1
kind: Service
metadata: {name: billing, namespace: prod}
spec: {clusterIP: 10.96.5.1, selector: {app: billing}, ports: [{name: dns, protocol: UDP, port: 53}]}
---
apiVersion: v1
kind: Service
metadata: {name: db, namespace: prod}
spec: {clusterIP: 10.96.5.2, selector: {app: db}, ports: [{name: dns, protocol: UDP, port: 53}]}
---
apiVersion: v1
kind: Service
metadata: {name: backend, namespace: prod}
spec: {clusterIP: 10.96.5.3, selector: {tier: backend}, ports: [{name: dns, protocol: UDP, port: 53}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: only-billing, namespace: plain}
spec:
  podSelector: {matchLabels: {app: outsider}}
  policyTypes: [Egress]
  egress:
  - to: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: prod}}, podSelector: {matchLabels: {app: billing}}}]
    ports: [{protocol: UDP, port: 53}]
"#;
    let cfg = mesh_from_manifests(&format!("{}\n---\n{policies}", cases::WORLD), IndexSettings::default()).unwrap();
    let (state, _) = MeshState::from_config(&cfg);
    let c = compile(&state, "node1", 1, &mut Identities::new());
    let outsider = state.workloads().find(|w| w.name == "outsider").unwrap().address();
    let IpAddr::V4(outsider4) = outsider else { panic!("IPv4") };
    let vip = |name: &str| -> IpAddr { state.services().find(|s| s.name == name).unwrap().addresses[0].address };
    let mut maps = Maps::default();
    maps.ipcache.extend(c.ipcache.clone());
    maps.world.extend(c.world.clone());
    maps.policy.extend(c.entries.clone());
    assert!(maps.denies_proto(IPPROTO_UDP, 1, outsider, vip("db"), 53), "every endpoint of db is refused: the service address is");
    assert!(!maps.denies_proto(IPPROTO_UDP, 1, outsider, vip("billing"), 53), "billing's only endpoint is allowed");
    assert!(!maps.denies_proto(IPPROTO_UDP, 1, outsider, vip("backend"), 53), "backend's endpoints differ: no say at the address");
    assert!(c.left_to_nftables.contains(&outsider4), "... so the sender stays in the nftables table: {:?}", c.left_to_nftables);
    let legacy = state.workloads().find(|w| w.name == "legacy").unwrap().address();
    let IpAddr::V4(legacy4) = legacy else { panic!("IPv4") };
    assert!(!c.left_to_nftables.contains(&legacy4), "a pod the map decides exactly is the programs' alone");
}
