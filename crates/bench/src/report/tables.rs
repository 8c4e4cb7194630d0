//! The page's tables: every figure with its ratio to `none`, the mesh
//! processes' resources, and the targets (the L4 mesh's, the eBPF
//! datapath's, the waypoint's).

use super::{fmt, header, targets, View};
use crate::experiment::{ExperimentId, EXPERIMENTS};
use crate::scenario::BASELINE;
use crate::stats::{figure_id, MESH_CPU, MESH_PEAK_RSS};
use std::fmt::Write;

/// Every figure reported as a ratio, per measured scenario.
pub(super) fn main_table(s: &mut String, v: &View) {
    let _ = writeln!(
        s,
        "## Results\n\nMedian over the repetitions; in parentheses the ratio to `{BASELINE}` measured in the same run \
         (for latencies also the milliseconds added).\n"
    );
    header(s, &["experiment", "figure"], v);
    for &e in v.experiments() {
        for f in e.figures().iter().filter(|f| f.ratio) {
            let id = figure_id(e, f.key);
            let mut cells = Vec::new();
            for sc in &v.measured {
                cells.push(match v.get(sc, &id) {
                    None => v.missing(sc, e).to_string(),
                    Some(x) if *sc == BASELINE => fmt::num(x),
                    Some(x) => {
                        let mut notes = Vec::new();
                        if let Some(r) = v.ratio(sc, &id) {
                            notes.push(fmt::ratio(r));
                        }
                        if let (true, Some(b)) = (f.added, v.get(BASELINE, &id)) {
                            notes.push(format!("{} ms", fmt::signed(x - b)));
                        }
                        if notes.is_empty() {
                            fmt::num(x)
                        } else {
                            format!("{} ({})", fmt::num(x), notes.join(", "))
                        }
                    }
                });
            }
            let _ = writeln!(s, "| {e} {} | {} ({}) | {} |", e.title(), f.label, f.unit, cells.join(" | "));
        }
    }
    s.push('\n');
}

/// R1: what the mesh processes took, idle and during each experiment.
pub(super) fn resources_table(s: &mut String, v: &View) {
    if v.r.kubernetes.is_some() {
        return super::kube::resources_table(s, v);
    }
    let procs: Vec<String> = v
        .r
        .idle
        .iter()
        .map(|p| {
            let pod = p.pod_rss_mb.map(|m| format!("; the pod, with its pod-init processes, {m:.1} MB")).unwrap_or_default();
            match p.anon_mb {
                Some(a) => format!("{} {:.1} MB ({:.1} MB its own, the rest the binary's shared code pages{pod})", p.process, p.rss_mb, a),
                None => format!("{} {:.1} MB", p.process, p.rss_mb),
            }
        })
        .collect();
    let _ = writeln!(
        s,
        "## R1: resources of the mesh processes\n\n\
         Every mesh process (today the node proxy of each node) is measured during every experiment: CPU seconds \
         from its cgroup, peak RSS from VmHWM (reset before the experiment). In `{BASELINE}` the node proxies run but \
         carry nothing. Idle, after `up` and before any traffic: {}.\n",
        if procs.is_empty() { "not measured".into() } else { procs.join(", ") }
    );
    header(s, &["measurement"], v);
    let row = |s: &mut String, label: String, id: String, e: ExperimentId| {
        let cells: Vec<String> =
            v.measured.iter().map(|sc| v.get(sc, &id).map(fmt::num).unwrap_or_else(|| v.missing(sc, e).to_string())).collect();
        let _ = writeln!(s, "| {label} | {} |", cells.join(" | "));
    };
    for e in EXPERIMENTS.into_iter().filter(|e| *e != ExperimentId::R1) {
        row(s, format!("CPU seconds during {e}, all mesh processes (node proxies and waypoints)"), figure_id(e, MESH_CPU), e);
    }
    for e in [ExperimentId::T1, ExperimentId::Q1] {
        row(s, format!("peak RSS during {e}, largest node proxy (MB)"), figure_id(e, MESH_PEAK_RSS), e);
    }
    row(
        s,
        format!("RSS with {} connections open, largest node proxy (MB)", v.r.settings.hold_connections),
        figure_id(ExperimentId::R1, "rss_mb"),
        ExperimentId::R1,
    );
    row(s, "RSS 2 s after they are closed, largest node proxy (MB)".into(), figure_id(ExperimentId::R1, "rss_after_mb"), ExperimentId::R1);
    s.push('\n');
}

