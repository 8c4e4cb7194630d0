//! `slipstream status` on Kubernetes: the nodes, pods and services from the
//! API server, the control plane replicas and node proxies from the
//! install's pods, in the local cluster's schema (docs/status-json.md),
//! plus `target` saying where it looked.

use super::reach::{self, Kube};
use super::target::KubeTarget;
use super::{install, status_map};
use crate::common;
use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use slipstream_testbed::status::{AgentStatus, ClusterStatus, STATUS_VERSION};
use std::collections::BTreeMap;

/// The status of the install `k` reaches.
pub async fn fetch(k: &Kube) -> anyhow::Result<ClusterStatus> {
    let lp = ListParams::default();
    let c = &k.client;
    let nodes = Api::<Node>::all(c.clone()).list(&lp).await.context("listing nodes")?.items;
    let pods = Api::<Pod>::all(c.clone()).list(&lp).await.context("listing pods")?.items;
    let namespaces = Api::<Namespace>::all(c.clone()).list(&lp).await.context("listing namespaces")?.items;
    let services = Api::<Service>::all(c.clone()).list(&lp).await.context("listing services")?.items;
    let slices = Api::<EndpointSlice>::all(c.clone()).list(&lp).await.context("listing endpoint slices")?.items;
    let control = install::pods(c, install::CONTROL_APP).await?;
    let node_pods = install::pods(c, install::NODE_APP).await?;
    let ns_labels: BTreeMap<String, BTreeMap<String, String>> =
        namespaces.iter().map(|n| (n.metadata.name.clone().unwrap_or_default(), n.metadata.labels.clone().unwrap_or_default())).collect();
    let empty = BTreeMap::new();
    let pods: Vec<_> =
        pods.iter().map(|p| status_map::pod(p, ns_labels.get(p.metadata.namespace.as_deref().unwrap_or("")).unwrap_or(&empty))).collect();
    // The pods each node proxy holds listeners for, from its own config dump.
    let serving = futures_util::future::join_all(node_pods.iter().map(|p| serving(k, p))).await;
    let nodes = nodes
        .iter()
        .map(|n| {
            let name = n.metadata.name.as_deref().unwrap_or("");
            let at = node_pods.iter().position(|p| install::node_of(p) == name);
            status_map::node(n, at.map(|i| &node_pods[i]), at.map(|i| serving[i]).unwrap_or(0))
        })
        .collect();
    let mut services: Vec<_> = services.iter().map(|s| status_map::service(s, &slices)).collect();
    services.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    Ok(ClusterStatus {
        version: STATUS_VERSION,
        cluster: k.context.clone(),
        agent: AgentStatus { pid: 0, running: true },
        control: control.iter().map(status_map::control).collect(),
        nodes,
        pods,
        services,
        other_objects: Vec::new(),
        objects_generation: 0,
    })
}

/// How many pods a node proxy holds listeners for (0 when it does not answer).
async fn serving(k: &Kube, p: &Pod) -> usize {
    if !install::running(p) {
        return 0;
    }
    let (ns, name) = install::key(p);
    match reach::get_json::<serde_json::Value>(k, &ns, &name, slipstream_core::ADMIN_PORT, "/config_dump").await {
        Ok(dump) => dump["localPods"].as_array().map(Vec::len).unwrap_or(0),
        Err(_) => 0,
    }
}

/// The `target` object added to the JSON: where the status comes from.
pub fn target_json(k: &Kube, t: &KubeTarget) -> serde_json::Value {
    serde_json::json!({
        "kind": "kubernetes",
        "context": k.context,
        "server": k.server,
        "kubeconfig": t.describe(std::env::var("KUBECONFIG").ok().as_deref()),
    })
}

/// `slipstream status [-o json]` on Kubernetes.
pub fn run(t: &KubeTarget, output: &str) -> anyhow::Result<()> {
    reach::block_on(async {
        let k = reach::connect(t).await?;
        let st = fetch(&k).await?;
        match output {
            "json" => {
                let mut v = serde_json::to_value(&st)?;
                v["target"] = target_json(&k, t);
                common::out(&format!("{}\n", serde_json::to_string_pretty(&v)?))
            }
            "table" | "wide" => {
                let table = crate::cmd::status::table_on_kubernetes(&st);
                let rest = table.split_once('\n').map(|(_, r)| r).unwrap_or("");
                let via = t.describe(std::env::var("KUBECONFIG").ok().as_deref());
                common::out(&format!("Kubernetes cluster {} at {} ({via})\n{rest}", k.context, k.server))
            }
            other => bail!("unknown output format {other:?}: use table or json"),
        }
    })
}
