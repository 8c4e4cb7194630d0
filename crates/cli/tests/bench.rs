//! `slipstream bench --quick`, the CI smoke test of the benchmark: every
//! experiment of every scenario this version can measure produces numbers,
//! the files are written, and the bench cluster is gone afterwards. It
//! never checks how fast anything is.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

/// The figures each experiment must report (the contract of results.json).
const FIGURES: &[(&str, &[&str])] = &[
    ("T1", &["gbps"]),
    ("T2", &["gbps"]),
    ("L1", &["p50_ms", "p90_ms", "p99_ms", "p99.9_ms", "avg_ms"]),
    ("Q1", &["rps", "p50_ms", "p99_ms"]),
    ("C1", &["cps"]),
    ("R1", &["connections", "rss_mb", "rss_after_mb"]),
];

#[test]
fn quick_bench_measures_every_experiment_of_every_available_scenario() {
    require_root();
    let out = tempfile::tempdir().unwrap();
    let t0 = Instant::now();
    let o = Command::new(bin()).args(["bench", "--quick", "--out"]).arg(out.path()).output().expect("run slipstream bench");
    let took = t0.elapsed();
    let log = text(&o);
    println!("{log}");
    assert!(o.status.success(), "slipstream bench --quick failed:\n{log}");
    // Three measured scenarios (none, l4-nft, l4-ebpf), each with every
    // experiment once, and a cluster up and down.
    assert!(took < Duration::from_secs(180), "--quick must finish in under 3 minutes, took {took:?}");
    assert_clean("bench");

    let results: Value = serde_json::from_str(&std::fs::read_to_string(out.path().join("results.json")).unwrap()).unwrap();
    assert_eq!(results["complete"], true);
    assert!(results["machine"]["cores"].as_u64().unwrap() > 0);
    assert!(results["tools"]["fortio"].is_string() && results["tools"]["iperf3"].is_string());
    let idle = results["idle"].as_array().unwrap();
    assert!(!idle.is_empty() && idle.iter().all(|p| p["rss_mb"].as_f64().unwrap() > 0.0), "idle: {idle:?}");

    let scenarios = results["scenarios"].as_array().unwrap();
    let names: Vec<&str> = scenarios.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["none", "l4-nft", "l4-ebpf", "l7", "denied"]);
    let runs = results["runs"].as_array().unwrap();
    let mut checked = 0;
    for s in scenarios {
        let name = s["name"].as_str().unwrap();
        if name == "l4-ebpf" {
            assert!(s["not_available"].is_null(), "the eBPF datapath runs on this machine: l4-ebpf is measured");
        }
        if let Some(why) = s["not_available"].as_str() {
            assert!(why.starts_with("not available in this version"), "{name}: {why}");
            assert!(runs.iter().all(|r| r["scenario"] != name), "{name} is not available but has runs");
            continue;
        }
        for (exp, figures) in FIGURES {
            let these: Vec<&Value> = runs.iter().filter(|r| r["scenario"] == name && r["experiment"] == *exp).collect();
            assert_eq!(these.len(), 1, "{name} {exp}: one repetition in --quick");
            for r in these {
                assert!(r["error"].is_null(), "{name} {exp} failed: {}", r["error"]);
                for f in *figures {
                    let v = r["figures"][f].as_f64().unwrap_or_else(|| panic!("{name} {exp}: no figure {f} in {r}"));
                    assert!(v > 0.0, "{name} {exp} {f} = {v}");
                }
                if *exp == "R1" {
                    assert_eq!(r["figures"]["connections"], r["details"]["wanted"], "{name} R1 held every connection: {r}");
                }
                let mesh = r["mesh"].as_array().unwrap();
                assert!(!mesh.is_empty(), "{name} {exp}: no mesh process measured");
                for p in mesh {
                    assert!(p["peak_rss_mb"].as_f64().unwrap() > 0.0 && p["rss_mb"].as_f64().unwrap() > 0.0, "{name} {exp}: {p}");
                    assert!(p["cpu_s"].as_f64().unwrap() >= 0.0);
                }
                if name != "none" && *exp != "R1" {
                    let cpu: f64 = mesh.iter().map(|p| p["cpu_s"].as_f64().unwrap()).sum();
                    assert!(cpu > 0.0, "{name} {exp}: the mesh carried the traffic but used no CPU");
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 4 * FIGURES.len(), "none, l4-nft, l4-ebpf and l7 are measurable in this version");

    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert!(report.contains("| experiment | figure | none | l4-nft | l4-ebpf | l7 |"), "{report}");
    assert!(report.contains("## Targets for the eBPF datapath"), "{report}");
    assert!(report.contains("](chart.svg)"));
    let svg = std::fs::read_to_string(out.path().join("chart.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    assert_eq!(svg.matches("class=\"bar\"").count(), 33, "one bar per ratio figure for l4-nft, l4-ebpf and l7");
    assert!(out.path().join("raw").read_dir().unwrap().count() >= 10, "raw tool outputs are kept");
}
