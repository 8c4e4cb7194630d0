//! `results.json`: every repetition of every experiment, the machine, the
//! commit and the tools. Fields may be added; `schema` is raised when one is
//! renamed or removed.

use crate::experiment::ExperimentId;
use crate::scenario::ScenarioInfo;
use crate::settings::Settings;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Results {
    pub schema: u32,
    /// The command line that produced these results.
    pub command: String,
    /// Version of the `slipstream` binary.
    pub version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<Commit>,
    /// UTC, RFC 3339.
    pub started_at: String,
    pub duration_s: f64,
    /// False when the run was interrupted: some runs are missing.
    pub complete: bool,
    pub settings: Settings,
    pub machine: Machine,
    /// Tool name -> version.
    pub tools: BTreeMap<String, String>,
    pub scenarios: Vec<ScenarioInfo>,
    pub experiments: Vec<ExperimentInfo>,
    /// Set for a run on Kubernetes (`--kubeconfig`): the cluster and its
    /// nodes; `machine` is then where the bench ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes: Option<KubeInfo>,
    /// Memory of every mesh process after `up`, before any traffic.
    pub idle: Vec<ProcSample>,
    pub runs: Vec<Run>,
    /// Scenario -> figure id (`T1.gbps`, `Q1.mesh_cpu_s`, ...) -> median over
    /// the successful repetitions. Derived from `runs`, for convenience.
    #[serde(default)]
    pub medians: BTreeMap<String, BTreeMap<String, f64>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Commit {
    pub hash: String,
    /// Uncommitted changes to tracked files when the run started.
    pub dirty: bool,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cpu_model: String,
    pub cores: usize,
    pub memory_gib: f64,
    pub kernel: String,
    pub os: String,
    /// RLIMIT_NOFILE the cluster ran with (R1 needs about 2 per held connection).
    #[serde(default)]
    pub open_files_limit: u64,
}

/// The Kubernetes cluster a run measured.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct KubeInfo {
    /// The API server's version (`v1.32.13`).
    pub server_version: String,
    /// The kubeconfig's context used.
    pub context: String,
    /// Where the client pods run (and S1's pods).
    pub client_node: String,
    /// Where the server pods run.
    pub server_node: String,
    /// Those two nodes, as they report themselves.
    pub nodes: Vec<KubeNode>,
    /// The image of the node proxies (the `proxy` container of DaemonSet
    /// `slipstream-node`).
    pub mesh_image: String,
    /// The install's datapath (`nftables` or `ebpf`, the chart's
    /// `datapath.mode` as its node agents run it).
    #[serde(default)]
    pub datapath: String,
}

/// A node of the cluster, from its status.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct KubeNode {
    pub name: String,
    pub cpus: String,
    pub memory: String,
    pub kernel: String,
    pub os: String,
    pub runtime: String,
    pub kubelet: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExperimentInfo {
    pub id: ExperimentId,
    pub title: String,
    /// The command run in the client pod, or what the bench does.
    pub command: String,
}

/// One repetition of one experiment in one scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    pub scenario: String,
    pub experiment: ExperimentId,
    /// 1-based.
    pub rep: u32,
    pub started_at: String,
    pub elapsed_s: f64,
    /// Set when the run produced no figures.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The figures are real but not quite what was asked for (some requests
    /// failed, fewer connections held).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The experiment's figures (keys of `ExperimentId::figures`).
    pub figures: BTreeMap<String, f64>,
    /// Other numbers read from the tool (actual rate, errors, ...).
    #[serde(default)]
    pub details: BTreeMap<String, f64>,
    /// CPU and memory of every mesh process during the run.
    #[serde(default)]
    pub mesh: Vec<ProcUsage>,
    /// Files (relative to the output directory) with the tool's own output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub raw: Vec<String>,
}

impl Run {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// CPU seconds of all mesh processes together.
    pub fn mesh_cpu_s(&self) -> Option<f64> {
        (!self.mesh.is_empty()).then(|| self.mesh.iter().map(|p| p.cpu_s).sum())
    }

    /// The largest peak RSS among the mesh processes.
    /// The largest node proxy's peak (the targets are the node proxy's;
    /// a waypoint's memory is reported on its own line).
    pub fn mesh_peak_rss_mb(&self) -> Option<f64> {
        self.mesh.iter().filter(|p| is_node_proxy(&p.process)).map(|p| p.peak_rss_mb).reduce(f64::max)
    }
}

/// Whether a mesh process (by its name, `bench::mesh`) is a node proxy.
pub fn is_node_proxy(process: &str) -> bool {
    process.starts_with("node proxy ")
}

/// Whether a mesh process (by its name, `bench::mesh`) is a waypoint.
pub fn is_waypoint(process: &str) -> bool {
    process.starts_with("waypoint ")
}

/// A mesh process (one cgroup, e.g. a node proxy) during a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcUsage {
    /// `node proxy node1`.
    pub process: String,
    pub pids: Vec<i32>,
    /// User + system CPU time of the cgroup during the run.
    pub cpu_s: f64,
    /// Peak resident memory during the run (VmHWM, reset before it).
    pub peak_rss_mb: f64,
    /// Resident memory at the end of the run (VmRSS).
    pub rss_mb: f64,
    /// Its processes changed during the run (a restart): figures are partial.
    #[serde(default)]
    pub restarted: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcSample {
    pub process: String,
    pub pids: Vec<i32>,
    pub rss_mb: f64,
    /// The anonymous part of `rss_mb` (RssAnon): the process's own memory.
    /// The rest is file pages, mostly the slipstream binary's code, shared
    /// with every other slipstream process (absent in older results).
    #[serde(default)]
    pub anon_mb: Option<f64>,
    /// For a waypoint: `rss_mb` is its own process (the container, as
    /// Kubernetes reports a container's memory); this is the whole pod,
    /// with the sandbox's `pod-init` processes (absent in older results).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_rss_mb: Option<f64>,
}
