use crate::common::{self, Ctx};
use crate::examples;
use anyhow::{bail, Context};
use slipstream_testbed::agent::store::{ClusterFacts, Store};
use slipstream_testbed::cluster::{self, Cluster, UpError};
use slipstream_testbed::ipc::{Request, Response};
use slipstream_testbed::plan;
use slipstream_testbed::status::ClusterStatus;
use std::path::PathBuf;
use std::time::Duration;

/// How big a cluster `up` builds.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub nodes: usize,
    pub control_replicas: usize,
    pub datapath: slipstream_testbed::agent::datapath::Mode,
}

pub fn run(
    ctx: &Ctx,
    files: &[PathBuf],
    shape: Shape,
    timeout: Duration,
    ca_cert: Option<PathBuf>,
    ca_key: Option<PathBuf>,
) -> anyhow::Result<()> {
    common::require_root("up")?;
    let Shape { nodes, control_replicas, datapath } = shape;
    if !(1..=plan::MAX_NODES).contains(&nodes) {
        bail!("--nodes must be between 1 and {}", plan::MAX_NODES);
    }
    if !(1..=plan::MAX_CONTROL_REPLICAS).contains(&control_replicas) {
        bail!("--control-replicas must be between 1 and {}", plan::MAX_CONTROL_REPLICAS);
    }
    preflight()?;
    let loaded = if files.is_empty() {
        println!("using the bundled example {}", examples::QUICKSTART_NAME);
        let l = slipstream_k8s::load_str(examples::QUICKSTART, &slipstream_k8s::Source(examples::QUICKSTART_NAME.into()))
            .map_err(|e| anyhow::anyhow!("the bundled example is invalid (a bug): {e}"))?;
        common::print_warnings(&l);
        l
    } else {
        common::load(files)?
    };
    let objects: Vec<_> = loaded.into_iter().map(|l| l.object).collect();

    // Check the whole apply against the cluster-to-be before touching anything.
    let node_names: Vec<String> = (1..=nodes).map(plan::node_name).collect();
    let vips = Default::default();
    if let Err(errors) = Store::new().plan_apply(objects.clone(), &ClusterFacts { nodes: &node_names, vips: &vips }) {
        bail!("invalid manifests, nothing was changed:\n{}", errors.join("\n"));
    }

    // The operator's CA must be valid now and outlive a workload
    // certificate; checked here so that a bad one creates nothing.
    if let (Some(c), Some(k)) = (&ca_cert, &ca_key) {
        slipstream_testbed::agent::validate_ca(c, k)
            .map_err(|e| anyhow::anyhow!("--ca-cert/--ca-key refused, nothing was changed: {e:#}"))?;
    }

    // From here on the machine changes: Ctrl-C (or SIGTERM, SIGHUP) rolls back.
    catch_interrupts()?;
    let spec = cluster::Spec { nodes, control_replicas, datapath, ca_cert, ca_key, program: std::env::current_exe()? };
    let interrupted = common::interrupted;
    let io = cluster::Io { interrupted: &interrupted, say: &|l| println!("{l}"), warn: &|l| eprintln!("{l}") };
    let made = match Cluster::up(&ctx.paths, &spec, &io) {
        Ok(c) => c,
        Err(e @ UpError::InterruptedBeforeCreating) => {
            println!("{e}");
            std::process::exit(130);
        }
        // Rolled back already, saying so.
        Err(UpError::Interrupted) => std::process::exit(130),
        Err(e) => return Err(e.into()),
    };
    match build(ctx, objects, timeout) {
        Ok(st) => {
            print_next_steps(ctx, &st);
            Ok(())
        }
        Err(_) if common::interrupted() => {
            made.roll_back(&io);
            std::process::exit(130)
        }
        Err(e) => Err(e),
    }
}

/// SIGINT, SIGTERM and SIGHUP raise `common::interrupted()`; a second one
/// exits at once (code 130).
fn catch_interrupts() -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let flag = common::interrupt_flag();
    for sig in [SIGINT, SIGTERM, SIGHUP] {
        // Conditional first: it exits only if the flag was already raised.
        signal_hook::flag::register_conditional_shutdown(sig, 130, flag.clone()).context("installing signal handlers")?;
        signal_hook::flag::register(sig, flag.clone()).context("installing signal handlers")?;
    }
    Ok(())
}

/// Applies the manifests, waits for the pods.
fn build(ctx: &Ctx, objects: Vec<slipstream_k8s::Object>, timeout: Duration) -> anyhow::Result<ClusterStatus> {
    match ctx.call(&Request::Apply { objects }, Duration::from_secs(120))? {
        Response::Done { lines } => lines.iter().for_each(|l| println!("{l}")),
        Response::Rejected { errors } => {
            // Cannot happen after the check above unless the agent disagrees.
            bail!("the cluster rejected the manifests:\n{}", errors.join("\n"))
        }
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
    if common::interrupted() {
        bail!("interrupted");
    }
    println!("waiting for pods to be ready (timeout {timeout:?})");
    common::wait_converged(ctx, timeout, false, &common::Scope::All)
}

fn print_next_steps(ctx: &Ctx, st: &ClusterStatus) {
    let paths = &ctx.paths;
    println!(
        "\ncluster {:?} is up: {} node(s), {} pod(s), {} service(s). Try:",
        paths.cluster.as_str(),
        st.nodes.len(),
        st.pods.len(),
        st.services.len()
    );
    let flag = if paths.cluster.as_str() == slipstream_testbed::names::DEFAULT_CLUSTER {
        String::new()
    } else {
        format!(" --cluster {}", paths.cluster)
    };
    println!("  slipstream{flag} status");
    // Suggest reaching a service from a pod that is not one of its endpoints.
    if let Some(svc) = st.services.first() {
        let serving: Vec<&str> = svc.endpoints.iter().map(|e| e.pod.as_str()).collect();
        if let Some(client) = st.pods.iter().find(|p| !serving.contains(&p.name.as_str())).or(st.pods.first()) {
            let port = svc.ports.first().map(|p| p.port).unwrap_or(80);
            let target = match client.owner.as_deref().and_then(|o| o.strip_prefix("Deployment/")) {
                Some(d) => format!("deploy/{d}"),
                None => client.name.clone(),
            };
            println!("  slipstream{flag} exec -n {} {target} -- curl -s http://{}.{}:{port}/", client.namespace, svc.name, svc.namespace);
        }
    }
    println!("  slipstream{flag} down");
}

/// The tools and kernel features `up` needs, each with what to do if absent.
fn preflight() -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for (tool, pkg) in [("ip", "iproute2"), ("nft", "nftables")] {
        let found = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file())).unwrap_or(false)
            || ["/usr/sbin", "/sbin"].iter().any(|d| std::path::Path::new(d).join(tool).is_file());
        if !found {
            missing.push(format!("{tool} (package {pkg})"));
        }
    }
    if !missing.is_empty() {
        bail!("missing tools: {}; run `sudo scripts/setup.sh`", missing.join(", "));
    }
    Ok(())
}
