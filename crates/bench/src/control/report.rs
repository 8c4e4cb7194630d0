//! The figures of `bench-control`, compared with the targets of
//! BENCHMARKS.md, as JSON and Markdown. Pure.

use super::process::Memory;
use super::synthetic::Shape;
use crate::results::{Commit, Machine};
use serde::Serialize;

/// The targets (BENCHMARKS.md, "control plane").
pub const TARGET_FULL_PUSH_SECS: f64 = 3.0;
pub const TARGET_CHANGE_P99_MS: f64 = 100.0;
pub const TARGET_CHANGE_BYTES: f64 = 2048.0;
pub const TARGET_RSS_MB: f64 = 300.0;

/// The first push to every proxy.
#[derive(Debug, Clone, Serialize)]
pub struct FullPush {
    /// From the proxies starting to connect until the last one holds both
    /// types' first responses.
    pub secs: f64,
    /// The fastest proxy's.
    pub first_proxy_secs: f64,
    /// Bytes of the first responses, per proxy.
    pub bytes_per_proxy_mean: f64,
    pub bytes_per_proxy_max: usize,
    /// Resources each proxy received in them (the same for all).
    pub resources_per_proxy: usize,
}

/// One pod change.
#[derive(Debug, Clone, Serialize)]
pub struct Change {
    pub pod: String,
    pub what: String,
    /// From the rename until the last proxy received it; None when some
    /// proxy did not within the timeout.
    pub latency_ms: Option<f64>,
    /// Until the first proxy received it.
    pub first_ms: Option<f64>,
    /// Proxies that received it.
    pub proxies: usize,
    /// Bytes of the responses that carried it, per proxy (min and max).
    pub bytes_min: usize,
    pub bytes_max: usize,
    /// Sum over the proxies (for the mean).
    pub bytes_total: usize,
    /// Responses received during the change that did not carry it.
    pub other_responses: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Changes {
    pub count: usize,
    pub completed: usize,
    pub latency_p50_ms: Option<f64>,
    pub latency_p99_ms: Option<f64>,
    pub latency_max_ms: Option<f64>,
    pub first_proxy_p50_ms: Option<f64>,
    /// Per change and proxy.
    pub bytes_per_proxy_mean: f64,
    pub bytes_per_proxy_max: usize,
    pub samples: Vec<Change>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryFigures {
    /// Once it is ready (objects read, before any proxy).
    pub ready: Memory,
    /// After the full push, once every proxy answered.
    pub after_push: Memory,
    /// After the changes; its `peak_mb` is the peak of the whole run.
    pub after_changes: Memory,
}

#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub figure: String,
    pub target: String,
    pub value: String,
    pub met: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct ControlReport {
    pub started: String,
    pub took_secs: f64,
    pub version: String,
    pub commit: Option<Commit>,
    pub machine: Machine,
    /// The command that reproduces the run.
    pub command: String,
    pub quick: bool,
    pub shape: Shape,
    pub files: usize,
    /// From starting the control plane until /ready (objects read whole).
    pub startup_secs: f64,
    pub full_push: FullPush,
    pub changes: Changes,
    pub memory: MemoryFigures,
    pub verdicts: Vec<Verdict>,
}

/// The nearest-rank percentile (`p` in 0..=100) of unsorted values.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    Some(v[rank.min(v.len()) - 1])
}

impl Changes {
    pub fn from_samples(samples: Vec<Change>) -> Changes {
        let done: Vec<&Change> = samples.iter().filter(|c| c.latency_ms.is_some()).collect();
        let latencies: Vec<f64> = done.iter().filter_map(|c| c.latency_ms).collect();
        let firsts: Vec<f64> = samples.iter().filter_map(|c| c.first_ms).collect();
        let received: usize = samples.iter().map(|c| c.proxies).sum();
        let total: usize = samples.iter().map(|c| c.bytes_total).sum();
        Changes {
            count: samples.len(),
            completed: done.len(),
            latency_p50_ms: percentile(&latencies, 50.0),
            latency_p99_ms: percentile(&latencies, 99.0),
            latency_max_ms: percentile(&latencies, 100.0),
            first_proxy_p50_ms: percentile(&firsts, 50.0),
            bytes_per_proxy_mean: if received == 0 { 0.0 } else { total as f64 / received as f64 },
            bytes_per_proxy_max: samples.iter().map(|c| c.bytes_max).max().unwrap_or(0),
            samples,
        }
    }
}

/// Each figure against its target. A change that never reached every
/// proxy fails the latency target whatever the others did.
pub fn verdicts(push: &FullPush, changes: &Changes, memory: &MemoryFigures) -> Vec<Verdict> {
    let mut out = vec![Verdict {
        figure: "full push to every proxy".into(),
        target: format!("< {TARGET_FULL_PUSH_SECS} s"),
        value: format!("{:.2} s", push.secs),
        met: push.secs < TARGET_FULL_PUSH_SECS,
    }];
    let missed = changes.count - changes.completed;
    out.push(match changes.latency_p99_ms {
        Some(p99) => Verdict {
            figure: "one pod change to every proxy, p99".into(),
            target: format!("< {TARGET_CHANGE_P99_MS} ms"),
            value: if missed > 0 { format!("{p99:.1} ms ({missed} change(s) never arrived everywhere)") } else { format!("{p99:.1} ms") },
            met: p99 < TARGET_CHANGE_P99_MS && missed == 0,
        },
        None => Verdict {
            figure: "one pod change to every proxy, p99".into(),
            target: format!("< {TARGET_CHANGE_P99_MS} ms"),
            value: "no change arrived everywhere".into(),
            met: false,
        },
    });
    out.push(Verdict {
        figure: "bytes per change per proxy (max)".into(),
        target: format!("< {TARGET_CHANGE_BYTES} B"),
        value: format!("{} B (mean {:.0} B)", changes.bytes_per_proxy_max, changes.bytes_per_proxy_mean),
        met: changes.completed > 0 && (changes.bytes_per_proxy_max as f64) < TARGET_CHANGE_BYTES,
    });
    let peak = memory.after_changes.peak_mb.max(memory.after_push.peak_mb);
    out.push(Verdict {
        figure: "control plane RSS (peak, VmHWM)".into(),
        target: format!("< {TARGET_RSS_MB} MB"),
        value: format!("{peak:.1} MB (after the push {:.1} MB)", memory.after_push.rss_mb),
        met: peak < TARGET_RSS_MB,
    });
    out
}

fn ms(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1} ms")).unwrap_or_else(|| "-".into())
}

