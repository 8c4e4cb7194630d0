use crate::common::{self, Ctx};
use anyhow::{bail, Context};
use slipstream_testbed::names::netns_path;
use slipstream_testbed::status::{ClusterStatus, PodStatus};
use slipstream_testbed::sys::spawn::{self, SandboxSpec};
use std::path::PathBuf;

/// What `exec` and `logs` were asked for, in kubectl's `TYPE/NAME` forms.
#[derive(Debug, PartialEq, Eq)]
pub enum Target<'a> {
    Pod(&'a str),
    /// A Deployment's first ready pod.
    Deployment(&'a str),
}

/// `NAME`, `pod/NAME` (`po`, `pods`), `deploy/NAME` (`deployment`,
/// `deployments`, `deployment.apps`, `deployments.apps`), as kubectl takes them.
pub fn parse_target(s: &str) -> Result<Target<'_>, String> {
    let Some((kind, name)) = s.split_once('/') else { return Ok(Target::Pod(s)) };
    if name.is_empty() || name.contains('/') {
        return Err(format!("{s:?} is not NAME or TYPE/NAME"));
    }
    match kind.to_ascii_lowercase().as_str() {
        "po" | "pod" | "pods" => Ok(Target::Pod(name)),
        "deploy" | "deployment" | "deployments" | "deployment.apps" | "deployments.apps" => Ok(Target::Deployment(name)),
        _ => Err(format!(
            "unknown resource type {kind:?} in {s:?}: use NAME, pod/NAME or deployment/NAME (also po, pods, deploy, deployments, deployment.apps)"
        )),
    }
}

/// Finds a pod by name (or `pod/NAME`), or `deploy/NAME` for a
/// Deployment's first ready pod.
pub fn find_pod<'a>(st: &'a ClusterStatus, ns: &str, pod: &str) -> anyhow::Result<&'a PodStatus> {
    let pod = match parse_target(pod).map_err(anyhow::Error::msg)? {
        Target::Deployment(dep) => {
            let owner = format!("Deployment/{dep}");
            let mut pods: Vec<&PodStatus> = st.pods.iter().filter(|p| p.namespace == ns && p.owner.as_deref() == Some(&owner)).collect();
            pods.sort_by_key(|p| !p.ready);
            return pods.first().copied().ok_or_else(|| anyhow::anyhow!("deployment {ns}/{dep} has no pods"));
        }
        Target::Pod(name) => name,
    };
    st.pod(ns, pod).ok_or_else(|| {
        let names: Vec<String> = st.pods.iter().filter(|p| p.namespace == ns).map(|p| p.name.clone()).collect();
        anyhow::anyhow!(
            "pod {ns}/{pod} not found; pods in namespace {ns}: {}",
            if names.is_empty() { "none".into() } else { names.join(", ") }
        )
    })
}

/// The PID namespace of an exec'd command (pure): the container's when it
/// runs (its pod-init's pid), as `kubectl exec`; a new one of its own when it
/// does not (between restarts); with `privileged`, the machine's (None).
pub fn pid_namespace(privileged: bool, container_pid: Option<i32>) -> Option<spawn::PidNamespace> {
    match (privileged, container_pid) {
        (true, _) => None,
        (false, Some(pid)) => Some(spawn::PidNamespace::JoinContainer(pid)),
        (false, None) => Some(spawn::PidNamespace::New),
    }
}

