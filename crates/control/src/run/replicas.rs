//! What lets several replicas run side by side on Kubernetes (a
//! Deployment), each behind its flag: the CA from a Secret they share
//! (`--ca-secret`), the roots published for the node proxies
//! (`--root-configmap`), and the election of the one replica that runs the
//! gateway controller (`--leader-elect`). Without the flags nothing here
//! runs, and the local cluster is as it was.

use super::{AbortOnDrop, ControlArgs, SourceArg};
use crate::ca::{root_configmap, secret, CaMaterial};
use crate::leader::{self, Leadership};
use anyhow::{anyhow, bail};
use slipstream_core::TrustDomain;

/// The namespace the control plane runs in (the downward API's
/// `POD_NAMESPACE`), for `--root-configmap` without `--ca-secret`.
fn pod_namespace() -> Option<String> {
    std::env::var("POD_NAMESPACE").ok()
}

/// Refuses a combination that cannot work, before anything is created.
pub(super) fn check(args: &ControlArgs) -> anyhow::Result<()> {
    let given = [
        ("--ca-secret", args.ca.ca_secret.is_some()),
        ("--root-configmap", args.ca.root_configmap.is_some()),
        ("--leader-elect", args.leader.leader_elect.is_some()),
    ];
    for (flag, given) in given {
        if given && !matches!(args.source, SourceArg::Kubernetes) {
            bail!("{flag}: needs --source kubernetes (it reads and writes objects of the API server)");
        }
    }
    if args.leader.leader_elect.is_some() {
        args.leader.settings().check().map_err(|e| anyhow!("--leader-elect: {e}"))?;
    }
    args.ca.root_configmap_target(pod_namespace().as_deref())?;
    Ok(())
}

/// The CA: from `--ca-secret` (created if absent), else the operator's
/// files or the root generated in `--ca-dir`.
pub(super) async fn load_ca(args: &ControlArgs, client: Option<&kube::Client>, trust_domain: &TrustDomain) -> anyhow::Result<CaMaterial> {
    let Some(secret) = &args.ca.ca_secret else {
        return CaMaterial::load(&args.ca.source()?, trust_domain, args.ca.max_cert_validity);
    };
    let Some(client) = client else { bail!("--ca-secret: needs --source kubernetes") };
    let (ca, origin) = secret::load_or_create(client.clone(), secret, trust_domain, args.ca.max_cert_validity).await?;
    tracing::info!(secret = %secret, ?origin, roots = ca.roots().certs().len(), "CA loaded from its Secret");
    Ok(CaMaterial::fixed(ca))
}

/// `--root-configmap`: published now (or startup fails), then kept so.
pub(super) async fn publish_roots(
    args: &ControlArgs,
    client: Option<&kube::Client>,
    material: &CaMaterial,
) -> anyhow::Result<Option<AbortOnDrop>> {
    let Some(target) = args.ca.root_configmap_target(pod_namespace().as_deref())? else { return Ok(None) };
    let Some(client) = client else { bail!("--root-configmap: needs --source kubernetes") };
    let task = root_configmap::start(client.clone(), target, material.clone()).await?;
    Ok(Some(AbortOnDrop(task)))
}

/// `--leader-elect`, when there is a gateway controller to elect for.
pub(super) fn leadership(args: &ControlArgs, client: Option<&kube::Client>, controller: bool) -> Option<Leadership> {
    let lease = args.leader.leader_elect.as_ref()?;
    if !controller {
        tracing::info!(lease = %lease, "--leader-elect: no gateway controller runs here, so there is nothing to elect a leader for");
        return None;
    }
    let me = leader::identity(args.leader.leader_elect_identity.as_deref());
    tracing::info!(lease = %lease, identity = %me, "leader election: only the holder of the Lease runs the gateway controller");
    Some(Leadership::start(client?.clone(), lease, me, args.leader.settings()))
}
