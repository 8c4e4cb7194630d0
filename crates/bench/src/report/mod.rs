//! The human-readable report: a Markdown page (run facts, the chart, the
//! table of every figure with its ratio to `none`, the mesh processes'
//! resources, the targets, how to reproduce) and the SVG chart. Rendered
//! from [`Results`] alone, so old results can be re-rendered. Pure.
//!
//! The tables are in `tables`, the chart's rows and its SVG in [`chart`],
//! the prose sections (facts, failures, scenarios, experiments,
//! reproduce) in `prose`, what differs on Kubernetes (`--kubeconfig`: the
//! cluster, S1's target) in `kube`.

pub mod chart;
pub mod fmt;
mod kube;
mod prose;
mod tables;
pub mod targets;
#[cfg(test)]
mod tests;

pub use chart::rows as chart_rows;

use crate::experiment::ExperimentId;
use crate::results::Results;
use crate::scenario::BASELINE;
use crate::stats;
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

/// The results as the tables read them: medians per scenario, the
/// scenarios measured.
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

    /// The experiments the report has rows for: the local bench's, or
    /// Kubernetes' (with S1, without R1's held connections).
    fn experiments(&self) -> &'static [ExperimentId] {
        if self.r.kubernetes.is_some() {
            &crate::experiment::KUBE_EXPERIMENTS
        } else {
            &crate::experiment::EXPERIMENTS
        }
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

/// A table's header: the `first` columns, then one per measured scenario.
fn header(s: &mut String, first: &[&str], v: &View) {
    let _ = writeln!(s, "| {} | {} |", first.join(" | "), v.measured.join(" | "));
    let _ = writeln!(s, "|{}{}", "---|".repeat(first.len()), "---:|".repeat(v.measured.len()));
}

/// The SVG chart: every figure's ratio to `none`, per compared scenario.
pub fn svg(r: &Results) -> String {
    let v = View::new(r);
    let compared: Vec<String> = v.compared().iter().map(|s| s.to_string()).collect();
    let title =
        format!("Slipstream vs. no mesh: median of {} repetition(s){}", r.settings.reps, if r.settings.quick { ", quick run" } else { "" });
    chart::render(&title, &compared, &chart::rows(r))
}

/// The Markdown page.
pub fn markdown(r: &Results, page: &Page) -> String {
    let v = View::new(r);
    let mut s = String::new();
    let _ = writeln!(s, "# {}\n", page.title);
    if let Some(p) = &page.preamble {
        let _ = writeln!(s, "{p}\n");
    }
    prose::facts(&mut s, r);
    if !r.complete {
        let _ = writeln!(s, "**This run was interrupted: some figures are missing.**\n");
    }
    let _ = writeln!(s, "![ratio of every figure to none]({})\n", page.chart_href);
    tables::main_table(&mut s, &v);
    tables::resources_table(&mut s, &v);
    tables::targets_table(&mut s, &v);
    tables::ebpf_targets(&mut s, &v);
    tables::waypoint_targets(&mut s, &v);
    kube::pod_start_targets(&mut s, &v);
    prose::failures(&mut s, r);
    prose::scenarios(&mut s, r);
    prose::experiments(&mut s, r);
    prose::reproduce(&mut s, r);
    s
}

/// The tables alone, for the terminal at the end of a run.
pub fn summary(r: &Results) -> String {
    let v = View::new(r);
    let mut s = String::new();
    tables::main_table(&mut s, &v);
    tables::resources_table(&mut s, &v);
    tables::targets_table(&mut s, &v);
    tables::ebpf_targets(&mut s, &v);
    tables::waypoint_targets(&mut s, &v);
    kube::pod_start_targets(&mut s, &v);
    s.trim_end().to_string()
}
