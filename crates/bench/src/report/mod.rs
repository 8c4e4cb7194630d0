//! The human-readable report: a Markdown page (run facts, the chart, the
//! table of every figure with its ratio to `none`, the mesh processes'
//! resources, the targets, how to reproduce) and the SVG chart. Rendered
//! from [`Results`] alone, so old results can be re-rendered. Pure.

pub mod chart;
pub mod fmt;
pub mod targets;

use crate::experiment::{ExperimentId, EXPERIMENTS};
use crate::results::Results;
use crate::scenario::BASELINE;
use crate::stats::{self, figure_id, MESH_CPU, MESH_PEAK_RSS};
use chart::ChartRow;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Where the page is going.
#[derive(Debug, Clone)]
pub struct Page {
    pub title: String,
    /// Link to the chart, relative to the page.
    pub chart_href: String,
    /// A note at the top (for the docs page: generated, do not edit).
    pub preamble: Option<String>,
}

struct View<'a> {
    r: &'a Results,
    medians: BTreeMap<String, BTreeMap<String, f64>>,
    /// Measured scenarios, baseline first.
    measured: Vec<&'a str>,
    empty: BTreeMap<String, f64>,
}

impl<'a> View<'a> {
    fn new(r: &'a Results) -> View<'a> {
        let measured = r.scenarios.iter().filter(|s| s.not_available.is_none()).map(|s| s.name.as_str()).collect();
        View { r, medians: stats::medians(&r.runs), measured, empty: BTreeMap::new() }
    }

    fn compared(&self) -> Vec<&'a str> {
        self.measured.iter().copied().filter(|s| *s != BASELINE).collect()
    }

    fn of(&self, scenario: &str) -> &BTreeMap<String, f64> {
        self.medians.get(scenario).unwrap_or(&self.empty)
    }

    fn get(&self, scenario: &str, id: &str) -> Option<f64> {
        self.of(scenario).get(id).copied()
    }

    fn ratio(&self, scenario: &str, id: &str) -> Option<f64> {
        stats::ratio(self.get(scenario, id)?, self.get(BASELINE, id)?)
    }

    /// Why a cell is empty: every repetition failed, or none ran.
    fn missing(&self, scenario: &str, e: ExperimentId) -> &'static str {
        if self.r.runs.iter().any(|run| run.scenario == scenario && run.experiment == e) {
            "failed"
        } else {
            "not run"
        }
    }

    /// Whether the run measured scenario `n` (asked for and available).
    fn available(&self, n: &str) -> bool {
        self.r.scenarios.iter().any(|x| x.name == n && x.not_available.is_none())
    }

    fn idle_rss(&self) -> Option<f64> {
        self.r.idle.iter().filter(|p| crate::results::is_node_proxy(&p.process)).map(|p| p.rss_mb).reduce(f64::max)
    }
}

/// The chart's rows: every figure reported as a ratio.
pub fn chart_rows(r: &Results) -> Vec<ChartRow> {
    let v = View::new(r);
    let compared = v.compared();
    let mut rows = Vec::new();
    for e in EXPERIMENTS {
        for f in e.figures().iter().filter(|f| f.ratio) {
            let id = figure_id(e, f.key);
            let target = targets::TARGETS.iter().find_map(|t| match t.rule {
                targets::Rule::RatioAtLeast(x) if t.figure == id => Some(x),
                _ => None,
            });
            let label = if f.unit == "ms" { format!("{e} {} ms", f.label) } else { format!("{e} {}", f.unit) };
            rows.push(ChartRow {
                label,
                figure: id.clone(),
                better: f.better,
                ratios: compared.iter().map(|s| v.ratio(s, &id)).collect(),
                target,
            });
        }
    }
    rows
}

pub fn svg(r: &Results) -> String {
    let v = View::new(r);
    let compared: Vec<String> = v.compared().iter().map(|s| s.to_string()).collect();
    let title =
        format!("Slipstream vs. no mesh: median of {} repetition(s){}", r.settings.reps, if r.settings.quick { ", quick run" } else { "" });
    chart::render(&title, &compared, &chart_rows(r))
}

pub fn markdown(r: &Results, page: &Page) -> String {
    let v = View::new(r);
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n", page.title);
    if let Some(p) = &page.preamble {
        let _ = writeln!(s, "{p}\n");
    }
    facts(&mut s, r);
    if !r.complete {
        let _ = writeln!(s, "**This run was interrupted: some figures are missing.**\n");
    }
    let _ = writeln!(s, "![ratio of every figure to none]({})\n", page.chart_href);
    main_table(&mut s, &v);
    resources_table(&mut s, &v);
    targets_table(&mut s, &v);
    ebpf_targets(&mut s, &v);
    waypoint_targets(&mut s, &v);
    failures(&mut s, r);
    scenarios(&mut s, r);
    experiments(&mut s, r);
    reproduce(&mut s, r);
    s
}

