//! The scenarios on Kubernetes (`--kubeconfig`): the local bench's names,
//! each a namespace made for the run, or why it cannot be measured there.

use crate::scenario::{Scenario, Setup, WAYPOINT};

/// The label that puts a namespace's pods in the mesh.
pub const AMBIENT: (&str, &str) = ("istio.io/dataplane-mode", "ambient");

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "none",
        description: "no mesh: a namespace without the ambient label, plain TCP between the pods, Services by kube-proxy",
        setup: Setup::Namespace { namespace: "bench-none", labels: &[] },
        l4_targets: false,
    },
    Scenario {
        name: "l4-nft",
        description: "L4 mesh: the namespace labelled `istio.io/dataplane-mode=ambient`, node proxies carry the connection in mTLS (HBONE), capture by nftables (the chart's `datapath.mode`)",
        setup: Setup::Namespace { namespace: "bench-mesh", labels: &[AMBIENT] },
        l4_targets: true,
    },
    Scenario {
        name: "l4-ebpf",
        description: "L4 mesh with eBPF capture",
        setup: Setup::NotOnKubernetes { reason: "the chart's `datapath.mode` accepts only `nftables` for now (docs/kubernetes.md, \"Values\")" },
        l4_targets: true,
    },
    Scenario {
        name: "l7",
        description: "through a waypoint (L7): node proxy, waypoint (a Gateway of class `istio-waypoint` in the namespace, HTTP routed per request; iperf3 passed through as TCP), node proxy",
        setup: Setup::Namespace { namespace: "bench-l7", labels: &[AMBIENT, ("istio.io/use-waypoint", WAYPOINT)] },
        l4_targets: false,
    },
    Scenario {
        name: "denied",
        description: "cost of refusing unauthorized connections (kernel drop vs. proxy drop)",
        setup: Setup::NotOnKubernetes {
            reason: "a refused connection has no throughput to compare: `slipstream bench-policy` measures it in the local cluster",
        },
        l4_targets: false,
    },
];

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
    }

    #[test]
    fn unavailable_ones_say_so_loudly() {
        let ebpf = SCENARIOS.iter().find(|s| s.name == "l4-ebpf").unwrap().info();
        assert!(ebpf.not_available.unwrap().starts_with("not available on Kubernetes: the chart's `datapath.mode`"));
        let all = select_in(SCENARIOS, &[]).unwrap();
        assert_eq!(all.len(), 5);
        let some = select_in(SCENARIOS, &["l4-nft".into()]).unwrap();
        assert_eq!(some.iter().map(|s| s.name).collect::<Vec<_>>(), ["none", "l4-nft"]);
    }
}
