//! From a tool's parsed output to an experiment's figures. Pure.

use crate::experiment::ExperimentId;
use crate::parse::fortio::FortioRun;
use crate::parse::iperf::IperfRun;
use std::collections::BTreeMap;

/// More failed requests than this fraction and the run is not a result.
pub const MAX_ERROR_FRACTION: f64 = 0.01;

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Outcome {
    pub figures: BTreeMap<String, f64>,
    pub details: BTreeMap<String, f64>,
    /// The figures are real but not what was asked for.
    pub warnings: Vec<String>,
}

fn map(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

pub fn from_iperf(r: &IperfRun) -> Result<Outcome, String> {
    if r.received_gbps <= 0.0 {
        return Err("iperf3 measured no throughput".into());
    }
    let mut details = map(&[("sent_gbps", r.sent_gbps), ("seconds", r.seconds), ("streams", r.streams as f64)]);
    if let Some(n) = r.retransmits {
        details.insert("retransmits".into(), n as f64);
    }
    Ok(Outcome { figures: map(&[("gbps", r.received_gbps)]), details, warnings: vec![] })
}

pub fn from_fortio(e: ExperimentId, r: &FortioRun) -> Result<Outcome, String> {
    if r.ok == 0 {
        return Err(format!("no successful request ({} failed)", r.errors));
    }
    if r.errors as f64 > MAX_ERROR_FRACTION * r.requests as f64 {
        return Err(format!("{} of {} requests failed", r.errors, r.requests));
    }
    let p = |q: f64| r.percentile_ms(q).ok_or_else(|| format!("fortio reported no p{q}"));
    let warnings = match r.errors {
        0 => vec![],
        n => vec![format!("{n} of {} requests failed", r.requests)],
    };
    let figures = match e {
        ExperimentId::L1 => {
            map(&[("p50_ms", p(50.0)?), ("p90_ms", p(90.0)?), ("p99_ms", p(99.0)?), ("p99.9_ms", p(99.9)?), ("avg_ms", r.avg_ms)])
        }
        ExperimentId::Q1 => map(&[("rps", r.ok_per_sec()), ("p50_ms", p(50.0)?), ("p99_ms", p(99.0)?)]),
        ExperimentId::C1 => map(&[("cps", r.sockets_per_sec())]),
        other => return Err(format!("{other} is not a fortio experiment")),
    };
    let details = map(&[
        ("actual_qps", r.actual_qps),
        ("requests", r.requests as f64),
        ("errors", r.errors as f64),
        ("connections", r.sockets as f64),
        ("seconds", r.duration_s),
    ]);
    Ok(Outcome { figures, details, warnings })
}

/// What R1's holder saw.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Hold {
    pub wanted: usize,
    pub established: usize,
    pub failed: usize,
    pub first_error: Option<String>,
    pub open_s: f64,
    /// Largest mesh process RSS with the connections open.
    pub rss_mb: Option<f64>,
    /// ... and after they were closed and the proxies let go of them.
    pub rss_after_mb: Option<f64>,
    /// How long the proxies took to close their side; None: not within the
    /// wait.
    pub drain_s: Option<f64>,
}

/// R1: connections held and the largest mesh process's RSS with them open
/// and after. Fewer connections than asked is still a result (the memory
/// they took is real), with a warning; none at all is not.
pub fn from_hold(h: &Hold) -> Result<Outcome, String> {
    let mut details = map(&[("wanted", h.wanted as f64), ("failed", h.failed as f64), ("open_s", h.open_s)]);
    let why = h.first_error.as_deref().map(|e| format!("; first error: {e}")).unwrap_or_default();
    if h.established == 0 {
        return Err(format!("no connection could be opened and echoed{why}"));
    }
    let mut warnings = vec![];
    if h.established < h.wanted {
        warnings.push(format!("only {} of {} connections could be opened and echoed{why}", h.established, h.wanted));
    } else if h.failed > 0 {
        warnings.push(format!("{} connection attempts failed before all {} were held{why}", h.failed, h.wanted));
    }
    match h.drain_s {
        Some(d) => {
            details.insert("drain_s".into(), d);
        }
        None => warnings.push("the node proxies had not closed their side of the connections when the bench stopped waiting".into()),
    }
    let mut figures = map(&[("connections", h.established as f64)]);
    for (k, v) in [("rss_mb", h.rss_mb), ("rss_after_mb", h.rss_after_mb)] {
        if let Some(v) = v {
            figures.insert(k.into(), v);
        }
    }
    Ok(Outcome { figures, details, warnings })
}

