//! A benchmark run from start to end: checks, cluster, every step with its
//! progress line, cleanup, files. The decisions live in the pure modules;
//! this one only sequences them and does the I/O.

use crate::cluster::{self, Cluster, Interrupted, Teardown};
use crate::experiment::{self, Action, ExperimentId, EXPERIMENTS};
use crate::figures::{self, Outcome};
use crate::manifests::{self, CLIENT, SERVER};
use crate::mesh::{self, MeshProcess};
use crate::parse::{fortio, iperf};
use crate::plan::{self, Step};
use crate::report::{self, Page};
use crate::results::{ExperimentInfo, Machine, Results, Run, SCHEMA};
use crate::scenario::{self, Scenario};
use crate::settings::Settings;
use crate::{hold, machine, preflight, timefmt, BenchArgs};
use anyhow::{anyhow, bail, Context};
use slipstream_testbed::status::ClusterStatus;
use slipstream_testbed::sys::signals;
use slipstream_testbed::{ClusterName, Paths};
use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// The bench's own cluster.
pub const CLUSTER: &str = "bench";
const UP_TIMEOUT: Duration = Duration::from_secs(120);
const HOLD_WORKERS: usize = 4;
/// How long R1 waits for the proxies to close their side of the held
/// connections before the next step.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// How long after the held connections are gone "RSS once they are closed"
/// is sampled.
const RSS_AFTER_CLOSE_DELAY: Duration = Duration::from_secs(2);

/// Where a scenario's steps run.
struct Target {
    namespace: String,
    /// The client pod's network namespace (for R1's holder).
    client_netns: PathBuf,
    /// The server's TCP echo port behind its service VIP.
    echo: SocketAddr,
}

pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    let settings = Settings::resolve(args.quick, args.reps, args.hold_connections).map_err(|e| anyhow!(e))?;
    let selected = scenario::select(&args.scenarios).map_err(|e| anyhow!(e))?;
    let experiments = experiment::select(&args.experiments).map_err(|e| anyhow!(e))?;
    if args.update_docs && settings.quick {
        bail!("--update-docs needs a full run: a --quick run is a smoke test, not a measurement");
    }
    if args.update_docs && experiments.len() != EXPERIMENTS.len() {
        bail!("--update-docs needs every experiment: drop --experiments");
    }
    preflight::require_root()?;
    let tools = preflight::tools()?;
    let cgroup2 = slipstream_testbed::sys::cgroup::cgroup2_mount().map_err(|e| anyhow!(e))?;
    let paths = Paths::new(ClusterName::new(CLUSTER).map_err(|e| anyhow!(e))?, &cgroup2);
    preflight::cluster_free(&paths)?;
    let docs = if args.update_docs { Some(docs_dir()?) } else { None };
    let nofile = preflight::raise_nofile(preflight::nofile_needed(settings.hold_connections))?;
    signals::install_termination_flag();

    let started = SystemTime::now();
    let t0 = Instant::now();
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("bench-out").join(timefmt::compact(started)));
    std::fs::create_dir_all(out.join("raw")).with_context(|| format!("creating {}", out.display()))?;
    let yaml = manifests::render(&selected);
    let tmp = tempfile::Builder::new().prefix("slipstream-bench.").tempdir()?;
    let manifest_file = tmp.path().join("bench.yaml");
    std::fs::write(&manifest_file, &yaml)?;
    std::fs::write(out.join("manifests.yaml"), &yaml)?;

    let steps = plan::steps(&selected, &experiments, settings.reps);
    let measured: Vec<&Scenario> = selected.iter().copied().filter(|s| s.available()).collect();
    let mut results = Results {
        schema: SCHEMA,
        command: command_line(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: machine::commit(),
        started_at: timefmt::rfc3339(started),
        duration_s: 0.0,
        complete: false,
        settings: settings.clone(),
        machine: Machine { open_files_limit: nofile, ..machine::read() },
        tools,
        scenarios: selected.iter().map(|s| s.info()).collect(),
        experiments: experiments
            .iter()
            .map(|e| ExperimentInfo { id: *e, title: e.title().to_string(), command: e.action(&settings).describe() })
            .collect(),
        kubernetes: None,
        idle: vec![],
        runs: vec![],
        medians: Default::default(),
    };

    println!(
        "slipstream bench: {} scenario(s) ({}), {} experiments, {} repetition(s): {} steps, about {}",
        measured.len(),
        measured.iter().map(|s| s.name).collect::<Vec<_>>().join(", "),
        experiments.len(),
        settings.reps,
        steps.len(),
        timefmt::human(experiment::estimate(&settings, measured.len(), &experiments))
    );
    for s in selected.iter().filter(|s| !s.available()) {
        println!("  {}: {}", s.name, s.info().not_available.unwrap_or_default());
    }
    println!("  output: {}", out.display());

    let exe = std::env::current_exe().context("finding the slipstream binary")?;
    let cluster = Cluster::new(exe, CLUSTER, out.join("cluster.log"));
    let teardown = Teardown::new(&cluster);
    let job = Job { settings: &settings, steps: &steps, measured: &measured };
    let measured_result = measure(&cluster, &paths, &manifest_file, &job, &mut results, &out);
    print!("removing cluster {CLUSTER:?} ... ");
    flush();
    let down = teardown.finish();
    println!("{}", if down.is_ok() { "ok" } else { "FAILED" });

    results.duration_s = t0.elapsed().as_secs_f64();
    results.complete = measured_result.is_ok();
    results.medians = crate::stats::medians(&results.runs);
    // The docs only ever get a complete run.
    write_outputs(&results, &out, docs.as_deref().filter(|_| results.complete))?;

    let failed: Vec<String> = results
        .runs
        .iter()
        .filter(|r| !r.ok())
        .map(|r| format!("{} {} rep {}: {}", r.scenario, r.experiment, r.rep, r.error.as_deref().unwrap_or("")))
        .collect();
    match measured_result {
        Err(e) if e.is::<Interrupted>() => bail!("interrupted; partial results in {}", out.display()),
        Err(e) => return Err(e.context(format!("the benchmark stopped; partial results in {}", out.display()))),
        Ok(()) => {}
    }
    down?;
    println!("\n{}", report::summary(&results));
    println!(
        "done in {}: {}/results.json, report.md, chart.svg{}",
        timefmt::human(t0.elapsed()),
        out.display(),
        docs.map(|d| format!("; updated {}", d.join("benchmarks.md").display())).unwrap_or_default()
    );
    if !failed.is_empty() {
        bail!("{} run(s) produced no figures:\n  {}", failed.len(), failed.join("\n  "));
    }
    Ok(())
}

