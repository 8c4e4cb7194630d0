//! Pure planning: addresses, placement, and the text of the files and rules
//! the cluster writes. No I/O here, so all of it is unit-tested.

use slipstream_k8s::{IntOrString, PodSpec, Protocol, ServicePort};
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::net::Ipv4Addr;

pub const MAX_NODES: usize = 250;
/// Pods one node can hold: kubelet's default `maxPods`. Applies beyond
/// nodes x this are refused before anything is created.
pub const MAX_PODS_PER_NODE: usize = 110;
// A node's pods take addresses .2 to .254 of its /24 (see `next_pod_ip`).
const _: () = assert!(MAX_PODS_PER_NODE <= 253);
/// Every node-side veth has this MAC, and every pod's gateway resolves to it.
pub const GATEWAY_MAC: &str = "ee:ee:ee:ee:ee:ee";
pub const GATEWAY_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
pub const CLUSTER_DOMAIN: &str = "cluster.local";
pub const NFT_TABLE: &str = "slipstream_svc";
const FIRST_VIP: u32 = u32::from_be_bytes([10, 96, 0, 10]);
const LAST_VIP: u32 = u32::from_be_bytes([10, 96, 255, 254]);

/// Node `index` is 1-based: node1 is index 1.
pub fn node_name(index: usize) -> String {
    format!("node{index}")
}

pub fn node_ip(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(172, 18, (index / 256) as u8, (index % 256) as u8)
}

pub const NODE_PREFIX_LEN: u8 = 16;

/// Control plane replicas a local cluster may run.
pub const MAX_CONTROL_REPLICAS: usize = 3;

/// Control plane replica `replica` (1-based) on the node network:
/// `172.18.255.<replica>`, outside the nodes' `172.18.0.0/24`.
pub fn control_ip(replica: usize) -> Ipv4Addr {
    Ipv4Addr::new(172, 18, 255, replica as u8)
}

/// Where node proxies reach the control plane (delta xDS and the CA).
pub fn control_addr(replica: usize) -> std::net::SocketAddr {
    std::net::SocketAddr::from((control_ip(replica), slipstream_core::abi::CONTROL_PLANE_PORT))
}

pub fn pod_cidr(index: usize) -> (Ipv4Addr, u8) {
    (Ipv4Addr::new(10, 244, index as u8, 0), 24)
}

pub fn format_cidr((ip, len): (Ipv4Addr, u8)) -> String {
    format!("{ip}/{len}")
}

/// Whether `ip` is inside the service VIP range.
pub fn is_service_ip(ip: Ipv4Addr) -> bool {
    let o = ip.octets();
    o[0] == 10 && o[1] == 96
}

/// The first free pod address of node `index` (`.2` to `.254`).
pub fn next_pod_ip(index: usize, used: &BTreeSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    (2..=254u8).map(|h| Ipv4Addr::new(10, 244, index as u8, h)).find(|ip| !used.contains(ip))
}

/// The first free service VIP.
pub fn next_vip(used: &BTreeSet<Ipv4Addr>) -> Option<Ipv4Addr> {
    (FIRST_VIP..=LAST_VIP).map(Ipv4Addr::from).find(|ip| !used.contains(ip))
}

/// Name of the node-side veth of a pod: unique per node because pod IPs are.
pub fn pod_veth(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("vp{}", o[3])
}

/// A locally administered MAC derived from the pod IP, so neighbours can be
/// static in both directions.
pub fn pod_mac(ip: Ipv4Addr) -> String {
    let o = ip.octets();
    format!("02:53:{:02x}:{:02x}:{:02x}:{:02x}", o[0], o[1], o[2], o[3])
}

/// Where a new pod goes: its `nodeName` if set (must exist), otherwise the
/// node with the fewest pods, lowest index first. `loads[i]` is node i+1's.
pub fn place(nodes: &[String], loads: &[usize], node_name: Option<&str>) -> Result<usize, String> {
    if let Some(n) = node_name {
        return nodes
            .iter()
            .position(|x| x == n)
            .ok_or_else(|| format!("node {n:?} does not exist (the cluster has {})", nodes.join(", ")));
    }
    loads.iter().enumerate().min_by_key(|(i, l)| (**l, *i)).map(|(i, _)| i).ok_or_else(|| "the cluster has no nodes".to_string())
}