/// One line for the progress display.
pub fn headline(e: ExperimentId, o: &Outcome) -> String {
    let f = |k: &str| o.figures.get(k).copied().unwrap_or(f64::NAN);
    match e {
        ExperimentId::T1 | ExperimentId::T2 => format!("{:.2} Gb/s", f("gbps")),
        ExperimentId::L1 => format!("p50 {:.2} ms, p99 {:.2} ms", f("p50_ms"), f("p99_ms")),
        ExperimentId::Q1 => format!("{:.0} req/s, p99 {:.2} ms", f("rps"), f("p99_ms")),
        ExperimentId::C1 => format!("{:.0} conn/s", f("cps")),
        ExperimentId::R1 => match o.figures.get("rss_mb") {
            Some(rss) => format!("{:.0} connections, largest node proxy {rss:.1} MB", f("connections")),
            None => format!("{:.0} connections", f("connections")),
        },
        ExperimentId::S1 => format!("p50 {:.0} ms, p99 {:.0} ms", f("p50_ms"), f("p99_ms")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::{fortio, iperf};

    #[test]
    fn iperf_figure_is_received_throughput() {
        let r = iperf::parse(include_str!("../testdata/iperf3-t2.json")).unwrap();
        let o = from_iperf(&r).unwrap();
        assert!((o.figures["gbps"] - 21.267005099680112).abs() < 1e-9);
        assert_eq!(o.details["streams"], 4.0);
        assert_eq!(headline(ExperimentId::T2, &o), "21.27 Gb/s");
    }

    #[test]
    fn fortio_figures_per_experiment() {
        let q = fortio::parse(include_str!("../testdata/fortio-q1.json")).unwrap();
        let l1 = from_fortio(ExperimentId::L1, &q).unwrap();
        assert_eq!(l1.figures.keys().collect::<Vec<_>>(), ["avg_ms", "p50_ms", "p90_ms", "p99.9_ms", "p99_ms"]);
        for f in ExperimentId::L1.figures() {
            assert!(l1.figures.contains_key(f.key), "{}", f.key);
        }
        let q1 = from_fortio(ExperimentId::Q1, &q).unwrap();
        assert!((q1.figures["rps"] - 55560.0 / 2.000365209).abs() < 1e-6);
        assert!(headline(ExperimentId::Q1, &q1).starts_with("27775 req/s, p99 "));
        let c = fortio::parse(include_str!("../testdata/fortio-c1.json")).unwrap();
        let c1 = from_fortio(ExperimentId::C1, &c).unwrap();
        assert!((c1.figures["cps"] - 15105.0 / 2.000604037).abs() < 1e-6);
        assert_eq!(c1.details["connections"], 15105.0);
        assert!(from_fortio(ExperimentId::T1, &q).is_err());
    }

    #[test]
    fn too_many_failed_requests_is_no_result() {
        let r = fortio::parse(include_str!("../testdata/fortio-errors.json")).unwrap();
        assert_eq!(from_fortio(ExperimentId::Q1, &r).unwrap_err(), "3707 of 12191 requests failed");
        let mut few = r.clone();
        few.errors = 3;
        few.ok = few.requests - 3;
        assert_eq!(from_fortio(ExperimentId::Q1, &few).unwrap().warnings, ["3 of 12191 requests failed"]);
    }

    #[test]
    fn hold_needs_every_connection() {
        let full = Hold {
            wanted: 1000,
            established: 1000,
            open_s: 0.8,
            rss_mb: Some(21.5),
            rss_after_mb: Some(19.0),
            drain_s: Some(0.4),
            ..Default::default()
        };
        let o = from_hold(&full).unwrap();
        assert_eq!((o.figures["connections"], o.figures["rss_mb"], o.figures["rss_after_mb"]), (1000.0, 21.5, 19.0));
        assert_eq!(o.details["drain_s"], 0.4);
        assert!(o.warnings.is_empty());
        assert_eq!(headline(ExperimentId::R1, &o), "1000 connections, largest node proxy 21.5 MB");
        let partial =
            from_hold(&Hold { established: 990, failed: 10, first_error: Some("reset".into()), drain_s: None, ..full.clone() }).unwrap();
        assert_eq!(partial.figures["connections"], 990.0);
        assert_eq!(partial.warnings.len(), 2);
        assert_eq!(partial.warnings[0], "only 990 of 1000 connections could be opened and echoed; first error: reset");
        let retried = from_hold(&Hold { failed: 3, first_error: Some("reset".into()), ..full.clone() }).unwrap();
        assert_eq!(retried.warnings, ["3 connection attempts failed before all 1000 were held; first error: reset"]);
        let none = Hold { established: 0, failed: 20, first_error: Some("refused".into()), ..full };
        assert!(from_hold(&none).unwrap_err().contains("refused"));
    }
}