/// What `measure` runs: the steps, in order, over the scenarios that can be
/// measured, with these settings.
struct Job<'a> {
    settings: &'a Settings,
    steps: &'a [Step],
    measured: &'a [&'a Scenario],
}

fn measure(cluster: &Cluster, paths: &Paths, manifest_file: &Path, job: &Job, results: &mut Results, out: &Path) -> anyhow::Result<()> {
    let &Job { settings, steps, measured } = job;
    print!("starting cluster {CLUSTER:?} ({} nodes) ... ", manifests::NODES);
    flush();
    let t = Instant::now();
    cluster.up(manifest_file, manifests::NODES, UP_TIMEOUT)?;
    println!("ok ({})", timefmt::human(t.elapsed()));
    let status = cluster.status()?;
    let targets: Vec<(String, Target)> =
        measured.iter().map(|s| Ok((s.name.to_string(), target(&status, s)?))).collect::<anyhow::Result<_>>()?;
    let procs = mesh::discover(&paths.cgroup_root);
    mesh::check(&procs).map_err(|e| anyhow!(e))?;

    std::thread::sleep(Duration::from_millis(settings.hold_settle_ms.max(1000)));
    results.idle = mesh::sample(&procs);
    println!("idle: {}", results.idle.iter().map(|p| format!("{} {:.1} MB", p.process, p.rss_mb)).collect::<Vec<_>>().join(", "));
    write_json(results, out)?;

    let width = measured.iter().map(|s| s.name.len()).max().unwrap_or(4);
    let mut last_hold: Option<(&str, Instant)> = None;
    for step in steps {
        if cluster::interrupted() {
            return Err(Interrupted.into());
        }
        if let (ExperimentId::R1, Some((scenario, ended))) = (step.experiment, last_hold) {
            let wait = Duration::from_millis(settings.hold_cooldown_ms).saturating_sub(ended.elapsed());
            if scenario == step.scenario.name && !wait.is_zero() {
                println!("  waiting {} for the TIME_WAIT sockets of the last R1 to expire", timefmt::human(wait));
                sleep_interruptibly(wait)?;
            }
        }
        print!("{}", plan::progress_prefix(step, steps.len(), settings.reps, width));
        flush();
        let target = &targets.iter().find(|(n, _)| n == step.scenario.name).expect("a target per measured scenario").1;
        let run = match run_step(cluster, step, target, &procs, settings, out) {
            Ok(r) => r,
            Err(e) => {
                println!("{}", if e.is::<Interrupted>() { "interrupted" } else { "ERROR" });
                return Err(e);
            }
        };
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
        if step.experiment == ExperimentId::R1 {
            last_hold = Some((step.scenario.name, Instant::now()));
        }
        results.runs.push(run);
        write_json(results, out)?;
        std::thread::sleep(Duration::from_millis(settings.pause_ms));
    }
    Ok(())
}