/// Resolves a service port's target on one pod: a number, or the name of a
/// container port of that pod (`None` when the pod does not declare it,
/// which leaves the pod out of that port's endpoints, as in Kubernetes).
pub fn resolve_target_port(sp: &ServicePort, spec: &PodSpec) -> Option<u16> {
    match sp.target() {
        IntOrString::Int(p) => u16::try_from(p).ok(),
        IntOrString::Str(name) => spec
            .containers
            .iter()
            .flat_map(|c| c.ports.iter())
            .find(|p| p.name.as_deref() == Some(name.as_str()) && p.protocol == sp.protocol)
            .and_then(|p| u16::try_from(p.container_port).ok()),
    }
}

/// One service as the hosts file sees it.
#[derive(Debug, Clone)]
pub struct HostsEntry {
    pub namespace: String,
    pub name: String,
    /// The VIP, or every ready endpoint for a headless service.
    pub addresses: Vec<Ipv4Addr>,
}

/// The `/etc/hosts` of a pod: itself, then every service under the names a
/// Kubernetes pod can use (short names only for its own namespace).
pub fn hosts_file(pod_ns: &str, pod_name: &str, pod_ip: Ipv4Addr, services: &[HostsEntry]) -> String {
    let mut s = String::from("# Written by slipstream: this pod's view of the cluster's names.\n");
    s.push_str("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n");
    let _ = writeln!(s, "{pod_ip}\t{pod_name}");
    for svc in services {
        let fqdn = format!("{}.{}.svc.{CLUSTER_DOMAIN}", svc.name, svc.namespace);
        let mut names = vec![fqdn, format!("{}.{}.svc", svc.name, svc.namespace), format!("{}.{}", svc.name, svc.namespace)];
        if svc.namespace == pod_ns {
            names.push(svc.name.clone());
        }
        for ip in &svc.addresses {
            let _ = writeln!(s, "{ip}\t{}", names.join(" "));
        }
    }
    s
}

pub fn resolv_conf(pod_ns: &str) -> String {
    // No DNS server runs in the local cluster: every name is in /etc/hosts.
    // The nameserver is loopback, where nothing listens, so a lookup of an
    // unknown name fails at once instead of timing out.
    format!(
        "# Written by slipstream: names are in /etc/hosts.\nsearch {pod_ns}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}\nnameserver 127.0.0.1\noptions ndots:5 timeout:1 attempts:1\n"
    )
}

/// One service port as nftables DNATs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRule {
    pub vip: Ipv4Addr,
    pub port: u16,
    pub protocol: Protocol,
    pub endpoints: Vec<(Ipv4Addr, u16)>,
}

/// The nftables transaction that replaces the service table atomically
/// (create-if-missing, delete, recreate, in one `nft -f`).
pub fn nft_ruleset(rules: &[ServiceRule]) -> String {
    let mut s = String::new();
    let t = NFT_TABLE;
    let _ = writeln!(s, "table ip {t} {{}}\ndelete table ip {t}\ntable ip {t} {{");
    // Declare the jump target first; `dstnat` is only a keyword in
    // prerouting, so output uses its number (-100).
    s.push_str("  chain services {}\n");
    s.push_str("  chain prerouting { type nat hook prerouting priority dstnat; policy accept; jump services; }\n");
    s.push_str("  chain output { type nat hook output priority -100; policy accept; jump services; }\n");
    s.push_str("  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n");
    // A pod reaching itself through its own service: without masquerade the
    // reply would short-cut through its loopback and never be un-NATed.
    let hairpins: BTreeSet<Ipv4Addr> = rules.iter().flat_map(|r| r.endpoints.iter().map(|e| e.0)).collect();
    for ip in &hairpins {
        let _ = writeln!(s, "    ct status dnat ip saddr {ip} ip daddr {ip} masquerade");
    }
    s.push_str("  }\n  chain services {\n");
    let active: Vec<(usize, &ServiceRule)> = rules.iter().enumerate().filter(|(_, r)| !r.endpoints.is_empty()).collect();
    for (i, r) in &active {
        let proto = proto_name(r.protocol);
        let _ = writeln!(s, "    ip daddr {} {proto} dport {} jump svc{i}", r.vip, r.port);
    }
    s.push_str("  }\n");
    for (i, r) in &active {
        let proto = proto_name(r.protocol);
        if r.endpoints.len() == 1 {
            let (ip, port) = r.endpoints[0];
            let _ = writeln!(s, "  chain svc{i} {{ meta l4proto {proto} dnat to {ip}:{port}; }}");
            continue;
        }
        let _ = write!(s, "  chain svc{i} {{ numgen random mod {} vmap {{ ", r.endpoints.len());
        for j in 0..r.endpoints.len() {
            let _ = write!(s, "{}{j} : jump svc{i}ep{j}", if j > 0 { ", " } else { "" });
        }
        s.push_str(" }; }\n");
        for (j, (ip, port)) in r.endpoints.iter().enumerate() {
            let _ = writeln!(s, "  chain svc{i}ep{j} {{ meta l4proto {proto} dnat to {ip}:{port}; }}");
        }
    }
    s.push_str("}\n");
    s
}

fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::UDP => "udp",
        _ => "tcp",
    }
}

/// Whether a pod of an older template is kept for now: it is ready (it
/// serves) and belongs to a Deployment whose pods of the current template
/// are not all ready yet. A bare pod, a pod of a deleted Deployment, a
/// replica beyond a lowered count, a pod that is not ready (it serves
/// nothing: a template that never started is replaced at once), or one
/// whose Deployment has every current pod ready is stopped.
pub fn rollout_holds(
    old: &slipstream_k8s::expand::PodInstance,
    desired: &[slipstream_k8s::expand::PodInstance],
    ready: impl Fn(&str, &str) -> bool,
) -> bool {
    let Some(owner) = &old.owner else { return false };
    if !ready(&old.namespace, &old.name) {
        return false;
    }
    let mut current = desired.iter().filter(|p| p.namespace == old.namespace && p.owner.as_ref() == Some(owner)).peekable();
    current.peek().is_some_and(|p| p.spec_hash != old.spec_hash) && !current.all(|p| ready(&p.namespace, &p.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rollout_keeps_old_pods_until_the_new_ones_are_ready() {
        use slipstream_k8s::expand::PodInstance;
        let pod = |name: &str, owner: Option<&str>, hash: &str| PodInstance {
            namespace: "ns".into(),
            name: name.into(),
            labels: Default::default(),
            annotations: Default::default(),
            spec: Default::default(),
            owner: owner.map(String::from),
            spec_hash: hash.into(),
        };
        let old = pod("web-a-0", Some("web"), "a");
        let desired = vec![pod("web-b-0", Some("web"), "b"), pod("web-b-1", Some("web"), "b"), pod("other-c-0", Some("other"), "c")];
        // (which of the new pods are ready, held)
        let cases: &[(&[&str], bool)] = &[(&[], true), (&["web-b-0"], true), (&["web-b-0", "web-b-1"], false)];
        for (ready, held) in cases {
            assert_eq!(rollout_holds(&old, &desired, |_, n| n == "web-a-0" || ready.contains(&n)), *held, "ready {ready:?}");
        }
        // Only the old pods are ready from here on.
        let old_ready = |_: &str, n: &str| !n.starts_with("web-b");
        // The old pod itself is not ready: it serves nothing, stop it.
        assert!(!rollout_holds(&old, &desired, |_, _| false));
        // The Deployment is gone: nothing to wait for.
        assert!(!rollout_holds(&old, &desired[2..], old_ready));
        // A bare pod, and a replica beyond a lowered count (same template).
        assert!(!rollout_holds(&pod("solo", None, "a"), &desired, old_ready));
        assert!(!rollout_holds(&pod("web-b-2", Some("web"), "b"), &desired, |_, n| n == "web-b-2"));
        // Another namespace's Deployment of the same name does not count.
        let mut elsewhere = desired[0].clone();
        elsewhere.namespace = "other-ns".into();
        assert!(!rollout_holds(&old, &[elsewhere], old_ready));
    }

    #[test]
    fn addresses() {
        assert_eq!(node_ip(1), Ipv4Addr::new(172, 18, 0, 1));
        assert_eq!(format_cidr(pod_cidr(2)), "10.244.2.0/24");
        let mut used = BTreeSet::new();
        assert_eq!(next_pod_ip(1, &used), Some(Ipv4Addr::new(10, 244, 1, 2)));
        used.insert(Ipv4Addr::new(10, 244, 1, 2));
        assert_eq!(next_pod_ip(1, &used), Some(Ipv4Addr::new(10, 244, 1, 3)));
        let full: BTreeSet<_> = (2..=254u8).map(|h| Ipv4Addr::new(10, 244, 1, h)).collect();
        assert_eq!(next_pod_ip(1, &full), None);
        assert_eq!(next_vip(&BTreeSet::new()), Some(Ipv4Addr::new(10, 96, 0, 10)));
        assert!(is_service_ip(Ipv4Addr::new(10, 96, 3, 4)));
        assert!(!is_service_ip(Ipv4Addr::new(10, 244, 3, 4)));
        assert_eq!(pod_veth(Ipv4Addr::new(10, 244, 1, 17)), "vp17");
        assert_eq!(pod_mac(Ipv4Addr::new(10, 244, 1, 17)), "02:53:0a:f4:01:11");
    }

    #[test]
    fn placement() {
        let nodes = vec!["node1".to_string(), "node2".to_string()];
        assert_eq!(place(&nodes, &[0, 0], None), Ok(0));
        assert_eq!(place(&nodes, &[1, 0], None), Ok(1));
        assert_eq!(place(&nodes, &[1, 1], None), Ok(0));
        assert_eq!(place(&nodes, &[0, 5], Some("node2")), Ok(1));
        let e = place(&nodes, &[0, 0], Some("node9")).unwrap_err();
        assert_eq!(e, "node \"node9\" does not exist (the cluster has node1, node2)");
    }

    #[test]
    fn hosts_names_depend_on_namespace() {
        let svcs = vec![
            HostsEntry { namespace: "default".into(), name: "echo".into(), addresses: vec![Ipv4Addr::new(10, 96, 0, 10)] },
            HostsEntry { namespace: "other".into(), name: "db".into(), addresses: vec![Ipv4Addr::new(10, 96, 0, 11)] },
        ];
        let h = hosts_file("default", "client", Ipv4Addr::new(10, 244, 1, 2), &svcs);
        assert!(h.contains("10.244.1.2\tclient\n"));
        assert!(h.contains("10.96.0.10\techo.default.svc.cluster.local echo.default.svc echo.default echo\n"));
        assert!(h.contains("10.96.0.11\tdb.other.svc.cluster.local db.other.svc db.other\n"), "{h}");
    }

    #[test]
    fn nft_rules() {
        let rules = vec![
            ServiceRule {
                vip: Ipv4Addr::new(10, 96, 0, 10),
                port: 80,
                protocol: Protocol::TCP,
                endpoints: vec![(Ipv4Addr::new(10, 244, 1, 2), 8080), (Ipv4Addr::new(10, 244, 2, 2), 8080)],
            },
            ServiceRule { vip: Ipv4Addr::new(10, 96, 0, 11), port: 53, protocol: Protocol::UDP, endpoints: vec![] },
        ];
        let s = nft_ruleset(&rules);
        assert!(s.starts_with("table ip slipstream_svc {}\ndelete table ip slipstream_svc\n"));
        assert!(s.contains("ip daddr 10.96.0.10 tcp dport 80 jump svc0"));
        assert!(s.contains("numgen random mod 2 vmap { 0 : jump svc0ep0, 1 : jump svc0ep1 }"));
        assert!(s.contains("chain svc0ep1 { meta l4proto tcp dnat to 10.244.2.2:8080; }"));
        assert!(!s.contains("10.96.0.11"), "a service without endpoints gets no rule");
        assert!(s.contains("ct status dnat ip saddr 10.244.1.2 ip daddr 10.244.1.2 masquerade"));
    }

    #[test]
    fn named_target_ports() {
        let spec: PodSpec = serde_json::from_value(serde_json::json!({
            "containers": [{"name": "c", "command": ["x"], "ports": [{"name": "http", "containerPort": 8080}]}]
        }))
        .unwrap();
        let sp =
            |t: serde_json::Value| -> ServicePort { serde_json::from_value(serde_json::json!({"port": 80, "targetPort": t})).unwrap() };
        assert_eq!(resolve_target_port(&sp(serde_json::json!("http")), &spec), Some(8080));
        assert_eq!(resolve_target_port(&sp(serde_json::json!("grpc")), &spec), None);
        assert_eq!(resolve_target_port(&sp(serde_json::json!(9090)), &spec), Some(9090));
    }
}