/// The Markdown summary.
pub fn markdown(r: &ControlReport) -> String {
    let s = &r.shape;
    let mut md = String::new();
    md.push_str("# Control plane benchmark (`slipstream bench-control`)\n\n");
    md.push_str(&format!(
        "Run {} (UTC), slipstream {}{}, took {:.0} s{}.\n\n",
        r.started.replace('T', " ").trim_end_matches('Z'),
        r.version,
        r.commit
            .as_ref()
            .map(|c| format!(" (commit `{}`{})", &c.hash[..c.hash.len().min(12)], if c.dirty { ", dirty" } else { "" }))
            .unwrap_or_default(),
        r.took_secs,
        if r.quick { ", **--quick: a smoke run, not a measurement**" } else { "" }
    ));
    md.push_str(&format!(
        "Machine: {}, {} cores, {:.1} GiB, Linux {} ({}); the bench's proxies share the cores with the control plane.\n\n",
        r.machine.cpu_model, r.machine.cores, r.machine.memory_gib, r.machine.kernel, r.machine.os
    ));
    md.push_str(&format!(
        "Cluster: {} pods on {} nodes, {} services, {} policies, {} namespaces ({} files); {} simulated node proxies, {} pod changes.\n\n",
        s.pods, s.nodes, s.services, s.policies, s.namespaces, r.files, s.nodes, r.changes.count
    ));
    md.push_str("| figure | value | target | |\n|---|---:|---|---|\n");
    for v in &r.verdicts {
        md.push_str(&format!("| {} | {} | {} | {} |\n", v.figure, v.value, v.target, if v.met { "met" } else { "**NOT MET**" }));
    }
    let c = &r.changes;
    md.push_str("\n| more figures | value |\n|---|---:|\n");
    md.push_str(&format!("| control plane start to ready (objects read) | {:.2} s |\n", r.startup_secs));
    md.push_str(&format!("| full push: first proxy complete | {:.2} s |\n", r.full_push.first_proxy_secs));
    md.push_str(&format!(
        "| full push: bytes per proxy | {:.1} MB ({} resources) |\n",
        r.full_push.bytes_per_proxy_mean / (1024.0 * 1024.0),
        r.full_push.resources_per_proxy
    ));
    md.push_str(&format!("| pod change to every proxy: p50 | {} |\n", ms(c.latency_p50_ms)));
    md.push_str(&format!("| pod change to every proxy: p99 | {} |\n", ms(c.latency_p99_ms)));
    md.push_str(&format!("| pod change to every proxy: max | {} |\n", ms(c.latency_max_ms)));
    md.push_str(&format!("| pod change to the first proxy: p50 | {} |\n", ms(c.first_proxy_p50_ms)));
    md.push_str(&format!("| changes that reached every proxy | {} of {} |\n", c.completed, c.count));
    let m = &r.memory;
    md.push_str(&format!(
        "| RSS when ready / after the push / after the changes | {:.1} / {:.1} / {:.1} MB |\n",
        m.ready.rss_mb, m.after_push.rss_mb, m.after_changes.rss_mb
    ));
    md.push_str(&format!("| peak RSS (VmHWM) | {:.1} MB |\n", m.after_changes.peak_mb));
    md.push_str(&format!("\nReproduce: `{}`\n", r.command));
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(latency: Option<f64>, bytes: usize, proxies: usize) -> Change {
        Change {
            pod: "ns0/p0".into(),
            what: "not ready".into(),
            latency_ms: latency,
            first_ms: latency.map(|l| l / 2.0),
            proxies,
            bytes_min: bytes,
            bytes_max: bytes,
            bytes_total: bytes * proxies,
            other_responses: 0,
        }
    }

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&[3.0], 99.0), Some(3.0));
        assert_eq!(percentile(&[], 50.0), None);
    }

    #[test]
    fn each_figure_is_judged_against_its_target() {
        let push = FullPush {
            secs: 2.5,
            first_proxy_secs: 1.0,
            bytes_per_proxy_mean: 5e6,
            bytes_per_proxy_max: 5_000_000,
            resources_per_proxy: 12_000,
        };
        let mem = |peak| Memory { rss_mb: 100.0, peak_mb: peak };
        let memory = MemoryFigures { ready: mem(90.0), after_push: mem(250.0), after_changes: mem(310.0) };
        let changes = Changes::from_samples(vec![change(Some(20.0), 900, 3), change(Some(40.0), 1100, 3)]);
        assert_eq!(changes.bytes_per_proxy_mean, 1000.0);
        let v = verdicts(&push, &changes, &memory);
        let met: Vec<bool> = v.iter().map(|v| v.met).collect();
        assert_eq!(met, [true, true, true, false], "{v:?}");
        // A change that never arrived everywhere fails the latency target.
        let changes = Changes::from_samples(vec![change(Some(20.0), 900, 3), change(None, 900, 2)]);
        let v = verdicts(&push, &changes, &memory);
        assert!(!v[1].met && v[1].value.contains("1 change(s) never arrived"), "{:?}", v[1]);
    }
}
