//! What the page says differently for a run on Kubernetes
//! (`slipstream bench --kubeconfig`): the cluster instead of the local
//! one, the mesh's resources as the kubelet reports its containers, and
//! pod start (S1) with its target.

use super::{fmt, header, View};
use crate::experiment::ExperimentId;
use crate::results::{KubeInfo, Results};
use crate::scenario::BASELINE;
use crate::stats::{figure_id, MESH_CPU, MESH_PEAK_RSS};
use std::fmt::Write;

/// BENCHMARKS.md: the first meshed request no later than without the mesh
/// plus this.
pub const POD_START_ADDED_MS: f64 = 100.0;

/// The cluster's facts, after the machine's.
pub(super) fn facts(s: &mut String, k: &KubeInfo) {
    let nodes: Vec<String> = k
        .nodes
        .iter()
        .map(|n| {
            format!("{} ({} CPUs, {} memory, Linux {}, {}, {}, kubelet {})", n.name, n.cpus, n.memory, n.kernel, n.os, n.runtime, n.kubelet)
        })
        .collect();
    let _ = writeln!(
        s,
        "Cluster: Kubernetes {} (context `{}`), mesh image `{}`, datapath `{}`. Nodes: {}. The machine above is where the bench ran.\n",
        k.server_version,
        k.context,
        k.mesh_image,
        if k.datapath.is_empty() { "nftables" } else { &k.datapath },
        if nodes.is_empty() { "unknown".into() } else { nodes.join("; ") }
    );
}

/// Where the scenarios' pods ran.
pub(super) fn scenarios(s: &mut String, k: &KubeInfo) {
    let _ = writeln!(
        s,
        "\nEach measured scenario is a namespace of the Kubernetes cluster holding the same two pods: a client on \
         `{}` (fortio and iperf3, idle until the bench runs them with `kubectl exec`) and a server on `{}` (fortio's \
         HTTP and TCP echo servers and an iperf3 server) behind the Service `server`, which every experiment \
         addresses by name. The namespaces are made for the run and deleted after it.\n",
        k.client_node, k.server_node
    );
}

/// The order of the steps, and how S1 measures.
pub(super) fn steps(s: &mut String) {
    let _ = writeln!(
        s,
        "\nSteps run in the order repetition, experiment, scenario: the scenarios compared in one figure are measured \
         back to back. S1 creates its pods one at a time in the scenario's namespace, on the client's node; each \
         pod's only container (`curlimages/curl`) requests `http://server:8080/` until it is answered and then exits. \
         A pod's time runs from the bench's clock just before its create request to the timestamp the container \
         runtime gave the log line curl wrote on its first answer (read with the pod's logs, `timestamps=true`): \
         on one machine, as in the harness, both are the same clock; on a real cluster the bench's and the node's \
         clocks differ by their NTP offset, the same in both scenarios, so the difference between them holds. \
         Each pod is deleted, and gone, before the next is created.\n"
    );
}

/// The command that reproduces the run.
pub(super) fn reproduce(s: &mut String, r: &Results) {
    let cmd = fmt::reproduce_command(&r.command);
    let _ = writeln!(
        s,
        "## Reproduce\n\nFrom a clone of the repository{}, with Slipstream installed on the cluster by its Helm chart \
         (docs/kubernetes.md) and `kubectl` on the PATH:\n\n```sh\ncargo build --release -p slipstream-cli\n{cmd}\n```\n\n\
         `results.json` holds every repetition, the cluster and the images; `--quick` is the smoke test.",
        r.commit.as_ref().map(|c| format!(" at commit `{}`", c.hash)).unwrap_or_default(),
    );
}

