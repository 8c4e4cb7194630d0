//! The scenarios on Kubernetes (`--kubeconfig`): the local bench's names,
//! each a namespace made for the run, or why it cannot be measured there.

use crate::scenario::{Scenario, Setup, WAYPOINT};

/// The label that puts a namespace's pods in the mesh.
pub const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");

/// The label that keeps a namespace's pods on nftables capture where the
/// install runs the eBPF datapath (`slipstream_cni::enrol::DATAPATH_LABEL`).
pub const ON_NFTABLES: (&str, &str) = ("slipstream.io/datapath", "nftables");

const NONE: Scenario = Scenario {
    name: "none",
    description: "no mesh: a namespace without the ambient label, plain TCP between the pods, Services by kube-proxy",
    setup: Setup::Namespace { namespace: "bench-none", labels: &[] },
    l4_targets: false,
};

const L4_NFT: Scenario = Scenario {
    name: "l4-nft",
    description: "L4 mesh: the namespace labelled `istio.io/dataplane-mode=ambient` (and `slipstream.io/datapath=nftables`), node proxies carry the connection in mTLS (HBONE), capture by nftables",
    setup: Setup::Namespace { namespace: "bench-mesh", labels: &[AMBIENT, ON_NFTABLES] },
    l4_targets: true,
};

const L4_EBPF: Scenario = Scenario {
    name: "l4-ebpf",
    description: "L4 mesh with eBPF capture: the namespace labelled `istio.io/dataplane-mode=ambient` on an install with `datapath.mode=ebpf`, capture and L3/L4 policy by the kernel's programs, node proxies carry the connection in mTLS (HBONE)",
    setup: Setup::Namespace { namespace: "bench-ebpf", labels: &[AMBIENT] },
    l4_targets: true,
};

const L4_EBPF_OFF: Scenario = Scenario {
    name: "l4-ebpf",
    description: "L4 mesh with eBPF capture",
    setup: Setup::NotOnKubernetes {
        reason: "the install runs nftables capture (the chart's `datapath.mode`); install with `datapath.mode=ebpf` to measure it",
    },
    l4_targets: true,
};

const L7: Scenario = Scenario {
    name: "l7",
    description: "through a waypoint (L7): node proxy, waypoint (a Gateway of class `istio-waypoint` in the namespace, HTTP routed per request; iperf3 passed through as TCP), node proxy",
    setup: Setup::Namespace { namespace: "bench-l7", labels: &[AMBIENT, ("istio.io/use-waypoint", WAYPOINT)] },
    l4_targets: false,
};

const DENIED: Scenario = Scenario {
    name: "denied",
    description: "cost of refusing unauthorized connections (kernel drop vs. proxy drop)",
    setup: Setup::NotOnKubernetes {
        reason: "a refused connection has no throughput to compare: `slipstream bench-policy` measures it in the local cluster",
    },
    l4_targets: false,
};

/// On an install with nftables capture.
pub const SCENARIOS: &[Scenario] = &[NONE, L4_NFT, L4_EBPF_OFF, L7, DENIED];

/// On an install with the eBPF datapath: both L4 paths side by side (the
/// `l4-nft` namespace kept on nftables by its label).
pub const SCENARIOS_EBPF: &[Scenario] = &[NONE, L4_NFT, L4_EBPF, L7, DENIED];

/// The scenarios of an install whose node agents run `datapath` (the
/// DaemonSet's `SLIPSTREAM_AGENT_DATAPATH`).
pub fn for_datapath(datapath: &str) -> &'static [Scenario] {
    if datapath == "ebpf" {
        SCENARIOS_EBPF
    } else {
        SCENARIOS
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{select_in, BASELINE};

    #[test]
    fn names_are_the_local_ones_and_the_baseline_is_outside_the_mesh() {
        let local: Vec<&str> = crate::scenario::SCENARIOS.iter().map(|s| s.name).collect();
        let here: Vec<&str> = SCENARIOS.iter().map(|s| s.name).collect();
        assert_eq!(local, here, "the same names, so that reports compare");
        assert_eq!(SCENARIOS[0].name, BASELINE);
        assert!(matches!(SCENARIOS[0].setup, Setup::Namespace { labels: &[], .. }));
        let measured: Vec<&str> = SCENARIOS.iter().filter_map(|s| s.namespace()).collect();
        assert_eq!(measured, ["bench-none", "bench-mesh", "bench-l7"]);
        let on_ebpf: Vec<&str> = for_datapath("ebpf").iter().filter_map(|s| s.namespace()).collect();
        assert_eq!(on_ebpf, ["bench-none", "bench-mesh", "bench-ebpf", "bench-l7"]);
        let names = |sc: &[Scenario]| sc.iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(SCENARIOS_EBPF), names(SCENARIOS), "the same names either way");
        assert!(matches!(for_datapath("nftables")[1].setup, Setup::Namespace { labels, .. } if labels.contains(&ON_NFTABLES)));
    }

    #[test]
    fn unavailable_ones_say_so_loudly() {
        let ebpf = SCENARIOS.iter().find(|s| s.name == "l4-ebpf").unwrap().info();
        assert!(ebpf.not_available.unwrap().starts_with("not available on Kubernetes: the install runs nftables capture"));
        let all = select_in(SCENARIOS, &[]).unwrap();
        assert_eq!(all.len(), 5);
        let some = select_in(SCENARIOS, &["l4-nft".into()]).unwrap();
        assert_eq!(some.iter().map(|s| s.name).collect::<Vec<_>>(), ["none", "l4-nft"]);
    }
}
