//! The scenarios compared by the benchmark. Adding one is one entry in
//! [`SCENARIOS`]: a namespace of the bench cluster with its labels, or the
//! reason it cannot be measured yet.

use serde::{Deserialize, Serialize};

/// The waypoint Gateway of a namespace labelled `istio.io/use-waypoint`.
pub const WAYPOINT: &str = "waypoint";

/// The baseline every figure is divided by.
pub const BASELINE: &str = "none";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scenario {
    pub name: &'static str,
    pub description: &'static str,
    pub setup: Setup,
    /// The targets of BENCHMARKS.md for the L4 mesh apply.
    pub l4_targets: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    /// A namespace of the bench cluster holding the same client and server
    /// pods as every other scenario, with these namespace labels.
    Namespace { namespace: &'static str, labels: &'static [(&'static str, &'static str)] },
    /// Not measurable with this version of Slipstream: why.
    NotAvailable { reason: &'static str },
    /// Measured in the local cluster, not on Kubernetes (`--kubeconfig`):
    /// why.
    NotOnKubernetes { reason: &'static str },
}

pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "none",
        description: "no mesh: plain TCP between the pods, service VIPs by nftables DNAT (no BPF program on these pods either)",
        setup: Setup::Namespace { namespace: "bench-none", labels: &[("slipstream.io/datapath", "nftables")] },
        l4_targets: false,
    },
    Scenario {
        name: "l4-nft",
        description: "L4 mesh: node proxies carry the connection in mTLS (HBONE), capture by nftables",
        setup: Setup::Namespace {
            namespace: "bench-l4",
            labels: &[("istio.io/dataplane-mode", "ambient"), ("slipstream.io/datapath", "nftables")],
        },
        l4_targets: true,
    },
    Scenario {
        name: "l4-ebpf",
        description: "L4 mesh with eBPF capture (connect4 + sockops out, tc ingress in) instead of nftables",
        setup: Setup::Namespace { namespace: "bench-l4e", labels: &[("istio.io/dataplane-mode", "ambient")] },
        l4_targets: true,
    },
    Scenario {
        name: "l7",
        description: "through a waypoint (L7): node proxy, waypoint (HTTP routed per request; iperf3 and the TCP echo passed through as TCP), node proxy, eBPF capture",
        setup: Setup::Namespace {
            namespace: "bench-l7",
            labels: &[("istio.io/dataplane-mode", "ambient"), ("istio.io/use-waypoint", WAYPOINT)],
        },
        l4_targets: false,
    },
    Scenario {
        name: "denied",
        description: "cost of refusing unauthorized connections (kernel drop vs. proxy drop)",
        setup: Setup::NotAvailable {
            reason: "a refused connection has no throughput to compare: `slipstream bench-policy` measures it (time to the refusal, by a node proxy and by the kernel path)",
        },
        l4_targets: false,
    },
];

impl Scenario {
    pub fn namespace(&self) -> Option<&'static str> {
        match self.setup {
            Setup::Namespace { namespace, .. } => Some(namespace),
            Setup::NotAvailable { .. } | Setup::NotOnKubernetes { .. } => None,
        }
    }

    pub fn available(&self) -> bool {
        self.namespace().is_some()
    }

    pub fn info(&self) -> ScenarioInfo {
        ScenarioInfo {
            name: self.name.to_string(),
            description: self.description.to_string(),
            namespace: self.namespace().map(String::from),
            l4_targets: self.l4_targets,
            not_available: match self.setup {
                Setup::NotAvailable { reason } => Some(format!("not available in this version: {reason}")),
                Setup::NotOnKubernetes { reason } => Some(format!("not available on Kubernetes: {reason}")),
                Setup::Namespace { .. } => None,
            },
        }
    }
}

pub fn find(name: &str) -> Option<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name)
}

fn find_in(registry: &'static [Scenario], name: &str) -> Option<&'static Scenario> {
    registry.iter().find(|s| s.name == name)
}

/// What the results record of a scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioInfo {
    pub name: String,
    pub description: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Set when the scenario could not be measured, with the reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_available: Option<String>,
    /// The targets of BENCHMARKS.md for the L4 mesh apply.
    #[serde(default)]
    pub l4_targets: bool,
}

/// Resolves `--scenarios`: every known scenario when empty, in registry
/// order, always with the baseline. Unknown names are an error naming the
/// known ones. Returns all selected scenarios, measurable or not.
pub fn select(requested: &[String]) -> Result<Vec<&'static Scenario>, String> {
    select_in(SCENARIOS, requested)
}

/// [`select`] in another registry (Kubernetes': `crate::kube::scenarios`).
pub fn select_in(registry: &'static [Scenario], requested: &[String]) -> Result<Vec<&'static Scenario>, String> {
    let mut wanted: Vec<&str> = requested.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).collect();
    if wanted.is_empty() || wanted == ["all"] {
        return Ok(registry.iter().collect());
    }
    let unknown: Vec<&str> = wanted.iter().copied().filter(|w| find_in(registry, w).is_none()).collect();
    if !unknown.is_empty() {
        let known: Vec<&str> = registry.iter().map(|s| s.name).collect();
        return Err(format!("unknown scenario(s) {}: known are {}", unknown.join(", "), known.join(", ")));
    }
    if !wanted.contains(&BASELINE) {
        wanted.push(BASELINE);
    }
    Ok(registry.iter().filter(|s| wanted.contains(&s.name)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&Scenario]) -> Vec<&'static str> {
        v.iter().map(|s| s.name).collect()
    }

    #[test]
    fn default_is_every_scenario_in_order() {
        assert_eq!(names(&select(&[]).unwrap()), ["none", "l4-nft", "l4-ebpf", "l7", "denied"]);
        assert_eq!(names(&select(&["all".into()]).unwrap()), ["none", "l4-nft", "l4-ebpf", "l7", "denied"]);
    }

    #[test]
    fn baseline_is_always_included() {
        assert_eq!(names(&select(&["l4-nft".into()]).unwrap()), ["none", "l4-nft"]);
        assert_eq!(names(&select(&["l7".into(), "none".into()]).unwrap()), ["none", "l7"]);
    }

    #[test]
    fn unknown_names_are_rejected_with_the_known_ones() {
        let e = select(&["l4".into(), "x".into()]).unwrap_err();
        assert!(e.contains("l4, x") && e.contains("l4-nft"), "{e}");
    }

    #[test]
    fn registry_is_consistent() {
        assert_eq!(SCENARIOS[0].name, BASELINE, "the baseline comes first");
        assert!(find(BASELINE).unwrap().available());
        let mut ns: Vec<&str> = SCENARIOS.iter().filter_map(|s| s.namespace()).collect();
        let n = ns.len();
        ns.sort();
        ns.dedup();
        assert_eq!(ns.len(), n, "one namespace per scenario");
        assert!(find("l7").unwrap().available());
        assert!(find("denied").unwrap().info().not_available.unwrap().starts_with("not available in this version"));
    }
}
