//! What the commands share: the cluster's paths, privilege checks, manifest
//! loading, reading status and waiting for pods.

use anyhow::{bail, Context};
use slipstream_k8s::load::Loaded;
use slipstream_k8s::{Object, ObjectKey};
use slipstream_testbed::ipc::{self, Request, Response};
use slipstream_testbed::status::{ClusterStatus, PodPhase, PodStatus};
use slipstream_testbed::{ClusterName, Paths};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub struct Ctx {
    pub paths: Paths,
}

impl Ctx {
    pub fn new(cluster: &str) -> anyhow::Result<Ctx> {
        let name = ClusterName::new(cluster).map_err(anyhow::Error::msg)?;
        let cgroup2 = slipstream_testbed::sys::cgroup::cgroup2_mount().map_err(anyhow::Error::msg)?;
        Ok(Ctx { paths: Paths::new(name, &cgroup2) })
    }

    pub fn call(&self, req: &Request, timeout: Duration) -> anyhow::Result<Response> {
        Ok(ipc::call(&self.paths.socket(), req, timeout)?)
    }

    /// Status from the agent, or from its last state file if it is down.
    pub fn status(&self) -> anyhow::Result<ClusterStatus> {
        match self.call(&Request::Status, Duration::from_secs(10)) {
            Ok(Response::Status { status }) => Ok(*status),
            Ok(other) => bail!("unexpected answer from the agent: {other:?}"),
            Err(e) => {
                // Not root: say so, rather than "not running" or a stale state file.
                if matches!(e.downcast_ref::<ipc::IpcError>(), Some(ipc::IpcError::PermissionDenied(_))) {
                    return Err(e);
                }
                let text = std::fs::read_to_string(self.paths.state_file()).map_err(|err| match err.kind() {
                    std::io::ErrorKind::PermissionDenied => anyhow::anyhow!(
                        "permission denied reading {}: the cluster belongs to root; run the command with sudo",
                        self.paths.state_file().display()
                    ),
                    _ => anyhow::anyhow!("no cluster {:?} is running (start one with `slipstream up`)", self.paths.cluster.as_str()),
                })?;
                let mut st: ClusterStatus = serde_json::from_str(&text).context("reading the state file")?;
                st.agent.running = false;
                if std::env::var_os("SLIPSTREAM_DEBUG").is_some() {
                    eprintln!("debug: agent not answering: {e}");
                }
                Ok(st)
            }
        }
    }
}

/// Raised by SIGINT, SIGTERM or SIGHUP once `up` catches them (see
/// `cmd::up`), so that its waits stop and it can roll back.
static INTERRUPTED: std::sync::OnceLock<std::sync::Arc<std::sync::atomic::AtomicBool>> = std::sync::OnceLock::new();

/// The flag the signal handlers raise (created on first use).
pub fn interrupt_flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    INTERRUPTED.get_or_init(Default::default).clone()
}

pub fn interrupted() -> bool {
    INTERRUPTED.get().is_some_and(|f| f.load(std::sync::atomic::Ordering::SeqCst))
}

/// Writes to stdout. A reader that went away (`| head`) ends the command
/// quietly, as for any Unix filter, instead of a panic or an error.
pub fn out(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    match o.write_all(text.as_bytes()).and_then(|_| o.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => Ok(r?),
    }
}

pub fn require_root(what: &str) -> anyhow::Result<()> {
    if !is_root() {
        bail!("`slipstream {what}` needs root (it creates network namespaces and cgroups); run it with sudo");
    }
    Ok(())
}

pub fn is_root() -> bool {
    // /proc/self/status Uid line: real, effective, saved, fs.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(2) == Some("0")))
        .unwrap_or(false)
}

