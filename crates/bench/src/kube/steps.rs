//! A Kubernetes run's steps: the scenarios' namespaces set up, every step
//! run with the mesh's usage around it. The order and the figures are the
//! local bench's (`plan`, `figures`); this module does the I/O.

use super::cluster::{self, KubeCluster};
use super::exec::Kubectl;
use super::objects::{FORTIO_CONTAINER, IPERF_CONTAINER};
use super::usage::{self, Sample};
use super::{startup, Job};
use crate::cluster::{interrupted, Interrupted};
use crate::experiment::{Action, ExperimentId};
use crate::figures::{self, Outcome};
use crate::manifests::{CLIENT, SERVER, WAYPOINT};
use crate::parse::{fortio, iperf};
use crate::plan::{self, Step};
use crate::results::{KubeInfo, ProcUsage, Results, Run};
use crate::runner::{flush, tail, write_json};
use crate::scenario::{Scenario, Setup};
use crate::timefmt;
use anyhow::anyhow;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long after a step the bench waits for every kubelet to have sampled
/// the mesh's containers (they do about every 10 to 15 s).
const SAMPLE_TIMEOUT: Duration = Duration::from_secs(40);

/// The namespaces with their objects, Ready, and answering through the
/// mesh: a request from each client to its server succeeds.
pub fn setup(cluster: &KubeCluster, kubectl: &Kubectl, measured: &[&Scenario], info: &KubeInfo) -> anyhow::Result<()> {
    for s in measured {
        let Setup::Namespace { namespace, labels } = s.setup else { continue };
        print!("  {}: namespace {namespace} ... ", s.name);
        flush();
        let t = Instant::now();
        cluster.fresh_namespace(&super::objects::namespace(namespace, labels), READY_TIMEOUT)?;
        let waypoint = labels.iter().any(|(k, _)| *k == "istio.io/use-waypoint");
        for obj in cluster::scenario_objects(namespace, waypoint, info) {
            cluster.create(&obj)?;
        }
        cluster.wait_ready(namespace, &[SERVER.to_string(), CLIENT.to_string()], READY_TIMEOUT, &interrupted)?;
        if waypoint {
            wait_waypoint(cluster, namespace)?;
        }
        warm_up(kubectl, namespace)?;
        println!("ready ({})", timefmt::human(t.elapsed()));
    }
    Ok(())
}

