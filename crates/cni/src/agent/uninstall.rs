//! Telling an uninstall from an upgrade. An agent that stops cannot tell by
//! itself whether its DaemonSet is being upgraded, its pod evicted, or the
//! mesh removed; only the last must release the node's pods. Helm's
//! `pre-delete` hook runs `slipstream node-agent mark-uninstall` before
//! anything is deleted: it annotates the DaemonSet, and every agent, which
//! watches its DaemonSet, remembers the mark when it stops.

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Patch, PatchParams};
use kube::Api;

/// The annotation the hook sets on the DaemonSet.
pub const MARK: &str = "slipstream.io/uninstall";

/// `namespace/name` of a DaemonSet.
pub fn parse_daemonset(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => Ok((ns.into(), name.into())),
        _ => Err(format!("--daemonset {s:?}: expected NAMESPACE/NAME")),
    }
}

/// Whether the DaemonSet carries the mark.
pub fn is_marked(ds: &DaemonSet) -> bool {
    ds.metadata.annotations.as_ref().and_then(|a| a.get(MARK)).is_some_and(|v| v == "true")
}

/// Sets the mark (the pre-delete hook's whole job).
pub async fn mark(client: kube::Client, namespace: &str, name: &str) -> anyhow::Result<()> {
    let api: Api<DaemonSet> = Api::namespaced(client, namespace);
    let patch = serde_json::json!({"metadata": {"annotations": {MARK: "true"}}});
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {
            println!("daemonset {namespace}/{name} marked for uninstall: its agents release every pod of their nodes and remove the CNI plugin when they stop");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => {
            println!("daemonset {namespace}/{name} is not there: nothing to mark");
            Ok(())
        }
        Err(e) => Err(anyhow::anyhow!("marking daemonset {namespace}/{name} for uninstall: {e}")),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn daemonset_names() {
        assert_eq!(
            super::parse_daemonset("slipstream-system/slipstream-node").unwrap(),
            ("slipstream-system".into(), "slipstream-node".into())
        );
        for bad in ["x", "/x", "x/", "a/b/c"] {
            assert!(super::parse_daemonset(bad).unwrap_err().contains("NAMESPACE/NAME"), "{bad}");
        }
    }
}
