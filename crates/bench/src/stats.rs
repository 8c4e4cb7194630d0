//! Statistics over repetitions: medians per scenario and figure, ratios and
//! differences to the baseline. Pure.

use crate::experiment::ExperimentId;
use crate::results::Run;
use std::collections::BTreeMap;

/// Figure ids derived from the mesh processes' usage during a run.
pub const MESH_CPU: &str = "mesh_cpu_s";
pub const MESH_PEAK_RSS: &str = "mesh_peak_rss_mb";

pub fn figure_id(e: ExperimentId, key: &str) -> String {
    format!("{e}.{key}")
}

/// The median; the mean of the two middle values for an even count. None
/// for no values; NaNs are ignored.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

/// `value / baseline`, when both are meaningful.
pub fn ratio(value: f64, baseline: f64) -> Option<f64> {
    (value.is_finite() && baseline.is_finite() && baseline > 0.0).then(|| value / baseline)
}

/// Scenario -> figure id -> median over the successful repetitions. Covers
/// every experiment figure, and `<EXP>.mesh_cpu_s` / `<EXP>.mesh_peak_rss_mb`
/// for the mesh processes' usage.
pub fn medians(runs: &[Run]) -> BTreeMap<String, BTreeMap<String, f64>> {
    let mut samples: BTreeMap<(String, String), Vec<f64>> = BTreeMap::new();
    for r in runs.iter().filter(|r| r.ok()) {
        let mut add = |id: String, v: f64| samples.entry((r.scenario.clone(), id)).or_default().push(v);
        for (k, v) in &r.figures {
            add(figure_id(r.experiment, k), *v);
        }
        if let Some(c) = r.mesh_cpu_s() {
            add(figure_id(r.experiment, MESH_CPU), c);
        }
        if let Some(m) = r.mesh_peak_rss_mb() {
            add(figure_id(r.experiment, MESH_PEAK_RSS), m);
        }
    }
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for ((scenario, id), v) in samples {
        if let Some(m) = median(&v) {
            out.entry(scenario).or_default().insert(id, m);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::ProcUsage;

    fn run(scenario: &str, e: ExperimentId, rep: u32, figures: &[(&str, f64)], cpu: &[f64]) -> Run {
        Run {
            scenario: scenario.into(),
            experiment: e,
            rep,
            started_at: String::new(),
            elapsed_s: 1.0,
            error: None,
            warnings: vec![],
            figures: figures.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            details: Default::default(),
            mesh: cpu
                .iter()
                .enumerate()
                .map(|(i, c)| ProcUsage {
                    process: format!("node proxy node{}", i + 1),
                    pids: vec![100 + i as i32],
                    cpu_s: *c,
                    peak_rss_mb: 10.0 + i as f64,
                    rss_mb: 9.0,
                    restarted: false,
                })
                .collect(),
            raw: vec![],
        }
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 1.0]), Some(1.0));
    }

    #[test]
    fn ratios_need_a_positive_baseline() {
        assert_eq!(ratio(1.0, 4.0), Some(0.25));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
    }

    #[test]
    fn medians_per_scenario_and_figure_skip_failed_runs() {
        let mut failed = run("none", ExperimentId::T1, 3, &[("gbps", 100.0)], &[]);
        failed.error = Some("boom".into());
        let runs = vec![
            run("none", ExperimentId::T1, 1, &[("gbps", 10.0)], &[0.0, 0.0]),
            run("none", ExperimentId::T1, 2, &[("gbps", 12.0)], &[0.0, 0.0]),
            failed,
            run("l4-nft", ExperimentId::T1, 1, &[("gbps", 3.0)], &[1.0, 2.0]),
            run("l4-nft", ExperimentId::T1, 2, &[("gbps", 2.0)], &[2.0, 2.0]),
            run("l4-nft", ExperimentId::T1, 3, &[("gbps", 4.0)], &[3.0, 2.0]),
        ];
        let m = medians(&runs);
        assert_eq!(m["none"]["T1.gbps"], 11.0);
        assert_eq!(m["l4-nft"]["T1.gbps"], 3.0);
        assert_eq!(m["l4-nft"]["T1.mesh_cpu_s"], 4.0, "sum over processes, then median");
        assert_eq!(m["l4-nft"]["T1.mesh_peak_rss_mb"], 11.0, "largest process");
        assert_eq!(m["none"]["T1.mesh_cpu_s"], 0.0);
    }
}