/// The command that loads manifests and its `--validate`, set once by
/// `main` for `up`, `apply` and `delete`.
static LOAD_OPTIONS: std::sync::OnceLock<(&'static str, slipstream_k8s::FieldValidation)> = std::sync::OnceLock::new();

pub fn set_load_options(verb: &'static str, validation: slipstream_k8s::FieldValidation) {
    let _ = LOAD_OPTIONS.set((verb, validation));
}

/// kubectl's `-n` of apply and delete -f: the namespace of objects that
/// name none.
static LOAD_NAMESPACE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

pub fn set_load_namespace(namespace: Option<String>) {
    if let Some(ns) = namespace {
        let _ = LOAD_NAMESPACE.set(ns);
    }
}

/// Loads manifests (`-` is standard input), printing their warnings; every
/// error at once. Nothing to load is an error, as in kubectl.
pub fn load(files: &[PathBuf]) -> anyhow::Result<Vec<Loaded>> {
    let (verb, validation) = LOAD_OPTIONS.get().copied().unwrap_or(("apply", Default::default()));
    let loaded = slipstream_k8s::load_paths_in(files, validation, LOAD_NAMESPACE.get().map(String::as_str))
        .map_err(|e| anyhow::anyhow!("invalid manifests, nothing was changed:\n{e}"))?;
    if loaded.is_empty() {
        let names: Vec<String> =
            files.iter().map(|f| if f.as_os_str() == "-" { "<stdin>".into() } else { f.display().to_string() }).collect();
        bail!("no objects passed to {verb} ({} holds no manifest); nothing was changed", names.join(", "));
    }
    print_warnings(&loaded);
    check_mesh_kinds(&loaded)?;
    Ok(loaded)
}

/// The policy kinds the control plane reads (AuthorizationPolicy,
/// PeerAuthentication) are checked here with the control plane's own
/// parser and validation, so a policy it would refuse is refused by `apply`
/// with nothing changed, naming the object and the field, instead of being
/// stored and then ignored.
fn check_mesh_kinds(loaded: &[Loaded]) -> anyhow::Result<()> {
    let mut errors = Vec::new();
    // Waypoints among the objects given, by namespace, to name in warnings.
    let waypoints: Vec<(String, String)> = loaded
        .iter()
        .filter_map(|l| match &l.object {
            Object::Kept(k) if k.kind == "Gateway" && k.spec.get("gatewayClassName").and_then(|c| c.as_str()) == Some("istio-waypoint") => {
                Some((k.metadata.namespace.clone(), k.metadata.name.clone()))
            }
            _ => None,
        })
        .collect();
    for l in loaded {
        let Object::Kept(k) = &l.object else { continue };
        let mut value = serde_json::json!({"apiVersion": k.api_version, "kind": k.kind, "metadata": k.metadata, "spec": k.spec});
        if let Some(data) = &k.data {
            value["data"] = data.clone();
        }
        let parsed = slipstream_control::objects::parse_value(value);
        let checked = parsed.as_ref().map_err(Clone::clone).and_then(|o| match o {
            Some(o) => slipstream_control::translate::validate(o),
            None => Ok(()),
        });
        if let Err(e) = checked {
            errors.push(format!("{}: {e}", l.place()));
            continue;
        }
        if let Ok(Some(slipstream_control::objects::ClusterObject::Opaque(o))) = &parsed {
            if o.kind == slipstream_control::objects::Kind::RequestAuthentication {
                if let Ok(ra) = slipstream_control::translate::request_authentication::request_authentication(
                    o,
                    slipstream_control::translate::DEFAULT_DOMAIN_SUFFIX,
                ) {
                    if let Some(why) = ra.inert {
                        eprintln!(
                            "warning: {}: RequestAuthentication {}/{} has no effect: {why}",
                            l.place(),
                            k.metadata.namespace,
                            k.metadata.name
                        );
                    }
                }
            }
        }
        if let Ok(Some(slipstream_control::objects::ClusterObject::AuthorizationPolicy(p))) = &parsed {
            let ns = k.metadata.namespace.clone();
            let r =
                slipstream_control::objects::ObjectRef::new(slipstream_control::objects::Kind::AuthorizationPolicy, &ns, &k.metadata.name);
            let rules = slipstream_control::translate::authorization::l7_rules_at_l4(p, &r);
            if !rules.is_empty() {
                let fix = match waypoints.iter().find(|(n, _)| *n == ns) {
                    Some((_, w)) => format!(
                        "bind the selected pods' Service to waypoint {ns}/{w} (label istio.io/use-waypoint: {w}) and give the policy targetRefs to that Service instead of a selector"
                    ),
                    None => "deploy a waypoint (a Gateway of class istio-waypoint), bind the selected pods' Service to it (label istio.io/use-waypoint) and give the policy targetRefs to that Service instead of a selector".to_string(),
                };
                eprintln!(
                    "warning: {}: AuthorizationPolicy {ns}/{}: {} name L7 attributes (methods, paths, hosts, headers or request conditions); the node proxies enforce them with L4 fail-safe semantics (an ALLOW rule that needs them matches nothing; a DENY rule denies on its L4 part). To enforce them at L7: {fix}",
                    l.place(),
                    k.metadata.name,
                    rules.join(", ")
                );
            }
        }
    }
    if !errors.is_empty() {
        bail!("invalid manifests, nothing was changed:\n{}", errors.join("\n"));
    }
    Ok(())
}

pub fn print_warnings(loaded: &[Loaded]) {
    for l in loaded {
        for w in &l.warnings {
            eprintln!("warning: {}: {w}", l.place());
        }
    }
}

/// Why a pod blocks convergence, if it does: Some(Err) for a failure that
/// waiting will not fix.
fn pod_blocker(p: &PodStatus) -> Option<Result<String, String>> {
    let id = format!("pod {}/{}", p.namespace, p.name);
    match p.phase {
        PodPhase::Failed => Some(Err(format!("{id} failed: {} {}", p.reason, p.message))),
        PodPhase::Succeeded => None,
        PodPhase::Terminating => Some(Ok(format!("{id} is stopping"))),
        _ if p.reason == "CrashLoopBackOff" || p.reason == "StartError" => {
            Some(Err(format!("{id} is not starting: {}: {}", p.reason, p.message)))
        }
        _ if !p.ready => {
            Some(Ok(format!("{id} is {:?}{}", p.phase, if p.message.is_empty() { String::new() } else { format!(" ({})", p.message) })))
        }
        _ => None,
    }
}

/// Waits until every pod is ready (or completed) and no pod is stopping.
/// Prints each pod once as it becomes ready. Fails fast on a crashing pod,
/// naming it, the reason and the end of its log.
pub fn wait_converged(ctx: &Ctx, timeout: Duration, quiet: bool, scope: &Scope) -> anyhow::Result<ClusterStatus> {
    let deadline = Instant::now() + timeout;
    let mut shown = std::collections::BTreeSet::new();
    loop {
        if interrupted() {
            bail!("interrupted");
        }
        let st = ctx.status()?;
        if !st.agent.running {
            bail!("the cluster agent stopped; see {}", ctx.paths.agent_log().display());
        }
        let pods: Vec<&PodStatus> = st.pods.iter().filter(|p| scope.contains(p)).collect();
        for p in &pods {
            if p.ready && shown.insert((p.namespace.clone(), p.name.clone())) && !quiet {
                println!("  pod {}/{} running on {} ({})", p.namespace, p.name, p.node, p.ip);
            }
        }
        let mut waiting = Vec::new();
        for p in pods {
            match pod_blocker(p) {
                Some(Err(e)) => {
                    let tail = p
                        .containers
                        .iter()
                        .find(|c| c.last_exit_code.is_some() || c.state != "running")
                        .map(|c| log_tail(&c.log, 8))
                        .unwrap_or_default();
                    let mut msg = e;
                    if !tail.is_empty() {
                        msg.push_str(&format!("\nlast lines of its log:\n{tail}"));
                    }
                    msg.push_str(&format!(
                        "\nthe cluster is still up: inspect with `slipstream logs -n {} {}`, remove it with `slipstream down`",
                        p.namespace, p.name
                    ));
                    bail!(msg);
                }
                Some(Ok(w)) => waiting.push(w),
                None => {}
            }
        }
        // A Deployment in the middle of a rollout: its old pods stop only
        // once every new one is ready (the agent does it on its next tick).
        waiting.extend(rollouts_in_progress(&pods_in(&st, scope)));
        // `up` returns with every node proxy answering its readiness probe,
        // so its first `status` does not show them NOT READY (starting).
        if matches!(scope, Scope::All) {
            for n in &st.nodes {
                if let Some(p) = n.proxy.as_ref().filter(|p| p.ready == Some(false)) {
                    waiting.push(format!("node proxy of {}: not ready ({})", n.name, p.reason));
                }
            }
        }
        if waiting.is_empty() {
            return Ok(st);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for:\n  {}", waiting.join("\n  "));
        }
        std::thread::sleep(Duration::from_millis(150));
    }
}

fn pods_in<'a>(st: &'a ClusterStatus, scope: &Scope) -> Vec<&'a PodStatus> {
    st.pods.iter().filter(|p| scope.contains(p)).collect()
}

