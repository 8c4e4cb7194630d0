//! The control-plane controller: one `slipstream control` per replica,
//! each in its own namespace on the fabric (`<cluster>.controlN` at
//! 172.18.255.N), supervised (restarts, readiness) as the node proxies are,
//! and the routes from its namespaces to the waypoint pods that must reach
//! it (pods cannot otherwise: its namespaces have no route back to the pod
//! network).

use super::supervised::{self, Supervised};
use crate::names::Paths;
use crate::plan;
use crate::status::{ControlStatus, ProxyStatus};
use crate::sys::net;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

#[derive(Default)]
pub struct ControlPlane {
    /// The replicas, in order.
    replicas: Vec<Supervised>,
    /// The namespaces made, in order (one per replica).
    netns: Vec<String>,
    /// Waypoint pod addresses routed to, with their node's address.
    routes: BTreeMap<Ipv4Addr, Ipv4Addr>,
}

impl ControlPlane {
    /// Adds replica `r` (1-based): its namespace on the fabric and its
    /// supervisor (the process starts at the next tick).
    pub fn add(&mut self, paths: &Paths, fabric: &str, r: usize) -> anyhow::Result<()> {
        let netns = paths.control_netns(r);
        self.netns.push(netns.clone());
        net::create_node(fabric, &netns, &format!("control{r}"), plan::control_ip(r))?;
        self.replicas.push(Supervised::new(supervised::control_spec(paths, r)));
        Ok(())
    }

    pub fn replicas(&self) -> usize {
        self.replicas.len()
    }

    /// Its addresses, comma-separated, as a waypoint is told them.
    pub fn addresses(&self) -> String {
        let all: Vec<String> = (1..=self.replicas.len().max(1)).map(|r| plan::control_addr(r).to_string()).collect();
        all.join(",")
    }

    pub fn tick(&mut self) {
        for c in &mut self.replicas {
            c.tick();
        }
    }

    /// Stops every replica (they drain), then waits for them.
    pub fn stop(&mut self) {
        for c in &mut self.replicas {
            c.stop();
        }
    }

    /// Deletes its namespaces (after `stop`).
    pub fn remove_netns(&mut self) {
        for ns in std::mem::take(&mut self.netns) {
            let _ = net::del_netns(&ns);
        }
    }

    /// Routes its namespaces to exactly the `wanted` waypoint pods (each
    /// its own address only, via its node), removing the routes of those
    /// gone.
    pub fn route_waypoints(&mut self, wanted: BTreeMap<Ipv4Addr, Ipv4Addr>) {
        if wanted == self.routes {
            return;
        }
        for netns in &self.netns {
            for ip in self.routes.keys().filter(|ip| !wanted.contains_key(ip)) {
                if let Err(e) = net::del_route(netns, &format!("{ip}/32")) {
                    tracing::warn!("removing the control plane's route to waypoint pod {ip}: {e}");
                }
            }
            for (ip, via) in &wanted {
                if let Err(e) = net::route_to_node(netns, &format!("{ip}/32"), *via) {
                    tracing::warn!("routing the control plane to waypoint pod {ip}: {e}");
                }
            }
        }
        self.routes = wanted;
    }

    /// What `status` shows of each replica.
    pub fn status(&self, paths: &Paths) -> Vec<ControlStatus> {
        self.replicas
            .iter()
            .enumerate()
            .map(|(i, c)| ControlStatus {
                name: c.node.clone(),
                netns: paths.control_netns(i + 1),
                address: plan::control_addr(i + 1).to_string(),
                process: ProxyStatus {
                    pid: c.pid(),
                    restarts: c.restarts,
                    serving: 0,
                    log: paths.control_log(i + 1).display().to_string(),
                    ready: Some(c.ready()),
                    reason: if c.ready() { String::new() } else { c.reason() },
                },
            })
            .collect()
    }
}
