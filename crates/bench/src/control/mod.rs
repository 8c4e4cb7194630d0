//! `slipstream bench-control`: the control plane benchmark of issue 13 and
//! BENCHMARKS.md. A synthetic cluster ([`synthetic`]) is written as
//! manifests into a temporary directory; `slipstream control` reads it as
//! a separate process ([`process`]); simulated node proxies in this
//! process ([`proxy`]) connect over TLS with their own node tokens. It
//! measures the first full push to every proxy, then pod changes one at a
//! time (each file replaced by rename, as the local cluster's agent
//! writes), from the rename to the last proxy receiving the pod's
//! resource, with the bytes each proxy received for it, and the control
//! plane's memory. The figures are compared with the targets, never
//! asserted ([`report`]).

pub mod process;
pub mod proxy;
pub mod report;
pub mod synthetic;

use crate::{machine, timefmt};
use anyhow::{bail, Context};
use process::{ControlFiles, ControlProcess};
use proxy::{Note, Received};
use report::{Change, ControlReport, FullPush, MemoryFigures};
use slipstream_api::TypeUrl;
use slipstream_proxy::control::{ControlChannel, ControlSettings};
use slipstream_proxy::xds::NodeInfo;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};
use synthetic::{Cluster, PodChange, Shape};
use tokio::sync::mpsc;

/// The cluster id the control plane runs with (workload names carry it).
const CLUSTER_ID: &str = "bench";
/// How long the control plane may take to read the objects.
const READY_TIMEOUT: Duration = Duration::from_secs(300);
/// How long the first push to every proxy may take.
const PUSH_TIMEOUT: Duration = Duration::from_secs(300);
/// How long one change may take to reach every proxy.
const CHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between changes: the proxies' ACKs settle, and the changes do not
/// queue behind each other.
const BETWEEN_CHANGES: Duration = Duration::from_millis(50);

/// Benchmark the control plane on a synthetic cluster (BENCHMARKS.md,
/// "control plane"): time to the first full push to every simulated node
/// proxy, time for one pod change to reach all of them (p50, p99), bytes
/// per change per proxy, and the control plane's RSS, each compared with
/// its target. Runs `slipstream control` as a child process on loopback;
/// needs no root and no cluster. Writes `control.json` and `control.md`
/// (and the control plane's log) into --out.
#[derive(clap::Args, Debug, Clone)]
pub struct ControlBenchArgs {
    /// Pods, spread over the nodes (one proxy per node).
    #[arg(long, default_value_t = 10_000)]
    pub pods: usize,
    #[arg(long, default_value_t = 1000)]
    pub services: usize,
    /// AuthorizationPolicies, each selecting the pods of one service.
    #[arg(long, default_value_t = 1000)]
    pub policies: usize,
    #[arg(long, default_value_t = 100)]
    pub namespaces: usize,
    /// Simulated node proxies, one per node (`node1..nodeN`).
    #[arg(long, default_value_t = 100)]
    pub proxies: usize,
    /// Pod changes, one at a time.
    #[arg(long, default_value_t = 100)]
    pub changes: usize,
    /// Smoke run: 1000 pods, 100 services and policies, 10 namespaces, 10
    /// proxies, 20 changes (flags given explicitly still win). Its figures
    /// are not measurements.
    #[arg(long)]
    pub quick: bool,
    /// Output directory (default: bench-out/control-<UTC timestamp>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

impl ControlBenchArgs {
    /// The shape and the number of changes, --quick applied to the flags
    /// left at their defaults.
    pub fn plan(&self) -> (Shape, usize) {
        let q = |v: usize, default: usize, quick: usize| if self.quick && v == default { quick } else { v };
        let shape = Shape {
            pods: q(self.pods, 10_000, 1000),
            services: q(self.services, 1000, 100),
            policies: q(self.policies, 1000, 100),
            namespaces: q(self.namespaces, 100, 10),
            nodes: q(self.proxies, 100, 10),
        };
        (shape, q(self.changes, 100, 20))
    }

