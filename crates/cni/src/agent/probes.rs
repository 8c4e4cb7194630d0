//! Kubelet probes of meshed pods under STRICT mTLS (Istio's way): in the
//! node's network namespace, a connection the node itself opens (only
//! locally made packets take the output hook) to a meshed pod's address
//! leaves with source [`PROBE_SOURCE`]; the pod's capture lets that source
//! reach the app directly (`crate::capture::ruleset`). Other pods' traffic
//! is forwarded, never output, so it is never rewritten; a pod that forges
//! the source gets no reply (replies go to the node, which answers only
//! connections it made).

use crate::capture::PROBE_SOURCE;
use crate::cmd::{run, CmdError};
use std::collections::BTreeSet;
use std::net::Ipv4Addr;

pub const TABLE: &str = "slipstream_probes";
/// The packet mark that asks for the rewrite: a bit kube-proxy (0x4000,
/// 0x8000) and Calico/Cilium's usual bits leave alone.
pub const MARK: u32 = 0x0020_0000;

/// The whole table with these meshed pods' addresses, replacing what was.
pub fn ruleset(meshed: &BTreeSet<Ipv4Addr>) -> String {
    let elements = if meshed.is_empty() {
        String::new()
    } else {
        format!("    elements = {{ {} }}\n", meshed.iter().map(Ipv4Addr::to_string).collect::<Vec<_>>().join(", "))
    };
    format!(
        r#"table ip {TABLE} {{}}
delete table ip {TABLE}
table ip {TABLE} {{
  set meshed {{
    type ipv4_addr;
{elements}  }}
  chain output {{
    type route hook output priority mangle; policy accept;
    ip daddr @meshed meta l4proto tcp ct state new meta mark set meta mark | {MARK:#010x}
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    meta mark & {MARK:#010x} == {MARK:#010x} snat ip to {PROBE_SOURCE}
  }}
}}
"#
    )
}

/// Installs the table in this process's network namespace (the node's).
pub fn apply(meshed: &BTreeSet<Ipv4Addr>) -> Result<(), CmdError> {
    run(&["nft", "-f", "-"], Some(&ruleset(meshed))).map(|_| ())
}

/// Removes it (uninstall), and the node proxy's network-policy table of
/// the same namespace (the proxy, stopping too, leaves it for its next
/// start: only an uninstall takes it away).
pub fn remove() -> Result<(), CmdError> {
    let netpol = slipstream_core::abi::NETPOL_TABLE;
    run(
        &["nft", "-f", "-"],
        Some(&format!("table ip {TABLE} {{}}\ndelete table ip {TABLE}\ntable inet {netpol} {{}}\ndelete table inet {netpol}\n")),
    )
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_nodes_own_new_connections_to_meshed_pods_are_rewritten() {
        let ips: BTreeSet<Ipv4Addr> = ["10.78.1.5".parse().unwrap(), "10.78.1.7".parse().unwrap()].into();
        let r = ruleset(&ips);
        assert!(r.starts_with("table ip slipstream_probes {}\ndelete table ip slipstream_probes\n"), "replaced in one transaction");
        assert!(r.contains("elements = { 10.78.1.5, 10.78.1.7 }"));
        assert!(r.contains("type route hook output"), "output only: forwarded traffic of other pods never matches");
        assert!(r.contains("snat ip to 169.254.7.127"));
        assert!(!ruleset(&BTreeSet::new()).contains("elements"), "an empty set is valid nft");
    }
}
