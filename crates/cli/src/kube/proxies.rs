//! `proxy-status`, `proxy-config` (`ztunnel-config`) and `policy check` on
//! Kubernetes: the control plane replicas' `/debug/syncz` (:15014) and the
//! node proxies' `/config_dump` (admin, 127.0.0.1:15000 in the node's
//! network namespace), each reached through the API server's pod
//! port-forward, then shown by the same code as the local cluster's.

use super::install;
use super::reach::{self, Kube};
use super::target::KubeTarget;
use crate::cmd::proxy_config::{self, Section};
use crate::common;
use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject, ListParams};
use slipstream_control::objects::ClusterObject;
use slipstream_control::syncz::Syncz;

/// Each control plane replica's `/debug/syncz`, or why there is none.
pub async fn syncz(k: &Kube) -> anyhow::Result<Vec<(String, Result<Syncz, String>)>> {
    let pods = install::pods(&k.client, install::CONTROL_APP).await?;
    if pods.is_empty() {
        bail!("no control plane pods (label app.kubernetes.io/name={}) in the cluster: is Slipstream installed?", install::CONTROL_APP);
    }
    let replies = futures_util::future::join_all(pods.iter().map(|p| async move {
        let (ns, name) = install::key(p);
        let r = reach::get_json::<Syncz>(k, &ns, &name, slipstream_core::abi::CONTROL_MONITOR_PORT, "/debug/syncz").await;
        (name, r.map_err(|e| format!("{e:#}")))
    }))
    .await;
    Ok(replies)
}

/// `slipstream proxy-status` on Kubernetes.
pub fn proxy_status(t: &KubeTarget, output: &str) -> anyhow::Result<()> {
    reach::block_on(async {
        let k = reach::connect(t).await?;
        let replies = syncz(&k).await?;
        match output {
            "json" => crate::cmd::proxy_status::json(&replies),
            "table" => {
                // Nodes that run a node proxy (the DaemonSet's), by name.
                let nodes: Vec<String> =
                    install::pods(&k.client, install::NODE_APP).await?.iter().map(|p| install::node_of(p).to_string()).collect();
                common::out(&crate::cmd::proxy_status::table(&nodes, &replies))
            }
            other => bail!("unknown output format {other:?}: use table or json"),
        }
    })
}

/// The config dump of the node proxy on `node` (a node name, or the node
/// pod's name), or of the first node's.
pub async fn config_dump(k: &Kube, node: Option<&str>) -> anyhow::Result<serde_json::Value> {
    let pods = install::pods(&k.client, install::NODE_APP).await?;
    let pod = match node {
        Some(n) => install::node_pod(&pods, n).with_context(|| {
            let nodes: Vec<&str> = pods.iter().map(install::node_of).collect();
            format!("no node proxy on {n:?} (nodes with one: {})", nodes.join(", "))
        })?,
        None => pods.iter().find(|p| install::running(p)).context("no node proxy pod is running (DaemonSet slipstream-node)")?,
    };
    let (ns, name) = install::key(pod);
    reach::get_json(k, &ns, &name, slipstream_core::ADMIN_PORT, "/config_dump")
        .await
        .with_context(|| format!("the node proxy of {} (pod {ns}/{name})", install::node_of(pod)))
}

/// `slipstream proxy-config [NODE] [SECTION]` on Kubernetes: NODE is a
/// node's name or its node proxy pod's (istioctl's way).
pub fn proxy_config(t: &KubeTarget, args: &[String], node: Option<String>, output: &str) -> anyhow::Result<()> {
    let (section, nodes) = proxy_config::split_target(args)?;
    let node = match (node, nodes.as_slice()) {
        (Some(n), []) => Some(n),
        (None, [n]) => Some(n.clone()),
        (None, []) => None,
        _ => bail!("name one node (positional or --node), not several"),
    };
    if output == "table" && section == Section::All {
        bail!("`all` is shown as JSON only: add -o json, or pick workloads, services, policies or certs");
    }
    let dump = reach::block_on(async {
        let k = reach::connect(t).await?;
        config_dump(&k, node.as_deref()).await
    })?;
    proxy_config::show(&dump, section, output)
}

/// The objects `policy check` warns from: the destination namespace's
/// pods and every AuthorizationPolicy (none when Istio's CRDs are absent).
async fn policy_objects(k: &Kube, namespace: &str) -> Vec<ClusterObject> {
    let mut values: Vec<serde_json::Value> = Vec::new();
    if let Ok(pods) = Api::<Pod>::namespaced(k.client.clone(), namespace).list(&ListParams::default()).await {
        values.extend(pods.items.into_iter().filter_map(|p| {
            let mut v = serde_json::to_value(p).ok()?;
            v["apiVersion"] = "v1".into();
            v["kind"] = "Pod".into();
            Some(v)
        }));
    }
    let gvk = kube::api::GroupVersionKind::gvk("security.istio.io", "v1", "AuthorizationPolicy");
    let ar = kube::api::ApiResource::from_gvk_with_plural(&gvk, "authorizationpolicies");
    if let Ok(list) = Api::<DynamicObject>::all_with(k.client.clone(), &ar).list(&ListParams::default()).await {
        values.extend(list.items.into_iter().filter_map(|o| {
            let mut v = serde_json::to_value(o).ok()?;
            v["apiVersion"] = "security.istio.io/v1".into();
            v["kind"] = "AuthorizationPolicy".into();
            Some(v)
        }));
    }
    values.into_iter().filter_map(|v| slipstream_control::objects::parse_value(v).ok().flatten()).collect()
}

/// `slipstream policy check --from --to` on Kubernetes: over the state of
/// the node proxy on `node` (default: the destination pod's node).
pub fn policy_check(
    t: &KubeTarget,
    from: &str,
    to: &str,
    files: &[std::path::PathBuf],
    node: Option<&str>,
    output: &str,
) -> anyhow::Result<()> {
    let question = crate::cmd::policy::question(from, to)?;
    if !files.is_empty() {
        return crate::cmd::policy::check_manifests(question, files, output);
    }
    let (dump, objects) = reach::block_on(async {
        let k = reach::connect(t).await?;
        let node = match node {
            Some(n) => Some(n.to_string()),
            None => destination_node(&k, &question.to.namespace, &question.to.name).await,
        };
        let dump = config_dump(&k, node.as_deref()).await?;
        Ok((dump, policy_objects(&k, &question.to.namespace).await))
    })?;
    let cfg = crate::cmd::policy::mesh_config_of(&dump)?;
    crate::cmd::policy::answer(&cfg, question, &objects, output)
}

/// The node of pod `namespace/name`, when it is a pod's name and scheduled.
async fn destination_node(k: &Kube, namespace: &str, name: &str) -> Option<String> {
    let pod = Api::<Pod>::namespaced(k.client.clone(), namespace).get_opt(name).await.ok()??;
    let node = install::node_of(&pod).to_string();
    // A node with a node proxy (the API's Node, so a typo is not taken for one).
    Api::<Node>::all(k.client.clone()).get_opt(&node).await.ok()??;
    Some(node)
}
