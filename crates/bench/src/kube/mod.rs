//! `slipstream bench --kubeconfig PATH`: the local bench's experiments on
//! a Kubernetes cluster where Slipstream is installed with its Helm chart,
//! plus pod start (S1), reported by the same code as the local bench.
//!
//! Pure parts, unit-tested: the scenarios there ([`scenarios`]), the
//! objects the run creates ([`objects`]), the mesh's usage from the
//! kubelets' stats ([`usage`]) and pod start's figures ([`podstart`]).
//! The I/O: [`cluster`] (the API server, with kube-rs), [`exec`] (`kubectl
//! exec` in the client pods), `startup` (S1's pods) and `steps`, which
//! runs them in the local bench's order (`plan`).

pub mod cluster;
pub mod exec;
pub mod objects;
pub mod podstart;
pub mod scenarios;
mod startup;
mod steps;
pub mod usage;

use crate::experiment::{self, ExperimentId, KUBE_EXPERIMENTS};
use crate::plan::{self, Step};
use crate::results::{ExperimentInfo, Machine, Results, SCHEMA};
use crate::runner::{command_line, write_json, write_outputs};
use crate::scenario::{self, Scenario};
use crate::settings::Settings;
use crate::{machine, report, timefmt, BenchArgs};
use anyhow::{anyhow, bail};
use cluster::KubeCluster;
use exec::Kubectl;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// How long the bench's namespaces may take to go.
const DELETE_TIMEOUT: Duration = Duration::from_secs(180);

/// What the steps run: in order, over the measurable scenarios.
pub struct Job<'a> {
    pub settings: &'a Settings,
    pub steps: &'a [Step],
    pub measured: &'a [&'a Scenario],
}

/// The run's choices from the command line, checked before anything is
/// made on the cluster.
fn resolve(args: &BenchArgs) -> anyhow::Result<(Settings, Vec<&'static Scenario>, Vec<ExperimentId>)> {
    let settings = Settings::resolve(args.quick, args.reps, args.hold_connections).map_err(|e| anyhow!(e))?;
    let selected = scenario::select_in(scenarios::SCENARIOS, &args.scenarios).map_err(|e| anyhow!(e))?;
    if args.experiments.iter().any(|e| e.trim().eq_ignore_ascii_case("R1")) {
        bail!(
            "R1's held connections are not measured on Kubernetes (the bench opens them inside the client pod's network \
             namespace, which it cannot enter on a remote node); the mesh's CPU and memory are reported for every other experiment"
        );
    }
    let experiments = experiment::select_from(&KUBE_EXPERIMENTS, &args.experiments).map_err(|e| anyhow!(e))?;
    if args.update_docs {
        bail!("--update-docs writes the local bench's figures; a run with --kubeconfig writes its report to --out");
    }
    Ok((settings, selected, experiments))
}

/// Runs the benchmark on the cluster of `kubeconfig`; see [`BenchArgs`].
pub fn run(args: &BenchArgs, kubeconfig: &Path) -> anyhow::Result<()> {
    let (settings, selected, experiments) = resolve(args)?;
    let selected_names: Vec<&str> = selected.iter().map(|s| s.name).collect();
    let kubectl = Kubectl::find(kubeconfig, args.context.as_deref())?;
    slipstream_testbed::sys::signals::install_termination_flag();
    let cluster = KubeCluster::connect(kubeconfig, args.context.as_deref())?;
    let info = cluster.discover()?;
    // The same names either way (checked above); whether l4-ebpf can be
    // measured depends on the install's datapath.
    let selected = scenario::select_in(scenarios::for_datapath(&info.datapath), &args.scenarios).map_err(|e| anyhow!(e))?;
    let selected = selected.into_iter().filter(|s| selected_names.contains(&s.name)).collect::<Vec<_>>();
    let started = SystemTime::now();
    let t0 = Instant::now();
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("bench-out").join(format!("kube-{}", timefmt::compact(started))));
    std::fs::create_dir_all(out.join("raw"))?;
    let steps = plan::steps(&selected, &experiments, settings.reps);
    let measured: Vec<&Scenario> = selected.iter().copied().filter(|s| s.available()).collect();
    let mut results = skeleton(&settings, &selected, &experiments, started);
    results.kubernetes = Some(info.clone());
    println!(
        "slipstream bench on Kubernetes {} (context {:?}): client pods on {}, server pods on {}; {} scenario(s) ({}), {} experiments, {} repetition(s): {} steps",
        info.server_version,
        info.context,
        info.client_node,
        info.server_node,
        measured.len(),
        measured.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        experiments.len(),
        settings.reps,
        steps.len(),
    );
    for s in selected.iter().filter(|s| !s.available()) {
        println!("  {}: {}", s.name, s.info().not_available.unwrap_or_default());
    }
    println!("  output: {}", out.display());
    let namespaces: Vec<&str> = measured.iter().filter_map(|s| s.namespace()).collect();
    let guard = Cleanup { cluster: &cluster, namespaces: &namespaces, armed: true };
    let job = Job { settings: &settings, steps: &steps, measured: &measured };
    let w = steps::Where { cluster: &cluster, kubectl: &kubectl, info: &info, namespaces: &namespaces };
    let measured_result = measure(&w, &job, &mut results, &out);
    let down = guard.finish();
    finish(results, t0, &out, measured_result, down)
}

