//! The experiments of BENCHMARKS.md: what each runs, in which pod, and which
//! figures it reports. Pure: the runner executes what this describes.

use crate::manifests;
use crate::settings::Settings;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ExperimentId {
    T1,
    T2,
    L1,
    Q1,
    C1,
    R1,
    /// Pod start, on Kubernetes only: from a pod's creation to its first
    /// request served (`crate::kube::podstart`).
    S1,
}

/// In the order they run within a repetition.
pub const EXPERIMENTS: [ExperimentId; 6] =
    [ExperimentId::T1, ExperimentId::T2, ExperimentId::L1, ExperimentId::Q1, ExperimentId::C1, ExperimentId::R1];

/// The experiments on Kubernetes (`--kubeconfig`), in run order: R1's held
/// connections need the bench inside the client pod's network namespace,
/// which it cannot enter on a remote node; S1 (pod start) is Kubernetes'
/// own.
pub const KUBE_EXPERIMENTS: [ExperimentId; 6] =
    [ExperimentId::T1, ExperimentId::T2, ExperimentId::L1, ExperimentId::Q1, ExperimentId::C1, ExperimentId::S1];

/// Every experiment, local or not, in report order.
pub const ALL_EXPERIMENTS: [ExperimentId; 7] =
    [ExperimentId::T1, ExperimentId::T2, ExperimentId::L1, ExperimentId::Q1, ExperimentId::C1, ExperimentId::R1, ExperimentId::S1];

/// The experiments named in `requested` (comma-separated ids such as `L1,Q1`,
/// any case), in run order; all of them when empty or `all`.
pub fn select(requested: &[String]) -> Result<Vec<ExperimentId>, String> {
    select_from(&EXPERIMENTS, requested)
}

/// [`select`] among `known`.
pub fn select_from(known: &[ExperimentId], requested: &[String]) -> Result<Vec<ExperimentId>, String> {
    let wanted: Vec<String> = requested.iter().map(|s| s.trim().to_ascii_uppercase()).filter(|s| !s.is_empty()).collect();
    if wanted.is_empty() || wanted == ["ALL"] {
        return Ok(known.to_vec());
    }
    let unknown: Vec<&str> = wanted.iter().map(String::as_str).filter(|w| !known.iter().any(|e| e.to_string() == *w)).collect();
    if !unknown.is_empty() {
        let names: Vec<String> = known.iter().map(|e| e.to_string()).collect();
        return Err(format!("unknown experiment(s) {}: known are {}", unknown.join(", "), names.join(", ")));
    }
    Ok(known.iter().copied().filter(|e| wanted.contains(&e.to_string())).collect())
}

impl fmt::Display for ExperimentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Whether a larger value is an improvement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
}

/// One number an experiment reports.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FigureDef {
    /// Key in the results (`gbps`, `p99_ms`, ...).
    pub key: &'static str,
    pub label: &'static str,
    pub unit: &'static str,
    pub better: Better,
    /// Reported as a ratio to `none` (false for absolute figures such as a
    /// proxy's memory, which `none` has no equivalent of).
    pub ratio: bool,
    /// Also report the difference to `none` (latencies: "added ms").
    pub added: bool,
}

const fn fig(key: &'static str, label: &'static str, unit: &'static str, better: Better) -> FigureDef {
    FigureDef { key, label, unit, better, ratio: true, added: false }
}

const fn ms(key: &'static str, label: &'static str) -> FigureDef {
    FigureDef { key, label, unit: "ms", better: Better::Lower, ratio: true, added: true }
}

const THROUGHPUT: &[FigureDef] = &[fig("gbps", "throughput", "Gb/s", Better::Higher)];
const LATENCY: &[FigureDef] =
    &[ms("p50_ms", "p50"), ms("p90_ms", "p90"), ms("p99_ms", "p99"), ms("p99.9_ms", "p99.9"), ms("avg_ms", "average")];
const MAX_RATE: &[FigureDef] = &[fig("rps", "requests/s", "req/s", Better::Higher), ms("p50_ms", "p50"), ms("p99_ms", "p99")];
const CONNECT: &[FigureDef] = &[fig("cps", "connections/s", "conn/s", Better::Higher)];
const POD_START: &[FigureDef] = &[ms("p50_ms", "p50"), ms("p99_ms", "p99")];
const HOLD: &[FigureDef] = &[
    FigureDef { key: "connections", label: "connections held", unit: "", better: Better::Higher, ratio: false, added: false },
    FigureDef {
        key: "rss_mb",
        label: "largest node proxy RSS with them open",
        unit: "MB",
        better: Better::Lower,
        ratio: false,
        added: false,
    },
    FigureDef {
        key: "rss_after_mb",
        label: "largest node proxy RSS once they are closed",
        unit: "MB",
        better: Better::Lower,
        ratio: false,
        added: false,
    },
];

