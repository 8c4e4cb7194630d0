//! The node agent (`slipstream node-agent`, the DaemonSet's `agent`
//! container): on its node it installs the CNI plugin, answers it, and
//! takes pods into and out of the mesh while they run, the same enrolment
//! as the local cluster's agent (`crate::enrol`, `crate::capture`).
//!
//! - watches of its node's pods, of namespaces and of its DaemonSet;
//! - a pass thread ([`pass`]) that steps every pod towards what its labels
//!   want and writes the node proxy's pod list (`files`) and the probe
//!   table (`probes`);
//! - the CNI socket ([`server`]);
//! - the plugin kept installed ([`install`]); on a stop marked as an
//!   uninstall ([`uninstall`]), every pod released and the plugin removed.
//!   Any other stop (upgrade, eviction) leaves the node meshed and failing
//!   closed: new pods wait for the next agent, which adopts the pods.

pub mod discover;
pub mod files;
pub mod install;
pub mod pass;
pub mod probes;
pub mod server;
pub mod uninstall;
mod watch;

use slipstream_core::sync::LockExt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `slipstream node-agent`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct AgentArgs {
    #[command(subcommand)]
    pub command: Option<AgentCommand>,
    /// This node's name (the downward API's spec.nodeName)
    #[arg(long, env = "NODE_NAME")]
    pub node: Option<String>,
    /// Shared with the node proxy: `<node>/pods.json` (written here),
    /// `<node>/served.json` (the proxy's), and the CNI socket `cni.sock`
    #[arg(long, default_value = "/var/run/slipstream")]
    pub run_dir: PathBuf,
    /// The node's CNI binary directory, as mounted in this container
    #[arg(long, default_value = "/host/opt/cni/bin")]
    pub cni_bin_dir: PathBuf,
    /// The node's CNI configuration directory, as mounted in this container
    #[arg(long, default_value = "/host/etc/cni/net.d")]
    pub cni_conf_dir: PathBuf,
    /// Where the runtime pins pods' network namespaces (CNI_NETNS paths)
    #[arg(long, default_value = "/var/run/netns")]
    pub netns_dir: PathBuf,
    /// The host's /proc (hostPID), to find pods that ran before the agent
    #[arg(long, default_value = "/proc")]
    pub proc_dir: PathBuf,
    /// This cluster's id, as the control plane's --cluster-id: pods are
    /// `<id>//Pod/<namespace>/<name>` in the workload API
    #[arg(long, env = "CLUSTER_ID", default_value = "Kubernetes")]
    pub cluster_id: String,
    /// `namespace/name` of the agent's own DaemonSet, watched for the
    /// uninstall mark (without it, a stop never releases pods)
    #[arg(long, env = "SLIPSTREAM_DAEMONSET")]
    pub daemonset: Option<String>,
    /// Rewrite the node's own connections to meshed pods (kubelet probes)
    /// to 169.254.7.127, which the pods let through under STRICT mTLS
    #[arg(long, env = "SLIPSTREAM_AGENT_PROBE_REWRITE", default_value_t = true, action = clap::ArgAction::Set)]
    pub probes: bool,
    /// How meshed pods' traffic reaches the node proxy: `nftables` (rules
    /// in each meshed pod's namespace) or `ebpf` (programs: connect() and
    /// tc on each meshed pod, policy in the kernel). No `auto` here: the
    /// node proxy beside the agent is given the same value (the chart's
    /// `datapath.mode`), so a fallback would leave them disagreeing
    #[arg(long, env = "SLIPSTREAM_AGENT_DATAPATH", default_value = "nftables", value_parser = ["nftables", "ebpf"])]
    pub datapath: String,
    /// With `--datapath ebpf`: the bpffs directory of the datapath's pins
    /// (the node proxy's --bpf-dir). One per node where nodes share a
    /// kernel (the test harness)
    #[arg(long, env = "SLIPSTREAM_AGENT_BPF_DIR", default_value = "/sys/fs/bpf/slipstream/kubernetes")]
    pub bpf_dir: PathBuf,
    /// With `--datapath ebpf`: the cgroup2 directory, inside the node's
    /// hierarchy, the socket hooks attach to (every socket of a process
    /// below it meets them): `/`, the root, on a real node; the kubelet's
    /// cgroup root where nodes share a kernel
    #[arg(long, env = "SLIPSTREAM_AGENT_CGROUP", default_value = "/")]
    pub cgroup: String,
    /// The node's /sys/fs/cgroup as mounted in this container (cgroup2 is
    /// it, or its `unified` on a hybrid host)
    #[arg(long, default_value = "/host/sys/fs/cgroup")]
    pub cgroup_mount: PathBuf,
    /// With `--datapath ebpf`: the node's /proc/sys/net as mounted,
    /// writable, in this container (a container's own /proc/sys is
    /// read-only); a meshed pod's sysctls are written through it from a
    /// thread inside the pod's network namespace
    #[arg(long, default_value = "/host/proc/sys/net")]
    pub sysctl_net: PathBuf,
    /// Connect-time Service balancing in eBPF: off on Kubernetes, where
    /// kube-proxy routes Services (docs/kubernetes.md)
    #[arg(long, env = "SLIPSTREAM_AGENT_SERVICE_BALANCING", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolValueParser::new())]
    pub service_balancing: bool,
    /// Readiness (/ready: 200 once the plugin is installed and the watches synced)
    #[arg(long, default_value = "0.0.0.0:15023")]
    pub ready_addr: SocketAddr,
    /// Kubeconfig (default: KUBECONFIG, else the in-cluster service account)
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum AgentCommand {
    /// Mark the DaemonSet for uninstall (Helm's pre-delete hook runs this):
    /// its agents then release every pod and remove the plugin when they stop
    MarkUninstall {
        /// `namespace/name` of the DaemonSet
        #[arg(long, env = "SLIPSTREAM_DAEMONSET")]
        daemonset: String,
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
}

async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<kube::Client> {
    use anyhow::Context;
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p).with_context(|| format!("reading the kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("using the kubeconfig {}", p.display()))?
        }
        None => kube::Config::infer().await.context("finding the Kubernetes API (in-cluster service account, or KUBECONFIG)")?,
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// Runs the agent (or its subcommand) to the end.
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        if let Some(AgentCommand::MarkUninstall { daemonset, kubeconfig }) = &args.command {
            let (ns, name) = uninstall::parse_daemonset(daemonset).map_err(anyhow::Error::msg)?;
            return uninstall::mark(client(kubeconfig.as_deref()).await?, &ns, &name).await;
        }
        agent(args).await
    })
}