/// Sets up the namespaces, samples the idle mesh, runs the steps.
fn measure(w: &steps::Where, job: &Job, results: &mut Results, out: &Path) -> anyhow::Result<()> {
    steps::setup(w.cluster, w.kubectl, job.measured, w.info)?;
    let idle = w.samples()?;
    if !idle.iter().any(|s| crate::results::is_node_proxy(&s.process)) {
        bail!("no node proxy found on {} or {} (container `proxy` of DaemonSet slipstream-node)", w.info.client_node, w.info.server_node);
    }
    results.idle = usage::idle(&idle);
    println!("idle: {}", results.idle.iter().map(|p| format!("{} {:.1} MB", p.process, p.rss_mb)).collect::<Vec<_>>().join(", "));
    write_json(results, out)?;
    steps::run_all(w, job, idle, results, out)
}

/// The results before the first step.
fn skeleton(settings: &Settings, selected: &[&Scenario], experiments: &[ExperimentId], started: SystemTime) -> Results {
    let tools = [("fortio image", objects::FORTIO_IMAGE), ("iperf3 image", objects::IPERF_IMAGE), ("curl image (S1)", objects::CURL_IMAGE)];
    Results {
        schema: SCHEMA,
        command: command_line(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: machine::commit(),
        started_at: timefmt::rfc3339(started),
        duration_s: 0.0,
        complete: false,
        settings: settings.clone(),
        machine: Machine {
            open_files_limit: rustix::process::getrlimit(rustix::process::Resource::Nofile).current.unwrap_or(0),
            ..machine::read()
        },
        tools: tools.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        scenarios: selected.iter().map(|s| s.info()).collect(),
        experiments: experiments
            .iter()
            .map(|e| ExperimentInfo { id: *e, title: e.title().to_string(), command: e.action(settings).describe() })
            .collect(),
        kubernetes: None,
        idle: vec![],
        runs: vec![],
        medians: Default::default(),
    }
}

/// Writes the files and says how the run went.
fn finish(mut results: Results, t0: Instant, out: &Path, measured: anyhow::Result<()>, down: anyhow::Result<()>) -> anyhow::Result<()> {
    results.duration_s = t0.elapsed().as_secs_f64();
    results.complete = measured.is_ok();
    results.medians = crate::stats::medians(&results.runs);
    write_outputs(&results, out, None)?;
    match measured {
        Err(e) if e.is::<crate::cluster::Interrupted>() => bail!("interrupted; partial results in {}", out.display()),
        Err(e) => return Err(e.context(format!("the benchmark stopped; partial results in {}", out.display()))),
        Ok(()) => {}
    }
    down?;
    println!("\n{}", report::summary(&results));
    println!("done in {}: {}/results.json, report.md, chart.svg", timefmt::human(t0.elapsed()), out.display());
    let failed: Vec<String> = results
        .runs
        .iter()
        .filter(|r| !r.ok())
        .map(|r| format!("{} {} rep {}: {}", r.scenario, r.experiment, r.rep, r.error.as_deref().unwrap_or("")))
        .collect();
    if !failed.is_empty() {
        bail!("{} run(s) produced no figures:\n  {}", failed.len(), failed.join("\n  "));
    }
    Ok(())
}

/// Deletes the bench's namespaces when dropped (an error, Ctrl-C), unless
/// [`Cleanup::finish`] did.
struct Cleanup<'a> {
    cluster: &'a KubeCluster,
    namespaces: &'a [&'a str],
    armed: bool,
}

impl Cleanup<'_> {
    fn finish(mut self) -> anyhow::Result<()> {
        self.armed = false;
        print!("deleting namespaces {} ... ", self.namespaces.join(", "));
        crate::runner::flush();
        let r = self.cluster.delete_namespaces(self.namespaces, DELETE_TIMEOUT);
        println!("{}", if r.is_ok() { "ok" } else { "FAILED" });
        r
    }
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if self.armed {
            eprintln!("deleting namespaces {}", self.namespaces.join(", "));
            if let Err(e) = self.cluster.delete_namespaces(self.namespaces, DELETE_TIMEOUT) {
                eprintln!("error: {e:#}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_checked_before_the_cluster_is_touched() {
        let (s, sc, ex) = resolve(&BenchArgs { quick: true, ..Default::default() }).unwrap();
        assert_eq!((s.reps, s.pod_starts), (1, 5));
        assert_eq!(sc.iter().map(|s| s.name).collect::<Vec<_>>(), ["none", "l4-nft", "l4-ebpf", "l7", "denied"]);
        assert_eq!(ex, KUBE_EXPERIMENTS);
        let r1 = resolve(&BenchArgs { experiments: vec!["r1".into()], ..Default::default() }).unwrap_err().to_string();
        assert!(r1.starts_with("R1's held connections are not measured on Kubernetes"), "{r1}");
        let docs = resolve(&BenchArgs { update_docs: true, ..Default::default() }).unwrap_err().to_string();
        assert!(docs.contains("--update-docs"));
        let (_, _, only) = resolve(&BenchArgs { experiments: vec!["s1".into(), "L1".into()], ..Default::default() }).unwrap();
        assert_eq!(only, [ExperimentId::L1, ExperimentId::S1]);
        assert_eq!(Settings::full().pod_starts, 50, "BENCHMARKS.md: p50 and p99 over 50 pods");
    }
}