/// The mesh's containers as the kubelet reports them (its stats summary,
/// through the API server).
pub(super) fn resources_table(s: &mut String, v: &View) {
    let idle: Vec<String> =
        v.r.idle
            .iter()
            .map(|p| match p.anon_mb {
                Some(a) => format!("{} {:.1} MB ({:.1} MB anonymous)", p.process, p.rss_mb, a),
                None => format!("{} {:.1} MB", p.process, p.rss_mb),
            })
            .collect();
    let _ = writeln!(
        s,
        "## R1: resources of the mesh processes\n\n\
         The node proxies (container `proxy` of DaemonSet `slipstream-node` on the client's and the server's node) \
         and the waypoints, from the kubelet's stats summary (`/api/v1/nodes/<node>/proxy/stats/summary`): CPU \
         seconds between a sample taken before the experiment and one the kubelet took after it, memory the working \
         set (what `kubectl top` shows; the anonymous part in parentheses) at the kubelet's samples during the \
         experiment (about every 10 s: a short peak can fall between them). In `{BASELINE}` the node proxies run \
         but carry nothing. Idle, before any traffic: {}. The held connections of R1 are not measured on \
         Kubernetes: the bench opens them from inside the client pod's network namespace, which it cannot enter \
         on a remote node.\n",
        if idle.is_empty() { "not measured".into() } else { idle.join(", ") }
    );
    header(s, &["measurement"], v);
    let row = |s: &mut String, label: String, id: String, e: ExperimentId| {
        let cells: Vec<String> =
            v.measured.iter().map(|sc| v.get(sc, &id).map(fmt::num).unwrap_or_else(|| v.missing(sc, e).to_string())).collect();
        let _ = writeln!(s, "| {label} | {} |", cells.join(" | "));
    };
    for &e in v.experiments() {
        row(s, format!("CPU seconds during {e}, all mesh processes (node proxies and waypoints)"), figure_id(e, MESH_CPU), e);
    }
    for e in [ExperimentId::T1, ExperimentId::Q1] {
        row(s, format!("largest sampled working set during {e}, largest node proxy (MB)"), figure_id(e, MESH_PEAK_RSS), e);
    }
    s.push('\n');
}

/// S1's target: the mesh's pod start no later than no mesh's plus 100 ms.
pub(super) fn pod_start_targets(s: &mut String, v: &View) {
    let compared = v.compared();
    let ran = v.r.runs.iter().any(|r| r.experiment == ExperimentId::S1);
    if v.r.kubernetes.is_none() || compared.is_empty() || !ran {
        return;
    }
    let _ = writeln!(
        s,
        "## Targets for pod start\n\nFor reference only: the benchmark measures, it never fails on a target. Each \
         cell: the scenario's figure, `{BASELINE}`'s, and the difference.\n"
    );
    let _ = writeln!(s, "| target | {} |", compared.join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(compared.len()));
    for key in ["p50_ms", "p99_ms"] {
        let id = figure_id(ExperimentId::S1, key);
        let cells: Vec<String> = compared.iter().map(|sc| pod_start_cell(v.get(sc, &id), v.get(BASELINE, &id))).collect();
        let _ = writeln!(s, "| S1 {} ≤ {BASELINE} + {POD_START_ADDED_MS:.0} ms | {} |", key.trim_end_matches("_ms"), cells.join(" | "));
    }
    let _ = writeln!(s, "\nWhere the time goes (p50 over the pods, median over the repetitions):\n");
    header(s, &["part of pod start"], v);
    for (key, label) in [
        ("started_p50_ms", "creation to the container running: sandbox, network (the CNI plugins), container (ms)"),
        ("first_request_p50_ms", "the container running to its first request answered (ms)"),
    ] {
        let cells: Vec<String> =
            v.measured.iter().map(|sc| detail(v, sc, key).map(fmt::num).unwrap_or_else(|| "not measured".into())).collect();
        let _ = writeln!(s, "| {label} | {} |", cells.join(" | "));
    }
    s.push('\n');
}

/// The median over S1's successful repetitions of one of their details.
fn detail(v: &View, scenario: &str, key: &str) -> Option<f64> {
    let values: Vec<f64> =
        v.r.runs
            .iter()
            .filter(|r| r.ok() && r.scenario == scenario && r.experiment == ExperimentId::S1)
            .filter_map(|r| r.details.get(key).copied())
            .collect();
    crate::stats::median(&values)
}