async fn agent(args: AgentArgs) -> anyhow::Result<()> {
    if args.service_balancing {
        anyhow::bail!("--service-balancing true: connect-time Service balancing is not available on Kubernetes yet (kube-proxy routes Services); leave it false");
    }
    let node = args.node.clone().ok_or_else(|| anyhow::anyhow!("--node (or NODE_NAME) is required: the node this agent serves"))?;
    let daemonset = args.daemonset.as_deref().map(uninstall::parse_daemonset).transpose().map_err(anyhow::Error::msg)?;
    let settings = pass::Settings {
        node: node.clone(),
        cluster_id: args.cluster_id.clone(),
        run_dir: args.run_dir.clone(),
        netns_dir: args.netns_dir.clone(),
        proc_dir: args.proc_dir.clone(),
        probes: args.probes,
        sysctl_net: args.sysctl_net.clone(),
        stale_bpf_dir: (args.datapath != "ebpf" && args.bpf_dir.join("maps").exists()).then(|| args.bpf_dir.clone()),
    };
    let capture = choose_datapath(&args)?;
    let client = client(args.kubeconfig.as_deref()).await?;
    let (wake_tx, wake_rx) = std::sync::mpsc::channel();
    let marked = Arc::new(AtomicBool::new(false));
    let views = watch::start(client, &node, daemonset, wake_tx.clone(), marked.clone()).await?;
    tracing::info!(%node, "watching the node's pods and the namespaces");

    // The node proxy's report (served.json, beside pods.json) wakes a pass
    // at once: a pod's CNI ADD waits for it. The pass's own poll stays.
    let node_dir = args.run_dir.join(&node);
    let _ = std::fs::create_dir_all(&node_dir);
    match slipstream_proxy::sys::dirwatch::DirWatch::new(&node_dir) {
        Ok(w) => {
            let tx = wake_tx.clone();
            tokio::spawn(async move { while w.changed().await.is_ok() && tx.send(()).is_ok() {} });
        }
        Err(e) => tracing::warn!(dir = %node_dir.display(), "cannot watch the node proxy's report (looked at every pass instead): {e}"),
    }

    let board = server::Shared::default();
    let socket = args.run_dir.join(crate::protocol::SOCKET);
    let listener = server::bind(&socket).map_err(|e| anyhow::anyhow!("binding the CNI socket {}: {e}", socket.display()))?;
    let serving = tokio::spawn(server::serve(listener, board.clone(), wake_tx.clone()));

    let stop = Arc::new(AtomicBool::new(false));
    let passes = {
        let (board, stop, settings) = (board.clone(), stop.clone(), settings.clone());
        std::thread::Builder::new().name("pass".into()).spawn(move || pass_loop(&settings, capture, &views, &board, &wake_rx, &stop))?
    };

    let ready = Arc::new(AtomicBool::new(false));
    tokio::spawn(serve_ready(args.ready_addr, ready.clone()));
    let keeper = tokio::spawn(keep_installed(args.cni_bin_dir.clone(), args.cni_conf_dir.clone(), socket.display().to_string(), ready));

    wait_for_stop().await;
    keeper.abort();
    serving.abort();
    let _ = std::fs::remove_file(&socket);
    stop.store(true, Ordering::SeqCst);
    let _ = wake_tx.send(());
    let mut state = passes.join().map_err(|_| anyhow::anyhow!("the pass thread panicked"))?;
    if marked.load(Ordering::SeqCst) {
        tracing::info!("stopping for an uninstall (the DaemonSet is marked): removing the plugin, then releasing every pod of the node");
        if let Err(e) = install::remove(&args.cni_conf_dir, &args.cni_bin_dir) {
            tracing::error!("removing the CNI plugin: {e}");
        }
        state.release_all(&settings);
        if args.datapath == "ebpf" {
            match slipstream_ebpf::remove_all(&args.bpf_dir) {
                Ok(()) => tracing::info!(dir = %args.bpf_dir.display(), "eBPF datapath removed: its socket hooks detached, its maps gone"),
                Err(e) => tracing::error!(dir = %args.bpf_dir.display(), "removing the eBPF datapath: {e}"),
            }
        }
        let _ = std::fs::remove_dir_all(args.run_dir.join(&node));
        tracing::info!("uninstalled from this node: pods serve without the mesh");
    } else {
        tracing::info!("stopping (an upgrade, an eviction or a restart: the DaemonSet is not marked for uninstall): the node stays meshed; new pods wait for the next agent");
    }
    Ok(())
}