/// What a step does in the client pod of its scenario.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Iperf {
        streams: u32,
        secs: u32,
    },
    /// `qps: None` is fortio's `-qps -1` (as fast as possible).
    Fortio {
        concurrency: u32,
        qps: Option<u32>,
        secs: u32,
        keepalive: bool,
        payload: u32,
    },
    /// Opens `connections` to the server's TCP echo port from inside the
    /// client pod and holds them while the mesh processes' memory is read.
    Hold {
        connections: usize,
    },
    /// Creates `pods` pods one after the other, each requesting the server
    /// until it answers, and times each from its creation to its first
    /// answer (Kubernetes only).
    PodStart {
        pods: u32,
    },
}

impl ExperimentId {
    pub fn title(self) -> &'static str {
        match self {
            ExperimentId::T1 => "single-connection throughput",
            ExperimentId::T2 => "multi-connection throughput (4 streams)",
            ExperimentId::L1 => "latency at fixed load",
            ExperimentId::Q1 => "maximum request rate",
            ExperimentId::C1 => "new connections per second",
            ExperimentId::R1 => "open connections held through the mesh",
            ExperimentId::S1 => "pod start: creation to first request served",
        }
    }

    pub fn figures(self) -> &'static [FigureDef] {
        match self {
            ExperimentId::T1 | ExperimentId::T2 => THROUGHPUT,
            ExperimentId::L1 => LATENCY,
            ExperimentId::Q1 => MAX_RATE,
            ExperimentId::C1 => CONNECT,
            ExperimentId::R1 => HOLD,
            ExperimentId::S1 => POD_START,
        }
    }

    pub fn figure(self, key: &str) -> Option<&'static FigureDef> {
        self.figures().iter().find(|f| f.key == key)
    }

    pub fn action(self, s: &Settings) -> Action {
        let fortio = |qps, secs, keepalive| Action::Fortio { concurrency: s.concurrency, qps, secs, keepalive, payload: s.payload };
        match self {
            ExperimentId::T1 => Action::Iperf { streams: 1, secs: s.throughput_secs },
            ExperimentId::T2 => Action::Iperf { streams: 4, secs: s.throughput_secs },
            ExperimentId::L1 => fortio(Some(s.latency_qps), s.latency_secs, true),
            ExperimentId::Q1 => fortio(None, s.max_rate_secs, true),
            ExperimentId::C1 => fortio(None, s.connect_secs, false),
            ExperimentId::R1 => Action::Hold { connections: s.hold_connections },
            ExperimentId::S1 => Action::PodStart { pods: s.pod_starts },
        }
    }
}

impl Action {
    /// The command run in the client pod, addressing the server by its
    /// service name (the same in every scenario). None for `Hold` and
    /// `PodStart`, which the bench does itself.
    pub fn command(&self) -> Option<Vec<String>> {
        let host = manifests::SERVER;
        let v = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        match *self {
            Action::Iperf { streams, secs } => {
                let port = manifests::IPERF_PORT.to_string();
                let t = secs.to_string();
                let mut c = v(&["iperf3", "-c", host, "-p", &port, "-t", &t, "-J"]);
                if streams > 1 {
                    c.extend(v(&["-P", &streams.to_string()]));
                }
                Some(c)
            }
            Action::Fortio { concurrency, qps, secs, keepalive, payload } => {
                let qps = qps.map(|q| q.to_string()).unwrap_or_else(|| "-1".into());
                let mut c = v(&["fortio", "load", "-c", &concurrency.to_string(), "-qps", &qps, "-t", &format!("{secs}s")]);
                if !keepalive {
                    c.push("-keepalive=false".into());
                }
                c.extend(v(&["-p", "50,90,99,99.9", "-json", "-"]));
                c.push(format!("http://{host}:{}/echo?size={payload}", manifests::HTTP_PORT));
                Some(c)
            }
            Action::Hold { .. } | Action::PodStart { .. } => None,
        }
    }

    /// How long the step is expected to measure (for timeouts).
    pub fn secs(&self) -> u32 {
        match *self {
            Action::Iperf { secs, .. } | Action::Fortio { secs, .. } => secs,
            Action::Hold { connections } => (connections / 500) as u32 + 5,
            Action::PodStart { pods } => pods * 3,
        }
    }

    /// For the report: the command, or what the bench does.
    pub fn describe(&self) -> String {
        match self {
            Action::Hold { connections } => format!(
                "{connections} TCP connections from the client pod to {}:{} (echo), each echoing a byte, held open",
                manifests::SERVER,
                manifests::TCP_ECHO_PORT
            ),
            Action::PodStart { pods } => format!(
                "{pods} pods, one after the other on the client's node, each running sh -c \"{}\"; timed from the create request to the log line of the first answer",
                manifests::POD_START_LOOP
            ),
            other => other.command().unwrap_or_default().join(" "),
        }
    }
}

