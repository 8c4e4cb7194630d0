//! The network controller: the fabric (the physical network between
//! nodes, a bridge in its own namespace) and one namespace per node, with
//! routes to every other node's pod CIDR and its service rules. It keeps
//! the namespaces it made, so that `remove` deletes exactly those.

use super::node::Node;
use crate::names::Paths;
use crate::plan;
use crate::sys::net;

#[derive(Default)]
pub struct Network {
    /// The fabric's namespace, once made.
    fabric: Option<String>,
    pub nodes: Vec<Node>,
    /// The service rules as last applied on every node.
    last_rules: Option<String>,
}

impl Network {
    /// Makes the fabric; the nodes are added to it one by one.
    pub fn create_fabric(&mut self, paths: &Paths) -> anyhow::Result<String> {
        let fabric = paths.fabric_netns();
        self.fabric = Some(fabric.clone());
        net::create_fabric(&fabric)?;
        Ok(fabric)
    }

    /// Adds node `index` (1-based) on the fabric, with an empty service
    /// table.
    pub fn add_node(&mut self, paths: &Paths, fabric: &str, index: usize) -> anyhow::Result<&Node> {
        let name = plan::node_name(index);
        let netns = paths.node_netns(&name);
        let node = Node { name, index, netns, ip: plan::node_ip(index) };
        self.nodes.push(node);
        let node = &self.nodes[self.nodes.len() - 1];
        net::create_node(fabric, &node.netns, &node.name, node.ip)?;
        net::apply_nft(&node.netns, &plan::nft_ruleset(&[]))?;
        Ok(node)
    }

    /// Routes every node's pod CIDR from every other node.
    pub fn route_nodes(&self) -> anyhow::Result<()> {
        for a in &self.nodes {
            for b in &self.nodes {
                if a.index != b.index {
                    net::route_to_node(&a.netns, &plan::format_cidr(plan::pod_cidr(b.index)), b.ip)?;
                }
            }
        }
        Ok(())
    }

    pub fn names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// Applies the services' nftables ruleset on every node; kept as the
    /// last applied only when every node took it (so it is retried).
    pub fn apply_rules(&mut self, rules: String) {
        let mut ok = true;
        for n in &self.nodes {
            if let Err(e) = net::apply_nft(&n.netns, &rules) {
                tracing::error!(node = %n.name, "service rules not applied: {e}");
                ok = false;
            }
        }
        if ok {
            self.last_rules = Some(rules);
        }
    }

    /// Whether `rules` differ from those last applied.
    pub fn rules_changed(&self, rules: &str) -> bool {
        self.last_rules.as_deref() != Some(rules)
    }

    /// Deletes the nodes' namespaces (and with them every veth, route and
    /// nftables table inside).
    pub fn remove_nodes(&mut self) {
        for n in std::mem::take(&mut self.nodes) {
            let _ = net::del_netns(&n.netns);
        }
    }

    /// Deletes the fabric (after the nodes and the control plane).
    pub fn remove_fabric(&mut self) {
        if let Some(f) = self.fabric.take() {
            let _ = net::del_netns(&f);
        }
    }
}