fn pass_loop(
    settings: &pass::Settings,
    capture: crate::datapath::Capture,
    views: &watch::Views,
    board: &server::Shared,
    wake: &std::sync::mpsc::Receiver<()>,
    stop: &AtomicBool,
) -> pass::Node {
    let mut node = pass::Node::adopt(settings, capture);
    let mut busy = true;
    while !stop.load(Ordering::SeqCst) {
        // While a pod waits (a CNI ADD among them), the node proxy's report is
        // looked at every 20 ms: the pass is cheap when nothing changes.
        let _ = wake.recv_timeout(if busy { Duration::from_millis(20) } else { Duration::from_secs(2) });
        while wake.try_recv().is_ok() {}
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let (sandboxes, seq) = {
            let mut b = board.locked();
            b.started += 1;
            (b.sandboxes.clone(), b.started)
        };
        let (pods, labels) = views.snapshot();
        let answers = node.pass(settings, &pods, &labels, &sandboxes);
        // Busy while a CNI ADD waits or a pod waits for its node proxy:
        // both end within a few passes.
        busy = {
            let b = board.locked();
            b.sandboxes.keys().any(|k| matches!(answers.get(k), Some(pass::Answer::Waiting(_))))
        } || node.entries.values().any(|e| e.state.meshed != e.state.captured);
        let mut b = board.locked();
        b.answers = answers;
        b.answered = seq;
        b.passed.notify_waiters();
    }
    node
}

