//! The node-proxy controller: one `slipstream node` per node, supervised
//! as kubelet does a DaemonSet pod (`supervised::Supervised`: restarts and
//! readiness), what each is told of its node's meshed pods (pods.json, the
//! CNI role) and what each reports it serves (served.json).

use super::mesh;
use super::node::Node;
use super::pods::PodRuntime;
use super::supervised::{self, Supervised};
use crate::names::Paths;
use crate::plan;
use crate::status::{DatapathStatus, NodeStatus, ProxyStatus};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

#[derive(Default)]
pub struct NodeProxies {
    /// One per node, in the nodes' order.
    proxies: Vec<Supervised>,
    /// Per node: the workload uids its proxy reports as served.
    served: BTreeMap<String, BTreeSet<String>>,
    /// pods.json of each node as last written.
    last_pods: BTreeMap<PathBuf, String>,
}

impl NodeProxies {
    /// Adds the proxy of `node` (it starts at the next tick).
    pub fn add(&mut self, paths: &Paths, node: &Node, control_replicas: usize, ebpf: bool) {
        self.proxies.push(Supervised::new(supervised::node_proxy_spec(paths, node, control_replicas, ebpf)));
    }

    /// Supervises the proxies, then reads what each serves.
    pub fn tick(&mut self, paths: &Paths, nodes: &[Node]) {
        for proxy in &mut self.proxies {
            proxy.tick();
        }
        for n in nodes {
            let path = paths.mesh_dir().join(&n.name).join("served.json");
            let served: slipstream_core::Served =
                std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str(&t).ok()).unwrap_or_default();
            self.served.insert(n.name.clone(), served.uids.into_iter().collect());
        }
    }

    /// Whether the proxy of `node` reports serving the workload `uid`.
    pub fn serves(&self, node: &str, uid: &str) -> bool {
        self.served.get(node).is_some_and(|s| s.contains(uid))
    }

    /// Writes each node's meshed pods and their namespaces (pods.json),
    /// atomically and only when changed.
    pub fn write_pods(&mut self, paths: &Paths, nodes: &[Node], pods: &[&PodRuntime]) {
        let cluster = paths.cluster.to_string();
        for n in nodes {
            let path = paths.mesh_dir().join(&n.name).join("pods.json");
            let Ok(text) = serde_json::to_string_pretty(&mesh::node_pods(&cluster, n.index, pods)) else { continue };
            if self.last_pods.get(&path) == Some(&text) {
                continue;
            }
            if let Err(e) = super::files::write_atomic(&path, &text) {
                tracing::error!("cannot write {}: {e}", path.display());
                continue;
            }
            self.last_pods.insert(path, text);
        }
    }

    /// Stops every proxy (they drain), then waits for them.
    pub fn stop(&mut self) {
        for proxy in &mut self.proxies {
            proxy.stop();
        }
    }

    /// What `status` shows of each node and its proxy.
    pub fn status(&self, paths: &Paths, nodes: &[Node], datapath: &DatapathStatus) -> Vec<NodeStatus> {
        nodes
            .iter()
            .zip(&self.proxies)
            .map(|(n, proxy)| NodeStatus {
                name: n.name.clone(),
                netns: n.netns.clone(),
                ip: n.ip.to_string(),
                pod_cidr: plan::format_cidr(plan::pod_cidr(n.index)),
                proxy: Some(ProxyStatus {
                    pid: proxy.pid(),
                    restarts: proxy.restarts,
                    serving: self.served.get(&n.name).map(|s| s.len()).unwrap_or(0),
                    log: paths.node_proxy_log(&n.name).display().to_string(),
                    ready: Some(proxy.ready()),
                    reason: if proxy.ready() { String::new() } else { proxy.reason() },
                }),
                datapath: Some(datapath.clone()),
            })
            .collect()
    }
}