/// Rough wall-clock time of a run: the measured durations plus a per-step
/// overhead (tool start, warm-up, reading /proc), plus cluster up and down.
pub fn estimate(settings: &Settings, scenarios: usize, experiments: &[ExperimentId]) -> Duration {
    let s = settings;
    let one = |e: &ExperimentId| -> u64 {
        let run = match e {
            ExperimentId::T1 | ExperimentId::T2 => s.throughput_secs as u64 * 1000,
            ExperimentId::L1 => s.latency_secs as u64 * 1000,
            ExperimentId::Q1 => s.max_rate_secs as u64 * 1000,
            ExperimentId::C1 => s.connect_secs as u64 * 1000,
            ExperimentId::R1 => s.hold_settle_ms + s.hold_connections as u64 / 2,
            ExperimentId::S1 => s.pod_starts as u64 * 2500,
        };
        run + s.pause_ms + 700
    };
    let per_rep: u64 = experiments.iter().map(one).sum();
    let cooldowns = if experiments.contains(&ExperimentId::R1) { s.hold_cooldown_ms * s.reps.saturating_sub(1) as u64 } else { 0 };
    Duration::from_millis((per_rep * s.reps as u64 + cooldowns) * scenarios as u64 + 10_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_follow_benchmarks_md() {
        let s = Settings::full();
        let cmd = |e: ExperimentId| e.action(&s).command().unwrap().join(" ");
        assert_eq!(cmd(ExperimentId::T1), "iperf3 -c server -p 5201 -t 10 -J");
        assert_eq!(cmd(ExperimentId::T2), "iperf3 -c server -p 5201 -t 10 -J -P 4");
        assert_eq!(cmd(ExperimentId::L1), "fortio load -c 64 -qps 1000 -t 30s -p 50,90,99,99.9 -json - http://server:8080/echo?size=1024");
        assert_eq!(cmd(ExperimentId::Q1), "fortio load -c 64 -qps -1 -t 30s -p 50,90,99,99.9 -json - http://server:8080/echo?size=1024");
        assert_eq!(
            cmd(ExperimentId::C1),
            "fortio load -c 64 -qps -1 -t 5s -keepalive=false -p 50,90,99,99.9 -json - http://server:8080/echo?size=1024"
        );
        assert_eq!(ExperimentId::R1.action(&s), Action::Hold { connections: 10_000 });
        assert_eq!(ExperimentId::S1.action(&s), Action::PodStart { pods: 50 });
        assert!(ExperimentId::S1.action(&s).command().is_none());
        let s1 = ExperimentId::S1.action(&s).describe();
        assert!(
            s1.starts_with("50 pods, one after the other on the client's node, each running sh -c \"echo started; until curl "),
            "{s1}"
        );
        assert!(!s1.contains('`'), "the report puts it in a code span");
        assert!(ExperimentId::R1.action(&s).command().is_none());
    }

    #[test]
    fn select_experiments() {
        assert_eq!(select(&[]).unwrap(), EXPERIMENTS.to_vec());
        assert_eq!(select(&["all".into()]).unwrap(), EXPERIMENTS.to_vec());
        assert_eq!(select(&["q1".into(), " L1".into()]).unwrap(), [ExperimentId::L1, ExperimentId::Q1]);
        let e = select(&["L1".into(), "X9".into()]).unwrap_err();
        assert!(e.contains("unknown experiment(s) X9") && e.contains("T1, T2, L1, Q1, C1, R1"), "{e}");
        assert!(select(&["S1".into()]).is_err(), "pod start is Kubernetes' only");
        assert_eq!(select_from(&KUBE_EXPERIMENTS, &["s1".into()]).unwrap(), [ExperimentId::S1]);
        assert!(select_from(&KUBE_EXPERIMENTS, &["R1".into()]).is_err());
    }

    #[test]
    fn quick_commands_are_short() {
        let s = Settings::quick();
        for e in EXPERIMENTS {
            assert!(e.action(&s).secs() <= 7, "{e}: {:?}", e.action(&s));
        }
    }

    #[test]
    fn every_experiment_reports_figures_with_distinct_keys() {
        for e in EXPERIMENTS {
            let keys: Vec<&str> = e.figures().iter().map(|f| f.key).collect();
            assert!(!keys.is_empty());
            let mut d = keys.clone();
            d.sort();
            d.dedup();
            assert_eq!(d.len(), keys.len(), "{e}");
            assert!(e.figure(keys[0]).is_some());
        }
        assert!(ExperimentId::L1.figures().iter().all(|f| f.added && f.better == Better::Lower));
    }
}