/// Loads the eBPF datapath (`--datapath ebpf`) before anything is
/// enrolled, with the kubelet probes' source when they are rewritten; a
/// kernel that cannot run it stops the agent with the kernel's answer.
fn choose_datapath(args: &AgentArgs) -> anyhow::Result<crate::datapath::Capture> {
    use crate::datapath::{Capture, Mode, Placement};
    if args.datapath != "ebpf" {
        return Capture::choose(Mode::Nftables, &Placement::local(args.bpf_dir.clone()));
    }
    crate::datapath::check_bpf_dir(&args.bpf_dir).map_err(|e| anyhow::anyhow!("--datapath ebpf: --bpf-dir: {e}"))?;
    let cgroup = crate::datapath::node_cgroup(&args.cgroup_mount, &args.cgroup, crate::datapath::is_cgroup2)
        .map_err(|e| anyhow::anyhow!("--datapath ebpf: --cgroup {}: {e}", args.cgroup))?;
    if !cgroup.is_dir() {
        anyhow::bail!("--datapath ebpf: --cgroup {}: {} is not a directory of the node's cgroup2 hierarchy", args.cgroup, cgroup.display());
    }
    let options = slipstream_ebpf::Options { probe_source: args.probes.then_some(crate::capture::PROBE_SOURCE) };
    let at = Placement { bpf_dir: args.bpf_dir.clone(), cgroup: Some(cgroup), options, sysctl_net: args.sysctl_net.clone() };
    Capture::choose(Mode::Ebpf, &at)
}

/// Installs the plugin and keeps it installed.
async fn keep_installed(bin_dir: PathBuf, conf_dir: PathBuf, socket: String, ready: Arc<AtomicBool>) {
    let mut said = String::new();
    let mut installed = install::Installed::default();
    loop {
        // Blocking file work (the first check reads the binary whole) off
        // the runtime's threads.
        let (bin, conf, sock) = (bin_dir.clone(), conf_dir.clone(), socket.clone());
        let outcome = tokio::task::spawn_blocking(move || {
            let r = install::install_binary(&bin, &mut installed).and_then(|copied| {
                if copied {
                    tracing::info!(dir = %bin.display(), "CNI plugin binary installed");
                }
                install::chain(&conf, &sock)
            });
            (r, installed)
        })
        .await;
        let outcome = match outcome {
            Ok((r, known)) => {
                installed = known;
                r
            }
            Err(e) => {
                tracing::error!("CNI plugin check: {e}");
                installed = install::Installed::default();
                tokio::time::sleep(Duration::from_secs(5)).await;
                continue;
            }
        };
        match outcome {
            Ok(changed) => {
                if let Some(file) = changed {
                    tracing::info!(file = %file.display(), "chained into the primary CNI's configuration: new pods call slipstream-cni");
                }
                ready.store(true, Ordering::SeqCst);
                said.clear();
            }
            Err(e) => {
                let msg = e.to_string();
                if msg != said {
                    tracing::warn!("CNI plugin: {msg} (retried every 5s)");
                    said = msg;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

async fn serve_ready(addr: SocketAddr, ready: Arc<AtomicBool>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%addr, "readiness: cannot listen: {e}");
            return;
        }
    };
    loop {
        let Ok((mut s, _)) = listener.accept().await else { continue };
        let ready = ready.load(Ordering::SeqCst);
        tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let _ = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
            let (status, body) =
                if ready { ("200 OK", "ready\n") } else { ("503 Service Unavailable", "the CNI plugin is not installed yet\n") };
            let _ = s
                .write_all(format!("HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len()).as_bytes())
                .await;
        });
    }
}

async fn wait_for_stop() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot wait for SIGTERM: {e}");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
