//! The targets of BENCHMARKS.md for the L4 mesh, checked against a run's
//! medians. Reported for reference: the benchmark never fails on them.

use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rule {
    /// Median ratio to `none` at least this.
    RatioAtLeast(f64),
    /// Median minus `none`'s at most this many (milliseconds).
    AddedAtMost(f64),
    /// Absolute value at most this (MB).
    AtMost(f64),
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Target {
    pub what: &'static str,
    /// Figure id in the medians, or [`IDLE_RSS`].
    pub figure: &'static str,
    pub rule: Rule,
    /// For `R1.rss_mb`: the target holds for this many open connections.
    pub at_connections: Option<usize>,
}

/// Pseudo figure id: the largest mesh process RSS after `up`.
pub const IDLE_RSS: &str = "idle.rss_mb";

pub const TARGETS: &[Target] = &[
    Target { what: "T1 throughput ≥ 0.50 × none", figure: "T1.gbps", rule: Rule::RatioAtLeast(0.5), at_connections: None },
    Target { what: "Q1 requests/s ≥ 0.50 × none", figure: "Q1.rps", rule: Rule::RatioAtLeast(0.5), at_connections: None },
    Target { what: "L1 p50 ≤ none + 1.5 ms", figure: "L1.p50_ms", rule: Rule::AddedAtMost(1.5), at_connections: None },
    Target { what: "L1 p99 ≤ none + 2.5 ms", figure: "L1.p99_ms", rule: Rule::AddedAtMost(2.5), at_connections: None },
    Target { what: "node proxy RSS idle ≤ 15 MB", figure: IDLE_RSS, rule: Rule::AtMost(15.0), at_connections: None },
    Target {
        what: "node proxy RSS with 10k open connections ≤ 40 MB",
        figure: "R1.rss_mb",
        rule: Rule::AtMost(40.0),
        at_connections: Some(10_000),
    },
];

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Met {
        measured: String,
    },
    Missed {
        measured: String,
    },
    /// Not measured as the target needs (missing figure, quick run, ...).
    NotMeasured(String),
}

/// Checks one target for a scenario. `idle_rss` is the largest mesh
/// process's idle RSS; `held` the connections R1 held in this run.
pub fn check(
    t: &Target,
    scenario: &BTreeMap<String, f64>,
    baseline: &BTreeMap<String, f64>,
    idle_rss: Option<f64>,
    held: usize,
) -> Verdict {
    let value = if t.figure == IDLE_RSS { idle_rss } else { scenario.get(t.figure).copied() };
    let Some(v) = value else { return Verdict::NotMeasured("no result".into()) };
    if let Some(n) = t.at_connections {
        if held < n {
            return Verdict::NotMeasured(format!("this run held {held} connections"));
        }
    }
    let (ok, measured) = match t.rule {
        Rule::RatioAtLeast(min) => match baseline.get(t.figure).and_then(|b| crate::stats::ratio(v, *b)) {
            Some(r) => (r >= min, format!("{r:.2}×")),
            None => return Verdict::NotMeasured("no baseline".into()),
        },
        Rule::AddedAtMost(max) => match baseline.get(t.figure) {
            Some(b) => (v - b <= max, format!("{:+.2} ms", v - b)),
            None => return Verdict::NotMeasured("no baseline".into()),
        },
        Rule::AtMost(max) => (v <= max, format!("{v:.1} MB")),
    };
    if ok {
        Verdict::Met { measured }
    } else {
        Verdict::Missed { measured }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn verdicts() {
        let base = m(&[("T1.gbps", 10.0), ("L1.p50_ms", 2.0)]);
        let l4 = m(&[("T1.gbps", 2.0), ("L1.p50_ms", 3.0), ("R1.rss_mb", 30.0)]);
        assert_eq!(check(&TARGETS[0], &l4, &base, None, 10_000), Verdict::Missed { measured: "0.20×".into() });
        assert_eq!(check(&TARGETS[2], &l4, &base, None, 10_000), Verdict::Met { measured: "+1.00 ms".into() });
        assert_eq!(check(&TARGETS[1], &l4, &base, None, 10_000), Verdict::NotMeasured("no result".into()));
        assert_eq!(check(&TARGETS[4], &l4, &base, Some(14.0), 10_000), Verdict::Met { measured: "14.0 MB".into() });
        assert_eq!(check(&TARGETS[5], &l4, &base, None, 10_000), Verdict::Met { measured: "30.0 MB".into() });
        assert_eq!(check(&TARGETS[5], &l4, &base, None, 1000), Verdict::NotMeasured("this run held 1000 connections".into()));
    }
}