/// The L4 mesh's targets, per scenario that has them.
pub(super) fn targets_table(s: &mut String, v: &View) {
    let with: Vec<&str> = v.r.scenarios.iter().filter(|x| x.l4_targets && x.not_available.is_none()).map(|x| x.name.as_str()).collect();
    if with.is_empty() {
        return;
    }
    let _ = writeln!(s, "## Targets for the L4 mesh\n\nFor reference only: the benchmark measures, it never fails on a target.\n");
    let _ = writeln!(s, "| target | {} |", with.join(" | "));
    let _ = writeln!(s, "|---|{}", "---|".repeat(with.len()));
    for t in targets::TARGETS {
        let cells: Vec<String> = with
            .iter()
            .map(|sc| {
                let held = v.get(sc, &figure_id(ExperimentId::R1, "connections")).unwrap_or(0.0) as usize;
                (sc, held)
            })
            .map(|(sc, held)| match targets::check(t, v.of(sc), v.of(BASELINE), v.idle_rss(), held) {
                targets::Verdict::Met { measured } => format!("{measured}: met"),
                targets::Verdict::Missed { measured } => format!("{measured}: **missed**"),
                targets::Verdict::NotMeasured(why) => format!("not measured ({why})"),
            })
            .collect();
        let _ = writeln!(s, "| {} | {} |", t.what, cells.join(" | "));
    }
    s.push('\n');
}

/// A target's verdict as the tables write it.
fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}

/// The eBPF datapath's own targets (BENCHMARKS.md): against `none` and
/// against `l4-nft` of the same run.
pub(super) fn ebpf_targets(s: &mut String, v: &View) {
    if !v.available("l4-ebpf") {
        return;
    }
    let get = |sc: &str, e: ExperimentId, f: &str| v.get(sc, &figure_id(e, f));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let cell = |r: Option<f64>, min: f64| match r {
        Some(r) => format!("{r:.2}×: {}", verdict(r >= min)),
        None => "not measured".into(),
    };
    let e = "l4-ebpf";
    let (t1, q1, l1) = (ExperimentId::T1, ExperimentId::Q1, ExperimentId::L1);
    let _ = writeln!(
        s,
        "## Targets for the eBPF datapath

For reference only: the benchmark measures, it never fails on a target.
"
    );
    let _ = writeln!(s, "| target | l4-ebpf |\n|---|---|");
    let _ = writeln!(s, "| T1 throughput ≥ 0.55 × none | {} |", cell(ratio(get(e, t1, "gbps"), get(BASELINE, t1, "gbps")), 0.55));
    let _ = writeln!(s, "| Q1 requests/s ≥ 0.60 × none | {} |", cell(ratio(get(e, q1, "rps"), get(BASELINE, q1, "rps")), 0.60));
    let nft = v.available("l4-nft");
    let q1_nft = if nft { cell(ratio(get(e, q1, "rps"), get("l4-nft", q1, "rps")), 1.2) } else { "not measured (no l4-nft)".into() };
    let _ = writeln!(s, "| Q1 requests/s ≥ 1.2 × l4-nft | {q1_nft} |");
    let p99 = match (get(e, l1, "p99_ms"), get("l4-nft", l1, "p99_ms")) {
        (Some(a), Some(b)) => format!("{a:.3} ms vs {b:.3} ms: {}", verdict(a < b)),
        _ => "not measured".into(),
    };
    let _ = writeln!(s, "| L1 p99 below l4-nft | {p99} |");
    s.push('\n');
}

