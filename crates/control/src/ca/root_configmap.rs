//! The trust bundle published for the node proxies (`--root-configmap
//! NAME`): the roots every proxy must trust, PEM, under `root-cert.pem` of
//! a ConfigMap in the control plane's namespace. The node DaemonSet mounts
//! it to verify the control plane's serving certificate (`slipstream node
//! --control-plane-root`). Created if absent, patched when it differs: at
//! startup, whenever the CA's roots change (a reload), and every minute
//! (a ConfigMap deleted or edited by hand comes back).
//!
//! Every replica publishes the same roots, so they never undo each other's
//! writes.

use super::roots::CaMaterial;
use crate::namespaced::NamespacedName;
use anyhow::Context;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

/// The key the roots are published under.
pub const ROOT_KEY: &str = "root-cert.pem";

/// How often the roots in force are compared with the ones published.
const CHECK_EVERY: Duration = Duration::from_secs(5);
/// How often the ConfigMap is read again even if the roots did not change.
const RESYNC: Duration = Duration::from_secs(60);

/// What publishing needs, given the ConfigMap as read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishStep {
    /// There is none: create it.
    Create,
    /// It holds other roots (or none): write ours.
    Patch,
    /// It holds these roots already.
    Nothing,
}

/// `held`: None when there is no ConfigMap, else what its key holds.
pub fn publish_step(held: Option<Option<&str>>, roots_pem: &str) -> PublishStep {
    match held {
        None => PublishStep::Create,
        Some(Some(pem)) if pem == roots_pem => PublishStep::Nothing,
        Some(_) => PublishStep::Patch,
    }
}

/// Makes the ConfigMap `target` hold `roots_pem`; what it took.
pub async fn publish(client: kube::Client, target: &NamespacedName, roots_pem: &str) -> anyhow::Result<PublishStep> {
    let api = Api::<ConfigMap>::namespaced(client, &target.namespace);
    // Twice at most: a create that lost a race to another replica reads
    // the winner's and patches it if it differs.
    for _ in 0..2 {
        let held = api.get_opt(&target.name).await.with_context(|| format!("reading the ConfigMap {target}"))?;
        let step = publish_step(held.as_ref().map(|c| c.data.as_ref().and_then(|d| d.get(ROOT_KEY)).map(String::as_str)), roots_pem);
        match step {
            PublishStep::Nothing => return Ok(step),
            PublishStep::Patch => {
                let patch = serde_json::json!({"data": {ROOT_KEY: roots_pem}});
                api.patch(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .with_context(|| format!("writing the roots into the ConfigMap {target}"))?;
                return Ok(step);
            }
            PublishStep::Create => {
                let mut cm =
                    ConfigMap { data: Some(BTreeMap::from([(ROOT_KEY.to_string(), roots_pem.to_string())])), ..ConfigMap::default() };
                cm.metadata.name = Some(target.name.clone());
                cm.metadata.labels = Some(BTreeMap::from([("app.kubernetes.io/managed-by".to_string(), "slipstream-control".to_string())]));
                match api.create(&PostParams::default(), &cm).await {
                    Ok(_) => return Ok(step),
                    Err(kube::Error::Api(e)) if e.code == 409 => continue,
                    Err(e) => return Err(e).with_context(|| format!("creating the ConfigMap {target}")),
                }
            }
        }
    }
    anyhow::bail!("the ConfigMap {target} was created and deleted again while publishing the roots; retrying later")
}

/// Publishes the roots now (an error fails startup: the node proxies
/// could not verify this control plane), then keeps them published.
pub async fn start(client: kube::Client, target: NamespacedName, material: CaMaterial) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let pem = material.roots().to_pem();
    let step = publish(client.clone(), &target, &pem).await.context("--root-configmap")?;
    tracing::info!(configmap = %target, ?step, "published the mesh roots for the node proxies");
    Ok(tokio::spawn(keep_published(client, target, material, pem)))
}

async fn keep_published(client: kube::Client, target: NamespacedName, material: CaMaterial, mut published: String) {
    let mut last_sync = tokio::time::Instant::now();
    let mut failing = false;
    loop {
        tokio::time::sleep(CHECK_EVERY).await;
        let pem = material.roots().to_pem();
        if pem == published && last_sync.elapsed() < RESYNC && !failing {
            continue;
        }
        match publish(client.clone(), &target, &pem).await {
            Ok(step) => {
                if step != PublishStep::Nothing || failing {
                    tracing::info!(configmap = %target, ?step, "published the mesh roots for the node proxies");
                }
                published = pem;
                last_sync = tokio::time::Instant::now();
                failing = false;
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(configmap = %target, "cannot publish the mesh roots (retrying every {CHECK_EVERY:?}): {e:#}");
                }
                failing = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_steps() {
        let cases = [
            (None, PublishStep::Create),
            (Some(None), PublishStep::Patch),
            (Some(Some("old")), PublishStep::Patch),
            (Some(Some("roots")), PublishStep::Nothing),
        ];
        for (held, want) in cases {
            assert_eq!(publish_step(held, "roots"), want, "{held:?}");
        }
    }
}
