//! The report's fixtures (a plausible complete run) and the tests of the
//! page as a whole; each part's own tests are beside it.

use super::*;
use crate::experiment::EXPERIMENTS;
use crate::results::{Commit, ExperimentInfo, Machine, ProcSample, ProcUsage, Run};
use crate::scenario::SCENARIOS;
use crate::settings::Settings;

fn run(scenario: &str, e: ExperimentId, rep: u32, figures: &[(&str, f64)], cpu: f64) -> Run {
    Run {
        scenario: scenario.into(),
        experiment: e,
        rep,
        started_at: "2026-11-22T04:18:45Z".into(),
        elapsed_s: 10.0,
        error: None,
        warnings: vec![],
        figures: figures.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
        details: Default::default(),
        mesh: vec![
            ProcUsage { process: "node proxy node1".into(), pids: vec![1], cpu_s: cpu, peak_rss_mb: 16.0, rss_mb: 15.0, restarted: false },
            ProcUsage { process: "node proxy node2".into(), pids: vec![2], cpu_s: cpu, peak_rss_mb: 18.0, rss_mb: 15.0, restarted: false },
        ],
        raw: vec![],
    }
}

/// A plausible complete run: none, l4-nft and l4-ebpf measured, the
/// others not available.
pub(super) fn sample() -> Results {
    let mut runs = Vec::new();
    for (sc, k, cpu) in [("none", 1.0, 0.0), ("l4-nft", 0.25, 4.0), ("l4-ebpf", 0.5, 3.0), ("l7", 0.2, 5.0)] {
        let lat = 1.0 / k;
        runs.push(run(sc, ExperimentId::T1, 1, &[("gbps", 12.0 * k)], cpu));
        runs.push(run(sc, ExperimentId::T2, 1, &[("gbps", 14.0 * k)], cpu));
        runs.push(run(
            sc,
            ExperimentId::L1,
            1,
            &[("p50_ms", 1.0 * lat), ("p90_ms", 2.0 * lat), ("p99_ms", 3.0 * lat), ("p99.9_ms", 5.0 * lat), ("avg_ms", 1.2 * lat)],
            cpu,
        ));
        runs.push(run(sc, ExperimentId::Q1, 1, &[("rps", 20000.0 * k), ("p50_ms", 2.0 * lat), ("p99_ms", 9.0 * lat)], cpu));
        runs.push(run(sc, ExperimentId::C1, 1, &[("cps", 4000.0 * k)], cpu));
        runs.push(run(
            sc,
            ExperimentId::R1,
            1,
            &[("connections", 10_000.0), ("rss_mb", if k < 1.0 { 38.0 } else { 15.0 }), ("rss_after_mb", 15.0)],
            cpu,
        ));
    }
    let s = Settings::full();
    Results {
        schema: crate::results::SCHEMA,
        command: "slipstream bench --update-docs".into(),
        version: "0.1.0".into(),
        commit: Some(Commit { hash: "0123456789abcdef0123456789abcdef01234567".into(), dirty: false }),
        started_at: "2026-11-22T04:18:45Z".into(),
        duration_s: 600.0,
        complete: true,
        machine: Machine {
            cpu_model: "Test CPU".into(),
            cores: 2,
            memory_gib: 23.5,
            kernel: "6.1.0".into(),
            os: "Debian".into(),
            open_files_limit: 65536,
        },
        tools: [("fortio".to_string(), "1.63.0".to_string()), ("iperf3".to_string(), "3.12".to_string())].into(),
        scenarios: SCENARIOS.iter().map(|x| x.info()).collect(),
        experiments: EXPERIMENTS
            .iter()
            .map(|e| ExperimentInfo { id: *e, title: e.title().into(), command: e.action(&s).describe() })
            .collect(),
        kubernetes: None,
        idle: vec![
            ProcSample { process: "node proxy node1".into(), pids: vec![1], rss_mb: 13.9, anon_mb: Some(1.8), pod_rss_mb: None },
            ProcSample { process: "node proxy node2".into(), pids: vec![2], rss_mb: 14.2, anon_mb: None, pod_rss_mb: None },
        ],
        runs,
        medians: Default::default(),
        settings: s,
    }
}

pub(super) fn page() -> Page {
    Page { title: "Benchmarks".into(), chart_href: "chart.svg".into(), preamble: None }
}

pub(super) fn line<'a>(md: &'a str, start: &str) -> &'a str {
    md.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no line starting with {start:?} in\n{md}"))
}

#[test]
fn failures_and_missing_scenarios_are_visible() {
    let mut r = sample();
    for run in r.runs.iter_mut().filter(|x| x.scenario == "l4-nft" && x.experiment == ExperimentId::Q1) {
        run.error = Some("fortio: no JSON".into());
        run.figures.clear();
    }
    r.runs.retain(|x| !(x.scenario == "l4-nft" && x.experiment == ExperimentId::C1));
    r.complete = false;
    let md = markdown(&r, &page());
    assert!(line(&md, "| Q1 maximum request rate | requests/s").ends_with("| 20000 | failed | 10000 (0.50×) | 4000 (0.20×) |"));
    assert!(line(&md, "| C1 ").ends_with("| 4000 | not run | 2000 (0.50×) | 800.0 (0.20×) |"));
    assert!(md.contains("- l4-nft Q1 rep 1: fortio: no JSON"));
    assert!(md.contains("interrupted"));
    assert!(!md.contains("## Warnings"));
    r.runs[5].warnings = vec!["only 9941 of 10000 connections could be opened and echoed".into()];
    let md = markdown(&r, &page());
    assert!(md.contains("## Warnings") && md.contains("- none R1 rep 1: only 9941 of 10000"), "{md}");
}
