//! The cluster's network: fabric bridge, nodes, pod sandboxes, nftables.
//! Built with iproute2 and nft, each step in the namespace it concerns.

use super::cmd::{ip_batch, run, CmdError};
use crate::plan;
use std::net::Ipv4Addr;

/// Network namespaces whose names start with `prefix`.
pub fn list_netns(prefix: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir("/run/netns")
        .map(|rd| rd.flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|n| n.starts_with(prefix)).collect())
        .unwrap_or_default();
    v.sort();
    v
}

pub fn add_netns(name: &str) -> Result<(), CmdError> {
    run(&["ip", "netns", "add", name], None)?;
    ip_batch(Some(name), &["link set lo up".into()])
}

/// Deletes a namespace; every veth with an end inside goes with it.
pub fn del_netns(name: &str) -> Result<(), CmdError> {
    if !crate::names::netns_path(name).exists() {
        return Ok(());
    }
    run(&["ip", "netns", "del", name], None).map(|_| ())
}

pub fn sysctl(netns: &str, settings: &[(&str, &str)]) -> Result<(), CmdError> {
    let mut argv = vec!["ip", "netns", "exec", netns, "sysctl", "-q", "-w"];
    let kv: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    argv.extend(kv.iter().map(|s| s.as_str()));
    run(&argv, None).map(|_| ())
}

pub fn create_fabric(netns: &str) -> Result<(), CmdError> {
    add_netns(netns)?;
    ip_batch(Some(netns), &["link add fabric type bridge".into(), "link set fabric up".into()])?;
    // The fabric stands for the switch between machines, which runs no
    // firewall. When the host has loaded br_netfilter, a new namespace's
    // bridges pass every frame through the IP hooks (its
    // bridge-nf-call-* default to 1); the fabric has no rules, so that
    // is only cost, paid on every packet between nodes.
    if std::path::Path::new("/proc/sys/net/bridge/bridge-nf-call-iptables").exists() {
        sysctl(
            netns,
            &[
                ("net.bridge.bridge-nf-call-iptables", "0"),
                ("net.bridge.bridge-nf-call-ip6tables", "0"),
                ("net.bridge.bridge-nf-call-arptables", "0"),
            ],
        )?;
    }
    Ok(())
}

/// One node: a namespace plugged into the fabric bridge, forwarding on.
pub fn create_node(fabric: &str, netns: &str, name: &str, ip: Ipv4Addr) -> Result<(), CmdError> {
    add_netns(netns)?;
    // Create the pair inside the fabric, then move one end into the node.
    ip_batch(
        Some(fabric),
        &[
            format!("link add {name} type veth peer name eth0 netns {netns}"),
            format!("link set {name} master fabric"),
            format!("link set {name} up"),
        ],
    )?;
    ip_batch(Some(netns), &[format!("addr add {ip}/{} dev eth0", plan::NODE_PREFIX_LEN), "link set eth0 up".into()])?;
    sysctl(
        netns,
        &[
            ("net.ipv4.ip_forward", "1"),
            ("net.ipv4.conf.all.rp_filter", "0"),
            ("net.ipv4.conf.default.rp_filter", "0"),
            // Keep neighbour entries of pods that restart on a reused IP fresh.
            ("net.ipv4.conf.all.arp_ignore", "0"),
        ],
    )
}

/// Routes from one node to another node's pod CIDR.
/// Removes a route (absent is fine).
pub fn del_route(netns: &str, cidr: &str) -> Result<(), CmdError> {
    match ip_batch(Some(netns), &[format!("route del {cidr}")]) {
        Err(e) if e.to_string().contains("No such process") => Ok(()),
        r => r,
    }
}

pub fn route_to_node(netns: &str, cidr: &str, via: Ipv4Addr) -> Result<(), CmdError> {
    ip_batch(Some(netns), &[format!("route replace {cidr} via {via} dev eth0")])
}

/// A pod sandbox: its namespace, the veth to its node, addresses, routes
/// and static neighbours on both sides.
pub fn create_pod_network(node_netns: &str, pod_netns: &str, ip: Ipv4Addr) -> Result<(), CmdError> {
    add_netns(pod_netns)?;
    let veth = plan::pod_veth(ip);
    let pod_mac = plan::pod_mac(ip);
    ip_batch(
        Some(node_netns),
        &[
            format!("link add {veth} address {} type veth peer name eth0 address {pod_mac} netns {pod_netns}", plan::GATEWAY_MAC),
            format!("link set {veth} up"),
            format!("route replace {ip}/32 dev {veth} scope link"),
            format!("neigh replace {ip} lladdr {pod_mac} dev {veth} nud permanent"),
        ],
    )?;
    ip_batch(
        Some(pod_netns),
        &[
            format!("addr add {ip}/32 dev eth0"),
            "link set eth0 up".into(),
            format!("route add {} dev eth0 scope link", plan::GATEWAY_IP),
            format!("route add default via {} dev eth0", plan::GATEWAY_IP),
            format!("neigh replace {} lladdr {} dev eth0 nud permanent", plan::GATEWAY_IP, plan::GATEWAY_MAC),
        ],
    )
}

/// Removes a pod's network: its veth pair first (deleting `eth0` deletes
/// the node's end at once), then its namespace. The kernel frees a deleted
/// namespace only when nothing holds it any more (an orphaned TCP socket
/// in FIN_WAIT2 does, for up to a minute): its veth would keep its name in
/// the node until then, and a new pod given the same address could not be
/// wired.
pub fn delete_pod_network(pod_netns: &str) -> Result<(), CmdError> {
    if !crate::names::netns_path(pod_netns).exists() {
        return Ok(());
    }
    let veth = ip_batch(Some(pod_netns), &["link del eth0".into()]);
    del_netns(pod_netns)?;
    veth
}

/// Replaces the service table of a node (one atomic nft transaction).
pub fn apply_nft(node_netns: &str, ruleset: &str) -> Result<(), CmdError> {
    run(&["ip", "netns", "exec", node_netns, "nft", "-f", "-"], Some(ruleset)).map(|_| ())
}
