//! Where the install's processes run: the control plane's pods and the
//! node proxies' pods, found by the chart's labels in every namespace (so
//! an install outside `slipstream-system` is found too).

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

/// The label value of the control plane's pods (Deployment `slipstream-control`).
pub const CONTROL_APP: &str = "slipstream-control";
/// The label value of the node pods (DaemonSet `slipstream-node`).
pub const NODE_APP: &str = "slipstream-node";
/// The node pods' container running the node proxy.
pub const PROXY_CONTAINER: &str = "proxy";
/// The node pods' container running the node agent.
pub const AGENT_CONTAINER: &str = "agent";

/// The pods of one of the install's parts, by name.
pub async fn pods(client: &kube::Client, app: &str) -> anyhow::Result<Vec<Pod>> {
    let api: Api<Pod> = Api::all(client.clone());
    let mut pods = api
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
        .await
        .with_context(|| format!("listing the pods of {app}"))?
        .items;
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    Ok(pods)
}

/// A pod's namespace and name.
pub fn key(p: &Pod) -> (String, String) {
    (p.metadata.namespace.clone().unwrap_or_default(), p.metadata.name.clone().unwrap_or_default())
}

/// The node a pod runs on.
pub fn node_of(p: &Pod) -> &str {
    p.spec.as_ref().and_then(|s| s.node_name.as_deref()).unwrap_or("")
}

/// The node pod on `node`, or the one named `node` (istioctl takes the
/// proxy's pod name), pure, for tests.
pub fn node_pod<'a>(pods: &'a [Pod], node: &str) -> Option<&'a Pod> {
    pods.iter().find(|p| node_of(p) == node).or_else(|| pods.iter().find(|p| p.metadata.name.as_deref() == Some(node)))
}

/// Whether the pod runs (a pod being deleted or not yet scheduled has no
/// process to ask).
pub fn running(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none() && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_proxy_by_node_or_by_pod() {
        let pod = |name: &str, node: &str| -> Pod {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": "slipstream-system"}, "spec": {"nodeName": node, "containers": []}}))
                .unwrap()
        };
        let pods = vec![pod("slipstream-node-a", "worker-1"), pod("slipstream-node-b", "worker-2")];
        assert_eq!(node_pod(&pods, "worker-2").and_then(|p| p.metadata.name.clone()).as_deref(), Some("slipstream-node-b"));
        assert_eq!(node_pod(&pods, "slipstream-node-a").map(node_of), Some("worker-1"));
        assert!(node_pod(&pods, "worker-3").is_none());
    }
}