/// The waypoint's targets (issue 16): `l7` against `none` of the same
/// run, and the waypoint's idle memory (its process, as a container's).
pub(super) fn waypoint_targets(s: &mut String, v: &View) {
    if !v.available("l7") {
        return;
    }
    let get = |sc: &str, e: ExperimentId, f: &str| v.get(sc, &figure_id(e, f));
    let (q1, l1) = (ExperimentId::Q1, ExperimentId::L1);
    let q1_cell = match (get("l7", q1, "rps"), get(BASELINE, q1, "rps")) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}×: {}", a / b, verdict(a / b >= 0.30)),
        _ => "not measured".into(),
    };
    let l1_cell = match (get("l7", l1, "p50_ms"), get(BASELINE, l1, "p50_ms")) {
        (Some(a), Some(b)) => format!("{:+.2} ms: {}", a - b, verdict(a - b <= 3.0)),
        _ => "not measured".into(),
    };
    let idle: Vec<String> =
        v.r.idle
            .iter()
            .filter(|p| crate::results::is_waypoint(&p.process))
            .map(|p| {
                let pod = p.pod_rss_mb.map(|m| format!(", the pod {m:.1} MB")).unwrap_or_default();
                format!("{:.1} MB{pod}: {}", p.rss_mb, verdict(p.rss_mb < 30.0))
            })
            .collect();
    let rss_cell = if idle.is_empty() { "not measured".to_string() } else { idle.join("; ") };
    let memory = if v.r.kubernetes.is_some() {
        "The waypoint's memory is its container's working set, as the kubelet reports it."
    } else {
        "The waypoint's memory is its process, as Kubernetes reports a container's; its pod adds the sandbox's `pod-init` processes."
    };
    let _ =
        writeln!(s, "## Targets for the waypoint\n\nFor reference only: the benchmark measures, it never fails on a target. {memory}\n");
    let _ = writeln!(s, "| target | l7 |\n|---|---|");
    let _ = writeln!(s, "| Q1 requests/s ≥ 0.30 × none | {q1_cell} |");
    let _ = writeln!(s, "| L1 p50 ≤ none + 3 ms | {l1_cell} |");
    let _ = writeln!(s, "| waypoint RSS idle < 30 MB | {rss_cell} |");
    s.push('\n');
}

#[cfg(test)]
mod tests {
    use super::super::markdown;
    use super::super::tests::{line, page, sample};
    use crate::experiment::EXPERIMENTS;
    use crate::results::ProcSample;

    #[test]
    fn table_has_every_ratio_figure_with_its_ratio() {
        let md = markdown(&sample(), &page());
        assert_eq!(line(&md, "| experiment |"), "| experiment | figure | none | l4-nft | l4-ebpf | l7 |");
        assert_eq!(
            line(&md, "| T1 "),
            "| T1 single-connection throughput | throughput (Gb/s) | 12.00 | 3.00 (0.25×) | 6.00 (0.50×) | 2.40 (0.20×) |"
        );
        assert_eq!(
            line(&md, "| L1 latency at fixed load | p99 (ms)"),
            "| L1 latency at fixed load | p99 (ms) | 3.00 | 12.00 (4.00×, +9.00 ms) | 6.00 (2.00×, +3.00 ms) | 15.00 (5.00×, +12.00 ms) |"
        );
        assert_eq!(
            line(&md, "| Q1 maximum request rate | requests/s"),
            "| Q1 maximum request rate | requests/s (req/s) | 20000 | 5000 (0.25×) | 10000 (0.50×) | 4000 (0.20×) |"
        );
        assert_eq!(
            line(&md, "| C1 "),
            "| C1 new connections per second | connections/s (conn/s) | 4000 | 1000 (0.25×) | 2000 (0.50×) | 800.0 (0.20×) |"
        );
        let section = &md[md.find("## Results").unwrap()..md.find("## R1").unwrap()];
        let rows = section.lines().filter(|l| l.starts_with("| ")).count() - 1;
        let ratio_figures: usize = EXPERIMENTS.iter().map(|e| e.figures().iter().filter(|f| f.ratio).count()).sum();
        assert_eq!(rows, ratio_figures);
        assert!(md.contains("![ratio of every figure to none](chart.svg)"));
    }

