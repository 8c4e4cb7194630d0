use crate::common::{self, Ctx};
use anyhow::{bail, Context};
use slipstream_testbed::names::netns_path;
use slipstream_testbed::status::{ClusterStatus, PodStatus};
use slipstream_testbed::sys::spawn::{self, SandboxSpec};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;

/// Finds a pod by name, or `deploy/NAME` for a Deployment's first ready pod.
pub fn find_pod<'a>(st: &'a ClusterStatus, ns: &str, pod: &str) -> anyhow::Result<&'a PodStatus> {
    if let Some(dep) = pod.strip_prefix("deploy/").or_else(|| pod.strip_prefix("deployment/")) {
        let owner = format!("Deployment/{dep}");
        let mut pods: Vec<&PodStatus> = st.pods.iter().filter(|p| p.namespace == ns && p.owner.as_deref() == Some(&owner)).collect();
        pods.sort_by_key(|p| !p.ready);
        return pods.first().copied().ok_or_else(|| anyhow::anyhow!("deployment {ns}/{dep} has no pods"));
    }
    st.pod(ns, pod).ok_or_else(|| {
        let names: Vec<String> = st.pods.iter().filter(|p| p.namespace == ns).map(|p| p.name.clone()).collect();
        anyhow::anyhow!(
            "pod {ns}/{pod} not found; pods in namespace {ns}: {}",
            if names.is_empty() { "none".into() } else { names.join(", ") }
        )
    })
}

pub fn run(ctx: &Ctx, ns: &str, pod: &str, container: Option<&str>, argv: &[String]) -> anyhow::Result<i32> {
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
    let mut env = vec![("PATH".to_string(), spawn::pod_path()), ("HOSTNAME".to_string(), p.name.clone())];
    // `slipstream` run in the pod (e.g. `debug hbone`) acts on this cluster.
    env.push(("SLIPSTREAM_CLUSTER".to_string(), ctx.paths.cluster.as_str().to_string()));
    for k in ["TERM", "HOME", "LANG"] {
        if let Ok(v) = std::env::var(k) {
            env.push((k.to_string(), v));
        }
    }
    let spec = SandboxSpec {
        argv: argv.to_vec(),
        env,
        cwd: None,
        netns: netns_path(&p.netns),
        cgroup: PathBuf::from(&p.cgroup),
        hostname: p.name.clone(),
        hosts: Some(dir.join("hosts")),
        resolv: Some(dir.join("resolv.conf")),
        log: None,
        new_session: false,
        private_mounts: true,
    };
    let mut child = spawn::spawn(&spec).with_context(|| format!("running {:?} in pod {ns}/{}", argv[0], p.name))?;
    let status = child.wait()?;
    Ok(status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}