fn target(status: &ClusterStatus, s: &Scenario) -> anyhow::Result<Target> {
    let ns = s.namespace().expect("measured scenarios have a namespace");
    if s.name == "l4-ebpf" {
        // The cluster runs --datapath auto: it must really be eBPF, or the
        // figures would be nftables' under another name.
        if let Some(n) = status.nodes.iter().find(|n| n.datapath.as_ref().map_or(true, |d| d.mode != "ebpf")) {
            let why = n.datapath.as_ref().and_then(|d| d.fallback.clone()).unwrap_or_else(|| "the eBPF datapath is not running".into());
            bail!("scenario l4-ebpf: node {} runs without the eBPF datapath ({why}); leave it out with --scenarios", n.name);
        }
    }
    let client = status.pod(ns, CLIENT).ok_or_else(|| anyhow!("pod {ns}/{CLIENT} is missing from the bench cluster"))?;
    let svc = status
        .services
        .iter()
        .find(|x| x.namespace == ns && x.name == SERVER)
        .ok_or_else(|| anyhow!("service {ns}/{SERVER} is missing from the bench cluster"))?;
    let vip: IpAddr = svc.vip.parse().with_context(|| format!("service {ns}/{SERVER} has no cluster IP ({:?})", svc.vip))?;
    Ok(Target {
        namespace: ns.to_string(),
        client_netns: slipstream_testbed::names::netns_path(&client.netns),
        echo: SocketAddr::new(vip, manifests::TCP_ECHO_PORT),
    })
}

/// One step. Err only when the whole run must stop (interrupted); a failed
/// experiment is a `Run` with its error.
fn run_step(
    cluster: &Cluster,
    step: &Step,
    target: &Target,
    procs: &[MeshProcess],
    settings: &Settings,
    out: &Path,
) -> anyhow::Result<Run> {
    let action = step.experiment.action(settings);
    let started_at = timefmt::rfc3339(SystemTime::now());
    let t = Instant::now();
    let before = mesh::begin(procs);
    let base = format!("raw/rep{}-{}-{}", step.rep, step.scenario.name, step.experiment);
    let (outcome, raw) = match &action {
        Action::Hold { connections } => (hold_step(target, *connections, settings, procs), vec![]),
        _ => {
            let raw = vec![format!("{base}.json"), format!("{base}.log")];
            (tool_step(cluster, target, step.experiment, &action, &out.join(&raw[0]), &out.join(&raw[1])), raw)
        }
    };
    let usage = mesh::end(procs, &before);
    let elapsed_s = t.elapsed().as_secs_f64();
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
        mesh: usage,
        raw,
    };
    match outcome {
        Ok(o) => {
            run.figures = o.figures;
            run.details = o.details;
            run.warnings = o.warnings;
        }
        Err(e) if e.is::<Interrupted>() => return Err(e),
        Err(e) => run.error = Some(format!("{e:#}")),
    }
    if let Some(p) = run.mesh.iter().find(|p| p.restarted) {
        let note = format!("the {} restarted during the run", p.process);
        run.error = Some(run.error.map(|e| format!("{e}; {note}")).unwrap_or(note));
    }
    Ok(run)
}

pub(crate) fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    v[v.len().saturating_sub(lines)..].join("\n")
}

fn tool_step(
    cluster: &Cluster,
    target: &Target,
    e: ExperimentId,
    action: &Action,
    stdout: &Path,
    stderr: &Path,
) -> anyhow::Result<Outcome> {
    let argv = action.command().expect("tool experiments have a command");
    let timeout = Duration::from_secs(action.secs() as u64 + 60);
    let mut attempt = 1;
    loop {
        let code = cluster.exec(&target.namespace, CLIENT, &argv, stdout, stderr, timeout)?;
        let text = std::fs::read_to_string(stdout).unwrap_or_default();
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
            (Ok(_), code) => Err(anyhow!("{} exited with code {code}:\n{}", argv[0], tail(stderr, 5))),
            (Err(err), code) => {
                Err(anyhow!("{err} ({} exit code {code}); last lines of {}:\n{}", argv[0], stderr.display(), tail(stderr, 5)))
            }
        };
    }
}