/// The tables alone, for the terminal at the end of a run.
pub fn summary(r: &Results) -> String {
    let v = View::new(r);
    let mut s = String::new();
    main_table(&mut s, &v);
    resources_table(&mut s, &v);
    targets_table(&mut s, &v);
    ebpf_targets(&mut s, &v);
    waypoint_targets(&mut s, &v);
    s.trim_end().to_string()
}

fn facts(s: &mut String, r: &Results) {
    let commit = match &r.commit {
        Some(c) => format!("commit `{}`{}", &c.hash[..c.hash.len().min(12)], if c.dirty { " with uncommitted changes" } else { "" }),
        None => "commit unknown".into(),
    };
    let m = &r.machine;
    let tools: Vec<String> = r.tools.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let _ = writeln!(
        s,
        "Run {} (UTC), slipstream {} ({commit}), {} repetition(s) per figure{}, {}.\n\n\
         Machine: {}, {} cores, {:.1} GiB, Linux {} ({}), open-file limit {}. Tools: {}.\n",
        r.started_at.replace('T', " ").trim_end_matches('Z'),
        r.version,
        r.settings.reps,
        if r.settings.quick { " (`--quick`: short durations, a smoke test, not a measurement)" } else { "" },
        if r.duration_s > 0.0 {
            format!("took {}", crate::timefmt::human(std::time::Duration::from_secs_f64(r.duration_s)))
        } else {
            "duration unknown".into()
        },
        m.cpu_model,
        m.cores,
        m.memory_gib,
        m.kernel,
        m.os,
        m.open_files_limit,
        if tools.is_empty() { "unknown".into() } else { tools.join(", ") },
    );
}

fn header(s: &mut String, first: &[&str], v: &View) {
    let _ = writeln!(s, "| {} | {} |", first.join(" | "), v.measured.join(" | "));
    let _ = writeln!(s, "|{}{}", "---|".repeat(first.len()), "---:|".repeat(v.measured.len()));
}

