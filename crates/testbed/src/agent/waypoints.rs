//! The waypoint controller: what a waypoint's pod is given, as the kubelet
//! would mount a projected token and istiod's address (where the control
//! plane is, the mesh root, its own token), the workload tokens file the
//! control plane checks those tokens against, and the control plane's
//! routes back to the waypoint pods. The Gateway's expansion into its
//! Deployment and Service is the store's (`Store::made_for_waypoint`).

use super::credentials::random_token;
use super::node::Node;
use super::pods::PodRuntime;
use crate::names::Paths;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

#[derive(Default)]
pub struct Waypoints {
    /// The workload tokens file as last written.
    last_tokens: Option<String>,
}

/// A new waypoint pod's token and environment. In the environment, which
/// only its own PID namespace (and root on the machine) can read: a pod's
/// /run and /tmp are its own, so no file could carry it there.
pub fn credentials(paths: &Paths, control_addresses: &str) -> (String, Vec<(String, String)>) {
    let token = random_token();
    let root = std::fs::read_to_string(paths.ca_dir().join("root-cert.pem")).unwrap_or_default();
    let env = vec![
        ("SLIPSTREAM_WAYPOINT_CONTROL_PLANE".into(), control_addresses.to_string()),
        ("SLIPSTREAM_WAYPOINT_ROOT_PEM".into(), root),
        ("SLIPSTREAM_WAYPOINT_TOKEN".into(), token.clone()),
        ("SLIPSTREAM_WAYPOINT_CLUSTER_ID".into(), paths.cluster.to_string()),
    ];
    (token, env)
}

impl Waypoints {
    /// Writes the workload tokens file the control plane reads (one entry
    /// per waypoint pod alive; rewritten only when it changes) and returns
    /// the routes the control plane needs: each waypoint pod's address,
    /// via its node.
    pub fn sync(&mut self, paths: &Paths, pods: &[&PodRuntime], nodes: &[Node]) -> BTreeMap<Ipv4Addr, Ipv4Addr> {
        let mut all = BTreeMap::new();
        for p in pods {
            let Some(t) = &p.workload_token else { continue };
            let node = nodes.get(p.node - 1).map(|n| n.name.clone()).unwrap_or_default();
            all.insert(
                t.clone(),
                serde_json::json!({"namespace": p.inst.namespace, "service_account": p.inst.spec.service_account(), "node": node, "pod": p.inst.name}),
            );
        }
        let text = serde_json::to_string_pretty(&all).unwrap_or_default();
        if self.last_tokens.as_deref() != Some(text.as_str()) {
            match super::files::write_private(&paths.workload_tokens_file(), &text) {
                Ok(()) => self.last_tokens = Some(text),
                Err(e) => tracing::error!("writing the workload tokens: {e}"),
            }
        }
        pods.iter().filter(|p| p.workload_token.is_some()).filter_map(|p| Some((p.ip, nodes.get(p.node - 1)?.ip))).collect()
    }
}
