//! `slipstream bench`: the reproducible performance report of the mesh
//! against the no-mesh path (the experiments and scenarios of
//! BENCHMARKS.md), in a local cluster of its own.
//!
//! Pure parts, unit-tested: the scenario registry ([`scenario`]), the
//! experiments and their commands ([`experiment`], [`settings`], [`plan`]),
//! the bench cluster's manifests ([`manifests`]), the tools' output parsers
//! ([`parse`]), figures and statistics ([`figures`], [`stats`]) and the
//! report ([`report`]: Markdown and SVG). The parts that touch the machine:
//! [`cluster`] (drives the `slipstream` binary), [`mesh`] (CPU and memory of
//! the mesh processes), [`hold`] (R1's open connections), [`preflight`],
//! [`machine`], and [`runner`], which joins them. [`kube`] runs the same
//! experiments, and pod start, on a Kubernetes cluster
//! (`--kubeconfig`). [`control`] is
//! `slipstream bench-control`, the control plane's benchmark.
#![forbid(unsafe_code)]

pub mod cluster;
pub mod control;
pub mod experiment;
pub mod figures;
pub mod hold;
pub mod kube;
pub mod machine;
pub mod manifests;
pub mod mesh;
pub mod parse;
pub mod plan;
pub mod policy_cost;
pub mod preflight;
pub mod report;
pub mod results;
pub mod runner;
pub mod scenario;
pub mod settings;
pub mod stats;
pub mod timefmt;

use std::path::PathBuf;

/// Measure the mesh against the no-mesh path and write a report.
///
/// Builds its own local cluster (`bench`, 2 nodes; one namespace per
/// scenario with a client pod on node1 and a server pod on node2), runs the
/// experiments of BENCHMARKS.md (T1, T2: iperf3 throughput; L1: latency at
/// 1000 req/s; Q1: maximum request rate; C1: new connections per second;
/// R1: CPU and memory of every mesh process, and the node proxies' memory
/// with 10k open connections) in every scenario, several repetitions each,
/// then removes the cluster (also on error and Ctrl-C). Writes
/// `results.json` (every repetition, the machine, the commit, the tools),
/// `report.md` (each figure's ratio to `none`) and `chart.svg`. Needs root,
/// fortio and iperf3 (scripts/setup.sh installs them).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct BenchArgs {
    /// Scenarios to measure, comma-separated: none, l4-nft, l4-ebpf, l7,
    /// denied (default: all; `none`, the baseline, is always measured).
    /// Those this version cannot measure are listed as not available.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub scenarios: Vec<String>,
    /// Experiments to run, comma-separated: T1, T2, L1, Q1, C1, R1 (default:
    /// all). A partial run writes its own report but never the docs.
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub experiments: Vec<String>,
    /// Smoke test: one repetition of 2-3 s per experiment and 1000 held
    /// connections, under two minutes. Checks that every experiment
    /// produces numbers; its figures are not measurements.
    #[arg(long)]
    pub quick: bool,
    /// Repetitions of every experiment (default 3, or 1 with --quick).
    #[arg(long, value_name = "N")]
    pub reps: Option<u32>,
    /// Output directory (default: bench-out/<UTC timestamp>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also (re)write docs/benchmarks.md, .svg and .json of the repository
    /// around the current directory. Needs a full run (not --quick).
    #[arg(long)]
    pub update_docs: bool,
    /// Connections held open for R1 (default 10000, or 1000 with --quick).
    #[arg(long, value_name = "N")]
    pub hold_connections: Option<usize>,
    /// Run on the Kubernetes cluster of this kubeconfig (its current
    /// context) instead of a local cluster: Slipstream installed there by
    /// its Helm chart, the bench's namespaces made and deleted by the run,
    /// two schedulable nodes (client and server apart), `kubectl` on the
    /// PATH. Scenarios none, l4-nft and l7; experiments T1, T2, L1, Q1, C1
    /// and S1 (pod start); no root needed.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// With --kubeconfig: the kubeconfig context to use (default: its
    /// current context).
    #[arg(long, value_name = "NAME", requires = "kubeconfig")]
    pub context: Option<String>,
}

/// Runs the benchmark; see [`BenchArgs`].
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.kubeconfig.clone() {
        Some(kubeconfig) => kube::run(&args, &kubeconfig),
        None => runner::run(args),
    }
}