    /// The command line that repeats this run.
    fn command(&self) -> String {
        let mut cmd = "slipstream bench-control".to_string();
        if self.quick {
            cmd.push_str(" --quick");
        }
        for (flag, v, default) in [
            ("pods", self.pods, 10_000),
            ("services", self.services, 1000),
            ("policies", self.policies, 1000),
            ("namespaces", self.namespaces, 100),
            ("proxies", self.proxies, 100),
            ("changes", self.changes, 100),
        ] {
            if v != default {
                cmd.push_str(&format!(" --{flag} {v}"));
            }
        }
        cmd
    }
}

/// Runs the benchmark; see [`ControlBenchArgs`].
pub fn run(args: ControlBenchArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let result = rt.block_on(bench(&args));
    // Ends every simulated proxy still running.
    rt.shutdown_timeout(Duration::from_secs(2));
    let report = result?;
    for v in &report.verdicts {
        println!("{:<40} {:>40}   target {:<10} {}", v.figure, v.value, v.target, if v.met { "met" } else { "NOT MET" });
    }
    Ok(())
}

/// Aborts the proxies' tasks when dropped (on every path out).
struct Tasks(Vec<tokio::task::JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

async fn bench(args: &ControlBenchArgs) -> anyhow::Result<ControlReport> {
    let (shape, changes) = args.plan();
    let started = SystemTime::now();
    let clock = Instant::now();
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("bench-out").join(format!("control-{}", timefmt::compact(started))));
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let cluster = Cluster::new(shape, CLUSTER_ID);
    let shape = cluster.shape;

    // Removed when dropped, on every path out.
    let tmp = tempfile::Builder::new().prefix("slipstream-bench-control.").tempdir().context("creating a temporary directory")?;
    let files = ControlFiles {
        objects: tmp.path().join("objects"),
        node_tokens: tmp.path().join("node-tokens.json"),
        ca_dir: tmp.path().join("ca"),
        log: tmp.path().join("control.log"),
    };
    let manifests = cluster.files();
    eprintln!(
        "bench-control: {} pods, {} services, {} policies, {} namespaces; {} proxies; writing {} manifests",
        shape.pods,
        shape.services,
        shape.policies,
        shape.namespaces,
        shape.nodes,
        manifests.len()
    );
    tokio::task::block_in_place(|| write_manifests(&files.objects, &manifests))?;
    let token_files = write_tokens(&cluster, tmp.path(), &files.node_tokens)?;

    let mut control = ControlProcess::start(&files, CLUSTER_ID)?;
    let result = measure(&cluster, changes, &files, &mut control, &token_files).await;
    control.stop();
    // The log is worth keeping, whatever happened.
    let _ = std::fs::copy(&files.log, out.join("control.log"));
    let m = result?;

    let changes = report::Changes::from_samples(m.changes);
    let verdicts = report::verdicts(&m.push, &changes, &m.memory);
    let report = ControlReport {
        started: timefmt::rfc3339(started),
        took_secs: clock.elapsed().as_secs_f64(),
        version: env!("CARGO_PKG_VERSION").into(),
        commit: machine::commit(),
        machine: machine::read(),
        command: args.command(),
        quick: args.quick,
        shape,
        files: manifests.len(),
        startup_secs: m.startup.as_secs_f64(),
        full_push: m.push,
        changes,
        memory: m.memory,
        verdicts,
    };
    std::fs::write(out.join("control.json"), serde_json::to_string_pretty(&report)?)?;
    std::fs::write(out.join("control.md"), report::markdown(&report))?;
    eprintln!("bench-control: wrote {}", out.join("control.md").display());
    Ok(report)
}

fn write_manifests(root: &Path, files: &[synthetic::File]) -> anyhow::Result<()> {
    for f in files {
        let path = root.join(&f.path);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        std::fs::write(&path, &f.text).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// One random token per node: the JSON the control plane reads, and a
/// file per node for its proxy.
fn write_tokens(cluster: &Cluster, dir: &Path, json: &Path) -> anyhow::Result<Vec<PathBuf>> {
    use std::io::Read;
    let mut random = vec![0u8; 16 * cluster.shape.nodes];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut random)).context("reading /dev/urandom")?;
    let mut by_node = BTreeMap::new();
    let mut paths = Vec::new();
    std::fs::create_dir_all(dir.join("tokens"))?;
    for (n, bytes) in random.chunks(16).enumerate() {
        let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let node = cluster.node(n);
        let path = dir.join("tokens").join(format!("{node}.token"));
        std::fs::write(&path, &token)?;
        by_node.insert(node, token);
        paths.push(path);
    }
    std::fs::write(json, serde_json::to_string(&by_node)?)?;
    Ok(paths)
}

/// What `measure` found.
struct Measured {
    startup: Duration,
    push: FullPush,
    changes: Vec<Change>,
    memory: MemoryFigures,
}

async fn measure(
    cluster: &Cluster,
    changes: usize,
    files: &ControlFiles,
    control: &mut ControlProcess,
    token_files: &[PathBuf],
) -> anyhow::Result<Measured> {
    let startup = tokio::task::block_in_place(|| control.wait_ready(READY_TIMEOUT, &files.log))?;
    eprintln!("bench-control: control plane ready after {:.2} s (pid {}, xDS on {})", startup.as_secs_f64(), control.pid, control.xds);
    let ready_memory = control.memory()?;

    let proxies = cluster.shape.nodes;
    let mut channels = Vec::with_capacity(proxies);
    for (n, token_file) in token_files.iter().enumerate() {
        let settings = ControlSettings {
            addresses: vec![control.xds.to_string()],
            san: slipstream_api::DEFAULT_CONTROL_PLANE_SAN.into(),
            root_cert: files.ca_dir.join("root-cert.pem"),
            token_file: token_file.clone(),
            cluster_id: CLUSTER_ID.into(),
            connect_timeout: Duration::from_secs(10),
        };
        let node = NodeInfo {
            node_name: cluster.node(n),
            cluster_id: CLUSTER_ID.into(),
            ip: "0.0.0.0".into(),
            pod: format!("ztunnel-{}", cluster.node(n)),
            namespace: "istio-system".into(),
        };
        channels.push((ControlChannel::new(settings).context("the proxies' channel to the control plane")?, node));
    }

    // The full push: every proxy connects at once.
    let (notes_tx, mut notes) = mpsc::unbounded_channel();
    let connect = Instant::now();
    let _tasks = Tasks(
        channels.into_iter().enumerate().map(|(i, (channel, node))| tokio::spawn(proxy::run(i, channel, node, notes_tx.clone()))).collect(),
    );
    drop(notes_tx);
    let push = full_push(&mut notes, proxies, connect).await?;
    eprintln!("bench-control: full push to {proxies} proxies in {:.2} s", push.secs);
    // Let the ACKs arrive and the push's buffers go before looking at memory.
    settle(&mut notes, Duration::from_millis(500)).await?;
    let after_push = control.memory()?;

    let mut samples = Vec::with_capacity(changes);
    for i in 0..changes {
        let sample = one_change(cluster, i, &files.objects, &mut notes, proxies).await?;
        if sample.latency_ms.is_none() {
            eprintln!("bench-control: change {i} ({}) did not reach every proxy within {CHANGE_TIMEOUT:?}", sample.pod);
        }
        samples.push(sample);
    }
    let done: Vec<f64> = samples.iter().filter_map(|c| c.latency_ms).collect();
    eprintln!(
        "bench-control: {} changes, p50 {:.1} ms, p99 {:.1} ms",
        samples.len(),
        report::percentile(&done, 50.0).unwrap_or(f64::NAN),
        report::percentile(&done, 99.0).unwrap_or(f64::NAN)
    );
    let after_changes = control.memory()?;
    Ok(Measured { startup, push, changes: samples, memory: MemoryFigures { ready: ready_memory, after_push, after_changes } })
}

/// Waits until every proxy holds the first response of both types.
async fn full_push(notes: &mut mpsc::UnboundedReceiver<Note>, proxies: usize, connect: Instant) -> anyhow::Result<FullPush> {
    let deadline = tokio::time::Instant::now() + PUSH_TIMEOUT;
    // Per proxy: types seen, bytes, resources, when complete.
    let mut seen = vec![(0usize, 0usize, 0usize, None::<Instant>); proxies];
    let mut complete = 0;
    while complete < proxies {
        let note = match tokio::time::timeout_at(deadline, notes.recv()).await {
            Ok(Some(n)) => n,
            Ok(None) => bail!("every proxy stopped"),
            Err(_) => bail!("only {complete} of {proxies} proxies had the full push after {PUSH_TIMEOUT:?}"),
        };
        let r = match note {
            Note::Response(r) => r,
            Note::Ended { proxy, why } => bail!("proxy {} lost its stream during the full push: {why}", proxy + 1),
        };
        let s = &mut seen[r.proxy];
        if s.3.is_some() {
            continue;
        }
        let Some(t) = r.type_url else { continue };
        s.0 |= 1 << TypeUrl::NODE.iter().position(|x| *x == t).unwrap_or(0);
        s.1 += r.bytes;
        s.2 += r.resources;
        if s.0 == (1 << TypeUrl::NODE.len()) - 1 {
            s.3 = Some(r.at);
            complete += 1;
        }
    }
    let done: Vec<Instant> = seen.iter().filter_map(|s| s.3).collect();
    let last = done.iter().max().copied().unwrap_or(connect);
    let first = done.iter().min().copied().unwrap_or(connect);
    let bytes: Vec<usize> = seen.iter().map(|s| s.1).collect();
    Ok(FullPush {
        secs: last.duration_since(connect).as_secs_f64(),
        first_proxy_secs: first.duration_since(connect).as_secs_f64(),
        bytes_per_proxy_mean: bytes.iter().sum::<usize>() as f64 / proxies.max(1) as f64,
        bytes_per_proxy_max: bytes.iter().copied().max().unwrap_or(0),
        resources_per_proxy: seen.iter().map(|s| s.2).max().unwrap_or(0),
    })
}

/// Takes what arrives for `quiet`; a proxy that lost its stream fails the run.
async fn settle(notes: &mut mpsc::UnboundedReceiver<Note>, quiet: Duration) -> anyhow::Result<usize> {
    let mut extra = 0;
    while let Ok(n) = tokio::time::timeout(quiet, notes.recv()).await {
        match n {
            Some(Note::Response(_)) => extra += 1,
            Some(Note::Ended { proxy, why }) => bail!("proxy {} lost its stream: {why}", proxy + 1),
            None => bail!("every proxy stopped"),
        }
    }
    Ok(extra)
}

/// Change `i`: rewrite one pod's file by rename and wait until every proxy
/// received its resource.
async fn one_change(
    cluster: &Cluster,
    i: usize,
    objects: &Path,
    notes: &mut mpsc::UnboundedReceiver<Note>,
    proxies: usize,
) -> anyhow::Result<Change> {
    let (p, what) = cluster.change(i);
    let file = cluster.pod(p, Some(what));
    let name = cluster.workload_name(p);
    let path = objects.join(&file.path);
    let tmp = path.with_file_name(format!(".{}.tmp", p));
    std::fs::write(&tmp, &file.text).with_context(|| format!("writing {}", tmp.display()))?;
    let t0 = Instant::now();
    std::fs::rename(&tmp, &path).with_context(|| format!("renaming over {}", path.display()))?;

    // Per proxy: when it received the pod, and the bytes that carried it.
    let mut arrived: Vec<Option<(Instant, usize)>> = vec![None; proxies];
    let mut count = 0;
    let mut other = 0;
    let deadline = tokio::time::Instant::now() + CHANGE_TIMEOUT;
    while count < proxies {
        let r: Received = match tokio::time::timeout_at(deadline, notes.recv()).await {
            Ok(Some(Note::Response(r))) => r,
            Ok(Some(Note::Ended { proxy, why })) => bail!("proxy {} lost its stream during change {i}: {why}", proxy + 1),
            Ok(None) => bail!("every proxy stopped"),
            Err(_) => break,
        };
        if r.names.contains(&name) && arrived[r.proxy].is_none() {
            arrived[r.proxy] = Some((r.at, r.bytes));
            count += 1;
        } else {
            other += 1;
        }
    }
    other += settle(notes, BETWEEN_CHANGES).await?;
    let got: Vec<(Instant, usize)> = arrived.iter().flatten().copied().collect();
    let ms = |t: Instant| t.duration_since(t0).as_secs_f64() * 1000.0;
    let (ns, pod) = cluster.pod_name(p);
    Ok(Change {
        pod: format!("{ns}/{pod}"),
        what: match what {
            PodChange::NotReady => "Ready=False".into(),
            PodChange::Revision(n) => format!("label canonical-revision=v{n}"),
        },
        latency_ms: (count == proxies).then(|| got.iter().map(|(t, _)| ms(*t)).fold(0.0, f64::max)),
        first_ms: got.iter().map(|(t, _)| ms(*t)).min_by(f64::total_cmp),
        proxies: count,
        bytes_min: got.iter().map(|(_, b)| *b).min().unwrap_or(0),
        bytes_max: got.iter().map(|(_, b)| *b).max().unwrap_or(0),
        bytes_total: got.iter().map(|(_, b)| *b).sum(),
        other_responses: other,
    })
}

#[cfg(test)]
mod tests;