/// What a Deployment whose pods are of more than one template waits for.
fn rollouts_in_progress(pods: &[&PodStatus]) -> Vec<String> {
    let mut templates: std::collections::BTreeMap<(&str, &str), std::collections::BTreeMap<&str, usize>> = Default::default();
    for p in pods {
        if let (Some(owner), Some(hash)) =
            (p.owner.as_deref().and_then(|o| o.strip_prefix("Deployment/")), p.labels.get("pod-template-hash"))
        {
            *templates.entry((p.namespace.as_str(), owner)).or_default().entry(hash.as_str()).or_default() += 1;
        }
    }
    templates
        .into_iter()
        .filter(|(_, by)| by.len() > 1)
        .map(|((ns, name), by)| {
            format!(
                "deployment {ns}/{name}: rollout in progress (pods of {} templates; the old ones stop once every new one is ready)",
                by.len()
            )
        })
        .collect()
}

pub fn log_tail(path: &str, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let v: Vec<&str> = text.lines().collect();
    v[v.len().saturating_sub(lines)..].iter().map(|l| format!("    {l}")).collect::<Vec<_>>().join("\n")
}

/// Which pods a command waits for: all of them (`up`), or those of the
/// objects it applied or deleted, so that an unrelated failing pod does not
/// fail an apply.
pub enum Scope {
    All,
    Objects(Vec<ObjectKey>),
}

impl Scope {
    /// The objects, and what the local cluster makes for them (a waypoint
    /// Gateway's Deployment): an apply that creates a waypoint returns once
    /// its pod is ready and the node proxies know it, so the next request
    /// to a service bound to it goes through.
    pub fn of(objects: &[Object]) -> Scope {
        let mut keys: Vec<ObjectKey> = objects.iter().map(|o| o.key()).collect();
        for o in objects {
            if let Object::Kept(k) = o {
                keys.extend(slipstream_k8s::expand::waypoint_objects(k).into_iter().flatten().map(|m| m.key()));
            }
        }
        Scope::Objects(keys)
    }

    fn contains(&self, p: &PodStatus) -> bool {
        match self {
            Scope::All => true,
            Scope::Objects(keys) => keys.iter().any(|k| match k.kind.as_str() {
                "Pod" => k.namespace == p.namespace && k.name == p.name,
                "Deployment" => k.namespace == p.namespace && p.owner.as_deref() == Some(&format!("Deployment/{}", k.name)),
                "Namespace" => k.name == p.namespace,
                _ => false,
            }),
        }
    }
}