/// `1234 ms vs 1180 ms, +54 ms: met`
pub fn pod_start_cell(mesh: Option<f64>, none: Option<f64>) -> String {
    match (mesh, none) {
        (Some(m), Some(n)) => {
            let verdict = if m - n <= POD_START_ADDED_MS { "met" } else { "**missed**" };
            format!("{m:.0} ms vs {n:.0} ms, {:+.0} ms: {verdict}", m - n)
        }
        _ => "not measured".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{line, page, sample};
    use super::super::{markdown, summary};
    use super::*;
    use crate::results::{KubeNode, Run};

    /// The sample run as a Kubernetes run: its scenarios, no R1, S1.
    fn kube_sample() -> Results {
        let mut r = sample();
        r.kubernetes = Some(KubeInfo {
            server_version: "v1.32.13".into(),
            context: "kube-harness".into(),
            client_node: "worker-1".into(),
            server_node: "worker-2".into(),
            nodes: vec![KubeNode { name: "worker-1".into(), cpus: "2".into(), ..Default::default() }],
            mesh_image: "ghcr.io/slipstream-mesh/slipstream:0.1.0".into(),
            datapath: "nftables".into(),
        });
        r.scenarios = crate::kube::scenarios::SCENARIOS.iter().map(|s| s.info()).collect();
        r.runs.retain(|x| x.experiment != ExperimentId::R1 && x.scenario != "l4-ebpf");
        let settings = r.settings.clone();
        r.experiments = crate::experiment::KUBE_EXPERIMENTS
            .iter()
            .map(|e| crate::results::ExperimentInfo { id: *e, title: e.title().into(), command: e.action(&settings).describe() })
            .collect();
        for (sc, p50, p99, started) in [("none", 600.0, 640.0, 580.0), ("l4-nft", 690.0, 760.0, 600.0), ("l7", 950.0, 1900.0, 700.0)] {
            let mut run: Run = r.runs.iter().find(|x| x.scenario == sc).unwrap().clone();
            run.experiment = ExperimentId::S1;
            run.figures = [("p50_ms".to_string(), p50), ("p99_ms".to_string(), p99)].into();
            run.details = [("started_p50_ms".to_string(), started), ("first_request_p50_ms".to_string(), p50 - started)].into();
            r.runs.push(run);
        }
        r.medians = crate::stats::medians(&r.runs);
        r
    }

    #[test]
    fn a_kubernetes_run_reads_as_one() {
        let md = markdown(&kube_sample(), &page());
        assert!(
            md.contains("Cluster: Kubernetes v1.32.13 (context `kube-harness`), mesh image `ghcr.io/slipstream-mesh/slipstream:0.1.0`, datapath `nftables`.")
        );
        assert_eq!(line(&md, "| experiment |"), "| experiment | figure | none | l4-nft | l7 |");
        assert_eq!(
            line(&md, "| S1 pod start: creation to first request served | p50"),
            "| S1 pod start: creation to first request served | p50 (ms) | 600.0 | 690.0 (1.15×, +90.00 ms) | 950.0 (1.58×, +350.00 ms) |"
        );
        assert!(!md.contains("| R1 "), "no held connections on Kubernetes");
        assert!(md.contains("The held connections of R1 are not measured on Kubernetes"));
        assert!(line(&md, "- `l4-ebpf`").contains("**not available on Kubernetes: the install runs nftables capture"));
        assert_eq!(
            line(&md, "| S1 p50 ≤ none + 100 ms"),
            "| S1 p50 ≤ none + 100 ms | 690 ms vs 600 ms, +90 ms: met | 950 ms vs 600 ms, +350 ms: **missed** |"
        );
        assert_eq!(
            line(&md, "| S1 p99 ≤ none + 100 ms"),
            "| S1 p99 ≤ none + 100 ms | 760 ms vs 640 ms, +120 ms: **missed** | 1900 ms vs 640 ms, +1260 ms: **missed** |"
        );
        assert_eq!(
            line(&md, "| creation to the container running"),
            "| creation to the container running: sandbox, network (the CNI plugins), container (ms) | 580.0 | 600.0 | 700.0 |"
        );
        assert!(md.contains("a client on `worker-1` (fortio and iperf3"));
        assert!(
            md.contains("slipstream bench --update-docs\n")
                || md.contains("/var/tmp/slipstream-target/release/slipstream bench --update-docs")
        );
        assert!(!md.contains("As root"), "no root needed on Kubernetes");
        assert!(summary(&kube_sample()).contains("## Targets for pod start"));
        assert!(md.contains("The waypoint's memory is its container's working set, as the kubelet reports it."));
    }

    #[test]
    fn the_local_report_has_no_kubernetes_section() {
        let md = markdown(&sample(), &page());
        assert!(!md.contains("S1") && !md.contains("Cluster:") && !md.contains("pod start"));
    }

    #[test]
    fn pod_start_verdicts() {
        assert_eq!(pod_start_cell(Some(1234.0), Some(1180.0)), "1234 ms vs 1180 ms, +54 ms: met");
        assert_eq!(pod_start_cell(Some(1280.0), Some(1180.0)), "1280 ms vs 1180 ms, +100 ms: met");
        assert_eq!(pod_start_cell(Some(1281.0), Some(1180.0)), "1281 ms vs 1180 ms, +101 ms: **missed**");
        assert_eq!(pod_start_cell(Some(900.0), Some(1180.0)), "900 ms vs 1180 ms, -280 ms: met");
        assert_eq!(pod_start_cell(None, Some(1.0)), "not measured");
    }
}
