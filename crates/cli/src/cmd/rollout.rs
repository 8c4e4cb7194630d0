//! `slipstream rollout restart|status`: kubectl's verbs on the local
//! cluster's Deployments. The agent replaces the pods surge-first (the old
//! ones serve until every new one is ready, `testbed::plan::rollout_holds`).

use crate::common::{self, Ctx};
use anyhow::bail;
use slipstream_k8s::ObjectKey;
use slipstream_testbed::ipc::{Request, Response};
use std::time::Duration;

#[derive(clap::Subcommand)]
pub enum RolloutCommand {
    /// Start replacing a Deployment's pods and return (kubectl's
    /// `kubectl.kubernetes.io/restartedAt` on its pod template). New pods
    /// start at once; each old one gets SIGTERM only when every new one is
    /// ready. Follow it with `rollout status`.
    Restart {
        #[arg(short = 'n', long = "namespace", default_value = "default")]
        namespace: String,
        /// `deploy/NAME` (`deployment/NAME`, `deployment.apps/NAME`), or
        /// `deployment NAME`; several may be given.
        #[arg(required = true, num_args = 1..)]
        resources: Vec<String>,
    },
    /// Wait until a Deployment's pods are all of its current template and
    /// ready, and its old ones gone. Exit code 1 at the timeout, naming
    /// what it still waits for.
    Status {
        #[arg(short = 'n', long = "namespace", default_value = "default")]
        namespace: String,
        /// `deploy/NAME`, or `deployment NAME`.
        #[arg(required = true, num_args = 1..=2)]
        resource: Vec<String>,
        #[arg(long, default_value = "120s", value_parser = slipstream_core::duration::parse_flag)]
        timeout: Duration,
    },
}

/// The Deployment names in kubectl's forms: `deploy/NAME` (and its
/// aliases) each, or `deployment NAME`.
pub fn deployments(args: &[String]) -> Result<Vec<String>, String> {
    const KINDS: &[&str] = &["deploy", "deployment", "deployments", "deployment.apps", "deployments.apps"];
    let is_kind = |k: &str| KINDS.contains(&k.to_ascii_lowercase().as_str());
    match args {
        [kind, rest @ ..] if is_kind(kind) && !rest.is_empty() && rest.iter().all(|n| !n.contains('/')) => Ok(rest.to_vec()),
        _ => args
            .iter()
            .map(|a| match a.split_once('/') {
                Some((k, n)) if is_kind(k) && !n.is_empty() && !n.contains('/') => Ok(n.to_string()),
                Some((k, _)) if !is_kind(k) => {
                    Err(format!("{a:?}: only Deployments can be rolled out here (deploy/NAME, deployment/NAME, deployment.apps/NAME)"))
                }
                _ => Err(format!("{a:?} is not deploy/NAME (or `deployment NAME`)")),
            })
            .collect(),
    }
}

pub fn restart(ctx: &Ctx, namespace: &str, resources: &[String]) -> anyhow::Result<()> {
    common::require_root("rollout restart")?;
    let names = deployments(resources).map_err(anyhow::Error::msg)?;
    for name in names {
        match ctx.call(&Request::Restart { namespace: namespace.to_string(), name: name.clone() }, Duration::from_secs(30))? {
            Response::Done { lines } => lines.iter().for_each(|l| println!("{l}")),
            Response::Rejected { errors } => bail!("{}", errors.join("\n")),
            other => bail!("unexpected answer from the agent: {other:?}"),
        }
    }
    Ok(())
}

pub fn status(ctx: &Ctx, namespace: &str, resource: &[String], timeout: Duration) -> anyhow::Result<()> {
    let names = deployments(resource).map_err(anyhow::Error::msg)?;
    let [name] = names.as_slice() else { bail!("rollout status takes one Deployment") };
    let st = ctx.status()?;
    let owner = format!("Deployment/{name}");
    if !st.pods.iter().any(|p| p.namespace == namespace && p.owner.as_deref() == Some(&owner)) {
        bail!("deployments.apps \"{name}\" not found in namespace {namespace} (or it has no pods)");
    }
    let key = ObjectKey { kind: "Deployment".into(), namespace: namespace.into(), name: name.clone() };
    println!("Waiting for deployment \"{name}\" rollout to finish...");
    common::wait_converged(ctx, timeout, true, &common::Scope::Objects(vec![key]))?;
    println!("deployment \"{name}\" successfully rolled out");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_forms() {
        let v = |a: &[&str]| deployments(&a.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(v(&["deploy/web"]), Ok(vec!["web".to_string()]));
        assert_eq!(v(&["deployment.apps/web", "deployments/api"]), Ok(vec!["web".to_string(), "api".to_string()]));
        assert_eq!(v(&["deployment", "web", "api"]), Ok(vec!["web".to_string(), "api".to_string()]));
        assert!(v(&["pod/web"]).unwrap_err().contains("only Deployments"));
        assert!(v(&["web"]).unwrap_err().contains("not deploy/NAME"));
        assert!(v(&["deploy/"]).is_err());
        assert!(v(&["deployment"]).is_err());
    }
}
