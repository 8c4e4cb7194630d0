//! Traffic capture for meshed pods with nftables, installed inside the pod's
//! network namespace before its containers start (the CNI plugin's role).
//! This is the one place that knows how capture is done: the node agent on
//! Kubernetes and the local cluster's agent both install it from here; the
//! eBPF datapath replaces it behind the same functions.
//!
//! Modeled on ztunnel's in-pod rules: the pod's outbound TCP goes to the
//! node proxy's listener on 127.0.0.1:15001, plaintext inbound to :15006,
//! HBONE to the proxy's :15008 listener untouched; the proxy's own sockets
//! carry mark 0x539 (skip capture) or 0x111 (transparent inbound, whose
//! replies are routed back to the proxy through table 100).
//!
//! IPv6: the local cluster addresses pods over IPv4 only, yet every pod
//! interface has an IPv6 link-local address and apps listen on `[::]`.
//! Capture and policy are IPv4, so IPv6 would be a side door around STRICT
//! mTLS: a meshed pod's eth0 refuses IPv6 in both directions (TCP gets a
//! reset so clients fail at once, everything else is dropped). The resets
//! that refusal sends leave through the output hook too, so bare resets
//! pass: a 20-byte TCP header with no options and no payload (IPv6 payload
//! length 20, no extension header), RST set and none of SYN, FIN, PSH, URG.
//! Neighbour discovery passes too (without it no SYN ever arrives to be
//! reset and clients wait for a timeout). Neither carries a byte to or from
//! an app. Loopback (`::1`) inside the pod is untouched.

//! Kubelet probes (Kubernetes only): the node agent rewrites the source of
//! the node's own connections to a meshed pod to [`PROBE_SOURCE`]
//! (`crate::agent::probes`), and the pod's rules let that source reach the
//! app directly. A pod cannot borrow it: its replies go to the pod's
//! gateway, the node, which answers only connections it made itself.

use crate::cmd::{ip_batch, run_in, CmdError};
use std::net::Ipv4Addr;
use std::path::Path;
// The marks, ports and table are shared with the node proxy (and later the
// eBPF programs); they are defined once, in core's ABI module.
use slipstream_core::abi::{HBONE_PORT, INBOUND_PLAINTEXT_PORT, INPOD_MARK, MARK_MASK, OUTBOUND_PORT, PROXY_MARK, ROUTE_TABLE};

pub const TABLE: &str = "slipstream_mesh";

/// The source kubelet probes arrive from (Istio's choice, so a cluster that
/// runs either mesh reads the same address in its pods).
pub const PROBE_SOURCE: Ipv4Addr = Ipv4Addr::new(169, 254, 7, 127);