fn main_table(s: &mut String, v: &View) {
    let _ = writeln!(
        s,
        "## Results\n\nMedian over the repetitions; in parentheses the ratio to `{BASELINE}` measured in the same run \
         (for latencies also the milliseconds added).\n"
    );
    header(s, &["experiment", "figure"], v);
    for e in EXPERIMENTS {
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

fn resources_table(s: &mut String, v: &View) {
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

fn targets_table(s: &mut String, v: &View) {
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
fn ebpf_targets(s: &mut String, v: &View) {
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
fn waypoint_targets(s: &mut String, v: &View) {
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
    let _ = writeln!(
        s,
        "## Targets for the waypoint

For reference only: the benchmark measures, it never fails on a target. The waypoint's memory is its \
process, as Kubernetes reports a container's; its pod adds the sandbox's `pod-init` processes.
"
    );
    let _ = writeln!(s, "| target | l7 |\n|---|---|");
    let _ = writeln!(s, "| Q1 requests/s ≥ 0.30 × none | {q1_cell} |");
    let _ = writeln!(s, "| L1 p50 ≤ none + 3 ms | {l1_cell} |");
    let _ = writeln!(s, "| waypoint RSS idle < 30 MB | {rss_cell} |");
    s.push('\n');
}

fn failures(s: &mut String, r: &Results) {
    let failed: Vec<_> = r.runs.iter().filter(|x| !x.ok()).collect();
    if !failed.is_empty() {
        let _ = writeln!(s, "## Failed runs\n\nThese repetitions produced no figures; the medians are over the others.\n");
        for f in failed {
            let _ = writeln!(s, "- {} {} rep {}: {}", f.scenario, f.experiment, f.rep, f.error.as_deref().unwrap_or(""));
        }
        s.push('\n');
    }
    let warned: Vec<_> = r.runs.iter().filter(|x| !x.warnings.is_empty()).collect();
    if !warned.is_empty() {
        let _ = writeln!(s, "## Warnings\n\nThese repetitions count, but did not go exactly as asked.\n");
        for w in warned {
            let _ = writeln!(s, "- {} {} rep {}: {}", w.scenario, w.experiment, w.rep, w.warnings.join("; "));
        }
        s.push('\n');
    }
}

fn scenarios(s: &mut String, r: &Results) {
    let _ = writeln!(s, "## Scenarios\n");
    for x in &r.scenarios {
        match &x.not_available {
            None => {
                let _ = writeln!(s, "- `{}`: {} (namespace `{}`)", x.name, x.description, x.namespace.as_deref().unwrap_or("?"));
            }
            Some(why) => {
                let _ = writeln!(s, "- `{}`: {}: **{why}**", x.name, x.description);
            }
        }
    }
    let _ = writeln!(
        s,
        "\nEach measured scenario is a namespace of one local cluster (`bench`, 2 nodes) holding the same two pods: a \
         client on node1 and a server on node2 (fortio's HTTP and TCP echo servers and an iperf3 server) behind the \
         Service `server`, which every experiment addresses by name.\n"
    );
}

fn experiments(s: &mut String, r: &Results) {
    let _ = writeln!(s, "## Experiments\n\n| id | what | run in the client pod |\n|---|---|---|");
    for e in &r.experiments {
        let _ = writeln!(s, "| {} | {} | `{}` |", e.id, e.title, fmt::cell(&e.command));
    }
    let _ = writeln!(
        s,
        "\nSteps run in the order repetition, experiment, scenario: the scenarios compared in one figure are measured \
         back to back, the repetitions of one experiment minutes apart. R1's held connections come last, scenario by \
         scenario, so that the memory a proxy keeps after them inflates no other figure; each R1 waits until the \
         proxies have closed their side before the next step, and the next R1 of the same scenario waits a further \
         TIME_WAIT (60 s) so that its connections cannot collide with the sockets of the last.\n"
    );
}

fn reproduce(s: &mut String, r: &Results) {
    let _ = writeln!(
        s,
        "## Reproduce\n\nAs root, from a clone of the repository{}:\n\n```sh\nscripts/setup.sh\ncargo build --release -p slipstream-cli\n{}\n```\n\n\
         `results.json` holds every repetition, the machine and the tools; `--quick` is the smoke test CI runs.",
        r.commit.as_ref().map(|c| format!(" at commit `{}`", c.hash)).unwrap_or_default(),
        reproduce_command(&r.command),
    );
}

/// The recorded command, run from the build directory, without `--out`
/// (where the files went changes no figure).
fn reproduce_command(command: &str) -> String {
    let mut out = Vec::new();
    let mut words = command.split(' ');
    while let Some(w) = words.next() {
        if w == "--out" {
            words.next();
        } else if !w.starts_with("--out=") {
            out.push(w);
        }
    }
    out.join(" ").replacen("slipstream ", "/var/tmp/slipstream-target/release/slipstream ", 1)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::results::{Commit, ExperimentInfo, Machine, ProcSample, ProcUsage, Run};
    use crate::scenario::{self, SCENARIOS};
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
                ProcUsage {
                    process: "node proxy node1".into(),
                    pids: vec![1],
                    cpu_s: cpu,
                    peak_rss_mb: 16.0,
                    rss_mb: 15.0,
                    restarted: false,
                },
                ProcUsage {
                    process: "node proxy node2".into(),
                    pids: vec![2],
                    cpu_s: cpu,
                    peak_rss_mb: 18.0,
                    rss_mb: 15.0,
                    restarted: false,
                },
            ],
            raw: vec![],
        }
    }

    /// A plausible complete run: none, l4-nft and l4-ebpf measured, the
    /// others not available.
    pub fn sample() -> Results {
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
            idle: vec![
                ProcSample { process: "node proxy node1".into(), pids: vec![1], rss_mb: 13.9, anon_mb: Some(1.8), pod_rss_mb: None },
                ProcSample { process: "node proxy node2".into(), pids: vec![2], rss_mb: 14.2, anon_mb: None, pod_rss_mb: None },
            ],
            runs,
            medians: Default::default(),
            settings: s,
        }
    }

    fn page() -> Page {
        Page { title: "Benchmarks".into(), chart_href: "chart.svg".into(), preamble: None }
    }

    fn line<'a>(md: &'a str, start: &str) -> &'a str {
        md.lines().find(|l| l.starts_with(start)).unwrap_or_else(|| panic!("no line starting with {start:?} in\n{md}"))
    }

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

    #[test]
    fn reproduce_command_drops_the_output_directory() {
        assert_eq!(
            reproduce_command("slipstream bench --out /tmp/x --update-docs --out=y --reps 5"),
            "/var/tmp/slipstream-target/release/slipstream bench --update-docs --reps 5"
        );
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

    #[test]
    fn chart_has_one_bar_per_ratio_figure_and_compared_scenario() {
        let r = sample();
        let svg = svg(&r);
        chart::tests::well_formed(&svg).unwrap();
        let ratio_figures: usize = EXPERIMENTS.iter().map(|e| e.figures().iter().filter(|f| f.ratio).count()).sum();
        assert_eq!(svg.matches("class=\"bar\"").count(), 3 * ratio_figures, "three compared scenarios (l4-nft, l4-ebpf, l7)");
        let rows = chart_rows(&r);
        assert_eq!(rows.len(), ratio_figures);
        let t1 = rows.iter().find(|x| x.figure == "T1.gbps").unwrap();
        assert_eq!((t1.ratios[..2].to_vec(), t1.target), (vec![Some(0.25), Some(0.5)], Some(0.5)));
        assert!(t1.ratios[2].is_some_and(|r| (r - 0.2).abs() < 1e-9), "l7: {:?}", t1.ratios);
        assert!(svg.contains(">0.25×<") && svg.contains(">4.00×<"));
        assert!(scenario::find("l4-nft").is_some());
    }
}