fn hold_step(target: &Target, count: usize, settings: &Settings, procs: &[MeshProcess]) -> anyhow::Result<Outcome> {
    let stop = || cluster::interrupted();
    let fds_before = mesh::fd_counts(procs);
    let held = hold::open(&target.client_netns, target.echo, count, HOLD_WORKERS, &stop)
        .with_context(|| format!("entering {}", target.client_netns.display()))?;
    if cluster::interrupted() {
        return Err(Interrupted.into());
    }
    std::thread::sleep(Duration::from_millis(settings.hold_settle_ms));
    let largest = || mesh::sample(procs).iter().filter(|p| crate::results::is_node_proxy(&p.process)).map(|p| p.rss_mb).reduce(f64::max);
    let rss_mb = largest();
    let (failed, first_error, open_s) = (held.failed, held.first_error.clone(), held.open_s);
    let established = held.release();
    let drain = mesh::wait_drained(procs, &fds_before, established, DRAIN_TIMEOUT, &stop);
    let fds_left: usize = mesh::fd_counts(procs).iter().zip(&fds_before).map(|(n, b)| n.saturating_sub(*b)).sum();
    // The node proxy hands freed memory back within a second of a burst of
    // closes (node crate, memtrim); sample after that.
    std::thread::sleep(RSS_AFTER_CLOSE_DELAY);
    if cluster::interrupted() {
        return Err(Interrupted.into());
    }
    let h = figures::Hold {
        wanted: count,
        established,
        failed,
        first_error,
        open_s,
        rss_mb,
        rss_after_mb: largest(),
        drain_s: drain.map(|d| d.as_secs_f64()),
    };
    let mut o = figures::from_hold(&h).map_err(|e| anyhow!(e))?;
    o.details.insert("fds_left".into(), fds_left as f64);
    Ok(o)
}

pub(crate) fn write_json(results: &Results, out: &Path) -> anyhow::Result<()> {
    let path = out.join("results.json");
    let tmp = out.join("results.json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(results)? + "\n").with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

pub(crate) fn write_outputs(results: &Results, out: &Path, docs: Option<&Path>) -> anyhow::Result<()> {
    write_json(results, out)?;
    let title = if results.kubernetes.is_some() { "Slipstream benchmark on Kubernetes" } else { "Slipstream benchmark" };
    let page = Page { title: title.into(), chart_href: "chart.svg".into(), preamble: None };
    std::fs::write(out.join("report.md"), report::markdown(results, &page))?;
    std::fs::write(out.join("chart.svg"), report::svg(results))?;
    if let Some(docs) = docs {
        let page = Page {
            title: "Benchmarks".into(),
            chart_href: "benchmarks.svg".into(),
            preamble: Some(
                "Generated by `slipstream bench --update-docs` (crate `crates/bench`): do not edit by hand, rerun it. \
                 The method, the experiments and the targets are those of BENCHMARKS.md; every figure is a median over \
                 the repetitions and is compared with the no-mesh path (`none`) measured in the same run. \
                 [benchmarks.json](benchmarks.json) holds every repetition."
                    .into(),
            ),
        };
        // The figures of the other benchmarks (bench-control, bench-policy)
        // are kept from the marker on.
        let kept = std::fs::read_to_string(docs.join("benchmarks.md"))
            .ok()
            .and_then(|old| old.find(KEPT_MARKER).map(|i| old[i..].to_string()))
            .unwrap_or_default();
        let mut md = report::markdown(results, &page);
        if !kept.is_empty() {
            md = format!("{}\n\n{kept}", md.trim_end());
        }
        std::fs::write(docs.join("benchmarks.md"), md)?;
        std::fs::write(docs.join("benchmarks.svg"), report::svg(results))?;
        std::fs::write(docs.join("benchmarks.json"), serde_json::to_string_pretty(results)? + "\n")?;
    }
    Ok(())
}

/// Where docs/benchmarks.md stops being this run's: the sections after it
/// (other benchmarks' figures) survive `--update-docs`.
pub const KEPT_MARKER: &str = "<!-- kept by slipstream bench --update-docs: the figures below come from other benchmarks -->";

/// `docs/` of the repository around the current directory.
fn docs_dir() -> anyhow::Result<PathBuf> {
    let cwd = std::env::current_dir()?;
    cwd.ancestors()
        .find(|d| d.join("Cargo.toml").is_file() && d.join("docs").is_dir() && d.join("crates").is_dir())
        .map(|d| d.join("docs"))
        .ok_or_else(|| anyhow!("--update-docs: run from inside the slipstream repository (no docs/ found above {})", cwd.display()))
}

/// The command as typed, with the binary called `slipstream`.
pub(crate) fn command_line() -> String {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| {
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || c == '\'' || c == '"') {
                format!("'{}'", a.replace('\'', "'\\''"))
            } else {
                a
            }
        })
        .collect();
    format!("slipstream {}", args.join(" "))
}

pub(crate) fn sleep_interruptibly(d: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + d;
    while Instant::now() < end {
        if cluster::interrupted() {
            return Err(Interrupted.into());
        }
        std::thread::sleep(Duration::from_millis(100).min(end.saturating_duration_since(Instant::now())));
    }
    Ok(())
}

pub(crate) fn flush() {
    let _ = std::io::stdout().flush();
}