/// The pod's capture rules; with `probes`, connections from that source
/// reach the app without the proxy (kubelet probes, rewritten at the node).
pub fn ruleset(probes: Option<Ipv4Addr>) -> String {
    let probe_rule = probes.map(|ip| format!("    iifname \"eth0\" ip saddr {ip} meta l4proto tcp return\n")).unwrap_or_default();
    format!(
        r#"table inet {TABLE} {{}}
delete table inet {TABLE}
table inet {TABLE} {{
  chain prerouting {{
    type nat hook prerouting priority dstnat; policy accept;
{probe_rule}    iifname "eth0" meta nfproto ipv4 meta l4proto tcp tcp dport != {HBONE_PORT} redirect to :{INBOUND_PLAINTEXT_PORT}
  }}
  chain output {{
    type nat hook output priority -100; policy accept;
    meta mark & {MARK_MASK:#x} == {PROXY_MARK:#x} return
    meta mark & {MARK_MASK:#x} == {INPOD_MARK:#x} return
    oifname "lo" return
    fib daddr type local return
    meta nfproto ipv4 meta l4proto tcp redirect to :{OUTBOUND_PORT}
  }}
  chain ipv6_in {{
    type filter hook input priority filter; policy accept;
    iifname "eth0" icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept
    iifname "eth0" meta nfproto ipv6 meta l4proto tcp counter reject with tcp reset
    iifname "eth0" meta nfproto ipv6 counter drop
  }}
  chain ipv6_out {{
    type filter hook output priority filter; policy accept;
    oifname "eth0" icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept
    oifname "eth0" ip6 nexthdr tcp ip6 length 20 tcp flags & (fin | syn | rst | psh | urg) == rst accept
    oifname "eth0" meta nfproto ipv6 meta l4proto tcp counter reject with tcp reset
    oifname "eth0" meta nfproto ipv6 counter drop
  }}
  chain output_route {{
    type route hook output priority mangle; policy accept;
    meta mark & {MARK_MASK:#x} == {INPOD_MARK:#x} ct mark set {INPOD_MARK:#x}
    ct mark {INPOD_MARK:#x} meta mark set {INPOD_MARK:#x}
  }}
}}
"#
    )
}

/// Installs capture in a pod's network namespace (idempotent: the table
/// is replaced in one transaction).
pub fn enable(pod_netns: &Path, probes: Option<Ipv4Addr>) -> Result<(), CmdError> {
    run_in(pod_netns, &["nft", "-f", "-"], Some(&ruleset(probes)))?;
    reply_route(pod_netns)
}

/// Whether the pod's namespace has its capture table.
pub fn is_enabled(pod_netns: &Path) -> Result<bool, CmdError> {
    Ok(run_in(pod_netns, &["nft", "list", "tables"], None)?.lines().any(|l| l.trim() == format!("table inet {TABLE}")))
}

/// What the eBPF datapath needs in a meshed pod's namespace besides its
/// programs (which also refuse IPv6 there, so no nftables rule is left in
/// the pod): the reply route of transparent inbound connections.
/// `tcp_fwmark_accept` makes the app's side of a connection
/// the proxy opened with INPOD_MARK carry that mark too, so its replies
/// take the reply route back to the proxy, and `fwmark_reflect` does the
/// same for what the kernel answers with no socket (the reset of a closed
/// port); nftables capture restores the mark from conntrack instead.
///
/// `sysctl_net` is where this process sees `/proc/sys/net` writable (a
/// container's own /proc/sys is read-only: the node agent is given the
/// node's, [`SYSCTL_NET`] elsewhere); what it shows follows the network
/// namespace of the thread that opens it, the pod's here.
pub fn enable_ebpf_support(pod_netns: &Path, sysctl_net: &Path) -> Result<(), CmdError> {
    set_ebpf_sysctls(pod_netns, true, sysctl_net)?;
    reply_route(pod_netns)
}

/// The sysctls [`enable_ebpf_support`] sets, in the pod's namespace
/// (under `/proc/sys/net`).
pub const EBPF_SYSCTLS: [&str; 2] = ["ipv4/tcp_fwmark_accept", "ipv4/fwmark_reflect"];

/// Where a process sees its network namespace's sysctls.
pub const SYSCTL_NET: &str = "/proc/sys/net";

/// Sets (`on`) or puts back to the kernel's default of a new namespace
/// (0) the sysctls of [`EBPF_SYSCTLS`] in a pod's namespace: written from
/// a thread inside it, so no `sysctl` program is needed in the image.
pub fn set_ebpf_sysctls(pod_netns: &Path, on: bool, sysctl_net: &Path) -> Result<(), CmdError> {
    let value = if on { "1\n" } else { "0\n" };
    crate::cmd::in_netns(pod_netns, "setting net.ipv4.tcp_fwmark_accept and net.ipv4.fwmark_reflect", || {
        for name in EBPF_SYSCTLS {
            let path = sysctl_net.join(name);
            std::fs::write(&path, value).map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        }
        Ok(())
    })
}

/// Reads the sysctls of [`EBPF_SYSCTLS`] in a pod's namespace (tests and
/// the uninstall check).
pub fn ebpf_sysctls(pod_netns: &Path, sysctl_net: &Path) -> Result<Vec<String>, CmdError> {
    crate::cmd::in_netns(pod_netns, "reading net.ipv4.tcp_fwmark_accept and net.ipv4.fwmark_reflect", || {
        EBPF_SYSCTLS.iter().map(|n| std::fs::read_to_string(sysctl_net.join(n)).map(|v| v.trim().to_string())).collect()
    })
}

/// Takes nftables capture out of a pod's namespace (a running pod leaving
/// the mesh); its reply route stays, unused (a pod that comes back needs it
/// again; [`remove_reply_route`] takes it away on uninstall).
pub fn disable(pod_netns: &Path) -> Result<(), CmdError> {
    run_in(pod_netns, &["nft", "-f", "-"], Some("table inet slipstream_mesh {}\ndelete table inet slipstream_mesh\n")).map(|_| ())
}

/// Removes the reply route and its rule (uninstall: nothing of ours is
/// left in the pod). Safe to repeat.
pub fn remove_reply_route(pod_netns: &Path) -> Result<(), CmdError> {
    let _ = ip_batch(pod_netns, &[format!("rule del fwmark {INPOD_MARK:#x}/{MARK_MASK:#x} pref 32764 lookup {ROUTE_TABLE}")]);
    ip_batch(pod_netns, &[format!("route flush table {ROUTE_TABLE}")])
}

fn reply_route(pod_netns: &Path) -> Result<(), CmdError> {
    // Idempotent: a pod enrolled again (its namespace labelled back) has
    // the rule already.
    let _ = ip_batch(pod_netns, &[format!("rule del fwmark {INPOD_MARK:#x}/{MARK_MASK:#x} pref 32764 lookup {ROUTE_TABLE}")]);
    ip_batch(
        pod_netns,
        &[
            format!("rule add fwmark {INPOD_MARK:#x}/{MARK_MASK:#x} pref 32764 lookup {ROUTE_TABLE}"),
            format!("route replace local 0.0.0.0/0 dev lo table {ROUTE_TABLE}"),
        ],
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn ruleset_replaces_atomically_and_skips_proxy_sockets() {
        let r = super::ruleset(None);
        assert!(r.starts_with("table inet slipstream_mesh {}\ndelete table inet slipstream_mesh\n"));
        assert!(r.contains("meta mark & 0xfff == 0x539 return"));
        assert!(r.contains("tcp dport != 15008 redirect to :15006"));
        assert!(r.contains("redirect to :15001"));
    }

    #[test]
    fn probes_pass_only_from_their_source_and_only_with_it() {
        assert!(!super::ruleset(None).contains("169.254"), "the local cluster's pods are unchanged");
        let r = super::ruleset(Some(super::PROBE_SOURCE));
        let pre: Vec<&str> = r.lines().skip_while(|l| !l.contains("chain prerouting")).take(4).collect();
        assert_eq!(pre[2], "    iifname \"eth0\" ip saddr 169.254.7.127 meta l4proto tcp return", "before the redirect: {pre:?}");
        assert!(pre[3].contains("redirect to :15006"));
        assert!(!r.lines().skip_while(|l| !l.contains("chain output")).any(|l| l.contains("169.254")), "outbound capture has no exception");
    }

    #[test]
    fn ipv6_is_refused_both_ways_on_the_pod_interface_but_not_on_loopback() {
        let r = super::ruleset(None);
        for dir in ["iifname", "oifname"] {
            assert!(r.contains(&format!("{dir} \"eth0\" meta nfproto ipv6 meta l4proto tcp counter reject with tcp reset")), "{dir}");
            assert!(r.contains(&format!("{dir} \"eth0\" meta nfproto ipv6 counter drop")), "{dir}");
        }
        assert!(!r.contains("\"lo\" meta nfproto ipv6"), "loopback IPv6 inside the pod stays usable");
        // Only bare resets leave: no payload (payload length = a TCP header
        // without options), no SYN/FIN/PSH/URG, so nothing rides on them.
        let out: Vec<&str> = r.lines().filter(|l| l.contains("oifname \"eth0\"") && l.trim_end().ends_with("accept")).collect();
        assert_eq!(
            out,
            [
                "    oifname \"eth0\" icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } accept",
                "    oifname \"eth0\" ip6 nexthdr tcp ip6 length 20 tcp flags & (fin | syn | rst | psh | urg) == rst accept",
            ],
            "the only IPv6 the pod may send on eth0"
        );
    }
}