fn wait_waypoint(cluster: &KubeCluster, ns: &str) -> anyhow::Result<()> {
    let t0 = Instant::now();
    loop {
        let pods = cluster.pods_named(ns, &format!("{WAYPOINT}-"))?;
        if !pods.is_empty() {
            return cluster.wait_ready(ns, &pods, READY_TIMEOUT.saturating_sub(t0.elapsed()), &interrupted);
        }
        if t0.elapsed() > READY_TIMEOUT {
            anyhow::bail!("no waypoint pod in {ns} {}s after its Gateway (is the control plane running?)", READY_TIMEOUT.as_secs());
        }
        if interrupted() {
            return Err(Interrupted.into());
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Until one request from the client reaches the server (the mesh has the
/// pods' certificates and the routes), for at most a minute.
fn warm_up(kubectl: &Kubectl, ns: &str) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (o, e) = (dir.path().join("out"), dir.path().join("err"));
    let argv: Vec<String> = ["fortio", "curl", "http://server:8080/"].iter().map(|s| s.to_string()).collect();
    let t0 = Instant::now();
    loop {
        if kubectl.exec(ns, CLIENT, FORTIO_CONTAINER, &argv, (&o, &e), Duration::from_secs(20))? == 0 {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(60) {
            anyhow::bail!("the client of {ns} cannot reach its server:\n{}", tail(&e, 5));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The cluster's facts the steps need.
pub struct Where<'a> {
    pub cluster: &'a KubeCluster,
    pub kubectl: &'a Kubectl,
    pub info: &'a KubeInfo,
    /// The bench's namespaces (their waypoints are mesh processes).
    pub namespaces: &'a [&'a str],
}

impl Where<'_> {
    fn nodes(&self) -> Vec<String> {
        vec![self.info.client_node.clone(), self.info.server_node.clone()]
    }

    pub fn samples(&self) -> anyhow::Result<Vec<Sample>> {
        self.cluster.mesh_samples(&self.nodes(), self.namespaces)
    }

    /// Samples until the kubelets have sampled every mesh container after
    /// `ended`; returns them with the ones seen meanwhile.
    fn samples_after(&self, ended: SystemTime) -> anyhow::Result<(Vec<Sample>, Vec<Sample>)> {
        let end_ns = ended.duration_since(UNIX_EPOCH)?.as_nanos() as i128;
        let (t0, mut seen) = (Instant::now(), Vec::new());
        loop {
            let now = self.samples()?;
            if usage::all_after(&now, end_ns) || t0.elapsed() > SAMPLE_TIMEOUT {
                return Ok((seen, now));
            }
            seen.extend(now);
            crate::runner::sleep_interruptibly(Duration::from_secs(1))?;
        }
    }
}

/// Every step in order, each run recorded as it ends.
pub fn run_all(w: &Where, job: &Job, idle: Vec<Sample>, results: &mut Results, out: &Path) -> anyhow::Result<()> {
    let width = job.measured.iter().map(|s| s.name.len()).max().unwrap_or(4);
    let mut before = idle;
    for step in job.steps {
        if interrupted() {
            return Err(Interrupted.into());
        }
        print!("{}", plan::progress_prefix(step, job.steps.len(), job.settings.reps, width));
        flush();
        let (run, after) = match one_step(w, step, job, &before, out) {
            Ok(r) => r,
            Err(e) => {
                println!("{}", if e.is::<Interrupted>() { "interrupted" } else { "ERROR" });
                return Err(e);
            }
        };
        before = after;
        let took = timefmt::human(Duration::from_secs_f64(run.elapsed_s));
        match &run.error {
            None => {
                let o = Outcome { figures: run.figures.clone(), ..Default::default() };
                let cpu = run.mesh_cpu_s().map(|c| format!(", mesh CPU {c:.2} s")).unwrap_or_default();
                let warn: String = run.warnings.iter().map(|w| format!("; warning: {w}")).collect();
                println!("{}{cpu} ({took}){warn}", figures::headline(step.experiment, &o));
            }
            Some(e) => println!("FAILED ({took}): {e}"),
        }
        results.runs.push(run);
        write_json(results, out)?;
        std::thread::sleep(Duration::from_millis(job.settings.pause_ms));
    }
    Ok(())
}

/// One step and the mesh's usage during it (`before`: the last samples);
/// returns the samples taken after it, the next step's `before`.
fn one_step(w: &Where, step: &Step, job: &Job, before: &[Sample], out: &Path) -> anyhow::Result<(Run, Vec<Sample>)> {
    let ns = step.scenario.namespace().expect("measured scenarios have a namespace");
    let action = step.experiment.action(job.settings);
    let started_at = timefmt::rfc3339(SystemTime::now());
    let t = Instant::now();
    let base = format!("raw/rep{}-{}-{}", step.rep, step.scenario.name, step.experiment);
    let (outcome, raw) = match &action {
        Action::PodStart { pods } => (startup::run(w.cluster, ns, &w.info.client_node, step.rep, *pods), vec![]),
        _ => {
            let raw = vec![format!("{base}.json"), format!("{base}.log")];
            (tool_step(w.kubectl, ns, step.experiment, &action, (&out.join(&raw[0]), &out.join(&raw[1]))), raw)
        }
    };
    let elapsed_s = t.elapsed().as_secs_f64();
    let (seen, after) = w.samples_after(SystemTime::now())?;
    let mesh: Vec<ProcUsage> = usage::usage(before, &seen, &after);
    let mut run = Run {
        scenario: step.scenario.name.to_string(),
        experiment: step.experiment,
        rep: step.rep,
        started_at,
        elapsed_s,
        error: None,
        warnings: vec![],
        figures: Default::default(),
        details: Default::default(),
        mesh,
        raw,
    };
    match outcome {
        Ok(o) => (run.figures, run.details, run.warnings) = (o.figures, o.details, o.warnings),
        Err(e) if e.is::<Interrupted>() => return Err(e),
        Err(e) => run.error = Some(format!("{e:#}")),
    }
    if let Some(p) = run.mesh.iter().find(|p| p.restarted) {
        let note = format!("the {} restarted during the run (or appeared)", p.process);
        run.warnings.push(note);
    }
    Ok((run, after))
}

fn tool_step(kubectl: &Kubectl, ns: &str, e: ExperimentId, action: &Action, files: (&Path, &Path)) -> anyhow::Result<Outcome> {
    let argv = action.command().expect("tool experiments have a command");
    let container = if matches!(action, Action::Iperf { .. }) { IPERF_CONTAINER } else { FORTIO_CONTAINER };
    let timeout = Duration::from_secs(action.secs() as u64 + 60);
    let mut attempt = 1;
    loop {
        let code = kubectl.exec(ns, CLIENT, container, &argv, files, timeout)?;
        let text = std::fs::read_to_string(files.0).unwrap_or_default();
        let parsed = match action {
            Action::Iperf { .. } => match iperf::parse(&text) {
                Err(err) if iperf::retryable(&err) && attempt < 3 => {
                    attempt += 1;
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
                r => r.map_err(|e| e.to_string()).and_then(|r| figures::from_iperf(&r)),
            },
            _ => fortio::parse(&text).map_err(|e| e.to_string()).and_then(|r| figures::from_fortio(e, &r)),
        };
        return match (parsed, code) {
            (Ok(o), 0) => Ok(o),
            (Ok(_), code) => Err(anyhow!("{} exited with code {code}:\n{}", argv[0], tail(files.1, 5))),
            (Err(err), code) => {
                Err(anyhow!("{err} ({} exit code {code}); last lines of {}:\n{}", argv[0], files.1.display(), tail(files.1, 5)))
            }
        };
    }
}