    #[test]
    fn resources_targets_and_scenarios() {
        let md = markdown(&sample(), &page());
        assert!(md.contains("node proxy node1 13.9 MB (1.8 MB its own, the rest the binary's shared code pages), node proxy node2 14.2 MB"));
        assert_eq!(
            line(&md, "| CPU seconds during T1"),
            "| CPU seconds during T1, all mesh processes (node proxies and waypoints) | 0.00 | 8.00 | 6.00 | 10.00 |"
        );
        assert_eq!(line(&md, "| peak RSS during Q1"), "| peak RSS during Q1, largest node proxy (MB) | 18.00 | 18.00 | 18.00 | 18.00 |");
        assert_eq!(
            line(&md, "| RSS with 10000"),
            "| RSS with 10000 connections open, largest node proxy (MB) | 15.00 | 38.00 | 38.00 | 38.00 |"
        );
        assert_eq!(line(&md, "| T1 throughput ≥"), "| T1 throughput ≥ 0.50 × none | 0.25×: **missed** | 0.50×: met |");
        assert_eq!(line(&md, "| L1 p50 ≤"), "| L1 p50 ≤ none + 1.5 ms | +3.00 ms: **missed** | +1.00 ms: met |");
        assert_eq!(line(&md, "| node proxy RSS idle"), "| node proxy RSS idle ≤ 15 MB | 14.2 MB: met | 14.2 MB: met |");
        assert_eq!(
            line(&md, "| node proxy RSS with 10k"),
            "| node proxy RSS with 10k open connections ≤ 40 MB | 38.0 MB: met | 38.0 MB: met |"
        );
        // The eBPF datapath's own targets, against none and l4-nft.
        assert_eq!(line(&md, "| T1 throughput ≥ 0.55"), "| T1 throughput ≥ 0.55 × none | 0.50×: **missed** |");
        assert_eq!(line(&md, "| Q1 requests/s ≥ 0.60"), "| Q1 requests/s ≥ 0.60 × none | 0.50×: **missed** |");
        assert_eq!(line(&md, "| Q1 requests/s ≥ 1.2"), "| Q1 requests/s ≥ 1.2 × l4-nft | 2.00×: met |");
        assert_eq!(line(&md, "| L1 p99 below l4-nft"), "| L1 p99 below l4-nft | 6.000 ms vs 12.000 ms: met |");
        assert!(line(&md, "- `denied`").contains("**not available in this version"));
        assert!(!line(&md, "- `l7`").contains("not available"), "the waypoint is measured");
        assert!(md.contains("/var/tmp/slipstream-target/release/slipstream bench --update-docs"));
        assert!(md.contains("commit `0123456789ab`"));
        assert!(!md.contains("Failed runs"));
    }

    #[test]
    fn waypoint_targets_use_its_process_and_name_the_pod() {
        let mut r = sample();
        let md = markdown(&r, &page());
        assert_eq!(line(&md, "| Q1 requests/s ≥ 0.30 × none"), "| Q1 requests/s ≥ 0.30 × none | 0.20×: **missed** |");
        assert_eq!(line(&md, "| L1 p50 ≤ none + 3 ms"), "| L1 p50 ≤ none + 3 ms | +4.00 ms: **missed** |");
        assert_eq!(line(&md, "| waypoint RSS idle"), "| waypoint RSS idle < 30 MB | not measured |");
        r.idle.push(ProcSample {
            process: "waypoint bench-l7/waypoint-abc".into(),
            pids: vec![3, 4, 5],
            rss_mb: 19.6,
            anon_mb: Some(2.2),
            pod_rss_mb: Some(32.8),
        });
        let md = markdown(&r, &page());
        assert_eq!(line(&md, "| waypoint RSS idle"), "| waypoint RSS idle < 30 MB | 19.6 MB, the pod 32.8 MB: met |");
        assert!(
            md.contains("waypoint bench-l7/waypoint-abc 19.6 MB (2.2 MB its own, the rest the binary's shared code pages; the pod, with its pod-init processes, 32.8 MB)"),
            "{md}"
        );
        // Only the node proxies count for the node proxy's target.
        assert_eq!(line(&md, "| node proxy RSS idle"), "| node proxy RSS idle ≤ 15 MB | 14.2 MB: met | 14.2 MB: met |");
        // Without l7, no section.
        r.scenarios.retain(|s| s.name != "l7");
        assert!(!markdown(&r, &page()).contains("## Targets for the waypoint"));
    }
}
