//! `slipstream`: one binary for the local cluster, the mesh's processes and
//! the sample applications.
#![forbid(unsafe_code)]

mod cmd;
mod common;
mod examples;
mod kube;
mod tool;

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// mimalloc: per-thread free lists and no arena consolidation on the
/// request path (docs/architecture.md, "Allocator").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "slipstream",
    version,
    about = "Slipstream: a sidecar-less service mesh with an eBPF datapath",
    long_about = "Slipstream: a sidecar-less service mesh with an eBPF datapath.\n\n\
        `slipstream up` builds a local cluster out of network namespaces on this machine \
        (root required) from ordinary Kubernetes manifests, and the other commands inspect \
        and change it. Start with `slipstream up`, then `slipstream status`.",
    after_help = "Every command that changes the machine needs root. Run `slipstream <command> --help` for details."
)]
struct Cli {
    /// Name of the local cluster to act on; several can run side by side.
    #[arg(long, global = true, env = "SLIPSTREAM_CLUSTER", default_value = slipstream_testbed::names::DEFAULT_CLUSTER)]
    cluster: String,
    /// `--kubeconfig` and `--context`: `status`, `proxy-status`,
    /// `proxy-config`, `policy check`, `observe` and `x waypoint` act on a
    /// Kubernetes install (docs/kubernetes.md, "The CLI on Kubernetes").
    #[command(flatten)]
    kube: kube::target::KubeFlags,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build a local cluster from Kubernetes manifests and start its pods.
    ///
    /// Creates one network namespace per node joined by a shared bridge, a
    /// namespace per pod wired to its node by a veth pair, service VIPs and
    /// DNS names, and runs every container's command in its pod. Returns
    /// once every pod runs (and passes its readiness probe), leaving the
    /// cluster running in the background.
    Up {
        /// Manifest file or directory (repeatable; `-` reads standard
        /// input). Default: the bundled quickstart example (a client and an
        /// echo server on two nodes).
        #[arg(short = 'f', long = "filename")]
        files: Vec<PathBuf>,
        /// Fields Kubernetes does not know (a typo such as `spec.replcas`):
        /// `strict` refuses the manifest, `warn` drops them with a warning,
        /// `ignore` drops them silently. Fields Kubernetes knows and the
        /// local cluster does not use are always accepted with a warning.
        #[arg(long = "validate", default_value = "strict", value_name = "strict|warn|ignore")]
        validate: slipstream_k8s::FieldValidation,
        /// Number of nodes.
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        /// How long to wait for every pod to be ready.
        #[arg(long, default_value = "120s", value_parser = slipstream_core::duration::parse_flag)]
        timeout: Duration,
        /// Mesh root certificate (PEM) to sign workload certificates with;
        /// with --ca-key. Default: a new root for this cluster.
        #[arg(long, requires = "ca_key")]
        ca_cert: Option<PathBuf>,
        /// Private key (PEM) of --ca-cert. The agent copies it into the
        /// cluster's state (hidden from pods) and covers the original path
        /// with an empty file in every pod; pods still read the rest of the
        /// machine's files, so removing the original after `up` is safest.
        #[arg(long, requires = "ca_cert")]
        ca_key: Option<PathBuf>,
        /// Control plane replicas. Each node proxy knows them all and fails
        /// over from one to the next; 2 lets you kill one and watch.
        #[arg(long, default_value_t = 1)]
        control_replicas: usize,
        /// How pods' traffic reaches the node proxies: `ebpf` (programs on
        /// each pod's connect() and inbound on its interface, policy in the kernel),
        /// `nftables` (redirect rules in each pod's namespace), or `auto`:
        /// eBPF when the kernel can run it, else nftables, saying why in
        /// the agent's log. `slipstream status` shows which one runs.
        #[arg(long, env = "SLIPSTREAM_DATAPATH", default_value = "auto", value_name = "auto|ebpf|nftables")]
        datapath: slipstream_testbed::agent::datapath::Mode,
    },
    /// Remove everything `up` made: processes, namespaces, veths, routes,
    /// nftables rules, cgroups, state. Safe to run twice, and after a crash.
    Down,
    /// Show nodes, pods and services.
    Status {
        /// Output format: `table` (default) or `json` (a stable interface,
        /// see docs/status-json.md).
        #[arg(short = 'o', long = "output", default_value = "table")]
        output: String,
    },
    /// Create or update objects in the running cluster, then wait for the
    /// pods to be ready and deleted pods to be gone.
    Apply {
        /// Manifest file or directory (repeatable; `-` reads standard input).
        #[arg(short = 'f', long = "filename", required = true)]
        files: Vec<PathBuf>,
        /// Fields Kubernetes does not know (a typo such as `spec.replcas`):
        /// `strict` refuses the manifest, `warn` drops them with a warning,
        /// `ignore` drops them silently. Fields Kubernetes knows and the
        /// local cluster does not use are always accepted with a warning.
        #[arg(long = "validate", default_value = "strict", value_name = "strict|warn|ignore")]
        validate: slipstream_k8s::FieldValidation,
        /// Return as soon as the change is accepted.
        #[arg(long)]
        no_wait: bool,
        #[arg(long, default_value = "120s", value_parser = slipstream_core::duration::parse_flag)]
        timeout: Duration,
        /// The namespace of objects that name none (an object naming
        /// another is refused, as kubectl does).
        #[arg(short = 'n', long = "namespace")]
        namespace: Option<String>,
        /// Apply only the objects whose labels match (k=v, k!=v, k, !k).
        #[arg(short = 'l', long = "selector")]
        selector: Option<String>,
    },
    /// Delete the objects a manifest names (deleting a Namespace deletes
    /// everything in it), and wait for their pods to stop.
    Delete {
        /// Manifest file or directory (repeatable; `-` reads standard input).
        #[arg(short = 'f', long = "filename", required_unless_present = "resources", conflicts_with = "resources")]
        files: Vec<PathBuf>,
        /// Instead of -f, as kubectl: `KIND NAME...` or `KIND/NAME...`
        /// (`delete pod web`, `delete deploy/web svc/web`).
        resources: Vec<String>,
        /// The namespace of the objects named in `resources`.
        #[arg(short = 'n', long = "namespace")]
        namespace: Option<String>,
        /// Fields Kubernetes does not know (a typo such as `spec.replcas`):
        /// `strict` refuses the manifest, `warn` drops them with a warning,
        /// `ignore` drops them silently. Fields Kubernetes knows and the
        /// local cluster does not use are always accepted with a warning.
        #[arg(long = "validate", default_value = "strict", value_name = "strict|warn|ignore")]
        validate: slipstream_k8s::FieldValidation,
        /// Do not fail when an object does not exist.
        #[arg(long)]
        ignore_not_found: bool,
        #[arg(long)]
        no_wait: bool,
        #[arg(long, default_value = "60s", value_parser = slipstream_core::duration::parse_flag)]
        timeout: Duration,
    },
    /// List objects, as `kubectl get`: `get pods`, `get svc,deploy -n NS`,
    /// `get pod/NAME -o yaml`, `get all -A`, `get gateways -l k=v`.
    /// Kinds: pods, services, deployments, namespaces, serviceaccounts,
    /// configmaps, gateways, httproutes, grpcroutes, authorizationpolicies,
    /// peerauthentications, virtualservices, destinationrules,
    /// networkpolicies, ciliumnetworkpolicies, localratelimitpolicies (and
    /// kubectl's short names). `-o json` prints one object for one name,
    /// else a `List`, with `apiVersion` and `kind` as the API server does.
    Get {
        #[arg(required = true)]
        resources: Vec<String>,
        #[command(flatten)]
        scope: cmd::kubectl::ScopeArgs,
        /// wide, json, yaml or name.
        #[arg(short = 'o', long = "output")]
        output: Option<String>,
        /// After the list, print each object again when it changes, until Ctrl-C.
        #[arg(short = 'w', long = "watch")]
        watch: bool,
    },
    /// Show objects in detail, as `kubectl describe` (labels, annotations,
    /// spec and status).
    Describe {
        #[arg(required = true)]
        resources: Vec<String>,
        #[command(flatten)]
        scope: cmd::kubectl::ScopeArgs,
    },
    /// Set or remove labels, as `kubectl label`: `label namespace bookinfo
    /// istio.io/dataplane-mode=ambient`, `label svc reviews
    /// istio.io/use-waypoint=waypoint -n bookinfo`, `label ns bookinfo
    /// istio.io/dataplane-mode-` (remove). Changing a value needs
    /// --overwrite. Returns once the node proxies hold the change.
    Label(cmd::kubectl::LabelArgs),
    /// Set or remove annotations, as `kubectl annotate` (same forms as `label`).
    Annotate(cmd::kubectl::LabelArgs),
    /// Create an object from the command line: `create namespace NAME`.
    #[command(subcommand)]
    Create(cmd::kubectl::CreateCommand),
    /// Wait for a condition, as `kubectl wait`: `wait --for=condition=Ready
    /// pod --all -n NS --timeout=120s`, `wait --for=condition=Available
    /// deploy/web`, `wait --for=condition=Programmed gtw/waypoint` (any
    /// condition of the object's status), `wait --for=delete pod/web`.
    /// Prints `pod/NAME condition met` for each; exit code 1 at the
    /// timeout, naming what did not.
    Wait {
        #[arg(required = true)]
        resources: Vec<String>,
        #[command(flatten)]
        scope: cmd::kubectl::ScopeArgs,
        /// Every object of the kind (in the namespace).
        #[arg(long)]
        all: bool,
        /// condition=Ready (pods), condition=Available (deployments), or delete.
        #[arg(long = "for")]
        for_: String,
        #[arg(long, default_value = "30s", value_parser = slipstream_core::duration::parse_flag)]
        timeout: Duration,
    },
    /// Run a command inside a pod (its network, names and cgroup) and
    /// return its exit code.
    ///
    /// POD is a pod name, `pod/NAME` (`po`, `pods`), or `deploy/NAME`
    /// (`deployment`, `deployments`, `deployment.apps`: the first ready pod
    /// of a Deployment), as kubectl takes them.
    Exec {
        #[arg(short = 'n', long = "namespace", default_value = "default")]
        namespace: String,
        /// Container whose environment to use (default: the first).
        #[arg(short = 'c', long = "container")]
        container: Option<String>,
        /// Run as root with every capability and the machine's files (the
        /// cluster's keys and state, cgroups, /sys writable), like nsenter or
        /// `kubectl debug --profile=sysadmin`, instead of as the container
        /// runs (its securityContext: user, capabilities, hidden files).
        #[arg(long)]
        privileged: bool,
        /// kubectl's `-i`: the command reads this terminal's standard
        /// input (it always does here).
        #[arg(short = 'i', long = "stdin")]
        _stdin: bool,
        /// kubectl's `-t`: accepted; no terminal is allocated (the command
        /// shares this one's).
        #[arg(short = 't', long = "tty")]
        _tty: bool,
        pod: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// Print a pod's container output, or with `node/NODE` the node proxy's
    /// log (its diagnostics and one access-log line per connection).
    Logs {
        #[arg(short = 'n', long = "namespace", default_value = "default")]
        namespace: String,
        #[arg(short = 'c', long = "container")]
        container: Option<String>,
        /// Keep printing new output until the pod goes away.
        #[arg(short = 'f', long = "follow")]
        follow: bool,
        pod: String,
    },
    /// Replace a Deployment's pods (`restart`) or wait until its rollout is
    /// done (`status`), as `kubectl rollout` does. The old pods serve until
    /// every new one is ready; a waypoint drains (docs/waypoint.md).
    #[command(subcommand)]
    Rollout(cmd::rollout::RolloutCommand),
    /// The node proxy: carries meshed pods' connections in mTLS (HBONE).
    /// Started by `up` on every node; see docs/node-proxy.md.
    Node(slipstream_node::NodeArgs),
    /// The control plane: Kubernetes objects (from the API server or a
    /// directory of manifests) in; the workload API over delta xDS and
    /// workload certificates (Istio's certificate service) out, on :15012
    /// over TLS. `slipstream up` runs it for the local cluster; on
    /// Kubernetes it runs as a Deployment (see docs/control-plane.md).
    Control(slipstream_control::run::ControlArgs),
    /// The node agent of the Kubernetes install (the DaemonSet's `agent`
    /// container): installs the CNI plugin `slipstream-cni` and answers it,
    /// and takes its node's pods into and out of the mesh while they run;
    /// see docs/kubernetes.md. The plugin is this binary run under the
    /// name `slipstream-cni`.
    #[command(name = "node-agent")]
    NodeAgent(slipstream_cni::agent::AgentArgs),
    Bench(slipstream_bench::BenchArgs),
    #[command(name = "bench-control")]
    BenchControl(slipstream_bench::control::ControlBenchArgs),
    /// Benchmark authorization: the policy engine's cost per decision with
    /// 1 000 policies of 10 rules applying to one workload (in process),
    /// and the `denied` scenario of BENCHMARKS.md in a local cluster (how
    /// long a refused client waits, refused by a node proxy and by the
    /// node's kernel path). Writes policy.json and policy.md into --out.
    #[command(name = "bench-policy")]
    BenchPolicy(slipstream_bench::policy_cost::PolicyBenchArgs),
    /// Data-path debugging: HBONE as any identity, raw TCP, many held
    /// connections (see docs/node-proxy.md, "Debugging").
    #[command(subcommand, hide = true)]
    Debug(cmd::debug::DebugCommand),
    /// Every node proxy, the control plane replica it is connected to, and
    /// whether it acknowledged all it was sent (like `istioctl
    /// proxy-status`). SYNCED: everything sent was acknowledged; STALE: a
    /// response is not acknowledged yet; NACKED: the proxy refused a
    /// resource (the reason follows; it keeps the previous version).
    #[command(name = "proxy-status")]
    ProxyStatus {
        /// `table` or `json`.
        #[arg(short = 'o', long = "output", default_value = "table")]
        output: String,
    },
    /// What one node proxy holds: the workloads, services, policies and
    /// certificates it was given (like `istioctl ztunnel-config`).
    ///
    /// Read from the node proxy's admin port (`/config_dump` on
    /// 127.0.0.1:15000 in the node's network namespace), so it shows what
    /// the proxy acts on, not what the control plane meant to send.
    ///
    /// Both orders work: `proxy-config node1 workloads` and istioctl's
    /// `ztunnel-config workloads [--node node1]` (the first node by default).
    #[command(name = "proxy-config", alias = "ztunnel-config")]
    ProxyConfig {
        /// NODE and/or SECTION (workloads, services, policies, certificates, all).
        #[arg(num_args = 0..=2)]
        args: Vec<String>,
        /// The node whose proxy to ask (`node1`).
        #[arg(long)]
        node: Option<String>,
        /// `table` or `json`.
        #[arg(short = 'o', long = "output", default_value = "table")]
        output: String,
    },
    /// Ask the policy engine about a connection, without sending traffic.
    #[command(subcommand)]
    Policy(cmd::policy::PolicyCommand),
    /// Problems in the applied configuration, as `istioctl analyze`: a
    /// VirtualService subset no DestinationRule defines (IST0101) or that
    /// selects no pod (SLP0002), a port of a waypoint-bound service whose
    /// protocol is not named (IST0118), a waypoint nothing is bound to
    /// (SLP0003), a selector policy with L7 rules on pods no waypoint
    /// serves (SLP0001). Exit code 79 when one is an Error.
    Analyze {
        #[arg(short = 'n', long = "namespace")]
        namespace: Option<String>,
        #[arg(short = 'A', long = "all-namespaces")]
        all_namespaces: bool,
        /// `log` (istioctl's lines) or `json`.
        #[arg(short = 'o', long = "output", default_value = "log", value_parser = ["log", "json"])]
        output: String,
    },
    /// istioctl's experimental commands: `x waypoint apply|list|status|delete`.
    #[command(subcommand)]
    X(cmd::istioctl::XCommand),
    /// Flows seen by the eBPF datapath (like `hubble observe`): each
    /// connect() a pod makes (REDIRECTED to its node proxy, FORWARDED when
    /// not meshed) and every drop with its reason and, for a policy drop,
    /// the deciding policy and rule (from the source node proxy's state).
    ///
    ///   slipstream observe --from-pod production/legacy-service --type drop -f
    Observe(cmd::observe::ObserveArgs),
    /// Built-in sample applications (run inside pods).
    #[command(subcommand)]
    App(AppCommand),
    /// The waypoint: the L7 proxy of the services and pods bound to a
    /// Gateway of class istio-waypoint (docs/waypoint.md). Runs in the
    /// waypoint's pods, which the local cluster makes for each such
    /// Gateway; its settings come from the environment they are given.
    Waypoint(slipstream_waypoint::run::WaypointArgs),
    /// The init of a pod's container: its own PID namespace, then the
    /// command, confined (started by the agent and `exec`; not for direct use).
    #[command(hide = true)]
    PodInit {
        #[arg(long)]
        spec: String,
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
    /// The cluster agent (started by `up`; not for direct use).
    #[command(hide = true)]
    Agent {
        #[arg(long, default_value_t = 2)]
        nodes: usize,
        #[arg(long)]
        ca_cert: Option<PathBuf>,
        #[arg(long)]
        ca_key: Option<PathBuf>,
        #[arg(long, default_value_t = 1)]
        control_replicas: usize,
        #[arg(long, default_value = "auto")]
        datapath: slipstream_testbed::agent::datapath::Mode,
    },
}

#[derive(Subcommand)]
enum AppCommand {
    /// HTTP echo server (`/echo?size=N`, `/headers`) and raw TCP echo.
    Echo(slipstream_apps::EchoArgs),
    /// One service of the bookinfo sample (productpage, details, reviews, ratings).
    Bookinfo(slipstream_apps::BookinfoArgs),
}

fn main() {
    tool::cni_plugin_if_named();
    let cli = Cli::parse_from(tool::as_tool(std::env::args_os().collect()));
    // Asked only by the commands that can act on Kubernetes.
    let on_kube = std::cell::LazyCell::new(|| kube::target::from_cli(&cli.cluster, &cli.kube));
    let result = match cli.command {
        // First, before anything could start a process: pod-init's first
        // child becomes PID 1 of the pod's namespace.
        Command::PodInit { spec, command } => slipstream_testbed::sys::podinit::main(&spec, &command),
        Command::App(AppCommand::Echo(a)) => slipstream_apps::run_echo(a),
        Command::App(AppCommand::Bookinfo(a)) => slipstream_apps::run_bookinfo(a),
        Command::BenchControl(args) => slipstream_bench::control::run(args),
        Command::BenchPolicy(args) => slipstream_bench::policy_cost::run(args),
        // The mesh's own processes: nothing of the local cluster (the CLI's
        // context finds its paths through the test bed).
        Command::Waypoint(args) => cmd::waypoint::run(args),
        Command::Node(args) => cmd::node::run(&cli.cluster, args),
        Command::Control(args) => cmd::control::run(args),
        Command::NodeAgent(args) => {
            slipstream_proxy::process::init();
            slipstream_cni::agent::run(args)
        }
        cmd if on_kubernetes_too(&cmd) && on_kube.is_some() => on_kubernetes(on_kube.as_ref().expect("checked"), cmd),
        cmd => common::Ctx::new(&cli.cluster).and_then(|ctx| match cmd {
            Command::Up { files, nodes, timeout, ca_cert, ca_key, validate, control_replicas, datapath } => {
                common::set_load_options("up", validate);
                cmd::up::run(&ctx, &files, cmd::up::Shape { nodes, control_replicas, datapath }, timeout, ca_cert, ca_key)
            }
            Command::Bench(args) => slipstream_bench::run(args),
            Command::Debug(d) => cmd::debug::run(&ctx, d),
            Command::Down => cmd::down::run(&ctx),
            Command::ProxyStatus { output } => cmd::proxy_status::run(&ctx, &output),
            Command::Observe(args) => cmd::observe::run(&ctx, &args),
            Command::ProxyConfig { args, node, output } => {
                let (node, section) = cmd::proxy_config::target(&ctx, &args, node)?;
                cmd::proxy_config::run(&ctx, &node, section, &output)
            }
            Command::Policy(cmd::policy::PolicyCommand::Check { from, to, filename, node, output }) => {
                cmd::policy::check(&ctx, &from, &to, &filename, node.as_deref(), &output)
            }
            Command::Status { output } => cmd::status::run(&ctx, &output),
            Command::X(x) => cmd::istioctl::run(&ctx, x),
            Command::Analyze { namespace, all_namespaces, output } => {
                cmd::analyze::run(&ctx, namespace.as_deref(), all_namespaces, &output).map(|code| {
                    if code != 0 {
                        std::process::exit(code)
                    }
                })
            }
            Command::Apply { files, no_wait, timeout, validate, namespace, selector } => {
                common::set_load_options("apply", validate);
                common::set_load_namespace(namespace);
                cmd::apply::apply(&ctx, &files, selector.as_deref(), !no_wait, timeout)
            }
            Command::Delete { files, resources, namespace, ignore_not_found, no_wait, timeout, validate } => {
                common::set_load_options("delete", validate);
                if resources.is_empty() {
                    common::set_load_namespace(namespace);
                    cmd::apply::delete(&ctx, &files, ignore_not_found, !no_wait, timeout)
                } else {
                    cmd::kubectl::delete(&ctx, &resources, namespace.as_deref(), ignore_not_found, timeout)
                }
            }
            Command::Get { resources, scope, output, watch } => cmd::kubectl::get(
                &ctx,
                cmd::kubectl::GetArgs { resources: &resources, scope: scope.scope()?, output: output.as_deref(), watch },
            ),
            Command::Describe { resources, scope } => cmd::kubectl::describe(&ctx, &resources, scope.scope()?),
            Command::Label(a) => cmd::kubectl::label(&ctx, &a.args, a.namespace.as_deref(), a.overwrite, false),
            Command::Annotate(a) => cmd::kubectl::label(&ctx, &a.args, a.namespace.as_deref(), a.overwrite, true),
            Command::Create(cmd::kubectl::CreateCommand::Namespace { name }) => cmd::kubectl::create_namespace(&ctx, &name),
            Command::Wait { resources, scope, all, for_, timeout } => {
                cmd::kubectl::wait(&ctx, cmd::kubectl::WaitArgs { resources: &resources, scope: scope.scope()?, all, for_: &for_, timeout })
            }
            Command::Exec { namespace, container, privileged, pod, command, .. } => {
                cmd::exec::run(&ctx, &namespace, &pod, container.as_deref(), privileged, &command).map(|code| std::process::exit(code))
            }
            Command::Logs { namespace, container, follow, pod } => cmd::logs::run(&ctx, &namespace, &pod, container.as_deref(), follow),
            Command::Rollout(cmd::rollout::RolloutCommand::Restart { namespace, resources }) => {
                cmd::rollout::restart(&ctx, &namespace, &resources)
            }
            Command::Rollout(cmd::rollout::RolloutCommand::Status { namespace, resource, timeout }) => {
                cmd::rollout::status(&ctx, &namespace, &resource, timeout)
            }
            Command::Agent { nodes, ca_cert, ca_key, control_replicas, datapath } => {
                cmd::agent::run(&ctx, nodes, control_replicas, datapath, ca_cert, ca_key)
            }
            Command::App(_)
            | Command::PodInit { .. }
            | Command::BenchControl(_)
            | Command::BenchPolicy(_)
            | Command::Waypoint(_)
            | Command::Node(_)
            | Command::NodeAgent(_)
            | Command::Control(_) => {
                unreachable!("handled above")
            }
        }),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// The commands that can act on a Kubernetes install.
fn on_kubernetes_too(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Status { .. }
            | Command::ProxyStatus { .. }
            | Command::ProxyConfig { .. }
            | Command::Policy(_)
            | Command::Observe(_)
            | Command::X(_)
    )
}

/// The commands that act on a Kubernetes install, there.
fn on_kubernetes(target: &kube::target::KubeTarget, cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Status { output } => kube::status::run(target, &output),
        Command::ProxyStatus { output } => kube::proxies::proxy_status(target, &output),
        Command::ProxyConfig { args, node, output } => kube::proxies::proxy_config(target, &args, node, &output),
        Command::Policy(cmd::policy::PolicyCommand::Check { from, to, filename, node, output }) => {
            kube::proxies::policy_check(target, &from, &to, &filename, node.as_deref(), &output)
        }
        Command::Observe(args) => kube::observe::run(target, &args),
        Command::X(x) => kube::waypoint::run(target, x),
        _ => anyhow::bail!("this command acts on the local cluster only, not on Kubernetes"),
    }
}

#[cfg(test)]
mod arguments {
    #[test]
    fn kubeconfig_and_context_anywhere_on_the_commands_that_take_them() {
        use clap::Parser;
        for argv in [
            &["slipstream", "status", "--kubeconfig", "/k", "-o", "json"][..],
            &["slipstream", "--kubeconfig", "/k", "proxy-status"],
            &["slipstream", "x", "waypoint", "list", "-n", "ns", "--kubeconfig=/k", "--context", "c"],
            &["slipstream", "policy", "check", "--from", "a/b", "--to", "a/c:80", "--kubeconfig", "/k"],
        ] {
            let cli = super::Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            assert_eq!(cli.kube.kubeconfig.as_deref(), Some(std::path::Path::new("/k")), "{argv:?}");
            assert!(super::on_kubernetes_too(&cli.command), "{argv:?}");
        }
        let cli = super::Cli::try_parse_from(["slipstream", "get", "pods"]).unwrap();
        assert!(!super::on_kubernetes_too(&cli.command), "kubectl's verbs act on the local cluster only");
    }

    #[test]
    fn label_takes_flags_between_its_words() {
        use clap::Parser;
        for argv in [
            &["slipstream", "label", "svc", "x", "-n", "ns", "k=v", "--overwrite"][..],
            &["slipstream", "label", "-n", "ns", "svc", "x", "k=v"],
            &["slipstream", "annotate", "svc/x", "--overwrite", "k=v", "-n", "ns"],
        ] {
            let cli = super::Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            let (super::Command::Label(a) | super::Command::Annotate(a)) = cli.command else { panic!("{argv:?}") };
            assert_eq!(a.namespace.as_deref(), Some("ns"), "{argv:?}");
            assert_eq!(a.args.last().map(String::as_str), Some("k=v"), "{argv:?}");
        }
    }
}