/// Runs `argv` in the pod as its container runs (user, groups,
/// capabilities, the cluster's files hidden, in the container's PID
/// namespace), or with `privileged` as root with every capability and the
/// host's files and processes, for operators.
pub fn run(ctx: &Ctx, ns: &str, pod: &str, container: Option<&str>, privileged: bool, argv: &[String]) -> anyhow::Result<i32> {
    common::require_root("exec")?;
    let st = ctx.status()?;
    let p = find_pod(&st, ns, pod)?;
    if let Some(c) = container {
        if !p.containers.iter().any(|x| x.name == c) {
            bail!("pod {ns}/{} has no container {c:?}", p.name);
        }
    }
    if !netns_path(&p.netns).exists() {
        bail!("pod {ns}/{} has no network namespace (phase {:?}: {})", p.name, p.phase, p.message);
    }
    let dir = ctx.paths.pod_dir(&p.namespace, &p.name);
    let container = container.or(p.containers.first().map(|c| c.name.as_str())).unwrap_or_default();
    let confinement = if privileged {
        None
    } else {
        let path = slipstream_testbed::agent::pods::security_file(&dir, container);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!("reading what container {container:?} of pod {ns}/{} runs as (use --privileged to run as root)", p.name)
        })?;
        let sec: slipstream_k8s::ContainerSecurity = serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))?;
        Some(spawn::confinement(&sec))
    };
    let mut env = vec![("PATH".to_string(), spawn::pod_path()), ("HOSTNAME".to_string(), p.name.clone())];
    // `slipstream` run in the pod (e.g. `debug hbone`) acts on this cluster.
    env.push(("SLIPSTREAM_CLUSTER".to_string(), ctx.paths.cluster.as_str().to_string()));
    for k in ["TERM", "HOME", "LANG"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.to_string(), v));
        }
    }
    if confinement.as_ref().is_some_and(|c| c.uid != 0) {
        env.retain(|(k, _)| k != "HOME");
        env.push(("HOME".into(), "/".into()));
    }
    let spec = SandboxSpec {
        argv: argv.to_vec(),
        env,
        cwd: confinement.as_ref().map(|_| PathBuf::from("/")),
        netns: netns_path(&p.netns),
        cgroup: PathBuf::from(&p.cgroup),
        hostname: p.name.clone(),
        hosts: Some(dir.join("hosts")),
        resolv: Some(dir.join("resolv.conf")),
        log: None,
        new_session: false,
        private_mounts: true,
        masked_files: slipstream_testbed::agent::masked_files(&ctx.paths),
        // The agent stops a pod by signalling its whole cgroup, this exec
        // included: pod-init must not pass those on a second time.
        cgroup_signaller: st.agent.running.then_some(st.agent.pid),
    };
    let pid = p.containers.iter().find(|c| c.name == container).and_then(|c| c.pid);
    let child = match (&confinement, pid_namespace(privileged, pid)) {
        (Some(c), Some(ns)) => spawn::spawn_confined(&spec, c, ns),
        _ => spawn::spawn(&spec),
    };
    let mut child = child.with_context(|| format!("running {:?} in pod {ns}/{}", argv[0], p.name))?;
    Ok(slipstream_testbed::sys::signals::exit_code(child.wait()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_namespace_of_an_exec() {
        use spawn::PidNamespace::*;
        for (privileged, pid, want) in
            [(true, Some(42), None), (true, None, None), (false, Some(42), Some(JoinContainer(42))), (false, None, Some(New))]
        {
            assert_eq!(pid_namespace(privileged, pid), want, "privileged {privileged}, container pid {pid:?}");
        }
    }

    #[test]
    fn target_forms_as_kubectl_takes_them() {
        let ok: &[(&str, Target)] = &[
            ("web-1", Target::Pod("web-1")),
            ("pod/web-1", Target::Pod("web-1")),
            ("pods/web-1", Target::Pod("web-1")),
            ("po/web-1", Target::Pod("web-1")),
            ("Pod/web-1", Target::Pod("web-1")),
            ("deploy/web", Target::Deployment("web")),
            ("deployment/web", Target::Deployment("web")),
            ("deployments/web", Target::Deployment("web")),
            ("deployment.apps/web", Target::Deployment("web")),
            ("deployments.apps/web", Target::Deployment("web")),
        ];
        for (s, want) in ok {
            assert_eq!(parse_target(s).as_ref(), Ok(want), "{s}");
        }
        let e = parse_target("svc/web").unwrap_err();
        assert!(e.starts_with("unknown resource type \"svc\" in \"svc/web\": use NAME, pod/NAME or deployment/NAME"), "{e}");
        assert!(parse_target("pod/").is_err());
        assert!(parse_target("pod/a/b").is_err());
    }

    #[test]
    fn find_pod_by_every_form() {
        let st: ClusterStatus = serde_json::from_value(serde_json::json!({
            "version": 1, "cluster": "t", "agent": {"pid": 1, "running": true}, "nodes": [], "services": [],
            "pods": [
                {"namespace": "default", "name": "web-a", "node": "node1", "ip": "10.244.1.2", "serviceAccount": "default",
                 "labels": {}, "phase": "Running", "ready": false, "restarts": 0, "netns": "x", "veth": "vp2", "cgroup": "/c",
                 "owner": "Deployment/web", "containers": []},
                {"namespace": "default", "name": "web-b", "node": "node1", "ip": "10.244.1.3", "serviceAccount": "default",
                 "labels": {}, "phase": "Running", "ready": true, "restarts": 0, "netns": "x", "veth": "vp3", "cgroup": "/c",
                 "owner": "Deployment/web", "containers": []}
            ]
        }))
        .unwrap();
        for form in ["web-a", "pod/web-a", "pods/web-a", "po/web-a"] {
            assert_eq!(find_pod(&st, "default", form).unwrap().name, "web-a", "{form}");
        }
        for form in ["deploy/web", "deployment/web", "deployments/web", "deployment.apps/web"] {
            assert_eq!(find_pod(&st, "default", form).unwrap().name, "web-b", "{form}: the ready one");
        }
        let e = find_pod(&st, "default", "deploy/nope").unwrap_err().to_string();
        assert_eq!(e, "deployment default/nope has no pods");
        let e = find_pod(&st, "default", "pod/nope").unwrap_err().to_string();
        assert_eq!(e, "pod default/nope not found; pods in namespace default: web-a, web-b");
        assert!(find_pod(&st, "default", "svc/web").unwrap_err().to_string().contains("unknown resource type \"svc\""));
    }
}
